//! Conformance cases for planned moves (transfers, priorities, lock-delay),
//! run by every store through [`crate::conformance_tests`]. Each elector
//! runs on its own handle onto the store, as separate processes would.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, timeout};

use super::{CountingStore, Counts, FaultyStore, StoreHarness, unique_election, watch_reads_of};
use crate::clock::TokioClock;
use crate::config::LeaseConfig;
use crate::elector::{Elector, HandoverCause, Leadership};
use crate::error::Error;
use crate::lease::LostReason;
use crate::line;
use crate::names::{CandidateId, ElectionName};
use crate::store::{SessionId, Store};
use crate::transfer::request_transfer;

/// How long a test waits for something that must happen.
const PATIENCE: Duration = Duration::from_secs(15);
/// A TTL long enough never to expire during a test.
const TTL: Duration = Duration::from_secs(30);

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: did not happen within {PATIENCE:?}"))
}

fn id(name: &str) -> CandidateId {
    CandidateId::new(name).expect("valid candidate id")
}

async fn elector(harness: &dyn StoreHarness, name: &str) -> Elector {
    Elector::new(harness.open().await, id(name), LeaseConfig::new(TTL)).expect("config")
}

/// An elector "leader" and its leadership of `election` (keep the
/// elector while the leadership is used).
async fn leading(harness: &dyn StoreHarness, election: &ElectionName) -> (Elector, Leadership) {
    let leader = elector(harness, "leader").await;
    let leadership = within("leader campaigns", leader.campaign(election))
        .await
        .expect("campaign");
    (leader, leadership)
}

