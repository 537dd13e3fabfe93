//! The guard between `run` and its command: a SIGKILLed runner hands over
//! at once (its host saw it die), a stopped one never early, and a runner
//! that cannot act still never lets its command outlive the lease.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::harness::{
    Proc, Scratch, StoppedReplica, alive, children_of, leasehold, read_lines, wait_until,
};
use super::run::{grandchildren, runs};

const SECOND: Duration = Duration::from_secs(1);

/// A command that logs `run TOKEN ID PID`, starts a process in a new
/// session (which escapes its process group) and logs `grandchild PID`,
/// then logs `tick ID` every 20 ms until killed. All lines go to one file
/// opened for appending, so its order is the order of the writes.
const TICKING: &str = r#"echo "run $LEASEHOLD_TOKEN $LEASEHOLD_ID $$" >> billing.log
setsid sleep 305 & echo "grandchild $!" >> billing.log
while :; do echo "tick $LEASEHOLD_ID" >> billing.log; sleep 0.02; done"#;

/// `leasehold run` as replica `id` of election `guarded` on `store`, its
/// stderr in `ID.err`.
fn replica(store: &str, scratch: &Scratch, id: &str, ttl: &str) -> Proc {
    let err = File::create(scratch.path(&format!("{id}.err"))).expect("stderr file");
    Proc::spawn(
        leasehold()
            .args(["run", "--election", "guarded", "--ttl", ttl, "--id", id])
            .args(["--store", store, "--", "sh", "-c", TICKING])
            .current_dir(scratch.dir.path())
            .stdout(Stdio::null())
            .stderr(err),
    )
}

fn log_of(scratch: &Scratch, id: &str) -> String {
    std::fs::read_to_string(scratch.path(&format!("{id}.err"))).unwrap_or_default()
}

/// The last `n` lines of billing.log, for a failure's message.
fn last_lines(scratch: &Scratch, n: usize) -> String {
    let lines = read_lines(&scratch.path("billing.log"));
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `a` leads (its command has started its escapee), `b` waits.
fn a_leads_b_waits(store: &str, scratch: &Scratch, ttl: &str) -> (Proc, Proc, i32, i32) {
    let a = replica(store, scratch, "a", ttl);
    assert!(
        wait_until(20 * SECOND, || runs(scratch).len() == 1
            && grandchildren(scratch).len() == 1),
        "a never led: {}",
        log_of(scratch, "a")
    );
    let b = replica(store, scratch, "b", ttl);
    assert!(
        wait_until(20 * SECOND, || log_of(scratch, "b")
            .contains("waiting; election is led")),
        "b never waited: {}",
        log_of(scratch, "b")
    );
    let (_, id, command) = runs(scratch)[0].clone();
    assert_eq!(id, "a");
    (a, b, command, grandchildren(scratch)[0])
}

/// No line of `a`'s command after `b`'s command started: the two never
/// overlapped.
fn assert_no_overlap(scratch: &Scratch) {
    let lines = read_lines(&scratch.path("billing.log"));
    let b_started = lines
        .iter()
        .position(|l| l.starts_with("run ") && l.contains(" b "))
        .expect("b ran");
    let late: Vec<_> = lines[b_started..]
        .iter()
        .filter(|l| *l == "tick a")
        .collect();
    assert!(
        late.is_empty(),
        "a's command wrote {} lines after b's started",
        late.len()
    );
}

/// SIGKILL of the leading runner while its host lives: the guard kills the
/// command's whole tree — the process it started in a new session too —
/// confirms it gone, and releases the grant, so the successor runs long
/// before the 60 s lease could have expired, with a higher token, and
/// never beside the old command.
pub fn sigkill_hands_over_at_once(store: &str, scratch: &Scratch) {
    let (a, _b, command, escapee) = a_leads_b_waits(store, scratch, "60s");
    let killed_at = Instant::now();
    a.signal(Signal::SIGKILL);
    assert!(
        wait_until(30 * SECOND, || runs(scratch).len() == 2),
        "no successor within 30 s of a 60 s lease: the grant was not released; a: {}",
        log_of(scratch, "a")
    );
    let took = killed_at.elapsed();
    assert!(!alive(command), "a's command outlived its runner");
    assert!(
        !alive(escapee),
        "a's escaped grandchild outlived its runner"
    );
    assert_no_overlap(scratch);
    let all = runs(scratch);
    assert_eq!(all[1].1, "b");
    assert!(all[1].0 > all[0].0, "the successor's token must be higher");
    assert!(
        log_of(scratch, "a").contains("released the election for the next candidate"),
        "the guard did not say it released: {}",
        log_of(scratch, "a")
    );
    eprintln!("successor ran {took:?} after the SIGKILL");
}

#[test]
fn sigkill_of_the_runner_hands_over_at_once() {
    let scratch = Scratch::new();
    sigkill_hands_over_at_once(&scratch.store_url(), &scratch);
}

/// The command's whole tree is killed when the command exits by itself:
/// a process it started in a new session does not outlive the term.
#[test]
fn an_escaped_process_dies_when_the_command_exits() {
    let scratch = Scratch::new();
    let out = leasehold()
        .args([
            "run",
            "--election",
            "escape",
            "--store",
            &scratch.store_url(),
        ])
        .args([
            "--",
            "sh",
            "-c",
            "setsid sleep 305 & echo \"grandchild $!\" >> billing.log; exit 3",
        ])
        .current_dir(scratch.dir.path())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(3));
    let escapee = grandchildren(&scratch)[0];
    assert!(!alive(escapee), "the escaped process outlived the term");
}

