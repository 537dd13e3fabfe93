//! Command-line arguments.

use std::time::Duration;

use clap::{Args as ClapArgs, Parser, Subcommand};
use leasehold::{CandidateId, ElectionName, LeaseConfig, StoreUrl};

/// Lease-based ownership election: exactly one replica owns a
/// responsibility at a time, with fencing tokens and safe handover.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, about, long_about = None)]
pub struct Args {
    /// More log output (-v info, -vv debug); RUST_LOG overrides.
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
    /// Campaign for an election, hold it for a while, then resign; prints one
    /// JSON line per event. A way to try leasehold and to probe a store.
    Campaign(CampaignArgs),
}

/// Which store and election, as whom, with which lease timing.
#[derive(Debug, ClapArgs)]
pub struct ElectionArgs {
    /// The election (1–200 bytes of A-Z a-z 0-9 . _ / -).
    #[arg(long, short = 'e', env = "LEASEHOLD_ELECTION", value_parser = parse_election)]
    pub election: ElectionName,
    /// The store URL: sqlite:PATH or memory:.
    /// [default: sqlite:$XDG_STATE_HOME/leasehold/leasehold.db]
    #[arg(long, env = "LEASEHOLD_STORE", value_parser = parse_store)]
    pub store: Option<StoreUrl>,
    /// This replica's candidate id. [default: <hostname>-<pid>]
    #[arg(long, env = "LEASEHOLD_ID", value_parser = parse_candidate)]
    pub id: Option<CandidateId>,
    /// The lease TTL: how long the store keeps the grant without a renewal.
    #[arg(long, env = "LEASEHOLD_TTL", default_value = "15s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// How often the lease is renewed. [default: a third of --ttl]
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
