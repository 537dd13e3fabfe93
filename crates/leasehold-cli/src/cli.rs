//! Command-line arguments.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args as ClapArgs, CommandFactory, Parser, Subcommand};
use leasehold::{CandidateId, ElectionName, LeaseConfig, Store, StoreUrl, shortened};

mod values;

pub(crate) use values::parse_duration;
pub(crate) use values::parse_http_addr;
use values::*;
pub use values::{HttpAddr, invalid_utf8_culprit};

/// The help heading of the options every subcommand takes.
const GLOBAL: &str = "Global options";

/// Lease-based ownership election: exactly one replica owns a
/// responsibility at a time, with fencing tokens and safe handover.
///
/// Exit codes: 0 success; 1 runtime failure (store unreachable or corrupt);
/// 2 bad usage or input; 3 `tune --ttl`: the TTL is unsafe; `run` exits with
/// its command's status (128+N if a signal ended it), or 127 if the command
/// could not be started.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version)]
pub struct Args {
    /// More log output: -v debug, -vv trace (the default level is info);
    /// RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true, help_heading = GLOBAL)]
    pub verbose: u8,
    /// Only log errors.
    #[arg(short, long, global = true, conflicts_with = "verbose", help_heading = GLOBAL)]
    pub quiet: bool,
    /// Log format on stderr: `text` for people, `json` (one object per line)
    /// for log collectors.
    #[arg(long, global = true, env = "LEASEHOLD_LOG_FORMAT", hide_env_values = true, value_enum, default_value_t = LogFormat::Text, help_heading = GLOBAL)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
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
    /// command's status. SIGTERM, SIGINT and SIGQUIT are forwarded to the
    /// group, and SIGHUP (a closed terminal) and SIGPWR (a shutdown) are
    /// sent on as SIGTERM; the command gets up to --grace to exit, then the
    /// election is released and `run` exits with the command's status.
    /// SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGSTKFLT and
    /// SIGRTMIN…SIGRTMAX are passed to the group and stop nothing (for
    /// reloads); SIGTRAP, SIGABRT, SIGSYS, SIGXCPU, SIGXFSZ and SIGTSTP,
    /// SIGTTIN, SIGTTOU (Ctrl-Z) are logged and ignored. If `run` itself dies, even by SIGKILL, its command's
    /// whole process group dies with it.
    Run(RunArgs),
    /// Print the current leader of an election and its line of standbys; for a group of shards or
    /// slots, its members and who owns each shard or slot.
    Status(StatusArgs),
    /// Print the leader of an election as a JSON line each time it changes.
    Observe(ObserveArgs),
    /// List every election in the store with its leader (a group's shards and slots each as their
    /// own election, NAME/shard/K and NAME/slot/K).
    List(ListArgs),
    /// Campaign, hold the election for a while, resign; prints one JSON line
    /// per event. A way to try leasehold and to probe a store.
    Campaign(CampaignArgs),
    /// Hold the election for an application that runs beside it, neither
    /// starting nor stopping it, and answer whether this replica leads:
    /// GET /leader is 200 only while it does, with the fencing token and how
    /// long the answer holds (valid_for_ms), 503 otherwise; /follower,
    /// /health, /watch, /status, /metrics and a page on / too, on --http and
    /// a unix socket.
    Sidecar(SidecarArgs),
    /// Recommend a lease TTL for a renewal period, jitter and clock skew, or
    /// judge a proposed one (--ttl).
    ///
    /// A holder may act for ttl·(1 − drift) − skew after sending a renewal;
    /// the renewals it sends every R after that must confirm (taking up to
    /// the jitter J) before then. The recommended TTL absorbs two lost
    /// renewals in a row; the worst-case failover after a crash is TTL + 2·J.
    /// With --measure N, J is the p99 of N renewal round trips against the
    /// store. On etcd (--store etcd://…) the worst case includes etcd's
    /// 500ms expiry check. Exits 3 when --ttl is unsafe under the given
    /// conditions.
    Tune(TuneArgs),
    /// Move leadership on purpose: ask the current leader to hand over to a
    /// chosen standby (--to), or to the first in line.
    ///
    /// The request reaches the leader through the store, so it works from
    /// any host that can reach the store. The leader's command gets SIGTERM
    /// and up to its --grace to exit, then the leader releases the
    /// election, the chosen standby is granted it with a higher token, and
    /// the old leader waits in line again. Prints the new leader and exits
    /// 0 once it has taken the election up. Exits 1, changing nothing, when
    /// nobody leads, when --to names no waiting candidate, or when nobody
    /// waits; exits 1 when no new leader took the election up within
    /// --timeout (the leader is an older leasehold, or its command takes
    /// longer to stop; or the chosen standby is stopped or was killed, and
    /// then the line moves on when its session expires), or when the
    /// chosen standby left during the transfer and another took over.
    Transfer(TransferArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    ///
    /// For example: `leasehold completions bash >
    /// ~/.local/share/bash-completion/completions/leasehold`, `leasehold
    /// completions zsh > ~/.zfunc/_leasehold` (with ~/.zfunc in $fpath), or
    /// `leasehold completions fish > ~/.config/fish/completions/leasehold.fish`.
    Completions(CompletionsArgs),
    /// Print the manual page leasehold(1) in roff, or write it and one page
    /// per subcommand into a directory (--dir).
    ///
    /// For example: `leasehold man | man -l -`, or `leasehold man --dir
    /// /usr/local/share/man/man1`.
    Man(ManArgs),
}

/// Where elections are decided.
#[derive(Debug, ClapArgs)]
pub struct StoreArgs {
    /// The store URL: sqlite:PATH, etcd://[USER@]HOST:PORT[,HOST:PORT…][/PREFIX][?cacert=PATH&cert=PATH&key=PATH&layout=L],
    /// zk://[USER@]HOST:PORT[,HOST:PORT…][/CHROOT][?layout=L],
    /// postgres://[USER@]HOST[:PORT]/DB[?schema=NAME&sslmode=verify-full&sslrootcert=PATH…]
    /// or memory:. A password goes in LEASEHOLD_STORE_PASSWORD or a file
    /// (?password_file=PATH), rather than in the URL, where ps and shell
    /// history show it. To share elections with other clients, etcd takes
    /// ?layout=concurrency (etcd's concurrency.Election, etcdctl elect: the
    /// election is the key prefix PREFIX/ELECTION) and ZooKeeper
    /// ?layout=curator (Curator's LeaderLatch) or ?layout=kazoo (kazoo's
    /// Election), on the path CHROOT/ELECTION; those take no --priority,
    /// --preempt-after, --lock-delay, --shards, --slots, transfer or list.
    /// (L=leasehold, the default, is leasehold's own layout.)
    /// [default: sqlite:$XDG_STATE_HOME/leasehold/leasehold.db]
    #[arg(long, env = "LEASEHOLD_STORE", hide_env_values = true, value_parser = StoreUrlParser)]
    pub store: Option<StoreUrl>,
}

/// The environment variable that may hold the store's password, so that
/// the URL (and so the command line) holds none. The library's
/// `store::open` takes it; `run` passes it on to neither its guard nor its
/// command.
pub const PASSWORD_ENV: &str = leasehold::store::PASSWORD_ENV;

/// The environment variable that may hold the store URL (`--store`).
pub const STORE_ENV: &str = "LEASEHOLD_STORE";

impl StoreArgs {
    /// The store's URL as given, the default SQLite file's when none is.
    fn given(&self) -> anyhow::Result<StoreUrl> {
        Ok(match &self.store {
            Some(url) => url.clone(),
            None => StoreUrl::default_sqlite()?,
        })
    }

