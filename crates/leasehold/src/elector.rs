//! The elector: campaigns on a shared session, hands out [`Leadership`]
//! handles that know their deadline and fire when leadership is lost.

use std::sync::Arc;

use crate::watch;
use tokio::sync::Mutex;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::clock::{Clock, Instant, TokioClock};
use crate::config::LeaseConfig;
use crate::error::{Error, Result};
use crate::lease::{DeadlinePolicy, LostReason};
use crate::names::{CandidateId, ElectionName};
use crate::session::{GrantSignal, RenewalObserver, Session, SessionState};
use crate::store::{FencingToken, Grant, Leader, LeaderWatch, StatusWatch, Store};

/// How many fresh sessions one campaign opens before giving up, when each
/// ends before the campaign completes (e.g. the store expires them at once).
const MAX_SESSIONS_PER_CAMPAIGN: usize = 3;

/// Takes part in elections as one candidate, on one store, with one session
/// (lease) shared by all its elections and reopened when it is lost.
#[derive(Debug)]
pub struct Elector {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    config: LeaseConfig,
    candidate: CandidateId,
    session: Mutex<Option<Arc<Session>>>,
    policy: DeadlinePolicy,
    observer: Option<RenewalObserver>,
}

impl Elector {
    /// An elector for `candidate` on `store`; fails if `config` is invalid.
    pub fn new(store: Arc<dyn Store>, candidate: CandidateId, config: LeaseConfig) -> Result<Self> {
        config.validate()?;
        Ok(Elector {
            store,
            clock: Arc::new(TokioClock),
            config,
            candidate,
            session: Mutex::new(None),
            policy: DeadlinePolicy::Conservative,
            observer: None,
        })
    }

    /// Calls `observer` after every renewal of this elector's sessions
    /// (round-trip times for metrics, failures for logs).
    pub fn with_renewal_observer(mut self, observer: RenewalObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Uses `clock` for renewals and deadlines (simulation, tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// **Unsafe, for tests only**: computes the deadline from when a renewal's
    /// reply arrived, plus the full TTL, instead of DESIGN rule 3. Exists so
    /// that the simulation can prove its checkers detect a broken deadline.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn with_unsafe_deadline_from_reply(mut self) -> Self {
        self.policy = DeadlinePolicy::FromReplyUnsafe;
        self
    }

    /// This elector's candidate id.
    pub fn candidate(&self) -> &CandidateId {
        &self.candidate
    }

    /// The lease timing in force.
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// The store elections are decided in.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The current live session, opening a new one if there is none or the
    /// last one ended.
    pub async fn session(&self) -> Result<Arc<Session>> {
        let mut current = self.session.lock().await;
        if let Some(session) = current.as_ref().filter(|s| s.over_now().is_none()) {
            return Ok(Arc::clone(session));
        }
        let session = Arc::new(
            Session::open_with(
                Arc::clone(&self.store),
                Arc::clone(&self.clock),
                self.config,
                self.policy,
                self.observer.clone(),
            )
            .await?,
        );
        tracing::debug!(session = %session.id(), candidate = %self.candidate, "session opened");
        *current = Some(Arc::clone(&session));
        Ok(session)
    }

    /// Resolves when this candidate holds `election`.
    ///
    /// Waits while another candidate holds it. If the session is lost while
    /// waiting, a new one is opened and the campaign goes on. Dropping the
    /// future withdraws the candidacy.
    pub async fn campaign(&self, election: &ElectionName) -> Result<Leadership> {
        let mut last_loss = None;
        for _ in 0..MAX_SESSIONS_PER_CAMPAIGN {
            let session = self.session().await?;
            let outcome = tokio::select! {
                biased;
                outcome = self.store.campaign(session.id(), election, &self.candidate) => outcome,
                reason = session.lost() => {
                    last_loss = Some(reason);
                    continue;
                }
            };
            match outcome {
                Ok(grant) => {
                    tracing::info!(%election, id = %self.candidate, token = grant.token.0, "became leader");
                    return Ok(Leadership::start(grant, session, Arc::clone(&self.store)));
                }
                Err(Error::SessionExpired(_)) => {
                    session.mark_expired();
                    last_loss = Some(LostReason::SessionExpired);
                }
                Err(error) => return Err(error),
            }
        }
        Err(Error::Unavailable {
            reason: format!(
                "{MAX_SESSIONS_PER_CAMPAIGN} sessions in a row ended before the campaign for {election} completed \
                 (last: {})",
                last_loss.map_or_else(|| "unknown".to_owned(), |r| r.to_string())
            ),
            source: None,
        })
    }

    /// The current leader of `election`, as the store sees it.
    pub async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        self.store.leader(election).await
    }

