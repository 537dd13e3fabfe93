//! `leasehold __guard`: the guard's side (see the module above).

use std::ffi::OsString;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Duration;

use leasehold::backend::sqlite::SqliteStore;
use leasehold::{Error, Grant, StoreUrl};
use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep, sleep_until};

use super::protocol::{GuardKill, Order, Report};
use super::tree;
use super::{FDS_ENV, LOG_ENV, TREE_PATIENCE};

/// How long the guard waits for orders already on their way before it acts
/// on a deadline: a deadline kill comes at most this late.
const ORDERS_SETTLE: Duration = Duration::from_millis(2);
/// How long the guard tries to release a dead runner's grant.
const RELEASE_PATIENCE: Duration = Duration::from_secs(10);

/// CLOCK_MONOTONIC now, in nanoseconds.
pub fn monotonic_now_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .unwrap_or(nix::sys::time::TimeSpec::new(0, 0));
    let ns = i128::from(now.tv_sec()) * 1_000_000_000 + i128::from(now.tv_nsec());
    u64::try_from(ns).unwrap_or(0)
}

fn instant_of(monotonic_ns: u64) -> Instant {
    let now_ns = monotonic_now_ns();
    let now = Instant::now();
    now + Duration::from_nanos(monotonic_ns.saturating_sub(now_ns))
}

pub fn main() -> ExitCode {
    // Signals meant for `run` (a terminal's Ctrl-C or hangup, a service
    // manager's SIGTERM or SIGPWR sent to every process of the unit, any
    // signal `run` passes to its command) must not remove the guard before
    // its work is done; it exits by itself when it is. So every signal that
    // can be is blocked (SIGKILL and SIGSTOP cannot), but SIGCHLD, by which
    // it learns that processes of the command's tree ended. The command
    // starts with an empty mask (`set_parent_death_signal`). Those that
    // stop `run` are read from a signalfd, only to log that they are
    // ignored (`log_ignored_signals`).
    let mut blocked = SigSet::all();
    blocked.remove(Signal::SIGCHLD);
    let _ = blocked.thread_block();
    let logging = std::env::var(LOG_ENV).unwrap_or_default();
    crate::init_logging_from(&logging);
    let fds = std::env::var(FDS_ENV).unwrap_or_default();
    let mut fds = fds.split(' ').map(|n| n.parse::<i32>().ok());
    let socket_fd = fds.next().flatten();
    let Some(socket) = socket_fd.and_then(take_socket) else {
        return by_hand();
    };
    // Held, never used, until the guard exits, and inherited by the command
    // and its tree (see `take_held`).
    let _held = fds
        .next()
        .flatten()
        .filter(|&fd| Some(fd) != socket_fd)
        .and_then(take_held);
    if let Err(error) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!(%error, "cannot become a subreaper: a process the command starts in a new session could outlive it");
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            crate::say(&format!("the guard cannot start: {error}"));
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async {
        tokio::spawn(log_ignored_signals());
        Guard::default().serve(socket).await;
    });
    crate::logwriter::flush(crate::LAST_LINES);
    ExitCode::SUCCESS
}

/// The signals that stop `run` (a service manager's stop, a terminal's
/// hangup, `pkill leasehold`), which may reach the guard too.
const STOPPING_SIGNALS: [Signal; 5] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGPWR,
];

#[allow(unsafe_code)]
fn register(
    fd: nix::sys::signalfd::SignalFd,
) -> std::io::Result<tokio::io::unix::AsyncFd<nix::sys::signalfd::SignalFd>> {
    // SAFETY: `register_with_interest` requires that the raw fd stays open
    // and refers to the same file description for the AsyncFd's whole life.
    // The AsyncFd takes ownership of the `SignalFd`, which owns its
    // `OwnedFd` and never closes or replaces it; it is closed only when the
    // AsyncFd (and so the `SignalFd`) is dropped, and `as_raw_fd` always
    // returns that same descriptor.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(std::io::Error::from)
}

