//! One database file, one name.
//!
//! SQLite finds a database's `-wal` and `-shm`, and leasehold its
//! `-notify`, by the path the database was opened by. A file reached by two
//! names — a hard link, or one file bind-mounted by itself into two
//! folders (`docker -v /host/lease.db:/app/lease.db` for two containers) —
//! has two sets of them: processes using one name never see what those
//! using the other wrote, and both are granted the same election with the
//! same token. (A symbolic link is followed to its file's folder, and a
//! bind-mounted folder keeps its device and inode: both are one name.)
//!
//! So a file's identity is its inode, and a name is the folder's device and
//! inode with the file name in it. Every handle holds, for its life, a lock
//! (an open file description lock, which the kernel keeps per inode, in
//! every mount namespace and container of the host) on one byte of the
//! database file itself, chosen by its name, far past SQLite's own lock
//! bytes. Before it reads or writes anything, a handle takes its byte and
//! then asks the kernel whether any other name's byte is held: if so, it
//! refuses to open. Each takes before it looks, so of two names opened at
//! once at least one sees the other. Two names could share a byte only if
//! their 32-bit hashes collide.
//!
//! Killed processes hold no lock, but their name's `-wal` may hold grants
//! not yet in the file, which every other name would miss (and which a
//! later opening of that name would replay over theirs). So a writer
//! records its name in the database (`name_in_use`) and checkpoints that
//! record into the file itself before it campaigns: the record is in the
//! file whatever the filesystem keeps, and is read from the file alone, as
//! another name sees it. The last handle of a name to close empties its
//! `-wal` into the file and then removes the record. A record of another
//! name found on opening means that name's processes died: the name is
//! refused, unless that name's `-wal` can be seen to be empty or gone.
//!
//! A handle that finds no other handle holding its name's byte takes it
//! alone (a write lock) while it looks and, if it writes, until its record
//! is in the file; others wait for it. So a handle that shares the byte
//! finds the record of the first: a record of another name with the same
//! byte (two names whose hashes collide, found on purpose) is refused as
//! a name in use. Writers also hold a second byte of the name's, which
//! readers do not: the last writer to close, whatever readers still have
//! the database open, is the one that finds it alone. And a writer holds
//! one byte of the file's alone from before it takes its name's byte until
//! its record is in the file: two writers that find the byte shared only
//! with readers, or with the last writer of another name as it closes,
//! take turns, and the second finds the first's record.
//!
//! The `-wal` next to a path belongs to whichever database file was
//! opened there, which another file mounted or moved onto the path is
//! not. So the record also names the database file (device and inode),
//! and a `-wal` with content that no connection uses (killed processes
//! left it) is only ever replayed into the file that records both the
//! name and itself: next to any other leasehold or empty file (a copy, a
//! backup put back, another file mounted over the path, or a file whose
//! record was removed by hand) it is refused, and left as it is. A `-shm`
//! in use while nobody uses the file means the same, with live processes.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::FcntlArg;
use nix::libc;
use rusqlite::{Connection, params};

use super::{
    BUSY_TIMEOUT, OnDisk, SHARED_FIRST, SHARED_SIZE, on_disk, open_connection, sibling, sql_error,
};
use crate::error::{Error, Result};

/// The first of the bytes names lock: far past SQLite's lock bytes (at
/// 1 GiB) and any database leasehold writes.
const FIRST_NAME_BYTE: i64 = 1 << 40;
/// How many bytes names are spread over.
const NAME_BYTES: i64 = 1 << 32;
/// The byte a writer holds alone from before it takes its name's byte
/// until its record is in the file: of two writers that find the name's
/// byte shared (with readers, or with a writer that is closing) and no
/// record, the second finds the first's.
const CLAIM_BYTE: i64 = FIRST_NAME_BYTE - 1;

/// The table of the name in use: one row at most.
pub(super) const TABLE: &str = "
CREATE TABLE IF NOT EXISTS name_in_use (
    one  INTEGER PRIMARY KEY CHECK (one = 1),
    dev  INTEGER NOT NULL,
    ino  INTEGER NOT NULL,
    byte INTEGER NOT NULL,
    path BLOB    NOT NULL,
    file_dev INTEGER NOT NULL,
    file_ino INTEGER NOT NULL
);
";