    /// Watches `election`'s leader: the receiver always holds the latest known
    /// leader (or `None`), so the final state is never missed.
    pub async fn observe(&self, election: &ElectionName) -> Result<LeaderWatch> {
        self.store.watch(election).await
    }

    /// Watches `election`'s leader as [`Elector::observe`] does, and also
    /// tells when the store cannot be read ([`crate::LeaderStatus::Unknown`]),
    /// then the leader once it can: for followers that must not act on a
    /// leader who may have stepped down meanwhile.
    pub async fn observe_status(&self, election: &ElectionName) -> Result<StatusWatch> {
        self.store.watch_status(election).await
    }

    /// Closes the session, releasing every election this elector holds.
    pub async fn close(&self) -> Result<()> {
        let session = self.session.lock().await.take();
        match session {
            Some(session) => session.close().await,
            None => Ok(()),
        }
    }
}

/// This process's view of a grant: the token, the conservative deadline, and
/// a signal that fires when leadership ends.
///
/// Dropping a `Leadership` without [`Leadership::resign`] releases the grant
/// in the background.
#[derive(Debug)]
pub struct Leadership {
    grant: Grant,
    session: Arc<Session>,
    store: Arc<dyn Store>,
    lost: GrantSignal,
    /// Set once the grant was let go (resign), so that drop does not again.
    let_go: bool,
    _stop_monitor: DropGuard,
}

impl Leadership {
    fn start(grant: Grant, session: Arc<Session>, store: Arc<dyn Store>) -> Self {
        let lost = session.hold(&grant);
        let stop = CancellationToken::new();
        // The monitor opens its watch in the background: the new leader's
        // work does not wait for it, and the session's deadline still ends
        // leadership in time if the store is slow to answer.
        let monitor = Monitor {
            grant: grant.clone(),
            store: Arc::clone(&store),
            session: Arc::clone(&session),
            state: session.subscribe(),
            stop: stop.clone(),
        };
        tokio::spawn(monitor.run());
        Leadership {
            grant,
            session,
            store,
            lost,
            let_go: false,
            _stop_monitor: stop.drop_guard(),
        }
    }

    /// The fencing token of this leadership.
    pub fn token(&self) -> FencingToken {
        self.grant.token
    }

    /// The grant as the store made it.
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// The election held.
    pub fn election(&self) -> &ElectionName {
        &self.grant.election
    }

    /// Until when this leadership is valid (DESIGN rule 3); it moves forward
    /// with every confirmed renewal.
    pub fn deadline(&self) -> Instant {
        self.session.deadline()
    }

