//! The elector: campaigns on a shared session, hands out [`Leadership`]
//! handles that know their deadline and fire when leadership is lost.

use std::sync::Arc;
use std::time::Duration;

use crate::line;
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
    planned: Planned,
}

/// How this elector takes part in planned moves (see [`crate::line`]).
#[derive(Clone, Copy, Debug)]
struct Planned {
    priority: i64,
    preempt_after: Duration,
    lock_delay: Duration,
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
            planned: Planned {
                priority: 0,
                preempt_after: config.renew_every,
                lock_delay: Duration::ZERO,
            },
        })
    }

    /// Campaigns with `priority` (default 0): among waiting candidates the
    /// highest priority is granted first, and while this candidate leads,
    /// a waiting candidate of strictly higher priority takes over by a
    /// graceful handover once it has waited [`Elector::with_preempt_after`].
    /// Equal priorities never preempt.
    pub fn with_priority(mut self, priority: i64) -> Self {
        self.planned.priority = priority;
        self
    }

    /// While this candidate leads, how long a waiting candidate of higher
    /// priority must have waited (as this process saw it) before this
    /// leader hands over to it; default the renewal period. A replica that
    /// restarts joins the line anew, so a crash-looping one never makes
    /// the leader flap.
    pub fn with_preempt_after(mut self, settle: Duration) -> Self {
        self.planned.preempt_after = settle;
        self
    }

    /// After the previous leader's lease *expired* (it did not release),
    /// waits `delay` before campaigning (default zero): the election stays
    /// unowned meanwhile, so that in-flight requests of a vanished holder
    /// drain from a resource that cannot check fencing tokens. A release
    /// (resign, a handover, a runner stopped with SIGTERM) is not delayed.
    pub fn with_lock_delay(mut self, delay: Duration) -> Self {
        self.planned.lock_delay = delay;
        self
    }

    /// This elector's priority.
    pub fn priority(&self) -> i64 {
        self.planned.priority
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
                outcome = self.campaign_in_line(&session, election) => outcome,
                reason = session.lost() => {
                    last_loss = Some(reason);
                    continue;
                }
            };
            match outcome {
                Ok((grant, planned)) => {
                    tracing::info!(%election, id = %self.candidate, token = grant.token.0, "became leader");
                    let planned = planned.then_some(self.planned);
                    return Ok(Leadership::start(
                        grant,
                        session,
                        Arc::clone(&self.store),
                        planned,
                    ));
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

    /// Campaigns on `session` as one of the line of standbys: only while
    /// this candidate is the chosen one ([`line::chosen`]) does it ask the
    /// store; `true` with the grant when the store keeps notes. On a store
    /// that keeps none, campaigns directly (priorities and lock-delay then
    /// cannot be honoured, and are refused).
    async fn campaign_in_line(
        &self,
        session: &Arc<Session>,
        election: &ElectionName,
    ) -> Result<(Grant, bool)> {
        let sid = session.id();
        let mut notes = match self.store.watch_notes(election).await {
            Ok(notes) => notes,
            Err(Error::Unsupported(what)) => {
                if self.planned.priority != 0 || !self.planned.lock_delay.is_zero() {
                    return Err(Error::Unsupported(format!(
                        "priorities and lock-delay: {what}"
                    )));
                }
                let grant = self.store.campaign(sid, election, &self.candidate).await?;
                return Ok((grant, false));
            }
            Err(error) => return Err(error),
        };
        self.store
            .put_note(
                sid,
                election,
                line::CANDIDATE,
                &line::candidate_note(self.planned.priority, &self.candidate),
            )
            .await?;
        // Leaves the line however the campaign ends (granted, failed, or
        // dropped).
        let _leave = LeaveLine {
            store: Arc::clone(&self.store),
            session: sid,
            election: election.clone(),
        };
        if let Some(grant) = self.live_or_release_stale(session, election).await? {
            return Ok((grant, true));
        }
        // Only lock-delay needs to follow the leader while waiting (every
        // waiter watching it would wake them all at each handover).
        let mut leaders = if self.planned.lock_delay.is_zero() {
            None
        } else {
            Some(self.store.watch(election).await?)
        };
        let mut last_leader: Option<FencingToken> = None;
        // Notes read afresh after a grant this candidate gave back, newer
        // than the watch may show yet.
        let mut fresh: Option<Vec<crate::store::Note>> = None;
        loop {
            let chosen = match fresh.take() {
                Some(fresh) => line::chosen(&fresh),
                None => line::chosen(&notes.borrow_and_update()),
            } == Some(sid);
            let holder = leaders.as_mut().map(|l| l.borrow_and_update().clone());
            if let Some(Some(holder)) = &holder {
                last_leader = Some(holder.token);
            }
            // Lock-delay: ask only once the election is free, and wait out
            // the delay if its last holder's lease expired.
            let busy = holder.as_ref().is_some_and(Option::is_some);
            if !chosen || busy {
                match leaders.as_mut() {
                    Some(leaders) => tokio::select! {
                        changed = notes.changed() => changed.map_err(|_| watch_ended())?,
                        changed = leaders.changed() => changed.map_err(|_| watch_ended())?,
                    },
                    None => notes.changed().await.map_err(|_| watch_ended())?,
                }
                continue;
            }
            if leaders.is_some()
                && let Some(token) = last_leader.take()
                && self.store.last_release(election).await? != Some(token)
            {
                tracing::info!(%election, expired_token = token.0, delay = ?self.planned.lock_delay,
                    "the previous leader's lease expired; waiting out the lock-delay");
                session.sleep(self.planned.lock_delay).await;
                continue;
            }
            let campaign = self.store.campaign(sid, election, &self.candidate);
            tokio::pin!(campaign);
            loop {
                tokio::select! {
                    biased;
                    grant = &mut campaign => {
                        let grant = grant?;
                        match self.give_back_if_another_was_chosen(&grant).await {
                            None => return Ok((grant, true)),
                            Some(notes) => {
                                fresh = Some(notes);
                                break;
                            }
                        }
                    }
                    changed = notes.changed() => {
                        changed.map_err(|_| watch_ended())?;
                        if line::chosen(&notes.borrow_and_update()) != Some(sid) {
                            // Another was chosen: withdraw from the store.
                            break;
                        }
                    }
                }
            }
            // A campaign withdrawn after the store granted it (its reply
            // was still on the way) leaves a grant this session holds.
            self.live_or_release_stale(session, election).await?;
        }
    }

    /// A grant of `election` that the store shows this candidate holding
    /// while this campaign runs. Live in this process (another campaign of
    /// this elector holds it): the store gives it again, as before the
    /// line. Otherwise it is one this session no longer holds though the
    /// store still shows it — a release whose reply was lost or that is
    /// still on its way, a campaign withdrawn after the store had granted
    /// it — and it is released (guarded by its token, as every release),
    /// never taken up again: a release of it may land at any moment, and
    /// waiting in line instead would wait for a grant this very session
    /// keeps alive. (A failed read fails the campaign, which its caller
    /// tries again.)
    async fn live_or_release_stale(
        &self,
        session: &Arc<Session>,
        election: &ElectionName,
    ) -> Result<Option<Grant>> {
        let Some(leader) = self.store.leader(election).await? else {
            return Ok(None);
        };
        if leader.candidate != self.candidate {
            return Ok(None);
        }
        let grant = Grant {
            election: election.clone(),
            candidate: self.candidate.clone(),
            session: session.id(),
            token: leader.token,
        };
        if session.grant_lost_now(&grant).is_none() {
            let grant = self
                .store
                .campaign(session.id(), election, &self.candidate)
                .await?;
            return Ok(Some(grant));
        }
        match self.store.resign(&grant).await {
            Ok(()) => {
                tracing::debug!(%election, token = grant.token.0, "released a grant the store still showed for this session");
            }
            // Another session's (of this candidate id), or gone meanwhile.
            Err(Error::NotHolder { .. }) => {}
            Err(error) => return Err(error),
        }
        Ok(None)
    }

    /// After the store granted `grant`: whether a leader that handed over
    /// chose another standby (its `next` note, put just before it
    /// released, names another session that still waits), which this
    /// candidate's notes watch may not have shown when it asked. Then the
    /// grant is released at once, before anyone acts on it, and the fresh
    /// notes are returned. The store orders that note before the release
    /// that let this grant happen, so the read sees it; the old leader
    /// removes it only once the chosen one holds. If the notes cannot be
    /// read, the grant is kept: the choice is a preference, never safety.
    async fn give_back_if_another_was_chosen(
        &self,
        grant: &Grant,
    ) -> Option<Vec<crate::store::Note>> {
        let election = &grant.election;
        let notes = match self.store.notes(election).await {
            Ok(notes) => notes,
            Err(error) => {
                tracing::debug!(%election, %error, "cannot read the line after a grant; keeping it");
                return None;
            }
        };
        let chosen = line::chosen_by_a_leader(&notes)?;
        if chosen == grant.session {
            return None;
        }
        tracing::debug!(%election, token = grant.token.0, "granted while another standby was chosen; giving the grant back");
        // Given back even if the release fails: its reply may have been
        // lost after the store released it, and a successor may hold now.
        // If it did not land, the grant is released again once the
        // campaign sees the store still showing it.
        if let Err(error) = self.store.resign(grant).await {
            tracing::debug!(%election, %error, "giving back a grant failed; it is released again later");
        }
        Some(notes)
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

fn watch_ended() -> Error {
    Error::Unavailable {
        reason: "the store's watch ended".into(),
        source: None,
    }
}

/// Deletes a campaign's `cand` note when dropped.
struct LeaveLine {
    store: Arc<dyn Store>,
    session: crate::grant::SessionId,
    election: ElectionName,
}

impl Drop for LeaveLine {
    fn drop(&mut self) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (store, session, election) =
                (Arc::clone(&self.store), self.session, self.election.clone());
            runtime.spawn(async move {
                if let Err(error) = store.delete_note(session, &election, line::CANDIDATE).await {
                    tracing::debug!(%election, %error, "leaving the line failed; the note ends with the session");
                }
            });
        }
    }
}

/// Why a leader is asked to hand over ([`Leadership::handover_requested`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandoverCause {
    /// Someone asked for it ([`crate::line::request_transfer`],
    /// `leasehold transfer`).
    Transfer,
    /// A waiting candidate of higher priority waited out the settling
    /// period.
    Preemption {
        /// Its priority.
        priority: i64,
    },
}

