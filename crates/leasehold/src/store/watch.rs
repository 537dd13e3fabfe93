//! What every backend's watch task shares: what a watch publishes (a
//! renewal is not news), its reads of the store, and, with the `testing`
//! feature, the fault point inside those reads.

use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::grant::Leader;
use crate::names::ElectionName;
use crate::store::{LeaderStatus, LeaderWatch, StatusWatch};

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
    if let Some(error) = injected_watch_read_failure(election) {
        return Err(error);
    }
    #[cfg(not(feature = "testing"))]
    let _ = election;
    read.await
}

/// For watch tasks: runs `read` until it succeeds, pausing `pause` after
/// each failure, and publishes the failure on `tx` (a [`StatusWatch`]
/// turns unknown); `None` once every receiver of `tx` is gone.
#[cfg(any(feature = "etcd", feature = "postgres", feature = "zookeeper"))]
pub(crate) async fn read_until_ok<T, V, Fut>(
    tx: &watch::Sender<V>,
    election: &ElectionName,
    pause: std::time::Duration,
    mut read: impl FnMut() -> Fut,
) -> Option<T>
where
    V: Published,
    Fut: Future<Output = Result<T>>,
{
    loop {
        match watch_read(election, read()).await {
            Ok(value) => return Some(value),
            Err(error) => {
                tracing::debug!(%election, %error, "re-reading the leader failed; retrying");
                publish_failure(tx, &error);
                tokio::select! {
                    biased;
                    () = tx.closed() => return None,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
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

/// A [`LeaderWatch`] fed by a [`StatusWatch`]: the holder whenever it
/// changes; while it is unknown, the last known one. Its task ends when
/// every receiver is gone (dropping `status`, which ends the store's).
pub(crate) fn known_only(mut status: StatusWatch) -> LeaderWatch {
    let first = status.borrow_and_update().leader().cloned();
    let (tx, rx) = watch::channel(first);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                biased;
                () = tx.closed() => return,
                changed = status.changed() => if changed.is_err() { return },
            }
            let known = match &*status.borrow_and_update() {
                LeaderStatus::Known(leader) => Some(leader.clone()),
                LeaderStatus::Unknown { .. } => None,
            };
            if let Some(leader) = known {
                publish_leader(&tx, leader);
            }
        }
    });
    rx
}

/// A [`StatusWatch`] fed by a [`LeaderWatch`], for stores that do not tell
/// when they cannot be read: the holder is always reported known.
pub(crate) fn status_of(mut leaders: LeaderWatch) -> StatusWatch {
    let first = leaders.borrow_and_update().clone();
    let (tx, rx) = watch::channel(LeaderStatus::Known(first));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                biased;
                () = tx.closed() => return,
                changed = leaders.changed() => if changed.is_err() { return },
            }
            let leader = leaders.borrow_and_update().clone();
            publish_leader(&tx, leader);
        }
    });
    rx
}

/// Watch reads of one election made to fail, and how many did.
#[cfg(feature = "testing")]
#[derive(Debug, Default)]
struct WatchReadFault {
    failing: bool,
    failed: u64,
}

#[cfg(feature = "testing")]
fn watch_read_faults()
-> std::sync::MutexGuard<'static, std::collections::HashMap<ElectionName, WatchReadFault>> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static FAULTS: OnceLock<Mutex<HashMap<ElectionName, WatchReadFault>>> = OnceLock::new();
    FAULTS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
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
