//! The store abstraction: sessions (leases) and grants, decided by the
//! store's own atomic compare-and-swap.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::names::{CandidateId, ElectionName};

#[cfg(any(
    feature = "sqlite",
    feature = "etcd",
    feature = "zookeeper",
    feature = "postgres"
))]
mod cleanup;
#[cfg(feature = "etcd")]
pub mod etcd;
mod local;
pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod security;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod url;
pub(crate) mod watch_driver;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

pub use crate::grant::{FencingToken, Grant, Leader, SessionId, SessionLease};
pub use security::{Password, Secret, Security};
#[cfg(feature = "postgres")]
pub(crate) use url::postgres_connect;
pub use url::{PgSslMode, StoreUrl, open, open_read_only, release_orphaned};
pub(crate) use watch_driver::{known_only, status_of};

/// `session`'s key in a store that keeps session ids as signed 64-bit
/// integers (SQLite, PostgreSQL, etcd): [`Error::SessionExpired`] for an
/// id such a store never issued.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "etcd"))]
pub(crate) fn session_key(session: SessionId) -> Result<i64> {
    session
        .to_i64()
        .ok_or(crate::error::Error::SessionExpired(session))
}

/// The key prefix of the etcd store when its URL names none.
pub(crate) const fn etcd_default_prefix() -> &'static str {
    "/leasehold"
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
/// It changes only when the holder does (a renewal is not a change); while
/// the store cannot be read it keeps the last known leader.
pub type LeaderWatch = crate::watch::Receiver<Option<Leader>>;

/// What a watch knows of an election's holder: the holder (or none), or
/// that the store did not answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaderStatus {
    /// The store answered: the holder, or `None` when the election has none.
    Known(Option<Leader>),
    /// The store did not answer the last read: who holds the election is
    /// unknown until it answers again. The last known holder may have
    /// stepped down meanwhile.
    Unknown {
        /// Why the store could not be read, for messages.
        error: String,
    },
}

impl LeaderStatus {
    /// The holder, when known.
    pub fn leader(&self) -> Option<&Leader> {
        match self {
            LeaderStatus::Known(leader) => leader.as_ref(),
            LeaderStatus::Unknown { .. } => None,
        }
    }

    /// Whether the store's answer is missing.
    pub fn is_unknown(&self) -> bool {
        matches!(self, LeaderStatus::Unknown { .. })
    }

    /// Whether `other` says the same: the same grant (whatever the time left
    /// on it), no holder in both, or unknown in both.
    pub fn same_as(&self, other: &LeaderStatus) -> bool {
        match (self, other) {
            (LeaderStatus::Known(Some(a)), LeaderStatus::Known(Some(b))) => a.same_grant(b),
            (LeaderStatus::Known(None), LeaderStatus::Known(None))
            | (LeaderStatus::Unknown { .. }, LeaderStatus::Unknown { .. }) => true,
            _ => false,
        }
    }
}

/// A watch on one election that also tells when the store cannot be read
/// ([`Store::watch_status`]); like a [`LeaderWatch`] it holds the latest
/// state and changes only when the holder, or whether it is known, does.
pub type StatusWatch = crate::watch::Receiver<LeaderStatus>;

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

    /// Releases `grant` on behalf of its holder's process, which is known to
    /// be dead: its host saw it die and confirmed that nothing it started is
    /// left (a runner's guard does this). Works from any handle on the store,
    /// not only the one whose session holds the grant, and is guarded by the
    /// token exactly like [`Store::resign`]: it never removes a successor's
    /// grant, and fails with [`crate::Error::NotHolder`] when the grant is
    /// already gone.
    ///
    /// The default is [`Store::resign`], for stores whose release does not
    /// depend on the holder's connection.
    async fn release_orphaned(&self, grant: &Grant) -> Result<()> {
        self.resign(grant).await
    }

    /// The current leader of `election`, if any.
    async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>>;

    /// Watches `election`: the receiver is updated whenever its holder
    /// changes (a new grant, a release, an expiry), never for a renewal.
    /// A read that fails is retried until it succeeds, and what it finds is
    /// published.
    async fn watch(&self, election: &ElectionName) -> Result<LeaderWatch>;

    /// Watches `election` as [`Store::watch`] does, and also publishes
    /// [`LeaderStatus::Unknown`] when the store cannot be read (it is
    /// unreachable, or the connection the watch relies on is lost), then the
    /// holder as soon as a read succeeds again, even if it is unchanged.
    ///
    /// The default adapts [`Store::watch`], and so never reports the holder
    /// unknown; backends override it.
    async fn watch_status(&self, election: &ElectionName) -> Result<StatusWatch> {
        Ok(status_of(self.watch(election).await?))
    }

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

    /// For a store that tells a dead holder process by something the
    /// kernel ends with the process (SQLite on one host: a lock on its
    /// notify file), a descriptor that carries this process's sessions
    /// there: a helper process that holds it keeps them alive for that
    /// test until it has exited too (`leasehold run` gives it to its guard,
    /// which exits only after killing the command's group). Never written
    /// to. `None` for the other stores, the default.
    fn session_lock_file(&self) -> Option<std::fs::File> {
        None
    }
}
