//! The PostgreSQL store: `postgres://…` / `postgresql://…[?schema=NAME]`.
//!
//! - Tables live in a schema of their own (default `leasehold`) that
//!   leasehold creates on first use, together with a `schema_version`
//!   table, its marker: exactly one column `version bigint NOT NULL` and
//!   one row. A schema that exists without that table — or with another
//!   program's table of that name, such as Flyway's old history table —
//!   was not created by leasehold and is refused without writing, as is a
//!   newer version; PostgreSQL's own schemas (`public`, `information_schema`,
//!   `pg_*`) are refused up front. A store opened read-only
//!   ([`Access::ReadOnly`]) creates nothing.
//! - A session is a row with an expiry on the **server's** clock
//!   (`clock_timestamp()`), never the client's; a renewal is one `UPDATE`
//!   of that row, which renews every election the session holds.
//! - An election is a row with the holder's session, the candidate and a
//!   token. Acquisition is one transaction that locks the election row and
//!   the holder's session row (so a concurrent renewal either lands first
//!   and is seen, or comes after and finds the session expired), and bumps
//!   the token in the acquiring `UPDATE` — one statement, a function
//!   created with the schema. The token is never reset, so it
//!   increases across server restarts.
//! - Releases and grants `NOTIFY` the channel `leasehold_{schema}` with the
//!   election's name; waiters `LISTEN` and otherwise sleep until the holder's
//!   expiry as the server reported it; there is no polling period. Waiters
//!   queue: a release notifies with the first waiter in line, and only it
//!   tries, so a handover costs O(1) statements however many wait.
//! - TLS follows libpq's `sslmode` (module `tls`), on rustls; the TLS files
//!   and `password_file` are read at each (re)connection, so a rotated
//!   certificate takes effect without a restart. A refusal — a certificate
//!   either side rejects, a wrong password, `pg_hba.conf`, a missing
//!   privilege — is one line of [`Error::Denied`] without secrets.
//! - Least privilege: the role needs `CONNECT` and `CREATE` on the
//!   database for the first use (it creates its schema, and so owns it);
//!   afterwards owning the schema is enough (`CREATE` may be revoked):
//!
//!   ```sql
//!   CREATE ROLE app LOGIN PASSWORD '…';
//!   REVOKE ALL ON DATABASE db FROM PUBLIC;
//!   GRANT CONNECT, CREATE ON DATABASE db TO app;
//!   ```
//!
//!   A role that only reads ([`Access::ReadOnly`]: status,
//!   list, observe) needs `CONNECT`, `USAGE` on the schema and `SELECT` on
//!   its tables. Releasing a dead holder's grant runs leasehold's functions
//!   as the caller, so it needs the holder's role (the owner).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast;
use tokio_postgres::{AsyncMessage, Client};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::StoreTtl;
use crate::error::{Error, Result};
use crate::names::{CandidateId, ElectionName};
use crate::store::Access;
use crate::store::cleanup::OnDrop;
use crate::store::watch_driver::{self as leader_watch, Event, Source};
use crate::store::{
    ElectionState, FencingToken, Grant, Leader, LeaderWatch, Note, NoteWatch, SessionId,
    SessionLease, StatusWatch, Store, session_key,
};

mod elections;
mod listening;
use listening::{InFlight, PgWatch, listen, wakes};
mod notes;
mod primitive;
mod schema;
pub use primitive::PgKeys;
mod tls;

/// How PostgreSQL keeps a TTL: as milliseconds in a `bigint`, turned into
/// an `interval` (at most about 178,000,000 years) added to the server's
/// clock.
const TTL: StoreTtl = StoreTtl {
    store: "PostgreSQL",
    unit: Duration::from_millis(1),
    max: Duration::from_secs(178_000_000 * 365 * 86_400),
};

/// The schema version this build writes and understands.
pub const SCHEMA_VERSION: i64 = 1;
/// How long to wait for a connection or one statement.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause before the listener or a watch retries after a failure.
const RETRY: Duration = Duration::from_millis(250);
/// The columns of leasehold's `schema_version`, as the schema check reads
/// them from the catalog: its marker.
const MARKER_COLUMNS: &str = "version bigint not null";
/// Expired session rows older than this are deleted when sessions open.
const KEEP_EXPIRED: &str = "1 hour";

