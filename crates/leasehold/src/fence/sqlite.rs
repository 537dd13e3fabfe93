//! Fencing inside a SQLite transaction.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS leasehold_fence (
//!     resource TEXT PRIMARY KEY,
//!     highest  INTEGER NOT NULL
//! );
//! -- In the same transaction as the protected write; no row back = stale.
//! INSERT INTO leasehold_fence (resource, highest) VALUES (?1, ?2)
//! ON CONFLICT (resource) DO UPDATE SET highest = excluded.highest
//!     WHERE excluded.highest >= leasehold_fence.highest
//! RETURNING highest;
//! ```

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use super::Fence;
use crate::error::{Error, Result};
use crate::grant::FencingToken;

const CREATE: &str = "CREATE TABLE IF NOT EXISTS leasehold_fence (
    resource TEXT PRIMARY KEY,
    highest  INTEGER NOT NULL
)";

const ADVANCE: &str = "INSERT INTO leasehold_fence (resource, highest) VALUES (?1, ?2)
ON CONFLICT (resource) DO UPDATE SET highest = excluded.highest
    WHERE excluded.highest >= leasehold_fence.highest
RETURNING highest";

fn sql(error: rusqlite::Error) -> Error {
    Error::unavailable("sqlite fence", error)
}

/// A SQLite error in a fenced write: `?` works in the closure given to
/// [`SqliteFence::fenced`], and the transaction is rolled back, the token
/// with it. [`Error::Unavailable`], as the fence's own SQLite errors.
impl From<rusqlite::Error> for Error {
    fn from(error: rusqlite::Error) -> Self {
        Error::unavailable("sqlite", error)
    }
}

/// Creates the fence table if it does not exist (idempotent).
pub fn create_table(conn: &Connection) -> Result<()> {
    conn.execute_batch(CREATE).map_err(sql)
}

/// Checks `token` for `resource` and records it, inside the caller's
/// transaction: if the caller's write then commits, so does the new highest
/// token; if the check fails, the caller rolls back and nothing is written.
/// Start the transaction with `TransactionBehavior::Immediate` so that two
/// writers serialize on the check. The table must exist ([`create_table`]).
pub fn check_and_advance(tx: &Transaction<'_>, resource: &str, token: FencingToken) -> Result<()> {
    let presented = token
        .to_i64()
        .ok_or_else(|| Error::invalid("fencing token", format!("{token} is too large")))?;
    let accepted: Option<i64> = tx
        .query_row(ADVANCE, params![resource, presented], |r| r.get(0))
        .optional()
        .map_err(sql)?;
    if accepted.is_some() {
        return Ok(());
    }
    let highest: i64 = tx
        .query_row(
            "SELECT highest FROM leasehold_fence WHERE resource = ?1",
            params![resource],
            |r| r.get(0),
        )
        .map_err(sql)?;
    Err(Error::Stale {
        resource: resource.to_owned(),
        presented: token,
        highest: FencingToken::from_stored(highest),
    })
}

/// A [`Fence`] kept in a SQLite file (its own connection and transaction),
/// for services whose protected write is elsewhere but serialized with the
/// check (see the HTTP layer).
#[derive(Debug, Clone)]
pub struct SqliteFence {
    conn: Arc<Mutex<Connection>>,
}

impl SqliteFence {
    /// Opens (creating) the fence table in the database at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let conn = Connection::open(path).map_err(sql)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sql)?;
        create_table(&conn)?;
        Ok(SqliteFence {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `write` in the same immediate transaction as the check.
    pub fn fenced<T>(
        &self,
        resource: &str,
        token: FencingToken,
        write: impl FnOnce(&Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut conn = crate::mutex::lock(&self.conn);
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql)?;
        check_and_advance(&tx, resource, token)?;
        let value = write(&tx)?;
        tx.commit().map_err(sql)?;
        Ok(value)
    }
}

#[async_trait]
impl Fence for SqliteFence {
    async fn check_and_advance(&self, resource: &str, token: FencingToken) -> Result<()> {
        let (fence, resource) = (self.clone(), resource.to_owned());
        tokio::task::spawn_blocking(move || fence.fenced(&resource, token, |_| Ok(())))
            .await
            .map_err(|e| Error::unavailable("sqlite fence worker failed", e))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write that fails with SQLite's own error (`?` in the closure)
    /// rolls back, the new highest token with it.
    #[test]
    fn a_failed_write_keeps_the_last_token() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fence = SqliteFence::open(dir.path().join("fence.db")).expect("open");
        fence
            .fenced("r", FencingToken(1), |tx| {
                tx.execute_batch("CREATE TABLE t (x INTEGER NOT NULL)")?;
                Ok(())
            })
            .expect("first write");
        let failed = fence.fenced("r", FencingToken(5), |tx| {
            tx.execute("INSERT INTO t (x) VALUES (NULL)", [])?;
            Ok(())
        });
        assert!(
            matches!(failed, Err(Error::Unavailable { .. })),
            "{failed:?}"
        );
        // Token 5 was not kept: 2 is still above the highest.
        fence
            .fenced("r", FencingToken(2), |_| Ok(()))
            .expect("token 2 is not stale");
    }
}
