//! A session: one lease in the store, renewed in the background, shared by
//! every election the process takes part in.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::clock::{Clock, Instant};
use crate::config::{LeaseConfig, humanize};
use crate::error::{Error, Result};
use crate::store::{SessionId, SessionLease, Store};

/// Why leadership (or the session under it) ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// No renewal was confirmed before the conservative deadline.
    DeadlineExpired {
        /// The last renewal error, if renewals failed (rather than hung).
        last_error: Option<String>,
    },
    /// The store reported the session expired or closed.
    SessionExpired,
    /// The store shows another grant (or none) for the election.
    Superseded,
    /// The holder resigned.
    Resigned,
    /// The session was closed by this process.
    Closed,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LostReason::DeadlineExpired {
                last_error: Some(e),
            } => {
                write!(
                    f,
                    "lease deadline passed without a confirmed renewal (last error: {e})"
                )
            }
            LostReason::DeadlineExpired { last_error: None } => {
                f.write_str("lease deadline passed without a confirmed renewal")
            }
            LostReason::SessionExpired => f.write_str("the store expired the session"),
            LostReason::Superseded => f.write_str("the store shows the grant gone or superseded"),
            LostReason::Resigned => f.write_str("resigned"),
            LostReason::Closed => f.write_str("session closed"),
        }
    }
}

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

/// What the renewal task publishes.
#[derive(Clone, Debug)]
pub(crate) struct SessionState {
    /// Until when the lease is known valid (DESIGN rule 3).
    pub(crate) deadline: Instant,
    /// Set once the session has ended; it never comes back.
    pub(crate) ended: Option<LostReason>,
    /// Why the last renewal failed, while renewals are failing.
    pub(crate) last_error: Option<String>,
}

impl SessionState {
    /// Why the session is over at `now`, if it is: ended, or past its
    /// deadline (even if the renewal task has not run yet).
    pub(crate) fn over_at(&self, now: Instant) -> Option<LostReason> {
        if let Some(reason) = &self.ended {
            return Some(reason.clone());
        }
        (now >= self.deadline).then(|| LostReason::DeadlineExpired {
            last_error: self.last_error.clone(),
        })
    }
}

/// How the holder's deadline is computed. Only the conservative rule is
/// safe; the other exists so that the simulation can show its checkers
/// catch a broken deadline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum DeadlinePolicy {
    /// `sent + ttl·(1 − drift) − skew` (DESIGN rule 3).
    #[default]
    Conservative,
    /// `reply received + ttl`: wrong on purpose, for tests only.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    FromReplyUnsafe,
}

impl DeadlinePolicy {
    fn deadline(
        self,
        config: &LeaseConfig,
        sent: Instant,
        replied: Instant,
        ttl: Duration,
    ) -> Option<Instant> {
        match self {
            DeadlinePolicy::Conservative => config.deadline(sent, ttl),
            DeadlinePolicy::FromReplyUnsafe => Some(replied + ttl),
        }
    }
}