/// What the listener broadcasts: an election that changed, or `None` after
/// (re)connecting, when anything may have changed unseen.
type Notice = Option<Arc<str>>;

/// Whether the listener hears the store's notices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listening {
    /// Not yet connected since the store was opened (the first `LISTEN`
    /// ends with a `None` notice, as every reconnection does).
    Starting,
    /// `LISTEN` is in place.
    Yes,
    /// The connection was lost: changes go unheard until it is back.
    Lost,
}

/// What one `acquire` statement answered.
#[derive(Debug)]
pub(super) enum Acquired {
    /// The session holds the election; `fresh` when this statement granted
    /// it (not when the session held it already).
    Granted { grant: Grant, fresh: bool },
    /// Someone else holds it or is before this session in line: wait at
    /// most `left`; `token` is the election's current one.
    Waiting { left: Duration, token: FencingToken },
}

/// An election store in a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Opens connections: the URL, `sslmode` and the files read at each.
    connector: tls::Connector,
    /// For messages: the URL without its password.
    display: String,
    schema: String,
    /// Opened for [`Access::ReadOnly`]: creates nothing and
    /// opens no session.
    read_only: bool,
    channel: String,
    client: tokio::sync::Mutex<Option<Arc<Client>>>,
    notices: broadcast::Sender<Notice>,
    listening: tokio::sync::watch::Sender<Listening>,
    /// The key changes the listening connection heard lately, which a new
    /// watch of the primitive looks back on (see `primitive.rs`).
    recent: Arc<std::sync::Mutex<primitive::Recent>>,
    /// Reads of an election's notes by this handle's note watches, shared
    /// (see `notes.rs`).
    note_reads: crate::store::shared_read::SharedReads<ElectionName, notes::Rows>,
    _stop_listener: DropGuard,
}

fn unavailable(what: &str, error: tokio_postgres::Error) -> Error {
    use tokio_postgres::error::SqlState;
    // tokio-postgres says only "db error" for errors the server reports.
    let detail = match error.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => crate::error::with_causes(&error),
    };
    // leasehold's own statements on objects that are missing or of another
    // shape: the schema is not (or no longer) what leasehold made, and no
    // retry will change that.
    let foreign = [
        SqlState::UNDEFINED_TABLE,
        SqlState::UNDEFINED_COLUMN,
        SqlState::UNDEFINED_FUNCTION,
        SqlState::UNDEFINED_SCHEMA,
        SqlState::WRONG_OBJECT_TYPE,
        SqlState::DATATYPE_MISMATCH,
    ];
    if error.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
        return Error::Denied(format!(
            "postgres {what}: {detail}: leasehold's role needs CREATE on the database for its \
             first use (it creates its schema) and afterwards owns that schema; a role that only \
             reads (status, list, observe) needs USAGE on the schema and SELECT on its tables"
        ));
    }
    if error.code().is_some_and(|code| foreign.contains(code)) {
        return Error::Corrupt(format!(
            "postgres {what}: {detail}: the schema's tables and functions are not the ones \
             leasehold made (changed or made by another program); leasehold writes only what it \
             created"
        ));
    }
    Error::Unavailable {
        reason: format!("postgres {what}: {detail}"),
        source: Some(Box::new(error)),
    }
}

async fn timed<T>(
    what: &str,
    fut: impl Future<Output = std::result::Result<T, tokio_postgres::Error>>,
) -> Result<T> {
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(unavailable(what, error)),
        Err(_) => Err(Error::no_answer(
            &format!("postgres {what}"),
            REQUEST_TIMEOUT,
        )),
    }
}

