//! The phases of a simulated run after the first grants: faults, then
//! settling, then the liveness checks (leaders and chosen standbys
//! crashed).

use super::*;

/// Mixed into the seed for the stream of witnessed-crash choices.
pub(super) const WITNESS_STREAM: u64 = 0x5749_544e_4553_5321;

/// When a live candidate next led after `crash` (no crash: no leader to
/// crash, which the liveness check reports).
pub(super) fn aftermath(
    history: &History,
    crash: Option<(usize, Duration)>,
    end: Duration,
) -> Crash {
    match crash {
        Some((candidate, at)) => Crash {
            candidate,
            at,
            next_leader_at: history
                .terms
                .iter()
                .filter(|t| t.candidate != candidate && t.start >= at)
                .map(|t| t.start)
                .min(),
        },
        None => Crash {
            candidate: usize::MAX,
            at: end,
            next_leader_at: None,
        },
    }
}

/// The fault phase: until `scenario.fault_phase` has passed, a random
/// fault every 0.3–2.5 s (partitions of one candidate or of all, pauses,
/// crashes with restarts, store clock jumps, message loss, transfer
/// requests; in a sharded run graceful stops with restarts instead of
/// transfers). Half the crashes, drawn from `witness_rng`, are witnessed.
/// Returns how many faults it injected, and when the last pause ends.
pub(super) async fn fault_phase(
    world: &World,
    slots: &mut [Slot],
    store_clock: &StoreClock,
    rng: &mut Rng,
    witness_rng: &mut Rng,
) -> (usize, Instant) {
    let mut faults = Faults {
        restarts: Vec::new(),
        count: 0,
        last_pause_end: world.t0,
        steps: Vec::new(),
    };
    let fault_end = world.t0 + world.scenario.fault_phase;
    loop {
        let next = Instant::now() + rng.millis(300, 2500);
        faults.restart_due(world, slots, next, rng).await;
        if next >= fault_end {
            break;
        }
        tokio::time::sleep_until(next).await;
        faults.count += 1;
        let i = usize::try_from(rng.below(slots.len() as u64)).expect("index");
        faults.inject(world, slots, i, store_clock, rng, witness_rng);
    }
    (faults.count, faults.last_pause_end)
}

/// What the fault phase has done so far.
struct Faults {
    /// Crashed or stopped candidates, and when each starts again.
    restarts: Vec<(Instant, usize)>,
    count: usize,
    last_pause_end: Instant,
    /// The store clock's forward steps, to keep their sum over any TTL
    /// within the bound: the skew bound is how far the store's clock may
    /// run ahead during one lease, not at each step.
    steps: Vec<(Instant, Duration)>,
}

impl Faults {
    /// Restarts the candidates whose time has come by `next`, each at its
    /// time.
    async fn restart_due(
        &mut self,
        world: &World,
        slots: &mut [Slot],
        next: Instant,
        rng: &mut Rng,
    ) {
        self.restarts.sort();
        while let Some(&(at, i)) = self.restarts.first() {
            if at > next {
                break;
            }
            tokio::time::sleep_until(at).await;
            self.restarts.remove(0);
            world.restart(&mut slots[i], self.count as u64 + 1, rng);
        }
    }

    /// One fault, drawn from `rng`, on candidate `i` (or on all).
    fn inject(
        &mut self,
        world: &World,
        slots: &mut [Slot],
        i: usize,
        store_clock: &StoreClock,
        rng: &mut Rng,
        witness_rng: &mut Rng,
    ) {
        let scenario = &world.scenario;
        match rng.below(7) {
            0 => {
                let link = Arc::clone(&slots[i].link);
                partition(vec![link], rng.millis(300, 5000));
            }
            1 => {
                let until = Instant::now() + rng.millis(500, 7000);
                slots[i].link.pause_until(until);
                self.last_pause_end = self.last_pause_end.max(until);
                if scenario.witness_on_pause {
                    world.release_paused(&slots[i]);
                }
            }
            2 if !slots[i].crashed => {
                if witness_rng.chance(0.5) {
                    world.crash_witnessed(&mut slots[i]);
                } else {
                    world.crash(&mut slots[i]);
                }
                self.restarts
                    .push((Instant::now() + rng.millis(500, 4000), i));
            }
            3 => {
                let links: Vec<_> = slots.iter().map(|s| Arc::clone(&s.link)).collect();
                partition(links, rng.millis(200, 3000));
            }
            4 => self.step_store_clock(scenario, store_clock, rng),
            5 => slots[i].link.set_loss(0.1),
            // A member is stopped (SIGTERM, a rolling deploy) and started
            // again.
            _ if scenario.shards.is_some() => {
                if !slots[i].crashed {
                    world.stop(&mut slots[i]);
                    self.restarts
                        .push((Instant::now() + rng.millis(500, 4000), i));
                }
            }
            _ => request_transfer(world, i, rng),
        }
    }

    /// Steps the store's clock forward, by at most what the bound leaves
    /// within the last TTL.
    fn step_store_clock(&mut self, scenario: &Scenario, store_clock: &StoreClock, rng: &mut Rng) {
        let step = u64::try_from(scenario.store_clock_step.as_millis()).unwrap_or(0);
        let drawn = rng.millis(0, step + 1);
        let now = Instant::now();
        self.steps.retain(|&(at, _)| now - at < scenario.ttl);
        let recent: Duration = self.steps.iter().map(|&(_, d)| d).sum();
        let jump = drawn.min(scenario.store_clock_step.saturating_sub(recent));
        self.steps.push((now, jump));
        store_clock.jump(jump);
    }
}