    /// Resolves with the deadline once it differs from `seen` (a renewal was
    /// confirmed): for a process that mirrors the deadline elsewhere, such
    /// as a runner's guard. Never resolves once the session has ended.
    pub async fn deadline_after(&self, seen: Instant) -> Instant {
        let mut state = self.session.subscribe();
        loop {
            let deadline = state.borrow_and_update().deadline;
            if deadline != seen {
                return deadline;
            }
            if state.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// The session this leadership is attached to.
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// Whether this process may still act as leader right now: not lost,
    /// and before the deadline by this process's clock.
    pub fn is_leader(&self) -> bool {
        self.lost_reason().is_none()
    }

    /// Why leadership ended, if it has. Asks the lease core with the
    /// clock's now, so it is exact at the deadline whatever the scheduling
    /// of background tasks.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.session.grant_lost_now(&self.grant)
    }

    /// Resolves when leadership ends, with the reason; no later than the
    /// deadline.
    pub async fn lost(&self) -> LostReason {
        let mut own = self.lost.clone();
        let mut session = self.session.subscribe();
        let mut at = self.session.now();
        loop {
            own.borrow_and_update();
            let deadline = session.borrow_and_update().deadline;
            if let Some(reason) = self.session.grant_lost_at(&self.grant, at) {
                return reason;
            }
            at = tokio::select! {
                biased;
                _ = own.changed() => self.session.now(),
                _ = session.changed() => self.session.now(),
                // At the deadline at least, even if the clock woke a hair
                // early.
                () = self.session.sleep_until(deadline) => self.session.now().max(deadline),
            };
        }
    }

    /// Ends leadership at once because the protected resource refused a
    /// write as stale ([`crate::Error::Stale`]): someone newer has written,
    /// so this process must stop acting, whatever its lease says. The grant
    /// is left to expire or be released by [`Leadership::resign`].
    pub fn supersede(&self) {
        if self.session.supersede(&self.grant, false) {
            tracing::warn!(election = %self.grant.election, token = self.grant.token.0,
                "leadership ended: the resource refused this token as stale");
        }
    }

    /// Ends leadership locally (the lost signal fires first), then releases
    /// the grant in the store, guarded by the token: it can never remove a
    /// successor's grant.
    pub async fn resign(mut self) -> Result<()> {
        self.let_go = true;
        if self.session.let_go(&self.grant) {
            self.store.resign(&self.grant).await
        } else {
            Ok(())
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if self.let_go || !self.session.let_go(&self.grant) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (store, grant) = (Arc::clone(&self.store), self.grant.clone());
            runtime.spawn(async move {
                if let Err(error) = store.resign(&grant).await {
                    tracing::debug!(election = %grant.election, %error, "release on drop failed");
                }
            });
        }
    }
}

/// Watches the store for the grant disappearing or being superseded; the
/// session's own end and deadline are the lease core's.
struct Monitor {
    grant: Grant,
    store: Arc<dyn Store>,
    session: Arc<Session>,
    state: watch::Receiver<SessionState>,
    stop: CancellationToken,
}

/// Pause between attempts to open the monitor's watch.
const WATCH_RETRY: std::time::Duration = std::time::Duration::from_millis(250);

impl Monitor {
    async fn open_watch(&mut self) -> Option<LeaderWatch> {
        let election = &self.grant.election;
        loop {
            match self.store.watch(election).await {
                Ok(watch) => return Some(watch),
                Err(error) => {
                    tracing::warn!(%election, %error, "cannot watch the election; retrying");
                }
            }
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return None,
                changed = self.state.changed() => if changed.is_err() { return None },
                () = self.session.sleep(WATCH_RETRY) => {}
            }
            if self.state.borrow().ended.is_some() {
                return None;
            }
        }
    }

    async fn run(mut self) {
        let Some(mut holders) = self.open_watch().await else {
            return;
        };
        loop {
            if self.state.borrow_and_update().ended.is_some() {
                return;
            }
            let holder = holders.borrow_and_update().clone();
            if holder.is_none_or(|h| h.token != self.grant.token) {
                if self.session.supersede(&self.grant, true) {
                    tracing::warn!(
                        token = self.grant.token.0,
                        "leadership lost: the store shows the grant gone or superseded"
                    );
                }
                return;
            }
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return,
                changed = self.state.changed() => if changed.is_err() { return },
                changed = holders.changed() => if changed.is_err() {
                    self.session.supersede(&self.grant, true);
                    return;
                },
            }
        }
    }
}
