//! `leasehold run` end to end with real processes on the SQLite store:
//! failover after SIGKILL of the leader, handover after SIGTERM and after
//! the command exits, and the runner's idle footprint while leading.
//!
//! `cargo bench -p leasehold-cli --bench runner [-- --rounds N]`
//!
//! Each time is measured in this process: from just before the signal (or
//! the old command's last line) to the new leader's command's first line
//! arriving on a pipe. Figures are medians and maxima; nothing asserts a
//! timing.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

mod common;
use common::{Replica, arg, ms, percentile};

fn median(v: Vec<Duration>) -> Duration {
    percentile(&v, 50.0)
}

const WORK: &str = r#"echo "start $LEASEHOLD_ID $LEASEHOLD_TOKEN"; trap 'exit 0' TERM; while :; do sleep 0.02; done"#;

/// Signals the leading runner after `settle`; time until the waiting
/// replica's command starts.
fn after_signal(
    store: &str,
    rounds: usize,
    signal: Signal,
    ttl: &str,
    settle: Duration,
) -> Vec<Duration> {
    (0..rounds)
        .map(|i| {
            let election = format!("{}-{i}", signal.as_str());
            let a = Replica::leasehold(store, &election, "a", ttl, WORK);
            a.line_with("", Duration::from_secs(10)).expect("a leads");
            let b = Replica::leasehold(store, &election, "b", ttl, WORK);
            // Let b reach its wait (and, for a crash, a renew a few times).
            std::thread::sleep(settle);
            let t0 = Instant::now();
            a.signal(signal);
            let (t1, _) = b
                .line_with("start", Duration::from_secs(30))
                .expect("b leads");
            a.stop();
            b.stop();
            t1 - t0
        })
        .collect()
}

fn handover_after_exit(store: &str, rounds: usize) -> Vec<Duration> {
    (0..rounds)
        .map(|i| {
            let election = format!("exit-{i}");
            let a = Replica::leasehold(
                store,
                &election,
                "a",
                "15s",
                r#"echo start; sleep 0.5; echo exiting"#,
            );
            a.line_with("", Duration::from_secs(10)).expect("a leads");
            let b = Replica::leasehold(store, &election, "b", "15s", WORK);
            let (t0, last) = a.line_with("", Duration::from_secs(10)).expect("a leads");
            assert_eq!(last, "exiting");
            let (t1, _) = b
                .line_with("start", Duration::from_secs(30))
                .expect("b leads");
            a.stop();
            b.stop();
            t1 - t0
        })
        .collect()
}

/// (RSS KiB, CPU % over the window) of `pid`.
fn footprint(pid: Pid, window: Duration) -> (u64, f64) {
    let ticks = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        let rest = stat.rsplit_once(") ").expect("stat format").1;
        let f: Vec<&str> = rest.split(' ').collect();
        f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
    };
    let hz = 100.0; // USER_HZ on Linux
    let before = ticks();
    std::thread::sleep(window);
    let after = ticks();
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or(0);
    (
        rss,
        (after - before) as f64 / hz / window.as_secs_f64() * 100.0,
    )
}

fn main() {
    let rounds = arg("--rounds", 10);
    let dir = tempfile::tempdir().expect("temp dir");
    let store = format!("sqlite:{}", dir.path().join("bench.db").display());

    let kill = after_signal(
        &store,
        rounds,
        Signal::SIGKILL,
        "2s",
        Duration::from_millis(1500),
    );
    let term = after_signal(
        &store,
        rounds,
        Signal::SIGTERM,
        "15s",
        Duration::from_millis(300),
    );
    let exit = handover_after_exit(&store, rounds);

    let leader = Replica::leasehold(&store, "idle", "a", "15s", WORK);
    leader
        .line_with("", Duration::from_secs(10))
        .expect("leader");
    std::thread::sleep(Duration::from_secs(1));
    let (rss, cpu) = footprint(leader.pid(), Duration::from_secs(10));
    leader.stop();

    println!("leasehold run on the SQLite store, {rounds} rounds each");
    println!("{:<48} {:>10} {:>10}", "measurement", "median ms", "max ms");
    for (name, samples) in [
        ("failover after SIGKILL of the leader (TTL 2s)", &kill),
        ("handover after SIGTERM to the leader (TTL 15s)", &term),
        ("handover after the command exits (TTL 15s)", &exit),
    ] {
        let max = samples.iter().max().copied().unwrap_or_default();
        println!(
            "{name:<48} {:>10} {:>10}",
            ms(median(samples.clone())),
            ms(max)
        );
    }
    println!("runner while leading (TTL 15s, 10 s window): RSS {rss} KiB, CPU {cpu:.2} %");
}
