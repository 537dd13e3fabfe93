//! `leasehold sidecar`: campaigns and holds leadership for an application
//! that runs beside it and is neither started nor stopped by it; the
//! application (and a load balancer) ask it over HTTP or its unix socket
//! whether this replica leads, and are told for how long the answer holds.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{ElectionName, Elector, Leadership};
use tokio::sync::mpsc;

use crate::cli::SidecarArgs;
use crate::metrics::{RunnerMetrics, StepDown};
use crate::signals::Handled;
use crate::watch::{Changes, LeadershipEvent};

mod answer;
mod endpoints;
mod hooks;
mod keeper;
mod shared;
mod socket;

use hooks::{Change, Fired, HookQueue, Hooks};
use shared::{Admin, AdminAccess, Local, Shared};

/// Pause before campaigning again after a transient store error.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The longest admin token file read.
const MAX_TOKEN_FILE: u64 = 4096;

pub async fn run(args: SidecarArgs) -> anyhow::Result<ExitCode> {
    let admin_token = check(&args)?;
    let store = args.election.open_store().await?;
    // Dropped last: it stops the keeper once everything is released.
    let _keeper = keeper::Keeper::start(&*store, args.election.lease_config().ttl)?;
    let election = args.election.election.clone();
    crate::run::refuse_a_group(&*store, &election, true).await?;
    let candidate = args.election.candidate();
    let metrics = RunnerMetrics::new(election.as_str(), candidate.as_str());
    let elector = elector(&args, &store, &metrics)?;
    let (admin_tx, admin_rx) = mpsc::channel(4);
    let leaders = elector.observe_last_known(&election).await.ok();
    let shared = Shared {
        election: election.clone(),
        me: candidate,
        store: Arc::clone(&store),
        local: Arc::new(Mutex::new(Local::default())),
        leader: leaders,
        line: line_of(&*store, &election).await?,
        admin: admin_tx,
    };
    let line_gauge = tokio::spawn(crate::run::count_waiting(
        Arc::clone(&store),
        election.clone(),
        Arc::clone(&metrics),
    ));
    let changes = Changes::new(
        metrics.changes(),
        shared.leader.clone(),
        answer_now(&shared),
    );
    let common = crate::http::routes(election.clone(), store, Arc::clone(&metrics), changes);
    let mut sidecar = Sidecar {
        elector,
        election,
        local: Arc::clone(&shared.local),
        hooks: HookQueue::start(Hooks {
            on_elected: args.on_elected.clone(),
            on_deposed: args.on_deposed.clone(),
            timeout: args.hook_timeout,
        }),
        inputs: Inputs {
            admin: admin_rx,
            signals: Handled::install()?,
        },
        metrics,
    };
    let _socket = listen(&args, &shared, &common, admin_token).await?;
    let code = sidecar.serve().await;
    if let Err(error) = sidecar.elector.close().await {
        tracing::warn!(%error, "could not close the session; the store will expire it after the TTL");
    }
    line_gauge.abort();
    sidecar.hooks.finish().await;
    code
}

/// The sidecar's elector, with its planned-move flags and its renewals
/// counted.
fn elector(
    args: &SidecarArgs,
    store: &Arc<dyn leasehold::Store>,
    metrics: &Arc<RunnerMetrics>,
) -> anyhow::Result<Elector> {
    let elector = Elector::new(
        Arc::clone(store),
        args.election.candidate(),
        args.election.lease_config(),
    )?
    .with_renewal_observer(metrics.renewal_observer());
    Ok(args.planned.apply(elector))
}

/// Refuses options that cannot work together; the admin token, if a file
/// gives one.
fn check(args: &SidecarArgs) -> anyhow::Result<Option<String>> {
    if args.http.is_none() && args.socket.is_none() {
        anyhow::bail!(leasehold::Error::InvalidInput {
            what: "options",
            reason: "give --http ADDR, --socket PATH or both: the sidecar answers there".into(),
        });
    }
    args.planned.check(&args.election.store)?;
    Ok(match &args.admin_token_file {
        Some(path) => Some(read_token(path)?),
        None => None,
    })
}

/// This replica's leadership as `/watch` first tells it: what `/leader`
/// would answer now.
fn answer_now(shared: &Shared) -> crate::watch::Now {
    let shared = shared.clone();
    Arc::new(move || {
        let answer = answer::leader(&shared.snapshot(), std::time::Instant::now()).body;
        LeadershipEvent {
            change: "state",
            leading: answer.leading,
            token: answer.token,
            valid_for_ms: answer.valid_for_ms,
            reason: None,
        }
    })
}

