//! The store: where elections are decided, by its own atomic
//! compare-and-swap. An application opens one from its URL ([`open`]) and
//! gives it to an [`crate::Elector`]; the [`Store`] trait and the types
//! of its methods are here. What a new backend implements, and the stores
//! leasehold ships by their own types, are in [`crate::backend`].

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::names::{CandidateId, ElectionName};

pub(crate) mod cleanup;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod keyed;
pub(crate) mod keys;
mod layout;
pub(crate) mod memory;
pub(crate) mod note_watch;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
mod security;
pub(crate) mod shared_read;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;
mod url;
pub(crate) mod watch_driver;
pub(crate) mod wrap;
#[cfg(feature = "zookeeper")]
pub(crate) mod zookeeper;

pub use crate::grant::{FencingToken, Grant, Leader, SessionId, SessionLease};
pub use layout::Layout;
pub use security::{Password, Secret, Security};
#[cfg(feature = "postgres")]
pub(crate) use url::postgres_connect;
pub use url::{
    Access, ClusterUrl, MAX_FILE_PATH_LEN, PASSWORD_ENV, PgSslMode, PostgresUrl, StoreUrl, open,
};

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

/// A note a session keeps on an election ([`Store::put_note`]): how the
/// candidates of an election make themselves known to each other through
/// the store, without any connection between them (their priority and
/// place in the line of standbys, a leader's chosen successor, a request
/// to hand leadership over). The store removes it when its session ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// The session that keeps the note.
    pub session: SessionId,
    /// Its name: one note per session, election and name.
    pub name: String,
    /// The store's order of notes: a note first put later has a greater
    /// order (putting it again keeps its order). Comparable only between
    /// notes of one election.
    pub order: u64,
    /// What it says.
    pub text: String,
}

/// The longest note text a store keeps, in bytes.
pub const MAX_NOTE_TEXT: usize = 512;

/// Checks a note's name (1–16 of `a-z`, `0-9`, `-`) and text (at most
/// [`MAX_NOTE_TEXT`] bytes, no control characters), as every store does
/// before writing.
pub fn check_note(name: &str, text: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 16
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(crate::error::Error::invalid(
            "note name",
            format!("{name:?}: 1 to 16 of a-z, 0-9 and -"),
        ));
    }
    if text.len() > MAX_NOTE_TEXT {
        return Err(crate::error::Error::invalid(
            "note",
            format!("{} bytes long, at most {MAX_NOTE_TEXT} allowed", text.len()),
        ));
    }
    if text.chars().any(char::is_control) {
        return Err(crate::error::Error::invalid(
            "note",
            "contains a control character",
        ));
    }
    Ok(())
}

/// A watch on the notes of one election: always holds the live notes, in
/// order. Updated after every put and delete, and when a session that
/// keeps notes ends (at its expiry on the store's clock at the latest).
/// While the store cannot be read it keeps the last notes read.
pub type NoteWatch = crate::watch::Receiver<Vec<Note>>;

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

    /// One acquisition attempt that never waits, for a campaign that may
    /// skip the line of standbys ([`crate::admin`]) because nobody is in
    /// it: grants `election` to `session` only if nobody holds it (this
    /// session neither) and no live session keeps a note on it, both
    /// checked atomically with the grant; otherwise `None`, having
    /// written nothing. So an uncontended campaign costs one request, and
    /// a candidate waiting in line is never overtaken. Fails with
    /// [`crate::Error::SessionExpired`] once the session has ended.
    ///
    /// The cancellation obligation of [`Store::campaign`] holds. The
    /// default never grants: the caller takes the line.
    async fn try_campaign_unwaited(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Option<Grant>> {
        let _ = (session, election, candidate);
        Ok(None)
    }

    /// Releases `grant` if, and only if, it is still the current grant of its
    /// election — the same token, held by the same session; otherwise fails
    /// with [`crate::Error::NotHolder`]. Another session never releases it,
    /// even one of the same candidate id that read its token.
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

    /// Watches the election of `grant` for its holder, the holder itself
    /// (a leader's monitor): as [`Store::watch`], but while `grant` holds,
    /// the watch does not read the store again at its expiry, since the
    /// holder's session ends its leadership at its own deadline; so holding
    /// many elections costs no request per election per renewal period.
    /// A store may start it from the grant itself, unread (etcd watches
    /// from the grant's revision on): the holder's `expires_in` then reads
    /// zero, until another holder is read.
    async fn watch_grant(&self, grant: &Grant) -> Result<LeaderWatch>;

    /// Watches `election` as [`Store::watch`] does, and also publishes
    /// [`LeaderStatus::Unknown`] when the store cannot be read (it is
    /// unreachable, or the connection the watch relies on is lost), then the
    /// holder as soon as a read succeeds again, even if it is unchanged.
    async fn watch_status(&self, election: &ElectionName) -> Result<StatusWatch>;

    /// Every election the store knows, with its current leader.
    async fn elections(&self) -> Result<Vec<ElectionState>>;

    /// Resolves when the store learns, between renewals, that `session` has
    /// ended (a ZooKeeper client told the session expired, say), so that
    /// leadership ends at once rather than at the next renewal; never, for
    /// a store that learns it only from a renewal.
    async fn session_ended(&self, session: SessionId);

    /// Puts `text` as `session`'s note `name` on `election`, replacing
    /// its earlier text (the note keeps its order). Fails with
    /// [`crate::Error::SessionExpired`] if the session has ended, and with
    /// [`crate::Error::InvalidInput`] if [`check_note`] refuses the name
    /// or text. The note ends with the session or [`Store::delete_note`].
    async fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()>;

    /// Deletes `session`'s note `name` on `election`; deleting a note that
    /// is not there is not an error.
    async fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()>;

    /// Replaces the text of `session`'s note `name` on `election` if it is
    /// there — whoever asks: a leader marks the standby it chose this way
    /// ([`crate::admin`]) — keeping its order and its session; `false`,
    /// writing nothing, if there is no such live note. Never creates one,
    /// so it cannot bring back a note that its session just deleted.
    async fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool>;

    /// Watches one note, `session`'s note `name` on `election`: the watch
    /// holds it (a one-note list), or an empty list while there is none.
    /// A waiting candidate watches the one ahead of it in line this way,
    /// and its own note, so that a change elsewhere in the line wakes
    /// nobody else: the others' changes never reach the watcher.
    async fn watch_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<NoteWatch>;

    /// The live notes on `election` (those of sessions that have not
    /// ended), in order.
    async fn notes(&self, election: &ElectionName) -> Result<Vec<Note>>;

    /// Watches the notes on `election` (see [`NoteWatch`]).
    async fn watch_notes(&self, election: &ElectionName) -> Result<NoteWatch>;

    /// As [`Store::watch_notes`], for the holder of a grant that
    /// [`Store::try_campaign_unwaited`] made: the store showed no live note
    /// on the election when it made it, so it may start the watch from
    /// there, empty, without a read (etcd does, from the grant's revision
    /// on). The default is [`Store::watch_notes`].
    async fn watch_notes_since_unwaited(&self, grant: &Grant) -> Result<NoteWatch> {
        self.watch_notes(&grant.election).await
    }

    /// The token of the last grant of `election` that its holder released
    /// ([`Store::resign`], [`Store::release_orphaned`]), recorded
    /// atomically with the release; `None` if none ever was. A grant that
    /// ended by its session's expiry or closing is not recorded, so a
    /// successor tells a release from an expiry (lock-delay).
    async fn last_release(&self, election: &ElectionName) -> Result<Option<FencingToken>>;

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
