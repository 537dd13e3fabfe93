//! Planned moves with real processes: `leasehold transfer`, `run
//! --priority`, and the line `status` shows.

use std::process::Stdio;
use std::time::Duration;

use super::harness::{Proc, Scratch, leasehold, read_lines, status_json, stderr, wait_until};

const SECOND: Duration = Duration::from_secs(1);
const ELECTION: &str = "planned";

/// A command that logs `run TOKEN ID` when it starts and `stopped TOKEN`
/// when SIGTERM stops it, to moves.log (appends from one host keep their
/// order, so the log shows whether two commands ever ran at once).
const WORKER: &str = r#"trap 'echo "stopped $LEASEHOLD_TOKEN" >> moves.log; exit 0' TERM
echo "run $LEASEHOLD_TOKEN $LEASEHOLD_ID" >> moves.log
while :; do sleep 0.05; done"#;

fn replica(store: &str, scratch: &Scratch, id: &str, extra: &[&str]) -> Proc {
    Proc::spawn(
        leasehold()
            .args(["run", "--election", ELECTION, "--ttl", "30s", "--id", id])
            .args(["--store", store])
            .args(extra)
            .args(["--", "sh", "-c", WORKER])
            .current_dir(scratch.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

/// `(token, id)` of every command start, in order.
fn runs(scratch: &Scratch) -> Vec<(u64, String)> {
    read_lines(&scratch.path("moves.log"))
        .iter()
        .filter_map(|l| {
            let (token, id) = l.strip_prefix("run ")?.split_once(' ')?;
            Some((token.parse().ok()?, id.to_owned()))
        })
        .collect()
}

/// Every command stopped before the next one started, and tokens grew.
fn assert_one_at_a_time(scratch: &Scratch) {
    let log = read_lines(&scratch.path("moves.log"));
    let mut running: Option<u64> = None;
    let mut last = 0;
    for line in &log {
        if let Some(rest) = line.strip_prefix("run ") {
            let token: u64 = rest
                .split(' ')
                .next()
                .and_then(|t| t.parse().ok())
                .expect("token");
            assert!(running.is_none(), "two commands ran at once: {log:?}");
            assert!(token > last, "tokens must increase: {log:?}");
            (running, last) = (Some(token), token);
        } else if let Some(token) = line.strip_prefix("stopped ") {
            assert_eq!(
                running.map(|t| t.to_string()).as_deref(),
                Some(token),
                "{log:?}"
            );
            running = None;
        }
    }
}

fn waiting_ids(store: &str) -> Vec<(String, i64)> {
    status_json(store, ELECTION)["candidates"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|w| {
                    (
                        w["id"].as_str().expect("id").to_owned(),
                        w["priority"].as_i64().expect("priority"),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn transfer(store: &str, to: Option<&str>) -> std::process::Output {
    let mut cmd = leasehold();
    cmd.args(["transfer", "--election", ELECTION, "--store", store]);
    if let Some(to) = to {
        cmd.args(["--to", to]);
    }
    cmd.output().expect("spawn transfer")
}

#[test]
fn transfer_moves_the_command_to_the_named_replica_one_at_a_time() {
    let scratch = Scratch::new();
    transfer_to_the_named_replica(&scratch.store_url(), &scratch);
}

pub fn transfer_to_the_named_replica(store: &str, scratch: &Scratch) {
    let _a = replica(store, scratch, "a", &[]);
    assert!(wait_until(10 * SECOND, || runs(scratch).len() == 1));
    let _b = replica(store, scratch, "b", &[]);
    assert!(wait_until(10 * SECOND, || waiting_ids(store).len() == 1));
    let _c = replica(store, scratch, "c", &[]);
    assert!(wait_until(10 * SECOND, || waiting_ids(store).len() == 2));
    assert_eq!(
        waiting_ids(store),
        [("b".to_owned(), 0), ("c".to_owned(), 0)],
        "status lists the line in grant order"
    );
    let out = transfer(store, Some("c"));
    assert!(out.status.success(), "transfer failed: {}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("c leads now"), "{said}");
    assert!(wait_until(10 * SECOND, || runs(scratch).len() == 2));
    assert_eq!(
        runs(scratch)[1].1,
        "c",
        "the named replica must take over: {said} {:?}",
        read_lines(&scratch.path("moves.log"))
    );
    // The old leader waits in line again, behind b.
    assert!(wait_until(10 * SECOND, || waiting_ids(store)
        == [("b".to_owned(), 0), ("a".to_owned(), 0)]));
    // Without --to, the first in line.
    let out = transfer(store, None);
    assert!(out.status.success(), "transfer failed: {}", stderr(&out));
    assert!(wait_until(10 * SECOND, || runs(scratch).len() == 3));
    assert_eq!(runs(scratch)[2].1, "b");
    assert_one_at_a_time(scratch);
}

/// `transfer --to b` while b's `leasehold run` is stopped (SIGSTOP) as it
/// waits first in line, its session still alive: on etcd and ZooKeeper
/// the store grants b the moment the leader releases (b's key is next),
/// but b never takes the election up and runs nothing. `transfer` must
/// not say that b leads: it exits 1 after its `--timeout`, naming b as
/// granted without taking over.
pub fn a_transfer_to_a_stopped_replica_fails_after_its_timeout(store: &str, scratch: &Scratch) {
    let _a = replica(store, scratch, "a", &[]);
    assert!(wait_until(10 * SECOND, || runs(scratch).len() == 1));
    let b = replica(store, scratch, "b", &[]);
    assert!(wait_until(10 * SECOND, || waiting_ids(store).len() == 1));
    // First in line, b asks the store right after it joined the line.
    std::thread::sleep(Duration::from_millis(500));
    b.signal(nix::sys::signal::Signal::SIGSTOP);
    let asked = std::time::Instant::now();
    let out = leasehold()
        .args(["transfer", "--election", ELECTION, "--store", store])
        .args(["--to", "b", "--timeout", "2s"])
        .output()
        .expect("spawn transfer");
    let (said, err) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert_eq!(
        out.status.code(),
        Some(1),
        "a transfer to a stopped replica succeeded: {said} {err}"
    );
    assert!(asked.elapsed() >= 2 * SECOND, "{err}");
    assert!(!said.contains("leads now"), "{said}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("b was granted") && err.contains("did not take it up"),
        "{err}"
    );
    assert_eq!(runs(scratch).len(), 1, "no command may run on b's grant");
    b.signal(nix::sys::signal::Signal::SIGKILL);
}

/// A transfer to a replica stopped (SIGSTOP) in line times out on SQLite:
/// the leader lets go, and the stopped replica takes nothing up. `transfer` then
/// says the old leader went back into the line only when the line shows
/// it there: not when its `run` was stopped by SIGTERM during the
/// handover and exited.
#[test]
fn a_timed_out_transfer_says_whether_the_old_leader_is_back_in_line() {
    use nix::sys::signal::Signal;
    for sigterm in [false, true] {
        let scratch = Scratch::new();
        let store = scratch.store_url();
        let mut a = replica(&store, &scratch, "a", &[]);
        assert!(wait_until(10 * SECOND, || runs(&scratch).len() == 1));
        let b = replica(&store, &scratch, "b", &[]);
        assert!(wait_until(10 * SECOND, || waiting_ids(&store).len() == 1));
        std::thread::sleep(Duration::from_millis(500));
        b.signal(Signal::SIGSTOP);
        let transfer = leasehold()
            .args(["transfer", "--election", ELECTION, "--store", &store])
            .args(["--to", "b", "--timeout", "3s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn transfer");
        if sigterm {
            // The handover has begun once a's command was stopped.
            assert!(wait_until(10 * SECOND, || read_lines(
                &scratch.path("moves.log")
            )
            .iter()
            .any(|l| l.starts_with("stopped "))));
            a.signal(Signal::SIGTERM);
            assert!(a.wait_for_exit(10 * SECOND).is_some(), "a did not exit");
        }
        let out = transfer.wait_with_output().expect("transfer");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{sigterm}: {err}");
        assert!(err.contains("within 3s"), "{err}");
        let (said, not_said) = match sigterm {
            false => ("(a went back into the line)", "not in the line"),
            true => ("(a is not in the line: its replica has exited", "went back"),
        };
        assert!(err.contains(said) && !err.contains(not_said), "{err}");
        b.signal(Signal::SIGKILL);
    }
}

#[test]
fn a_transfer_that_cannot_happen_says_why_and_changes_nothing() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    // No leader yet (the store does not even exist): nothing to hand over,
    // and no store is made at that path.
    let out = transfer(&store, None);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        !scratch.path("leasehold.db").exists() && !scratch.path("leasehold.db-notify").exists(),
        "a refused transfer created a store"
    );
    let _a = replica(&store, &scratch, "a", &[]);
    assert!(wait_until(10 * SECOND, || runs(&scratch).len() == 1));
    let out = transfer(&store, None);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("nobody is waiting"), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    let _b = replica(&store, &scratch, "b", &[]);
    assert!(wait_until(10 * SECOND, || waiting_ids(&store).len() == 1));
    for to in ["ghost", "a"] {
        let out = transfer(&store, Some(to));
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains(to), "{err}");
        assert!(out.stdout.is_empty());
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        runs(&scratch).len(),
        1,
        "a refused transfer changed the leader"
    );
    assert_eq!(status_json(&store, ELECTION)["leader"]["id"], "a");
}

#[test]
fn a_higher_priority_replica_takes_over_gracefully_after_settling() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    let _low = replica(&store, &scratch, "low", &["--preempt-after", "300ms"]);
    assert!(wait_until(10 * SECOND, || runs(&scratch).len() == 1));
    let _high = replica(&store, &scratch, "high", &["--priority", "5"]);
    assert!(
        wait_until(10 * SECOND, || runs(&scratch).len() == 2),
        "the higher priority never took over"
    );
    assert_eq!(runs(&scratch)[1].1, "high");
    assert!(wait_until(10 * SECOND, || waiting_ids(&store)
        == [("low".to_owned(), 0)]));
    // An equal priority never preempts.
    let _peer = replica(&store, &scratch, "peer", &["--priority", "5"]);
    assert!(wait_until(10 * SECOND, || waiting_ids(&store).len() == 2));
    assert_eq!(
        waiting_ids(&store),
        [("peer".to_owned(), 5), ("low".to_owned(), 0)],
        "the higher priority waits ahead"
    );
    std::thread::sleep(2 * SECOND);
    assert_eq!(runs(&scratch).len(), 2, "an equal priority preempted");
    assert_one_at_a_time(&scratch);
    let log = read_lines(&scratch.path("moves.log"));
    assert!(
        log.contains(&format!("stopped {}", runs(&scratch)[0].0)),
        "{log:?}"
    );
}

/// On SQLite the kernel tells that a waiting replica's process died: a
/// replica killed in line leaves it at once, not at its 30 s TTL, so it
/// neither holds up the next handover nor, with a higher priority, makes
/// the leader hand over to a dead replica.
#[test]
fn a_replica_killed_while_it_waits_leaves_the_line_at_once() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    let a = replica(&store, &scratch, "a", &["--preempt-after", "3s"]);
    assert!(wait_until(10 * SECOND, || runs(&scratch).len() == 1));
    let b = replica(&store, &scratch, "b", &[]);
    assert!(wait_until(10 * SECOND, || waiting_ids(&store).len() == 1));
    let _c = replica(&store, &scratch, "c", &[]);
    assert!(wait_until(10 * SECOND, || waiting_ids(&store).len() == 2));
    b.signal(nix::sys::signal::Signal::SIGKILL);
    assert!(
        wait_until(10 * SECOND, || waiting_ids(&store) == [("c".to_owned(), 0)]),
        "a killed replica must leave the line before its TTL: {:?}",
        waiting_ids(&store)
    );
    // A higher priority that dies before the leader's --preempt-after
    // passed is never handed the election.
    let x = replica(&store, &scratch, "x", &["--priority", "9"]);
    assert!(wait_until(10 * SECOND, || waiting_ids(&store).len() == 2));
    x.signal(nix::sys::signal::Signal::SIGKILL);
    assert!(wait_until(10 * SECOND, || waiting_ids(&store) == [("c".to_owned(), 0)]));
    std::thread::sleep(4 * SECOND);
    assert_eq!(
        status_json(&store, ELECTION)["leader"]["id"],
        "a",
        "the leader handed over to a dead replica"
    );
    assert_eq!(runs(&scratch).len(), 1);
    // The next handover goes to c at once.
    a.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(
        wait_until(10 * SECOND, || runs(&scratch).len() == 2),
        "c must take over well before the killed replicas' TTL"
    );
    assert_eq!(runs(&scratch)[1].1, "c");
    assert_one_at_a_time(&scratch);
}

#[test]
fn planned_move_flags_are_checked_and_explained() {
    let out = leasehold()
        .args(["run", "--election", "e", "--priority", "high", "--", "true"])
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let help = leasehold().args(["run", "--help"]).output().expect("spawn");
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in ["--priority", "--preempt-after", "--lock-delay"] {
        assert!(help.contains(flag), "{flag} missing from run --help");
    }
    let help = leasehold()
        .args(["transfer", "--help"])
        .output()
        .expect("spawn");
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in ["--to", "--timeout", "--election", "--store"] {
        assert!(help.contains(flag), "{flag} missing from transfer --help");
    }
}

/// In another recipe's layout the recipe's order is the only line: what
/// needs leasehold's notes is refused up front, in one line, exit 2,
/// before any store is reached (the URLs name a port nothing listens on).
#[test]
fn recipe_layouts_refuse_what_their_recipe_cannot_honour() {
    let port = leasehold_testkit::free_port();
    let etcd = format!("etcd://127.0.0.1:{port}/svc?layout=concurrency");
    let zk = format!("zk://127.0.0.1:{port}/svc?layout=curator");
    let kazoo = format!("zk://127.0.0.1:{port}?layout=kazoo");
    let cases: [(&[&str], &str); 8] = [
        (&["run", "--store", &etcd, "--priority", "5"], "--priority"),
        (
            &["run", "--store", &zk, "--lock-delay", "2s"],
            "--lock-delay",
        ),
        (
            &["run", "--store", &kazoo, "--preempt-after", "1s"],
            "--preempt-after",
        ),
        (&["run", "--store", &etcd, "--shards", "4"], "--shards"),
        (&["run", "--store", &zk, "--slots", "2"], "--slots"),
        (&["transfer", "--store", &etcd], "transfer"),
        (&["transfer", "--store", &kazoo], "transfer"),
        (&["list", "--store", &zk], "list"),
    ];
    for (args, named) in cases {
        let mut cmd = leasehold();
        cmd.args(args);
        if args[0] != "list" {
            cmd.args(["--election", "jobs"]);
        }
        if args[0] == "run" {
            cmd.args(["--", "true"]);
        }
        let out = cmd.output().expect("spawn");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains(named) && err.contains("own layout"),
            "{args:?} must name {named} and why: {err}"
        );
    }
    for (url, wrong) in [
        (format!("etcd://127.0.0.1:{port}?layout=curator"), "curator"),
        (
            format!("zk://127.0.0.1:{port}?layout=concurrency"),
            "concurrency",
        ),
        (format!("zk://127.0.0.1:{port}?layout="), "\"\""),
    ] {
        let out = leasehold()
            .args(["status", "--election", "jobs", "--store", &url])
            .output()
            .expect("spawn");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{url}: {err}");
        assert!(
            err.contains("layout") && err.contains(wrong),
            "{url}: {err}"
        );
    }
    // An election no recipe's path can be: refused before anything
    // connects (nothing listens on the port), by every command that takes
    // an election.
    let rootless = format!("zk://127.0.0.1:{port}?layout=curator");
    for (election, says) in [
        ("a//b", "no ZooKeeper path"),
        ("a/../b", "no ZooKeeper path"),
        ("zookeeper/quota", "/zookeeper"),
    ] {
        for command in [
            &["status"][..],
            &["observe"],
            &["campaign"],
            &["run", "--", "true"],
        ] {
            let out = leasehold()
                .args([command[0], "--store", &rootless, "--election", election])
                .args(&command[1..])
                .output()
                .expect("spawn");
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{command:?} {election}: {err}");
            assert_eq!(
                err.trim_end().lines().count(),
                1,
                "{command:?} {election}: {err}"
            );
            assert!(
                err.contains("invalid election name") && err.contains(says),
                "{command:?} {election}: {err}"
            );
        }
    }
}
