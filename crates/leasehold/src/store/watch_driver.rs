//! The watch every backend shares: [`start`] drives a backend's [`Source`]
//! (what wakes it, how it reads the holder), publishing only changes of
//! grant (a renewal is not news); and, with the `testing` feature, the
//! fault point inside its reads.

use std::pin::Pin;
use std::time::Duration;

use crate::watch;

use crate::error::{Error, Result};
use crate::grant::Leader;
use crate::names::ElectionName;
use crate::store::{FencingToken, Grant, LeaderStatus};

/// A value a watch task publishes: a [`LeaderWatch`]'s `Option<Leader>`
/// or a [`StatusWatch`]'s [`LeaderStatus`], so that every backend's watch
/// task uses the same helpers for either.
pub(crate) trait Published: Send + Sync + 'static {
    /// Records what a read found; `true` when receivers must hear of it:
    /// another holder, or the first answer after the store could not be
    /// read. A renewal (the same grant) is not news.
    fn record(&mut self, leader: Option<Leader>) -> bool;
    /// Records a failed read; `true` when receivers must hear of it.
    fn record_failure(&mut self, error: &Error) -> bool;
}

/// A published value as a watch starts: what its first read found.
pub(crate) trait Initial: Published {
    fn initial(first: Option<Leader>) -> Self;
}

impl Initial for Option<Leader> {
    fn initial(first: Option<Leader>) -> Self {
        first
    }
}

impl Initial for LeaderStatus {
    fn initial(first: Option<Leader>) -> Self {
        LeaderStatus::Known(first)
    }
}

impl Published for Option<Leader> {
    fn record(&mut self, leader: Option<Leader>) -> bool {
        let same = match (&*self, &leader) {
            (Some(a), Some(b)) => a.same_grant(b),
            (None, None) => true,
            _ => false,
        };
        if !same {
            *self = leader;
        }
        !same
    }

    /// A [`LeaderWatch`] keeps the last known leader.
    fn record_failure(&mut self, _: &Error) -> bool {
        false
    }
}

impl Published for LeaderStatus {
    fn record(&mut self, leader: Option<Leader>) -> bool {
        let read = LeaderStatus::Known(leader);
        let news = !self.same_as(&read);
        if news {
            *self = read;
        }
        news
    }

    fn record_failure(&mut self, error: &Error) -> bool {
        if self.is_unknown() {
            return false;
        }
        *self = LeaderStatus::Unknown {
            error: error.to_string(),
        };
        true
    }
}

/// One read of the store by a watch task. With the `testing` feature, a
/// read that a test made fail ([`fail_watch_reads`]) fails
/// here, inside the backend, as a store that does not answer would.
pub(crate) async fn watch_read<T>(
    election: &ElectionName,
    read: impl Future<Output = Result<T>>,
) -> Result<T> {
    #[cfg(feature = "testing")]
    {
        count_watch_read(election);
        if let Some(error) = injected_watch_read_failure(election) {
            return Err(error);
        }
    }
    #[cfg(not(feature = "testing"))]
    let _ = election;
    read.await
}

/// Publishes `leader` on a watch sender if it is news: another grant than
/// the one published (a renewal alone is not a change), or the first
/// answer after a failure.
pub(crate) fn publish_leader<V: Published>(tx: &watch::Sender<V>, leader: Option<Leader>) {
    tx.send_if_modified(|seen| seen.record(leader));
}

/// Publishes that a read failed: a [`StatusWatch`] turns unknown (once),
/// a [`LeaderWatch`] keeps its last known leader.
pub(crate) fn publish_failure<V: Published>(tx: &watch::Sender<V>, error: &Error) {
    tx.send_if_modified(|seen| seen.record_failure(error));
}

/// What a watch hears from its store between reads.
#[derive(Debug)]
pub(crate) enum Event {
    /// The election may have changed: read it again.
    Changed,
    /// The store cannot be watched now (the connection the watch relies on
    /// is lost): the holder is unknown until the next [`Event::Changed`].
    /// (ZooKeeper's client and PostgreSQL's listener tell of a lost
    /// connection between reads.)
    Unavailable(Error),
    /// Nothing more will come: the watch ends.
    Ended,
}

