//! SQLite on one host: a holder whose process died is found dead by the
//! kernel (the lock its session holds on `<db>-notify` is gone), and its
//! election is taken over at once; a process that is stopped, or whose pid
//! says otherwise, is never taken for dead.
//!
//! The holders run in real processes: this test binary, started again with
//! [`HOLDER_DB`] set, runs [`holder_process`] only.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::backend::sqlite::{SqliteKeys, SqliteStore};
use leasehold::backend::{Keys, Write};
use leasehold::store::{Grant, Store};
use leasehold::testing::unique_election;
use leasehold::{CandidateId, ElectionName};
use nix::libc;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The database the holder process uses; its presence makes
/// [`holder_process`] one.
const HOLDER_DB: &str = "LEASEHOLD_TEST_HOLDER_DB";
const HOLDER_ELECTION: &str = "LEASEHOLD_TEST_HOLDER_ELECTION";
const HOLDER_TTL_MS: &str = "LEASEHOLD_TEST_HOLDER_TTL_MS";
/// `one`: one session, holding the election. `two`: two sessions, the
/// first closed once the second holds the election. `key`: one session,
/// holding the election and the key `ELECTION/key` of the store primitive.
/// `helper`: one session,
/// and a helper process (`sleep`) holding its lock file as stdout, as
/// `leasehold run`'s guard does.
const HOLDER_MODE: &str = "LEASEHOLD_TEST_HOLDER_MODE";
/// What the holder process prints once it holds the election, with the
/// token and the session id.
const HELD: &str = "holder-process-held";

/// Where session locks start in the notify file (`liveness.rs`).
const FIRST_SESSION_BYTE: i64 = 1 << 32;

/// A test's waiting time for what the fast path does in milliseconds: far
/// below the 60 s TTL, so only the kernel test can make it.
const FAST: Duration = Duration::from_secs(30);
const LONG_TTL: Duration = Duration::from_secs(60);

/// Not a test on its own (it returns at once): the holder process the
/// tests below start. It holds the election named in its environment and
/// renews until it is killed, or its stdin closes (the test is gone).
#[test]
fn holder_process() {
    let Some(db) = std::env::var_os(HOLDER_DB) else {
        return;
    };
    let var = |name| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let election = ElectionName::new(var(HOLDER_ELECTION)).expect("election");
    let ttl = Duration::from_millis(var(HOLDER_TTL_MS).parse().expect("ttl"));
    let two = var(HOLDER_MODE) == "two";
    std::thread::spawn(|| {
        // EOF (or an error): the test that started this process is gone.
        let _ = std::io::stdin().read(&mut [0u8; 1]);
        std::process::exit(0);
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let store = SqliteStore::open(PathBuf::from(db)).expect("open");
        let first = store.open_session(ttl).await.expect("open a session");
        let lease = if two {
            store
                .open_session(ttl)
                .await
                .expect("open a second session")
        } else {
            first
        };
        let grant = store
            .campaign(
                lease.id,
                &election,
                &CandidateId::new("holder").expect("id"),
            )
            .await
            .expect("campaign");
        if two {
            store.close_session(first.id).await.expect("close");
        }
        if var(HOLDER_MODE) == "key" {
            let put = Write::Put {
                key: format!("{election}/key"),
                value: String::new(),
                session: Some(lease.id),
            };
            store.keys().commit(&[], &[put]).await.expect("commit");
        }
        let helper = (var(HOLDER_MODE) == "helper").then(|| {
            let locks = store.session_lock_file().expect("the session lock file");
            Command::new("sleep")
                .arg("600")
                .stdin(Stdio::null())
                .stdout(Stdio::from(locks))
                .spawn()
                .expect("start the helper")
                .id()
        });
        // On a line of its own: the harness has written "test … " before.
        println!(
            "\n{HELD} {} {} {}",
            grant.token,
            lease.id,
            helper.unwrap_or(0)
        );
        loop {
            tokio::time::sleep(ttl / 3).await;
            if store.keep_alive(lease.id).await.is_err() {
                // Stopped past its TTL, then continued: its part is over.
                std::process::exit(0);
            }
        }
    });
}

