//! Spawning the built binary and reading its JSON-line events.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

pub fn leasehold() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    cmd.env_remove("LEASEHOLD_STORE")
        .env_remove("LEASEHOLD_STORE_PASSWORD")
        .env_remove("LEASEHOLD_ID")
        .env_remove("LEASEHOLD_ELECTION")
        .env_remove("LEASEHOLD_TTL")
        .env_remove("LEASEHOLD_RENEW_EVERY")
        .env_remove("LEASEHOLD_PRIORITY")
        .env_remove("LEASEHOLD_PREEMPT_AFTER")
        .env_remove("LEASEHOLD_LOCK_DELAY")
        .env_remove("LEASEHOLD_GRACE")
        .stdin(Stdio::null());
    cmd
}

pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Self {
        Scratch {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn store_url(&self) -> String {
        format!("sqlite:{}", self.path("leasehold.db").display())
    }
}

/// One parsed event line.
#[derive(Debug, Clone)]
pub struct Event {
    pub event: String,
    pub id: String,
    pub token: Option<u64>,
    pub monotonic_ns: i64,
}

pub fn events(stdout: &[u8]) -> Vec<Event> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON event line: {line:?}: {e}"));
            Event {
                event: v["event"].as_str().expect("event").to_owned(),
                id: v["id"].as_str().expect("id").to_owned(),
                token: v["token"].as_u64(),
                monotonic_ns: v["monotonic_ns"].as_i64().expect("monotonic_ns"),
            }
        })
        .collect()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A `leasehold run` (or other long-lived) process, SIGKILLed and reaped
/// when dropped, so a failing test leaves nothing running.
pub struct Proc {
    pub child: std::process::Child,
}

impl Proc {
    pub fn spawn(cmd: &mut Command) -> Self {
        Proc {
            child: cmd.spawn().expect("spawn leasehold"),
        }
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits")
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal).expect("signal");
    }

    /// Waits up to `limit` for the process to exit; its exit code.
    pub fn wait_for_exit(
        &mut self,
        limit: std::time::Duration,
    ) -> Option<std::process::ExitStatus> {
        let until = std::time::Instant::now() + limit;
        while std::time::Instant::now() < until {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `leasehold transfer` of `election` to `to`, which must succeed.
pub fn transferred(store: &str, election: &str, to: &str) {
    let out = leasehold()
        .args(["transfer", "-e", election, "--store", store, "--to", to])
        .output()
        .expect("transfer");
    assert!(out.status.success(), "{}", stderr(&out));
}

/// Polls `cond` every 10 ms for up to `limit`.
pub fn wait_until(limit: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Whether a process may still run code of its own. A zombie runs
/// nothing; nor does a process with a SIGKILL pending: the kernel ends it
/// before it returns to its own code, though on a busy machine it may not
/// have been scheduled to finish dying yet.
///
/// A pid read from a log is [`seen`] first: once its process has died, the
/// kernel may give its number to a new process (CI saw a successor's
/// grandchild take the old leader's pid), which this does not count.
pub fn alive(pid: i32) -> bool {
    let Some((state, started)) = stat_of(pid) else {
        return false;
    };
    let same = *first_seen()
        .lock()
        .expect("pids")
        .entry(pid)
        .or_insert(started)
        == started;
    same && state != 'Z' && state != 'X' && !sigkill_pending(pid)
}

/// Remembers which process `pid` names now (by its start time), so that
/// [`alive`] is not fooled when the number is reused; returns `pid`.
pub fn seen(pid: i32) -> i32 {
    if let Some((_, started)) = stat_of(pid) {
        first_seen()
            .lock()
            .expect("pids")
            .entry(pid)
            .or_insert(started);
    }
    pid
}

fn first_seen() -> &'static std::sync::Mutex<std::collections::HashMap<i32, u64>> {
    static SEEN: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<i32, u64>>> =
        std::sync::OnceLock::new();
    SEEN.get_or_init(Default::default)
}

/// A process's state letter and start time (in clock ticks after boot),
/// from /proc/PID/stat.
fn stat_of(pid: i32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    let state = rest.chars().next()?;
    // Field 22 of the line is the start time; `rest` begins at field 3.
    let started = rest.split(' ').nth(22 - 3)?.parse().ok()?;
    Some((state, started))
}

/// Whether `pid` has a SIGKILL pending, for the thread or the process
/// (`SigPnd`, `ShdPnd` in /proc/PID/status: masks, signal n at bit n − 1).
fn sigkill_pending(pid: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status.lines().any(|line| {
        let mask = line
            .strip_prefix("SigPnd:")
            .or_else(|| line.strip_prefix("ShdPnd:"));
        mask.and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|m| m & (1 << (9 - 1)) != 0)
    })
}

pub fn read_lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The leader's JSON as `status --json` prints it.
pub fn status_json(store: &str, election: &str) -> Value {
    let out = leasehold()
        .args(["status", "--json", "--election", election, "--store", store])
        .output()
        .expect("spawn");
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

/// [`status_json`], or `Value::Null` while `status` fails: a store that a
/// runner just started has not created yet does not exist, and `status`
/// does not create it.
pub fn status_json_once_created(store: &str, election: &str) -> Value {
    let out = leasehold()
        .args(["status", "--json", "--election", election, "--store", store])
        .output()
        .expect("spawn");
    if !out.status.success() {
        return Value::Null;
    }
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

/// The children of process `pid`, read from /proc.
pub fn children_of(pid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let child: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
            let (_, rest) = stat.rsplit_once(") ")?;
            let ppid: i32 = rest.split(' ').nth(1)?.parse().ok()?;
            (ppid == pid).then_some(child)
        })
        .collect()
}

/// Whether `pid` is stopped (state `T` in `/proc/PID/stat`).
pub fn stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| Some(stat.rsplit_once(") ")?.1.starts_with('T')))
        .unwrap_or(false)
}

