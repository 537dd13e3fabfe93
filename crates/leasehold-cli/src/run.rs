//! `leasehold run`: campaign; while leader, supervise the command.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use leasehold::{ElectionName, Elector, Handover, Leadership};

use crate::child;
use crate::cli::RunArgs;
use crate::guard::{Launch, Supervised};
use crate::metrics::{RunnerMetrics, StepDown};
use crate::signals::{Handled, IgnoredSignals, PassedSignals, StopSignals};
use crate::stopping::TermEnd;
use crate::term::{EXIT_CANNOT_START, Request, already_gone, renewed_in_time};
use crate::watch::Changes;

/// Pause before campaigning again after a transient store error.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// What to do after a term of leadership.
enum Next {
    Campaign,
    Exit(ExitCode),
}

struct Runner {
    /// With `--slots K`: campaign for one of K slots of the election.
    slots: Option<u32>,
    elector: Elector,
    election: ElectionName,
    command: Vec<OsString>,
    grace: Duration,
    signals: Handled,
    /// Where the grants live, for the guard (see guard.rs).
    store: leasehold::StoreUrl,
    metrics: Arc<RunnerMetrics>,
}

pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    // Should a guard die, what is left of its command's tree comes to
    // `run` rather than to PID 1, and `run` kills it (guard.rs).
    if let Err(error) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!(%error, "cannot become a subreaper");
    }
    args.check()?;
    let store = args.election.open_store().await?;
    let candidate = args.election.candidate();
    let metrics = RunnerMetrics::new(args.election.election.as_str(), candidate.as_str());
    let config = args.election.lease_config();
    let elector = args.planned.apply(
        Elector::new(Arc::clone(&store), candidate, config)?
            .with_renewal_observer(metrics.renewal_observer()),
    );
    let line_gauge = tokio::spawn(count_waiting(
        Arc::clone(&store),
        args.election.election.clone(),
        Arc::clone(&metrics),
    ));
    let election = &args.election.election;
    let serving = match &args.http {
        Some(addr) => Some(serve_http(addr, &elector, election, store, &metrics).await?),
        None => None,
    };
    check_margin(&elector, &args.election.election).await;
    if let Some(bound) = serving {
        let shown: Vec<String> = bound.iter().map(ToString::to_string).collect();
        tracing::info!(addr = %shown.join(", "), "serving the page on /, /watch, /status, /healthz and /metrics");
    }
    refuse_a_group(
        &**elector.store(),
        &args.election.election,
        args.shards.is_none() && args.slots.is_none(),
    )
    .await?;
    if let Some(count) = args.shards {
        line_gauge.abort();
        return run_shards(args, count, elector, metrics).await;
    }
    let mut runner = Runner {
        slots: args.slots,
        elector,
        election: args.election.election.clone(),
        command: args.command,
        grace: args.grace,
        signals: Handled::install()?,
        store: args.election.store.url()?,
        metrics,
    };
    let code = runner.serve().await;
    line_gauge.abort();
    if let Err(error) = runner.elector.close().await {
        tracing::warn!(%error, "could not close the session; the store will expire it after the TTL");
    }
    code
}

/// `run --shards COUNT`: a command for each shard this replica owns.
async fn run_shards(
    args: RunArgs,
    count: u32,
    elector: Elector,
    metrics: Arc<RunnerMetrics>,
) -> anyhow::Result<ExitCode> {
    let elector = Arc::new(elector);
    let runner = crate::shards::ShardRunner {
        elector: Arc::clone(&elector),
        group: args.election.election.clone(),
        count,
        command: args.command,
        grace: args.grace,
        restart_delay: args
            .restart_delay
            .unwrap_or(crate::cli::DEFAULT_RESTART_DELAY),
        signals: Handled::install()?,
        store: args.election.store.url()?,
        metrics,
    };
    let code = runner.serve().await;
    if let Err(error) = elector.close().await {
        tracing::warn!(%error, "could not close the session; the store will expire it after the TTL");
    }
    code
}

/// Serves `--http`: the page, `/watch` (this runner's leadership from
/// `metrics`, the leader from a watch of the election), `/status`,
/// `/healthz` and `/metrics`; the addresses bound.
async fn serve_http(
    addr: &crate::cli::HttpAddr,
    elector: &Elector,
    election: &ElectionName,
    store: Arc<dyn leasehold::Store>,
    metrics: &Arc<RunnerMetrics>,
) -> anyhow::Result<Vec<std::net::SocketAddr>> {
    let leaders = elector.observe_last_known(election).await.ok();
    let now = {
        let metrics = Arc::clone(metrics);
        Arc::new(move || metrics.leadership_now())
    };
    let changes = Changes::new(metrics.changes(), leaders, now);
    let routes = crate::http::routes(election.clone(), store, Arc::clone(metrics), changes);
    crate::http::serve(addr, routes).await
}

