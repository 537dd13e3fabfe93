//! The checked properties, one file each.
//!
//! A sharded run is many elections at once: the single-election properties
//! (one leader at a time, strictly increasing tokens, fenced writes) hold
//! for each shard's part of the history alone, and the group as a whole
//! must settle (`settles.rs`).

mod fencing;
mod liveness;
mod one_leader;
mod settles;
mod tokens;

use crate::Scenario;
use crate::history::History;
pub use settles::ORPHAN_GRANT;

/// A broken invariant, in words.
#[derive(Debug, Clone)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

impl Violation {
    /// The same violation, found in shard `shard`'s election.
    fn in_shard(self, shard: u32) -> Violation {
        Violation {
            invariant: self.invariant,
            detail: format!("shard {shard}: {}", self.detail),
        }
    }
}

/// Every invariant over one run's history.
pub fn check(history: &History, scenario: &Scenario) -> Result<(), Violation> {
    match scenario.shards {
        None => one_election(history)?,
        Some(shards) => {
            for shard in 0..shards {
                one_election(&history.of_shard(shard)).map_err(|v| v.in_shard(shard))?;
            }
        }
    }
    liveness::check(history, scenario)?;
    settles::check(history, scenario)?;
    Ok(())
}

/// The properties of one election, over its part of the history.
fn one_election(history: &History) -> Result<(), Violation> {
    one_leader::check(history)?;
    tokens::check(history)?;
    fencing::check(history)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::history::{Granted, Term, Write};

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn term(shard: u32, candidate: usize, token: u64, start: u64, end: u64) -> Term {
        Term {
            shard,
            candidate,
            token,
            start: ms(start),
            end: ms(end),
        }
    }

    fn sharded() -> Scenario {
        Scenario {
            shards: Some(4),
            ..Scenario::default()
        }
    }

    /// Two members owning *different* shards at once is the point of a
    /// group; two owning the *same* shard at once is caught, and named.
    #[test]
    fn a_double_owner_of_one_shard_is_caught_and_named() {
        let mut history = History {
            terms: vec![term(0, 0, 1, 0, 1000), term(1, 1, 1, 0, 1000)],
            grants: vec![
                Granted {
                    shard: 0,
                    candidate: 0,
                    token: 1,
                },
                Granted {
                    shard: 1,
                    candidate: 1,
                    token: 1,
                },
            ],
            ..History::default()
        };
        assert!(check(&history, &sharded()).is_ok());
        // Member 2 acts on shard 1 while member 1 still does.
        history.terms.push(term(1, 2, 2, 900, 2000));
        let error = check(&history, &sharded()).expect_err("must be caught");
        assert_eq!(error.invariant, "one leader at a time");
        assert!(error.detail.starts_with("shard 1: "), "{}", error.detail);
        // Checked as one election, the same terms look like three leaders.
        history.terms.truncate(2);
        assert!(check(&history, &Scenario::default()).is_err());
    }

    /// Tokens and fenced writes are checked per shard: equal tokens in two
    /// shards are fine, a token that goes back within one shard is not.
    #[test]
    fn tokens_and_fenced_writes_are_checked_per_shard() {
        let grant = |shard, candidate, token| Granted {
            shard,
            candidate,
            token,
        };
        let write = |shard, token, decided| Write {
            shard,
            candidate: 0,
            token,
            issued: ms(10),
            decided: ms(decided),
            accepted: true,
        };
        let mut history = History {
            terms: vec![term(0, 0, 5, 0, 100), term(2, 0, 3, 0, 100)],
            grants: vec![grant(0, 0, 5), grant(2, 0, 3)],
            writes: vec![write(0, 5, 20), write(2, 3, 30)],
            ..History::default()
        };
        assert!(check(&history, &sharded()).is_ok());
        history.grants.push(grant(2, 1, 3));
        let error = check(&history, &sharded()).expect_err("must be caught");
        assert_eq!(error.invariant, "tokens strictly increase");
        assert!(error.detail.starts_with("shard 2: "), "{}", error.detail);
        history.grants.pop();
        history.terms.push(term(2, 0, 2, 0, 100));
        history.writes.push(write(2, 2, 40));
        let error = check(&history, &sharded()).expect_err("must be caught");
        assert_eq!(error.invariant, "fenced writes never go back");
        assert!(error.detail.starts_with("shard 2: "), "{}", error.detail);
    }
}
