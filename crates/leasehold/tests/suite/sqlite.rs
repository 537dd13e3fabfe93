//! The conformance suite on `sqlite:`, plus what only a file can get wrong.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use leasehold::Error;
use leasehold::backend::sqlite::SqliteStore;
use leasehold::store::Store;
use leasehold::testing::StoreHarness;

struct SqliteHarness {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl SqliteHarness {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("leasehold.db");
        SqliteHarness { _dir: dir, path }
    }
}

#[async_trait]
impl StoreHarness for SqliteHarness {
    async fn open(&self) -> Arc<dyn Store> {
        Arc::new(SqliteStore::open(&self.path).expect("open sqlite store"))
    }

    fn durable(&self) -> bool {
        true
    }

    fn campaigns_unwaited(&self) -> bool {
        true
    }
}

leasehold::conformance_tests!(async { SqliteHarness::new() });

/// Sets the store's revision counter (the last token given) by hand, as
/// an operator's own tools would: `value` is SQL.
fn set_revision(harness: &SqliteHarness, value: &str) {
    let set = rusqlite_conn(&harness.path)
        .execute(&format!("UPDATE revision SET value = {value}"), [])
        .expect("set the counter");
    assert_eq!(set, 1, "one revision row");
}

fn revision(harness: &SqliteHarness) -> rusqlite::types::Value {
    rusqlite_conn(&harness.path)
        .query_row("SELECT value FROM revision", [], |r| r.get(0))
        .expect("read the counter")
}

/// The revisions (the tokens) at the largest token: a grant gets it, and
/// the next change is refused as corrupt, naming the file, with nothing
/// written (before, a counter at its end overflowed into a REAL, read as
/// an outage and retried forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_revision_counter_is_corrupt() {
    let harness = SqliteHarness::new();
    let store = harness.open().await;
    let election = leasehold::testing::unique_election("exhausted");
    let ttl = std::time::Duration::from_secs(30);
    set_revision(&harness, &(i64::MAX - 1).to_string());
    let last = leasehold::testing::campaign_on_new_session(&*store, &election, "a", ttl).await;
    assert_eq!(last.token.to_i64(), Some(i64::MAX), "the largest token");
    match store.resign(&last).await {
        Err(Error::Corrupt(message)) => {
            assert!(message.contains("exhausted"), "{message}");
            assert!(
                message.contains(&harness.path.display().to_string()),
                "{message}"
            );
            assert!(!message.contains('\n'), "{message}");
        }
        other => panic!("a change past the largest revision must be Corrupt, got {other:?}"),
    }
    let elector = leasehold::Elector::new(
        Arc::clone(&store),
        candidate("b"),
        leasehold::LeaseConfig::new(ttl),
    )
    .expect("config");
    let other = leasehold::testing::unique_election("exhausted-other");
    match tokio::time::timeout(ttl / 2, elector.campaign(&other)).await {
        Ok(Err(Error::Corrupt(message))) => assert!(message.contains("exhausted"), "{message}"),
        other => panic!("a campaign past the largest revision must be Corrupt, got {other:?}"),
    }
    assert_eq!(store.leader(&other).await.expect("read"), None);
    assert_eq!(
        revision(&harness),
        rusqlite::types::Value::Integer(i64::MAX),
        "the counter changed"
    );
}

/// A revision counter that holds no count of grants (set by hand to a
/// text or a negative number) is corrupt: the campaign says so, and
/// writes nothing. Before, SQLite's `'many' + 1` granted token 1 again and
/// `-5 + 1` granted token 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_that_is_no_count_is_corrupt() {
    let harness = SqliteHarness::new();
    let store = harness.open().await;
    let election = leasehold::testing::unique_election("no-count");
    let ttl = std::time::Duration::from_secs(30);
    let first = leasehold::testing::campaign_on_new_session(&*store, &election, "a", ttl).await;
    store.resign(&first).await.expect("resign");
    let lease = store.open_session(ttl).await.expect("session");
    for (value, shown) in [("'many'", "the text \"many\""), ("-5", "-5")] {
        set_revision(&harness, value);
        let refused = store.campaign(lease.id, &election, &candidate("b")).await;
        match refused {
            Err(Error::Corrupt(message)) => {
                assert!(message.contains("no count of grants"), "{message}");
                assert!(message.contains(shown), "{message}");
                assert!(!message.contains('\n'), "{message}");
            }
            other => panic!("{value}: {other:?}"),
        }
        assert_eq!(
            store.leader(&election).await.expect("read"),
            None,
            "{value}"
        );
        let kept = rusqlite_conn(&harness.path)
            .query_row(
                "SELECT value = {value} FROM revision"
                    .replace("{value}", value)
                    .as_str(),
                [],
                |r| r.get::<_, bool>(0),
            )
            .expect("read the counter");
        assert!(kept, "{value}: the counter changed");
    }
}

/// A revision counter set back below a key's revision (by hand, under a
/// running leader) is no count of grants: a new candidate's key would get
/// a revision below the leader's, and lead beside it. The campaign is
/// refused as corrupt, and the leader stays the only one (found by a
/// review: two commands ran at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_set_back_below_a_key_is_corrupt() {
    let harness = SqliteHarness::new();
    let store = harness.open().await;
    let election = leasehold::testing::unique_election("set-back");
    let ttl = std::time::Duration::from_secs(30);
    for _ in 0..3 {
        let grant = leasehold::testing::campaign_on_new_session(&*store, &election, "a", ttl).await;
        store.resign(&grant).await.expect("resign");
    }
    let leader = leasehold::testing::campaign_on_new_session(&*store, &election, "a", ttl).await;
    set_revision(&harness, "0");
    let lease = store.open_session(ttl).await.expect("session");
    let refused = tokio::time::timeout(
        ttl / 2,
        store.campaign(lease.id, &election, &candidate("b")),
    )
    .await;
    match refused {
        Ok(Err(Error::Corrupt(message))) => {
            assert!(message.contains("below revision"), "{message}");
            assert!(!message.contains('\n'), "{message}");
        }
        other => panic!("a campaign on a counter set back must be Corrupt, got {other:?}"),
    }
    let holder = store
        .leader(&election)
        .await
        .expect("read")
        .expect("a leader");
    assert_eq!(holder.token, leader.token, "the leader changed");
    assert_eq!(
        revision(&harness),
        rusqlite::types::Value::Integer(0),
        "the counter changed"
    );
}

