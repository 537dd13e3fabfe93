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
//!   that, if what is at the path now is not a leasehold database, the
//!   handle empties its own `-wal` (a checkpoint into its own file, through
//!   SQLite's open descriptors), so that SQLite never pairs it with the new
//!   file.
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

mod liveness;
mod names;
mod notify;

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
///   successor tells a release from an expiry (lock-delay).
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

impl Drop for Db {
    /// A handle that did not write leasehold's database (read-only, or it
    /// refused the file) closes without checkpointing and removes the
    /// `-wal` (if empty) and `-shm` its connection created, once no SQLite
    /// connection uses the database: the folder is left as it was.
    fn drop(&mut self) {
        let Ok(placeholder) = Connection::open_in_memory() else {
            return;
        };
        let conn = std::mem::replace(
            self.conn.get_mut().unwrap_or_else(|p| p.into_inner()),
            placeholder,
        );
        if self.verified {
            // The last handle of this name empties its -wal into the file
            // and then removes its record: another name may be used after.
            if !self.read_only
                && !self.replaced.is_cancelled()
                && let Some(claim) = &self.claim
            {
                names::release(&conn, &self.file, claim, &self.path);
            }
            return;
        }
        drop(conn);
        let created: Vec<PathBuf> = [("-wal", self.wal_existed), ("-shm", self.shm_existed)]
            .into_iter()
            .filter(|(_, existed)| !existed)
            .filter_map(|(suffix, _)| {
                let path = sibling(&self.path, suffix);
                let meta = std::fs::symlink_metadata(&path).ok()?;
                (meta.is_file() && (suffix == "-shm" || meta.len() == 0)).then_some(path)
            })
            .collect();
        // Only while this handle's file is still at the path, and no
        // connection (in any process) uses it.
        let still_here = std::fs::metadata(&self.path).is_ok_and(|m| FileId::of(&m) == self.id);
        if created.is_empty() || !still_here || !lock_unused(&self.file, true) {
            return;
        }
        for path in created {
            if let Err(error) = std::fs::remove_file(&path) {
                tracing::debug!(path = %path.display(), %error, "could not remove a file SQLite created");
            }
        }
        lock_unused(&self.file, false);
    }
}

/// One acquisition attempt's outcome, as [`Db::try_acquire`] gives it.
struct Tried {
    attempt: Attempt,
    /// Whether the attempt made the grant.
    fresh: bool,
    /// The holder session, when the kernel says its process is there: wait
    /// for its lock to go (see `liveness`).
    watch: Option<i64>,
}

impl Tried {
    fn existing(attempt: Attempt) -> Self {
        Tried {
            attempt,
            fresh: false,
            watch: None,
        }
    }
}

/// Attempts waiting to be made (see [`Db::attempt_queued`]).
#[derive(Default)]
struct AttemptQueue {
    waiting: Vec<QueuedAttempt>,
    /// Whether a thread is making the waiting attempts; it takes new ones
    /// until none is left.
    running: bool,
}

impl std::fmt::Debug for AttemptQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttemptQueue")
            .field("waiting", &self.waiting.len())
            .field("running", &self.running)
            .finish()
    }
}

/// One campaign's attempt, and where its outcome goes.
struct QueuedAttempt {
    session: SessionId,
    election: ElectionName,
    candidate: CandidateId,
    /// Only if nobody holds or waits (see `Db::attempt`).
    unwaited: bool,
    outcome: tokio::sync::oneshot::Sender<Result<Tried>>,
}

/// At most this many attempts share a transaction.
const ATTEMPTS_PER_TRANSACTION: usize = 256;

/// A live holder as read from the database.
struct Holder {
    candidate: String,
    token: i64,
    expires_in_ns: i64,
    session: i64,
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
        let path = resolve_symbolic_link(path)?;
        let db = Arc::new(Db::open(&path, read_only)?);
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

/// The file a symbolic link at `path` names, so that the checks of the
/// files next to the database (`-wal`, `-shm`, `-journal`, `-notify`) look
/// where SQLite puts them: next to the file the link resolves to. Any
/// other path is returned as it is.
fn resolve_symbolic_link(path: &Path) -> Result<PathBuf> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => std::fs::canonicalize(path).map_err(|error| {
            Error::unavailable(
                format!(
                    "{} is a symbolic link that cannot be followed: {error}",
                    path.display()
                ),
                error,
            )
        }),
        _ => Ok(path.to_owned()),
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

/// What a database file holds, read from the file itself rather than
/// through SQLite (whose view includes the `-wal` file next to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnDisk {
    /// Nothing: 0 bytes.
    Empty,
    /// A SQLite database without tables or ids: what switching a new file
    /// to WAL writes, before the schema is checkpointed into the file.
    EmptyDatabase,
    /// A SQLite database with leasehold's application id.
    Leasehold,
    /// A SQLite database of another program.
    Other { app_id: u32 },
    /// Not a SQLite database.
    NotSqlite,
}

/// Reads the header of the database file (its first page begins with it).
fn on_disk(file: &File) -> std::io::Result<OnDisk> {
    let mut head = [0u8; 108];
    let mut read = 0;
    while read < head.len() {
        match file.read_at(&mut head[read..], read as u64) {
            Ok(0) => break,
            Ok(n) => read += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    let be32 = |at: usize| u32::from_be_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    if read == 0 {
        return Ok(OnDisk::Empty);
    }
    if read < 108 || &head[..16] != b"SQLite format 3\0" {
        return Ok(OnDisk::NotSqlite);
    }
    let app_id = be32(68);
    if i64::from(app_id) == APPLICATION_ID {
        return Ok(OnDisk::Leasehold);
    }
    // Page 1 holds the schema table after the 100-byte header: a leaf
    // (0x0d) without cells is an empty schema.
    let user_version = be32(60);
    let empty_schema = head[100] == 0x0d && head[103] == 0 && head[104] == 0;
    if app_id == 0 && user_version == 0 && empty_schema {
        return Ok(OnDisk::EmptyDatabase);
    }
    Ok(OnDisk::Other { app_id })
}

/// `<path><suffix>`, as SQLite names the `-wal` and `-shm` files.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// Opens the database file to hold it, without blocking on a FIFO.
fn open_database_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(OFlag::O_NONBLOCK.bits())
        .open(path)
}

/// Opens the database file to hold it for the handle's life: for writing
/// too where this user may (only to lock it, see [`lock_unused`]; nothing
/// is written through it), without blocking on a FIFO.
fn hold_database_file(path: &Path) -> std::io::Result<File> {
    match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(OFlag::O_NONBLOCK.bits())
        .open(path)
    {
        Ok(file) => Ok(file),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Err(error),
        Err(_) => open_database_file(path),
    }
}

/// SQLite's lock bytes (unix VFS): every connection holds a read lock on
/// the `SHARED` range while it has a database in WAL mode open.
const SHARED_FIRST: i64 = 0x4000_0002;
const SHARED_SIZE: i64 = 510;

/// Takes (`true`), or releases, a write lock over SQLite's `SHARED` range
/// of `file`: an open file description lock, which conflicts with every
/// SQLite connection's lock in every process, this one included. Taken
/// only while no SQLite connection uses the database.
fn lock_unused(file: &File, take: bool) -> bool {
    let lock = nix::libc::flock {
        l_type: if take {
            nix::libc::F_WRLCK
        } else {
            nix::libc::F_UNLCK
        } as i16,
        l_whence: nix::libc::SEEK_SET as i16,
        l_start: SHARED_FIRST,
        l_len: SHARED_SIZE,
        l_pid: 0,
    };
    nix::fcntl::fcntl(file, FcntlArg::F_OFD_SETLK(&lock)).is_ok()
}

/// [`Error::NotFound`] for a path without a file.
fn missing(path: &Path) -> Error {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let why = if dir.is_dir() {
        "the file does not exist".to_owned()
    } else {
        format!("directory {} does not exist", dir.display())
    };
    Error::NotFound(format!(
        "at {}: {why}; nothing was created (`leasehold run` or `campaign` creates it)",
        path.display()
    ))
}

/// Retries `op` while SQLite reports "busy" at once instead of waiting in
/// its busy handler, as some steps of opening do (switching to WAL while
/// another process does the same, WAL recovery).
fn retry_busy<T>(mut op: impl FnMut() -> Result<T>) -> Result<T> {
    let started = std::time::Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        match op() {
            Err(error) if is_busy(&error) && started.elapsed() < BUSY_TIMEOUT => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            outcome => return outcome,
        }
    }
}