/// A backend's own part of a watch on one election: how it reads the
/// holder and what wakes it (an etcd watch stream, a ZooKeeper watcher,
/// PostgreSQL's `NOTIFY`, a local store's changes). [`start`] does the
/// rest, the same for every backend.
pub(crate) trait Source: Send + 'static {
    /// How long to pause after a failed read before reading again.
    const RETRY: Duration;

    /// Reads the holder. [`start`] adds the test fault point to every read
    /// after the first.
    fn read(&mut self) -> impl Future<Output = Result<Option<Leader>>> + Send;

    /// Waits until the election may have changed, or the watch cannot
    /// go on.
    fn changed(&mut self) -> impl Future<Output = Event> + Send;

    /// Whether [`Source::changed`] tells when the holder's session ends,
    /// so that the watch need not read again at its expiry.
    fn tells_expiry(&self) -> bool {
        false
    }

    /// Sleeps for `duration` on the store's clock.
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// Slack added to the holder's expiry so that the watch wakes just after it.
const EXPIRY_SLACK: Duration = Duration::from_millis(1);

/// Watches an election through `source`: reads the holder once (a failure
/// is returned), then keeps the returned [`StatusWatch`] or
/// [`LeaderWatch`] up to date in a task (a [`LeaderWatch`] keeps the last
/// known holder while reads fail). The task re-reads whenever the source reports a change and at the
/// holder's expiry (which notices an expiry, or an outage, that no event
/// reports); retries a failed read after [`Source::RETRY`], reporting the
/// holder unknown meanwhile; publishes only a change of grant (a renewal,
/// the same token and candidate, is none); and ends once every receiver is
/// gone.
///
/// `held` is the token of the grant the watcher holds itself, if it does (a
/// leader's monitor, [`crate::store::Store::watch_grant`]): while that
/// grant is the holder, the task does not re-read at its expiry. The
/// holder's own session ends its leadership at the deadline whatever the
/// store says, and any other change of holder comes as an event; so a
/// process holding N elections sends no request per election per renewal
/// period.
pub(crate) async fn start<S: Source, V: Initial>(
    mut source: S,
    election: &ElectionName,
    held: Option<FencingToken>,
) -> Result<watch::Receiver<V>> {
    let first = source.read().await?;
    let (tx, rx) = watch::channel(V::initial(first.clone()));
    tokio::spawn(drive(source, tx, election.clone(), first, held));
    Ok(rx)
}

/// As [`start`] for the holder of `grant`, without the first read: the
/// source already watches from just after the grant was made (an etcd
/// watch from the grant's revision on), so the grant is the holder it
/// starts from, with `expires_in` zero (not read), and any later change
/// comes as an event. A store whose history is gone from that revision
/// (compacted) breaks the watch, and the task reads the holder as after
/// any wake.
pub(crate) fn start_held<S: Source, V: Initial>(source: S, grant: &Grant) -> watch::Receiver<V> {
    let first = Some(Leader {
        candidate: grant.candidate.clone(),
        token: grant.token,
        expires_in: Duration::ZERO,
        session: Some(grant.session),
    });
    let (tx, rx) = watch::channel(V::initial(first.clone()));
    tokio::spawn(drive(
        source,
        tx,
        grant.election.clone(),
        first,
        Some(grant.token),
    ));
    rx
}

async fn drive<S: Source, V: Published>(
    mut source: S,
    tx: watch::Sender<V>,
    election: ElectionName,
    first: Option<Leader>,
    held: Option<FencingToken>,
) {
    let mut at_expiry = expiry(&source, first.as_ref(), held);
    loop {
        // The store's futures are boxed, here and in the read: a task
        // that waits then holds a pointer, not their largest state (a
        // process holding thousands of elections keeps this many tasks).
        tokio::select! {
            biased;
            () = tx.closed() => return,
            event = Box::pin(source.changed()) => match event {
                Event::Changed => {}
                Event::Unavailable(error) => {
                    tracing::debug!(%election, %error, "the watch cannot hear from the store");
                    publish_failure(&tx, &error);
                    continue;
                }
                Event::Ended => return,
            },
            () = &mut at_expiry => {}
        }
        let Some(leader) = read_until_ok(&mut source, &tx, &election).await else {
            return;
        };
        at_expiry = expiry(&source, leader.as_ref(), held);
        publish_leader(&tx, leader);
    }
}

/// Resolves just after `leader`'s session expires unless renewed; never
/// without a leader, nor while the leader is the grant `held`.
fn expiry<S: Source>(
    source: &S,
    leader: Option<&Leader>,
    held: Option<FencingToken>,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    match leader {
        Some(leader) if Some(leader.token) != held && !source.tells_expiry() => {
            source.sleep(leader.expires_in + EXPIRY_SLACK)
        }
        _ => Box::pin(std::future::pending()),
    }
}

