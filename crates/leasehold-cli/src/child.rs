//! Starting the command in its own process group, tied to `run`'s life.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::signals::AnySignal;

/// A running command and its process group.
#[derive(Debug)]
pub struct Child {
    pub process: tokio::process::Child,
    pub pgid: i32,
}

/// Starts `command` (program and arguments) with `env` added, as the leader
/// of a new process group, set to receive SIGKILL when `run` dies.
pub fn spawn(command: &[OsString], env: &[(&str, String)]) -> std::io::Result<Child> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| std::io::Error::other("no command given"))?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .kill_on_drop(false);
    let supervisor = nix::unistd::getpid();
    set_parent_death_signal(&mut cmd, supervisor);
    let process = cmd.spawn()?;
    let pgid = process
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| std::io::Error::other("the command exited before it got an id"))?;
    Ok(Child { process, pgid })
}

#[allow(unsafe_code)]
fn set_parent_death_signal(cmd: &mut tokio::process::Command, supervisor: Pid) {
    // SAFETY: `pre_exec` closures run in the forked child before `exec`,
    // where only async-signal-safe work is allowed. This one makes two
    // system calls (prctl, getppid) and builds an `io::Error` from a raw
    // errno, which does not allocate; it touches no locks and no shared
    // state.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            // If `run` died between fork and prctl, the death signal was
            // never armed: the parent is already someone else. Refuse to
            // start rather than run unsupervised.
            if nix::unistd::getppid() != supervisor {
                return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
            }
            Ok(())
        });
    }
}

impl Child {
    /// Sends `signal` to the whole process group; a group already gone is
    /// not an error.
    pub fn signal_group(&self, signal: Signal) {
        match killpg(Pid::from_raw(self.pgid), signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(error) => {
                tracing::warn!(pgid = self.pgid, %signal, %error, "cannot signal the command's group")
            }
        }
    }
}

impl Child {
    /// Sends `signal` — which may be a real-time signal, which [`Signal`]
    /// cannot name — to the whole process group; a group already gone is not
    /// an error.
    #[allow(unsafe_code)]
    pub fn pass(&self, signal: AnySignal) {
        // SAFETY: killpg(2) takes two integers and touches no memory.
        let sent = unsafe { nix::libc::killpg(self.pgid, signal.number()) };
        match nix::errno::Errno::result(sent) {
            Ok(_) | Err(nix::errno::Errno::ESRCH) => {}
            Err(error) => {
                tracing::warn!(pgid = self.pgid, %signal, %error, "cannot signal the command's group")
            }
        }
    }
}

/// The conventional shell status of an exited process: its code, or 128+N
/// when signal N ended it.
pub fn exit_code(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return u8::try_from(code & 0xff).unwrap_or(1);
    }
    status
        .signal()
        .and_then(|sig| u8::try_from(128 + sig).ok())
        .unwrap_or(1)
}
