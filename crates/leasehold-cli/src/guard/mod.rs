//! The guard: a small process between `run` and its command that outlives
//! `run` for as long as it takes to make `run`'s death safe and fast.
//!
//! For every term of leadership `run` starts `leasehold __guard`, which
//! starts the command (in its own process group) and is a child subreaper:
//! any process the command starts and leaves behind — even one in a new
//! session, which escapes the process group — is re-parented to the guard
//! instead of to PID 1. `run` and the guard talk over a private socket
//! ([`protocol`]); the kernel closes `run`'s end when `run` exits, however
//! it exits. The guard
//!
//! - kills the command's whole tree whenever the term ends: the command
//!   exited, `run` stepped down, or `run` died;
//! - reports the command's exit to `run` only once nothing of the tree is
//!   left, so that `run` releases the election only then;
//! - is a dead-man switch: `run` tells it every new lease deadline, and if
//!   the deadline passes without a newer one (`run` stopped, or stuck) it
//!   kills the tree at the deadline, so the command never runs past its
//!   lease even when its supervisor cannot act. It releases nothing then:
//!   stopped is not dead, and the lease must expire;
//! - on SQLite, kills the tree at once when the database file is gone from
//!   its path (deleted with its `-notify`, its folder moved, a link
//!   re-pointed): a replica opening the path may then be granted at once,
//!   whether `run` can act or not;
//! - when `run` died without ending the term (SIGKILL, a panic, the OOM
//!   killer), confirms that no process of the tree and of the command's
//!   group is left, and then releases the grant on the store, guarded by
//!   its token: the successor is granted within milliseconds instead of
//!   after the TTL. It connects to the store only then; if it cannot
//!   confirm the tree is gone, or cannot reach the store, it releases
//!   nothing and the lease expires as it would have.

mod process;
pub mod protocol;
mod tree;

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::Context;
use leasehold::backend::sqlite::SqliteStore;
use leasehold::{Grant, StoreUrl};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::Instant;

pub use process::{by_hand, main};
pub use protocol::GuardKill;
use protocol::{Order, Report};

use crate::signals::AnySignal;

/// The argument that makes `leasehold` the guard (`leasehold __guard`).
pub const ARG: &str = "__guard";

/// How long the guard (or `run`, when the guard is gone) tries to see the
/// command's tree gone.
const TREE_PATIENCE: Duration = Duration::from_secs(5);

/// How long [`Supervised::ended_already`] gives a report that is there to
/// be read (a line the guard writes at once).
const REPORT_PATIENCE: Duration = Duration::from_millis(20);

/// How often `run` continues its guard, should something have stopped it.
pub const GUARD_WAKE: Duration = Duration::from_secs(1);

/// The environment variable that names the guard's descriptors: its
/// socket to `run`, then what it must hold until it exits
/// (`Launch::session_locks`), if anything (removed from the command's
/// environment).
const FDS_ENV: &str = "LEASEHOLD_GUARD_FDS";

/// The environment variable that passes `run`'s log settings to its guard
/// (removed from the command's environment).
const LOG_ENV: &str = "LEASEHOLD_GUARD_LOG";

/// Every variable `run` sets in a command's environment to describe its
/// term, in any mode (one election, `--shards`, `--slots`). None of them
/// is inherited: the guard starts without them, and the command gets only
/// its own term's (a `run` nested in another's command would otherwise
/// hand its command the outer term's shard or slot beside its own token).
/// Settings passed down, such as `LEASEHOLD_TTL`, are left as they are.
pub const TERM_ENV: [&str; 7] = [
    "LEASEHOLD_ELECTION",
    "LEASEHOLD_ID",
    "LEASEHOLD_TOKEN",
    "LEASEHOLD_SHARD",
    "LEASEHOLD_SHARDS",
    "LEASEHOLD_SLOT",
    "LEASEHOLD_SLOTS",
];

/// What the guard needs to start a term's command.
#[derive(Debug)]
pub struct Launch<'a> {
    /// Program and arguments.
    pub command: &'a [OsString],
    /// Added to the environment.
    pub env: &'a [(&'a str, String)],
    /// Where the grant lives.
    pub store: &'a StoreUrl,
    /// The grant of this term.
    pub grant: &'a Grant,
    /// The lease deadline now.
    pub deadline: Instant,
    /// A descriptor the guard holds until it exits
    /// ([`leasehold::Store::session_lock_file`]).
    pub session_locks: Option<std::fs::File>,
}