/// A name of the database file: its folder's device and inode, and its
/// file name there.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Name {
    dev: u64,
    ino: u64,
    file: Vec<u8>,
}

impl Name {
    fn of(path: &Path) -> std::io::Result<Self> {
        let folder = match path.parent() {
            Some(folder) if !folder.as_os_str().is_empty() => folder,
            _ => Path::new("."),
        };
        let meta = std::fs::metadata(folder)?;
        Ok(Name {
            dev: meta.dev(),
            ino: meta.ino(),
            file: path
                .file_name()
                .map(|f| f.as_bytes().to_vec())
                .unwrap_or_default(),
        })
    }

    /// The byte this name locks: FNV-1a of the name, a hash that stays the
    /// same in every build.
    fn byte(&self) -> i64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let bytes = self.dev.to_le_bytes().into_iter();
        let bytes = bytes
            .chain(self.ino.to_le_bytes())
            .chain(self.file.iter().copied());
        for b in bytes {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        FIRST_NAME_BYTE + i64::try_from(hash % NAME_BYTES.unsigned_abs()).unwrap_or(0)
    }
}

/// The name a handle holds (see [`claim`]).
#[derive(Debug)]
pub(super) struct Claim {
    name: Name,
    byte: i64,
    /// The database file's device and inode.
    file: (u64, u64),
    /// Whether the database file records this name already.
    recorded: bool,
    /// Whether the name's byte is held alone, until [`share`].
    alone: bool,
    /// Whether [`CLAIM_BYTE`] is held, until [`share`].
    claiming: bool,
    /// Whether a `-wal` that killed processes left was next to the file
    /// when it was claimed (see [`leftover_wal`]).
    leftover: bool,
}

impl Claim {
    /// The byte a writer of the name holds besides its name's, in a range
    /// of its own: the last writer to close is the one that finds no other
    /// holder, whatever readers of the name do.
    fn writer_byte(&self) -> i64 {
        self.byte + NAME_BYTES
    }
}

/// How long a handle waits while another of its name holds the name's
/// byte alone (opening the database, or closing it last).
const NAME_WAIT: Duration = Duration::from_secs(15);

fn lock_arg(kind: libc::c_int, start: i64, len: i64) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        // Must be 0 for OFD locks.
        l_pid: 0,
    }
}

fn set_lock(file: &File, kind: libc::c_int, byte: i64) -> nix::Result<()> {
    nix::fcntl::fcntl(file, FcntlArg::F_OFD_SETLK(&lock_arg(kind, byte, 1))).map(drop)
}

/// The byte of another name held on `file` within `start..start + len`.
fn other_name_in(file: &File, start: i64, len: i64) -> nix::Result<Option<i64>> {
    if len <= 0 {
        return Ok(None);
    }
    let mut arg = lock_arg(libc::F_WRLCK, start, len);
    nix::fcntl::fcntl(file, FcntlArg::F_OFD_GETLK(&mut arg))?;
    Ok((libc::c_int::from(arg.l_type) != libc::F_UNLCK).then_some(arg.l_start))
}

/// The byte of a name other than the one at `byte` held on `file`.
fn other_name(file: &File, byte: i64) -> nix::Result<Option<i64>> {
    let end = FIRST_NAME_BYTE + NAME_BYTES;
    match other_name_in(file, FIRST_NAME_BYTE, byte - FIRST_NAME_BYTE)? {
        Some(other) => Ok(Some(other)),
        None => other_name_in(file, byte + 1, end - byte - 1),
    }
}

/// Runs `take` until it is not refused because another handle holds the
/// byte alone (for at most [`NAME_WAIT`]). `None` where the kernel cannot
/// lock the file (a filesystem without such locks).
fn waiting<T>(path: &Path, mut take: impl FnMut() -> nix::Result<T>) -> Result<Option<T>> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        match take() {
            Ok(taken) => return Ok(Some(taken)),
            Err(Errno::EAGAIN | Errno::EACCES) if started.elapsed() < NAME_WAIT => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(Errno::EAGAIN | Errno::EACCES) => {
                return Err(Error::Unavailable {
                    reason: format!(
                        "{} is being opened or closed by another process using this path, for \
                         more than {NAME_WAIT:?}",
                        path.display()
                    ),
                    source: None,
                });
            }
            Err(error) => {
                tracing::debug!(path = %path.display(), %error, "cannot lock the database file; its names are not checked");
                return Ok(None);
            }
        }
    }
}

