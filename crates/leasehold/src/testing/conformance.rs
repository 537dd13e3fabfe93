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
pub use grants::*;
pub use notes::*;
pub use watches::*;

mod grants;
mod notes;
mod watches;
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
                LeaseConfig::new(too_long)
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
    let mut config = LeaseConfig::new(Duration::from_secs(2));
    config.renew_every = Duration::from_secs(1);
    assert!(matches!(
        Elector::new(Arc::clone(&store), candidate("a"), config),
        Err(Error::InvalidInput { .. })
    ));
    assert!(matches!(
        Elector::new(store, candidate("a"), LeaseConfig::new(Duration::ZERO)),
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
    LeaseConfig::new(SHORT_TTL.max(Duration::from_secs(2)))
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

/// A store laid out as another election recipe keeps no notes: the
/// recipe's own order is the only line. So what needs them is refused with
/// [`Error::Unsupported`], never silently wrong: priorities and lock-delay
/// (at the campaign), transfer requests, groups of shards or slots, and
/// the list of elections. A plain campaign still works alongside.
/// A note, the notes and the list of elections: [`Error::Unsupported`].
async fn notes_and_lists_are_unsupported(
    store: &dyn Store,
    session: SessionId,
    election: &ElectionName,
) {
    assert!(matches!(
        store.put_note(session, election, "cand", "0 - a").await,
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        store.notes(election).await,
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        store.elections().await,
        Err(Error::Unsupported(_))
    ));
}

pub async fn a_recipe_layout_refuses_what_only_leasehold_keeps(harness: &dyn StoreHarness) {
    let store = harness.open().await;
    let election = unique_election("recipe");
    let lease = store
        .open_session(Duration::from_secs(5))
        .await
        .expect("session");
    notes_and_lists_are_unsupported(&*store, lease.id, &election).await;
    let prioritized = Elector::new(
        Arc::clone(&store),
        CandidateId::new("high").expect("id"),
        LeaseConfig::new(Duration::from_secs(5)),
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
            LeaseConfig::new(Duration::from_secs(5)),
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