/// Whether `pid` holds a POSIX write lock on any byte of `file`, as
/// `/proc/locks` lists them (`N: POSIX ADVISORY WRITE PID MAJ:MIN:INODE ...`).
fn holds_write_lock(pid: i32, file: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(inode) = std::fs::metadata(file).map(|m| m.ino()) else {
        return false;
    };
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    locks.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&"POSIX")
            && fields.get(3) == Some(&"WRITE")
            && fields.get(4) == Some(&pid.to_string().as_str())
            && fields
                .get(5)
                .and_then(|id| id.rsplit(':').next())
                .is_some_and(|i| i == inode.to_string())
    })
}

/// A whole replica — `leasehold run`, its guard and its command's process
/// group — stopped (SIGSTOP) as a paused VM or host would be, and continued
/// on drop (then a runner already killed leaves nothing behind).
pub struct StoppedReplica {
    pub runner: i32,
    pub guard: i32,
    pub command: i32,
}

impl StoppedReplica {
    /// Stops the replica whose runner is `runner`, leading with `command`
    /// on `store`. On SQLite, never while the runner holds the database's
    /// write lock: a process stopped inside a write keeps every other
    /// replica from writing, so none could take over (a hazard of SIGSTOP
    /// the GUIDE's walk-through names), which is not what these tests are
    /// about.
    pub fn stop(runner: i32, command: i32, store: &str) -> Self {
        use nix::sys::signal::{Signal, kill, killpg};
        use nix::unistd::Pid;
        let guards = children_of(runner);
        assert_eq!(guards.len(), 1, "one guard under the runner: {guards:?}");
        let guard = guards[0];
        assert_eq!(
            children_of(guard),
            vec![command],
            "the command is the guard's child"
        );
        // The guard and the command first: the guard acts on time alone
        // (it kills the command at the lease deadline), and on a loaded
        // machine the runner may take a while to be caught outside a write
        // (CI once saw the guard's deadline pass meanwhile).
        kill(Pid::from_raw(guard), Signal::SIGSTOP).expect("stop the guard");
        killpg(Pid::from_raw(command), Signal::SIGSTOP).expect("stop the command");
        let shm = store
            .strip_prefix("sqlite:")
            .map(|path| PathBuf::from(format!("{path}-shm")));
        for _ in 0..100 {
            kill(Pid::from_raw(runner), Signal::SIGSTOP).expect("stop the runner");
            // Stopped once /proc says so: its locks no longer change.
            wait_until(std::time::Duration::from_secs(1), || stopped(runner));
            if !shm
                .as_deref()
                .is_some_and(|shm| holds_write_lock(runner, shm))
            {
                break;
            }
            kill(Pid::from_raw(runner), Signal::SIGCONT).expect("continue the runner");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        StoppedReplica {
            runner,
            guard,
            command,
        }
    }

    /// Continues the runner and the guard (not the command, which they
    /// find past its deadline and kill).
    pub fn continue_supervisors(&self) {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let _ = kill(Pid::from_raw(self.guard), Signal::SIGCONT);
        let _ = kill(Pid::from_raw(self.runner), Signal::SIGCONT);
    }
}

impl Drop for StoppedReplica {
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, killpg};
        use nix::unistd::Pid;
        self.continue_supervisors();
        let _ = killpg(Pid::from_raw(self.command), Signal::SIGCONT);
    }
}
