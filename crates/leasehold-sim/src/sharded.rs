//! Sharded runs: each candidate is a member of one group of shards
//! ([`Shards::join`]) and does the work of each shard it is granted — a
//! term of that shard in the history, fenced writes to that shard's own
//! resource — until the shard's leadership is lost, the assignment moves
//! the shard away (revoked: the work stops, then the shard is resigned),
//! the member gives it back for a rest, or the member stops or crashes.
//!
//! After the faults, the liveness phase records the stretches in which
//! the group must settle: once healed; after a member holding shards
//! crashes unwitnessed; once it is back; after another dies on a live host
//! (its witness releases each of its shards and removes its membership).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold::admin::GroupKind;
use leasehold::clock::Instant;
use leasehold::store::Store;
use leasehold::{CandidateId, ElectionName, Elector, Error, LeaseConfig, Shard, Shards};
use leasehold_testkit::Rng;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::clock::DriftingClock;
use crate::history::{Settling, Term, Window};
use crate::{InFlight, OpenTerm, OpenTerms, Slot, World, Writer, candidate_index, lock};

/// The note a member keeps on its group's name (the library's), which the
/// witness of a dead member's shards removes.
pub(crate) const MEMBER_NOTE: &str = "member";

/// Pause before a member tries to join again.
const RETRY: Duration = Duration::from_millis(100);

/// At each write during the fault phase, the chance that the member gives
/// the shard back for a rest ([`Shard::release_for`]).
const REST_CHANCE: f64 = 0.005;

/// What a member's task needs.
pub(crate) struct Member {
    pub(crate) seed: u64,
    pub(crate) writer: Writer,
    pub(crate) clock: Arc<DriftingClock>,
    pub(crate) ttl: Duration,
    pub(crate) unsafe_deadline: bool,
    pub(crate) write_every: Duration,
    pub(crate) group: ElectionName,
    pub(crate) count: u32,
    pub(crate) open: OpenTerms,
    /// Each shard's work, killed with the member.
    pub(crate) workers: InFlight,
    /// Rests happen only while this is set.
    pub(crate) rests: Arc<AtomicBool>,
    /// A graceful stop.
    pub(crate) stop: mpsc::UnboundedReceiver<()>,
}

impl Member {
    fn record(&self, error: &Error) {
        let at = Instant::now() - self.writer.t0;
        lock(&self.writer.history)
            .member_errors
            .push((self.writer.index, at, error.to_string()));
    }
}

/// One member: joins the group, and starts the work of each shard granted
/// to it. Asked to stop, it does what `leasehold run --shards` does on
/// SIGTERM: leaves the group (no more campaigns), stops each shard's work
/// (which resigns the shard), and closes its session. An error of the
/// membership (none is expected: [`Shards::next`] fails only when the
/// membership cannot go on) is recorded, and stops the member likewise.
pub(crate) async fn member(mut m: Member) {
    let mut rng = Rng::new(m.seed);
    let id = CandidateId::new(format!("c{}", m.writer.index)).expect("valid id");
    let mut elector = Elector::new(
        Arc::clone(&m.writer.link) as Arc<dyn Store>,
        id,
        LeaseConfig::new(m.ttl),
    )
    .expect("valid config")
    .with_clock(Arc::clone(&m.clock) as Arc<dyn leasehold::clock::Clock>);
    if m.unsafe_deadline {
        elector = elector.with_unsafe_deadline_from_reply();
    }
    let elector = Arc::new(elector);
    let (stop_work, stopped) = leasehold::watch::channel(false);
    let mut running: Vec<JoinHandle<()>> = Vec::new();
    if let Some(mut shards) = join(&mut m, &elector).await {
        loop {
            tokio::select! {
                biased;
                _ = m.stop.recv() => break,
                next = shards.next() => match next {
                    Ok(shard) => {
                        let work = Work::start(&m, &shard, rng.next_u64());
                        let task = tokio::spawn(work.run(shard, stopped.clone()));
                        let mut workers = lock(&m.workers);
                        workers.retain(|w| !w.is_finished());
                        workers.push(task.abort_handle());
                        running.retain(|t| !t.is_finished());
                        running.push(task);
                    }
                    Err(error) => {
                        m.record(&error);
                        break;
                    }
                },
            }
        }
        shards.leave().await;
    }
    stop_work.send_replace(true);
    for task in running {
        let _ = task.await;
    }
    let _ = elector.close().await;
    // The process exits: whatever of it is left (a session whose close
    // failed keeps renewing itself) never reaches the store again.
    m.writer.link.crash();
}

