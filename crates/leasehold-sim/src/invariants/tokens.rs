//! (b) Tokens strictly increase over the grants of the election.

use super::Violation;
use crate::history::History;

pub fn check(history: &History) -> Result<(), Violation> {
    for pair in history.grants.windows(2) {
        let ((_, a), (cb, b)) = (pair[0], pair[1]);
        if b <= a {
            return Err(Violation {
                invariant: "tokens strictly increase",
                detail: format!("grant with token {b} (candidate {cb}) after token {a}"),
            });
        }
    }
    Ok(())
}