/// Takes `byte` on `file`: for this handle alone (`true`) when no other
/// handle holds it, else shared with them (`false`).
fn take_byte(file: &File, byte: i64, path: &Path) -> Result<Option<bool>> {
    waiting(path, || {
        set_lock(file, libc::F_WRLCK, byte)
            .map(|()| true)
            .or_else(|error| match error {
                // Others hold it; or this user may only read the file.
                Errno::EAGAIN | Errno::EACCES | Errno::EBADF => {
                    set_lock(file, libc::F_RDLCK, byte).map(|()| false)
                }
                error => Err(error),
            })
    })
}

/// Takes `path`'s name on the database `file` (held by the open file
/// description for as long as `file` is open) before SQLite reads
/// anything, and refuses, with [`Error::Conflict`], a file that another
/// name uses now or whose record says another name's processes died
/// (see the module's documentation). `None` where names cannot be checked.
/// A handle that holds its name alone keeps it so until [`share`].
pub(super) fn claim(file: &File, path: &Path, read_only: bool) -> Result<Option<Claim>> {
    let name = match Name::of(path) {
        Ok(name) => name,
        Err(error) => {
            tracing::debug!(path = %path.display(), %error, "cannot identify the database's folder; its names are not checked");
            return Ok(None);
        }
    };
    let byte = name.byte();
    let claiming = !read_only;
    if claiming && waiting(path, || set_lock(file, libc::F_WRLCK, CLAIM_BYTE))?.is_none() {
        return Ok(None);
    }
    let Some(alone) = take_byte(file, byte, path)? else {
        return Ok(None);
    };
    let meta = file
        .metadata()
        .map_err(|e| Error::unavailable(format!("cannot inspect {}: {e}", path.display()), e))?;
    let mut claim = Claim {
        name,
        byte,
        file: (meta.dev(), meta.ino()),
        recorded: false,
        alone,
        claiming,
        leftover: false,
    };
    if !read_only {
        let writer = claim.writer_byte();
        if waiting(path, || set_lock(file, libc::F_RDLCK, writer))?.is_none() {
            return Ok(None);
        }
    }
    judge_files(file, path, &mut claim, read_only)?;
    if read_only {
        share(file, &claim, path)?;
    }
    Ok(Some(claim))
}

/// Refuses, for `claim` of the database `file` at `path`, what would pair
/// it with files that are not its own: a `-wal` and `-shm` of another
/// file, another name in use, a leftover `-wal` that is not this file's;
/// and records what it learnt (whether the file records this name, and
/// whether a `-wal` was left over).
fn judge_files(file: &File, path: &Path, claim: &mut Claim, read_only: bool) -> Result<()> {
    // With other handles of this name open, the -shm is theirs too.
    if claim.alone && siblings_of_another_file(file, path) {
        return Err(Error::Conflict(format!(
            "the -wal and -shm at {} are in use by processes that have another database file open \
             at this path (another file was mounted or moved onto it, in another mount namespace \
             or container): SQLite would pair their -wal with this file; nothing was written",
            path.display()
        )));
    }
    let other = other_name(file, claim.byte).unwrap_or_else(|error| {
        tracing::debug!(path = %path.display(), %error, "cannot test the database file's locks; its names are not checked");
        None
    });
    if let Some(other) = other {
        return Err(Error::Conflict(refusal(file, path, other)));
    }
    claim.recorded = check_record(file, path, claim)?;
    // With other handles of this name open, the -wal is theirs.
    claim.leftover = claim.alone && leftover_wal(file, path);
    // Reading through the -wal creates a -shm: a reader (of another user,
    // maybe) never does; it reads the file alone.
    if claim.leftover && !claim.recorded && !read_only {
        claim.recorded =
            recorded_only_in_the_wal(file, path, claim) || created_only_in_the_wal(file, path);
    }
    // A SQLite file without tables has its -wal judged once SQLite has
    // told whose it is (another program's is refused as such).
    if matches!(on_disk(file), Ok(OnDisk::Leasehold | OnDisk::Empty)) {
        refuse_a_leftover(claim, path)?;
    }
    if claim.leftover && claim.recorded && !read_only && !wal_fits(path) {
        return Err(Error::Conflict(misfit(path)));
    }
    Ok(())
}