/// Checks the path before anything is opened: not empty, not a directory,
/// and, if something is there, a regular file (read-only, it must exist).
/// Its metadata if it exists.
fn check_path(path: &Path, read_only: bool) -> Result<Option<Metadata>> {
    let shown = path.display();
    if path.as_os_str().is_empty() {
        return Err(Error::invalid("sqlite path", "must not be empty"));
    }
    if path.is_dir() {
        return Err(Error::invalid(
            "sqlite path",
            format!("{shown} is a directory, not a database file"),
        ));
    }
    // A path that cannot be looked up (a folder on the way that this
    // user may not search) is not a missing one.
    let existing = match std::fs::metadata(path) {
        Ok(meta) => Some(meta),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(Error::Denied(format!(
                "cannot reach {shown}: a folder on the way is not searchable by this user: {error}"
            )));
        }
        Err(error) => {
            return Err(Error::unavailable(
                format!("cannot open {shown}: {error}"),
                error,
            ));
        }
    };
    match &existing {
        None if read_only => Err(missing(path)),
        Some(meta) if !meta.is_file() => Err(Error::Corrupt(format!(
            "{shown} is not a regular file, so not a database"
        ))),
        // Before SQLite creates a -wal and -shm of this user's, which
        // would lock the owners out.
        Some(_) if !read_only => match nix::unistd::access(path, nix::unistd::AccessFlags::W_OK) {
            Err(error @ (nix::errno::Errno::EACCES | nix::errno::Errno::EROFS)) => {
                Err(Error::Denied(format!(
                    "{shown} is not writable by this user ({error}), so it cannot campaign \
                     there; `status`, `list` and `observe` only read it; nothing was written"
                )))
            }
            _ => Ok(existing),
        },
        _ => Ok(existing),
    }
}

