//! Fencing inside a PostgreSQL transaction (tokio-postgres).
//!
//! The same check in plain SQL, for any language — run it in the
//! transaction that makes the protected write, and roll back if it returns
//! no row:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS leasehold_fence (
//!     resource text   PRIMARY KEY,
//!     highest  bigint NOT NULL
//! );
//! INSERT INTO leasehold_fence (resource, highest) VALUES ($1, $2)
//! ON CONFLICT (resource) DO UPDATE SET highest = EXCLUDED.highest
//!     WHERE leasehold_fence.highest <= EXCLUDED.highest
//! RETURNING highest;
//! ```
//!
//! Concurrent writers of one resource queue on the row's lock; PostgreSQL
//! re-evaluates the `WHERE` against the committed row after the wait, so a
//! lower token cannot pass once a higher one has committed.

use tokio_postgres::{GenericClient, Transaction};

use crate::error::{Error, Result};
use crate::grant::FencingToken;

/// The fence table, for `CREATE`-ing once.
pub const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS leasehold_fence (
    resource text   PRIMARY KEY,
    highest  bigint NOT NULL
)";

const ADVANCE: &str = "INSERT INTO leasehold_fence (resource, highest) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET highest = EXCLUDED.highest
    WHERE leasehold_fence.highest <= EXCLUDED.highest
RETURNING highest";

fn pg(error: tokio_postgres::Error) -> Error {
    Error::unavailable("postgres fence", error)
}

/// A PostgreSQL error in a fenced write: `?` works on the caller's
/// statements in the transaction the check runs in.
/// [`Error::Unavailable`], as the fence's own PostgreSQL errors.
impl From<tokio_postgres::Error> for Error {
    fn from(error: tokio_postgres::Error) -> Self {
        pg(error)
    }
}

/// Creates the fence table if it does not exist.
pub async fn create_table(client: &impl GenericClient) -> Result<()> {
    client.batch_execute(CREATE_TABLE).await.map_err(pg)
}

/// Checks `token` for `resource` and records it inside the caller's
/// transaction; on [`Error::Stale`] the caller rolls back (dropping the
/// transaction does) and nothing is written.
pub async fn check_and_advance(
    tx: &Transaction<'_>,
    resource: &str,
    token: FencingToken,
) -> Result<()> {
    let presented = token
        .to_i64()
        .ok_or_else(|| Error::invalid("fencing token", format!("{token} is too large")))?;
    if tx
        .query_opt(ADVANCE, &[&resource, &presented])
        .await
        .map_err(pg)?
        .is_some()
    {
        return Ok(());
    }
    let row = tx
        .query_one(
            "SELECT highest FROM leasehold_fence WHERE resource = $1",
            &[&resource],
        )
        .await
        .map_err(pg)?;
    let highest: i64 = row.get(0);
    Err(Error::Stale {
        resource: resource.to_owned(),
        presented: token,
        highest: FencingToken::from_stored(highest),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller's own PostgreSQL error converts with `?` in code that
    /// returns leasehold's `Result`.
    #[test]
    fn a_postgres_error_converts_with_a_question_mark() {
        fn configure() -> Result<tokio_postgres::Config> {
            Ok("host=h port=not-a-port".parse::<tokio_postgres::Config>()?)
        }
        let error = configure().expect_err("an invalid port");
        assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    }
}