/// Logs each of [`STOPPING_SIGNALS`] the guard gets, at debug level: they
/// stay blocked (see `main`), and are read here from a signalfd only to
/// say that they are ignored. If the signalfd cannot be had, they stay
/// pending, unlogged, as before.
async fn log_ignored_signals() {
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    let mut mask = SigSet::empty();
    for signal in STOPPING_SIGNALS {
        mask.add(signal);
    }
    let flags = SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC;
    let Ok(fd) = SignalFd::with_flags(&mask, flags) else {
        return;
    };
    let Ok(fd) = register(fd) else {
        return;
    };
    loop {
        let Ok(mut ready) = fd.readable().await else {
            return;
        };
        match fd.get_ref().read_signal() {
            Ok(Some(info)) => {
                let signal = i32::try_from(info.ssi_signo)
                    .ok()
                    .and_then(|n| Signal::try_from(n).ok())
                    .map_or("a signal", Signal::as_str);
                tracing::debug!(
                    signal,
                    from_pid = info.ssi_pid,
                    "the guard ignores {signal}: it exits by itself once the term is over and the command's tree is gone (to end the term, signal `leasehold run`)"
                );
            }
            Ok(None) => ready.clear_ready(),
            Err(_) => return,
        }
    }
}

/// `leasehold __guard` run by hand (in any argument shape): one line
/// saying it is internal, exit 2. The line is flushed before returning:
/// once logging is set up it goes through the stderr thread, and a process
/// that exits at once would lose it.
pub fn by_hand() -> ExitCode {
    crate::say("leasehold __guard is internal: it is started by `leasehold run`, not by hand");
    crate::logwriter::flush(crate::LAST_LINES);
    ExitCode::from(crate::EXIT_USAGE)
}

