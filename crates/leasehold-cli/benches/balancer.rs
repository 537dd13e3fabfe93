//! The GUIDE's load-balancer recipe under planned moves, on SQLite and on
//! a 3-member etcd cluster: three replicas of `recipes/leader_service.py`,
//! each beside its `leasehold sidecar`, behind HAProxy (`recipes/haproxy.cfg`,
//! health checks on `/leader` every 100 ms). From the health checks alone
//! to the whole recipe, one part added at a time: the services' hold-off
//! before a 503, the backup servers used while no server is seen up, and
//! the hook that tells HAProxy's runtime API of a new leader at once.
//!
//! `cargo build --release -p leasehold-cli --example fenced_store &&
//! cargo bench -p leasehold-cli --bench balancer [-- --rounds N --clients N]`
//!
//! `--clients` threads send `POST /` through HAProxy one after another, each
//! on a connection of its own. Each round makes one move and waits 1.5 s:
//! `leasehold transfer` (to the first in line), then a SIGTERM to the
//! leader's sidecar (started again afterwards), alternately. For each move:
//! the time from just before the move (the `transfer` process's spawn, or the
//! signal) to the first request answered 200 with a newer token; and the
//! requests that failed in the 1.5 s after it. Requests served with a token
//! older than one an earlier answer (finished before the request was sent)
//! carried count as stale; the fenced store's log must also never go back.
//! Nothing asserts a timing.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold_testkit::EtcdCluster;
use leasehold_testkit::leader_fleet::{self, FleetBinaries, FleetOptions, LeaderFleet};
use nix::sys::signal::Signal;

mod common;
use common::{arg, http_code, ms, percentile};

/// One request: when it was sent and answered, its code, and the token
/// that served it (on a 200).
#[derive(Clone, Copy)]
struct Sent {
    sent: Instant,
    done: Instant,
    code: u16,
    token: Option<u64>,
}

fn fenced_store() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_leasehold"));
    let path = bin
        .parent()
        .expect("target dir")
        .join("examples/fenced_store");
    assert!(
        path.exists(),
        "{} is missing: cargo build --release -p leasehold-cli --example fenced_store",
        path.display()
    );
    path
}

fn client(front: SocketAddr, stop: Arc<AtomicBool>, log: Arc<Mutex<Vec<Sent>>>) {
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        let answer = leader_fleet::post(front, "order");
        let token = answer.as_ref().and_then(|(code, body)| {
            let body: serde_json::Value = serde_json::from_str(body).ok()?;
            (*code == 200).then(|| body["token"].as_u64())?
        });
        log.lock().expect("log").push(Sent {
            sent,
            done: Instant::now(),
            code: answer.map_or(0, |(code, _)| code),
            token,
        });
    }
}

