//! Waiting logic shared by the stores that live on this host (memory,
//! SQLite): they cannot push per-election events, but they know when
//! anything was committed and when the current holder's session expires.
//! So waiters sleep until either happens, never on a fixed polling period.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::names::{CandidateId, ElectionName};
use crate::store::{Grant, Leader, LeaderWatch, SessionId, publish_leader};

/// Bumped whenever anything in the store may have changed.
pub(crate) type Changes = watch::Receiver<u64>;

/// One compare-and-swap attempt's outcome.
#[derive(Debug)]
pub(crate) enum Attempt {
    Granted(Grant),
    /// Someone else holds the election; their session ends in `expires_in`
    /// unless renewed.
    Held {
        expires_in: Duration,
    },
}

/// Slack added to a known expiry so the waiter wakes just after it.
const EXPIRY_SLACK: Duration = Duration::from_millis(1);

/// After a failed read, a watcher retries on the next change or after this.
const READ_RETRY: Duration = Duration::from_millis(250);

#[async_trait]
pub(crate) trait LocalBackend: Send + Sync + 'static {
    /// A receiver that changes whenever the store may have changed.
    fn changes(&self) -> Changes;
    /// One atomic acquisition attempt.
    async fn try_acquire(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Attempt>;
    /// The current leader.
    async fn read_leader(&self, election: &ElectionName) -> Result<Option<Leader>>;
    /// Sleeps for `duration` on the store's clock.
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

fn store_closed() -> Error {
    Error::Unavailable {
        reason: "store was closed".into(),
        source: None,
    }
}

/// Attempts acquisition, then waits for a change or the holder's expiry and
/// attempts again.
pub(crate) async fn campaign<B: LocalBackend + ?Sized>(
    backend: &B,
    session: SessionId,
    election: &ElectionName,
    candidate: &CandidateId,
) -> Result<Grant> {
    let mut changes = backend.changes();
    loop {
        // Mark the current version seen *before* attempting, so a change made
        // between the attempt and the wait still wakes us.
        changes.borrow_and_update();
        match backend.try_acquire(session, election, candidate).await? {
            Attempt::Granted(grant) => return Ok(grant),
            Attempt::Held { expires_in } => {
                tokio::select! {
                    biased;
                    changed = changes.changed() => changed.map_err(|_| store_closed())?,
                    () = backend.sleep(expires_in + EXPIRY_SLACK) => {}
                }
            }
        }
    }
}

/// Starts a task that keeps a [`LeaderWatch`] up to date; it ends when the
/// last receiver is dropped.
pub(crate) async fn watch<B: LocalBackend>(
    backend: Arc<B>,
    election: &ElectionName,
) -> Result<LeaderWatch> {
    let mut changes = backend.changes();
    changes.borrow_and_update();
    let first = backend.read_leader(election).await?;
    let (tx, rx) = watch::channel(first.clone());
    let election = election.clone();
    tokio::spawn(async move {
        let mut current = first;
        loop {
            let wake_in = current.as_ref().map(|l| l.expires_in + EXPIRY_SLACK);
            tokio::select! {
                biased;
                () = tx.closed() => return,
                changed = changes.changed() => if changed.is_err() { return },
                () = sleep_opt(&*backend, wake_in) => {}
            }
            changes.borrow_and_update();
            match backend.read_leader(&election).await {
                Ok(leader) => {
                    publish_leader(&tx, leader.clone());
                    current = leader;
                }
                Err(error) => {
                    tracing::warn!(%election, %error, "watch could not read the store; retrying");
                    current = None;
                    tokio::select! {
                        biased;
                        () = tx.closed() => return,
                        _ = changes.changed() => {}
                        () = backend.sleep(READ_RETRY) => {}
                    }
                }
            }
        }
    });
    Ok(rx)
}

async fn sleep_opt<B: LocalBackend + ?Sized>(backend: &B, duration: Option<Duration>) {
    match duration {
        Some(d) => backend.sleep(d).await,
        None => std::future::pending().await,
    }
}
