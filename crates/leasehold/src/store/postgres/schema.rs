//! The store's schema: created, checked and migrated under a lock, from
//! `schema.sql`.

use super::*;

impl Inner {
    /// Creates the schema on first use; refuses a schema leasehold did not
    /// create, or a newer version, without writing. Runs in one transaction
    /// behind an advisory lock, so concurrent first uses neither race on
    /// `CREATE` nor see each other's half-made schema.
    pub(super) async fn migrate(&self, client: &Client) -> Result<()> {
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
    pub(super) async fn migrate_in_transaction(&self, client: &Client) -> Result<bool> {
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
    pub(super) async fn lock_schema(&self, client: &Client) -> Result<()> {
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
    pub(super) async fn inspect_schema(&self, client: &Client) -> Result<FoundSchema> {
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
    pub(super) fn check_marker(&self, columns: Option<&str>) -> Result<()> {
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
    pub(super) async fn check_version(&self, client: &Client, tables: i64) -> Result<()> {
        let s = &self.schema;
        // The column is leasehold's, so reading it cannot fail on its type.
        let row = timed(
            "read the schema version",
            client.query_one(
                &format!(
                    "SELECT count(*), max(version) FROM {}.schema_version",
                    quoted(s)
                ),
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
                 keys: it was damaged; nothing was written"
            ))),
            _ => Err(Error::Corrupt(format!(
                "{s}.schema_version holds no version leasehold writes: schema {s} was not created \
                 by leasehold, or was damaged; nothing was written"
            ))),
        }
    }

    /// Creates the schema, its tables and functions; fails if the schema
    /// exists (the caller checked, under the lock, that it does not).
    pub(super) async fn create_schema(&self, client: &Client) -> Result<()> {
        let ddl = fill_schema_placeholders(SCHEMA_SQL, &self.schema);
        timed("create the schema", client.batch_execute(&ddl)).await
    }
}

/// The schema's SQL (`postgres/schema.sql`, with placeholders filled by
/// [`fill_schema_placeholders`]): its tables, its version marker, and the
/// store's statements that change state, as functions so that each is one
/// statement (one implicit transaction) however many steps it takes:
///
/// - `commit_keys(checks…, writes…)`: the store primitive's commit (see
///   `primitive.rs`). It locks the one row of `revision` first, so commits
///   are taken one at a time and each sees every earlier one; checks and
///   writes skip the dead keys of ended sessions; a commit that changes
///   nothing takes no revision. Returns the revision, NULL when a check
///   failed, or the ended session a put named.
/// - `notify_keys(revision, keys)`: `NOTIFY` with `"k {revision}"` and the
///   keys, one a line, so that a watch wakes for its own keys alone (no
///   herd).
/// - `end_session(session)`: ends a session and its keys, at one revision.
/// - `forget_old_sessions()`: deletes sessions expired over an hour ago and
///   their dead keys (housekeeping when a session opens).
/// - `live(session)`: whether a key's session is live.
pub(super) const SCHEMA_SQL: &str = include_str!("schema.sql");

/// What [`Inner::inspect_schema`] finds (`postgres/inspect_schema.sql`).
pub(super) const INSPECT_SCHEMA_SQL: &str = include_str!("inspect_schema.sql");

/// What is in the store's schema, before it is created or used.
pub(super) struct FoundSchema {
    pub(super) exists: bool,
    /// The columns of its table schema_version, if it has one.
    pub(super) marker_columns: Option<String>,
    /// How many of leasehold's tables sessions and keys it has.
    pub(super) tables: i64,
}

/// `sql` with `{schema}` replaced by the schema's name `schema` (checked to
/// be `[a-z0-9_]` by `check_schema_name`): quoted where it names the schema
/// (`{schema}.` and `CREATE SCHEMA {schema}`), since a plain name may still
/// be a reserved word (`select`, `user`), and as it is inside a text (a
/// message, the channel `leasehold_{schema}`); `{version}` by
/// [`SCHEMA_VERSION`].
pub(super) fn fill_schema_placeholders(sql: &str, schema: &str) -> String {
    let quoted = quoted(schema);
    sql.replace("{schema}.", &format!("{quoted}."))
        .replace("CREATE SCHEMA {schema}", &format!("CREATE SCHEMA {quoted}"))
        .replace("{schema}", schema)
        .replace("{version}", &SCHEMA_VERSION.to_string())
}

/// The schema's name as an identifier in a statement: quoted, so that a
/// reserved word names a schema too (the name is `[a-z0-9_]`, so quoting
/// changes nothing else).
pub(super) fn quoted(schema: &str) -> String {
    format!("\"{schema}\"")
}
