//! The kernel's test of whether a session's process is still there.
//!
//! Every session a process opens holds an open file description (OFD) lock
//! — a write lock on one byte of `<db>-notify`, the byte of its session id
//! — taken inside the transaction that inserts the session's row, before
//! that transaction commits, and recorded in the `session_locks` table with
//! the notify file's device and inode. The kernel holds such a lock for as
//! long as the open file description exists, and ends it when the last
//! descriptor of it is closed: when the process dies (even by SIGKILL, or
//! by `exec`, as the descriptor is close-on-exec). A stopped, paused, slow
//! or swapped-out process keeps its descriptors and so its locks, and a
//! lock belongs to no pid, so pid reuse cannot fake it.
//!
//! One open file description per process and notify file carries all the
//! process's session locks there: the locks belong to the process, not to
//! the store handle that opened the session (the Store contract lets a
//! session outlive its handle). A live process lets go of one (unlocks its
//! byte) only once the session's row can never be live again — after
//! closing it (the row deleted and committed), once a renewal found it
//! expired or gone, or once the expiry of its last renewal by this process
//! has passed on the host's monotonic clock (which no one can take back:
//! expired is for ever). A session is renewed only by the process that
//! opened it. A helper process given a descriptor of it
//! ([`crate::store::Store::session_lock_file`]) keeps every such lock until
//! it exits too: `leasehold run`'s guard holds it, so that a runner's
//! sessions end only once the guard has killed the command's group.
//!
//! A contender that finds an election held by a live session with such a
//! record asks the kernel whether a write lock is held on that byte
//! (`F_OFD_GETLK` for a read lock, so that other contenders' read locks
//! never look like a holder). It asks inside its `BEGIN IMMEDIATE`
//! transaction, after reading the row: the holder cannot close or commit
//! meanwhile, and since the lock was taken before the row committed, "no
//! write lock" can only mean that the lock was let go since, which a live
//! process does only for rows that are gone or expired: the process is
//! gone. Then the contender deletes the session and is granted in the same
//! transaction.
//!
//! Waiters learn of the death without polling: a thread per watched holder
//! session (one per process, per notify file and session) blocks in
//! `F_OFD_SETLKW` for a read lock on the holder's byte, which the kernel
//! grants the moment the holder's write lock goes; the thread then lets go
//! and wakes the waiters of every store handle that asked, which attempt
//! again. The thread ends then: when the holder's process dies or its
//! session ends.
//!
//! A child made by `fork` (without `exec`) shares its parent's open file
//! descriptions, and with them the locks: a session then counts as alive
//! while its process or such a child lives (until the child opens a
//! session of its own, which gives it an open file description of its
//! own). Slower, never unsafe.
//!
//! Sessions without a record — opened while the notify file could not
//! carry locks (not writable by this user, or on a filesystem not known to
//! be local) — and records naming another notify file (it was deleted and
//! created anew) are never tested: they end at their TTL.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Weak};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag};
use nix::libc;

use crate::watch;

/// Where session locks start in the notify file: far past its content
/// (locks past the end of a file are legal and write nothing; locks are
/// advisory and never touch the bytes).
const FIRST_SESSION_BYTE: i64 = 1 << 32;

/// Filesystems whose locks the local kernel keeps itself (`statfs` magic
/// numbers). On a network filesystem a lock can be lost while its process
/// lives (an NFS client's lease lapses), so the test is not used there, nor
/// on FUSE, whose locks are whatever the daemon makes of them.
const LOCAL_FILESYSTEMS: &[u64] = &[
    0xEF53,      // ext2, ext3, ext4
    0x5846_5342, // xfs
    0x9123_683E, // btrfs
    0x0102_1994, // tmpfs
    0xF2F5_2010, // f2fs
    0x794C_7630, // overlayfs
    0x2FC1_2FC1, // zfs
    0xCA45_1A4E, // bcachefs
    0x5265_4973, // reiserfs
];

/// The notify file's identity: device and inode.
type FileKey = (u64, u64);