/// Joins the group, trying again while the store cannot be reached;
/// `None` if asked to stop first.
async fn join(m: &mut Member, elector: &Arc<Elector>) -> Option<Shards> {
    loop {
        let attempt = Shards::join(Arc::clone(elector), m.group.clone(), m.count);
        tokio::select! {
            biased;
            _ = m.stop.recv() => return None,
            joined = attempt => match joined {
                Ok(shards) => return Some(shards),
                Err(error) => {
                    if !error.is_transient() && !matches!(error, Error::SessionExpired(_)) {
                        m.record(&error);
                    }
                }
            },
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// The work of one shard, for one term.
struct Work {
    writer: Writer,
    clock: Arc<DriftingClock>,
    write_every: Duration,
    open: OpenTerms,
    rests: Arc<AtomicBool>,
    seed: u64,
    start: Duration,
}

/// Why a shard's work stopped.
enum End {
    /// Its leadership was lost: nothing to release.
    Lost,
    /// The assignment moved it away: resign it.
    Revoked,
    /// The member stops: resign it.
    Stopped,
    /// Given back for a rest.
    Rest,
}

impl Work {
    /// The work of `shard`, from now: its term opens (so that a crash
    /// closes it and a witness can release its grant).
    fn start(m: &Member, shard: &Shard, seed: u64) -> Work {
        let start = Instant::now() - m.writer.t0;
        let leadership = shard.leadership();
        lock(&m.open).insert(
            shard.index(),
            OpenTerm {
                token: leadership.token().0,
                start,
                session: Arc::clone(leadership.session()),
                grant: leadership.grant().clone(),
            },
        );
        Work {
            writer: m.writer.clone(),
            clock: Arc::clone(&m.clock),
            write_every: m.write_every,
            open: Arc::clone(&m.open),
            rests: Arc::clone(&m.rests),
            seed,
            start,
        }
    }

    /// Writes to the shard's resource while it leads; when the work stops,
    /// records the term, then lets the shard go.
    async fn run(self, shard: Shard, mut stopped: leasehold::watch::Receiver<bool>) {
        let mut rng = Rng::new(self.seed);
        let (index, token) = (shard.index(), shard.token().0);
        let resource = format!("shard/{index}");
        let t0 = self.writer.t0;
        let leadership = shard.leadership();
        let end = loop {
            tokio::select! {
                biased;
                _ = leadership.lost() => break End::Lost,
                () = shard.revoked() => break End::Revoked,
                _ = stopped.wait_for(|stop| *stop) => break End::Stopped,
                () = tokio::time::sleep(self.write_every) => {
                    if !leadership.is_leader() {
                        continue;
                    }
                    self.writer.write(index, &resource, token);
                    if self.rests.load(Ordering::Relaxed) && rng.chance(REST_CHANCE) {
                        break End::Rest;
                    }
                }
            }
        };
        let deadline = self.clock.to_real(leadership.deadline()) - t0;
        let end_at = (Instant::now() - t0).min(deadline).max(self.start);
        {
            let mut open = lock(&self.open);
            if open.get(&index).is_some_and(|t| t.token == token) {
                open.remove(&index);
            }
        }
        {
            let mut history = lock(&self.writer.history);
            history.terms.push(Term {
                shard: index,
                candidate: self.writer.index,
                token,
                start: self.start,
                end: end_at,
            });
            if matches!(end, End::Rest) {
                history.rests += 1;
            }
        }
        match end {
            // Dropped, it goes back to the membership.
            End::Lost => drop(shard),
            End::Revoked | End::Stopped => {
                let _ = shard.resign().await;
            }
            End::Rest => {
                let _ = shard.release_for(rng.millis(50, 500)).await;
            }
        }
    }
}

/// The liveness phase of a sharded run, once the faults ended at
/// `faults_end` (and three TTLs later at the earliest): crashes the member
/// holding the most shards (unwitnessed), restarts it once its session has
/// expired, then kills the member holding the most shards on a live host
/// (witnessed), and at last everyone. Returns the stretches in which the
/// group must settle.
pub(crate) async fn liveness(
    world: &World,
    slots: &mut [Slot],
    rng: &mut Rng,
    faults_end: Duration,
) -> Vec<Window> {
    let scenario = &world.scenario;
    tokio::time::sleep_until(world.t0 + faults_end + scenario.ttl * 3).await;
    let all: Vec<usize> = (0..slots.len()).collect();
    let without = |gone: usize| all.iter().copied().filter(|&i| i != gone).collect();
    let mut windows = Vec::new();
    let mut from = faults_end;
    let mut close = async |windows: &mut Vec<Window>, cause, members| {
        let until = world.since_start();
        windows.push(Window {
            cause,
            from,
            until,
            members,
            held_at_end: held(world).await,
        });
        from = until;
    };
    close(&mut windows, Settling::Healed, all.clone()).await;
    if let Some(x) = busiest(world, slots).await {
        world.crash(&mut slots[x]);
        tokio::time::sleep(scenario.ttl + scenario.failover_slack * 2).await;
        close(&mut windows, Settling::Crashed, without(x)).await;
        world.restart(&mut slots[x], 3_000 + x as u64, rng);
        tokio::time::sleep(scenario.ttl).await;
        close(&mut windows, Settling::Rejoined, all.clone()).await;
        if let Some(y) = busiest(world, slots).await {
            world.crash_witnessed(&mut slots[y]);
            tokio::time::sleep(scenario.ttl).await;
            close(&mut windows, Settling::WitnessedCrash, without(y)).await;
        }
    }
    for slot in slots.iter_mut() {
        if !slot.crashed {
            world.crash(slot);
        }
    }
    windows
}

/// Each shard's holder in the store now (candidate, token).
async fn held(world: &World) -> Vec<Option<(usize, u64)>> {
    let count = world.scenario.shards.unwrap_or(0);
    let mut held = Vec::new();
    for shard in 0..count {
        let leader = match GroupKind::Shards(count).election(&world.election, shard) {
            Ok(election) => world.store.leader(&election).await.ok().flatten(),
            Err(_) => None,
        };
        held.push(leader.map(|l| (candidate_index(&l.candidate), l.token.0)));
    }
    held
}

/// The live member holding the most shards in the store (the lowest
/// number among equals), if any holds one.
async fn busiest(world: &World, slots: &[Slot]) -> Option<usize> {
    let mut loads = vec![0usize; slots.len()];
    for (holder, _) in held(world).await.into_iter().flatten() {
        if let Some(load) = loads.get_mut(holder) {
            *load += 1;
        }
    }
    (0..slots.len())
        .filter(|&i| !slots[i].crashed && loads[i] > 0)
        .max_by_key(|&i| (loads[i], std::cmp::Reverse(i)))
}