/// Starts `elector`'s campaign in the background; resolves once it waits
/// in the line (its note is visible), so the order of joining is known.
async fn join(
    elector: Arc<Elector>,
    election: &ElectionName,
    store: &Arc<dyn Store>,
) -> tokio::task::JoinHandle<Leadership> {
    let name = elector.candidate().clone();
    let task = {
        let election = election.clone();
        tokio::spawn(async move { elector.campaign(&election).await.expect("campaign") })
    };
    within("the candidate to join the line", async {
        loop {
            let line = line::line(&**store, election).await.expect("read the line");
            if line.iter().any(|w| w.candidate == name) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    task
}

/// The leader hands over when a transfer asks it to; `resign` then ends its
/// leadership with [`LostReason::HandedOver`].
async fn honour_requests(leadership: Leadership) -> LostReason {
    let handover = within("the handover request", leadership.handover_requested()).await;
    assert_eq!(handover.cause, HandoverCause::Transfer);
    let session = Arc::clone(leadership.session());
    let grant = leadership.grant().clone();
    leadership.resign().await.expect("hand over");
    session
        .lost_reason_of(&grant)
        .expect("leadership ended by the handover")
}

/// `transfer --to B` goes to B even though A waits ahead of it; the old
/// leader's lost reason says it handed over; tokens increase.
pub async fn transfer_goes_to_the_named_standby(harness: &dyn StoreHarness) {
    let election = unique_election("transfer-to");
    let requester = harness.open().await;
    let (_leader, leadership) = leading(harness, &election).await;
    let first_token = leadership.token();
    let a = join(Arc::new(elector(harness, "a").await), &election, &requester).await;
    let b = join(Arc::new(elector(harness, "b").await), &election, &requester).await;
    let lost = tokio::spawn(honour_requests(leadership));
    let transferred = within(
        "the transfer",
        request_transfer(&requester, &election, Some(&id("b")), TTL, PATIENCE),
    )
    .await
    .expect("transfer to b");
    assert_eq!(
        transferred.to.candidate,
        id("b"),
        "the named standby must take over"
    );
    assert!(
        transferred.to.token > first_token,
        "tokens must increase through a transfer"
    );
    let taken = within("b's campaign", b).await.expect("b task");
    assert_eq!(taken.token(), transferred.to.token);
    assert_eq!(lost.await.expect("leader task"), LostReason::HandedOver);
    assert!(!a.is_finished(), "a must still wait: it was not chosen");
    a.abort();
}

/// Without a name the first in line takes over; the old leader, back in
/// line, can be handed the election again.
pub async fn transfer_without_a_name_goes_to_the_first_in_line(harness: &dyn StoreHarness) {
    let election = unique_election("transfer-next");
    let requester = harness.open().await;
    let (_leader, leadership) = leading(harness, &election).await;
    let first_token = leadership.token();
    let a = join(Arc::new(elector(harness, "a").await), &election, &requester).await;
    let b = join(Arc::new(elector(harness, "b").await), &election, &requester).await;
    let old = tokio::spawn(honour_requests(leadership));
    let transferred = within(
        "the transfer",
        request_transfer(&requester, &election, None, TTL, PATIENCE),
    )
    .await
    .expect("transfer to the first in line");
    assert_eq!(
        transferred.to.candidate,
        id("a"),
        "the first in line must take over"
    );
    assert!(transferred.to.token > first_token);
    assert_eq!(old.await.expect("leader task"), LostReason::HandedOver);
    let a = within("a's campaign", a).await.expect("a task");
    // The library's own transfer, from the new leader back to a named one.
    let second_token = a.token();
    a.transfer(Some(&id("b"))).await.expect("a hands over to b");
    let b = within("b's campaign", b).await.expect("b task");
    assert!(b.token() > second_token);
    b.resign().await.expect("resign");
}

/// A chosen standby that cannot take its grant up is no successful
/// transfer. Here the store grants it (on etcd and ZooKeeper the next in
/// line holds as soon as the leader's key goes; here on every store, as
/// its campaign's reply never arrives) but its process never learns it,
/// while its session lives on, as for a stopped replica: the store shows
/// it holding, yet `request_transfer` times out. Once that standby's
/// session ends, the line moves on to the one behind it.
pub async fn a_transfer_to_a_standby_that_cannot_take_it_up_times_out(harness: &dyn StoreHarness) {
    const WAIT: Duration = Duration::from_secs(2);
    let election = unique_election("transfer-untaken");
    let requester = harness.open().await;
    let (_leader, leadership) = leading(harness, &election).await;
    let first_token = leadership.token();
    let frozen = Arc::new(FaultyStore::new(harness.open().await, Arc::new(TokioClock)));
    let b = Arc::new(
        Elector::new(
            Arc::clone(&frozen) as Arc<dyn Store>,
            id("b"),
            LeaseConfig::new(TTL),
        )
        .expect("config"),
    );
    let b_campaign = join(Arc::clone(&b), &election, &requester).await;
    let a = join(Arc::new(elector(harness, "a").await), &election, &requester).await;
    frozen.set_withhold_grants(true);
    let lost = tokio::spawn(honour_requests(leadership));
    let asked = Instant::now();
    let outcome = within(
        "the transfer",
        request_transfer(&requester, &election, Some(&id("b")), TTL, WAIT),
    )
    .await;
    assert!(
        matches!(outcome, Err(Error::Timeout(after)) if after == WAIT),
        "a transfer to a standby that never took its grant up must time out, got {outcome:?}"
    );
    assert!(asked.elapsed() >= WAIT);
    assert_eq!(lost.await.expect("leader task"), LostReason::HandedOver);
    let shown = requester.leader(&election).await.expect("read");
    let shown = shown.expect("the store shows b holding");
    assert_eq!(shown.candidate, id("b"), "the store granted b");
    assert!(shown.token > first_token);
    assert!(!a.is_finished(), "a must still wait behind b");
    // b's session ends (it expires, for a stopped replica): a takes over.
    b_campaign.abort();
    let _ = b_campaign.await;
    b.close().await.expect("close b's session");
    let taken = within("a takes over once b's session ended", a)
        .await
        .expect("a task");
    assert!(taken.token() > shown.token);
    taken.resign().await.expect("resign");
}

/// A transfer to a candidate that does not wait, to the leader itself,
/// with nobody waiting, or of an election nobody leads, is refused at
/// once and changes nothing.
pub async fn transfer_to_an_unknown_candidate_is_refused(harness: &dyn StoreHarness) {
    let election = unique_election("transfer-refused");
    let requester = harness.open().await;
    match request_transfer(&requester, &election, None, TTL, PATIENCE).await {
        Err(Error::InvalidInput { reason, .. }) => {
            assert!(reason.contains("no leader"), "{reason}")
        }
        other => panic!("a transfer without a leader must be refused, got {other:?}"),
    }
    let (_leader, leadership) = leading(harness, &election).await;
    match request_transfer(&requester, &election, None, TTL, PATIENCE).await {
        Err(Error::InvalidInput { reason, .. }) => assert!(reason.contains("nobody"), "{reason}"),
        other => panic!("a transfer with nobody waiting must be refused, got {other:?}"),
    }
    let a = join(Arc::new(elector(harness, "a").await), &election, &requester).await;
    for to in ["ghost", "leader"] {
        match request_transfer(&requester, &election, Some(&id(to)), TTL, PATIENCE).await {
            Err(Error::InvalidInput { .. }) => {}
            other => panic!("a transfer to {to} must be refused, got {other:?}"),
        }
    }
    let current = requester
        .leader(&election)
        .await
        .expect("read")
        .expect("a leader");
    assert_eq!(
        current.token,
        leadership.token(),
        "a refused transfer must change nothing"
    );
    assert!(leadership.is_leader());
    assert!(!a.is_finished());
    a.abort();
}

/// A standby of strictly higher priority is handed the election once it
/// has waited the settling period — not before.
pub async fn priority_preempts_after_the_settling_period(harness: &dyn StoreHarness) {
    let election = unique_election("preempt");
    let requester = harness.open().await;
    let settle = Duration::from_secs(1);
    let leader = elector(harness, "low").await.with_preempt_after(settle);
    let leadership = within("leader campaigns", leader.campaign(&election))
        .await
        .expect("campaign");
    let joined = Instant::now();
    let high = join(
        Arc::new(elector(harness, "high").await.with_priority(5)),
        &election,
        &requester,
    )
    .await;
    let handover = within("the preemption", leadership.handover_requested()).await;
    assert!(
        joined.elapsed() >= settle,
        "preempted {:?} after the higher priority joined; the settling period is {settle:?}",
        joined.elapsed()
    );
    assert_eq!(handover.cause, HandoverCause::Preemption { priority: 5 });
    assert_eq!(handover.to, Some(id("high")));
    let token = leadership.token();
    leadership.resign().await.expect("hand over");
    let high = within("high takes over", high).await.expect("task");
    assert!(high.token() > token);
    high.resign().await.expect("resign");
}

/// Equal priorities never preempt, however long the standby waits.
pub async fn equal_priorities_never_preempt(harness: &dyn StoreHarness) {
    let election = unique_election("no-preempt");
    let requester = harness.open().await;
    let leader = elector(harness, "first")
        .await
        .with_priority(3)
        .with_preempt_after(Duration::from_millis(100));
    let leadership = within("leader campaigns", leader.campaign(&election))
        .await
        .expect("campaign");
    let other = join(
        Arc::new(elector(harness, "second").await.with_priority(3)),
        &election,
        &requester,
    )
    .await;
    let waited = timeout(Duration::from_secs(1), leadership.handover_requested()).await;
    assert!(
        waited.is_err(),
        "an equal priority asked the leader to hand over: {waited:?}"
    );
    assert!(leadership.is_leader());
    assert!(!other.is_finished());
    other.abort();
}

/// Among standbys the highest priority is granted first, then the
/// earliest, whatever the order they joined in.
pub async fn the_highest_priority_standby_is_granted_first(harness: &dyn StoreHarness) {
    let election = unique_election("priority-order");
    let requester = harness.open().await;
    let leader = elector(harness, "leader").await.with_priority(10);
    let leadership = within("leader campaigns", leader.campaign(&election))
        .await
        .expect("campaign");
    let low = join(
        Arc::new(elector(harness, "low").await),
        &election,
        &requester,
    )
    .await;
    let high1 = join(
        Arc::new(elector(harness, "high-1").await.with_priority(2)),
        &election,
        &requester,
    )
    .await;
    let high2 = join(
        Arc::new(elector(harness, "high-2").await.with_priority(2)),
        &election,
        &requester,
    )
    .await;
    let order: Vec<String> = line::line(&*requester, &election)
        .await
        .expect("line")
        .into_iter()
        .map(|w| w.candidate.to_string())
        .collect();
    assert_eq!(order, ["high-1", "high-2", "low"]);
    let mut token = leadership.token();
    leadership.resign().await.expect("resign");
    for (name, task) in [("high-1", high1), ("high-2", high2), ("low", low)] {
        let next = within(&format!("the grant to {name}"), task)
            .await
            .expect("task");
        assert_eq!(next.election(), &election);
        let holder = requester
            .leader(&election)
            .await
            .expect("read")
            .expect("a holder");
        assert_eq!(holder.candidate, id(name), "granted out of priority order");
        assert!(next.token() > token);
        token = next.token();
        next.resign().await.expect("resign");
    }
}

/// A standby at the front of the line whose campaign ends (dropped, or
/// failed) while the store fails for a moment, and whose elector lives
/// on without campaigning again: it leaves the line all the same, once
/// the store answers, so the standby behind it is granted when the leader
/// resigns (before: its note stayed at the front while its session lived,
/// and nobody behind it ever campaigned).
pub async fn a_standby_whose_campaign_ends_leaves_the_line_despite_a_failure(
    harness: &dyn StoreHarness,
) {
    let election = unique_election("leaves-despite-failure");
    let requester = harness.open().await;
    let (_leader, leadership) = leading(harness, &election).await;
    let faulty = Arc::new(FaultyStore::new(harness.open().await, Arc::new(TokioClock)));
    let front =
        Arc::new(Elector::new(faulty.clone(), id("front"), LeaseConfig::new(TTL)).expect("config"));
    let front_task = join(Arc::clone(&front), &election, &requester).await;
    let behind = join(
        Arc::new(elector(harness, "behind").await),
        &election,
        &requester,
    )
    .await;
    faulty.fail_note_deletes(3);
    front_task.abort();
    let _ = front_task.await;
    let token = leadership.token();
    leadership.resign().await.expect("resign");
    let next = within("the grant to the standby behind", behind)
        .await
        .expect("task");
    assert!(next.token() > token);
    let holder = requester.leader(&election).await.expect("read");
    assert_eq!(holder.map(|l| l.candidate), Some(id("behind")));
    next.resign().await.expect("resign");
    drop(front);
}

/// Lock-delay: after the leader's lease expires the election stays
/// unowned for the delay; after a release it does not.
pub async fn lock_delay_after_expiry_not_after_release(harness: &dyn StoreHarness) {
    let election = unique_election("lock-delay");
    let store = harness.open().await;
    // A holder that stops renewing: a session nobody keeps alive. Its
    // opening is its only renewal, so its TTL runs from before it was sent.
    let sent = Instant::now();
    let short = store
        .open_session(Duration::from_secs(1))
        .await
        .expect("open");
    let expired = within(
        "campaign",
        store.campaign(short.id, &election, &id("vanishing")),
    )
    .await
    .expect("campaign");
    let delay = Duration::from_secs(2);
    let waiter = elector(harness, "careful").await.with_lock_delay(delay);
    let taken = within(
        "takeover after expiry and delay",
        waiter.campaign(&election),
    )
    .await
    .expect("campaign");
    assert!(
        sent.elapsed() >= short.ttl + delay,
        "taken over {:?} after the holder's only renewal; TTL {:?} plus lock-delay {delay:?}",
        sent.elapsed(),
        short.ttl
    );
    assert!(taken.token() > expired.token);
    // A release is not delayed: a lock-delay longer than the test's
    // patience would fail it.
    let patient = elector(harness, "patient")
        .await
        .with_lock_delay(Duration::from_secs(600));
    let again = election.clone();
    let next = tokio::spawn(async move {
        let leadership = patient.campaign(&again).await;
        (leadership, patient)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let token = taken.token();
    taken.resign().await.expect("resign");
    let (leadership, _patient) = within("takeover after a release", next)
        .await
        .expect("task");
    let leadership = leadership.expect("campaign");
    assert!(leadership.token() > token);
}

/// `n` standbys `w0`…, each on a store handle of its own that counts its
/// calls, joined to the line of `election` in turn, and settled: every
/// standby behind the first watches its own note and the one ahead of it.
async fn counted_standbys(
    harness: &dyn StoreHarness,
    n: usize,
    election: &ElectionName,
    requester: &Arc<dyn Store>,
) -> (
    Vec<Arc<CountingStore>>,
    Vec<tokio::task::JoinHandle<Leadership>>,
) {
    let mut stores = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..n {
        let store = Arc::new(CountingStore::new(harness.open().await));
        let elector = Elector::new(
            Arc::clone(&store) as Arc<dyn Store>,
            id(&format!("w{i}")),
            LeaseConfig::new(TTL),
        )
        .expect("config");
        tasks.push(join(Arc::new(elector), election, requester).await);
        stores.push(store);
    }
    within("the standbys to settle", async {
        while stores[1..].iter().any(|s| s.counts().watches < 2) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    (stores, tasks)
}

/// No herd: with six standbys waiting, a transfer to the fourth touches
/// only the first in line, the chosen one and the one just behind it (it
/// watched the chosen one's note). The others neither read nor are woken
/// by a watch nor campaign: each counts exactly what it did before.
pub async fn a_transfer_wakes_only_the_front_of_the_line(harness: &dyn StoreHarness) {
    const WAITERS: usize = 6;
    const CHOSEN: usize = 3;
    let election = unique_election("no-herd");
    let requester = harness.open().await;
    let (_leader, leadership) = leading(harness, &election).await;
    let (stores, mut tasks) = counted_standbys(harness, WAITERS, &election, &requester).await;
    let before: Vec<Counts> = stores.iter().map(|s| s.counts()).collect();
    for (i, counts) in before.iter().enumerate().skip(1) {
        assert_eq!(
            (counts.watches, counts.campaigns),
            (2, 0),
            "w{i} must watch two notes and not campaign while it waits behind others: {counts:?}"
        );
    }
    let lost = tokio::spawn(honour_requests(leadership));
    let chosen = id(&format!("w{CHOSEN}"));
    let transferred = within(
        "the transfer",
        request_transfer(&requester, &election, Some(&chosen), TTL, PATIENCE),
    )
    .await
    .expect("transfer");
    assert_eq!(transferred.to.candidate, chosen);
    assert_eq!(lost.await.expect("leader task"), LostReason::HandedOver);
    let taken = within("the chosen one's campaign", tasks.remove(CHOSEN))
        .await
        .expect("task");
    // The one behind the chosen one now waits behind the one before it.
    within("the one behind to settle again", async {
        while stores[CHOSEN + 1].counts().watches < 4 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    for i in 0..WAITERS {
        let after = stores[i].counts();
        if [0, CHOSEN, CHOSEN + 1].contains(&i) {
            continue;
        }
        assert!(
            after.untouched_since(&before[i]),
            "the transfer to w{CHOSEN} touched w{i}: before {:?}, after {after:?}",
            before[i]
        );
    }
    let chosen_counts = stores[CHOSEN].counts();
    assert!(
        chosen_counts.campaigns > before[CHOSEN].campaigns,
        "the chosen standby must have campaigned: {chosen_counts:?}"
    );
    taken.resign().await.expect("resign");
    for task in tasks {
        task.abort();
    }
}

/// No herd on one handle: standbys that share one store handle (one
/// process) with the leader, each on its own session, wait in line. While they wait
/// (2.5 TTLs) and over a handover (the leader resigns, the first in line
/// takes the election, the line moves up), the watches of the line read
/// the store fewer times than there are standbys: only the front and the
/// one behind a note that changed read. A write to one note that woke
/// every standby's watches, or watches that each read at their sessions'
/// expiry, would read at least twice per standby. (The local stores, whose
/// watches are woken by the handle itself. Another process's write still
/// wakes every watch of a SQLite handle: it cannot tell what changed.)
pub async fn a_line_on_one_handle_reads_only_at_its_front(harness: &dyn StoreHarness) {
    const WAITERS: usize = 12;
    const SHORT: Duration = Duration::from_secs(2);
    let election = unique_election("one-handle-line");
    let shared = harness.open().await;
    let config = LeaseConfig::new(SHORT);
    let leader = Elector::new(Arc::clone(&shared), id("leader"), config).expect("config");
    let leadership = within("leader campaigns", leader.campaign(&election))
        .await
        .expect("campaign");
    let mut tasks = Vec::new();
    let mut electors = Vec::new();
    for i in 0..WAITERS {
        let elector = Arc::new(
            Elector::new(Arc::clone(&shared), id(&format!("w{i}")), config).expect("config"),
        );
        tasks.push(join(Arc::clone(&elector), &election, &shared).await);
        electors.push(elector);
    }
    // The standbys open their watches.
    tokio::time::sleep(SHORT / 2).await;
    let before = watch_reads_of(&election);
    tokio::time::sleep(SHORT * 5 / 2).await;
    let idle = watch_reads_of(&election) - before;
    assert!(
        idle < WAITERS as u64,
        "{WAITERS} standbys on one handle read the store {idle} times in 2.5 TTLs of waiting"
    );
    let before = watch_reads_of(&election);
    leadership.resign().await.expect("resign");
    let next = within("the first in line takes over", tasks.remove(0))
        .await
        .expect("task");
    // The line moves up: the new front watches the whole line.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let handover = watch_reads_of(&election) - before;
    assert!(
        handover < WAITERS as u64,
        "a handover read the store {handover} times in the watches of {WAITERS} standbys \
         on one handle"
    );
    assert_eq!(
        next.grant().candidate,
        id("w0"),
        "the first in line must take over"
    );
    next.resign().await.expect("resign");
    for task in tasks {
        task.abort();
    }
    for elector in electors {
        let _ = elector.close().await;
    }
    let _ = leader.close().await;
}

/// An uncontended campaign takes a free election with one request
/// ([`Store::try_campaign_unwaited`]), never one that anybody holds (its
/// own session included) or waits for, and writes nothing when it does
/// not take it; a campaign dropped on the way never leaves its session
/// holding the election; and [`Elector::campaign`] uses it.
pub async fn an_unwaited_campaign_takes_only_a_free_election(harness: &dyn StoreHarness) {
    let election = unique_election("unwaited");
    let (a, b) = (harness.open().await, harness.open().await);
    let sa = a.open_session(TTL).await.expect("open").id;
    let sb = b.open_session(TTL).await.expect("open").id;
    let ida = id("a");
    // Somebody waits in line (or asks for a transfer): a note.
    b.put_note(sb, &election, line::CANDIDATE, "0 - b")
        .await
        .expect("put");
    let tried = a.try_campaign_unwaited(sa, &election, &ida).await;
    assert_eq!(
        tried.expect("attempt"),
        None,
        "an unwaited campaign overtook a standby waiting in line"
    );
    assert_eq!(
        a.leader(&election).await.expect("read"),
        None,
        "an attempt that was not granted wrote a grant"
    );
    b.delete_note(sb, &election, line::CANDIDATE)
        .await
        .expect("delete");
    let first = a
        .try_campaign_unwaited(sa, &election, &ida)
        .await
        .expect("attempt");
    if !harness.campaigns_unwaited() {
        assert_eq!(first, None, "this store's default never grants");
        return;
    }
    let first = first.expect("a free election that nobody waits for was not taken");
    held_elections_are_not_taken_unwaited(&*a, &*b, (sa, sb), &election, first).await;

    dropped_unwaited_campaigns_never_hold(harness, &*a, sa, &election, &ida).await;

    a.close_session(sa).await.expect("close");
    assert!(
        matches!(
            a.try_campaign_unwaited(sa, &election, &ida).await,
            Err(Error::SessionExpired(_))
        ),
        "an ended session's unwaited campaign was not refused"
    );
    an_uncontended_campaign_is_one_request(harness).await;
}

/// `first`, `a`'s unwaited grant of `election`, keeps it from every other
/// unwaited campaign, its own session's included; once released, the
/// next unwaited grant has a greater token.
async fn held_elections_are_not_taken_unwaited(
    a: &dyn Store,
    b: &dyn Store,
    (sa, sb): (SessionId, SessionId),
    election: &ElectionName,
    first: crate::store::Grant,
) {
    assert_eq!(
        a.leader(election).await.expect("read").map(|l| l.token),
        Some(first.token)
    );
    let by_b = b.try_campaign_unwaited(sb, election, &id("b")).await;
    assert_eq!(
        by_b.expect("attempt"),
        None,
        "rule 1 broken: an unwaited campaign took a held election"
    );
    let again = a.try_campaign_unwaited(sa, election, &id("a")).await;
    assert_eq!(
        again.expect("attempt"),
        None,
        "an unwaited campaign took up its own session's grant"
    );
    a.resign(&first).await.expect("resign");
    let second = b
        .try_campaign_unwaited(sb, election, &id("b"))
        .await
        .expect("attempt")
        .expect("a released election was not taken");
    assert!(
        second.token > first.token,
        "rule 2 broken: token {} after {}",
        second.token.0,
        first.token.0
    );
    b.resign(&second).await.expect("resign");
}

/// Unwaited campaigns polled once (the request leaves) and dropped, on an
/// election the store knows already, as most campaigns are: none leaves
/// its session holding the election.
async fn dropped_unwaited_campaigns_never_hold(
    harness: &dyn StoreHarness,
    a: &dyn Store,
    sa: SessionId,
    election: &ElectionName,
    ida: &CandidateId,
) {
    let mut dropped = 0;
    for _ in 0..5 {
        let mut attempt = a.try_campaign_unwaited(sa, election, ida);
        let polled =
            std::future::poll_fn(|cx| std::task::Poll::Ready(attempt.as_mut().poll(cx))).await;
        drop(attempt);
        match polled {
            std::task::Poll::Ready(granted) => {
                // Done at the first poll (an in-process store).
                let granted = granted.expect("attempt").expect("free");
                a.resign(&granted).await.expect("resign");
            }
            std::task::Poll::Pending => {
                dropped += 1;
                // Withdrawn once the request's answer is in, which a slow
                // store gives late (up to a request's timeout, sent again
                // to another member): the election is free again then,
                // and stays so.
                within("the dropped unwaited campaign withdrawn", async {
                    while a.leader(election).await.expect("read").is_some() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                })
                .await;
                tokio::time::sleep(Duration::from_millis(500)).await;
                assert_eq!(
                    a.leader(election).await.expect("read"),
                    None,
                    "a dropped unwaited campaign left its session holding the election"
                );
            }
        }
    }
    assert!(
        dropped > 0 || !harness.durable(),
        "no attempt was dropped on the way: the case tested nothing"
    );
}

/// An uncontended [`Elector::campaign`] holds after one request: no note
/// put, nothing else written.
async fn an_uncontended_campaign_is_one_request(harness: &dyn StoreHarness) {
    let election = unique_election("one-request");
    let counting = Arc::new(CountingStore::new(harness.open().await));
    let store: Arc<dyn Store> = counting.clone();
    let elector = Elector::new(store, id("solo"), LeaseConfig::new(TTL)).expect("config");
    elector.session().await.expect("session");
    let before = counting.counts();
    let leadership = within("an uncontended campaign", elector.campaign(&election))
        .await
        .expect("campaign");
    let after = counting.counts();
    assert_eq!(
        (
            after.unwaited - before.unwaited,
            after.campaigns - before.campaigns,
            after.writes - before.writes
        ),
        (1, 0, 0),
        "an uncontended campaign made other requests than one attempt (unwaited, campaigns, writes)"
    );
    leadership.resign().await.expect("resign");
}
