//! The signals `run` and `campaign` handle, caught from the start so that
//! none of them kills the process with its default action while it holds
//! an election (the election would then stay held until the TTL, and
//! `run`'s command would get the guard's SIGKILL without a chance to exit).
//! Every signal whose default action ends a process is in one of three
//! classes:
//!
//! - [`STOP`] — SIGTERM, SIGINT, SIGHUP, SIGQUIT, and SIGPWR (what
//!   lxc-stop and power managers send to ask for a shutdown) — ask to stop:
//!   `run` stops its command (see [`forwarded_as`]), gives it up to
//!   `--grace`, releases the election and exits; `campaign` resigns and
//!   exits.
//! - [`passed`] — SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO,
//!   SIGSTKFLT and the real-time signals SIGRTMIN…SIGRTMAX — are passed
//!   through to `run`'s command as they are (reload-style and
//!   application-defined signals, as tini and dumb-init pass them); they
//!   stop nothing. `campaign`, which has no command, resigns and exits on
//!   them as on a stop signal.
//! - [`IGNORED`] — SIGTRAP, SIGABRT, SIGSYS, SIGXCPU, SIGXFSZ — report a
//!   fault or a resource limit of the process that gets them: `run` and
//!   `campaign` log them and go on, and never pass them to the command.
//!   (An `abort()` still ends the process: it restores the default action
//!   before raising SIGABRT again.) So are SIGTSTP, SIGTTIN and SIGTTOU
//!   (Ctrl-Z, a background read or write on the terminal), whose default
//!   would stop `run` while its command, in a process group of its own,
//!   went on running past the lease that `run` could no longer renew.
//!
//! Left alone: SIGKILL and SIGSTOP (no process can catch them), SIGILL,
//! SIGFPE, SIGSEGV and SIGBUS (a fault of leasehold itself, which it cannot
//! survive: a handler that returns would fault again forever). If one of
//! them ends `run`, the guard kills its command and the store expires the
//! election after the TTL. SIGPIPE is ignored by Rust programs (a write to
//! a closed pipe is an error), and the remaining signals' default action is
//! to do nothing or to stop (pause) the process.

use std::fmt;
use std::sync::atomic::{AtomicI32, Ordering};
use std::task::{Context as TaskContext, Poll};

use anyhow::Context;
use nix::libc;
use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

/// The signals that ask to stop.
pub const STOP: [Signal; 5] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGPWR,
];

/// The signals `run` and `campaign` log and otherwise ignore.
pub const IGNORED: [Signal; 8] = [
    Signal::SIGTRAP,
    Signal::SIGABRT,
    Signal::SIGSYS,
    Signal::SIGXCPU,
    Signal::SIGXFSZ,
    Signal::SIGTSTP,
    Signal::SIGTTIN,
    Signal::SIGTTOU,
];

/// The signals `run` passes to its command: the named ones, then every
/// real-time signal the C library leaves to applications.
pub fn passed() -> Vec<AnySignal> {
    let named = [
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGALRM,
        Signal::SIGVTALRM,
        Signal::SIGPROF,
        Signal::SIGIO,
        Signal::SIGSTKFLT,
    ];
    named
        .into_iter()
        .map(AnySignal::from)
        .chain((libc::SIGRTMIN()..=libc::SIGRTMAX()).map(AnySignal))
        .collect()
}

/// A signal by number: one of nix's [`Signal`]s or a real-time signal,
/// which [`Signal`] cannot name. Shown as `kill -l` names it (`SIGALRM`,
/// `SIGRTMIN+3`, `SIGRTMAX`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnySignal(i32);

impl AnySignal {
    pub fn number(self) -> i32 {
        self.0
    }
}

impl From<Signal> for AnySignal {
    fn from(signal: Signal) -> Self {
        AnySignal(signal as i32)
    }
}

impl fmt::Display for AnySignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (min, max) = (libc::SIGRTMIN(), libc::SIGRTMAX());
        match Signal::try_from(self.0) {
            Ok(signal) => f.write_str(signal.as_str()),
            Err(_) if self.0 == max => f.write_str("SIGRTMAX"),
            Err(_) if self.0 == min => f.write_str("SIGRTMIN"),
            Err(_) if (min..max).contains(&self.0) => write!(f, "SIGRTMIN+{}", self.0 - min),
            Err(_) => write!(f, "signal {}", self.0),
        }
    }
}

/// Every signal a process of leasehold's handles, installed together:
/// those that stop it, those `run` passes to its command, and those it
/// ignores.
#[derive(Debug)]
pub struct Handled {
    pub stop: StopSignals,
    pub passed: PassedSignals,
    pub ignored: IgnoredSignals,
}

impl Handled {
    /// Handles the three sets from now on.
    pub fn install() -> anyhow::Result<Self> {
        Ok(Handled {
            stop: StopSignals::install()?,
            passed: PassedSignals::install()?,
            ignored: IgnoredSignals::install()?,
        })
    }

