//! The conformance suite: plain async functions over [`StoreHarness`], run
//! by every backend (see [`crate::conformance_tests`]). Each panics with a
//! message saying which rule broke.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::{Instant, timeout};

use super::{
    FaultyStore, StoreHarness, fail_watch_reads, failed_watch_reads, heal_watch_reads,
    unique_election, watch_reads_of,
};
use crate::clock::TokioClock;
use crate::config::LeaseConfig;
use crate::elector::Elector;
use crate::error::Error;
use crate::lease::LostReason;
use crate::names::{CandidateId, ElectionName};
use crate::store::{Grant, LeaderStatus, SessionId, Store};

pub use super::groups::*;
pub use super::planned::*;

/// A TTL long enough never to expire during a test.
const LONG_TTL: Duration = Duration::from_secs(30);
/// The TTL of sessions a test lets expire.
const SHORT_TTL: Duration = Duration::from_secs(1);
/// How long a test waits for something that must happen.
const PATIENCE: Duration = Duration::from_secs(15);

fn candidate(name: &str) -> CandidateId {
    CandidateId::new(name).expect("valid candidate id")
}

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: did not happen within {PATIENCE:?}"))
}

async fn grant_on(store: &Arc<dyn Store>, election: &ElectionName, who: &str) -> Grant {
    within(
        "uncontended campaign",
        super::campaign_on_new_session(&**store, election, who, LONG_TTL),
    )
    .await
}

/// Rule 1: among 50 concurrent candidates (each on its own handle and
/// session) exactly one wins; after it resigns exactly one more wins.
pub async fn one_winner_among_concurrent_candidates(harness: &dyn StoreHarness) {
    let election = unique_election("one-winner");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = JoinSet::new();
    for i in 0..50 {
        let store = harness.open().await;
        let (election, tx) = (election.clone(), tx.clone());
        tasks.spawn(async move {
            let session = store.open_session(LONG_TTL).await.expect("open session");
            let grant = store
                .campaign(session.id, &election, &candidate(&format!("c{i}")))
                .await
                .expect("campaign");
            tx.send((store, grant)).expect("collector alive");
            std::future::pending::<()>().await;
        });
    }
    let (store, first) = within("a first winner", rx.recv()).await.expect("a winner");
    // Give every other campaign time to (wrongly) complete too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        rx.try_recv().is_err(),
        "rule 1 broken: two of 50 concurrent candidates were granted the election"
    );
    let leader = store.leader(&election).await.expect("read leader");
    assert_eq!(
        leader.map(|l| (l.candidate, l.token)),
        Some((first.candidate.clone(), first.token))
    );
    store.resign(&first).await.expect("winner resigns");
    let (_, second) = within("a successor after resign", rx.recv())
        .await
        .expect("a successor");
    assert!(second.token > first.token, "rule 2: tokens must increase");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        rx.try_recv().is_err(),
        "rule 1 broken: a release let two waiters in"
    );
    tasks.abort_all();
}

/// Rule 2: 200 successive grants carry strictly increasing tokens, also
/// across reopening a durable store.
pub async fn tokens_strictly_increase(harness: &dyn StoreHarness) {
    let election = unique_election("tokens");
    let mut last = None;
    let mut store = harness.open().await;
    for i in 0..200 {
        if harness.durable() && i == 100 {
            drop(store);
            store = harness.open().await;
        }
        let grant = grant_on(&store, &election, &format!("c{}", i % 3)).await;
        if let Some(prev) = last {
            assert!(
                grant.token > prev,
                "rule 2 broken: grant {i} has token {} after {prev}",
                grant.token
            );
        }
        last = Some(grant.token);
        if i % 2 == 0 {
            store.resign(&grant).await.expect("resign");
        } else {
            store.close_session(grant.session).await.expect("close");
        }
    }
}

/// Rules 2 and 7 at the end of a counter: the largest token a store keeps
/// (`i64::MAX`) is granted; a grant that would need a larger one is
/// refused as [`Error::Corrupt`] naming the election — by a campaign, an
/// unwaited one, and an elector's — and leaves nothing written: no
/// holder, the counter as it was. Never a wrapped or repeated token, and
/// never an outage that a runner would retry forever. For the stores whose
/// counter the harness can set ([`StoreHarness::set_last_token`]).
pub async fn an_exhausted_token_counter_is_corrupt(harness: &dyn StoreHarness) {
    let store = harness.open().await;
    let election = unique_election("exhausted");
    let first = grant_on(&store, &election, "a").await;
    store.resign(&first).await.expect("resign");
    assert!(
        harness.set_last_token(&election, i64::MAX - 1).await,
        "this harness cannot set the token counter"
    );
    let last = grant_on(&store, &election, "b").await;
    assert_eq!(last.token.to_i64(), Some(i64::MAX), "the largest token");
    store.resign(&last).await.expect("resign");

    let lease = store.open_session(LONG_TTL).await.expect("open");
    let refused = within(
        "a refused campaign",
        store.campaign(lease.id, &election, &candidate("c")),
    )
    .await;
    assert_exhausted(refused.map(|g| g.token), &election);
    if harness.campaigns_unwaited() {
        let refused = store
            .try_campaign_unwaited(lease.id, &election, &candidate("c"))
            .await;
        assert_exhausted(refused.map(|g| g.map(|g| g.token)), &election);
    }
    let elector = Elector::new(
        Arc::clone(&store),
        candidate("d"),
        LeaseConfig::with_ttl(LONG_TTL),
    )
    .expect("config");
    let refused = within("a refused elector", elector.campaign(&election)).await;
    assert_exhausted(refused.map(|l| l.token()), &election);

    assert_eq!(store.leader(&election).await.expect("read"), None);
    assert_eq!(
        harness.last_token(&election).await,
        Some(i64::MAX),
        "the counter changed"
    );
    elector.close().await.expect("close");
    store.close_session(lease.id).await.expect("close");
}

