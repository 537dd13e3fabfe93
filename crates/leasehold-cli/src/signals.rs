//! The signals `run` and `campaign` handle, caught from the start so that
//! none of them kills the process with its default action while it holds
//! an election (the election would then stay held until the TTL, and
//! `run`'s command would get the guard's SIGKILL without a chance to exit).
//!
//! - SIGTERM, SIGINT, SIGHUP, SIGQUIT ask to stop: `run` stops its command
//!   (see [`forwarded_as`]), gives it up to `--grace`, releases the
//!   election and exits; `campaign` resigns and exits.
//! - SIGUSR1, SIGUSR2 are passed through to `run`'s command (reload-style
//!   signals); they do not stop anything.

use anyhow::Context;
use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

/// The signals that ask to stop.
pub struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl StopSignals {
    pub fn install() -> anyhow::Result<Self> {
        Ok(StopSignals {
            term: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
            hup: signal(SignalKind::hangup()).context("cannot handle SIGHUP")?,
            quit: signal(SignalKind::quit()).context("cannot handle SIGQUIT")?,
        })
    }

    /// The next stop signal received.
    pub async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.hup.recv() => Signal::SIGHUP,
            _ = self.quit.recv() => Signal::SIGQUIT,
        }
    }
}

/// What `run` sends its command's group when `received` asks it to stop.
///
/// SIGTERM, SIGINT and SIGQUIT are passed on as they are, as tini and
/// dumb-init do: an interrupt or a quit (Ctrl-\, a core or stack dump) is
/// the command's to act on. SIGHUP becomes SIGTERM: it tells `run` that its
/// terminal is gone, not the command (which runs in its own process group,
/// away from the terminal), and the runner's contract with its command is
/// "SIGTERM, then SIGKILL after --grace"; many daemons take SIGHUP as
/// "reload" (and commands started under nohup ignore it), so forwarding it
/// would leave them running until the SIGKILL.
pub fn forwarded_as(received: Signal) -> Signal {
    match received {
        Signal::SIGHUP => Signal::SIGTERM,
        other => other,
    }
}

/// The signals passed through to the command without stopping anything.
pub struct PassedSignals {
    usr1: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
}

impl PassedSignals {
    pub fn install() -> anyhow::Result<Self> {
        Ok(PassedSignals {
            usr1: signal(SignalKind::user_defined1()).context("cannot handle SIGUSR1")?,
            usr2: signal(SignalKind::user_defined2()).context("cannot handle SIGUSR2")?,
        })
    }

    /// The next signal to pass through.
    pub async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.usr1.recv() => Signal::SIGUSR1,
            _ = self.usr2.recv() => Signal::SIGUSR2,
        }
    }
}

#[cfg(test)]
mod tests {
    use nix::sys::signal::Signal;

    use super::forwarded_as;

    #[test]
    fn a_hangup_stops_the_command_with_sigterm_and_the_rest_pass_as_they_are() {
        assert_eq!(forwarded_as(Signal::SIGHUP), Signal::SIGTERM);
        for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGQUIT] {
            assert_eq!(forwarded_as(signal), signal);
        }
    }
}