/// What the kernel says of a session's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Process {
    /// Its lock is gone: the process died. The session may be expired at
    /// once.
    Gone,
    /// Its lock is held: the process is there, whatever state it is in.
    Alive,
    /// The session carries no lock this handle can test: it ends at its
    /// TTL.
    Untested,
}

/// The kernel test on one database's notify file, for one store handle.
#[derive(Debug)]
pub(super) struct Liveness {
    path: PathBuf,
    key: FileKey,
    /// An open file description of the notify file of its own, which never
    /// holds an `fcntl` lock: probes from it see every session's lock,
    /// this process's included.
    probe: File,
}

/// The session locks this process holds on one notify file.
#[derive(Debug)]
struct Held {
    /// The open file description that holds them (opened for appending,
    /// so that a stray write through a copy given to a helper process can
    /// only add to the notify file, never change its marker).
    file: File,
    /// The process that opened it: a child made by `fork` opens its own.
    pid: u32,
    /// Each session's expiry unless renewed, on the host's monotonic clock,
    /// as of its last renewal by this process.
    sessions: BTreeMap<i64, i64>,
}

/// The session locks this process holds, per notify file.
static HELD: Mutex<BTreeMap<FileKey, Held>> = Mutex::new(BTreeMap::new());

fn held() -> std::sync::MutexGuard<'static, BTreeMap<FileKey, Held>> {
    HELD.lock().unwrap_or_else(|p| p.into_inner())
}

/// Unlocks `byte` of `file`. A failure (the kernel may need memory to split
/// a range) leaves the lock held: the session then counts as alive until
/// the process ends, which is slower, never unsafe.
fn unlock(file: &File, byte: i64) {
    if let Err(error) =
        nix::fcntl::fcntl(file, FcntlArg::F_OFD_SETLK(&lock_arg(libc::F_UNLCK, byte)))
    {
        tracing::debug!(%error, "cannot unlock a session's byte of the notify file; it stays locked");
    }
}

/// A session's lock taken before its row commits: let go when dropped,
/// unless kept ([`Liveness::keep`]).
#[derive(Debug)]
pub(super) struct Taken {
    key: FileKey,
    session: i64,
    kept: bool,
}

impl Drop for Taken {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        let mut held = held();
        if let (Some(h), Some(byte)) = (held.get_mut(&self.key), byte_of(self.session)) {
            unlock(&h.file, byte);
            h.sessions.remove(&self.session);
        }
    }
}

/// The holder sessions whose locks a thread waits on, per notify file and
/// session, with the store handles to wake and the process that started
/// the thread (a child made by `fork` has no such thread).
type Watches = BTreeMap<(FileKey, i64), (u32, Vec<Weak<watch::Sender<u64>>>)>;
static WATCHES: Mutex<Watches> = Mutex::new(BTreeMap::new());

/// A new open file description of the notify file at `path`, for reading,
/// or for appending too if `append`, if the path still names the file
/// `key`.
fn reopen(path: &Path, key: FileKey, append: bool) -> Option<File> {
    let file = OpenOptions::new()
        .read(true)
        .append(append)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    ((meta.dev(), meta.ino()) == key).then_some(file)
}

/// The byte that stands for `session`.
fn byte_of(session: i64) -> Option<i64> {
    (session > 0)
        .then(|| FIRST_SESSION_BYTE.checked_add(session))
        .flatten()
        .filter(|byte| byte.checked_add(1).is_some())
}

fn lock_arg(kind: libc::c_int, byte: i64) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: byte,
        l_len: 1,
        // Must be 0 for OFD locks.
        l_pid: 0,
    }
}