/// A live lease in the store, renewed in the background until it is closed,
/// dropped, or lost.
#[derive(Debug)]
pub struct Session {
    lease: SessionLease,
    state: watch::Receiver<SessionState>,
    publish: Arc<watch::Sender<SessionState>>,
    stop: CancellationToken,
    _stop_on_drop: DropGuard,
    store: Arc<dyn Store>,
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
        let Some(deadline) = policy.deadline(&config, sent, clock.now(), lease.ttl) else {
            // Best effort: the session is useless, let it go at once.
            let _ = store.close_session(lease.id).await;
            return Err(Error::invalid(
                "lease configuration",
                format!(
                    "the store granted a TTL of {}, which leaves no validity after drift {} and skew {}",
                    humanize(lease.ttl),
                    config.drift,
                    humanize(config.skew)
                ),
            ));
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
        let (tx, rx) = watch::channel(SessionState {
            deadline,
            ended: None,
            last_error: None,
        });
        let publish = Arc::new(tx);
        let stop = CancellationToken::new();
        let renewer = Renewer {
            store: Arc::clone(&store),
            clock,
            config,
            id: lease.id,
            renew_every: config.renew_period_for(lease.ttl),
            publish: Arc::clone(&publish),
            stop: stop.clone(),
            policy,
            observer,
        };
        tokio::spawn(renewer.run(sent, deadline));
        Ok(Session {
            lease,
            state: rx,
            publish,
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
            store,
        })
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

    pub(crate) fn state(&self) -> SessionState {
        self.state.borrow().clone()
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
        end(&self.publish, LostReason::SessionExpired);
    }

    /// Stops renewing and closes the session in the store, releasing every
    /// grant attached to it at once.
    pub async fn close(&self) -> Result<()> {
        end(&self.publish, LostReason::Closed);
        self.stop.cancel();
        self.store.close_session(self.lease.id).await
    }
}

fn end(publish: &watch::Sender<SessionState>, reason: LostReason) {
    publish.send_if_modified(|s| {
        if s.ended.is_some() {
            return false;
        }
        s.ended = Some(reason);
        true
    });
}

struct Renewer {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    config: LeaseConfig,
    id: SessionId,
    renew_every: Duration,
    publish: Arc<watch::Sender<SessionState>>,
    stop: CancellationToken,
    policy: DeadlinePolicy,
    observer: Option<RenewalObserver>,
}

impl Renewer {
    /// Renews every `renew_every` after the last successful renewal was sent;
    /// retries failures more often; gives up at the deadline.
    async fn run(self, mut last_sent: Instant, mut deadline: Instant) {
        let retry = (self.renew_every / 4).max(Duration::from_millis(5));
        let mut next = last_sent + self.renew_every;
        let mut last_error: Option<String> = None;
        loop {
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return,
                () = self.store.session_ended(self.id) => return self.store_ended_it(),
                () = self.clock.sleep_until(deadline) => return self.deadline_passed(last_error).await,
                () = self.clock.sleep_until(next) => {}
            }
            let sent = self.clock.now();
            let outcome = tokio::select! {
                biased;
                () = self.stop.cancelled() => return,
                () = self.clock.sleep_until(deadline) => {
                    // The renewal is still outstanding: it failed.
                    if let Some(observer) = &self.observer {
                        let after = self.clock.now().saturating_duration_since(sent);
                        observer.notify(&RenewalEvent::Failed { after, error: &Error::Timeout(after) });
                    }
                    return self.deadline_passed(last_error).await;
                }
                outcome = self.store.keep_alive(self.id) => outcome,
            };
            if let Some(observer) = &self.observer {
                let elapsed = self.clock.now().saturating_duration_since(sent);
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
            match outcome {
                Ok(granted) => {
                    last_error = None;
                    last_sent = sent;
                    let replied = self.clock.now();
                    match self.policy.deadline(&self.config, sent, replied, granted) {
                        Some(d) => deadline = d,
                        None => {
                            tracing::warn!(session = %self.id, granted = %humanize(granted),
                                "the store shortened the TTL below any validity; giving up the session");
                            return self.deadline_passed(None).await;
                        }
                    }
                    self.publish.send_modify(|s| {
                        s.deadline = deadline;
                        s.last_error = None;
                    });
                    next = last_sent + self.config.renew_period_for(granted);
                }
                Err(Error::SessionExpired(_)) => {
                    tracing::warn!(session = %self.id, "the store reports the session expired");
                    end(&self.publish, LostReason::SessionExpired);
                    return;
                }
                Err(error) => {
                    tracing::warn!(session = %self.id, %error, "renewal failed; retrying until the deadline");
                    last_error = Some(error.to_string());
                    self.publish
                        .send_modify(|s| s.last_error.clone_from(&last_error));
                    next = self.clock.now() + retry;
                }
            }
        }
    }

    fn store_ended_it(&self) {
        tracing::warn!(session = %self.id, "the store reports the session ended");
        end(&self.publish, LostReason::SessionExpired);
    }

    async fn deadline_passed(&self, last_error: Option<String>) {
        tracing::warn!(session = %self.id, "lease deadline passed without a confirmed renewal");
        end(&self.publish, LostReason::DeadlineExpired { last_error });
        // The holder has stepped down; closing frees its grants for the next
        // candidate sooner than the store's expiry would. Best effort.
        if let Err(error) = self.store.close_session(self.id).await {
            tracing::debug!(session = %self.id, %error, "could not close the lost session");
        }
    }
}
