//! `sqlite:PATH` — the embedded store: many processes on one host share one
//! database file.
//!
//! - Acquisition is one `BEGIN IMMEDIATE` transaction: SQLite's write lock is
//!   the compare-and-swap.
//! - Tokens come from a per-election counter that is never reset; rows are
//!   never deleted, so tokens survive every process restarting.
//! - Expiry runs on the host's `CLOCK_MONOTONIC`, the clock every process on
//!   the host shares and the one the elector's deadlines use, never wall
//!   time. Every session row is tagged with the kernel's boot id: a session
//!   written under an earlier boot is expired (its monotonic times mean
//!   nothing now).
//! - Commits are fully synced (`synchronous=FULL`): a token handed out is
//!   never handed out again, even after a power loss.
//! - Waiters learn of grants and releases by other processes from inotify
//!   on the database's folder (see `notify`), and of expiries by sleeping
//!   until the holder's known expiry time: no polling period.
//! - A holder whose process died is found by the kernel, not by its TTL:
//!   each session holds a lock on one byte of `<db>-notify` that the kernel
//!   ends with its process, taken before the session's row commits. A
//!   contender that finds the holder's lock gone expires its session at
//!   once, in the transaction that grants; waiters learn of the death from
//!   a thread blocked on that lock. A stopped or slow process keeps its
//!   lock, and a pid plays no part (see `liveness`).
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
//!   once ([`Store::session_ended`]). Once the path names another file (or
//!   none), the handle is dead: renewals fail with
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

use std::collections::HashMap;
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
use rusqlite::types::Value;
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior, params};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::clock::host_monotonic_ns as monotonic_ns;
use crate::config::{CheckedTtl, StoreTtl};
use crate::error::{Error, Result};
use crate::names::{CandidateId, ElectionName};
use crate::store::cleanup::OnDrop;
use crate::store::local::{self, Attempt, ChangeHub, Changes, Expired, LocalBackend, Topic};
use crate::store::{
    ElectionState, FencingToken, Grant, Leader, LeaderWatch, Note, NoteWatch, SessionId,
    SessionLease, StatusWatch, Store, session_key,
};
use liveness::Process;

mod db;
mod file;
mod grants;
mod liveness;
mod names;
mod notify;
mod primitive;
pub use primitive::SqliteKeys;
mod reads;

use file::*;
use grants::*;

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
/// - `sessions`, and `elections` with their holders and token counters;
/// - `session_locks`: the sessions whose process holds a lock on the notify
///   file (device `dev`, inode `ino`) that the kernel ends with the process
///   (see `liveness`); rows whose session is gone are deleted with the
///   expired sessions;
/// - planned moves (see `line`): `notes`, the notes sessions keep on
///   elections (the line of standbys, a leader's chosen successor, transfer
///   requests), in the order first put (`id`, never reused), gone with
///   their session; and `releases`, the token of each election's last
///   released grant, written in the releasing transaction, so that a
///   successor tells a release from an expiry (lock-delay);
/// - the store primitive (see `primitive`): `revision`, the last revision
///   given (store-wide, never reset); `keys`, each perhaps attached to a
///   session, with the revisions of the commits that created it and last
///   wrote it (a key of an ended session is dead: reads and checks skip
///   it, and the commit that next writes it replaces it); and `deletions`,
///   the revision each key was last deleted at, so that a watch that
///   starts late reads whether its prefix changed after a revision.
const SCHEMA: &str = "
CREATE TABLE sessions (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    boot_id       TEXT    NOT NULL,
    expires_at_ns INTEGER NOT NULL,
    ttl_ms        INTEGER NOT NULL,
    pid           INTEGER NOT NULL
);
CREATE TABLE elections (
    name             TEXT    PRIMARY KEY,
    last_token       INTEGER NOT NULL,
    holder_session   INTEGER,
    holder_candidate TEXT,
    holder_token     INTEGER
) WITHOUT ROWID;
CREATE TABLE session_locks (
    session INTEGER PRIMARY KEY,
    dev     INTEGER NOT NULL,
    ino     INTEGER NOT NULL
);
CREATE TABLE notes (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    election TEXT    NOT NULL,
    session  INTEGER NOT NULL,
    name     TEXT    NOT NULL,
    text     TEXT    NOT NULL,
    UNIQUE (election, session, name)
);
CREATE TABLE releases (
    election TEXT    PRIMARY KEY,
    token    INTEGER NOT NULL
) WITHOUT ROWID;
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
CREATE TABLE deletions (
    key      TEXT    PRIMARY KEY,
    revision INTEGER NOT NULL
) WITHOUT ROWID;
";

