//! Chaos with real processes: a 3-member etcd cluster, three `leasehold run`
//! replicas whose commands write through the fenced object store, and a
//! nemesis that, for a bounded time, pauses runners and their command
//! groups (SIGSTOP/SIGCONT), stops a runner alone while its command runs
//! on, SIGKILLs runners (and restarts them: the host saw the death, so
//! the guard may hand over at once), SIGKILLs and restarts etcd members,
//! and cuts runners off from etcd through a TCP proxy. The runner faults
//! hit the leader's runner three times in four. Afterwards a checker reads
//! the history and prints a report as a table and as JSON; it exits
//! non-zero if a must-be-zero count is not.
//!
//! `cargo bench -p leasehold-cli --bench chaos [-- --seconds 60 --seed S]`
//!
//! A command that outlived its lease while only its runner was stopped is
//! a violation too: the guard's dead-man switch must end it at the
//! deadline even then.
//!
//! Everything runs on 127.0.0.1; every process it starts is stopped at the
//! end (and by process id on drop).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::testing::{EtcdCluster, Rng};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

mod common;
use common::{alive, arg};

/// A TCP proxy to one etcd member that can cut every connection through it.
struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (cut2, conns2) = (Arc::clone(&cut), Arc::clone(&conns));
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                if cut2.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let mut list = conns2.lock().unwrap_or_else(|p| p.into_inner());
                for s in [&client, &server] {
                    if let Ok(clone) = s.try_clone() {
                        list.push(clone);
                    }
                }
                drop(list);
                for (mut from, mut to) in [
                    (client.try_clone(), server.try_clone()),
                    (server.try_clone(), client.try_clone()),
                ]
                .into_iter()
                .filter_map(|(a, b)| Some((a.ok()?, b.ok()?)))
                {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 || to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, cut, conns }
    }

    fn set_cut(&self, on: bool) {
        self.cut.store(on, Ordering::SeqCst);
        if on {
            for s in self
                .conns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .drain(..)
            {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

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
        build.args(["build", "-p", "leasehold-cli", "--examples"]);
        if release {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo");
        assert!(status.success(), "cannot build the examples");
    }
    path
}

struct Replica {
    id: String,
    runner: Option<Child>,
    proxies: Vec<Proxy>,
    log: PathBuf,
    /// Intervals during which this runner (and its group) was stopped.
    paused: Vec<(Instant, Instant)>,
    /// Intervals during which this runner alone was stopped, its command
    /// running on.
    stopped_alone: Vec<(Instant, Instant)>,
}

/// The nemesis's faults, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    PauseRunnerAndCommand,
    StopRunnerAlone,
    KillRunner,
    KillEtcdMember,
    CutRunnerOff,
}

impl Fault {
    const ALL: [Fault; 5] = [
        Fault::PauseRunnerAndCommand,
        Fault::StopRunnerAlone,
        Fault::KillRunner,
        Fault::KillEtcdMember,
        Fault::CutRunnerOff,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::PauseRunnerAndCommand => "faults_sigstop_runner_and_command",
            Fault::StopRunnerAlone => "faults_sigstop_runner_alone",
            Fault::KillRunner => "faults_sigkill_runner",
            Fault::KillEtcdMember => "faults_sigkill_etcd_member",
            Fault::CutRunnerOff => "faults_cut_runner_from_etcd",
        }
    }
}

/// A runner fault that hit the leader's runner: when, for the time to the
/// next leader's command.
#[derive(Debug, Clone, Copy)]
struct LeaderHit {
    fault: Fault,
    at: Instant,
}

/// A command (writer) seen alive: from first sight to first absence.
#[derive(Debug, Clone)]
struct Life {
    replica: usize,
    pid: i32,
    start: Instant,
    end: Option<Instant>,
}

fn spawn_runner(replica: &Replica, store_addr: &str, dir: &Path) -> Child {
    let endpoints: Vec<String> = replica
        .proxies
        .iter()
        .map(|p| format!("127.0.0.1:{}", p.port))
        .collect();
    let err = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("runner-{}.err", replica.id)))
        .expect("runner log");
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "run",
            "--election",
            "chaos",
            "--ttl",
            "2s",
            "--id",
            &replica.id,
        ])
        .arg(format!("--store=etcd://{}/chaos", endpoints.join(",")))
        .arg("--")
        .arg(example("fenced_writer"))
        .arg(store_addr)
        .arg("object-x")
        .arg(&replica.log)
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("spawn leasehold run")
}