/// Opens the session (timing the store's answer), states the lease it runs
/// with — the TTL the store granted and the renewal period in effect — as
/// `run`'s first log line, and warns when they leave too little margin for
/// that latency.
async fn check_margin(elector: &Elector, election: &ElectionName) {
    let config = elector.config();
    let id = elector.candidate();
    let sent = std::time::Instant::now();
    let session = match elector.session().await {
        Ok(session) => session,
        // The campaign reports (and retries) the failure itself.
        Err(_) => {
            let (ttl, every) = (to_millis(config.ttl), to_millis(config.renew_every));
            tracing::info!(%election, %id, %ttl, renew_every = %every,
                "lease: TTL {ttl}, renewing every {every} (the store has not answered yet)");
            return;
        }
    };
    let latency = sent.elapsed();
    let granted = session.granted_ttl();
    let effective = config.renew_period_for(granted);
    let (ttl, every) = (to_millis(granted), to_millis(effective));
    let (requested, configured) = (to_millis(config.ttl), to_millis(config.renew_every));
    // What the store changed, said whenever it changed anything.
    let less = match granted < config.ttl {
        true => format!(" (the store granted less than the {requested} asked for)"),
        false => String::new(),
    };
    if effective == config.renew_every {
        tracing::info!(%election, %id, %ttl, renew_every = %every, requested_ttl = %requested,
            "lease: TTL {ttl}{less}, renewing every {every}");
    } else {
        tracing::info!(%election, %id, %ttl, renew_every = %every,
            requested_ttl = %requested, configured_renew_every = %configured,
            "lease: TTL {ttl}{less}, renewing every {every} instead of {configured}: {}",
            leasehold::RENEWAL_RULE);
    }
    let conditions = leasehold::tune::Conditions {
        renew_every: effective,
        jitter: latency,
        skew: config.skew,
        drift: config.drift,
        store_expiry_check: Duration::ZERO,
    };
    let assessment = conditions.assess(granted);
    let latency_ms = latency.as_secs_f64() * 1e3;
    match assessment.verdict {
        leasehold::tune::Verdict::Tolerant => {
            tracing::debug!(%ttl, renew_every = %every, store_latency_ms = latency_ms,
                lost_renewals_absorbed = assessment.lost_renewals_absorbed, "lease margin");
        }
        leasehold::tune::Verdict::Fragile => {
            tracing::warn!(%ttl, renew_every = %every, store_latency_ms = latency_ms,
                "thin lease margin: with this TTL and renewal period one lost or slow renewal ends \
                 leadership (false failovers); see `leasehold tune --ttl {ttl} --renew-every {every} --measure 100`");
        }
        leasehold::tune::Verdict::Unsafe { reason } => {
            tracing::warn!(%ttl, renew_every = %every, store_latency_ms = latency_ms,
                "thin lease margin at the measured store latency: {reason}; see `leasehold tune`");
        }
    }
}

/// A duration rounded to whole milliseconds, as humantime prints it.
fn to_millis(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_millis(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    ))
}

impl Runner {
    async fn serve(&mut self) -> anyhow::Result<ExitCode> {
        loop {
            let Some((leadership, slot)) = self.campaign().await? else {
                return Ok(ExitCode::SUCCESS);
            };
            match self.lead(leadership, slot).await? {
                Next::Campaign => {}
                Next::Exit(code) => return Ok(code),
            }
        }
    }

