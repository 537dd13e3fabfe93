//! When and how a term's command is stopped, decided by a pure machine in
//! the style of the library's lease core: what happens to the term (the
//! lease deadline at risk, leadership lost, the store's file gone, a
//! request to stop, hand over or move, a kill deadline reached) comes in
//! with the instant, and the signals to send go out. [`crate::term`]
//! carries them out and waits for the command's whole tree to be gone.
//!
//! The rules:
//! - Leadership lost, or the store's file gone: the command is killed at
//!   once (SIGTERM then SIGKILL; SIGKILL alone for the file), and nothing
//!   else acts any more.
//! - No renewal confirmed `lead` before the deadline (the grace period,
//!   at most a renewal period): the command is asked to stop (SIGTERM) and
//!   killed at the deadline, so that it can exit cleanly before the
//!   guard's SIGKILL there.
//! - A stop, a handover or a move: the command is asked to stop and killed
//!   after the grace period, never later than the lease deadline (which
//!   renewals move on meanwhile: a grace longer than the TTL is honoured
//!   while they succeed).
//! - Once stopping, later requests and the deadline's warning send
//!   nothing more; a loss still kills at once. A stop signal `run` is
//!   told while handing over or moving is remembered, and so is one
//!   that a loss interrupts: `run` exits with the command's status.

use std::time::Duration;

use leasehold::{Handover, LostReason};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::signals::{AnySignal, forwarded_as};

/// Why a term of leadership ended.
#[derive(Debug)]
pub enum TermEnd {
    /// The command exited by itself.
    Exited,
    /// Leadership was lost; the command was killed.
    Lost(LostReason),
    /// The command was stopped before the lease deadline, for this reason
    /// (renewals failing, or the guard killed it on its own).
    AtRisk(&'static str),
    /// `run` was told to stop by this signal; it was forwarded (SIGHUP and
    /// SIGPWR as SIGTERM).
    Stopped(Signal),
    /// `run` was told to stop by this signal, and leadership was lost
    /// while the command was stopping: it was killed, nothing is left to
    /// release, and `run` still exits.
    StoppedAndLost(Signal, LostReason),
    /// Asked to hand over (a transfer, a higher priority): the command was
    /// stopped as for SIGTERM, then the election is handed over.
    HandedOver(Handover),
    /// The group's assignment moved the shard to another member: the
    /// command was stopped as for SIGTERM, then the shard is released.
    Moved,
}

/// Why `run` kills a command whose SQLite store's file is gone from its path.
pub(crate) const STORE_GONE: &str = "the store's database file is no longer at its path";

/// Why a command is stopped before the lease deadline when renewals fail.
pub const RENEWALS_FAILING: &str = "renewals failing; stopped before the lease deadline";

/// What the supervisor sends the command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deliver {
    /// This signal to the command's process group.
    Group(Signal),
    /// A signal passed through to the command as `run` received it.
    Pass(AnySignal),
}

/// What may stop a term's command.
#[derive(Clone, Debug)]
pub(crate) enum Cause {
    /// `run` was told to stop by this signal.
    Stop(Signal),
    /// Asked to hand over.
    HandOver(Handover),
    /// The shard moved to another member.
    Moved,
}

/// A term's stopping (see the [module](self)).
#[derive(Debug)]
pub(crate) struct Stopping {
    grace: Duration,
    lead: Duration,
    why: TermEnd,
    kill_at: Option<Instant>,
    /// The end of the grace period a stop gave the command.
    grace_until: Option<Instant>,
    lost: bool,
}

impl Stopping {
    /// A term whose command may take `grace` to exit once asked to stop,
    /// renewed every `renew_every`.
    pub(crate) fn new(grace: Duration, renew_every: Duration) -> Self {
        Stopping {
            grace,
            lead: grace.min(renew_every),
            why: TermEnd::Exited,
            kill_at: None,
            grace_until: None,
            lost: false,
        }
    }

    /// Whether the command was asked to stop (or killed).
    pub(crate) fn stopping(&self) -> bool {
        !matches!(self.why, TermEnd::Exited)
    }

    /// Whether leadership is lost (or the store's file gone): nothing but
    /// the command's end matters any more.
    pub(crate) fn lost(&self) -> bool {
        self.lost
    }

    /// When the command is killed if it has not exited.
    pub(crate) fn kill_at(&self) -> Option<Instant> {
        self.kill_at
    }

