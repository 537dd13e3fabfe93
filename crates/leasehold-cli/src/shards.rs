//! `run --shards N`: a member of a group of N shards, running one command
//! per owned shard (each its own term: own process group, guard, token and
//! deadline), stopping a shard's command when the shard moves away, and
//! campaigning again for a shard whose command exited.

use std::collections::HashMap;
use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use leasehold::{CandidateId, ElectionName, Elector, Leadership, Shard, Shards};
use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::child;
use crate::guard::{Launch, Supervised};
use crate::metrics::{RunnerMetrics, StepDown};
use crate::signals::{AnySignal, Handled};
use crate::stopping::TermEnd;
use crate::term::{Request, Requests, Term, renewed_in_time};

/// Pause before joining again after the store did not answer.
const RETRY_JOIN: Duration = Duration::from_secs(1);

/// What `run` tells a shard's term.
enum Control {
    /// `run` was told to stop by this signal.
    Stop(Signal),
    /// Pass this signal to the command.
    Pass(AnySignal),
}

/// What every shard's term shares.
struct Settings {
    elector: Arc<Elector>,
    group: ElectionName,
    count: u32,
    command: Vec<OsString>,
    grace: Duration,
    restart_delay: Duration,
    store: leasehold::StoreUrl,
    metrics: Arc<RunnerMetrics>,
    /// Per shard whose command keeps exiting soon after it started, the
    /// restart delay used last.
    backoff: std::sync::Mutex<HashMap<u32, Duration>>,
}

/// A command that ran at least this long before it exited was no crash
/// loop: its shard's restart delay goes back to `--restart-delay`.
const RAN_LONG_ENOUGH: Duration = Duration::from_secs(10);
/// The longest restart delay a crash-looping shard's command backs off to.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

impl Settings {
    /// How long shard `index` rests after its command exited, having run
    /// `ran`: `--restart-delay`, doubled (from at least 100 ms, up to a
    /// minute) for each exit in a row that came sooner than
    /// [`RAN_LONG_ENOUGH`], so that commands that exit at once cannot keep
    /// the runner (and the store) too busy to renew its lease.
    fn restart_delay(&self, index: u32, ran: Duration) -> Duration {
        let mut backoff = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
        if ran >= RAN_LONG_ENOUGH {
            backoff.remove(&index);
            return self.restart_delay;
        }
        let delay = match backoff.get(&index) {
            None => self.restart_delay,
            Some(last) => (*last * 2)
                .max(Duration::from_millis(100))
                .min(MAX_BACKOFF)
                .max(self.restart_delay),
        };
        backoff.insert(index, delay);
        delay
    }
}

/// `run --shards N`.
pub struct ShardRunner {
    pub elector: Arc<Elector>,
    pub group: ElectionName,
    pub count: u32,
    pub command: Vec<OsString>,
    pub grace: Duration,
    pub restart_delay: Duration,
    pub signals: Handled,
    pub store: leasehold::StoreUrl,
    pub metrics: Arc<RunnerMetrics>,
}

impl ShardRunner {
    /// Joins the group and serves until told to stop; then stops every
    /// shard's command and releases every shard.
    pub async fn serve(self) -> anyhow::Result<ExitCode> {
        let ShardRunner {
            elector,
            group,
            count,
            command,
            grace,
            restart_delay,
            signals: mut handled,
            store,
            metrics,
        } = self;
        let id = elector.candidate().clone();
        let Some(mut shards) = join_group(&elector, &group, count, &mut handled).await? else {
            return Ok(ExitCode::SUCCESS);
        };
        metrics.follow_group(shards.view());
        tracing::info!(%group, %id, shards = count, "joined the group; campaigning for this member's share");
        let settings = Arc::new(Settings {
            elector,
            group,
            count,
            command,
            grace,
            restart_delay,
            store,
            metrics,
            backoff: std::sync::Mutex::new(HashMap::new()),
        });
        let mut terms = Terms::default();
        let outcome = terms.serve(&settings, &mut shards, &mut handled).await;
        // No more campaigns; then every command stops and its shard is
        // released.
        shards.leave().await;
        terms.stop(&settings, &outcome).await;
        settings.metrics.follow_group_end();
        outcome.map(|signal| match signal {
            Some(signal) => {
                tracing::info!(group = %settings.group, %id, %signal, "stopped; every shard released");
                ExitCode::SUCCESS
            }
            None => ExitCode::from(crate::term::EXIT_CANNOT_START),
        })
    }
}

