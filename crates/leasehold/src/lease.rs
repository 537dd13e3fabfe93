//! The lease core: every decision a holder makes about its lease and the
//! grants attached to it, with no I/O, no task and no clock.
//!
//! An event goes in together with the instant it happened at; the actions
//! to take come out. [`crate::Session`] and [`crate::Leadership`] are the
//! shell around it: they read the clock, talk to the store, and do what the
//! actions say. Because time is an argument, the rules below are tested as
//! exact sequences of actions (this module's tests), and the same code runs
//! in the process, under simulated time and in the simulation.
//!
//! The rules (DESIGN rule 3 and the renewal rule):
//! - The lease is valid until `sent + ttl·(1 − drift) − skew`, counted from
//!   when the last *confirmed* renewal was **sent**, never from its reply.
//! - A renewal is due `renew_every` after the last confirmed one was sent
//!   (shortened when the store grants a smaller TTL); a failed renewal is
//!   retried sooner, until the deadline.
//! - At the deadline every grant is stepped down, the session is over, and
//!   it is closed in the store (best effort) so the next holder need not
//!   wait for the store's own expiry.
//! - The store saying the session ended ends everything at once.
//! - Resigning signals the step-down before it releases; the release names
//!   the token, so it can never remove a successor's grant.
//! - Each grant is stepped down once; a release is only ever asked for a
//!   grant this session holds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::config::LeaseConfig;
use crate::grant::FencingToken;
use crate::names::ElectionName;

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
    /// The holder released the election to hand it over on request (a
    /// transfer, or a waiting candidate of higher priority).
    HandedOver,
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
            LostReason::HandedOver => f.write_str("handed over on request"),
            LostReason::Closed => f.write_str("session closed"),
        }
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
            DeadlinePolicy::Conservative => config.validity(ttl).map(|v| sent + v),
            DeadlinePolicy::FromReplyUnsafe => Some(replied + ttl),
        }
    }
}

/// What happened, as the shell tells the core.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseEvent {
    /// A timer the core asked for ([`LeaseAction::WakeAt`]) went off, or
    /// the shell simply wants the core to look at the time.
    Tick,
    /// The store confirmed the renewal sent at `sent`, with the TTL it
    /// granted.
    RenewalConfirmed {
        /// When the confirmed request was sent.
        sent: Instant,
        /// The TTL the store granted.
        granted_ttl: Duration,
    },
    /// The renewal failed (it is retried until the deadline).
    RenewalFailed {
        /// Why, for the step-down reason if the deadline passes.
        error: String,
    },
    /// The store reported the session expired or closed.
    SessionEnded,
    /// A campaign on this session won `election` with `token`.
    GrantAcquired {
        /// The election won.
        election: ElectionName,
        /// Its fencing token.
        token: FencingToken,
    },
    /// The store shows `election` held by another grant, or by none.
    GrantVanished {
        /// The election.
        election: ElectionName,
        /// The grant's token (a later grant of the same election is
        /// another grant).
        token: FencingToken,
    },
    /// The protected resource refused this holder's token as stale.
    Superseded {
        /// The election.
        election: ElectionName,
        /// The grant's token (a later grant of the same election is
        /// another grant).
        token: FencingToken,
    },
    /// The holder lets `election` go (resign, or its handle was dropped).
    Resign {
        /// The election.
        election: ElectionName,
        /// The grant's token (a later grant of the same election is
        /// another grant).
        token: FencingToken,
    },
    /// The holder lets `election` go to hand it over on request: as
    /// [`LeaseEvent::Resign`], with [`LostReason::HandedOver`].
    HandOver {
        /// The election.
        election: ElectionName,
        /// The grant's token.
        token: FencingToken,
    },
    /// This process closes the session.
    Close,
}

/// What the shell must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseAction {
    /// Send a renewal now, then report its outcome
    /// ([`LeaseEvent::RenewalConfirmed`] or [`LeaseEvent::RenewalFailed`]).
    Renew,
    /// Wake the core with [`LeaseEvent::Tick`] at this instant; replaces
    /// any earlier request. Asked for only when the instant moves; a shell
    /// may also tick at any other time.
    WakeAt(Instant),
    /// The lease is now known valid until this instant: tell whoever must
    /// stop the work by then (the holders, a supervisor outside the
    /// process).
    Deadline(Instant),
    /// The renewal sent at `sent` got no answer before the deadline: report
    /// it as failed.
    RenewalAbandoned {
        /// When it was sent.
        sent: Instant,
    },
    /// Leadership of `election` (with `token`) ended: signal it to the
    /// holder at once.
    StepDown {
        /// The election.
        election: ElectionName,
        /// The token of the grant that ended.
        token: FencingToken,
        /// Why.
        reason: LostReason,
    },
    /// The session is over, for this reason; it never comes back.
    SessionLost(LostReason),
    /// Release `election`'s grant in the store, guarded by `token`.
    Release {
        /// The election.
        election: ElectionName,
        /// The token of the grant to release.
        token: FencingToken,
    },
    /// Close the session in the store (best effort): frees its grants for
    /// the next holder sooner than the store's expiry would.
    CloseSession,
}

