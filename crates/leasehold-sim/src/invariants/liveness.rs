//! (d) After the leader crashes (with the network healed), a live candidate
//! leads within the TTL plus a bound; after a witnessed crash (the host
//! saw the process die and released its grant), within a few round trips;
//! after the standby a transfer chose dies mid-transfer, someone else
//! leads within the TTL plus a bound.

use super::Violation;
use crate::Scenario;
use crate::history::{Crash, History};

pub fn check(history: &History, scenario: &Scenario) -> Result<(), Violation> {
    if let Some(crash) = &history.liveness_crash {
        within(
            crash,
            scenario.ttl + scenario.failover_slack,
            "a live candidate leads after a crash",
            "crashed",
        )?;
    }
    if let Some(crash) = &history.chosen_standby_crash {
        within(
            crash,
            scenario.ttl + scenario.failover_slack,
            "someone else leads after the standby a transfer chose dies",
            "(chosen by a transfer) crashed",
        )?;
    }
    if let Some(crash) = &history.witnessed_crash {
        within(
            crash,
            scenario.witnessed_failover,
            "a live candidate leads soon after a witnessed crash",
            "died (witnessed)",
        )?;
    }
    Ok(())
}

fn within(
    crash: &Crash,
    bound: std::time::Duration,
    invariant: &'static str,
    what: &str,
) -> Result<(), Violation> {
    match crash.next_leader_at {
        Some(at) if at <= crash.at + bound => Ok(()),
        other => Err(Violation {
            invariant,
            detail: format!(
                "leader {} {what} at {:?}; next leader at {other:?}, bound {bound:?}",
                crash.candidate, crash.at
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Not blind: a chosen standby's crash after which nobody led, or
    /// somebody led only after the bound, breaks the invariant.
    #[test]
    fn a_chosen_standby_crash_without_a_successor_is_caught() {
        let scenario = Scenario::default();
        let at = Duration::from_secs(40);
        let crash = |next_leader_at| History {
            chosen_standby_crash: Some(Crash {
                candidate: 1,
                at,
                next_leader_at,
            }),
            ..History::default()
        };
        let bound = scenario.ttl + scenario.failover_slack;
        assert!(check(&crash(Some(at + bound)), &scenario).is_ok());
        for late in [None, Some(at + bound + Duration::from_millis(1))] {
            let error = check(&crash(late), &scenario).expect_err("must be caught");
            assert_eq!(
                error.invariant,
                "someone else leads after the standby a transfer chose dies"
            );
        }
    }
}