    /// Campaigns until leader (`Some`) or told to stop (`None`), logging who
    /// leads meanwhile.
    async fn campaign(&mut self) -> anyhow::Result<Option<(Leadership, Option<u32>)>> {
        let observed = match self.slots {
            None => self
                .elector
                .observe_last_known(&self.election)
                .await
                .map(Some),
            Some(_) => Ok(None),
        };
        let follower_log = match observed {
            Ok(None) => None,
            Ok(Some(watch)) => Some(tokio::spawn(log_leaders(
                self.election.clone(),
                self.elector.candidate().clone(),
                watch,
            ))),
            Err(error) => {
                tracing::warn!(%error, "cannot observe the election");
                None
            }
        };
        tracing::info!(election = %self.election, id = %self.elector.candidate(), "campaigning");
        let outcome = loop {
            tokio::select! {
                outcome = campaign_once(&self.elector, &self.election, self.slots) => match outcome {
                    Ok(won) => break Ok(Some(won)),
                    Err(error) if error.is_transient() => {
                        tracing::warn!(%error, retry_in = ?RETRY_AFTER, "campaign failed; retrying");
                        tokio::select! {
                            () = tokio::time::sleep(RETRY_AFTER) => {}
                            signal = self.signals.next_stop() => {
                                tracing::info!(%signal, "stopping while waiting to lead");
                                break Ok(None);
                            }
                        }
                    }
                    Err(error) => {
                        // Worded as `--shards` words it: what could not be joined.
                        let what = match self.slots {
                            Some(k) => format!("cannot take one of {k} slots of {}", self.election),
                            None => format!("cannot campaign for {}", self.election),
                        };
                        break Err(anyhow::Error::new(error).context(what));
                    }
                },
                signal = self.signals.next_stop() => {
                    tracing::info!(%signal, "stopping while waiting to lead");
                    break Ok(None);
                }
            }
        };
        if let Some(task) = follower_log {
            task.abort();
        }
        outcome
    }

    /// Runs the command while `leadership` lasts.
    async fn lead(&mut self, leadership: Leadership, slot: Option<u32>) -> anyhow::Result<Next> {
        let token = leadership.token();
        let renew_every = self.elector.config().renew_every;
        if let Err(reason) = renewed_in_time(&leadership, self.grace, renew_every).await {
            tracing::warn!(election = %self.election, id = %self.elector.candidate(), token = token.0, %reason,
                "granted, but lost before a renewal was confirmed; the command was not started; campaigning again");
            release(leadership).await;
            return Ok(Next::Campaign);
        }
        let mut child = match self.start_command(&leadership, slot).await {
            Ok(child) => child,
            Err(next) => {
                release(leadership).await;
                return Ok(next);
            }
        };
        self.metrics
            .became_leader(token, Arc::clone(leadership.session()));
        tracing::info!(election = %self.election, id = %self.elector.candidate(), token = token.0, pgid = child.pgid, "leading; command started");
        // Returns once the command's whole tree is gone (the guard makes
        // sure of it), so the election is released only then.
        let (status, why) = self.supervise(&mut child, &leadership).await;
        let next = self
            .end_term(leadership, why, child::exit_code(status))
            .await;
        // The term is over: `run` released the grant or knows it lost it,
        // so the guard releases nothing.
        child.finish().await;
        Ok(next)
    }

    /// Starts the command under its guard, with the grant in its
    /// environment; what to do next if it cannot start (the caller
    /// releases the election).
    async fn start_command(
        &self,
        leadership: &Leadership,
        slot: Option<u32>,
    ) -> Result<Supervised, Next> {
        // The token belongs to the election held: with --slots, the slot's.
        let mut env = vec![
            ("LEASEHOLD_ELECTION", leadership.election().to_string()),
            ("LEASEHOLD_ID", self.elector.candidate().to_string()),
            ("LEASEHOLD_TOKEN", leadership.token().to_string()),
        ];
        if let (Some(slot), Some(slots)) = (slot, self.slots) {
            env.push(("LEASEHOLD_SLOT", slot.to_string()));
            env.push(("LEASEHOLD_SLOTS", slots.to_string()));
        }
        let launch = Launch {
            command: &self.command,
            env: &env,
            store: &self.store,
            grant: leadership.grant(),
            deadline: leadership.deadline(),
            // On SQLite, the descriptor this process's session locks are
            // on: held by the guard too, a SIGKILLed `run`'s session is
            // found dead only once the guard has killed the command's tree.
            session_locks: self.elector.store().session_lock_file(),
        };
        Supervised::start(launch).await.map_err(|error| {
            let program = self
                .command
                .first()
                .map(|p| p.to_string_lossy().into_owned());
            // Never a panic on a closed stderr: the election must still be
            // released.
            crate::say(&format!(
                "cannot run {}: {error:#}",
                leasehold::shortened(&program.unwrap_or_default())
            ));
            Next::Exit(ExitCode::from(EXIT_CANNOT_START))
        })
    }