/// A grant attached to the session.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Held {
    token: FencingToken,
    lost: Option<LostReason>,
}

/// The state of one session's lease and of the grants attached to it.
#[derive(Clone, Debug)]
pub struct LeaseState {
    config: LeaseConfig,
    policy: DeadlinePolicy,
    /// Until when the lease is known valid.
    deadline: Instant,
    /// When the next renewal is due.
    next_renewal: Instant,
    /// The pause before retrying a failed renewal.
    retry: Duration,
    /// When the renewal in flight was sent.
    in_flight: Option<Instant>,
    /// Why the last renewal failed, while renewals fail.
    last_error: Option<String>,
    ended: Option<LostReason>,
    held: BTreeMap<ElectionName, Held>,
    /// The last grant of each election this session handed over, so that
    /// its lost reason says so after it is let go.
    handed_over: BTreeMap<ElectionName, FencingToken>,
    /// The wake-up last asked for, so that it is asked for only when it
    /// moves.
    armed: Option<Instant>,
}

/// The store granted a TTL that leaves no validity after drift and skew.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoValidity;

impl LeaseState {
    /// The state of a session whose opening request was sent at `sent` and
    /// granted `granted_ttl`. Fails if the granted TTL leaves no validity.
    #[cfg(test)]
    pub fn open(
        config: LeaseConfig,
        sent: Instant,
        granted_ttl: Duration,
    ) -> Result<Self, NoValidity> {
        Self::open_with(
            config,
            DeadlinePolicy::Conservative,
            sent,
            sent,
            granted_ttl,
        )
    }

    /// [`LeaseState::open`] with a deadline policy; `replied` is when the
    /// opening request was answered (only the unsafe policy reads it).
    pub(crate) fn open_with(
        config: LeaseConfig,
        policy: DeadlinePolicy,
        sent: Instant,
        replied: Instant,
        granted_ttl: Duration,
    ) -> Result<Self, NoValidity> {
        let deadline = policy
            .deadline(&config, sent, replied, granted_ttl)
            .ok_or(NoValidity)?;
        let renew_every = config.renew_period_for(granted_ttl);
        Ok(LeaseState {
            config,
            policy,
            deadline,
            next_renewal: sent + renew_every,
            retry: (renew_every / 4).max(Duration::from_millis(5)),
            in_flight: None,
            last_error: None,
            ended: None,
            held: BTreeMap::new(),
            handed_over: BTreeMap::new(),
            armed: None,
        })
    }

    /// Until when the lease is known valid.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Why the session ended, once it has (a deadline passed without a
    /// [`LeaseEvent::Tick`] does not count yet: see [`LeaseState::over_at`]).
    pub fn ended(&self) -> Option<&LostReason> {
        self.ended.as_ref()
    }

    /// Why the last renewal failed, while renewals fail.
    #[cfg(test)]
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// When the core next needs a [`LeaseEvent::Tick`], if ever.
    pub fn next_wake(&self) -> Option<Instant> {
        if self.ended.is_some() {
            return None;
        }
        Some(match self.in_flight {
            Some(_) => self.deadline,
            None => self.deadline.min(self.next_renewal),
        })
    }

    /// Why the session is over at `now`, if it is: ended, or past its
    /// deadline even if no [`LeaseEvent::Tick`] has said so yet.
    pub fn over_at(&self, now: Instant) -> Option<LostReason> {
        if let Some(reason) = &self.ended {
            return Some(reason.clone());
        }
        (now >= self.deadline).then(|| LostReason::DeadlineExpired {
            last_error: self.last_error.clone(),
        })
    }

    /// Why leadership of `election` with `token` is over at `now`, if it
    /// is (a grant this session does not hold is over).
    pub fn lost_at(
        &self,
        election: &ElectionName,
        token: FencingToken,
        now: Instant,
    ) -> Option<LostReason> {
        match self.held.get(election) {
            Some(held) if held.token == token => held.lost.clone().or_else(|| self.over_at(now)),
            _ if self.handed_over.get(election) == Some(&token) => Some(LostReason::HandedOver),
            _ => Some(LostReason::Resigned),
        }
    }

