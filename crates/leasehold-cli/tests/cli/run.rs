//! `leasehold run` with real processes and real signals.

use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use serde_json::Value;

use super::harness::{
    Proc, Scratch, StoppedReplica, alive, leasehold, read_lines, seen, status_json,
    status_json_once_created, stderr, wait_until,
};

const SECOND: Duration = Duration::from_secs(1);

/// A replica of a service: `leasehold run` for `election` with `script`
/// (run by sh) as the command.
fn replica(scratch: &Scratch, id: &str, ttl: &str, script: &str) -> Proc {
    replica_on(&scratch.store_url(), scratch, id, ttl, script)
}

/// The same on the store at `store`.
pub fn replica_on(store: &str, scratch: &Scratch, id: &str, ttl: &str, script: &str) -> Proc {
    Proc::spawn(
        leasehold()
            .args([
                "run",
                "--election",
                "nightly-billing",
                "--ttl",
                ttl,
                "--id",
                id,
            ])
            .args(["--store", store, "--"])
            .args(["sh", "-c", script])
            .current_dir(scratch.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

/// A "billing" command: appends `run TOKEN ID PID` and the pid of a
/// background grandchild to billing.log, then works until stopped.
pub const BILLING: &str = r#"echo "run $LEASEHOLD_TOKEN $LEASEHOLD_ID $$" >> billing.log
sleep 600 & echo "grandchild $!" >> billing.log
wait"#;

pub fn runs(scratch: &Scratch) -> Vec<(u64, String, i32)> {
    read_lines(&scratch.path("billing.log"))
        .iter()
        .filter_map(|l| {
            let mut f = l.strip_prefix("run ")?.split(' ');
            Some((
                f.next()?.parse().ok()?,
                f.next()?.to_owned(),
                seen(f.next()?.parse().ok()?),
            ))
        })
        .collect()
}

pub fn grandchildren(scratch: &Scratch) -> Vec<i32> {
    read_lines(&scratch.path("billing.log"))
        .iter()
        .filter_map(|l| l.strip_prefix("grandchild ")?.parse().ok().map(seen))
        .collect()
}

/// Worked example 1: three replicas, one billing run at a time; SIGKILL of
/// the leading runner kills its whole command group at once, and another
/// replica runs the job after about the TTL, with a higher token.
#[test]
fn worked_example_1_one_scheduler_and_failover_after_sigkill() {
    let scratch = Scratch::new();
    worked_example_1(&scratch.store_url(), &scratch);
}

pub fn worked_example_1(store: &str, scratch: &Scratch) {
    let mut replicas: Vec<(String, Proc)> = ["a", "b", "c"]
        .iter()
        .map(|id| {
            (
                id.to_string(),
                replica_on(store, scratch, id, "2s", BILLING),
            )
        })
        .collect();
    assert!(wait_until(10 * SECOND, || runs(scratch).len() == 1
        && grandchildren(scratch).len() == 1));
    std::thread::sleep(SECOND);
    let first = runs(scratch);
    assert_eq!(first.len(), 1, "the job ran twice: {first:?}");
    let (token, leader_id, child_pid) = first[0].clone();
    let grandchild = grandchildren(scratch)[0];
    assert!(alive(child_pid) && alive(grandchild));

    let at = replicas
        .iter()
        .position(|(id, _)| *id == leader_id)
        .expect("leader is a replica");
    let (_, leader) = replicas.remove(at);
    let killed_at = Instant::now();
    leader.signal(Signal::SIGKILL);
    let mut gone_at = None;
    let mut second_at = None;
    assert!(
        wait_until(15 * SECOND, || {
            if gone_at.is_none() && !alive(child_pid) && !alive(grandchild) {
                gone_at = Some(Instant::now());
            }
            if second_at.is_none() && runs(scratch).len() >= 2 {
                second_at = Some(Instant::now());
            }
            gone_at.is_some() && second_at.is_some()
        }),
        "child gone: {gone_at:?}, successor ran: {second_at:?}"
    );
    let (gone_at, second_at) = (gone_at.expect("set"), second_at.expect("set"));
    assert!(
        gone_at - killed_at < SECOND,
        "orphan: the killed runner's command group lived {:?} on",
        gone_at - killed_at
    );
    assert!(gone_at <= second_at, "two schedulers at once");
    let all = runs(scratch);
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all[1].0 > token, "the successor's token must be higher");
    assert_ne!(all[1].1, leader_id);
    drop(leader);
}

/// SIGTERM to the leader: the command gets the signal, the election is
/// released, and a waiting replica runs within a fraction of the TTL.
#[test]
fn sigterm_hands_over_without_waiting_for_the_ttl() {
    let scratch = Scratch::new();
    sigterm_handover(&scratch.store_url(), &scratch);
}

pub fn sigterm_handover(store: &str, scratch: &Scratch) {
    let script = r#"trap 'echo "stopped $LEASEHOLD_TOKEN" >> billing.log; exit 0' TERM
echo "run $LEASEHOLD_TOKEN $LEASEHOLD_ID $$" >> billing.log
while :; do sleep 0.05; done"#;
    let mut a = replica_on(store, scratch, "a", "30s", script);
    assert!(wait_until(10 * SECOND, || runs(scratch).len() == 1));
    let b = replica_on(store, scratch, "b", "30s", script);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(runs(scratch).len(), 1);
    let sent = Instant::now();
    a.signal(Signal::SIGTERM);
    assert!(
        wait_until(10 * SECOND, || runs(scratch).len() == 2),
        "no handover"
    );
    let took = sent.elapsed();
    assert!(took < 10 * SECOND, "handover took {took:?} with a 30s TTL");
    let status = a.wait_for_exit(10 * SECOND).expect("a exits");
    assert_eq!(
        status.code(),
        Some(0),
        "the command trapped TERM and exited 0"
    );
    let log = read_lines(&scratch.path("billing.log"));
    let first_token = runs(scratch)[0].0;
    assert!(
        log.iter().any(|l| *l == format!("stopped {first_token}")),
        "{log:?}"
    );
    assert_eq!(runs(scratch)[1].1, "b");
    drop(b);
}

/// Two replicas given one `--id`: the second waits while the first leads
/// (neither takes the election from the other), says that another
/// replica holds it under the same id, and is shown waiting by `status`;
/// it takes over with a higher token only once the first stops.
#[test]
fn two_replicas_sharing_an_id_take_turns_and_the_twin_is_named() {
    let scratch = Scratch::new();
    let script = r#"trap 'echo "stopped $LEASEHOLD_TOKEN" >> billing.log; exit 0' TERM
echo "run $LEASEHOLD_TOKEN $LEASEHOLD_ID $$" >> billing.log
while :; do sleep 0.05; done"#;
    let mut a = replica(&scratch, "twin", "30s", script);
    assert!(wait_until(10 * SECOND, || runs(&scratch).len() == 1));
    let log = std::fs::File::create(scratch.path("b.err")).expect("create");
    let b = Proc::spawn(
        leasehold()
            .args(["run", "--election", "nightly-billing", "--ttl", "30s"])
            .args(["--id", "twin", "--store", &scratch.store_url(), "--"])
            .args(["sh", "-c", script])
            .current_dir(scratch.dir.path())
            .stdout(Stdio::null())
            .stderr(log),
    );
    let named = "another replica with this candidate id holds the election";
    assert!(
        wait_until(10 * SECOND, || read_lines(&scratch.path("b.err"))
            .iter()
            .any(|l| l.contains(named))),
        "the twin is not named; its last lines: {:?}",
        read_lines(&scratch.path("b.err"))
            .iter()
            .rev()
            .take(6)
            .collect::<Vec<_>>()
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        runs(&scratch).len(),
        1,
        "the replicas took the election from each other: {:?}",
        read_lines(&scratch.path("billing.log"))
    );
    // `status` shows the twin waiting behind the leader of its id.
    let status = status_json(&scratch.store_url(), "nightly-billing");
    assert_eq!(status["leader"]["id"], "twin", "{status}");
    let waiting = status["candidates"].as_array().cloned().unwrap_or_default();
    assert_eq!(waiting.len(), 1, "the twin is not shown waiting: {status}");
    assert_eq!(waiting[0]["id"], "twin", "{status}");
    a.signal(Signal::SIGTERM);
    assert!(
        wait_until(10 * SECOND, || runs(&scratch).len() == 2),
        "no handover to the twin"
    );
    a.wait_for_exit(10 * SECOND).expect("a exits");
    let runs = runs(&scratch);
    assert!(runs[1].0 > runs[0].0, "tokens out of order: {runs:?}");
    assert_ne!(runs[1].2, runs[0].2);
    let log = read_lines(&scratch.path("billing.log"));
    let stopped = log
        .iter()
        .position(|l| *l == format!("stopped {}", runs[0].0))
        .expect("the first command stopped");
    let second = log
        .iter()
        .position(|l| l.starts_with(&format!("run {} ", runs[1].0)))
        .expect("the second command ran");
    assert!(
        stopped < second,
        "the twin's command started before the first stopped: {log:?}"
    );
    drop(b);
}

/// The command's own exit: `run` exits with its status and releases at once.
#[test]
fn the_commands_exit_status_is_passed_on_and_the_election_released() {
    let scratch = Scratch::new();
    for (script, code) in [("exit 0", 0), ("exit 3", 3), ("kill -USR1 $$", 128 + 10)] {
        let out = leasehold()
            .args([
                "run",
                "--election",
                "job",
                "--ttl",
                "60s",
                "--store",
                &scratch.store_url(),
            ])
            .args(["--", "sh", "-c", script])
            .output()
            .expect("spawn");
        assert_eq!(out.status.code(), Some(code), "{script}: {}", stderr(&out));
        let status = status_json(&scratch.store_url(), "job");
        assert!(
            status["leader"].is_null(),
            "{script}: not released: {status}"
        );
    }
}

/// The command sees its election, id and token.
#[test]
fn the_command_gets_election_id_and_token() {
    let scratch = Scratch::new();
    let out = leasehold()
        .args(["run", "--election", "env-check", "--id", "replica-7"])
        .env("LEASEHOLD_STORE", scratch.store_url())
        .args([
            "--",
            "sh",
            "-c",
            "echo $LEASEHOLD_ELECTION $LEASEHOLD_ID $LEASEHOLD_TOKEN",
        ])
        .output()
        .expect("spawn");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "env-check replica-7 1"
    );
}

#[test]
fn bad_input_exits_2_with_one_line() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "--election", "a", "--store", &store],
            "no command to run",
        ),
        (
            &["run", "--election", "a", "--store", &store, "--"],
            "no command to run",
        ),
        (&["run", "--store", &store, "--", "true"], "--election"),
        (
            &[
                "run",
                "--election",
                "a",
                "--store",
                "zookeeper://x",
                "--",
                "true",
            ],
            "unknown scheme",
        ),
        (
            &[
                "run",
                "--election",
                "a",
                "--store",
                &store,
                "--ttl",
                "soon",
                "--",
                "true",
            ],
            "--ttl",
        ),
        (
            &[
                "run",
                "--election",
                "a",
                "--store",
                &store,
                "--grace=-1s",
                "--",
                "true",
            ],
            "--grace",
        ),
        (
            &[
                "run",
                "--election",
                "a",
                "--store",
                &store,
                "--ttl",
                "3s",
                "--renew-every",
                "2s",
                "--",
                "true",
            ],
            "the renewal period must be shorter than half of TTL·(1 − drift) − skew",
        ),
        (
            &[
                "run",
                "--election",
                "no spaces",
                "--store",
                &store,
                "--",
                "true",
            ],
            "invalid election name",
        ),
    ];
    for (args, needle) in cases {
        let out = leasehold().args(*args).output().expect("spawn");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: not one line: {err}"
        );
    }
}

