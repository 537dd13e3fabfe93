//! Issue 13 on the SQLite store, with the real binary: leasehold writes no
//! file it did not create, a store that changes under a running leader
//! stops it before anyone else leads, and reading a store creates nothing.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::harness::{Proc, Scratch, alive, leasehold, read_lines, wait_until};
use super::run::{grandchildren, runs};

const PATIENCE: Duration = Duration::from_secs(30);

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// Runs `cmd` to its end (failing the test if it hangs); its exit code and
/// stderr.
fn finish(scratch: &Scratch, name: &str, cmd: &mut Command) -> (Option<i32>, String) {
    let err_path = scratch.path(&format!("{name}.err"));
    let err = File::create(&err_path).expect("stderr file");
    let mut proc = Proc::spawn(cmd.stdout(Stdio::null()).stderr(err));
    let status = proc
        .wait_for_exit(PATIENCE)
        .unwrap_or_else(|| panic!("{name} hung"));
    (
        status.code(),
        std::fs::read_to_string(&err_path).unwrap_or_default(),
    )
}

/// A refusal: exit 1 and one line on stderr containing `needle`.
fn assert_refused(code: Option<i32>, err: &str, needle: &str) {
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.contains(needle), "{needle:?} not in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `campaign` meets a `<db>-notify` that leasehold did not create: someone's
/// file, a symbolic link to one, a FIFO. Each is refused before anything is
/// written, in one line that says why, and left as it was (the FIFO used to
/// hang `campaign` forever, the others had their first byte overwritten).
/// `status`, `list` and `observe` refuse the FIFO too.
#[test]
fn a_notify_file_leasehold_did_not_create_is_refused_and_left_as_it_was() {
    let scratch = Scratch::new();
    let db = scratch.path("leasehold.db");
    let notify = sibling(&db, "-notify");
    let target = scratch.path("target.txt");
    let campaign = |name: &str| {
        finish(
            &scratch,
            name,
            leasehold()
                .args(["campaign", "--election", "e"])
                .args(["--store", &scratch.store_url()]),
        )
    };

    std::fs::write(&notify, "someone's data\n").expect("write");
    let (code, err) = campaign("file");
    assert_refused(code, &err, "leasehold.db-notify holds other data");
    assert_eq!(
        std::fs::read_to_string(&notify).expect("read"),
        "someone's data\n"
    );
    std::fs::remove_file(&notify).expect("remove");

    std::fs::write(&target, "the target's data\n").expect("write");
    std::os::unix::fs::symlink(&target, &notify).expect("symlink");
    let (code, err) = campaign("symlink");
    assert_refused(code, &err, "leasehold.db-notify is a symbolic link");
    assert_eq!(
        std::fs::read_to_string(&target).expect("read"),
        "the target's data\n"
    );
    std::fs::remove_file(&notify).expect("remove");

    nix::unistd::mkfifo(&notify, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let (code, err) = campaign("fifo");
    assert_refused(code, &err, "leasehold.db-notify is a FIFO");
    std::fs::remove_file(&notify).expect("remove");

    // Nothing of leasehold's was created next to them.
    assert!(!db.exists(), "the database was created");
    let (code, err) = campaign("own");
    assert_eq!(code, Some(0), "its own notify file is fine: {err}");

    // Readers, which take no lock, refuse a FIFO in its place too (before:
    // they waited on it forever).
    std::fs::remove_file(&notify).expect("remove");
    nix::unistd::mkfifo(&notify, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    for args in [
        &["status", "--election", "e"][..],
        &["list"],
        &["observe", "--election", "e"],
    ] {
        let (code, err) = finish(
            &scratch,
            &format!("read-{}", args[0]),
            leasehold()
                .args(args)
                .args(["--store", &scratch.store_url()]),
        );
        assert_refused(code, &err, "leasehold.db-notify is a FIFO");
    }
}

/// `run` for `election` with a command that first records any process of
/// `watch` (pids) still alive as `OVERLAP`, then appends `run TOKEN ID PID`
/// and a grandchild's pid to billing.log and works until stopped.
fn replica(scratch: &Scratch, id: &str, watch: &str) -> Proc {
    replica_at(scratch, &scratch.store_url(), id, watch)
}

/// [`replica`] on the store `store`.
fn replica_at(scratch: &Scratch, store: &str, id: &str, watch: &str) -> Proc {
    let script = r#"for p in $WATCH; do
  state=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -c1)
  case "$state" in ''|Z|X) ;; *) echo "OVERLAP $p $state" >> billing.log ;; esac
done
echo "run $LEASEHOLD_TOKEN $LEASEHOLD_ID $$" >> billing.log
sleep 600 & echo "grandchild $!" >> billing.log
wait"#;
    let err = File::create(scratch.path(&format!("{id}.err"))).expect("stderr file");
    Proc::spawn(
        leasehold()
            .args(["run", "--election", "nightly-billing", "--ttl", "3s"])
            .args(["--id", id, "--store", store, "--"])
            .args(["sh", "-c", script])
            .env("WATCH", watch)
            .current_dir(scratch.dir.path())
            .stdout(Stdio::null())
            .stderr(err),
    )
}

fn overlaps(scratch: &Scratch) -> Vec<String> {
    read_lines(&scratch.path("billing.log"))
        .into_iter()
        .filter(|l| l.starts_with("OVERLAP"))
        .collect()
}

/// The leader `a` runs; returns its command's pid and grandchild's.
fn leading(scratch: &Scratch) -> (Proc, i32, i32) {
    leading_at(scratch, &scratch.store_url())
}

/// [`leading`] on the store `store`.
fn leading_at(scratch: &Scratch, store: &str) -> (Proc, i32, i32) {
    let a = replica_at(scratch, store, "a", "");
    assert!(
        wait_until(PATIENCE, || runs(scratch).len() == 1
            && grandchildren(scratch).len() == 1),
        "a does not lead: {}",
        std::fs::read_to_string(scratch.path("a.err")).unwrap_or_default()
    );
    let (_, _, child) = runs(scratch)[0].clone();
    (a, child, grandchildren(scratch)[0])
}

/// The database (with its -wal and -shm) deleted under a running leader,
/// and another replica started at once: the first leader's command is
/// stopped, its runner exits saying why, and only then does the second
/// replica's command run — on a new file, so with token 1 again. The two
/// commands never run at once (before: both ran, both with token 1, the
/// first renewing an unlinked file).
#[test]
fn a_deleted_store_stops_its_leader_before_another_replica_runs() {
    let scratch = Scratch::new();
    let (mut a, a_child, a_grandchild) = leading(&scratch);
    let db = scratch.path("leasehold.db");
    for suffix in ["", "-wal", "-shm"] {
        std::fs::remove_file(sibling(&db, suffix)).expect("remove");
    }
    let b = replica(&scratch, "b", &format!("{a_child} {a_grandchild}"));
    assert!(
        wait_until(PATIENCE, || runs(&scratch).len() == 2),
        "b never ran: {}",
        std::fs::read_to_string(scratch.path("b.err")).unwrap_or_default()
    );
    assert_eq!(
        overlaps(&scratch),
        Vec::<String>::new(),
        "two leaders at once"
    );
    assert!(!alive(a_child) && !alive(a_grandchild));
    let status = a.wait_for_exit(PATIENCE).expect("a exits");
    assert_eq!(status.code(), Some(1));
    let a_err = std::fs::read_to_string(scratch.path("a.err")).unwrap_or_default();
    // Whichever sees it first: its store handle (leadership lost), its
    // watch of the path, or its guard's.
    assert!(
        a_err.contains("leadership lost")
            || a_err.contains("no longer at its path; killing the command")
            || a_err.contains(
                "the guard killed the command: the store's database file is no longer at its path"
            ),
        "{a_err}"
    );
    // "(it was deleted or moved away)", or "(another file is there now)"
    // if b created its file first.
    assert!(
        a_err.contains("is no longer the database file this process opened"),
        "{a_err}"
    );
    let all = runs(&scratch);
    assert_eq!(all[1].1, "b");
    assert_eq!(all[1].0, 1, "a new file starts tokens again from 1");
    drop(b);
}