/// A path that starts with `//` (the same file as with one `/`) is taken
/// literally, read-only too (found by a review: the read-only open made it
/// a URI whose authority was the first folder, and failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_starting_with_two_slashes_is_taken_literally() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = PathBuf::from(format!("/{}", dir.path().join("slashes.db").display()));
    let election = leasehold::testing::unique_election("slashes");
    let ttl = std::time::Duration::from_secs(30);
    {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).expect("open"));
        let grant = leasehold::testing::campaign_on_new_session(&*store, &election, "a", ttl).await;
        store.resign(&grant).await.expect("resign");
        store.close_session(grant.session).await.expect("close");
    }
    let reader = SqliteStore::open_read_only(&path).expect("open read-only");
    assert_eq!(reader.leader(&election).await.expect("read"), None);
    drop(reader);
    drop(SqliteStore::open(&path).expect("open again"));
}

/// The local stores' watches are woken by the handle itself: a line on one
/// handle must not herd (see the case).
#[tokio::test]
async fn a_line_on_one_handle_reads_only_at_its_front() {
    leasehold::testing::a_line_on_one_handle_reads_only_at_its_front(&SqliteHarness::new()).await;
}

#[test]
fn a_directory_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let err = SqliteStore::open(dir.path()).expect_err("directory");
    assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
    assert!(err.to_string().contains("is a directory"), "{err}");
}

#[test]
fn an_unwritable_location_is_refused() {
    // /proc refuses new files even to root, unlike a chmod'ed folder.
    let err = SqliteStore::open("/proc/leasehold-test.db").expect_err("unwritable");
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("/proc/leasehold-test.db"), "{err}");
}

#[test]
fn a_file_that_is_not_sqlite_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("notes.txt");
    let content = "these are my notes, not a database\n".repeat(200);
    std::fs::write(&path, &content).expect("write");
    let err = SqliteStore::open(&path).expect_err("not sqlite");
    assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
    assert!(err.to_string().contains("not a SQLite database"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).expect("read"), content);
    assert!(!dir.path().join("notes.txt-wal").exists());
}

#[test]
fn another_programs_database_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("app.db");
    {
        let conn = rusqlite_conn(&path);
        conn.execute_batch(
            "CREATE TABLE users (id INTEGER PRIMARY KEY); INSERT INTO users VALUES (7);",
        )
        .expect("create");
    }
    let before = std::fs::read(&path).expect("read");
    let err = SqliteStore::open(&path).expect_err("foreign database");
    assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
    assert!(err.to_string().contains("another program"), "{err}");
    assert_eq!(std::fs::read(&path).expect("read"), before);
}

#[test]
fn a_future_schema_version_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("leasehold.db");
    drop(SqliteStore::open(&path).expect("create"));
    {
        let conn = rusqlite_conn(&path);
        conn.pragma_update(None, "user_version", 99)
            .expect("bump version");
    }
    let before = std::fs::read(&path).expect("read");
    let err = SqliteStore::open(&path).expect_err("future schema");
    assert!(
        matches!(
            err,
            Error::IncompatibleSchema {
                found: 99,
                supported: 1
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("upgrade leasehold"), "{err}");
    assert_eq!(std::fs::read(&path).expect("read"), before);
}

#[tokio::test]
async fn a_session_from_an_earlier_boot_is_expired() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("leasehold.db");
    let store = SqliteStore::open(&path).expect("open");
    let election = leasehold::testing::unique_election("boot");
    let grant = leasehold::testing::campaign_on_new_session(
        &store,
        &election,
        "a",
        std::time::Duration::from_secs(3600),
    )
    .await;
    // Rewrite the session as if written under another boot: its monotonic
    // expiry means nothing now.
    {
        let conn = rusqlite_conn(&path);
        conn.execute("UPDATE sessions SET boot_id = 'an-earlier-boot'", [])
            .expect("rewrite");
    }
    assert_eq!(store.leader(&election).await.expect("read"), None);
    assert!(matches!(
        store.keep_alive(grant.session).await,
        Err(Error::SessionExpired(_))
    ));
    let other = store
        .open_session(std::time::Duration::from_secs(60))
        .await
        .expect("open");
    let next = store
        .campaign(
            other.id,
            &election,
            &leasehold::CandidateId::new("b").expect("id"),
        )
        .await
        .expect("campaign");
    assert!(next.token > grant.token);
}

fn rusqlite_conn(path: &std::path::Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).expect("open with rusqlite")
}

/// Many processes starting at once on a new file: every open succeeds
/// (regression: reading the schema identity across two statements saw a
/// half-created schema, and switching to WAL reported "busy" at once).
#[test]
fn concurrent_first_opens_all_succeed() {
    for round in 0..5 {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("leasehold.db");
        let barrier = std::sync::Barrier::new(16);
        std::thread::scope(|s| {
            for _ in 0..16 {
                s.spawn(|| {
                    barrier.wait();
                    SqliteStore::open(&path)
                        .unwrap_or_else(|e| panic!("round {round}: concurrent open failed: {e}"));
                });
            }
        });
    }
}

