//! Learns that another process changed an election: after every commit that
//! grants or releases, the writer writes the first byte of `<db>-notify`,
//! and an inotify watch on the database's folder sees it.
//!
//! Why not watch `<db>-wal`? SQLite writes the WAL frames *before* the commit
//! becomes visible (the wal-index in shared memory is updated last, which
//! inotify cannot see), so a reader woken by the WAL write can still read
//! the old state and then sleep through the change.
//!
//! The notify file is leasehold's own, and leasehold writes no other:
//!
//! - It is created only where nothing exists, complete with its content
//!   (written to a new file of its own, then hard-linked into place, which
//!   never replaces anything).
//! - An existing one is used only if it is a regular file, not a symbolic
//!   link (opened with `O_NOFOLLOW | O_NONBLOCK`, so a FIFO never blocks),
//!   owned by the database's owner or by this user, whose content starts
//!   with [`MARKER`]. Anything else is refused before anything is written.
//! - The only write is the byte 0x01 at offset 0, which is already there:
//!   the content never changes; the write is what wakes the watchers. The
//!   marker is checked again before each write.
//!
//! The file also carries the database's *generation lock* (`flock`): every
//! process using the database holds it shared; creating a new database at
//! the path takes it exclusive. A process that still uses an earlier
//! database at this path (deleted or replaced under it) thus keeps a new
//! one from being created, and granted, until it has stopped. And each
//! session holds a byte-range lock on it, past its end, that tells other
//! processes whether the session's process is still there (see
//! `liveness`).

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::watch;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent};
use tokio::io::unix::AsyncFd;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};

/// Appended to the database's file name to name the file writers touch.
pub(super) const NOTIFY_SUFFIX: &str = "-notify";

/// How every notify file leasehold creates begins. Its first byte is the
/// byte announcements write, so writing it changes nothing.
pub(super) const MARKER: &[u8] = b"\x01leasehold notify file\n";

/// The whole content of a new notify file.
const CONTENT: &[u8] = b"\x01leasehold notify file\n\
leasehold writes the byte 0x01 over the first byte of this file after every\n\
grant or release in the database next to it, so that waiting processes on\n\
this host wake up; the content never changes. Processes using the database\n\
hold a shared lock on this file, and each of their sessions a lock on one\n\
byte past its end (the kernel ends it when the process dies). It may be\n\
removed while no leasehold process uses the database.\n";

/// If inotify cannot be used (e.g. the per-user instance limit is reached),
/// waiters fall back to re-reading on this period.
const FALLBACK_PERIOD: Duration = Duration::from_millis(50);

/// Adapts nix's `Inotify` (which is `AsFd`) to tokio's `AsyncFd`.
struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

#[allow(unsafe_code)]
fn register(fd: InotifyFd) -> std::io::Result<AsyncFd<InotifyFd>> {
    // SAFETY: `register_with_interest` requires that the raw fd stays open and
    // refers to the same file description for the AsyncFd's whole life. The
    // AsyncFd takes ownership of `InotifyFd`, which owns the inotify
    // instance's `OwnedFd` and never closes or replaces it; it is closed only
    // when the AsyncFd (and so `InotifyFd`) is dropped, and `as_raw_fd`
    // always returns that same descriptor.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(std::io::Error::from)
}

/// `<db>-notify`.
pub(super) fn notify_path(db_path: &Path) -> PathBuf {
    let mut name = db_path.as_os_str().to_owned();
    name.push(NOTIFY_SUFFIX);
    name.into()
}

/// The notify file next to a database: leasehold's own, open for
/// announcing changes and for the generation lock.
#[derive(Debug)]
pub(super) struct NotifyFile {
    path: PathBuf,
    file: File,
    /// Opened for writing; a notify file this user may not write still
    /// carries the lock, and waiters wake at the holder's expiry instead.
    writable: bool,
    /// Set once announcing failed, so that the failure is logged once.
    failed: AtomicBool,
    lock: Mutex<Option<Flock<File>>>,
}

