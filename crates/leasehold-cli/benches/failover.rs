//! Crash failover at the physical limit, on every store, side by side with
//! `etcdctl lock` on the same etcd cluster.
//!
//! `cargo bench -p leasehold-cli --bench failover [-- --rounds N]`
//!
//! Rounds, per store, with a TTL of 5 s:
//!
//! - SIGKILL of the leading `run` (its host lives): time from the signal to
//!   the waiting replica's command's first line, and whether the killed
//!   runner's command (or the process it started in a new session) was
//!   left running;
//! - SIGSTOP of the leading `run` alone, its command running on: time to
//!   the successor, and whether the stopped runner's command was still
//!   alive when the successor's started (an overlap).
//!
//! Servers start on loopback (a 3-member etcd cluster, a standalone
//! ZooKeeper, a PostgreSQL server; Debian's packages) and stop at the end.
//! Medians and maxima; nothing asserts a timing.

use std::process::Command;
use std::time::{Duration, Instant};

use leasehold_testkit::{EtcdCluster, PostgresServer, ZooKeeperServer};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

mod common;
use common::{Replica, alive, arg, ms, percentile};

/// Prints `start PID ESCAPEE`, then works until stopped. The escapee is a
/// process in a new session, outside the command's process group.
const WORK: &str = r#"setsid sleep 300 & echo "start $$ $!"; while :; do sleep 0.02; done"#;
const TTL: &str = "5s";

/// Who supervises the command.
#[derive(Clone)]
enum Tool {
    Leasehold { bin: String, store: String },
    Etcdctl { endpoints: String },
}

impl Tool {
    fn replica(&self, election: &str, id: &str) -> Replica {
        match self {
            Tool::Leasehold { bin, store } => {
                Replica::leasehold_of(bin, store, election, id, TTL, WORK)
            }
            Tool::Etcdctl { endpoints } => {
                let mut command = Command::new("etcdctl");
                command
                    .env("ETCDCTL_API", "3")
                    .arg(format!("--endpoints={endpoints}"))
                    .args(["lock", "--ttl=5", election, "--", "sh", "-c", WORK]);
                Replica::spawn(command)
            }
        }
    }
}

#[derive(Default)]
struct Outcome {
    samples: Vec<Duration>,
    /// Rounds where a process of the stopped holder's command outlived it
    /// (SIGKILL) or ran beside the successor's (SIGSTOP).
    bad: usize,
    rounds: usize,
}

impl Outcome {
    fn cell(&self) -> String {
        if self.samples.is_empty() {
            return "none".into();
        }
        let max = self.samples.iter().max().copied().unwrap_or_default();
        format!(
            "{} / {} ({}/{})",
            ms(percentile(&self.samples, 50.0)),
            ms(max),
            self.bad,
            self.rounds
        )
    }
}

fn pids(line: &str) -> Vec<i32> {
    line.split_whitespace()
        .skip(1)
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn round(tool: &Tool, signal: Signal, name: &str, i: usize, outcome: &mut Outcome) {
    let election = format!("{name}-{}-{i}-{}", signal.as_str(), std::process::id());
    let a = tool.replica(&election, "a");
    let Some((_, line)) = a.line_with("start", Duration::from_secs(15)) else {
        a.stop();
        return;
    };
    let held = pids(&line);
    let b = tool.replica(&election, "b");
    // Let b queue, and vary where the signal falls between renewals.
    std::thread::sleep(Duration::from_millis(1000 + (i as u64 * 337) % 1500));
    let t0 = Instant::now();
    a.signal(signal);
    let next = b.line_with("start", Duration::from_secs(20));
    outcome.rounds += 1;
    // What the successor's command started, killed with the rest below:
    // `etcdctl lock` leaves its command running when it exits.
    let started = next
        .as_ref()
        .map(|(_, line)| pids(line))
        .unwrap_or_default();
    if let Some((t1, _)) = next {
        outcome.samples.push(t1 - t0);
        // SIGKILL: anything of the old command left; SIGSTOP: the old
        // command still running beside the new one.
        let bad = match signal {
            Signal::SIGKILL => held.iter().any(|&p| alive(p)),
            _ => alive(held[0]),
        };
        outcome.bad += usize::from(bad);
    }
    if signal == Signal::SIGSTOP {
        a.signal(Signal::SIGCONT);
    }
    a.stop();
    b.stop();
    for p in held.into_iter().chain(started) {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
}

fn measure(tool: &Tool, name: &str, signal: Signal, rounds: usize) -> Outcome {
    let mut outcome = Outcome::default();
    for i in 0..rounds {
        round(tool, signal, name, i, &mut outcome);
    }
    outcome
}

fn main() {
    let rounds = arg("--rounds", 10);
    let bin = env!("CARGO_BIN_EXE_leasehold").to_owned();
    let scratch = tempfile::tempdir().expect("temp dir");
    let etcd = EtcdCluster::start(3);
    let zookeeper = ZooKeeperServer::start();
    let postgres = PostgresServer::start();
    let stores = [
        (
            "sqlite",
            format!("sqlite:{}", scratch.path().join("bench.db").display()),
        ),
        ("etcd (3 members)", etcd.url("/bench")),
        ("zookeeper", zookeeper.url("/bench")),
        ("postgres", postgres.url()),
    ];
    let mut rows: Vec<[String; 4]> = Vec::new();
    for (store_name, store) in &stores {
        let mut tools: Vec<(String, Tool)> = vec![(
            "leasehold run".into(),
            Tool::Leasehold {
                bin: bin.clone(),
                store: store.clone(),
            },
        )];
        if store.starts_with("etcd") {
            tools.push((
                "etcdctl lock".into(),
                Tool::Etcdctl {
                    endpoints: etcd.endpoints().join(","),
                },
            ));
        }
        for (tool_name, tool) in &tools {
            eprintln!("measuring {tool_name} on {store_name}…");
            let tag = tool_name.replace(|c: char| !c.is_ascii_alphanumeric(), "-");
            let kill = measure(tool, &tag, Signal::SIGKILL, rounds);
            let stop = if matches!(tool, Tool::Leasehold { .. }) {
                measure(tool, &tag, Signal::SIGSTOP, rounds.div_ceil(2)).cell()
            } else {
                "—".into()
            };
            rows.push([store_name.to_string(), tool_name.clone(), kill.cell(), stop]);
        }
    }
    println!(
        "TTL {TTL}; {rounds} SIGKILL rounds, {} SIGSTOP rounds per cell; servers on loopback on this machine",
        rounds.div_ceil(2)
    );
    println!(
        "cells: median / max ms to the successor's command's first line (rounds where the old command outlived its supervisor or overlapped / rounds)"
    );
    println!();
    println!(
        "| {:<17} | {:<24} | {:>32} | {:>32} |",
        "store", "supervisor", "SIGKILL of the holder", "SIGSTOP of the holder alone"
    );
    println!(
        "|{}|{}|{}|{}|",
        "-".repeat(19),
        "-".repeat(26),
        "-".repeat(34),
        "-".repeat(34)
    );
    for [store, tool, kill, stop] in rows {
        println!("| {store:<17} | {tool:<24} | {kill:>32} | {stop:>32} |");
    }
}
