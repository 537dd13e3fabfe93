//! The lease core's rules as exact sequences of actions, and properties
//! over random sequences of events.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

/// A fixed origin, so that instants print as offsets from it.
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// `ms` milliseconds after the origin.
fn t(ms: u64) -> Instant {
    origin() + Duration::from_millis(ms)
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// TTL 10 s, renewed every 3 s, no drift, 100 ms skew: valid for 9.9 s
/// after a renewal is sent.
fn config() -> LeaseConfig {
    LeaseConfig {
        ttl: ms(10_000),
        renew_every: ms(3_000),
        drift: 0.0,
        skew: ms(100),
    }
}

fn election(name: &str) -> ElectionName {
    ElectionName::new(name).expect("a valid name")
}

/// A session opened by a request sent at 0 and answered at `replied`,
/// granted the TTL it asked for.
fn opened(replied: u64) -> LeaseState {
    LeaseState::open_with(
        config(),
        DeadlinePolicy::Conservative,
        t(0),
        t(replied),
        ms(10_000),
    )
    .expect("valid")
}

/// `opened(0)` holding `job` with token 7.
fn leading() -> LeaseState {
    let mut lease = opened(0);
    let actions = lease.handle(
        t(10),
        LeaseEvent::GrantAcquired {
            election: election("job"),
            token: FencingToken(7),
        },
    );
    assert_eq!(actions, vec![LeaseAction::WakeAt(t(3_000))]);
    lease
}

fn step_down(reason: LostReason) -> LeaseAction {
    LeaseAction::StepDown {
        election: election("job"),
        token: FencingToken(7),
        reason,
    }
}

#[test]
fn the_deadline_counts_from_when_the_renewal_was_sent() {
    // Opened by a request sent at 0 that took 2 s to answer: valid until
    // 9.9 s, not 11.9 s.
    let mut lease = opened(2_000);
    assert_eq!(lease.deadline(), t(9_900));
    assert_eq!(
        lease.handle(t(2_000), LeaseEvent::Tick),
        vec![LeaseAction::WakeAt(t(3_000))]
    );
    assert_eq!(
        lease.handle(t(3_000), LeaseEvent::Tick),
        vec![LeaseAction::Renew, LeaseAction::WakeAt(t(9_900))]
    );
    // Confirmed 2 s after it was sent: valid until 3 s + 9.9 s, renewed
    // again 3 s after it was sent.
    assert_eq!(
        lease.handle(
            t(5_000),
            LeaseEvent::RenewalConfirmed {
                sent: t(3_000),
                granted_ttl: ms(10_000)
            }
        ),
        vec![
            LeaseAction::Deadline(t(12_900)),
            LeaseAction::WakeAt(t(6_000))
        ]
    );
}

#[test]
fn the_holder_steps_down_at_the_deadline() {
    let mut lease = leading();
    assert_eq!(
        lease.handle(t(3_000), LeaseEvent::Tick),
        vec![LeaseAction::Renew, LeaseAction::WakeAt(t(9_900))]
    );
    // Just before the deadline it still leads; at the deadline the hung
    // renewal is given up, the holder told first, the session closed.
    assert_eq!(
        lease.lost_at(&election("job"), FencingToken(7), t(9_899)),
        None
    );
    let lost = LostReason::DeadlineExpired { last_error: None };
    assert_eq!(
        lease.lost_at(&election("job"), FencingToken(7), t(9_900)),
        Some(lost.clone())
    );
    assert_eq!(
        lease.handle(t(9_900), LeaseEvent::Tick),
        vec![
            LeaseAction::RenewalAbandoned { sent: t(3_000) },
            step_down(lost.clone()),
            LeaseAction::SessionLost(lost),
            LeaseAction::CloseSession,
        ]
    );
    // Over for good: a late confirmation changes nothing.
    assert_eq!(
        lease.handle(
            t(9_950),
            LeaseEvent::RenewalConfirmed {
                sent: t(3_000),
                granted_ttl: ms(10_000)
            }
        ),
        vec![]
    );
    assert!(lease.over_at(t(9_950)).is_some());
}

#[test]
fn a_lost_renewal_is_ridden_out() {
    let mut lease = leading();
    assert_eq!(
        lease.handle(t(3_000), LeaseEvent::Tick),
        vec![LeaseAction::Renew, LeaseAction::WakeAt(t(9_900))]
    );
    // Failed: retried a quarter period later (750 ms), the holder still
    // leads.
    assert_eq!(
        lease.handle(
            t(3_500),
            LeaseEvent::RenewalFailed {
                error: "timeout".into()
            }
        ),
        vec![LeaseAction::WakeAt(t(4_250))]
    );
    assert_eq!(lease.last_error(), Some("timeout"));
    assert_eq!(
        lease.handle(t(4_250), LeaseEvent::Tick),
        vec![LeaseAction::Renew, LeaseAction::WakeAt(t(9_900))]
    );
    assert_eq!(
        lease.handle(
            t(4_300),
            LeaseEvent::RenewalConfirmed {
                sent: t(4_250),
                granted_ttl: ms(10_000)
            }
        ),
        vec![
            LeaseAction::Deadline(t(14_150)),
            LeaseAction::WakeAt(t(7_250))
        ]
    );
    assert_eq!(lease.last_error(), None);
    assert_eq!(
        lease.lost_at(&election("job"), FencingToken(7), t(14_000)),
        None
    );
}

#[test]
fn renewals_failing_until_the_deadline_name_the_last_error() {
    let mut lease = leading();
    let mut now = 3_000;
    let mut last = 0;
    while now < 9_900 {
        let actions = lease.handle(t(now), LeaseEvent::Tick);
        assert_eq!(actions.first(), Some(&LeaseAction::Renew), "at {now} ms");
        last += 1;
        lease.handle(
            t(now),
            LeaseEvent::RenewalFailed {
                error: format!("refused {last}"),
            },
        );
        now += 750;
    }
    let lost = LostReason::DeadlineExpired {
        last_error: Some(format!("refused {last}")),
    };
    assert_eq!(
        lease.handle(t(9_900), LeaseEvent::Tick),
        vec![
            step_down(lost.clone()),
            LeaseAction::SessionLost(lost),
            LeaseAction::CloseSession
        ]
    );
}

#[test]
fn the_session_ended_by_the_store_ends_leadership_at_once() {
    let mut lease = leading();
    assert_eq!(
        lease.handle(t(1_000), LeaseEvent::SessionEnded),
        vec![
            step_down(LostReason::SessionExpired),
            LeaseAction::SessionLost(LostReason::SessionExpired),
        ]
    );
    assert_eq!(lease.next_wake(), None);
    assert_eq!(lease.handle(t(3_000), LeaseEvent::Tick), vec![]);
    assert_eq!(lease.handle(t(9_900), LeaseEvent::Tick), vec![]);
}

#[test]
fn resigning_signals_before_it_releases_with_the_token() {
    let mut lease = leading();
    assert_eq!(
        lease.handle(
            t(1_000),
            LeaseEvent::Resign {
                election: election("job"),
                token: FencingToken(7)
            }
        ),
        vec![
            step_down(LostReason::Resigned),
            LeaseAction::Release {
                election: election("job"),
                token: FencingToken(7)
            },
        ]
    );
    // Released once: a second resign asks for nothing.
    assert_eq!(
        lease.handle(
            t(1_001),
            LeaseEvent::Resign {
                election: election("job"),
                token: FencingToken(7)
            }
        ),
        vec![]
    );
    // The session itself goes on.
    assert_eq!(lease.over_at(t(1_001)), None);
}

#[test]
fn a_superseded_grant_steps_down_once_and_is_still_released_by_token() {
    let mut lease = leading();
    assert_eq!(
        lease.handle(
            t(1_000),
            LeaseEvent::Superseded {
                election: election("job"),
                token: FencingToken(7)
            }
        ),
        vec![step_down(LostReason::Superseded)]
    );
    assert_eq!(
        lease.handle(
            t(1_001),
            LeaseEvent::GrantVanished {
                election: election("job"),
                token: FencingToken(7)
            }
        ),
        vec![]
    );
    assert_eq!(
        lease.handle(
            t(1_002),
            LeaseEvent::Resign {
                election: election("job"),
                token: FencingToken(7)
            }
        ),
        vec![LeaseAction::Release {
            election: election("job"),
            token: FencingToken(7)
        }]
    );
}

#[test]
fn a_grant_not_held_is_never_released() {
    let mut lease = opened(0);
    lease.handle(t(0), LeaseEvent::Tick);
    assert_eq!(
        lease.handle(
            t(1),
            LeaseEvent::Resign {
                election: election("job"),
                token: FencingToken(7)
            }
        ),
        vec![]
    );
    assert_eq!(
        lease.handle(
            t(2),
            LeaseEvent::GrantVanished {
                election: election("job"),
                token: FencingToken(7)
            }
        ),
        vec![]
    );
    assert_eq!(
        lease.lost_at(&election("job"), FencingToken(7), t(3)),
        Some(LostReason::Resigned)
    );
}

#[test]
fn the_renewal_period_shrinks_to_fit_a_smaller_granted_ttl() {
    // Asked for 10 s, granted 3.1 s: valid for 3 s, so renewed every 1 s
    // (a third of it) instead of every 3 s.
    let mut lease = LeaseState::open(config(), t(0), ms(3_100)).expect("valid");
    assert_eq!(lease.deadline(), t(3_000));
    assert_eq!(
        lease.handle(t(0), LeaseEvent::Tick),
        vec![LeaseAction::WakeAt(t(1_000))]
    );
    assert_eq!(
        lease.handle(t(1_000), LeaseEvent::Tick),
        vec![LeaseAction::Renew, LeaseAction::WakeAt(t(3_000))]
    );
    // A renewal that grants the full TTL again restores the period.
    assert_eq!(
        lease.handle(
            t(1_010),
            LeaseEvent::RenewalConfirmed {
                sent: t(1_000),
                granted_ttl: ms(10_000)
            }
        ),
        vec![
            LeaseAction::Deadline(t(10_900)),
            LeaseAction::WakeAt(t(4_000))
        ]
    );
}

#[test]
fn a_granted_ttl_without_validity_ends_the_session() {
    assert_eq!(
        LeaseState::open(config(), t(0), ms(100)).err(),
        Some(NoValidity)
    );
    let mut lease = leading();
    lease.handle(t(3_000), LeaseEvent::Tick);
    let lost = LostReason::DeadlineExpired { last_error: None };
    assert_eq!(
        lease.handle(
            t(3_010),
            LeaseEvent::RenewalConfirmed {
                sent: t(3_000),
                granted_ttl: ms(50)
            }
        ),
        vec![
            step_down(lost.clone()),
            LeaseAction::SessionLost(lost),
            LeaseAction::CloseSession
        ]
    );
}

#[test]
fn closing_steps_down_then_closes_once() {
    let mut lease = leading();
    assert_eq!(
        lease.handle(t(1_000), LeaseEvent::Close),
        vec![
            step_down(LostReason::Closed),
            LeaseAction::SessionLost(LostReason::Closed),
            LeaseAction::CloseSession,
        ]
    );
    assert_eq!(lease.handle(t(1_001), LeaseEvent::Close), vec![]);
}

#[test]
fn a_grant_won_on_a_session_already_over_is_stepped_down_at_once() {
    let mut lease = opened(0);
    lease.handle(t(0), LeaseEvent::SessionEnded);
    assert_eq!(
        lease.handle(
            t(1),
            LeaseEvent::GrantAcquired {
                election: election("job"),
                token: FencingToken(7)
            }
        ),
        vec![step_down(LostReason::SessionExpired)]
    );
}

#[test]
fn several_elections_on_one_session_end_together() {
    let mut lease = leading();
    lease.handle(
        t(20),
        LeaseEvent::GrantAcquired {
            election: election("other"),
            token: FencingToken(8),
        },
    );
    let actions = lease.handle(t(30), LeaseEvent::SessionEnded);
    assert_eq!(
        actions,
        vec![
            step_down(LostReason::SessionExpired),
            LeaseAction::StepDown {
                election: election("other"),
                token: FencingToken(8),
                reason: LostReason::SessionExpired,
            },
            LeaseAction::SessionLost(LostReason::SessionExpired),
        ]
    );
}

/// An event the shell could feed, before its time is chosen.
#[derive(Clone, Debug)]
enum Step {
    Tick,
    Confirm { ttl_ms: u64 },
    Fail,
    SessionEnded,
    Acquire { election: u8 },
    Vanish { election: u8, token: u64 },
    Supersede { election: u8, token: u64 },
    Resign { election: u8, token: u64 },
    Close,
}

fn step() -> impl Strategy<Value = (u64, Step)> {
    let election = 0u8..3;
    let step = prop_oneof![
        6 => Just(Step::Tick),
        4 => (1u64..20_000).prop_map(|ttl_ms| Step::Confirm { ttl_ms }),
        2 => Just(Step::Fail),
        1 => Just(Step::SessionEnded),
        2 => election.clone().prop_map(|election| Step::Acquire { election }),
        1 => (election.clone(), 1u64..12).prop_map(|(election, token)| Step::Vanish { election, token }),
        1 => (election.clone(), 1u64..12).prop_map(|(election, token)| Step::Supersede { election, token }),
        2 => (election, 1u64..12).prop_map(|(election, token)| Step::Resign { election, token }),
        1 => Just(Step::Close),
    ];
    (0u64..4_000, step)
}

proptest! {
    /// Whatever happens, in any order: nobody leads past `sent +
    /// validity(ttl)` of the last confirmed renewal; a release is only
    /// asked for a grant held, once; each grant is stepped down at most
    /// once; a renewal is asked for only when none is in flight.
    #[test]
    fn the_rules_hold_for_any_sequence_of_events(
        open_after in 0u64..3_000,
        steps in proptest::collection::vec(step(), 1..80),
    ) {
        let config = config();
        let mut lease = LeaseState::open_with(
            config, DeadlinePolicy::Conservative, t(0), t(open_after), ms(10_000),
        ).expect("valid");
        let mut now = open_after;
        // What the shell knows.
        let mut valid_until = t(0) + config.validity(ms(10_000)).expect("valid");
        let mut in_flight: Option<Instant> = None;
        let mut held: BTreeMap<ElectionName, FencingToken> = BTreeMap::new();
        let mut stepped_down: Vec<(ElectionName, FencingToken)> = Vec::new();
        let mut next_token = 1;
        for (pause, step) in steps {
            now += pause;
            let at = t(now);
            let event = match step {
                Step::Tick => LeaseEvent::Tick,
                Step::Confirm { ttl_ms } => match in_flight.take() {
                    Some(sent) => {
                        if let Some(validity) = config.validity(ms(ttl_ms)) {
                            valid_until = sent + validity;
                        }
                        LeaseEvent::RenewalConfirmed { sent, granted_ttl: ms(ttl_ms) }
                    }
                    None => LeaseEvent::Tick,
                },
                Step::Fail => match in_flight.take() {
                    Some(_) => LeaseEvent::RenewalFailed { error: "failed".into() },
                    None => LeaseEvent::Tick,
                },
                Step::SessionEnded => LeaseEvent::SessionEnded,
                Step::Acquire { election: e } => {
                    let name = election(&format!("e{e}"));
                    if held.contains_key(&name) {
                        LeaseEvent::Tick
                    } else {
                        next_token += 1;
                        held.insert(name.clone(), FencingToken(next_token));
                        LeaseEvent::GrantAcquired { election: name, token: FencingToken(next_token) }
                    }
                }
                Step::Vanish { election: e, token } => LeaseEvent::GrantVanished { election: election(&format!("e{e}")), token: FencingToken(token) },
                Step::Supersede { election: e, token } => LeaseEvent::Superseded { election: election(&format!("e{e}")), token: FencingToken(token) },
                Step::Resign { election: e, token } => LeaseEvent::Resign { election: election(&format!("e{e}")), token: FencingToken(token) },
                Step::Close => LeaseEvent::Close,
            };
            for action in lease.handle(at, event) {
                match action {
                    LeaseAction::Renew => {
                        prop_assert!(in_flight.is_none(), "a second renewal in flight at {now} ms");
                        in_flight = Some(at);
                    }
                    LeaseAction::RenewalAbandoned { .. } | LeaseAction::SessionLost(_) => in_flight = None,
                    LeaseAction::Release { election, token } => {
                        prop_assert_eq!(held.remove(&election), Some(token), "release of a grant not held");
                    }
                    LeaseAction::StepDown { election, token, .. } => {
                        prop_assert!(!stepped_down.contains(&(election.clone(), token)), "stepped down twice");
                        stepped_down.push((election, token));
                    }
                    LeaseAction::Deadline(deadline) => prop_assert!(deadline <= valid_until),
                    LeaseAction::WakeAt(_) | LeaseAction::CloseSession => {}
                }
            }
            for (name, token) in &held {
                if lease.lost_at(name, *token, at).is_none() {
                    prop_assert!(at < valid_until, "{name} leads at {now} ms, past its validity");
                    prop_assert!(!stepped_down.contains(&(name.clone(), *token)));
                }
            }
        }
    }
}

#[test]
fn an_earlier_grant_of_the_same_election_cannot_touch_the_later_one() {
    let mut lease = leading();
    lease.handle(
        t(100),
        LeaseEvent::Resign {
            election: election("job"),
            token: FencingToken(7),
        },
    );
    lease.handle(
        t(200),
        LeaseEvent::GrantAcquired {
            election: election("job"),
            token: FencingToken(9),
        },
    );
    for event in [
        LeaseEvent::GrantVanished {
            election: election("job"),
            token: FencingToken(7),
        },
        LeaseEvent::Superseded {
            election: election("job"),
            token: FencingToken(7),
        },
        LeaseEvent::Resign {
            election: election("job"),
            token: FencingToken(7),
        },
    ] {
        assert_eq!(lease.handle(t(300), event), vec![]);
    }
    assert_eq!(
        lease.lost_at(&election("job"), FencingToken(9), t(300)),
        None
    );
    assert_eq!(
        lease.lost_at(&election("job"), FencingToken(7), t(300)),
        Some(LostReason::Resigned)
    );
}