    /// Ends a term the way it ended (`why`, the command's exit `code`):
    /// says so, releases or hands over the election, and says what comes
    /// next.
    async fn end_term(&self, leadership: Leadership, why: TermEnd, code: u8) -> Next {
        let (token, id) = (leadership.token(), self.elector.candidate().clone());
        let election = &self.election;
        match why {
            TermEnd::Lost(reason) => {
                self.metrics
                    .stepped_down(StepDown::from_lost(&reason), &reason.to_string());
                tracing::warn!(%election, %id, token = token.0, %reason, status = code, "stepped down; campaigning again");
                Next::Campaign
            }
            TermEnd::StoppedAndLost(signal, reason) => {
                self.metrics
                    .stepped_down(StepDown::from_lost(&reason), &reason.to_string());
                tracing::warn!(%election, %id, token = token.0, %signal, %reason, status = code,
                    "stopped; leadership was lost meanwhile, so there was nothing to release");
                Next::Exit(ExitCode::from(code))
            }
            TermEnd::AtRisk(reason) => {
                self.metrics.stepped_down(StepDown::AtRisk, reason);
                // Stepped down now; the release (which the failing store
                // may not answer before its timeout) comes after.
                tracing::warn!(%election, %id, token = token.0, reason, status = code, "stepped down; campaigning again");
                release(leadership).await;
                Next::Campaign
            }
            TermEnd::Stopped(signal) => {
                let reason = format!("{signal} received");
                self.metrics.stepped_down(StepDown::Stopped, &reason);
                self.release_at_exit(leadership, &reason, "stopped; ", code)
                    .await
            }
            TermEnd::HandedOver(handover) => self.hand_over(leadership, &handover, code).await,
            // Only a shard moves (`run --shards`); released as for a
            // handover all the same.
            TermEnd::Moved => {
                self.metrics.stepped_down(StepDown::HandedOver, "moved");
                release(leadership).await;
                Next::Campaign
            }
            TermEnd::Exited => {
                let reason = "command exited";
                self.metrics.stepped_down(StepDown::CommandExited, reason);
                self.release_at_exit(leadership, reason, "", code).await
            }
        }
    }

    /// Releases the election for `handover` once the command stopped with
    /// `code`, and waits in line again.
    async fn hand_over(&self, leadership: Leadership, handover: &Handover, code: u8) -> Next {
        let (token, id) = (leadership.token(), self.elector.candidate().clone());
        let election = &self.election;
        self.metrics
            .stepped_down(StepDown::HandedOver, "handed over");
        let to = handover
            .to
            .as_ref()
            .map_or_else(|| "the first to campaign".to_owned(), ToString::to_string);
        match leadership.resign().await {
            Ok(()) => {
                tracing::info!(%election, %id, token = token.0, %to, status = code, "handed over; waiting in line again");
            }
            Err(error) => {
                tracing::warn!(%election, %id, token = token.0, %to, %error, status = code,
                    "the command stopped for a handover, but the election was not released (the store expires it after the TTL); waiting in line again");
            }
        }
        Next::Campaign
    }

    /// Releases the election as `run` exits with the command's `code`
    /// (`reason`: why the term ended), saying whether it was released;
    /// `said` starts each message.
    async fn release_at_exit(
        &self,
        leadership: Leadership,
        reason: &str,
        said: &str,
        code: u8,
    ) -> Next {
        let (token, id) = (leadership.token(), self.elector.candidate().clone());
        let election = &self.election;
        match release(leadership).await {
            Released::Now => {
                tracing::info!(%election, %id, token = token.0, reason, status = code, "{said}election released");
            }
            Released::Already => {
                tracing::info!(%election, %id, token = token.0, reason, status = code,
                    "{said}the grant had already ended, so there was nothing to release");
            }
            Released::Not => {
                tracing::warn!(%election, %id, token = token.0, reason, status = code, "{said}the election was not released (the store expires it after the TTL)");
            }
        }
        Next::Exit(ExitCode::from(code))
    }

    /// Waits until the command's whole tree is gone (see
    /// [`crate::term::supervise`]), stopping it when leadership is lost or
    /// at risk, when `run` is told to stop, or when asked to hand over.
    async fn supervise(
        &mut self,
        child: &mut Supervised,
        leadership: &Leadership,
    ) -> (std::process::ExitStatus, TermEnd) {
        let term = crate::term::Term {
            election: &self.election,
            id: self.elector.candidate(),
            grace: self.grace,
            renew_every: self.elector.config().renew_every,
        };
        let mut requests = SingleRequests {
            signals: &mut self.signals.stop,
            passed: &mut self.signals.passed,
            ignored: &mut self.signals.ignored,
        };
        term.supervise(child, leadership, &mut requests).await
    }
}

/// What may ask a single election's command to stop: `run`'s own signals
/// and a handover request.
struct SingleRequests<'a> {
    signals: &'a mut StopSignals,
    passed: &'a mut PassedSignals,
    ignored: &'a mut IgnoredSignals,
}

