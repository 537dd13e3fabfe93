//! What happened in one run, on the simulation's real clock.

use std::time::Duration;

/// One term of leadership as its holder saw it: from the grant until it
/// stopped considering itself leader (lost signal, deadline, or crash).
#[derive(Debug, Clone)]
pub struct Term {
    pub candidate: usize,
    pub token: u64,
    pub start: Duration,
    pub end: Duration,
}

/// A write that reached the fenced resource.
#[derive(Debug, Clone)]
pub struct Write {
    pub candidate: usize,
    pub token: u64,
    /// When the writer issued it (it then considered itself leader).
    pub issued: Duration,
    /// When the resource decided.
    pub decided: Duration,
    pub accepted: bool,
}

/// A leader crash (witnessed or not) whose aftermath is checked for
/// liveness.
#[derive(Debug, Clone)]
pub struct Crash {
    pub candidate: usize,
    pub at: Duration,
    /// When a live candidate next led, if one did before the run ended.
    pub next_leader_at: Option<Duration>,
}

#[derive(Debug, Default, Clone)]
pub struct History {
    pub terms: Vec<Term>,
    pub writes: Vec<Write>,
    /// Grants in the order the store made them (candidate, token).
    pub grants: Vec<(usize, u64)>,
    pub liveness_crash: Option<Crash>,
    /// The leader's witnessed crash after the healed network settled.
    pub witnessed_crash: Option<Crash>,
    pub faults: usize,
    /// Grants a witness released after its candidate's death.
    pub witness_releases: usize,
    /// The standby a transfer chose, crashed while the transfer was under
    /// way.
    pub chosen_standby_crash: Option<Crash>,
    /// Transfer requests an operator made during the fault phase.
    pub transfers_requested: usize,
}