    /// The store's URL, the default SQLite file's when none is given, with
    /// the password from `LEASEHOLD_STORE_PASSWORD` if that is set (what
    /// the guard is given: its environment has no password).
    pub fn url(&self) -> anyhow::Result<StoreUrl> {
        Ok(self.given()?.with_password_from_env()?)
    }

    /// Refuses, before anything connects, an election name the store's
    /// layout cannot hold (a recipe's path on ZooKeeper): exit 2.
    pub fn check_election(&self, election: &ElectionName) -> anyhow::Result<()> {
        Ok(self.given()?.check_election(election)?)
    }

    /// Opens the store, or the default SQLite file (creating its folder).
    pub async fn open(&self) -> anyhow::Result<Arc<dyn Store>> {
        let url = self.given()?;
        // A password the store cannot take is refused as bad usage before
        // the folder is made; `store::open` takes the password itself.
        url.clone().with_password_from_env()?;
        if self.store.is_none()
            && let StoreUrl::Sqlite(path) = &url
            && let Some(dir) = path.parent()
        {
            std::fs::create_dir_all(dir).with_context(|| {
                format!("cannot create {}", shortened(&dir.display().to_string()))
            })?;
        }
        leasehold::store::open(&url, leasehold::store::Access::ReadWrite)
            .await
            .with_context(|| format!("cannot open store {}", shortened(&url.to_string())))
    }

