//! Which member of a group owns which shard: balanced and sticky.
//!
//! Every member computes the assignment from what every member can read
//! in the store — the live members in the order they joined, and who
//! holds each shard now — so members that see the same store agree
//! without talking to each other. The store's compare-and-swap still
//! decides every grant: members that disagree for a moment (one has seen
//! a join the other has not) only wait on each other's shards, never
//! share one.
//!
//! The rules, for `n` shards over `M` members:
//!
//! 1. Each member may own `⌊n/M⌋` shards, and `n mod M` of them one more:
//!    those owning the most now (earlier joiners first among equals), so
//!    that nobody gives up a shard only to balance a count.
//! 2. Each member keeps as many of the shards it holds as it may own,
//!    preferring those it ranks highest (below).
//! 3. Every other shard — unheld, held by a session that is no longer a
//!    member, or beyond its holder's share — goes, in shard order, to the
//!    member with room left that ranks it highest.
//!
//! A member's rank of a shard is a hash of the shard's number and the
//! member's id (rendezvous hashing), the same in every process and
//! version. With it, a cold start spreads shards evenly without any
//! holder, and the shards a member must give up or take are spread
//! rather than contiguous.
//!
//! What moves: nothing while membership is stable (the assignment of the
//! current owners is its own fixed point); when a member leaves or dies,
//! only its shards; when one joins, only the shards beyond the others'
//! new shares, about `n/(M+1)`.

use crate::names::CandidateId;

/// The assignment of `count` shards over `members` (in the order they
/// joined, without repeats), given each shard's current holder
/// (`holders[k]`, `None` when unheld; a holder that is not a member counts
/// as unheld): for each shard, the index in `members` of the member that
/// should own it, or `None` when there are no members.
pub fn assign(
    count: usize,
    members: &[CandidateId],
    holders: &[Option<CandidateId>],
) -> Vec<Option<usize>> {
    let m = members.len();
    if m == 0 {
        return vec![None; count];
    }
    let held_by: Vec<Option<usize>> = (0..count)
        .map(|k| {
            holders
                .get(k)
                .and_then(Option::as_ref)
                .and_then(|h| members.iter().position(|c| c == h))
        })
        .collect();
    let mut room = shares(count, m, &held_by);
    let seeds: Vec<u64> = members.iter().map(|c| seed(c.as_str())).collect();
    let rank = |shard: usize, member: usize| mix(seeds[member] ^ mix(shard as u64));
    // Rule 2: keep what one holds, up to one's share, best ranked first.
    let mut target: Vec<Option<usize>> = vec![None; count];
    let mut held: Vec<Vec<usize>> = vec![Vec::new(); m];
    for (shard, holder) in held_by.iter().enumerate() {
        if let Some(member) = holder {
            held[*member].push(shard);
        }
    }
    for (member, shards) in held.iter_mut().enumerate() {
        shards.sort_by_key(|&s| std::cmp::Reverse(rank(s, member)));
        for &shard in shards.iter().take(room[member]) {
            target[shard] = Some(member);
        }
        room[member] = room[member].saturating_sub(shards.len());
    }
    // Rule 3: the rest, in shard order, to the best-ranking member with room.
    for (shard, slot) in target.iter_mut().enumerate() {
        if slot.is_some() {
            continue;
        }
        let best = (0..m)
            .filter(|&i| room[i] > 0)
            .max_by_key(|&i| (rank(shard, i), std::cmp::Reverse(i)));
        if let Some(member) = best {
            room[member] -= 1;
            *slot = Some(member);
        }
    }
    target
}

/// Rule 1: how many shards each of `m` members may own: ⌊count/m⌋, and
/// one more for the `count mod m` that hold the most now (`held_by`: each
/// shard's holder), earlier joiners first among equals.
fn shares(count: usize, m: usize, held_by: &[Option<usize>]) -> Vec<usize> {
    let mut loads = vec![0usize; m];
    for member in held_by.iter().flatten() {
        loads[*member] += 1;
    }
    let (share, extra) = (count / m, count % m);
    let mut by_load: Vec<usize> = (0..m).collect();
    by_load.sort_by_key(|&i| (std::cmp::Reverse(loads[i]), i));
    let mut room = vec![share; m];
    for &i in by_load.iter().take(extra) {
        room[i] += 1;
    }
    room
}