/// A holder process, killed when dropped.
struct Holder {
    child: Child,
    _stdin: ChildStdin,
    token: u64,
    session: i64,
    /// The helper process's pid, in mode `helper`.
    helper: Option<Pid>,
}

impl Holder {
    /// Starts a holder of `election` in `db` and waits until it holds it.
    fn start(db: &Path, election: &ElectionName, ttl: Duration, mode: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "suite::sqlite_crash::holder_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HOLDER_DB, db)
            .env(HOLDER_ELECTION, election.as_str())
            .env(HOLDER_TTL_MS, ttl.as_millis().to_string())
            .env(HOLDER_MODE, mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the holder process");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let held = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|line| line.starts_with(HELD));
        let Some(held) = held else {
            let _ = child.kill();
            panic!("the holder process never held {election}");
        };
        let mut words = held.split(' ').skip(1);
        let token = words.next().and_then(|w| w.parse().ok()).expect("token");
        let session = words.next().and_then(|w| w.parse().ok()).expect("session");
        let helper = words
            .next()
            .and_then(|w| w.parse().ok())
            .filter(|&pid| pid > 0)
            .map(Pid::from_raw);
        Holder {
            child,
            _stdin: stdin,
            token,
            session,
            helper,
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid"))
    }

    fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).expect("signal the holder");
    }

    /// SIGKILLs it and reaps it (so that its pid may be reused).
    fn kill(&mut self) {
        self.signal(Signal::SIGKILL);
        self.child.wait().expect("reap the holder");
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.signal_if_running();
    }
}

impl Holder {
    fn signal_if_running(&mut self) -> std::io::Result<()> {
        if let Some(helper) = self.helper {
            let _ = kill(helper, Signal::SIGKILL);
        }
        if self.child.try_wait()?.is_none() {
            let _ = kill(self.pid(), Signal::SIGCONT);
            self.child.kill()?;
            self.child.wait()?;
        }
        Ok(())
    }
}

fn db_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("leasehold.db")
}

fn notify_of(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-notify");
    name.into()
}

fn sql(db: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(db).expect("open with rusqlite");
    conn.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    conn
}

/// A waiter in this process: campaigns for `election` on a session of
/// its own (TTL 60 s) and reports when it is granted.
fn start_waiter(db: &Path, election: &ElectionName) -> tokio::task::JoinHandle<(Instant, Grant)> {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(db).expect("open"));
    let election = election.clone();
    tokio::spawn(async move {
        let lease = store.open_session(LONG_TTL).await.expect("open a session");
        let grant = store
            .campaign(
                lease.id,
                &election,
                &CandidateId::new("waiter").expect("id"),
            )
            .await
            .expect("campaign");
        (Instant::now(), grant)
    })
}

/// Waits for `waiter`'s grant, at most `limit`.
async fn granted_within(
    waiter: &mut tokio::task::JoinHandle<(Instant, Grant)>,
    limit: Duration,
    what: &str,
) -> (Instant, Grant) {
    tokio::time::timeout(limit, waiter)
        .await
        .unwrap_or_else(|_| panic!("{what}: the waiter was not granted within {limit:?}"))
        .expect("waiter task")
}

/// Asserts that `waiter` is not granted for `span`.
async fn not_granted_for(
    waiter: &mut tokio::task::JoinHandle<(Instant, Grant)>,
    span: Duration,
    what: &str,
) {
    if let Ok(outcome) = tokio::time::timeout(span, waiter).await {
        panic!("{what}: the waiter was granted ({outcome:?}) while the holder's process lived");
    }
}