    /// Opens the store for reading only (`status`, `list`, `observe`):
    /// creates nothing, not even the default SQLite file's folder; a store
    /// that does not exist is an error.
    pub async fn open_read_only(&self) -> anyhow::Result<Arc<dyn Store>> {
        let url = self.given()?;
        url.clone().with_password_from_env()?;
        leasehold::store::open(&url, leasehold::store::Access::ReadOnly)
            .await
            .with_context(|| format!("cannot read store {}", shortened(&url.to_string())))
    }
}

/// Which election, as whom, with which lease timing.
#[derive(Debug, ClapArgs)]
pub struct ElectionArgs {
    /// The election: the name of the responsibility the replicas compete
    /// for, such as nightly-billing; every replica uses the same name
    /// (1–200 bytes of A-Z a-z 0-9 . _ / -, not starting with / or .).
    #[arg(long, short = 'e', env = "LEASEHOLD_ELECTION", hide_env_values = true, value_parser = parse_election)]
    pub election: ElectionName,
    #[command(flatten)]
    pub store: StoreArgs,
    /// This replica's candidate id. [default: <hostname>-<pid>]
    #[arg(long, env = "LEASEHOLD_ID", hide_env_values = true, value_parser = parse_candidate)]
    pub id: Option<CandidateId>,
    /// The lease TTL: how long the store keeps the election for a leader that
    /// stopped renewing; also about how long a crash leaves it unowned.
    #[arg(long, env = "LEASEHOLD_TTL", hide_env_values = true, default_value = DEFAULT_TTL.as_str(), value_parser = parse_duration, allow_hyphen_values = true)]
    pub ttl: Duration,
    #[arg(long, env = "LEASEHOLD_RENEW_EVERY", hide_env_values = true, value_parser = parse_duration, allow_hyphen_values = true, help = renew_every_help())]
    pub renew_every: Option<Duration>,
}

/// `--ttl`'s default: the library's.
static DEFAULT_TTL: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| humantime::format_duration(leasehold::DEFAULT_TTL).to_string());

impl ElectionArgs {
    /// Opens the store for this election, after refusing (exit 2, before
    /// anything connects) a name the store's layout cannot hold.
    pub async fn open_store(&self) -> anyhow::Result<Arc<dyn Store>> {
        self.store.check_election(&self.election)?;
        self.store.open().await
    }

    pub fn lease_config(&self) -> LeaseConfig {
        let mut config = LeaseConfig::new(self.ttl);
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
    /// How long the command may take to exit after a forwarded SIGTERM,
    /// SIGINT or SIGQUIT (SIGHUP and SIGPWR are forwarded as SIGTERM) before it gets
    /// SIGKILL; never past the lease deadline, which renewals move on meanwhile.
    #[arg(long, env = "LEASEHOLD_GRACE", hide_env_values = true, default_value = "5s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub grace: Duration,
    /// Serve a page for people on /, /watch (Server-Sent Events), /status
    /// (JSON), /healthz and /metrics (Prometheus) on this address: HOST:PORT (an IP address or a host name, served on every
    /// address it resolves to, such as localhost:9464) or :PORT (all
    /// interfaces). [default: no HTTP]
    #[arg(long, env = "LEASEHOLD_HTTP", hide_env_values = true, value_parser = parse_http_addr, value_name = "ADDR")]
    pub http: Option<HttpAddr>,
    #[command(flatten)]
    pub planned: PlannedArgs,
    /// Own a share of N shards instead of the whole election: the
    /// replicas that run with the same --election and N form a group, each
    /// shard (an election of its own, ELECTION/shard/K, with its own token)
    /// is owned by exactly one of them, and every replica owns N/M of them
    /// (M replicas), moved only when replicas come or go. CMD runs once per
    /// owned shard, with LEASEHOLD_SHARD (0 to N-1) and LEASEHOLD_SHARDS in
    /// its environment, and LEASEHOLD_TOKEN the shard's token. [default: the
    /// whole election, no shards]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(leasehold::admin::MAX_SHARDS)), conflicts_with = "slots")]
    pub shards: Option<u32>,
    /// Hold one of K slots instead of the whole election: at most K
    /// replicas with the same --election and K run CMD at once, each with
    /// LEASEHOLD_SLOT (0 to K-1) and the slot's own token; a freed slot goes
    /// to the replica waiting longest. [default: the whole election, no
    /// slots]
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=i64::from(leasehold::admin::MAX_SHARDS)))]
    pub slots: Option<u32>,
    /// With --shards only: how long a shard whose command exited stays
    /// released before this replica campaigns for it again (`run` keeps
    /// running). [default: 1s]
    #[arg(long, env = "LEASEHOLD_RESTART_DELAY", hide_env_values = true, value_parser = parse_duration, allow_hyphen_values = true)]
    pub restart_delay: Option<Duration>,
    /// The command to run while leader, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// How this replica takes part in planned moves: its priority, and the
