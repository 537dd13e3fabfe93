//! Issue 12 ("first contact"): what `observe` and `run` say — a line per
//! change of leader, the store's outages, waiting only when waiting, why a
//! takeover happened, step-downs when they happen, errors in one line.

use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use leasehold_testkit::{PostgresServer, ZooKeeperServer};
use nix::sys::signal::Signal;
use serde_json::Value;

use super::harness::{
    Proc, Scratch, StoppedReplica, children_of, leasehold, status_json, status_json_once_created,
    stderr, wait_until,
};
use super::run::free_port;

const PATIENCE: Duration = Duration::from_secs(20);

/// Spawns `cmd` with its stdout and stderr in `{name}.out` and `{name}.err`
/// of the scratch folder, to be read while it runs.
fn spawn_logged(scratch: &Scratch, name: &str, cmd: &mut Command) -> Proc {
    let out = File::create(scratch.path(&format!("{name}.out"))).expect("stdout file");
    let err = File::create(scratch.path(&format!("{name}.err"))).expect("stderr file");
    Proc::spawn(cmd.stdout(Stdio::from(out)).stderr(Stdio::from(err)))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn runner(scratch: &Scratch, store: &str, id: &str, script: &str) -> Proc {
    spawn_logged(
        scratch,
        id,
        leasehold()
            .args(["run", "--election", "e", "--ttl", "2s", "--id", id])
            .args(["--store", store, "--", "sh", "-c", script]),
    )
}

/// The JSON lines `observe` printed so far (complete lines only).
fn observed(scratch: &Scratch) -> Vec<Value> {
    let out = read(&scratch.path("observe.out"));
    let complete = out.rsplit_once('\n').map_or("", |(lines, _)| lines);
    complete
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect()
}

/// On PostgreSQL (whose watch re-read the holder at each of its expiries
/// and published every renewal): `observe` prints one line while one leader
/// renews, a waiting runner says once who leads; while the server is down,
/// `observe` warns and prints that the leader is unknown, then the true
/// state once it is back; the leader's step-down is logged before its
/// release attempt, which fails.
#[test]
fn observe_and_run_on_postgres_say_each_change_once_and_report_an_outage() {
    let mut server = PostgresServer::start();
    let store = server.url();
    let scratch = Scratch::new();
    let _a = runner(&scratch, &store, "a", "exec sleep 600");
    assert!(
        wait_until(PATIENCE, || status_json_once_created(&store, "e")["leader"]
            ["id"]
            == "a"),
        "a does not lead: {}",
        read(&scratch.path("a.err"))
    );
    let _b = runner(&scratch, &store, "b", "exec sleep 600");
    // b waits in line before `observe` starts: a change of the line is a
    // change of `observe`'s object, and would print a second line.
    assert!(
        wait_until(
            PATIENCE,
            || status_json_once_created(&store, "e")["candidates"][0]["id"] == "b"
        ),
        "b does not wait: {}",
        read(&scratch.path("b.err"))
    );
    let _observe = spawn_logged(
        &scratch,
        "observe",
        leasehold().args(["observe", "--election", "e", "--store", &store]),
    );
    assert!(wait_until(PATIENCE, || !observed(&scratch).is_empty()));
    // Three TTLs of renewals (and of the watches' re-reads at each expiry).
    std::thread::sleep(Duration::from_secs(6));
    let lines = observed(&scratch);
    assert_eq!(lines.len(), 1, "a line per renewal: {lines:?}");
    assert_eq!(lines[0]["leader"]["id"], "a", "{lines:?}");
    assert!(lines[0].get("unknown").is_none(), "{lines:?}");
    let b_log = read(&scratch.path("b.err"));
    assert_eq!(
        b_log.matches("waiting; election is led").count(),
        1,
        "b logs its wait once: {b_log}"
    );

    server.stop();
    assert!(
        wait_until(PATIENCE, || observed(&scratch)
            .iter()
            .any(|l| l["unknown"] == true)),
        "no line saying the leader is unknown: {:?}",
        observed(&scratch)
    );
    let unknown = observed(&scratch)
        .into_iter()
        .find(|l| l["unknown"] == true)
        .expect("just seen");
    assert_eq!(unknown["election"], "e", "{unknown}");
    assert!(unknown["leader"].is_null(), "{unknown}");
    assert!(
        unknown["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{unknown}"
    );
    assert!(
        wait_until(PATIENCE, || {
            let warned = read(&scratch.path("observe.err"));
            warned.contains("WARN") && warned.contains("the leader is unknown")
        }),
        "{}",
        read(&scratch.path("observe.err"))
    );
    // a steps down at its deadline, then tries to release (and cannot).
    assert!(
        wait_until(PATIENCE, || read(&scratch.path("a.err"))
            .contains("could not release the election")),
        "{}",
        read(&scratch.path("a.err"))
    );
    let a_log = read(&scratch.path("a.err"));
    let stepped = a_log.find("stepped down").expect("a logs its step-down");
    let release = a_log.find("could not release").expect("just seen");
    assert!(
        stepped < release,
        "the step-down is logged after the release attempt: {a_log}"
    );

    server.start_again();
    assert!(
        wait_until(PATIENCE, || {
            let lines = observed(&scratch);
            let at = lines.iter().position(|l| l["unknown"] == true);
            at.is_some_and(|at| lines[at + 1..].iter().any(|l| l.get("unknown").is_none()))
        }),
        "no line with the state after the outage: {:?}",
        observed(&scratch)
    );
    // Logs go through a writer thread: the line may follow the stdout one.
    assert!(
        wait_until(PATIENCE, || read(&scratch.path("observe.err"))
            .contains("the store answers again")),
        "{}",
        read(&scratch.path("observe.err"))
    );
}

/// An uncontested start does not log a wait; a waiting runner logs its wait
/// once; a takeover after the leader crashed says so, naming it (on SQLite,
/// that its process is gone: the kernel showed it, no lease had to
/// expire), and a planned handover does not.
#[test]
fn run_logs_waits_once_and_says_when_it_takes_over_an_expired_lease() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    let out = leasehold()
        .args(["run", "--election", "e", "--id", "solo", "--store", &store])
        .args(["--", "true"])
        .output()
        .expect("spawn");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("waiting"), "{}", stderr(&out));

    let a = runner(&scratch, &store, "a", "exec sleep 600");
    assert!(wait_until(PATIENCE, || status_json(&store, "e")["leader"]
        ["id"]
        == "a"));
    let mut b = runner(&scratch, &store, "b", "exit 0");
    assert!(wait_until(PATIENCE, || read(&scratch.path("b.err"))
        .contains("waiting; election is led")));
    // A few renewals of a's lease: still one line.
    std::thread::sleep(Duration::from_secs(3));
    // Paused as a whole (a SIGKILLed runner's guard would release at once):
    // its lease expires.
    let guard = children_of(a.pid())[0];
    let paused = StoppedReplica::stop(a.pid(), children_of(guard)[0], &store);
    assert!(b.wait_for_exit(PATIENCE).is_some_and(|s| s.success()));
    drop(a);
    drop(paused);
    let b_log = read(&scratch.path("b.err"));
    assert_eq!(
        b_log.matches("waiting; election is led").count(),
        1,
        "{b_log}"
    );
    // A stopped replica keeps its session's lock: never taken for dead.
    let expired = b_log
        .lines()
        .find(|l| l.contains("lease expired"))
        .unwrap_or_else(|| panic!("the takeover does not say a's lease expired: {b_log}"));
    assert!(expired.contains("expired_leader=a"), "{expired}");

    // A planned handover: no lease expired.
    let c = runner(&scratch, &store, "c", "exec sleep 600");
    assert!(wait_until(PATIENCE, || status_json(&store, "e")["leader"]
        ["id"]
        == "c"));
    let mut d = runner(&scratch, &store, "d", "exit 0");
    assert!(wait_until(PATIENCE, || read(&scratch.path("d.err"))
        .contains("waiting; election is led")));
    c.signal(Signal::SIGTERM);
    assert!(d.wait_for_exit(PATIENCE).is_some_and(|s| s.success()));
    let d_log = read(&scratch.path("d.err"));
    assert!(d_log.contains("became leader"), "{d_log}");
    assert!(!d_log.contains("the previous leader"), "{d_log}");
}

