//! `leasehold run`: campaign; while leader, supervise the command.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use leasehold::{ElectionName, Elector, Leadership, LostReason};
use nix::sys::signal::Signal;
use tokio::time::{Instant, sleep_until};

use crate::child;
use crate::cli::RunArgs;
use crate::guard::{Ended, GUARD_WAKE, Launch, Supervised};
use crate::metrics::{RunnerMetrics, StepDown};
use crate::signals::{IgnoredSignals, PassedSignals, StopSignals, forwarded_as};

/// Exit status when the command could not be started.
const EXIT_CANNOT_START: u8 = 127;
/// Pause before campaigning again after a transient store error.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// What to do after a term of leadership.
enum Next {
    Campaign,
    Exit(ExitCode),
}

struct Runner {
    elector: Elector,
    election: ElectionName,
    command: Vec<OsString>,
    grace: Duration,
    signals: StopSignals,
    passed: PassedSignals,
    ignored: IgnoredSignals,
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
    let store = args.election.store.open().await?;
    let candidate = args.election.candidate();
    let metrics = RunnerMetrics::new(args.election.election.as_str(), candidate.as_str());
    let config = args.election.lease_config();
    let mut elector = Elector::new(Arc::clone(&store), candidate, config)?
        .with_renewal_observer(metrics.renewal_observer())
        .with_priority(args.priority)
        .with_lock_delay(args.lock_delay);
    if let Some(settle) = args.preempt_after {
        elector = elector.with_preempt_after(settle);
    }
    let line_gauge = tokio::spawn(count_waiting(
        Arc::clone(&store),
        args.election.election.clone(),
        Arc::clone(&metrics),
    ));
    let serving = match &args.http {
        Some(addr) => Some(
            crate::http::serve(
                addr,
                args.election.election.clone(),
                store,
                Arc::clone(&metrics),
            )
            .await?,
        ),
        None => None,
    };
    check_margin(&elector, &args.election.election).await;
    if let Some(bound) = serving {
        let shown: Vec<String> = bound.iter().map(ToString::to_string).collect();
        tracing::info!(addr = %shown.join(", "), "serving /status, /healthz and /metrics");
    }
    let mut runner = Runner {
        elector,
        election: args.election.election.clone(),
        command: args.command,
        grace: args.grace,
        signals: StopSignals::install()?,
        passed: PassedSignals::install()?,
        ignored: IgnoredSignals::install()?,
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
    if effective == config.renew_every {
        tracing::info!(%election, %id, %ttl, renew_every = %every, "lease: TTL {ttl}, renewing every {every}");
    } else {
        let configured = to_millis(config.renew_every);
        tracing::info!(%election, %id, %ttl, renew_every = %every,
            requested_ttl = %to_millis(config.ttl), configured_renew_every = %configured,
            "lease: TTL {ttl} (the store granted less than the {} asked for), renewing every {every} \
             instead of {configured}: {}",
            to_millis(config.ttl), leasehold::RENEWAL_RULE);
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
            let Some(leadership) = self.campaign().await? else {
                return Ok(ExitCode::SUCCESS);
            };
            match self.lead(leadership).await? {
                Next::Campaign => {}
                Next::Exit(code) => return Ok(code),
            }
        }
    }

