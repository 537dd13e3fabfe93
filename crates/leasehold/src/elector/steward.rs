//! The steward beside each grant: it turns transfer requests and waiting
//! candidates of higher priority into a handover request to the holder,
//! and tells the transfer requests of earlier grants that this leader took
//! its grant up (they succeed only then).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Handover, HandoverCause, Planned, WATCH_RETRY};
use crate::clock::Instant;
use crate::error::Error;
use crate::grant::SessionId;
use crate::line::{self, Standby};
use crate::session::Session;
use crate::store::{Grant, Note, Store};
use crate::watch;

/// While a leader holds, watches the line for a transfer request addressed
/// to its grant and for a waiting candidate of higher priority that has
/// waited out the settling period; then marks the chosen standby's note
/// and tells the holder ([`super::Leadership::handover_requested`]). It
/// starts once the elector holds the grant, so its answer to a transfer
/// request says that a live elector took the grant up
/// ([`line::answers`]).
pub(super) struct Steward {
    pub(super) grant: Grant,
    pub(super) store: Arc<dyn Store>,
    pub(super) session: Arc<Session>,
    pub(super) planned: Planned,
    /// Taken while nobody waited ([`Store::try_campaign_unwaited`]): the
    /// line's watch may start empty from the grant.
    pub(super) unwaited: bool,
    pub(super) requested: watch::Sender<Option<Handover>>,
    pub(super) stop: CancellationToken,
}

/// What the line asks of a leader now: a handover to a chosen standby
/// (`None`: the first to campaign), or when to look again.
type Decision = (Option<(Handover, Option<Standby>)>, Option<Instant>);

/// The higher-priority standby being timed, and since when.
type Contender = Option<(SessionId, u64, Instant)>;

impl Steward {
    pub(super) async fn run(self) {
        let Some(mut notes) = self.watch_line().await else {
            return;
        };
        let election = &self.grant.election;
        let mut contender: Contender = None;
        loop {
            let ((handover, wake), stale, answers) = {
                let current = notes.borrow_and_update();
                // This leader's own place in line, left by a campaign
                // whose removal of it failed: it would keep its early
                // place when this candidate waits again.
                let stale = current
                    .iter()
                    .any(|n| n.session == self.grant.session && n.name == line::CANDIDATE);
                let answers = line::answers(&current, self.grant.token);
                (self.decide(&current, &mut contender), stale, answers)
            };
            let retry = self.answer(answers).await;
            if stale
                && let Err(error) = self
                    .store
                    .delete_note(self.grant.session, election, line::CANDIDATE)
                    .await
            {
                tracing::debug!(%election, %error, "cannot leave the line while leading; trying at the next change");
            }
            if let Some((handover, standby)) = handover {
                self.request(handover, standby).await;
                return;
            }
            let sleep = match wake.into_iter().chain(retry).min() {
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

    /// Opens the watch on the line, retrying until stopped; `None` once
    /// stopped, or on a store that keeps no notes.
    async fn watch_line(&self) -> Option<crate::store::NoteWatch> {
        let election = &self.grant.election;
        let mut since_grant = self.unwaited;
        loop {
            let opened = if std::mem::take(&mut since_grant) {
                self.store.watch_notes_since_unwaited(&self.grant).await
            } else {
                self.store.watch_notes(election).await
            };
            match opened {
                Ok(notes) => return Some(notes),
                Err(Error::Unsupported(_)) => return None,
                Err(error) => {
                    tracing::debug!(%election, %error, "cannot watch the line; retrying");
                }
            }
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return None,
                () = self.session.sleep(WATCH_RETRY) => {}
            }
        }
    }

    /// Tells the transfer requests of older grants that this leader took
    /// its grant up ([`line::answers`]): a request succeeds only then, so
    /// that a grant the store made to a standby that cannot act on it
    /// (stopped, killed) is not taken for a handover. When to try again
    /// if an answer could not be written.
    async fn answer(&self, answers: Vec<(SessionId, String)>) -> Option<Instant> {
        let election = &self.grant.election;
        let mut retry = None;
        for (session, text) in answers {
            if let Err(error) = self
                .store
                .amend_note(session, election, line::TRANSFER, &text)
                .await
            {
                tracing::debug!(%election, %error, "cannot answer a transfer request; trying again");
                retry = Some(self.session.now() + WATCH_RETRY);
            }
        }
        retry
    }

    /// Marks the standby chosen to take over, if one is, and asks the
    /// holder to hand over.
    async fn request(&self, handover: Handover, standby: Option<Standby>) {
        let election = &self.grant.election;
        if let Some(standby) = standby {
            match crate::line::mark_chosen(&*self.store, election, &standby, self.grant.token).await
            {
                Ok(true) => {}
                Ok(false) => {
                    tracing::info!(%election, to = %standby.candidate, "the chosen standby left the line; handing over to the first in line");
                }
                Err(error) => {
                    tracing::warn!(%election, %error, "cannot mark the chosen standby; handing over to the first in line");
                }
            }
        }
        tracing::info!(%election, token = self.grant.token.0, cause = %handover.cause,
            to = handover.to.as_ref().map_or("the first to campaign", |c| c.as_str()),
            "asked to hand over");
        self.requested.send_replace(Some(handover));
    }

    /// What the notes ask of this leader now.
    fn decide(&self, notes: &[Note], contender: &mut Contender) -> Decision {
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
                let handover = Handover {
                    cause: HandoverCause::Transfer,
                    to: Some(target.candidate.clone()),
                };
                return (Some((handover, Some(target.clone()))), None);
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
        if now < due {
            return (None, Some(due));
        }
        let handover = Handover {
            cause: HandoverCause::Preemption {
                priority: first.priority,
            },
            to: Some(first.candidate.clone()),
        };
        (Some((handover, Some(first.clone()))), None)
    }
}