impl Liveness {
    /// The test on the notify file at `path`, opened as `file`: `None` when
    /// it cannot be used (its filesystem is not known to be local, or it
    /// cannot be opened again).
    pub(super) fn new(path: PathBuf, file: &File) -> Option<Self> {
        let shown = path.display();
        let meta = file.metadata().ok()?;
        let key = (meta.dev(), meta.ino());
        let kind = match nix::sys::statfs::fstatfs(file) {
            // The magic numbers are 32 bits; the field is wider (and
            // signed on some targets).
            Ok(fs) => (fs.filesystem_type().0 as u64) & 0xFFFF_FFFF,
            Err(error) => {
                tracing::debug!(path = %shown, %error, "cannot tell the notify file's filesystem; crash detection by the kernel is off");
                return None;
            }
        };
        if !LOCAL_FILESYSTEMS.contains(&kind) {
            tracing::info!(path = %shown, filesystem = format_args!("{kind:#x}"),
                "the notify file is not on a filesystem known to be local: a crashed holder's election is taken over at its TTL, not at once");
            return None;
        }
        let probe = reopen(&path, key, false)?;
        Some(Liveness { path, key, probe })
    }

    fn reopen(&self, append: bool) -> Option<File> {
        reopen(&self.path, self.key, append)
    }

    /// The notify file's device and inode as stored in `session_locks`
    /// (SQLite integers are `i64`; the bits are kept).
    pub(super) fn stored_key(&self) -> (i64, i64) {
        (self.key.0 as i64, self.key.1 as i64)
    }