    /// Campaigns until leader (`Some`) or told to stop (`None`), logging who
    /// leads meanwhile.
    async fn campaign(&mut self) -> anyhow::Result<Option<Leadership>> {
        let follower_log = match self.elector.observe(&self.election).await {
            Ok(watch) => Some(tokio::spawn(log_leaders(
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
                outcome = self.elector.campaign(&self.election) => match outcome {
                    Ok(leadership) => break Ok(Some(leadership)),
                    Err(error) if error.is_transient() => {
                        tracing::warn!(%error, retry_in = ?RETRY_AFTER, "campaign failed; retrying");
                        tokio::select! {
                            () = tokio::time::sleep(RETRY_AFTER) => {}
                            signal = stop_requested(&mut self.signals, &mut self.passed, &mut self.ignored) => {
                                tracing::info!(%signal, "stopping while waiting to lead");
                                break Ok(None);
                            }
                        }
                    }
                    Err(error) => break Err(anyhow::Error::new(error).context("campaign failed")),
                },
                signal = stop_requested(&mut self.signals, &mut self.passed, &mut self.ignored) => {
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
    async fn lead(&mut self, leadership: Leadership) -> anyhow::Result<Next> {
        let token = leadership.token();
        let env = [
            ("LEASEHOLD_ELECTION", self.election.to_string()),
            ("LEASEHOLD_ID", self.elector.candidate().to_string()),
            ("LEASEHOLD_TOKEN", token.to_string()),
        ];
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
        let mut child = match Supervised::start(launch).await {
            Ok(child) => child,
            Err(error) => {
                let program = self
                    .command
                    .first()
                    .map(|p| p.to_string_lossy().into_owned());
                // Never a panic on a closed stderr: the election must
                // still be released below.
                crate::say(&format!(
                    "cannot run {}: {error:#}",
                    program.unwrap_or_default()
                ));
                if let Err(error) = leadership.resign().await {
                    tracing::warn!(%error, "could not release the election");
                }
                return Ok(Next::Exit(ExitCode::from(EXIT_CANNOT_START)));
            }
        };
        self.metrics
            .became_leader(token, Arc::clone(leadership.session()));
        tracing::info!(election = %self.election, id = %self.elector.candidate(), token = token.0, pgid = child.pgid, "leading; command started");
        // Returns once the command's whole tree is gone (the guard makes
        // sure of it), so the election is released only then.
        let (status, why) = self.supervise(&mut child, &leadership).await;
        let code = child::exit_code(status);
        let id = self.elector.candidate().clone();
        let election = &self.election;
        let next = match why {
            TermEnd::Lost(reason) => {
                self.metrics.stepped_down(StepDown::from_lost(&reason));
                tracing::warn!(%election, %id, token = token.0, %reason, status = code, "stepped down; campaigning again");
                Next::Campaign
            }
            TermEnd::AtRisk => {
                self.metrics.stepped_down(StepDown::AtRisk);
                // Stepped down now; the release (which the failing store
                // may not answer before its timeout) comes after.
                tracing::warn!(%election, %id, token = token.0, reason = "renewals failing; stopped before the lease deadline", status = code, "stepped down; campaigning again");
                release(leadership).await;
                Next::Campaign
            }
            TermEnd::Stopped(signal) => {
                self.metrics.stepped_down(StepDown::Stopped);
                let reason = format!("{signal} received");
                if release(leadership).await {
                    tracing::info!(%election, %id, token = token.0, %reason, status = code, "stopped; election released");
                } else {
                    tracing::warn!(%election, %id, token = token.0, %reason, status = code, "stopped; the election was not released (the store expires it after the TTL)");
                }
                Next::Exit(ExitCode::from(code))
            }
            TermEnd::HandedOver(handover) => {
                self.metrics.stepped_down(StepDown::HandedOver);
                let to = handover
                    .to
                    .as_ref()
                    .map_or_else(|| "the first to campaign".to_owned(), ToString::to_string);
                match leadership.hand_over().await {
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
            TermEnd::Exited => {
                self.metrics.stepped_down(StepDown::CommandExited);
                let reason = "command exited";
                if release(leadership).await {
                    tracing::info!(%election, %id, token = token.0, reason, status = code, "election released");
                } else {
                    tracing::warn!(%election, %id, token = token.0, reason, status = code, "the election was not released (the store expires it after the TTL)");
                }
                Next::Exit(ExitCode::from(code))
            }
        };
        // The term is over: `run` released the grant or knows it lost it,
        // so the guard releases nothing.
        child.finish().await;
        Ok(next)
    }

    /// Waits until the command's whole tree is gone, stopping it when
    /// leadership is lost or at risk, or when `run` is told to stop, and
    /// telling the guard every new lease deadline.
    async fn supervise(
        &mut self,
        child: &mut Supervised,
        leadership: &Leadership,
    ) -> (std::process::ExitStatus, TermEnd) {
        // When no renewal has been confirmed this long before the deadline,
        // the command is asked to stop so that it can exit cleanly before
        // the deadline's SIGKILL.
        let lead = self.grace.min(self.elector.config().renew_every);
        let mut why = TermEnd::Exited;
        let mut kill_at: Option<Instant> = None;
        let mut lost = false;
        let mut wake_guard = tokio::time::interval(GUARD_WAKE);
        loop {
            let deadline = leadership.deadline();
            let at_risk = deadline.checked_sub(lead).unwrap_or(deadline);
            let stopping = !matches!(why, TermEnd::Exited);
            tokio::select! {
                ended = child.wait() => {
                    return (ended.status, self.term_end(why, ended, leadership));
                }
                moved = leadership.deadline_after(deadline), if !lost => {
                    child.extend(moved).await;
                }
                reason = leadership.lost(), if !lost => {
                    lost = true;
                    tracing::warn!(election = %self.election, id = %self.elector.candidate(), token = leadership.token().0, %reason, "leadership lost; killing the command");
                    child.signal_group(Signal::SIGTERM).await;
                    child.signal_group(Signal::SIGKILL).await;
                    why = TermEnd::Lost(reason);
                }
                () = sleep_until(at_risk), if !stopping => {
                    if leadership.deadline() <= deadline {
                        tracing::warn!(election = %self.election, id = %self.elector.candidate(), token = leadership.token().0,
                            "no renewal confirmed; asking the command to stop before the lease deadline");
                        child.signal_group(Signal::SIGTERM).await;
                        kill_at = Some(deadline);
                        why = TermEnd::AtRisk;
                    }
                }
                () = sleep_until(kill_at.unwrap_or(deadline)), if kill_at.is_some() => {
                    tracing::warn!(pgid = child.pgid, "the command did not exit in time; SIGKILL");
                    child.signal_group(Signal::SIGKILL).await;
                    kill_at = None;
                }
                signal = self.signals.recv(), if !stopping => {
                    // SIGHUP and SIGPWR reach the command as SIGTERM
                    // (`forwarded_as`).
                    let sent = forwarded_as(signal);
                    tracing::info!(%signal, forwarded = %sent, grace = ?self.grace, "forwarding to the command");
                    child.signal_group(sent).await;
                    kill_at = Some((Instant::now() + self.grace).min(leadership.deadline()));
                    why = TermEnd::Stopped(signal);
                }
                handover = leadership.handover_requested(), if !stopping && !lost => {
                    let to = handover.to.as_ref().map_or_else(|| "the first to campaign".to_owned(), ToString::to_string);
                    tracing::info!(election = %self.election, id = %self.elector.candidate(), token = leadership.token().0,
                        cause = %handover.cause, %to, grace = ?self.grace, "handing over on request; stopping the command");
                    child.signal_group(Signal::SIGTERM).await;
                    kill_at = Some((Instant::now() + self.grace).min(leadership.deadline()));
                    why = TermEnd::HandedOver(handover);
                }
                signal = self.passed.recv() => {
                    tracing::info!(%signal, pgid = child.pgid, "passing to the command");
                    child.pass(signal).await;
                }
                signal = self.ignored.recv() => {
                    tracing::info!(%signal, "signal ignored");
                }
                _ = wake_guard.tick() => child.wake_guard(),
            }
        }
    }

    /// Why the term ended, now that the command has: a command that exits
    /// after leadership was lost (say, because the resource refused its
    /// token), or that the guard killed at the lease deadline, ends the term
    /// like a loss: the replica stays in the pool.
    fn term_end(&self, why: TermEnd, ended: Ended, leadership: &Leadership) -> TermEnd {
        if !matches!(why, TermEnd::Exited) {
            return why;
        }
        if let Some(reason) = leadership.lost_reason() {
            return TermEnd::Lost(reason);
        }
        if ended.at_deadline {
            // Still leader, yet the guard saw the deadline it knew pass:
            // the renewal was confirmed too late to tell it. Step down all
            // the same (release, campaign again): the command is gone.
            tracing::warn!(election = %self.election, id = %self.elector.candidate(), token = leadership.token().0,
                "the guard killed the command at the lease deadline: this runner did not tell it of a renewal in time");
            return TermEnd::AtRisk;
        }
        if ended.guard_lost {
            tracing::warn!(election = %self.election, id = %self.elector.candidate(), token = leadership.token().0,
                "the guard process was killed; the command's tree was killed with it");
        }
        why
    }
}

/// Waits for a signal that asks to stop. A signal meant for the command
/// (SIGUSR1, SIGUSR2, SIGALRM…) that arrives while none runs is logged and
/// dropped, never kept for the next command; so is one that is ignored.
async fn stop_requested(
    signals: &mut StopSignals,
    passed: &mut PassedSignals,
    ignored: &mut IgnoredSignals,
) -> Signal {
    loop {
        tokio::select! {
            signal = signals.recv() => return signal,
            signal = passed.recv() => {
                tracing::info!(%signal, "no command is running; signal ignored");
            }
            signal = ignored.recv() => {
                tracing::info!(%signal, "signal ignored");
            }
        }
    }
}

/// Why a term of leadership ended.
enum TermEnd {
    /// The command exited by itself.
    Exited,
    /// Leadership was lost; the command was killed.
    Lost(LostReason),
    /// Renewals were failing; the command was stopped before the deadline.
    AtRisk,
    /// `run` was told to stop by this signal; it was forwarded (SIGHUP and
    /// SIGPWR as SIGTERM).
    Stopped(Signal),
    /// Asked to hand over (a transfer, a higher priority): the command was
    /// stopped as for SIGTERM, then the election is handed over.
    HandedOver(leasehold::Handover),
}

/// Releases the election; whether it was released.
async fn release(leadership: Leadership) -> bool {
    match leadership.resign().await {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(%error, "could not release the election");
            false
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
async fn count_waiting(
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
        let waiting = leasehold::line::standbys(&notes.borrow_and_update()).len();
        metrics.set_waiting(waiting);
        if notes.changed().await.is_err() {
            return;
        }
    }
}
