//! Planned moves with real processes, on every store: `leasehold transfer
//! --to C` and priority preemption, beside `etcdctl lock` stopped with
//! SIGTERM on the same etcd cluster (it has no transfer: stopping the
//! holder is how its users move a lock).
//!
//! `cargo bench -p leasehold-cli --bench planned [-- --rounds N]`
//!
//! Per round, replicas a (leading), b and c (waiting, b first in line), a
//! TTL of 30 s (so no move is an expiry):
//!
//! - transfer: from spawning `leasehold transfer --to c` to c's command's
//!   first line; and from a's command's last line (it exits on SIGTERM at
//!   once) to c's first line, leasehold's own share; and whether a's
//!   command was still alive when c's started (an overlap).
//! - preemption: a leads with `--preempt-after 500ms`; from spawning a
//!   replica with `--priority 5` to its command's first line, less the
//!   500 ms it must wait.
//! - `etcdctl lock` (three rounds): from SIGTERM of the holder to the next
//!   one's first line.
//!
//! Servers start on loopback (a 3-member etcd cluster, a standalone
//! ZooKeeper, a PostgreSQL server; Debian's packages) and stop at the end.
//! Medians and maxima; nothing asserts a timing.

use std::process::Command;
use std::time::{Duration, Instant};

use leasehold_testkit::{EtcdCluster, PostgresServer, ZooKeeperServer};
use nix::sys::signal::Signal;

mod common;
use common::{Replica, alive, arg, ms, percentile};

/// Prints `start PID` and, when SIGTERM stops it, `stop` (then exits).
const WORK: &str =
    r#"trap 'echo stop; exit 0' TERM; echo "start $$"; while :; do sleep 0.01; done"#;
const TTL: &str = "30s";
const SETTLE: Duration = Duration::from_millis(500);
const PATIENCE: Duration = Duration::from_secs(20);

/// This build's executable.
const NOW: &str = env!("CARGO_BIN_EXE_leasehold");

fn replica(bin: &str, store: &str, election: &str, id: &str, extra: &[&str]) -> Replica {
    let mut command = Command::new(bin);
    command
        .args([
            "run",
            "-q",
            "--election",
            election,
            "--id",
            id,
            "--ttl",
            TTL,
        ])
        .args(["--store", store])
        .args(extra)
        .args(["--", "sh", "-c", WORK]);
    Replica::spawn(command)
}

fn etcdctl_replica(endpoints: &str, election: &str) -> Replica {
    let mut command = Command::new("etcdctl");
    command
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .args(["lock", "--ttl=30", election, "--", "sh", "-c", WORK]);
    Replica::spawn(command)
}

