//! The elector under simulated time (tokio's paused clock): exact checks of
//! deadlines, renewals and step-down, with faults injected between the
//! elector and an in-memory store.

use std::sync::Arc;
use std::time::Duration;

use leasehold::backend::memory::MemoryStore;
use leasehold::clock::{Clock, TokioClock};
use leasehold::store::Store;
use leasehold::testing::{FaultyStore, unique_election};
use leasehold::{CandidateId, Elector, LeaseConfig, LostReason};
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

struct Setup {
    store: MemoryStore,
    faulty: Arc<FaultyStore>,
    elector: Elector,
}

fn setup(ttl: Duration) -> Setup {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock);
    let store = MemoryStore::with_clock(Arc::clone(&clock));
    let faulty = Arc::new(FaultyStore::new(
        Arc::new(store.clone()),
        Arc::clone(&clock),
    ));
    let elector = Elector::new(
        faulty.clone(),
        CandidateId::new("a").expect("id"),
        LeaseConfig::new(ttl),
    )
    .expect("valid config")
    .with_clock(clock);
    Setup {
        store,
        faulty,
        elector,
    }
}

/// Rule 3: the deadline counts from when a renewal was *sent*, so slow
/// replies can never make the holder believe in a lease the store has
/// already expired.
#[tokio::test(start_paused = true)]
async fn deadline_counts_from_send_not_from_reply() {
    let s = setup(ms(2000));
    let election = unique_election("send-time");
    let leadership = s.elector.campaign(&election).await.expect("campaign");
    s.faulty.set_keep_alive_reply_delay(ms(300));
    let first = leadership.deadline();
    for _ in 0..200 {
        tokio::time::sleep(ms(37)).await;
        let now = Instant::now();
        let Some(leader) = s.store.leader(&election).await.expect("read") else {
            panic!("the leader was lost although every renewal got through");
        };
        let store_expiry = now + leader.expires_in;
        assert!(
            leadership.deadline() < store_expiry,
            "rule 3 broken: holder deadline {:?} after the store's expiry",
            leadership.deadline() - store_expiry
        );
    }
    // The checks above saw renewed deadlines, not only the first: 7.4 s
    // of a 2 s lease went by.
    assert!(
        leadership.deadline() > first + ms(5000),
        "the deadline was not renewed: {:?} after the first",
        leadership.deadline() - first
    );
    assert!(leadership.is_leader());
    assert!(s.faulty.keep_alives_sent() >= 8);
}

/// Rule 4: when renewals hang, the lost signal fires exactly at the
/// conservative deadline, which is before the store's expiry.
#[tokio::test(start_paused = true)]
async fn lost_fires_at_the_deadline_when_renewals_hang() {
    let s = setup(ms(3000));
    let election = unique_election("hang");
    let leadership = s.elector.campaign(&election).await.expect("campaign");
    tokio::time::sleep(ms(1500)).await;
    s.faulty.set_drop_keep_alives(true);
    let deadline = leadership.deadline();
    let store_expiry = Instant::now()
        + s.store
            .leader(&election)
            .await
            .expect("read")
            .expect("held")
            .expires_in;
    let reason = leadership.lost().await;
    let lost_at = Instant::now();
    assert!(
        matches!(reason, LostReason::DeadlineExpired { .. }),
        "{reason:?}"
    );
    assert!(lost_at >= deadline, "lost early: {:?}", deadline - lost_at);
    assert!(
        lost_at - deadline < ms(5),
        "lost late: {:?}",
        lost_at - deadline
    );
    assert!(
        lost_at < store_expiry,
        "rule 4 broken: stepped down after the store expired the grant"
    );
    assert!(!leadership.is_leader());
}

/// The renewal loop renews once per period and nothing more.
#[tokio::test(start_paused = true)]
async fn renews_once_per_period() {
    let s = setup(ms(3000));
    let leadership = s
        .elector
        .campaign(&unique_election("period"))
        .await
        .expect("campaign");
    tokio::time::sleep(ms(10_500)).await;
    assert_eq!(s.faulty.keep_alives_sent(), 10);
    assert!(leadership.is_leader());
}

/// An outage shorter than the validity is ridden out: renewals are retried
/// and leadership continues.
#[tokio::test(start_paused = true)]
async fn a_short_outage_is_ridden_out() {
    let s = setup(ms(3000));
    let leadership = s
        .elector
        .campaign(&unique_election("outage"))
        .await
        .expect("campaign");
    s.faulty.set_unavailable(true);
    tokio::time::sleep(ms(1500)).await;
    assert!(leadership.is_leader());
    s.faulty.set_unavailable(false);
    tokio::time::sleep(ms(10_000)).await;
    assert!(
        leadership.is_leader(),
        "lost: {:?}",
        leadership.lost_reason()
    );
}