/// A term's command, started and watched by a guard.
#[derive(Debug)]
pub struct Supervised {
    /// The command's process id, which is also its process group.
    pub pgid: i32,
    guard: tokio::process::Child,
    /// The guard's process id, kept after it was reaped.
    guard_pid: Option<Pid>,
    /// Until its socket closed.
    guard_alive: bool,
    control: OwnedWriteHalf,
    reports: Lines<BufReader<OwnedReadHalf>>,
    deadline: Instant,
    /// Resolves once a SQLite store's file is gone from its path (see
    /// [`Supervised::store_gone`]).
    store_gone: Option<StoreGone>,
}

/// A future that resolves once a SQLite store's file is gone from its path.
pub struct StoreGone(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>);

impl std::fmt::Debug for StoreGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreGone")
    }
}

impl std::future::Future for StoreGone {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

/// How the command ended.
#[derive(Debug, Clone, Copy)]
pub struct Ended {
    pub status: ExitStatus,
    /// The guard killed it on its own, and why.
    pub killed: Option<GuardKill>,
    /// The guard was killed; `run` killed the command's tree itself.
    pub guard_lost: bool,
}

/// What the guard is told to start the command: the store, the grant, the
/// deadline, the command and its environment.
fn orders(launch: &Launch<'_>) -> Vec<Order> {
    let mut orders = vec![
        Order::Store(launch.store.clone()),
        Order::Grant(launch.grant.clone()),
        Order::Deadline(monotonic_ns(launch.deadline)),
    ];
    orders.extend(launch.command.iter().cloned().map(Order::Arg));
    orders.extend(term_env(launch.env));
    orders.push(Order::Start);
    orders
}

impl Supervised {
    /// Starts a guard and, through it, the command. The guard knows the
    /// grant and the deadline before the command starts.
    pub async fn start(launch: Launch<'_>) -> anyhow::Result<Supervised> {
        let orders = orders(&launch);
        let (mine, theirs) = std::os::unix::net::UnixStream::pair()
            .context("cannot create the socket to the guard")?;
        let guard = spawn_guard(&theirs, launch.session_locks.as_ref())?;
        drop(theirs);
        drop(launch.session_locks);
        mine.set_nonblocking(true)
            .context("cannot set up the socket to the guard")?;
        let (reports, control) = UnixStream::from_std(mine)
            .context("cannot set up the socket to the guard")?
            .into_split();
        let guard_pid = guard
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        let store_gone = match launch.store {
            StoreUrl::Sqlite(path) => {
                SqliteStore::until_file_gone(path).map(|f| StoreGone(Box::pin(f)))
            }
            _ => None,
        };
        let mut supervised = Supervised {
            pgid: 0,
            guard_pid,
            guard_alive: true,
            guard,
            control,
            reports: BufReader::new(reports).lines(),
            deadline: launch.deadline,
            store_gone,
        };
        for order in &orders {
            supervised.tell(order).await?;
        }
        let report = supervised.started_report().await?;
        match report {
            Some(Report::Started(pid)) => {
                supervised.pgid = pid;
                Ok(supervised)
            }
            Some(Report::Failed(message)) => {
                supervised.finish().await;
                Err(anyhow::anyhow!(message))
            }
            other => anyhow::bail!("the guard process answered {other:?} instead of starting"),
        }
    }