/// The live holder of `?1`, at monotonic time `?2` under boot `?3`.
const LIVE_HOLDER: &str = "
SELECT e.holder_candidate, e.holder_token, s.expires_at_ns - ?2, e.holder_session
FROM elections e JOIN sessions s ON s.id = e.holder_session
WHERE e.name = ?1 AND s.boot_id = ?3 AND s.expires_at_ns > ?2";

/// The embedded SQLite store. Cloning gives another handle to the same
/// connection.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    db: Arc<Db>,
    /// Wakes waiters and watches: of one election after this process wrote
    /// to it, of all after another process wrote (see `notify`) or a
    /// holder's process died (see `liveness`).
    changes: Arc<ChangeHub>,
    /// The deadline that this handle's last renewal of each of its
    /// sessions set: until then a session is known to live without a read
    /// (`LocalBackend::known_alive`), so the notes watches of a line whose
    /// sessions this process renews do not read at each session's expiry.
    renewed: Mutex<HashMap<SessionId, tokio::time::Instant>>,
    /// Renewals asked for and not yet sent: one thread renews all that
    /// are waiting in one transaction (see `Inner::renew`).
    renewing: Arc<Mutex<RenewalQueue>>,
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
    /// Campaigns' attempts waiting for the next transaction: attempts made
    /// at once share one transaction, and so one synced commit.
    attempts: Mutex<AttemptQueue>,
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

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`.
    ///
    /// Refuses, without writing anything, a directory, a file that is not a
    /// SQLite database, a SQLite database that belongs to another program,
    /// a leasehold database of a newer schema version, a `-wal` file next
    /// to it that belongs to another file, and a `-notify` file that
    /// leasehold did not create.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_in(path.as_ref(), false)
    }

    /// Opens the existing database at `path` for reading only: `leader`,
    /// `elections` and the watches work; creates nothing (neither the file
    /// nor its folder nor the schema) and writes nothing. A missing file, an
    /// empty one, or a SQLite file without leasehold's schema is
    /// [`Error::NotFound`]; the other refusals are those of
    /// [`SqliteStore::open`]. Sessions and campaigns fail with
    /// [`Error::InvalidInput`].
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
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                db,
                changes: Arc::new(ChangeHub::new()),
                renewed: Mutex::default(),
                renewing: Arc::default(),
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
        let start = {
            let mut queue = lock(&self.renewing);
            queue.pending.push((session, tx));
            !std::mem::replace(&mut queue.running, true)
        };
        if start {
            let (db, queue) = (Arc::clone(&self.db), Arc::clone(&self.renewing));
            let spawned = std::thread::Builder::new()
                .name("leasehold-renewal".into())
                .spawn(move || renew_while_asked(&db, &queue));
            if let Err(e) = spawned {
                let pending = {
                    let mut queue = lock(&self.renewing);
                    queue.running = false;
                    std::mem::take(&mut queue.pending)
                };
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

    /// Records (`Some`) or forgets (`None`) the deadline of `session`.
    fn renewed(&self, session: SessionId, deadline: Option<tokio::time::Instant>) {
        // Every mutation is one map operation: nothing half-done to recover.
        let mut renewed = self.renewed.lock().unwrap_or_else(|p| p.into_inner());
        match deadline {
            Some(deadline) => renewed.insert(session, deadline),
            None => renewed.remove(&session),
        };
    }

    /// This process granted or released `election`.
    fn written(&self, election: &ElectionName) {
        self.changes.holder_written(election);
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
                (**self.changes.all()).clone(),
                self.stop_notifier.clone(),
                file_event,
                foreign,
            );
        });
    }
}

#[async_trait]
impl LocalBackend for Inner {
    fn changes(&self, topic: Topic) -> Changes {
        self.watch_files();
        self.changes.subscribe(topic)
    }

    fn known_alive(&self, session: SessionId) -> Option<Duration> {
        let renewed = self.renewed.lock().unwrap_or_else(|p| p.into_inner());
        let deadline = *renewed.get(&session)?;
        Some(deadline.saturating_duration_since(tokio::time::Instant::now()))
    }

    async fn try_acquire(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
        unwaited: bool,
    ) -> Result<Attempt> {
        // No timer once the wait is over: every campaign passes here.
        let first_use = self.db.opened + FIRST_USE_WAIT;
        if std::time::Instant::now() < first_use {
            tokio::time::sleep_until(first_use.into()).await;
        }
        let pending =
            self.db
                .attempt_queued(session, election.clone(), candidate.clone(), unwaited);
        // Dropped before the attempt's outcome is returned, the campaign
        // releases the grant the attempt made, so that a cancelled campaign
        // never leaves the session holding the election (the [`Store`]
        // cancellation obligation).
        let db = Arc::clone(&self.db);
        let changes = Arc::clone(&self.changes);
        let mut guard = OnDrop::new(pending, |pending| async move {
            if let Ok(Ok(Tried {
                attempt: Attempt::Granted(grant, _),
                fresh: true,
                ..
            })) = pending.await
            {
                let election = grant.election.clone();
                let released = tokio::task::spawn_blocking(move || db.resign(&grant)).await;
                changes.holder_written(&election);
                tracing::debug!(?released, "released the grant of a cancelled campaign");
            }
        });
        let outcome = guard.get_mut().await;
        guard.disarm();
        let Tried {
            attempt,
            fresh,
            watch,
        } = outcome.map_err(|e| Error::unavailable("sqlite worker failed", e))??;
        if fresh {
            self.written(election);
        }
        // The campaign marked `changes` seen before this attempt: if the
        // holder's process dies from here on, the bump wakes it.
        if let (Some(holder), Some(liveness)) = (watch, &self.db.liveness) {
            liveness.watch(holder, Arc::downgrade(self.changes.all()));
        }
        Ok(attempt)
    }

    async fn read_notes(
        &self,
        election: &ElectionName,
        only: Option<&local::NoteKey>,
    ) -> Result<(Vec<Note>, Option<Duration>)> {
        let (election, only) = (election.clone(), only.cloned());
        let (notes, expiry, alive) = self
            .blocking(move |db| db.notes(&election, only.as_ref()))
            .await?;
        // Those sessions' processes may die while they wait in line: the
        // kernel's word wakes the notes watches then (read after `changes`
        // was marked seen, so no death from here on is missed).
        if let Some(liveness) = &self.db.liveness {
            for session in alive {
                liveness.watch(session, Arc::downgrade(self.changes.all()));
            }
        }
        Ok((notes, expiry))
    }

    async fn read_leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        let election = election.clone();
        self.blocking(move |db| db.leader(&election)).await
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        // The database's clock is CLOCK_MONOTONIC, which tokio's timer follows.
        Box::pin(tokio::time::sleep(duration))
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        let ttl = TTL.check(ttl)?;
        // Read before the request: the store's deadline is no earlier.
        let sent = tokio::time::Instant::now();
        let lease = self.inner.blocking(move |db| db.open_session(ttl)).await?;
        self.inner.renewed(lease.id, Some(sent + lease.ttl));
        Ok(lease)
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        let sent = tokio::time::Instant::now();
        let renewed = self.inner.renew(session).await;
        self.inner
            .renewed(session, renewed.as_ref().ok().map(|left| sent + *left));
        renewed
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        self.inner.renewed(session, None);
        self.inner
            .blocking(move |db| db.close_session(session))
            .await?;
        // Its grants and notes, on any number of elections, are gone.
        self.inner.changes.everything();
        Ok(())
    }

    async fn campaign(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Grant> {
        local::campaign(&*self.inner, session, election, candidate).await
    }

    async fn try_campaign_unwaited(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Option<Grant>> {
        local::try_campaign_unwaited(&*self.inner, session, election, candidate).await
    }

    async fn resign(&self, grant: &Grant) -> Result<()> {
        let owned = grant.clone();
        self.inner.blocking(move |db| db.resign(&owned)).await?;
        self.inner.written(&grant.election);
        Ok(())
    }

    async fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        let (owned, owned_name, text) = (election.clone(), name.to_owned(), text.to_owned());
        self.inner
            .blocking(move |db| db.put_note(session, &owned, &owned_name, &text))
            .await?;
        self.inner.changes.note_written(election, session, name);
        Ok(())
    }

    async fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        let (owned, owned_name) = (election.clone(), name.to_owned());
        self.inner
            .blocking(move |db| db.delete_note(session, &owned, &owned_name))
            .await?;
        self.inner.changes.note_written(election, session, name);
        Ok(())
    }

    async fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        let (owned, owned_name, text) = (election.clone(), name.to_owned(), text.to_owned());
        let amended = self
            .inner
            .blocking(move |db| db.amend_note(session, &owned, &owned_name, &text))
            .await?;
        if amended {
            self.inner.changes.note_written(election, session, name);
        }
        Ok(amended)
    }

    async fn notes(&self, election: &ElectionName) -> Result<Vec<Note>> {
        Ok(self.inner.read_notes(election, None).await?.0)
    }

    async fn watch_notes(&self, election: &ElectionName) -> Result<NoteWatch> {
        local::watch_notes(Arc::clone(&self.inner), election, None).await
    }

    async fn watch_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<NoteWatch> {
        local::watch_notes(Arc::clone(&self.inner), election, Some((session, name))).await
    }

    async fn last_release(&self, election: &ElectionName) -> Result<Option<FencingToken>> {
        let election = election.clone();
        self.inner
            .blocking(move |db| db.last_release(&election))
            .await
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        self.inner.read_leader(election).await
    }

    async fn watch(&self, election: &ElectionName) -> Result<LeaderWatch> {
        // Not ended by a replaced file (see `watch_status`): a leader's
        // monitor learns of that from `session_ended`, with its reason.
        local::watch(Arc::clone(&self.inner), election, None).await
    }

    async fn watch_grant(&self, grant: &Grant) -> Result<LeaderWatch> {
        local::watch(Arc::clone(&self.inner), &grant.election, Some(grant.token)).await
    }

    /// Ends (its sender is dropped) once the database file is replaced:
    /// that is permanent for this handle, whose reads then all fail with
    /// [`Error::Replaced`], so a watcher learns why from its next read
    /// instead of waiting for an answer that never comes.
    async fn watch_status(&self, election: &ElectionName) -> Result<StatusWatch> {
        let mut status: StatusWatch = local::watch(Arc::clone(&self.inner), election, None).await?;
        let replaced = self.inner.db.replaced.clone();
        let (tx, rx) = watch::channel(status.borrow_and_update().clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    () = replaced.cancelled() => return,
                    () = tx.closed() => return,
                    changed = status.changed() => if changed.is_err() { return },
                }
                // The file is checked (and `replaced` cancelled) before a
                // read reports it replaced: a replaced file ends the watch
                // rather than being published as an outage.
                if replaced.is_cancelled() {
                    return;
                }
                tx.send_replace(status.borrow_and_update().clone());
            }
        });
        Ok(rx)
    }

    async fn elections(&self) -> Result<Vec<ElectionState>> {
        self.inner.blocking(Db::elections).await
    }

    /// A descriptor of the open file description that carries this
    /// process's session locks on the database's notify file (see the
    /// module's documentation); `None` when the kernel's test is not in use
    /// (read-only, no usable notify file, a filesystem not known to be
    /// local).
    fn session_lock_file(&self) -> Option<File> {
        self.inner.db.liveness.as_ref()?.lock_file()
    }

    /// Resolves as soon as the database file is deleted, moved or replaced
    /// (inotify on its folder): every session in it has ended for this
    /// process, whose leaders must step down at once rather than at the
    /// next renewal (which would fail with [`Error::SessionExpired`]).
    async fn session_ended(&self, _session: SessionId) {
        self.inner.watch_files();
        self.inner.db.replaced.cancelled().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renewals that share one transaction each get their own answer: a
    /// session past its expiry ends alone, the live one is renewed, and an
    /// id SQLite never issued names no session.
    #[tokio::test]
    async fn renewals_in_one_transaction_are_answered_each_alone() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let store = SqliteStore::open(dir.path().join("leasehold.db")).expect("open");
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
}
