//! Chaos with real processes on every distributed store: a 3-member etcd
//! cluster, a 3-member ZooKeeper ensemble or a PostgreSQL server; three
//! `leasehold run` replicas whose commands write through the fenced object
//! store; and a nemesis that, for a bounded time, hits the runners — a
//! SIGKILL (the runner is started again), a SIGTERM (the same), a SIGSTOP
//! of a runner and its command's group, or of the whole replica (runner,
//! guard and command, as a frozen VM), a SIGSTOP of a runner alone while
//! its command runs on, a cut of its links to the store — and the store:
//! SIGKILL or SIGSTOP of an etcd or ZooKeeper member (the ensemble's
//! leader half of the time on ZooKeeper), a fast or an immediate shutdown
//! of PostgreSQL (started again after a while). Most runner faults aim at
//! the leader's runner, so that leadership moves often.
//!
//! `cargo bench -p leasehold-cli --bench chaos [-- --store etcd|zookeeper|postgres --seconds 60 --seed S]`
//!
//! `--rogue` tests the checker: half-way through it also runs a command
//! outside any election, beside the leader's, for about 5 ms; the run must
//! then report an overlap and fail.
//!
//! Afterwards a checker reads the history — every command's lifetime as
//! the command recorded it on the host's monotonic clock, the fenced
//! store's accepted writes in order, every refused write — and prints a
//! report as a table and as JSON; it exits non-zero if a must-be-zero
//! count is not. A command that outlived its lease while only its runner
//! was stopped is a violation too: the guard's dead-man switch must end it
//! at the deadline even then.
//!
//! Everything runs on 127.0.0.1; every process it starts is stopped at the
//! end (and by process id on drop).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold::clock::host_monotonic_ns;
use leasehold_testkit::Rng;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

mod cluster;
#[path = "../common/mod.rs"]
mod common;
mod lives;
mod proxy;

use cluster::{Cluster, Fault, Kind};
use common::{alive, arg, arg_text};
use lives::{Life, Lives};
use proxy::Proxy;

/// The runners' TTL.
const TTL: &str = "2s";
/// How often a runner fault hits the leader's runner (else any runner).
const AIM_AT_THE_LEADER: f64 = 0.85;
/// How often the nemesis hits a runner (else the store).
const RUNNER_FAULTS: f64 = 0.8;

/// An example binary next to the `leasehold` binary, built on first use
/// (`cargo bench` does not build examples).
fn example(name: &str) -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_leasehold"));
    let path = bin
        .parent()
        .expect("target dir")
        .join("examples")
        .join(name);
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let release = bin
            .parent()
            .and_then(|d| d.file_name())
            .is_some_and(|d| d == "release");
        let mut build = Command::new(cargo);
        build.args([
            "build",
            "-p",
            "leasehold-cli",
            "--all-features",
            "--example",
            name,
        ]);
        if release {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo");
        assert!(status.success(), "cannot build the example {name}");
    }
    path
}

struct Replica {
    id: String,
    runner: Option<Child>,
    proxies: Vec<Proxy>,
    /// Intervals (monotonic ns) during which this runner and its command's
    /// group were stopped.
    paused: Vec<(i64, i64)>,
    /// Intervals during which this runner alone was stopped, its command
    /// running on.
    stopped_alone: Vec<(i64, i64)>,
}

/// A runner fault that hit the leader's runner: when, for the time to the
/// next leader's command.
#[derive(Debug, Clone, Copy)]
struct LeaderHit {
    fault: Fault,
    at: i64,
}

struct Chaos {
    cluster: Cluster,
    replicas: Vec<Replica>,
    lives: Lives,
    store_addr: String,
    dir: PathBuf,
    faults: Vec<(Fault, String)>,
    leader_hits: Vec<LeaderHit>,
    orphans: usize,
}