// Issue 13: files leasehold did not create, and a store that changes under
// a running process.

const MINUTE: std::time::Duration = std::time::Duration::from_secs(60);

fn sibling(path: &std::path::Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn candidate(id: &str) -> leasehold::CandidateId {
    leasehold::CandidateId::new(id).expect("id")
}

#[test]
fn a_notify_file_holding_other_data_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("leasehold.db");
    let notify = sibling(&path, "-notify");
    std::fs::write(&notify, "someone's data\n").expect("write");
    let err = SqliteStore::open(&path).expect_err("a notify file leasehold did not create");
    assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("leasehold.db-notify holds other data, not leasehold's notify file"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&notify).expect("read"),
        "someone's data\n"
    );
    assert_eq!(
        listing(dir.path()),
        ["leasehold.db-notify"],
        "nothing created"
    );
}

#[test]
fn a_symlink_as_notify_file_is_refused_and_its_target_left_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("leasehold.db");
    let target = dir.path().join("target.txt");
    std::fs::write(&target, "the target's data\n").expect("write");
    std::os::unix::fs::symlink(&target, sibling(&path, "-notify")).expect("symlink");
    let err = SqliteStore::open(&path).expect_err("a symlink");
    assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("leasehold.db-notify is a symbolic link"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&target).expect("read"),
        "the target's data\n"
    );
}

#[test]
fn a_fifo_as_notify_file_is_refused_without_blocking() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("leasehold.db");
    nix::unistd::mkfifo(
        &sibling(&path, "-notify"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .expect("mkfifo");
    let (tx, rx) = std::sync::mpsc::channel();
    let opening = path.clone();
    std::thread::spawn(move || {
        let _ = tx.send(SqliteStore::open(&opening).map(drop));
    });
    let err = rx
        .recv_timeout(MINUTE)
        .expect("opening hung on the FIFO")
        .expect_err("a FIFO");
    assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
    assert!(err.to_string().contains("-notify is a FIFO"), "{err}");
}

#[test]
fn a_notify_file_of_another_user_is_refused() {
    if !nix::unistd::geteuid().is_root() {
        return; // only root can give a file to someone else
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("leasehold.db");
    drop(SqliteStore::open(&path).expect("create"));
    let notify = sibling(&path, "-notify");
    let before = std::fs::read(&notify).expect("read");
    nix::unistd::chown(&notify, Some(nix::unistd::Uid::from_raw(4242)), None).expect("chown");
    let err = SqliteStore::open(&path).expect_err("someone else's file");
    assert!(err.to_string().contains("belongs to user 4242"), "{err}");
    assert_eq!(std::fs::read(&notify).expect("read"), before);
}

/// The notify file is created complete, with a marker, and announcing
/// grants and releases never changes its content.
#[tokio::test]
async fn the_notify_file_is_created_with_a_marker_and_never_changed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("leasehold.db");
    let notify = sibling(&path, "-notify");
    let store = SqliteStore::open(&path).expect("open");
    let before = std::fs::read(&notify).expect("read");
    assert!(
        before.starts_with(b"\x01leasehold notify file\n"),
        "{before:?}"
    );
    let election = leasehold::testing::unique_election("notify");
    for _ in 0..3 {
        let grant =
            leasehold::testing::campaign_on_new_session(&store, &election, "a", MINUTE).await;
        store.resign(&grant).await.expect("resign");
        store.close_session(grant.session).await.expect("close");
    }
    assert_eq!(std::fs::read(&notify).expect("read"), before);
}

/// The database deleted (with its -wal and -shm) under a leader: the
/// store learns it at once, the session is over, and the old handle
/// neither writes nor creates anything any more.
#[tokio::test]
async fn a_deleted_database_ends_the_session_at_once_and_is_not_written() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("leasehold.db");
    let store = SqliteStore::open(&path).expect("open");
    let election = leasehold::testing::unique_election("deleted");
    let grant = leasehold::testing::campaign_on_new_session(&store, &election, "a", MINUTE).await;
    for suffix in ["", "-wal", "-shm"] {
        std::fs::remove_file(sibling(&path, suffix)).expect("remove");
    }
    tokio::time::timeout(MINUTE, store.session_ended(grant.session))
        .await
        .expect("the store did not notice that its file was deleted");
    assert!(
        matches!(
            store.keep_alive(grant.session).await,
            Err(Error::SessionExpired(_))
        ),
        "a renewal must report the session gone"
    );
    let err = store.leader(&election).await.expect_err("a dead handle");
    assert!(matches!(err, Error::Replaced(_)), "{err:?}");
    assert!(
        err.to_string().contains("it was deleted or moved away"),
        "{err}"
    );
    assert!(matches!(
        store.open_session(MINUTE).await,
        Err(Error::Replaced(_))
    ));
    assert!(matches!(
        store.resign(&grant).await,
        Err(Error::Replaced(_))
    ));
    store
        .close_session(grant.session)
        .await
        .expect("closing a session of a replaced file is not an error");
    assert!(!path.exists(), "the old handle created a file at the path");
}