/// Whether a write lock is held on `session`'s byte of the notify file,
/// asked of the kernel from an open file description of this test's own.
fn session_lock_held(db: &Path, session: i64) -> bool {
    let file = std::fs::File::open(notify_of(db)).expect("open the notify file");
    let mut arg = libc::flock {
        l_type: libc::F_RDLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: FIRST_SESSION_BYTE + session,
        l_len: 1,
        l_pid: 0,
    };
    nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_OFD_GETLK(&mut arg)).expect("F_OFD_GETLK");
    libc::c_int::from(arg.l_type) != libc::F_UNLCK
}

/// The point of it: SIGKILL of the holder's process, TTL 60 s, and the
/// waiter — already waiting in another process — is granted in well under
/// the TTL, with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_holder_process_is_taken_over_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = db_in(&dir);
    let election = unique_election("sigkill");
    let mut holder = Holder::start(&db, &election, LONG_TTL, "one");
    assert!(session_lock_held(&db, holder.session));
    let mut waiter = start_waiter(&db, &election);
    // The waiter has attempted and is waiting on the holder's lock.
    not_granted_for(&mut waiter, Duration::from_millis(500), "before the kill").await;
    let killed_at = Instant::now();
    holder.kill();
    let (granted_at, grant) = granted_within(&mut waiter, FAST, "after SIGKILL").await;
    assert!(grant.token.0 > holder.token);
    eprintln!(
        "granted {:?} after SIGKILL of the holder (TTL {LONG_TTL:?})",
        granted_at - killed_at
    );
    // The dead session is ended too, with its lock record, long before
    // its TTL: by the waiter's watch that saw it dead, just after (or by
    // the commit that granted, when there is one).
    let conn = sql(&db);
    let left = || -> i64 {
        conn.query_row(
            "SELECT count(*) FROM sessions WHERE id = ?1",
            [holder.session],
            |r| r.get(0),
        )
        .expect("count")
    };
    let ended_by = Instant::now() + Duration::from_secs(5);
    while left() != 0 && Instant::now() < ended_by {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(left(), 0, "the dead session was not ended within 5 s");
}

/// A stopped (SIGSTOP) holder process keeps its lock: its election is not
/// taken over before its TTL (3 s here), however long the waiter waits;
/// only the TTL ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holder_process_is_not_taken_over_before_its_ttl() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = db_in(&dir);
    let election = unique_election("sigstop");
    let ttl = Duration::from_secs(3);
    let holder = Holder::start(&db, &election, ttl, "one");
    holder.signal(Signal::SIGSTOP);
    let stopped_at = Instant::now();
    let mut waiter = start_waiter(&db, &election);
    not_granted_for(&mut waiter, Duration::from_millis(1500), "holder stopped").await;
    assert!(session_lock_held(&db, holder.session));
    // Its lease runs out while it is stopped: then, and only then, the
    // waiter is granted.
    let (granted_at, grant) = granted_within(&mut waiter, FAST, "after the TTL").await;
    assert!(grant.token.0 > holder.token);
    assert!(
        granted_at - stopped_at >= ttl / 2,
        "granted {:?} after the stop",
        granted_at - stopped_at
    );
    holder.signal(Signal::SIGCONT);
}

/// The session's pid says nothing: a dead holder whose recorded pid is
/// a live process's (as after pid reuse) is taken over at once, and a
/// live holder whose recorded pid names no process is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pid_reuse_cannot_fool_the_test() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = db_in(&dir);
    let set_pid = |session: i64, pid: i64| {
        let changed = sql(&db)
            .execute("UPDATE sessions SET pid = ?2 WHERE id = ?1", [session, pid])
            .expect("rewrite the pid");
        assert_eq!(changed, 1);
    };

    // Dead holder, pid of a live process (this one).
    let election = unique_election("pid-live");
    let mut holder = Holder::start(&db, &election, LONG_TTL, "one");
    set_pid(holder.session, i64::from(std::process::id()));
    let mut waiter = start_waiter(&db, &election);
    not_granted_for(&mut waiter, Duration::from_millis(300), "before the kill").await;
    holder.kill();
    granted_within(&mut waiter, FAST, "dead holder, live pid").await;

    // Live holder, pid of a process that has exited and been reaped.
    let election = unique_election("pid-dead");
    let holder = Holder::start(&db, &election, LONG_TTL, "one");
    let mut gone = Command::new("true").spawn().expect("run true");
    let gone_pid = i64::from(gone.id());
    gone.wait().expect("reap true");
    set_pid(holder.session, gone_pid);
    let mut waiter = start_waiter(&db, &election);
    not_granted_for(
        &mut waiter,
        Duration::from_millis(1500),
        "live holder, dead pid",
    )
    .await;
    drop(holder);
    granted_within(&mut waiter, FAST, "after the holder is killed").await;
}

