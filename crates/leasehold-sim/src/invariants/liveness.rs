//! (d) After the leader crashes (with the network healed), a live candidate
//! leads within the TTL plus a bound; after a witnessed crash (the host
//! saw the process die and released its grant), within a few round trips.

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
