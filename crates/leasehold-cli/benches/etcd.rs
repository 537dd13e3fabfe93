//! leasehold on etcd, side by side with `etcdctl lock` on the same cluster.
//!
//! `cargo bench -p leasehold-cli --bench etcd [-- --rounds N]`
//!
//! Starts its own 3-member cluster (Debian's etcd-server) on loopback. For
//! each measurement both tools supervise the same `sh -c` command, which
//! prints a line when it starts; times run from just before the signal (or
//! the release) to that line arriving here. Medians and maxima over the
//! rounds; nothing asserts a timing.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::backend::etcd::EtcdStore;
use leasehold_testkit::EtcdCluster;
use nix::sys::signal::Signal;

mod common;
use common::{Replica, alive, arg, library, ms, percentile};

/// Prints `start ID PID`, then works until told to stop.
const WORK: &str = r#"echo "start $$"; trap 'exit 0' TERM; while :; do sleep 0.02; done"#;

#[derive(Clone, Copy, PartialEq)]
enum Tool {
    Leasehold,
    Etcdctl,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Leasehold => "leasehold run",
            Tool::Etcdctl => "etcdctl lock",
        }
    }

    fn replica(
        self,
        cluster: &EtcdCluster,
        election: &str,
        id: &str,
        ttl_s: u64,
        script: &str,
    ) -> Replica {
        match self {
            Tool::Leasehold => Replica::leasehold(
                &cluster.url("/bench"),
                election,
                id,
                &format!("{ttl_s}s"),
                script,
            ),
            Tool::Etcdctl => {
                let mut command = Command::new("etcdctl");
                command
                    .env("ETCDCTL_API", "3")
                    .arg(format!("--endpoints={}", cluster.endpoints().join(",")))
                    .args([
                        "lock",
                        &format!("--ttl={ttl_s}"),
                        election,
                        "--",
                        "sh",
                        "-c",
                        script,
                    ]);
                Replica::spawn(command)
            }
        }
    }
}

fn child_pid(line: &str) -> Option<i32> {
    line.split_whitespace().last()?.parse().ok()
}

struct Outcome {
    samples: Vec<Duration>,
    orphans: usize,
    rounds: usize,
}

/// How a holder's supervisor is stopped in a round.
struct Stop {
    signal: Signal,
    ttl_s: u64,
    /// Before the signal: fixed part, and a part varied across rounds so the
    /// signal falls at different points between renewals.
    settle: Duration,
    vary_ms: u64,
    wait: Duration,
}

