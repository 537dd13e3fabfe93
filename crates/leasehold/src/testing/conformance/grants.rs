//! Grants: one winner, tokens that only increase, expiry, and releases
//! that never remove a successor.

use super::*;

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
/// neither released nor superseded by its twin), and the line shows the
/// twin waiting beside the leader's own entry; the second leads only after
/// the first resigns, with a higher token.
pub async fn two_electors_of_one_id_never_lead_together(harness: &dyn StoreHarness) {
    let election = unique_election("one-id-electors");
    let config = LeaseConfig::new(LONG_TTL);
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
    // The twin is told apart: the holder is the first's session, and the
    // line of waiting candidates shows the twin beside it.
    let reader = harness.open().await;
    let leader = reader
        .leader(&election)
        .await
        .expect("read")
        .expect("a leads");
    assert_eq!(leader.session, Some(first.grant().session));
    // (An interop layout has no line: its recipe's order is the only one.)
    match crate::line::line(&*reader, &election).await {
        Ok(line) => {
            let waiting: Vec<_> = line.iter().filter(|w| !w.is_of(&leader)).collect();
            assert_eq!(waiting.len(), 1, "the twin is not shown waiting: {line:?}");
        }
        Err(Error::Unsupported(_)) => {}
        Err(error) => panic!("the line: {error}"),
    }
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
