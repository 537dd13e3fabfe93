//! (e) Sharded runs: once the faults end, and after a member crashes,
//! comes back, or dies on a live host, the group settles within a bound
//! and stays settled while its members stay the same: every shard is owned
//! (a term of one live member covers it) and each live member owns
//! `⌊n/M⌋` or `⌈n/M⌉` shards.
//!
//! When a stretch ends unsettled because the store shows a live member's
//! session holding a shard that member does not act on (an orphan grant:
//! it renews the grant with its session, so nobody else ever gets the
//! shard), the violation is [`ORPHAN_GRANT`], named apart from the others.

use std::time::Duration;

use super::Violation;
use crate::Scenario;
use crate::history::{History, Settling, Term, Window};

/// The invariant an orphan grant breaks (see the module's documentation).
pub const ORPHAN_GRANT: &str = "a live member acts on every shard its session holds";

pub fn check(history: &History, scenario: &Scenario) -> Result<(), Violation> {
    let Some(shards) = scenario.shards else {
        return Ok(());
    };
    for window in &history.windows {
        let bound = bound(window.cause, scenario);
        let (settled, unsettled) = settled_at(&history.terms, window, shards);
        if settled.is_some_and(|at| at <= window.from + bound) {
            continue;
        }
        let mut detail = format!(
            "members {:?} from {:?} to {:?}: settled {}, bound {bound:?}",
            window.members,
            window.from,
            window.until,
            settled.map_or_else(|| "never".to_owned(), |at| format!("at {at:?}")),
        );
        let mut orphaned = Vec::new();
        if let Some((at, owners)) = unsettled {
            detail.push_str(&format!("; owners of each shard at {at:?}: {owners:?}"));
            if settled.is_none() {
                orphaned = orphans(window, &owners);
            }
        }
        for orphan in &orphaned {
            detail.push_str(&format!("; {orphan}"));
        }
        if !history.member_errors.is_empty() {
            detail.push_str(&format!("; members' errors: {:?}", history.member_errors));
        }
        return Err(Violation {
            invariant: if orphaned.is_empty() {
                invariant(window.cause)
            } else {
                ORPHAN_GRANT
            },
            detail: format!("{}: {detail}", describe(window.cause)),
        });
    }
    Ok(())
}

/// The shards nobody acts on at the window's end although the store shows
/// one of its live members holding them: grants that member's session
/// keeps (renewing them) while the member does not know it holds them.
fn orphans(window: &Window, owners_at_end: &Owners) -> Vec<String> {
    owners_at_end
        .iter()
        .zip(&window.held_at_end)
        .enumerate()
        .filter(|(_, (owners, _))| owners.is_empty())
        .filter_map(|(shard, (_, held))| {
            let (member, token) = (*held)?;
            window.members.contains(&member).then(|| {
                format!(
                    "shard {shard} is held in the store by live member {member} (token {token}), which does not act on it"
                )
            })
        })
        .collect()
}

fn describe(cause: Settling) -> &'static str {
    match cause {
        Settling::Healed => "after the faults ended",
        Settling::Crashed => "after a member crashed",
        Settling::Rejoined => "after a member came back",
        Settling::WitnessedCrash => "after a member died on a live host",
    }
}

fn invariant(cause: Settling) -> &'static str {
    match cause {
        Settling::Healed => "the group settles after the faults end",
        Settling::Crashed => "the group settles after a member crashes",
        Settling::Rejoined => "the group settles after a member comes back",
        Settling::WitnessedCrash => "the group settles soon after a witnessed crash",
    }
}

/// How long after a window's start the group may take to settle.
pub(crate) fn bound(cause: Settling, scenario: &Scenario) -> Duration {
    match cause {
        // Sessions of crashed members expire (a TTL), members cut off
        // lose their grants and join again, then the moves of a rebalance.
        Settling::Healed => scenario.ttl * 2,
        // The dead member's session expires, then its shards are taken.
        Settling::Crashed => scenario.ttl + scenario.failover_slack,
        // It joins: a few round trips, then one watch per shard, one
        // after another; then the others hand over its share.
        Settling::Rejoined => {
            let round_trip = scenario.max_delay * 2;
            round_trip * (5 + scenario.shards.unwrap_or(0)) + scenario.witnessed_failover
        }
        // The witness releases its shards and its membership, the others
        // take them: a few round trips.
        Settling::WitnessedCrash => scenario.witnessed_failover,
    }
}

/// Who owns each shard at `at`: the members whose terms cover it.
type Owners = Vec<Vec<usize>>;