/// An outage past the deadline ends leadership with the last error named.
#[tokio::test(start_paused = true)]
async fn a_long_outage_ends_leadership_with_the_error() {
    let s = setup(ms(3000));
    let leadership = s
        .elector
        .campaign(&unique_election("long-outage"))
        .await
        .expect("campaign");
    s.faulty.set_unavailable(true);
    let reason = leadership.lost().await;
    match reason {
        LostReason::DeadlineExpired {
            last_error: Some(e),
        } => assert!(e.contains("unreachable"), "{e}"),
        other => panic!("expected a deadline loss with the error, got {other:?}"),
    }
}

/// The store dropping the grant (here: its session closed from outside)
/// ends leadership at once, long before the deadline.
#[tokio::test(start_paused = true)]
async fn a_vanished_grant_ends_leadership_at_once() {
    let s = setup(ms(3000));
    let leadership = s
        .elector
        .campaign(&unique_election("vanish"))
        .await
        .expect("campaign");
    let before = Instant::now();
    s.store
        .close_session(leadership.grant().session)
        .await
        .expect("close");
    let reason = leadership.lost().await;
    assert!(
        matches!(reason, LostReason::Superseded | LostReason::SessionExpired),
        "{reason:?}"
    );
    assert!(Instant::now() - before < ms(1000));
}

/// After the session was lost, the next campaign opens a new one.
#[tokio::test(start_paused = true)]
async fn a_new_campaign_after_loss_opens_a_new_session() {
    let s = setup(ms(3000));
    let election = unique_election("again");
    let first = s.elector.campaign(&election).await.expect("campaign");
    s.faulty.set_unavailable(true);
    first.lost().await;
    s.faulty.set_unavailable(false);
    let second = s.elector.campaign(&election).await.expect("campaign again");
    assert!(second.token() > first.token());
    assert_ne!(second.grant().session, first.grant().session);
    assert!(second.is_leader());
}

/// Resign ends leadership locally first, then releases the grant.
#[tokio::test(start_paused = true)]
async fn resign_signals_then_releases() {
    let s = setup(ms(3000));
    let election = unique_election("resign");
    let leadership = s.elector.campaign(&election).await.expect("campaign");
    let mut signal = {
        let mut watch = s
            .elector
            .observe_last_known(&election)
            .await
            .expect("observe");
        watch.borrow_and_update();
        watch
    };
    leadership.resign().await.expect("resign");
    signal.changed().await.expect("observer sees the release");
    assert_eq!(*signal.borrow(), None);
    assert_eq!(s.store.leader(&election).await.expect("read"), None);
}

/// Two electors on one store: the waiter takes over within a round trip of
/// the holder resigning, and within the TTL of it crashing.
#[tokio::test(start_paused = true)]
async fn waiter_takes_over_on_resign_and_on_crash() {
    let s = setup(ms(3000));
    let election = unique_election("takeover");
    let b_link = Arc::new(FaultyStore::new(
        Arc::new(s.store.clone()),
        Arc::new(TokioClock),
    ));
    let b = Elector::new(
        b_link.clone(),
        CandidateId::new("b").expect("id"),
        LeaseConfig::new(ms(3000)),
    )
    .expect("config");
    let first = s.elector.campaign(&election).await.expect("campaign");
    let waiter = tokio::spawn(async move {
        let leadership = b.campaign(&election).await.expect("campaign");
        (Instant::now(), leadership, b)
    });
    tokio::time::sleep(ms(5000)).await;
    assert!(!waiter.is_finished(), "rule 1 broken");
    let resigned_at = Instant::now();
    let first_token = first.token();
    first.resign().await.expect("resign");
    let (at, second, b) = waiter.await.expect("waiter");
    assert!(
        at - resigned_at < ms(10),
        "planned handover took {:?}",
        at - resigned_at
    );
    assert!(second.token() > first_token);

    // Now b "crashes": nothing it sends reaches the store any more.
    let election = second.election().clone();
    let crashed_at = Instant::now();
    b_link.set_unavailable(true);
    let third = s.elector.campaign(&election).await.expect("campaign");
    let gap = Instant::now() - crashed_at;
    assert!(gap <= ms(3100), "crash failover took {gap:?}, TTL is 3s");
    assert!(
        second.lost_reason().is_some(),
        "rule 4 broken: the crashed holder still believes it leads"
    );
    assert!(third.token() > second.token());
    assert_eq!(
        s.store
            .leader(&election)
            .await
            .expect("read")
            .map(|l| l.token),
        Some(third.token())
    );
    drop((second, b));
}