fn from_millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Refuses a schema name leasehold cannot use: not a plain lower-case
/// identifier (it is written into statements unquoted), or one of
/// PostgreSQL's own schemas, which hold other programs' objects.
fn check_schema_name(schema: &str) -> Result<()> {
    let plain = !schema.is_empty()
        && schema.len() <= 63
        && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !plain {
        return Err(Error::invalid(
            "PostgreSQL schema",
            format!(
                "{schema:?} must be 1–63 characters of a-z, 0-9 and _, not starting with a digit"
            ),
        ));
    }
    if schema.starts_with("pg_") || schema == "information_schema" || schema == "public" {
        return Err(Error::invalid(
            "PostgreSQL schema",
            format!(
                "{schema:?} is shared with PostgreSQL and other programs; \
                 leasehold needs a schema of its own (?schema=NAME, default leasehold)"
            ),
        ));
    }
    Ok(())
}

impl PostgresStore {
    /// A watch of `election`; with `held`, for the holder of that grant
    /// (see [`leader_watch::start`]).
    async fn watch_held<V: crate::store::watch_driver::Initial>(
        &self,
        election: &ElectionName,
        held: Option<FencingToken>,
    ) -> Result<crate::watch::Receiver<V>> {
        let source = PgWatch {
            inner: Arc::clone(&self.inner),
            election: election.clone(),
            // Subscribed before the first read, so that no change between
            // the two is missed.
            notices: self.inner.notices.subscribe(),
            listening: self.inner.listening.subscribe(),
            told_deaf: false,
        };
        leader_watch::start(source, election, held).await
    }

    /// Connects to the database at `url` (a libpq-style URL) and creates
    /// leasehold's tables in `schema` on first use, or checks them. A
    /// schema that exists but was not created by leasehold is refused with
    /// [`Error::Corrupt`], one written by a newer leasehold with
    /// [`Error::IncompatibleSchema`], PostgreSQL's own schemas (`public`,
    /// `information_schema`, `pg_*`) with [`Error::InvalidInput`]; nothing
    /// is written then.
    ///
    /// [`PostgresStore::open`] with [`Access::ReadWrite`].
    pub async fn connect(url: &str, schema: &str) -> Result<Self> {
        Self::open(url, schema, Access::ReadWrite).await
    }

    /// Connects to the database at `url` (a libpq-style URL, without
    /// leasehold's `schema` parameter) for `access`, with leasehold's
    /// tables in `schema`. [`Access::ReadOnly`] creates nothing and opens
    /// no session; a schema that does not exist is then
    /// [`Error::NotFound`]. [`Access::ReleaseOnly`] checks no schema (the
    /// holder's process made it) and starts no listener, so the release
    /// goes out after one connection; the release is a call of leasehold's
    /// own function in the schema, which fails where the schema is not
    /// leasehold's.
    pub async fn open(url: &str, schema: &str, access: Access) -> Result<Self> {
        let read_only = access == Access::ReadOnly;
        let (inner, stop) = Self::inner(url, schema, read_only)?;
        if access == Access::ReleaseOnly {
            return Ok(PostgresStore { inner });
        }
        let client = inner.client().await?;
        inner.migrate(&client).await?;
        tokio::spawn(listen(Arc::downgrade(&inner), stop));
        Ok(PostgresStore { inner })
    }

    fn inner(url: &str, schema: &str, read_only: bool) -> Result<(Arc<Inner>, CancellationToken)> {
        check_schema_name(schema)?;
        let connect = crate::store::postgres_connect(url)?;
        let config: tokio_postgres::Config =
            connect
                .tokio_postgres_url
                .expose()
                .parse()
                .map_err(|e: tokio_postgres::Error| {
                    Error::invalid("store URL", format!("not a PostgreSQL URL: {e}"))
                })?;
        // The server alone: messages quote the store's URL around this
        // already, and a password added from the environment would show
        // there as a ?password= parameter.
        let display = server_of(&config);
        let (notices, _) = broadcast::channel(1024);
        let stop = CancellationToken::new();
        let inner = Arc::new(Inner {
            connector: tls::Connector {
                config,
                sslmode: connect.sslmode,
                files: connect.tls,
            },
            display,
            schema: schema.to_owned(),
            read_only,
            channel: format!("leasehold_{schema}"),
            client: tokio::sync::Mutex::new(None),
            notices,
            listening: tokio::sync::watch::Sender::new(Listening::Starting),
            recent: Arc::default(),
            note_reads: crate::store::shared_read::SharedReads::default(),
            _stop_listener: stop.clone().drop_guard(),
        });
        Ok((inner, stop))
    }
}