/// Another program's database moved onto the path under a leader: the
/// leader's renewal fails before writing, its -wal is emptied so that
/// SQLite cannot pair it with that file, a new open refuses the file, and
/// the other program finds its database byte for byte as it was.
#[tokio::test]
async fn another_database_moved_onto_the_path_is_never_written() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("leasehold.db");
    let store = SqliteStore::open(&path).expect("open");
    let election = leasehold::testing::unique_election("moved");
    let grant = leasehold::testing::campaign_on_new_session(&store, &election, "a", MINUTE).await;
    let other = dir.path().join("app.db");
    rusqlite_conn(&other)
        .execute_batch("CREATE TABLE users (id INTEGER PRIMARY KEY); INSERT INTO users VALUES (7);")
        .expect("create");
    let before = std::fs::read(&other).expect("read");
    std::fs::rename(&other, &path).expect("move onto the store");
    assert!(matches!(
        store.keep_alive(grant.session).await,
        Err(Error::SessionExpired(_))
    ));
    let err = store.resign(&grant).await.expect_err("a dead handle");
    assert!(
        err.to_string().contains("another file is there now"),
        "{err}"
    );
    let err = SqliteStore::open(&path).expect_err("the other program's database");
    assert!(err.to_string().contains("another program"), "{err}");
    drop(store);
    assert_eq!(std::fs::read(&path).expect("read"), before);
    let conn = rusqlite_conn(&path);
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
    assert_eq!(ours, 0, "leasehold's tables appeared in the other database");
    drop(conn);
    assert_eq!(std::fs::read(&path).expect("read"), before);
}

/// While a process still uses the database that was at the path, a new
/// one is not created there (nor granted): the old holder may still lead.
/// Once it is gone, it is.
#[test]
fn a_new_database_waits_for_the_users_of_the_one_it_replaces() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("leasehold.db");
    let old = SqliteStore::open(&path).expect("open");
    for suffix in ["", "-wal", "-shm"] {
        std::fs::remove_file(sibling(&path, suffix)).expect("remove");
    }
    let err = SqliteStore::open(&path).expect_err("created while the old one is in use");
    assert!(err.is_transient(), "{err:?}");
    assert!(
        err.to_string()
            .contains("processes still use the database that was at this path before"),
        "{err}"
    );
    drop(old);
    SqliteStore::open(&path).expect("created once the old one's users are gone");
}

/// Read-only opens (`status`, `list`, `observe`) create nothing: no file,
/// no folder, no schema in an empty file, no notify file; a store that
/// does not exist is `NotFound`.
#[tokio::test]
async fn a_read_only_open_creates_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    for path in [dir.path().join("x.db"), dir.path().join("sub").join("x.db")] {
        let url = leasehold::StoreUrl::Sqlite(path.clone());
        let err = leasehold::store::open(&url, leasehold::store::Access::ReadOnly)
            .await
            .expect_err("missing");
        assert!(matches!(err, Error::NotFound(_)), "{err:?}");
        assert!(err.to_string().contains("does not exist"), "{err}");
    }
    assert!(listing(dir.path()).is_empty(), "{:?}", listing(dir.path()));

    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, "").expect("write");
    let err = SqliteStore::open_read_only(&empty).expect_err("empty");
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    assert!(err.to_string().contains("the file is empty"), "{err}");
    assert_eq!(std::fs::metadata(&empty).expect("stat").len(), 0);

    // An empty SQLite database: no leasehold schema is added.
    let blank = dir.path().join("blank.db");
    rusqlite_conn(&blank)
        .pragma_update(None, "journal_mode", "WAL")
        .expect("write a header");
    let before = std::fs::read(&blank).expect("read");
    let err = SqliteStore::open_read_only(&blank).expect_err("no schema");
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    assert_eq!(std::fs::read(&blank).expect("read"), before);
    assert_eq!(listing(dir.path()), ["blank.db", "empty.db"]);
}

#[tokio::test]
async fn a_read_only_store_reads_and_refuses_to_write() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("leasehold.db");
    let writer = SqliteStore::open(&path).expect("open");
    let election = leasehold::testing::unique_election("ro");
    let grant = leasehold::testing::campaign_on_new_session(&writer, &election, "a", MINUTE).await;
    let reader = SqliteStore::open_read_only(&path).expect("open read-only");
    let leader = reader.leader(&election).await.expect("read").expect("led");
    assert_eq!(leader.token, grant.token);
    assert_eq!(reader.elections().await.expect("list").len(), 1);
    let watch = reader.watch_status(&election).await.expect("watch");
    assert_eq!(watch.borrow().leader().map(|l| l.token), Some(grant.token));
    for err in [
        reader.open_session(MINUTE).await.expect_err("session"),
        reader
            .campaign(grant.session, &election, &candidate("b"))
            .await
            .expect_err("campaign"),
        reader.resign(&grant).await.expect_err("resign"),
    ] {
        assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
        assert!(err.to_string().contains("read-only"), "{err}");
    }
    assert_eq!(
        writer
            .leader(&election)
            .await
            .expect("read")
            .map(|l| l.token),
        Some(grant.token)
    );
}

/// Another program's WAL-mode database whose tables are still only in its
/// `-wal` (not checkpointed): built the way the program would, with
/// automatic checkpoints off. Returns the database's path.
fn foreign_wal_database(dir: &std::path::Path) -> PathBuf {
    let source = dir.join("source").join("w.db");
    std::fs::create_dir(source.parent().expect("parent")).expect("mkdir");
    let conn = rusqlite_conn(&source);
    conn.pragma_update(None, "journal_mode", "WAL")
        .expect("wal");
    conn.pragma_update(None, "wal_autocheckpoint", 0)
        .expect("no autocheckpoint");
    conn.execute_batch("CREATE TABLE t (x)").expect("create");
    conn.execute_batch("BEGIN").expect("begin");
    for i in 0..50 {
        conn.execute("INSERT INTO t VALUES (?1)", [i])
            .expect("insert");
    }
    conn.execute_batch("COMMIT").expect("commit");
    let path = dir.join("p.db");
    std::fs::copy(&source, &path).expect("copy the database");
    std::fs::copy(sibling(&source, "-wal"), sibling(&path, "-wal")).expect("copy its WAL");
    drop(conn);
    std::fs::remove_dir_all(source.parent().expect("parent")).expect("clean up");
    path
}

