//! (c) The fenced resource never accepts a write with a lower token after a
//! higher one, and every accepted write was issued during its writer's term.

use super::Violation;
use crate::history::History;

pub fn check(history: &History) -> Result<(), Violation> {
    let mut accepted: Vec<_> = history.writes.iter().filter(|w| w.accepted).collect();
    accepted.sort_by_key(|w| w.decided);
    let mut highest = 0;
    for w in &accepted {
        if w.token < highest {
            return Err(Violation {
                invariant: "fenced writes never go back",
                detail: format!(
                    "accepted token {} from candidate {} at {:?} after token {highest}",
                    w.token, w.candidate, w.decided
                ),
            });
        }
        highest = w.token;
        let in_term = history.terms.iter().any(|t| {
            t.candidate == w.candidate
                && t.token == w.token
                && t.start <= w.issued
                && w.issued <= t.end
        });
        if !in_term {
            return Err(Violation {
                invariant: "writes only from leaders",
                detail: format!(
                    "candidate {} wrote with token {} at {:?} outside its term",
                    w.candidate, w.token, w.issued
                ),
            });
        }
    }
    Ok(())
}