/// Whether a leasehold file that records no name has, in the `-wal` that
/// killed processes left next to it, the record of this name and this
/// file: they were killed after writing it and before it reached the
/// file (their grants come only after), so the `-wal` is this file's.
/// Read without writing the file: a `-wal` that is not this file's reads
/// as something else, or as damaged.
fn recorded_only_in_the_wal(file: &File, path: &Path, claim: &Claim) -> bool {
    if !matches!(on_disk(file), Ok(OnDisk::Leasehold)) || !matches!(recorded(file, path), Ok(None))
    {
        return false;
    }
    let Ok(conn) = open_connection(path, true, false) else {
        return false;
    };
    let kept = read_record_with(&conn, path);
    drop(conn);
    kept.ok()
        .flatten()
        .is_some_and(|kept| kept.name == claim.name && kept.file == claim.file)
}

/// Whether the `-wal` that killed processes left next to a file that
/// holds no database yet (switched to WAL and nothing more) holds a
/// leasehold database in which nothing was ever granted: a store whose
/// creation was cut short (its process killed as it opened it, before it
/// recorded its name). Replaying it loses no grant and pairs no token with
/// another file's, whoever wrote it. Read without writing the file, and
/// never beside an empty file (0 bytes), next to which SQLite deletes a
/// `-wal` as soon as it reads.
fn created_only_in_the_wal(file: &File, path: &Path) -> bool {
    if !matches!(on_disk(file), Ok(OnDisk::EmptyDatabase)) {
        return false;
    }
    let Ok(conn) = open_connection(path, true, false) else {
        return false;
    };
    let granted: rusqlite::Result<i64> = conn.query_row(
        "SELECT (SELECT application_id FROM pragma_application_id()) = ?1
                AND (SELECT value FROM revision) = 0",
        [super::APPLICATION_ID],
        |row| row.get(0),
    );
    matches!(granted, Ok(1))
}

/// Whether the database at `path`, read through the `-wal` that killed
/// processes left (without writing the file: SQLite writes a `-wal` into
/// its file only at a checkpoint, which this read-only connection never
/// runs), is whole. A `-wal` replayed into another file than the one it
/// was written for (a copy put back into the same inode, whose pages lie
/// elsewhere) reads as damaged.
fn wal_fits(path: &Path) -> bool {
    let Ok(conn) = open_connection(path, true, false) else {
        return false;
    };
    let verdict: rusqlite::Result<Vec<String>> = conn
        .prepare("PRAGMA quick_check")
        .and_then(|mut s| s.query_map([], |row| row.get(0))?.collect());
    match verdict {
        Ok(lines) if lines == ["ok"] => true,
        other => {
            tracing::debug!(path = %path.display(), ?other, "the -wal left by killed processes does not fit the file");
            false
        }
    }
}

/// One line for a `-wal` that does not fit the file at its path.
fn misfit(path: &Path) -> String {
    format!(
        "{}-wal holds what processes that did not close the database (killed) wrote, and it does \
         not fit this database file: replaying it would damage the file (a backup or a copy put \
         back at this path beside it?). Nothing was written. To keep its grants, put back the \
         file it belongs to; to use this file, stop every replica and move the -wal and -shm \
         away (the file's token counters are then its own: see the GUIDE's section on a lost \
         SQLite file)",
        path.display()
    )
}

/// Whether other handles of `claim`'s name have the database `file` open
/// (each holds the name's byte while it does).
pub(super) fn others_use(file: &File, claim: &Claim) -> bool {
    held(file, claim.byte, 1)
}

/// Refuses a `-wal` that killed processes left next to a file that does
/// not record both this name and itself (see the module's documentation).
pub(super) fn refuse_a_leftover(claim: &Claim, path: &Path) -> Result<()> {
    if claim.leftover && !claim.recorded {
        return Err(Error::Conflict(format!(
            "{}-wal holds what processes that did not close the database (killed) wrote, and this \
             database file does not record that it was theirs: it may belong to another database \
             file that was at this path or was mounted over it, whose grants it holds. Open that \
             file at this path once (`leasehold campaign` there empties it into that file); if it \
             is this file's own, written by another program that did not close it (sqlite3 after \
             an error), open the file once with that program; if nothing needs it, move it away. \
             Nothing was written (where no database was, an empty file is left at the path)",
            path.display()
        )));
    }
    Ok(())
}