/// Signals the lock holder's supervisor; time until the waiter's command
/// starts, and whether the stopped supervisor's command kept running.
fn stop_holder(tool: Tool, cluster: &EtcdCluster, rounds: usize, stop: &Stop) -> Outcome {
    let mut samples = Vec::new();
    let mut orphans = 0;
    for i in 0..rounds {
        let election = format!(
            "{}-{}-{i}",
            stop.signal.as_str(),
            tool.name().replace(' ', "-")
        );
        let a = tool.replica(cluster, &election, "a", stop.ttl_s, WORK);
        let Some((_, line)) = a.line_with("start", Duration::from_secs(10)) else {
            continue;
        };
        let b = tool.replica(cluster, &election, "b", stop.ttl_s, WORK);
        let vary = if stop.vary_ms == 0 {
            0
        } else {
            (i as u64 * 233) % stop.vary_ms
        };
        std::thread::sleep(stop.settle + Duration::from_millis(vary));
        let t0 = Instant::now();
        a.signal(stop.signal);
        if let Some((t1, _)) = b.line_with("start", stop.wait) {
            samples.push(t1 - t0);
        }
        if let Some(pid) = child_pid(&line) {
            std::thread::sleep(Duration::from_millis(200));
            if alive(pid) {
                orphans += 1;
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        a.stop();
        b.stop();
    }
    Outcome {
        samples,
        orphans,
        rounds,
    }
}

const CRASH: Stop = Stop {
    signal: Signal::SIGKILL,
    ttl_s: 2,
    settle: Duration::from_millis(1500),
    vary_ms: 700,
    wait: Duration::from_secs(15),
};

const TERMINATE: Stop = Stop {
    signal: Signal::SIGTERM,
    ttl_s: 10,
    settle: Duration::from_millis(300),
    vary_ms: 0,
    wait: Duration::from_secs(20),
};

/// `n` supervisors started together, each running a command that exits at
/// once: time until all have run (each acquisition waits for the previous
/// release). Panics if any supervisor fails, so a broken invocation cannot
/// pass for a fast one.
fn contenders(tool: Tool, cluster: &EtcdCluster, n: usize, round: usize) -> Duration {
    let election = format!("queue-{}-{n}-{round}", tool.name().replace(' ', "-"));
    let t0 = Instant::now();
    let replicas: Vec<Replica> = (0..n)
        .map(|i| tool.replica(cluster, &election, &format!("c{i}"), 10, "echo ran"))
        .collect();
    for mut r in replicas {
        let ran = r.line_with("ran", Duration::from_secs(120)).is_some();
        let status = r.child.wait().expect("wait");
        assert!(ran && status.success(), "{} failed: {status}", tool.name());
    }
    t0.elapsed()
}

fn main() {
    let rounds = arg("--rounds", 5);
    let cluster = EtcdCluster::start(3);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    println!("etcd 3-member cluster on loopback, {rounds} rounds per process-level figure");
    println!();
    println!("library, in-process (EtcdStore, one client, concurrent campaigns):");
    println!(
        "{:<12} {:>22} {:>22} {:>22}",
        "contenders", "first grant ms", "handover p50 ms", "handover p99 ms"
    );
    for n in [1usize, 10, 100] {
        let (first, handovers) = runtime.block_on(async {
            let store = EtcdStore::connect(
                &cluster.endpoints(),
                "/bench-lib",
                &leasehold::store::Security::none(),
            )
            .await
            .expect("connect");
            library(Arc::new(store), n).await
        });
        let (p50, p99) = if handovers.is_empty() {
            ("-".to_owned(), "-".to_owned())
        } else {
            (
                ms(percentile(&handovers, 50.0)),
                ms(percentile(&handovers, 99.0)),
            )
        };
        println!("{n:<12} {:>22} {:>22} {:>22}", ms(first), p50, p99);
    }
    println!();
    println!(
        "{:<44} {:>14} {:>14} {:>10} {:>10}",
        "processes", "median ms", "max ms", "orphans", "n"
    );
    for tool in [Tool::Leasehold, Tool::Etcdctl] {
        let crash = stop_holder(tool, &cluster, rounds, &CRASH);
        let term = stop_holder(tool, &cluster, rounds, &TERMINATE);
        for (what, o) in [
            ("crash failover, SIGKILL, TTL 2s", &crash),
            ("SIGTERM handover, TTL 10s", &term),
        ] {
            let (median, max) = if o.samples.is_empty() {
                ("none".to_owned(), "within 20 s".to_owned())
            } else {
                let max = o.samples.iter().max().copied().unwrap_or_default();
                (ms(percentile(&o.samples, 50.0)), ms(max))
            };
            println!(
                "{:<44} {:>14} {:>14} {:>7}/{:<2} {:>10}",
                format!("{}: {what}", tool.name()),
                median,
                max,
                o.orphans,
                o.rounds,
                o.samples.len()
            );
        }
        for n in [1usize, 10, 100] {
            let runs: Vec<Duration> = (0..rounds.min(3))
                .map(|r| contenders(tool, &cluster, n, r))
                .collect();
            println!(
                "{:<44} {:>14} {:>14}",
                format!("{}: {n} contenders, each runs once", tool.name()),
                ms(percentile(&runs, 50.0)),
                ms(runs.iter().max().copied().unwrap_or_default())
            );
        }
    }
}