fn writer_pids(log: &Path) -> Vec<i32> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("pid ")?.parse().ok())
        .collect()
}

fn main() {
    let seconds = arg("--seconds", 60) as u64;
    let seed = arg("--seed", 0) as u64;
    let seed = if seed == 0 {
        leasehold::clock::host_monotonic_ns().unsigned_abs()
    } else {
        seed
    };
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cluster = EtcdCluster::start(3);
    let ports: Vec<u16> = cluster
        .endpoints()
        .iter()
        .filter_map(|e| e.rsplit(':').next()?.parse().ok())
        .collect();

    let mut store = Command::new(example("fenced_store"))
        .arg("127.0.0.1:0")
        .arg(dir.path().join("fence.db"))
        .arg(dir.path().join("store.log"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the fenced store (cargo build --examples)");
    let mut line = String::new();
    BufReader::new(store.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("store address");
    let store_addr = line.trim().trim_start_matches("listening on ").to_owned();

    let mut replicas: Vec<Replica> = (0..3)
        .map(|i| Replica {
            id: format!("r{i}"),
            runner: None,
            proxies: ports.iter().map(|&p| Proxy::start(p)).collect(),
            log: dir.path().join(format!("writer-r{i}.log")),
            paused: Vec::new(),
            stopped_alone: Vec::new(),
        })
        .collect();
    for r in &mut replicas {
        r.runner = Some(spawn_runner(r, &store_addr, dir.path()));
    }

    let mut lives: Vec<Life> = Vec::new();
    let mut faults: Vec<(Fault, String)> = Vec::new();
    let mut leader_hits: Vec<LeaderHit> = Vec::new();
    let mut orphans = 0;
    let observe = |lives: &mut Vec<Life>, replicas: &[Replica]| {
        let now = Instant::now();
        for (i, r) in replicas.iter().enumerate() {
            for pid in writer_pids(&r.log) {
                if !lives.iter().any(|l| l.pid == pid) && alive(pid) {
                    lives.push(Life {
                        replica: i,
                        pid,
                        start: now,
                        end: None,
                    });
                }
            }
        }
        for life in lives.iter_mut().filter(|l| l.end.is_none()) {
            if !alive(life.pid) {
                life.end = Some(now);
            }
        }
    };
    let wait = |d: Duration, lives: &mut Vec<Life>, replicas: &[Replica]| {
        let until = Instant::now() + d;
        while Instant::now() < until {
            observe(lives, replicas);
            std::thread::sleep(Duration::from_millis(5));
        }
    };

    wait(Duration::from_secs(3), &mut lives, &replicas);
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        let i = usize::try_from(rng.below(3)).expect("index");
        // The leader's runner, for the faults that aim at it: the replica
        // whose command started last and still runs.
        let leader = lives
            .iter()
            .filter(|l| l.end.is_none())
            .max_by_key(|l| l.start)
            .map(|l| l.replica);
        let aim = |rng: &mut Rng| match leader {
            Some(l) if rng.chance(0.75) => l,
            _ => i,
        };
        match rng.below(5) {
            0 => {
                // A stop-the-world pause of runner i and its command group.
                let d = rng.millis(1000, 4000);
                let started = Instant::now();
                let runner_pid = replicas[i].runner.as_ref().map(|c| c.id() as i32);
                let group: Vec<i32> = lives
                    .iter()
                    .filter(|l| l.replica == i && l.end.is_none())
                    .map(|l| l.pid)
                    .collect();
                if let Some(pid) = runner_pid {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
                }
                group.iter().for_each(|&g| {
                    let _ = killpg(Pid::from_raw(g), Signal::SIGSTOP);
                });
                wait(d, &mut lives, &replicas);
                group.iter().for_each(|&g| {
                    let _ = killpg(Pid::from_raw(g), Signal::SIGCONT);
                });
                // Sometimes the command wakes a moment before its runner:
                // its stale writes must then be refused by the store.
                if rng.chance(0.5) {
                    wait(Duration::from_millis(200), &mut lives, &replicas);
                }
                if let Some(pid) = runner_pid {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
                }
                replicas[i].paused.push((started, Instant::now()));
                faults.push((Fault::PauseRunnerAndCommand, format!("pause r{i} {d:?}")));
            }
            1 => {
                // SIGSTOP of runner i alone: its command runs on. Nobody can
                // know a stopped runner is dead, so nothing may hand over
                // before its lease expires; its command must not work past
                // the lease (the guard's dead-man switch), and what it writes
                // after a successor has is refused by the store.
                let i = aim(&mut rng);
                let d = rng.millis(1000, 5000);
                let started = Instant::now();
                if leader == Some(i) {
                    leader_hits.push(LeaderHit {
                        fault: Fault::StopRunnerAlone,
                        at: started,
                    });
                }
                let runner_pid = replicas[i].runner.as_ref().map(|c| c.id() as i32);
                if let Some(pid) = runner_pid {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
                }
                wait(d, &mut lives, &replicas);
                if let Some(pid) = runner_pid {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
                }
                replicas[i].stopped_alone.push((started, Instant::now()));
                faults.push((
                    Fault::StopRunnerAlone,
                    format!("stop runner r{i} alone {d:?}"),
                ));
            }
            2 => {
                // SIGKILL runner i: its command must die with it; the host
                // saw the death, so the guard may release the grant at once.
                let i = aim(&mut rng);
                if leader == Some(i) {
                    leader_hits.push(LeaderHit {
                        fault: Fault::KillRunner,
                        at: Instant::now(),
                    });
                }
                let group: Vec<i32> = lives
                    .iter()
                    .filter(|l| l.replica == i && l.end.is_none())
                    .map(|l| l.pid)
                    .collect();
                if let Some(mut runner) = replicas[i].runner.take() {
                    let _ = runner.kill();
                    let _ = runner.wait();
                }
                wait(Duration::from_secs(1), &mut lives, &replicas);
                orphans += group.iter().filter(|&&p| alive(p)).count();
                replicas[i].runner = Some(spawn_runner(&replicas[i], &store_addr, dir.path()));
                faults.push((Fault::KillRunner, format!("sigkill runner r{i}")));
            }
            3 => {
                let m = usize::try_from(rng.below(3)).expect("member");
                cluster.kill(m);
                wait(rng.millis(1000, 3000), &mut lives, &replicas);
                cluster.restart(m);
                faults.push((Fault::KillEtcdMember, format!("sigkill+restart etcd m{m}")));
            }
            _ => {
                let d = rng.millis(1000, 5000);
                replicas[i].proxies.iter().for_each(|p| p.set_cut(true));
                wait(d, &mut lives, &replicas);
                replicas[i].proxies.iter().for_each(|p| p.set_cut(false));
                faults.push((Fault::CutRunnerOff, format!("cut r{i} from etcd {d:?}")));
            }
        }
        wait(rng.millis(500, 2000), &mut lives, &replicas);
    }
    wait(Duration::from_secs(3), &mut lives, &replicas);

    // Stop everything; every command must go with its runner.
    for r in &mut replicas {
        if let Some(mut runner) = r.runner.take() {
            let _ = runner.kill();
            let _ = runner.wait();
        }
    }
    wait(Duration::from_secs(1), &mut lives, &replicas);
    orphans += lives
        .iter()
        .filter(|l| l.end.is_none() && alive(l.pid))
        .count();
    for l in &lives {
        if alive(l.pid) {
            let _ = killpg(Pid::from_raw(l.pid), Signal::SIGKILL);
        }
    }
    let _ = store.kill();
    let _ = store.wait();

    // The history.
    let accepted: Vec<u64> = std::fs::read_to_string(dir.path().join("store.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("accepted ")?.split(' ').next()?.parse().ok())
        .collect();
    let out_of_order = accepted.windows(2).filter(|w| w[1] < w[0]).count();
    let mut changes = 0;
    for w in accepted.windows(2) {
        if w[1] != w[0] {
            changes += 1;
        }
    }
    let rejected: usize = replicas
        .iter()
        .map(|r| {
            std::fs::read_to_string(&r.log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.ends_with(" 409"))
                .count()
        })
        .sum();
    let during = |l: &Life, intervals: &[(Instant, Instant)]| {
        let end = l.end.unwrap_or_else(Instant::now);
        intervals.iter().any(|&(a, b)| a < end && l.start < b)
    };
    let paused_during = |l: &Life| during(l, &replicas[l.replica].paused);
    let stopped_during = |l: &Life| during(l, &replicas[l.replica].stopped_alone);
    let mut overlaps = 0;
    let mut overlaps_with_pause = 0;
    let mut overlaps_with_stopped_runner = 0;
    for (i, a) in lives.iter().enumerate() {
        for b in &lives[i + 1..] {
            if a.replica == b.replica {
                continue;
            }
            let (a_end, b_end) = (
                a.end.unwrap_or_else(Instant::now),
                b.end.unwrap_or_else(Instant::now),
            );
            if a.start < b_end && b.start < a_end {
                if paused_during(a) || paused_during(b) {
                    overlaps_with_pause += 1;
                } else if stopped_during(a) || stopped_during(b) {
                    overlaps_with_stopped_runner += 1;
                } else {
                    overlaps += 1;
                }
            }
        }
    }
    // After a fault on the leader's runner: how long until a command
    // started again (the next leader's, or the restarted runner's).
    let failovers = |fault: Fault| -> Vec<Duration> {
        leader_hits
            .iter()
            .filter(|h| h.fault == fault)
            .filter_map(|h| {
                lives
                    .iter()
                    .filter(|l| l.start > h.at)
                    .map(|l| l.start - h.at)
                    .min()
            })
            .collect()
    };
    let after_kill = failovers(Fault::KillRunner);
    let after_stop = failovers(Fault::StopRunnerAlone);
    let ms = |d: Option<Duration>| d.map_or(0, |d| d.as_millis() as usize);
    let hits = |fault: Fault| leader_hits.iter().filter(|h| h.fault == fault).count();
    let kinds: Vec<(&str, usize)> = Fault::ALL
        .iter()
        .map(|&k| (k.name(), faults.iter().filter(|(f, _)| *f == k).count()))
        .collect();
    let mut report = vec![
        ("seconds", seconds as usize),
        ("faults_injected", faults.len()),
    ];
    report.extend(kinds);
    report.extend([
        ("sigkills_of_the_leaders_runner", hits(Fault::KillRunner)),
        (
            "ms_to_next_leader_after_sigkill_min",
            ms(after_kill.iter().min().copied()),
        ),
        (
            "ms_to_next_leader_after_sigkill_max",
            ms(after_kill.iter().max().copied()),
        ),
        (
            "sigstops_of_the_leaders_runner_alone",
            hits(Fault::StopRunnerAlone),
        ),
        (
            "ms_to_next_leader_after_sigstop_min",
            ms(after_stop.iter().min().copied()),
        ),
    ]);
    report.extend([
        ("leadership_changes", changes),
        ("writes_accepted", accepted.len()),
        ("stale_writes_rejected", rejected),
        ("commands_started", lives.len()),
        (
            "overlapping_leaderships_with_a_paused_runner",
            overlaps_with_pause,
        ),
        (
            "overlapping_leaderships_with_a_stopped_runner_alone",
            overlaps_with_stopped_runner,
        ),
        ("overlapping_unfenced_leaderships", overlaps),
        ("accepted_writes_out_of_token_order", out_of_order),
        ("orphaned_children", orphans),
    ]);
    println!("chaos run, seed {seed} (rerun with --seed {seed})");
    for (name, value) in &report {
        println!("{name:<52} {value:>8}");
    }
    let json: Vec<String> = report.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    println!("{{\"seed\":{seed},{}}}", json.join(","));
    drop(cluster);
    let must_be_zero = overlaps + out_of_order + orphans + overlaps_with_stopped_runner;
    if must_be_zero > 0 {
        let faults: Vec<&str> = faults.iter().map(|(_, f)| f.as_str()).collect();
        eprintln!("faults: {faults:?}");
        std::process::exit(1);
    }
}