/// A token counter below zero (set by hand, or a damaged store) holds no
/// count of grants: a campaign is refused as corrupt, naming the
/// election, and nothing is written (a grant of token 0, or of any token
/// at or below one granted before, would break rule 2).
pub async fn a_negative_token_counter_is_corrupt(harness: &dyn StoreHarness) {
    let store = harness.open().await;
    let election = unique_election("negative");
    let first = grant_on(&store, &election, "a").await;
    store.resign(&first).await.expect("resign");
    assert!(
        harness.set_last_token(&election, -5).await,
        "this harness cannot set the token counter"
    );
    let lease = store.open_session(LONG_TTL).await.expect("open");
    let refused = within(
        "a refused campaign",
        store.campaign(lease.id, &election, &candidate("b")),
    )
    .await;
    match refused {
        Err(Error::Corrupt(message)) => {
            assert!(message.contains(election.as_str()), "{message}");
            assert!(message.contains("no count of grants"), "{message}");
            assert!(!message.contains('\n'), "{message}");
        }
        other => panic!("a grant from a negative counter must be Corrupt, got {other:?}"),
    }
    assert_eq!(store.leader(&election).await.expect("read"), None);
    assert_eq!(
        harness.last_token(&election).await,
        Some(-5),
        "the counter changed"
    );
    store.close_session(lease.id).await.expect("close");
}

fn assert_exhausted<T: std::fmt::Debug>(outcome: Result<T, Error>, election: &ElectionName) {
    match outcome {
        Err(Error::Corrupt(message)) => {
            assert!(message.contains(election.as_str()), "{message}");
            assert!(message.contains("exhausted"), "{message}");
            assert!(!message.contains('\n'), "{message}");
        }
        other => panic!("a grant past the largest token must be Corrupt, got {other:?}"),
    }
}

/// A held election is not granted to anyone else while its session is
/// renewed, nor before the session's TTL has passed since the holder's last
/// renewal was sent; after that it is granted to a waiter.
pub async fn no_takeover_before_expiry(harness: &dyn StoreHarness) {
    let election = unique_election("expiry");
    let holder = harness.open().await;
    let sent = Instant::now();
    let lease = holder.open_session(SHORT_TTL).await.expect("open");
    let grant = within(
        "campaign",
        holder.campaign(lease.id, &election, &candidate("holder")),
    )
    .await
    .expect("campaign");

    let waiter = harness.open().await;
    let waiting = waiter.open_session(LONG_TTL).await.expect("open");
    let election2 = election.clone();
    let mut contender = tokio::spawn(async move {
        let grant = waiter
            .campaign(waiting.id, &election2, &candidate("waiter"))
            .await
            .expect("campaign");
        (Instant::now(), grant)
    });

    // Renew for three TTLs: the waiter must not get in.
    let mut last_sent = sent;
    let renew_until = Instant::now() + lease.ttl * 3;
    while Instant::now() < renew_until {
        tokio::time::sleep(lease.ttl / 4).await;
        last_sent = Instant::now();
        holder
            .keep_alive(lease.id)
            .await
            .expect("renewal of a live session");
        assert!(
            !contender.is_finished(),
            "rule 1 broken: election taken over while the holder renewed"
        );
    }
    let (granted_at, successor) = within("takeover after expiry", &mut contender)
        .await
        .expect("contender task");
    assert!(
        granted_at >= last_sent + lease.ttl,
        "rule 1 broken: taken over {:?} after the holder's last renewal, TTL is {:?}",
        granted_at - last_sent,
        lease.ttl
    );
    assert!(successor.token > grant.token);
}

/// A session whose TTL passed without renewal cannot be renewed, and its
/// grant is gone.
pub async fn renewal_after_expiry_fails(harness: &dyn StoreHarness) {
    let election = unique_election("renew-expired");
    let store = harness.open().await;
    let lease = store.open_session(SHORT_TTL).await.expect("open");
    store
        .campaign(lease.id, &election, &candidate("a"))
        .await
        .expect("campaign");
    tokio::time::sleep(lease.ttl + Duration::from_millis(300)).await;
    match store.keep_alive(lease.id).await {
        Err(Error::SessionExpired(id)) => assert_eq!(id, lease.id),
        other => panic!("renewal after expiry must fail with SessionExpired, got {other:?}"),
    }
    assert_eq!(store.leader(&election).await.expect("read"), None);
}

/// Rule 6: a resign with an old token never removes a successor's grant.
pub async fn resign_never_removes_a_successor(harness: &dyn StoreHarness) {
    let election = unique_election("guarded-resign");
    let a = harness.open().await;
    let b = harness.open().await;
    let first = grant_on(&a, &election, "a").await;
    a.resign(&first).await.expect("first resign");
    let second = grant_on(&b, &election, "b").await;
    for attempt in [&first, &first] {
        match a.resign(attempt).await {
            Err(Error::NotHolder { token, .. }) => assert_eq!(token, first.token),
            other => panic!("rule 6 broken: stale resign returned {other:?}"),
        }
    }
    let leader = b.leader(&election).await.expect("read").expect("b leads");
    assert_eq!(
        leader.token, second.token,
        "rule 6 broken: successor removed"
    );
    // The same holds when the old grant's session expired instead.
    b.close_session(second.session).await.expect("close");
    let third = grant_on(&a, &election, "a").await;
    assert!(matches!(
        b.resign(&second).await,
        Err(Error::NotHolder { .. })
    ));
    assert_eq!(
        a.leader(&election).await.expect("read").map(|l| l.token),
        Some(third.token)
    );
}

