//! PostgreSQL restarted under a leader and a line of 30 waiters, against a
//! real server (Debian's postgresql): a fast shutdown (SIGINT: backends
//! ended, a shutdown checkpoint) and an immediate one (SIGQUIT, as after a
//! crash: the start replays the log), each followed by a start on the same
//! port and data.
//!
//! Every candidate is its own process as far as the store can tell: its
//! own `PostgresStore` (its own connections and listener), its own
//! `Elector` and session. The leader's TTL is short; the waiters' TTL is
//! long enough that their sessions, and so the line, outlive the restart
//! whatever becomes of the leader. Each test runs two rounds on one server,
//! each with a new election, leader and line:
//!
//! - the server restarted at once: the leader keeps leading if a renewal
//!   lands before its deadline, or steps down by it. Either outcome is
//!   correct; the test asserts what the one that happened must satisfy,
//!   and prints which it was;
//! - the server held down past the leader's validity, then started: the
//!   leader must step down (no renewal can land before its deadline).
//!
//! What each outcome must satisfy:
//!
//! - kept leading: a renewal sent after the restart landed, the grant and
//!   its token are unchanged, the store shows it, no waiter was granted
//!   meanwhile, and the line is unchanged;
//! - stepped down: its `Leadership` ended (deadline passed, or the store
//!   ended the session) no later than its deadline, and the first in line
//!   was granted only after that deadline.
//!
//! Throughout, the leader never considers itself leader at or past its
//! deadline (sampled every few milliseconds; rule 4). Then the line hands
//! the election down, one resignation at a time: all 30 waiters are
//! granted exactly once each, in the order they stood in line before the
//! restart (DESIGN, the line of standbys: equal priorities in the store's
//! order of joining), each only after its predecessor began to resign, with
//! strictly increasing tokens (rule 2) and never two holders at once
//! (rule 1); nobody is left in line or holding at the end.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::backend::postgres::PostgresStore;
use leasehold::store::Store;
use leasehold::testing::unique_election;
use leasehold::{CandidateId, ElectionName, Elector, Error, Leadership, LeaseConfig, LostReason};
use leasehold_testkit::PostgresServer;
use tokio::time::Instant;

/// How many candidates wait in line behind the leader.
const WAITERS: usize = 30;
/// The leader's TTL: renewed every 667 ms, valid 1.88 s after a renewal
/// is sent, so it rides out a restart of up to 1.2–1.9 s (depending on
/// when its last renewal before it went out) and steps down after a
/// longer one.
const LEADER_TTL: Duration = Duration::from_secs(2);
/// The waiters' TTL: renewed every 3 s, valid 8.81 s, so an outage of up
/// to 5.8 s leaves every waiter's session, and its place in line, alive.
const WAITER_TTL: Duration = Duration::from_secs(9);
/// How long the held-down round keeps the server down beyond the leader's
/// validity.
const PAST_THE_DEADLINE: Duration = Duration::from_millis(300);
/// The schema every candidate's store uses.
const SCHEMA: &str = "faults";
/// Generous bound on anything that should happen "soon" (a grant after a
/// release, a renewal after the restart) on a busy shared machine.
const EVENTUALLY: Duration = Duration::from_secs(20);

/// How the server is shut down.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// SIGINT.
    Fast,
    /// SIGQUIT.
    Immediate,
}

impl Mode {
    /// Shuts the server down and waits for it to exit.
    fn stop(self, server: &mut PostgresServer) {
        match self {
            Mode::Fast => server.stop_fast(),
            Mode::Immediate => server.stop(),
        }
    }
}

/// How long the server stays down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Down {
    /// Started again as soon as it has exited.
    AtOnce,
    /// Started again only once the leader's validity has passed since the
    /// server exited: the leader must step down.
    PastTheLeadersDeadline,
}

/// The leader's validity after sending a renewal: `ttl·(1 − drift) − skew`.
fn leader_validity() -> Duration {
    LeaseConfig::new(LEADER_TTL)
        .validity(LEADER_TTL)
        .expect("a valid TTL")
}

/// What a waiter's campaign delivers: its index, when it saw the grant,
/// how many waiters held just before it counted itself, and the
/// leadership.
type Granted = (usize, Instant, usize, Leadership);

async fn candidate(url: &str, id: &str, ttl: Duration) -> Elector {
    let store = PostgresStore::connect(url, SCHEMA)
        .await
        .expect("connect a candidate's own store");
    Elector::new(
        Arc::new(store),
        CandidateId::new(id).expect("id"),
        LeaseConfig::new(ttl),
    )
    .expect("config")
}