/// waits before preempting and after an expiry (`run` and `sidecar`).
#[derive(Debug, ClapArgs)]
pub struct PlannedArgs {
    /// This replica's priority (any integer; higher wins). Among waiting
    /// replicas the highest priority is granted the election first, then
    /// the one waiting longest; a waiting replica of strictly higher
    /// priority than the leader takes over by a graceful handover once it
    /// has waited --preempt-after. Equal priorities never preempt.
    #[arg(
        long,
        env = "LEASEHOLD_PRIORITY",
        hide_env_values = true,
        default_value_t = 0,
        allow_hyphen_values = true,
        value_name = "N"
    )]
    pub priority: i64,
    /// While this replica leads, how long a waiting replica of higher
    /// priority must have waited before this one hands over to it, so that
    /// a replica that keeps crashing and restarting cannot make leadership
    /// flap. [default: the renewal period]
    #[arg(long, env = "LEASEHOLD_PREEMPT_AFTER", hide_env_values = true, value_parser = parse_duration, allow_hyphen_values = true)]
    pub preempt_after: Option<Duration>,
    /// After the previous leader's lease expired (it crashed or was cut off,
    /// rather than releasing), wait this long before taking over, so that
    /// requests it had in flight drain from a resource that cannot check
    /// fencing tokens. A release (SIGTERM, a transfer) is not delayed.
    #[arg(long, env = "LEASEHOLD_LOCK_DELAY", hide_env_values = true, default_value = "0s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub lock_delay: Duration,
}

impl PlannedArgs {
    /// The first of these flags that is set, if any: each needs the line's
    /// notes, which another recipe's layout and a group do not keep.
    pub fn first_set(&self) -> Option<&'static str> {
        [
            (self.priority != 0, "--priority (or LEASEHOLD_PRIORITY)"),
            (
                self.preempt_after.is_some(),
                "--preempt-after (or LEASEHOLD_PREEMPT_AFTER)",
            ),
            (
                !self.lock_delay.is_zero(),
                "--lock-delay (or LEASEHOLD_LOCK_DELAY)",
            ),
        ]
        .into_iter()
        .find_map(|(set, flag)| set.then_some(flag))
    }

    /// `elector` with these settings.
    pub fn apply(&self, elector: leasehold::Elector) -> leasehold::Elector {
        let elector = elector
            .with_priority(self.priority)
            .with_lock_delay(self.lock_delay);
        match self.preempt_after {
            Some(settle) => elector.with_preempt_after(settle),
            None => elector,
        }
    }

    /// Refuses these flags in another recipe's layout.
    pub fn check(&self, store: &StoreArgs) -> Result<(), leasehold::Error> {
        let layout = store.store.as_ref().map(StoreUrl::layout);
        match (layout.filter(|l| l.is_foreign()), self.first_set()) {
            (Some(layout), Some(flag)) => Err(foreign_layout_refuses(flag, layout)),
            _ => Ok(()),
        }
    }
}