/// The database deleted with its `-notify` (all that tells a replica of
/// the leader) while the leader's runner is stopped (SIGSTOP), and another
/// replica started at once: the first leader's guard, which runs on, kills
/// its command as soon as the file is gone from its path, before the
/// second replica's command runs (before: both commands ran until the
/// first one's lease deadline, the new one with token 1).
#[test]
fn a_store_deleted_under_a_stopped_leader_stops_its_command_before_another_runs() {
    let scratch = Scratch::new();
    let a_err = under_a_stopped_leader(&scratch, || {
        let db = scratch.path("leasehold.db");
        for suffix in ["", "-wal", "-shm", "-notify"] {
            std::fs::remove_file(sibling(&db, suffix)).expect("remove");
        }
    });
    assert!(
        a_err.contains("no longer at its path"),
        "the guard said nothing: {a_err}"
    );
}

/// A folder further up than the store's moved away (which inotify on the
/// store's folder does not see) while the leader's runner is stopped, and
/// a new folder made at its place, where another replica creates a new
/// database at once: the first leader's guard kills its command before the
/// new replica's command runs (before: the new file was used at once, and
/// both commands ran, with token 1, until the guard's next look at the
/// path, up to 250 ms later). `a`'s `run`, continued after its lease
/// deadline, does not claim to kill the command the guard killed (before:
/// "the command did not exit in time; SIGKILL") and steps down giving the
/// guard's reason.
#[test]
fn a_folder_moved_further_up_under_a_stopped_leader_stops_its_command_before_another_runs() {
    let scratch = Scratch::new();
    let (store, move_up) = under_a_folder_further_up(&scratch);
    // Past `a`'s lease deadline (TTL 3s): its timers fire once continued.
    let longer = Duration::from_secs(3);
    let a_err = under_a_stopped(&scratch, &store, Stopped::Runner, longer, move_up);
    assert!(
        a_err.contains("no longer at its path"),
        "the guard said nothing: {a_err}"
    );
    // `run` gives the true reason, though its lease ran out meanwhile
    // (before: "lease deadline passed without a confirmed renewal").
    assert!(
        a_err.contains("the guard killed the command: the store's database file"),
        "{a_err}"
    );
}

/// The same with a folder whose store is in use (another election's
/// `observe` has it open) moved into the moved folder's place: the new
/// replica, although not the file's first user, waits as long before its
/// first campaign (before: it was granted at once, beside the old leader's
/// command, with token 1; review 11).
#[test]
fn a_folder_whose_store_is_in_use_moved_onto_the_path_under_a_stopped_leader_waits_for_its_guard() {
    let scratch = Scratch::new();
    let folder = scratch.path("up").join("store");
    let other = scratch.path("new").join("store");
    for dir in [&folder, &other] {
        std::fs::create_dir_all(dir).expect("mkdir");
    }
    let other_store = format!("sqlite:{}", other.join("leasehold.db").display());
    let (code, err) = finish(
        &scratch,
        "other",
        leasehold()
            .args(["campaign", "-e", "other", "--hold", "0s"])
            .args(["--store", &other_store]),
    );
    assert_eq!(code, Some(0), "{err}");
    let out = File::create(scratch.path("observe.out")).expect("stdout file");
    let observe = Proc::spawn(
        leasehold()
            .args(["observe", "-e", "other", "--store", &other_store])
            .stdout(out)
            .stderr(Stdio::null()),
    );
    assert!(wait_until(PATIENCE, || !read_lines(
        &scratch.path("observe.out")
    )
    .is_empty()));
    let store = format!("sqlite:{}", folder.join("leasehold.db").display());
    under_a_stopped(&scratch, &store, Stopped::Runner, Duration::ZERO, || {
        std::fs::rename(scratch.path("up"), scratch.path("up.old")).expect("move up away");
        std::fs::rename(scratch.path("new"), scratch.path("up")).expect("move new in");
    });
    drop(observe);
}

/// The same with the leader's guard stopped (SIGSTOP) instead of its
/// runner: `run` watches the path as its guard does, kills the command
/// through the guard and continues it (before: `run` said it was killing
/// the command, which ran on beside the new leader's, with token 1, until
/// `run` continued the guard, up to a second later; review 12).
#[test]
fn a_folder_moved_further_up_under_a_stopped_guard_stops_its_command_before_another_runs() {
    let scratch = Scratch::new();
    let (store, move_up) = under_a_folder_further_up(&scratch);
    let a_err = under_a_stopped(&scratch, &store, Stopped::Guard, Duration::ZERO, move_up);
    assert!(a_err.contains("no longer at its path"), "{a_err}");
}

/// A store in a folder `up/store`, and the change that moves `up` away
/// (which inotify on the store's folder does not see) and makes a new
/// `up/store` at its place.
fn under_a_folder_further_up(scratch: &Scratch) -> (String, impl FnOnce() + '_) {
    let folder = scratch.path("up").join("store");
    std::fs::create_dir_all(&folder).expect("mkdir");
    let store = format!("sqlite:{}", folder.join("leasehold.db").display());
    let move_up = move || {
        std::fs::rename(scratch.path("up"), scratch.path("elsewhere")).expect("move up");
        std::fs::create_dir_all(&folder).expect("mkdir again");
    };
    (store, move_up)
}

/// Which of the leader's processes [`under_a_stopped`] stops.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stopped {
    Runner,
    Guard,
}

/// Leader `a` leads; its runner is stopped (SIGSTOP) while `change` is
/// made to the store's files, and replica `b` is started at once: `b`'s
/// command runs, never beside `a`'s, and `a`, continued, exits 1. `a`'s
/// stderr.
fn under_a_stopped_leader(scratch: &Scratch, change: impl FnOnce()) -> String {
    let store = scratch.store_url();
    under_a_stopped(scratch, &store, Stopped::Runner, Duration::ZERO, change)
}

/// [`under_a_stopped_leader`] on the store `store`, with `stopped` (the
/// runner or its guard) stopped, and kept stopped for `longer` once `b`
/// runs.
fn under_a_stopped(
    scratch: &Scratch,
    store: &str,
    stopped: Stopped,
    longer: Duration,
    change: impl FnOnce(),
) -> String {
    let (mut a, a_child, a_grandchild) = leading_at(scratch, store);
    let pid = nix::unistd::Pid::from_raw(match stopped {
        Stopped::Runner => a.pid(),
        Stopped::Guard => parent_of(a_child),
    });
    nix::sys::signal::kill(pid, nix::sys::signal::SIGSTOP).expect("stop a");
    change();
    let b = replica_at(scratch, store, "b", &format!("{a_child} {a_grandchild}"));
    let b_ran = wait_until(PATIENCE, || runs(scratch).len() == 2);
    std::thread::sleep(longer);
    // A guard continued by `run` may be gone by now: only `run` must be.
    let continued = nix::sys::signal::kill(pid, nix::sys::signal::SIGCONT);
    assert!(stopped == Stopped::Guard || continued.is_ok(), "continue a");
    assert!(
        b_ran,
        "b never ran: {}",
        std::fs::read_to_string(scratch.path("b.err")).unwrap_or_default()
    );
    let overlapped = overlaps(scratch);
    let status = a.wait_for_exit(PATIENCE).expect("a exits");
    let err = |id: &str| std::fs::read_to_string(scratch.path(&format!("{id}.err")));
    assert_eq!(
        overlapped,
        Vec::<String>::new(),
        "two leaders at once; a's stderr: {:?}; b's: {:?}",
        err("a"),
        err("b")
    );
    let a_err = std::fs::read_to_string(scratch.path("a.err")).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{a_err}");
    // The guard killed the command; `run`, continued, does not claim to.
    for claim in [
        "did not exit in time",
        "leadership lost; killing the command",
        "killed the command at the lease deadline",
    ] {
        assert!(
            stopped == Stopped::Guard || !a_err.contains(claim),
            "{a_err}"
        );
    }
    drop(b);
    a_err
}

/// The parent of process `pid` (of a command: its guard).
fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    stat.rsplit(") ")
        .next()
        .and_then(|rest| rest.split(' ').nth(1))
        .and_then(|ppid| ppid.parse().ok())
        .expect("a parent")
}