/// Descriptor `fd`, if it is the socket `run` left open for the guard.
#[allow(unsafe_code)]
fn take_socket(fd: i32) -> Option<std::os::unix::net::UnixStream> {
    use std::os::unix::fs::FileTypeExt;
    // The magic link leads to the descriptor's own inode.
    if fd < 3 {
        return None;
    }
    let kind = std::fs::metadata(format!("/proc/self/fd/{fd}"))
        .ok()?
        .file_type();
    if !kind.is_socket() {
        return None;
    }
    // SAFETY: descriptor `fd` is open (its /proc entry exists) and is a
    // socket that `run` left open for this process alone
    // (`keep_descriptors`); nothing else in this process has taken
    // ownership of it, and this function is called once, so the `OwnedFd`
    // is its only owner.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let socket = std::os::unix::net::UnixStream::from(fd);
    // Not inherited by the command.
    let _ = nix::fcntl::fcntl(
        &socket,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
    socket.set_nonblocking(true).ok()?;
    Some(socket)
}

/// Descriptor `fd`, which `run` left open for the guard to hold
/// (`Launch::session_locks`).
#[allow(unsafe_code)]
fn take_held(fd: i32) -> Option<OwnedFd> {
    if fd < 3 || !std::path::Path::new(&format!("/proc/self/fd/{fd}")).exists() {
        return None;
    }
    // SAFETY: descriptor `fd` is open (its /proc entry exists); `run` left
    // it open for this process alone (`keep_descriptors`), it is not the
    // socket (the caller checks),
    // nothing else in this process has taken ownership of it, and this
    // function is called once, so the `OwnedFd` is its only owner.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // Left open across `exec`: the command's whole tree holds the session
    // locks too, so that on SQLite a session is found dead only when `run`,
    // its guard and every process of the command are gone — even if `run`
    // and the guard are both killed and the tree escapes.
    Some(fd)
}

#[derive(Debug, Default)]
struct Guard {
    store: Option<StoreUrl>,
    /// A SQLite store's database file, while its command runs: a file
    /// gone from its path (deleted with its `-notify`, its folder moved, a
    /// link re-pointed) leaves nothing by which a replica that opens the
    /// path could know of this term, so it may be granted at once. The
    /// guard, which runs on while `run` is stopped, kills the command as
    /// soon as it sees it, not at the deadline.
    store_file: Option<std::path::PathBuf>,
    grant: Option<Grant>,
    deadline: Option<Instant>,
    argv: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    /// The command's pid (and group), once started.
    leader: Option<i32>,
    /// The command's wait status, once reaped.
    status: Option<i32>,
    /// Whether `run` was told the command ended.
    reported: bool,
    /// `run` ended the term itself.
    done: bool,
    /// Why the guard killed the command on its own, if it did.
    killed: Option<GuardKill>,
}

impl Guard {
    async fn serve(mut self, socket: std::os::unix::net::UnixStream) {
        let Ok(socket) = UnixStream::from_std(socket) else {
            return;
        };
        let (read, mut write) = socket.into_split();
        let mut lines = BufReader::new(read).lines();
        let mut children = match signal(SignalKind::child()) {
            Ok(children) => Some(children),
            Err(error) => {
                tracing::warn!(%error, "the guard cannot watch its children; it polls");
                None
            }
        };
        let mut store_gone: Option<Pin<Box<dyn Future<Output = ()> + Send>>> = None;
        loop {
            if store_gone.is_none()
                && let Some(path) = &self.store_file
            {
                store_gone = SqliteStore::until_file_gone(path).map(|f| Box::pin(f) as _);
            }
            let deadline = self.deadline.filter(|_| self.running());
            let watched = self.running() && store_gone.is_some();
            tokio::select! {
                // Orders first: after the guard was stopped, the deadlines
                // `run` sent meanwhile count before the timer does.
                biased;
                line = lines.next_line() => match line {
                    Ok(Some(line)) => match Order::parse(&line) {
                        Some(order) => self.obey(order, &mut write).await,
                        None => tracing::warn!("the guard got an order it does not know; ignored"),
                    },
                    // `run` exited, however it exited.
                    Ok(None) | Err(_) => break,
                },
                () = child_exited(&mut children) => self.reap_and_report(&mut write).await,
                () = async { if let Some(gone) = store_gone.as_mut() { gone.await } }, if watched => {
                    store_gone = None;
                    self.kill_store_gone(&mut write).await;
                }
                () = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    // After the guard was stopped, tokio may see the timer
                    // before the socket: read the orders that wait first.
                    while let Ok(Ok(Some(line))) = tokio::time::timeout(ORDERS_SETTLE, lines.next_line()).await {
                        if let Some(order) = Order::parse(&line) {
                            self.obey(order, &mut write).await;
                        }
                    }
                    if self.running() && self.deadline.is_some_and(|d| d <= Instant::now()) {
                        self.kill_at_deadline(&mut write).await;
                    }
                }
            }
        }
        self.run_is_gone().await;
    }

    /// `run` closed the socket (it exited, however it exited): kills the
    /// command's tree and, unless `run` ended the term itself, releases
    /// the grant once the whole tree is confirmed gone.
    async fn run_is_gone(&mut self) {
        let eof = std::time::Instant::now();
        let gone = self.kill_tree().await;
        if self.done {
            return;
        }
        tracing::debug!(took = ?eof.elapsed(), gone, "leasehold run is gone; the command's tree was killed");
        if let (Some(store), Some(grant)) = (self.store.take(), self.grant.take()) {
            if gone {
                release(&store, &grant).await;
            } else {
                tracing::warn!(election = %grant.election, token = grant.token.0,
                    "leasehold run is gone but its command's processes are not all gone; \
                     not releasing the election (the store expires it after the TTL)");
            }
        }
    }

    async fn kill_at_deadline(&mut self, write: &mut OwnedWriteHalf) {
        let (election, id, token) = self.grant.as_ref().map_or_else(
            || (String::new(), String::new(), 0),
            |g| (g.election.to_string(), g.candidate.to_string(), g.token.0),
        );
        tracing::warn!(%election, %id, token, pgid = self.leader.unwrap_or(0),
            "the lease deadline passed and `leasehold run` confirmed no renewal (it is stopped or stuck): killing the command");
        self.killed = Some(GuardKill::Deadline);
        self.kill_tree().await;
        self.reap_and_report(write).await;
    }

    async fn kill_store_gone(&mut self, write: &mut OwnedWriteHalf) {
        let (election, token) = self.grant.as_ref().map_or_else(
            || (String::new(), 0),
            |g| (g.election.to_string(), g.token.0),
        );
        let path = self.store_file.take().unwrap_or_default();
        tracing::warn!(%election, token, path = %path.display(),
            "the store's database file is no longer at its path (deleted, moved or replaced): a replica may be granted the election there now; killing the command");
        self.killed = Some(GuardKill::StoreGone);
        self.kill_tree().await;
        self.reap_and_report(write).await;
    }

    fn running(&self) -> bool {
        self.leader.is_some() && !self.reported
    }

    async fn obey(&mut self, order: Order, write: &mut OwnedWriteHalf) {
        match order {
            Order::Store(url) => {
                if let StoreUrl::Sqlite(path) = &url {
                    self.store_file = Some(path.clone());
                }
                self.store = Some(url);
            }
            Order::Grant(grant) => self.grant = Some(grant),
            Order::Deadline(ns) => self.deadline = Some(instant_of(ns)),
            Order::Arg(arg) => self.argv.push(arg),
            Order::Env(key, value) => self.env.push((key, value)),
            Order::Start => {
                let report = match self.start() {
                    Ok(pid) => Report::Started(pid),
                    Err(error) => Report::Failed(error.to_string()),
                };
                send(write, &report).await;
            }
            Order::Done => self.done = true,
            Order::Signal(number) => self.signal_group(number),
        }
    }

    /// Sends signal `number` to the command's group, only while the
    /// command is not reaped: its group's id is certainly the command's
    /// then (a group that outlived its reaped leader may have emptied and
    /// its id gone to another process). A group already gone is not an
    /// error.
    #[allow(unsafe_code)]
    fn signal_group(&self, number: i32) {
        let Some(group) = self.leader.filter(|&p| p > 1 && self.status.is_none()) else {
            return;
        };
        // SAFETY: killpg(2) takes two integers and touches no memory.
        let sent = unsafe { nix::libc::killpg(group, number) };
        if let Err(error) = Errno::result(sent)
            && error != Errno::ESRCH
        {
            tracing::warn!(pgid = group, signal = number, %error, "cannot signal the command's group");
        }
    }

    fn start(&mut self) -> std::io::Result<i32> {
        if self.leader.is_some() {
            return Err(std::io::Error::other("a command was already started"));
        }
        let (program, args) = self
            .argv
            .split_first()
            .ok_or_else(|| std::io::Error::other("no command given"))?;
        let mut cmd = std::process::Command::new(program);
        cmd.args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env_remove(LOG_ENV)
            .env_remove(FDS_ENV)
            .process_group(0);
        set_parent_death_signal(&mut cmd, nix::unistd::getpid());
        let child = cmd.spawn().map_err(|error| explained(program, error))?;
        let pid = i32::try_from(child.id())
            .map_err(|_| std::io::Error::other("the command's process id is out of range"))?;
        // Reaped by `reap`, with every orphan of its tree.
        drop(child);
        self.leader = Some(pid);
        Ok(pid)
    }

    /// Reaps every child that has exited; once the command itself has, kills
    /// what is left of its tree and tells `run`.
    async fn reap_and_report(&mut self, write: &mut OwnedWriteHalf) {
        self.reap();
        if self.status.is_none() || self.reported {
            return;
        }
        if !self.kill_tree().await {
            tracing::warn!(
                "processes the command started are still there after SIGKILL; reporting its end anyway"
            );
        }
        self.reported = true;
        let status = self.status.unwrap_or(Signal::SIGKILL as i32);
        send(
            write,
            &Report::Exited {
                status,
                killed: self.killed,
            },
        )
        .await;
    }

    /// Reaps exited children; whether the guard has none left.
    fn reap(&mut self) -> bool {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => self.reaped(pid, code << 8),
                Ok(WaitStatus::Signaled(pid, signal, core)) => {
                    self.reaped(pid, signal as i32 | if core { 0x80 } else { 0 });
                }
                Ok(WaitStatus::StillAlive) => return false,
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => return true,
            }
        }
    }

    fn reaped(&mut self, pid: Pid, status: i32) {
        if Some(pid.as_raw()) == self.leader && self.status.is_none() {
            self.status = Some(status);
        }
    }

    /// SIGKILLs the command's group and every process re-parented to the
    /// guard, until none is left; whether that was seen within
    /// [`TREE_PATIENCE`]: the guard has no child left (every process of the
    /// tree is a child of the guard or the descendant of a live one, as the
    /// guard is a subreaper) and no process is left in the command's group.
    async fn kill_tree(&mut self) -> bool {
        let give_up = Instant::now() + TREE_PATIENCE;
        let mut round = 0u32;
        loop {
            // The group is signalled only while the command is not reaped:
            // its id is certainly the command's then. Once reaped, the id
            // may go to an unrelated process as soon as the group empties;
            // what is left of the group is the guard's descendants, which
            // the children scan reaches.
            let group = self
                .leader
                .filter(|&pgid| pgid > 1 && self.status.is_none())
                .map(Pid::from_raw);
            // The group first, and /proc scanned for children outside it
            // (escapees) only from the second round: a tree that stayed in
            // its group is gone without a scan.
            if round == 0 {
                if let Some(group) = group {
                    let _ = nix::sys::signal::killpg(group, Signal::SIGKILL);
                }
            } else {
                tree::kill_round(group, |_| false);
            }
            round += 1;
            // No child left: the command (reaped) and every process of its
            // tree are gone.
            if self.reap() {
                return true;
            }
            if Instant::now() >= give_up {
                return false;
            }
            sleep(Duration::from_micros(500)).await;
            if self.reap() {
                return true;
            }
        }
    }
}

