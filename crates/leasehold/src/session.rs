//! A session: one lease in the store, renewed in the background, shared by
//! every election the process takes part in.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::clock::{Clock, Instant};
use crate::config::{LeaseConfig, humanize};
use crate::error::{Error, Result};
use crate::lease::{DeadlinePolicy, LeaseAction, LeaseEvent, LeaseState, LostReason, NoValidity};
use crate::mutex::lock;
use crate::names::ElectionName;
use crate::store::{FencingToken, Grant, SessionId, SessionLease, Store};

/// What happened to one renewal, reported to a [`RenewalObserver`].
#[derive(Debug)]
#[non_exhaustive]
pub enum RenewalEvent<'a> {
    /// The store confirmed the renewal.
    Renewed {
        /// From sending the request to its reply.
        round_trip: Duration,
        /// The TTL the store granted.
        granted_ttl: Duration,
    },
    /// The renewal failed; it is retried until the deadline.
    Failed {
        /// From sending the request to the failure.
        after: Duration,
        /// What failed.
        error: &'a Error,
    },
}

/// Called by the renewal task after every renewal (metrics, logs). It runs
/// on the renewal task, so it must be quick and must not block.
#[derive(Clone)]
pub struct RenewalObserver(Arc<dyn Fn(&RenewalEvent<'_>) + Send + Sync>);

impl RenewalObserver {
    /// Wraps `f`.
    pub fn new(f: impl Fn(&RenewalEvent<'_>) + Send + Sync + 'static) -> Self {
        RenewalObserver(Arc::new(f))
    }

    fn notify(&self, event: &RenewalEvent<'_>) {
        (self.0)(event);
    }
}

impl std::fmt::Debug for RenewalObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RenewalObserver")
    }
}

/// What a session publishes to the holders of its grants.
#[derive(Clone, Debug)]
pub(crate) struct SessionState {
    /// Until when the lease is known valid (DESIGN rule 3).
    pub(crate) deadline: Instant,
    /// Set once the session has ended; it never comes back.
    pub(crate) ended: Option<LostReason>,
}

/// A grant's own signal: set once when its leadership ends.
pub(crate) type GrantSignal = watch::Receiver<Option<LostReason>>;

/// The sending side of every grant's signal, by election and token.
type GrantSignals = BTreeMap<(ElectionName, FencingToken), watch::Sender<Option<LostReason>>>;

/// The lease core and the signals it drives, shared by the renewal task
/// and the holders of the session's grants.
#[derive(Debug)]
struct Shared {
    core: Mutex<LeaseState>,
    clock: Arc<dyn Clock>,
    id: SessionId,
    state: watch::Sender<SessionState>,
    /// Each grant's step-down signal, by election and token.
    grants: Mutex<GrantSignals>,
    /// What the core asked of the renewal task (send a renewal, give one
    /// up, close the session) in answer to another caller's event: the
    /// core looks at the time at every event, so a grant taken just as a
    /// renewal falls due asks for that renewal. `kick` wakes the task to
    /// take them; were they dropped, no renewal would go out until the
    /// deadline ended the session.
    for_renewer: Mutex<Vec<LeaseAction>>,
    kick: tokio::sync::Notify,
}

impl Shared {
    /// Feeds `event` to the core at the clock's now, publishes what it
    /// decided (deadline, end, step-downs) and returns that instant and the
    /// actions left for the caller (those that need the store or a timer).
    fn apply(&self, event: LeaseEvent) -> (Instant, Vec<LeaseAction>) {
        self.apply_at(self.clock.now(), event)
    }

    /// [`Shared::apply`] at `now`.
    fn apply_at(&self, now: Instant, event: LeaseEvent) -> (Instant, Vec<LeaseAction>) {
        self.apply_as(now, event, false)
    }

    /// [`Shared::apply_at`] for the renewal task itself, which gets every
    /// action left, its own included.
    fn apply_by_renewer(&self, now: Instant, event: LeaseEvent) -> Vec<LeaseAction> {
        self.apply_as(now, event, true).1
    }

    fn apply_as(
        &self,
        now: Instant,
        event: LeaseEvent,
        by_renewer: bool,
    ) -> (Instant, Vec<LeaseAction>) {
        let mut core = lock(&self.core);
        let actions = core.handle(now.into_std(), event);
        let deadline = Instant::from_std(core.deadline());
        let ended = core.ended().cloned();
        self.state.send_if_modified(|s| {
            let changed = s.deadline != deadline || s.ended != ended;
            s.deadline = deadline;
            s.ended.clone_from(&ended);
            changed
        });
        let mut left = Vec::new();
        for action in actions {
            match action {
                LeaseAction::StepDown {
                    election,
                    token,
                    reason,
                } => {
                    if let Some(signal) = lock(&self.grants).get(&(election, token)) {
                        signal.send_replace(Some(reason));
                    }
                }
                LeaseAction::SessionLost(reason) => self.log_end(&reason),
                LeaseAction::Release { election, token } => {
                    lock(&self.grants).remove(&(election.clone(), token));
                    left.push(LeaseAction::Release { election, token });
                }
                LeaseAction::Deadline(_) | LeaseAction::WakeAt(_) => {}
                action @ (LeaseAction::Renew
                | LeaseAction::RenewalAbandoned { .. }
                | LeaseAction::CloseSession)
                    if !by_renewer =>
                {
                    lock(&self.for_renewer).push(action);
                    // A permit if the task is not waiting: never lost.
                    self.kick.notify_one();
                }
                other => left.push(other),
            }
        }
        (now, left)
    }

    fn log_end(&self, reason: &LostReason) {
        match reason {
            LostReason::DeadlineExpired { .. } => {
                tracing::warn!(session = %self.id, "lease deadline passed without a confirmed renewal");
            }
            LostReason::SessionExpired => {
                tracing::warn!(session = %self.id, "the store reports the session ended");
            }
            _ => tracing::debug!(session = %self.id, %reason, "session over"),
        }
    }
}

/// A live lease in the store, renewed in the background until it is closed,
/// dropped, or lost.
#[derive(Debug)]
pub struct Session {
    lease: SessionLease,
    shared: Arc<Shared>,
    state: watch::Receiver<SessionState>,
    stop: CancellationToken,
    _stop_on_drop: DropGuard,
    store: Arc<dyn Store>,
}

/// A granted TTL that leaves no validity once `config`'s drift and skew
/// are taken off.
fn no_validity(config: &LeaseConfig, granted: Duration) -> Error {
    Error::invalid(
        "lease configuration",
        format!(
            "the store granted a TTL of {}, which leaves no validity after drift {} and skew {}",
            humanize(granted),
            config.drift,
            humanize(config.skew)
        ),
    )
}

impl Session {
    /// Opens a session and starts renewing it.
    pub async fn open(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: LeaseConfig,
    ) -> Result<Self> {
        Session::open_with(store, clock, config, DeadlinePolicy::Conservative, None).await
    }

    pub(crate) async fn open_with(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: LeaseConfig,
        policy: DeadlinePolicy,
        observer: Option<RenewalObserver>,
    ) -> Result<Self> {
        config.validate()?;
        let sent = clock.now();
        let lease = store.open_session(config.ttl).await?;
        let replied = clock.now();
        let opened = LeaseState::open_with(
            config,
            policy,
            sent.into_std(),
            replied.into_std(),
            lease.ttl,
        );
        let core = match opened {
            Ok(core) => core,
            Err(NoValidity) => {
                // Best effort: the session is useless, let it go at once.
                let _ = store.close_session(lease.id).await;
                return Err(no_validity(&config, lease.ttl));
            }
        };
        if lease.ttl != config.ttl {
            // Debug: the runner's first line states the TTL in use and why.
            tracing::debug!(
                requested = %humanize(config.ttl),
                granted = %humanize(lease.ttl),
                session = %lease.id,
                "the store granted a different TTL; using the granted one"
            );
        }
        Ok(Session::start(lease, core, clock, store, observer))
    }

    /// The session `lease`, with its lease core, renewed from now on.
    fn start(
        lease: SessionLease,
        core: LeaseState,
        clock: Arc<dyn Clock>,
        store: Arc<dyn Store>,
        observer: Option<RenewalObserver>,
    ) -> Session {
        let (state, rx) = watch::channel(SessionState {
            deadline: Instant::from_std(core.deadline()),
            ended: None,
        });
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            clock,
            id: lease.id,
            state,
            grants: Mutex::new(BTreeMap::new()),
            for_renewer: Mutex::new(Vec::new()),
            kick: tokio::sync::Notify::new(),
        });
        let stop = CancellationToken::new();
        let renewer = Renewer {
            shared: Arc::clone(&shared),
            store: Arc::clone(&store),
            stop: stop.clone(),
            observer,
        };
        tokio::spawn(renewer.run());
        Session {
            lease,
            shared,
            state: rx,
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
            store,
        }
    }

    /// The session's id in the store.
    pub fn id(&self) -> SessionId {
        self.lease.id
    }

    /// The TTL the store granted when the session was opened.
    pub fn granted_ttl(&self) -> Duration {
        self.lease.ttl
    }

    /// Until when the lease is known valid.
    pub fn deadline(&self) -> Instant {
        self.state.borrow().deadline
    }

    /// Why the session ended, if it has.
    pub fn ended(&self) -> Option<LostReason> {
        self.state.borrow().ended.clone()
    }

    /// Why the session is over now, if it is: ended, or past its deadline
    /// by this process's clock (exact at the deadline, whatever the
    /// scheduling of the renewal task).
    pub(crate) fn over_now(&self) -> Option<LostReason> {
        let now = self.shared.clock.now().into_std();
        lock(&self.shared.core).over_at(now)
    }

    /// Completes at `deadline` on the session's clock.
    pub(crate) fn sleep_until(
        &self,
        deadline: Instant,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.shared.clock.sleep_until(deadline)
    }

    /// Completes after `duration` on the session's clock.
    pub(crate) fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.shared.clock.sleep(duration)
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<SessionState> {
        self.state.clone()
    }

    /// Resolves when the session ends, with the reason.
    pub async fn lost(&self) -> LostReason {
        let mut rx = self.state.clone();
        match rx.wait_for(|s| s.ended.is_some()).await {
            Ok(state) => state.ended.clone().unwrap_or(LostReason::Closed),
            Err(_) => LostReason::Closed,
        }
    }

    /// Records that the store reported the session gone.
    pub(crate) fn mark_expired(&self) {
        self.shared.apply(LeaseEvent::SessionEnded);
    }

    /// Attaches `grant`, just won on this session; the signal fires once
    /// its leadership ends.
    pub(crate) fn hold(&self, grant: &Grant) -> GrantSignal {
        let (tx, rx) = watch::channel(None);
        lock(&self.shared.grants).insert((grant.election.clone(), grant.token), tx);
        self.shared.apply(LeaseEvent::GrantAcquired {
            election: grant.election.clone(),
            token: grant.token,
        });
        rx
    }

    /// Why leadership of `grant` (a grant on this session) is over now, if
    /// it is: ended, or past the conservative deadline by this session's
    /// clock. For a process that answers others about its leadership at
    /// the moment they ask, as `leasehold sidecar` does.
    pub fn grant_lost_now(&self, grant: &Grant) -> Option<LostReason> {
        self.grant_lost_at(grant, self.shared.clock.now())
    }

    /// Why leadership of `grant` is over at `at`, if it is.
    pub(crate) fn grant_lost_at(&self, grant: &Grant, at: Instant) -> Option<LostReason> {
        lock(&self.shared.core).lost_at(&grant.election, grant.token, at.into_std())
    }

    /// Why leadership of `grant` on this session ended, if it did (for
    /// a grant already let go, what its release said).
    pub fn lost_reason_of(&self, grant: &Grant) -> Option<LostReason> {
        self.grant_lost_now(grant)
    }

    /// The session's clock's now.
    pub(crate) fn now(&self) -> Instant {
        self.shared.clock.now()
    }

    /// The store shows `grant` gone or superseded (`vanished`), or the
    /// protected resource refused its token as stale; `true` if this ended
    /// its leadership.
    pub(crate) fn supersede(&self, grant: &Grant, vanished: bool) -> bool {
        let (election, token) = (grant.election.clone(), grant.token);
        let event = if vanished {
            LeaseEvent::GrantVanished { election, token }
        } else {
            LeaseEvent::Superseded { election, token }
        };
        let was_leading = self.grant_lost_now(grant).is_none();
        self.shared.apply(event);
        was_leading && self.grant_lost_now(grant).is_some()
    }

    /// Ends leadership of `grant` locally (its signal fires first); `true`
    /// if the grant is to be released in the store (it was still attached).
    pub(crate) fn let_go(&self, grant: &Grant) -> bool {
        self.release(LeaseEvent::Resign {
            election: grant.election.clone(),
            token: grant.token,
        })
    }

    /// As [`Session::let_go`], to hand the election over on request
    /// ([`LostReason::HandedOver`]).
    pub(crate) fn hand_over(&self, grant: &Grant) -> bool {
        self.release(LeaseEvent::HandOver {
            election: grant.election.clone(),
            token: grant.token,
        })
    }

    fn release(&self, event: LeaseEvent) -> bool {
        let (_, actions) = self.shared.apply(event);
        actions
            .iter()
            .any(|a| matches!(a, LeaseAction::Release { .. }))
    }

    /// Stops renewing and closes the session in the store, releasing every
    /// grant attached to it at once.
    pub async fn close(&self) -> Result<()> {
        self.shared.apply(LeaseEvent::Close);
        self.stop.cancel();
        self.store.close_session(self.lease.id).await
    }
}

