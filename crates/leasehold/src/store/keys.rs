//! The store primitive: see [`crate::backend`], where it is public and
//! its rules are stated.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::{Clock, TokioClock};
use crate::error::Result;
use crate::grant::{SessionId, SessionLease};

pub mod memory;

/// A store-wide, strictly increasing number given to each commit that
/// writes; 0 is before the first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision(pub u64);

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A live key, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// Its value.
    pub value: String,
    /// The session it is attached to, if any: it ends with that session.
    pub session: Option<SessionId>,
    /// The revision of the commit that created it.
    pub created: Revision,
    /// The revision of the commit that last wrote it.
    pub modified: Revision,
    /// How long its session had left on the store's clock when it was
    /// read, where the store knows it without asking; `None` for a key
    /// without a session, or when it does not.
    pub expires_in: Option<Duration>,
}

/// The live keys under a prefix, ordered by key, as of one revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Range {
    /// The keys.
    pub entries: Vec<Entry>,
    /// The store's revision when it was read: a watch started from it
    /// misses nothing that came after the read.
    pub revision: Revision,
}

/// A condition a commit checks before it writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// No live key has this name.
    Absent(String),
    /// A live key has this name, was created at this revision, and is
    /// attached to this session (or to none).
    Created {
        /// The key.
        key: String,
        /// Its creation revision.
        revision: Revision,
        /// Its session.
        session: Option<SessionId>,
    },
    /// No live key starts with this prefix.
    NoneUnder(String),
}

/// A write of a commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Creates the key, or replaces the value and session of a live one
    /// (keeping its creation revision). A commit that attaches a key to a
    /// session that has ended fails with
    /// [`Error::SessionExpired`](crate::Error::SessionExpired), writing
    /// nothing.
    Put {
        /// The key.
        key: String,
        /// Its value.
        value: String,
        /// The session it ends with, if any.
        session: Option<SessionId>,
    },
    /// Deletes the key; deleting one that is not there writes nothing.
    Delete(String),
}

impl Write {
    /// The key it writes or deletes.
    pub fn key(&self) -> &str {
        match self {
            Write::Put { key, .. } | Write::Delete(key) => key,
        }
    }

    /// The session a put attaches its key to.
    pub fn session(&self) -> Option<SessionId> {
        match self {
            Write::Put { session, .. } => *session,
            Write::Delete(_) => None,
        }
    }
}

/// What a watch has heard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Heard {
    /// Something under the prefix changed at this revision (or nothing
    /// since the watch started, at the revision it started from).
    Changed(Revision),
    /// The store does not answer: changes may go untold until the next
    /// [`Heard::Changed`], which comes as soon as it answers again.
    Unknown {
        /// Why, for messages.
        error: String,
    },
}

/// A watch of a prefix (see [`Keys::watch`]). It holds the latest of what
/// it heard; a reader that wants the state reads it again.
pub type KeyWatch = crate::watch::Receiver<Heard>;

/// The least string above every string that starts with `prefix` (in
/// code point order, which is the byte order of UTF-8 that the keys'
/// collation "C" and SQLite's BINARY sort by); `None` if there is none.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match last {
            '\u{D7FF}' => Some('\u{E000}'),
            c => char::from_u32(u32::from(c) + 1),
        };
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// What a store's primitive tells of itself, besides its operations
/// ([`Keys::properties`]).
#[derive(Clone, Debug)]
pub struct Properties {
    /// Whether its watches tell when a session's end deletes keys, at the
    /// session's expiry too; if not, whoever needs to know reads again at
    /// the [`Entry::expires_in`] of what it read. `false` by default.
    pub tells_expiries: bool,
    /// No grant before this instant: a store that must let something
    /// settle after it was opened says until when (SQLite: a leader of
    /// another file that was at the same path has its command stopped
    /// first); `None`, the default, for one that may grant at once.
    pub grants_from: Option<std::time::Instant>,
    /// The clock its sessions expire by, on which the elections above it
    /// wait; tokio's, by default.
    pub clock: Arc<dyn Clock>,
}

impl Default for Properties {
    fn default() -> Self {
        Properties {
            tells_expiries: false,
            grants_from: None,
            clock: Arc::new(TokioClock),
        }
    }
}

/// The store primitive (see [`crate::backend`] for the rules a backend
/// keeps).
#[async_trait]
pub trait Keys: Send + Sync + fmt::Debug + 'static {
    /// Opens a session with the requested TTL; the store may grant another.
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease>;

    /// Renews the session; returns the TTL granted for this renewal.
    /// Fails with [`Error::SessionExpired`](crate::Error::SessionExpired)
    /// once the session is gone.
    async fn keep_alive(&self, session: SessionId) -> Result<Duration>;

    /// Ends the session and every key attached to it, at once. Ending an
    /// unknown or ended session is not an error.
    async fn close_session(&self, session: SessionId) -> Result<()>;

    /// Writes `writes` at one new revision if every check holds, and
    /// returns it; `None`, having written nothing, if a check fails.
    async fn commit(&self, checks: &[Check], writes: &[Write]) -> Result<Option<Revision>>;

    /// The live keys that start with `prefix`.
    async fn range(&self, prefix: &str) -> Result<Range>;

    /// Watches the keys that start with `prefix` for what changes after
    /// revision `from` (a [`Range::revision`], so that a read and a watch
    /// started from it miss nothing; a change already made after it is
    /// told at once).
    async fn watch(&self, prefix: &str, from: Revision) -> Result<KeyWatch>;

    /// Resolves when the store learns, between renewals, that `session`
    /// has ended; stores that learn it only from a renewal keep the
    /// default, which never resolves.
    async fn session_ended(&self, session: SessionId) {
        let _ = session;
        std::future::pending::<()>().await;
    }

    /// How long `session` has left on the store's clock, for a store whose
    /// reads leave [`Entry::expires_in`] out; the default, for one whose
    /// reads tell it, is `None` without asking.
    async fn time_left(&self, session: SessionId) -> Result<Option<Duration>> {
        let _ = session;
        Ok(None)
    }

    /// What the store tells of itself besides its operations (see
    /// [`Properties`]); the default is [`Properties::default`]. Read once
    /// per handle of the elections above it.
    fn properties(&self) -> Properties {
        Properties::default()
    }

    /// A descriptor that carries this process's sessions where the kernel
    /// tells a dead holder process (see [`Store::session_lock_file`]);
    /// `None`, the default, for a store that has none.
    ///
    /// [`Store::session_lock_file`]: crate::store::Store::session_lock_file
    fn session_lock_file(&self) -> Option<std::fs::File> {
        None
    }
}

#[cfg(all(test, any(feature = "postgres", feature = "sqlite")))]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_at_the_next_string_of_its_length() {
        assert_eq!(prefix_end("ab").as_deref(), Some("ac"));
        assert_eq!(prefix_end("a:").as_deref(), Some("a;"));
        assert_eq!(prefix_end("a\u{D7FF}").as_deref(), Some("a\u{E000}"));
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_end(""), None);
        assert_eq!(prefix_end("\u{10FFFF}"), None);
    }
}