/// A store that cannot be opened: one line naming the cause, without the
/// path three times, SQLite's error codes or Rust debug output.
#[test]
fn store_errors_are_one_line_naming_the_cause() {
    let fails = |command: &str, store: &str| {
        let out = leasehold()
            .args([command, "--election", "e", "--store", store])
            .output()
            .expect("spawn");
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        for noise in [
            "Error code",
            "Os {",
            "kind:",
            "store unavailable: store unavailable",
        ] {
            assert!(!err.contains(noise), "{noise}: {err}");
        }
        err
    };
    let status = |store: &str| fails("status", store);
    // Opening to campaign creates the file; reading does not (issue 13).
    let err = fails("campaign", "sqlite:/nonexistent-leasehold-dir/sub/x.db");
    assert!(
        err.contains("directory /nonexistent-leasehold-dir/sub does not exist"),
        "{err}"
    );
    assert_eq!(err.matches("x.db").count(), 1, "{err}");
    let err = status("sqlite:/nonexistent-leasehold-dir/sub/x.db");
    assert!(
        err.contains("no leasehold store at /nonexistent-leasehold-dir/sub/x.db: directory /nonexistent-leasehold-dir/sub does not exist"),
        "{err}"
    );
    assert_eq!(err.matches("x.db").count(), 2, "{err}");
    let err = fails("campaign", "sqlite:/proc/leasehold-test.db");
    assert!(
        err.contains("cannot create /proc/leasehold-test.db"),
        "{err}"
    );
    assert_eq!(err.matches("leasehold-test.db").count(), 2, "{err}");

    let port = free_port();
    let err = status(&format!(
        "postgresql://postgres:hunter2@127.0.0.1:{port}/postgres"
    ));
    assert!(err.contains("Connection refused"), "{err}");
    assert_eq!(
        err.matches("error connecting to server").count(),
        1,
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    let err = status(&format!("zk://127.0.0.1:{port}"));
    assert_eq!(err.matches("no available hosts").count(), 1, "{err}");
    let err = status(&format!("etcd://127.0.0.1:{port}"));
    assert!(err.contains("Connection refused"), "{err}");
    for noise in ["status:", "ConnectError", "tonic", "Unavailable"] {
        assert!(!err.contains(noise), "{noise}: {err}");
    }
}

/// On ZooKeeper: the negotiated TTL is logged once.
#[test]
fn the_negotiated_ttl_is_logged_once_on_zookeeper() {
    let server = ZooKeeperServer::start();
    let out = leasehold()
        .args(["run", "--election", "e", "--ttl", "90s"])
        .args(["--store", &server.url("/ttl"), "--", "true"])
        .output()
        .expect("spawn");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let mentions = err
        .lines()
        .filter(|l| {
            l.contains("negotiated")
                || l.contains("granted a different TTL")
                || l.contains("the store granted less")
        })
        .count();
    // Once: run's first line, which states the TTL in use and why.
    assert_eq!(mentions, 1, "{err}");
    assert!(
        err.lines()
            .any(|l| l.contains("lease: TTL") && l.contains("the store granted less")),
        "{err}"
    );
}