    /// The guard's first report. The command may stop its guard before
    /// the guard reports it started: `run` continues it meanwhile, as it
    /// does while it leads, and at once if the store's file leaves its
    /// path, so that the guard kills the command (which may already run)
    /// rather than only once the report is in; `run` then kills it too as
    /// soon as it knows its process group.
    async fn started_report(&mut self) -> anyhow::Result<Option<Report>> {
        let mut wake =
            tokio::time::interval_at(tokio::time::Instant::now() + GUARD_WAKE, GUARD_WAKE);
        let (mut gone, mut seen_gone) = (self.store_gone.take(), false);
        let report = loop {
            let watch = async {
                match gone.as_mut() {
                    Some(gone) => gone.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                report = self.report() => break report,
                () = watch, if !seen_gone => {
                    seen_gone = true;
                    self.wake_guard();
                }
                _ = wake.tick() => self.wake_guard(),
            }
        };
        // Seen gone: the term kills the command as soon as it begins.
        self.store_gone = match seen_gone {
            true => Some(StoreGone(Box::pin(std::future::ready(())))),
            false => gone,
        };
        report
    }

    async fn tell(&mut self, order: &Order) -> anyhow::Result<()> {
        let line = order.line() + "\n";
        self.control
            .write_all(line.as_bytes())
            .await
            .context("the guard process is gone")
    }

    async fn report(&mut self) -> anyhow::Result<Option<Report>> {
        let line = self
            .reports
            .next_line()
            .await
            .context("cannot read from the guard process")?;
        Ok(line.and_then(|l| Report::parse(&l)))
    }

    /// Tells the guard the lease's new deadline, if it moved.
    pub async fn extend(&mut self, deadline: Instant) {
        if deadline == self.deadline {
            return;
        }
        self.deadline = deadline;
        if let Err(error) = self.tell(&Order::Deadline(monotonic_ns(deadline))).await {
            tracing::warn!(%error, "cannot tell the guard the new lease deadline");
        }
    }

    /// Waits until the command and everything it started are gone.
    /// Cancel-safe: a report half read is kept for the next call.
    pub async fn wait(&mut self) -> Ended {
        loop {
            match self.report().await {
                Ok(Some(Report::Exited { status, killed })) => {
                    return Ended {
                        status: ExitStatus::from_raw(status),
                        killed,
                        guard_lost: false,
                    };
                }
                Ok(Some(other)) => {
                    tracing::warn!(report = ?other, "unexpected report from the guard process");
                }
                Ok(None) | Err(_) => return self.guard_gone().await,
            }
        }
    }

    /// Resolves once the SQLite store's file is gone from its path (never,
    /// for another store): `run` watches the path as its guard does, so
    /// that either kills the command at once while the other is stopped.
    /// Taken once.
    pub fn store_gone(&mut self) -> StoreGone {
        self.store_gone
            .take()
            .unwrap_or_else(|| StoreGone(Box::pin(std::future::pending())))
    }

    /// The command's end, if the guard has reported it already. After
    /// `run` was stopped (SIGSTOP) and continued, its runtime handles the
    /// timers that fired meanwhile before it knows that the guard's socket
    /// became readable (the kernel's wait for events returns EINTR then),
    /// so a report that [`Supervised::wait`] would read is looked for here
    /// directly.
    pub async fn ended_already(&mut self) -> Option<Ended> {
        let reader = self.reports.get_ref();
        let mut byte = [0u8; 1];
        let waiting = !reader.buffer().is_empty()
            || matches!(
                nix::sys::socket::recv(
                    reader.get_ref().as_ref().as_raw_fd(),
                    &mut byte,
                    nix::sys::socket::MsgFlags::MSG_PEEK | nix::sys::socket::MsgFlags::MSG_DONTWAIT,
                ),
                Ok(n) if n > 0
            );
        if !waiting {
            return None;
        }
        // A report is there: the runtime sees it at its next turn.
        tokio::time::timeout(REPORT_PATIENCE, self.wait())
            .await
            .ok()
    }

    /// The guard was killed: `run`, a subreaper too, has inherited what was
    /// left of the command's tree, and kills it (the command's group and
    /// every child of `run` but the guard) before the term can end.
    async fn guard_gone(&mut self) -> Ended {
        self.guard_alive = false;
        tracing::warn!(
            pgid = self.pgid,
            "the guard process is gone; killing what is left of the command's tree"
        );
        let give_up = Instant::now() + TREE_PATIENCE;
        // Its socket closes before the kernel gives its children to `run`:
        // once it is reaped, they are `run`'s to find.
        let _ = tokio::time::timeout_at(give_up, self.guard.wait()).await;
        loop {
            // The group only while its leader is `run`'s (re-parented,
            // unreaped): its id is certainly the command's then.
            let leader = Pid::from_raw(self.pgid);
            let group = (self.pgid > 1 && tree::parent_of(leader) == Some(nix::unistd::getpid()))
                .then_some(leader);
            tree::kill_round(group, |pid| Some(pid) == self.guard_pid);
            let mut left = false;
            for pid in tree::children_of(nix::unistd::getpid()) {
                if Some(pid) != self.guard_pid {
                    left |= !matches!(
                        waitpid(pid, Some(WaitPidFlag::WNOHANG)),
                        Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) | Err(_)
                    );
                }
            }
            if !left {
                break;
            }
            if Instant::now() >= give_up {
                tracing::warn!("processes of the command's tree are still there after SIGKILL");
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ended {
            status: ExitStatus::from_raw(Signal::SIGKILL as i32),
            killed: None,
            guard_lost: true,
        }
    }

    /// Continues the guard if something stopped it (the guard alone: a
    /// stopped guard would neither report the command's exit nor kill it at
    /// the deadline). A running process ignores SIGCONT.
    pub fn wake_guard(&self) {
        if let Some(pid) = self.guard_pid {
            let _ = kill(pid, Signal::SIGCONT);
        }
    }

    /// Ends the term with the guard: `run` has released the grant (or knows
    /// it lost it), so the guard releases nothing; it exits once it has
    /// made sure nothing of the command is left.
    pub async fn finish(mut self) {
        self.wake_guard();
        let _ = self.tell(&Order::Done).await;
        let _ = self.control.shutdown().await;
        if tokio::time::timeout(Duration::from_secs(10), self.guard.wait())
            .await
            .is_err()
        {
            tracing::warn!("the guard process did not exit; leaving it");
        }
    }

    /// Sends `signal` to the command's whole process group, through the
    /// guard: the command's parent knows whether it has reaped the command,
    /// after which the group's id may belong to another process. With the
    /// guard gone, `run` signals the group itself only while the command
    /// is its own unreaped child (re-parented to it, a subreaper).
    pub async fn signal_group(&mut self, signal: Signal) {
        self.send_signal(signal as i32).await;
    }

    /// The same for any signal, real-time ones included.
    pub async fn pass(&mut self, signal: AnySignal) {
        self.send_signal(signal.number()).await;
    }

    #[allow(unsafe_code)]
    async fn send_signal(&mut self, number: i32) {
        if self.guard_alive && self.tell(&Order::Signal(number)).await.is_ok() {
            // A stopped guard would act on it only once continued.
            self.wake_guard();
            return;
        }
        self.guard_alive = false;
        let leader = Pid::from_raw(self.pgid);
        if self.pgid <= 1 || tree::parent_of(leader) != Some(nix::unistd::getpid()) {
            return;
        }
        // SAFETY: killpg(2) takes two integers and touches no memory.
        let sent = unsafe { nix::libc::killpg(self.pgid, number) };
        if let Err(error) = nix::errno::Errno::result(sent)
            && error != nix::errno::Errno::ESRCH
        {
            tracing::warn!(pgid = self.pgid, signal = number, %error, "cannot signal the command's group");
        }
    }
}

/// The orders that give the command its term's variables, `env`, each
/// one of [`TERM_ENV`] (the only ones the guard's environment lacks).
fn term_env<'a>(env: &'a [(&'a str, String)]) -> impl Iterator<Item = Order> + 'a {
    env.iter().map(|(name, value)| {
        debug_assert!(TERM_ENV.contains(name), "{name} is not in TERM_ENV");
        Order::Env(name.into(), value.into())
    })
}

/// Starts `leasehold __guard` with `socket` (and `held`) open, in its own
/// process group (a terminal's Ctrl-C is for `run`, which forwards it).
fn spawn_guard(
    socket: &std::os::unix::net::UnixStream,
    held: Option<&std::fs::File>,
) -> anyhow::Result<tokio::process::Child> {
    let exe = std::env::current_exe().context("cannot find the leasehold executable")?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg(ARG)
        .env(LOG_ENV, crate::log_settings())
        // The store's URL and password reach the guard over the socket,
        // within the store order; the command is given neither (the URL
        // may hold the password too).
        .env_remove(crate::cli::PASSWORD_ENV)
        .env_remove(crate::cli::STORE_ENV)
        .process_group(0)
        .kill_on_drop(false);
    // The term `run` itself may be part of (a `run` in another's command)
    // is not the command's: the command's term is given in `Launch::env`.
    for name in TERM_ENV {
        cmd.env_remove(name);
    }
    let (socket, held) = (socket.as_raw_fd(), held.map(AsRawFd::as_raw_fd));
    cmd.env(
        FDS_ENV,
        match held {
            Some(held) => format!("{socket} {held}"),
            None => socket.to_string(),
        },
    );
    keep_descriptors(&mut cmd, socket, held);
    cmd.spawn().context("cannot start the guard process")
}

/// `socket` and `held` (if any) stay open in the guard, at the same
/// numbers (named in [`FDS_ENV`]). Every other descriptor `run` inherited
/// reaches the command as before — a socket-activated service's listening
/// sockets at 3 and up included.
#[allow(unsafe_code)]
fn keep_descriptors(cmd: &mut tokio::process::Command, socket: i32, held: Option<i32>) {
    // SAFETY: `pre_exec` closures run in the forked child before `exec`,
    // where only async-signal-safe work is allowed. This one calls fcntl
    // (async-signal-safe) to clear close-on-exec on two descriptors the
    // parent keeps open and owns, and builds an `io::Error` from a raw
    // errno, which does not allocate.
    unsafe {
        cmd.pre_exec(move || {
            for fd in std::iter::once(socket).chain(held) {
                if nix::libc::fcntl(fd, nix::libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// `at` as CLOCK_MONOTONIC nanoseconds, which the guard (on the same host)
/// reads alike. Rounded down: never later than `at`.
fn monotonic_ns(at: Instant) -> u64 {
    let mono = process::monotonic_now_ns();
    let now = Instant::now();
    match at.checked_duration_since(now) {
        Some(ahead) => mono.saturating_add(u64::try_from(ahead.as_nanos()).unwrap_or(u64::MAX)),
        None => mono.saturating_sub(u64::try_from((now - at).as_nanos()).unwrap_or(u64::MAX)),
    }
}