#[derive(Debug, ClapArgs)]
pub struct SidecarArgs {
    #[command(flatten)]
    pub election: ElectionArgs,
    #[command(flatten)]
    pub planned: PlannedArgs,
    /// Serve /leader, /follower, /health, /watch, /status, /healthz,
    /// /metrics and a page for people on / on this address: HOST:PORT (an IP address or a host name, served on
    /// every address it resolves to) or :PORT (all interfaces). At least
    /// one of --http and --socket is needed. [default: no HTTP]
    #[arg(long, env = "LEASEHOLD_HTTP", hide_env_values = true, value_parser = parse_http_addr, value_name = "ADDR")]
    pub http: Option<HttpAddr>,
    /// Serve the same, and the admin calls POST /resign and POST
    /// /transfer?to=ID, on a unix socket at this path (created mode 0600;
    /// a socket of this user's nobody serves on is replaced, any other file
    /// refused). [default: no socket]
    #[arg(
        long,
        env = "LEASEHOLD_SOCKET",
        hide_env_values = true,
        value_name = "PATH"
    )]
    pub socket: Option<PathBuf>,
    /// Allow the admin calls on --http too, to a request carrying the
    /// token this file holds (`Authorization: Bearer TOKEN`): one line of at
    /// least 16 characters without spaces; keep the file mode 0600.
    /// [default: the admin calls are refused on --http]
    #[arg(
        long,
        env = "LEASEHOLD_ADMIN_TOKEN_FILE",
        hide_env_values = true,
        value_name = "PATH"
    )]
    pub admin_token_file: Option<PathBuf>,
    /// Run this shell command (sh -c) when this replica becomes the
    /// leader, with LEASEHOLD_ELECTION, LEASEHOLD_ID and LEASEHOLD_TOKEN in
    /// its environment. Hooks run one at a time, in order, beside the
    /// election: they never delay a renewal or a step-down. [default: none]
    #[arg(long, value_name = "CMD", value_parser = parse_hook)]
    pub on_elected: Option<String>,
    /// Run this shell command when this replica stops leading, with the
    /// same variables and LEASEHOLD_REASON. [default: none]
    #[arg(long, value_name = "CMD", value_parser = parse_hook)]
    pub on_deposed: Option<String>,
    /// How long a hook may run before it (and every process it started in
    /// its process group) is killed.
    #[arg(long, default_value = "10s", value_parser = parse_hook_timeout)]
    pub hook_timeout: Duration,
}

/// A hook's command: not empty.
fn parse_hook(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("a hook needs a command".into());
    }
    Ok(s.to_owned())
}

/// A hook's timeout: more than nothing.
fn parse_hook_timeout(s: &str) -> Result<Duration, String> {
    let timeout = parse_duration(s)?;
    if timeout.is_zero() {
        return Err("a hook needs some time to run: give more than 0s".into());
    }
    Ok(timeout)
}

/// A shard's restart delay without `--restart-delay`.
pub const DEFAULT_RESTART_DELAY: Duration = Duration::from_secs(1);

impl RunArgs {
    /// Refuses settings that do not go together.
    pub fn check(&self) -> Result<(), leasehold::Error> {
        self.planned.check(&self.election.store)?;
        let layout = self.election.store.store.as_ref().map(StoreUrl::layout);
        if let Some(layout) = layout.filter(|l| l.is_foreign()) {
            let group = [
                (self.shards.is_some(), "--shards"),
                (self.slots.is_some(), "--slots"),
            ];
            if let Some((_, flag)) = group.iter().find(|(set, _)| *set) {
                return Err(foreign_layout_refuses(flag, layout));
            }
        }
        let group = if let Some(n) = self.shards {
            leasehold::admin::GroupKind::Shards(n).check(&self.election.election)?;
            "--shards"
        } else if let Some(k) = self.slots {
            leasehold::admin::GroupKind::Slots(k).check(&self.election.election)?;
            "--slots"
        } else if self.restart_delay.is_some() {
            return Err(leasehold::Error::InvalidInput {
                what: "options",
                reason: "--restart-delay (or LEASEHOLD_RESTART_DELAY) applies only with --shards"
                    .into(),
            });
        } else {
            return Ok(());
        };
        let restart_delay = (self.slots.is_some() && self.restart_delay.is_some())
            .then_some("--restart-delay (or LEASEHOLD_RESTART_DELAY)");
        match restart_delay.or(self.planned.first_set()) {
            Some(flag) => Err(leasehold::Error::InvalidInput {
                what: "options",
                reason: format!("{flag} does not apply with {group}"),
            }),
            None => Ok(()),
        }
    }
}

/// `what` needs leasehold's own layout: in another recipe's, that
/// recipe's order of candidates is the only line, which its own clients
/// follow without knowing of priorities, transfers or groups.
pub fn foreign_layout_refuses(what: &str, layout: leasehold::store::Layout) -> leasehold::Error {
    leasehold::Error::InvalidInput {
        what: "options",
        reason: format!(
            "{what} needs leasehold's own layout: with ?layout={layout} leasehold keeps \
             nothing but the recipe's candidates, whose order alone decides"
        ),
    }
}

