//! `sqlite:PATH` — the embedded store: many processes on one host share one
//! database file.
//!
//! - [`SqliteStore`] is the elections written once above the store
//!   primitive ([`KeyedStore`]); [`SqliteKeys`] is the primitive on the
//!   file (see `primitive`): a commit is one `BEGIN IMMEDIATE` transaction
//!   (SQLite's write lock is the compare-and-swap), and commits asked for
//!   at once share one (see `commits`).
//! - Tokens are revisions: one store-wide counter, never reset, so tokens
//!   survive every process restarting.
//! - Expiry runs on the host's `CLOCK_MONOTONIC`, the clock every process on
//!   the host shares and the one the elector's deadlines use, never wall
//!   time. Every session row is tagged with the kernel's boot id: a session
//!   written under an earlier boot is expired (its monotonic times mean
//!   nothing now).
//! - Commits are fully synced (`synchronous=FULL`): a token handed out is
//!   never handed out again, even after a power loss.
//! - Watches learn of other processes' commits from inotify on the
//!   database's folder (see `notify`), and of expiries by sleeping until
//!   the session's known expiry time: no polling period (see `following`).
//! - A holder whose process died is found by the kernel, not by its TTL:
//!   each session holds a lock on one byte of `<db>-notify` that the kernel
//!   ends with its process, taken before the session's row commits. A
//!   reader that finds the lock gone takes the session's keys for dead at
//!   once, and the next commit or watch ends the session; watches learn of
//!   the death from a thread blocked on that lock. A stopped or slow
//!   process keeps its lock, and a pid plays no part (see `liveness`).
//!
//! leasehold writes only files it created (DESIGN rule 7):
//!
//! - What the path holds is checked from the file's own header before
//!   SQLite reads it: a file that is not SQLite, or another program's
//!   database, is refused untouched. (SQLite pairs a database with the
//!   `-wal` file next to it by name alone: another program's database moved
//!   onto the path of a running store showed — and on the next checkpoint
//!   got — leasehold's tables.) Read through SQLite, the database must then
//!   still be a leasehold database, or empty, in the file itself too.
//! - The path must keep naming the file opened: its device and inode are
//!   compared with the open file's before every operation, and again
//!   before every commit, and inotify reports a deletion or a rename at
//!   once ([`Keys::session_ended`](crate::store::keys::Keys::session_ended)).
//!   Once the path names another file (or none), the handle is dead:
//!   renewals fail with
//!   [`Error::SessionExpired`], so leaders step down at once, everything
//!   else with [`Error::Replaced`], and nothing more is written — except
//!   that the handle empties its own `-wal` (a checkpoint into its own
//!   file, through SQLite's open descriptors), so that SQLite never pairs
//!   it with the new file.
//! - A new database is created only under the exclusive generation lock on
//!   the notify file, which every process using the database holds shared:
//!   while a process still uses an earlier database at the path, a new one
//!   is neither created nor granted (see `notify`).
//! - [`SqliteStore::open_read_only`] creates nothing, writes nothing, and
//!   reports a missing or empty file as [`Error::NotFound`].

use std::fs::{File, Metadata, OpenOptions};
use std::future::Future;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::mutex::lock;
use std::time::Duration;

use crate::watch;
use async_trait::async_trait;
use nix::fcntl::{FcntlArg, OFlag};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior, params};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::clock::host_monotonic_ns as monotonic_ns;
use crate::config::{CheckedTtl, StoreTtl};
use crate::error::{Error, Result};
use crate::store::keyed::KeyedStore;
use crate::store::{SessionId, SessionLease, session_key};
use liveness::Process;

mod batches;
mod commits;
mod db;
mod file;
mod following;
mod liveness;
mod names;
mod notify;
mod primitive;
mod reading;
mod sessions;

use file::*;
use sessions::*;

