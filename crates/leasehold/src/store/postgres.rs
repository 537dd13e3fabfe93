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
//! - Elections are written once over the store primitive
//!   ([`crate::store::keyed`]); on PostgreSQL the primitive ([`PgKeys`],
//!   `primitive.rs`) is a table of keys, each perhaps attached to a
//!   session, with the store-wide revision of the commit that created it
//!   (the token of a candidate's key) and of the one that last wrote it.
//!   A commit is one statement, a function created with the schema, that
//!   takes the store's commits one at a time on the single row of
//!   `revision`; revisions are never reset, so tokens increase across
//!   server restarts.
//! - Each commit `NOTIFY`s the channel `leasehold_{schema}` with the keys
//!   it changed; a handle's watches share its one `LISTEN`ing connection,
//!   and a waiting campaign watches the key just ahead of its own, so a
//!   release wakes the next in line alone. The server tells no expiry: a
//!   waiter otherwise sleeps until the expiry of the key ahead as the
//!   server reported it; there is no polling period.
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
use tokio_postgres::{AsyncMessage, Client};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::StoreTtl;
use crate::error::{Error, Result};
use crate::store::Access;
use crate::store::keyed::KeyedStore;
use crate::store::{SessionId, SessionLease, session_key};

mod heard;
mod listening;
use listening::listen;
mod primitive;
mod schema;
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

/// A connection, with the statements prepared on it: each of leasehold's
/// statements is prepared once per connection, not at every use (which
/// costs a round trip).
#[derive(Debug)]
struct Conn {
    client: Client,
    prepared: std::sync::Mutex<std::collections::HashMap<String, tokio_postgres::Statement>>,
}

impl std::ops::Deref for Conn {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Conn {
    /// `sql` prepared on this connection.
    async fn prepared(&self, sql: &str) -> Result<tokio_postgres::Statement> {
        if let Some(statement) = crate::mutex::lock(&self.prepared).get(sql) {
            return Ok(statement.clone());
        }
        let statement = timed("prepare a statement", self.client.prepare(sql)).await?;
        crate::mutex::lock(&self.prepared).insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }
}

/// An election store in a PostgreSQL database: the elections written once
/// over the store primitive, on [`PgKeys`].
pub type PostgresStore = KeyedStore<PgKeys>;

/// The store primitive in a PostgreSQL database: its connections, its
/// schema and its listening connection. Cloning shares them.
#[derive(Debug, Clone)]
pub struct PgKeys {
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
    client: tokio::sync::Mutex<Option<Arc<Conn>>>,
    /// What the listening connection heard lately, and the primitive's
    /// watches it tells (see `heard.rs`).
    recent: Arc<std::sync::Mutex<heard::Recent>>,
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
        && schema.len() <= 53
        && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !plain {
        return Err(Error::invalid(
            "PostgreSQL schema",
            format!(
                "{schema:?} must be 1–53 characters of a-z, 0-9 and _, not starting with a digit (its notices go on the channel leasehold_SCHEMA, and PostgreSQL's names end at 63)"
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

impl KeyedStore<PgKeys> {
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

    /// The elections over [`PgKeys::open`].
    pub async fn open(url: &str, schema: &str, access: Access) -> Result<Self> {
        Ok(KeyedStore::over(PgKeys::open(url, schema, access).await?))
    }
}

impl PgKeys {
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
            return Ok(PgKeys { inner });
        }
        let client = inner.client().await?;
        inner.migrate(&client).await?;
        tokio::spawn(listen(Arc::downgrade(&inner), stop));
        Ok(PgKeys { inner })
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
            recent: Arc::default(),
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
    async fn client(&self) -> Result<Arc<Conn>> {
        let mut slot = self.client.lock().await;
        if let Some(conn) = slot.as_ref()
            && !conn.client.is_closed()
        {
            return Ok(Arc::clone(conn));
        }
        let conn = Arc::new(Conn {
            client: self.connect().await?,
            prepared: std::sync::Mutex::default(),
        });
        *slot = Some(Arc::clone(&conn));
        Ok(conn)
    }

    fn table(&self, name: &str) -> String {
        format!("{}.{name}", schema::quoted(&self.schema))
    }
}