/// SQLite's lock byte in a `-shm` file (unix VFS, `UNIX_SHM_DMS`): every
/// connection that uses the `-shm` holds a read lock on it.
const SHM_IN_USE_BYTE: i64 = 128;

/// Whether the `-shm` next to `path` is in use by SQLite connections while
/// none uses the database `file` (in WAL mode, each holds a read lock on
/// it): those connections have another file open at this path (see the
/// caller), and their `-wal` is not this file's.
/// Only a leasehold database is judged here: any other file is refused
/// later, saying what it is, and a new one waits for the processes still
/// using the one it replaces.
fn siblings_of_another_file(file: &File, path: &Path) -> bool {
    let seen = || shm_in_use(path) && !db_in_use(file);
    // As long as it lasts: a connection of this file that opens or closes
    // holds the -shm a moment without the file's lock.
    matches!(on_disk(file), Ok(OnDisk::Leasehold))
        && (0..5).all(|_| {
            let now = seen();
            if now {
                std::thread::sleep(Duration::from_millis(10));
            }
            now
        })
}

/// Whether any SQLite connection, in any process, holds a lock on the
/// `-shm` next to `path`.
fn shm_in_use(path: &Path) -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits())
        .open(sibling(path, "-shm"))
        .is_ok_and(|shm| held(&shm, SHM_IN_USE_BYTE, 1))
}

/// Whether any SQLite connection, in any process, has the database `file`
/// open (in WAL mode, each holds a read lock on its `SHARED` range).
fn db_in_use(file: &File) -> bool {
    held(file, SHARED_FIRST, SHARED_SIZE)
}

/// Whether a lock that another open file description holds meets
/// `start..start + len` of `file`.
fn held(file: &File, start: i64, len: i64) -> bool {
    let mut arg = lock_arg(libc::F_WRLCK, start, len);
    nix::fcntl::fcntl(file, FcntlArg::F_OFD_GETLK(&mut arg))
        .is_ok_and(|_| libc::c_int::from(arg.l_type) != libc::F_UNLCK)
}

/// Whether a `-wal` with content that no SQLite connection uses is next
/// to `path`, by a leasehold database file or an empty one: what killed
/// processes left, which SQLite would replay into `file`. Asked before
/// this process's connection reads (it would then hold the `-shm`).
fn leftover_wal(file: &File, path: &Path) -> bool {
    let wal = std::fs::symlink_metadata(sibling(path, "-wal"));
    let ours = matches!(
        on_disk(file),
        Ok(OnDisk::Leasehold | OnDisk::Empty | OnDisk::EmptyDatabase)
    );
    wal.is_ok_and(|m| m.is_file() && m.len() >= WAL_WITH_A_FRAME)
        && ours
        && !shm_in_use(path)
        && !db_in_use(file)
}

/// The size of the smallest `-wal` that holds a frame: its 32-byte
/// header, a frame's 24-byte header and the smallest page (512 bytes).
/// A shorter one (a process killed as it opened the database leaves the
/// header alone) holds nothing SQLite would replay; it resets it.
const WAL_WITH_A_FRAME: u64 = 32 + 24 + 512;

/// Whether the database file records `claim`'s name; refuses another
/// name's record that tells it uses the file now (a name whose byte is
/// this one's) or that its processes died.
fn check_record(file: &File, path: &Path, claim: &Claim) -> Result<bool> {
    match recorded(file, path)? {
        Some(kept) if kept.name == claim.name && kept.file == claim.file => Ok(true),
        // A copy of a file this name used (or a backup put back): its
        // record is that file's, and so may be the -wal at this path.
        Some(kept) if kept.name == claim.name => Ok(false),
        // Two names whose bytes are one: the other holds it with this
        // name's handles, or alone has recorded it before sharing it.
        Some(kept) if kept.byte == claim.byte && !claim.alone => {
            Err(Error::Conflict(refusal(file, path, kept.byte)))
        }
        Some(kept) if !closed(&kept) => Err(Error::Conflict(left_behind(path, &kept))),
        _ => Ok(false),
    }
}

