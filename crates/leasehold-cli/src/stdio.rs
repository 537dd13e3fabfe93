//! A closed stdin, stdout or stderr (as in `leasehold status >&-`).
//!
//! Two hazards: the next file leasehold opens — the SQLite database, say —
//! would get the free number, and a line printed on "stdout" would be
//! written into it; and a status printed nowhere must not exit 0 as if it
//! had been read.
//!
//! Rust's runtime, before `main`, opens /dev/null onto each of fds 0, 1 and
//! 2 that is closed, which removes the first hazard but hides the second:
//! a write to that stdout succeeds. So [`note_closed_standard_fds`] looks
//! at them earlier still, as the C library starts the program, and the
//! commands that print fail when stdout was closed ([`stdout_closed`]).
//! [`reopen_closed_standard_fds`], the first thing `main` does, makes sure
//! of the /dev/null without relying on the runtime.

use std::sync::atomic::{AtomicBool, Ordering};

/// What a command that prints says when stdout was closed.
pub const STDOUT_IS_CLOSED: &str = "cannot write to stdout: it is closed";

/// Whether stdout (fd 1) was closed when leasehold started.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Whether stdout was closed when leasehold started. It is /dev/null since
/// then, so that writes to it "succeed": the commands that print check this
/// instead, and fail.
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::SeqCst)
}

/// Run by the C library as it starts the program, before Rust's runtime
/// (see the module's documentation): notes whether stdout is closed.
extern "C" fn note_closed_standard_fds() {
    if is_closed(1) {
        STDOUT_CLOSED.store(true, Ordering::SeqCst);
    }
}

#[allow(unsafe_code)]
mod constructor {
    /// SAFETY: a function in `.init_array` runs before `main`, on the one
    /// thread there is, before Rust's runtime is set up. This one makes one
    /// fcntl(2) call (through `is_closed`) and stores into an atomic: no
    /// allocation, no locks, nothing of the runtime.
    #[used]
    #[unsafe(link_section = ".init_array")]
    static NOTE_CLOSED_STANDARD_FDS: extern "C" fn() = super::note_closed_standard_fds;
}

/// Whether file descriptor `fd` is closed.
#[allow(unsafe_code)]
fn is_closed(fd: i32) -> bool {
    // SAFETY: fcntl(F_GETFD) on any number only reads the descriptor table;
    // a number that is not open is EBADF.
    let flags = unsafe { nix::libc::fcntl(fd, nix::libc::F_GETFD) };
    flags == -1 && nix::errno::Errno::last() == nix::errno::Errno::EBADF
}

/// Opens /dev/null onto each of fds 0, 1 and 2 still closed, lowest first,
/// so that each takes the number it stands in for (checked), and notes
/// whether stdout was one of them. Normally Rust's runtime has done it
/// already, and this does nothing.
pub fn reopen_closed_standard_fds() -> Result<(), String> {
    use std::os::fd::IntoRawFd;

    use nix::fcntl::{OFlag, open};
    use nix::sys::stat::Mode;

    for number in 0..=2 {
        if !is_closed(number) {
            continue;
        }
        // Not close-on-exec: `run`'s command inherits /dev/null, not a
        // closed descriptor of its own.
        let null = open("/dev/null", OFlag::O_RDWR, Mode::empty()).map_err(|e| {
            format!("fd {number} is closed and /dev/null cannot be opened onto it: {e}")
        })?;
        // Kept open for the life of the process.
        let got = null.into_raw_fd();
        if got != number {
            return Err(format!(
                "fd {number} is closed and /dev/null was opened as fd {got} instead"
            ));
        }
        if number == 1 {
            STDOUT_CLOSED.store(true, Ordering::SeqCst);
        }
    }
    Ok(())
}