#[derive(Debug, ClapArgs)]
pub struct StatusArgs {
    /// The election to report on: the name its replicas give to `run
    /// --election` (`list` shows every election in the store).
    #[arg(long, short = 'e', env = "LEASEHOLD_ELECTION", hide_env_values = true, value_parser = parse_election)]
    pub election: ElectionName,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Print JSON: {"election":E,"leader":{"id":…,"token":N,"expires_in_ms":…}} or "leader":null,
    /// and "candidates":[{"id":…,"priority":N},…], the waiting replicas in the order they would be granted;
    /// for a group (`run --shards`, `run --slots`), "group":{"kind","count","members":[{"id","owns"}],
    /// "owners":[{"index","election","owner"}]}.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, ClapArgs)]
pub struct TransferArgs {
    /// The election whose leadership moves.
    #[arg(long, short = 'e', env = "LEASEHOLD_ELECTION", hide_env_values = true, value_parser = parse_election)]
    pub election: ElectionName,
    #[command(flatten)]
    pub store: StoreArgs,
    /// The candidate id of the waiting replica to hand over to (`status`
    /// lists them). [default: the first in line]
    #[arg(long, value_parser = parse_candidate, value_name = "ID")]
    pub to: Option<CandidateId>,
    /// How long to wait for the new leader to hold (more than zero). A
    /// handover the leader began before then goes on after it.
    #[arg(long, default_value = "10s", value_parser = parse_timeout, allow_hyphen_values = true)]
    pub timeout: Duration,
}

#[derive(Debug, ClapArgs)]
pub struct ObserveArgs {
    /// The election to watch: the name its replicas give to `run
    /// --election` (`list` shows every election in the store).
    #[arg(long, short = 'e', env = "LEASEHOLD_ELECTION", hide_env_values = true, value_parser = parse_election)]
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
    /// How long to hold the election once won before resigning. SIGTERM,
    /// SIGINT, SIGHUP, SIGQUIT, SIGPWR, and the signals `run` passes to its
    /// command (SIGUSR1, SIGUSR2, SIGALRM…) resign at once (`releasing` and
    /// `released` then name the signal) and end `campaign` with status 0;
    /// those `run` ignores (SIGABRT, SIGXCPU…) are ignored.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub hold: Duration,
    /// How many times to campaign, hold and resign in a row.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
}

#[derive(Debug, ClapArgs)]
pub struct TuneArgs {
    /// How often the leader renews its lease (R). [default: a third of --ttl;
    /// required without --ttl]
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true, required_unless_present = "ttl")]
    pub renew_every: Option<Duration>,
    /// The slowest renewal round trip to ride out (J): network jitter plus
    /// store latency under load. [default: with --measure, the
    /// measured p99; required without --measure]
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true, required_unless_present = "measure")]
    pub jitter: Option<Duration>,
    /// Bound on the skew between the leader's and the store's clocks (S).
    #[arg(long, default_value = "100ms", value_parser = parse_duration, allow_hyphen_values = true)]
    pub skew: Duration,
    /// Judge this TTL instead of recommending one; exits 3 if it is unsafe.
    /// [default: recommend one]
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    pub ttl: Option<Duration>,
    /// Measure N renewal round trips against the store (--store or the
    /// default) and use their p99, rounded up to whole milliseconds, as the
    /// jitter (the larger of the two if --jitter is given too). [default: no
    /// measurement]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub measure: Option<u32>,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Print one JSON object (the recommendation is `recommended_ttl_ms`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, ClapArgs)]