/// Another program's WAL-mode database whose tables exist only in its
/// `-wal` is refused — for writing and for reading — and left byte for
/// byte as it was, with no file added next to it (before: the refusing
/// connection checkpointed the WAL into the database on closing and
/// deleted the `-wal`, and read-only opens left a `-shm`).
#[test]
fn a_foreign_database_only_in_its_wal_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = foreign_wal_database(dir.path());
    let wal = sibling(&path, "-wal");
    let (db_before, wal_before) = (
        std::fs::read(&path).expect("read"),
        std::fs::read(&wal).expect("read"),
    );
    assert!(!wal_before.is_empty(), "the WAL holds the tables");
    let files = listing(dir.path());
    assert_eq!(files, ["p.db", "p.db-wal"]);
    for read_only in [false, true] {
        let err = if read_only {
            SqliteStore::open_read_only(&path).expect_err("foreign, read-only")
        } else {
            SqliteStore::open(&path).expect_err("foreign")
        };
        assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
        assert!(
            err.to_string()
                .contains("a SQLite database of another program"),
            "{err}"
        );
        assert_eq!(std::fs::read(&path).expect("read"), db_before, "db written");
        assert_eq!(
            std::fs::read(&wal).expect("read"),
            wal_before,
            "wal written"
        );
        assert_eq!(listing(dir.path()), files, "read-only {read_only}");
    }
    // The other program still sees its rows.
    let rows: i64 = rusqlite_conn(&path)
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .expect("its table");
    assert_eq!(rows, 50);
}

/// A `-wal`, `-journal` or `-shm` next to a database that does not exist
/// yet (or is empty) is refused, in one line naming it, and left alone
/// (before: SQLite deleted it while creating the database) — unless
/// leasehold's notify file shows it is leasehold's own leftover.
#[test]
fn a_foreign_sibling_of_a_new_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("k.db");
    for suffix in ["-wal", "-journal", "-shm"] {
        let foreign = sibling(&path, suffix);
        std::fs::write(&foreign, "foreign wal\n").expect("write");
        for empty in [false, true] {
            if empty {
                std::fs::write(&path, "").expect("an empty database file");
            }
            let err = SqliteStore::open(&path).expect_err("foreign sibling");
            assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
            let text = err.to_string();
            assert!(text.contains(&format!("k.db{suffix} exists")), "{text}");
            assert_eq!(text.lines().count(), 1, "{text}");
            assert_eq!(
                std::fs::read_to_string(&foreign).expect("read"),
                "foreign wal\n"
            );
            let mut expected = vec![format!("k.db{suffix}")];
            if empty {
                expected.insert(0, "k.db".to_owned());
                assert_eq!(std::fs::metadata(&path).expect("stat").len(), 0);
            }
            assert_eq!(listing(dir.path()), expected);
            if empty {
                std::fs::remove_file(&path).expect("remove");
            }
        }
        std::fs::remove_file(&foreign).expect("remove");
    }
    // leasehold's own leftover: its notify file is next to it.
    drop(SqliteStore::open(&path).expect("create"));
    std::fs::remove_file(&path).expect("remove the database");
    std::fs::write(sibling(&path, "-wal"), "").expect("a leftover WAL");
    SqliteStore::open(&path).expect("leasehold's leftover is fine");
}

/// A symbolic link to a database is followed as SQLite follows it: the
/// files next to the database are checked where SQLite puts them, next to
/// the file the link names. Another program's WAL database behind a link
/// is refused and left as it was, with nothing added next to it (before:
/// a `-shm` appeared next to it, and reading called it "no leasehold
/// database yet"); leasehold's own database behind a link is used.
#[test]
fn a_symbolic_link_is_checked_where_it_leads() {
    let dir = tempfile::tempdir().expect("temp dir");
    let target = foreign_wal_database(dir.path());
    let link = dir.path().join("link.db");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let files = listing(dir.path());
    let before = std::fs::read(&target).expect("read");
    for read_only in [false, true] {
        let err = if read_only {
            SqliteStore::open_read_only(&link).expect_err("foreign, read-only")
        } else {
            SqliteStore::open(&link).expect_err("foreign")
        };
        assert!(
            err.to_string()
                .contains("a SQLite database of another program"),
            "{err}"
        );
        assert_eq!(listing(dir.path()), files, "read-only {read_only}");
        assert_eq!(std::fs::read(&target).expect("read"), before);
    }
    let ours = dir.path().join("ours.db");
    drop(SqliteStore::open(&ours).expect("create"));
    let ours_link = dir.path().join("ours-link.db");
    std::os::unix::fs::symlink(&ours, &ours_link).expect("symlink");
    let store = SqliteStore::open(&ours_link).expect("leasehold's own, behind a link");
    assert_eq!(
        store.path(),
        std::fs::canonicalize(&ours).expect("real path")
    );
}