#[test]
fn a_command_that_cannot_start_exits_127_and_releases() {
    let scratch = Scratch::new();
    let not_executable = scratch.path("script.sh");
    std::fs::write(&not_executable, "#!/bin/sh\necho hi\n").expect("write");
    // A script whose #! interpreter is missing: the kernel says "No such
    // file or directory" of a file that is there, so the message says
    // what is missing (a review was misled by the bare words).
    let orphan = scratch.path("orphan.sh");
    std::fs::write(&orphan, "#!/no/such/interpreter\necho hi\n").expect("write");
    std::fs::set_permissions(&orphan, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    for (program, says) in [
        ("/no/such/program", "cannot run"),
        (not_executable.to_str().expect("utf-8"), "cannot run"),
        (
            orphan.to_str().expect("utf-8"),
            "the interpreter its #! line names",
        ),
    ] {
        let out = leasehold()
            .args([
                "run",
                "--election",
                "job",
                "--ttl",
                "60s",
                "--store",
                &scratch.store_url(),
            ])
            .args(["--", program])
            .output()
            .expect("spawn");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(127), "{program}: {err}");
        assert!(
            err.contains("cannot run") && err.contains(program) && err.contains(says),
            "{program}: {err}"
        );
        assert!(status_json(&scratch.store_url(), "job")["leader"].is_null());
    }
}

