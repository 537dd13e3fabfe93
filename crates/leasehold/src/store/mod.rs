//! The store abstraction: sessions (leases) and grants, decided by the
//! store's own atomic compare-and-swap.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::error::Result;
use crate::names::{CandidateId, ElectionName};

#[cfg(feature = "etcd")]
pub mod etcd;
mod local;
pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod url;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

pub use url::{StoreUrl, open};

/// The key prefix of the etcd store when its URL names none.
pub(crate) const fn etcd_default_prefix() -> &'static str {
    "/leasehold"
}

/// Identifies one session (lease) in one store. Never reused by the store.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId({:x})", self.0)
    }
}

/// A fencing token: strictly increasing per election over every grant ever
/// made, kept by renewals, never reused (DESIGN rule 2).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct FencingToken(pub u64);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A session as the store granted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLease {
    /// The session's id.
    pub id: SessionId,
    /// The TTL the store actually granted; it may differ from the request.
    pub ttl: Duration,
}

/// "Candidate X owns election E": attached to a session, it dies with the
/// session or when released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The election owned.
    pub election: ElectionName,
    /// Who owns it.
    pub candidate: CandidateId,
    /// The session the grant is attached to.
    pub session: SessionId,
    /// The fencing token of this grant.
    pub token: FencingToken,
}

/// The current holder of an election, as seen by the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// Who holds the election.
    pub candidate: CandidateId,
    /// The holder's fencing token.
    pub token: FencingToken,
    /// How long the holder's session has left on the store's clock, when it
    /// was read.
    pub expires_in: Duration,
}

impl Leader {
    /// Whether `other` is the same grant (same holder and token), whatever
    /// the time left on it.
    pub fn same_grant(&self, other: &Leader) -> bool {
        self.token == other.token && self.candidate == other.candidate
    }
}

/// The state of one election, as listed by [`Store::elections`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectionState {
    /// The election.
    pub election: ElectionName,
    /// Its current holder, if any.
    pub leader: Option<Leader>,
}

/// A watch on one election: always holds the latest known leader (or `None`),
/// so a slow reader skips intermediate states but never misses the final one.
pub type LeaderWatch = watch::Receiver<Option<Leader>>;

/// A store that decides elections.
///
/// ### To ensure correctness, an implementation must guarantee:
/// - **One grant**: at most one live grant per election at any instant of the
///   store's own time; [`Store::campaign`] acquires with a single atomic
///   compare-and-swap.
/// - **Monotonic tokens**: each grant of an election carries a token strictly
///   greater than every earlier grant's, also across restarts of the store.
/// - **Server-side expiry**: a session expires by the store's own clock `ttl`
///   after the store *processed* its creation or last renewal, never earlier.
///   A holder computes its deadline from when it *sent* the request, so the
///   holder always gives up first.
/// - **Guarded release**: [`Store::resign`] removes a grant only if it still
///   carries the presented token.
/// - **Cancellation**: if a [`Store::campaign`] future is dropped before it
///   completes, the session does not end up holding the election.
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug {
    /// Opens a session with the requested TTL; the store may grant another.
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease>;

    /// Renews the session; returns the TTL granted for this renewal.
    /// Fails with [`crate::Error::SessionExpired`] once the session is gone.
    async fn keep_alive(&self, session: SessionId) -> Result<Duration>;

    /// Ends the session and releases every grant attached to it at once.
    /// Closing an unknown or expired session is not an error.
    async fn close_session(&self, session: SessionId) -> Result<()>;

    /// Resolves when `session` holds `election`, with the grant. Waits while
    /// another session holds it. If the session already holds the election,
    /// returns its existing grant.
    async fn campaign(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Grant>;

    /// Releases `grant` if, and only if, it is still the current grant of its
    /// election; otherwise fails with [`crate::Error::NotHolder`].
    async fn resign(&self, grant: &Grant) -> Result<()>;

    /// The current leader of `election`, if any.
    async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>>;

    /// Watches `election`: the receiver is updated whenever its holder
    /// changes (a new grant, a release, an expiry).
    async fn watch(&self, election: &ElectionName) -> Result<LeaderWatch>;

    /// Every election the store knows, with its current leader.
    async fn elections(&self) -> Result<Vec<ElectionState>>;

    /// Resolves when the store learns, between renewals, that `session` has
    /// ended (a ZooKeeper client told the session expired, say), so that
    /// leadership ends at once rather than at the next renewal. Stores that
    /// learn it only from a renewal keep the default, which never resolves.
    async fn session_ended(&self, session: SessionId) {
        let _ = session;
        std::future::pending::<()>().await;
    }
}

/// For watch tasks: runs `read` until it succeeds, pausing `pause` after
/// each failure; `None` once every receiver of `tx` is gone.
#[cfg(any(feature = "etcd", feature = "postgres"))]
pub(crate) async fn read_until_ok<T, Fut>(
    tx: &watch::Sender<Option<Leader>>,
    election: &ElectionName,
    pause: Duration,
    mut read: impl FnMut() -> Fut,
) -> Option<T>
where
    Fut: Future<Output = Result<T>>,
{
    loop {
        match read().await {
            Ok(value) => return Some(value),
            Err(error) => {
                tracing::debug!(%election, %error, "re-reading the leader failed; retrying");
                tokio::select! {
                    biased;
                    () = tx.closed() => return None,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}

/// Publishes `leader` on a [`LeaderWatch`] sender if it is another grant
/// than the one published (a renewal alone is not a change).
pub(crate) fn publish_leader(tx: &watch::Sender<Option<Leader>>, leader: Option<Leader>) {
    tx.send_if_modified(|seen| {
        let same = match (&*seen, &leader) {
            (Some(a), Some(b)) => a.same_grant(b),
            (None, None) => true,
            _ => false,
        };
        if !same {
            *seen = leader;
        }
        !same
    });
}