/// Campaigns made at once through one handle share transactions (one synced
/// commit for many commits). Within them each commit stands alone: among
/// sessions racing for one election exactly one is granted, the others
/// wait; a session that ended is refused without failing the commits
/// made with it; and every other election is granted once, each with a
/// token of its own (a revision each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_made_together_stand_alone() {
    use std::time::Duration;

    use leasehold::ElectionName;

    let harness = SqliteHarness::new();
    let store = harness.open().await;
    let contested = ElectionName::new("together/contested").expect("name");
    let ended = store
        .open_session(Duration::from_secs(30))
        .await
        .expect("session");
    store.close_session(ended.id).await.expect("close");
    let mut sessions = Vec::new();
    for _ in 0..20 {
        sessions.push(
            store
                .open_session(Duration::from_secs(30))
                .await
                .expect("session")
                .id,
        );
    }
    let mut last_first = 0;
    for round in 0..5_u64 {
        let (won, mut winners) = tokio::sync::mpsc::unbounded_channel();
        let (owned, mut own_tokens) = tokio::sync::mpsc::unbounded_channel();
        let mut racing = tokio::task::JoinSet::new();
        for (i, &session) in sessions.iter().enumerate() {
            let (store, contested, won) = (Arc::clone(&store), contested.clone(), won.clone());
            let owned = owned.clone();
            racing.spawn(async move {
                let who = candidate(&format!("c{i}"));
                let own = ElectionName::new(format!("together/{round}/{i}")).expect("name");
                let mine = store.campaign(session, &own, &who).await;
                let mine = mine.expect("an election nobody else wants is granted");
                let _ = owned.send(mine.token.0);
                let _ = won.send(store.campaign(session, &contested, &who).await);
            });
        }
        let refused = store
            .campaign(
                ended.id,
                &ElectionName::new(format!("together/{round}/ended")).expect("name"),
                &candidate("gone"),
            )
            .await;
        assert!(
            matches!(refused, Err(Error::SessionExpired(_))),
            "a campaign on an ended session: {refused:?}"
        );
        let first = tokio::time::timeout(Duration::from_secs(15), winners.recv())
            .await
            .expect("the free election is granted")
            .expect("a winner")
            .expect("campaign");
        assert!(first.token.0 > last_first, "{first:?} after {last_first}");
        last_first = first.token.0;
        // Any other grant would come with the first.
        tokio::time::sleep(Duration::from_millis(300)).await;
        racing.abort_all();
        while let Some(joined) = racing.join_next().await {
            if let Err(error) = joined
                && error.is_panic()
            {
                std::panic::resume_unwind(error.into_panic());
            }
        }
        drop(won);
        let mut others = Vec::new();
        while let Some(other) = winners.recv().await {
            others.push(other);
        }
        assert!(others.is_empty(), "granted with {first:?}: {others:?}");
        drop(owned);
        let mut tokens = Vec::new();
        while let Some(token) = own_tokens.recv().await {
            tokens.push(token);
        }
        tokens.sort_unstable();
        tokens.dedup();
        assert_eq!(tokens.len(), sessions.len(), "round {round}: {tokens:?}");
        store.resign(&first).await.expect("resign");
    }
}

/// One file reached by two names (here a hard link in another folder):
/// each name would have its own `-wal`, `-shm` and `-notify`, and so its
/// own leader with the same token. While one name is in use, the other is
/// refused, for reading too, naming the first; once the first is no longer
/// used, the other may be, and then refuses the first.
#[test]
fn a_database_reached_by_a_second_name_is_refused_naming_the_first() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (real, other) = (dir.path().join("real"), dir.path().join("other"));
    std::fs::create_dir_all(&real).expect("mkdir");
    std::fs::create_dir_all(&other).expect("mkdir");
    let (first, second) = (real.join("db"), other.join("db"));
    let holder = SqliteStore::open(&first).expect("open the first name");
    std::fs::hard_link(&first, &second).expect("link");
    let before = listing(&other);
    refused_both_ways(&second, &first);
    assert_eq!(listing(&other), before, "the refused name created files");
    // Another handle of the first name is no second name.
    drop(open_once_unused(&first));
    drop(holder);
    let now = SqliteStore::open(&second).expect("the other name, once the first is unused");
    match SqliteStore::open(&first) {
        Err(Error::Conflict(message)) => {
            assert!(message.contains(&second.display().to_string()), "{message}");
        }
        other => panic!("the first name was opened beside the second: {other:?}"),
    }
    drop(now);
}

/// A `-wal` or `-shm` next to the database that another user put there (in
/// a folder others may write), or a symbolic link in their place: SQLite
/// would replay such a `-wal` into the database, rolling its token
/// counters back, or lock the owners out with such a `-shm`. Refused,
/// for reading too, and left as it was.
#[test]
fn a_wal_or_shm_of_another_user_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("db");
    drop(SqliteStore::open(&path).expect("create"));
    for suffix in ["-wal", "-shm", "-journal"] {
        let planted = sibling(&path, suffix);
        std::fs::write(&planted, b"forged").expect("plant");
        nix::unistd::chown(&planted, Some(nix::unistd::Uid::from_raw(65534)), None)
            .expect("chown (the tests run as root)");
        for read_only in [false, true] {
            let err = if read_only {
                SqliteStore::open_read_only(&path).expect_err("planted, read-only")
            } else {
                SqliteStore::open(&path).expect_err("planted")
            };
            assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
            assert!(err.to_string().contains("belongs to user 65534"), "{err}");
        }
        assert_eq!(std::fs::read(&planted).expect("read"), b"forged");
        std::fs::remove_file(&planted).expect("remove");
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &planted).expect("symlink");
        let err = SqliteStore::open(&path).expect_err("a symbolic link");
        assert!(err.to_string().contains("is a symbolic link"), "{err}");
        assert!(!dir.path().join("elsewhere").exists());
        std::fs::remove_file(&planted).expect("remove");
    }
    drop(SqliteStore::open(&path).expect("usable once they are gone"));
}