/// The line's notes, to tell when this replica is in it; `None` on a
/// layout that keeps none.
async fn line_of(
    store: &dyn leasehold::Store,
    election: &ElectionName,
) -> anyhow::Result<Option<leasehold::NoteWatch>> {
    match store.watch_notes(election).await {
        Ok(notes) => Ok(Some(notes)),
        Err(leasehold::Error::Unsupported(_)) => Ok(None),
        Err(error) => {
            Err(anyhow::Error::new(error).context(format!("cannot watch the line of {election}")))
        }
    }
}

/// Starts serving on `--http` and `--socket`; the socket, removed when
/// dropped.
async fn listen(
    args: &SidecarArgs,
    shared: &Shared,
    common: &axum::Router,
    admin_token: Option<String>,
) -> anyhow::Result<Option<socket::BoundSocket>> {
    let mut serving = Vec::new();
    if let Some(addr) = &args.http {
        let access = admin_token.map_or(AdminAccess::Refused, AdminAccess::Token);
        let app = endpoints::routes(shared.clone(), common.clone(), access);
        let bound = crate::http::serve(addr, app).await?;
        serving.extend(bound.iter().map(ToString::to_string));
    }
    let socket = match &args.socket {
        Some(path) => {
            let (listener, bound) = socket::bind(path)?;
            let app = endpoints::routes(shared.clone(), common.clone(), AdminAccess::Open);
            tokio::spawn(async move {
                if let Err(error) = axum::serve(crate::capped::Capped::new(listener), app).await {
                    tracing::error!(%error, "the socket's server stopped");
                }
            });
            serving.push(path.display().to_string());
            Some(bound)
        }
        None => None,
    };
    tracing::info!(at = %serving.join(", "), "serving /leader, /follower, /health, /watch, /status, /healthz, /metrics and the page on /, and the admin calls where allowed");
    Ok(socket)
}

/// The admin token: the file's one line.
/// A file that cannot be read or holds no usable token is bad input (exit
/// 2), as a store's password file is.
fn read_token(path: &PathBuf) -> anyhow::Result<String> {
    use std::io::Read;
    let shown = path.display();
    let refuse = |reason: String| leasehold::Error::InvalidInput {
        what: "admin token file",
        reason,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TOKEN_FILE).read_to_string(&mut text))
        .map_err(|error| refuse(format!("cannot read --admin-token-file {shown}: {error}")))?;
    let token = text.strip_suffix('\n').unwrap_or(&text);
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata(path).is_ok_and(|m| m.mode() & 0o077 != 0) {
        tracing::warn!(file = %shown, "--admin-token-file can be read by other users; make it mode 0600");
    }
    if token.len() < 16 || token.contains(char::is_whitespace) {
        return Err(refuse(format!(
            "--admin-token-file {shown} must hold one token of at least 16 characters, without spaces"
        ))
        .into());
    }
    Ok(token.to_owned())
}

struct Sidecar {
    elector: Elector,
    election: ElectionName,
    local: Arc<Mutex<Local>>,
    hooks: HookQueue,
    inputs: Inputs,
    metrics: Arc<RunnerMetrics>,
}

/// What may end a campaign or a term: signals and admin calls.
struct Inputs {
    admin: mpsc::Receiver<Admin>,
    signals: Handled,
}

/// Why a term of leadership ended.
enum TermEnd {
    Lost(leasehold::LostReason),
    HandOver,
    Resign(tokio::sync::oneshot::Sender<Result<String, String>>),
    Stopped(nix::sys::signal::Signal),
}

impl Sidecar {
    fn local(&self) -> std::sync::MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn serve(&mut self) -> anyhow::Result<ExitCode> {
        loop {
            let Some(leadership) = self.campaign().await? else {
                return Ok(ExitCode::SUCCESS);
            };
            if !self.lead(leadership).await {
                return Ok(ExitCode::SUCCESS);
            }
        }
    }

    /// Campaigns until leader (`Some`) or told to stop (`None`).
    async fn campaign(&mut self) -> anyhow::Result<Option<Leadership>> {
        tracing::info!(election = %self.election, id = %self.elector.candidate(), "campaigning");
        loop {
            if let Ok(session) = self.elector.session().await {
                self.local().session = Some(session.id().0);
            }
            self.local().waiting = true;
            let outcome = tokio::select! {
                outcome = self.elector.campaign(&self.election) => outcome,
                signal = self.inputs.stop_requested(&self.election) => {
                    tracing::info!(%signal, "stopping while waiting to lead");
                    self.local().waiting = false;
                    return Ok(None);
                }
            };
            self.local().waiting = false;
            match outcome {
                Ok(leadership) => return Ok(Some(leadership)),
                Err(error) if error.is_transient() => {
                    tracing::warn!(%error, retry_in = ?RETRY_AFTER, "campaign failed; retrying");
                    tokio::time::sleep(RETRY_AFTER).await;
                }
                Err(error) => {
                    return Err(anyhow::Error::new(error)
                        .context(format!("cannot campaign for {}", self.election)));
                }
            }
        }
    }

