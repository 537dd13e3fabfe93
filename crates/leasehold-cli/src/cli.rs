//! Command-line arguments.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args as ClapArgs, Parser, Subcommand};
use leasehold::{CandidateId, ElectionName, LeaseConfig, Store, StoreUrl};

/// Lease-based ownership election: exactly one replica owns a
/// responsibility at a time, with fencing tokens and safe handover.
///
/// Exit codes: 0 success; 1 runtime failure (store unreachable or corrupt);
/// 2 bad usage or input; `run` exits with its command's status (128+N if a
/// signal ended it), or 127 if the command could not be started.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version)]
pub struct Args {
    /// More log output (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Only log errors.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Campaign for an election and, while leader, run a command.
    ///
    /// The command runs in its own process group with LEASEHOLD_ELECTION,
    /// LEASEHOLD_ID and LEASEHOLD_TOKEN (the fencing token) set. If
    /// leadership is lost, its group gets SIGTERM and, no later than the
    /// lease deadline, SIGKILL; then `run` campaigns again. If the command
    /// exits, the election is released at once and `run` exits with the
    /// command's status. SIGTERM/SIGINT are forwarded to the command, which
    /// gets up to --grace to exit before the release. If `run` itself dies,
    /// even by SIGKILL, its command's whole process group dies with it.
    Run(RunArgs),
    /// Print the current leader of an election.
    Status(StatusArgs),
    /// Print the leader of an election as a JSON line each time it changes.
    Observe(ObserveArgs),
    /// List every election in the store with its leader.
    List(ListArgs),
    /// Campaign, hold the election for a while, resign; prints one JSON line
    /// per event. A way to try leasehold and to probe a store.
    Campaign(CampaignArgs),
    /// Internal: kills a command's process group if its `run` dies.
    #[command(name = "__guard", hide = true)]
    Guard,
}

/// Where elections are decided.
#[derive(Debug, ClapArgs)]
pub struct StoreArgs {
    /// The store URL: sqlite:PATH, etcd://HOST:PORT[,HOST:PORT…][/PREFIX] or memory:.
    /// [default: sqlite:$XDG_STATE_HOME/leasehold/leasehold.db]
    #[arg(long, env = "LEASEHOLD_STORE", value_parser = parse_store)]
    pub store: Option<StoreUrl>,
}

impl StoreArgs {
    /// Opens the store, or the default SQLite file (creating its folder).
    pub async fn open(&self) -> anyhow::Result<Arc<dyn Store>> {
        let url = match &self.store {
            Some(url) => url.clone(),
            None => {
                let url = StoreUrl::default_sqlite()?;
                if let StoreUrl::Sqlite(path) = &url
                    && let Some(dir) = path.parent()
                {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("cannot create {}", dir.display()))?;
                }
                url
            }
        };
        leasehold::store::open(&url)
            .await
            .with_context(|| format!("cannot open store {url}"))
    }
}

/// Which election, as whom, with which lease timing.
#[derive(Debug, ClapArgs)]
pub struct ElectionArgs {
    /// The election (1–200 bytes of A-Z a-z 0-9 . _ / -, not starting with / or .).
    #[arg(long, short = 'e', env = "LEASEHOLD_ELECTION", value_parser = parse_election)]
    pub election: ElectionName,
    #[command(flatten)]
    pub store: StoreArgs,
    /// This replica's candidate id. [default: <hostname>-<pid>]
    #[arg(long, env = "LEASEHOLD_ID", value_parser = parse_candidate)]
    pub id: Option<CandidateId>,
    /// The lease TTL: how long the store keeps the election for a leader that
    /// stopped renewing; also about how long a crash leaves it unowned.
    #[arg(long, env = "LEASEHOLD_TTL", default_value = "15s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// How often the lease is renewed; the TTL must be at least twice this
    /// plus the 100ms clock-skew bound. [default: a third of --ttl]
    #[arg(long, env = "LEASEHOLD_RENEW_EVERY", value_parser = parse_duration)]
    pub renew_every: Option<Duration>,
}

impl ElectionArgs {
    pub fn lease_config(&self) -> LeaseConfig {
        let mut config = LeaseConfig::with_ttl(self.ttl);
        if let Some(every) = self.renew_every {
            config.renew_every = every;
        }
        config
    }

    pub fn candidate(&self) -> CandidateId {
        self.id
            .clone()
            .unwrap_or_else(CandidateId::default_for_process)
    }
}

#[derive(Debug, ClapArgs)]
pub struct RunArgs {
    #[command(flatten)]
    pub election: ElectionArgs,
    /// How long the command may take to exit after a forwarded SIGTERM or
    /// SIGINT before it gets SIGKILL; never past the lease deadline.
    #[arg(long, env = "LEASEHOLD_GRACE", default_value = "5s", value_parser = parse_duration)]
    pub grace: Duration,
    /// The command to run while leader, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

#[derive(Debug, ClapArgs)]
pub struct StatusArgs {
    /// The election.
    #[arg(long, short = 'e', env = "LEASEHOLD_ELECTION", value_parser = parse_election)]
    pub election: ElectionName,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Print JSON: {"election":E,"leader":{"id":…,"token":N,"expires_in_ms":…}} or "leader":null.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, ClapArgs)]
pub struct ObserveArgs {
    /// The election.
    #[arg(long, short = 'e', env = "LEASEHOLD_ELECTION", value_parser = parse_election)]
    pub election: ElectionName,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, ClapArgs)]
pub struct ListArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Print a JSON array of status objects instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, ClapArgs)]
pub struct CampaignArgs {
    #[command(flatten)]
    pub election: ElectionArgs,
    /// How long to hold the election once won before resigning.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub hold: Duration,
    /// How many times to campaign, hold and resign in a row.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 15s, 2m)"))
}

fn parse_election(s: &str) -> Result<ElectionName, String> {
    ElectionName::new(s).map_err(|e| e.to_string())
}

fn parse_candidate(s: &str) -> Result<CandidateId, String> {
    CandidateId::new(s).map_err(|e| e.to_string())
}

fn parse_store(s: &str) -> Result<StoreUrl, String> {
    s.parse().map_err(|e: leasehold::Error| e.to_string())
}
