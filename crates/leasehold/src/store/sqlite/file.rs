//! The database file and the files next to it, checked before SQLite
//! opens them: what the path holds, who owns the siblings, and what an
//! error opening them means.

use super::*;

/// The file a symbolic link at `path` names, so that the checks of the
/// files next to the database (`-wal`, `-shm`, `-journal`, `-notify`) look
/// where SQLite puts them: next to the file the link resolves to. Any
/// other path is returned as it is.
/// A link that belongs to another user than this one or root is refused:
/// in a folder others may write, it may point anywhere this user may
/// write (as the kernel's `fs.protected_symlinks` refuses in sticky
/// folders).
pub(super) fn resolve_symbolic_link(path: &Path) -> Result<PathBuf> {
    let me = nix::unistd::geteuid().as_raw();
    // A link of another user to a folder on the way is not followed either:
    // it could lead this user's files into a folder only it may write.
    let mut on_the_way = PathBuf::new();
    for part in path.parent().into_iter().flat_map(Path::components) {
        on_the_way.push(part);
        if let Ok(meta) = std::fs::symlink_metadata(&on_the_way)
            && meta.file_type().is_symlink()
            && ![0, me].contains(&meta.uid())
        {
            return Err(Error::Denied(format!(
                "{} (on the way to {}) is a symbolic link that belongs to user {}, neither this \
                 user nor root: it is not followed; nothing was written",
                on_the_way.display(),
                path.display(),
                meta.uid()
            )));
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() && ![0, me].contains(&meta.uid()) => {
            Err(Error::Denied(format!(
                "{} is a symbolic link that belongs to user {}, neither this user nor root: it \
                 is not followed; nothing was written",
                path.display(),
                meta.uid()
            )))
        }
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

/// What a database file holds, read from the file itself rather than
/// through SQLite (whose view includes the `-wal` file next to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OnDisk {
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
pub(super) fn on_disk(file: &File) -> std::io::Result<OnDisk> {
    let (read, head) = header(file)?;
    let be32 = |at: usize| u32::from_be_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    if read == 0 {
        return Ok(OnDisk::Empty);
    }
    if !is_sqlite(read, &head) {
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
pub(super) fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// Opens the database file to hold it, without blocking on a FIFO.
pub(super) fn open_database_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(OFlag::O_NONBLOCK.bits())
        .open(path)
}

/// Opens the database file to hold it for the handle's life: for writing
/// too where this user may (only to lock it, see [`lock_unused`]; nothing
/// is written through it), without blocking on a FIFO.
pub(super) fn hold_database_file(path: &Path) -> std::io::Result<File> {
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
pub(super) const SHARED_FIRST: i64 = 0x4000_0002;
pub(super) const SHARED_SIZE: i64 = 510;

/// Takes (`true`), or releases, a write lock over SQLite's `SHARED` range
/// of `file`: an open file description lock, which conflicts with every
/// SQLite connection's lock in every process, this one included. Taken
/// only while no SQLite connection uses the database.
pub(super) fn lock_unused(file: &File, take: bool) -> bool {
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
pub(super) fn missing(path: &Path) -> Error {
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
pub(super) fn retry_busy<T>(mut op: impl FnMut() -> Result<T>) -> Result<T> {
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
pub(super) fn check_path(path: &Path, read_only: bool) -> Result<Option<Metadata>> {
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
pub(super) fn settle_new_database(
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
pub(super) fn check_siblings(path: &Path, owners: &[u32]) -> Result<()> {
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
        } else if suffix == "-journal"
            && meta.len() > 0
            && !journal_of_a_new_database(path)
            && foreign_journal_stays(path)
        {
            "is a rollback journal next to a database in WAL mode, which never has one: it is \
             another database file's (SQLite would roll it back into this one)"
                .to_owned()
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

/// Whether the `-journal` next to `path` is that of a database created
/// in it: its header (SQLite's magic, then the record count, the nonce
/// and the size in pages the database had before) says the database was
/// empty before, and the file still holds no database (empty, or switched
/// to WAL and nothing more). A process killed as it turned a new store to
/// WAL mode leaves it; rolled back, it leaves the file empty, so it holds
/// nothing of another file's.
fn journal_of_a_new_database(path: &Path) -> bool {
    const MAGIC: [u8; 8] = [0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7];
    let mut head = [0u8; 20];
    let read = File::open(sibling(path, "-journal")).and_then(|f| f.read_exact_at(&mut head, 0));
    let was_empty = read.is_ok() && head[..8] == MAGIC && head[16..20] == [0, 0, 0, 0];
    was_empty
        && File::open(path)
            .and_then(|file| on_disk(&file))
            .is_ok_and(|d| matches!(d, OnDisk::Empty | OnDisk::EmptyDatabase))
}

/// Whether a non-empty `-journal` stays next to the database in WAL mode
/// for [`SIBLING_SETTLE`]. The process that turns a new database to WAL
/// mode writes the header before it deletes its journal, so for a few
/// milliseconds both are there: only a journal that stays is another
/// file's.
fn foreign_journal_stays(path: &Path) -> bool {
    let journal = sibling(path, "-journal");
    let there = || {
        std::fs::symlink_metadata(&journal).is_ok_and(|meta| meta.len() > 0) && in_wal_mode(path)
    };
    let settle = std::time::Instant::now() + SIBLING_SETTLE;
    while there() {
        if std::time::Instant::now() >= settle {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// The first bytes of a database file (its 100-byte header and the start
/// of page 1), and how many of them it has.
fn header(file: &File) -> std::io::Result<(usize, [u8; 108])> {
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
    Ok((read, head))
}

fn is_sqlite(read: usize, head: &[u8; 108]) -> bool {
    read == head.len() && &head[..16] == b"SQLite format 3\0"
}

/// Whether the file at `path` is a SQLite database in WAL mode (its
/// header's read and write versions are 2), as every leasehold database is
/// once it was first opened.
fn in_wal_mode(path: &Path) -> bool {
    File::open(path)
        .and_then(|f| header(&f))
        .is_ok_and(|(read, head)| is_sqlite(read, &head) && head[18..20] == [2, 2])
}

/// SQLite's connection to the database (created if missing, unless
/// `read_only`), which does not checkpoint on close until the schema is
/// known to be leasehold's. A `quiet` one (read-only, see [`Quiet`]) reads
/// the file alone, as SQLite's `immutable` URI parameter does: it takes no
/// lock and creates no `-wal` or `-shm`.
pub(super) fn open_connection(path: &Path, read_only: bool, quiet: bool) -> Result<Connection> {
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
/// SQLite's unreserved ones. An absolute path follows an empty authority
/// (`file://`), so that one starting with `//` is not read as a host.
pub(super) fn immutable_uri(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from(if path.is_absolute() {
        "file://"
    } else {
        "file:"
    });
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
pub(super) struct Quiet {
    modified: (i64, i64),
    changed: (i64, i64),
    len: u64,
}

impl Quiet {
    pub(super) fn of(file: &File) -> Option<Self> {
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
pub(super) fn in_use(path: &Path) -> bool {
    let meta = |suffix| std::fs::symlink_metadata(sibling(path, suffix));
    meta("-shm").is_ok() || meta("-wal").is_ok_and(|wal| wal.len() > 0)
}

/// The database file, held open (see [`hold_database_file`]), and its
/// metadata; refused unless it is a regular file.
pub(super) fn hold_regular_file(path: &Path, read_only: bool) -> Result<(File, Metadata)> {
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

pub(super) fn sql_error(path: &Path, error: rusqlite::Error) -> Error {
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
pub(super) fn unreadable(path: &Path) -> bool {
    std::fs::File::open(path).is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
}

/// Whether this user may not open `path` for reading, or, when it does
/// not exist, create a file in its folder: a permission, not an outage.
pub(super) fn permission_denied(path: &Path) -> bool {
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
pub(super) fn why_cannot_open(path: &Path) -> String {
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