/// A `-wal` left at one name by processes that did not close the file,
/// after another name used the file (so the file no longer records the
/// first name): replayed when the first name is opened again, it would
/// roll back what the other name wrote (its grants forgotten, their tokens
/// granted again). Opening the first name is refused instead, and nothing
/// is written; once that -wal is moved away, it opens with the other
/// name's grant kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_left_before_another_name_used_the_file_is_not_replayed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (real, other) = (dir.path().join("real"), dir.path().join("other"));
    std::fs::create_dir_all(&real).expect("mkdir");
    std::fs::create_dir_all(&other).expect("mkdir");
    let (first, second) = (real.join("db"), other.join("db"));
    let ttl = std::time::Duration::from_secs(30);
    let (old, new) = (
        leasehold::testing::unique_election("before"),
        leasehold::testing::unique_election("after"),
    );
    let a = SqliteStore::open(&first).expect("open the first name");
    leasehold::testing::campaign_on_new_session(&a, &old, "a", ttl).await;
    // What the first name's -wal held then: frames older than what the
    // second name writes below.
    let left = std::fs::read(sibling(&first, "-wal")).expect("read the -wal");
    assert!(!left.is_empty(), "the grant is not in a -wal");
    drop(a);
    std::fs::hard_link(&first, &second).expect("link");
    let b = open_once_unused(&second);
    let granted = leasehold::testing::campaign_on_new_session(&b, &new, "b", ttl).await;
    drop(b);
    std::fs::write(sibling(&first, "-wal"), &left).expect("leave the old -wal");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let refused = loop {
        match SqliteStore::open(&first) {
            Err(Error::Conflict(message)) if message.contains("in use now") => {
                assert!(std::time::Instant::now() < deadline, "{message}");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => break other,
        }
    };
    match refused {
        Err(Error::Conflict(message)) => {
            assert!(
                message.contains("does not record that it was theirs"),
                "{message}"
            );
        }
        other => panic!("the first name was opened over an old -wal: {other:?}"),
    }
    assert_eq!(
        std::fs::read(sibling(&first, "-wal")).expect("the -wal"),
        left,
        "the -wal was changed"
    );
    std::fs::remove_file(sibling(&first, "-wal")).expect("move it away");
    drop(SqliteStore::open(&first).expect("the first name, the -wal moved away"));
    // The grant's key, created at the revision that is its token.
    let last = rusqlite_conn(&first)
        .query_row(
            "SELECT created FROM keys WHERE created = ?1",
            [i64::try_from(granted.token.0).expect("a token")],
            |r| r.get::<_, i64>(0),
        )
        .ok();
    assert_eq!(
        last,
        Some(i64::try_from(granted.token.0).expect("a token")),
        "the second name's grant was rolled back"
    );
}

/// Opens `path` once the handles of another name, dropped just before,
/// have closed (their sessions' threads end soon after).
fn open_once_unused(path: &std::path::Path) -> SqliteStore {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match SqliteStore::open(path) {
            Err(Error::Conflict(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            opened => return opened.expect("a name, once the other is unused"),
        }
    }
}

/// Two file names in `dir` whose lock bytes are one: FNV-1a (64 bits) of
/// the folder's device and inode and the file name, kept to 32 bits, as
/// anyone who reads the database's `name_in_use` table can work out.
fn colliding_names(dir: &std::path::Path) -> (String, String) {
    let folder = FolderHash::of(dir);
    let mut seen = std::collections::HashMap::new();
    for i in 0u64.. {
        let name = format!("n{i}.db");
        if let Some(first) = seen.insert(lock_byte_with(&folder, &name), name.clone()) {
            return (first, name);
        }
    }
    unreachable!("the names run out")
}

/// Two names of one file chosen so that they lock the same byte: the
/// second is refused all the same, naming the first, whether the first
/// leads or has just started (before: both led, with token 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_names_that_lock_one_byte_are_two_names_all_the_same() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (a, b) = colliding_names(dir.path());
    let (first, second) = (dir.path().join(&a), dir.path().join(&b));
    let holder = SqliteStore::open(&first).expect("open the first name");
    let election = leasehold::testing::unique_election("collide");
    leasehold::testing::campaign_on_new_session(&holder, &election, "a", LONG).await;
    std::fs::hard_link(&first, &second).expect("link");
    refused_both_ways(&second, &first);
    // The other way round, while the first name's writers open at once.
    drop(holder);
    let opened: Vec<_> = std::thread::scope(|s| {
        let one = s.spawn(|| SqliteStore::open(&second));
        let two = s.spawn(|| SqliteStore::open(&first));
        vec![one.join().expect("join"), two.join().expect("join")]
    });
    assert!(
        opened.iter().filter(|o| o.is_ok()).count() <= 1,
        "both names were opened at once: {opened:?}"
    );
}

/// Two names that lock one byte, whose writers open at once while a
/// reader of one holds the byte (shared, with no record in the file): one
/// name is opened, the other refused (before: both found the byte shared
/// and no record, and both were opened).
#[test]
fn beside_a_reader_two_names_that_lock_one_byte_are_not_opened_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (a, b) = colliding_names(dir.path());
    let (first, second) = (dir.path().join(&a), dir.path().join(&b));
    drop(SqliteStore::open(&first).expect("create"));
    std::fs::hard_link(&first, &second).expect("link");
    let reader = SqliteStore::open_read_only(&first).expect("read the first name");
    for round in 0..5 {
        let opened: Vec<_> = std::thread::scope(|s| {
            let one = s.spawn(|| SqliteStore::open(&second));
            let two = s.spawn(|| SqliteStore::open(&first));
            vec![one.join().expect("join"), two.join().expect("join")]
        });
        let refused: Vec<_> = opened.iter().filter_map(|o| o.as_ref().err()).collect();
        assert_eq!(
            refused.len(),
            1,
            "round {round}: not one name was opened, refused: {refused:?}"
        );
    }
    drop(reader);
}