#[test]
fn a_corrupt_store_exits_1_without_a_panic() {
    let scratch = Scratch::new();
    let file = scratch.path("garbage.db");
    std::fs::write(&file, vec![0x42u8; 4096]).expect("write");
    let out = leasehold()
        .args([
            "run",
            "--election",
            "job",
            "--store",
            &format!("sqlite:{}", file.display()),
        ])
        .args(["--", "true"])
        .output()
        .expect("spawn");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("not a SQLite database"), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
}

/// Twenty replicas whose command runs briefly: each leads once, in turn,
/// never two at a time, with increasing tokens.
#[test]
fn twenty_replicas_take_turns() {
    let scratch = Scratch::new();
    let script = r#"mkdir running.lock 2>/dev/null || echo "OVERLAP $LEASEHOLD_ID" >> turns.log
echo "turn $LEASEHOLD_TOKEN $LEASEHOLD_ID" >> turns.log
sleep 0.05
rmdir running.lock"#;
    let mut replicas: Vec<Proc> = (0..20)
        .map(|i| {
            let log = std::fs::File::create(scratch.path(&format!("r{i}.err"))).expect("log file");
            Proc::spawn(
                leasehold()
                    .args([
                        "run",
                        "--election",
                        "turns",
                        "--ttl",
                        "10s",
                        "--id",
                        &format!("r{i}"),
                    ])
                    .args(["--store", &scratch.store_url(), "--", "sh", "-c", script])
                    .current_dir(scratch.dir.path())
                    .stdout(Stdio::null())
                    .stderr(log),
            )
        })
        .collect();
    for (i, replica) in replicas.iter_mut().enumerate() {
        let status = replica
            .wait_for_exit(60 * SECOND)
            .expect("every replica gets its turn");
        let err = std::fs::read_to_string(scratch.path(&format!("r{i}.err"))).unwrap_or_default();
        assert!(status.success(), "replica r{i}: {status}: {err}");
    }
    let log = read_lines(&scratch.path("turns.log"));
    assert!(!log.iter().any(|l| l.starts_with("OVERLAP")), "{log:?}");
    let turns: Vec<(u64, String)> = log
        .iter()
        .filter_map(|l| {
            let mut f = l.strip_prefix("turn ")?.split(' ');
            Some((f.next()?.parse().ok()?, f.next()?.to_owned()))
        })
        .collect();
    assert_eq!(turns.len(), 20);
    let mut ids: Vec<_> = turns.iter().map(|t| t.1.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20, "every replica leads exactly once");
    assert!(
        turns.windows(2).all(|w| w[1].0 > w[0].0),
        "tokens must increase: {turns:?}"
    );
}

/// A replica stopped (SIGSTOP) past its TTL loses leadership; on SIGCONT its
/// runner kills its command at once (the deadline has passed) and stays in the
/// pool as a follower.
#[test]
fn a_runner_that_lost_leadership_kills_its_command_and_campaigns_again() {
    let scratch = Scratch::new();
    let a = replica(&scratch, "a", "1s", BILLING);
    assert!(wait_until(10 * SECOND, || runs(&scratch).len() == 1
        && grandchildren(&scratch).len() == 1));
    let b = replica(&scratch, "b", "1s", BILLING);
    let (_, _, a_child) = runs(&scratch)[0].clone();
    let a_grandchild = grandchildren(&scratch)[0];
    // A stop-the-world pause of a (runner, guard and command), never
    // inside a SQLite write, which would keep b from writing too.
    let paused = StoppedReplica::stop(a.pid(), a_child, &scratch.store_url());
    assert!(
        wait_until(10 * SECOND, || runs(&scratch).len() == 2),
        "b never took over"
    );
    drop(paused);
    assert!(
        wait_until(5 * SECOND, || !alive(a_child) && !alive(a_grandchild)),
        "the ex-leader's command survived the loss of leadership"
    );
    // a is still a replica: when b goes, a leads again.
    b.signal(Signal::SIGTERM);
    assert!(
        wait_until(10 * SECOND, || runs(&scratch).len() == 3),
        "a did not campaign again"
    );
    let all = runs(&scratch);
    assert_eq!(all[2].1, "a");
    assert!(all[2].0 > all[1].0 && all[1].0 > all[0].0);
    drop((a, b));
}

