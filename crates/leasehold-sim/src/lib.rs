//! Deterministic fault simulation of the real leasehold elector.
//!
//! Each run is a function of its seed: several candidates run the library's
//! real `Elector` (sessions, renewals, deadlines, campaigns) on tokio's
//! paused clock against the in-memory store (linearizable compare-and-swap,
//! expiry on its own clock). Between each candidate and the store sits a
//! simulated link with delays, losses, partitions and pauses; candidates'
//! clocks drift within the configured bound; the store's clock can be
//! stepped forward within the skew bound; candidates crash and restart.
//! A crash is either unwitnessed (the host died, or nobody can tell: the
//! lease expires) or witnessed (the process died on a live host: the host
//! knows for certain, its witness kills the candidate's work and then
//! releases the dead holder's grant at once, guarded by the token). A pause
//! or a partition is never witnessed: nobody can know the candidate is dead.
//! Afterwards the history is checked against the invariants in
//! [`invariants`], one file each. A failure names the seed and the command
//! that replays it.
//!
//! With [`Scenario::shards`] set, the candidates are instead members of one
//! group of shards ([`leasehold::Shards`]) under the same faults, and
//! stopped gracefully now and then: each shard is its own election,
//! checked as one, and the group must settle evenly over the live members
//! once the faults end and after each later crash or return of a member.

pub mod clock;
mod grant_log;
pub mod history;
pub mod invariants;
pub mod link;
mod phases;
mod sharded;

use grant_log::*;
use phases::*;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::backend::memory::MemoryStore;
use leasehold::backend::{Request, Wrapper};
use leasehold::clock::Instant;
use leasehold::fence::MemoryFence;
use leasehold::store::{Grant, Leader, Store};
use leasehold::{CandidateId, ElectionName, Elector, Error, LeaseConfig, Session};

use crate::clock::{DriftingClock, StoreClock};
use crate::history::{Crash, Granted, History, Term, Write};
pub use crate::invariants::Violation;
use crate::link::Link;
use leasehold_testkit::Rng;

/// What one run simulates.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub candidates: usize,
    pub ttl: Duration,
    /// How long faults are injected before the network heals.
    pub fault_phase: Duration,
    /// Upper bound of each one-way network delay.
    pub max_delay: Duration,
    /// Liveness bound beyond the TTL after a crash.
    pub failover_slack: Duration,
    /// Liveness bound after a witnessed crash: the witness releases the
    /// grant at once, so a few network round trips, far below the TTL.
    pub witnessed_failover: Duration,
    /// Largest forward step of the store's clock, and of the sum of its
    /// steps within one TTL (the configured skew bound is 100 ms; beyond
    /// it safety is not promised).
    pub store_clock_step: Duration,
    /// Test only: the holder's deadline from the reply, without margins.
    pub unsafe_deadline: bool,
    /// Test only: the resource accepts every write (no fencing).
    pub unfenced_resource: bool,
    /// Test only: the witness also releases the grant of a *paused*
    /// candidate, as if a stop were a death.
    pub witness_on_pause: bool,
    pub write_every: Duration,
    /// A sharded run: each candidate joins one group of this many shards
    /// ([`leasehold::Shards::join`]) instead of campaigning for one
    /// election.
    pub shards: Option<u32>,
    /// Candidate 1 campaigns under candidate 0's id (two replicas given
    /// one id): every invariant must still hold.
    pub twin_ids: bool,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            candidates: 3,
            ttl: Duration::from_secs(3),
            fault_phase: Duration::from_secs(40),
            max_delay: Duration::from_millis(40),
            failover_slack: Duration::from_millis(1500),
            witnessed_failover: Duration::from_millis(300),
            store_clock_step: leasehold::DEFAULT_SKEW,
            unsafe_deadline: false,
            unfenced_resource: false,
            witness_on_pause: false,
            write_every: Duration::from_millis(100),
            shards: None,
            twin_ids: false,
        }
    }
}

