//! Every store side by side: SQLite, etcd, ZooKeeper and PostgreSQL.
//!
//! `cargo bench -p leasehold-cli --bench stores [-- --rounds N]`
//!
//! Starts its own servers on loopback (a 3-member etcd cluster, a
//! standalone ZooKeeper, a PostgreSQL server; Debian's packages) and prints
//! one table. Process figures run from just before the signal to the
//! successor's command's first line arriving here; library figures are
//! in-process, one store handle, concurrent campaigns each on its own
//! session. Medians and maxima; nothing asserts a timing.

use std::time::{Duration, Instant};

use leasehold_testkit::{EtcdCluster, PostgresServer, ZooKeeperServer};
use nix::sys::signal::Signal;

mod common;
use common::{Replica, arg, library, ms, percentile};

/// Prints `start PID`, then works until told to stop.
const WORK: &str = r#"echo "start $$"; trap 'exit 0' TERM; while :; do sleep 0.02; done"#;

struct Backend {
    name: &'static str,
    url: String,
}

/// SIGKILL (crash) or SIGTERM (planned) of the leading runner; the time
/// until the waiting runner's command starts.
fn stop_leader(backend: &Backend, rounds: usize, signal: Signal) -> Vec<Duration> {
    let mut samples = Vec::new();
    for i in 0..rounds {
        let election = format!("{}-{i}-{}", signal.as_str(), std::process::id());
        let a = Replica::leasehold(&backend.url, &election, "a", "2s", WORK);
        if a.line_with("start", Duration::from_secs(15)).is_none() {
            a.stop();
            continue;
        }
        let b = Replica::leasehold(&backend.url, &election, "b", "2s", WORK);
        // Vary where the signal falls between renewals (every ~667 ms).
        std::thread::sleep(Duration::from_millis(1000 + (i as u64 * 233) % 700));
        let t0 = Instant::now();
        a.signal(signal);
        if let Some((t1, _)) = b.line_with("start", Duration::from_secs(15)) {
            samples.push(t1 - t0);
        }
        a.stop();
        b.stop();
    }
    samples
}

/// `n` runners started together, each running a command that exits at
/// once: time until all have run. Panics if one fails.
fn processes(backend: &Backend, n: usize, round: usize) -> Duration {
    let election = format!("queue-{n}-{round}-{}", std::process::id());
    let t0 = Instant::now();
    let replicas: Vec<Replica> = (0..n)
        .map(|i| Replica::leasehold(&backend.url, &election, &format!("c{i}"), "10s", "echo ran"))
        .collect();
    for mut r in replicas {
        let ran = r.line_with("ran", Duration::from_secs(120)).is_some();
        let status = r.child.wait().expect("wait");
        assert!(
            ran && status.success(),
            "{}: a runner failed: {status}",
            backend.name
        );
    }
    t0.elapsed()
}

fn median_max(samples: &[Duration]) -> String {
    if samples.is_empty() {
        return "none".into();
    }
    let max = samples.iter().max().copied().unwrap_or_default();
    format!("{} / {}", ms(percentile(samples, 50.0)), ms(max))
}

fn main() {
    let rounds = arg("--rounds", 5);
    let scratch = tempfile::tempdir().expect("temp dir");
    let etcd = EtcdCluster::start(3);
    let zookeeper = ZooKeeperServer::start();
    let postgres = PostgresServer::start();
    let backends = [
        Backend {
            name: "sqlite",
            url: format!("sqlite:{}", scratch.path().join("bench.db").display()),
        },
        Backend {
            name: "etcd (3 members)",
            url: etcd.url("/bench"),
        },
        Backend {
            name: "zookeeper",
            url: zookeeper.url("/bench"),
        },
        Backend {
            name: "postgres",
            url: postgres.url(),
        },
    ];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    let mut rows: Vec<(String, Vec<String>)> = vec![
        (
            "crash failover, SIGKILL of `run`, TTL 2s: median / max ms".into(),
            vec![],
        ),
        (
            "planned handover, SIGTERM to `run`: median / max ms".into(),
            vec![],
        ),
        ("library, 10 contenders: first grant ms".into(), vec![]),
        (
            "library, 10 contenders: handover p50 / p99 ms".into(),
            vec![],
        ),
        ("library, 100 contenders: first grant ms".into(), vec![]),
        (
            "library, 100 contenders: handover p50 / p99 ms".into(),
            vec![],
        ),
        (
            "processes, 10 `run`s each run once: median / max ms".into(),
            vec![],
        ),
        ("processes, 100 `run`s each run once: ms".into(), vec![]),
    ];
    for backend in &backends {
        eprintln!("measuring {}…", backend.name);
        let mut column = vec![
            median_max(&stop_leader(backend, rounds, Signal::SIGKILL)),
            median_max(&stop_leader(backend, rounds, Signal::SIGTERM)),
        ];
        for n in [10usize, 100] {
            let (first, handovers) = runtime.block_on(async {
                let url = backend.url.parse().expect("store URL");
                let store = leasehold::store::open(&url, leasehold::store::Access::ReadWrite)
                    .await
                    .expect("open the store");
                library(store, n).await
            });
            column.push(ms(first));
            column.push(format!(
                "{} / {}",
                ms(percentile(&handovers, 50.0)),
                ms(percentile(&handovers, 99.0))
            ));
        }
        let runs: Vec<Duration> = (0..rounds.min(3))
            .map(|r| processes(backend, 10, r))
            .collect();
        column.push(median_max(&runs));
        column.push(ms(processes(backend, 100, 0)));
        for (row, value) in rows.iter_mut().zip(column) {
            row.1.push(value);
        }
    }
    println!("{rounds} rounds per process figure; servers on loopback on this machine");
    println!();
    print!("| {:<58} |", "measurement");
    for b in &backends {
        print!(" {:>17} |", b.name);
    }
    println!();
    print!("|{}|", "-".repeat(60));
    for _ in &backends {
        print!("{}|", "-".repeat(19));
    }
    println!();
    for (what, values) in rows {
        print!("| {what:<58} |");
        for v in values {
            print!(" {v:>17} |");
        }
        println!();
    }
}
