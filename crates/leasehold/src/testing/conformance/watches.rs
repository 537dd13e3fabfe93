//! Watches: the leader's changes seen, renewals not, failed reads
//! retried.

use super::*;

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

/// Every one of `held` still leads, and its watch read the store no more
/// times (`after`) than before (`before`).
fn none_read_the_store(held: &[crate::Leadership], before: &[u64], after: &[u64]) {
    for ((leadership, before), after) in held.iter().zip(before).zip(after) {
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
        LeaseConfig::new(TTL),
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
    none_read_the_store(&held, &before, &reads(&held));
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