/// SIGSTOP of the leading runner alone: its command runs on, but its guard
/// kills it at the lease deadline, and the successor — granted only once
/// the lease expired — never runs beside it. Continued, the runner steps
/// down and waits again.
#[test]
fn a_stopped_runner_s_command_is_killed_at_the_deadline() {
    let scratch = Scratch::new();
    let (a, _b, command, _) = a_leads_b_waits(&scratch.store_url(), &scratch, "2s");
    a.signal(Signal::SIGSTOP);
    assert!(
        wait_until(20 * SECOND, || runs(&scratch).len() == 2),
        "no successor"
    );
    assert!(
        !alive(command),
        "a's command outlived its lease\n--- a's log:\n{}\n--- b's log:\n{}\n--- billing.log, last lines:\n{}",
        log_of(&scratch, "a"),
        log_of(&scratch, "b"),
        last_lines(&scratch, 12)
    );
    assert_no_overlap(&scratch);
    assert!(
        log_of(&scratch, "a").contains("the lease deadline passed"),
        "the guard did not say why it killed the command: {}",
        log_of(&scratch, "a")
    );
    assert!(
        !log_of(&scratch, "a").contains("released the election"),
        "a stopped runner's grant was released early"
    );
    a.signal(Signal::SIGCONT);
    assert!(
        wait_until(20 * SECOND, || log_of(&scratch, "a")
            .contains("stepped down; campaigning again")),
        "the continued runner did not step down: {}",
        log_of(&scratch, "a")
    );
    assert_eq!(runs(&scratch).len(), 2, "a led again while b leads");
}

/// SIGSTOP of the whole replica — runner, guard and command: nobody can
/// know it is not dead, so nothing is released early; the successor is
/// granted only when the lease has expired, and the continued replica's
/// command is killed before it runs again.
#[test]
fn a_stopped_replica_is_never_released_early() {
    let scratch = Scratch::new();
    let (a, _b, command, _) = a_leads_b_waits(&scratch.store_url(), &scratch, "3s");
    let stopped = StoppedReplica::stop(a.pid(), command, &scratch.store_url());
    let stopped_at = Instant::now();
    assert!(
        wait_until(20 * SECOND, || runs(&scratch).len() == 2),
        "no successor"
    );
    // The lease (3 s, renewed every second or so) had at least 1 s to run
    // when the replica stopped: a successor granted sooner was granted on
    // a release, which a stopped replica must never get.
    assert!(
        stopped_at.elapsed() >= SECOND,
        "b ran {:?} after a stopped: an early release",
        stopped_at.elapsed()
    );
    stopped.continue_supervisors();
    assert!(
        wait_until(10 * SECOND, || !alive(command)),
        "the continued replica's command was not killed"
    );
    drop(stopped);
    assert_no_overlap(&scratch);
    assert!(!log_of(&scratch, "a").contains("released the election"));
}

