//! The checked properties, one file each.

mod fencing;
mod liveness;
mod one_leader;
mod tokens;

use crate::Scenario;
use crate::history::History;

/// A broken invariant, in words.
#[derive(Debug, Clone)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

/// Every invariant over one run's history.
pub fn check(history: &History, scenario: &Scenario) -> Result<(), Violation> {
    one_leader::check(history)?;
    tokens::check(history)?;
    fencing::check(history)?;
    liveness::check(history, scenario)?;
    Ok(())
}