/// Shares the name's byte with the other handles of the name, once this
/// handle, holding it alone, has checked and recorded, and lets the next
/// writer claim.
pub(super) fn share(file: &File, claim: &Claim, path: &Path) -> Result<()> {
    let shared = match claim.alone {
        true => set_lock(file, libc::F_RDLCK, claim.byte),
        false => Ok(()),
    };
    let done = match claim.claiming {
        true => set_lock(file, libc::F_UNLCK, CLAIM_BYTE),
        false => Ok(()),
    };
    shared.and(done).map_err(|error| {
        Error::unavailable(
            format!("cannot share the lock on {}", path.display()),
            std::io::Error::from(error),
        )
    })
}

/// A name's record, as [`record`] writes it.
#[derive(Debug)]
struct Recorded {
    name: Name,
    byte: i64,
    path: PathBuf,
    /// The device and inode of the database file that recorded it.
    file: (u64, u64),
}

/// The record in the database file itself (not in any `-wal`), if the
/// file is a leasehold database that holds one. A read that fails (a
/// writer of this name checkpointing into the file) is tried again.
/// How long a file that reads as damaged is read again before it is
/// taken to be damaged (a checkpoint of a large store takes tens of
/// milliseconds).
const DAMAGED_WAIT: Duration = Duration::from_millis(500);

fn recorded(file: &File, path: &Path) -> Result<Option<Recorded>> {
    let started = Instant::now();
    loop {
        if !matches!(on_disk(file), Ok(OnDisk::Leasehold)) {
            return Ok(None);
        }
        let read = read_record(path);
        // A file read while another process checkpoints into it may read
        // as damaged for a moment; one that still does is damaged.
        let patience = match &read {
            Err(Error::Corrupt(_)) => DAMAGED_WAIT,
            _ => BUSY_TIMEOUT,
        };
        match read {
            Ok(kept) => return Ok(kept),
            Err(error) if started.elapsed() < patience => {
                tracing::debug!(path = %path.display(), %error, "cannot read the name record yet");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(error) => return Err(error),
        }
    }
}

fn read_record(path: &Path) -> Result<Option<Recorded>> {
    read_record_with(&open_connection(path, true, true)?, path)
}

fn read_record_with(conn: &Connection, path: &Path) -> Result<Option<Recorded>> {
    let row = conn.query_row(
        "SELECT dev, ino, byte, path, file_dev, file_ino FROM name_in_use",
        [],
        |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        },
    );
    #[allow(clippy::type_complexity)]
    let (dev, ino, byte, kept, file_dev, file_ino): (i64, i64, i64, Vec<u8>, i64, i64) = match row {
        Ok(row) => row,
        Err(rusqlite::Error::QueryReturnedNoRows) => return Ok(None),
        // A file whose tables are not in it yet (still in a -wal).
        Err(rusqlite::Error::SqliteFailure(_, Some(message)))
            if message.starts_with("no such table") =>
        {
            return Ok(None);
        }
        Err(error) => return Err(sql_error(path, error)),
    };
    let kept = PathBuf::from(OsStr::from_bytes(&kept));
    let Some(file) = kept.file_name().map(|f| f.as_bytes().to_vec()) else {
        return Ok(None);
    };
    let unsigned = |n: i64| u64::from_ne_bytes(n.to_ne_bytes());
    Ok(Some(Recorded {
        name: Name {
            dev: unsigned(dev),
            ino: unsigned(ino),
            file,
        },
        byte,
        path: kept,
        file: (unsigned(file_dev), unsigned(file_ino)),
    }))
}

/// Whether the recorded name's `-wal` can be seen from here to be empty
/// or gone: its processes closed the database, or another opened it.
fn closed(other: &Recorded) -> bool {
    // Its folder, if it is the one at its path here: then its -wal tells.
    let seen = Name::of(&other.path).is_ok_and(|here| here == other.name);
    seen && std::fs::symlink_metadata(sibling(&other.path, "-wal")).map_or(true, |m| m.len() == 0)
}