/// One candidate id on two sessions (two replicas given the same `--id`):
/// a release presented by the other session, even with the holder's
/// token, never removes the grant (rule 6: a grant is its session's), and
/// the other session is granted only once the holder has released.
pub async fn a_release_by_another_session_of_one_id_changes_nothing(harness: &dyn StoreHarness) {
    let election = unique_election("one-id-release");
    let (a, b) = (harness.open().await, harness.open().await);
    let first = grant_on(&a, &election, "twin").await;
    let other = b.open_session(LONG_TTL).await.expect("open");
    let forged = Grant {
        session: other.id,
        ..first.clone()
    };
    match b.resign(&forged).await {
        Err(Error::NotHolder { token, .. }) => assert_eq!(token, first.token),
        outcome => {
            panic!("rule 6 broken: another session of the same id released the grant: {outcome:?}")
        }
    }
    let leader = a.leader(&election).await.expect("read").expect("a leads");
    assert_eq!(leader.token, first.token, "the holder's grant was removed");
    let campaign = {
        let (b, election) = (Arc::clone(&b), election.clone());
        tokio::spawn(async move { b.campaign(other.id, &election, &candidate("twin")).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !campaign.is_finished(),
        "rule 1 broken: a second session of the same id was granted while the first held"
    );
    a.resign(&first).await.expect("the holder resigns");
    let second = within("the other session granted after the release", campaign)
        .await
        .expect("campaign task")
        .expect("granted");
    assert_eq!(second.session, other.id);
    assert!(second.token > first.token);
}

/// Two electors given the same candidate id, on their own handles: the
/// second waits while the first leads, and the first keeps leading (it is
/// neither released nor superseded by its twin); the second leads only
/// after the first resigns, with a higher token.
pub async fn two_electors_of_one_id_never_lead_together(harness: &dyn StoreHarness) {
    let election = unique_election("one-id-electors");
    let config = LeaseConfig::with_ttl(LONG_TTL);
    let a = Elector::new(harness.open().await, candidate("twin"), config).expect("a");
    let b = Elector::new(harness.open().await, candidate("twin"), config).expect("b");
    let first = within("a campaigns", a.campaign(&election))
        .await
        .expect("campaign");
    let second = {
        let election = election.clone();
        tokio::spawn(async move { b.campaign(&election).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        first.is_leader(),
        "the leader lost its election to a twin of the same id: {:?}",
        first.lost_reason()
    );
    assert!(
        !second.is_finished(),
        "rule 1 broken: the twin leads beside the leader"
    );
    let first_token = first.token();
    first.resign().await.expect("resign");
    let second = within("the twin takes over", second)
        .await
        .expect("campaign task")
        .expect("campaign");
    assert!(second.token() > first_token);
    second.resign().await.expect("resign");
}

/// A dead holder's grant released from another handle (a runner's guard
/// after its runner died): the next candidate is granted at once, and the
/// same release presented again never removes that successor (rule 6).
pub async fn an_orphaned_grant_is_released_from_another_handle(harness: &dyn StoreHarness) {
    let election = unique_election("orphaned");
    let holder = harness.open().await;
    let first = grant_on(&holder, &election, "a").await;
    let waiter = harness.open().await;
    let session = waiter
        .open_session(Duration::from_secs(30))
        .await
        .expect("open");
    let candidate = CandidateId::new("b").expect("valid id");
    let campaign = {
        let (waiter, election) = (Arc::clone(&waiter), election.clone());
        tokio::spawn(async move { waiter.campaign(session.id, &election, &candidate).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!campaign.is_finished(), "granted while the holder lived");
    let guard = harness.open().await;
    guard.release_orphaned(&first).await.expect("release");
    let second = within("the waiter granted after the release", campaign)
        .await
        .expect("campaign task")
        .expect("granted");
    assert!(second.token > first.token);
    match guard.release_orphaned(&first).await {
        Err(Error::NotHolder { token, .. }) => assert_eq!(token, first.token),
        other => panic!("rule 6 broken: a stale release returned {other:?}"),
    }
    let leader = guard
        .leader(&election)
        .await
        .expect("read")
        .expect("b leads");
    assert_eq!(
        leader.token, second.token,
        "rule 6 broken: successor removed"
    );
    drop(holder);
}

/// Observe reports leader → no leader → new leader, ending on the final
/// state.
pub async fn observe_sees_leader_release_and_successor(harness: &dyn StoreHarness) {
    let election = unique_election("observe");
    let observer = harness.open().await;
    let mut watch = observer.watch(&election).await.expect("watch");
    assert_eq!(*watch.borrow_and_update(), None);
    let a = harness.open().await;
    let first = grant_on(&a, &election, "a").await;
    within(
        "observer sees a",
        watch.wait_for(|l| l.as_ref().is_some_and(|l| l.token == first.token)),
    )
    .await
    .expect("watch open");
    a.resign(&first).await.expect("resign");
    within("observer sees no leader", watch.wait_for(Option::is_none))
        .await
        .expect("watch open");
    let b = harness.open().await;
    let second = grant_on(&b, &election, "b").await;
    let seen = within(
        "observer sees b",
        watch.wait_for(|l| l.as_ref().is_some_and(|l| l.token == second.token)),
    )
    .await
    .expect("watch open")
    .clone()
    .expect("some leader");
    assert_eq!(seen.candidate, candidate("b"));
    // An expiry (not a release) is observed too.
    let lease = b.open_session(SHORT_TTL).await.expect("open");
    b.resign(&second).await.expect("resign");
    let third = b
        .campaign(lease.id, &election, &candidate("short"))
        .await
        .expect("campaign");
    within(
        "observer sees the short-lived holder",
        watch.wait_for(|l| l.as_ref().is_some_and(|l| l.token == third.token)),
    )
    .await
    .expect("watch open");
    within("observer sees the expiry", watch.wait_for(Option::is_none))
        .await
        .expect("watch open");
}

/// A renewal is not a change: while the holder only renews (for three
/// TTLs, so that stores that re-read at the holder's expiry do so), neither
/// watch publishes anything; `leasehold observe` prints a line per change.
pub async fn watch_ignores_renewals(harness: &dyn StoreHarness) {
    let election = unique_election("renewals");
    let observer = harness.open().await;
    let mut leaders = observer.watch(&election).await.expect("watch");
    let mut status = observer.watch_status(&election).await.expect("watch");
    let holder = harness.open().await;
    let lease = holder.open_session(SHORT_TTL).await.expect("open");
    let grant = within(
        "campaign",
        holder.campaign(lease.id, &election, &candidate("renewer")),
    )
    .await
    .expect("campaign");
    within(
        "the watch sees the holder",
        leaders.wait_for(|l| l.as_ref().is_some_and(|l| l.token == grant.token)),
    )
    .await
    .expect("watch open");
    within(
        "the status watch sees the holder",
        status.wait_for(|s| s.leader().is_some_and(|l| l.token == grant.token)),
    )
    .await
    .expect("watch open");
    let renew_until = Instant::now() + lease.ttl * 3;
    while Instant::now() < renew_until {
        tokio::time::sleep(lease.ttl / 4).await;
        holder.keep_alive(lease.id).await.expect("renewal");
    }
    assert!(
        !leaders.has_changed().expect("watch open"),
        "a renewal was published as a change of leader: {:?}",
        *leaders.borrow()
    );
    assert!(
        !status.has_changed().expect("watch open"),
        "a renewal was published as a change of status: {:?}",
        *status.borrow()
    );
    holder.resign(&grant).await.expect("resign");
    within(
        "the watch sees the release",
        leaders.wait_for(Option::is_none),
    )
    .await
    .expect("watch open");
    within(
        "the status watch sees the release",
        status.wait_for(|s| *s == LeaderStatus::Known(None)),
    )
    .await
    .expect("watch open");
}

/// A process holding many elections keeps them with its renewals alone:
/// its leaders' watches read the store when their own election changes,
/// never once per election per renewal period, nor when this process takes
/// another election; yet a grant taken from under one of them still ends
/// that leadership at once, the others going on.
pub async fn a_holder_of_many_reads_nothing_per_period(harness: &dyn StoreHarness) {
    const HELD: usize = 10;
    const TTL: Duration = Duration::from_secs(2);
    let store = harness.open().await;
    let elector = Elector::new(
        Arc::clone(&store),
        candidate("holder"),
        LeaseConfig::with_ttl(TTL),
    )
    .expect("config");
    let base = unique_election("many");
    let name = |i: usize| ElectionName::new(format!("{base}-{i}")).expect("valid name");
    let mut held = Vec::new();
    for i in 0..HELD {
        held.push(
            within("campaign", elector.campaign(&name(i)))
                .await
                .expect("campaign"),
        );
    }
    // The monitors open their watches in the background.
    tokio::time::sleep(TTL / 2).await;
    let reads = |held: &[crate::Leadership]| -> Vec<u64> {
        held.iter().map(|l| watch_reads_of(l.election())).collect()
    };
    let before = reads(&held);
    // Two and a half TTLs: a watch that re-read at its holder's expiry
    // would have read at least twice.
    tokio::time::sleep(TTL * 5 / 2).await;
    for i in HELD..HELD + 5 {
        let more = within("campaign", elector.campaign(&name(i)))
            .await
            .expect("campaign");
        held.push(more);
    }
    let after = reads(&held);
    for ((leadership, before), after) in held.iter().zip(&before).zip(&after) {
        assert!(
            leadership.is_leader(),
            "{} was lost while held: {:?}",
            leadership.election(),
            leadership.lost_reason()
        );
        assert_eq!(
            after - before,
            0,
            "{}: its holder's watch read the store {} times while its election did not \
             change (over 2.5 TTLs, and as this process took 5 more elections)",
            leadership.election(),
            after - before
        );
    }
    // Still listening: the grant released from another handle (as a
    // runner's guard does) ends that leadership, and only that one.
    let other = harness.open().await;
    let victim = held.remove(0);
    other
        .release_orphaned(victim.grant())
        .await
        .expect("release from another handle");
    within("the holder learns its grant is gone", victim.lost()).await;
    for leadership in &held {
        assert!(
            leadership.is_leader(),
            "{} ended with another election's grant: {:?}",
            leadership.election(),
            leadership.lost_reason()
        );
    }
    drop(victim);
    drop(held);
    let _ = elector.close().await;
}

/// A watch's read that fails (here inside the backend, after the store
/// told the watch of a release) is retried until it succeeds, and the
/// final state is published — not left until some later change. Meanwhile
/// the watch keeps the last known leader.
pub async fn watch_retries_a_failed_read(harness: &dyn StoreHarness) {
    let election = unique_election("watch-retry");
    let observer = harness.open().await;
    let mut leaders = observer.watch(&election).await.expect("watch");
    let a = harness.open().await;
    let grant = grant_on(&a, &election, "a").await;
    within(
        "the watch sees a",
        leaders.wait_for(|l| l.as_ref().is_some_and(|l| l.token == grant.token)),
    )
    .await
    .expect("watch open");
    fail_watch_reads(&election);
    a.resign(&grant).await.expect("resign");
    within("the watch tries again after a failed read", async {
        while failed_watch_reads(&election) < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(
        leaders.borrow().as_ref().map(|l| l.token),
        Some(grant.token),
        "while the store cannot be read, the watch keeps the last known leader"
    );
    heal_watch_reads(&election);
    within(
        "the watch publishes the final state",
        leaders.wait_for(Option::is_none),
    )
    .await
    .expect("watch open");
}

/// While a watch cannot read the store its status is unknown (the last
/// known leader may have stepped down meanwhile); once it can, the true
/// state is published.
pub async fn watch_status_is_unknown_while_reads_fail(harness: &dyn StoreHarness) {
    let election = unique_election("watch-unknown");
    let observer = harness.open().await;
    let mut status = observer.watch_status(&election).await.expect("watch");
    let a = harness.open().await;
    let grant = grant_on(&a, &election, "a").await;
    within(
        "the status watch sees a",
        status.wait_for(|s| s.leader().is_some_and(|l| l.token == grant.token)),
    )
    .await
    .expect("watch open");
    fail_watch_reads(&election);
    a.resign(&grant).await.expect("resign");
    within(
        "the status turns unknown",
        status.wait_for(LeaderStatus::is_unknown),
    )
    .await
    .expect("watch open");
    heal_watch_reads(&election);
    within(
        "the status is known again, with the final state",
        status.wait_for(|s| *s == LeaderStatus::Known(None)),
    )
    .await
    .expect("watch open");
}

/// Closing a session releases every election it holds, at once.
pub async fn closing_a_session_releases_its_grants(harness: &dyn StoreHarness) {
    let store = harness.open().await;
    let lease = store.open_session(LONG_TTL).await.expect("open");
    let elections = [unique_election("close-a"), unique_election("close-b")];
    for election in &elections {
        store
            .campaign(lease.id, election, &candidate("a"))
            .await
            .expect("campaign");
    }
    store.close_session(lease.id).await.expect("close");
    for election in &elections {
        assert_eq!(store.leader(election).await.expect("read"), None);
    }
    assert!(matches!(
        store.keep_alive(lease.id).await,
        Err(Error::SessionExpired(_))
    ));
    store
        .close_session(lease.id)
        .await
        .expect("closing twice is fine");
}

/// A campaign dropped while waiting never ends up holding the election.
pub async fn cancelled_campaign_does_not_hold(harness: &dyn StoreHarness) {
    let election = unique_election("cancel");
    let a = harness.open().await;
    let first = grant_on(&a, &election, "a").await;
    let b = harness.open().await;
    // How long this store takes to answer a campaign: the held one below
    // is given twenty times that (and at least 300 ms), so that its
    // request surely reached the store before it is cancelled, and a
    // wrong grant would have come back.
    let free = unique_election("cancel-free");
    let started = Instant::now();
    grant_on(&b, &free, "b").await;
    let answer = started.elapsed() * 20 + Duration::from_millis(300);
    let lease = b.open_session(LONG_TTL).await.expect("open");
    let waited = timeout(answer, b.campaign(lease.id, &election, &candidate("b"))).await;
    assert!(
        waited.is_err(),
        "rule 1 broken: campaign won a held election"
    );
    a.resign(&first).await.expect("resign");
    tokio::time::sleep(answer + Duration::from_millis(200)).await;
    assert_eq!(
        b.leader(&election).await.expect("read"),
        None,
        "a cancelled campaign was granted the election"
    );
}

/// A campaign dropped at any point — its request on the way, queued,
/// waiting — never comes to hold the election: once the holder resigns,
/// the election is free. Drops after 0 to 39 ms catch campaigns whose
/// request to the store has not been answered yet.
pub async fn a_campaign_dropped_at_any_point_never_holds(harness: &dyn StoreHarness) {
    let election = unique_election("dropped");
    let a = harness.open().await;
    let first = grant_on(&a, &election, "a").await;
    let b = harness.open().await;
    for after in 0..40 {
        let lease = b.open_session(LONG_TTL).await.expect("open");
        let waited = timeout(
            Duration::from_millis(after),
            b.campaign(lease.id, &election, &candidate("b")),
        )
        .await;
        assert!(
            waited.is_err(),
            "rule 1 broken: campaign won a held election"
        );
    }
    a.resign(&first).await.expect("resign");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        b.leader(&election).await.expect("read"),
        None,
        "a dropped campaign was granted the election"
    );
}

/// Rule 7: invalid input is refused with a typed error.
pub async fn invalid_input_is_rejected(harness: &dyn StoreHarness) {
    let store = harness.open().await;
    assert!(matches!(
        store.open_session(Duration::ZERO).await,
        Err(Error::InvalidInput { .. })
    ));
    // Issue 13: a TTL beyond what every store keeps is refused up front,
    // not sent to the store.
    for too_long in [crate::MAX_TTL + Duration::from_millis(1), Duration::MAX] {
        assert!(matches!(
            store.open_session(too_long).await,
            Err(Error::InvalidInput { .. })
        ));
        assert!(matches!(
            Elector::new(
                Arc::clone(&store),
                candidate("a"),
                LeaseConfig::with_ttl(too_long)
            ),
            Err(Error::InvalidInput { .. })
        ));
    }
    for bad in ["", "/abs", ".dot", "white space", &"x".repeat(201)] {
        assert!(matches!(
            ElectionName::new(bad),
            Err(Error::InvalidInput { .. })
        ));
    }
    let mut config = LeaseConfig::with_ttl(Duration::from_secs(2));
    config.renew_every = Duration::from_secs(1);
    assert!(matches!(
        Elector::new(Arc::clone(&store), candidate("a"), config),
        Err(Error::InvalidInput { .. })
    ));
    assert!(matches!(
        Elector::new(store, candidate("a"), LeaseConfig::with_ttl(Duration::ZERO)),
        Err(Error::InvalidInput { .. })
    ));
}

/// Every election the store has seen is listed, with its holder.
pub async fn elections_are_listed(harness: &dyn StoreHarness) {
    let store = harness.open().await;
    let held = unique_election("list-held");
    let free = unique_election("list-free");
    let grant = grant_on(&store, &held, "a").await;
    let other = grant_on(&store, &free, "b").await;
    store.resign(&other).await.expect("resign");
    let listed = store.elections().await.expect("list");
    let find = |name: &ElectionName| {
        listed
            .iter()
            .find(|e| &e.election == name)
            .unwrap_or_else(|| panic!("{name} not listed"))
    };
    let leader = find(&held).leader.clone().expect("held has a leader");
    assert_eq!(
        (leader.candidate, leader.token),
        (grant.candidate, grant.token)
    );
    assert_eq!(find(&free).leader, None);
}

fn short_config() -> LeaseConfig {
    LeaseConfig::with_ttl(SHORT_TTL.max(Duration::from_secs(2)))
}

/// Rule 4: when renewals stop reaching the store, the elector's lost signal
/// fires by the conservative deadline, which is before the store can expire
/// the grant.
pub async fn elector_loses_leadership_when_renewals_fail(harness: &dyn StoreHarness) {
    let election = unique_election("elector-lost");
    let faulty = Arc::new(FaultyStore::new(harness.open().await, Arc::new(TokioClock)));
    let elector = Elector::new(faulty.clone(), candidate("a"), short_config()).expect("config");
    let leadership = within("campaign", elector.campaign(&election))
        .await
        .expect("campaign");
    assert!(leadership.is_leader());
    faulty.set_unavailable(true);
    let reason = within("lost signal", leadership.lost()).await;
    assert!(
        matches!(reason, LostReason::DeadlineExpired { .. }),
        "lost for {reason:?}"
    );
    assert!(!leadership.is_leader());
    assert!(Instant::now() >= leadership.deadline());
}

/// Rules 3 and 4: a partitioned leader's lost signal fires before a
/// competitor is granted the election.
pub async fn elector_steps_down_before_a_successor_is_granted(harness: &dyn StoreHarness) {
    let election = unique_election("elector-handover");
    let faulty = Arc::new(FaultyStore::new(harness.open().await, Arc::new(TokioClock)));
    let a = Elector::new(faulty.clone(), candidate("a"), short_config()).expect("config");
    let b = Elector::new(harness.open().await, candidate("b"), short_config()).expect("config");
    let first = within("a campaigns", a.campaign(&election))
        .await
        .expect("campaign");
    faulty.set_drop_keep_alives(true);
    let second = within("b takes over", b.campaign(&election))
        .await
        .expect("campaign");
    // Checked the moment b is granted, before anything else runs.
    assert!(
        !first.is_leader(),
        "rule 4 broken: b was granted the election while a still considered itself leader"
    );
    assert!(Instant::now() >= first.deadline());
    assert!(matches!(
        first.lost_reason(),
        Some(LostReason::DeadlineExpired { .. })
    ));
    assert!(second.token() > first.token());
    second.resign().await.expect("resign");
}

/// Notes (the line of standbys, transfer requests): kept in the order
/// first put, replaced in place, one per session and name, gone with
/// their session (closed or expired), refused on an ended session or with
/// a bad name or text, and never visible on another election.
pub async fn notes_are_ordered_and_end_with_their_session(harness: &dyn StoreHarness) {
    let election = unique_election("notes");
    let other = unique_election("notes-other");
    let a = harness.open().await;
    let b = harness.open().await;
    let sa = a.open_session(LONG_TTL).await.expect("open");
    let sb = b.open_session(LONG_TTL).await.expect("open");
    let short = b.open_session(SHORT_TTL).await.expect("open");
    a.put_note(sa.id, &election, "cand", "0 a")
        .await
        .expect("put");
    b.put_note(sb.id, &election, "cand", "5 b")
        .await
        .expect("put");
    b.put_note(short.id, &election, "cand", "1 short")
        .await
        .expect("put");
    a.put_note(sa.id, &election, "next", "b")
        .await
        .expect("put");
    b.put_note(sb.id, &other, "cand", "elsewhere")
        .await
        .expect("put");
    // Replacing keeps the note's place.
    a.put_note(sa.id, &election, "cand", "3 a again")
        .await
        .expect("replace");
    let seen = |notes: Vec<crate::store::Note>| -> Vec<(String, String)> {
        notes.into_iter().map(|n| (n.name, n.text)).collect()
    };
    let notes = within("read notes", b.notes(&election))
        .await
        .expect("notes");
    assert!(
        notes.windows(2).all(|w| w[0].order < w[1].order),
        "notes must come in increasing order: {notes:?}"
    );
    assert_eq!(
        seen(notes.clone()),
        [
            ("cand".into(), "3 a again".into()),
            ("cand".into(), "5 b".into()),
            ("cand".into(), "1 short".into()),
            ("next".into(), "b".into()),
        ],
        "notes in the order first put, replaced in place: {notes:?}"
    );
    assert_eq!(notes[0].session, sa.id);
    assert_eq!(notes[1].session, sb.id);
    // The short session expires unrenewed: its note goes with it.
    tokio::time::sleep(short.ttl + Duration::from_millis(500)).await;
    a.keep_alive(sa.id).await.expect("renew");
    b.keep_alive(sb.id).await.expect("renew");
    let names = seen(a.notes(&election).await.expect("notes"));
    assert!(
        !names.contains(&("cand".into(), "1 short".into())),
        "an expired session's note must be gone: {names:?}"
    );
    match b.put_note(short.id, &election, "cand", "late").await {
        Err(Error::SessionExpired(id)) => assert_eq!(id, short.id),
        other => panic!("a note on an ended session must fail with SessionExpired, got {other:?}"),
    }
    // Deleting one note leaves the session's others; deleting twice is fine.
    a.delete_note(sa.id, &election, "next")
        .await
        .expect("delete");
    a.delete_note(sa.id, &election, "next")
        .await
        .expect("delete again");
    assert_eq!(
        seen(b.notes(&election).await.expect("notes")),
        [
            ("cand".into(), "3 a again".into()),
            ("cand".into(), "5 b".into())
        ]
    );
    // Closing a session removes its notes.
    a.close_session(sa.id).await.expect("close");
    assert_eq!(
        seen(b.notes(&election).await.expect("notes")),
        [("cand".into(), "5 b".into())]
    );
    assert_eq!(
        seen(b.notes(&other).await.expect("notes")),
        [("cand".into(), "elsewhere".into())]
    );
    for (name, text) in [
        ("", "x"),
        ("Cand", "x"),
        ("a/b", "x"),
        ("cand", "line\nbreak"),
    ] {
        match b.put_note(sb.id, &election, name, text).await {
            Err(Error::InvalidInput { .. }) => {}
            other => panic!("note {name:?} {text:?} must be refused as invalid, got {other:?}"),
        }
    }
    let long = "x".repeat(crate::store::MAX_NOTE_TEXT + 1);
    assert!(matches!(
        b.put_note(sb.id, &election, "cand", &long).await,
        Err(Error::InvalidInput { .. })
    ));
    assert!(
        b.notes(&unique_election("no-notes"))
            .await
            .expect("notes of an election nobody noted")
            .is_empty()
    );
}

/// A notes watch publishes every put and delete, and a note whose session
/// expires without anyone writing.
pub async fn notes_watch_sees_puts_deletes_and_expiries(harness: &dyn StoreHarness) {
    let election = unique_election("notes-watch");
    let store = harness.open().await;
    let watcher = harness.open().await;
    let mut notes = watcher.watch_notes(&election).await.expect("watch");
    assert!(notes.borrow_and_update().is_empty());
    let long = store.open_session(LONG_TTL).await.expect("open");
    let short = store.open_session(SHORT_TTL).await.expect("open");
    store
        .put_note(long.id, &election, "cand", "0 long")
        .await
        .expect("put");
    store
        .put_note(short.id, &election, "cand", "0 short")
        .await
        .expect("put");
    let texts = |notes: &crate::watch::Receiver<Vec<crate::store::Note>>| -> Vec<String> {
        notes.borrow().iter().map(|n| n.text.clone()).collect()
    };
    within(
        "the watch to see both notes",
        notes.wait_for(|n| n.len() == 2),
    )
    .await
    .expect("watch alive");
    assert_eq!(texts(&notes), ["0 long", "0 short"]);
    within(
        "the watch to see the short session's note expire",
        notes.wait_for(|n| n.len() == 1),
    )
    .await
    .expect("watch alive");
    assert_eq!(texts(&notes), ["0 long"]);
    store
        .delete_note(long.id, &election, "cand")
        .await
        .expect("delete");
    within(
        "the watch to see the delete",
        notes.wait_for(|n| n.is_empty()),
    )
    .await
    .expect("watch alive");
}

/// `amend_note` replaces another session's note in place (same session,
/// same order) from any handle, and never makes a note that is not there
/// (never put, deleted, or of an ended session). A one-note watch holds
/// that note alone, and follows its put, amendment, delete and expiry.
pub async fn a_note_is_amended_in_place_and_watched_alone(harness: &dyn StoreHarness) {
    let election = unique_election("amend");
    let owner = harness.open().await;
    let other = harness.open().await;
    let long = owner.open_session(LONG_TTL).await.expect("open");
    let short = owner.open_session(SHORT_TTL).await.expect("open");
    let mut watched = other
        .watch_note(long.id, &election, "cand")
        .await
        .expect("watch one note");
    assert!(watched.borrow_and_update().is_empty());
    assert!(
        !other
            .amend_note(long.id, &election, "cand", "0 x 1")
            .await
            .expect("amend a note never put"),
        "amending a note that is not there must say so"
    );
    assert!(other.notes(&election).await.expect("notes").is_empty());
    owner
        .put_note(short.id, &election, "cand", "0 first")
        .await
        .expect("put");
    owner
        .put_note(long.id, &election, "cand", "0 second")
        .await
        .expect("put");
    let texts = |w: &crate::watch::Receiver<Vec<crate::store::Note>>| -> Vec<String> {
        w.borrow().iter().map(|n| n.text.clone()).collect()
    };
    within(
        "the one-note watch to see its note",
        watched.wait_for(|n| !n.is_empty()),
    )
    .await
    .expect("watch alive");
    assert_eq!(texts(&watched), ["0 second"]);
    assert!(
        other
            .amend_note(long.id, &election, "cand", "0 second 7")
            .await
            .expect("amend"),
        "amending a live note from another handle must succeed"
    );
    let notes = other.notes(&election).await.expect("notes");
    let shown: Vec<(SessionId, &str)> =
        notes.iter().map(|n| (n.session, n.text.as_str())).collect();
    assert_eq!(
        shown,
        [(short.id, "0 first"), (long.id, "0 second 7")],
        "an amended note keeps its session and its place"
    );
    within(
        "the one-note watch to see the amendment",
        watched.wait_for(|n| n.first().is_some_and(|n| n.text == "0 second 7")),
    )
    .await
    .expect("watch alive");
    assert_eq!(watched.borrow()[0].session, long.id);
    // Only that note: the other session's note never shows in it.
    assert_eq!(texts(&watched), ["0 second 7"]);
    for (name, text) in [
        (
            "cand",
            "line
break",
        ),
        ("Cand", "x"),
    ] {
        assert!(
            matches!(
                other.amend_note(long.id, &election, name, text).await,
                Err(Error::InvalidInput { .. })
            ),
            "amending with {name:?} {text:?} must be refused as invalid"
        );
    }
    owner
        .delete_note(long.id, &election, "cand")
        .await
        .expect("delete");
    within(
        "the one-note watch to see the delete",
        watched.wait_for(|n| n.is_empty()),
    )
    .await
    .expect("watch alive");
    assert!(
        !other
            .amend_note(long.id, &election, "cand", "0 back")
            .await
            .expect("amend a deleted note"),
        "amending a deleted note must not make it again"
    );
    // The short session expires unrenewed: its note goes, and cannot be
    // amended back.
    let mut expiring = other
        .watch_note(short.id, &election, "cand")
        .await
        .expect("watch one note");
    within(
        "the one-note watch to see its session expire",
        expiring.wait_for(|n| n.is_empty()),
    )
    .await
    .expect("watch alive");
    assert!(
        !other
            .amend_note(short.id, &election, "cand", "0 late")
            .await
            .expect("amend an expired session's note"),
        "an ended session's note must not be amended"
    );
    owner.keep_alive(long.id).await.expect("renew");
    assert!(other.notes(&election).await.expect("notes").is_empty());
}

/// A release (resign, or a dead holder's release from another handle) is
/// recorded with its token; an expiry or a closed session is not.
pub async fn releases_are_recorded_and_expiries_are_not(harness: &dyn StoreHarness) {
    let election = unique_election("last-release");
    let store = harness.open().await;
    let other = harness.open().await;
    assert_eq!(store.last_release(&election).await.expect("read"), None);
    let first = grant_on(&store, &election, "a").await;
    store.resign(&first).await.expect("resign");
    assert_eq!(
        other.last_release(&election).await.expect("read"),
        Some(first.token)
    );
    let lease = store.open_session(SHORT_TTL).await.expect("open");
    let second = within(
        "campaign",
        store.campaign(lease.id, &election, &candidate("b")),
    )
    .await
    .expect("campaign");
    // Expiry: the record still names the first grant.
    let third = within(
        "takeover after expiry",
        super::campaign_on_new_session(&*other, &election, "c", LONG_TTL),
    )
    .await;
    assert!(third.token > second.token);
    assert_eq!(
        store.last_release(&election).await.expect("read"),
        Some(first.token),
        "an expiry must not be recorded as a release"
    );
    other.release_orphaned(&third).await.expect("release");
    assert_eq!(
        store.last_release(&election).await.expect("read"),
        Some(third.token)
    );
    let fourth = grant_on(&other, &election, "d").await;
    other.close_session(fourth.session).await.expect("close");
    assert_eq!(
        store.last_release(&election).await.expect("read"),
        Some(third.token),
        "closing a session must not be recorded as a release"
    );
}

/// A store laid out as another election recipe keeps no notes: the
/// recipe's own order is the only line. So what needs them is refused with
/// [`Error::Unsupported`], never silently wrong: priorities and lock-delay
/// (at the campaign), transfer requests, groups of shards or slots, and
/// the list of elections. A plain campaign still works alongside.
pub async fn a_recipe_layout_refuses_what_only_leasehold_keeps(harness: &dyn StoreHarness) {
    let store = harness.open().await;
    let election = unique_election("recipe");
    let lease = store
        .open_session(Duration::from_secs(5))
        .await
        .expect("session");
    assert!(matches!(
        store.put_note(lease.id, &election, "cand", "0 - a").await,
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        store.notes(&election).await,
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        store.elections().await,
        Err(Error::Unsupported(_))
    ));
    let prioritized = Elector::new(
        Arc::clone(&store),
        CandidateId::new("high").expect("id"),
        LeaseConfig::with_ttl(Duration::from_secs(5)),
    )
    .expect("config")
    .with_priority(5);
    match prioritized.campaign(&election).await {
        Err(Error::Unsupported(message)) => {
            assert!(message.contains("priorit"), "{message}")
        }
        other => panic!("a priority must be refused in a recipe's layout, got {other:?}"),
    }
    let plain = Arc::new(
        Elector::new(
            Arc::clone(&store),
            CandidateId::new("plain").expect("id"),
            LeaseConfig::with_ttl(Duration::from_secs(5)),
        )
        .expect("config"),
    );
    let leadership = plain.campaign(&election).await.expect("a plain campaign");
    match crate::transfer::request_transfer(
        &store,
        &election,
        None,
        Duration::from_secs(5),
        Duration::from_secs(1),
    )
    .await
    {
        Err(Error::Unsupported(_)) => {}
        other => panic!("a transfer must be refused in a recipe's layout, got {other:?}"),
    }
    match crate::group::Shards::join(Arc::clone(&plain), unique_election("recipe-group"), 4).await {
        Err(Error::Unsupported(_)) => {}
        other => panic!(
            "a group must be refused in a recipe's layout, got {:?}",
            other.map(|_| ())
        ),
    }
    leadership.resign().await.expect("resign");
    let _ = plain.close().await;
    let _ = prioritized.close().await;
    store.close_session(lease.id).await.expect("close");
}