/// Another program's SQLite database moved onto the path under a running
/// leader, and another replica started at once: the first leader's
/// command is stopped and its runner exits; the second refuses the file;
/// the other program's database is left byte for byte as it was, and
/// SQLite still shows it its own table (before: leasehold wrote its tables
/// into it through the -wal, and that table was gone).
#[test]
fn a_database_moved_onto_the_store_is_left_as_it_was_and_its_leader_stops() {
    let scratch = Scratch::new();
    let (mut a, a_child, a_grandchild) = leading(&scratch);
    let other = scratch.path("app.db");
    rusqlite::Connection::open(&other)
        .expect("open")
        .execute_batch("CREATE TABLE users (id INTEGER PRIMARY KEY); INSERT INTO users VALUES (7);")
        .expect("create");
    let before = std::fs::read(&other).expect("read");
    let db = scratch.path("leasehold.db");
    std::fs::rename(&other, &db).expect("move onto the store");
    let mut b = replica(&scratch, "b", &format!("{a_child} {a_grandchild}"));
    let status = b.wait_for_exit(PATIENCE).expect("b exits");
    let b_err = std::fs::read_to_string(scratch.path("b.err")).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{b_err}");
    assert!(
        b_err.contains("a SQLite database of another program"),
        "{b_err}"
    );
    assert!(
        wait_until(PATIENCE, || !alive(a_child) && !alive(a_grandchild)),
        "a's command outlived its store"
    );
    let status = a.wait_for_exit(PATIENCE).expect("a exits");
    assert_eq!(status.code(), Some(1));
    let a_err = std::fs::read_to_string(scratch.path("a.err")).unwrap_or_default();
    assert!(a_err.contains("another file is there now"), "{a_err}");
    assert_eq!(runs(&scratch).len(), 1, "b ran");
    assert_eq!(overlaps(&scratch), Vec::<String>::new());

    assert_eq!(std::fs::read(&db).expect("read"), before);
    let conn = rusqlite::Connection::open(&db).expect("open");
    let id: i64 = conn
        .query_row("SELECT id FROM users", [], |r| r.get(0))
        .expect("the other program's table");
    assert_eq!(id, 7);
    let ours: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name IN ('sessions', 'elections')",
            [],
            |r| r.get(0),
        )
        .expect("schema");
    assert_eq!(ours, 0, "leasehold's tables are in the other database");
    drop(conn);
    assert_eq!(std::fs::read(&db).expect("read"), before);
}

/// A copy of the store (a leasehold database: a backup) moved onto the
/// path under a running leader and a waiting replica: both exit 1, the
/// leader's command stopped, and the next `campaign` uses the copy as it
/// is, with its own counters (before: they left their `-wal` at the path,
/// and every later command was refused because of it, naming a file that
/// `mv` had unlinked).
#[test]
fn a_backup_moved_onto_the_store_under_its_replicas_is_used_once_they_are_gone() {
    let scratch = Scratch::new();
    let (mut a, a_child, a_grandchild) = leading(&scratch);
    let mut b = replica(&scratch, "b", "");
    assert!(
        wait_until(PATIENCE, || std::fs::read_to_string(scratch.path("b.err"))
            .is_ok_and(|e| e.contains("waiting; election is led"))),
        "b does not wait"
    );
    let db = scratch.path("leasehold.db");
    let copy = scratch.path("copy.db");
    copy_of(&db, &copy);
    let copied = revision_of(&copy);
    std::fs::rename(&copy, &db).expect("move the copy onto the store");
    for (name, replica) in [("a", &mut a), ("b", &mut b)] {
        let status = replica.wait_for_exit(PATIENCE);
        let err = std::fs::read_to_string(scratch.path(&format!("{name}.err"))).unwrap_or_default();
        let status = status.unwrap_or_else(|| panic!("{name} does not exit: {err}"));
        assert_eq!(status.code(), Some(1), "{name}: {err}");
        assert!(err.contains("another file is there now"), "{name}: {err}");
    }
    assert!(
        wait_until(PATIENCE, || !alive(a_child) && !alive(a_grandchild)),
        "a's command outlived its store"
    );
    assert_eq!(runs(&scratch).len(), 1, "b ran");
    let token = granted(&scratch.store_url());
    assert_eq!(token, copied + 1, "the copy's counter, plus one");
    let conn = rusqlite::Connection::open(&db).expect("open");
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("check");
    assert_eq!(check, "ok");
}

/// A backup moved onto the path, its `-wal` and `-shm` removed, while the
/// leader's runner is stopped (SIGSTOP): a `campaign` on the backup is
/// refused while that runner lives (before: it was granted at once, with
/// the stopped leader's own token, both commands alive), and once the
/// runner runs again it leaves (store replaced), after which the backup is
/// used. The wait for it is said within a second.
#[test]
fn a_backup_moved_onto_the_path_of_a_stopped_leader_waits_for_it() {
    let scratch = Scratch::new();
    let campaign = |name: &str| {
        finish(
            &scratch,
            name,
            leasehold()
                .args(["campaign", "-e", "nightly-billing", "--hold", "1ms"])
                .args(["--ttl", "3s", "--store", &scratch.store_url()]),
        )
    };
    assert_eq!(campaign("first").0, Some(0));
    let db = scratch.path("leasehold.db");
    let backup = scratch.path("backup.db");
    std::fs::copy(&db, &backup).expect("a backup");
    let (mut a, a_child, _) = leading(&scratch);
    let pid = nix::unistd::Pid::from_raw(a.pid());
    nix::sys::signal::kill(pid, nix::sys::signal::SIGSTOP).expect("stop a");
    std::fs::rename(&backup, &db).expect("move the backup onto the path");
    for suffix in ["-wal", "-shm"] {
        std::fs::remove_file(sibling(&db, suffix)).expect("remove");
    }
    let (code, err) = campaign("while-a-is-stopped");
    nix::sys::signal::kill(pid, nix::sys::signal::SIGCONT).expect("continue a");
    // The wait is said after a second (before: 5 s of silence), then the
    // refusal in one line.
    let (waiting, refusal) = err.split_once('\n').unwrap_or_default();
    assert!(
        waiting.contains("waiting for the processes that hold the notify file"),
        "{err}"
    );
    assert_refused(
        code,
        refusal,
        "processes still use the database that was at this path before",
    );
    let status = a.wait_for_exit(PATIENCE).expect("a exits");
    let a_err = std::fs::read_to_string(scratch.path("a.err")).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{a_err}");
    assert!(
        wait_until(PATIENCE, || !alive(a_child)),
        "a's command outlived its store"
    );
    let (code, err) = campaign("after-a");
    assert_eq!(code, Some(0), "{err}");
}

/// The store is reached through a symbolic link to its file, and the link
/// is pointed at another store under the running leader (`ln -sfn`, a
/// deploy's habit): the leader steps down, its command stopped, and exits
/// 1 saying so (before: it led on through the old file while a replica
/// started through the link led the other store, both with token 1).
#[test]
fn a_symbolic_link_pointed_at_another_store_ends_the_leader_behind_it() {
    let scratch = Scratch::new();
    let (first, second, linked) = (
        scratch.path("first.db"),
        scratch.path("second.db"),
        scratch.path("leasehold.db"),
    );
    for store in [&first, &second] {
        let out = leasehold()
            .args(["campaign", "-e", "other", "--hold", "1ms", "--store"])
            .arg(format!("sqlite:{}", store.display()))
            .output()
            .expect("campaign");
        assert!(out.status.success(), "{}", super::harness::stderr(&out));
    }
    std::os::unix::fs::symlink(&first, &linked).expect("link");
    let (mut a, a_child, a_grandchild) = leading(&scratch);
    let next = scratch.path("next-link");
    std::os::unix::fs::symlink(&second, &next).expect("link");
    std::fs::rename(&next, &linked).expect("point the link at the second store");
    let status = a.wait_for_exit(PATIENCE);
    let a_err = std::fs::read_to_string(scratch.path("a.err")).unwrap_or_default();
    let status = status.unwrap_or_else(|| panic!("a leads on: {a_err}"));
    assert_eq!(status.code(), Some(1), "{a_err}");
    assert!(a_err.contains("names another file now"), "{a_err}");
    assert!(
        wait_until(PATIENCE, || !alive(a_child) && !alive(a_grandchild)),
        "a's command outlived its store"
    );
}