/// The guard itself SIGKILLed (here by its own command): `run`, a
/// subreaper too, inherits what is left of the command's tree — a process
/// in a new session included — and kills it before it releases, so the
/// next leader never runs beside it.
#[test]
fn a_killed_guard_leaves_nothing_behind() {
    let scratch = Scratch::new();
    let script = r#"echo "run $LEASEHOLD_TOKEN $LEASEHOLD_ID $$" >> billing.log
setsid sh -c 'while :; do echo "tick $LEASEHOLD_ID" >> billing.log; sleep 0.02; done' &
echo "grandchild $!" >> billing.log
sleep 0.3; kill -9 $PPID; wait"#;
    let run = |id: &str| {
        let err = File::create(scratch.path(&format!("{id}.err"))).expect("stderr file");
        Proc::spawn(
            leasehold()
                .args(["run", "--election", "guardless", "--ttl", "60s", "--id", id])
                .args(["--store", &scratch.store_url(), "--", "sh", "-c", script])
                .current_dir(scratch.dir.path())
                .stdout(Stdio::null())
                .stderr(err),
        )
    };
    let mut a = run("a");
    assert!(wait_until(20 * SECOND, || grandchildren(&scratch).len() == 1));
    let escapee = grandchildren(&scratch)[0];
    assert!(
        a.wait_for_exit(20 * SECOND).is_some(),
        "a did not end its term"
    );
    assert!(!alive(escapee), "the escapee outlived the killed guard");
    assert!(
        log_of(&scratch, "a").contains("the guard process was killed"),
        "{}",
        log_of(&scratch, "a")
    );
    let _b = run("b");
    assert!(wait_until(20 * SECOND, || runs(&scratch).len() == 2));
    assert_no_overlap(&scratch);
}

/// Signals that stop `run` do not stop its guard, which must outlive
/// `run` to kill the command's tree (and, were `run` killed, release its
/// grant once that tree is gone): it ignores them, saying so at debug
/// level, and exits by itself once `run` ended the term.
#[test]
fn the_guard_ignores_signals_that_stop_run_and_says_so() {
    let scratch = Scratch::new();
    let err = File::create(scratch.path("a.err")).expect("stderr file");
    let mut a = Proc::spawn(
        leasehold()
            .args(["-v", "run", "--election", "signalled", "--ttl", "60s"])
            .args(["--store", &scratch.store_url(), "--", "sh", "-c", TICKING])
            .current_dir(scratch.dir.path())
            .stdout(Stdio::null())
            .stderr(err),
    );
    assert!(wait_until(20 * SECOND, || runs(&scratch).len() == 1));
    let guards = children_of(a.pid());
    assert_eq!(guards.len(), 1, "one guard: {guards:?}");
    let guard = nix::unistd::Pid::from_raw(guards[0]);
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        nix::sys::signal::kill(guard, signal).expect("signal the guard");
        let said = format!("the guard ignores {}", signal.as_str());
        assert!(
            wait_until(10 * SECOND, || log_of(&scratch, "a").contains(&said)),
            "{said}: {}",
            log_of(&scratch, "a")
        );
    }
    assert!(alive(guards[0]), "the guard died of a signal meant for run");
    let ticks = read_lines(&scratch.path("billing.log")).len();
    assert!(
        wait_until(10 * SECOND, || read_lines(&scratch.path("billing.log"))
            .len()
            > ticks),
        "the command stopped"
    );
    // `run` stopped: the term ends, and the guard exits by itself.
    a.signal(Signal::SIGTERM);
    assert!(a.wait_for_exit(20 * SECOND).is_some(), "run did not exit");
    assert!(
        wait_until(10 * SECOND, || !alive(guards[0])),
        "the guard outlived the term"
    );
}

/// A stderr nobody reads (a full pipe) never blocks `run` or its guard:
/// SIGTERM still reaches the command, the election is released and `run`
/// exits, long before the 60 s lease could expire.
#[test]
fn a_full_stderr_pipe_blocks_nothing() {
    let scratch = Scratch::new();
    let (unread, full) = nix::unistd::pipe().expect("pipe");
    let script = r#"head -c 200000 /dev/zero >&2 &
echo "run $LEASEHOLD_TOKEN $LEASEHOLD_ID $$" >> billing.log
trap 'exit 0' TERM; while :; do sleep 0.02; done"#;
    let mut a = Proc::spawn(
        leasehold()
            .args([
                "-v",
                "run",
                "--election",
                "full",
                "--ttl",
                "60s",
                "--id",
                "a",
            ])
            .args([
                "--grace",
                "1s",
                "--store",
                &scratch.store_url(),
                "--",
                "sh",
                "-c",
                script,
            ])
            .current_dir(scratch.dir.path())
            .stdout(Stdio::null())
            .stderr(std::process::Stdio::from(full)),
    );
    assert!(wait_until(20 * SECOND, || runs(&scratch).len() == 1));
    // Let the pipe fill up (64 KiB), then some.
    std::thread::sleep(SECOND);
    a.signal(Signal::SIGTERM);
    assert!(
        a.wait_for_exit(20 * SECOND).is_some(),
        "run blocked on its stderr"
    );
    let status = super::harness::status_json(&scratch.store_url(), "full");
    assert!(status["leader"].is_null(), "not released: {status}");
    drop(unread);
}

