//! Conformance cases for groups ([`crate::group`]): shards and slots, run
//! by every store through [`crate::conformance_tests`]. Each member runs on
//! its own handle onto the store, as separate processes would, and a
//! [`Ownership`] record checks every instant of ownership as the members
//! themselves see it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, timeout};

use super::{FaultyStore, StoreHarness, unique_election};
use crate::clock::TokioClock;
use crate::config::LeaseConfig;
use crate::elector::Elector;
use crate::error::Error;
use crate::group::{GroupView, Shards};
use crate::names::{CandidateId, ElectionName};
use crate::store::{FencingToken, Store};

/// How long a test waits for something that must happen.
const PATIENCE: Duration = Duration::from_secs(20);
/// A TTL long enough never to expire during a test.
const TTL: Duration = Duration::from_secs(30);
/// The TTL of a member a test lets die.
const SHORT_TTL: Duration = Duration::from_secs(2);

fn id(name: &str) -> CandidateId {
    CandidateId::new(name).expect("valid candidate id")
}

/// Who acts as owner of each shard (or slot) right now, as the members
/// say: a member records a shard when it is granted and drops it before
/// it stops acting (before a release, at a loss). Panics at once when two
/// members act on one shard, or a token does not increase.
#[derive(Debug, Default)]
struct Ownership {
    state: Mutex<OwnershipState>,
    /// Each member's own view of the group, shown when a test fails.
    views: Mutex<Vec<(&'static str, crate::watch::Receiver<GroupView>)>>,
}

#[derive(Debug, Default)]
struct OwnershipState {
    owners: BTreeMap<u32, (String, FencingToken)>,
    last_token: HashMap<u32, FencingToken>,
    gains: usize,
}

impl Ownership {
    fn gain(&self, what: &str, index: u32, who: &str, token: FencingToken) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((other, held)) = state.owners.get(&index) {
            panic!(
                "{what} {index} granted to {who} (token {token}) while {other} acts on it (token {held})"
            );
        }
        if let Some(last) = state.last_token.get(&index) {
            assert!(
                token > *last,
                "{what} {index}: token {token} granted to {who} after token {last}"
            );
        }
        state.last_token.insert(index, token);
        state.owners.insert(index, (who.to_owned(), token));
        state.gains += 1;
    }