/// The database's notify file `notify` (as found), or the one that appears
/// while a sibling of a new database settles; refuses a sibling that stays.
/// For a writer, before it opens the database.
///
/// A new database: SQLite deletes a `-wal` or `-journal` next to a missing
/// or empty file, and takes over a `-shm`. Such a file is leasehold's
/// leftover only next to leasehold's notify file. Another leasehold process
/// creating the database at this moment has a `-journal` there for a few
/// milliseconds, and writes the notify file soon after: only a sibling that
/// stays is foreign.
fn settle_new_database(
    path: &Path,
    owners: &[u32],
    mut notify: Option<notify::NotifyFile>,
) -> Result<Option<notify::NotifyFile>> {
    let shown = path.display();
    let exists = |suffix: &str| std::fs::symlink_metadata(sibling(path, suffix)).is_ok();
    let settle = std::time::Instant::now() + SIBLING_SETTLE;
    while notify.is_none() {
        let state = match std::fs::metadata(path) {
            Err(_) => "does not exist",
            Ok(meta) if meta.len() == 0 => "is empty",
            Ok(_) => break,
        };
        let Some(suffix) = ["-wal", "-journal", "-shm"]
            .into_iter()
            .find(|suffix| exists(suffix))
        else {
            break;
        };
        if std::time::Instant::now() >= settle {
            return Err(Error::Corrupt(format!(
                "{shown}{suffix} exists but {shown} {state}, and no leasehold notify file is \
                 next to it, so it is not leasehold's; creating the database would delete or \
                 overwrite it: leasehold writes only files it created, move it away"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
        notify = notify::open_existing(path, owners)?;
    }
    Ok(notify)
}

/// Refuses a `-wal`, `-shm` or `-journal` next to the database that is not a regular
/// file, or that belongs to neither `owners` (the database's owner and
/// this user): SQLite would replay such a `-wal` into the database —
/// another user who may write the folder could roll its token counters
/// back — or lock the owners out with such a `-shm`. Nothing is written.
fn check_siblings(path: &Path, owners: &[u32]) -> Result<()> {
    for suffix in ["-wal", "-shm", "-journal"] {
        let file = sibling(path, suffix);
        let shown = file.display();
        let meta = match std::fs::symlink_metadata(&file) {
            Ok(meta) => meta,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => {
                return Err(Error::unavailable(
                    format!("cannot inspect {shown}: {error}"),
                    error,
                ));
            }
        };
        let why = if meta.file_type().is_symlink() {
            "is a symbolic link".to_owned()
        } else if !meta.is_file() {
            "is not a regular file".to_owned()
        } else if !owners.contains(&meta.uid()) {
            format!(
                "belongs to user {}, neither the database's owner nor this user",
                meta.uid()
            )
        } else {
            continue;
        };
        return Err(Error::Corrupt(format!(
            "{shown} {why}: SQLite would use it with the database, so leasehold does not open \
             it; nothing was written. Move it away (only the database's owner writes next to \
             the database: keep its folder writable by that user alone)"
        )));
    }
    Ok(())
}

/// SQLite's connection to the database (created if missing, unless
/// `read_only`), which does not checkpoint on close until the schema is
/// known to be leasehold's. A `quiet` one (read-only, see [`Quiet`]) reads
/// the file alone, as SQLite's `immutable` URI parameter does: it takes no
/// lock and creates no `-wal` or `-shm`.
fn open_connection(path: &Path, read_only: bool, quiet: bool) -> Result<Connection> {
    let flags = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE
    } | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = if quiet {
        Connection::open_with_flags(immutable_uri(path), flags | OpenFlags::SQLITE_OPEN_URI)
    } else {
        Connection::open_with_flags(path, flags)
    }
    .map_err(|e| sql_error(path, e))?;
    // Closing must not checkpoint another program's WAL into its
    // database (and delete the WAL) before the schema is known to be
    // leasehold's.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        .map_err(|e| sql_error(path, e))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| sql_error(path, e))?;
    Ok(conn)
}

/// `file:PATH?immutable=1`, the path's bytes percent-encoded but for
/// SQLite's unreserved ones.
fn immutable_uri(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file:");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    uri
}

/// A read-only handle's connection while no process has the database open
/// for writing (no `-wal` and `-shm` next to it: SQLite removes both when
/// the last connection closes, after checkpointing everything into the
/// file). Reading it the usual way would create both, owned by the reader,
/// and the owners could not open the database again; so it is read as a
/// file that does not change, and opened again — the usual way once a
/// writer's `-wal` and `-shm` are there, else anew — when the file has
/// changed since. A read that meets a writer's checkpoint fails, and is
/// retried as every failed read is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Quiet {
    modified: (i64, i64),
    changed: (i64, i64),
    len: u64,
}

impl Quiet {
    fn of(file: &File) -> Option<Self> {
        let meta = file.metadata().ok()?;
        Some(Quiet {
            modified: (meta.mtime(), meta.mtime_nsec()),
            changed: (meta.ctime(), meta.ctime_nsec()),
            len: meta.len(),
        })
    }
}

/// Whether the database at `path` may hold more than its file: a `-shm`
/// (a writer has it open, or had it when it crashed) or a `-wal` with
/// content is next to it.
fn in_use(path: &Path) -> bool {
    let meta = |suffix| std::fs::symlink_metadata(sibling(path, suffix));
    meta("-shm").is_ok() || meta("-wal").is_ok_and(|wal| wal.len() > 0)
}

/// The database file, held open (see [`hold_database_file`]), and its
/// metadata; refused unless it is a regular file.
fn hold_regular_file(path: &Path, read_only: bool) -> Result<(File, Metadata)> {
    let shown = path.display();
    let file = match hold_database_file(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound && read_only => {
            return Err(missing(path));
        }
        Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(Error::Denied(format!(
                "{shown} is not readable by this user: {error}"
            )));
        }
        Err(error) => {
            return Err(Error::unavailable(
                format!("cannot open {shown}: {error}"),
                error,
            ));
        }
    };
    let meta = file
        .metadata()
        .map_err(|e| Error::unavailable(format!("cannot inspect {shown}: {e}"), e))?;
    if !meta.is_file() {
        return Err(Error::Corrupt(format!(
            "{shown} is not a regular file, so not a database"
        )));
    }
    Ok((file, meta))
}

impl Db {
    fn open(path: &Path, read_only: bool) -> Result<Self> {
        let existing = check_path(path, read_only)?;
        let me = nix::unistd::geteuid().as_raw();
        let mut owners = [existing.as_ref().map_or(me, MetadataExt::uid), me];
        // A notify file that leasehold did not create is refused before
        // anything is created or written.
        let mut notify = if read_only {
            None
        } else {
            notify::open_existing(path, &owners)?
        };
        let exists = |suffix: &str| std::fs::symlink_metadata(sibling(path, suffix)).is_ok();
        check_siblings(path, &owners)?;
        let (wal_existed, shm_existed) = (exists("-wal"), exists("-shm"));
        if !read_only {
            notify = settle_new_database(path, &owners, notify)?;
        }
        let quiet = read_only && !in_use(path);
        let conn = open_connection(path, read_only, quiet)?;
        let (file, meta) = hold_regular_file(path, read_only)?;
        let claim = names::claim(&file, path, read_only)?;
        owners[0] = meta.uid();
        let mut db = Db {
            path: path.to_owned(),
            conn: Mutex::new(conn),
            boot_id: boot_id(),
            read_only,
            owners,
            notify,
            liveness: None,
            id: FileId::of(&meta),
            file,
            replaced: CancellationToken::new(),
            why_replaced: OnceLock::new(),
            wal_emptied: AtomicBool::new(false),
            renewals: (Mutex::new(0), std::sync::Condvar::new()),
            attempts: Mutex::new(AttemptQueue::default()),
            wal_existed,
            shm_existed,
            verified: false,
            quiet: Mutex::new(None),
            claim,
        };
        if quiet {
            *lock(&db.quiet) = Quiet::of(&db.file);
        }
        db.prepare()?;
        // SQLite opened what the path named between the first look and now.
        db.check_file()?;
        if !read_only {
            db.take_up()?;
        }
        db.liveness = db.open_liveness();
        Ok(db)
    }

    /// A writer's database, once known to be leasehold's: closing
    /// checkpoints it as usual, and the name is recorded (see `names`).
    fn take_up(&mut self) -> Result<()> {
        self.conn()
            .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, false)
            .map_err(self.err())?;
        self.verified = true;
        match &self.claim {
            Some(claim) => {
                names::record(&self.conn(), claim, &self.path)?;
                names::share(&self.file, claim, &self.path)
            }
            None => Ok(()),
        }
    }

    /// The kernel's test of sessions' processes, on the notify file.
    fn open_liveness(&self) -> Option<liveness::Liveness> {
        match &self.notify {
            Some(n) => liveness::Liveness::new(n.path().to_owned(), n.file()),
            // A read-only handle opens the notify file only to ask the
            // kernel (notes of waiters whose process died are not live);
            // it never takes a lock, and a session lock recorded on
            // another file is never tested.
            None if self.read_only => {
                let notify = sibling(&self.path, "-notify");
                std::fs::File::open(&notify)
                    .ok()
                    .and_then(|file| liveness::Liveness::new(notify, &file))
            }
            None => None,
        }
    }

    /// Checks what the file is before writing anything, then creates or
    /// accepts the schema.
    fn prepare(&mut self) -> Result<()> {
        let identity = retry_busy(|| self.inspect())?;
        // A leasehold database that only a -wal killed processes left
        // holds: it is another file's (see `names`), unless this file
        // records it.
        if identity.version != 0
            && let Some(claim) = &self.claim
            && matches!(on_disk(&self.file), Ok(OnDisk::EmptyDatabase))
        {
            names::refuse_a_leftover(claim, &self.path)?;
        }
        if self.read_only {
            if identity.version == 0 {
                return Err(Error::NotFound(format!(
                    "at {}: the SQLite file holds no leasehold database yet; nothing was written",
                    self.path.display()
                )));
            }
            return Ok(());
        }
        if self.notify.is_none() {
            self.notify = notify::create(&self.path, &self.owners)?;
        }
        retry_busy(|| {
            let identity = self.inspect()?;
            self.settle(identity)
        })
    }

    /// `PRAGMA data_version` of this connection: it changes only when
    /// another connection commits. `None` if it cannot be read.
    fn data_version(&self) -> Option<i64> {
        self.conn()
            .query_row("PRAGMA data_version", [], |row| row.get(0))
            .ok()
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        if self.read_only {
            self.reopen_if_stale();
        }
        // A renewal waiting goes first (bounded: it holds the connection
        // for one short transaction).
        let (waiting, turn) = &self.renewals;
        let waiting = waiting.lock().unwrap_or_else(|p| p.into_inner());
        drop(
            turn.wait_timeout_while(waiting, std::time::Duration::from_millis(100), |n| *n > 0)
                .unwrap_or_else(|p| p.into_inner()),
        );
        self.lock_conn()
    }

    /// A read-only handle's quiet connection, opened again when the file
    /// changed since (see [`Quiet`]): the usual way once a writer has the
    /// database open.
    fn reopen_if_stale(&self) {
        let mut quiet = lock(&self.quiet);
        let Some(opened) = *quiet else {
            return;
        };
        let writer = in_use(&self.path);
        if !writer && Quiet::of(&self.file) == Some(opened) {
            return;
        }
        match open_connection(&self.path, true, !writer) {
            Ok(conn) => {
                *self.lock_conn() = conn;
                *quiet = if writer { None } else { Quiet::of(&self.file) };
            }
            Err(error) => {
                tracing::debug!(path = %self.path.display(), %error, "cannot open the database again; reading with the connection as it is");
            }
        }
    }

    fn lock_conn(&self) -> MutexGuard<'_, Connection> {
        // rusqlite rolls back an open transaction when it is dropped during a
        // panic, so the connection is consistent even if the lock is poisoned.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection for a renewal, ahead of everything else waiting.
    fn conn_for_renewal(&self) -> MutexGuard<'_, Connection> {
        let (waiting, turn) = &self.renewals;
        *waiting.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        let conn = self.lock_conn();
        *waiting.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        turn.notify_all();
        conn
    }

    fn err(&self) -> impl Fn(rusqlite::Error) -> Error + '_ {
        |e| sql_error(&self.path, e)
    }

    /// What the file holds, refusing — without writing — anything that is
    /// not a leasehold database or an empty file, first from the file's
    /// own bytes (before SQLite reads it), then through SQLite.
    fn inspect(&self) -> Result<Identity> {
        let shown = self.path.display();
        let looked = |e: std::io::Error| Error::unavailable(format!("cannot read {shown}: {e}"), e);
        match on_disk(&self.file).map_err(looked)? {
            OnDisk::Empty if self.read_only => {
                return Err(Error::NotFound(format!(
                    "at {shown}: the file is empty; nothing was written"
                )));
            }
            // Without a -wal, SQLite would see the same empty database
            // (and a read-only open would leave a -wal and -shm behind).
            OnDisk::EmptyDatabase if self.read_only && !sibling(&self.path, "-wal").exists() => {
                return Err(Error::NotFound(format!(
                    "at {shown}: the SQLite file holds no leasehold database yet; nothing was written"
                )));
            }
            OnDisk::Empty | OnDisk::EmptyDatabase | OnDisk::Leasehold => {}
            OnDisk::NotSqlite => {
                return Err(Error::Corrupt(format!("{shown} is not a SQLite database")));
            }
            OnDisk::Other { app_id: 0 } => {
                return Err(Error::Corrupt(format!(
                    "{shown} is a SQLite database of another program (it has tables and no \
                     application id); point leasehold at its own file"
                )));
            }
            OnDisk::Other { app_id } => {
                return Err(Error::Corrupt(format!(
                    "{shown} is a SQLite database of another program (application id {app_id:#x})"
                )));
            }
        }
        // Reading the header fails with NOTADB on a file that is not SQLite;
        // nothing has been written at that point.
        let identity = read_identity(&self.conn()).map_err(self.err())?;
        self.check_identity(identity)?;
        if identity.app_id == APPLICATION_ID
            && !matches!(
                on_disk(&self.file).map_err(looked)?,
                OnDisk::Leasehold | OnDisk::EmptyDatabase
            )
        {
            return Err(Error::Corrupt(format!(
                "{shown}-wal holds leasehold data but {shown} itself is not a leasehold database: \
                 the file was deleted or replaced while a process had it open. Nothing was written; \
                 stop the processes still using the old file, then remove {shown}-wal and {shown}-shm"
            )));
        }
        Ok(identity)
    }

    /// Under the generation lock, creates the schema if the file has none;
    /// holds the lock shared from then on.
    fn settle(&self, mut identity: Identity) -> Result<()> {
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(2);
        let lock = |exclusive| -> Result<bool> {
            let Some(notify) = &self.notify else {
                return Ok(true);
            };
            notify.try_lock(exclusive).map_err(|e| {
                Error::unavailable(
                    format!("cannot lock {}-notify: {e}", self.path.display()),
                    e,
                )
            })
        };
        loop {
            let creating = identity.version == 0;
            if lock(creating)? {
                break;
            }
            if started.elapsed() >= GENERATION_WAIT {
                let shown = self.path.display();
                return Err(Error::Unavailable {
                    reason: if creating {
                        format!(
                            "{shown} is new, but processes still use the database that was at \
                             this path before (it was deleted or replaced while they had it open); \
                             a new one is created only once they have stopped, which they do as \
                             soon as they notice"
                        )
                    } else {
                        format!("{shown} is still being created by another process")
                    },
                    source: None,
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
            identity = self.inspect()?;
        }
        let outcome = self.create_schema(identity);
        let shared = match &self.notify {
            Some(notify) => notify.share_lock(),
            None => Ok(()),
        };
        outcome?;
        shared.map_err(|e| {
            Error::unavailable(
                format!("cannot lock {}-notify: {e}", self.path.display()),
                e,
            )
        })
    }

    fn create_schema(&self, identity: Identity) -> Result<()> {
        let mut conn = self.conn();
        let err = self.err();
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(&err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(&err)?;
        if identity.version == SCHEMA_VERSION {
            return Ok(());
        }
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&err)?;
        // Another process may have created the schema while we waited.
        let identity = read_identity(&tx).map_err(&err)?;
        self.check_identity(identity)?;
        if identity.version == 0 {
            tx.execute_batch(SCHEMA).map_err(&err)?;
            tx.execute_batch(names::TABLE).map_err(&err)?;
            tx.pragma_update(None, "application_id", APPLICATION_ID)
                .map_err(&err)?;
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(&err)?;
        }
        self.check_file()?;
        tx.commit().map_err(&err)
    }

    /// Whether the path still names the file this handle opened; once it
    /// does not, this handle is dead ([`Error::Replaced`]).
    fn check_file(&self) -> Result<()> {
        if self.replaced.is_cancelled() {
            return Err(self.replaced_error());
        }
        let why = match std::fs::metadata(&self.path) {
            Ok(meta) if FileId::of(&meta) == self.id => return Ok(()),
            Ok(_) => "another file is there now",
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                "it was deleted or moved away"
            }
            Err(error) => {
                return Err(Error::unavailable(
                    format!("cannot check {}: {error}", self.path.display()),
                    error,
                ));
            }
        };
        let _ = self.why_replaced.set(why);
        self.replaced.cancel();
        let message =
            "the database file this process opened is no longer at its path; not using it any more";
        if self.read_only {
            // A reader reports it in its error (`observe` exits saying so).
            tracing::debug!(path = %self.path.display(), why, "{message}");
        } else {
            tracing::warn!(path = %self.path.display(), why, "{message}");
        }
        Err(self.replaced_error())
    }

    fn replaced_error(&self) -> Error {
        Error::Replaced(format!(
            "{} is no longer the database file this process opened ({}); nothing more is written \
             to either — open the store again",
            self.path.display(),
            self.why_replaced.get().copied().unwrap_or("replaced")
        ))
    }

    /// [`Db::check_file`] before using the connection; once the file was
    /// replaced, also empties this handle's `-wal` when what the path holds
    /// now is not a leasehold database (see the module's documentation).
    fn usable(&self, conn: &Connection) -> Result<()> {
        let checked = self.check_file();
        if let Err(Error::Replaced(_)) = &checked {
            self.empty_wal(conn);
        }
        checked
    }

    /// Checkpoints the WAL into this handle's own database file and
    /// truncates it. SQLite does both through the descriptors it opened, so
    /// only this handle's own files are written, wherever they are now.
    /// Without it, SQLite would pair the `-wal` still at `<path>-wal` with
    /// whatever file is put at the path, and write leasehold's pages into
    /// it.
    fn empty_wal(&self, conn: &Connection) {
        if self.read_only || self.wal_emptied.load(Ordering::SeqCst) {
            return;
        }
        let there = open_database_file(&self.path)
            .and_then(|f| on_disk(&f))
            .ok();
        if matches!(there, Some(OnDisk::Leasehold | OnDisk::EmptyDatabase)) {
            tracing::debug!(path = %self.path.display(),
                "a leasehold database is at the path now; leaving the WAL as it is");
            return;
        }
        match conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            r.get::<_, i64>(0)
        }) {
            Ok(0) => {
                self.wal_emptied.store(true, Ordering::SeqCst);
                tracing::info!(path = %self.path.display(),
                    "emptied this process's WAL of the replaced database file, so that it cannot be paired with the file there now");
            }
            Ok(_) => tracing::warn!(path = %self.path.display(),
                "could not empty the WAL of the replaced database file yet (busy)"),
            Err(error) => tracing::warn!(path = %self.path.display(), %error,
                "could not empty the WAL of the replaced database file"),
        }
    }

    /// Fails on a handle opened read-only.
    fn writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::invalid(
                "store",
                "opened read-only (store::open_read_only): it opens no sessions and writes nothing",
            ));
        }
        Ok(())
    }

    fn announce(&self) {
        if let Some(notify) = &self.notify {
            notify.announce();
        }
    }

    fn check_identity(&self, identity: Identity) -> Result<()> {
        let Identity {
            app_id,
            version,
            objects: tables,
        } = identity;
        let path = self.path.display();
        if app_id == 0 && version == 0 {
            if tables > 0 {
                return Err(Error::Corrupt(format!(
                    "{path} is a SQLite database of another program ({tables} schema objects); \
                     point leasehold at its own file"
                )));
            }
            return Ok(());
        }
        if app_id != APPLICATION_ID {
            return Err(Error::Corrupt(format!(
                "{path} is a SQLite database of another program (application id {app_id:#x})"
            )));
        }
        if version > SCHEMA_VERSION {
            return Err(Error::IncompatibleSchema {
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        if version < 1 {
            return Err(Error::Corrupt(format!(
                "{path} has leasehold's application id but schema version {version}"
            )));
        }
        Ok(())
    }

    fn live_holder(
        &self,
        conn: &Connection,
        election: &str,
        now: i64,
    ) -> rusqlite::Result<Option<Holder>> {
        conn.query_row(LIVE_HOLDER, params![election, now, self.boot_id], |r| {
            Ok(Holder {
                candidate: r.get(0)?,
                token: r.get(1)?,
                expires_in_ns: r.get(2)?,
                session: r.get(3)?,
            })
        })
        .optional()
    }

    fn session_alive(&self, conn: &Connection, session: SessionId, now: i64) -> Result<()> {
        let alive = conn
            .query_row(
                "SELECT 1 FROM sessions WHERE id = ?1 AND boot_id = ?2 AND expires_at_ns > ?3",
                params![session_key(session)?, self.boot_id, now],
                |_| Ok(()),
            )
            .optional()
            .map_err(self.err())?;
        alive.ok_or(Error::SessionExpired(session))
    }

    fn open_session(&self, ttl: CheckedTtl) -> Result<SessionLease> {
        let (granted, ttl_ms) = (ttl.ttl, ttl.units);
        self.writable()?;
        let mut conn = self.conn();
        self.usable(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let now = monotonic_ns();
        liveness::Liveness::let_expired_go(now);
        // Sessions of an earlier boot or past their expiry can never come
        // back; dropping them keeps the table small. Their grants are dead
        // already (the holder query joins on live sessions).
        tx.execute(
            "DELETE FROM sessions WHERE boot_id <> ?1 OR expires_at_ns <= ?2",
            params![self.boot_id, now],
        )
        .map_err(self.err())?;
        tx.execute_batch(
            "DELETE FROM session_locks WHERE session NOT IN (SELECT id FROM sessions);
             DELETE FROM notes WHERE session NOT IN (SELECT id FROM sessions);",
        )
        .map_err(self.err())?;
        let expires_at_ns = now.saturating_add(nanos(granted));
        let id: i64 = tx
            .query_row(
                "INSERT INTO sessions (boot_id, expires_at_ns, ttl_ms, pid) VALUES (?1, ?2, ?3, ?4)
                 RETURNING id",
                params![self.boot_id, expires_at_ns, ttl_ms, std::process::id()],
                |r| r.get(0),
            )
            .map_err(self.err())?;
        // The lock is taken before the row commits, so that whoever reads
        // the row knows the lock was held; dropped (let go) if the commit
        // does not happen.
        let lock = self.liveness.as_ref().and_then(|l| Some((l, l.lock(id)?)));
        if let Some((liveness, _)) = &lock {
            let (dev, ino) = liveness.stored_key();
            tx.execute(
                "INSERT INTO session_locks (session, dev, ino) VALUES (?1, ?2, ?3)",
                params![id, dev, ino],
            )
            .map_err(self.err())?;
        }
        self.usable(&tx)?;
        tx.commit().map_err(self.err())?;
        if let Some((liveness, taken)) = lock {
            liveness.keep(taken, expires_at_ns);
        }
        Ok(SessionLease {
            id: SessionId::from_stored(id),
            ttl: granted,
        })
    }

    /// Renewals of `sessions` in one transaction (one synced commit for
    /// all of them), each result in the order asked. Once the file was
    /// replaced a session is gone with it ([`Error::SessionExpired`]), so
    /// that its leaders step down at once.
    fn keep_alive(&self, sessions: &[SessionId]) -> Vec<Result<Duration>> {
        match self.renew_all(sessions) {
            Ok(rows) => rows
                .into_iter()
                .zip(sessions)
                .map(|(ttl_ms, &session)| match ttl_ms {
                    Some(ms) => Ok(Duration::from_millis(ms.unsigned_abs())),
                    None => {
                        // Gone or past its expiry, which the shared monotonic
                        // clock never takes back: no one will test its lock
                        // again.
                        self.release_lock(session);
                        Err(Error::SessionExpired(session))
                    }
                })
                .collect(),
            Err(error) => match sessions {
                [session] => vec![Err(renewal_error(error, *session))],
                _ => sessions
                    .iter()
                    .map(|&session| Err(renewal_error(shared_error(&error), session)))
                    .collect(),
            },
        }
    }

    /// The granted TTL of each session renewed, `None` for one that is
    /// gone or past its expiry.
    fn renew_all(&self, sessions: &[SessionId]) -> Result<Vec<Option<i64>>> {
        self.writable()?;
        let mut conn = self.conn_for_renewal();
        self.usable(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let now = monotonic_ns();
        let mut rows = Vec::with_capacity(sessions.len());
        {
            let mut update = tx
                .prepare_cached(
                    "UPDATE sessions SET expires_at_ns = ?3 + ttl_ms * 1000000
                     WHERE id = ?1 AND boot_id = ?2 AND expires_at_ns > ?3
                     RETURNING ttl_ms, expires_at_ns",
                )
                .map_err(self.err())?;
            for &session in sessions {
                // An id SQLite never issued names no session.
                let Ok(key) = session_key(session) else {
                    rows.push(None);
                    continue;
                };
                let renewed: Option<(i64, i64)> = update
                    .query_row(params![key, self.boot_id, now], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .optional()
                    .map_err(self.err())?;
                // Before the commit: the lock must outlast the row's new
                // expiry.
                if let Some((_, expires_at_ns)) = renewed {
                    liveness::Liveness::renewed(key, expires_at_ns);
                }
                rows.push(renewed.map(|(ttl_ms, _)| ttl_ms));
            }
        }
        self.usable(&tx)?;
        tx.commit().map_err(self.err())?;
        Ok(rows)
    }

    /// Closing a session of a replaced file is not an error: the file that
    /// holds it is no longer the store, and nothing is written to it.
    fn close_session(&self, session: SessionId) -> Result<()> {
        self.writable()?;
        // An id SQLite never issued names no session.
        let Ok(key) = session_key(session) else {
            return Ok(());
        };
        let mut conn = self.conn();
        if let Err(Error::Replaced(_)) = self.usable(&conn) {
            return Ok(());
        }
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        tx.execute(
            "UPDATE elections SET holder_session = NULL, holder_candidate = NULL, holder_token = NULL
             WHERE holder_session = ?1",
            params![key],
        )
        .map_err(self.err())?;
        tx.execute("DELETE FROM sessions WHERE id = ?1", params![key])
            .map_err(self.err())?;
        tx.execute("DELETE FROM session_locks WHERE session = ?1", params![key])
            .map_err(self.err())?;
        tx.execute("DELETE FROM notes WHERE session = ?1", params![key])
            .map_err(self.err())?;
        if let Err(Error::Replaced(_)) = self.usable(&tx) {
            return Ok(());
        }
        tx.commit().map_err(self.err())?;
        // Only now that no one can read the row: a lock let go while the
        // row is there means the process is gone.
        self.release_lock(session);
        self.announce();
        Ok(())
    }

    /// Queues an acquisition attempt; the first attempt queued while no
    /// thread makes them starts one, which makes every attempt waiting
    /// (up to [`ATTEMPTS_PER_TRANSACTION`] at a time) in one transaction,
    /// so that campaigns made at once share one synced commit. Resolves
    /// with the attempt's outcome.
    fn attempt_queued(
        self: &Arc<Self>,
        session: SessionId,
        election: ElectionName,
        candidate: CandidateId,
        unwaited: bool,
    ) -> tokio::sync::oneshot::Receiver<Result<Tried>> {
        let (outcome, received) = tokio::sync::oneshot::channel();
        let start = {
            let mut queue = self.attempts.lock().unwrap_or_else(|p| p.into_inner());
            queue.waiting.push(QueuedAttempt {
                session,
                election,
                candidate,
                unwaited,
                outcome,
            });
            !std::mem::replace(&mut queue.running, true)
        };
        if start {
            let db = Arc::clone(self);
            tokio::task::spawn_blocking(move || db.make_queued_attempts());
        }
        received
    }

    /// Makes the queued attempts until none is left.
    fn make_queued_attempts(&self) {
        /// Should an attempt panic, the next one queued starts a thread
        /// again (the panicking batch's campaigns fail: their outcomes'
        /// senders are dropped).
        struct Stopped<'a>(&'a Mutex<AttemptQueue>);
        impl Drop for Stopped<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.lock().unwrap_or_else(|p| p.into_inner()).running = false;
                }
            }
        }
        let _stopped = Stopped(&self.attempts);
        loop {
            let batch: Vec<QueuedAttempt> = {
                let mut queue = self.attempts.lock().unwrap_or_else(|p| p.into_inner());
                if queue.waiting.is_empty() {
                    queue.running = false;
                    return;
                }
                let n = queue.waiting.len().min(ATTEMPTS_PER_TRANSACTION);
                queue.waiting.drain(..n).collect()
            };
            let outcomes = if batch.len() == 1 {
                vec![self.try_acquire(&batch[0])]
            } else {
                // A failure of the shared transaction committed nothing:
                // each attempt is then made alone, and fails (or not) alone.
                self.try_acquire_together(&batch)
                    .unwrap_or_else(|_| batch.iter().map(|a| self.try_acquire(a)).collect())
            };
            for (attempt, outcome) in batch.into_iter().zip(outcomes) {
                // A campaign gone meanwhile: its receiver's owner releases
                // what it was granted (see `Inner::try_acquire`).
                let _ = attempt.outcome.send(outcome);
            }
        }
    }

    /// Several acquisition attempts in one transaction, each in a savepoint
    /// of its own: an attempt that fails leaves nothing behind and does not
    /// fail the others.
    fn try_acquire_together(&self, batch: &[QueuedAttempt]) -> Result<Vec<Result<Tried>>> {
        self.writable()?;
        let mut conn = self.conn();
        self.usable(&conn)?;
        let mut tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let now = monotonic_ns();
        let mut outcomes = Vec::with_capacity(batch.len());
        for a in batch {
            let savepoint = tx.savepoint().map_err(self.err())?;
            let outcome = self.attempt(&savepoint, a, now);
            if outcome.is_ok() {
                savepoint.commit().map_err(self.err())?;
            }
            outcomes.push(outcome);
        }
        if outcomes.iter().any(|o| o.as_ref().is_ok_and(|t| t.fresh)) {
            self.usable(&tx)?;
            tx.commit().map_err(self.err())?;
            self.announce();
        }
        Ok(outcomes)
    }

    /// One acquisition attempt, in a transaction of its own.
    fn try_acquire(&self, a: &QueuedAttempt) -> Result<Tried> {
        self.writable()?;
        let mut conn = self.conn();
        self.usable(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let tried = self.attempt(&tx, a, monotonic_ns())?;
        if tried.fresh {
            self.usable(&tx)?;
            tx.commit().map_err(self.err())?;
            self.announce();
        }
        Ok(tried)
    }

    /// One acquisition attempt inside the transaction `tx` (at monotonic
    /// time `now`); `fresh` with a grant that it wrote, which the caller
    /// commits. An `unwaited` attempt grants only if nobody holds the
    /// election, its own session neither, and no live session keeps a
    /// note on it (so none waits in line).
    fn attempt(&self, tx: &Connection, a: &QueuedAttempt, now: i64) -> Result<Tried> {
        let (session, election, candidate) = (a.session, &a.election, &a.candidate);
        self.session_alive(tx, session, now)?;
        let mut dead_pid = None;
        if let Some(holder) = self
            .live_holder(tx, election.as_str(), now)
            .map_err(self.err())?
        {
            let held = Attempt::Held {
                expires_in: duration_ns(holder.expires_in_ns),
            };
            if SessionId::from_stored(holder.session) == session {
                if a.unwaited {
                    return Ok(Tried::existing(held));
                }
                let grant = holder.into_grant(&self.path, election, session)?;
                return Ok(Tried::existing(Attempt::Granted(grant, None)));
            }
            match self.holder_process(tx, holder.session)? {
                (Process::Untested, _) => return Ok(Tried::existing(held)),
                (Process::Alive, _) => {
                    return Ok(Tried {
                        watch: Some(holder.session),
                        ..Tried::existing(held)
                    });
                }
                // Its lock was taken before its row committed and is gone
                // now, while this transaction keeps the row from changing:
                // the process that held the session is gone. Expire the
                // session; its grants are no longer live.
                (Process::Gone, pid) => {
                    self.expire_session(tx, holder.session)?;
                    dead_pid = Some(pid);
                }
            }
        }
        if a.unwaited && self.anyone_waits(tx, election, now)? {
            return Ok(Tried::existing(Attempt::Held {
                expires_in: Duration::ZERO,
            }));
        }
        let expired = self.expired_holder(tx, election, dead_pid)?;
        let grant = Grant {
            election: election.clone(),
            candidate: candidate.clone(),
            session,
            token: self.write_grant(tx, a)?,
        };
        Ok(Tried {
            attempt: Attempt::Granted(grant, expired),
            fresh: true,
            watch: None,
        })
    }

    /// Ends `session` in `tx`, whose process is gone: its grants are no
    /// longer live.
    fn expire_session(&self, tx: &Connection, session: i64) -> Result<()> {
        tx.execute("DELETE FROM sessions WHERE id = ?1", params![session])
            .map_err(self.err())?;
        tx.execute(
            "DELETE FROM session_locks WHERE session = ?1",
            params![session],
        )
        .map_err(self.err())?;
        Ok(())
    }

    /// The holder still recorded for `election` in `tx`, though not live
    /// (the caller checked): it was never released, its session expired —
    /// at once if its process was found gone, `dead_pid`.
    fn expired_holder(
        &self,
        tx: &Connection,
        election: &ElectionName,
        dead_pid: Option<i64>,
    ) -> Result<Option<Expired>> {
        tx.query_row(
            "SELECT holder_candidate, holder_token FROM elections
             WHERE name = ?1 AND holder_session IS NOT NULL",
            params![election.as_str()],
            |r| {
                Ok(Expired {
                    candidate: r.get::<_, Option<String>>(0)?.unwrap_or_default(),
                    token: FencingToken::from_stored(r.get::<_, Option<i64>>(1)?.unwrap_or(0)),
                    dead_pid,
                })
            },
        )
        .optional()
        .map_err(self.err())
    }

    /// Grants the election of `a` to its session and candidate inside the
    /// transaction `tx`, with the token after the election's last: that
    /// token. [`Error::Corrupt`] when the counter cannot give one; the
    /// caller then rolls `tx` back, and nothing is written.
    fn write_grant(&self, tx: &Connection, a: &QueuedAttempt) -> Result<FencingToken> {
        let token = self.next_token(tx, &a.election)?;
        tx.execute(
            "INSERT INTO elections (name, last_token, holder_session, holder_candidate, holder_token)
             VALUES (?1, ?4, ?2, ?3, ?4)
             ON CONFLICT (name) DO UPDATE SET
                 last_token = excluded.last_token,
                 holder_session = excluded.holder_session,
                 holder_candidate = excluded.holder_candidate,
                 holder_token = excluded.holder_token",
            params![
                a.election.as_str(),
                session_key(a.session)?,
                a.candidate.as_str(),
                token
            ],
        )
        .map_err(self.err())?;
        Ok(FencingToken::from_stored(token))
    }

    /// The token of the next grant of `election`: one above its counter,
    /// 1 for an election never granted. Computed here rather than by
    /// SQLite, whose `last_token + 1` at `i64::MAX` turns into a REAL:
    /// an exhausted counter, or one that holds no count (another type, a
    /// negative number), is [`Error::Corrupt`], never a wrapped token.
    fn next_token(&self, tx: &Connection, election: &ElectionName) -> Result<i64> {
        let last = tx
            .query_row(
                "SELECT last_token FROM elections WHERE name = ?1",
                params![election.as_str()],
                |r| r.get::<_, Value>(0),
            )
            .optional()
            .map_err(self.err())?;
        let shown = self.path.display();
        match last {
            None => Ok(1),
            Some(Value::Integer(last)) if last >= 0 => last
                .checked_add(1)
                .ok_or_else(|| Error::tokens_exhausted(&shown, election.as_str())),
            Some(other) => Err(Error::Corrupt(format!(
                "{shown}: the fencing token counter of election {election} holds {}, which is \
                 no count of grants; nothing was written",
                stored_value(&other)
            ))),
        }
    }

    /// Whether a live session keeps a note on `election` (at monotonic
    /// time `now`): a candidate waits in line, or a transfer is asked.
    /// Only attempts ask, on a writable handle, whose opening created the
    /// notes table.
    fn anyone_waits(&self, conn: &Connection, election: &ElectionName, now: i64) -> Result<bool> {
        conn.prepare_cached(
            "SELECT 1 FROM notes n JOIN sessions s ON s.id = n.session
             WHERE n.election = ?1 AND s.boot_id = ?3 AND s.expires_at_ns > ?2 LIMIT 1",
        )
        .and_then(|mut stmt| stmt.exists(params![election.as_str(), now, self.boot_id]))
        .map_err(self.err())
    }

    /// What the kernel says of the process of the holder `session`, and
    /// the pid it recorded (see `liveness`).
    fn holder_process(&self, conn: &Connection, session: i64) -> Result<(Process, i64)> {
        let Some(liveness) = &self.liveness else {
            return Ok((Process::Untested, 0));
        };
        let recorded = conn
            .query_row(
                "SELECT l.dev, l.ino, s.pid FROM session_locks l JOIN sessions s ON s.id = l.session
                 WHERE l.session = ?1",
                params![session],
                |r| Ok(((r.get(0)?, r.get(1)?), r.get(2)?)),
            )
            .optional()
            .map_err(self.err())?;
        Ok(match recorded {
            Some((file, pid)) => (liveness.probe(session, file), pid),
            None => (Process::Untested, 0),
        })
    }

    /// Lets go of `session`'s lock, if this handle holds it.
    fn release_lock(&self, session: SessionId) {
        if let (Some(liveness), Ok(key)) = (&self.liveness, session_key(session)) {
            liveness.release(key);
        }
    }

    fn resign(&self, grant: &Grant) -> Result<()> {
        self.writable()?;
        let mut conn = self.conn();
        self.usable(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let now = monotonic_ns();
        let released = tx
            .execute(
                "UPDATE elections SET holder_session = NULL, holder_candidate = NULL, holder_token = NULL
                 WHERE name = ?1 AND holder_token = ?2 AND holder_session = ?5 AND holder_session IN
                     (SELECT id FROM sessions WHERE boot_id = ?3 AND expires_at_ns > ?4)",
                params![
                    grant.election.as_str(),
                    grant.token.to_i64_saturating(),
                    self.boot_id,
                    now,
                    session_key(grant.session)?
                ],
            )
            .map_err(self.err())?;
        if released == 0 {
            return Err(Error::NotHolder {
                election: grant.election.to_string(),
                token: grant.token,
            });
        }
        tx.execute(
            "INSERT INTO releases (election, token) VALUES (?1, ?2)
             ON CONFLICT (election) DO UPDATE SET token = excluded.token",
            params![grant.election.as_str(), grant.token.to_i64_saturating()],
        )
        .map_err(self.err())?;
        self.usable(&tx)?;
        tx.commit().map_err(self.err())?;
        self.announce();
        Ok(())
    }

    fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        crate::store::check_note(name, text)?;
        self.writable()?;
        let mut conn = self.conn();
        self.usable(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        self.session_alive(&tx, session, monotonic_ns())?;
        tx.execute(
            "INSERT INTO notes (election, session, name, text) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (election, session, name) DO UPDATE SET text = excluded.text",
            params![election.as_str(), session_key(session)?, name, text],
        )
        .map_err(self.err())?;
        self.usable(&tx)?;
        tx.commit().map_err(self.err())?;
        self.announce();
        Ok(())
    }

    fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        crate::store::check_note(name, text)?;
        self.writable()?;
        let Ok(key) = session_key(session) else {
            return Ok(false);
        };
        let mut conn = self.conn();
        self.usable(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let amended = tx
            .execute(
                "UPDATE notes SET text = ?4
                 WHERE election = ?1 AND session = ?2 AND name = ?3 AND EXISTS (
                     SELECT 1 FROM sessions s
                     WHERE s.id = ?2 AND s.boot_id = ?5 AND s.expires_at_ns > ?6)",
                params![
                    election.as_str(),
                    key,
                    name,
                    text,
                    self.boot_id,
                    monotonic_ns()
                ],
            )
            .map_err(self.err())?;
        self.usable(&tx)?;
        tx.commit().map_err(self.err())?;
        if amended > 0 {
            self.announce();
        }
        Ok(amended > 0)
    }

    fn delete_note(&self, session: SessionId, election: &ElectionName, name: &str) -> Result<()> {
        self.writable()?;
        let Ok(key) = session_key(session) else {
            return Ok(());
        };
        let mut conn = self.conn();
        self.usable(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let deleted = tx
            .execute(
                "DELETE FROM notes WHERE election = ?1 AND session = ?2 AND name = ?3",
                params![election.as_str(), key, name],
            )
            .map_err(self.err())?;
        self.usable(&tx)?;
        tx.commit().map_err(self.err())?;
        if deleted > 0 {
            self.announce();
        }
        Ok(())
    }

    /// The live notes on `election`, and how long until the first session
    /// keeping one of them expires.
    /// The live notes on `election` (only `session`'s note `name` with
    /// `only`), how long until the first session keeping one expires, and
    /// the sessions the kernel said are alive (see `liveness`): a note of
    /// a session whose process the kernel saw die is not live, so that a
    /// waiter killed in line leaves it at once, not at its TTL.
    fn notes(
        &self,
        election: &ElectionName,
        only: Option<&local::NoteKey>,
    ) -> Result<(Vec<Note>, Option<Duration>, Vec<i64>)> {
        let conn = self.conn();
        self.usable(&conn)?;
        let now = monotonic_ns();
        let mut stmt = conn
            .prepare_cached(
                "SELECT n.session, n.name, n.id, n.text, s.expires_at_ns - ?2, l.dev, l.ino
                 FROM notes n JOIN sessions s ON s.id = n.session
                      LEFT JOIN session_locks l ON l.session = n.session
                 WHERE n.election = ?1 AND s.boot_id = ?3 AND s.expires_at_ns > ?2
                   AND (?4 IS NULL OR (n.session = ?4 AND n.name = ?5))
                 ORDER BY n.id",
            )
            .map_err(self.err())?;
        let (session, name) = match only {
            Some((session, name)) => (Some(session_key(*session)?), Some(name.as_str())),
            None => (None, None),
        };
        let rows = stmt
            .query_map(
                params![election.as_str(), now, self.boot_id, session, name],
                |r| {
                    let lock = match (r.get::<_, Option<i64>>(5)?, r.get::<_, Option<i64>>(6)?) {
                        (Some(dev), Some(ino)) => Some((dev, ino)),
                        _ => None,
                    };
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, i64>(4)?,
                        lock,
                    ))
                },
            )
            .map_err(self.err())?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(self.err())?;
        let mut tested: std::collections::BTreeMap<i64, Process> = Default::default();
        let mut alive = Vec::new();
        let mut notes = Vec::with_capacity(rows.len());
        let mut first_expiry: Option<i64> = None;
        for (session, name, id, text, left, lock) in rows {
            let process = match (&self.liveness, lock) {
                (Some(liveness), Some(lock)) => *tested
                    .entry(session)
                    .or_insert_with(|| liveness.probe(session, lock)),
                _ => Process::Untested,
            };
            match process {
                Process::Gone => continue,
                Process::Alive if !alive.contains(&session) => alive.push(session),
                _ => {}
            }
            first_expiry = Some(first_expiry.map_or(left, |f| f.min(left)));
            notes.push(Note {
                session: SessionId::from_stored(session),
                name,
                order: id.unsigned_abs(),
                text,
            });
        }
        Ok((notes, first_expiry.map(duration_ns), alive))
    }

    fn last_release(&self, election: &ElectionName) -> Result<Option<FencingToken>> {
        let conn = self.conn();
        self.usable(&conn)?;
        let token = conn
            .query_row(
                "SELECT token FROM releases WHERE election = ?1",
                params![election.as_str()],
                |r| r.get::<_, i64>(0),
            )
            .optional()
            .map_err(self.err())?;
        Ok(token.map(FencingToken::from_stored))
    }

    fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        let conn = self.conn();
        self.usable(&conn)?;
        let holder = self
            .live_holder(&conn, election.as_str(), monotonic_ns())
            .map_err(self.err())?;
        holder.map(|h| h.into_leader(&self.path)).transpose()
    }

    fn elections(&self) -> Result<Vec<ElectionState>> {
        let conn = self.conn();
        self.usable(&conn)?;
        let now = monotonic_ns();
        let mut stmt = conn
            .prepare("SELECT name FROM elections ORDER BY name")
            .map_err(self.err())?;
        let names = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(self.err())?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(self.err())?;
        names
            .into_iter()
            .map(|name| {
                let leader = self
                    .live_holder(&conn, &name, now)
                    .map_err(self.err())?
                    .map(|h| h.into_leader(&self.path))
                    .transpose()?;
                let election = ElectionName::new(name).map_err(|e| {
                    Error::Corrupt(format!(
                        "{}: stored election name: {e}",
                        self.path.display()
                    ))
                })?;
                Ok(ElectionState { election, leader })
            })
            .collect()
    }
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

/// `(application_id, user_version, schema objects)`, read in one statement
/// so that all three come from the same snapshot even while another
/// process is creating the schema.
fn read_identity(conn: &Connection) -> rusqlite::Result<Identity> {
    conn.query_row(
        "SELECT (SELECT application_id FROM pragma_application_id()),
                (SELECT user_version FROM pragma_user_version()),
                (SELECT count(*) FROM sqlite_master)",
        [],
        |r| {
            Ok(Identity {
                app_id: r.get(0)?,
                version: r.get(1)?,
                objects: r.get(2)?,
            })
        },
    )
}

#[derive(Debug, Clone, Copy)]
struct Identity {
    app_id: i64,
    version: i64,
    objects: i64,
}

impl Holder {
    fn into_leader(self, path: &Path) -> Result<Leader> {
        Ok(Leader {
            candidate: stored_candidate(path, self.candidate)?,
            token: FencingToken::from_stored(self.token),
            expires_in: duration_ns(self.expires_in_ns),
        })
    }

    fn into_grant(self, path: &Path, election: &ElectionName, session: SessionId) -> Result<Grant> {
        Ok(Grant {
            election: election.clone(),
            candidate: stored_candidate(path, self.candidate)?,
            session,
            token: FencingToken::from_stored(self.token),
        })
    }
}

/// A value SQLite holds, for a message.
fn stored_value(value: &Value) -> String {
    match value {
        Value::Null => "NULL".to_owned(),
        Value::Integer(n) => n.to_string(),
        Value::Real(r) => format!("the real number {r}"),
        Value::Text(text) => format!("the text {}", crate::error::quoted(text)),
        Value::Blob(blob) => format!("a blob of {} bytes", blob.len()),
    }
}

fn stored_candidate(path: &Path, candidate: String) -> Result<CandidateId> {
    CandidateId::new(candidate)
        .map_err(|e| Error::Corrupt(format!("{}: stored candidate id: {e}", path.display())))
}

fn sql_error(path: &Path, error: rusqlite::Error) -> Error {
    let shown = path.display();
    match error.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => {
            Error::Corrupt(format!("{shown} is not a SQLite database"))
        }
        Some(ErrorCode::DatabaseCorrupt) => Error::Corrupt(format!("{shown} is damaged: {error}")),
        Some(ErrorCode::CannotOpen) if permission_denied(path) => {
            Error::Denied(why_cannot_open(path))
        }
        Some(ErrorCode::CannotOpen)
            if ["-wal", "-shm"]
                .iter()
                .any(|s| unreadable(&sibling(path, s))) =>
        {
            Error::Denied(format!(
                "{shown}-wal or {shown}-shm is not readable by this user (a replica that uses the \
                 database made it): give this user read access to both, as to the database"
            ))
        }
        Some(ErrorCode::CannotOpen) => Error::unavailable(why_cannot_open(path), error),
        // A permission of the file or its folder, or a read-only
        // filesystem: no outage, and waiting does not end it.
        Some(ErrorCode::ReadOnly | ErrorCode::PermissionDenied) => Error::Denied(format!(
            "{shown} (or the -wal and -shm files next to it) is not writable by this user: {error}"
        )),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            Error::unavailable(format!("{shown} is locked by another process"), error)
        }
        _ => Error::unavailable(format!("{shown}: {error}"), error),
    }
}