/// FNV-1a of `id`: stable across processes, platforms and versions (the
/// standard library's hasher is not).
fn seed(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// splitmix64's finalizer: spreads nearby inputs over the whole range.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ids(n: usize) -> Vec<CandidateId> {
        (0..n)
            .map(|i| CandidateId::new(format!("member-{i}")).expect("valid id"))
            .collect()
    }

    /// The owners after every member took what the assignment gives it.
    fn settle(
        count: usize,
        members: &[CandidateId],
        holders: &[Option<CandidateId>],
    ) -> Vec<Option<CandidateId>> {
        let mut holders = holders.to_vec();
        // Two rounds reach the fixed point; a third must change nothing.
        for _ in 0..3 {
            holders = assign(count, members, &holders)
                .into_iter()
                .map(|t| t.map(|i| members[i].clone()))
                .collect();
        }
        holders
    }

    fn loads(members: &[CandidateId], holders: &[Option<CandidateId>]) -> Vec<usize> {
        members
            .iter()
            .map(|m| holders.iter().filter(|h| h.as_ref() == Some(m)).count())
            .collect()
    }

    fn moved(a: &[Option<CandidateId>], b: &[Option<CandidateId>]) -> usize {
        a.iter().zip(b).filter(|(x, y)| x != y).count()
    }

    #[test]
    fn twelve_shards_over_three_then_two_then_three() {
        let members = ids(3);
        let cold = settle(12, &members, &vec![None; 12]);
        assert_eq!(loads(&members, &cold), [4, 4, 4]);
        // member-1 dies: only its four shards move, two to each survivor.
        let survivors = vec![members[0].clone(), members[2].clone()];
        let after = settle(12, &survivors, &cold);
        assert_eq!(loads(&survivors, &after), [6, 6]);
        assert_eq!(moved(&cold, &after), 4);
        // It comes back (joining last): it takes two from each.
        let back = vec![members[0].clone(), members[2].clone(), members[1].clone()];
        let again = settle(12, &back, &after);
        assert_eq!(loads(&back, &again), [4, 4, 4]);
        assert_eq!(moved(&after, &again), 4);
    }

    #[test]
    fn no_members_no_owner() {
        assert_eq!(assign(3, &[], &[None, None, None]), vec![None, None, None]);
    }

    proptest! {
        /// Balanced, a fixed point once settled, and a leave or join moves
        /// only what it must.
        #[test]
        fn balanced_and_sticky(count in 0usize..300, m in 1usize..9, leave in 0usize..9, seed_owners in proptest::collection::vec(proptest::option::of(0usize..12), 0..300)) {
            let members = ids(m);
            // Any starting holders, members or not.
            let start: Vec<Option<CandidateId>> = (0..count)
                .map(|k| seed_owners.get(k).copied().flatten().map(|i| CandidateId::new(format!("member-{i}")).expect("valid id")))
                .collect();
            let settled = settle(count, &members, &start);
            let l = loads(&members, &settled);
            let (lo, hi) = (count / m, count.div_ceil(m));
            prop_assert!(l.iter().all(|&x| x == lo || x == hi), "loads {l:?} for {count} shards over {m}");
            prop_assert_eq!(settle(count, &members, &settled), settled.clone(), "not a fixed point");
            // A member leaves: only its shards move.
            if m > 1 {
                let gone = leave % m;
                let rest: Vec<CandidateId> = members.iter().enumerate().filter(|(i, _)| *i != gone).map(|(_, c)| c.clone()).collect();
                let after = settle(count, &rest, &settled);
                let own = l[gone];
                prop_assert_eq!(moved(&settled, &after), own, "a leave moved others' shards");
                let la = loads(&rest, &after);
                let (lo, hi) = (count / (m - 1), count.div_ceil(m - 1));
                prop_assert!(la.iter().all(|&x| x == lo || x == hi), "loads {la:?} after a leave");
            }
            // A member joins: it takes exactly its share, nothing else moves.
            let mut more = members.clone();
            more.push(CandidateId::new("newcomer").expect("valid id"));
            let after = settle(count, &more, &settled);
            let la = loads(&more, &after);
            prop_assert_eq!(moved(&settled, &after), la[m], "a join moved more than the newcomer took");
            prop_assert!(la[m] == count / (m + 1) || la[m] == count.div_ceil(m + 1));
        }
    }
}