fn pid_of(line: &str) -> i32 {
    line.split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

#[derive(Default)]
struct Samples {
    total: Vec<Duration>,
    own: Vec<Duration>,
    overlaps: usize,
    rounds: usize,
}

fn cell(samples: &[Duration]) -> String {
    if samples.is_empty() {
        return format!("none in {}s", PATIENCE.as_secs());
    }
    let max = samples.iter().max().copied().unwrap_or_default();
    format!("{} / {}", ms(percentile(samples, 50.0)), ms(max))
}

/// Waits until `store` shows `count` waiting candidates for `election`.
fn line_has(store: &str, election: &str, count: usize) -> bool {
    let until = Instant::now() + PATIENCE;
    while Instant::now() < until {
        let out = Command::new(NOW)
            .args(["status", "--json", "--election", election, "--store", store])
            .output();
        if let Ok(out) = out
            && let Ok(json) = serde_json::from_slice::<serde_json::Value>(&out.stdout)
            && json["candidates"].as_array().map_or(0, Vec::len) == count
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn transfer_round(bin: &str, store: &str, tag: &str, i: usize, samples: &mut Samples) {
    let election = format!("transfer-{tag}-{i}-{}", std::process::id());
    let a = replica(bin, store, &election, "a", &[]);
    let Some((_, started)) = a.line_with("start", PATIENCE) else {
        a.stop();
        return;
    };
    let old = pid_of(&started);
    let b = replica(bin, store, &election, "b", &[]);
    let c = replica(bin, store, &election, "c", &[]);
    if !line_has(store, &election, 2) {
        for r in [a, b, c] {
            r.stop();
        }
        return;
    }
    samples.rounds += 1;
    let t0 = Instant::now();
    let mut transfer = Command::new(bin)
        .args(["transfer", "--election", &election, "--store", store])
        .args(["--to", "c"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn transfer");
    let stopped = a.line_with("stop", PATIENCE);
    if let Some((t1, _)) = c.line_with("start", PATIENCE) {
        samples.total.push(t1 - t0);
        if let Some((stop, _)) = stopped {
            samples.own.push(t1.saturating_duration_since(stop));
        }
        samples.overlaps += usize::from(alive(old));
    }
    let _ = transfer.wait();
    for r in [a, b, c] {
        r.stop();
    }
}

fn preemption_round(store: &str, tag: &str, i: usize, samples: &mut Samples) {
    let election = format!("preempt-{tag}-{i}-{}", std::process::id());
    let settle = format!("{}ms", SETTLE.as_millis());
    let low = replica(NOW, store, &election, "low", &["--preempt-after", &settle]);
    let Some((_, started)) = low.line_with("start", PATIENCE) else {
        low.stop();
        return;
    };
    let old = pid_of(&started);
    samples.rounds += 1;
    let t0 = Instant::now();
    let high = replica(NOW, store, &election, "high", &["--priority", "5"]);
    let stopped = low.line_with("stop", PATIENCE);
    if let Some((t1, _)) = high.line_with("start", PATIENCE) {
        samples.total.push((t1 - t0).saturating_sub(SETTLE));
        if let Some((stop, _)) = stopped {
            samples.own.push(t1.saturating_duration_since(stop));
        }
        samples.overlaps += usize::from(alive(old));
    }
    low.stop();
    high.stop();
}

/// `etcdctl lock`: SIGTERM to the holder, to the next one's first line.
fn etcdctl_round(endpoints: &str, i: usize, samples: &mut Samples) {
    let election = format!("etcdctl-{i}-{}", std::process::id());
    let a = etcdctl_replica(endpoints, &election);
    let Some((_, started)) = a.line_with("start", PATIENCE) else {
        a.stop();
        return;
    };
    let old = pid_of(&started);
    let b = etcdctl_replica(endpoints, &election);
    std::thread::sleep(Duration::from_millis(500));
    samples.rounds += 1;
    let t0 = Instant::now();
    a.signal(Signal::SIGTERM);
    if let Some((t1, _)) = b.line_with("start", PATIENCE) {
        samples.total.push(t1 - t0);
        samples.overlaps += usize::from(alive(old));
    }
    a.stop();
    b.stop();
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(old), Signal::SIGKILL);
}

fn main() {
    let rounds = arg("--rounds", 10);
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
    let mut rows: Vec<[String; 5]> = Vec::new();
    let row = |store: &str, what: &str, s: &Samples| {
        [
            store.to_owned(),
            what.to_owned(),
            cell(&s.total),
            cell(&s.own),
            format!("{}/{}", s.overlaps, s.rounds),
        ]
    };
    for (name, store) in &stores {
        eprintln!("measuring on {name}…");
        let tag = name.replace(|c: char| !c.is_ascii_alphanumeric(), "-");
        let mut transfer = Samples::default();
        let mut preempt = Samples::default();
        for i in 0..rounds {
            transfer_round(NOW, store, &tag, i, &mut transfer);
            preemption_round(store, &tag, i, &mut preempt);
        }
        rows.push(row(name, "leasehold transfer --to c", &transfer));
        rows.push(row(name, "run --priority 5 (preempts)", &preempt));
        if store.starts_with("etcd") {
            // It leaves its lease to expire (30 s a round): three rounds.
            let mut baseline = Samples::default();
            for i in 0..rounds.min(3) {
                etcdctl_round(&etcd.endpoints().join(","), i, &mut baseline);
            }
            rows.push(row(name, "etcdctl lock, SIGTERM to holder", &baseline));
        }
    }
    println!(
        "TTL {TTL}; {rounds} rounds per row; preemption after {}; servers on loopback on this machine",
        humantime::format_duration(SETTLE)
    );
    println!(
        "cells: median / max ms. 'to first line': from the request (the transfer's spawn; the high \
         replica's spawn less the settling period; the SIGTERM) to the new command's first line. \
         'after old exit': from the old command's last line to the new one's first."
    );
    println!();
    println!(
        "| {:<17} | {:<32} | {:>17} | {:>17} | {:>13} |",
        "store", "move", "to first line", "after old exit", "two at once"
    );
    println!(
        "|{}|{}|{}|{}|{}|",
        "-".repeat(19),
        "-".repeat(34),
        "-".repeat(19),
        "-".repeat(19),
        "-".repeat(15)
    );
    for [store, what, total, own, overlaps] in rows {
        println!("| {store:<17} | {what:<32} | {total:>17} | {own:>17} | {overlaps:>13} |");
    }
}
