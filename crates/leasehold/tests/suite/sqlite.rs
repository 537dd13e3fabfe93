//! The conformance suite on `sqlite:`, plus what only a file can get wrong.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use leasehold::Error;
use leasehold::store::Store;
use leasehold::store::sqlite::SqliteStore;
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
}

leasehold::conformance_tests!(async { SqliteHarness::new() });

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