impl crate::term::Requests for SingleRequests<'_> {
    async fn next(&mut self, leadership: &Leadership, stopping: bool) -> Request {
        loop {
            tokio::select! {
                signal = self.signals.recv() => return Request::Stop(signal),
                handover = leadership.handover_requested(), if !stopping => return Request::HandOver(handover),
                signal = self.passed.recv() => return Request::Pass(signal),
                signal = self.ignored.recv() => {
                    tracing::info!(%signal, "signal ignored");
                }
            }
        }
    }
}

/// Refuses, with `plain`, a group's own name (its replicas use it for
/// shards or slots), naming the flag that joins it. (A name of one of its
/// shards or slots is refused by the library's campaign and join.)
pub(crate) async fn refuse_a_group(
    store: &dyn leasehold::Store,
    election: &ElectionName,
    plain: bool,
) -> leasehold::Result<()> {
    // A store that keeps no notes has no groups; one that cannot be read
    // now is retried by the campaign.
    let kind_of = async |name: &ElectionName| {
        store
            .notes(name)
            .await
            .ok()
            .and_then(|notes| leasehold::admin::kind_of(&notes))
    };
    if plain && let Some(kind) = kind_of(election).await {
        let flag = match kind {
            leasehold::admin::GroupKind::Shards(n) => format!("--shards {n}"),
            leasehold::admin::GroupKind::Slots(n) => format!("--slots {n}"),
        };
        return Err(leasehold::Error::Conflict(format!(
            "{election} is a group of {kind}: run with {flag} to join it"
        )));
    }
    Ok(())
}

/// One campaign: for the election, or with `slots` for one of its slots
/// (which one, with the grant).
async fn campaign_once(
    elector: &Elector,
    election: &ElectionName,
    slots: Option<u32>,
) -> leasehold::Result<(Leadership, Option<u32>)> {
    match slots {
        None => elector.campaign(election).await.map(|l| (l, None)),
        Some(k) => {
            let slot = elector.campaign_slot(election, k).await?;
            tracing::info!(%election, slot = slot.index, slots = k, "holding a slot");
            Ok((slot.leadership, Some(slot.index)))
        }
    }
}

/// How a release went.
enum Released {
    Now,
    /// The grant had already ended: lost, expired, or taken by a successor.
    Already,
    /// The store did not answer or refused: it expires the grant.
    Not,
}

/// Releases the election.
async fn release(leadership: Leadership) -> Released {
    // Lost already (its deadline passed while `run` was stopped, say): the
    // resign sends nothing.
    let lost = leadership.lost_reason().is_some();
    match leadership.resign().await {
        Ok(()) if lost => Released::Already,
        Ok(()) => Released::Now,
        Err(error) if already_gone(&error) => {
            tracing::debug!(%error, "nothing to release: the grant had already ended");
            Released::Already
        }
        Err(error) => {
            tracing::warn!(%error, "could not release the election");
            Released::Not
        }
    }
}

/// Logs who leads while this runner waits: once per leader that is not this
/// candidate. An election without a leader is not a wait (the campaign is
/// granted at once), and a renewal is not a change.
async fn log_leaders(
    election: ElectionName,
    me: leasehold::CandidateId,
    mut watch: leasehold::LeaderWatch,
) {
    let mut logged: Option<leasehold::Leader> = None;
    loop {
        let current = watch.borrow_and_update().clone();
        if let Some(leader) = current.filter(|l| l.candidate != me)
            && logged.as_ref().is_none_or(|l| !l.same_grant(&leader))
        {
            tracing::info!(%election, id = %me, leader = %leader.candidate, token = leader.token.0, "waiting; election is led");
            logged = Some(leader);
        }
        if watch.changed().await.is_err() {
            return;
        }
    }
}

/// Keeps the metrics' count of waiting candidates up to date from the
/// line's notes; ends at once on a store that keeps none.
pub(crate) async fn count_waiting(
    store: Arc<dyn leasehold::Store>,
    election: ElectionName,
    metrics: Arc<RunnerMetrics>,
) {
    let mut notes = loop {
        match store.watch_notes(&election).await {
            Ok(notes) => break notes,
            Err(leasehold::Error::Unsupported(_)) => return,
            Err(error) => {
                tracing::debug!(%election, %error, "cannot watch the line; retrying");
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    };
    loop {
        let waiting = leasehold::admin::standbys(&notes.borrow_and_update()).len();
        metrics.set_waiting(waiting);
        if notes.changed().await.is_err() {
            return;
        }
    }
}