/// What a file type is, for messages.
fn kind(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_symlink() {
        "a symbolic link"
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_block_device() || file_type.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

fn not_ours(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!(
        "{} {why}, not leasehold's notify file; leasehold writes only files it created: move it away",
        path.display()
    ))
}

/// Opens the notify file next to `db_path` if there is one (`None` if
/// not), refusing anything leasehold did not create. `owners` are the uids
/// it may belong to.
pub(super) fn open_existing(db_path: &Path, owners: &[u32]) -> Result<Option<NotifyFile>> {
    let path = notify_path(db_path);
    if !is_there(&path)? {
        return Ok(None);
    }
    let Some((file, writable)) = open_no_follow(&path)? else {
        return Ok(None);
    };
    check_opened(&path, &file, owners)?;
    if !writable {
        tracing::warn!(path = %path.display(), "the notify file is not writable by this user; waiters will be slower");
    }
    Ok(Some(NotifyFile {
        path,
        file,
        writable,
        failed: AtomicBool::new(false),
        lock: Mutex::new(None),
    }))
}

/// The `-notify` next to `db_path` that a writer uses, if there is one; for
/// a reader, which takes no lock, `None` once it is checked. Either way
/// one that leasehold did not create is refused.
pub(super) fn checked(
    db_path: &Path,
    owners: &[u32],
    read_only: bool,
) -> Result<Option<NotifyFile>> {
    if read_only {
        open_for_reading(db_path, owners)?;
        return Ok(None);
    }
    open_existing(db_path, owners)
}

/// For a reader, which takes no lock: the `-notify` next to `db_path` if
/// there is one, refused as [`open_existing`] refuses what leasehold did
/// not create, opened for reading without following a link or waiting on
/// a FIFO.
pub(super) fn open_for_reading(db_path: &Path, owners: &[u32]) -> Result<Option<File>> {
    let path = notify_path(db_path);
    if !is_there(&path)? {
        return Ok(None);
    }
    let flags = (OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits();
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(&path)
    {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) if error.raw_os_error() == Some(Errno::ELOOP as i32) => {
            return Err(not_ours(&path, "is a symbolic link"));
        }
        Err(error) => {
            return Err(Error::unavailable(
                format!("cannot open {}: {error}", path.display()),
                error,
            ));
        }
    };
    check_opened(&path, &file, owners)?;
    Ok(Some(file))
}

/// Whether there is something at `path`; refuses anything but a regular
/// file.
fn is_there(path: &Path) -> Result<bool> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(error) => {
            return Err(Error::unavailable(
                format!("cannot inspect {}: {error}", path.display()),
                error,
            ));
        }
    };
    if !meta.file_type().is_file() {
        return Err(not_ours(
            path,
            format_args!("is {}", kind(meta.file_type())),
        ));
    }
    Ok(true)
}

/// Opens the file at `path` without following a symbolic link: for reading
/// and writing, or only reading if this user may not write it (the `bool`
/// says whether it is writable); `None` if it is gone.
fn open_no_follow(path: &Path) -> Result<Option<(File, bool)>> {
    let shown = path.display();
    let flags = (OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits();
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(flags)
        .open(path);
    match opened {
        Ok(file) => Ok(Some((file, true))),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) if error.raw_os_error() == Some(Errno::ELOOP as i32) => {
            Err(not_ours(path, "is a symbolic link"))
        }
        Err(error)
            if matches!(
                Errno::from_raw(error.raw_os_error().unwrap_or(0)),
                Errno::EACCES | Errno::EPERM | Errno::EROFS
            ) =>
        {
            match OpenOptions::new().read(true).custom_flags(flags).open(path) {
                Ok(file) => Ok(Some((file, false))),
                Err(error) => Err(Error::unavailable(
                    format!("cannot open {shown}: {error}"),
                    error,
                )),
            }
        }
        Err(error) => Err(Error::unavailable(
            format!("cannot open {shown}: {error}"),
            error,
        )),
    }
}

/// Checks what was opened at `path`, which may not be what was inspected:
/// a regular file, belonging to one of `owners`, holding leasehold's marker.
fn check_opened(path: &Path, file: &File, owners: &[u32]) -> Result<()> {
    let meta = file
        .metadata()
        .map_err(|e| Error::unavailable(format!("cannot inspect {}: {e}", path.display()), e))?;
    if !meta.file_type().is_file() {
        return Err(not_ours(
            path,
            format_args!("is {}", kind(meta.file_type())),
        ));
    }
    if !owners.contains(&meta.uid()) {
        return Err(not_ours(
            path,
            format_args!(
                "belongs to user {}, neither the database's owner nor this user",
                meta.uid()
            ),
        ));
    }
    if !has_marker(file) {
        return Err(not_ours(path, "holds other data"));
    }
    Ok(())
}