    /// Waits for a signal that asks to stop. A signal meant for the command
    /// (SIGUSR1, SIGUSR2, SIGALRM…) that arrives while none runs is logged
    /// and dropped, never kept for the next command; so is one that is
    /// ignored.
    pub async fn next_stop(&mut self) -> Signal {
        loop {
            tokio::select! {
                signal = self.stop.recv() => return signal,
                signal = self.passed.recv() => {
                    tracing::info!(%signal, "no command is running; signal ignored");
                }
                signal = self.ignored.recv() => {
                    tracing::info!(%signal, "signal ignored");
                }
            }
        }
    }
}

/// The signals that ask to stop.
#[derive(Debug)]
pub struct StopSignals(SignalSet);

impl StopSignals {
    pub fn install() -> anyhow::Result<Self> {
        SignalSet::install(STOP.into_iter().map(AnySignal::from)).map(StopSignals)
    }

    /// The next stop signal received.
    pub async fn recv(&mut self) -> Signal {
        loop {
            // Only signals of `STOP` are installed, all of them `Signal`s.
            if let Ok(signal) = Signal::try_from(self.0.recv().await.0) {
                return signal;
            }
        }
    }
}

/// What `run` sends its command's group when `received` asks it to stop.
///
/// SIGTERM, SIGINT and SIGQUIT are passed on as they are, as tini and
/// dumb-init do: an interrupt or a quit (Ctrl-\, a core or stack dump) is
/// the command's to act on. SIGHUP and SIGPWR become SIGTERM: SIGHUP tells
/// `run` that its terminal is gone, not the command (which runs in its own
/// process group, away from the terminal), SIGPWR that the machine or
/// container is shutting down; the runner's contract with its command is
/// "SIGTERM, then SIGKILL after --grace". Many daemons take SIGHUP as
/// "reload" (and commands started under nohup ignore it), and few handle
/// SIGPWR, so forwarding them would leave the command running until the
/// SIGKILL, or kill it without a chance to clean up.
pub fn forwarded_as(received: Signal) -> Signal {
    match received {
        Signal::SIGHUP | Signal::SIGPWR => Signal::SIGTERM,
        other => other,
    }
}

/// The signals passed through to the command without stopping anything.
#[derive(Debug)]
pub struct PassedSignals(SignalSet);

impl PassedSignals {
    pub fn install() -> anyhow::Result<Self> {
        SignalSet::install(passed()).map(PassedSignals)
    }

    /// The next signal to pass through.
    pub async fn recv(&mut self) -> AnySignal {
        self.0.recv().await
    }
}

/// The signals that are logged and otherwise ignored.
#[derive(Debug)]
pub struct IgnoredSignals(SignalSet);

impl IgnoredSignals {
    pub fn install() -> anyhow::Result<Self> {
        SignalSet::install(IGNORED.into_iter().map(AnySignal::from)).map(IgnoredSignals)
    }

    /// The next signal to ignore (and log).
    pub async fn recv(&mut self) -> AnySignal {
        self.0.recv().await
    }
}

/// Handlers for a set of signals, each received on its own tokio stream;
/// or, for a signal tokio does not take (it refuses SIGRTMAX), through a
/// handler of ours that writes the signal's number into a socket.
#[derive(Debug)]
struct SignalSet {
    streams: Vec<(AnySignal, tokio::signal::unix::Signal)>,
    /// Where [`raw_handler`] writes the numbers of the signals tokio refused.
    raw: Option<tokio::net::UnixStream>,
    /// Where to start polling next, so that no signal starves the others.
    next: usize,
}

impl SignalSet {
    fn install(signals: impl IntoIterator<Item = AnySignal>) -> anyhow::Result<Self> {
        let mut set = SignalSet {
            streams: Vec::new(),
            raw: None,
            next: 0,
        };
        let mut refused = Vec::new();
        for any in signals {
            match signal(SignalKind::from_raw(any.0)) {
                Ok(stream) => set.streams.push((any, stream)),
                Err(_) => refused.push(any),
            }
        }
        if !refused.is_empty() {
            let (reader, writer) =
                std::os::unix::net::UnixStream::pair().context("cannot handle signals")?;
            reader.set_nonblocking(true)?;
            writer.set_nonblocking(true)?;
            set.raw = Some(tokio::net::UnixStream::from_std(reader)?);
            // Kept open for the life of the process: the handler may run
            // at any time from now on.
            let writer = std::os::fd::IntoRawFd::into_raw_fd(writer);
            for any in refused {
                install_raw(any, writer).with_context(|| format!("cannot handle {any}"))?;
            }
        }
        Ok(set)
    }

