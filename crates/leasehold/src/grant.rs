//! The values stores and electors exchange: session ids, fencing tokens,
//! grants and leaders. Plain data, with no store behind them, so that every
//! module (errors included) can name them without depending on the stores.

use std::time::Duration;

pub use crate::ids::{FencingToken, SessionId};
use crate::names::{CandidateId, ElectionName};

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
    /// The holder's session, where the store tells it (not for a key
    /// another program put without a lease): what tells two replicas given
    /// one candidate id apart, in the line of waiting candidates.
    pub session: Option<SessionId>,
}

impl Leader {
    /// Whether `other` is the same grant (same holder and token), whatever
    /// the time left on it.
    pub fn same_grant(&self, other: &Leader) -> bool {
        self.token == other.token && self.candidate == other.candidate
    }
}