    /// Feeds `event`, which happened at `now`; returns what to do, in order.
    pub fn handle(&mut self, now: Instant, event: LeaseEvent) -> Vec<LeaseAction> {
        let mut actions = Vec::new();
        match event {
            LeaseEvent::Tick => {}
            LeaseEvent::RenewalConfirmed { sent, granted_ttl } => {
                self.confirmed(now, sent, granted_ttl, &mut actions);
            }
            LeaseEvent::RenewalFailed { error } => {
                if self.ended.is_none() {
                    self.in_flight = None;
                    self.last_error = Some(error);
                    self.next_renewal = now + self.retry;
                }
            }
            LeaseEvent::SessionEnded => self.end(LostReason::SessionExpired, &mut actions),
            LeaseEvent::GrantAcquired { election, token } => {
                self.acquired(now, election, token, &mut actions);
            }
            LeaseEvent::GrantVanished { election, token }
            | LeaseEvent::Superseded { election, token } => {
                self.step_down(&election, token, LostReason::Superseded, &mut actions);
            }
            LeaseEvent::Resign { election, token } => {
                self.let_go(election, token, LostReason::Resigned, &mut actions);
            }
            LeaseEvent::HandOver { election, token } => {
                self.let_go(election, token, LostReason::HandedOver, &mut actions);
            }
            LeaseEvent::Close => {
                if self.ended.is_none() {
                    self.end(LostReason::Closed, &mut actions);
                    actions.push(LeaseAction::CloseSession);
                }
            }
        }
        self.look_at_the_time(now, &mut actions);
        actions
    }

    /// A grant acquired on this session: held, and stepped down from at
    /// once if the session is already over.
    fn acquired(
        &mut self,
        now: Instant,
        election: ElectionName,
        token: FencingToken,
        actions: &mut Vec<LeaseAction>,
    ) {
        let lost = self.over_at(now);
        if let Some(reason) = &lost {
            actions.push(LeaseAction::StepDown {
                election: election.clone(),
                token,
                reason: reason.clone(),
            });
        }
        self.held.insert(election, Held { token, lost });
    }

    /// A grant given up (`reason`: resigned or handed over): stepped down
    /// from, and released if it is still held.
    fn let_go(
        &mut self,
        election: ElectionName,
        token: FencingToken,
        reason: LostReason,
        actions: &mut Vec<LeaseAction>,
    ) {
        if reason == LostReason::HandedOver {
            self.handed_over.insert(election.clone(), token);
        }
        self.step_down(&election, token, reason, actions);
        if self.held.get(&election).is_some_and(|h| h.token == token) {
            self.held.remove(&election);
            actions.push(LeaseAction::Release { election, token });
        }
    }

    fn confirmed(
        &mut self,
        now: Instant,
        sent: Instant,
        granted_ttl: Duration,
        actions: &mut Vec<LeaseAction>,
    ) {
        if self.ended.is_some() {
            return;
        }
        self.in_flight = None;
        let Some(deadline) = self.policy.deadline(&self.config, sent, now, granted_ttl) else {
            // The store shortened the TTL below any validity: the lease
            // cannot be kept, so it is over now.
            self.last_error = None;
            self.deadline = self.deadline.min(now);
            return;
        };
        self.last_error = None;
        self.deadline = deadline;
        self.next_renewal = sent + self.config.renew_period_for(granted_ttl);
        actions.push(LeaseAction::Deadline(deadline));
    }

    /// The deadline, a due renewal, and the next wake-up.
    fn look_at_the_time(&mut self, now: Instant, actions: &mut Vec<LeaseAction>) {
        if self.ended.is_some() {
            return;
        }
        if now >= self.deadline {
            if let Some(sent) = self.in_flight.take() {
                actions.push(LeaseAction::RenewalAbandoned { sent });
            }
            let reason = LostReason::DeadlineExpired {
                last_error: self.last_error.clone(),
            };
            self.end(reason, actions);
            actions.push(LeaseAction::CloseSession);
            return;
        }
        if self.in_flight.is_none() && now >= self.next_renewal {
            // Sent now: the shell sends it as it carries the action out.
            self.in_flight = Some(now);
            actions.push(LeaseAction::Renew);
        }
        let wake = self.next_wake();
        if wake != self.armed {
            self.armed = wake;
            if let Some(at) = wake {
                actions.push(LeaseAction::WakeAt(at));
            }
        }
    }

    fn step_down(
        &mut self,
        election: &ElectionName,
        token: FencingToken,
        reason: LostReason,
        actions: &mut Vec<LeaseAction>,
    ) {
        if let Some(held) = self.held.get_mut(election)
            && held.token == token
            && held.lost.is_none()
        {
            held.lost = Some(reason.clone());
            actions.push(LeaseAction::StepDown {
                election: election.clone(),
                token: held.token,
                reason,
            });
        }
    }

    fn end(&mut self, reason: LostReason, actions: &mut Vec<LeaseAction>) {
        if self.ended.is_some() {
            return;
        }
        self.in_flight = None;
        let held: Vec<(ElectionName, FencingToken)> = self
            .held
            .iter()
            .map(|(e, h)| (e.clone(), h.token))
            .collect();
        for (election, token) in &held {
            self.step_down(election, *token, reason.clone(), actions);
        }
        self.ended = Some(reason.clone());
        actions.push(LeaseAction::SessionLost(reason));
    }
}

#[cfg(test)]
mod tests;