/// Whether `path` exists and this user may not open it for reading.
fn unreadable(path: &Path) -> bool {
    std::fs::File::open(path).is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
}

/// Whether this user may not open `path` for reading, or, when it does
/// not exist, create a file in its folder: a permission, not an outage.
fn permission_denied(path: &Path) -> bool {
    use nix::unistd::{AccessFlags, access};
    match std::fs::File::open(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let dir = match path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => Path::new("."),
            };
            access(dir, AccessFlags::W_OK | AccessFlags::X_OK) == Err(nix::errno::Errno::EACCES)
        }
        Err(error) => error.kind() == std::io::ErrorKind::PermissionDenied,
        Ok(_) => false,
    }
}

/// Why SQLite could not open `path`, which it reports only as "unable to
/// open database file": the operating system's answer to the same open, or
/// to creating a file next to it (a probe with a name of its own, so that
/// the database file is never touched).
fn why_cannot_open(path: &Path) -> String {
    let shown = path.display();
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return format!("directory {} does not exist", dir.display());
    }
    let exists = path.exists();
    if exists
        && let Err(error) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
    {
        return format!("cannot open {shown}: {error}");
    }
    let probe = dir.join(format!(
        ".leasehold-probe-{}-{}",
        std::process::id(),
        monotonic_ns()
    ));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Err(error) if exists => {
            format!("cannot create SQLite's -wal and -shm files next to {shown}: {error}")
        }
        Err(error) => format!("cannot create {shown}: {error}"),
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            format!("cannot open {shown}")
        }
    }
}

