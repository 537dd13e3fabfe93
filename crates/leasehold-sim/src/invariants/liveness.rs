//! (d) After the leader crashes (with the network healed), a live candidate
//! leads within the TTL plus a bound.

use super::Violation;
use crate::Scenario;
use crate::history::History;

pub fn check(history: &History, scenario: &Scenario) -> Result<(), Violation> {
    let Some(crash) = &history.liveness_crash else {
        return Ok(());
    };
    let bound = scenario.ttl + scenario.failover_slack;
    match crash.next_leader_at {
        Some(at) if at <= crash.at + bound => Ok(()),
        other => Err(Violation {
            invariant: "a live candidate leads after a crash",
            detail: format!(
                "leader {} crashed at {:?}; next leader at {other:?}, bound {bound:?}",
                crash.candidate, crash.at
            ),
        }),
    }
}
