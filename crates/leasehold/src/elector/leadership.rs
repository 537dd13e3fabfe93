//! [`Leadership`], a holder's handle on its grant, and the monitor that
//! ends it when the store shows the grant gone.

use std::sync::Arc;

use tokio_util::sync::{CancellationToken, DropGuard};

use super::steward::Steward;
use super::{Handover, Planned, WATCH_RETRY};
use crate::clock::Instant;
use crate::error::{Error, Result};
use crate::lease::LostReason;
use crate::line;
use crate::names::{CandidateId, ElectionName};
use crate::session::{GrantSignal, Session};
use crate::store::{FencingToken, Grant, LeaderWatch, Store};
use crate::watch;

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
    pub(super) fn start(
        grant: Grant,
        session: Arc<Session>,
        store: Arc<dyn Store>,
        planned: Option<Planned>,
        unwaited: bool,
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
            lost: lost.clone(),
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
                unwaited,
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
    pub fn end_as_stale(&self) {
        if self.session.supersede(&self.grant, false) {
            tracing::warn!(election = %self.grant.election, token = self.grant.token.0,
                "leadership ended: the resource refused this token as stale");
        }
    }

    /// Resolves when this leader is asked to hand over: a transfer request
    /// addressed to its grant, or a waiting candidate of higher priority
    /// that waited out the settling period. The chosen standby is already
    /// told (the next grant goes to it); the holder should stop its work
    /// gracefully, then call [`Leadership::resign`], which hands over to
    /// it. Never resolves on a store that keeps no notes.
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
    /// releases to it as [`Leadership::resign`] does after a handover
    /// request. Fails with
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
                Error::invalid(
                    "transfer",
                    format!(
                        "{} is not waiting for {election}",
                        crate::quoted(to.as_str())
                    ),
                )
            })?,
            None => line.first().ok_or_else(|| {
                Error::invalid(
                    "transfer",
                    format!("nobody is waiting to take over {election}"),
                )
            })?,
        };
        if !line::mark_chosen(&*self.store, &election, target, self.grant.token).await? {
            return Err(Error::invalid(
                "transfer",
                format!(
                    "{} left the line of {election}",
                    crate::quoted(target.candidate.as_str())
                ),
            ));
        }
        self.hand_over().await
    }

    /// Releases the grant to the standby a handover chose (see
    /// [`Leadership::resign`]).
    async fn hand_over(mut self) -> Result<()> {
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
        tokio::spawn(unmark_when_done(
            Arc::clone(&self.store),
            self.grant.clone(),
            Arc::clone(&self.session),
        ));
        Ok(())
    }

    /// Lets go: ends leadership locally (the lost signal fires first),
    /// then releases the grant in the store, guarded by the token: it can
    /// never remove a successor's grant.
    ///
    /// After a handover was requested ([`Leadership::handover_requested`]
    /// resolved; call this once the work stopped) the release goes to the
    /// standby the request chose: leadership ends with
    /// [`LostReason::HandedOver`], a release that fails for a moment is
    /// tried again (that standby waits for it), and the mark on its note
    /// is withdrawn once a successor holds (or after two TTLs). Otherwise
    /// it ends with [`LostReason::Resigned`] and the next in line is
    /// granted.
    pub async fn resign(mut self) -> Result<()> {
        if self.handover.borrow().is_some() {
            return self.hand_over().await;
        }
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
    /// The grant's own step-down signal (set when the session ends too):
    /// not the session's state, whose every renewal would wake the
    /// monitors of all the session's grants.
    lost: GrantSignal,
    stop: CancellationToken,
}

impl Monitor {
    async fn open_watch(&mut self) -> Option<LeaderWatch> {
        let election = &self.grant.election;
        loop {
            match self.store.watch_grant(&self.grant).await {
                Ok(watch) => return Some(watch),
                Err(error) => {
                    tracing::warn!(%election, %error, "cannot watch the election; retrying");
                }
            }
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return None,
                changed = self.lost.changed() => if changed.is_err() { return None },
                () = self.session.sleep(WATCH_RETRY) => {}
            }
            if self.lost.borrow().is_some() {
                return None;
            }
        }
    }

    async fn run(mut self) {
        let Some(mut holders) = self.open_watch().await else {
            return;
        };
        loop {
            if self.lost.borrow_and_update().is_some() {
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
                changed = self.lost.changed() => if changed.is_err() { return },
                changed = holders.changed() => if changed.is_err() {
                    self.session.supersede(&self.grant, true);
                    return;
                },
            }
        }
    }
}

/// Withdraws the mark a leader that handed over `grant` left on the
/// standby it chose, when [`line::Unmarking`] says so: carries it out.
async fn unmark_when_done(store: Arc<dyn Store>, grant: Grant, session: Arc<Session>) {
    let patience = session.granted_ttl().saturating_mul(2);
    let mut unmarking = line::Unmarking::new(grant.token, session.now(), patience);
    let until = unmarking.until();
    let succeeded = async {
        let mut leaders = store.watch(&grant.election).await?;
        let mut notes = store.watch_notes(&grant.election).await?;
        let successor = line::successor(
            &*store,
            &grant.election,
            &mut leaders,
            &mut notes,
            grant.token,
            None,
        )
        .await?;
        unmarking.succeeded(&successor);
        while unmarking.step(&notes.borrow_and_update(), session.now()) == line::UnmarkStep::Keep {
            notes.changed().await.map_err(|_| line::watch_ended())?;
        }
        Ok::<_, Error>(())
    };
    let _ = tokio::select! {
        outcome = succeeded => outcome,
        () = session.sleep_until(until) => Ok(()),
    };
    if let Err(error) = line::unmark_chosen(&*store, &grant.election, grant.token).await {
        tracing::debug!(election = %grant.election, %error, "withdrawing the choice of a standby failed; it ends with that standby's wait");
    }
}