    fn lose(&self, index: u32, who: &str) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.owners.get(&index).is_some_and(|(o, _)| o == who) {
            state.owners.remove(&index);
        }
    }

    fn drop_all(&self, who: &str) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.owners.retain(|_, (o, _)| o != who);
    }

    /// What each member sees: the members, and the shards it owns.
    fn views(&self) -> String {
        let views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        views
            .iter()
            .map(|(name, view)| {
                let view = view.borrow();
                let members: Vec<String> = view
                    .members
                    .iter()
                    .map(|m| format!("{} (session {})", m.candidate, m.session))
                    .collect();
                format!("{name} sees members {members:?} and owns {:?}", view.mine)
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn gains(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).gains
    }

    /// How many each of `members` owns, and how many shards are owned.
    fn loads(&self, members: &[&str]) -> (Vec<usize>, usize) {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let loads = members
            .iter()
            .map(|m| state.owners.values().filter(|(o, _)| o == m).count())
            .collect();
        (loads, state.owners.len())
    }

    /// Waits until `members` own `want` shards each, every shard owned,
    /// and nothing has changed for a while.
    async fn settled(&self, members: &[&str], want: &[usize]) {
        let total: usize = want.iter().sum();
        let outcome = timeout(PATIENCE, async {
            loop {
                let before = (self.loads(members), self.gains());
                if before.0 == (want.to_vec(), total) {
                    sleep(Duration::from_millis(300)).await;
                    if (self.loads(members), self.gains()) == before {
                        return;
                    }
                }
                sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        if outcome.is_err() {
            panic!(
                "{members:?} did not settle at {want:?} within {PATIENCE:?}: they own {:?}; {}",
                self.loads(members),
                self.views()
            );
        }
    }
}

/// A member of a group of `count` shards: records what it is granted,
/// gives up what is revoked.
struct Member {
    name: &'static str,
    elector: Arc<Elector>,
    faults: Arc<FaultyStore>,
    task: tokio::task::JoinHandle<()>,
}

async fn member(
    harness: &dyn StoreHarness,
    name: &'static str,
    ttl: Duration,
    group: &ElectionName,
    count: u32,
    ownership: &Arc<Ownership>,
) -> Member {
    let faults = Arc::new(FaultyStore::new(harness.open().await, Arc::new(TokioClock)));
    let store: Arc<dyn Store> = Arc::clone(&faults) as Arc<dyn Store>;
    let elector = Arc::new(Elector::new(store, id(name), LeaseConfig::new(ttl)).expect("config"));
    let mut shards = Shards::join(Arc::clone(&elector), group.clone(), count)
        .await
        .unwrap_or_else(|e| panic!("{name} joins {group}: {e}"));
    ownership
        .views
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((name, shards.view()));
    let ownership = Arc::clone(ownership);
    let task = tokio::spawn(async move {
        let mut held = JoinSet::new();
        loop {
            let shard = match shards.next().await {
                Ok(shard) => shard,
                Err(error) if error.is_transient() => continue,
                Err(error) => panic!("{name}: {error}"),
            };
            ownership.gain("shard", shard.index(), name, shard.token());
            let ownership = Arc::clone(&ownership);
            held.spawn(async move {
                tokio::select! {
                    () = shard.revoked() => {
                        ownership.lose(shard.index(), name);
                        let _ = shard.resign().await;
                    }
                    _ = shard.leadership().lost() => ownership.lose(shard.index(), name),
                }
            });
        }
    });
    Member {
        name,
        elector,
        faults,
        task,
    }
}

/// Stops a member's task and waits until it is gone: its [`Shards`]
/// dropped, so that it campaigns no more.
async fn stop(task: tokio::task::JoinHandle<()>) {
    task.abort();
    let _ = task.await;
}

/// Shards settle balanced; a member joining takes its share and nothing
/// else moves; a member that dies (cut off from the store) has only its
/// shards taken, after its lease; a member that leaves frees everything at
/// once. At no instant do two members act on one shard, and every shard's
/// tokens increase.
pub async fn shards_balance_and_move_only_what_they_must(harness: &dyn StoreHarness) {
    let group = unique_election("shards");
    let ownership = Arc::new(Ownership::default());
    let a = member(harness, "a", TTL, &group, 12, &ownership).await;
    let b = member(harness, "b", TTL, &group, 12, &ownership).await;
    let c = member(harness, "c", SHORT_TTL, &group, 12, &ownership).await;
    ownership.settled(&["a", "b", "c"], &[4, 4, 4]).await;

    let gains = ownership.gains();
    let d = member(harness, "d", TTL, &group, 12, &ownership).await;
    ownership
        .settled(&["a", "b", "c", "d"], &[3, 3, 3, 3])
        .await;
    assert_eq!(
        ownership.gains() - gains,
        3,
        "d's join moved more than the three shards it takes"
    );

    // c is cut off from the store: its shards end at its deadline, and
    // are taken once the store expired its session, and only they.
    let gains = ownership.gains();
    let cut_at = Instant::now();
    c.faults.set_unavailable(true);
    ownership.settled(&["a", "b", "d"], &[4, 4, 4]).await;
    assert_eq!(
        ownership.gains() - gains,
        3,
        "c's death moved more than its three shards"
    );
    assert!(
        cut_at.elapsed() >= SHORT_TTL / 2,
        "c's shards were taken {:?} after it was cut off, before its lease could end",
        cut_at.elapsed()
    );
    stop(c.task).await;
    drop(c.elector);

    // b leaves: its session closes, freeing its shards at once.
    ownership.drop_all(b.name);
    stop(b.task).await;
    b.elector.close().await.expect("b leaves");
    ownership.settled(&["a", "d"], &[6, 6]).await;

    for m in [a, d] {
        stop(m.task).await;
        let _ = m.elector.close().await;
    }
}

/// A member asking for another count (or for slots) than the group's
/// first member is refused with [`Error::Conflict`] naming the count in
/// use, and leaves no note behind.
pub async fn a_group_refuses_another_count(harness: &dyn StoreHarness) {
    let group = unique_election("counts");
    let ownership = Arc::new(Ownership::default());
    let a = member(harness, "a", TTL, &group, 3, &ownership).await;
    let store = harness.open().await;
    let other =
        Arc::new(Elector::new(Arc::clone(&store), id("b"), LeaseConfig::new(TTL)).expect("config"));
    match Shards::join(Arc::clone(&other), group.clone(), 4).await {
        Err(Error::Conflict(message)) => assert!(
            message.contains("3 shards"),
            "the refusal must name the count in use: {message}"
        ),
        other => panic!("joining 3 shards with 4 must be refused, got {other:?}"),
    }
    match other.campaign_slot(&group, 3).await {
        Err(Error::Conflict(message)) => assert!(message.contains("3 shards"), "{message}"),
        other => panic!("slots on a group of shards must be refused, got {other:?}"),
    }
    let notes = store.notes(&group).await.expect("notes");
    let session = other.session().await.expect("session").id();
    assert!(
        notes.iter().all(|n| n.session != session),
        "a refused member left a note: {notes:?}"
    );
    stop(a.task).await;
    let _ = a.elector.close().await;
    // A single election's name, led: neither shards nor slots take it,
    // and nothing is written.
    let single = unique_election("single");
    let leader = other.campaign(&single).await.expect("campaign");
    let joiner = Arc::new(
        Elector::new(harness.open().await, id("c"), LeaseConfig::new(TTL)).expect("config"),
    );
    match Shards::join(Arc::clone(&joiner), single.clone(), 2).await {
        Err(Error::Conflict(message)) => assert!(
            message.contains("single election") && message.contains("led by b"),
            "{message}"
        ),
        other => panic!("shards on a led single election must be refused, got {other:?}"),
    }
    match joiner.campaign_slot(&single, 2).await {
        Err(Error::Conflict(message)) => assert!(message.contains("single election"), "{message}"),
        other => panic!("slots on a led single election must be refused, got {other:?}"),
    }
    let session = joiner.session().await.expect("session").id();
    assert!(
        store
            .notes(&single)
            .await
            .expect("notes")
            .iter()
            .all(|n| n.session != session),
        "a refused member left a note"
    );
    drop(leader);
    let _ = joiner.close().await;
    let _ = other.close().await;
}

/// Slots: five contenders for two slots, each taking a slot three times:
/// never more than two holders, never two on one slot, tokens increasing
/// per slot, and every contender served.
pub async fn slots_hold_at_most_k(harness: &dyn StoreHarness) {
    const SLOTS: u32 = 2;
    let group = unique_election("slots");
    let ownership = Arc::new(Ownership::default());
    let mut tasks = JoinSet::new();
    for name in ["s0", "s1", "s2", "s3", "s4"] {
        let store = harness.open().await;
        let (group, ownership) = (group.clone(), Arc::clone(&ownership));
        tasks.spawn(async move {
            let elector = Elector::new(store, id(name), LeaseConfig::new(TTL)).expect("config");
            for _ in 0..3 {
                let slot = elector
                    .campaign_slot(&group, SLOTS)
                    .await
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                assert!(slot.index < SLOTS, "slot {} of {SLOTS}", slot.index);
                ownership.gain("slot", slot.index, name, slot.leadership.token());
                sleep(Duration::from_millis(30)).await;
                ownership.lose(slot.index, name);
                slot.leadership.resign().await.expect("release the slot");
            }
            let _ = elector.close().await;
        });
    }
    timeout(PATIENCE * 2, async {
        while let Some(done) = tasks.join_next().await {
            done.expect("a contender failed");
        }
    })
    .await
    .expect("five contenders took a slot three times each");
    assert_eq!(ownership.gains(), 15);
}

/// Resigns the shards of `held` that were revoked; keeps the others.
async fn give_back_revoked(held: &mut Vec<crate::group::Shard>) {
    let mut kept = Vec::new();
    for s in held.drain(..) {
        if s.is_revoked() {
            s.resign().await.expect("resign");
        } else {
            kept.push(s);
        }
    }
    *held = kept;
}

/// A member that leaves ([`Shards::leave`]) is no member at once, even
/// while it still holds shards: the others campaign for each of its
/// shards and take it as soon as it is released, one by one.
pub async fn a_member_that_leaves_is_gone_at_once(harness: &dyn StoreHarness) {
    let group = unique_election("leave");
    let store = harness.open().await;
    let a = Arc::new(
        Elector::new(harness.open().await, id("a"), LeaseConfig::new(TTL)).expect("config"),
    );
    let b = Arc::new(
        Elector::new(harness.open().await, id("b"), LeaseConfig::new(TTL)).expect("config"),
    );
    let mut shards_a = Shards::join(Arc::clone(&a), group.clone(), 2)
        .await
        .expect("a joins");
    let mut shards_b = Shards::join(Arc::clone(&b), group.clone(), 2)
        .await
        .expect("b joins");
    // Each ends up with one shard (a may take both first, then hand one over).
    let mut held_a = Vec::new();
    let first_b = timeout(PATIENCE, async {
        loop {
            tokio::select! {
                shard = shards_a.next() => {
                    held_a.push(shard.expect("a's shard"));
                    // Revoked ones go back at once.
                    give_back_revoked(&mut held_a).await;
                }
                shard = shards_b.next() => return shard.expect("b's shard"),
                () = sleep(Duration::from_millis(50)) => give_back_revoked(&mut held_a).await,
            }
        }
    })
    .await
    .expect("b gets a shard");
    let b_index = first_b.index();
    let b_session = b.session().await.expect("session").id();
    shards_b.leave().await;
    let notes = store.notes(&group).await.expect("notes");
    assert!(
        crate::group::members(&notes)
            .iter()
            .all(|m| m.session != b_session),
        "b left, yet is still a member: {notes:?}"
    );
    // b still holds its shard; a waits for it and takes it once released.
    first_b.resign().await.expect("b releases");
    timeout(PATIENCE, async {
        while !held_a.iter().any(|s| s.index() == b_index) {
            held_a.push(shards_a.next().await.expect("a's shard"));
        }
    })
    .await
    .expect("a takes b's shard once released");
    drop(held_a);
    let _ = a.close().await;
    let _ = b.close().await;
}

/// `transfer` refuses a group's name and its shards' names, naming the
/// group and its count, and writes nothing: shards move by the
/// assignment, not by requests.
pub async fn a_group_is_never_transferred(harness: &dyn StoreHarness) {
    let group = unique_election("moved");
    let ownership = Arc::new(Ownership::default());
    let a = member(harness, "a", TTL, &group, 2, &ownership).await;
    ownership.settled(&["a"], &[2]).await;
    let store = harness.open().await;
    let shard = crate::group::GroupKind::Shards(2)
        .election(&group, 1)
        .expect("a shard's name");
    for (name, says) in [(&group, "is a group of 2 shards"), (&shard, "belongs to")] {
        let before = store.notes(name).await.expect("notes");
        match crate::transfer::request_transfer(&store, name, None, TTL, PATIENCE).await {
            Err(Error::InvalidInput { reason, .. }) => assert!(
                reason.contains(says) && reason.contains(group.as_str()),
                "the refusal of transferring {name} must say {says:?} and name {group}: {reason}"
            ),
            other => panic!("transferring {name} must be refused, got {other:?}"),
        }
        assert_eq!(
            store.notes(name).await.expect("notes"),
            before,
            "a refused transfer of {name} wrote a note"
        );
    }
    assert_eq!(
        ownership.loads(&["a"]).0,
        vec![2],
        "a refused transfer moved a shard"
    );
    stop(a.task).await;
    let _ = a.elector.close().await;
}