/// `HOST:PORT[,…]/DB` of a configuration, for messages: no user, no
/// password, no parameter.
fn server_of(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let ports = config.get_ports();
    let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let mut hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| match host {
            Host::Tcp(name) => format!("{name}:{}", port(i)),
            Host::Unix(dir) => format!("{}:{}", dir.display(), port(i)),
        })
        .collect();
    if hosts.is_empty() {
        hosts = config
            .get_hostaddrs()
            .iter()
            .enumerate()
            .map(|(i, addr)| format!("{addr}:{}", port(i)))
            .collect();
    }
    let database = config.get_dbname().or(config.get_user()).unwrap_or("");
    format!("{}/{database}", hosts.join(","))
}

impl Inner {
    async fn connect(&self) -> Result<Client> {
        let (client, connection) = self
            .connector
            .connect(&format!("connect to {}", self.display))
            .await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "postgres connection ended");
            }
        });
        Ok(client)
    }

    /// The shared connection, reconnected if it broke.
    async fn client(&self) -> Result<Arc<Client>> {
        let mut slot = self.client.lock().await;
        if let Some(client) = slot.as_ref()
            && !client.is_closed()
        {
            return Ok(Arc::clone(client));
        }
        let client = Arc::new(self.connect().await?);
        *slot = Some(Arc::clone(&client));
        Ok(client)
    }

    fn table(&self, name: &str) -> String {
        // The schema name is checked to be [a-z0-9_] by `check_schema_name`.
        format!("{}.{name}", self.schema)
    }
}