/// The same with the leader's runner stopped (SIGSTOP), and another
/// replica started through the re-pointed link: the stopped leader's guard
/// kills its command before the other replica's runs (before: both ran,
/// both with token 1, until the first one's lease deadline).
#[test]
fn a_symbolic_link_re_pointed_under_a_stopped_leader_stops_its_command() {
    let scratch = Scratch::new();
    let (first, second, linked) = (
        scratch.path("first.db"),
        scratch.path("second.db"),
        scratch.path("leasehold.db"),
    );
    for store in [&first, &second] {
        drop(leasehold::backend::sqlite::SqliteStore::open(store).expect("a store"));
    }
    std::os::unix::fs::symlink(&first, &linked).expect("link");
    under_a_stopped_leader(&scratch, || {
        let next = scratch.path("next-link");
        std::os::unix::fs::symlink(&second, &next).expect("link");
        std::fs::rename(&next, &linked).expect("point the link at the second store");
    });
}

/// A hot rollback journal of another copy of the store, put next to it
/// (a backup set copied back with a leftover `-journal`): `campaign` is
/// refused and leaves the journal and the database as they were (before:
/// SQLite rolled the journal back into the database, its counter went
/// back from 5 to 3, and token 3 was granted again). A journal that goes
/// within a moment is waited for.
#[test]
fn another_files_rollback_journal_next_to_the_store_is_refused() {
    let scratch = Scratch::new();
    let campaign = |name: &str, rounds: &str| {
        let out = leasehold()
            .args([
                "campaign",
                "-e",
                "nightly-billing",
                "--hold",
                "1ms",
                "--rounds",
                rounds,
            ])
            .args(["--ttl", "3s", "--store", &scratch.store_url()])
            .stderr(Stdio::piped())
            .output()
            .expect("campaign");
        let tokens: Vec<u64> = super::harness::events(&out.stdout)
            .iter()
            .filter(|e| e.event == "acquired")
            .filter_map(|e| e.token)
            .collect();
        (
            out.status.code(),
            super::harness::stderr(&out),
            tokens,
            name.to_owned(),
        )
    };
    let first = campaign("first", "2").2;
    assert!(first.len() == 2 && first[0] < first[1], "{first:?}");
    let db = scratch.path("leasehold.db");
    let old = scratch.path("old.db");
    std::fs::copy(&db, &old).expect("copy");
    let second = campaign("second", "3").2;
    assert!(
        second.len() == 3 && first[1] < second[0] && second.windows(2).all(|w| w[0] < w[1]),
        "{first:?} then {second:?}"
    );
    let conn = rusqlite::Connection::open(&old).expect("open the copy");
    conn.execute_batch(
        "PRAGMA journal_mode=DELETE; BEGIN EXCLUSIVE; UPDATE revision SET value = 99;",
    )
    .expect("write in the copy");
    let journal = sibling(&db, "-journal");
    std::fs::copy(sibling(&old, "-journal"), &journal).expect("a hot journal");
    conn.execute_batch("ROLLBACK").expect("rollback");
    drop(conn);
    let (journal_before, db_before) = (
        std::fs::read(&journal).expect("read"),
        std::fs::read(&db).expect("read"),
    );
    let (code, err, tokens, _) = campaign("refused", "1");
    assert_refused(
        code,
        &err,
        "is a rollback journal next to a database in WAL mode",
    );
    assert!(tokens.is_empty(), "granted {tokens:?}");
    assert_eq!(
        std::fs::read(&journal).expect("the journal"),
        journal_before
    );
    assert_eq!(std::fs::read(&db).expect("the database"), db_before);
    // A journal that goes within a moment is the one of a process turning
    // the new database to WAL mode: opening waits for it (before: refused
    // at once, and one of twenty replicas starting together failed).
    let remove = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        std::fs::remove_file(&journal).expect("move the journal away");
    });
    let after = campaign("after", "1").2;
    assert!(
        after.len() == 1 && after[0] > second[2],
        "{after:?} after {second:?}"
    );
    remove.join().expect("removed");
}

/// A symbolic link at the store's path that another user made (in a
/// folder anyone may write), pointing at an empty file in a folder only
/// this user may write: `campaign` refuses to follow it, and the file stays
/// empty with nothing created next to it (before: it became a leasehold
/// database, with a `-notify` beside it).
#[test]
fn a_symbolic_link_of_another_user_is_not_followed() {
    let scratch = Scratch::new();
    let private = scratch.path("private");
    std::fs::create_dir(&private).expect("mkdir");
    let target = private.join("empty");
    File::create(&target).expect("an empty file");
    let link = scratch.path("leasehold.db");
    std::os::unix::fs::symlink(&target, &link).expect("link");
    std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).expect("give the link to nobody");
    let (code, err) = finish(
        &scratch,
        "campaign",
        leasehold()
            .args(["campaign", "-e", "nightly-billing", "--hold", "1ms"])
            .args(["--store", &scratch.store_url()]),
    );
    assert_refused(code, &err, "neither this user nor root");
    assert_eq!(std::fs::metadata(&target).expect("stat").len(), 0);
    assert_eq!(
        std::fs::read_dir(&private).expect("ls").count(),
        1,
        "files were created next to the target"
    );

    // Nor a link of another user to a folder on the way (before: the
    // database and its -notify were created in the folder it led to).
    let folder_link = scratch.path("dir");
    std::os::unix::fs::symlink(&private, &folder_link).expect("link");
    std::os::unix::fs::lchown(&folder_link, Some(65534), Some(65534)).expect("give it to nobody");
    let store = format!("sqlite:{}", folder_link.join("lease.db").display());
    for args in [
        &["campaign", "-e", "nightly-billing", "--hold", "1ms"][..],
        &["status", "-e", "nightly-billing"],
    ] {
        let (code, err) = finish(
            &scratch,
            &format!("folder-{}", args[0]),
            leasehold().args(args).args(["--store", &store]),
        );
        assert_refused(code, &err, "(on the way to");
        assert_eq!(
            std::fs::read_dir(&private).expect("ls").count(),
            1,
            "files were created through the folder link"
        );
    }
}

/// `status`, `list` and `observe` on a store that does not exist say so in
/// one line, exit 1, and create nothing: not the default file nor its
/// folder under `$XDG_STATE_HOME`, not a database in an empty file.
#[test]
fn reading_a_store_that_does_not_exist_creates_nothing() {
    let scratch = Scratch::new();
    let state = scratch.path("state");
    let empty = scratch.path("empty.db");
    std::fs::write(&empty, "").expect("write");
    let commands: [&[&str]; 3] = [
        &["status", "--election", "e"],
        &["list"],
        &["observe", "--election", "e"],
    ];
    for (i, args) in commands.iter().enumerate() {
        let (code, err) = finish(
            &scratch,
            &format!("default-{i}"),
            leasehold().args(*args).env("XDG_STATE_HOME", &state),
        );
        assert_refused(code, &err, "no leasehold store at");
        assert!(err.contains("does not exist"), "{err}");
        assert!(!state.exists(), "{args:?} created {}", state.display());

        let missing = scratch.path("missing.db");
        let (code, err) = finish(
            &scratch,
            &format!("missing-{i}"),
            leasehold()
                .args(*args)
                .args(["--store", &format!("sqlite:{}", missing.display())]),
        );
        assert_refused(code, &err, "the file does not exist");
        assert!(!missing.exists(), "{args:?} created {}", missing.display());

        let (code, err) = finish(
            &scratch,
            &format!("empty-{i}"),
            leasehold()
                .args(*args)
                .args(["--store", &format!("sqlite:{}", empty.display())]),
        );
        assert_refused(code, &err, "the file is empty");
        assert_eq!(std::fs::metadata(&empty).expect("stat").len(), 0);
    }
    let mut names: Vec<String> = std::fs::read_dir(scratch.dir.path())
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".err"))
        .collect();
    names.sort();
    assert_eq!(names, ["empty.db"], "files appeared");
}

