//! Reads asked for at once through one handle share one turn of the
//! connection and one read transaction: a thread takes every read waiting
//! (a campaign's, each watch's), so that a thousand of them cost one
//! thread hop and one lock of the connection, not a thousand.

use super::*;

/// A read waiting: it runs on the connection, or gets the error that kept
/// the batch from reading, and sends its outcome itself.
pub(super) type ReadJob = Box<dyn FnOnce(&Db, Result<&Connection>) + Send>;

/// At most this many reads share a transaction.
const READS_PER_TRANSACTION: usize = 256;

/// Reads waiting for the read thread.
pub(super) type ReadQueue = batches::Batches<ReadJob>;

impl Inner {
    /// Runs `op` in the next read transaction of this handle.
    pub(super) async fn read<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Db, &Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (outcome, received) = tokio::sync::oneshot::channel();
        let job: ReadJob = Box::new(move |db, conn| {
            let _ = outcome.send(conn.and_then(|conn| op(db, conn)));
        });
        let start = batches::queue(&self.reading, job);
        if start {
            let (db, queue) = (Arc::clone(&self.db), Arc::clone(&self.reading));
            tokio::task::spawn_blocking(move || read_while_queued(&db, &queue));
        }
        received
            .await
            .map_err(|e| Error::unavailable("the sqlite read thread failed", e))?
    }
}

/// Makes the queued reads until none is left.
fn read_while_queued(db: &Db, queue: &Mutex<ReadQueue>) {
    batches::drain(queue, READS_PER_TRANSACTION, |batch| {
        db.read_together(batch)
    });
}

impl Db {
    /// The reads of `batch` in one read transaction (one snapshot).
    fn read_together(&self, batch: Vec<ReadJob>) {
        let mut conn = self.conn();
        let tx = self
            .usable(&conn)
            .and_then(|()| conn.transaction().map_err(self.err()));
        match tx {
            Ok(tx) => {
                for job in batch {
                    job(self, Ok(&tx));
                }
            }
            Err(error) => {
                for job in batch {
                    job(self, Err(shared_error(&error)));
                }
            }
        }
    }
}
