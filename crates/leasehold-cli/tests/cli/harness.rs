//! Spawning the built binary and reading its JSON-line events.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

pub fn leasehold() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    cmd.env_remove("LEASEHOLD_STORE")
        .env_remove("LEASEHOLD_ID")
        .env_remove("LEASEHOLD_ELECTION")
        .env_remove("LEASEHOLD_TTL")
        .env_remove("LEASEHOLD_RENEW_EVERY")
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