/// `observe` on a SQLite store whose file is deleted and created anew by
/// another process exits 1, saying in one line that the store was
/// replaced: that is permanent for its handle (before: it printed the
/// leader as unknown and then waited forever). Its last line on stdout
/// says the leader is unknown (before: the old file's leader was the last
/// word).
#[test]
fn observe_exits_when_its_store_is_replaced() {
    let scratch = Scratch::new();
    let db = scratch.path("leasehold.db");
    let campaign = |name: &str| {
        finish(
            &scratch,
            name,
            leasehold()
                .args(["campaign", "--election", "e"])
                .args(["--store", &scratch.store_url()]),
        )
    };
    let (code, err) = campaign("create");
    assert_eq!(code, Some(0), "{err}");
    let out_path = scratch.path("observe.out");
    let err_path = scratch.path("observe.err");
    let mut observe = Proc::spawn(
        leasehold()
            .args([
                "observe",
                "--election",
                "e",
                "--store",
                &scratch.store_url(),
            ])
            .stdout(File::create(&out_path).expect("stdout file"))
            .stderr(File::create(&err_path).expect("stderr file")),
    );
    assert!(
        wait_until(PATIENCE, || !read_lines(&out_path).is_empty()),
        "observe printed nothing: {}",
        std::fs::read_to_string(&err_path).unwrap_or_default()
    );
    for suffix in ["", "-wal", "-shm", "-notify"] {
        let _ = std::fs::remove_file(sibling(&db, suffix));
    }
    let (code, err) = campaign("recreate");
    assert_eq!(code, Some(0), "{err}");
    let status = observe
        .wait_for_exit(PATIENCE)
        .expect("observe exits once its store is replaced");
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert_refused(status.code(), &err, "store replaced: ");
    assert!(
        err.contains("is no longer the database file this process opened"),
        "{err}"
    );
    // Its last line says the leader is unknown: a reader of the lines is
    // not left with the old file's leader.
    let lines = read_lines(&out_path);
    let last: serde_json::Value =
        serde_json::from_str(lines.last().expect("lines")).expect("a JSON line");
    assert_eq!(last["unknown"], true, "{lines:?}");
    assert!(last["leader"].is_null(), "{lines:?}");
    assert!(
        last["error"]
            .as_str()
            .is_some_and(|e| e.contains("store replaced")),
        "{lines:?}"
    );
}

/// The tester's case with the real binary: another program's WAL-mode
/// database whose tables are only in its `-wal` is refused by `campaign`,
/// `status` and `list`, and the folder is left as it was, byte for byte
/// (before: `campaign` checkpointed the WAL into the database and deleted
/// it; `status` and `list` left a `-shm`). A foreign `-wal`, `-journal`
/// or `-shm` next to a database not created yet is refused, untouched
/// (before: deleted).
#[test]
fn foreign_wal_and_sibling_files_are_refused_and_left_as_they_were() {
    let scratch = Scratch::new();
    let source = scratch.path("w.db");
    let conn = rusqlite::Connection::open(&source).expect("open");
    conn.pragma_update(None, "journal_mode", "WAL")
        .expect("wal");
    conn.pragma_update(None, "wal_autocheckpoint", 0)
        .expect("no autocheckpoint");
    conn.execute_batch("CREATE TABLE t (x); BEGIN;")
        .expect("create");
    for i in 0..50 {
        conn.execute("INSERT INTO t VALUES (?1)", [i])
            .expect("insert");
    }
    conn.execute_batch("COMMIT").expect("commit");
    let folder = scratch.path("store");
    std::fs::create_dir(&folder).expect("mkdir");
    let db = folder.join("p.db");
    std::fs::copy(&source, &db).expect("copy");
    std::fs::copy(sibling(&source, "-wal"), sibling(&db, "-wal")).expect("copy");
    drop(conn);
    let snapshot = |dir: &Path| {
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
            .expect("read dir")
            .map(|e| {
                let e = e.expect("entry");
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).expect("read"),
                )
            })
            .collect();
        files.sort();
        files
    };
    let before = snapshot(&folder);
    let store = format!("sqlite:{}", db.display());
    let commands: [&[&str]; 3] = [
        &["campaign", "--election", "e"],
        &["status", "--election", "e"],
        &["list"],
    ];
    for (i, args) in commands.iter().enumerate() {
        let (code, err) = finish(
            &scratch,
            &format!("foreign-{i}"),
            leasehold().args(*args).args(["--store", &store]),
        );
        assert_refused(code, &err, "a SQLite database of another program");
        assert!(snapshot(&folder) == before, "{args:?} changed the folder");
    }

    let new = folder.join("k.db");
    for suffix in ["-wal", "-journal", "-shm"] {
        let foreign = sibling(&new, suffix);
        std::fs::write(&foreign, "foreign wal\n").expect("write");
        let (code, err) = finish(
            &scratch,
            &format!("sibling{suffix}"),
            leasehold()
                .args(["campaign", "--election", "e"])
                .args(["--store", &format!("sqlite:{}", new.display())]),
        );
        assert_refused(code, &err, &format!("k.db{suffix} exists"));
        assert_eq!(
            std::fs::read_to_string(&foreign).expect("read"),
            "foreign wal\n"
        );
        assert!(!new.exists(), "the database was created");
        std::fs::remove_file(&foreign).expect("remove");
    }
    assert!(snapshot(&folder) == before);
}

/// One database file reached by a second name while a replica leads
/// through the first: a hard link in another folder, and the file
/// bind-mounted by itself into another folder in a mount namespace of its
/// own (what `docker -v /host/lease.db:/app/lease.db` does for a second
/// container). Each would keep its own `-wal`, `-shm` and `-notify`, and
/// so lead beside the first with the same token: `run` on the second name
/// exits 1 with one line naming the first, and its command never runs.
#[test]
fn a_second_name_for_the_database_is_refused_while_the_first_leads() {
    let scratch = Scratch::new();
    let (_a, _, _) = leading(&scratch);
    let first = scratch.path("leasehold.db");
    let linked = scratch.path("linked");
    let mounted = scratch.path("mounted");
    std::fs::create_dir_all(&linked).expect("mkdir");
    std::fs::create_dir_all(&mounted).expect("mkdir");
    std::fs::hard_link(&first, linked.join("leasehold.db")).expect("link");
    File::create(mounted.join("leasehold.db")).expect("mount point");
    let needle = format!("is in use now as {}", first.display());
    let run_on = |db: &Path| {
        let mut run = leasehold();
        run.args(["run", "-e", "nightly-billing", "--store"])
            .arg(format!("sqlite:{}", db.display()))
            .args(["--", "sh", "-c", "echo SECOND >> billing.log"])
            .current_dir(scratch.dir.path());
        run
    };
    let (code, err) = finish(
        &scratch,
        "linked",
        &mut run_on(&linked.join("leasehold.db")),
    );
    assert_refused(code, &err, &needle);
    // The bind mount lives only in the namespace `unshare` makes (root,
    // as CI runs); the file's lock is the kernel's, seen from every one.
    let target = mounted.join("leasehold.db");
    let (code, err) = mounted_over(&scratch, "mounted", &first, &target, &run_on(&target));
    assert_refused(code, &err, &needle);
    assert!(
        !read_lines(&scratch.path("billing.log"))
            .iter()
            .any(|l| l == "SECOND"),
        "a second name's command ran beside the leader"
    );
}

/// Another database file (a copy of the store, and another leasehold
/// database) bind-mounted over the store's path in a mount namespace of
/// its own while a replica leads through the path: the path's `-wal`,
/// `-shm` and `-notify` are the leader's. `run` there is refused (exit 1,
/// one line), the leader keeps its term and the copy is left intact
/// (before: the leader's -wal was emptied or paired with the copy, the
/// leader was granted its token again, and the copy was left malformed).
#[test]
fn another_database_mounted_over_the_path_of_a_leader_is_refused() {
    let scratch = Scratch::new();
    let (_a, command, _) = leading(&scratch);
    let db = scratch.path("leasehold.db");
    let copy = scratch.path("copy.db");
    let other = scratch.path("other.db");
    copy_of(&db, &copy);
    let out = leasehold()
        .args(["campaign", "-e", "elsewhere", "--hold", "0s"])
        .args(["--store", &format!("sqlite:{}", other.display())])
        .output()
        .expect("campaign");
    assert!(out.status.success(), "{}", super::harness::stderr(&out));
    for (name, mounted) in [("copy", &copy), ("other", &other)] {
        let mut leasehold = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        leasehold
            .args([
                "run",
                "-e",
                "nightly-billing",
                "--store",
                &scratch.store_url(),
            ])
            .args(["--", "sh", "-c", "echo MOUNTED >> billing.log"]);
        let (code, err) = mounted_over(&scratch, name, mounted, &db, &leasehold);
        assert_refused(code, &err, "another database file open at this path");
        let check: String = rusqlite::Connection::open(mounted)
            .and_then(|c| c.query_row("PRAGMA integrity_check", [], |r| r.get(0)))
            .expect("read the mounted file");
        assert_eq!(check, "ok", "{name} was damaged");
    }
    assert!(alive(command), "the leader's command was stopped");
    assert_eq!(runs(&scratch).len(), 1, "the election was granted again");
    assert!(
        !read_lines(&scratch.path("billing.log"))
            .iter()
            .any(|l| l == "MOUNTED")
    );
}