/// The renewal task: the shell that sends renewals and wakes the core.
struct Renewer {
    shared: Arc<Shared>,
    store: Arc<dyn Store>,
    stop: CancellationToken,
    observer: Option<RenewalObserver>,
}

/// A renewal in flight: when it was sent, and its outcome to come.
type InFlight = (
    Instant,
    Pin<Box<dyn Future<Output = Result<Duration>> + Send>>,
);

impl Renewer {
    /// Renews as the core asks until the session is over.
    async fn run(self) {
        let id = self.shared.id;
        let mut in_flight: Option<InFlight> = None;
        let mut actions = self
            .shared
            .apply_by_renewer(self.shared.clock.now(), LeaseEvent::Tick);
        loop {
            if self.execute(actions, &mut in_flight).await {
                return;
            }
            let Some(wake) = lock(&self.shared.core).next_wake() else {
                return;
            };
            let wake = Instant::from_std(wake);
            actions = tokio::select! {
                biased;
                () = self.stop.cancelled() => return,
                () = self.store.session_ended(id) => {
                    self.shared.apply_by_renewer(self.shared.clock.now(), LeaseEvent::SessionEnded)
                }
                () = self.shared.kick.notified() => std::mem::take(&mut *lock(&self.shared.for_renewer)),
                outcome = async {
                    match in_flight.as_mut() {
                        Some((_, renewal)) => renewal.await,
                        None => std::future::pending().await,
                    }
                } => match in_flight.take() {
                    Some((sent, _)) => self.outcome(sent, outcome),
                    None => Vec::new(),
                },
                () = self.shared.clock.sleep_until(wake) => {
                    // At `wake` at least: a clock that wakes its sleepers a
                    // hair early (rounding) must not make the core see an
                    // instant before the one it asked for, again and again.
                    let now = self.shared.clock.now().max(wake);
                    self.shared.apply_by_renewer(now, LeaseEvent::Tick)
                }
            };
        }
    }

