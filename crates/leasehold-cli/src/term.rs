//! One term of leadership's command, supervised until its whole tree is
//! gone: shared by `run` on one election and by `run --shards`, which
//! supervises one term per owned shard at once.

use std::process::ExitStatus;
use std::time::Duration;

use leasehold::{CandidateId, ElectionName, Handover, Leadership, LostReason};
use nix::sys::signal::Signal;
use tokio::time::{Instant, sleep_until};

use crate::guard::{Ended, GUARD_WAKE, GuardKill, Supervised};
use crate::signals::{AnySignal, forwarded_as};
use crate::stopping::TermEnd;
use crate::stopping::{Cause, Deliver, STORE_GONE, Stopping};

/// Exit status when the command could not be started.
pub const EXIT_CANNOT_START: u8 = 127;

/// Whether a release failed only because the grant had already ended
/// (lost, expired, or taken by a successor): nothing is left to release,
/// and nothing to warn about.
pub(crate) fn already_gone(error: &leasehold::Error) -> bool {
    matches!(
        error,
        leasehold::Error::NotHolder { .. } | leasehold::Error::SessionExpired(_)
    )
}

/// Whether a term's command may start, with a stop `grace` and renewals
/// every `renew_every`. Granted while renewals failed (the store answered
/// the campaign, but no renewal has been confirmed since the outage), the
/// lease is already so close to its deadline that the command would be
/// asked to stop as soon as it started: a renewal is waited for first, at
/// most until the deadline; why leadership was lost if it was lost
/// meanwhile, or before. Shared by `run` and `run --shards`.
pub(crate) async fn renewed_in_time(
    leadership: &Leadership,
    grace: Duration,
    renew_every: Duration,
) -> Result<(), LostReason> {
    // Lost already (the store's file left its path while `run` was
    // stopped, say): never started, not even for an instant.
    if !leadership.is_leader() {
        return Err(leadership.lost().await);
    }
    let at_risk = grace.min(renew_every);
    let deadline = leadership.deadline();
    if deadline.saturating_duration_since(Instant::now()) > at_risk {
        return Ok(());
    }
    tokio::select! {
        _ = leadership.deadline_after(deadline) => Ok(()),
        reason = leadership.lost() => Err(reason),
    }
}

/// Returns from [`Term::supervise`] if the guard has reported the
/// command's end already: it may have ended it while `run` was stopped,
/// and a timer that fired meanwhile must not act as if it ran.
macro_rules! ended_already {
    ($term:expr, $child:expr, $stopping:expr, $leadership:expr) => {
        if let Some(ended) = $child.ended_already().await {
            return (
                ended.status,
                $term.term_end($stopping.into_why(), ended, $leadership),
            );
        }
    };
}

/// What, besides leadership itself, may act on a term's command.
pub enum Request {
    /// Stop: this signal was received (forwarded as [`forwarded_as`]).
    Stop(Signal),
    /// Hand over.
    HandOver(Handover),
    /// The shard moved away.
    Moved,
    /// Pass this signal to the command.
    Pass(AnySignal),
}

/// The source of [`Request`]s of one term.
pub trait Requests {
    /// The next request; `HandOver` and `Moved` only while not already
    /// `stopping` (a `Stop` always: told while handing over, `run` exits
    /// afterwards).
    fn next(
        &mut self,
        leadership: &Leadership,
        stopping: bool,
    ) -> impl Future<Output = Request> + Send;
}

/// A term: which election, whose, and its timing.
pub struct Term<'a> {
    pub election: &'a ElectionName,
    pub id: &'a CandidateId,
    /// How long the command may take to exit once asked to stop.
    pub grace: Duration,
    pub renew_every: Duration,
}

/// Why a command is killed now: the lease deadline came first, or the
/// grace period ended.
fn late(stopping: &Stopping) -> &'static str {
    match stopping.kill_is_the_deadline() {
        true => "the lease deadline came before the command exited",
        false => "the command did not exit in time",
    }
}

/// Sends the command what the stopping machine decided.
async fn deliver(child: &mut Supervised, sends: Vec<Deliver>) {
    for send in sends {
        match send {
            Deliver::Group(signal) => child.signal_group(signal).await,
            Deliver::Pass(signal) => child.pass(signal).await,
        }
    }
}

