//! (a) No two candidates consider themselves leader at the same instant.

use super::Violation;
use crate::history::History;

pub fn check(history: &History) -> Result<(), Violation> {
    let mut terms = history.terms.clone();
    terms.sort_by_key(|t| t.start);
    for (i, a) in terms.iter().enumerate() {
        for b in terms[i + 1..].iter().take_while(|b| b.start < a.end) {
            if b.candidate != a.candidate {
                return Err(Violation {
                    invariant: "one leader at a time",
                    detail: format!(
                        "candidate {} (token {}) led {:?}..{:?} while candidate {} (token {}) led from {:?}",
                        a.candidate, a.token, a.start, a.end, b.candidate, b.token, b.start
                    ),
                });
            }
        }
    }
    Ok(())
}
