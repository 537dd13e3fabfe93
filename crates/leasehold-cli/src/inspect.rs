//! `status`, `observe` and `list`: what the store says, for people and
//! scripts.

use std::io::Write;
use std::process::ExitCode;

use leasehold::{ElectionName, Leader};
use serde::Serialize;

use crate::cli::{ListArgs, ObserveArgs, StatusArgs};

/// The JSON object of DESIGN.md: `{"election":E,"leader":{…}|null}`.
#[derive(Debug, Serialize)]
pub struct Status<'a> {
    pub election: &'a str,
    pub leader: Option<LeaderJson>,
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
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

pub async fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let store = args.store.open().await?;
    let leader = store.leader(&args.election).await?;
    let status = Status::new(&args.election, leader.as_ref());
    if args.json {
        print_line(&serde_json::to_string(&status)?)?;
    } else {
        print_line(&status.human())?;
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn observe(args: ObserveArgs) -> anyhow::Result<ExitCode> {
    let store = args.store.open().await?;
    let mut watch = store.watch(&args.election).await?;
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let current = watch.borrow_and_update().clone();
        print_line(&serde_json::to_string(&Status::new(
            &args.election,
            current.as_ref(),
        ))?)?;
        tokio::select! {
            changed = watch.changed() => if changed.is_err() { anyhow::bail!("the store stopped reporting changes") },
            _ = interrupt.recv() => return Ok(ExitCode::SUCCESS),
            _ = terminate.recv() => return Ok(ExitCode::SUCCESS),
        }
    }
}

pub async fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let store = args.store.open().await?;
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
