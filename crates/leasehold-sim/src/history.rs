//! What happened in one run, on the simulation's real clock.
//!
//! Terms, writes and grants name the election they belong to by its shard
//! number: 0 for the one election of a plain run, `k` for shard `k` of a
//! sharded run (`<group>/shard/<k>`). Every single-election invariant holds
//! for each shard's part of the history alone ([`History::of_shard`]).

use std::time::Duration;

/// One term of leadership as its holder saw it: from the grant until it
/// stopped considering itself leader (lost signal, deadline, revocation,
/// or crash).
#[derive(Debug, Clone)]
pub struct Term {
    pub shard: u32,
    pub candidate: usize,
    pub token: u64,
    pub start: Duration,
    pub end: Duration,
}

/// A write that reached the fenced resource.
#[derive(Debug, Clone)]
pub struct Write {
    pub shard: u32,
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

/// A grant, as the store made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    pub shard: u32,
    pub candidate: usize,
    pub token: u64,
}

/// Why the members of a sharded run must settle again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settling {
    /// The faults ended: every link healed, every crashed member restarted.
    Healed,
    /// A member holding shards crashed, unwitnessed: its shards are free
    /// once its session expires.
    Crashed,
    /// That member came back: the others give up its share.
    Rejoined,
    /// A member holding shards died on a live host: the witness released
    /// its grants and its membership.
    WitnessedCrash,
}

/// A stretch of a sharded run without faults and with a fixed set of live
/// members, in which the group must settle within a bound of its start
/// and stay settled to its end: every shard owned by one of them, each
/// owning `⌊n/M⌋` or `⌈n/M⌉`.
#[derive(Debug, Clone)]
pub struct Window {
    pub cause: Settling,
    pub from: Duration,
    pub until: Duration,
    /// The live members, by candidate number.
    pub members: Vec<usize>,
    /// Each shard's holder in the store at the window's end (candidate,
    /// token): to tell, when a shard is unowned then, whether a live
    /// member's session holds a grant that member does not act on.
    pub held_at_end: Vec<Option<(usize, u64)>>,
}

#[derive(Debug, Default, Clone)]
pub struct History {
    pub terms: Vec<Term>,
    pub writes: Vec<Write>,
    /// Grants in the order the store made them.
    pub grants: Vec<Granted>,
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
    /// Sharded runs: the stretches after which the group must settle.
    pub windows: Vec<Window>,
    /// Sharded runs: errors a member's `Shards` reported (candidate, when,
    /// error); none is expected.
    pub member_errors: Vec<(usize, Duration, String)>,
    /// Sharded runs: members stopped gracefully during the fault phase
    /// (they left the group and closed their session).
    pub graceful_stops: usize,
    /// Sharded runs: shards a member gave back for a rest during the fault
    /// phase ([`leasehold::Shard::release_for`]).
    pub rests: usize,
}

impl History {
    /// The part of the history about shard `shard` alone (the whole
    /// history's terms, writes and grants for a plain run's shard 0).
    pub fn of_shard(&self, shard: u32) -> History {
        History {
            terms: self
                .terms
                .iter()
                .filter(|t| t.shard == shard)
                .cloned()
                .collect(),
            writes: self
                .writes
                .iter()
                .filter(|w| w.shard == shard)
                .cloned()
                .collect(),
            grants: self
                .grants
                .iter()
                .filter(|g| g.shard == shard)
                .copied()
                .collect(),
            ..History::default()
        }
    }
}
