//! (b) Tokens strictly increase over the grants of the election.

use super::Violation;
use crate::history::History;

pub fn check(history: &History) -> Result<(), Violation> {
    for pair in history.grants.windows(2) {
        let (a, b) = (pair[0].token, pair[1].token);
        if b <= a {
            return Err(Violation {
                invariant: "tokens strictly increase",
                detail: format!(
                    "grant with token {b} (candidate {}) after token {a}",
                    pair[1].candidate
                ),
            });
        }
    }
    Ok(())
}
