//! Command lifetimes as the commands recorded them (`chaos_writer`): each
//! writes its start, then an "alive" stamp every millisecond and a "stop"
//! stamp when SIGTERM ends it, on the host's monotonic clock. A lifetime
//! read from them is never longer than the command really ran, so every
//! overlap found happened; one shorter than a millisecond at a command's
//! end may go unseen.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::common::alive;

/// One command's life, from its own records.
#[derive(Debug, Clone)]
pub struct Life {
    pub replica: usize,
    pub pid: i32,
    pub token: u64,
    /// Monotonic nanoseconds.
    pub start: i64,
    /// Its last stamp: "stop", or the last "alive" before it died.
    pub end: i64,
    /// Whether its process was still running at the last look.
    pub running: bool,
}

/// The commands of every replica, each replica's in a folder of its own.
pub struct Lives {
    dirs: Vec<PathBuf>,
    seen: HashSet<(usize, i32)>,
    pub all: Vec<Life>,
}

fn read_end(dir: &Path, pid: i32) -> Option<i64> {
    let text = std::fs::read_to_string(dir.join(format!("{pid}.end"))).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

impl Lives {
    pub fn new(dirs: Vec<PathBuf>) -> Lives {
        for dir in &dirs {
            std::fs::create_dir_all(dir).expect("lives folder");
        }
        Lives {
            dirs,
            seen: HashSet::new(),
            all: Vec::new(),
        }
    }

    /// The folder replica `i`'s commands write to.
    pub fn dir(&self, i: usize) -> &Path {
        &self.dirs[i]
    }

    /// Picks up commands that started since the last look, and notes which
    /// still run.
    pub fn scan(&mut self) {
        for (replica, dir) in self.dirs.iter().enumerate() {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.map_while(Result::ok) {
                let name = entry.file_name();
                let Some(pid) = name
                    .to_str()
                    .and_then(|n| n.strip_suffix(".start"))
                    .and_then(|p| p.parse::<i32>().ok())
                else {
                    continue;
                };
                if self.seen.contains(&(replica, pid)) {
                    continue;
                }
                let Ok(text) = std::fs::read_to_string(entry.path()) else {
                    continue;
                };
                let mut words = text.split_whitespace();
                let (Some(start), Some(token)) = (
                    words.next().and_then(|w| w.parse().ok()),
                    words.next().and_then(|w| w.parse().ok()),
                ) else {
                    // Not written in full yet: the next look reads it.
                    continue;
                };
                self.seen.insert((replica, pid));
                self.all.push(Life {
                    replica,
                    pid,
                    token,
                    start,
                    end: start,
                    running: true,
                });
            }
        }
        for life in self.all.iter_mut().filter(|l| l.running) {
            life.running = alive(life.pid);
        }
    }

    /// The replica whose command started last and still runs: the leader's.
    pub fn leader(&self) -> Option<usize> {
        self.all
            .iter()
            .filter(|l| l.running)
            .max_by_key(|l| l.start)
            .map(|l| l.replica)
    }

    /// The process groups of replica `i`'s running commands.
    pub fn running_of(&self, i: usize) -> Vec<i32> {
        self.all
            .iter()
            .filter(|l| l.replica == i && l.running)
            .map(|l| l.pid)
            .collect()
    }

    /// Reads every command's last stamp (call when all have ended).
    pub fn finish(&mut self) {
        self.scan();
        for life in &mut self.all {
            if let Some(end) = read_end(&self.dirs[life.replica], life.pid) {
                life.end = end.max(life.start);
            }
        }
        self.all.sort_by_key(|l| l.start);
    }

    /// Every write's `(token, status)`, from the commands' write logs.
    pub fn write_statuses(&self) -> Vec<(u64, u16)> {
        let mut statuses = Vec::new();
        for life in &self.all {
            let path = self.dirs[life.replica].join(format!("{}.writes", life.pid));
            let text = std::fs::read_to_string(path).unwrap_or_default();
            for line in text.lines() {
                let mut words = line.split_whitespace().skip(1);
                if let (Some(token), Some(status)) = (
                    words.next().and_then(|w| w.parse().ok()),
                    words.next().and_then(|w| w.parse().ok()),
                ) {
                    statuses.push((token, status));
                }
            }
        }
        statuses
    }
}