async fn child_exited(children: &mut Option<tokio::signal::unix::Signal>) {
    match children {
        Some(children) => {
            children.recv().await;
        }
        None => sleep(Duration::from_millis(50)).await,
    }
}

async fn send(write: &mut OwnedWriteHalf, report: &Report) {
    let line = report.line() + "\n";
    // `run` may be gone; then nobody needs the report.
    let _ = write.write_all(line.as_bytes()).await;
}

/// `error` from starting `program`, with what it means when the kernel
/// says "No such file or directory" of a file that is there: the file's
/// interpreter (its `#!` line) or the dynamic loader it names is missing.
fn explained(program: &std::ffi::OsStr, error: std::io::Error) -> std::io::Error {
    let path = std::path::Path::new(program);
    let named_by_path = program.as_encoded_bytes().contains(&b'/');
    if error.kind() == std::io::ErrorKind::NotFound && named_by_path && path.is_file() {
        return std::io::Error::new(
            error.kind(),
            format!(
                "{error}: the file is there, so what it needs to start is not (the \
                 interpreter its #! line names, or the dynamic loader of a binary)"
            ),
        );
    }
    error
}

#[allow(unsafe_code)]
fn set_parent_death_signal(cmd: &mut std::process::Command, guard: Pid) {
    // SAFETY: `pre_exec` closures run in the forked child before `exec`,
    // where only async-signal-safe work is allowed. This one makes three
    // system calls (pthread_sigmask, prctl, getppid) and builds an
    // `io::Error` from a raw errno, which does not allocate; it touches no
    // locks and no shared state.
    unsafe {
        cmd.pre_exec(move || {
            // The guard blocks almost every signal; the command starts with
            // none blocked, as it would under `run` alone.
            SigSet::empty()
                .thread_set_mask()
                .map_err(std::io::Error::from)?;
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            // If the guard died between fork and prctl, the death signal
            // was never armed: refuse to start rather than run unwatched.
            if nix::unistd::getppid() != guard {
                return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Releases the grant of a runner that died, its command's tree confirmed
/// gone, guarded by the token.
async fn release(url: &StoreUrl, grant: &Grant) {
    let (election, token) = (&grant.election, grant.token.0);
    match url {
        // Died with `run`.
        StoreUrl::Memory => return,
        // Never create a database that is not there any more.
        StoreUrl::Sqlite(path) if !path.exists() => return,
        _ => {}
    }
    let attempt = async {
        let started = std::time::Instant::now();
        let released = leasehold::admin::release_orphaned(url, grant).await;
        tracing::debug!(took = ?started.elapsed(), "the guard's release answered");
        released
    };
    match tokio::time::timeout(RELEASE_PATIENCE, attempt).await {
        Ok(Ok(())) => tracing::info!(%election, id = %grant.candidate, token,
            "leasehold run died and every process of its command is gone: \
             released the election for the next candidate"),
        Ok(Err(Error::NotHolder { .. })) => tracing::info!(%election, token,
            "leasehold run died; its grant was already released or expired"),
        Ok(Err(error)) => tracing::warn!(%election, token, %error,
            "leasehold run died, but its grant could not be released; the store expires it after the TTL"),
        Err(_) => tracing::warn!(%election, token,
            "leasehold run died, but the store did not answer the release in time; it expires the grant after the TTL"),
    }
}