impl Chaos {
    fn spawn_runner(&self, i: usize) -> Child {
        let replica = &self.replicas[i];
        let via: Vec<u16> = replica.proxies.iter().map(|p| p.port).collect();
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("runner-{}.err", replica.id)))
            .expect("runner log");
        Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args([
                "run",
                "--election",
                "chaos",
                "--ttl",
                TTL,
                "--id",
                &replica.id,
            ])
            .arg(format!("--store={}", self.cluster.url(&via)))
            .arg("--")
            .arg(example("chaos_writer"))
            .arg(&self.store_addr)
            .arg("object-x")
            .arg(self.lives.dir(i))
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("spawn leasehold run")
    }

    /// Lets `d` pass, watching which commands run.
    fn wait(&mut self, d: Duration) {
        let until = Instant::now() + d;
        loop {
            self.lives.scan();
            let now = Instant::now();
            if now >= until {
                return;
            }
            std::thread::sleep((until - now).min(Duration::from_millis(20)));
        }
    }

    fn runner_pid(&self, i: usize) -> Option<Pid> {
        let child = self.replicas[i].runner.as_ref()?;
        Some(Pid::from_raw(i32::try_from(child.id()).ok()?))
    }

    /// Ends runner `i` (already signalled, or SIGKILLed here), then counts
    /// its commands that outlived it by a second, and starts it again.
    fn replace_runner(&mut self, i: usize, sigkill: bool) {
        let group = self.lives.running_of(i);
        if let Some(mut runner) = self.replicas[i].runner.take() {
            if sigkill {
                let _ = runner.kill();
            }
            // A runner ending on SIGTERM stops its command (grace 10 s by
            // default) and releases; give it that long, then SIGKILL.
            let until = Instant::now() + Duration::from_secs(15);
            while Instant::now() < until && matches!(runner.try_wait(), Ok(None)) {
                self.wait(Duration::from_millis(10));
            }
            let _ = runner.kill();
            let _ = runner.wait();
        }
        self.wait(Duration::from_secs(1));
        self.orphans += group.iter().filter(|&&p| alive(p)).count();
        self.replicas[i].runner = Some(self.spawn_runner(i));
    }

    fn runner_fault(&mut self, fault: Fault, i: usize, rng: &mut Rng) {
        if self.lives.leader() == Some(i) {
            self.leader_hits.push(LeaderHit {
                fault,
                at: host_monotonic_ns(),
            });
        }
        let what = match fault {
            Fault::PauseRunnerAndCommand | Fault::PauseReplica => {
                // A stop-the-world pause of the runner and its command;
                // of the whole replica (its guard too, as when a VM or a
                // container is frozen) for PauseReplica. Only then can the
                // command outlive its lease: the guard kills it at the
                // deadline otherwise, even while it is stopped.
                let d = rng.millis(1000, 4000);
                let started = host_monotonic_ns();
                let runner = self.runner_pid(i);
                let group = self.lives.running_of(i);
                let guards: Vec<Pid> = if fault == Fault::PauseReplica {
                    group.iter().filter_map(|&g| parent_of(g)).collect()
                } else {
                    Vec::new()
                };
                if let Some(pid) = runner {
                    let _ = kill(pid, Signal::SIGSTOP);
                }
                for &guard in &guards {
                    let _ = kill(guard, Signal::SIGSTOP);
                }
                for &g in &group {
                    let _ = killpg(Pid::from_raw(g), Signal::SIGSTOP);
                }
                self.wait(d);
                for &g in &group {
                    let _ = killpg(Pid::from_raw(g), Signal::SIGCONT);
                }
                // Sometimes the command wakes a moment before its runner:
                // its stale writes must then be refused by the store.
                if rng.chance(0.5) {
                    self.wait(Duration::from_millis(200));
                }
                for &guard in &guards {
                    let _ = kill(guard, Signal::SIGCONT);
                }
                if let Some(pid) = runner {
                    let _ = kill(pid, Signal::SIGCONT);
                }
                self.replicas[i].paused.push((started, host_monotonic_ns()));
                if fault == Fault::PauseReplica {
                    format!("pause r{i} with its guard {d:?}")
                } else {
                    format!("pause r{i} {d:?}")
                }
            }
            Fault::StopRunnerAlone => {
                // Nobody can know a stopped runner is dead, so nothing may
                // hand over before its lease expires; its command must not
                // work past the lease (the guard's dead-man switch), and
                // what it writes after a successor has is refused.
                let d = rng.millis(1000, 5000);
                let started = host_monotonic_ns();
                let runner = self.runner_pid(i);
                if let Some(pid) = runner {
                    let _ = kill(pid, Signal::SIGSTOP);
                }
                self.wait(d);
                if let Some(pid) = runner {
                    let _ = kill(pid, Signal::SIGCONT);
                }
                self.replicas[i]
                    .stopped_alone
                    .push((started, host_monotonic_ns()));
                format!("stop runner r{i} alone {d:?}")
            }
            Fault::KillRunner => {
                // Its command must die with it; the host saw the death, so
                // the guard may release the grant at once.
                self.replace_runner(i, true);
                format!("sigkill runner r{i}")
            }
            Fault::TermRunner => {
                // A graceful stop: the command is stopped, the grant
                // released, and the next in line takes over.
                if let Some(pid) = self.runner_pid(i) {
                    let _ = kill(pid, Signal::SIGTERM);
                }
                self.replace_runner(i, false);
                format!("sigterm runner r{i}")
            }
            Fault::CutRunnerOff => {
                let d = rng.millis(1000, 5000);
                self.replicas[i]
                    .proxies
                    .iter()
                    .for_each(|p| p.set_cut(true));
                self.wait(d);
                self.replicas[i]
                    .proxies
                    .iter()
                    .for_each(|p| p.set_cut(false));
                format!("cut r{i} from the store {d:?}")
            }
            _ => unreachable!("a store fault"),
        };
        self.faults.push((fault, what));
    }

    /// Runs a command beside the leader's, outside any election, for about
    /// five milliseconds: the overlap the checker must find.
    fn rogue(&mut self) {
        let i = self.lives.leader().map_or(0, |l| (l + 1) % 3);
        let mut rogue = Command::new(example("chaos_writer"))
            .arg(&self.store_addr)
            .arg("object-x")
            .arg(self.lives.dir(i))
            .env("LEASEHOLD_TOKEN", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the rogue command");
        let pid = Pid::from_raw(i32::try_from(rogue.id()).expect("pid"));
        std::thread::sleep(Duration::from_millis(5));
        let _ = kill(pid, Signal::SIGTERM);
        let _ = rogue.wait();
        eprintln!("--rogue: ran a command outside leasehold as r{i} for about 5 ms");
    }

    fn store_fault(&mut self, fault: Fault, rng: &mut Rng) {
        let (what, m, down) = self.cluster.begin(fault, rng);
        self.wait(down);
        self.cluster.end(fault, m);
        self.faults.push((fault, format!("{what} for {down:?}")));
    }
}