/// Joins `group`, again while the store does not answer; `None` if told
/// to stop first.
async fn join_group(
    elector: &Arc<Elector>,
    group: &ElectionName,
    count: u32,
    handled: &mut Handled,
) -> anyhow::Result<Option<Shards>> {
    loop {
        tokio::select! {
            joined = Shards::join(Arc::clone(elector), group.clone(), count) => match joined {
                Ok(shards) => return Ok(Some(shards)),
                Err(error) if error.is_transient() => {
                    tracing::warn!(%group, %error, retry_in = ?RETRY_JOIN, "cannot join the group yet; retrying");
                    tokio::time::sleep(RETRY_JOIN).await;
                }
                Err(error) => {
                    return Err(anyhow::Error::new(error).context(format!("cannot join group {group}")));
                }
            },
            signal = handled.stop.recv() => {
                tracing::info!(%signal, "stopping before joining the group");
                return Ok(None);
            }
        }
    }
}

/// The shards' terms: their tasks, and every running term's control with
/// its shard. A shard's next term may start while its last one still
/// ends (its release): both are kept, and a term's entry goes once its
/// receiver is gone.
#[derive(Default)]
struct Terms {
    tasks: JoinSet<(u32, bool)>,
    controls: Vec<(u32, mpsc::UnboundedSender<Control>)>,
}

impl Terms {
    /// Runs a term for each shard granted until told to stop (the
    /// signal), a command cannot start (`None`), or the group fails.
    async fn serve(
        &mut self,
        settings: &Arc<Settings>,
        shards: &mut Shards,
        handled: &mut Handled,
    ) -> anyhow::Result<Option<Signal>> {
        loop {
            tokio::select! {
                shard = shards.next() => match shard {
                    Ok(shard) => {
                        let (tx, rx) = mpsc::unbounded_channel();
                        self.controls.push((shard.index(), tx));
                        self.tasks.spawn(run_term(Arc::clone(settings), shard, rx));
                    }
                    Err(error) if error.is_transient() => {
                        tracing::warn!(%error, "a shard's campaign failed; retrying");
                    }
                    Err(error) => return Err(anyhow::Error::new(error).context(format!("group {}", settings.group))),
                },
                Some(done) = self.tasks.join_next() => {
                    self.controls.retain(|(_, control)| !control.is_closed());
                    if let Ok((_, true)) = done {
                        return Ok(None);
                    }
                }
                signal = handled.stop.recv() => return Ok(Some(signal)),
                signal = handled.passed.recv() => {
                    if self.controls.is_empty() {
                        tracing::info!(%signal, "no command is running; signal ignored");
                    }
                    for (_, control) in &self.controls {
                        let _ = control.send(Control::Pass(signal));
                    }
                }
                signal = handled.ignored.recv() => tracing::info!(%signal, "signal ignored"),
            }
        }
    }

    /// Stops every command (with the signal `run` was told to stop by, or
    /// SIGTERM) and waits for every term to end.
    async fn stop(&mut self, settings: &Settings, outcome: &anyhow::Result<Option<Signal>>) {
        let signal = match outcome {
            Ok(Some(signal)) => *signal,
            Ok(None) | Err(_) => Signal::SIGTERM,
        };
        if !self.controls.is_empty() {
            match outcome {
                Ok(Some(_)) => {
                    tracing::info!(%signal, commands = self.controls.len(), grace = ?settings.grace, "stopping every shard's command");
                }
                _ => {
                    tracing::info!(commands = self.controls.len(), grace = ?settings.grace,
                        "stopping every other shard's command with SIGTERM");
                }
            }
        }
        for (_, control) in &self.controls {
            let _ = control.send(Control::Stop(signal));
        }
        while self.tasks.join_next().await.is_some() {}
    }
}

/// The requests of one shard's term: `run`'s, and the shard's move.
struct ShardRequests<'a> {
    shard: &'a Shard,
    control: &'a mut mpsc::UnboundedReceiver<Control>,
}

impl Requests for ShardRequests<'_> {
    async fn next(&mut self, _leadership: &Leadership, stopping: bool) -> Request {
        loop {
            tokio::select! {
                control = self.control.recv() => match control {
                    Some(Control::Stop(signal)) => return Request::Stop(signal),
                    Some(Control::Pass(signal)) => return Request::Pass(signal),
                    None => std::future::pending::<()>().await,
                },
                () = self.shard.revoked(), if !stopping => return Request::Moved,
            }
        }
    }
}