/// Whether `file` begins with leasehold's marker.
fn has_marker(file: &File) -> bool {
    let mut head = [0u8; MARKER.len()];
    let mut read = 0;
    while read < head.len() {
        match file.read_at(&mut head[read..], read as u64) {
            Ok(0) => break,
            Ok(n) => read += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    head[..read].starts_with(MARKER)
}

/// Creates the notify file next to `db_path`, or opens the one another
/// process created meanwhile. `None` if it cannot be created (waiters are
/// slower then; nothing is refused).
pub(super) fn create(db_path: &Path, owners: &[u32]) -> Result<Option<NotifyFile>> {
    let path = notify_path(db_path);
    for _ in 0..3 {
        if let Some(found) = open_existing(db_path, owners)? {
            return Ok(Some(found));
        }
        // Written in full to a new file, synced, then linked into place:
        // the notify file appears complete or not at all, even after a
        // power loss, and linking never replaces anything.
        let mut temp_name = OsString::from(".");
        temp_name.push(path.file_name().unwrap_or_default());
        temp_name.push(format!(
            ".{}-{}.tmp",
            std::process::id(),
            crate::clock::host_monotonic_ns()
        ));
        let temp = path.with_file_name(temp_name);
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(OFlag::O_NOFOLLOW.bits())
            .open(&temp)
            .and_then(|mut file| {
                file.write_all(CONTENT)?;
                file.sync_data()
            })
            .and_then(|()| std::fs::hard_link(&temp, &path));
        let _ = std::fs::remove_file(&temp);
        match written {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(error) => {
                tracing::warn!(path = %path.display(), %error,
                    "cannot create the notify file; waiters will be slower");
                return Ok(None);
            }
        }
    }
    Ok(None)
}

impl NotifyFile {
    /// Where the file is.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The file as opened (and checked).
    pub(super) fn file(&self) -> &File {
        &self.file
    }

    /// Tells waiters in every process that an election changed: writes the
    /// byte that is already there, which raises an inotify event in every
    /// watcher. Called only after the change is committed, so a woken
    /// reader sees it.
    ///
    /// Best effort: if the file cannot be written, waiters still wake at the
    /// holder's expiry, so a failure costs speed, never safety.
    pub(super) fn announce(&self) {
        if !self.writable || self.failed.load(Ordering::Relaxed) {
            return;
        }
        // Checked again: someone may have written into the file since.
        if !has_marker(&self.file) {
            self.failed.store(true, Ordering::Relaxed);
            tracing::warn!(path = %self.path.display(),
                "the notify file no longer holds leasehold's marker; not writing it (waiters will be slower)");
            return;
        }
        if let Err(error) = self.file.write_at(&MARKER[..1], 0) {
            self.failed.store(true, Ordering::Relaxed);
            tracing::warn!(path = %self.path.display(), %error, "cannot write the notify file; waiters will be slower");
        }
    }

    /// Tries to take the generation lock, shared or exclusive, without
    /// waiting; `Ok(false)` when another process's lock prevents it.
    pub(super) fn try_lock(&self, exclusive: bool) -> std::io::Result<bool> {
        let mut lock = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        if lock.is_some() {
            return Ok(true);
        }
        let arg = if exclusive {
            FlockArg::LockExclusiveNonblock
        } else {
            FlockArg::LockSharedNonblock
        };
        match Flock::lock(self.file.try_clone()?, arg) {
            Ok(held) => {
                *lock = Some(held);
                Ok(true)
            }
            Err((_, Errno::EWOULDBLOCK)) => Ok(false),
            Err((_, errno)) => Err(errno.into()),
        }
    }

    /// Turns an exclusive generation lock into a shared one (waiting, since
    /// the change is not atomic and another process may take the exclusive
    /// lock in between; it lets go as soon as it sees the database exists).
    pub(super) fn share_lock(&self) -> std::io::Result<()> {
        let lock = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        match lock.as_ref() {
            Some(held) => held.relock(FlockArg::LockShared).map_err(Into::into),
            None => Ok(()),
        }
    }
}

/// Starts a task that bumps `changes` whenever the database at `path` may
/// have changed, until `stop` is cancelled. `file_event` is called when the
/// database file's name is created, deleted or moved (or, without inotify,
/// on every period), so that the store can check it still uses that file.
/// A write to the notify file bumps `changes` only if `foreign` says that
/// another connection wrote since it last looked (this process's own
/// writes wake their own waiters).
pub(super) fn spawn(
    path: &Path,
    changes: watch::Sender<u64>,
    stop: CancellationToken,
    file_event: impl Fn() + Send + 'static,
    foreign: impl Fn() -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + 'static,
) {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => ".".into(),
    };
    let Some(file) = path.file_name().map(OsString::from) else {
        return fallback(
            changes,
            stop,
            "database path has no file name".into(),
            file_event,
        );
    };
    let mut signal = file.clone();
    signal.push(NOTIFY_SUFFIX);
    let fd = match watch_dir(&dir) {
        Ok(fd) => fd,
        Err(e) => return fallback(changes, stop, e.to_string(), file_event),
    };
    tokio::spawn(async move {
        loop {
            let mut ready = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                ready = fd.readable() => match ready {
                    Ok(ready) => ready,
                    Err(error) => {
                        tracing::warn!(%error, "inotify failed; falling back to periodic checks");
                        return fallback(changes, stop, error.to_string(), file_event);
                    }
                },
            };
            match ready.get_inner().0.read_events() {
                Ok(events) => {
                    let relevant = events
                        .iter()
                        .any(|e| e.name.as_ref().is_some_and(|n| *n == signal));
                    let moved = events.iter().any(|e| moves(e, &file));
                    if moved {
                        file_event();
                    }
                    if moved || (relevant && foreign().await) {
                        super::bump(&changes);
                    }
                }
                Err(Errno::EAGAIN) => ready.clear_ready(),
                Err(error) => {
                    tracing::warn!(%error, "reading inotify failed; falling back to periodic checks");
                    return fallback(changes, stop, error.to_string(), file_event);
                }
            }
        }
    });
}