impl Inner {
    async fn read_leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        let client = self.client().await?;
        let row = timed(
            "read the leader",
            client.query_opt(
                &format!(
                    "SELECT e.candidate, e.token,
                            (extract(epoch FROM h.expires_at - clock_timestamp()) * 1000)::bigint,
                            e.session
                     FROM {} e JOIN {} h ON h.id = e.session
                     WHERE e.name = $1 AND h.expires_at > clock_timestamp()",
                    self.table("elections"),
                    self.table("sessions")
                ),
                &[&election.as_str()],
            ),
        )
        .await?;
        row.map(|row| self.leader_from(row.get(0), row.get(1), row.get(2), row.get(3)))
            .transpose()
    }

    fn leader_from(
        &self,
        candidate: Option<String>,
        tok: i64,
        left_ms: i64,
        session: Option<i64>,
    ) -> Result<Leader> {
        let candidate = candidate
            .as_deref()
            .and_then(|c| CandidateId::new(c).ok())
            .ok_or_else(|| {
                Error::Corrupt(format!(
                    "{} holds an invalid candidate",
                    self.table("elections")
                ))
            })?;
        Ok(Leader {
            candidate,
            token: FencingToken::from_stored(tok),
            expires_in: from_millis(left_ms),
            session: session.map(SessionId::from_stored),
        })
    }

    /// One acquisition attempt, one statement: the grant, or how long to
    /// wait at most and the election's current token (the holder's, if it
    /// has one).
    pub(super) async fn try_acquire(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Acquired> {
        let id = session_key(session)?;
        let client = self.client().await?;
        let acquired = timed("campaign", async {
            Ok(client
                .query_one(
                    &format!("SELECT * FROM {}($1, $2, $3)", self.table("acquire")),
                    &[&id, &election.as_str(), &candidate.as_str()],
                )
                .await)
        })
        .await?;
        let row = acquired.map_err(|error| self.acquire_failed(election, error))?;
        let (granted, tok, wait_ms, fresh): (Option<bool>, Option<i64>, Option<i64>, Option<bool>) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        match (granted, tok) {
            (Some(true), Some(tok)) => Ok(Acquired::Granted {
                grant: Grant {
                    election: election.clone(),
                    candidate: candidate.clone(),
                    session,
                    token: FencingToken::from_stored(tok),
                },
                fresh: fresh == Some(true),
            }),
            (Some(false), tok) => Ok(Acquired::Waiting {
                left: from_millis(wait_ms.unwrap_or(0)),
                token: FencingToken::from_stored(tok.unwrap_or(0)),
            }),
            _ => Err(Error::SessionExpired(session)),
        }
    }

    /// Releases `grant` if it still holds its election: whether it did.
    pub(super) async fn release(&self, grant: &Grant) -> Result<bool> {
        let id = session_key(grant.session)?;
        let client = self.client().await?;
        Ok(timed(
            "release the election",
            client.query_one(
                &format!("SELECT {}($1, $2, $3)", self.table("release")),
                &[
                    &grant.election.as_str(),
                    &grant.token.to_i64_saturating(),
                    &id,
                ],
            ),
        )
        .await?
        .get(0))
    }

    /// The error of an `acquire` of `election` that the server refused.
    /// Its one sum that can leave bigint's range is the token's `+ 1`
    /// (the milliseconds it computes stay far below it, as timestamps end
    /// in 294276 AD): `numeric_value_out_of_range` says the election's
    /// counter is exhausted; `data_corrupted` is `acquire`'s refusal of a
    /// counter below zero. The statement, its own transaction, was rolled
    /// back: nothing was written.
    fn acquire_failed(&self, election: &ElectionName, error: tokio_postgres::Error) -> Error {
        use tokio_postgres::error::SqlState;
        if error.code() == Some(&SqlState::NUMERIC_VALUE_OUT_OF_RANGE) {
            return Error::tokens_exhausted(&self.table("elections"), election.as_str());
        }
        if let Some(db) = error.as_db_error()
            && db.code() == &SqlState::DATA_CORRUPTED
        {
            return Error::Corrupt(format!(
                "{}: {}; no grant was written",
                self.table("elections"),
                db.message()
            ));
        }
        unavailable("campaign", error)
    }

    /// The candidate of the grant `tok` of `election` if that grant was
    /// never released but its session is no longer live: it expired.
    async fn expired_holder(
        &self,
        election: &ElectionName,
        tok: FencingToken,
    ) -> Result<Option<String>> {
        let client = self.client().await?;
        let tok = tok.to_i64_saturating();
        let row = timed(
            "read the expired holder",
            client.query_opt(
                &format!(
                    "SELECT e.candidate FROM {} e
                     WHERE e.name = $1 AND e.token = $2 AND e.session IS NOT NULL
                       AND NOT EXISTS (SELECT 1 FROM {} h
                                       WHERE h.id = e.session AND h.expires_at > clock_timestamp())",
                    self.table("elections"),
                    self.table("sessions")
                ),
                &[&election.as_str(), &tok],
            ),
        )
        .await?;
        Ok(row.and_then(|r| r.get(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(payload: &str) -> std::result::Result<Notice, broadcast::error::RecvError> {
        Ok(Some(Arc::from(payload)))
    }

    #[test]
    fn a_release_wakes_the_waiter_it_names_and_only_it() {
        assert!(wakes(&notice("jobs 7"), "jobs", "7"));
        assert!(!wakes(&notice("jobs 8"), "jobs", "7"));
        assert!(!wakes(&notice("other 7"), "jobs", "7"));
        // A grant, and a change of the line's notes, wake no waiter.
        assert!(!wakes(&notice("jobs"), "jobs", "7"));
        assert!(!wakes(&notice("#n jobs"), "jobs", "7"));
    }

    #[test]
    fn a_release_that_names_nobody_wakes_every_waiter_of_the_election() {
        assert!(wakes(&notice("jobs "), "jobs", "7"));
        assert!(wakes(&notice("jobs "), "jobs", "8"));
        assert!(!wakes(&notice("other "), "jobs", "7"));
    }

    #[test]
    fn a_resync_wakes_every_waiter() {
        assert!(wakes(&Ok(None), "jobs", "7"));
        assert!(wakes(
            &Err(broadcast::error::RecvError::Lagged(3)),
            "jobs",
            "7"
        ));
    }
}
