//! `--on-elected` and `--on-deposed`: commands run when this replica gains
//! or loses leadership, one at a time and in order, by a task of their
//! own, so that a slow or hanging hook never delays a renewal or a
//! step-down. A hook still running at its timeout is killed (its whole
//! process group); failures are logged.

use std::time::Duration;

use tokio::sync::mpsc;

/// Which change a hook is run for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Elected,
    Deposed,
}

impl Change {
    fn flag(self) -> &'static str {
        match self {
            Change::Elected => "--on-elected",
            Change::Deposed => "--on-deposed",
        }
    }
}

/// One hook to run: the change, and the environment it is told of.
#[derive(Clone, Debug)]
pub struct Fired {
    pub change: Change,
    pub election: String,
    pub id: String,
    pub token: u64,
    /// Why leadership ended (`--on-deposed`).
    pub reason: Option<String>,
}

/// The hooks' commands and timeout.
#[derive(Clone, Debug)]
pub struct Hooks {
    pub on_elected: Option<String>,
    pub on_deposed: Option<String>,
    pub timeout: Duration,
}

/// Where the sidecar sends what happened; never blocks.
#[derive(Debug)]
pub struct HookQueue(
    Option<(
        mpsc::UnboundedSender<Fired>,
        tokio::task::JoinHandle<()>,
        Duration,
    )>,
);

/// Whether `fired` is an `--on-elected` for a term that has ended already
/// (its `--on-deposed` is due too): both are skipped, so that a backlog
/// of quick moves does not run hooks for terms long over.
fn skip_ended_term(fired: &Fired, due: &mut std::collections::VecDeque<Fired>) -> bool {
    if fired.change != Change::Elected {
        return false;
    }
    let ended = due
        .iter()
        .position(|d| d.change == Change::Deposed && d.token == fired.token);
    match ended {
        Some(at) => {
            due.remove(at);
            tracing::info!(
                token = fired.token,
                "the term ended before its hooks ran; skipped them"
            );
            true
        }
        None => false,
    }
}

impl HookQueue {
    /// Starts the task that runs `hooks`; none when no hook is given.
    pub fn start(hooks: Hooks) -> Self {
        if hooks.on_elected.is_none() && hooks.on_deposed.is_none() {
            return HookQueue(None);
        }
        let (tx, mut rx) = mpsc::unbounded_channel::<Fired>();
        let timeout = hooks.timeout;
        let task = tokio::spawn(async move {
            let mut due = std::collections::VecDeque::new();
            loop {
                while let Ok(fired) = rx.try_recv() {
                    due.push_back(fired);
                }
                let Some(fired) = due.pop_front() else {
                    match rx.recv().await {
                        Some(fired) => due.push_back(fired),
                        None => return,
                    }
                    continue;
                };
                if skip_ended_term(&fired, &mut due) {
                    continue;
                }
                let command = match fired.change {
                    Change::Elected => &hooks.on_elected,
                    Change::Deposed => &hooks.on_deposed,
                };
                if let Some(command) = command {
                    run_one(command, &fired, hooks.timeout).await;
                }
            }
        });
        HookQueue(Some((tx, task, timeout)))
    }

    /// Queues the hook for `fired`, if one is given.
    pub fn fire(&self, fired: Fired) {
        if let Some((tx, _, _)) = &self.0 {
            // The task ends only once this queue is finished.
            let _ = tx.send(fired);
        }
    }

    /// Runs the hooks still due as the sidecar exits (an `--on-deposed`
    /// for its last term too), for at most one hook timeout and a second.
    pub async fn finish(self) {
        if let Some((tx, mut task, timeout)) = self.0 {
            drop(tx);
            let limit = timeout + Duration::from_secs(1);
            if tokio::time::timeout(limit, &mut task).await.is_err() {
                tracing::warn!("hooks still due at exit were not run");
                task.abort();
            }
        }
    }
}

/// The hook `command` for `fired`, in a process group of its own, with
/// the grant in its environment and neither the store nor its password.
fn hook_command(command: &str, fired: &Fired) -> tokio::process::Command {
    let mut child = tokio::process::Command::new("/bin/sh");
    child
        .arg("-c")
        .arg(command)
        .env("LEASEHOLD_ELECTION", &fired.election)
        .env("LEASEHOLD_ID", &fired.id)
        .env("LEASEHOLD_TOKEN", fired.token.to_string())
        .env_remove("LEASEHOLD_STORE")
        .env_remove(leasehold::store::PASSWORD_ENV)
        .stdin(std::process::Stdio::null())
        // Its output would mix into the sidecar's log (and could forge
        // lines of it): a hook writes where it wants to itself.
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    match &fired.reason {
        Some(reason) => child.env("LEASEHOLD_REASON", reason),
        None => child.env_remove("LEASEHOLD_REASON"),
    };
    child
}

/// Runs `command` with `sh -c` in a process group of its own, killing the
/// group at `timeout`.
async fn run_one(command: &str, fired: &Fired, timeout: Duration) {
    let flag = fired.change.flag();
    let mut child = match hook_command(command, fired).spawn() {
        Ok(child) => child,
        Err(error) => {
            tracing::warn!(hook = flag, %error, "cannot start the hook");
            return;
        }
    };
    let pgid = child.id().and_then(|id| i32::try_from(id).ok());
    let kill_group = || {
        if let Some(pgid) = pgid {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    };
    let ended = tokio::time::timeout(timeout, child.wait()).await;
    // What it left running in its group goes with it (a process that
    // called setsid has left the group, and is not found).
    if ended.is_ok() {
        kill_group();
    }
    match ended {
        Ok(Ok(status)) if status.success() => {
            tracing::debug!(hook = flag, token = fired.token, "hook done");
        }
        Ok(Ok(status)) => {
            tracing::warn!(hook = flag, token = fired.token, %status, "the hook failed");
        }
        Ok(Err(error)) => tracing::warn!(hook = flag, %error, "cannot wait for the hook"),
        Err(_) => {
            // The group is the hook's own (process_group(0)), and the hook
            // has not been reaped: its id is still its group's.
            kill_group();
            let _ = child.wait().await;
            tracing::warn!(hook = flag, token = fired.token, timeout = ?timeout,
                "the hook did not finish in time; killed");
        }
    }
}