/// The earliest instant of `window` from which the group was settled to
/// its end (`None` if it was not settled at its end), and the last instant
/// at which it was not, with the owners then.
fn settled_at(
    terms: &[Term],
    window: &Window,
    shards: u32,
) -> (Option<Duration>, Option<(Duration, Owners)>) {
    let terms: Vec<&Term> = terms
        .iter()
        .filter(|t| t.start < window.until && t.end > window.from)
        .collect();
    // The owners change only where a term starts or ends.
    let mut points = vec![window.from];
    points.extend(
        terms
            .iter()
            .flat_map(|t| [t.start, t.end])
            .filter(|&p| window.from < p && p < window.until),
    );
    points.sort();
    points.dedup();
    let mut settled = None;
    for &at in points.iter().rev() {
        let owners = owners_at(&terms, at, shards);
        if !is_settled(&owners, &window.members) {
            return (settled, Some((at, owners)));
        }
        settled = Some(at);
    }
    (settled, None)
}

fn owners_at(terms: &[&Term], at: Duration, shards: u32) -> Owners {
    (0..shards)
        .map(|shard| {
            terms
                .iter()
                .filter(|t| t.shard == shard && t.start <= at && at < t.end)
                .map(|t| t.candidate)
                .collect()
        })
        .collect()
}

/// Every shard owned by exactly one of `members`, each owning its share
/// (with no members, no shard owned).
fn is_settled(owners: &Owners, members: &[usize]) -> bool {
    let owned_once = owners
        .iter()
        .all(|o| matches!(o.as_slice(), [one] if members.contains(one)));
    if members.is_empty() {
        return owners.iter().all(Vec::is_empty);
    }
    let (n, m) = (owners.len(), members.len());
    let (lo, hi) = (n / m, n.div_ceil(m));
    owned_once
        && members.iter().all(|member| {
            let load = owners.iter().filter(|o| o.contains(member)).count();
            lo <= load && load <= hi
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn term(shard: u32, candidate: usize, start: u64, end: u64) -> Term {
        Term {
            shard,
            candidate,
            token: 1,
            start: ms(start),
            end: ms(end),
        }
    }

    fn scenario() -> Scenario {
        Scenario {
            shards: Some(3),
            ..Scenario::default()
        }
    }

    fn history(terms: Vec<Term>, members: Vec<usize>) -> History {
        History {
            terms,
            windows: vec![Window {
                cause: Settling::Rejoined,
                from: ms(1000),
                until: ms(5000),
                members,
                held_at_end: Vec::new(),
            }],
            ..History::default()
        }
    }

    /// Three shards over two members, settled 100 ms into the window.
    fn balanced() -> Vec<Term> {
        vec![
            term(0, 0, 0, 9000),
            term(1, 1, 0, 9000),
            term(2, 1, 1100, 9000),
        ]
    }

    #[test]
    fn a_group_that_settles_in_time_passes() {
        assert!(check(&history(balanced(), vec![0, 1]), &scenario()).is_ok());
        // Plain runs have no group.
        assert!(check(&history(Vec::new(), vec![0]), &Scenario::default()).is_ok());
    }

    /// Not blind: an unowned shard, a shard owned twice, a dead owner, an
    /// uneven spread, a late or a lost settling are each caught.
    #[test]
    fn a_group_that_does_not_settle_is_caught() {
        let invariant = "the group settles after a member comes back";
        let mut late = balanced();
        late[2].start = ms(1000) + bound(Settling::Rejoined, &scenario()) + ms(1);
        let mut lost = balanced();
        lost[1].end = ms(4000);
        let mut twice = balanced();
        twice.push(term(0, 1, 4000, 4001));
        let mut dead = balanced();
        dead[0].candidate = 2;
        let mut uneven = balanced();
        uneven[0].candidate = 1;
        for (what, terms) in [
            ("late", late),
            ("lost", lost),
            ("twice", twice),
            ("dead", dead),
            ("uneven", uneven),
        ] {
            let error =
                check(&history(terms, vec![0, 1]), &scenario()).expect_err("must be caught");
            assert_eq!(error.invariant, invariant, "{what}");
        }
        // Unowned while a live member's session holds it: an orphan grant,
        // named apart.
        let mut lost = history(balanced()[..2].to_vec(), vec![0, 1]);
        lost.windows[0].held_at_end = vec![Some((0, 1)), Some((1, 1)), Some((1, 7))];
        let error = check(&lost, &scenario()).expect_err("must be caught");
        assert_eq!(error.invariant, ORPHAN_GRANT);
        assert!(
            error
                .detail
                .contains("shard 2 is held in the store by live member 1 (token 7)"),
            "{}",
            error.detail
        );
        // Held by a member that is gone, it is not an orphan of a live one.
        lost.windows[0].members = vec![0, 2];
        lost.terms[1].candidate = 2;
        let error = check(&lost, &scenario()).expect_err("must be caught");
        assert_eq!(error.invariant, invariant);
        // With no live member, no shard may be owned.
        assert!(check(&history(Vec::new(), Vec::new()), &scenario()).is_ok());
        let error = check(&history(balanced(), Vec::new()), &scenario()).expect_err("owned");
        assert_eq!(error.invariant, invariant);
    }
}