/// How SQLite keeps a TTL: as milliseconds, and expiry times as
/// nanoseconds of the monotonic clock in an `i64`.
const TTL: StoreTtl = StoreTtl {
    store: "SQLite",
    unit: Duration::from_millis(1),
    max: Duration::from_nanos(i64::MAX.unsigned_abs()),
};

/// The schema version this build writes and understands.
const SCHEMA_VERSION: i64 = 1;
/// `PRAGMA application_id` of a leasehold database ("LSHD").
const APPLICATION_ID: i64 = 0x4c53_4844;
/// How long a statement waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a `-journal`, `-wal` or `-shm` next to a missing or empty
/// database may stay before it is taken for another program's (one that
/// another leasehold process is creating the database with goes within
/// milliseconds).
const SIBLING_SETTLE: Duration = Duration::from_secs(2);
/// How long creating a new database waits for the processes that still use
/// an earlier one at the same path to stop.
const GENERATION_WAIT: Duration = Duration::from_secs(5);
/// When a process still waiting for [`GENERATION_WAIT`] says so: well after
/// another's [`FIRST_USE_WAIT`].
const GENERATION_WARN: Duration = Duration::from_secs(1);

/// How long a handle waits, from opening the file its path leads to, before
/// its first campaign: the path may have led to another file until just
/// before (a folder on the way moved or mounted over, taking that file's
/// `-notify` with it), whose leader nothing here tells of — whatever
/// processes use this file already, through this name or the folder's old
/// one. That leader's guard looks the path up every
/// [`notify::PATH_RECHECK`] and kills its command once the path leads
/// elsewhere: this wait lets it, before a new leader can be granted here
/// (with token 1 again). Waiters opened earlier campaign at once.
const FIRST_USE_WAIT: Duration = Duration::from_millis(300);

