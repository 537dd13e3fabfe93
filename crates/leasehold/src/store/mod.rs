//! The store abstraction: sessions (leases) and grants, decided by the
//! store's own atomic compare-and-swap.

use std::fmt;
use std::time::Duration;

use crate::watch;
use async_trait::async_trait;

use crate::error::{Error, Result};
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

pub use url::{StoreUrl, open, open_read_only};

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
/// It changes only when the holder does (a renewal is not a change); while
/// the store cannot be read it keeps the last known leader.
pub type LeaderWatch = watch::Receiver<Option<Leader>>;

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
pub type StatusWatch = watch::Receiver<LeaderStatus>;

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
}

/// A value a watch task publishes: a [`LeaderWatch`]'s `Option<Leader>`
/// or a [`StatusWatch`]'s [`LeaderStatus`], so that every backend's watch
/// task uses the same helpers for either.
pub(crate) trait Published: Send + Sync + 'static {
    /// Records what a read found; `true` when receivers must hear of it:
    /// another holder, or the first answer after the store could not be
    /// read. A renewal (the same grant) is not news.
    fn record(&mut self, leader: Option<Leader>) -> bool;
    /// Records a failed read; `true` when receivers must hear of it.
    fn record_failure(&mut self, error: &Error) -> bool;
}

impl Published for Option<Leader> {
    fn record(&mut self, leader: Option<Leader>) -> bool {
        let same = match (&*self, &leader) {
            (Some(a), Some(b)) => a.same_grant(b),
            (None, None) => true,
            _ => false,
        };
        if !same {
            *self = leader;
        }
        !same
    }

    /// A [`LeaderWatch`] keeps the last known leader.
    fn record_failure(&mut self, _: &Error) -> bool {
        false
    }
}

impl Published for LeaderStatus {
    fn record(&mut self, leader: Option<Leader>) -> bool {
        let read = LeaderStatus::Known(leader);
        let news = !self.same_as(&read);
        if news {
            *self = read;
        }
        news
    }

    fn record_failure(&mut self, error: &Error) -> bool {
        if self.is_unknown() {
            return false;
        }
        *self = LeaderStatus::Unknown {
            error: error.to_string(),
        };
        true
    }
}

/// One read of the store by a watch task. With the `testing` feature, a
/// read that a test made fail ([`crate::testing::fail_watch_reads`]) fails
/// here, inside the backend, as a store that does not answer would.
pub(crate) async fn watch_read<T>(
    election: &ElectionName,
    read: impl Future<Output = Result<T>>,
) -> Result<T> {
    #[cfg(feature = "testing")]
    if let Some(error) = crate::testing::injected_watch_read_failure(election) {
        return Err(error);
    }
    #[cfg(not(feature = "testing"))]
    let _ = election;
    read.await
}

/// For watch tasks: runs `read` until it succeeds, pausing `pause` after
/// each failure, and publishes the failure on `tx` (a [`StatusWatch`]
/// turns unknown); `None` once every receiver of `tx` is gone.
#[cfg(any(feature = "etcd", feature = "postgres", feature = "zookeeper"))]
pub(crate) async fn read_until_ok<T, V, Fut>(
    tx: &watch::Sender<V>,
    election: &ElectionName,
    pause: Duration,
    mut read: impl FnMut() -> Fut,
) -> Option<T>
where
    V: Published,
    Fut: Future<Output = Result<T>>,
{
    loop {
        match watch_read(election, read()).await {
            Ok(value) => return Some(value),
            Err(error) => {
                tracing::debug!(%election, %error, "re-reading the leader failed; retrying");
                publish_failure(tx, &error);
                tokio::select! {
                    biased;
                    () = tx.closed() => return None,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}

/// Publishes `leader` on a watch sender if it is news: another grant than
/// the one published (a renewal alone is not a change), or the first
/// answer after a failure.
pub(crate) fn publish_leader<V: Published>(tx: &watch::Sender<V>, leader: Option<Leader>) {
    tx.send_if_modified(|seen| seen.record(leader));
}

/// Publishes that a read failed: a [`StatusWatch`] turns unknown (once),
/// a [`LeaderWatch`] keeps its last known leader.
pub(crate) fn publish_failure<V: Published>(tx: &watch::Sender<V>, error: &Error) {
    tx.send_if_modified(|seen| seen.record_failure(error));
}

/// A [`LeaderWatch`] fed by a [`StatusWatch`]: the holder whenever it
/// changes; while it is unknown, the last known one. Its task ends when
/// every receiver is gone (dropping `status`, which ends the store's).
pub(crate) fn known_only(mut status: StatusWatch) -> LeaderWatch {
    let first = status.borrow_and_update().leader().cloned();
    let (tx, rx) = watch::channel(first);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                biased;
                () = tx.closed() => return,
                changed = status.changed() => if changed.is_err() { return },
            }
            let known = match &*status.borrow_and_update() {
                LeaderStatus::Known(leader) => Some(leader.clone()),
                LeaderStatus::Unknown { .. } => None,
            };
            if let Some(leader) = known {
                publish_leader(&tx, leader);
            }
        }
    });
    rx
}

/// A [`StatusWatch`] fed by a [`LeaderWatch`], for stores that do not tell
/// when they cannot be read: the holder is always reported known.
pub(crate) fn status_of(mut leaders: LeaderWatch) -> StatusWatch {
    let first = leaders.borrow_and_update().clone();
    let (tx, rx) = watch::channel(LeaderStatus::Known(first));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                biased;
                () = tx.closed() => return,
                changed = leaders.changed() => if changed.is_err() { return },
            }
            let leader = leaders.borrow_and_update().clone();
            publish_leader(&tx, leader);
        }
    });
    rx
}