/// The environment of shard `index`'s command, granted with `token`.
fn shard_env(
    settings: &Settings,
    election: &ElectionName,
    token: leasehold::FencingToken,
    index: u32,
) -> [(&'static str, String); 5] {
    [
        ("LEASEHOLD_ELECTION", election.to_string()),
        ("LEASEHOLD_ID", settings.elector.candidate().to_string()),
        ("LEASEHOLD_TOKEN", token.to_string()),
        ("LEASEHOLD_SHARD", index.to_string()),
        ("LEASEHOLD_SHARDS", settings.count.to_string()),
    ]
}

/// One term of one shard: runs the command until the term ends, then
/// releases the shard (or lets it go, when lost). Returns the shard's
/// number, and whether the command could not be started at all.
async fn run_term(
    settings: Arc<Settings>,
    shard: Shard,
    mut control: mpsc::UnboundedReceiver<Control>,
) -> (u32, bool) {
    let index = shard.index();
    let leadership = shard.leadership();
    let (election, token) = (leadership.election().clone(), leadership.token());
    let id: &CandidateId = settings.elector.candidate();
    let env = shard_env(&settings, &election, token, index);
    let renew_every = settings.elector.config().renew_every;
    if let Err(reason) = renewed_in_time(leadership, settings.grace, renew_every).await {
        tracing::warn!(group = %settings.group, shard = index, %id, token = token.0, %reason,
            "granted, but lost before a renewal was confirmed; the command was not started");
        drop(shard);
        return (index, false);
    }
    let launch = Launch {
        command: &settings.command,
        env: &env,
        store: &settings.store,
        grant: leadership.grant(),
        deadline: leadership.deadline(),
        session_locks: settings.elector.store().session_lock_file(),
    };
    let mut child = match Supervised::start(launch).await {
        Ok(child) => child,
        Err(error) => {
            cannot_start(&settings, shard, &format!("{error:#}")).await;
            return (index, true);
        }
    };
    settings.metrics.shard_gained();
    let started = tokio::time::Instant::now();
    tracing::info!(group = %settings.group, shard = index, %id, token = token.0, pgid = child.pgid, "owning shard; command started");
    let term = Term {
        election: &election,
        id,
        grace: settings.grace,
        renew_every: settings.elector.config().renew_every,
    };
    let (status, why) = {
        let mut requests = ShardRequests {
            shard: &shard,
            control: &mut control,
        };
        term.supervise(&mut child, shard.leadership(), &mut requests)
            .await
    };
    let code = child::exit_code(status);
    let (step_down, released) = end_term(&settings, shard, why, code, started.elapsed()).await;
    if let Err(error) = released
        && !crate::term::already_gone(&error)
    {
        tracing::warn!(shard = index, %error, "could not release the shard (the store expires it after the TTL)");
    }
    settings.metrics.shard_released(step_down);
    child.finish().await;
    (index, false)
}

/// The shard's command could not be started: says so, and releases the
/// shard.
async fn cannot_start(settings: &Settings, shard: Shard, error: &str) {
    let program = settings
        .command
        .first()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    crate::say(&format!(
        "cannot run {}: {error}",
        leasehold::shortened(&program)
    ));
    let index = shard.index();
    if let Err(error) = shard.resign().await
        && !crate::term::already_gone(&error)
    {
        tracing::warn!(shard = index, %error, "could not release the shard");
    }
}

/// Lets the shard go as its term ended (`why`, the command's exit `code`,
/// after running `ran`): released, to be asked for again after the
/// restart delay or at once, or dropped when lost. How it stepped down,
/// and how the release went.
async fn end_term(
    settings: &Settings,
    shard: Shard,
    why: TermEnd,
    code: u8,
    ran: Duration,
) -> (StepDown, leasehold::Result<()>) {
    let (index, token) = (shard.index(), shard.token());
    match why {
        TermEnd::Exited => {
            let delay = settings.restart_delay(index, ran);
            tracing::info!(shard = index, token = token.0, status = code, restart_in = ?delay,
                "command exited; shard released, campaigning for it again after the restart delay");
            (StepDown::CommandExited, shard.release_for(delay).await)
        }
        TermEnd::Moved => {
            tracing::info!(
                shard = index,
                token = token.0,
                status = code,
                "shard released to its new owner"
            );
            (StepDown::HandedOver, shard.resign().await)
        }
        TermEnd::Lost(reason) | TermEnd::StoppedAndLost(_, reason) => {
            tracing::warn!(shard = index, token = token.0, %reason, status = code, "shard lost");
            drop(shard);
            (StepDown::from_lost(&reason), Ok(()))
        }
        TermEnd::AtRisk(reason) => {
            tracing::warn!(
                shard = index,
                token = token.0,
                status = code,
                reason,
                "shard given up before the lease deadline"
            );
            // Not asked for again at once: the lease is what is at risk.
            (StepDown::AtRisk, shard.release_for(RETRY_JOIN).await)
        }
        TermEnd::Stopped(signal) => {
            tracing::info!(shard = index, token = token.0, %signal, status = code, "stopped; shard released");
            (StepDown::Stopped, shard.resign().await)
        }
        TermEnd::HandedOver(_) => (StepDown::HandedOver, shard.resign().await),
    }
}
