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
//!   ([`PostgresStore::connect_read_only`]) creates nothing.
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
//!   A role that only reads ([`PostgresStore::connect_read_only`]: status,
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
use crate::store::cleanup::OnDrop;
use crate::store::watch_driver::{self as leader_watch, Event, Source};
use crate::store::{
    ElectionState, FencingToken, Grant, Leader, LeaderWatch, Note, NoteWatch, SessionId,
    SessionLease, StatusWatch, Store, session_key,
};

mod notes;
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
    /// Opened by [`PostgresStore::connect_read_only`]: creates nothing and
    /// opens no session.
    read_only: bool,
    channel: String,
    client: tokio::sync::Mutex<Option<Arc<Client>>>,
    notices: broadcast::Sender<Notice>,
    listening: tokio::sync::watch::Sender<Listening>,
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
    pub async fn connect(url: &str, schema: &str) -> Result<Self> {
        Self::open(url, schema, false).await
    }

    /// Connects as [`PostgresStore::connect`] does, for reading only:
    /// creates nothing and opens no session. A schema that does not exist
    /// is [`Error::NotFound`].
    pub async fn connect_read_only(url: &str, schema: &str) -> Result<Self> {
        Self::open(url, schema, true).await
    }

    /// Connects only to release a dead holder's grant
    /// ([`crate::store::release_orphaned`]): no schema check (the holder's
    /// process made it) and no listener, so the release goes out after one
    /// connection. The release is a call of leasehold's own function in the
    /// schema, which fails where the schema is not leasehold's.
    pub(crate) async fn connect_to_release(url: &str, schema: &str) -> Result<Self> {
        let (inner, _stop) = Self::inner(url, schema, false)?;
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
            note_reads: crate::store::shared_read::SharedReads::default(),
            _stop_listener: stop.clone().drop_guard(),
        });
        Ok((inner, stop))
    }

    async fn open(url: &str, schema: &str, read_only: bool) -> Result<Self> {
        let (inner, stop) = Self::inner(url, schema, read_only)?;
        let client = inner.client().await?;
        inner.migrate(&client).await?;
        tokio::spawn(listen(Arc::downgrade(&inner), stop));
        Ok(PostgresStore { inner })
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

    /// Creates the schema on first use; refuses a schema leasehold did not
    /// create, or a newer version, without writing. Runs in one transaction
    /// behind an advisory lock, so concurrent first uses neither race on
    /// `CREATE` nor see each other's half-made schema.
    async fn migrate(&self, client: &Client) -> Result<()> {
        timed("begin", client.batch_execute("BEGIN")).await?;
        let outcome = self.migrate_in_transaction(client).await;
        let end = if outcome.as_ref().is_ok_and(|created| *created) {
            "COMMIT"
        } else {
            "ROLLBACK"
        };
        let ended = timed("end the schema transaction", client.batch_execute(end)).await;
        outcome?;
        ended
    }

    /// `Ok(true)` when it created the schema (to be committed).
    async fn migrate_in_transaction(&self, client: &Client) -> Result<bool> {
        self.lock_schema(client).await?;
        let found = self.inspect_schema(client).await?;
        if !found.exists {
            if self.read_only {
                return Err(Error::NotFound(format!(
                    "in schema {}: nothing has campaigned there yet",
                    self.schema
                )));
            }
            self.create_schema(client).await?;
            return Ok(true);
        }
        self.check_marker(found.marker_columns.as_deref())?;
        self.check_version(client, found.tables).await?;
        Ok(false)
    }

    /// Takes the transaction's advisory lock on the schema's name.
    async fn lock_schema(&self, client: &Client) -> Result<()> {
        timed(
            "lock the schema",
            client.execute(
                "SELECT pg_advisory_xact_lock(hashtext($1))",
                &[&format!("leasehold schema {}", self.schema)],
            ),
        )
        .await?;
        Ok(())
    }

    /// The schema, and in it leasehold's marker: a table schema_version
    /// with exactly the one column leasehold gives it (`version bigint NOT
    /// NULL`) — another program's table of that name (Flyway's old history
    /// table, say) is not the marker — and leasehold's tables.
    async fn inspect_schema(&self, client: &Client) -> Result<FoundSchema> {
        let row = timed(
            "read the schema",
            client.query_one(INSPECT_SCHEMA_SQL, &[&self.schema.as_str()]),
        )
        .await?;
        Ok(FoundSchema {
            exists: row.get(0),
            marker_columns: row.get(1),
            tables: row.get(2),
        })
    }

    /// Refuses an existing schema without leasehold's marker: leasehold did
    /// not create it.
    fn check_marker(&self, columns: Option<&str>) -> Result<()> {
        let s = &self.schema;
        match columns {
            Some(MARKER_COLUMNS) => Ok(()),
            None => Err(Error::Corrupt(format!(
                "schema {s} exists but leasehold did not create it (it has no {s}.schema_version); \
                 leasehold uses only a schema it creates: choose another with ?schema=NAME"
            ))),
            Some(other) => Err(Error::Corrupt(format!(
                "schema {s} exists but leasehold did not create it ({s}.schema_version has \
                 columns ({other}), not leasehold's ({MARKER_COLUMNS})); leasehold uses only a \
                 schema it creates: choose another with ?schema=NAME"
            ))),
        }
    }

    /// Checks the version in the marker of a schema leasehold created, which
    /// has `tables` of leasehold's two: one version row, one this build
    /// supports, and both tables.
    async fn check_version(&self, client: &Client, tables: i64) -> Result<()> {
        let s = &self.schema;
        // The column is leasehold's, so reading it cannot fail on its type.
        let row = timed(
            "read the schema version",
            client.query_one(
                &format!("SELECT count(*), max(version) FROM {s}.schema_version"),
                &[],
            ),
        )
        .await?;
        let (rows, found): (i64, Option<i64>) = (row.get(0), row.get(1));
        match found {
            _ if rows != 1 => Err(Error::Corrupt(format!(
                "{s}.schema_version holds {rows} rows where leasehold writes one: schema {s} was \
                 not created by leasehold, or was damaged; nothing was written"
            ))),
            Some(v) if v > SCHEMA_VERSION => Err(Error::IncompatibleSchema {
                found: v,
                supported: SCHEMA_VERSION,
            }),
            Some(v) if v >= 1 && tables == 2 => Ok(()),
            Some(v) if v >= 1 => Err(Error::Corrupt(format!(
                "schema {s} has leasehold's schema_version but not its tables sessions and \
                 elections: it was damaged; nothing was written"
            ))),
            _ => Err(Error::Corrupt(format!(
                "{s}.schema_version holds no version leasehold writes: schema {s} was not created \
                 by leasehold, or was damaged; nothing was written"
            ))),
        }
    }

    /// Creates the schema, its tables and functions; fails if the schema
    /// exists (the caller checked, under the lock, that it does not).
    async fn create_schema(&self, client: &Client) -> Result<()> {
        let ddl = fill_schema_placeholders(SCHEMA_SQL, &self.schema);
        timed("create the schema", client.batch_execute(&ddl)).await
    }

    async fn read_leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        let client = self.client().await?;
        let row = timed(
            "read the leader",
            client.query_opt(
                &format!(
                    "SELECT e.candidate, e.token,
                            (extract(epoch FROM h.expires_at - clock_timestamp()) * 1000)::bigint
                     FROM {} e JOIN {} h ON h.id = e.session
                     WHERE e.name = $1 AND h.expires_at > clock_timestamp()",
                    self.table("elections"),
                    self.table("sessions")
                ),
                &[&election.as_str()],
            ),
        )
        .await?;
        row.map(|row| self.leader_from(row.get(0), row.get(1), row.get(2)))
            .transpose()
    }

    fn leader_from(&self, candidate: Option<String>, tok: i64, left_ms: i64) -> Result<Leader> {
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
        })
    }

    /// One acquisition attempt, one statement: the grant, or how long to
    /// wait at most and the election's current token (the holder's, if it
    /// has one).
    async fn try_acquire(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<std::result::Result<Grant, (Duration, FencingToken)>> {
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
        let (granted, tok, wait_ms): (Option<bool>, Option<i64>, Option<i64>) =
            (row.get(0), row.get(1), row.get(2));
        match (granted, tok) {
            (Some(true), Some(tok)) => Ok(Ok(Grant {
                election: election.clone(),
                candidate: candidate.clone(),
                session,
                token: FencingToken::from_stored(tok),
            })),
            (Some(false), tok) => Ok(Err((
                from_millis(wait_ms.unwrap_or(0)),
                FencingToken::from_stored(tok.unwrap_or(0)),
            ))),
            _ => Err(Error::SessionExpired(session)),
        }
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

/// The schema's SQL (`postgres/schema.sql`, with placeholders filled by
/// [`fill_schema_placeholders`]): its tables, its version marker, and the
/// store's statements that change state, as functions so that each is one
/// statement (one implicit transaction) however many steps it takes:
///
/// - `acquire(session, election, candidate)`: the compare-and-swap. It locks
///   the election row, then the holder's session row (a renewal racing with
///   it either committed before and is seen, or runs after and finds the
///   session expired), and bumps the token in the acquiring `UPDATE`. A free
///   election goes to the first waiter in line whose session is live; a
///   candidate that has to wait joins the line. Returns `(true, token, 0)`
///   when granted (also when the session already holds the election),
///   `(false, token, ms)` with how long to sleep at most — until the
///   holder's expiry for the first in line, until the first's expiry for the
///   others — or NULLs when the calling session has expired.
/// - `queue_head(election)`: the first waiter with a live session.
/// - `notify_release(election)`: `NOTIFY` with `"{election} {head}"`, so that
///   only the first in line wakes (no herd); observers read any notice.
/// - `release(election, token, session)`, `withdraw(election, session)`,
///   `close_session(session)`: the guarded release (which records the
///   released token in `releases`, for lock-delay), leaving the line, and
///   ending a session (releasing its grants and its places in line).
/// - `put_note(election, session, name, text)` and
///   `delete_note(election, session, name)`: the notes of planned moves
///   (see `line.rs`) in `notes`; `put_note` puts a note of a live session
///   only (false if it has ended) and drops the election's notes of ended
///   sessions. Both `NOTIFY` `"#n {election}"`: no election name starts
///   with `#`, so no waiter takes it for a release.
const SCHEMA_SQL: &str = include_str!("postgres/schema.sql");

/// What [`Inner::inspect_schema`] finds (`postgres/inspect_schema.sql`).
const INSPECT_SCHEMA_SQL: &str = include_str!("postgres/inspect_schema.sql");

/// What is in the store's schema, before it is created or used.
struct FoundSchema {
    exists: bool,
    /// The columns of its table schema_version, if it has one.
    marker_columns: Option<String>,
    /// How many of leasehold's tables sessions and elections it has.
    tables: i64,
}

/// `sql` with `{schema}` replaced by the schema's name `schema` (checked to
/// be `[a-z0-9_]` by `check_schema_name`, so it needs no quoting) and
/// `{version}` by [`SCHEMA_VERSION`].
fn fill_schema_placeholders(sql: &str, schema: &str) -> String {
    sql.replace("{schema}", schema)
        .replace("{version}", &SCHEMA_VERSION.to_string())
}

/// Keeps one connection LISTENing on the store's channel and broadcasts
/// what it hears; after every (re)connection it broadcasts `None`, since
/// notifications sent meanwhile were lost.
async fn listen(inner: std::sync::Weak<Inner>, stop: CancellationToken) {
    loop {
        let Some(store) = inner.upgrade() else { return };
        let (connector, what, channel, notices, state) = (
            store.connector.clone(),
            format!("listen on {}", store.display),
            store.channel.clone(),
            store.notices.clone(),
            store.listening.clone(),
        );
        drop(store);
        let connected = connector.connect(&what).await;
        if let Err(error) = &connected {
            tracing::debug!(%error, "the postgres listener could not connect; retrying");
        }
        if let Ok((client, mut connection)) = connected {
            let forward = {
                let notices = notices.clone();
                async move {
                    loop {
                        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                            Some(Ok(AsyncMessage::Notification(n))) => {
                                let _ = notices.send(Some(Arc::from(n.payload())));
                            }
                            Some(Ok(_)) => {}
                            Some(Err(_)) | None => return,
                        }
                    }
                }
            };
            // Runs while `forward` drives the connection.
            let listening = async {
                if client
                    .batch_execute(&format!("LISTEN {channel}"))
                    .await
                    .is_ok()
                {
                    state.send_replace(Listening::Yes);
                    let _ = notices.send(None);
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = forward => {}
                () = listening => {}
            }
            // Lost the connection: whatever happened meanwhile is unknown,
            // and nothing is heard until it is back.
            state.send_replace(Listening::Lost);
            let _ = notices.send(None);
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}

/// The PostgreSQL side of a watch on one election: it wakes on the
/// listener's notices for the election, and on a lost listener connection
/// (anything may have changed meanwhile). While the listener is lost the
/// holder is unknown, even if a read made just as the server went down
/// succeeded: no change would be heard.
struct PgWatch {
    inner: Arc<Inner>,
    election: ElectionName,
    notices: broadcast::Receiver<Notice>,
    listening: tokio::sync::watch::Receiver<Listening>,
    /// Whether the lost listener was reported since the last read.
    told_deaf: bool,
}

impl Source for PgWatch {
    const RETRY: Duration = RETRY;

    async fn read(&mut self) -> Result<Option<Leader>> {
        self.inner.read_leader(&self.election).await
    }

    async fn changed(&mut self) -> Event {
        loop {
            if !self.told_deaf && *self.listening.borrow_and_update() == Listening::Lost {
                self.told_deaf = true;
                return Event::Unavailable(Error::Unavailable {
                    reason: format!(
                        "postgres listen on {}: the connection is lost, changes are not heard",
                        self.inner.display
                    ),
                    source: None,
                });
            }
            tokio::select! {
                biased;
                notice = self.notices.recv() => {
                    if let Err(broadcast::error::RecvError::Closed) = notice {
                        return Event::Ended;
                    }
                    if concerns(&notice, self.election.as_str()) {
                        self.told_deaf = false;
                        return Event::Changed;
                    }
                }
                changed = self.listening.changed() => {
                    if changed.is_err() {
                        return Event::Ended;
                    }
                }
            }
        }
    }
}

/// Whether a notice concerns `election` (for observers: any change).
fn concerns(
    notice: &std::result::Result<Notice, broadcast::error::RecvError>,
    election: &str,
) -> bool {
    match notice {
        Ok(Some(payload)) => payload.split(' ').next() == Some(election),
        // A resync, a lagged receiver or a closed channel: re-read.
        Ok(None) | Err(_) => true,
    }
}

/// Whether a notice wakes the waiter `session` of `election`: a release
/// names the first in line; only it tries. A release that names nobody
/// wakes every waiter of the election: the line its statement read may
/// be missing a waiter whose attempt ran at the same time. A waiter that
/// leaves the line (`withdraw`) does not lock the election, so its
/// notice can be read before a concurrent attempt's waiter row commits,
/// while that attempt read the leaver as first in line and waits to be
/// named: without this, it waited for its first's session to expire.
fn wakes(
    notice: &std::result::Result<Notice, broadcast::error::RecvError>,
    election: &str,
    session: &str,
) -> bool {
    match notice {
        Ok(Some(payload)) => match payload.split_once(' ') {
            Some((e, first)) => e == election && (first.is_empty() || first == session),
            None => false,
        },
        Ok(None) | Err(_) => true,
    }
}

/// Leaves the line, for a campaign dropped or failed before it was
/// granted, so that a release is never handed to a waiter that is gone.
async fn leave_line(inner: Arc<Inner>, election: ElectionName, session: SessionId) {
    let Ok(id) = session_key(session) else { return };
    let statement = format!("SELECT {}($1, $2)", inner.table("withdraw"));
    // Tried until it lands: a row left at the head of the queue while the
    // session lives would keep the election from everyone behind it.
    crate::store::cleanup::until_done("leave the line", || {
        let (inner, election, statement) = (Arc::clone(&inner), election.clone(), &statement);
        async move {
            let client = inner.client().await?;
            timed(
                "leave the line",
                client.execute(statement, &[&election.as_str(), &id]),
            )
            .await
            .map(|_| ())
        }
    })
    .await;
}

#[async_trait]
impl Store for PostgresStore {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        if self.inner.read_only {
            return Err(Error::invalid(
                "session",
                "the store was opened read-only (PostgresStore::connect_read_only)",
            ));
        }
        let ttl_ms = TTL.check(ttl)?.units;
        let client = self.inner.client().await?;
        let s = self.inner.table("sessions");
        let id: i64 = timed(
            "open a session",
            client.query_one(
                &format!(
                    "INSERT INTO {s} (ttl_ms, expires_at)
                     VALUES ($1::bigint, clock_timestamp() + $1::bigint * interval '1 millisecond')
                     RETURNING id"
                ),
                &[&ttl_ms],
            ),
        )
        .await?
        .get(0);
        // Housekeeping: sessions long expired are of no use to anyone.
        let _ = timed(
            "forget old sessions",
            client.execute(
                &format!("DELETE FROM {s} WHERE expires_at < clock_timestamp() - interval '{KEEP_EXPIRED}'"),
                &[],
            ),
        )
        .await;
        Ok(SessionLease {
            id: SessionId::from_stored(id),
            ttl: from_millis(ttl_ms),
        })
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        let id = session_key(session)?;
        let client = self.inner.client().await?;
        let row = timed(
            "renew the session",
            client.query_opt(
                &format!(
                    "UPDATE {} SET expires_at = clock_timestamp() + ttl_ms * interval '1 millisecond'
                     WHERE id = $1 AND expires_at > clock_timestamp() RETURNING ttl_ms",
                    self.inner.table("sessions")
                ),
                &[&id],
            ),
        )
        .await?;
        match row {
            Some(row) => Ok(from_millis(row.get(0))),
            None => Err(Error::SessionExpired(session)),
        }
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        let Ok(id) = session_key(session) else {
            return Ok(());
        };
        let client = self.inner.client().await?;
        timed(
            "close the session",
            client.execute(
                &format!("SELECT {}($1)", self.inner.table("close_session")),
                &[&id],
            ),
        )
        .await?;
        // Its notes go with it, and their watchers hear of it now rather
        // than at the next change (the schema's close_session predates
        // notes; the statement needs no change of schema).
        timed(
            "drop the session's notes",
            client.execute(
                &format!(
                    "WITH gone AS (DELETE FROM {} WHERE session = $1 RETURNING election)
                     SELECT pg_notify($2, '#n ' || e) FROM (SELECT DISTINCT election AS e FROM gone) x",
                    self.inner.table("notes")
                ),
                &[&id, &self.inner.channel],
            ),
        )
        .await?;
        Ok(())
    }

    async fn campaign(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Grant> {
        // Subscribed before the first attempt, so a release between the
        // attempt and the wait is not missed.
        let mut notices = self.inner.notices.subscribe();
        let withdraw = {
            let (inner, election) = (Arc::clone(&self.inner), election.clone());
            OnDrop::new((), move |()| leave_line(inner, election, session))
        };
        let me = session.0.to_string();
        // The holder whose grant this campaign found expired, not released.
        let mut expired: Option<(String, FencingToken)> = None;
        loop {
            match self.inner.try_acquire(session, election, candidate).await? {
                Ok(grant) => {
                    withdraw.disarm();
                    if let Some((holder, tok)) = expired {
                        tracing::info!(%election, id = %candidate, expired_leader = %holder, expired_token = tok.0,
                            "the previous leader's lease expired; taking over");
                    }
                    return Ok(grant);
                }
                Err((left, tok)) => {
                    let wake = tokio::time::Instant::now() + left + Duration::from_millis(1);
                    let by_timer = loop {
                        tokio::select! {
                            biased;
                            notice = notices.recv() => {
                                if wakes(&notice, election.as_str(), &me) {
                                    break false;
                                }
                            }
                            () = tokio::time::sleep_until(wake) => break true,
                        }
                    };
                    // Woken at the holder's expiry rather than by a release:
                    // find out whether it expired (one statement, only then).
                    expired = if by_timer {
                        match self.inner.expired_holder(election, tok).await {
                            Ok(holder) => holder.map(|h| (h, tok)),
                            Err(error) => {
                                tracing::debug!(%election, %error, "could not read the expired holder");
                                None
                            }
                        }
                    } else {
                        None
                    };
                }
            }
        }
    }

    async fn resign(&self, grant: &Grant) -> Result<()> {
        let id = session_key(grant.session)?;
        let client = self.inner.client().await?;
        let token_value = grant.token.to_i64_saturating();
        let released: bool = timed(
            "release the election",
            client.query_one(
                &format!("SELECT {}($1, $2, $3)", self.inner.table("release")),
                &[&grant.election.as_str(), &token_value, &id],
            ),
        )
        .await?
        .get(0);
        if !released {
            return Err(Error::NotHolder {
                election: grant.election.to_string(),
                token: grant.token,
            });
        }
        Ok(())
    }

    async fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        self.inner.put_note(session, election, name, text).await
    }

    async fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        self.inner.delete_note(session, election, name).await
    }

    async fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        self.inner.amend_note(session, election, name, text).await
    }

    async fn watch_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<NoteWatch> {
        self.inner
            .watch_notes(election, Some((session, name)))
            .await
    }

    async fn notes(&self, election: &ElectionName) -> Result<Vec<Note>> {
        self.inner.read_notes(election).await
    }

    async fn watch_notes(&self, election: &ElectionName) -> Result<NoteWatch> {
        self.inner.watch_notes(election, None).await
    }

    async fn last_release(&self, election: &ElectionName) -> Result<Option<FencingToken>> {
        self.inner.last_release(election).await
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        self.inner.read_leader(election).await
    }

    async fn watch(&self, election: &ElectionName) -> Result<LeaderWatch> {
        self.watch_held(election, None).await
    }

    async fn watch_status(&self, election: &ElectionName) -> Result<StatusWatch> {
        self.watch_held(election, None).await
    }

    async fn watch_grant(&self, grant: &Grant) -> Result<LeaderWatch> {
        self.watch_held(&grant.election, Some(grant.token)).await
    }

    async fn elections(&self) -> Result<Vec<ElectionState>> {
        let client = self.inner.client().await?;
        let rows = timed(
            "list elections",
            client.query(
                &format!(
                    "SELECT e.name, e.candidate, e.token,
                            (extract(epoch FROM h.expires_at - clock_timestamp()) * 1000)::bigint,
                            h.id IS NOT NULL
                     FROM {} e LEFT JOIN {} h
                          ON h.id = e.session AND h.expires_at > clock_timestamp()
                     ORDER BY e.name",
                    self.inner.table("elections"),
                    self.inner.table("sessions")
                ),
                &[],
            ),
        )
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let name: String = row.get(0);
            let election = ElectionName::new(name).map_err(|_| {
                Error::Corrupt(format!(
                    "{} holds an invalid election name",
                    self.inner.table("elections")
                ))
            })?;
            let live: bool = row.get(4);
            let leader = if live {
                Some(self.inner.leader_from(row.get(1), row.get(2), row.get(3))?)
            } else {
                None
            };
            out.push(ElectionState { election, leader });
        }
        Ok(out)
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