/// Reads until a read succeeds, pausing [`Source::RETRY`] after each
/// failure and publishing it (a [`StatusWatch`] turns unknown); `None` once
/// every receiver of `tx` is gone.
async fn read_until_ok<S: Source, V: Published>(
    source: &mut S,
    tx: &watch::Sender<V>,
    election: &ElectionName,
) -> Option<Option<Leader>> {
    let mut warned = false;
    loop {
        match watch_read(election, Box::pin(source.read())).await {
            Ok(leader) => return Some(leader),
            // A replaced SQLite file never comes back: the watch ends.
            Err(Error::Replaced(_)) => return None,
            Err(error) => {
                // A refusal, or a password file gone bad, will not pass by
                // itself (changed credentials, grants or files): say so
                // once at warn, as a leader may keep its lease meanwhile
                // (etcd's keep-alives need no token).
                if matches!(
                    error,
                    crate::Error::Denied(_) | crate::Error::InvalidInput { .. }
                ) && !warned
                {
                    warned = true;
                    tracing::warn!(%election, %error, "the store refuses to let this process read the election; retrying");
                } else {
                    tracing::debug!(%election, %error, "re-reading the leader failed; retrying");
                }
                publish_failure(tx, &error);
                let pause = source.sleep(S::RETRY);
                tokio::select! {
                    biased;
                    () = tx.closed() => return None,
                    () = pause => {}
                }
            }
        }
    }
}

/// Reads made by the watch tasks of every store in this process.
#[cfg(feature = "testing")]
static WATCH_READS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Counts a watch task's read of `election`.
#[cfg(feature = "testing")]
pub(crate) fn count_watch_read(election: &ElectionName) {
    WATCH_READS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    watch_read_faults()
        .entry(election.clone())
        .or_default()
        .reads += 1;
}

/// How many reads the watch tasks of every store in this process made
/// after their first (which opening the watch makes): the store requests
/// a [`crate::testing::CountingStore`] cannot see, since a watch's task
/// makes them on its own.
#[cfg(feature = "testing")]
pub fn watch_reads() -> u64 {
    WATCH_READS.load(std::sync::atomic::Ordering::Relaxed)
}

/// How many reads the watch tasks of this process made of `election`
/// after their first (leader and notes watches alike).
#[cfg(feature = "testing")]
pub fn watch_reads_of(election: &ElectionName) -> u64 {
    watch_read_faults().get(election).map_or(0, |f| f.reads)
}

/// Watch reads of one election: how many were made, whether they are made
/// to fail, and how many did.
#[cfg(feature = "testing")]
#[derive(Debug, Default)]
struct WatchReadFault {
    reads: u64,
    failing: bool,
    failed: u64,
}

#[cfg(feature = "testing")]
fn watch_read_faults()
-> std::sync::MutexGuard<'static, std::collections::HashMap<ElectionName, WatchReadFault>> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static FAULTS: OnceLock<Mutex<HashMap<ElectionName, WatchReadFault>>> = OnceLock::new();
    crate::mutex::lock(FAULTS.get_or_init(Mutex::default))
}

/// Until [`heal_watch_reads`], every read that a watch task of any store in
/// this process makes of `election` fails inside the backend, as if the
/// store did not answer. (Keyed by election, so tests running at once do
/// not disturb each other: they use [`crate::testing::unique_election`].)
#[cfg(feature = "testing")]
pub fn fail_watch_reads(election: &ElectionName) {
    watch_read_faults()
        .entry(election.clone())
        .or_default()
        .failing = true;
}

/// Ends [`fail_watch_reads`] for `election`.
#[cfg(feature = "testing")]
pub fn heal_watch_reads(election: &ElectionName) {
    if let Some(fault) = watch_read_faults().get_mut(election) {
        fault.failing = false;
    }
}

/// How many watch reads of `election` [`fail_watch_reads`] has failed.
#[cfg(feature = "testing")]
pub fn failed_watch_reads(election: &ElectionName) -> u64 {
    watch_read_faults().get(election).map_or(0, |f| f.failed)
}

/// The failure for a watch read of `election`, if a test asked for one.
#[cfg(feature = "testing")]
fn injected_watch_read_failure(election: &ElectionName) -> Option<Error> {
    let mut faults = watch_read_faults();
    let fault = faults.get_mut(election).filter(|f| f.failing)?;
    fault.failed += 1;
    Some(Error::Unavailable {
        reason: "fault injected: the watch's read got no answer".into(),
        source: None,
    })
}