pub struct CompletionsArgs {
    /// The shell to write the completion script for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, ClapArgs)]
pub struct ManArgs {
    /// Write leasehold.1 and a page per subcommand (leasehold-run.1, …)
    /// into this directory. [default: print leasehold.1 on stdout]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

impl Args {
    /// A `run` or `campaign` started by the command of another `run`
    /// (`LEASEHOLD_TOKEN` is set): the `LEASEHOLD_ELECTION` and
    /// `LEASEHOLD_ID` it inherited describe that run's term, not this
    /// one's. Inherited, the id is not taken (this one gets its own
    /// default), and the election must be given as a flag: the same
    /// election under the same id would wait for itself.
    pub fn leave_the_outer_term(&mut self, matches: &clap::ArgMatches) -> leasehold::Result<()> {
        use clap::parser::ValueSource;
        let (Some((_, sub)), Some(outer)) =
            (matches.subcommand(), std::env::var_os("LEASEHOLD_TOKEN"))
        else {
            return Ok(());
        };
        let election = match &mut self.command {
            Command::Run(run) => &mut run.election,
            Command::Campaign(campaign) => &mut campaign.election,
            _ => return Ok(()),
        };
        let inherited = |arg: &str| sub.value_source(arg) == Some(ValueSource::EnvVariable);
        if inherited("id") {
            election.id = None;
        }
        if inherited("election") {
            return Err(leasehold::Error::InvalidInput {
                what: "election",
                reason: format!(
                    "this leasehold was started by the command of another `leasehold run` (the \
                     one of token {}), whose LEASEHOLD_ELECTION names that run's election, not \
                     this one's: give this one --election",
                    leasehold::quoted(&outer.to_string_lossy())
                ),
            });
        }
        Ok(())
    }

