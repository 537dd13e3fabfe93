//! `status`, `observe` and `list`: what the store says, for people and
//! scripts.

use std::process::ExitCode;

use leasehold::{ElectionName, Leader, LeaderStatus};
use serde::Serialize;

use crate::cli::{ListArgs, ObserveArgs, StatusArgs};

/// The JSON object of docs/DESIGN.md: `{"election":E,"leader":{…}|null}`.
///
/// `observe` prints `{"election":E,"leader":null,"unknown":true,"error":"…"}`
/// while the store does not answer: the leader is unknown (the last one
/// printed may have stepped down meanwhile).
#[derive(Debug, Serialize)]
pub struct Status<'a> {
    pub election: &'a str,
    pub leader: Option<LeaderJson>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unknown: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct LeaderJson {
    pub id: String,
    pub token: u64,
    pub expires_in_ms: u64,
}

impl LeaderJson {
    pub fn new(l: &Leader) -> Self {
        LeaderJson {
            id: l.candidate.to_string(),
            token: l.token.0,
            expires_in_ms: u64::try_from(l.expires_in.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

impl<'a> Status<'a> {
    pub fn new(election: &'a ElectionName, leader: Option<&Leader>) -> Self {
        Status {
            election: election.as_str(),
            leader: leader.map(LeaderJson::new),
            unknown: false,
            error: None,
        }
    }

    /// The store did not answer: the leader is unknown.
    pub fn unknown(election: &'a ElectionName, error: &str) -> Self {
        Status {
            election: election.as_str(),
            leader: None,
            unknown: true,
            error: Some(error.to_owned()),
        }
    }

    fn human(&self) -> String {
        match &self.leader {
            Some(l) => format!(
                "{}: led by {} (token {}, lease expires in {} ms unless renewed)",
                self.election, l.id, l.token, l.expires_in_ms
            ),
            None => format!("{}: no leader", self.election),
        }
    }
}

fn print_line(line: &str) -> anyhow::Result<()> {
    crate::generate::write_stdout(format!("{line}\n").as_bytes())
}

pub async fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let store = args.store.open_read_only().await?;
    let leader = store.leader(&args.election).await?;
    let status = Status::new(&args.election, leader.as_ref());
    if args.json {
        print_line(&serde_json::to_string(&status)?)?;
    } else {
        print_line(&status.human())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A line per change of leader (never per renewal); while the store does
/// not answer, a warning on stderr and a line saying the leader is unknown,
/// then the true state once it answers again. A store that can never be
/// watched again (a SQLite file replaced under it) ends the watch: exit 1,
/// saying why in one line.
pub async fn observe(args: ObserveArgs) -> anyhow::Result<ExitCode> {
    let store = args.store.open_read_only().await?;
    let mut watch = store.watch_status(&args.election).await?;
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let election = &args.election;
    let mut printed: Option<LeaderStatus> = None;
    loop {
        let current = watch.borrow_and_update().clone();
        if printed.as_ref().is_none_or(|p| !p.same_as(&current)) {
            let line = match &current {
                LeaderStatus::Known(leader) => {
                    if printed.as_ref().is_some_and(LeaderStatus::is_unknown) {
                        tracing::info!(%election, "the store answers again");
                    }
                    Status::new(election, leader.as_ref())
                }
                LeaderStatus::Unknown { error } => {
                    tracing::warn!(%election, %error,
                        "the store does not answer; the leader is unknown until it does");
                    Status::unknown(election, error)
                }
            };
            print_line(&serde_json::to_string(&line)?)?;
            printed = Some(current);
        }
        tokio::select! {
            changed = watch.changed() => if changed.is_err() {
                // The watch ended for good (a SQLite file replaced under
                // this handle): the store says why on a read.
                store.leader(election).await?;
                anyhow::bail!("the store stopped reporting changes")
            },
            _ = interrupt.recv() => return Ok(ExitCode::SUCCESS),
            _ = terminate.recv() => return Ok(ExitCode::SUCCESS),
        }
    }
}

pub async fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let store = args.store.open_read_only().await?;
    let elections = store.elections().await?;
    let statuses: Vec<Status<'_>> = elections
        .iter()
        .map(|e| Status::new(&e.election, e.leader.as_ref()))
        .collect();
    if args.json {
        print_line(&serde_json::to_string(&statuses)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = format!(
        "{:<40} {:<32} {:>8} {:>14}",
        "ELECTION", "LEADER", "TOKEN", "EXPIRES_IN_MS"
    );
    for s in &statuses {
        let (id, token, expires) = match &s.leader {
            Some(l) => (
                l.id.as_str(),
                l.token.to_string(),
                l.expires_in_ms.to_string(),
            ),
            None => ("-", "-".to_owned(), "-".to_owned()),
        };
        table.push_str(&format!(
            "\n{:<40} {:<32} {:>8} {:>14}",
            s.election, id, token, expires
        ));
    }
    print_line(&table)?;
    Ok(ExitCode::SUCCESS)
}
