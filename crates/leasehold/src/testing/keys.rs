//! The store primitive's conformance suite ([`crate::backend::Keys`]): what
//! a backend must keep for the elections written above it to be safe.
//! Each case panics with the rule it found broken; run them all with
//! [`crate::keys_conformance_tests`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, timeout};

use crate::error::Error;
use crate::grant::SessionId;
use crate::store::keys::{Check, Heard, Keys, Revision, Write};

/// Gives the cases handles onto the primitive under test.
#[async_trait]
pub trait KeysHarness: Send + Sync {
    /// The primitive under test.
    type Keys: Keys;

    /// A new handle onto it; every handle sees the same keys.
    async fn open(&self) -> Arc<Self::Keys>;
}

const LONG: Duration = Duration::from_secs(30);
const SHORT: Duration = Duration::from_secs(1);
const PATIENCE: Duration = Duration::from_secs(15);

/// A prefix no other case uses.
fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}:", std::process::id())
}

fn put(key: &str, value: &str, session: Option<SessionId>) -> Write {
    Write::Put {
        key: key.to_owned(),
        value: value.to_owned(),
        session,
    }
}

async fn commit(keys: &impl Keys, checks: &[Check], writes: &[Write]) -> Option<Revision> {
    keys.commit(checks, writes).await.expect("commit")
}

