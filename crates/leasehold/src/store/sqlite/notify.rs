//! Learns that another process changed an election: after every commit that
//! grants or releases, the writer rewrites a few bytes of `<db>-notify`, and
//! an inotify watch on the database's folder sees it.
//!
//! Why not watch `<db>-wal`? SQLite writes the WAL frames *before* the commit
//! becomes visible (the wal-index in shared memory is updated last, which
//! inotify cannot see), so a reader woken by the WAL write can still read
//! the old state and then sleep through the change.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Appended to the database's file name to name the file writers touch.
pub(super) const NOTIFY_SUFFIX: &str = "-notify";

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

/// Tells waiters in every process that an election changed: rewrites the
/// notify file, which raises an inotify event in every watcher. Called only
/// after the change is committed, so a woken reader sees it.
#[derive(Debug)]
pub(super) struct Announcer {
    path: std::path::PathBuf,
    file: std::sync::Mutex<Option<std::fs::File>>,
}

impl Announcer {
    pub(super) fn new(db_path: &Path) -> Self {
        let mut name = db_path.as_os_str().to_owned();
        name.push(NOTIFY_SUFFIX);
        Announcer {
            path: name.into(),
            file: std::sync::Mutex::new(None),
        }
    }

    /// Best effort: if the file cannot be written, waiters still wake at the
    /// holder's expiry, so a failure costs speed, never safety.
    pub(super) fn announce(&self) {
        use std::os::unix::fs::FileExt;
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if file.is_none() {
            match std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&self.path)
            {
                Ok(f) => *file = Some(f),
                Err(error) => {
                    tracing::warn!(path = %self.path.display(), %error, "cannot open the notify file; waiters will be slower");
                    return;
                }
            }
        }
        if let Some(f) = file.as_ref()
            && let Err(error) = f.write_at(&[1], 0)
        {
            tracing::warn!(path = %self.path.display(), %error, "cannot write the notify file; waiters will be slower");
            *file = None;
        }
    }
}

/// Starts a task that bumps `changes` whenever the database at `path` may
/// have changed, until `stop` is cancelled.
pub(super) fn spawn(path: &Path, changes: watch::Sender<u64>, stop: CancellationToken) {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => ".".into(),
    };
    let Some(file) = path.file_name().map(OsString::from) else {
        return fallback(changes, stop, "database path has no file name".into());
    };
    let mut signal = file;
    signal.push(NOTIFY_SUFFIX);
    let watcher = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).and_then(|fd| {
        fd.add_watch(&dir, AddWatchFlags::IN_MODIFY | AddWatchFlags::IN_CREATE)?;
        Ok(fd)
    });
    let fd = match watcher
        .map_err(std::io::Error::from)
        .and_then(|fd| register(InotifyFd(fd)))
    {
        Ok(fd) => fd,
        Err(e) => return fallback(changes, stop, e.to_string()),
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
                        return fallback(changes, stop, error.to_string());
                    }
                },
            };
            match ready.get_inner().0.read_events() {
                Ok(events) => {
                    let relevant = events
                        .iter()
                        .any(|e| e.name.as_ref().is_some_and(|n| *n == signal));
                    if relevant {
                        changes.send_modify(|v| *v = v.wrapping_add(1));
                    }
                }
                Err(nix::errno::Errno::EAGAIN) => ready.clear_ready(),
                Err(error) => {
                    tracing::warn!(%error, "reading inotify failed; falling back to periodic checks");
                    return fallback(changes, stop, error.to_string());
                }
            }
        }
    });
}

fn fallback(changes: watch::Sender<u64>, stop: CancellationToken, why: String) {
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
                _ = tick.tick() => changes.send_modify(|v| *v = v.wrapping_add(1)),
            }
        }
    });
}
