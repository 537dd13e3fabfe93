//! Worked example 2 with real processes: a leader paused (runner and
//! command, SIGSTOP) past its TTL is replaced; when it resumes, the fenced
//! store refuses its stale writes and its runner ends its command.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::harness::{Proc, Scratch, StoppedReplica, alive, leasehold, read_lines, wait_until};

const SECOND: Duration = Duration::from_secs(1);

/// An example binary, built next to the `leasehold` binary by `cargo test`.
pub(super) fn example(name: &str) -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_leasehold"));
    let path = bin
        .parent()
        .expect("target dir")
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} is not built; run `cargo build --examples`",
        path.display()
    );
    path
}

/// (token, accepted) of each write in a writer's log.
fn writes(path: &std::path::Path) -> Vec<(u64, bool)> {
    read_lines(path)
        .iter()
        .filter_map(|l| {
            let (token, status) = l.split_once(' ')?;
            Some((token.parse().ok()?, status == "204"))
        })
        .collect()
}

fn writer_pid(path: &std::path::Path) -> Option<i32> {
    read_lines(path)
        .iter()
        .find_map(|l| l.strip_prefix("pid ")?.parse().ok())
        .map(super::harness::seen)
}

/// Tokens of the writes the store accepted, in the order it accepted them.
fn accepted(path: &std::path::Path) -> Vec<u64> {
    read_lines(path)
        .iter()
        .filter_map(|l| l.strip_prefix("accepted ")?.split(' ').next()?.parse().ok())
        .collect()
}

#[test]
fn worked_example_2_a_paused_leader_is_fenced_off() {
    let scratch = Scratch::new();
    let store_log = scratch.path("store.log");
    let mut server = Proc::spawn(
        Command::new(example("fenced_store"))
            .arg("127.0.0.1:0")
            .arg(scratch.path("fence.db"))
            .arg(&store_log)
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    let mut first = String::new();
    BufReader::new(server.child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("the store says where it listens");
    let addr = first
        .trim()
        .strip_prefix("listening on ")
        .expect("address")
        .to_owned();

    let runner = |id: &str| {
        let log = std::fs::File::create(scratch.path(&format!("runner-{id}.err"))).expect("log");
        Proc::spawn(
            leasehold()
                .args(["run", "--election", "writer", "--ttl", "2s", "--id", id])
                .args(["--store", &scratch.store_url(), "--"])
                .arg(example("fenced_writer"))
                .arg(&addr)
                .arg("object-x")
                .arg(scratch.path(&format!("writer-{id}.log")))
                .stdout(Stdio::null())
                .stderr(log),
        )
    };
    let a = runner("a");
    let a_log = scratch.path("writer-a.log");
    assert!(
        wait_until(10 * SECOND, || writes(&a_log).len() >= 3),
        "a never wrote"
    );
    let b = runner("b");
    let b_log = scratch.path("writer-b.log");
    let a_child = writer_pid(&a_log).expect("a's writer pid");
    let a_token = writes(&a_log)[0].0;

    // A stop-the-world pause of A: its runner, its guard and its command's
    // group (a paused VM stops them all; were the guard running, it would
    // kill the command at the lease deadline).
    let paused = StoppedReplica::stop(a.pid(), a_child, &scratch.store_url());
    assert!(
        wait_until(15 * SECOND, || writes(&b_log)
            .iter()
            .filter(|w| w.1)
            .count()
            >= 3),
        "b never took over"
    );
    let b_token = writes(&b_log)[0].0;
    assert!(b_token > a_token);

    // A's command wakes first and writes with its stale token...
    killpg(Pid::from_raw(a_child), Signal::SIGCONT).expect("resume a's command");
    assert!(
        wait_until(5 * SECOND, || writes(&a_log).last().is_some_and(|w| !w.1)),
        "a's next write was not refused"
    );
    // ...then its runner and guard, whose deadline has long passed: they
    // end the command.
    paused.continue_supervisors();
    assert!(
        wait_until(5 * SECOND, || !alive(a_child)),
        "a's runner left its command running"
    );
    std::thread::sleep(Duration::from_millis(300));

    // What the store accepted: tokens never went back, and nothing of A's
    // landed after B's first write.
    let order = accepted(&store_log);
    assert!(order.windows(2).all(|w| w[0] <= w[1]), "{order:?}");
    let b_first = order
        .iter()
        .position(|&t| t == b_token)
        .expect("b's writes accepted");
    assert!(order[b_first..].iter().all(|&t| t == b_token), "{order:?}");
    assert_eq!(
        writes(&a_log)
            .iter()
            .filter(|w| w.0 == a_token && !w.1)
            .count(),
        1
    );
    let a_err = std::fs::read_to_string(scratch.path("runner-a.err")).expect("runner log");
    assert!(a_err.contains("leadership lost"), "{a_err}");
    // A's runner stays in the pool, waiting.
    assert!(alive(a.pid()));
    drop((a, b));
    let _ = server.child.kill();
}
