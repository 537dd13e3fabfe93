//! One JSON line per event on stdout, for scripts and tests.

use serde::Serialize;
use std::io::Write;

use anyhow::Context;

pub use leasehold::clock::host_monotonic_ns as monotonic_ns;

#[derive(Debug, Serialize)]
pub struct Event<'a> {
    pub event: &'a str,
    pub election: &'a str,
    pub id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub monotonic_ns: i64,
}

/// Prints `event` as one line and flushes, so a reader sees it at once.
pub fn emit(event: &Event<'_>) -> anyhow::Result<()> {
    let line = serde_json::to_string(event)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .context("cannot write to stdout")
}
