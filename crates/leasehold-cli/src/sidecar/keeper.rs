//! On SQLite, a waiter takes over from a holder whose process is gone at
//! once: the kernel ends the holder's lock on the notify file with its
//! process (the store's liveness test). That is right for `run`, whose
//! guard has killed the command by then; a sidecar's server outlives it,
//! and may act on its last 200 until that answer's deadline. So a keeper
//! process holds the sidecar's session locks too (the store's
//! `session_lock_file`, as the guard does for `run`): it waits for the
//! sidecar to end, then for a whole TTL, past any deadline the sidecar
//! gave, and only then lets the locks go. A sidecar that exits cleanly has
//! released or closed everything first, and stops its keeper.

use std::process::Stdio;
use std::time::Duration;

/// The keeper process, stopped when dropped (it is never read: it is
/// kept for its drop).
pub struct Keeper {
    _child: tokio::process::Child,
}

impl Keeper {
    /// Starts a keeper of `store`'s session locks for `ttl` past this
    /// process's end; none for a store without such locks.
    pub fn start(store: &dyn leasehold::Store, ttl: Duration) -> anyhow::Result<Option<Self>> {
        let Some(locks) = store.session_lock_file() else {
            return Ok(None);
        };
        let seconds = format!("{:.3}", ttl.as_secs_f64() + 1.0);
        // Its stdout is a descriptor of the locks' open file description;
        // its stdin a pipe from this process, which ends with it.
        let child = tokio::process::Command::new("/bin/sh")
            .args([
                "-c",
                "read _ignored; exec sleep \"$1\"",
                "leasehold-keeper",
                &seconds,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::from(locks))
            .stderr(Stdio::null())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        Ok(Some(Keeper { _child: child }))
    }
}