impl Scenario {
    /// The command that replays `seed` of this scenario.
    pub fn replay_command(&self, seed: u64) -> String {
        let mut cmd = format!("cargo run -p leasehold-sim -- --seed {seed}");
        if let Some(shards) = self.shards {
            cmd.push_str(&format!(" --shards {shards}"));
        }
        if self.unsafe_deadline {
            cmd.push_str(" --unsafe-deadline");
        }
        if self.unfenced_resource {
            cmd.push_str(" --unfenced");
        }
        if self.witness_on_pause {
            cmd.push_str(" --witness-on-pause");
        }
        if self.twin_ids {
            cmd.push_str(" --twin-ids");
        }
        if self.store_clock_step > leasehold::DEFAULT_SKEW {
            cmd.push_str(&format!(
                " --store-clock-step-ms {}",
                self.store_clock_step.as_millis()
            ));
        }
        cmd
    }
}

/// A failed run: the broken invariant and what happened.
#[derive(Debug)]
pub struct Failure {
    pub seed: u64,
    pub violation: Violation,
    pub history: History,
    pub replay: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {}: {} broken: {}\nREPRODUCE WITH: {}",
            self.seed, self.violation.invariant, self.violation.detail, self.replay
        )
    }
}

/// Runs one seed; `Ok` with the history if every invariant held.
pub fn run(seed: u64, scenario: &Scenario) -> std::result::Result<History, Box<Failure>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let history = runtime.block_on(simulate(seed, scenario));
    match invariants::check(&history, scenario) {
        Ok(()) => Ok(history),
        Err(violation) => Err(Box::new(Failure {
            seed,
            violation,
            history,
            replay: scenario.replay_command(seed),
        })),
    }
}

fn candidate_index(id: &CandidateId) -> usize {
    id.as_str()
        .trim_start_matches('c')
        .parse()
        .unwrap_or(usize::MAX)
}

