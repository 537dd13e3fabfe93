//! The one public error type of the library.

use std::time::Duration;

use crate::ids::{FencingToken, SessionId};

/// Everything that can go wrong in leasehold.
///
/// Each failure a caller may want to react to differently is its own variant:
/// a lost race is not an outage, and an outage is not bad input.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed something that can never work: a bad election name,
    /// URL, TTL or configuration. Retrying will not help.
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// What was invalid, e.g. "election name".
        what: &'static str,
        /// Why, in words a user can act on.
        reason: String,
    },

    /// A guarded operation (resign, a fenced write) was made with a grant that
    /// is no longer the current one: the election has been released, expired
    /// or taken by a successor.
    #[error("not the holder of election {election} (token {token})")]
    NotHolder {
        /// The election concerned (its name).
        election: String,
        /// The token the caller presented.
        token: FencingToken,
    },

    /// The store no longer knows the session: it expired (the store's clock
    /// passed its TTL without a renewal) or was closed. Every grant attached
    /// to it is gone.
    #[error("session {0} expired")]
    SessionExpired(SessionId),

    /// The store could not be reached or did not answer in time. The state of
    /// the store is unknown; the operation may be retried.
    #[error("store unavailable: {reason}")]
    Unavailable {
        /// What failed.
        reason: String,
        /// The underlying cause, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    /// The store refused this client: a certificate that does not verify
    /// (either side's), a wrong user name or password, or a permission
    /// the user lacks. Retrying will not help until an operator changes
    /// the credentials, files or grants. The text names the cause in one
    /// line and never holds a password or key.
    #[error("store refused access: {0}")]
    Denied(String),

    /// The store holds data leasehold cannot read: not a leasehold store, or
    /// damaged. Nothing was written.
    #[error("store corrupt or not a leasehold store: {0}")]
    Corrupt(String),

    /// There is no leasehold store where the URL points (opened read-only:
    /// nothing has campaigned there yet, and nothing was created). Nothing
    /// was written.
    #[error("no leasehold store {0}")]
    NotFound(String),

    /// The store changed under this handle: the SQLite file it opened was
    /// deleted, moved or replaced by another file. The handle is dead —
    /// its sessions ended ([`Error::SessionExpired`] on renewal) and it
    /// writes nothing more, to either file; drop it and open the store
    /// again (a new file starts fencing tokens again from 1).
    #[error("store replaced: {0}")]
    Replaced(String),

    /// The store was written by a newer leasehold whose schema this version
    /// does not understand. Nothing was written.
    #[error(
        "store schema version {found} is newer than this leasehold supports ({supported}); upgrade leasehold"
    )]
    IncompatibleSchema {
        /// The version found in the store.
        found: i64,
        /// The newest version this build understands.
        supported: i64,
    },

    /// A fenced write presented a token lower than the highest the resource
    /// has accepted: a newer leader has written since. The writer is no
    /// longer leader, whatever it believes (DESIGN rule 5).
    #[error("stale fencing token {presented} for {resource}: it has accepted token {highest}")]
    Stale {
        /// The protected resource.
        resource: String,
        /// The token the writer presented.
        presented: FencingToken,
        /// The highest token the resource has accepted.
        highest: FencingToken,
    },

    /// An operation did not finish within the time the caller allowed.
    #[error("timed out after {0:?}")]
    Timeout(Duration),

    /// The store does not offer what was asked of it (a store type written
    /// outside this crate that keeps no notes, say). Retrying will not help.
    #[error("{0}")]
    Unsupported(String),

    /// The store records another setup under this name than the one asked
    /// for: a group of another kind or count ([`crate::admin`]). Nothing
    /// is left written; retrying will not help until every member asks
    /// for the same.
    #[error("{0}")]
    Conflict(String),
}

impl Error {
    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            what,
            reason: reason.into(),
        }
    }

    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn unavailable(
        reason: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Unavailable {
            reason: reason.into(),
            source: Some(Box::new(source)),
        }
    }

    /// `what` got no answer from the store within `after`.
    #[cfg(any(feature = "postgres", feature = "zookeeper"))]
    pub(crate) fn no_answer(what: &str, after: Duration) -> Self {
        Error::Unavailable {
            reason: format!("{what}: no answer within {after:?}"),
            source: None,
        }
    }

    /// Whether retrying the same operation later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::Timeout(_))
    }
}

/// `error` and its causes as one line, each message once: for the reason
/// of an [`Error::Unavailable`] that quotes a client library's error, whose
/// own message may leave the cause (say, "Connection refused") to its
/// source. Never `Debug` output.
#[cfg(any(feature = "postgres", feature = "zookeeper"))]
pub(crate) fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let text = next.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = next.source();
    }
    line
}

/// The most characters of a value [`quoted`] shows.
pub const QUOTED_CHARS: usize = 40;

/// `value` quoted for a message, as `{:?}` quotes it (control characters
/// escaped), but only its first [`QUOTED_CHARS`] characters followed by
/// `…` when it is longer: an error names a value a user gave, it does not
/// repeat a huge one. Say its length and the limit beside it when the
/// length is what is wrong.
pub fn quoted(value: &str) -> String {
    match value.char_indices().nth(QUOTED_CHARS) {
        None => format!("{value:?}"),
        Some((end, _)) => format!("{:?}…", &value[..end]),
    }
}

/// The most characters of a URL or path [`shortened`] shows whole.
pub const SHORTENED_CHARS: usize = 200;

/// `value` (a URL, a path, a program) as a message shows it: whole up to
/// [`SHORTENED_CHARS`] characters, else its first ones, `…` and how many
/// bytes it has, so that an error line stays one short line.
pub fn shortened(value: &str) -> std::borrow::Cow<'_, str> {
    match value.char_indices().nth(SHORTENED_CHARS) {
        None => std::borrow::Cow::Borrowed(value),
        Some((end, _)) => {
            std::borrow::Cow::Owned(format!("{}… ({} bytes)", &value[..end], value.len()))
        }
    }
}

/// Result alias used throughout the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::{QUOTED_CHARS, quoted};

    #[test]
    fn long_values_are_shortened_with_their_length() {
        assert_eq!(super::shortened("sqlite:/a"), "sqlite:/a");
        let long = "é".repeat(super::SHORTENED_CHARS + 1);
        let shown = super::shortened(&long);
        assert!(
            shown.ends_with(&format!("… ({} bytes)", long.len())),
            "{shown}"
        );
        assert_eq!(
            shown.chars().filter(|&c| c == 'é').count(),
            super::SHORTENED_CHARS
        );
    }

    #[test]
    fn quoted_values_are_cut_short() {
        assert_eq!(quoted("a\"b"), r#""a\"b""#);
        assert_eq!(
            quoted(&"é".repeat(QUOTED_CHARS)),
            format!("{:?}", "é".repeat(40))
        );
        let long = format!("{}{}", "é".repeat(QUOTED_CHARS), "x".repeat(100_000));
        assert_eq!(quoted(&long), format!("{:?}…", "é".repeat(40)));
    }
}
