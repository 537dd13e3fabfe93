//! The identifiers a store hands out: session ids and fencing tokens.
//! Plain numbers with no other module behind them, so that every module
//! (errors included) can name them.

use std::fmt;

/// Identifies one session (lease) in one store. Never reused by the store.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

impl SessionId {
    /// The id as the signed 64-bit key that SQLite, PostgreSQL and etcd
    /// keep; `None` above `i64::MAX`, an id none of them issues (such a
    /// session is unknown to them).
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "etcd"))]
    pub(crate) fn to_i64(self) -> Option<i64> {
        i64::try_from(self.0).ok()
    }

    /// The id of a session that SQLite, PostgreSQL or etcd keeps as a
    /// signed 64-bit key. They issue positive keys; a negative one reads as
    /// 0, an id they never issue.
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "etcd"))]
    pub(crate) fn from_stored(key: i64) -> Self {
        SessionId(u64::try_from(key).unwrap_or(0))
    }

    /// The id of a ZooKeeper session: ZooKeeper's `i64`, every bit kept
    /// (its top bits name the server that created it, so it may be
    /// negative).
    #[cfg(feature = "zookeeper")]
    pub(crate) fn from_bits(id: i64) -> Self {
        SessionId(id.cast_unsigned())
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

impl FencingToken {
    /// The largest token a store issues: `i64::MAX`, the largest that
    /// SQLite, PostgreSQL, etcd, ZooKeeper and the fences keep. A grant
    /// that would need a larger one fails with [`crate::Error::Corrupt`].
    pub(crate) const LAST: FencingToken = FencingToken(i64::MAX.unsigned_abs());

    /// The token as the signed 64-bit integer that SQLite, PostgreSQL and
    /// etcd keep; `None` above `i64::MAX`, a token none of them issues.
    pub fn to_i64(self) -> Option<i64> {
        i64::try_from(self.0).ok()
    }

    /// The token as a signed 64-bit integer, `i64::MAX` when it is larger:
    /// for comparing with tokens a store issued, none of which is larger
    /// than `i64::MAX`, so such a token matches none of them but the last
    /// one an election can be granted (stores compare its session too).
    pub fn to_i64_saturating(self) -> i64 {
        self.to_i64().unwrap_or(i64::MAX)
    }

    /// A token read from a store that keeps tokens as signed 64-bit
    /// integers. Stores issue only positive tokens; a negative value reads
    /// as 0, lower than every token ever granted, so that a fence never
    /// accepts it.
    pub fn from_stored(value: i64) -> Self {
        FencingToken(u64::try_from(value).unwrap_or(0))
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(all(test, any(feature = "etcd", feature = "zookeeper")))]
mod tests {
    use super::FencingToken;

    /// The last token is the largest signed 64-bit integer, and no token
    /// above it has one.
    #[test]
    fn the_last_token_is_the_largest_stored_value() {
        assert_eq!(FencingToken::LAST.to_i64(), Some(i64::MAX));
        assert_eq!(FencingToken(FencingToken::LAST.0 + 1).to_i64(), None);
    }
}