/// A process's parent (the guard, for a command).
fn parent_of(pid: i32) -> Option<Pid> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
    Some(Pid::from_raw(ppid))
}

fn main() {
    let seconds = arg("--seconds", 60) as u64;
    let store_name = arg_text("--store").unwrap_or_else(|| "etcd".into());
    let Some(kind) = Kind::parse(&store_name) else {
        eprintln!("--store {store_name}: expected etcd, zookeeper or postgres");
        std::process::exit(2);
    };
    let seed = arg("--seed", 0) as u64;
    let seed = if seed == 0 {
        host_monotonic_ns().unsigned_abs()
    } else {
        seed
    };
    // A self-test of the checker: a command started outside leasehold
    // half-way through, for a few milliseconds; the run must then fail.
    let mut rogue = std::env::args().any(|a| a == "--rogue");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().expect("temp dir");
    let cluster = Cluster::start(kind);

    let mut store = Command::new(example("fenced_store"))
        .arg("127.0.0.1:0")
        .arg(dir.path().join("fence.db"))
        .arg(dir.path().join("store.log"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the fenced store");
    let mut line = String::new();
    BufReader::new(store.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("store address");
    let store_addr = line.trim().trim_start_matches("listening on ").to_owned();

    let ports = cluster.ports();
    let replicas: Vec<Replica> = (0..3)
        .map(|i| Replica {
            id: format!("r{i}"),
            runner: None,
            proxies: ports.iter().map(|&p| Proxy::start(p)).collect(),
            paused: Vec::new(),
            stopped_alone: Vec::new(),
        })
        .collect();
    let lives = Lives::new(
        (0..3)
            .map(|i| dir.path().join("lives").join(format!("r{i}")))
            .collect(),
    );
    let mut chaos = Chaos {
        cluster,
        replicas,
        lives,
        store_addr,
        dir: dir.path().to_owned(),
        faults: Vec::new(),
        leader_hits: Vec::new(),
        orphans: 0,
    };
    for i in 0..3 {
        let runner = chaos.spawn_runner(i);
        chaos.replicas[i].runner = Some(runner);
    }

    chaos.wait(Duration::from_secs(3));
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        if rng.chance(RUNNER_FAULTS) {
            let any = usize::try_from(rng.below(3)).expect("index");
            let i = match chaos.lives.leader() {
                Some(l) if rng.chance(AIM_AT_THE_LEADER) => l,
                _ => any,
            };
            let kind = Fault::RUNNER
                [usize::try_from(rng.below(Fault::RUNNER.len() as u64)).expect("kind")];
            chaos.runner_fault(kind, i, &mut rng);
        } else {
            let kinds = chaos.cluster.faults();
            let kind = kinds[usize::try_from(rng.below(kinds.len() as u64)).expect("kind")];
            chaos.store_fault(kind, &mut rng);
        }
        if rogue && Instant::now() + Duration::from_secs(seconds / 2) > end {
            chaos.rogue();
            rogue = false;
        }
        chaos.wait(rng.millis(300, 1500));
    }
    chaos.wait(Duration::from_secs(3));

    // Stop everything; every command must go with its runner.
    for r in &mut chaos.replicas {
        if let Some(mut runner) = r.runner.take() {
            let _ = runner.kill();
            let _ = runner.wait();
        }
    }
    chaos.wait(Duration::from_secs(1));
    chaos.orphans += chaos.lives.all.iter().filter(|l| l.running).count();
    for l in &chaos.lives.all {
        if alive(l.pid) {
            let _ = killpg(Pid::from_raw(l.pid), Signal::SIGKILL);
        }
    }
    let _ = store.kill();
    let _ = store.wait();
    chaos.lives.finish();

    let report = check(&chaos, dir.path(), seconds);
    println!(
        "chaos run on {}, seed {seed} (rerun with --store {store_name} --seed {seed})",
        chaos.cluster.describe()
    );
    for (name, value) in &report.counts {
        println!("{name:<52} {value:>8}");
    }
    let json: Vec<String> = report
        .counts
        .iter()
        .map(|(k, v)| format!("\"{k}\":{v}"))
        .collect();
    println!(
        "{{\"store\":\"{store_name}\",\"seed\":{seed},{}}}",
        json.join(",")
    );
    let faults: Vec<String> = chaos.faults.iter().map(|(_, f)| f.clone()).collect();
    // The servers stop here, by process id.
    drop(chaos);
    if report.must_be_zero > 0 {
        eprintln!("faults: {faults:?}");
        for line in &report.overlaps {
            eprintln!("{line}");
        }
        let kept = dir.keep();
        eprintln!(
            "the history (lives/, store.log, runner-*.err) is kept in {}",
            kept.display()
        );
        std::process::exit(1);
    }
}

struct Report {
    counts: Vec<(&'static str, usize)>,
    must_be_zero: usize,
    /// Each unexplained overlap, described.
    overlaps: Vec<String>,
}

fn check(chaos: &Chaos, dir: &Path, seconds: u64) -> Report {
    let lives = &chaos.lives.all;
    let accepted: Vec<u64> = std::fs::read_to_string(dir.join("store.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("accepted ")?.split(' ').next()?.parse().ok())
        .collect();
    let out_of_order = accepted.windows(2).filter(|w| w[1] < w[0]).count();
    let changes = accepted.windows(2).filter(|w| w[1] != w[0]).count();
    let rejected = chaos
        .lives
        .write_statuses()
        .iter()
        .filter(|(_, status)| *status == 409)
        .count();
    let during = |l: &Life, intervals: &[(i64, i64)]| {
        intervals.iter().any(|&(a, b)| a < l.end && l.start < b)
    };
    let paused_during = |l: &Life| during(l, &chaos.replicas[l.replica].paused);
    let stopped_during = |l: &Life| during(l, &chaos.replicas[l.replica].stopped_alone);
    let (mut with_pause, mut with_stopped_runner) = (0, 0);
    let mut overlaps = Vec::new();
    for (i, a) in lives.iter().enumerate() {
        for b in &lives[i + 1..] {
            if a.replica == b.replica || !(a.start < b.end && b.start < a.end) {
                continue;
            }
            if paused_during(a) || paused_during(b) {
                with_pause += 1;
            } else if stopped_during(a) || stopped_during(b) {
                with_stopped_runner += 1;
                overlaps.push(describe_overlap("a runner stopped alone", a, b));
            } else {
                overlaps.push(describe_overlap("no pause", a, b));
            }
        }
    }
    let unfenced = overlaps.len() - with_stopped_runner;
    // After a fault on the leader's runner: how long until a command
    // started again (the next leader's, or the restarted runner's).
    let after = |fault: Fault| -> Vec<i64> {
        chaos
            .leader_hits
            .iter()
            .filter(|h| h.fault == fault)
            .filter_map(|h| {
                lives
                    .iter()
                    .map(|l| l.start - h.at)
                    .filter(|&d| d > 0)
                    .min()
            })
            .collect()
    };
    let ms = |ns: Option<&i64>| ns.map_or(0, |&ns| usize::try_from(ns / 1_000_000).unwrap_or(0));
    let hits = |fault: Fault| {
        chaos
            .leader_hits
            .iter()
            .filter(|h| h.fault == fault)
            .count()
    };
    let mut counts = vec![
        ("seconds", seconds as usize),
        ("faults_injected", chaos.faults.len()),
    ];
    for &kind in Fault::RUNNER.iter().chain(chaos.cluster.faults()) {
        counts.push((
            kind.name(),
            chaos.faults.iter().filter(|(f, _)| *f == kind).count(),
        ));
    }
    counts.push((
        "runner_faults_on_the_leaders_runner",
        chaos.leader_hits.len(),
    ));
    for (fault, hits_name, min_name, max_name) in [
        (
            Fault::KillRunner,
            "sigkills_of_the_leaders_runner",
            "ms_to_next_leader_after_sigkill_min",
            "ms_to_next_leader_after_sigkill_max",
        ),
        (
            Fault::TermRunner,
            "sigterms_of_the_leaders_runner",
            "ms_to_next_leader_after_sigterm_min",
            "ms_to_next_leader_after_sigterm_max",
        ),
        (
            Fault::StopRunnerAlone,
            "sigstops_of_the_leaders_runner_alone",
            "ms_to_next_leader_after_sigstop_min",
            "ms_to_next_leader_after_sigstop_max",
        ),
    ] {
        let times = after(fault);
        counts.push((hits_name, hits(fault)));
        counts.push((min_name, ms(times.iter().min())));
        counts.push((max_name, ms(times.iter().max())));
    }
    counts.extend([
        ("leadership_changes", changes),
        ("writes_accepted", accepted.len()),
        ("stale_writes_rejected", rejected),
        ("commands_started", lives.len()),
        ("overlapping_leaderships_with_a_paused_runner", with_pause),
        (
            "overlapping_leaderships_with_a_stopped_runner_alone",
            with_stopped_runner,
        ),
        ("overlapping_unfenced_leaderships", unfenced),
        ("accepted_writes_out_of_token_order", out_of_order),
        ("orphaned_children", chaos.orphans),
    ]);
    Report {
        counts,
        must_be_zero: unfenced + with_stopped_runner + out_of_order + chaos.orphans,
        overlaps,
    }
}

fn describe_overlap(kind: &str, a: &Life, b: &Life) -> String {
    let overlap = a.end.min(b.end) - a.start.max(b.start);
    format!(
        "overlap ({kind}) of {:.3} ms: r{} pid {} token {} [{}, {}] and r{} pid {} token {} [{}, {}]",
        overlap as f64 / 1e6,
        a.replica,
        a.pid,
        a.token,
        a.start,
        a.end,
        b.replica,
        b.pid,
        b.token,
        b.start,
        b.end
    )
}