/// A guard stopped by someone and continued (`run` continues it within a
/// second) acts on the deadlines `run` sent meanwhile, not on the one it
/// knew when it stopped: a healthy leader's command is never killed.
#[test]
fn a_stopped_guard_never_kills_a_healthy_leader() {
    let scratch = Scratch::new();
    let a = replica(&scratch.store_url(), &scratch, "a", "1s");
    assert!(wait_until(20 * SECOND, || runs(&scratch).len() == 1));
    let command = runs(&scratch)[0].2;
    let guard = super::harness::children_of(a.pid())[0];
    for _ in 0..3 {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(guard), Signal::SIGSTOP)
            .unwrap_or_else(|e| panic!("stop the guard: {e}: {}", log_of(&scratch, "a")));
        std::thread::sleep(1500 * Duration::from_millis(1));
    }
    assert!(alive(command), "a healthy leader's command was killed");
    assert!(
        !log_of(&scratch, "a").contains("lease deadline passed"),
        "{}",
        log_of(&scratch, "a")
    );
    assert_eq!(runs(&scratch).len(), 1);
}

/// A command that stops its guard and exits: `run` continues the guard,
/// learns of the exit, releases and exits with the command's status.
#[test]
fn a_command_that_stops_its_guard_still_ends_the_term() {
    let scratch = Scratch::new();
    let mut a = Proc::spawn(
        leasehold()
            .args(["run", "--election", "stopper", "--ttl", "60s"])
            .args([
                "--store",
                &scratch.store_url(),
                "--",
                "sh",
                "-c",
                "kill -STOP $PPID; exit 4",
            ])
            .current_dir(scratch.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let status = a.wait_for_exit(20 * SECOND).expect("run never ended");
    assert_eq!(status.code(), Some(4));
    let status = super::harness::status_json(&scratch.store_url(), "stopper");
    assert!(status["leader"].is_null(), "not released: {status}");
}

/// The guard killed and reaped a stopped runner's command at the deadline;
/// while `run` was stopped, its command's pid went to an unrelated process
/// (forced here through `ns_last_pid`, as root). Continued, `run` must not
/// signal that process as if it were its command's group.
#[test]
fn a_continued_runner_never_signals_a_reused_pid() {
    let scratch = Scratch::new();
    let a = replica(&scratch.store_url(), &scratch, "a", "2s");
    assert!(wait_until(20 * SECOND, || runs(&scratch).len() == 1));
    let command = runs(&scratch)[0].2;
    a.signal(Signal::SIGSTOP);
    assert!(
        wait_until(20 * SECOND, || !std::path::Path::new(&format!(
            "/proc/{command}"
        ))
        .exists()),
        "the guard did not kill and reap the command at the deadline"
    );
    let victim = (0..500)
        .find_map(|_| {
            std::fs::write("/proc/sys/kernel/ns_last_pid", (command - 1).to_string())
                .expect("write ns_last_pid (the test runs as root)");
            let mut child = std::process::Command::new("sleep")
                .arg("200")
                .process_group(0)
                .spawn()
                .expect("spawn");
            if i32::try_from(child.id()) == Ok(command) {
                return Some(child);
            }
            let _ = child.kill();
            let _ = child.wait();
            None
        })
        .expect("could not place a process at the freed pid");
    a.signal(Signal::SIGCONT);
    assert!(
        wait_until(20 * SECOND, || log_of(&scratch, "a")
            .contains("stepped down; campaigning again")),
        "{}",
        log_of(&scratch, "a")
    );
    std::thread::sleep(SECOND);
    let mut victim = victim;
    let ended = victim.try_wait().expect("try_wait");
    assert!(
        ended.is_none(),
        "run signalled an unrelated process that got its command's pid ({ended:?}): {}",
        log_of(&scratch, "a")
    );
    let _ = victim.kill();
    let _ = victim.wait();
}

/// Descriptors `run` inherited reach the command through the guard, at the
/// same numbers — as a socket-activated service's listeners at 3 and up
/// must — and the guard's own descriptors do not.
#[test]
fn inherited_descriptors_reach_the_command_and_the_guards_do_not() {
    let scratch = Scratch::new();
    std::fs::write(scratch.path("three"), "3").expect("write");
    std::fs::write(scratch.path("four"), "4").expect("write");
    let out = std::process::Command::new("sh")
        .args([
            "-c",
            r#"exec 3<three 4<four; exec "$0" run --election fds --store "$1" -- sh -c 'cat 0<&3; cat 0<&4; echo; ls -l /proc/$$/fd; env | grep LEASEHOLD_GUARD'"#,
            env!("CARGO_BIN_EXE_leasehold"),
            &scratch.store_url(),
        ])
        .current_dir(scratch.dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().next(), Some("34"), "{stdout}");
    // Nothing of the guard's — its socket to `run`, the database, its
    // variables — but, on purpose, the descriptor of `run`'s session locks
    // (the SQLite notify file): the command's tree keeps the session alive
    // for the kernel's test.
    for guards in ["socket:", ".db\n", "LEASEHOLD_GUARD"] {
        assert!(!stdout.contains(guards), "{guards}: {stdout}");
    }
    assert!(stdout.contains("-notify"), "{stdout}");
}

/// `run` and its guard SIGKILLed together: what is left of the command's
/// tree escapes (nothing is left to kill it), but on SQLite it still holds
/// `run`'s session locks, so the kernel's test does not hand the election
/// over while it runs; once it is gone, the next replica takes over at
/// once, long before the 60 s lease expires.
#[test]
fn on_sqlite_a_surviving_tree_keeps_the_session_alive() {
    let scratch = Scratch::new();
    let (a, _b, command, escapee) = a_leads_b_waits(&scratch.store_url(), &scratch, "60s");
    let guard = super::harness::children_of(a.pid())[0];
    // At one instant, as a crash would: stopped first, so that neither
    // sees the other die and acts on it (a runner that saw its guard go
    // could still end its command and release before its own SIGKILL).
    let guard = nix::unistd::Pid::from_raw(guard);
    a.signal(Signal::SIGSTOP);
    nix::sys::signal::kill(guard, Signal::SIGSTOP).expect("stop");
    nix::sys::signal::kill(guard, Signal::SIGKILL).expect("kill");
    a.signal(Signal::SIGKILL);
    std::thread::sleep(2 * SECOND);
    assert_eq!(
        runs(&scratch).len(),
        1,
        "the election passed on while the old tree still ran"
    );
    // The escapee (a new session) and the command's background job outlive
    // both; end them.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(escapee), Signal::SIGKILL).expect("kill");
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(command), Signal::SIGKILL);
    assert!(
        wait_until(30 * SECOND, || runs(&scratch).len() == 2),
        "no takeover once the old tree was gone"
    );
}

/// `leasehold __guard` by hand, in any argument shape: one line saying it
/// is internal, exit 2. (It once printed nothing: the line was queued for
/// the stderr thread and the process exited before it was written.)
#[test]
fn the_guard_run_by_hand_says_it_is_internal() {
    let shapes: [&[&str]; 5] = [
        &["__guard"],
        &["__guard", "extra"],
        &["__guard", "--help"],
        &["__guard", "-v", "x", "y"],
        &["-q", "__guard"],
    ];
    for shape in shapes {
        // Many times: a lost line is a race.
        for _ in 0..20 {
            let out = leasehold().args(shape).output().expect("spawn");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{shape:?}: {err}");
            assert!(out.stdout.is_empty(), "{shape:?}");
            assert_eq!(
                err,
                "leasehold: leasehold __guard is internal: it is started by `leasehold run`, \
                 not by hand\n",
                "{shape:?}"
            );
        }
    }
    // With a descriptor that is no socket of `run`'s.
    let out = leasehold()
        .arg("__guard")
        .env("LEASEHOLD_GUARD_FDS", "1")
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
}