/// The renewal observer sees every renewal with its round trip, and a
/// renewal still outstanding at the deadline as a failure.
#[tokio::test(start_paused = true)]
async fn the_renewal_observer_sees_round_trips_and_failures() {
    use std::sync::Mutex;
    let events: Arc<Mutex<Vec<Result<Duration, String>>>> = Arc::default();
    let seen = Arc::clone(&events);
    let mut s = setup(ms(3000));
    s.elector = s
        .elector
        .with_renewal_observer(leasehold::RenewalObserver::new(move |event| {
            let entry = match event {
                leasehold::RenewalEvent::Renewed { round_trip, .. } => Ok(*round_trip),
                leasehold::RenewalEvent::Failed { error, .. } => Err(error.to_string()),
                _ => Err("unknown event".into()),
            };
            seen.lock().expect("lock").push(entry);
        }));
    let election = unique_election("observer");
    let leadership = s.elector.campaign(&election).await.expect("campaign");
    s.faulty.set_keep_alive_reply_delay(ms(250));
    tokio::time::sleep(ms(3500)).await;
    let renewed: Vec<_> = events.lock().expect("lock").clone();
    assert!(renewed.len() >= 3, "{renewed:?}");
    assert!(renewed.iter().all(|e| *e == Ok(ms(250))), "{renewed:?}");
    s.faulty.set_drop_keep_alives(true);
    let reason = leadership.lost().await;
    assert!(
        matches!(reason, LostReason::DeadlineExpired { .. }),
        "{reason:?}"
    );
    tokio::task::yield_now().await;
    let last = events.lock().expect("lock").last().cloned();
    assert!(
        matches!(&last, Some(Err(e)) if e.contains("timed out")),
        "{last:?}"
    );
}

/// A clock whose sleepers wake when it still reads 2 ms short of the
/// instant they asked for (as a clock converting between rates can, by
/// rounding, by a hair).
#[derive(Debug)]
struct EarlyClock;

impl Clock for EarlyClock {
    fn now(&self) -> Instant {
        Instant::now() - ms(2)
    }

    fn sleep_until(
        &self,
        deadline: Instant,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(tokio::time::sleep_until(deadline))
    }
}

/// Regression (simulation seed 2233 hung): a clock that wakes a hair early
/// must not make the renewal task or `lost()` wait on the same instant
/// forever; renewals go on, and a hung renewal still ends leadership at
/// the deadline.
#[tokio::test(start_paused = true)]
async fn a_clock_that_wakes_early_neither_spins_nor_misses_the_deadline() {
    let clock: Arc<dyn Clock> = Arc::new(EarlyClock);
    let store = MemoryStore::with_clock(Arc::clone(&clock));
    let faulty = Arc::new(FaultyStore::new(
        Arc::new(store.clone()),
        Arc::clone(&clock),
    ));
    let elector = Elector::new(
        faulty.clone(),
        CandidateId::new("a").expect("id"),
        LeaseConfig::new(ms(3000)),
    )
    .expect("valid config")
    .with_clock(clock);
    let leadership = elector
        .campaign(&unique_election("early"))
        .await
        .expect("campaign");
    // Several renewal periods: still leading, so renewals were sent.
    tokio::time::timeout(ms(10_000), tokio::time::sleep(ms(5_000)))
        .await
        .expect("time moves on");
    assert!(leadership.is_leader());
    faulty.set_drop_keep_alives(true);
    let deadline = leadership.deadline();
    let reason = tokio::time::timeout(ms(10_000), leadership.lost())
        .await
        .expect("lost() returns");
    assert!(
        matches!(reason, LostReason::DeadlineExpired { .. }),
        "{reason:?}"
    );
    let lost_at = Instant::now();
    assert!(
        lost_at + ms(1) >= deadline,
        "lost early: {:?}",
        deadline - lost_at
    );
}

/// A renewal that falls due just as this process takes another election
/// still goes out. The lease core looks at the time at every event, so the
/// grant's event is what asks for the renewal; the renewal task must hear
/// of it (it once did not: no renewal went out until the deadline ended
/// the session, and with it every leadership, which a process taking
/// thousands of elections at once hit every time).
#[tokio::test(start_paused = true)]
async fn a_renewal_due_as_an_election_is_taken_still_goes_out() {
    let ttl = ms(3000);
    let s = setup(ttl);
    let base = unique_election("due");
    let period = LeaseConfig::new(ttl).renew_every;
    let mut held = vec![
        s.elector
            .campaign(&leasehold::ElectionName::new(format!("{base}-0")).expect("name"))
            .await
            .expect("campaign"),
    ];
    let started = Instant::now();
    for round in 1..=6_u32 {
        // To the instant the next renewal falls due (the clock moves
        // without running anyone), then take an election at once.
        let due = started + period * round;
        tokio::time::advance(due.saturating_duration_since(Instant::now())).await;
        let election = leasehold::ElectionName::new(format!("{base}-{round}")).expect("name");
        held.push(s.elector.campaign(&election).await.expect("campaign"));
    }
    // Two TTLs more: without renewals the deadline passes within one.
    tokio::time::sleep(ttl * 2).await;
    for leadership in &held {
        assert!(
            leadership.is_leader(),
            "{} lost: {:?} (renewals sent: {})",
            leadership.election(),
            leadership.lost_reason(),
            s.faulty.keep_alives_sent()
        );
    }
}