    /// Reports a renewal's outcome to the core, then to the observer: an
    /// observer that reads the session's deadline sees the renewed one.
    fn outcome(&self, sent: Instant, outcome: Result<Duration>) -> Vec<LeaseAction> {
        let id = self.shared.id;
        let elapsed = self.shared.clock.now().saturating_duration_since(sent);
        let event = match &outcome {
            Ok(granted_ttl) => LeaseEvent::RenewalConfirmed {
                sent: sent.into_std(),
                granted_ttl: *granted_ttl,
            },
            Err(Error::SessionExpired(_)) => LeaseEvent::SessionEnded,
            Err(error) => {
                tracing::warn!(session = %id, %error, "renewal failed; retrying until the deadline");
                LeaseEvent::RenewalFailed {
                    error: error.to_string(),
                }
            }
        };
        let actions = self.shared.apply_by_renewer(self.shared.clock.now(), event);
        if let Some(observer) = &self.observer {
            observer.notify(&match &outcome {
                Ok(granted) => RenewalEvent::Renewed {
                    round_trip: elapsed,
                    granted_ttl: *granted,
                },
                Err(error) => RenewalEvent::Failed {
                    after: elapsed,
                    error,
                },
            });
        }
        actions
    }

    /// Does what the core asked; `true` once the session is over.
    async fn execute(&self, actions: Vec<LeaseAction>, in_flight: &mut Option<InFlight>) -> bool {
        let id = self.shared.id;
        for action in actions {
            match action {
                LeaseAction::Renew => {
                    let store = Arc::clone(&self.store);
                    let sent = self.shared.clock.now();
                    *in_flight = Some((sent, Box::pin(async move { store.keep_alive(id).await })));
                }
                LeaseAction::RenewalAbandoned { sent } => {
                    in_flight.take();
                    if let Some(observer) = &self.observer {
                        let after = self
                            .shared
                            .clock
                            .now()
                            .saturating_duration_since(Instant::from_std(sent));
                        observer.notify(&RenewalEvent::Failed {
                            after,
                            error: &Error::Timeout(after),
                        });
                    }
                }
                LeaseAction::CloseSession => {
                    // The holders have stepped down; closing frees the
                    // grants for the next candidate sooner than the store's
                    // expiry would. Best effort.
                    if let Err(error) = self.store.close_session(id).await {
                        tracing::debug!(session = %id, %error, "could not close the lost session");
                    }
                    return true;
                }
                _ => {}
            }
        }
        lock(&self.shared.core).ended().is_some()
    }
}
