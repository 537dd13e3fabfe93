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

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

struct Replica {
    child: Child,
    lines: Receiver<(Instant, String)>,
}

impl Replica {
    fn start(store: &str, election: &str, id: &str, ttl: &str, script: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args([
                "run",
                "-q",
                "--election",
                election,
                "--id",
                id,
                "--ttl",
                ttl,
            ])
            .args(["--store", store, "--", "sh", "-c", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn leasehold run");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((Instant::now(), line)).is_err() {
                    return;
                }
            }
        });
        Replica { child, lines }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid"))
    }

    fn next_line(&self, limit: Duration) -> (Instant, String) {
        self.lines
            .recv_timeout(limit)
            .expect("a line from the command")
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

const WORK: &str = r#"echo "start $LEASEHOLD_ID $LEASEHOLD_TOKEN"; trap 'exit 0' TERM; while :; do sleep 0.02; done"#;

fn failover_after_sigkill(store: &str, rounds: usize) -> Vec<Duration> {
    (0..rounds)
        .map(|i| {
            let election = format!("kill-{i}");
            let a = Replica::start(store, &election, "a", "2s", WORK);
            a.next_line(Duration::from_secs(10));
            let b = Replica::start(store, &election, "b", "2s", WORK);
            // Let b reach its wait, and a renew a few times.
            std::thread::sleep(Duration::from_millis(1500));
            let t0 = Instant::now();
            kill(a.pid(), Signal::SIGKILL).expect("kill");
            let (t1, _) = b.next_line(Duration::from_secs(10));
            a.stop();
            b.stop();
            t1 - t0
        })
        .collect()
}

fn handover_after_sigterm(store: &str, rounds: usize) -> Vec<Duration> {
    (0..rounds)
        .map(|i| {
            let election = format!("term-{i}");
            let a = Replica::start(store, &election, "a", "15s", WORK);
            a.next_line(Duration::from_secs(10));
            let b = Replica::start(store, &election, "b", "15s", WORK);
            std::thread::sleep(Duration::from_millis(300));
            let t0 = Instant::now();
            kill(a.pid(), Signal::SIGTERM).expect("kill");
            let (t1, _) = b.next_line(Duration::from_secs(30));
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
            let a = Replica::start(
                store,
                &election,
                "a",
                "15s",
                r#"echo start; sleep 0.5; echo exiting"#,
            );
            a.next_line(Duration::from_secs(10));
            let b = Replica::start(store, &election, "b", "15s", WORK);
            let (t0, last) = a.next_line(Duration::from_secs(10));
            assert_eq!(last, "exiting");
            let (t1, _) = b.next_line(Duration::from_secs(30));
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
    let args: Vec<String> = std::env::args().collect();
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(10usize);
    let dir = tempfile::tempdir().expect("temp dir");
    let store = format!("sqlite:{}", dir.path().join("bench.db").display());

    let kill = failover_after_sigkill(&store, rounds);
    let term = handover_after_sigterm(&store, rounds);
    let exit = handover_after_exit(&store, rounds);

    let leader = Replica::start(&store, "idle", "a", "15s", WORK);
    leader.next_line(Duration::from_secs(10));
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