/// The replicas of the store's path are killed outright (their `-wal`,
/// holding the last grants, stays at the path), and then a copy of the
/// store or an empty file is bind-mounted over the path in a mount
/// namespace of its own: `campaign` there is refused (exit 1, one line),
/// the mounted file and the `-wal` are left as they were, and the next
/// grant through the path outside is later than every one before (before:
/// that -wal was replayed into the mounted file and deleted, and the
/// killed leader's token was granted again).
#[test]
fn another_file_mounted_over_the_path_of_killed_replicas_is_refused() {
    let scratch = Scratch::new();
    let (a, command, grandchild) = leading(&scratch);
    let db = scratch.path("leasehold.db");
    let copy = scratch.path("copy.db");
    let empty = scratch.path("empty.db");
    copy_of(&db, &copy);
    File::create(&empty).expect("an empty file");
    kill_replica(a, command, grandchild);
    assert!(
        wait_until(PATIENCE, || !alive(command)),
        "the command lives"
    );
    let wal = std::fs::read(sibling(&db, "-wal")).expect("the killed replica's -wal");
    assert!(!wal.is_empty(), "the killed replica left no -wal");
    for (name, mounted) in [("copy", &copy), ("empty", &empty)] {
        let before = std::fs::read(mounted).expect("read");
        let mut leasehold = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        leasehold
            .args(["campaign", "-e", "nightly-billing", "--hold", "1ms"])
            .args(["--store", &scratch.store_url()]);
        let (code, err) = mounted_over(&scratch, name, mounted, &db, &leasehold);
        assert_refused(code, &err, "does not record that it was theirs");
        assert_eq!(
            std::fs::read(mounted).expect("read"),
            before,
            "{name} was written"
        );
        assert_eq!(
            std::fs::read(sibling(&db, "-wal")).expect("the -wal"),
            wal,
            "{name}: the -wal was changed"
        );
    }
    let killed_token = runs(&scratch)[0].0;
    let token = granted(&scratch.store_url());
    assert!(token > killed_token, "token {token} after {killed_token}");
}

/// A `-journal` left by a process killed as it turned a new store to WAL
/// mode — its header says the database was empty before — beside a file
/// that holds no database yet is no other file's: the store is created
/// (before: refused as another database file's journal until moved away).
/// One that says the database had pages stays refused.
#[test]
fn a_new_stores_own_journal_does_not_lock_it_out() {
    let scratch = Scratch::new();
    for (name, pages_before, refused) in [("new.db", 0u32, false), ("other.db", 3, true)] {
        let db = scratch.path(name);
        {
            let conn = rusqlite::Connection::open(&db).expect("open");
            conn.pragma_update(None, "journal_mode", "WAL")
                .expect("WAL");
        }
        assert_eq!(
            std::fs::metadata(&db).expect("the file").len(),
            4096,
            "{name}"
        );
        let mut journal = vec![0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7];
        journal.extend_from_slice(&0u32.to_be_bytes()); // records
        journal.extend_from_slice(&0x1234_5678u32.to_be_bytes()); // nonce
        journal.extend_from_slice(&pages_before.to_be_bytes());
        journal.extend_from_slice(&512u32.to_be_bytes()); // sector
        journal.extend_from_slice(&4096u32.to_be_bytes()); // page
        journal.resize(512, 0);
        std::fs::write(sibling(&db, "-journal"), &journal).expect("the journal");
        let refusal = "is a rollback journal next to a database in WAL mode";
        campaign_once_at(&scratch, &db, refused.then_some(refusal));
    }
}

/// A campaign on the store at `db`, once: refused with `refusal`, or
/// granted and released (exit 0).
fn campaign_once_at(scratch: &Scratch, db: &Path, refusal: Option<&str>) {
    let name = db
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (code, err) = finish(
        scratch,
        &name,
        leasehold()
            .args(["campaign", "-e", "e1", "--hold", "1ms", "--store"])
            .arg(format!("sqlite:{}", db.display())),
    );
    match refusal {
        Some(needle) => assert_refused(code, &err, needle),
        None => assert_eq!(code, Some(0), "{name}: {err}"),
    }
}