impl Term<'_> {
    /// Waits until the command's whole tree is gone, stopping it when
    /// leadership is lost or at risk, or when a request says so, and
    /// telling the guard every new lease deadline.
    pub async fn supervise(
        &self,
        child: &mut Supervised,
        leadership: &Leadership,
        requests: &mut impl Requests,
    ) -> (ExitStatus, TermEnd) {
        let (election, id) = (self.election, self.id);
        let token = leadership.token().0;
        let mut stopping = Stopping::new(self.grace, self.renew_every);
        let mut wake_guard = tokio::time::interval(GUARD_WAKE);
        let mut store_gone = child.store_gone();
        loop {
            let deadline = leadership.deadline();
            let at_risk = stopping.at_risk_at(deadline);
            let (lost, kill_at) = (stopping.lost(), stopping.kill_at());
            let sends = tokio::select! {
                ended = child.wait() => {
                    return (ended.status, self.term_end(stopping.into_why(), ended, leadership));
                }
                moved = leadership.deadline_after(deadline), if !lost => {
                    child.extend(moved).await;
                    stopping.deadline_moved(moved);
                    continue;
                }
                () = &mut store_gone, if !lost => {
                    ended_already!(self, child, stopping, leadership);
                    tracing::warn!(%election, %id, token, "{}; killing the command", STORE_GONE);
                    stopping.store_gone()
                }
                reason = leadership.lost(), if !lost => {
                    ended_already!(self, child, stopping, leadership);
                    tracing::warn!(%election, %id, token, %reason, "leadership lost; killing the command");
                    stopping.leadership_lost(reason)
                }
                () = sleep_until(at_risk), if !stopping.stopping() => {
                    ended_already!(self, child, stopping, leadership);
                    let sends = stopping.at_risk(deadline, leadership.deadline());
                    if !sends.is_empty() {
                        tracing::warn!(%election, %id, token,
                            "no renewal confirmed; asking the command to stop before the lease deadline");
                    }
                    sends
                }
                () = sleep_until(kill_at.unwrap_or(deadline)), if kill_at.is_some() => {
                    ended_already!(self, child, stopping, leadership);
                    tracing::warn!(pgid = child.pgid, "{}; SIGKILL", late(&stopping));
                    stopping.kill_due()
                }
                request = requests.next(leadership, stopping.stopping()) => {
                    self.requested(&mut stopping, request, leadership, child.pgid)
                }
                _ = wake_guard.tick() => {
                    child.wake_guard();
                    continue;
                }
            };
            deliver(child, sends).await;
        }
    }

    /// What `request` asks of the command, said in the log.
    fn requested(
        &self,
        stopping: &mut Stopping,
        request: Request,
        leadership: &Leadership,
        pgid: i32,
    ) -> Vec<Deliver> {
        let (election, id, token) = (self.election, self.id, leadership.token().0);
        let cause = match request {
            Request::Pass(signal) => {
                tracing::info!(%signal, %pgid, "passing to the command");
                return vec![Deliver::Pass(signal)];
            }
            Request::Stop(signal) if stopping.stopping() => {
                tracing::info!(%signal, "the command is stopping already; exiting once it has");
                Cause::Stop(signal)
            }
            Request::Stop(signal) => {
                let sent = forwarded_as(signal);
                tracing::info!(%signal, forwarded = %sent, grace = ?self.grace, "forwarding to the command");
                Cause::Stop(signal)
            }
            Request::HandOver(handover) => {
                let to = handover
                    .to
                    .as_ref()
                    .map_or_else(|| "the first to campaign".to_owned(), ToString::to_string);
                tracing::info!(%election, %id, token, cause = %handover.cause, %to, grace = ?self.grace,
                    "handing over on request; stopping the command");
                Cause::HandOver(handover)
            }
            Request::Moved => {
                tracing::info!(%election, %id, token, grace = ?self.grace,
                    "the shard moves to another member; stopping the command");
                Cause::Moved
            }
        };
        stopping.stop(cause, Instant::now(), leadership.deadline())
    }

    /// Why the term ended, now that the command has: a command that exits
    /// after leadership was lost (say, because the resource refused its
    /// token), or that the guard killed at the lease deadline, ends the term
    /// like a loss: the replica stays in the pool.
    fn term_end(&self, why: TermEnd, ended: Ended, leadership: &Leadership) -> TermEnd {
        let (election, id, token) = (self.election, self.id, leadership.token().0);
        if !matches!(why, TermEnd::Exited) {
            return why;
        }
        // The guard ended it because the store's file is gone: that is why,
        // even if the lease ran out since (`run` was stopped).
        if let Some(kill @ GuardKill::StoreGone) = ended.killed {
            tracing::warn!(%election, %id, token, "{}", kill.reason());
            return TermEnd::AtRisk(kill.reason());
        }
        if let Some(reason) = leadership.lost_reason() {
            return TermEnd::Lost(reason);
        }
        if let Some(kill) = ended.killed {
            // Still leader, yet the guard killed the command on its own: it
            // saw the deadline it knew pass (the renewal was confirmed too
            // late to tell it), or the store's file gone. Step down all the
            // same (release, campaign again): the command is gone.
            tracing::warn!(%election, %id, token, "{}", kill.reason());
            return TermEnd::AtRisk(kill.reason());
        }
        if ended.guard_lost {
            tracing::warn!(%election, %id, token,
                "the guard process was killed; the command's tree was killed with it");
        }
        why
    }
}

#[cfg(test)]
mod tests {
    use super::already_gone;
    use leasehold::{Error, FencingToken, SessionId};

    #[test]
    fn only_a_grant_that_already_ended_is_released_without_a_warning() {
        let not_holder = Error::NotHolder {
            election: "e".to_owned(),
            token: FencingToken(3),
        };
        assert!(already_gone(&not_holder));
        assert!(already_gone(&Error::SessionExpired(SessionId(7))));
        let unanswered = Error::Unavailable {
            reason: "no answer".to_owned(),
            source: None,
        };
        assert!(
            !already_gone(&unanswered),
            "a release the store did not answer must warn"
        );
        assert!(!already_gone(&Error::Timeout(
            std::time::Duration::from_secs(1)
        )));
    }
}