    async fn recv(&mut self) -> AnySignal {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    fn poll_recv(&mut self, cx: &mut TaskContext<'_>) -> Poll<AnySignal> {
        let count = self.streams.len();
        for i in 0..count {
            let index = (self.next + i) % count;
            let (any, stream) = &mut self.streams[index];
            if let Poll::Ready(Some(())) = stream.poll_recv(cx) {
                self.next = index + 1;
                return Poll::Ready(*any);
            }
        }
        if let Some(raw) = &self.raw {
            while let Poll::Ready(Ok(())) = raw.poll_read_ready(cx) {
                let mut byte = [0u8];
                match raw.try_read(&mut byte) {
                    Ok(1) => return Poll::Ready(AnySignal(i32::from(byte[0]))),
                    Ok(_) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => break,
                }
            }
        }
        Poll::Pending
    }
}

/// For each signal number, the socket [`raw_handler`] writes it into; -1
/// for none.
static RAW_WRITERS: [AtomicI32; 128] = [const { AtomicI32::new(-1) }; 128];

/// Catches `any` with [`raw_handler`], which writes its number into
/// `writer`.
#[allow(unsafe_code)]
fn install_raw(any: AnySignal, writer: i32) -> std::io::Result<()> {
    let slot = usize::try_from(any.0)
        .ok()
        .and_then(|n| RAW_WRITERS.get(n))
        .ok_or_else(|| std::io::Error::other("signal number out of range"))?;
    slot.store(writer, Ordering::SeqCst);
    // SAFETY: `action` is a zeroed `sigaction` (a valid value: no flags,
    // an empty mask) whose handler is `raw_handler`, an `extern "C"
    // fn(c_int)` as `sa_sigaction` expects without SA_SIGINFO; sigemptyset
    // and sigaction only read and write the structs passed to them.
    let result = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = raw_handler as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(any.0, &action, std::ptr::null_mut())
    };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The signal handler of the signals tokio refuses: writes the signal's
/// number into its socket. Async-signal-safe: an atomic load and one
/// write(2) on a non-blocking socket (a full socket loses the byte, as a
/// pending signal absorbs a second one), and errno is left as it was.
#[allow(unsafe_code)]
extern "C" fn raw_handler(number: libc::c_int) {
    let saved = nix::errno::Errno::last_raw();
    let writer = usize::try_from(number)
        .ok()
        .and_then(|n| RAW_WRITERS.get(n))
        .map_or(-1, |slot| slot.load(Ordering::SeqCst));
    if writer >= 0 {
        let byte = u8::try_from(number).unwrap_or(0);
        // SAFETY: write(2) from a valid one-byte buffer; `writer` is a
        // socket kept open for the life of the process.
        unsafe {
            libc::write(writer, (&raw const byte).cast(), 1);
        }
    }
    nix::errno::Errno::set_raw(saved);
}

#[cfg(test)]
mod tests {
    use nix::sys::signal::Signal;

    use super::{AnySignal, IGNORED, STOP, forwarded_as, passed};

    #[test]
    fn a_hangup_or_a_power_failure_stops_the_command_with_sigterm_and_the_rest_pass_as_they_are() {
        assert_eq!(forwarded_as(Signal::SIGHUP), Signal::SIGTERM);
        assert_eq!(forwarded_as(Signal::SIGPWR), Signal::SIGTERM);
        for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGQUIT] {
            assert_eq!(forwarded_as(signal), signal);
        }
    }

    /// Every signal whose default action ends a process is handled, except
    /// those no handler can (or should) catch; and each is in one class.
    #[test]
    fn every_signal_that_would_end_the_process_is_handled_once() {
        use nix::libc;
        let mut handled: Vec<i32> = STOP
            .iter()
            .chain(IGNORED.iter())
            .map(|&s| s as i32)
            .chain(passed().into_iter().map(AnySignal::number))
            .collect();
        let count = handled.len();
        handled.sort_unstable();
        handled.dedup();
        assert_eq!(handled.len(), count, "a signal is in two classes");
        // Default action "ignore", or not catchable / a fault.
        let left_alone = [
            Signal::SIGKILL,
            Signal::SIGSTOP,
            Signal::SIGILL,
            Signal::SIGFPE,
            Signal::SIGSEGV,
            Signal::SIGBUS,
            Signal::SIGPIPE,
            Signal::SIGCHLD,
            Signal::SIGCONT,
            Signal::SIGURG,
            Signal::SIGWINCH,
        ];
        for signal in Signal::iterator() {
            assert!(
                handled.contains(&(signal as i32)) != left_alone.contains(&signal),
                "{signal}"
            );
        }
        for number in libc::SIGRTMIN()..=libc::SIGRTMAX() {
            assert!(handled.contains(&number), "{}", AnySignal(number));
        }
        assert_eq!(AnySignal(libc::SIGRTMIN() + 3).to_string(), "SIGRTMIN+3");
        assert_eq!(AnySignal(libc::SIGRTMAX()).to_string(), "SIGRTMAX");
        assert_eq!(AnySignal::from(Signal::SIGALRM).to_string(), "SIGALRM");
    }
}
