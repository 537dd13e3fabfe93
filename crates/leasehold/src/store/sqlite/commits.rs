//! Commits made at once through one handle share one transaction, and so
//! one synced commit (`synchronous=FULL` makes each a disk flush): a
//! thread takes every commit waiting, each in a savepoint of its own, so
//! that one whose check fails, or that fails, leaves nothing behind and
//! does not fail the others; each gets a revision of its own.

use super::primitive::Committed;
use super::*;
use crate::store::keys::{Check, Write};

/// At most this many commits share a transaction.
const COMMITS_PER_TRANSACTION: usize = 256;

/// One commit waiting, and where its outcome goes.
pub(super) struct Queued {
    checks: Vec<Check>,
    writes: Vec<Write>,
    outcome: tokio::sync::oneshot::Sender<Result<Committed>>,
}

/// Commits waiting for the commit thread.
pub(super) type CommitQueue = batches::Batches<Queued>;

impl Inner {
    /// Queues a commit; the first queued while no thread commits starts
    /// one. Resolves with the commit's outcome.
    pub(super) async fn commit_queued(
        &self,
        checks: Vec<Check>,
        writes: Vec<Write>,
    ) -> Result<Committed> {
        let (outcome, received) = tokio::sync::oneshot::channel();
        let queued = Queued {
            checks,
            writes,
            outcome,
        };
        let start = batches::queue(&self.committing, queued);
        if start {
            let (db, queue) = (Arc::clone(&self.db), Arc::clone(&self.committing));
            tokio::task::spawn_blocking(move || commit_while_queued(&db, &queue));
        }
        received
            .await
            .map_err(|e| Error::unavailable("the sqlite commit thread failed", e))?
    }
}

/// Makes the queued commits until none is left.
fn commit_while_queued(db: &Db, queue: &Mutex<CommitQueue>) {
    batches::drain(queue, COMMITS_PER_TRANSACTION, |batch| {
        let alone = |c: &Queued| db.commit_keys(&c.checks, &c.writes);
        let outcomes = if batch.len() == 1 {
            vec![alone(&batch[0])]
        } else {
            // A failure of the shared transaction committed nothing: each
            // commit is then made alone, and fails (or not) alone.
            db.commit_together(&batch)
                .unwrap_or_else(|_| batch.iter().map(alone).collect())
        };
        for (queued, outcome) in batch.into_iter().zip(outcomes) {
            let _ = queued.outcome.send(outcome);
        }
    });
}

impl Db {
    /// The commits of `batch` in one transaction, each in a savepoint.
    fn commit_together(&self, batch: &[Queued]) -> Result<Vec<Result<Committed>>> {
        self.writable()?;
        let mut conn = self.conn();
        self.usable(&conn)?;
        let mut tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut wrote = false;
        for queued in batch {
            let savepoint = tx.savepoint().map_err(self.err())?;
            let outcome = self.commit_in(&savepoint, &queued.checks, &queued.writes);
            if let Ok((_, true)) = &outcome {
                savepoint.commit().map_err(self.err())?;
                wrote = true;
            }
            outcomes.push(outcome.map(|(committed, _)| committed));
        }
        if wrote {
            self.usable(&tx)?;
            tx.commit().map_err(self.err())?;
            self.announce();
        }
        Ok(outcomes)
    }
}