/// Closing a session deletes its row, then lets its lock go; a waiter is
/// granted by the release, and the session is not reported dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_session_lets_its_lock_go() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = db_in(&dir);
    let election = unique_election("closed");
    let store = SqliteStore::open(&db).expect("open");
    let lease = store.open_session(LONG_TTL).await.expect("open a session");
    let session = i64::try_from(lease.id.0).expect("session id");
    assert!(
        session_lock_held(&db, session),
        "the session holds its lock"
    );
    store
        .campaign(lease.id, &election, &CandidateId::new("a").expect("id"))
        .await
        .expect("campaign");
    let mut waiter = start_waiter(&db, &election);
    not_granted_for(&mut waiter, Duration::from_millis(500), "held").await;
    store.close_session(lease.id).await.expect("close");
    granted_within(&mut waiter, FAST, "after the close").await;
    assert!(!session_lock_held(&db, session), "the lock was let go");
    let records: i64 = sql(&db)
        .query_row(
            "SELECT count(*) FROM session_locks WHERE session = ?1",
            [session],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(records, 0);
}

/// Two sessions of one process: the one closed lets its lock go, the
/// other keeps its own, and its election is not taken over until its
/// process dies — in another process, and in this one (where a contender's
/// probe must not take the process's own locks for its own). A session
/// outlives the store handle that opened it: dropping the handle keeps its
/// lock, which is let go when the session is closed through another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_sessions_in_one_process_the_live_one_is_not_taken_over() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = db_in(&dir);

    let election = unique_election("two");
    let mut holder = Holder::start(&db, &election, LONG_TTL, "two");
    assert!(session_lock_held(&db, holder.session));
    assert!(
        !session_lock_held(&db, holder.session - 1),
        "the closed one"
    );
    let mut waiter = start_waiter(&db, &election);
    not_granted_for(&mut waiter, Duration::from_millis(1500), "the live session").await;
    holder.kill();
    granted_within(&mut waiter, FAST, "after SIGKILL").await;

    // The same in this process: two sessions on one handle.
    let election = unique_election("two-here");
    let first = SqliteStore::open(&db).expect("open");
    let closed = first.open_session(LONG_TTL).await.expect("open");
    let live = first.open_session(LONG_TTL).await.expect("open");
    first
        .campaign(live.id, &election, &CandidateId::new("a").expect("id"))
        .await
        .expect("campaign");
    first.close_session(closed.id).await.expect("close");
    let mut waiter = start_waiter(&db, &election);
    not_granted_for(
        &mut waiter,
        Duration::from_millis(1500),
        "a live session here",
    )
    .await;
    drop(first);
    not_granted_for(
        &mut waiter,
        Duration::from_millis(1000),
        "its handle dropped",
    )
    .await;
    let live_key = i64::try_from(live.id.0).expect("session id");
    assert!(session_lock_held(&db, live_key), "kept without its handle");
    let other = SqliteStore::open(&db).expect("open");
    other.close_session(live.id).await.expect("close");
    granted_within(&mut waiter, FAST, "after the close").await;
    assert!(!session_lock_held(&db, live_key), "let go by the close");
}