impl super::SqliteStore {
    /// A future that resolves once `path` no longer leads to the database
    /// file it leads to now: the file deleted or moved away (with its
    /// `-notify`, nothing tells a replica that opens the path afterwards of
    /// the grants in it: it may be granted at once), another file moved
    /// onto the path, a folder on the way moved, a symbolic link
    /// re-pointed. For a process that acts for a grant and must stop then,
    /// whatever its store handle does (`leasehold run`'s guard, which runs
    /// on while `run` is stopped). `None` if `path` cannot be looked up now.
    pub fn until_file_gone(path: &Path) -> Option<impl Future<Output = ()> + Send + 'static> {
        let file = super::FileId::of(&std::fs::metadata(path).ok()?);
        let path = path.to_owned();
        Some(async move { until_gone(&path, file).await })
    }
}

/// Resolves once `path` no longer leads to `file`: the
/// file deleted or moved away, another moved onto the path, a folder on
/// the way moved or a symbolic link re-pointed. The database's folder is
/// watched with inotify, and the whole path looked up again every
/// [`PATH_RECHECK`] as well (inotify sees neither a folder further up nor
/// a link moved), or every [`FALLBACK_PERIOD`] without inotify. A path
/// that cannot be looked up for another reason (a permission) is not taken
/// for gone.
async fn until_gone(path: &Path, file: super::FileId) {
    let gone = || match std::fs::metadata(path) {
        Ok(meta) => super::FileId::of(&meta) != file,
        Err(error) => error.kind() == std::io::ErrorKind::NotFound,
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => ".".into(),
    };
    let watch = watch_dir(&dir).ok();
    let mut recheck = tokio::time::interval(match watch {
        Some(_) => PATH_RECHECK,
        None => FALLBACK_PERIOD,
    });
    loop {
        if gone() {
            return;
        }
        let Some(fd) = watch.as_ref() else {
            recheck.tick().await;
            continue;
        };
        tokio::select! {
            _ = recheck.tick() => {}
            ready = fd.readable() => match ready {
                // Whatever the events, the path is looked up again.
                Ok(mut ready) => {
                    if let Err(Errno::EAGAIN) = ready.get_inner().0.read_events() {
                        ready.clear_ready();
                    }
                }
                Err(_) => {
                    recheck.tick().await;
                }
            },
        }
    }
}

/// How often [`until_gone`] looks the whole path up again besides
/// inotify's events on the database's folder: a sixth of
/// [`super::FIRST_USE_WAIT`], which must leave a guard time to look and
/// kill. A look is one `stat` of the path.
pub(super) const PATH_RECHECK: Duration = Duration::from_millis(50);

/// The events on a folder's entries that give a name to another file or
/// take it away.
const RENAMES: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_MOVED_TO);

/// An inotify watch on the folder `dir`, registered with tokio: its
/// entries' changes and renames, and its own deletion or move.
fn watch_dir(dir: &Path) -> std::io::Result<AsyncFd<InotifyFd>> {
    let watcher = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).and_then(|fd| {
        fd.add_watch(
            dir,
            AddWatchFlags::IN_MODIFY
                | RENAMES
                | AddWatchFlags::IN_DELETE_SELF
                | AddWatchFlags::IN_MOVE_SELF,
        )?;
        Ok(fd)
    });
    watcher
        .map_err(std::io::Error::from)
        .and_then(|fd| register(InotifyFd(fd)))
}

/// Whether `event` says the database `file`'s name changed hands, or the
/// folder itself went (no name), or events were lost.
fn moves(event: &InotifyEvent, file: &OsString) -> bool {
    match &event.name {
        Some(name) => name == file && event.mask.intersects(RENAMES),
        None => true,
    }
}

fn fallback(
    changes: watch::Sender<u64>,
    stop: CancellationToken,
    why: String,
    file_event: impl Fn() + Send + 'static,
) {
    tracing::warn!(
        why,
        period = ?FALLBACK_PERIOD,
        "cannot watch the sqlite database for changes; waiters re-check periodically"
    );
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(FALLBACK_PERIOD);
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                _ = tick.tick() => {
                    file_event();
                    super::bump(&changes);
                }
            }
        }
    });
}
