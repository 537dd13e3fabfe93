//! What `/watch` reports: the sidecar's loop sends these, the stream
//! serializes them.

use serde::Serialize;

/// Something `/watch` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// This replica's leadership: `change` is `state` (on connecting),
    /// `gained`, `renewed` or `lost`.
    Leadership(LeadershipEvent),
    /// The election's leader: its id and token, or none.
    Leader(Option<(String, u64)>),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeadershipEvent {
    pub change: &'static str,
    pub leading: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub valid_for_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