    /// What clap cannot check, checked before anything connects: the
    /// program to run is one a system could start, the lease configuration
    /// obeys the renewal rule and the maximum TTL.
    pub fn validate(&self) -> leasehold::Result<()> {
        let election = match &self.command {
            Command::Run(run) => {
                if let Some(program) = run.command.first() {
                    check_program(program)?;
                }
                &run.election
            }
            Command::Campaign(campaign) => &campaign.election,
            Command::Man(ManArgs { dir: Some(dir) }) => return check_man_dir(dir),
            _ => return Ok(()),
        };
        election.lease_config().validate()
    }
}

/// The longest name of a file or directory, in bytes (Linux's `NAME_MAX`).
const MAX_FILE_NAME_LEN: usize = 255;

/// Refuses a program to run that no system could start, whatever is
/// installed by the time this replica leads: an empty one, a name looked
/// up in `PATH` longer than `NAME_MAX` (glibc's and musl's `execvp` refuse
/// it), a path longer than the kernel takes. Its bytes need not be UTF-8:
/// the program is started as given.
fn check_program(program: &std::ffi::OsStr) -> leasehold::Result<()> {
    let len = program.len();
    let looked_up = !program.as_encoded_bytes().contains(&b'/');
    let limit = if looked_up {
        MAX_FILE_NAME_LEN
    } else {
        leasehold::store::MAX_FILE_PATH_LEN
    };
    let reason = if len == 0 {
        "the program to run (the first word after --) is empty".to_owned()
    } else if len > limit {
        let kind = if looked_up {
            "a name looked up in PATH"
        } else {
            "a path"
        };
        format!(
            "the program to run (the first word after --) {} is {len} bytes long, at most \
             {limit} for {kind}: no system can start it",
            leasehold::quoted(&program.to_string_lossy()),
        )
    } else {
        return Ok(());
    };
    Err(leasehold::Error::InvalidInput {
        what: "command",
        reason,
    })
}

/// `man --dir`: a path the system can take, its length and the limit said
/// when too long (rather than the path quoted back whole).
fn check_man_dir(dir: &std::path::Path) -> leasehold::Result<()> {
    let invalid = |reason| {
        Err(leasehold::Error::InvalidInput {
            what: "manual page directory (--dir)",
            reason,
        })
    };
    let len = dir.as_os_str().len();
    if len > leasehold::store::MAX_FILE_PATH_LEN {
        return invalid(format!(
            "{len} bytes long, at most {} allowed",
            leasehold::store::MAX_FILE_PATH_LEN
        ));
    }
    let long_name = dir
        .components()
        .map(|c| c.as_os_str())
        .find(|name| name.len() > MAX_FILE_NAME_LEN);
    if let Some(name) = long_name {
        return invalid(format!(
            "the name {} in it is {} bytes long, at most {MAX_FILE_NAME_LEN} allowed",
            leasehold::quoted(&name.to_string_lossy()),
            name.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::CommandFactory;
    use leasehold::MAX_TTL;
    use proptest::prelude::*;

    use super::{Args, parse_duration};

    proptest! {
        /// Any text: a duration up to the maximum or an error, never a
        /// panic.
        #[test]
        fn any_text_is_a_bounded_duration_or_refused(text in ".*") {
            if let Ok(d) = parse_duration(&text) {
                prop_assert!(d <= MAX_TTL);
            }
        }

        /// Any number with any unit, up to `u64::MAX`: within the bound it
        /// is what it says, beyond it refused naming the maximum.
        #[test]
        fn numbers_with_units_are_exact_or_refused(
            n in prop_oneof![0u64..200_000, any::<u64>()],
            unit in prop::sample::select(vec!["ns", "us", "ms", "s", "m", "h", "d", "w", "M", "y"]),
        ) {
            let text = format!("{n}{unit}");
            match parse_duration(&text) {
                Ok(d) => {
                    prop_assert!(d <= MAX_TTL);
                    prop_assert_eq!(Some(d), humantime::parse_duration(&text).ok());
                }
                Err(e) => prop_assert!(
                    humantime::parse_duration(&text).is_err()
                        || e.contains("longer than the maximum, 24h"),
                    "{}: {}", text, e
                ),
            }
        }

        /// What `humantime` writes reads back the same up to the maximum,
        /// and is refused beyond it.
        #[test]
        fn durations_round_trip_up_to_the_maximum(secs in 0u64..200_000, nanos in 0u32..1_000_000_000) {
            let d = Duration::new(secs, nanos);
            let text = humantime::format_duration(d).to_string();
            match parse_duration(&text) {
                Ok(parsed) => {
                    prop_assert_eq!(parsed, d);
                    prop_assert!(d <= MAX_TTL);
                }
                Err(e) => {
                    prop_assert!(d > MAX_TTL, "{}: {}", text, e);
                    prop_assert!(e.contains("longer than the maximum, 24h"), "{}", e);
                }
            }
        }
    }

    /// Every flag of every subcommand says what it does, and every optional
    /// flag that takes a value names its default.
    #[test]
    fn every_flag_is_explained_with_its_default() {
        let mut command = Args::command();
        command.build();
        let mut checked = 0;
        for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
            assert!(sub.get_about().is_some(), "{} has no help", sub.get_name());
            for arg in sub.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") || arg.is_hide_set() {
                    continue;
                }
                let help = arg
                    .get_long_help()
                    .or(arg.get_help())
                    .map(ToString::to_string)
                    .unwrap_or_default();
                assert!(
                    !help.trim().is_empty(),
                    "{} --{id} has no help",
                    sub.get_name()
                );
                let takes_value = arg.get_num_args().is_some_and(|n| n.takes_values())
                    && !matches!(
                        arg.get_action(),
                        clap::ArgAction::SetTrue | clap::ArgAction::Count
                    );
                let optional = !arg.is_required_set() && !arg.is_positional();
                if takes_value && optional && arg.get_default_values().is_empty() {
                    assert!(
                        help.contains("[default:"),
                        "{} --{id} does not name its default: {help:?}",
                        sub.get_name()
                    );
                }
                checked += 1;
            }
        }
        assert!(checked > 20, "only {checked} flags checked");
    }

    /// No flag read from the environment shows the variable's value in
    /// `--help`: LEASEHOLD_STORE may hold a password, and any variable added
    /// later could too.
    #[test]
    fn help_never_shows_an_environment_value() {
        let mut command = Args::command();
        command.build();
        let mut checked = 0;
        for sub in std::iter::once(&command).chain(command.get_subcommands()) {
            for arg in sub.get_arguments().filter(|a| a.get_env().is_some()) {
                assert!(
                    arg.is_hide_env_values_set(),
                    "{} --{} shows its environment value in --help",
                    sub.get_name(),
                    arg.get_id()
                );
                checked += 1;
            }
        }
        assert!(checked >= 10, "only {checked} flags checked");
    }

    /// `:PORT` is every interface; an IPv6 address needs its brackets (an
    /// unbracketed `::1:PORT` was once read as `0.0.0.0::1:PORT`).
    #[test]
    fn http_addresses() {
        let ok = |s: &str| super::parse_http_addr(s).map(|a| a.addrs);
        assert_eq!(
            ok(":9464").expect("port only"),
            vec!["0.0.0.0:9464".parse().expect("addr")]
        );
        assert_eq!(
            ok("[::1]:9464").expect("bracketed IPv6"),
            vec!["[::1]:9464".parse().expect("addr")]
        );
        let error = super::parse_http_addr("::1:9464").expect_err("unbracketed IPv6");
        assert!(error.contains("[::1]:9464"), "{error}");
        assert!(!error.contains("0.0.0.0"), "{error}");
        for bad in [":", ":x", "host", "host:", "a b:1"] {
            assert!(super::parse_http_addr(bad).is_err(), "{bad}");
        }
    }
}
