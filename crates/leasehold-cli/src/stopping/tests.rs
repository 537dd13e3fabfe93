//! The stopping rules as exact sequences of signals.

use std::sync::OnceLock;

use leasehold::HandoverCause;

use super::*;

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// `ms` milliseconds after the origin.
fn t(ms: u64) -> Instant {
    origin() + Duration::from_millis(ms)
}

const TERM: Deliver = Deliver::Group(Signal::SIGTERM);
const KILL: Deliver = Deliver::Group(Signal::SIGKILL);

/// Grace 5 s, renewed every 2 s: at risk 2 s before the deadline.
fn term() -> Stopping {
    Stopping::new(Duration::from_secs(5), Duration::from_secs(2))
}

#[test]
fn a_lost_leadership_kills_at_once_and_nothing_acts_afterwards() {
    let mut s = term();
    assert_eq!(s.leadership_lost(LostReason::Resigned), vec![TERM, KILL]);
    assert!(s.lost() && s.stopping());
    assert_eq!(s.leadership_lost(LostReason::Resigned), []);
    assert_eq!(s.store_gone(), []);
    assert_eq!(s.stop(Cause::Moved, t(0), t(10_000)), []);
    assert!(matches!(s.into_why(), TermEnd::Lost(LostReason::Resigned)));
}

/// Found by a review: a loss during the grace period of a SIGTERM made
/// `run` forget it, campaign again and start a second command.
#[test]
fn a_loss_while_stopping_on_a_signal_kills_and_still_ends_run() {
    let mut s = term();
    let stop = Cause::Stop(Signal::SIGTERM);
    assert_eq!(s.stop(stop, t(0), t(10_000)), vec![TERM]);
    assert_eq!(s.leadership_lost(LostReason::Resigned), vec![TERM, KILL]);
    assert!(matches!(
        s.into_why(),
        TermEnd::StoppedAndLost(Signal::SIGTERM, LostReason::Resigned)
    ));
    // The store's file gone instead: killed, still stopped.
    let mut s = term();
    assert_eq!(
        s.stop(Cause::Stop(Signal::SIGINT), t(0), t(10_000)),
        vec![Deliver::Group(Signal::SIGINT)]
    );
    assert_eq!(s.store_gone(), vec![KILL]);
    assert!(matches!(s.into_why(), TermEnd::Stopped(Signal::SIGINT)));
}

#[test]
fn a_store_file_gone_kills_without_asking_first() {
    let mut s = term();
    assert_eq!(s.store_gone(), vec![KILL]);
    assert!(matches!(s.why(), TermEnd::AtRisk(why) if *why == STORE_GONE));
    // A loss afterwards changes neither the signals nor the reason.
    assert_eq!(s.leadership_lost(LostReason::Resigned), []);
    assert!(matches!(s.into_why(), TermEnd::AtRisk(_)));
}

#[test]
fn at_risk_the_command_is_asked_to_stop_and_killed_at_the_deadline() {
    let mut s = term();
    let deadline = t(10_000);
    assert_eq!(
        s.at_risk_at(deadline),
        t(8_000),
        "the lead is a renewal period"
    );
    assert_eq!(s.at_risk(deadline, deadline), vec![TERM]);
    assert_eq!(s.kill_at(), Some(deadline));
    assert!(matches!(s.why(), TermEnd::AtRisk(why) if *why == RENEWALS_FAILING));
    assert_eq!(s.kill_due(), vec![KILL]);
    assert_eq!(s.kill_due(), [], "killed once");
}

#[test]
fn a_renewal_that_moved_the_deadline_takes_the_risk_away() {
    let mut s = term();
    assert_eq!(s.at_risk(t(10_000), t(12_000)), []);
    assert!(!s.stopping());
    assert_eq!(s.kill_at(), None);
}

#[test]
fn a_stop_kills_after_the_grace_period_but_never_after_the_deadline() {
    let mut s = term();
    assert_eq!(
        s.stop(Cause::Stop(Signal::SIGINT), t(0), t(60_000)),
        vec![Deliver::Group(Signal::SIGINT)]
    );
    assert_eq!(s.kill_at(), Some(t(5_000)), "after the grace period");
    let mut s = term();
    s.stop(Cause::Moved, t(0), t(3_000));
    assert_eq!(s.kill_at(), Some(t(3_000)), "no later than the deadline");
    assert!(matches!(s.into_why(), TermEnd::Moved));
}