/// The schema, version 1, created in one transaction with
/// [`names::TABLE`]:
/// - `sessions`, and `session_locks`: the sessions whose process holds a
///   lock on the notify file (device `dev`, inode `ino`) that the kernel
///   ends with the process (see `liveness`); rows whose session is gone
///   are deleted with the expired sessions;
/// - the store primitive (see `primitive`): `revision`, the last revision
///   given (store-wide, never reset: the fencing tokens); `keys`, each
///   perhaps attached to a session, with the revisions of the commits
///   that created it and last wrote it (a key of an ended session is dead:
///   reads and checks skip it, and the commit that next writes it
///   replaces it); and `deletions`, the revision each key was last deleted
///   at, so that a watch that starts late reads whether its prefix changed
///   after a revision.
const SCHEMA: &str = "
CREATE TABLE sessions (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    boot_id       TEXT    NOT NULL,
    expires_at_ns INTEGER NOT NULL,
    ttl_ms        INTEGER NOT NULL,
    pid           INTEGER NOT NULL
);
CREATE TABLE session_locks (
    session INTEGER PRIMARY KEY,
    dev     INTEGER NOT NULL,
    ino     INTEGER NOT NULL
);
CREATE TABLE revision (value INTEGER NOT NULL);
INSERT INTO revision (value) VALUES (0);
CREATE TABLE keys (
    key      TEXT    PRIMARY KEY,
    value    TEXT    NOT NULL,
    session  INTEGER,
    created  INTEGER NOT NULL,
    modified INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX keys_by_session ON keys (session);
CREATE INDEX keys_by_modified ON keys (modified);
CREATE TABLE deletions (
    key      TEXT    PRIMARY KEY,
    revision INTEGER NOT NULL
) WITHOUT ROWID;
";

/// The embedded SQLite store: the elections written once over the store
/// primitive ([`KeyedStore`]), on a database file ([`SqliteKeys`]).
pub type SqliteStore = KeyedStore<SqliteKeys>;

/// The store primitive on a SQLite database file. Cloning gives another
/// handle onto the same connection.
#[derive(Clone, Debug)]
pub struct SqliteKeys {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    db: Arc<Db>,
    /// Bumped when anything may have changed: after this process
    /// committed, after another process did (see `notify`), or once a
    /// session's process died (see `liveness`, which holds it weakly).
    changes: Arc<watch::Sender<u64>>,
    /// The prefixes this handle's watches follow (see `following`).
    follows: following::Follows,
    /// The deadlines this handle's renewals set.
    renewed: Arc<following::Renewed>,
    /// Renewals asked for and not yet sent: one thread renews all that
    /// are waiting in one transaction (see `Inner::renew`).
    renewing: Arc<Mutex<RenewalQueue>>,
    /// Commits asked for and not yet made (see `commits`).
    committing: Arc<Mutex<commits::CommitQueue>>,
    /// Reads asked for and not yet made (see `reading`).
    reading: Arc<Mutex<reading::ReadQueue>>,
    notifier: OnceLock<()>,
    stop_notifier: CancellationToken,
    _stop_on_drop: DropGuard,
}

#[derive(Debug)]
struct Db {
    path: PathBuf,
    /// When this handle had found the file at its path (the end of its
    /// opening): no grant is asked for before [`FIRST_USE_WAIT`] after.
    opened: std::time::Instant,
    /// The symbolic link `path` was reached by, if any: it must keep
    /// naming the file too (a link pointed at another store is a
    /// replacement).
    link: Option<PathBuf>,
    conn: Mutex<Connection>,
    boot_id: String,
    /// Opened by [`SqliteStore::open_read_only`]: writes nothing.
    read_only: bool,
    /// The uids the notify file may belong to: the database's owner's and
    /// this process's.
    owners: [u32; 2],
    /// `None` when read-only, or when the notify file cannot be created.
    notify: Option<notify::NotifyFile>,
    /// The kernel's test of sessions' processes, on the notify file; `None`
    /// when read-only or when the notify file cannot carry it.
    liveness: Option<liveness::Liveness>,
    /// The database file as opened; the path must keep naming it.
    file: File,
    id: FileId,
    /// Cancelled once the path no longer names `file`.
    replaced: CancellationToken,
    why_replaced: OnceLock<&'static str>,
    wal_emptied: AtomicBool,
    /// Renewals waiting for the connection: everything else waits for them
    /// to have it first ([`Db::conn`]), so that a busy process (many
    /// watches reading after every change) never starves its own lease.
    renewals: (Mutex<usize>, std::sync::Condvar),
    /// Whether `-wal` and `-shm` existed before this handle opened the
    /// database: those that did not were created by its SQLite connection.
    wal_existed: bool,
    shm_existed: bool,
    /// Set once the database is known to be leasehold's and this handle
    /// writes: SQLite may then checkpoint it on closing. Until then (and
    /// always when read-only) closing checkpoints nothing, and removes the
    /// `-wal` and `-shm` files the connection created.
    verified: bool,
    /// Read-only while no writer has the database open: how the file was
    /// when the connection was opened (see [`Quiet`]).
    quiet: Mutex<Option<Quiet>>,
    /// The name this handle holds on the file (see `names`); `None` where
    /// the kernel cannot lock it.
    claim: Option<names::Claim>,
}

/// A file's identity: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    fn of(meta: &Metadata) -> Self {
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

impl KeyedStore<SqliteKeys> {
    /// Opens (creating if needed) the database at `path`.
    ///
    /// Refuses, without writing anything, a directory, a file that is not a
    /// SQLite database, a SQLite database that belongs to another program,
    /// a leasehold database of a newer schema version, a `-wal` file next
    /// to it that belongs to another file, and a `-notify` file that
    /// leasehold did not create.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Ok(KeyedStore::over(SqliteKeys::open(path)?))
    }

    /// Opens the existing database at `path` for reading only: `leader`,
    /// `elections` and the watches work; creates nothing (neither the file
    /// nor its folder nor the schema) and writes nothing. A missing file, an
    /// empty one, or a SQLite file without leasehold's schema is
    /// [`Error::NotFound`]; the other refusals are those of
    /// [`SqliteStore::open`]. Sessions and campaigns fail with
    /// [`Error::InvalidInput`].
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self> {
        Ok(KeyedStore::over(SqliteKeys::open_read_only(path)?))
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.keys().path()
    }
}

