//! The guard: a small sidecar process that kills the command's process group
//! if `run` dies without doing so itself — even by SIGKILL, which no process
//! can catch.
//!
//! `PR_SET_PDEATHSIG` only reaches the direct child; a shell's children
//! would outlive it. So `run` starts `leasehold __guard` once, in its own
//! process group, and tells it over a pipe which group to protect. When the
//! pipe reaches end-of-file — the kernel closes it when `run` exits, however
//! it exits — the guard kills the group it was last told about, if any.
//!
//! On SQLite the guard also holds, as its stdout, the descriptor that
//! carries `run`'s session locks ([`leasehold::store::Store::session_lock_file`]):
//! the kernel ends them, and so lets another replica find `run`'s sessions
//! dead and take over at once, only when the guard has exited too — after
//! it killed the group. Nothing is ever written to it.

use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::process::{ChildStdin, Command, ExitCode, Stdio};

use anyhow::Context;
use nix::sys::signal::{SigSet, Signal, killpg};
use nix::unistd::Pid;

/// The argument that makes `leasehold` the guard (`leasehold __guard`).
pub const ARG: &str = "__guard";

/// The handle `run` keeps on its guard.
#[derive(Debug)]
pub struct Guard {
    pipe: Option<ChildStdin>,
    process: std::process::Child,
}

impl Guard {
    /// Starts the guard, holding `session_locks` (see the module's
    /// documentation) until it exits.
    pub fn start(session_locks: Option<std::fs::File>) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("cannot find the leasehold executable")?;
        let mut process = Command::new(exe)
            .arg(ARG)
            .stdin(Stdio::piped())
            .stdout(session_locks.map_or_else(Stdio::null, Stdio::from))
            .process_group(0)
            .spawn()
            .context("cannot start the process-group guard")?;
        let pipe = process.stdin.take();
        Ok(Guard { pipe, process })
    }

    /// From now on, the guard kills `pgid` if `run` dies.
    pub fn protect(&mut self, pgid: i32) {
        self.tell(&format!("+{pgid}"));
    }

    /// `pgid` is gone; the guard forgets it.
    pub fn forget(&mut self, pgid: i32) {
        self.tell(&format!("-{pgid}"));
    }

    fn tell(&mut self, line: &str) {
        let sent = self
            .pipe
            .as_mut()
            .map(|pipe| writeln!(pipe, "{line}").and_then(|()| pipe.flush()));
        if let Some(Err(error)) = sent {
            tracing::warn!(%error, "the process-group guard is gone; a SIGKILL of leasehold could leave the command's children running");
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // End-of-file with nothing registered: the guard exits quietly.
        drop(self.pipe.take());
        let _ = self.process.wait();
    }
}

/// `leasehold __guard`: reads `+PGID` / `-PGID` lines until end-of-file,
/// then kills the group still registered.
pub fn main() -> ExitCode {
    // Signals meant for `run` (a terminal's Ctrl-C or hangup, a service
    // manager's SIGTERM or a container manager's SIGPWR sent to every
    // process of the unit, any signal `run` passes to its command) must not
    // remove the guard before `run` is done with it; it exits by itself as
    // soon as `run` exits. So every signal that can be is blocked (SIGKILL
    // and SIGSTOP cannot).
    let _ = SigSet::all().thread_block();
    let mut protected: Option<i32> = None;
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if let Some(pgid) = line.strip_prefix('+').and_then(|n| n.parse().ok()) {
            protected = Some(pgid);
        } else if let Some(pgid) = line.strip_prefix('-').and_then(|n| n.parse::<i32>().ok())
            && protected == Some(pgid)
        {
            protected = None;
        }
    }
    if let Some(pgid) = protected.filter(|&p| p > 1) {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    ExitCode::SUCCESS
}