/// The waiters' indices in the order the line shows them (`w07` → 7).
async fn line_of(store: &dyn Store, election: &ElectionName) -> Vec<usize> {
    leasehold::admin::line(store, election)
        .await
        .expect("read the line")
        .iter()
        .map(|standby| {
            standby.candidate.as_str()[1..]
                .parse()
                .expect("a waiter's id")
        })
        .collect()
}

/// Campaigns until granted, retrying after store errors (the restart) and
/// recording them; then counts itself a holder and hands the leadership
/// on. It campaigns no more after its grant.
fn spawn_waiter(
    index: usize,
    elector: Arc<Elector>,
    election: ElectionName,
    holders: Arc<AtomicUsize>,
    errors: Arc<Mutex<Vec<String>>>,
    granted: tokio::sync::mpsc::UnboundedSender<Granted>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match elector.campaign(&election).await {
                Ok(leadership) => {
                    let at = Instant::now();
                    let before = holders.fetch_add(1, Ordering::SeqCst);
                    let _ = granted.send((index, at, before, leadership));
                    return;
                }
                Err(error @ Error::InvalidInput { .. }) => panic!("w{index:02}: {error}"),
                Err(error) => {
                    eprintln!("w{index:02}: campaign failed, retrying: {error}");
                    errors
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(format!("w{index:02}: {error}"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
}

/// Samples the leader every few milliseconds until `stop`: how many
/// samples were taken, and by how much it considered itself leader past
/// its deadline (rule 4), if it ever did.
fn spawn_sampler(
    leader: Arc<Leadership>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, Option<Duration>)> {
    tokio::spawn(async move {
        let mut samples = 0;
        while !stop.load(Ordering::SeqCst) {
            // The clock first and the deadline last: `is_leader` reads the
            // clock in between and the deadline only moves forward, so a
            // correct leader always has `before < deadline`.
            let before = Instant::now();
            let leading = leader.is_leader();
            let deadline = leader.deadline();
            if leading && before >= deadline {
                return (samples, Some(before - deadline));
            }
            samples += 1;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        (samples, None)
    })
}

/// How the leader came out of the restart.
#[derive(Debug)]
enum Outcome {
    /// A renewal sent after the restart landed: the deadline moved past
    /// `restarted + validity`.
    KeptLeading,
    /// Leadership ended, for this reason, at this instant.
    SteppedDown(LostReason, Instant),
}

/// One round: a new election, its leader and 30 waiters in line, the
/// server shut down in `mode` and started again after `down`; then the
/// checks of the module's doc. Returns the server for the next round.
async fn round(mut server: PostgresServer, mode: Mode, down: Down) -> PostgresServer {
    let began = Instant::now();
    let url = server.url();
    let election = unique_election("pg-faults");
    let observer = PostgresStore::connect(&url, SCHEMA)
        .await
        .expect("observer connects");

    // The leader, renewing in the background.
    let leader_elector = candidate(&url, "leader", LEADER_TTL).await;
    let leader = Arc::new(
        leader_elector
            .campaign(&election)
            .await
            .expect("the leader campaigns"),
    );
    let token = leader.token();

    // 30 waiters, each its own store and session, campaigning at once;
    // the store's order of their notes is the line.
    let mut connecting = tokio::task::JoinSet::new();
    for i in 0..WAITERS {
        let url = url.clone();
        connecting
            .spawn(async move { (i, candidate(&url, &format!("w{i:02}"), WAITER_TTL).await) });
    }
    let mut electors: Vec<Option<Arc<Elector>>> = (0..WAITERS).map(|_| None).collect();
    while let Some(joined) = connecting.join_next().await {
        let (i, elector) = joined.expect("connect task");
        electors[i] = Some(Arc::new(elector));
    }
    let electors: Vec<Arc<Elector>> = electors.into_iter().flatten().collect();
    // Waiters holding now (the leader is checked by its deadline and its
    // resignation instead).
    let holders = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let (granted_tx, mut granted) = tokio::sync::mpsc::unbounded_channel::<Granted>();
    let waiters: Vec<_> = electors
        .iter()
        .enumerate()
        .map(|(i, elector)| {
            spawn_waiter(
                i,
                Arc::clone(elector),
                election.clone(),
                Arc::clone(&holders),
                Arc::clone(&errors),
                granted_tx.clone(),
            )
        })
        .collect();
    drop(granted_tx);
    let lined_up = async {
        loop {
            let line = line_of(&observer, &election).await;
            if line.len() == WAITERS {
                return line;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let order = tokio::time::timeout(EVENTUALLY, lined_up)
        .await
        .expect("30 waiters in line");
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..WAITERS).collect::<Vec<_>>(),
        "each waiter once in line"
    );

    // Let the leader renew once or twice, then restart the server.
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampler = spawn_sampler(Arc::clone(&leader), Arc::clone(&stop_sampling));
    // When `lost()` resolves, as the leader's own code would see it.
    let mut lost = {
        let leader = Arc::clone(&leader);
        tokio::spawn(async move { (leader.lost().await, Instant::now()) })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(leader.is_leader(), "the leader leads before the restart");
    let stopping = Instant::now();
    let (server_back, exited) = tokio::task::spawn_blocking(move || {
        mode.stop(&mut server);
        let exited = Instant::now();
        if down == Down::PastTheLeadersDeadline {
            std::thread::sleep(leader_validity() + PAST_THE_DEADLINE);
        }
        server.start_again();
        (server, exited)
    })
    .await
    .expect("restart");
    server = server_back;
    let restarted = Instant::now();
    let shutdown_took = exited - stopping;
    let down_for = restarted - exited;

    // Either a renewal sent after the restart lands (the deadline moves
    // past `restarted + validity`), or leadership ends.
    let outcome = tokio::time::timeout(EVENTUALLY, async {
        let mut seen = leader.deadline();
        loop {
            if seen >= restarted + leader_validity() {
                return Outcome::KeptLeading;
            }
            tokio::select! {
                ended = &mut lost => {
                    let (reason, at) = ended.expect("the lost() task");
                    return Outcome::SteppedDown(reason, at);
                }
                deadline = leader.deadline_after(seen) => seen = deadline,
            }
        }
    })
    .await
    .expect("the leader either renews after the restart or steps down");

    let mut expected = order.clone();
    let mut last_token = token;
    let mut previous_holder: Option<Leadership> = None;
    // When the last holder began to resign: nobody may be granted before.
    let mut released: Option<Instant> = None;
    let how = match outcome {
        Outcome::KeptLeading => {
            assert_eq!(
                down,
                Down::AtOnce,
                "rule 4: the leader kept leading though the server was down past its deadline"
            );
            // Same grant, same token, renewed after the restart, as the
            // store sees it too; nobody else was granted; the line is whole.
            assert!(leader.is_leader(), "kept leading");
            assert_eq!(leader.token(), token, "the token of a kept grant");
            let held = observer
                .leader(&election)
                .await
                .expect("read the leader")
                .expect("the election is held");
            assert_eq!(
                (held.candidate.as_str(), held.token),
                ("leader", token),
                "the store shows the leader's grant"
            );
            assert!(
                granted.try_recv().is_err(),
                "a waiter was granted while the leader kept leading"
            );
            assert_eq!(
                line_of(&observer, &election).await,
                order,
                "the line after the restart"
            );
            stop_sampling.store(true, Ordering::SeqCst);
            let (samples, past) = sampler.await.expect("sampler");
            assert_eq!(past, None, "rule 4: the leader led past its deadline");
            lost.abort();
            let _ = lost.await;
            let leader = Arc::into_inner(leader).expect("the sampler let go");
            released = Some(Instant::now());
            leader.resign().await.expect("the leader resigns");
            format!(
                "the leader kept leading (token {}, {samples} samples)",
                token.0
            )
        }
        Outcome::SteppedDown(reason, lost_at) => {
            let deadline = leader.deadline();
            assert!(
                matches!(
                    reason,
                    LostReason::DeadlineExpired { .. }
                        | LostReason::SessionExpired
                        | LostReason::Superseded
                ),
                "the leader lost leadership to the restart, not {reason:?}"
            );
            assert!(!leader.is_leader(), "a leader that stepped down");
            // `lost()` resolves at the deadline at the latest; its task may
            // run late on a busy machine, so only a generous bound here. The
            // exact rule (never a leader past the deadline) is the sampler's.
            assert!(
                lost_at < deadline + Duration::from_secs(2),
                "lost() resolved {:?} after the deadline",
                lost_at - deadline
            );
            let lost_vs_deadline = if lost_at >= deadline {
                format!("{:?} after", lost_at - deadline)
            } else {
                format!("{:?} before", deadline - lost_at)
            };
            if down == Down::PastTheLeadersDeadline {
                assert!(
                    deadline <= exited + leader_validity(),
                    "the deadline counts from a renewal sent before the server exited"
                );
            }
            stop_sampling.store(true, Ordering::SeqCst);
            let (samples, past) = sampler.await.expect("sampler");
            assert_eq!(past, None, "rule 4: the leader led past its deadline");
            // The line is whole, or its first has just been granted.
            let line = line_of(&observer, &election).await;
            assert!(
                line == order || line == order[1..],
                "the line after the restart: {line:?}, before: {order:?}"
            );
            // The first in line takes over, only after the leader's deadline.
            let (first, at, before, leadership) = tokio::time::timeout(EVENTUALLY, granted.recv())
                .await
                .expect("the first in line is granted after the leader's lease")
                .expect("a waiter is granted");
            assert_eq!(first, expected.remove(0), "the first in line takes over");
            assert_eq!(before, 0, "two holders at once");
            assert!(
                at >= deadline,
                "rule 4: w{first:02} granted {:?} before the leader's deadline",
                deadline - at
            );
            assert!(leadership.token() > last_token, "rule 2 across the restart");
            last_token = leadership.token();
            previous_holder = Some(leadership);
            format!(
                "the leader stepped down ({reason}), lost() {lost_vs_deadline} its deadline, \
                 w{first:02} granted {:?} after the deadline ({samples} samples)",
                at - deadline
            )
        }
    };

    // The line hands the election down: each waiter once, in line order.
    for next in expected {
        if let Some(holder) = previous_holder.take() {
            assert!(holder.is_leader(), "a holder leads until it resigns");
            holders.fetch_sub(1, Ordering::SeqCst);
            released = Some(Instant::now());
            holder.resign().await.expect("a holder resigns");
        }
        let (index, at, before, leadership) = tokio::time::timeout(EVENTUALLY, granted.recv())
            .await
            .unwrap_or_else(|_| panic!("w{next:02} is granted after a resignation"))
            .expect("a waiter is granted");
        assert_eq!(index, next, "granted out of the line's order {order:?}");
        assert_eq!(before, 0, "two holders at once (w{index:02})");
        let released = released.take().expect("a resignation came first");
        assert!(
            at >= released,
            "w{index:02} granted {:?} before its predecessor resigned",
            released - at
        );
        assert!(
            leadership.token() > last_token,
            "rule 2: w{index:02} got {} after {}",
            leadership.token().0,
            last_token.0
        );
        last_token = leadership.token();
        previous_holder = Some(leadership);
    }
    if let Some(holder) = previous_holder.take() {
        holders.fetch_sub(1, Ordering::SeqCst);
        holder.resign().await.expect("the last holder resigns");
    }
    // Every waiter's campaign ended with its one grant; nobody is left.
    for waiter in waiters {
        waiter.await.expect("a waiter's task");
    }
    assert!(granted.recv().await.is_none(), "a waiter granted twice");
    assert_eq!(holders.load(Ordering::SeqCst), 0);
    assert_eq!(observer.leader(&election).await.expect("read"), None);
    // A granted candidate deletes its note in the background.
    let emptied = async {
        while !line_of(&observer, &election).await.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(EVENTUALLY, emptied)
        .await
        .expect("the line empties");
    let errors = errors
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    println!(
        "{mode:?} shutdown ({shutdown_took:?}), down {down:?} ({down_for:?}): {how}; \
         30 waiters granted in line order, tokens {}..={}; {} campaign errors retried {errors:?}; \
         round took {:?}",
        token.0 + 1,
        last_token.0,
        errors.len(),
        began.elapsed()
    );
    server
}

async fn restarts(mode: Mode) {
    let server = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .expect("server start");
    let server = round(server, mode, Down::AtOnce).await;
    let server = round(server, mode, Down::PastTheLeadersDeadline).await;
    drop(server);
}

/// A fast shutdown (SIGINT) and a start, at once and then past the
/// leader's deadline, while a leader renews and 30 candidates wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_restarts_under_a_leader_and_30_waiters() {
    restarts(Mode::Fast).await;
}

/// An immediate shutdown (SIGQUIT, as after a crash) and a start, at once
/// and then past the leader's deadline, while a leader renews and 30
/// candidates wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_restarts_under_a_leader_and_30_waiters() {
    restarts(Mode::Immediate).await;
}