    /// When the lease ending at `deadline` is at risk, if no renewal
    /// moved it by then.
    pub(crate) fn at_risk_at(&self, deadline: Instant) -> Instant {
        deadline.checked_sub(self.lead).unwrap_or(deadline)
    }

    /// Why the term ends, as far as this machine knows.
    pub(crate) fn into_why(self) -> TermEnd {
        self.why
    }

    /// Why the term ends, as far as this machine knows, without ending it.
    #[cfg(test)]
    pub(crate) fn why(&self) -> &TermEnd {
        &self.why
    }

    /// Leadership was lost for `reason`.
    pub(crate) fn leadership_lost(&mut self, reason: LostReason) -> Vec<Deliver> {
        if self.lost {
            return Vec::new();
        }
        self.lost = true;
        self.why = match std::mem::replace(&mut self.why, TermEnd::Exited) {
            TermEnd::Stopped(signal) => TermEnd::StoppedAndLost(signal, reason),
            _ => TermEnd::Lost(reason),
        };
        vec![
            Deliver::Group(Signal::SIGTERM),
            Deliver::Group(Signal::SIGKILL),
        ]
    }

    /// The store's database file is no longer at its path.
    pub(crate) fn store_gone(&mut self) -> Vec<Deliver> {
        if self.lost {
            return Vec::new();
        }
        self.lost = true;
        // Told to stop, `run` still exits.
        if !matches!(self.why, TermEnd::Stopped(_)) {
            self.why = TermEnd::AtRisk(STORE_GONE);
        }
        vec![Deliver::Group(Signal::SIGKILL)]
    }

    /// The at-risk instant of the deadline `seen` passed; the lease's
    /// deadline is `now_deadline` now. Unless a renewal moved it, the
    /// command is asked to stop and killed at that deadline.
    pub(crate) fn at_risk(&mut self, seen: Instant, now_deadline: Instant) -> Vec<Deliver> {
        if self.stopping() || now_deadline > seen {
            return Vec::new();
        }
        self.kill_at = Some(seen);
        self.why = TermEnd::AtRisk(RENEWALS_FAILING);
        vec![Deliver::Group(Signal::SIGTERM)]
    }

    /// Whether the kill due now comes from the lease deadline, before the
    /// end of the grace period a stop gave (or at risk, where the deadline
    /// is the only limit).
    pub(crate) fn kill_is_the_deadline(&self) -> bool {
        match (self.kill_at, self.grace_until) {
            (Some(kill_at), Some(until)) => kill_at < until,
            _ => true,
        }
    }

    /// The kill instant passed with the command still there.
    pub(crate) fn kill_due(&mut self) -> Vec<Deliver> {
        match self.kill_at.take() {
            Some(_) => vec![Deliver::Group(Signal::SIGKILL)],
            None => Vec::new(),
        }
    }

    /// Asked at `now` to stop for `cause`, the lease's deadline being
    /// `deadline`: the command is asked to stop, and killed after the
    /// grace period or at the deadline, whichever comes first.
    pub(crate) fn stop(&mut self, cause: Cause, now: Instant, deadline: Instant) -> Vec<Deliver> {
        if self.stopping() {
            // Told to stop while handing over or moving: the command is
            // stopping already, and `run` now exits afterwards.
            if let (Cause::Stop(signal), TermEnd::HandedOver(_) | TermEnd::Moved) =
                (&cause, &self.why)
            {
                self.why = TermEnd::Stopped(*signal);
            }
            return Vec::new();
        }
        let (signal, why) = match cause {
            // SIGHUP and SIGPWR reach the command as SIGTERM.
            Cause::Stop(signal) => (forwarded_as(signal), TermEnd::Stopped(signal)),
            Cause::HandOver(handover) => (Signal::SIGTERM, TermEnd::HandedOver(handover)),
            Cause::Moved => (Signal::SIGTERM, TermEnd::Moved),
        };
        let grace_until = now + self.grace;
        self.grace_until = Some(grace_until);
        self.kill_at = Some(grace_until.min(deadline));
        self.why = why;
        vec![Deliver::Group(signal)]
    }

    /// A renewal moved the lease deadline to `deadline`: a stopped
    /// command's kill, held back by the old deadline, moves with it up to
    /// the end of its grace period.
    pub(crate) fn deadline_moved(&mut self, deadline: Instant) {
        if let (Some(kill_at), Some(until)) = (&mut self.kill_at, self.grace_until) {
            *kill_at = (*kill_at).max(until.min(deadline));
        }
    }
}

#[cfg(test)]
mod tests;