/// A store whose creation was cut short — its process killed as it opened
/// it, the schema written to the `-wal` and not yet to the file — is
/// used: nothing was granted in it, so replaying that `-wal` loses and
/// pairs no grant (before: every `run` and `campaign` was refused, saying
/// the `-wal` might be another database file's). A `-wal` that holds a
/// grant beside such a file stays refused.
#[test]
fn a_store_whose_creation_was_cut_short_is_used() {
    let scratch = Scratch::new();
    let reference = scratch.path("ref.db");
    let (code, err) = finish(
        &scratch,
        "ref",
        leasehold()
            .args(["campaign", "-e", "e1", "--hold", "1ms", "--store"])
            .arg(format!("sqlite:{}", reference.display())),
    );
    assert_eq!(code, Some(0), "{err}");
    let schema: Vec<String> = rusqlite::Connection::open(&reference)
        .and_then(|c| {
            let mut s = c.prepare(
                "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'",
            )?;
            s.query_map([], |r| r.get(0))?.collect()
        })
        .expect("the schema");
    let ids: (i64, i64) = rusqlite::Connection::open(&reference)
        .and_then(|c| {
            c.query_row(
                "SELECT (SELECT application_id FROM pragma_application_id()),
                        (SELECT user_version FROM pragma_user_version())",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .expect("the ids");
    for (name, granted, refused) in [("cut.db", false, false), ("granted.db", true, true)] {
        let db = scratch.path(name);
        {
            let conn = rusqlite::Connection::open(&db).expect("open");
            conn.pragma_update(None, "journal_mode", "WAL")
                .expect("WAL");
            conn.set_db_config(
                rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
                true,
            )
            .expect("no checkpoint on close");
            let mut batch = schema.join(";\n");
            batch.push_str(&format!(
                ";\nPRAGMA application_id = {};\nPRAGMA user_version = {};",
                ids.0, ids.1
            ));
            if granted {
                batch.push_str("\nINSERT INTO revision (value) VALUES (7);");
            } else {
                batch.push_str("\nINSERT INTO revision (value) VALUES (0);");
            }
            conn.execute_batch(&format!("BEGIN;\n{batch}\nCOMMIT;"))
                .expect("the schema, in the -wal");
        }
        assert_eq!(
            std::fs::metadata(&db).expect("the file").len(),
            4096,
            "{name}"
        );
        assert!(sibling(&db, "-wal").exists(), "{name}: no -wal");
        let refusal = "does not record that it was theirs";
        campaign_once_at(&scratch, &db, refused.then_some(refusal));
    }
}

/// A `-wal` holding its header alone, as a process killed while it opened
/// the store leaves it, holds nothing to replay: the store is read and
/// used as it is (before: every `status`, `campaign` and `run` on it was
/// refused, saying the `-wal` might be another database file's, until it
/// was moved away by hand).
#[test]
fn a_wal_with_its_header_alone_does_not_lock_the_store_out() {
    let scratch = Scratch::new();
    let db = scratch.path("leasehold.db");
    let store = scratch.store_url();
    let campaign = |name: &str| {
        finish(
            &scratch,
            name,
            leasehold()
                .args(["campaign", "-e", "e1", "--hold", "1ms"])
                .args(["--ttl", "3s", "--store", &store]),
        )
    };
    assert_eq!(campaign("first").0, Some(0));
    // The header of a live replica's -wal, then the replica stops cleanly.
    let (mut a, _, _) = leading(&scratch);
    let wal = std::fs::read(sibling(&db, "-wal")).expect("a leader's -wal");
    assert!(wal.len() > 32, "the -wal holds no frame yet");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(a.pid()),
        nix::sys::signal::SIGTERM,
    )
    .expect("stop a");
    assert!(a.wait_for_exit(PATIENCE).is_some(), "a did not exit");
    std::fs::write(sibling(&db, "-wal"), &wal[..32]).expect("a header alone");
    let (code, err) = finish(
        &scratch,
        "status",
        leasehold().args(["status", "-e", "e1", "--store", &store]),
    );
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = campaign("again");
    assert_eq!(code, Some(0), "{err}");
}

/// A copy of the store taken while its leader ran, put back with `cp`
/// into the same file (the same inode) after the replicas were killed
/// outright: the `-wal` they left does not fit the copy's pages, so
/// `campaign` is refused (exit 1, one line) and the copy and the `-wal` are
/// left as they were (before: SQLite replayed that `-wal` into the copy,
/// and the file was left malformed). With the `-wal` and `-shm` removed, as
/// the GUIDE says to do before putting a backup back, the copy is used.
#[test]
fn a_backup_put_back_into_the_same_file_beside_a_killed_wal_is_refused() {
    let scratch = Scratch::new();
    let db = scratch.path("leasehold.db");
    let copy = scratch.path("copy.db");
    let campaign = |name: &str, election: &str| {
        finish(
            &scratch,
            name,
            leasehold()
                .args(["campaign", "-e", election, "--hold", "1ms"])
                .args(["--ttl", "3s", "--store", &scratch.store_url()]),
        )
    };
    assert_eq!(campaign("first", "nightly-billing").0, Some(0));
    // Many elections, a range of them gone: the file has free pages in
    // the middle, which a copy (`VACUUM INTO`) does not have, so the
    // pages of the copy lie elsewhere.
    rusqlite::Connection::open(&db)
        .and_then(|c| {
            c.execute_batch(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400)
                 INSERT INTO keys (key, value, created, modified)
                 SELECT printf('m-%04d-%s', i, hex(zeroblob(60))), '', 1, 1 FROM n;
                 DELETE FROM keys WHERE key BETWEEN 'm-0100' AND 'm-0300';",
            )
        })
        .expect("fill the store");
    let (a, command, grandchild) = leading(&scratch);
    copy_of(&db, &copy);
    let long = "x".repeat(100);
    for i in 0..10 {
        let name = format!("later-{i}");
        assert_eq!(campaign(&name, &format!("z-{i}-{long}")).0, Some(0));
    }
    kill_replica(a, command, grandchild);
    assert!(
        wait_until(PATIENCE, || !alive(command)),
        "the command lives"
    );
    let wal = std::fs::read(sibling(&db, "-wal")).expect("the killed replica's -wal");
    assert!(!wal.is_empty(), "the killed replica left no -wal");
    let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&p.metadata().expect("stat"));
    let before = inode(&db);
    std::fs::copy(&copy, &db).expect("put the copy back");
    assert_eq!(inode(&db), before, "cp wrote another file");
    let restored = std::fs::read(&db).expect("read");
    let (code, err) = campaign("restored", "nightly-billing");
    assert_refused(code, &err, "does not fit this database file");
    assert_eq!(
        std::fs::read(&db).expect("read"),
        restored,
        "the copy was written"
    );
    assert_eq!(
        std::fs::read(sibling(&db, "-wal")).expect("the -wal"),
        wal,
        "the -wal was changed"
    );
    for suffix in ["-wal", "-shm"] {
        std::fs::remove_file(sibling(&db, suffix)).expect("remove");
    }
    let (code, err) = campaign("without-the-wal", "nightly-billing");
    assert_eq!(code, Some(0), "{err}");
}

/// Runs `leasehold` (its arguments) in a mount namespace of its own in
/// which `mounted` is bind-mounted over `db`; its exit code and stderr.
fn mounted_over(
    scratch: &Scratch,
    name: &str,
    mounted: &Path,
    db: &Path,
    leasehold: &Command,
) -> (Option<i32>, String) {
    let script = format!(
        "mount --bind {} {} && exec \"$@\"",
        mounted.display(),
        db.display()
    );
    finish(
        scratch,
        name,
        Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
                "sh",
            ])
            .arg(leasehold.get_program())
            .args(leasehold.get_args())
            .current_dir(scratch.dir.path()),
    )
}

/// Runs the binary (a copy anyone may run, in `dir`) as `user` with
/// `args`; its exit code, stdout and stderr. Needs root, as CI runs.
/// With `observe` first, it runs for a second under `timeout` (exit 124).
fn as_user(dir: &Path, user: &str, args: &[&str]) -> (Option<i32>, String, String) {
    // Numbers, used as both uid and gid: daemon 1, nobody 65534.
    let exe = dir.join("leasehold");
    if !exe.exists() {
        std::fs::copy(env!("CARGO_BIN_EXE_leasehold"), &exe).expect("copy the binary");
    }
    let out = Command::new("setpriv")
        .args(["--reuid", user, "--regid", user, "--clear-groups", "--"])
        .args(if args.first() == Some(&"observe") {
            &["timeout", "1"][..]
        } else {
            &[]
        })
        .arg(&exe)
        .args(args)
        .env_remove("LEASEHOLD_STORE")
        .env("HOME", dir)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("setpriv (util-linux) runs the binary as another user");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const DAEMON: &str = "1";
const NOBODY: &str = "65534";

fn files_in(dir: &Path) -> Vec<(String, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut files: Vec<(String, u32)> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            let e = e.expect("entry");
            let uid = e.metadata().expect("metadata").uid();
            (e.file_name().to_string_lossy().into_owned(), uid)
        })
        .collect();
    files.sort();
    files
}

/// A store owned by one user (`daemon`) and read by another (`nobody`),
/// who may read the database but not write it, while no replica has it
/// open: in a folder the reader may write (`/tmp`-like, sticky), `status`,
/// `list` and `observe` read it and create nothing (before: they left a
/// `-wal` and `-shm` of the reader's, and the owners' next campaign failed
/// with "not writable"); in a folder the reader may not write, they read
/// it too (before: exit 1, "not writable").
#[test]
fn another_user_reads_a_store_it_may_not_write_and_creates_nothing() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = Scratch::new();
    let root = scratch.dir.path();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    for (folder, mode) in [("sticky", 0o1777), ("owners", 0o755)] {
        let dir = root.join(folder);
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).expect("chmod");
        nix::unistd::chown(&dir, Some(nix::unistd::Uid::from_raw(1)), None).expect("chown");
        let store = format!("sqlite:{}/db", dir.display());
        let (code, _, err) = as_user(root, DAEMON, &["campaign", "-e", "job", "--store", &store]);
        assert_eq!(code, Some(0), "the owner campaigns: {err}");
        let before = files_in(&dir);
        for args in [
            vec!["status", "-e", "job", "--json"],
            vec!["list", "--json"],
            vec!["observe", "-e", "job"],
        ] {
            let mut args = args.clone();
            args.extend(["--store", &store]);
            let (code, out, err) = as_user(root, NOBODY, &args);
            let ran = if args[0] == "observe" { 124 } else { 0 };
            assert_eq!(code, Some(ran), "{folder}: {args:?} as a reader: {err}");
            assert!(out.contains("\"job\""), "{folder}: {args:?} printed {out}");
            assert_eq!(files_in(&dir), before, "{folder}: {args:?} created files");
        }
        let (code, _, err) = as_user(root, DAEMON, &["campaign", "-e", "job", "--store", &store]);
        assert_eq!(code, Some(0), "{folder}: the owner campaigns again: {err}");
        // A reader the file's mode shuts out is refused access: no outage.
        let db = dir.join("db");
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let (code, _, err) = as_user(root, NOBODY, &["status", "-e", "job", "--store", &store]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("store refused access"), "{err}");
        assert!(!err.contains("unavailable"), "{err}");
    }
}