impl SqliteKeys {
    /// The primitive on the database at `path`, as [`SqliteStore::open`]
    /// opens it.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_in(path.as_ref(), false)
    }

    /// The primitive on the database at `path`, read-only, as
    /// [`SqliteStore::open_read_only`] opens it.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_in(path.as_ref(), true)
    }

    fn open_in(path: &Path, read_only: bool) -> Result<Self> {
        let resolved = resolve_symbolic_link(path)?;
        let mut db = Db::open(&resolved, read_only)?;
        if resolved != path {
            db.link = Some(path.to_owned());
        }
        let db = Arc::new(db);
        let stop_notifier = CancellationToken::new();
        let wake = Arc::new(tokio::sync::Notify::new());
        Ok(SqliteKeys {
            inner: Arc::new(Inner {
                db,
                changes: Arc::new(watch::channel(0).0),
                follows: following::Follows::new(Arc::clone(&wake)),
                renewed: Arc::new(following::Renewed::new(wake)),
                renewing: Arc::default(),
                committing: Arc::default(),
                reading: Arc::default(),
                notifier: OnceLock::new(),
                _stop_on_drop: stop_notifier.clone().drop_guard(),
                stop_notifier,
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.db.path
    }
}

/// Wakes the receivers of a change counter.
fn bump(tx: &watch::Sender<u64>) {
    tx.send_modify(|v| *v = v.wrapping_add(1));
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown-boot".to_owned())
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

fn duration_ns(ns: i64) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

fn is_busy(error: &Error) -> bool {
    let Error::Unavailable {
        source: Some(source),
        ..
    } = error
    else {
        return false;
    };
    source.downcast_ref::<rusqlite::Error>().is_some_and(|e| {
        matches!(
            e.sqlite_error_code(),
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
        )
    })
}

/// The failure of a transaction that renewed several sessions, for each of
/// them: the same kind where it matters (a replaced file), else the same
/// words.
fn shared_error(error: &Error) -> Error {
    match error {
        Error::Replaced(what) => Error::Replaced(what.clone()),
        other => Error::Unavailable {
            reason: other.to_string(),
            source: None,
        },
    }
}

impl Inner {
    /// Renews `session`. Renewals run on a thread of their own rather
    /// than on tokio's blocking pool, whose queue hundreds of reads may
    /// fill (every watch of a busy process reads after each change), so
    /// they never wait behind them; and the renewals asked for while one
    /// transaction runs go together in the next, so a thousand sessions
    /// of one process cost a few commits a period rather than a thousand.
    async fn renew(&self, session: SessionId) -> Result<Duration> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let start = batches::queue(&self.renewing, (session, tx));
        if start {
            let (db, queue) = (Arc::clone(&self.db), Arc::clone(&self.renewing));
            let spawned = std::thread::Builder::new()
                .name("leasehold-renewal".into())
                .spawn(move || renew_while_asked(&db, &queue));
            if let Err(e) = spawned {
                let pending = batches::not_started(&self.renewing);
                for (_, waiter) in pending {
                    let _ = waiter.send(Err(Error::Unavailable {
                        reason: format!("cannot start a thread for the renewal: {e}"),
                        source: None,
                    }));
                }
            }
        }
        rx.await
            .map_err(|e| Error::unavailable("sqlite renewal thread failed", e))?
    }

    async fn blocking<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Db) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let db = Arc::clone(&self.db);
        tokio::task::spawn_blocking(move || op(&db))
            .await
            .map_err(|e| Error::unavailable("sqlite worker failed", e))?
    }

    /// Starts the inotify watch of the database's folder, once: it bumps
    /// `changes` after other processes' grants and releases, and checks the
    /// database file whenever its name is created, deleted or moved.
    fn watch_files(&self) {
        self.notifier.get_or_init(|| {
            // Weak: dropping the store must drop the database (and its
            // generation lock) at once, not when this task next runs.
            let db = Arc::downgrade(&self.db);
            let file_event = move || {
                let Some(db) = db.upgrade() else {
                    return;
                };
                if db.replaced.is_cancelled() || db.check_file().is_ok() {
                    return;
                }
                // The file was replaced: empty the WAL off the runtime
                // (it takes the connection, which a statement may hold).
                tokio::task::spawn_blocking(move || db.empty_wal(&db.conn()));
            };
            // A write to the notify file may be this connection's own,
            // whose waiters were woken already: all are woken only when
            // another connection committed since the last look
            // (`PRAGMA data_version`, which only others' commits change).
            let db = Arc::downgrade(&self.db);
            let seen = Arc::new(Mutex::new(None::<i64>));
            let foreign = move || -> Pin<Box<dyn Future<Output = bool> + Send>> {
                let (db, seen) = (db.clone(), Arc::clone(&seen));
                Box::pin(async move {
                    let looked = tokio::task::spawn_blocking(move || {
                        let db = db.upgrade()?;
                        let version = db.data_version();
                        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                        let foreign = version.is_none() || *seen != version;
                        *seen = version;
                        Some(foreign)
                    })
                    .await;
                    // Unknown (the store is gone, the read failed): wake all.
                    looked.ok().flatten().unwrap_or(true)
                })
            };
            notify::spawn(
                &self.db.path,
                (*self.changes).clone(),
                self.stop_notifier.clone(),
                file_event,
                foreign,
            );
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::keys::Keys;

    /// Renewals that share one transaction each get their own answer: a
    /// session past its expiry ends alone, the live one is renewed, and an
    /// id SQLite never issued names no session.
    #[tokio::test]
    async fn renewals_in_one_transaction_are_answered_each_alone() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let store = SqliteKeys::open(dir.path().join("leasehold.db")).expect("open");
        let short = store
            .open_session(Duration::from_millis(100))
            .await
            .expect("a short session");
        let long = store
            .open_session(Duration::from_secs(30))
            .await
            .expect("a long session");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let never = SessionId(u64::MAX);
        let db = Arc::clone(&store.inner.db);
        let sessions = [short.id, long.id, never];
        let renewed = tokio::task::spawn_blocking(move || db.keep_alive(&sessions))
            .await
            .expect("the renewal");
        assert_eq!(renewed.len(), 3);
        assert!(
            matches!(renewed[0], Err(Error::SessionExpired(id)) if id == short.id),
            "{:?}",
            renewed[0]
        );
        assert_eq!(
            renewed[1].as_ref().ok().copied(),
            Some(Duration::from_secs(30))
        );
        assert!(renewed[2].is_err(), "{:?}", renewed[2]);
        // The live session was renewed, not ended with the expired one.
        assert!(store.keep_alive(long.id).await.is_ok());
    }

    /// The reads of a prefix search the keys' index between the prefix
    /// and its end, with or without a string above them all: a bound the
    /// index cannot take made every read scan to the end of the table.
    #[test]
    fn a_prefix_is_read_from_the_index_between_its_two_bounds() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let store = SqliteKeys::open(dir.path().join("leasehold.db")).expect("open");
        let conn = store.inner.db.conn();
        for prefix in ["e/", "", "\u{10FFFF}"] {
            let end = primitive::below(prefix);
            for (table, sql) in [
                (
                    "k",
                    primitive::KEY_ROWS.replace("?3", "0").replace("?4", "''"),
                ),
                ("deletions", following::LAST_DELETION.to_owned()),
            ] {
                let plan: Vec<String> = conn
                    .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                    .and_then(|mut s| {
                        s.query_map(params![prefix, end], |r| r.get::<_, String>(3))?
                            .collect()
                    })
                    .expect("the plan");
                let searched = format!("SEARCH {table} USING PRIMARY KEY (key>? AND key<?)");
                assert!(plan.contains(&searched), "{prefix:?}: {plan:?}");
            }
        }
    }
}