#[test]
fn sighup_and_sigpwr_reach_the_command_as_sigterm() {
    for signal in [Signal::SIGHUP, Signal::SIGPWR] {
        let mut s = term();
        assert_eq!(s.stop(Cause::Stop(signal), t(0), t(60_000)), vec![TERM]);
        assert!(matches!(s.into_why(), TermEnd::Stopped(got) if got == signal));
    }
}

#[test]
fn once_stopping_later_requests_and_the_risk_change_nothing_but_a_loss_kills() {
    let mut s = term();
    let handover = Handover {
        cause: HandoverCause::Transfer,
        to: None,
    };
    assert_eq!(
        s.stop(Cause::HandOver(handover), t(0), t(60_000)),
        vec![TERM]
    );
    assert_eq!(s.at_risk(t(60_000), t(60_000)), []);
    assert_eq!(s.kill_at(), Some(t(5_000)));
    assert!(matches!(s.why(), TermEnd::HandedOver(_)));
    assert_eq!(s.leadership_lost(LostReason::Resigned), vec![TERM, KILL]);
    assert!(matches!(s.into_why(), TermEnd::Lost(_)));
}

/// Found by a review: a SIGTERM while the command stopped for a transfer
/// was left for the next campaign, and `run` exited 0 instead of with
/// the command's status. It now sends nothing more, keeps the grace
/// period, and makes the term end as a stop.
#[test]
fn a_stop_signal_while_handing_over_ends_run_after_the_handover() {
    for first in [
        Cause::Moved,
        Cause::HandOver(Handover {
            cause: HandoverCause::Transfer,
            to: None,
        }),
    ] {
        let mut s = term();
        assert_eq!(s.stop(first, t(0), t(60_000)), vec![TERM]);
        assert_eq!(s.stop(Cause::Stop(Signal::SIGINT), t(1), t(60_000)), []);
        assert_eq!(s.kill_at(), Some(t(5_000)));
        assert!(matches!(s.why(), TermEnd::Stopped(Signal::SIGINT)));
        // A second signal changes nothing.
        assert_eq!(s.stop(Cause::Stop(Signal::SIGTERM), t(2), t(60_000)), []);
        assert!(matches!(s.into_why(), TermEnd::Stopped(Signal::SIGINT)));
    }
}

#[test]
fn a_stop_s_kill_follows_the_deadline_renewals_move_up_to_the_grace_period() {
    let mut s = term();
    s.stop(Cause::Stop(Signal::SIGTERM), t(0), t(3_000));
    assert_eq!(s.kill_at(), Some(t(3_000)));
    s.deadline_moved(t(4_000));
    assert_eq!(s.kill_at(), Some(t(4_000)));
    s.deadline_moved(t(9_000));
    assert_eq!(
        s.kill_at(),
        Some(t(5_000)),
        "no later than the grace period"
    );
    // Once killed, a later renewal arms nothing.
    assert_eq!(s.kill_due(), vec![KILL]);
    s.deadline_moved(t(12_000));
    assert_eq!(s.kill_at(), None);
}

#[test]
fn at_risk_the_kill_stays_at_the_deadline_that_was_at_risk() {
    let mut s = term();
    s.at_risk(t(10_000), t(10_000));
    s.deadline_moved(t(14_000));
    assert_eq!(s.kill_at(), Some(t(10_000)));
}

#[test]
fn a_kill_says_whether_the_deadline_or_the_grace_period_came_first() {
    let mut s = term();
    s.stop(Cause::Stop(Signal::SIGTERM), t(0), t(60_000));
    assert!(
        !s.kill_is_the_deadline(),
        "killed at the end of the grace period"
    );
    let mut s = term();
    s.stop(Cause::Stop(Signal::SIGTERM), t(0), t(3_000));
    assert!(
        s.kill_is_the_deadline(),
        "killed at the deadline, 2 s early"
    );
    let mut s = term();
    s.at_risk(t(10_000), t(10_000));
    assert!(
        s.kill_is_the_deadline(),
        "at risk: the deadline is the limit"
    );
}
