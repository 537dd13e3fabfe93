//! Fencing at the resource (DESIGN rule 5): the protected resource records
//! the highest fencing token it has accepted and rejects a lower one,
//! atomically with the protected write.
//!
//! Leases alone cannot stop a holder that pauses (GC, SIGSTOP, a stalled
//! VM): it wakes believing it still leads. Only the resource can refuse its
//! writes, because only the resource sees both the old and the new leader's
//! tokens. Every check here accepts a token *equal* to the highest (a leader
//! writes many times with one token) and refuses a lower one.
//!
//! - [`MemoryFence`]: resources inside one process.
//! - [`sqlite::check_and_advance`]: inside the caller's own rusqlite
//!   transaction, so the check and the write commit or roll back together;
//!   [`sqlite::SqliteFence`] for a file-backed [`Fence`].
//! - PostgreSQL (feature `postgres`): `postgres::check_and_advance` inside
//!   the caller's tokio-postgres transaction, and the same SQL to paste.
//! - etcd (feature `etcd`): [`etcd::EtcdFence::put`] writes only while
//!   the election's leader key still carries the writer's token.
//! - HTTP (feature `http`): the `Fencing-Token` header and a tower layer
//!   that enforces it in front of a service.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::grant::FencingToken;

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

/// A resource-side record of the highest accepted token per resource.
#[async_trait]
pub trait Fence: Send + Sync {
    /// Accepts `token` for `resource` if no higher token was accepted before,
    /// and records it; otherwise fails with [`Error::Stale`].
    async fn check_and_advance(&self, resource: &str, token: FencingToken) -> Result<()>;
}

/// Fencing for resources inside one process.
#[derive(Debug, Default)]
pub struct MemoryFence {
    highest: Mutex<HashMap<String, u64>>,
}

impl MemoryFence {
    /// An empty fence.
    pub fn new() -> Self {
        MemoryFence::default()
    }

    /// Runs `write` only if `token` is not stale for `resource`, holding the
    /// fence's lock across the check and the write so that no lower token
    /// can slip in between.
    pub fn fenced<T>(
        &self,
        resource: &str,
        token: FencingToken,
        write: impl FnOnce() -> T,
    ) -> Result<T> {
        let mut highest = crate::mutex::lock(&self.highest);
        advance(&mut highest, resource, token)?;
        Ok(write())
    }

    /// The highest token accepted for `resource`, if any.
    pub fn highest(&self, resource: &str) -> Option<FencingToken> {
        let highest = crate::mutex::lock(&self.highest);
        highest.get(resource).copied().map(FencingToken)
    }
}

fn advance(highest: &mut HashMap<String, u64>, resource: &str, token: FencingToken) -> Result<()> {
    match highest.get_mut(resource) {
        Some(seen) if *seen > token.0 => Err(Error::Stale {
            resource: resource.to_owned(),
            presented: token,
            highest: FencingToken(*seen),
        }),
        Some(seen) => {
            *seen = token.0;
            Ok(())
        }
        None => {
            highest.insert(resource.to_owned(), token.0);
            Ok(())
        }
    }
}

#[async_trait]
impl Fence for MemoryFence {
    async fn check_and_advance(&self, resource: &str, token: FencingToken) -> Result<()> {
        self.fenced(resource, token, || ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn equal_is_accepted_lower_is_refused() {
        let fence = MemoryFence::new();
        assert!(fence.fenced("x", FencingToken(41), || ()).is_ok());
        assert!(fence.fenced("x", FencingToken(41), || ()).is_ok());
        assert!(fence.fenced("x", FencingToken(42), || ()).is_ok());
        match fence.fenced("x", FencingToken(41), || panic!("must not write")) {
            Err(Error::Stale {
                presented,
                highest,
                resource,
            }) => {
                assert_eq!((presented.0, highest.0, resource.as_str()), (41, 42, "x"));
            }
            other => panic!("expected Stale, got {other:?}"),
        }
        assert!(
            fence.fenced("y", FencingToken(1), || ()).is_ok(),
            "resources are independent"
        );
    }

    proptest! {
        /// Whatever the order writers present tokens in, the resource ends up
        /// with a non-decreasing sequence of accepted tokens, and every
        /// refusal was of a token below one accepted earlier.
        #[test]
        fn accepted_tokens_never_decrease(tokens in proptest::collection::vec(1u64..20, 1..200)) {
            let fence = MemoryFence::new();
            let mut accepted: Vec<u64> = Vec::new();
            for t in tokens {
                match fence.fenced("r", FencingToken(t), || t) {
                    Ok(v) => accepted.push(v),
                    Err(Error::Stale { highest, .. }) => {
                        prop_assert!(highest.0 > t);
                        prop_assert_eq!(Some(&highest.0), accepted.iter().max());
                    }
                    Err(e) => prop_assert!(false, "unexpected {e}"),
                }
            }
            prop_assert!(accepted.windows(2).all(|w| w[0] <= w[1]));
        }
    }
}