fn left_behind(path: &Path, other: &Recorded) -> String {
    format!(
        "{} was last used as {}, whose processes were not seen to close it (killed, their host or \
         container gone, or that path is not visible from here): its -wal may hold grants that \
         are not yet in the database, and another name would not see them. Open it once as {} \
         (`leasehold campaign` or `run` there empties that -wal into the file; reading commands \
         write nothing), and use one path for every replica; if those files are gone for good, \
         remove the record with `sqlite3 {} 'DELETE FROM name_in_use'` and know that tokens \
         granted there may be granted again. Nothing was written",
        path.display(),
        other.path.display(),
        other.path.display(),
        path.display()
    )
}

/// Records this handle's name in the database, and checkpoints the record
/// into the file itself, before the handle campaigns.
pub(super) fn record(conn: &Connection, claim: &Claim, path: &Path) -> Result<()> {
    if claim.recorded {
        return Ok(());
    }
    let as_i64 = |n: u64| i64::from_ne_bytes(n.to_ne_bytes());
    conn.execute(
        "INSERT OR REPLACE INTO name_in_use (one, dev, ino, byte, path, file_dev, file_ino)
         VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            as_i64(claim.name.dev),
            as_i64(claim.name.ino),
            claim.byte,
            path.as_os_str().as_bytes(),
            as_i64(claim.file.0),
            as_i64(claim.file.1)
        ],
    )
    .map_err(|e| sql_error(path, e))?;
    checkpoint(conn, path, "FULL")
}

/// Checkpoints the whole `-wal` into the database file (`mode` `FULL`, or
/// `TRUNCATE` to empty it too), waiting for readers for a while.
fn checkpoint(conn: &Connection, path: &Path, mode: &str) -> Result<()> {
    let started = Instant::now();
    loop {
        let busy: i64 = conn
            .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| r.get(0))
            .map_err(|e| sql_error(path, e))?;
        if busy == 0 {
            return Ok(());
        }
        if started.elapsed() >= BUSY_TIMEOUT {
            return Err(Error::Unavailable {
                reason: format!(
                    "cannot write into {} yet: other processes keep it busy",
                    path.display()
                ),
                source: None,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Before the last writer of a name closes the database: empties the
/// name's `-wal` into the file, then removes its record from the file,
/// keeping the name's writer byte to itself until the file is closed (see
/// the module's documentation).
pub(super) fn release(conn: &Connection, file: &File, claim: &Claim, path: &Path) {
    if set_lock(file, libc::F_WRLCK, claim.writer_byte()).is_err() {
        return;
    }
    let released = checkpoint(conn, path, "TRUNCATE")
        .and_then(|()| {
            conn.execute(
                "DELETE FROM name_in_use WHERE byte = ?1",
                params![claim.byte],
            )
            .map_err(|e| sql_error(path, e))
        })
        // Into the file now, even if readers keep the database open.
        .and_then(|_| checkpoint(conn, path, "TRUNCATE"));
    if let Err(error) = released {
        tracing::debug!(path = %path.display(), %error, "cannot remove the database's name record");
    }
}

/// The refusal of `path`, naming the name that holds `byte` when the
/// database file records it.
fn refusal(file: &File, path: &Path, byte: i64) -> String {
    let shown = path.display();
    let first = recorded(file, path)
        .ok()
        .flatten()
        .filter(|kept| kept.byte == byte);
    let other = match first {
        Some(first) if first.path == path => format!(
            "under the same path {} in another mount namespace (another container: a bind mount of the file itself)",
            first.path.display()
        ),
        Some(first) => format!("as {}", first.path.display()),
        None => "under another name (a hard link, or a bind mount of the file itself)".to_owned(),
    };
    format!(
        "{shown} is a database file that is in use now {other}; SQLite and leasehold keep their \
         -wal, -shm and -notify files next to each name, so two names would give two leaders: \
         use one path for every replica (in containers, mount the folder that holds the database, \
         not the file); nothing was written"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_its_folder_and_file_name() {
        let dir = tempfile::tempdir().expect("dir");
        let a = Name::of(&dir.path().join("db")).expect("name");
        let b = Name::of(&dir.path().join("db")).expect("name");
        let c = Name::of(&dir.path().join("db2")).expect("name");
        assert_eq!(a, b);
        assert_eq!(a.byte(), b.byte());
        assert_ne!(a.byte(), c.byte());
        assert!((FIRST_NAME_BYTE..FIRST_NAME_BYTE + NAME_BYTES).contains(&a.byte()));
    }
}