/// The last writer of a name closes cleanly while a reader of the name
/// still has the database open: once the reader is gone too, another name
/// may be used (before: it was refused as if the writer had been killed).
#[test]
fn a_reader_left_open_does_not_keep_the_record_of_a_clean_close() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (real, other) = (dir.path().join("real"), dir.path().join("other"));
    std::fs::create_dir_all(&real).expect("mkdir");
    std::fs::create_dir_all(&other).expect("mkdir");
    let (first, second) = (real.join("db"), other.join("db"));
    let writer = SqliteStore::open(&first).expect("open the first name");
    let reader = SqliteStore::open_read_only(&first).expect("read the first name");
    drop(writer);
    std::fs::hard_link(&first, &second).expect("link");
    // Make the first name's folder invisible from the second name, as in
    // another container: only the record can tell that it closed.
    std::fs::rename(&real, dir.path().join("gone")).expect("move the first name away");
    drop(reader);
    drop(open_once_unused(&second));
}

const LONG: std::time::Duration = std::time::Duration::from_secs(30);

/// The lock byte of the name `file` in `dir` (see `colliding_names`).
fn lock_byte(dir: &std::path::Path, file: &str) -> i64 {
    lock_byte_with(&FolderHash::of(dir), file)
}

/// FNV-1a (64 bits) of a folder's device and inode, to which a file name
/// is added (see `lock_byte`).
struct FolderHash(u64);

impl FolderHash {
    fn of(dir: &std::path::Path) -> Self {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(dir).expect("stat");
        let bytes = meta.dev().to_le_bytes().into_iter();
        FolderHash(fnv(
            0xcbf2_9ce4_8422_2325,
            bytes.chain(meta.ino().to_le_bytes()),
        ))
    }
}

fn fnv(mut hash: u64, bytes: impl Iterator<Item = u8>) -> u64 {
    for b in bytes {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

fn lock_byte_with(folder: &FolderHash, file: &str) -> i64 {
    let hash = fnv(folder.0, file.bytes());
    (1i64 << 40) + i64::try_from(hash & 0xffff_ffff).expect("32 bits")
}

/// A process killed after writing its path's record into the `-wal` and
/// before that record reached the file (a few milliseconds into its
/// start): the `-wal` holds this path's and this file's record only, so
/// the file is opened at its path again (before: refused as another
/// file's `-wal`, until someone moved it away).
#[test]
fn a_record_that_did_not_reach_the_file_before_a_kill_keeps_the_path_usable() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("db");
    drop(SqliteStore::open(&path).expect("create"));
    let as_i64 = |n: u64| i64::from_ne_bytes(n.to_ne_bytes());
    let (folder, file) = (
        std::fs::metadata(dir.path()).expect("stat"),
        std::fs::metadata(&path).expect("stat"),
    );
    // What the killed process left: its record in the -wal alone.
    let conn = rusqlite_conn(&path);
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )
    .expect("no checkpoint on close");
    conn.execute(
        "INSERT INTO name_in_use (one, dev, ino, byte, path, file_dev, file_ino)
         VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6)",
        rusqlite::params![
            as_i64(folder.dev()),
            as_i64(folder.ino()),
            lock_byte(dir.path(), "db"),
            std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()),
            as_i64(file.dev()),
            as_i64(file.ino())
        ],
    )
    .expect("the record");
    drop(conn);
    assert!(
        std::fs::metadata(sibling(&path, "-wal")).is_ok_and(|m| m.len() > 0),
        "no -wal was left"
    );
    drop(SqliteStore::open(&path).expect("the file at its own path"));
}

/// Opening `second`, for writing and for reading, is refused as a second
/// name of the file in use as `first`, naming it, with nothing written.
fn refused_both_ways(second: &std::path::Path, first: &std::path::Path) {
    for read_only in [false, true] {
        let refused = if read_only {
            SqliteStore::open_read_only(second)
        } else {
            SqliteStore::open(second)
        };
        match refused {
            Err(Error::Conflict(message)) => {
                assert!(
                    message.contains(&format!("in use now as {}", first.display())),
                    "{message}"
                );
                assert!(message.contains("nothing was written"), "{message}");
            }
            other => panic!("a second name was opened (read-only: {read_only}): {other:?}"),
        }
    }
}

/// `SqliteStore::until_file_gone` stays pending while the path leads to
/// the file, whatever is written to it, and resolves once it does not: the
/// file moved away, and a folder further up moved (which inotify on the
/// file's folder does not see).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_file_gone_resolves_once_the_path_leads_elsewhere() {
    use std::time::Duration;
    let dir = tempfile::tempdir().expect("temp dir");
    let folder = dir.path().join("up").join("store");
    std::fs::create_dir_all(&folder).expect("mkdir");
    let path = folder.join("db");
    drop(SqliteStore::open(&path).expect("create"));
    let gone = SqliteStore::until_file_gone(&path).expect("the path leads to a file");
    tokio::pin!(gone);
    std::fs::write(folder.join("other"), "x").expect("a file beside it");
    drop(SqliteStore::open(&path).expect("open again"));
    assert!(
        tokio::time::timeout(Duration::from_millis(600), &mut gone)
            .await
            .is_err(),
        "resolved while the path still leads to the file"
    );
    std::fs::rename(&path, folder.join("moved")).expect("move the file away");
    tokio::time::timeout(LONG, &mut gone)
        .await
        .expect("resolves once the file is moved away");

    let again = SqliteStore::until_file_gone(&folder.join("moved")).expect("a file");
    std::fs::rename(dir.path().join("up"), dir.path().join("elsewhere")).expect("move up");
    tokio::time::timeout(LONG, again)
        .await
        .expect("resolves once a folder further up is moved");
}