/// The owner's replica is killed outright (its `-wal` stays) and the
/// `-shm` is gone, in a folder anyone may write: a reader of another user
/// is refused access and creates nothing (before: `status` created a
/// `-shm` of its own, and the owner's next command was refused because of
/// it); the owner reads.
#[test]
fn a_reader_does_not_create_a_missing_shm_that_would_lock_the_owner_out() {
    let scratch = Scratch::new();
    let (root, dir, store) = sticky_store(&scratch);
    let err_file = File::create(root.join("run.err")).expect("stderr file");
    let mut owner = Proc::spawn(
        Command::new("setpriv")
            .args(["--reuid", DAEMON, "--regid", DAEMON, "--clear-groups", "--"])
            .arg(root.join("leasehold"))
            .args(["run", "-e", "job", "--ttl", "30s", "--store", &store, "--"])
            .args(["sleep", "600"])
            .stdout(Stdio::null())
            .stderr(err_file),
    );
    assert!(
        wait_until(PATIENCE, || std::fs::read_to_string(root.join("run.err"))
            .is_ok_and(|e| e.contains("command started"))),
        "the owner's replica does not lead"
    );
    kill_tree(owner.pid());
    owner.wait_for_exit(PATIENCE).expect("killed");
    let db = dir.join("db");
    assert!(
        sibling(&db, "-wal").metadata().is_ok_and(|m| m.len() > 0),
        "no -wal left"
    );
    std::fs::remove_file(sibling(&db, "-shm")).expect("remove the -shm");
    let before = files_in(&dir);
    let (code, _, err) = as_user(root, NOBODY, &["status", "-e", "job", "--store", &store]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("store refused access"), "{err}");
    assert_eq!(files_in(&dir), before, "the reader created files");
    let (code, _, err) = as_user(root, DAEMON, &["status", "-e", "job", "--store", &store]);
    assert_eq!(code, Some(0), "the owner reads: {err}");
}

/// A folder anyone may write (sticky) in `scratch`, holding a store its
/// owner (user `DAEMON`) has campaigned on: the scratch folder, that
/// folder, and the store's URL.
fn sticky_store(scratch: &Scratch) -> (&Path, PathBuf, String) {
    use std::os::unix::fs::PermissionsExt;
    let root = scratch.dir.path();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let dir = root.join("sticky");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let store = format!("sqlite:{}/db", dir.display());
    let (code, _, err) = as_user(root, DAEMON, &["campaign", "-e", "job", "--store", &store]);
    assert_eq!(code, Some(0), "the owner campaigns: {err}");
    (root, dir, store)
}

/// A user who may only read the database, in a folder anyone may write,
/// runs `campaign` and `run` there: refused access (exit 1), and nothing
/// created (before: a `-wal` and `-shm` of that user's were left, and the
/// owners' next campaign was refused for them).
#[test]
fn a_user_who_may_only_read_cannot_lock_the_owners_out_by_campaigning() {
    let scratch = Scratch::new();
    let (root, dir, store) = sticky_store(&scratch);
    let before = files_in(&dir);
    for args in [
        vec!["campaign", "-e", "job", "--hold", "0s"],
        vec!["run", "-e", "job", "--", "true"],
    ] {
        let mut args = args.clone();
        let at = args.iter().position(|a| *a == "--").unwrap_or(args.len());
        args.splice(at..at, ["--store", store.as_str()]);
        let (code, _, err) = as_user(root, NOBODY, &args);
        assert_eq!(code, Some(1), "{args:?} as a reader: {err}");
        assert!(err.contains("store refused access"), "{args:?}: {err}");
        assert_eq!(files_in(&dir), before, "{args:?} created files");
    }
    let (code, _, err) = as_user(root, DAEMON, &["campaign", "-e", "job", "--store", &store]);
    assert_eq!(code, Some(0), "the owner campaigns again: {err}");
}

/// A replica killed outright on one name (runner, guard and command: what
/// `docker kill` of a container given the file alone does) leaves a `-wal`
/// that only that name sees. Another name is refused until the first has
/// been opened once (which empties that `-wal` into the file), naming it;
/// then it is used, and tokens keep increasing (before: the second name
/// granted the same token again, and reopening the first rolled it back).
#[test]
fn a_name_whose_replicas_were_killed_keeps_others_away_until_opened_again() {
    killed_replicas_keep_other_names_away(&Scratch::new());
}

/// The same on a filesystem that keeps no extended attributes (ramfs):
/// the record of the name in use is in the database file itself, so it
/// holds there too (before: the second name was let in, and granted the
/// killed leader's token again).
#[test]
fn a_name_whose_replicas_were_killed_keeps_others_away_on_any_filesystem() {
    let scratch = Scratch::new();
    let _ramfs = Mounted::ramfs(scratch.dir.path());
    killed_replicas_keep_other_names_away(&scratch);
}

/// A filesystem mounted for a test (root, as CI runs), unmounted when
/// dropped, also when the test fails.
struct Mounted(PathBuf);

impl Mounted {
    fn ramfs(on: &Path) -> Self {
        let status = Command::new("mount")
            .args(["-t", "ramfs", "ramfs"])
            .arg(on)
            .status()
            .expect("mount (util-linux)");
        assert!(status.success(), "mount -t ramfs on {}", on.display());
        Mounted(on.to_owned())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn killed_replicas_keep_other_names_away(scratch: &Scratch) {
    let (a, command, grandchild) = leading(scratch);
    let first = scratch.path("leasehold.db");
    let linked = scratch.path("linked");
    std::fs::create_dir_all(&linked).expect("mkdir");
    std::fs::hard_link(&first, linked.join("leasehold.db")).expect("link");
    kill_replica(a, command, grandchild);
    assert!(
        wait_until(PATIENCE, || !alive(command)),
        "the command lives"
    );
    assert!(
        sibling(&first, "-wal")
            .metadata()
            .is_ok_and(|m| m.len() > 0),
        "the killed replica left no -wal"
    );
    let second = format!("sqlite:{}", linked.join("leasehold.db").display());
    let campaign = |name: &str, store: &str| {
        finish(
            scratch,
            name,
            leasehold()
                .args(["campaign", "-e", "nightly-billing", "--hold", "1ms"])
                .args(["--ttl", "3s", "--store", store]),
        )
    };
    let (code, err) = campaign("second", &second);
    assert_refused(code, &err, &format!("was last used as {}", first.display()));
    // Each name's grant, once the first was opened again: strictly later
    // tokens than the killed leader's.
    let killed_token = runs(scratch)[0].0;
    let mut last = killed_token;
    for store in [scratch.store_url(), second] {
        let token = granted(&store);
        assert!(token > last, "token {token} after {last} on {store}");
        last = token;
    }
}

/// The token of one `campaign` on `store` (which must be granted).
fn granted(store: &str) -> u64 {
    let out = leasehold()
        .args(["campaign", "-e", "nightly-billing", "--hold", "1ms"])
        .args(["--ttl", "3s", "--store", store])
        .output()
        .expect("campaign");
    assert!(out.status.success(), "{}", super::harness::stderr(&out));
    super::harness::events(&out.stdout)
        .iter()
        .find(|e| e.event == "acquired")
        .and_then(|e| e.token)
        .expect("acquired")
}

/// The revision counter of the database at `db`: the last token given.
fn revision_of(db: &Path) -> u64 {
    rusqlite::Connection::open(db)
        .and_then(|c| c.query_row("SELECT value FROM revision", [], |r| r.get(0)))
        .expect("the revision counter")
}

/// A copy of the database at `db` (through its `-wal`) written to `copy`.
fn copy_of(db: &Path, copy: &Path) {
    rusqlite::Connection::open(db)
        .and_then(|c| c.execute("VACUUM INTO ?1", [copy.to_str().expect("UTF-8")]))
        .expect("copy the store");
}

/// Kills a replica outright, as `docker kill` does: its runner, guard,
/// command and the command's child.
fn kill_replica(a: Proc, command: i32, grandchild: i32) {
    kill_tree(a.pid());
    for pid in [command, grandchild] {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
    }
    drop(a);
}

/// SIGKILLs `pid` and every process below it, all at one instant as a
/// machine's crash would: each is stopped first, top down (a stopped
/// process starts no child), and only then killed. Killed one by one, a
/// guard that saw its runner die could still release and close the
/// database, which removes the -wal a crash leaves (CI once saw that).
fn kill_tree(pid: i32) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let _ = kill(Pid::from_raw(tree[i]), Signal::SIGSTOP);
        super::harness::wait_until(PATIENCE, || {
            super::harness::stopped(tree[i]) || !alive(tree[i])
        });
        tree.extend(super::harness::children_of(tree[i]));
        i += 1;
    }
    for pid in tree {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}