/// Renewals waiting for the renewal thread, and whether it runs. Every
/// change under its lock is one assignment or one `Vec` operation, so a
/// lock whose holder panicked is used as it is ([`lock`]).
#[derive(Debug, Default)]
struct RenewalQueue {
    pending: Vec<(SessionId, tokio::sync::oneshot::Sender<Result<Duration>>)>,
    running: bool,
}

/// The renewal thread: renews, in one transaction, every renewal waiting,
/// until none is; then it ends (the next renewal starts another).
fn renew_while_asked(db: &Db, queue: &Mutex<RenewalQueue>) {
    loop {
        let batch = {
            let mut queue = lock(queue);
            if queue.pending.is_empty() {
                queue.running = false;
                return;
            }
            std::mem::take(&mut queue.pending)
        };
        let sessions: Vec<SessionId> = batch.iter().map(|(session, _)| *session).collect();
        for ((_, waiter), renewed) in batch.into_iter().zip(db.keep_alive(&sessions)) {
            let _ = waiter.send(renewed);
        }
    }
}

/// A renewal that failed because the file was replaced ends the session:
/// the file that held it is no longer the store.
fn renewal_error(error: Error, session: SessionId) -> Error {
    match error {
        Error::Replaced(_) => Error::SessionExpired(session),
        other => other,
    }
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