/// Revisions are store-wide and strictly increasing; a put keeps a key's
/// creation revision; a range is ordered by key and holds its prefix's
/// keys alone.
pub async fn revisions_increase_and_creation_is_kept<H: KeysHarness>(harness: &H) {
    let keys = harness.open().await;
    let p = unique("rev");
    let first = commit(&*keys, &[], &[put(&format!("{p}b"), "1", None)]).await;
    let second = commit(&*keys, &[], &[put(&format!("{p}a"), "2", None)]).await;
    let third = commit(&*keys, &[], &[put(&format!("{p}b"), "3", None)]).await;
    let (Some(first), Some(second), Some(third)) = (first, second, third) else {
        panic!("unchecked commits must write");
    };
    assert!(
        first < second && second < third,
        "revisions must increase: {first} {second} {third}"
    );
    commit(&*keys, &[], &[put(&format!("{p}x-other"), "", None)]).await;
    let range = keys.range(&format!("{p}a")).await.expect("range");
    assert_eq!(
        range.entries.len(),
        1,
        "a range holds its prefix alone: {range:?}"
    );
    let range = keys.range(&p).await.expect("range");
    let shown: Vec<(&str, &str, Revision, Revision)> = range
        .entries
        .iter()
        .map(|e| {
            (
                e.key.strip_prefix(&p).unwrap_or(&e.key),
                e.value.as_str(),
                e.created,
                e.modified,
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("a", "2", second, second),
            ("b", "3", first, third),
            ("x-other", "", shown[2].2, shown[2].2)
        ],
        "ordered by key, each with its creation and last revision"
    );
    assert!(
        range.revision > third,
        "the range's revision is the store's"
    );
}

/// A commit writes all or nothing: a failed check writes nothing, and a
/// put onto an ended session fails and writes nothing either.
pub async fn commits_are_all_or_nothing<H: KeysHarness>(harness: &H) {
    let keys = harness.open().await;
    let p = unique("atomic");
    let (a, b) = (format!("{p}a"), format!("{p}b"));
    let created = commit(&*keys, &[Check::Absent(a.clone())], &[put(&a, "1", None)])
        .await
        .expect("absent: created");
    let refused = [
        Check::Absent(a.clone()),
        Check::NoneUnder(p.clone()),
        Check::Created {
            key: a.clone(),
            revision: Revision(created.0 + 1),
            session: None,
        },
        Check::Created {
            key: b.clone(),
            revision: created,
            session: None,
        },
    ];
    for check in refused {
        let written = commit(&*keys, std::slice::from_ref(&check), &[put(&b, "no", None)]).await;
        assert_eq!(written, None, "{check:?} must fail");
    }
    let held = Check::Created {
        key: a.clone(),
        revision: created,
        session: None,
    };
    commit(
        &*keys,
        &[held, Check::NoneUnder(format!("{p}b"))],
        &[put(&b, "yes", None), Write::Delete(a.clone())],
    )
    .await
    .expect("every check holds: written");
    let session = keys.open_session(LONG).await.expect("open").id;
    keys.close_session(session).await.expect("close");
    let ended = keys
        .commit(
            &[],
            &[put(&a, "late", Some(session)), Write::Delete(b.clone())],
        )
        .await;
    assert!(matches!(ended, Err(Error::SessionExpired(_))), "{ended:?}");
    let range = keys.range(&p).await.expect("range");
    let left: Vec<(&str, &str)> = range
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    assert_eq!(
        left,
        [(b.as_str(), "yes")],
        "nothing of a failed commit is written"
    );
}

/// A `NoneUnder` check holds until its commit lands: a key created under
/// the prefix meanwhile, even by a commit that only creates it if absent
/// (a campaign joining the line), fails it. Otherwise a free election
/// taken with one request would lead beside the candidate that joined
/// just before it (found on ZooKeeper, whose creations did not move the
/// version its guarded commits check).
pub async fn a_creation_fails_a_none_under_check_of_its_prefix<H: KeysHarness>(harness: &H) {
    let keys = harness.open().await;
    let (a, b) = (open(&*keys).await, open(&*keys).await);
    for round in 0..200 {
        // The creation sent later each round, across the commit's read
        // and its write.
        let later = Duration::from_micros(100 * (round % 30));
        // A prefix beside another key: its directory exists already.
        let dir = unique("race");
        commit(&*keys, &[], &[put(&format!("{dir}other"), "", None)]).await;
        let p = format!("{dir}line/");
        let (ka, kb) = (format!("{p}a"), format!("{p}b"));
        let (none_under, put_a) = ([Check::NoneUnder(p.clone())], [put(&ka, "", Some(a))]);
        let (absent, put_b) = ([Check::Absent(kb.clone())], [put(&kb, "", Some(b))]);
        let taken = keys.commit(&none_under, &put_a);
        let joined = async {
            tokio::time::sleep(later).await;
            keys.commit(&absent, &put_b).await
        };
        let (taken, joined) = tokio::join!(taken, joined);
        let (taken, joined) = (taken.expect("commit"), joined.expect("commit"));
        if let (Some(taken), Some(joined)) = (taken, joined) {
            assert!(
                joined > taken,
                "{kb} was created at {joined}, before {ka} at {taken}, whose commit checked \
                 that nothing was under {p}"
            );
        }
    }
}

async fn open(keys: &impl Keys) -> SessionId {
    keys.open_session(LONG).await.expect("open").id
}

/// A key attached to a session ends with it: at its close, and at its
/// expiry by the store's clock, never before its TTL; a renewal pushes the
/// expiry on; an ended session cannot be renewed.
pub async fn keys_end_with_their_session<H: KeysHarness>(harness: &H) {
    let keys = harness.open().await;
    let p = unique("session");
    let closed = keys.open_session(LONG).await.expect("open").id;
    let expiring = keys.open_session(SHORT).await.expect("open");
    let started = Instant::now();
    commit(&*keys, &[], &[put(&format!("{p}closed"), "", Some(closed))]).await;
    commit(
        &*keys,
        &[],
        &[put(&format!("{p}expiring"), "", Some(expiring.id))],
    )
    .await;
    keys.close_session(closed).await.expect("close");
    keys.close_session(closed)
        .await
        .expect("closing twice is fine");
    let left: Vec<String> = keys
        .range(&p)
        .await
        .expect("range")
        .entries
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(
        left,
        [format!("{p}expiring")],
        "closing ends the session's keys at once"
    );
    // The store counts the TTL from when it processed the renewal, which
    // is after it was sent: the bound starts at the sending, as a
    // holder's deadline does (a bound from the reply failed once on a
    // loaded machine, by the reply's own delay).
    let renewing = Instant::now();
    let renewed = keys.keep_alive(expiring.id).await.expect("renew");
    assert!(renewed >= SHORT / 2, "{renewed:?}");
    loop {
        let range = keys.range(&p).await.expect("range");
        if range.entries.is_empty() {
            break;
        }
        assert!(started.elapsed() < PATIENCE, "the session never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        renewing.elapsed() >= expiring.ttl.min(renewed),
        "a key ended before its session's TTL"
    );
    assert!(matches!(
        keys.keep_alive(expiring.id).await,
        Err(Error::SessionExpired(_))
    ));
}

/// A watch tells what changes under its prefix after the revision it
/// starts from, also a change made before it started; nothing else.
pub async fn watches_tell_changes_after_their_revision<H: KeysHarness>(harness: &H) {
    let keys = harness.open().await;
    let p = unique("watch");
    let before = keys.range(&p).await.expect("range").revision;
    commit(&*keys, &[], &[put(&format!("{p}a"), "1", None)]).await;
    let mut late = keys.watch(&p, before).await.expect("watch");
    within("a change before the watch started", late.changed()).await;
    let now = keys.range(&p).await.expect("range").revision;
    let mut watch = keys.watch(&p, now).await.expect("watch");
    // Beside the prefix, not under it.
    let beside = format!("{}-beside", p.trim_end_matches(':'));
    commit(&*keys, &[], &[put(&beside, "", None)]).await;
    commit(&*keys, &[], &[put("elsewhere", "", None)]).await;
    let quiet = timeout(Duration::from_millis(300), watch.changed()).await;
    assert!(
        quiet.is_err(),
        "a watch told of a change outside its prefix"
    );
    let session = keys.open_session(LONG).await.expect("open").id;
    let written = commit(&*keys, &[], &[put(&format!("{p}b"), "", Some(session))]).await;
    within("a put", watch.changed()).await;
    assert!(matches!(*watch.borrow_and_update(), Heard::Changed(at) if Some(at) >= written));
    keys.close_session(session).await.expect("close");
    within("the end of a session", watch.changed()).await;
    commit(&*keys, &[], &[Write::Delete(format!("{p}a"))]).await;
    within("a delete", watch.changed()).await;
}

/// Where the store says it tells expiries, a watch hears of one without
/// any write.
pub async fn a_told_expiry_reaches_the_watch<H: KeysHarness>(harness: &H) {
    let keys = harness.open().await;
    if !keys.properties().tells_expiries {
        return;
    }
    let p = unique("expiry");
    let session = keys.open_session(SHORT).await.expect("open").id;
    commit(&*keys, &[], &[put(&format!("{p}k"), "", Some(session))]).await;
    let at = keys.range(&p).await.expect("range").revision;
    let mut watch = keys.watch(&p, at).await.expect("watch");
    within("an expiry", watch.changed()).await;
    assert!(keys.range(&p).await.expect("range").entries.is_empty());
}

async fn within<T, E: std::fmt::Debug>(what: &str, fut: impl Future<Output = Result<T, E>>) -> T {
    timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not told within {PATIENCE:?}"))
        .unwrap_or_else(|e| panic!("{what}: the watch ended: {e:?}"))
}

/// One `#[tokio::test]` per case of the primitive's conformance suite.
/// `$harness` is an expression giving a future of a [`KeysHarness`].
#[macro_export]
macro_rules! keys_conformance_tests {
    ($harness:expr) => {
        $crate::keys_conformance_tests!(@cases $harness;
            revisions_increase_and_creation_is_kept,
            commits_are_all_or_nothing,
            a_creation_fails_a_none_under_check_of_its_prefix,
            keys_end_with_their_session,
            watches_tell_changes_after_their_revision,
            a_told_expiry_reaches_the_watch,
        );
    };
    (@cases $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $harness.await;
                $crate::testing::keys::$case(&harness).await;
            }
        )*
    };
}