    /// This process's open file description for session locks on this
    /// notify file, opened if there is none yet (or the one there was
    /// inherited through `fork`).
    fn shared<'a>(&self, held: &'a mut BTreeMap<FileKey, Held>) -> Option<&'a mut Held> {
        let me = std::process::id();
        if held.get(&self.key).is_none_or(|h| h.pid != me) {
            let file = self.reopen(true)?;
            // An inherited one is dropped: closing this process's copy does
            // not end the parent's locks.
            held.insert(
                self.key,
                Held {
                    file,
                    pid: me,
                    sessions: BTreeMap::new(),
                },
            );
        }
        held.get_mut(&self.key)
    }

    /// A copy of the descriptor that carries this process's session locks
    /// on this notify file (see the module's documentation).
    pub(super) fn lock_file(&self) -> Option<File> {
        let mut held = held();
        self.shared(&mut held)?.file.try_clone().ok()
    }

    /// Takes `session`'s lock: `None` if it cannot (the session then ends
    /// at its TTL only). To be called before the session's row commits;
    /// dropping the result lets the lock go.
    pub(super) fn lock(&self, session: i64) -> Option<Taken> {
        let byte = byte_of(session)?;
        let mut held = held();
        let shared = self.shared(&mut held)?;
        match nix::fcntl::fcntl(
            &shared.file,
            FcntlArg::F_OFD_SETLK(&lock_arg(libc::F_WRLCK, byte)),
        ) {
            Ok(_) => Some(Taken {
                key: self.key,
                session,
                kept: false,
            }),
            Err(error) => {
                tracing::debug!(path = %self.path.display(), session, %error,
                    "cannot lock the session's byte of the notify file; it ends at its TTL only");
                None
            }
        }
    }

    /// Keeps a lock taken by [`Liveness::lock`] for the process's life,
    /// once the session's row, expiring at `expires_at_ns`, is committed.
    pub(super) fn keep(&self, mut taken: Taken, expires_at_ns: i64) {
        let mut held = held();
        if let Some(h) = held.get_mut(&taken.key) {
            h.sessions.insert(taken.session, expires_at_ns);
            taken.kept = true;
        }
    }

    /// Records that `session` now expires at `expires_at_ns`: to be called
    /// before the renewal commits, so that the lock is never let go while
    /// the row is live (a renewal that then fails to commit only keeps it
    /// longer). By every handle, even one without the test (its notify
    /// file does not tell which database it is, so the sessions of that
    /// id in every database are kept: longer, never shorter).
    pub(super) fn renewed(session: i64, expires_at_ns: i64) {
        for h in held().values_mut() {
            if let Some(expiry) = h.sessions.get_mut(&session) {
                *expiry = (*expiry).max(expires_at_ns);
            }
        }
    }

    /// Lets go of `session`'s lock, whichever handle of this process opened
    /// it: only once its row is deleted or can never be live again.
    pub(super) fn release(&self, session: i64) {
        let mut held = held();
        if let (Some(h), Some(byte)) = (held.get_mut(&self.key), byte_of(session))
            && h.sessions.remove(&session).is_some()
        {
            unlock(&h.file, byte);
        }
    }

    /// Lets go of the locks of sessions, of any database, whose last
    /// renewal by this process expired before `now_ns`: their rows can
    /// never be live again, whether or not a handle is left to close them.
    pub(super) fn let_expired_go(now_ns: i64) {
        for h in held().values_mut() {
            let Held { file, sessions, .. } = h;
            sessions.retain(|&session, &mut expiry| {
                let live = expiry > now_ns;
                if let (false, Some(byte)) = (live, byte_of(session)) {
                    unlock(file, byte);
                }
                live
            });
        }
    }

    /// Whether `session`'s process is there, for a session whose lock was
    /// recorded on the notify file `stored` (see [`Liveness::stored_key`]).
    pub(super) fn probe(&self, session: i64, stored: (i64, i64)) -> Process {
        if stored != self.stored_key() {
            return Process::Untested;
        }
        let Some(byte) = byte_of(session) else {
            return Process::Untested;
        };
        let mut arg = lock_arg(libc::F_RDLCK, byte);
        match nix::fcntl::fcntl(&self.probe, FcntlArg::F_OFD_GETLK(&mut arg)) {
            Ok(_) if libc::c_int::from(arg.l_type) == libc::F_UNLCK => Process::Gone,
            Ok(_) => Process::Alive,
            Err(error) => {
                tracing::debug!(path = %self.path.display(), session, %error,
                    "cannot test the holder session's lock; it ends at its TTL");
                Process::Untested
            }
        }
    }

    /// Wakes `wake` (bumps it) as soon as `session`'s lock goes, from a
    /// thread that waits for it; one thread per notify file and session in
    /// this process, however many handles and attempts ask.
    pub(super) fn watch(&self, session: i64, wake: Weak<watch::Sender<u64>>) {
        let Some(byte) = byte_of(session) else {
            return;
        };
        let key = (self.key, session);
        let me = std::process::id();
        let mut watches = WATCHES.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((pid, wakers)) = watches.get_mut(&key)
            && *pid == me
        {
            wakers.retain(|w| w.strong_count() > 0);
            if !wakers.iter().any(|w| w.ptr_eq(&wake)) {
                wakers.push(wake);
            }
            return;
        }
        let Some(file) = self.reopen(false) else {
            return;
        };
        watches.insert(key, (me, vec![wake]));
        let spawned = std::thread::Builder::new()
            .name("leasehold-holder-watch".into())
            .stack_size(256 * 1024)
            .spawn(move || wait_for_release(&file, byte, key));
        if let Err(error) = spawned {
            watches.remove(&key);
            tracing::debug!(%error, "cannot start a thread to watch the holder's process; waiting for its TTL");
        }
    }
}

/// Blocks until no write lock is held on `byte` of `file`, then wakes the
/// handles that asked.
fn wait_for_release(file: &File, byte: i64, key: (FileKey, i64)) {
    let waited = loop {
        match nix::fcntl::fcntl(file, FcntlArg::F_OFD_SETLKW(&lock_arg(libc::F_RDLCK, byte))) {
            Err(Errno::EINTR) => continue,
            other => break other,
        }
    };
    // Let go of the read lock at once (no one else needs it, but nothing
    // should hold the byte longer than necessary).
    let _ = nix::fcntl::fcntl(file, FcntlArg::F_OFD_SETLK(&lock_arg(libc::F_UNLCK, byte)));
    let wakers = WATCHES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&key)
        .map(|(_, wakers)| wakers)
        .unwrap_or_default();
    match waited {
        Ok(_) => {
            for waker in wakers.iter().filter_map(Weak::upgrade) {
                super::bump(&waker);
            }
        }
        // Not woken: the waiters wake at the holder's expiry, and a failure
        // that repeats does not turn into a loop.
        Err(error) => tracing::debug!(%error, "waiting for the holder session's lock failed"),
    }
}