/// Which replica's sidecar `/leader` answers 200, waiting for one.
fn leading(fleet: &LeaderFleet) -> usize {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        for replica in 0..3 {
            if http_code(fleet.sidecar(replica), "/leader") == Some(200) {
                return replica;
            }
        }
        assert!(Instant::now() < until, "nobody leads: {}", fleet.logs());
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait_following(fleet: &LeaderFleet, replica: usize) {
    let until = Instant::now() + Duration::from_secs(30);
    while http_code(fleet.sidecar(replica), "/follower") != Some(200) {
        assert!(Instant::now() < until, "{replica} never followed");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What the moves of one fleet came to.
#[derive(Default)]
struct Moves {
    transfer: Vec<Duration>,
    sigterm: Vec<Duration>,
    failed_transfer: Vec<usize>,
    failed_sigterm: Vec<usize>,
    /// From the first failed request's sending to the last one's answer.
    window_transfer: Vec<Duration>,
    window_sigterm: Vec<Duration>,
    served: usize,
    seconds: f64,
    stale: usize,
    store_went_back: bool,
}

/// After a move at `t0`: the first 200 with a token above `above`, how
/// many requests failed in the `window` after `t0`, and from the first
/// failed request's sending to the last one's answer.
fn after_move(
    log: &[Sent],
    t0: Instant,
    above: u64,
    window: Duration,
) -> (Option<Duration>, usize, Duration) {
    let first = log
        .iter()
        .filter(|s| s.done >= t0 && s.token.is_some_and(|t| t > above))
        .map(|s| s.done - t0)
        .min();
    let failed: Vec<&Sent> = log
        .iter()
        .filter(|s| s.done >= t0 && s.done < t0 + window && s.code != 200)
        .collect();
    let from = failed.iter().map(|s| s.sent).min();
    let to = failed.iter().map(|s| s.done).max();
    let span = from.zip(to).map_or(Duration::ZERO, |(from, to)| to - from);
    (first, failed.len(), span)
}

/// One way to set the recipe up: (what it adds, hook, backup servers,
/// hold-off ms, one of the three replicas down).
type Variant = (&'static str, bool, bool, u32, bool);

/// From HAProxy's health checks alone to the whole recipe, one part added
/// at a time; then the whole recipe with one replica down.
const VARIANTS: [Variant; 5] = [
    ("checks only", false, false, 0, false),
    ("+ hold-off 50 ms", false, false, 50, false),
    ("+ backup servers", false, true, 50, false),
    ("+ hook (the whole recipe)", true, true, 50, false),
    (
        "the whole recipe, one replica of three down",
        true,
        true,
        50,
        true,
    ),
];

/// The fleet of `variant`, settled: a leader, the other live replicas
/// waiting in line (one taken away first when the variant says so).
fn settled(store: &str, election: &str, variant: Variant) -> LeaderFleet {
    let (_, hooks, backups, hold_off_ms, one_down) = variant;
    let binaries = FleetBinaries {
        leasehold: env!("CARGO_BIN_EXE_leasehold").into(),
        fenced_store: fenced_store(),
    };
    let options = FleetOptions {
        store,
        election,
        ttl: "5s",
        hooks,
        backups,
        hold_off_ms,
    };
    let mut fleet = LeaderFleet::start(binaries, &options, 3);
    let first = leading(&fleet);
    let mut live: Vec<usize> = (0..3).collect();
    if one_down {
        let away = (first + 1) % 3;
        fleet.stop_replica(away);
        live.retain(|r| *r != away);
    }
    for replica in live.into_iter().filter(|r| *r != first) {
        wait_following(&fleet, replica);
    }
    fleet
}

/// One move (a transfer, or a SIGTERM to the leader's sidecar, which is
/// started again after the window) and what the clients saw after it.
fn one_move(
    fleet: &mut LeaderFleet,
    log: &Mutex<Vec<Sent>>,
    by_transfer: bool,
    store: &str,
    election: &str,
) -> (Duration, usize, Duration) {
    let window = Duration::from_millis(1500);
    let leader = leading(fleet);
    let above = log
        .lock()
        .expect("log")
        .iter()
        .filter_map(|s| s.token)
        .max()
        .unwrap_or(0);
    let t0 = Instant::now();
    if by_transfer {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["transfer", "-e", election, "--store", store])
            .output()
            .expect("transfer");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    } else {
        fleet.signal_sidecar(leader, Signal::SIGTERM);
    }
    std::thread::sleep(window);
    let (first, failed, span) = after_move(&log.lock().expect("log"), t0, above, window);
    let first = first.unwrap_or_else(|| panic!("no new leader served: {}", fleet.logs()));
    if !by_transfer {
        fleet.restart_sidecar(leader);
        wait_following(fleet, leader);
    }
    (first, failed, span)
}

fn run(store: &str, election: &str, variant: Variant, rounds: usize, clients: usize) -> Moves {
    let mut fleet = settled(store, election, variant);
    let log: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (front, stop, log) = (fleet.front(), stop.clone(), log.clone());
            std::thread::spawn(move || client(front, stop, log))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut moves = Moves::default();
    for round in 0..2 * rounds {
        let by_transfer = round % 2 == 0;
        let (first, failed, span) = one_move(&mut fleet, &log, by_transfer, store, election);
        if by_transfer {
            moves.transfer.push(first);
            moves.failed_transfer.push(failed);
            moves.window_transfer.push(span);
        } else {
            moves.sigterm.push(first);
            moves.failed_sigterm.push(failed);
            moves.window_sigterm.push(span);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().expect("client");
    }
    let log = log.lock().expect("log");
    moves.served = log.iter().filter(|s| s.code == 200).count();
    let first_sent = log.iter().map(|s| s.sent).min();
    let last_done = log.iter().map(|s| s.done).max();
    moves.seconds = first_sent
        .zip(last_done)
        .map_or(0.0, |(from, to)| (to - from).as_secs_f64());
    moves.stale = stale(&log);
    moves.store_went_back = fleet.accepted().windows(2).any(|w| w[0] > w[1]);
    moves
}

/// Answers served with a token older than one an answer finished before
/// this request was sent had carried.
fn stale(log: &[Sent]) -> usize {
    let mut done: Vec<(Instant, u64)> = log
        .iter()
        .filter_map(|s| Some((s.done, s.token?)))
        .collect();
    done.sort();
    log.iter()
        .filter_map(|s| Some((s.sent, s.token?)))
        .filter(|(sent, token)| {
            done.iter()
                .take_while(|(at, _)| at < sent)
                .any(|(_, newer)| newer > token)
        })
        .count()
}

/// Median / max (sum) of counts.
fn counts(samples: &[usize]) -> String {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0);
    let max = sorted.last().copied().unwrap_or(0);
    format!("{median} / {max} ({})", sorted.iter().sum::<usize>())
}

fn main() {
    let rounds = arg("--rounds", 5);
    let clients = arg("--clients", 4);
    let scratch = tempfile::tempdir().expect("temp dir");
    let etcd = EtcdCluster::start(3);
    let sqlite = format!("sqlite:{}", scratch.path().join("bench.db").display());
    let stores = [
        ("sqlite", sqlite),
        ("etcd (3 members)", etcd.url("/balancer")),
    ];
    println!(
        "| store | recipe | transfer → first request served by the new leader: median / max ms | SIGTERM → the same | failed requests per transfer: median / max (all) | their window: median / max ms | failed per SIGTERM | their window | requests served (per second) | stale served | store went back |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, store) in &stores {
        for (n, variant) in VARIANTS.into_iter().enumerate() {
            let election = format!("balancer-{n}");
            let moves = run(store, &election, variant, rounds, clients);
            let times = |s: &[Duration]| {
                format!("{} / {}", ms(percentile(s, 50.0)), ms(percentile(s, 100.0)))
            };
            println!(
                "| {name} | {} | {} | {} | {} | {} | {} | {} | {} ({:.0}) | {} | {} |",
                variant.0,
                times(&moves.transfer),
                times(&moves.sigterm),
                counts(&moves.failed_transfer),
                times(&moves.window_transfer),
                counts(&moves.failed_sigterm),
                times(&moves.window_sigterm),
                moves.served,
                moves.served as f64 / moves.seconds.max(1e-9),
                moves.stale,
                if moves.store_went_back { "yes" } else { "no" },
            );
        }
    }
}