impl std::fmt::Display for HandoverCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandoverCause::Transfer => f.write_str("a transfer request"),
            HandoverCause::Preemption { priority } => {
                write!(f, "a waiting candidate of higher priority ({priority})")
            }
        }
    }
}

/// A request that this leader hand over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handover {
    /// Why.
    pub cause: HandoverCause,
    /// The standby chosen to take over; `None` when nobody waits (the
    /// first to campaign then takes over).
    pub to: Option<CandidateId>,
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
    /// Set by the steward when this leader is asked to hand over.
    handover: watch::Receiver<Option<Handover>>,
    _stop_monitor: DropGuard,
}

impl Leadership {
    fn start(
        grant: Grant,
        session: Arc<Session>,
        store: Arc<dyn Store>,
        planned: Option<Planned>,
    ) -> Self {
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
        let (handover_tx, handover) = watch::channel(None);
        if let Some(planned) = planned {
            let steward = Steward {
                grant: grant.clone(),
                store: Arc::clone(&store),
                session: Arc::clone(&session),
                planned,
                requested: handover_tx,
                stop: stop.clone(),
            };
            tokio::spawn(steward.run());
        }
        Leadership {
            grant,
            session,
            store,
            lost,
            let_go: false,
            handover,
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

    /// Resolves when this leader is asked to hand over: a transfer request
    /// addressed to its grant, or a waiting candidate of higher priority
    /// that waited out the settling period. The chosen standby is already
    /// told (the next grant goes to it); the holder should stop its work
    /// gracefully, then call [`Leadership::hand_over`]. Never resolves on
    /// a store that keeps no notes.
    pub async fn handover_requested(&self) -> Handover {
        let mut requested = self.handover.clone();
        loop {
            if let Some(handover) = requested.borrow_and_update().clone() {
                return handover;
            }
            if requested.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Hands leadership over to the standby `to`, or without `to` to the
    /// first in line: tells the line that it is the chosen one, then
    /// releases as [`Leadership::hand_over`] does. Fails with
    /// [`Error::InvalidInput`], still leading, when `to` does not wait for
    /// the election, or when nobody waits.
    pub async fn transfer(self, to: Option<&CandidateId>) -> Result<()> {
        let election = self.grant.election.clone();
        let line = line::line(&*self.store, &election).await?;
        let line: Vec<_> = line
            .into_iter()
            .filter(|w| w.session != self.grant.session)
            .collect();
        let target = match to {
            Some(to) => line.iter().find(|w| &w.candidate == to).ok_or_else(|| {
                Error::invalid("transfer", format!("{to} is not waiting for {election}"))
            })?,
            None => line.first().ok_or_else(|| {
                Error::invalid(
                    "transfer",
                    format!("nobody is waiting to take over {election}"),
                )
            })?,
        };
        self.store
            .put_note(
                self.grant.session,
                &election,
                line::NEXT,
                &target.session.0.to_string(),
            )
            .await?;
        self.hand_over().await
    }

    /// Releases the grant to hand it over (after
    /// [`Leadership::handover_requested`], once the work stopped): as
    /// [`Leadership::resign`], with [`LostReason::HandedOver`]. The note
    /// naming the chosen standby is removed once a successor holds (or
    /// after two TTLs).
    pub async fn hand_over(mut self) -> Result<()> {
        self.let_go = true;
        if !self.session.hand_over(&self.grant) {
            return Ok(());
        }
        // The chosen standby waits for this release: a failed attempt is
        // tried again (the release is guarded by the token, so a repeat
        // after a lost reply is harmless).
        let mut attempt = 1;
        loop {
            match self.store.resign(&self.grant).await {
                Ok(()) => break,
                // An earlier attempt released it; its reply was lost.
                Err(Error::NotHolder { .. }) if attempt > 1 => break,
                Err(error @ (Error::Unavailable { .. } | Error::Timeout(_))) if attempt < 3 => {
                    tracing::debug!(election = %self.grant.election, %error, "handing over: the release failed; again");
                    attempt += 1;
                    self.session.sleep(WATCH_RETRY).await;
                }
                Err(error) => return Err(error),
            }
        }
        let (store, grant, session) = (
            Arc::clone(&self.store),
            self.grant.clone(),
            Arc::clone(&self.session),
        );
        tokio::spawn(async move {
            let patience = session.granted_ttl().saturating_mul(2);
            let succeeded = async {
                let mut leaders = store.watch(&grant.election).await?;
                let mut notes = store.watch_notes(&grant.election).await?;
                line::successor(
                    &*store,
                    &grant.election,
                    &mut leaders,
                    &mut notes,
                    grant.token,
                    None,
                )
                .await
            };
            let _ = tokio::select! {
                outcome = succeeded => outcome.map(drop),
                () = session.sleep(patience) => Ok(()),
            };
            if let Err(error) = store
                .delete_note(grant.session, &grant.election, line::NEXT)
                .await
            {
                tracing::debug!(election = %grant.election, %error, "removing the handover note failed; it ends with the session");
            }
        });
        Ok(())
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

/// While a leader holds, watches the line for a transfer request addressed
/// to its grant and for a waiting candidate of higher priority that has
/// waited out the settling period; then names the chosen standby in a
/// `next` note and tells the holder ([`Leadership::handover_requested`]).
struct Steward {
    grant: Grant,
    store: Arc<dyn Store>,
    session: Arc<Session>,
    planned: Planned,
    requested: watch::Sender<Option<Handover>>,
    stop: CancellationToken,
}

impl Steward {
    async fn run(self) {
        let election = self.grant.election.clone();
        let mut notes = loop {
            match self.store.watch_notes(&election).await {
                Ok(notes) => break notes,
                Err(Error::Unsupported(_)) => return,
                Err(error) => {
                    tracing::debug!(%election, %error, "cannot watch the line; retrying");
                }
            }
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return,
                () = self.session.sleep(WATCH_RETRY) => {}
            }
        };
        // The higher-priority standby being timed, and since when.
        let mut contender: Option<(crate::grant::SessionId, u64, Instant)> = None;
        loop {
            let (handover, wake, stale) = {
                let current = notes.borrow_and_update();
                // This leader's own place in line, left by a campaign
                // whose removal of it failed: it would keep its early
                // place when this candidate waits again.
                let stale = current
                    .iter()
                    .any(|n| n.session == self.grant.session && n.name == line::CANDIDATE);
                let (handover, wake) = self.decide(&current, &mut contender);
                (handover, wake, stale)
            };
            if stale
                && let Err(error) = self
                    .store
                    .delete_note(self.grant.session, &election, line::CANDIDATE)
                    .await
            {
                tracing::debug!(%election, %error, "cannot leave the line while leading; trying at the next change");
            }
            if let Some((handover, session)) = handover {
                if let Some(session) = session
                    && let Err(error) = self
                        .store
                        .put_note(
                            self.grant.session,
                            &election,
                            line::NEXT,
                            &session.0.to_string(),
                        )
                        .await
                {
                    tracing::warn!(%election, %error, "cannot name the chosen standby; handing over to the first in line");
                }
                tracing::info!(%election, token = self.grant.token.0, cause = %handover.cause,
                    to = handover.to.as_ref().map_or("the first to campaign", |c| c.as_str()),
                    "asked to hand over");
                self.requested.send_replace(Some(handover));
                return;
            }
            let sleep = match wake {
                Some(at) => self.session.sleep_until(at),
                None => Box::pin(std::future::pending()),
            };
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return,
                changed = notes.changed() => if changed.is_err() { return },
                () = sleep => {}
            }
        }
    }

    /// What the notes ask of this leader now: a handover (with the chosen
    /// standby's session), or when to look again.
    #[allow(clippy::type_complexity)]
    fn decide(
        &self,
        notes: &[crate::store::Note],
        contender: &mut Option<(crate::grant::SessionId, u64, Instant)>,
    ) -> (
        Option<(Handover, Option<crate::grant::SessionId>)>,
        Option<Instant>,
    ) {
        let line: Vec<_> = line::standbys(notes)
            .into_iter()
            .filter(|w| w.session != self.grant.session)
            .collect();
        if let Some(to) = line::transfer_request(notes, self.grant.token) {
            let target = match to {
                Some(session) => line.iter().find(|w| w.session == session),
                None => line.first(),
            };
            if let Some(target) = target {
                return (
                    Some((
                        Handover {
                            cause: HandoverCause::Transfer,
                            to: Some(target.candidate.clone()),
                        },
                        Some(target.session),
                    )),
                    None,
                );
            }
            tracing::debug!(election = %self.grant.election, "a transfer request names nobody who waits; ignored");
        }
        let Some(first) = line.first().filter(|w| w.priority > self.planned.priority) else {
            *contender = None;
            return (None, None);
        };
        let now = self.session.now();
        let since = match *contender {
            Some((session, order, since)) if session == first.session && order == first.order => {
                since
            }
            _ => {
                *contender = Some((first.session, first.order, now));
                now
            }
        };
        let due = since + self.planned.preempt_after;
        if now >= due {
            return (
                Some((
                    Handover {
                        cause: HandoverCause::Preemption {
                            priority: first.priority,
                        },
                        to: Some(first.candidate.clone()),
                    },
                    Some(first.session),
                )),
                None,
            );
        }
        (None, Some(due))
    }
}