/// The shard an election is (`sim/shard/3` is 3); 0 for the plain run's
/// one election.
fn shard_of(election: &ElectionName) -> u32 {
    election
        .as_str()
        .rsplit_once("/shard/")
        .and_then(|(_, k)| k.parse().ok())
        .unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A term in progress, so that a crash can close it and a witness can
/// release its grant.
struct OpenTerm {
    token: u64,
    start: Duration,
    session: Arc<Session>,
    grant: Grant,
}

/// A candidate's terms in progress, by shard (0 for the plain run's one
/// election).
type OpenTerms = Arc<Mutex<BTreeMap<u32, OpenTerm>>>;

/// Tasks of a candidate: the writes it has issued that have not reached
/// the resource, or a member's shard workers.
type InFlight = Arc<Mutex<Vec<tokio::task::AbortHandle>>>;

struct Slot {
    index: usize,
    link: Arc<Link>,
    clock: Arc<DriftingClock>,
    task: tokio::task::JoinHandle<()>,
    open: OpenTerms,
    writes: InFlight,
    /// A member's shard workers (sharded runs), killed with it.
    workers: InFlight,
    /// Asks a member to stop gracefully (sharded runs).
    stop: Option<tokio::sync::mpsc::UnboundedSender<()>>,
    /// Down (crashed, or stopping gracefully) until restarted.
    crashed: bool,
}

/// What a candidate's fenced writes need.
#[derive(Clone)]
struct Writer {
    index: usize,
    link: Arc<Link>,
    fence: Arc<MemoryFence>,
    history: Arc<Mutex<History>>,
    writes: InFlight,
    unfenced: bool,
    t0: Instant,
}

impl Writer {
    /// Issues a write to `resource` with `token`, now: it crosses the
    /// link, then the resource decides; the history records both times.
    fn write(&self, shard: u32, resource: &str, token: u64) {
        let (link, fence, history, t0) = (
            Arc::clone(&self.link),
            Arc::clone(&self.fence),
            Arc::clone(&self.history),
            self.t0,
        );
        let issued = Instant::now() - t0;
        let (candidate, unfenced, resource) = (self.index, self.unfenced, resource.to_owned());
        let write = tokio::spawn(async move {
            link.hop().await;
            let accepted = unfenced
                || fence
                    .fenced(&resource, leasehold::FencingToken(token), || ())
                    .is_ok();
            lock(&history).writes.push(Write {
                shard,
                candidate,
                token,
                issued,
                decided: Instant::now() - t0,
                accepted,
            });
        });
        let mut writes = lock(&self.writes);
        writes.retain(|w| !w.is_finished());
        writes.push(write.abort_handle());
    }
}

struct World {
    scenario: Scenario,
    t0: Instant,
    store: Arc<GrantLog>,
    /// The election, or in a sharded run the group.
    election: ElectionName,
    fence: Arc<MemoryFence>,
    history: Arc<Mutex<History>>,
    /// Planned handovers (and, in a sharded run, a shard's rests) happen
    /// only while this is set.
    handovers: Arc<std::sync::atomic::AtomicBool>,
}

impl World {
    fn since_start(&self) -> Duration {
        Instant::now() - self.t0
    }

    /// Candidate `i`'s id: `c{i}`, but candidate 1's is `c0` with
    /// [`Scenario::twin_ids`].
    fn id_of(&self, i: usize) -> CandidateId {
        let i = if self.scenario.twin_ids && i == 1 {
            0
        } else {
            i
        };
        CandidateId::new(format!("c{i}")).expect("valid id")
    }

    fn spawn(&self, i: usize, incarnation: u64, rng: &mut Rng) -> Slot {
        let link = Arc::new(Link::new(
            Arc::clone(&self.store) as Arc<dyn Store>,
            rng.next_u64(),
            self.scenario.max_delay,
        ));
        // Within the drift bound: up to 0.99·drift slow, or a little fast.
        let rate = rng.float(1.0 - 0.99 * leasehold::DEFAULT_DRIFT, 1.05);
        let clock = Arc::new(DriftingClock::new(rate));
        let open = OpenTerms::default();
        let writes = InFlight::default();
        let workers = InFlight::default();
        let writer = Writer {
            index: i,
            link: Arc::clone(&link),
            fence: Arc::clone(&self.fence),
            history: Arc::clone(&self.history),
            writes: Arc::clone(&writes),
            unfenced: self.scenario.unfenced_resource,
            t0: self.t0,
        };
        let seed = rng.next_u64() ^ incarnation;
        let (task, stop) = self.start_task(i, seed, writer, &clock, &open, &workers);
        Slot {
            index: i,
            link,
            clock,
            task,
            open,
            writes,
            workers,
            stop,
            crashed: false,
        }
    }

    /// Starts candidate `i`'s task, with its writer and clock: a single
    /// election's candidate, or a group's member (with the sender that
    /// stops it gracefully).
    fn start_task(
        &self,
        i: usize,
        seed: u64,
        writer: Writer,
        clock: &Arc<DriftingClock>,
        open: &OpenTerms,
        workers: &InFlight,
    ) -> (
        tokio::task::JoinHandle<()>,
        Option<tokio::sync::mpsc::UnboundedSender<()>>,
    ) {
        match self.scenario.shards {
            None => {
                let task = tokio::spawn(candidate(Candidate {
                    seed,
                    writer,
                    clock: Arc::clone(clock),
                    ttl: self.scenario.ttl,
                    unsafe_deadline: self.scenario.unsafe_deadline,
                    write_every: self.scenario.write_every,
                    election: self.election.clone(),
                    open: Arc::clone(open),
                    handovers: Arc::clone(&self.handovers),
                    // Candidates of three priorities: preemptions happen too.
                    priority: i64::try_from(i % 3).unwrap_or(0),
                    id: self.id_of(i),
                }));
                (task, None)
            }
            Some(count) => {
                let (stop, stopped) = tokio::sync::mpsc::unbounded_channel();
                let task = tokio::spawn(sharded::member(sharded::Member {
                    seed,
                    writer,
                    clock: Arc::clone(clock),
                    ttl: self.scenario.ttl,
                    unsafe_deadline: self.scenario.unsafe_deadline,
                    write_every: self.scenario.write_every,
                    group: self.election.clone(),
                    count,
                    open: Arc::clone(open),
                    workers: Arc::clone(workers),
                    rests: Arc::clone(&self.handovers),
                    stop: stopped,
                }));
                (task, Some(stop))
            }
        }
    }

    /// Starts candidate `slot.index` again, as incarnation `incarnation`;
    /// one still stopping gracefully is killed first.
    fn restart(&self, slot: &mut Slot, incarnation: u64, rng: &mut Rng) {
        if !slot.task.is_finished() {
            self.crash(slot);
        }
        *slot = self.spawn(slot.index, incarnation, rng);
    }

    /// Asks a member to stop gracefully (sharded runs): it leaves the
    /// group, ends the work of each shard it owns and releases it, and
    /// closes its session. It is down until restarted.
    fn stop(&self, slot: &mut Slot) {
        if let Some(stop) = &slot.stop {
            let _ = stop.send(());
            slot.crashed = true;
            lock(&self.history).graceful_stops += 1;
        }
    }

    /// A witnessed crash: the candidate's process dies on a live host. Its
    /// work stops at that instant (the host's witness kills the command
    /// first: writes not yet at the resource never get there), then, with
    /// nothing of the candidate left to act, the witness releases each
    /// grant it held, if it knew it held it.
    fn crash_witnessed(&self, slot: &mut Slot) {
        let grants = open_grants(slot);
        for write in lock(&slot.writes).drain(..) {
            write.abort();
        }
        self.crash(slot);
        for grant in grants {
            self.witness_release(slot, grant);
        }
    }

    /// The witness releases `grant` (guarded by its token, so it can never
    /// remove a successor's grant), over the host's network: it retries
    /// while the host is cut off, and stops when the store no longer shows
    /// the grant (`NotHolder`: expired, or released already). A shard's
    /// witness then removes the dead member from its group, as `leasehold
    /// run --shards` does, so that the others take its shards now rather
    /// than once its session expires.
    fn witness_release(&self, slot: &Slot, grant: Grant) {
        let (link, history) = (Arc::clone(&slot.link), Arc::clone(&self.history));
        let group = self.scenario.shards.map(|_| self.election.clone());
        let give_up = Instant::now() + self.scenario.ttl * 2;
        tokio::spawn(async move {
            loop {
                match link.witness_resign(&grant).await {
                    Ok(()) => {
                        lock(&history).witness_releases += 1;
                        break;
                    }
                    Err(Error::NotHolder { .. }) => break,
                    Err(_) if Instant::now() < give_up => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(_) => return,
                }
            }
            let Some(group) = group else { return };
            while link
                .witness_delete_note(grant.session, &group, sharded::MEMBER_NOTE)
                .await
                .is_err()
                && Instant::now() < give_up
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    }

    /// The mistake the checkers must catch (`witness_on_pause`): the
    /// witness takes a stopped candidate for dead and releases its grants,
    /// while the candidate, paused, still believes it leads.
    fn release_paused(&self, slot: &Slot) {
        for grant in open_grants(slot) {
            self.witness_release(slot, grant);
        }
    }

    /// Kills a candidate: its task (and a member's shard workers) stops,
    /// its link swallows everything, and each open term ends now (or at
    /// its deadline, if that came first).
    fn crash(&self, slot: &mut Slot) {
        slot.link.crash();
        slot.task.abort();
        for worker in lock(&slot.workers).drain(..) {
            worker.abort();
        }
        slot.crashed = true;
        let open = std::mem::take(&mut *lock(&slot.open));
        for (shard, term) in open {
            let deadline = slot.clock.to_real(term.session.deadline()) - self.t0;
            let end = self.since_start().min(deadline).max(term.start);
            lock(&self.history).terms.push(Term {
                shard,
                candidate: slot.index,
                token: term.token,
                start: term.start,
                end,
            });
        }
    }
}

/// The grants of a candidate's open terms.
fn open_grants(slot: &Slot) -> Vec<Grant> {
    lock(&slot.open).values().map(|t| t.grant.clone()).collect()
}

struct Candidate {
    seed: u64,
    writer: Writer,
    clock: Arc<DriftingClock>,
    ttl: Duration,
    unsafe_deadline: bool,
    write_every: Duration,
    election: ElectionName,
    open: OpenTerms,
    handovers: Arc<std::sync::atomic::AtomicBool>,
    priority: i64,
    id: CandidateId,
}

/// One candidate: campaign; while leader, write to the fenced resource;
/// sometimes hand over; when leadership ends, record the term and campaign
/// again.
async fn candidate(c: Candidate) {
    let mut rng = Rng::new(c.seed);
    let (index, t0) = (c.writer.index, c.writer.t0);
    let elector = c.elector();
    let since = |t0: Instant| Instant::now() - t0;
    loop {
        let leadership = match elector.campaign(&c.election).await {
            Ok(leadership) => leadership,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let token = leadership.token().0;
        let start = since(t0);
        lock(&c.open).insert(
            0,
            OpenTerm {
                token,
                start,
                session: Arc::clone(leadership.session()),
                grant: leadership.grant().clone(),
            },
        );
        let resign = c.lead(&leadership, token, &mut rng).await;
        let deadline = c.clock.to_real(leadership.deadline()) - t0;
        let end = since(t0).min(deadline).max(start);
        lock(&c.open).remove(&0);
        lock(&c.writer.history).terms.push(Term {
            shard: 0,
            candidate: index,
            token,
            start,
            end,
        });
        match resign {
            Release::Resign => {
                let _ = leadership.resign().await;
                tokio::time::sleep(rng.millis(50, 500)).await;
            }
            // The work stopped when the term ended above; back in line at
            // once, as `leasehold run` does.
            Release::HandOver => {
                let _ = leadership.resign().await;
            }
            Release::No => {}
        }
    }
}

impl Candidate {
    /// Its elector, on its link, with its clock and priority.
    fn elector(&self) -> Elector {
        let elector = Elector::new(
            Arc::clone(&self.writer.link) as Arc<dyn Store>,
            self.id.clone(),
            LeaseConfig::new(self.ttl),
        )
        .expect("valid config")
        .with_clock(Arc::clone(&self.clock) as Arc<dyn leasehold::clock::Clock>)
        .with_priority(self.priority);
        if self.unsafe_deadline {
            elector.with_unsafe_deadline_from_reply()
        } else {
            elector
        }
    }

    /// While it leads: writes to the fenced resource every `write_every`,
    /// until leadership is lost, a handover is asked for, or (rarely) it
    /// resigns of its own.
    async fn lead(&self, leadership: &leasehold::Leadership, token: u64, rng: &mut Rng) -> Release {
        loop {
            tokio::select! {
                biased;
                _ = leadership.lost() => return Release::No,
                _ = leadership.handover_requested() => return Release::HandOver,
                () = tokio::time::sleep(self.write_every) => {
                    if !leadership.is_leader() {
                        continue;
                    }
                    self.writer.write(0, "object", token);
                    if self.handovers.load(std::sync::atomic::Ordering::Relaxed) && rng.chance(0.01) {
                        return Release::Resign;
                    }
                }
            }
        }
    }
}

/// How a term the candidate ended itself is let go.
enum Release {
    /// Lost: nothing to release.
    No,
    /// A planned resign.
    Resign,
    /// Asked to hand over (a transfer, a higher priority).
    HandOver,
}

async fn simulate(seed: u64, scenario: &Scenario) -> History {
    let mut rng = Rng::new(seed);
    let store_clock = Arc::new(StoreClock::new());
    let history = Arc::new(Mutex::new(History::default()));
    let world = World {
        scenario: scenario.clone(),
        t0: Instant::now(),
        store: Arc::new(GrantLog {
            store: MemoryStore::with_clock(
                Arc::clone(&store_clock) as Arc<dyn leasehold::clock::Clock>
            ),
            history: Arc::clone(&history),
        }),
        election: ElectionName::new("sim").expect("valid name"),
        fence: Arc::new(MemoryFence::new()),
        history: Arc::clone(&history),
        handovers: Arc::new(std::sync::atomic::AtomicBool::new(true)),
    };
    // Which crashes the host witnesses comes from a second stream: `rng`
    // draws what it drew before witnessed crashes existed, so a seed
    // injects the same faults, at the same times, on the same candidates.
    let mut witness_rng = Rng::new(seed ^ WITNESS_STREAM);
    let mut slots: Vec<Slot> = (0..scenario.candidates)
        .map(|i| world.spawn(i, 0, &mut rng))
        .collect();
    let (faults, last_pause_end) =
        fault_phase(&world, &mut slots, &store_clock, &mut rng, &mut witness_rng).await;
    let healed = settle(&world, &mut slots, &mut rng).await;
    if scenario.shards.is_some() {
        // Healing lets no new message wait, but one already held by a
        // pause waits out that pause: the faults end with the last one.
        let faults_end = healed.max(last_pause_end - world.t0);
        let windows = sharded::liveness(&world, &mut slots, &mut rng, faults_end).await;
        let mut history = lock(&history).clone();
        history.faults = faults;
        history.windows = windows;
        return history;
    }
    let [crash, witnessed, chosen] = liveness(&world, &mut slots, &mut rng).await;
    let mut history = lock(&history).clone();
    history.faults = faults;
    let end = world.since_start();
    history.liveness_crash = Some(aftermath(&history, crash, end));
    history.witnessed_crash = Some(aftermath(&history, witnessed, end));
    history.chosen_standby_crash = Some(aftermath(&history, chosen, end));
    history
}