    /// Holds `leadership` until it ends; whether to campaign again.
    async fn lead(&mut self, leadership: Leadership) -> bool {
        let token = leadership.token();
        let id = self.elector.candidate().clone();
        self.local().held = Some((Arc::clone(leadership.session()), leadership.grant().clone()));
        self.metrics
            .became_leader(token, Arc::clone(leadership.session()));
        tracing::info!(election = %self.election, %id, token = token.0, "leading");
        self.fire(Change::Elected, token.0, None);
        let end = self.inputs.hold(&leadership).await;
        // From here on /leader answers 503, before anything is released.
        self.local().held = None;
        let (reason, again) = match end {
            TermEnd::Lost(reason) => {
                self.metrics
                    .stepped_down(StepDown::from_lost(&reason), &reason.to_string());
                tracing::warn!(election = %self.election, %id, token = token.0, %reason, "stepped down; campaigning again");
                (reason.to_string(), true)
            }
            TermEnd::HandOver => {
                self.metrics
                    .stepped_down(StepDown::HandedOver, "handed over");
                let done = leadership.resign().await;
                log_release(&self.election, token.0, "handed over", done.as_ref().err());
                ("handed over".to_owned(), true)
            }
            TermEnd::Resign(reply) => {
                self.metrics.stepped_down(StepDown::HandedOver, "resigned");
                let done = leadership.resign().await;
                log_release(&self.election, token.0, "resigned", done.as_ref().err());
                let _ = reply.send(
                    done.map(|()| "resigned; waiting in line again".to_owned())
                        .map_err(|e| e.to_string()),
                );
                ("resigned".to_owned(), true)
            }
            TermEnd::Stopped(signal) => {
                self.metrics
                    .stepped_down(StepDown::Stopped, &format!("{signal} received"));
                let done = leadership.resign().await;
                log_release(
                    &self.election,
                    token.0,
                    &format!("{signal} received"),
                    done.as_ref().err(),
                );
                (format!("{signal} received"), false)
            }
        };
        self.fire(Change::Deposed, token.0, Some(reason));
        again
    }

    fn fire(&self, change: Change, token: u64, reason: Option<String>) {
        self.hooks.fire(Fired {
            change,
            election: self.election.to_string(),
            id: self.elector.candidate().to_string(),
            token,
            reason,
        });
    }
}

impl Inputs {
    /// Waits for the end of a term, calling `renewed` at each renewal.
    async fn hold(&mut self, leadership: &Leadership) -> TermEnd {
        loop {
            tokio::select! {
                reason = leadership.lost() => return TermEnd::Lost(reason),
                _ = leadership.handover_requested() => return TermEnd::HandOver,
                signal = self.signals.stop.recv() => return TermEnd::Stopped(signal),
                Some(call) = self.admin.recv() => match call {
                    Admin::Resign(reply) => return TermEnd::Resign(reply),
                },
                signal = self.signals.passed.recv() => tracing::info!(%signal, "signal ignored"),
                signal = self.signals.ignored.recv() => tracing::info!(%signal, "signal ignored"),
            }
        }
    }

    /// The next signal that asks to stop; an admin call while not leading
    /// is answered here.
    async fn stop_requested(&mut self, election: &ElectionName) -> nix::sys::signal::Signal {
        loop {
            tokio::select! {
                signal = self.signals.stop.recv() => return signal,
                Some(call) = self.admin.recv() => match call {
                    Admin::Resign(reply) => {
                        let _ = reply.send(Err(format!("this replica does not lead {election}")));
                    }
                },
                signal = self.signals.passed.recv() => tracing::info!(%signal, "signal ignored"),
                signal = self.signals.ignored.recv() => tracing::info!(%signal, "signal ignored"),
            }
        }
    }
}

fn log_release(
    election: &ElectionName,
    token: u64,
    reason: &str,
    error: Option<&leasehold::Error>,
) {
    match error {
        None => tracing::info!(%election, token, reason, "election released"),
        Some(error) => tracing::warn!(%election, token, reason, %error,
            "the election was not released (the store expires it after the TTL)"),
    }
}