/// `status --json`, `observe` and `list --json` print exactly the shapes of
/// docs/DESIGN.md, fields in that order.
#[test]
fn status_observe_and_list_print_the_documented_json() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    // Reading creates no store: a first `run` (of another election) does.
    let out = leasehold()
        .args(["run", "--election", "setup", "--store", &store])
        .args(["--", "true"])
        .output()
        .expect("spawn");
    assert!(out.status.success(), "{}", stderr(&out));
    let status_line = || {
        let out = leasehold()
            .args([
                "status",
                "--json",
                "--election",
                "nightly-billing",
                "--store",
                &store,
            ])
            .output()
            .expect("spawn");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(
        status_line(),
        r#"{"election":"nightly-billing","leader":null,"candidates":[]}"#
    );

    let mut observer = Proc::spawn(
        leasehold()
            .args([
                "observe",
                "--election",
                "nightly-billing",
                "--store",
                &store,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    let stdout = observer.child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    std::thread::sleep(Duration::from_millis(300));
    // The command lives 1.5 s, then exits: the election is released.
    let mut leader = replica(&scratch, "shape-leader", "30s", "sleep 1.5");
    assert!(wait_until(5 * SECOND, || status_line().contains("shape-leader")));
    let line = status_line();
    let token = serde_json::from_str::<serde_json::Value>(&line).expect("JSON")["leader"]["token"]
        .as_u64()
        .unwrap_or_else(|| panic!("no token: {line}"));
    let prefix = format!(
        r#"{{"election":"nightly-billing","leader":{{"id":"shape-leader","token":{token},"expires_in_ms":"#
    );
    let suffix = r#"},"candidates":[]}"#;
    assert!(
        line.starts_with(&prefix) && line.ends_with(suffix),
        "{line}"
    );
    let ms: u64 = line[prefix.len()..line.len() - suffix.len()]
        .parse()
        .expect("a number of ms");
    assert!(ms <= 30_000);
    let list = leasehold()
        .args(["list", "--json", "--store", &store])
        .output()
        .expect("spawn");
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(list.starts_with(&format!("[{prefix}")), "{list}");
    assert!(
        leader
            .wait_for_exit(10 * SECOND)
            .is_some_and(|s| s.success())
    );
    std::thread::sleep(Duration::from_millis(300));
    observer.signal(Signal::SIGTERM);
    assert!(
        observer
            .wait_for_exit(5 * SECOND)
            .is_some_and(|s| s.success())
    );
    let lines = reader.join().expect("reader");
    assert_eq!(lines.len(), 3, "null, leader, null: {lines:?}");
    assert_eq!(
        lines[0],
        r#"{"election":"nightly-billing","leader":null,"candidates":[]}"#
    );
    assert!(lines[1].starts_with(&prefix), "{}", lines[1]);
    assert_eq!(lines[2], lines[0]);
}

/// An `observe` line is `status --json`'s object: the same keys, the
/// waiting replicas included, and a new line when the line of waiting
/// replicas changes (as `status --json` would then print another object).
#[test]
fn an_observe_line_has_the_keys_of_status_json() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    let _leader = replica(&scratch, "keys-leader", "30s", "exec sleep 600");
    assert!(wait_until(10 * SECOND, || {
        status_json_once_created(&store, "nightly-billing")["leader"]["id"] == "keys-leader"
    }));
    let _waiter = replica(&scratch, "keys-waiter", "30s", "exec sleep 600");
    assert!(wait_until(10 * SECOND, || {
        status_json(&store, "nightly-billing")["candidates"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
    }));
    let mut observer = Proc::spawn(
        leasehold()
            .args([
                "observe",
                "--election",
                "nightly-billing",
                "--store",
                &store,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    let stdout = observer.child.stdout.take().expect("stdout");
    let (sender, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let next_line = || -> Value {
        let line = lines.recv_timeout(10 * SECOND).expect("an observe line");
        serde_json::from_str(&line).expect("observe prints JSON")
    };
    let keys = |v: &Value| -> Vec<String> {
        v.as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default()
    };
    let observed = next_line();
    let status = status_json(&store, "nightly-billing");
    assert_eq!(keys(&observed), keys(&status), "{observed} vs {status}");
    assert_eq!(observed["candidates"], status["candidates"], "{observed}");
    assert_eq!(
        observed["candidates"][0],
        serde_json::json!({"id": "keys-waiter", "priority": 0}),
        "{observed}"
    );
    assert_eq!(observed["leader"]["id"], "keys-leader", "{observed}");

    // A second replica joins the line: the leader is the same, the object
    // is not.
    let _second = replica(&scratch, "keys-second", "30s", "exec sleep 600");
    let observed = next_line();
    assert_eq!(observed["leader"]["id"], "keys-leader", "{observed}");
    let waiting: Vec<&Value> = observed["candidates"]
        .as_array()
        .map(|c| c.iter().map(|c| &c["id"]).collect())
        .unwrap_or_default();
    assert_eq!(waiting, ["keys-waiter", "keys-second"], "{observed}");
    observer.signal(Signal::SIGTERM);
    assert!(
        observer
            .wait_for_exit(5 * SECOND)
            .is_some_and(|s| s.success())
    );
}

/// A runner of `election` whose command ignores SIGTERM, once that
/// command runs; with the time SIGTERM was sent to the runner.
fn ignoring_sigterm(scratch: &Scratch, election: &str, ttl: &str, grace: &str) -> (Proc, Instant) {
    let log = std::fs::File::create(scratch.path(&format!("{election}.err"))).expect("log file");
    let runner = Proc::spawn(
        leasehold()
            .args([
                "run",
                "--election",
                election,
                "--ttl",
                ttl,
                "--grace",
                grace,
            ])
            .args(["--store", &scratch.store_url(), "--"])
            .args([
                "sh",
                "-c",
                "trap '' TERM; echo ready >> ready; while :; do sleep 0.05; done",
            ])
            .current_dir(scratch.dir.path())
            .stdout(Stdio::null())
            .stderr(log),
    );
    assert!(wait_until(10 * SECOND, || scratch.path("ready").exists()));
    let sent = Instant::now();
    runner.signal(Signal::SIGTERM);
    (runner, sent)
}

/// A command that ignores SIGTERM gets SIGKILL after --grace; the election
/// is released and `run` reports the kill.
#[test]
fn a_command_ignoring_sigterm_is_killed_after_the_grace_period() {
    let scratch = Scratch::new();
    let (mut runner, sent) = ignoring_sigterm(&scratch, "stubborn", "30s", "300ms");
    let status = runner.wait_for_exit(10 * SECOND).expect("run exits");
    assert!(
        sent.elapsed() >= Duration::from_millis(300),
        "killed before the grace period"
    );
    assert_eq!(
        status.code(),
        Some(128 + 9),
        "the command was ended by SIGKILL"
    );
    assert!(status_json(&scratch.store_url(), "stubborn")["leader"].is_null());
}

/// Leadership lost while a SIGTERM's grace period runs: the command is
/// killed and `run` exits, never campaigning again (found by a review:
/// `run` forgot the SIGTERM, led again with a new token and started a
/// second command). The loss comes from the outside: the session's row
/// is deleted, so the next renewal finds it gone.
#[test]
fn a_loss_during_the_grace_period_still_ends_run() {
    let scratch = Scratch::new();
    let (mut runner, _) = ignoring_sigterm(&scratch, "forgotten", "2s", "60s");
    let started = || read_lines(&scratch.path("ready")).len();
    assert!(wait_until(10 * SECOND, || log_of(&scratch, "forgotten")
        .contains("forwarding to the command")));
    rusqlite::Connection::open(scratch.path("leasehold.db"))
        .and_then(|c| c.execute("DELETE FROM sessions", []))
        .expect("end the session from the outside");
    let status = runner.wait_for_exit(10 * SECOND);
    let log = log_of(&scratch, "forgotten");
    assert_eq!(status.and_then(|s| s.code()), Some(128 + 9), "{log}");
    assert_eq!(started(), 1, "a second command started: {log}");
    assert!(log.contains("leadership was lost meanwhile"), "{log}");
}

/// SIGTERM while the command stops for a transfer: the handover goes on,
/// and `run` then exits with the command's status (found by a review: it
/// campaigned again, met the signal there and exited 0).
#[test]
fn a_sigterm_during_a_transfer_exits_with_the_command_s_status() {
    let scratch = Scratch::new();
    let script = "trap 'echo stopping >> stops; sleep 1; exit 7' TERM; \
                  echo \"run $LEASEHOLD_ID\" >> runs; while :; do sleep 0.05; done";
    let mut a = logged_replica(&scratch, "a", script);
    assert!(wait_until(10 * SECOND, || read_lines(
        &scratch.path("runs")
    )
    .len()
        == 1));
    let b = logged_replica(&scratch, "b", script);
    assert!(wait_until(10 * SECOND, || status_json(
        &scratch.store_url(),
        "nightly-billing"
    )["candidates"]
        .as_array()
        .is_some_and(|w| !w.is_empty())));
    let transfer = Proc::spawn(
        leasehold()
            .args([
                "transfer",
                "--election",
                "nightly-billing",
                "--store",
                &scratch.store_url(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    assert!(wait_until(10 * SECOND, || scratch.path("stops").exists()));
    a.signal(Signal::SIGTERM);
    let status = a.wait_for_exit(10 * SECOND);
    let log = log_of(&scratch, "a");
    assert_eq!(status.and_then(|s| s.code()), Some(7), "{log}");
    assert!(log.contains("the command is stopping already"), "{log}");
    assert!(
        wait_until(10 * SECOND, || read_lines(&scratch.path("runs"))
            == ["run a", "run b"]),
        "b did not take over: {log}"
    );
    drop((b, transfer));
}

/// A grace period longer than the TTL is honoured while renewals go on:
/// the kill waits for it, not for the lease deadline the stop found
/// (found by a review: `--ttl 3s --grace 8s` killed after 2.9 s).
#[test]
fn a_grace_period_longer_than_the_ttl_is_honoured_while_renewals_go_on() {
    let scratch = Scratch::new();
    let (mut runner, sent) = ignoring_sigterm(&scratch, "patient", "2s", "4s");
    assert!(
        runner.wait_for_exit(3 * SECOND).is_none(),
        "killed at the lease deadline the stop found, before the grace period"
    );
    let status = runner.wait_for_exit(10 * SECOND).expect("run exits");
    assert!(
        sent.elapsed() >= 4 * SECOND,
        "killed before the grace period"
    );
    assert_eq!(status.code(), Some(128 + 9), "ended by SIGKILL");
    assert!(status_json(&scratch.store_url(), "patient")["leader"].is_null());
}

/// A waiting replica says who leads, and says so again when it changes.
#[test]
fn a_follower_logs_who_leads() {
    let scratch = Scratch::new();
    let leader = replica(&scratch, "the-leader", "30s", BILLING);
    assert!(wait_until(10 * SECOND, || runs(&scratch).len() == 1));
    let mut follower = Proc::spawn(
        leasehold()
            .args([
                "run",
                "--election",
                "nightly-billing",
                "--id",
                "the-follower",
            ])
            .args(["--store", &scratch.store_url(), "--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    std::thread::sleep(Duration::from_millis(500));
    follower.signal(Signal::SIGTERM);
    assert!(
        follower
            .wait_for_exit(10 * SECOND)
            .is_some_and(|s| s.success())
    );
    let mut err = String::new();
    std::io::Read::read_to_string(&mut follower.child.stderr.take().expect("stderr"), &mut err)
        .expect("read");
    assert!(err.contains("leader=the-leader"), "{err}");
    drop(leader);
}

/// Renewals that cannot reach the store (here: another process holds the
/// SQLite write lock) make the leader stop its command before its lease
/// deadline — SIGTERM first — and campaign again once the store is back.
#[test]
fn a_leader_whose_renewals_fail_stops_its_command_before_the_deadline() {
    let scratch = Scratch::new();
    let script = r#"trap 'echo "term $LEASEHOLD_TOKEN" >> billing.log; exit 0' TERM
echo "run $LEASEHOLD_TOKEN $LEASEHOLD_ID $$" >> billing.log
while :; do sleep 0.02; done"#;
    let runner = replica(&scratch, "a", "2s", script);
    assert!(wait_until(10 * SECOND, || runs(&scratch).len() == 1));
    let (_, _, child) = runs(&scratch)[0].clone();
    {
        let db = rusqlite::Connection::open(scratch.path("leasehold.db")).expect("open");
        db.execute_batch("BEGIN EXCLUSIVE")
            .expect("take the write lock");
        let locked_at = Instant::now();
        assert!(
            wait_until(5 * SECOND, || !alive(child)),
            "the command outlived failing renewals"
        );
        // TTL 2s: renewals every ~667ms, deadline 2s·0.99 − 100ms after the
        // last one sent. The command must be gone within that.
        assert!(
            locked_at.elapsed() < 2 * SECOND,
            "stopped only after {:?}",
            locked_at.elapsed()
        );
        let log = read_lines(&scratch.path("billing.log"));
        assert!(
            log.contains(&"term 1".to_owned()),
            "no SIGTERM before the kill: {log:?}"
        );
        db.execute_batch("ROLLBACK").expect("release the lock");
    }
    assert!(
        wait_until(15 * SECOND, || runs(&scratch).len() == 2),
        "did not lead again"
    );
    assert!(runs(&scratch)[1].0 > runs(&scratch)[0].0, "a lower token");
    drop(runner);
}

/// The command's status is passed on and the election is free afterwards.
pub fn exit_status_and_release(store: &str) {
    let out = leasehold()
        .args(["run", "--election", "job", "--ttl", "30s", "--store", store])
        .args(["--", "sh", "-c", "exit 3"])
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let out = leasehold()
        .args(["status", "--json", "--election", "job", "--store", store])
        .output()
        .expect("spawn");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"{"election":"job","leader":null,"candidates":[]}"#,
        "{}",
        stderr(&out)
    );
}

/// A store that cannot be reached: exit 1, one line naming the address.
pub fn unreachable_exits_1(url: &str, needle: &str) {
    let out = leasehold()
        .args(["run", "--election", "job", "--store", url, "--", "true"])
        .output()
        .expect("spawn");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(needle), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

pub fn free_port() -> u16 {
    leasehold_testkit::free_port()
}

/// A replica with a 60 s TTL whose log goes to `ID.err` in the scratch
/// folder: far longer than any test waits, so a successor that leads did so
/// because the election was released (or, on SQLite, because the leader's
/// process died: the successor logs it), not because its lease expired.
fn logged_replica(scratch: &Scratch, id: &str, script: &str) -> Proc {
    let log = std::fs::File::create(scratch.path(&format!("{id}.err"))).expect("log file");
    Proc::spawn(
        leasehold()
            .args([
                "run",
                "--election",
                "nightly-billing",
                "--ttl",
                "60s",
                "--id",
                id,
            ])
            .args(["--store", &scratch.store_url(), "--"])
            .args(["sh", "-c", script])
            .current_dir(scratch.dir.path())
            .stdout(Stdio::null())
            .stderr(log),
    )
}

fn log_of(scratch: &Scratch, id: &str) -> String {
    std::fs::read_to_string(scratch.path(&format!("{id}.err"))).unwrap_or_default()
}

/// A command that notes which stop signal it got (`term`, `hup`, `int` or
/// `quit`, with its token) and exits 0, and notes SIGUSR1/SIGUSR2 without
/// stopping.
const NOTES_SIGNALS: &str = r#"trap 'echo "term $LEASEHOLD_TOKEN" >> billing.log; exit 0' TERM
trap 'echo "hup $LEASEHOLD_TOKEN" >> billing.log; exit 0' HUP
trap 'echo "int $LEASEHOLD_TOKEN" >> billing.log; exit 0' INT
trap 'echo "quit $LEASEHOLD_TOKEN" >> billing.log; exit 0' QUIT
trap 'echo "usr1 $LEASEHOLD_TOKEN" >> billing.log' USR1
trap 'echo "usr2 $LEASEHOLD_TOKEN" >> billing.log' USR2
echo "run $LEASEHOLD_TOKEN $LEASEHOLD_ID $$" >> billing.log
while :; do sleep 0.05; done"#;

/// A terminal closing (SIGHUP) stops `run` the way SIGTERM does: its
/// command gets SIGTERM (not SIGHUP), and once it has exited the election
/// is released, so a waiting replica leads next without waiting for the
/// lease to expire.
#[test]
fn sighup_stops_the_command_with_sigterm_and_hands_over() {
    a_stop_signal_hands_over_like_sigterm(Signal::SIGHUP);
}

/// `signal` to a leading `run` stops it the way SIGTERM does: its command
/// gets SIGTERM (not `signal`), and once it has exited the election is
/// released, so a waiting replica leads next without waiting for the lease
/// to expire.
fn a_stop_signal_hands_over_like_sigterm(signal: Signal) {
    let name = signal.as_str();
    let noted_as = name.trim_start_matches("SIG").to_lowercase();
    let scratch = Scratch::new();
    let mut a = logged_replica(&scratch, "a", NOTES_SIGNALS);
    assert!(wait_until(10 * SECOND, || runs(&scratch).len() == 1));
    let b = logged_replica(&scratch, "b", NOTES_SIGNALS);
    assert!(
        wait_until(10 * SECOND, || log_of(&scratch, "b")
            .contains("waiting; election is led")),
        "b is not waiting: {}",
        log_of(&scratch, "b")
    );
    a.signal(signal);
    let status = a.wait_for_exit(10 * SECOND).expect("a exits");
    assert_eq!(
        status.code(),
        Some(0),
        "run exits with its command's status (it trapped TERM and exited 0): {}",
        log_of(&scratch, "a")
    );
    let a_log = log_of(&scratch, "a");
    assert!(
        a_log.contains(&format!("{name} received")) && a_log.contains("stopped; election released"),
        "{a_log}"
    );
    assert!(
        wait_until(10 * SECOND, || runs(&scratch).len() == 2),
        "no handover"
    );
    let log = read_lines(&scratch.path("billing.log"));
    let stopped = log.iter().position(|l| l == "term 1");
    let successor = log
        .iter()
        .position(|l| l.starts_with("run ") && l.split(' ').nth(2) == Some("b"));
    assert!(
        stopped.is_some() && successor.is_some() && stopped < successor,
        "a's command must get SIGTERM and exit before b's starts: {log:?}"
    );
    assert!(!log.iter().any(|l| l.starts_with(&noted_as)), "{log:?}");
    assert!(
        !log_of(&scratch, "b").contains("the previous leader"),
        "b took over from an expired lease or a dead process, not a release: {}",
        log_of(&scratch, "b")
    );
    drop(b);
}

/// SIGQUIT (Ctrl-\) is passed on as it is, like SIGTERM and SIGINT: the
/// command gets SIGQUIT and `run` releases the election once it has exited,
/// then exits with its status. A command that does not handle it dies of
/// it: 128+3.
#[test]
fn sigquit_is_forwarded_and_the_election_released() {
    let scratch = Scratch::new();
    let mut a = logged_replica(&scratch, "a", NOTES_SIGNALS);
    assert!(wait_until(10 * SECOND, || runs(&scratch).len() == 1));
    a.signal(Signal::SIGQUIT);
    let status = a.wait_for_exit(10 * SECOND).expect("a exits");
    assert_eq!(status.code(), Some(0), "{}", log_of(&scratch, "a"));
    let log = read_lines(&scratch.path("billing.log"));
    assert!(log.contains(&"quit 1".to_owned()), "{log:?}");
    assert!(
        status_json(&scratch.store_url(), "nightly-billing")["leader"].is_null(),
        "not released"
    );

    let mut b = logged_replica(
        &scratch,
        "b",
        r#"echo "run $LEASEHOLD_TOKEN $LEASEHOLD_ID $$" >> billing.log; while :; do sleep 0.05; done"#,
    );
    assert!(wait_until(10 * SECOND, || runs(&scratch).len() == 2));
    b.signal(Signal::SIGQUIT);
    let status = b.wait_for_exit(10 * SECOND).expect("b exits");
    assert_eq!(
        status.code(),
        Some(128 + 3),
        "the command died of SIGQUIT: {}",
        log_of(&scratch, "b")
    );
    assert!(
        status_json(&scratch.store_url(), "nightly-billing")["leader"].is_null(),
        "not released"
    );
}

/// SIGUSR1 and SIGUSR2 reach the command and stop nothing: `run` and its
/// command keep running and the election stays held. A follower, which has
/// no command, takes them without dying and drops them.
#[test]
fn sigusr1_and_sigusr2_reach_the_command_and_stop_nothing() {
    let scratch = Scratch::new();
    let mut a = logged_replica(&scratch, "a", NOTES_SIGNALS);
    assert!(wait_until(10 * SECOND, || runs(&scratch).len() == 1));
    let (_, _, child) = runs(&scratch)[0].clone();
    for (signal, note) in [
        (Signal::SIGUSR1, "usr1 1"),
        (Signal::SIGUSR2, "usr2 1"),
        (Signal::SIGUSR1, "usr1 1"),
    ] {
        let before = read_lines(&scratch.path("billing.log"))
            .iter()
            .filter(|l| *l == note)
            .count();
        a.signal(signal);
        assert!(
            wait_until(10 * SECOND, || read_lines(&scratch.path("billing.log"))
                .iter()
                .filter(|l| *l == note)
                .count()
                > before),
            "{signal} did not reach the command: {}",
            log_of(&scratch, "a")
        );
    }
    assert!(
        a.child.try_wait().expect("try_wait").is_none(),
        "run exited"
    );
    assert!(alive(child), "the command was stopped");
    assert_eq!(
        status_json(&scratch.store_url(), "nightly-billing")["leader"]["id"],
        "a"
    );

    let mut b = logged_replica(&scratch, "b", NOTES_SIGNALS);
    assert!(wait_until(10 * SECOND, || log_of(&scratch, "b")
        .contains("waiting; election is led")));
    b.signal(Signal::SIGUSR1);
    b.signal(Signal::SIGUSR2);
    assert!(
        wait_until(10 * SECOND, || log_of(&scratch, "b")
            .matches("no command is running; signal ignored")
            .count()
            == 2),
        "{}",
        log_of(&scratch, "b")
    );
    assert!(b.child.try_wait().expect("try_wait").is_none(), "b died");

    a.signal(Signal::SIGTERM);
    assert_eq!(
        a.wait_for_exit(10 * SECOND).expect("a exits").code(),
        Some(0)
    );
    assert!(
        wait_until(10 * SECOND, || runs(&scratch).len() == 2),
        "b did not lead after a"
    );
    b.signal(Signal::SIGTERM);
    assert_eq!(
        b.wait_for_exit(10 * SECOND).expect("b exits").code(),
        Some(0)
    );
}

/// Sends signal `number` (which may be a real-time one, which
/// [`Signal`] cannot name) to `pid` with kill(1).
pub fn kill_by_number(pid: i32, number: i32) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{number}"))
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{number} {pid}");
}

/// SIGPWR (what lxc-stop and power managers send to ask for a shutdown)
/// stops `run` as SIGTERM does: its command gets SIGTERM, and once it has
/// exited the election is released and a waiting replica leads next with
/// the next token, long before the 60 s TTL. It once killed `run` (exit
/// 158) and left the election held for the whole TTL.
#[test]
fn sigpwr_stops_the_command_with_sigterm_and_hands_over() {
    a_stop_signal_hands_over_like_sigterm(Signal::SIGPWR);
}

/// A command that notes every signal of `PASSED` and `IGNORED` it gets
/// (`got N`) and exits 0 on SIGTERM.
const NOTES_EVERY_SIGNAL: &str = r#"trap 'echo "term $LEASEHOLD_TOKEN" >> billing.log; exit 0' TERM
for n in 14 26 27 29 16 34 40 64 5 6 31 24 25; do trap "echo got $n >> billing.log" $n; done
echo "run $LEASEHOLD_TOKEN $LEASEHOLD_ID $$" >> billing.log
while :; do sleep 0.05; done"#;

/// The signals `run` passes to its command: SIGALRM, SIGVTALRM, SIGPROF,
/// SIGIO, SIGSTKFLT, SIGRTMIN, SIGRTMIN+6, SIGRTMAX (by number, as on
/// Linux with glibc).
const PASSED: [i32; 8] = [14, 26, 27, 29, 16, 34, 40, 64];
/// The signals `run` ignores: SIGTRAP, SIGABRT, SIGSYS, SIGXCPU, SIGXFSZ.
/// SIGTRAP, SIGABRT, SIGSYS, SIGXCPU, SIGXFSZ, SIGTSTP, SIGTTIN, SIGTTOU.
const IGNORED: [i32; 8] = [5, 6, 31, 24, 25, 20, 21, 22];

/// No signal whose default action ends a process ends a leading `run`
/// without a release: SIGALRM, the other timer signals, SIGIO, SIGSTKFLT
/// and the real-time signals reach the command and stop nothing (as
/// SIGUSR1 does); SIGTRAP, SIGABRT, SIGSYS, SIGXCPU and SIGXFSZ are logged
/// and ignored. `run` once died of each (SIGALRM: exit 142) and left the
/// election held until the TTL. A follower takes them all without dying.
#[test]
fn other_signals_reach_the_command_or_are_ignored_and_never_end_run() {
    let scratch = Scratch::new();
    let mut a = logged_replica(&scratch, "a", NOTES_EVERY_SIGNAL);
    assert!(wait_until(10 * SECOND, || runs(&scratch).len() == 1));
    let (_, _, child) = runs(&scratch)[0].clone();
    let noted = |note: &str| {
        read_lines(&scratch.path("billing.log"))
            .iter()
            .filter(|l| *l == note)
            .count()
    };
    for number in PASSED {
        let note = format!("got {number}");
        let before = noted(&note);
        kill_by_number(a.pid(), number);
        assert!(
            wait_until(10 * SECOND, || noted(&note) > before),
            "signal {number} did not reach the command: {}",
            log_of(&scratch, "a")
        );
        assert!(
            a.child.try_wait().expect("try_wait").is_none(),
            "run exited on signal {number}: {}",
            log_of(&scratch, "a")
        );
    }
    for number in IGNORED {
        kill_by_number(a.pid(), number);
    }
    assert!(
        wait_until(10 * SECOND, || log_of(&scratch, "a")
            .matches("signal ignored")
            .count()
            == IGNORED.len()),
        "{}",
        log_of(&scratch, "a")
    );
    for name in [
        "SIGTRAP", "SIGABRT", "SIGSYS", "SIGXCPU", "SIGXFSZ", "SIGTSTP", "SIGTTIN", "SIGTTOU",
    ] {
        assert!(log_of(&scratch, "a").contains(name), "{name}");
    }
    // Not stopped by SIGTSTP/SIGTTIN/SIGTTOU (its command would run on
    // past a lease nobody renews).
    let state = std::fs::read_to_string(format!("/proc/{}/stat", a.pid())).expect("stat");
    let state = state.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
    assert_ne!(state, Some(Some('T')), "run was stopped");
    assert!(
        log_of(&scratch, "a").contains("SIGRTMAX"),
        "{}",
        log_of(&scratch, "a")
    );
    for number in IGNORED {
        assert_eq!(noted(&format!("got {number}")), 0, "{number} was passed on");
    }
    assert!(
        a.child.try_wait().expect("try_wait").is_none(),
        "run exited"
    );
    assert!(alive(child), "the command was stopped");
    assert_eq!(
        status_json(&scratch.store_url(), "nightly-billing")["leader"]["id"],
        "a"
    );

    let mut b = logged_replica(&scratch, "b", NOTES_EVERY_SIGNAL);
    assert!(wait_until(10 * SECOND, || log_of(&scratch, "b")
        .contains("waiting; election is led")));
    for (sent, number) in PASSED.into_iter().chain(IGNORED).enumerate() {
        kill_by_number(b.pid(), number);
        assert!(
            wait_until(10 * SECOND, || log_of(&scratch, "b")
                .matches("signal ignored")
                .count()
                > sent),
            "signal {number}: {}",
            log_of(&scratch, "b")
        );
    }
    assert!(b.child.try_wait().expect("try_wait").is_none(), "b died");

    a.signal(Signal::SIGTERM);
    assert_eq!(
        a.wait_for_exit(10 * SECOND).expect("a exits").code(),
        Some(0)
    );
    assert!(
        wait_until(10 * SECOND, || runs(&scratch).len() == 2),
        "b did not lead after a"
    );
    b.signal(Signal::SIGTERM);
    assert_eq!(
        b.wait_for_exit(10 * SECOND).expect("b exits").code(),
        Some(0)
    );
}