/// Cuts `links` off for `d`.
fn partition(links: Vec<Arc<Link>>, d: Duration) {
    links.iter().for_each(|l| l.set_partitioned(true));
    tokio::spawn(async move {
        tokio::time::sleep(d).await;
        links.iter().for_each(|l| l.set_partitioned(false));
    });
}

/// An operator asks for a transfer, to candidate `i` or to the first in
/// line, and does not wait for it.
fn request_transfer(world: &World, i: usize, rng: &mut Rng) {
    let to = rng
        .chance(0.5)
        .then(|| CandidateId::new(format!("c{i}")).expect("valid id"));
    let (store, election, ttl) = (
        Arc::clone(&world.store) as Arc<dyn Store>,
        world.election.clone(),
        world.scenario.ttl,
    );
    lock(&world.history).transfers_requested += 1;
    tokio::spawn(async move {
        let _ = leasehold::admin::request_transfer(&store, &election, to.as_ref(), ttl, ttl).await;
    });
}

/// Heals every link, restarts the crashed candidates, and lets the group
/// settle for three TTLs without handovers. Returns when it healed.
pub(super) async fn settle(world: &World, slots: &mut [Slot], rng: &mut Rng) -> Duration {
    let scenario = &world.scenario;
    world
        .handovers
        .store(false, std::sync::atomic::Ordering::Relaxed);
    for (i, slot) in slots.iter_mut().enumerate() {
        if slot.crashed {
            world.restart(slot, 1_000 + i as u64, rng);
        }
        slot.link.heal();
    }
    let healed = world.since_start();
    tokio::time::sleep(scenario.ttl * 3).await;
    healed
}

/// A crash of the leader, and when, for the liveness check.
pub(super) type LeaderCrash = Option<(usize, Duration)>;

/// Liveness: crashes the leader (if any) without a witness; someone else
/// must lead within the TTL and a bound. Then a witnessed crash of the
/// next leader; someone else must lead within a few round trips. Then
/// crashes everyone. Returns the crashed leaders and when.
pub(super) async fn liveness(world: &World, slots: &mut [Slot], rng: &mut Rng) -> [LeaderCrash; 3] {
    let scenario = &world.scenario;
    let chosen = crash_chosen_standby(world, slots, rng).await;
    tokio::time::sleep(scenario.ttl + scenario.failover_slack * 2).await;
    let crash = crash_leader(world, slots, false).await;
    tokio::time::sleep(scenario.ttl + scenario.failover_slack * 2).await;
    let witnessed = crash_leader(world, slots, true).await;
    tokio::time::sleep(scenario.witnessed_failover * 2).await;
    for slot in slots.iter_mut() {
        if !slot.crashed {
            world.crash(slot);
        }
    }
    [crash, witnessed, chosen]
}

/// Asks the leader to hand over to a standby, and crashes that standby
/// (unwitnessed) while the transfer is under way; then restarts it, so the
/// later checks still have candidates. Someone else must lead within the
/// TTL and a bound: the chosen standby's session expires, and with it its
/// place in line.
pub(super) async fn crash_chosen_standby(
    world: &World,
    slots: &mut [Slot],
    rng: &mut Rng,
) -> LeaderCrash {
    let leader = world.store.leader(&world.election).await.ok().flatten()?;
    let leading = slot_of(slots, &leader);
    let i = (0..slots.len()).find(|&i| i != leading && !slots[i].crashed)?;
    let to = CandidateId::new(format!("c{i}")).expect("valid id");
    let (store, election, ttl) = (
        Arc::clone(&world.store) as Arc<dyn Store>,
        world.election.clone(),
        world.scenario.ttl,
    );
    tokio::spawn(async move {
        let _ =
            leasehold::admin::request_transfer(&store, &election, Some(&to), ttl, ttl * 2).await;
    });
    // Long enough for the request to reach the leader, not for the
    // handover to finish.
    tokio::time::sleep(world.scenario.max_delay * 3).await;
    let at = world.since_start();
    world.crash(&mut slots[i]);
    slots[i] = world.spawn(i, 2_000 + i as u64, rng);
    Some((i, at))
}

/// The slot of the candidate whose open term holds `leader`'s token; by
/// the id's number if none does (the term is not recorded yet). Ids alone
/// do not tell twins apart ([`Scenario::twin_ids`]).
pub(super) fn slot_of(slots: &[Slot], leader: &Leader) -> usize {
    slots
        .iter()
        .find(|s| lock(&s.open).values().any(|t| t.token == leader.token.0))
        .map_or_else(|| candidate_index(&leader.candidate), |s| s.index)
}

/// Crashes the store's current leader, witnessed or not.
pub(super) async fn crash_leader(
    world: &World,
    slots: &mut [Slot],
    witnessed: bool,
) -> LeaderCrash {
    let leader = world.store.leader(&world.election).await.ok().flatten()?;
    let i = slot_of(slots, &leader);
    let at = world.since_start();
    if let Some(slot) = slots.get_mut(i) {
        if witnessed {
            world.crash_witnessed(slot);
        } else {
            world.crash(slot);
        }
    }
    Some((i, at))
}
