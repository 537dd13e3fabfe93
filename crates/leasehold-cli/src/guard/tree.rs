//! Processes by parent, read from /proc: what the guard (and `run`, when
//! the guard is gone) kills to end a command's whole tree.

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// Processes whose parent is `parent` (zombies included).
pub fn children_of(parent: Pid) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            (parent_of(Pid::from_raw(pid))? == parent).then_some(Pid::from_raw(pid))
        })
        .collect()
}

/// The parent of `pid`, if `pid` exists (a zombie does).
pub fn parent_of(pid: Pid) -> Option<Pid> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid …": comm may hold spaces and parens.
    let after = stat.get(stat.rfind(')')? + 1..)?;
    let ppid: i32 = after.split_whitespace().nth(1)?.parse().ok()?;
    Some(Pid::from_raw(ppid))
}

/// One round of killing: SIGKILL to `group` and to every child of this
/// process that `spare` does not name.
pub fn kill_round(group: Option<Pid>, spare: impl Fn(Pid) -> bool) {
    if let Some(group) = group {
        let _ = killpg(group, Signal::SIGKILL);
    }
    for pid in children_of(nix::unistd::getpid()) {
        if !spare(pid) {
            let _ = kill(pid, Signal::SIGKILL);
        }
    }
}