/// A helper process holding the session lock file (as `leasehold run`'s
/// guard does) keeps the sessions alive after their process died, until it
/// exits too; then the election is taken over at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helper_holding_the_lock_file_keeps_the_session_alive() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = db_in(&dir);
    let election = unique_election("helper");
    let mut holder = Holder::start(&db, &election, LONG_TTL, "helper");
    let helper = holder.helper.expect("a helper process");
    let mut waiter = start_waiter(&db, &election);
    not_granted_for(&mut waiter, Duration::from_millis(300), "before the kill").await;
    holder.kill();
    not_granted_for(&mut waiter, Duration::from_millis(1500), "the helper lives").await;
    assert!(session_lock_held(&db, holder.session));
    kill(helper, Signal::SIGKILL).expect("kill the helper");
    granted_within(&mut waiter, FAST, "after the helper was killed").await;
}

/// A session without a lock record is never taken for dead: it ends at
/// its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_without_a_lock_record_end_at_their_ttl() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = db_in(&dir);
    let election = unique_election("unrecorded");
    let ttl = Duration::from_secs(3);
    let mut holder = Holder::start(&db, &election, ttl, "one");
    let removed = sql(&db)
        .execute(
            "DELETE FROM session_locks WHERE session = ?1",
            [holder.session],
        )
        .expect("delete the record");
    assert_eq!(removed, 1);
    let killed_at = Instant::now();
    holder.kill();
    let mut waiter = start_waiter(&db, &election);
    not_granted_for(
        &mut waiter,
        Duration::from_millis(1500),
        "unrecorded session",
    )
    .await;
    let (granted_at, _) = granted_within(&mut waiter, FAST, "after the TTL").await;
    assert!(granted_at - killed_at >= ttl / 2);
}

/// The notify file is the one the session's lock was recorded on: after
/// it is deleted and made anew, nothing is locked in the new file, but a
/// live holder's record names the old one and is not tested, so it is not
/// taken for dead; once it is killed, its session ends at its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_recorded_on_another_notify_file_is_not_tested() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = db_in(&dir);
    let election = unique_election("renotified");
    let ttl = Duration::from_secs(3);
    let mut holder = Holder::start(&db, &election, ttl, "one");
    let recorded = std::fs::metadata(notify_of(&db)).expect("notify").ino();
    std::fs::remove_file(notify_of(&db)).expect("remove the notify file");
    let mut waiter = start_waiter(&db, &election);
    not_granted_for(
        &mut waiter,
        Duration::from_millis(1500),
        "another notify file",
    )
    .await;
    assert_ne!(
        std::fs::metadata(notify_of(&db))
            .expect("a new notify file")
            .ino(),
        recorded
    );
    assert!(
        !session_lock_held(&db, holder.session),
        "nothing locked in the new file"
    );
    let killed_at = Instant::now();
    holder.kill();
    let (granted_at, _) = granted_within(&mut waiter, FAST, "after the TTL").await;
    assert!(
        granted_at - killed_at >= Duration::from_millis(500),
        "granted {:?} after the kill: the record was tested against the new file",
        granted_at - killed_at
    );
}

/// The store primitive: a key of a session whose process was killed ends
/// at once, long before its TTL, and a watch of its prefix is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_ends_with_its_sessions_process() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("keys.db");
    let election = unique_election("key");
    let mut holder = Holder::start(&db, &election, LONG_TTL, "key");
    let keys = SqliteKeys::open(&db).expect("open");
    let prefix = format!("{election}/");
    let range = keys.range(&prefix).await.expect("range");
    assert_eq!(range.entries.len(), 1, "{range:?}");
    let mut watch = keys.watch(&prefix, range.revision).await.expect("watch");
    // The watch has read the key and asked the kernel about its session.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let killed = Instant::now();
    holder.kill();
    tokio::time::timeout(FAST, watch.changed())
        .await
        .expect("the death is told")
        .expect("watch open");
    let range = keys.range(&prefix).await.expect("range");
    assert!(range.entries.is_empty(), "{range:?}");
    eprintln!("told {:?} after the SIGKILL", killed.elapsed());
}
