//! The store primitive on PostgreSQL ([`Keys`]): a session is a row of
//! `sessions` (expiring by the server's clock), a key a row of `keys`, a
//! commit one statement (`commit_keys`, which takes the store's commits
//! one at a time on the row of `revision`), a watch one subscriber of the
//! store's listening connection. Each commit `NOTIFY`s the keys it
//! changed, so a watch wakes for its prefix only. A watch that starts
//! later than the revision it watches from finds what changed meanwhile in
//! what the listener heard lately (`heard.rs`), or else reads it: its
//! prefix's last writes, and the `deletions` table. An expiry goes untold
//! (nothing runs in the server when a session's time is up): a key comes
//! with the time its session had left, and whoever needs to know reads
//! again then.

use super::*;
use crate::mutex::lock;
use crate::store::keys::{Check, Entry, Heard, KeyWatch, Keys, Range, Revision, Write, prefix_end};

impl PgKeys {
    /// Refuses a write on a store opened read-only.
    fn writable(&self, what: &'static str) -> Result<()> {
        if self.inner.read_only {
            return Err(Error::invalid(
                what,
                "the store was opened read-only (Access::ReadOnly)",
            ));
        }
        Ok(())
    }
}

/// A commit's checks and writes as `commit_keys` takes them: one array a
/// column.
#[derive(Default)]
struct Arrays {
    check_kind: Vec<&'static str>,
    check_key: Vec<String>,
    check_end: Vec<Option<String>>,
    check_revision: Vec<i64>,
    check_session: Vec<Option<i64>>,
    delete: Vec<bool>,
    key: Vec<String>,
    value: Vec<String>,
    session: Vec<Option<i64>>,
}

impl Arrays {
    fn of(checks: &[Check], writes: &[Write]) -> Result<Self> {
        let mut a = Arrays::default();
        for check in checks {
            let (kind, key, revision, session) = match check {
                Check::Absent(key) => ("absent", key, 0, None),
                Check::NoneUnder(prefix) => ("under", prefix, 0, None),
                Check::Created {
                    key,
                    revision,
                    session,
                } => (
                    "created",
                    key,
                    // A revision beyond bigint was never given: the check
                    // fails, as it should.
                    i64::try_from(revision.0).unwrap_or(-1),
                    session.map(session_key).transpose()?,
                ),
            };
            a.check_kind.push(kind);
            a.check_end.push(match check {
                Check::NoneUnder(prefix) => prefix_end(prefix),
                _ => None,
            });
            a.check_key.push(key.clone());
            a.check_revision.push(revision);
            a.check_session.push(session);
        }
        for write in writes {
            let (delete, key, value, session) = match write {
                Write::Put {
                    key,
                    value,
                    session,
                } => (
                    false,
                    key,
                    value.clone(),
                    session.map(session_key).transpose()?,
                ),
                Write::Delete(key) => (true, key, String::new(), None),
            };
            a.delete.push(delete);
            a.key.push(key.clone());
            a.value.push(value);
            a.session.push(session);
        }
        Ok(a)
    }
}

#[async_trait]
impl Keys for PgKeys {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        self.writable("session")?;
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
        // Housekeeping: sessions long expired, and their dead keys, are of
        // no use to anyone.
        let _ = timed(
            "forget old sessions",
            client.execute(
                &format!("SELECT {}()", self.inner.table("forget_old_sessions")),
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
        let statement = client
            .prepared(&format!(
                "UPDATE {} SET expires_at = clock_timestamp() + ttl_ms * interval '1 millisecond'
                 WHERE id = $1 AND expires_at > clock_timestamp() RETURNING ttl_ms",
                self.inner.table("sessions")
            ))
            .await?;
        let row = timed("renew the session", client.query_opt(&statement, &[&id])).await?;
        match row {
            Some(row) => Ok(from_millis(row.get(0))),
            None => Err(Error::SessionExpired(session)),
        }
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        self.writable("session")?;
        let Ok(id) = session_key(session) else {
            return Ok(());
        };
        let inner = &self.inner;
        let client = inner.client().await?;
        let statement = client
            .prepared(&format!("SELECT {}($1)", inner.table("end_session")))
            .await?;
        let ended = timed("end a session", async {
            Ok(client.execute(&statement, &[&id]).await)
        })
        .await?;
        ended.map(|_| ()).map_err(|error| self.commit_failed(error))
    }

    async fn commit(&self, checks: &[Check], writes: &[Write]) -> Result<Option<Revision>> {
        self.writable("commit")?;
        let a = Arrays::of(checks, writes)?;
        let inner = &self.inner;
        let client = inner.client().await?;
        let statement = client
            .prepared(&format!(
                "SELECT * FROM {}($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                inner.table("commit_keys")
            ))
            .await?;
        let answered = timed("commit", async {
            Ok(client
                .query_one(
                    &statement,
                    &[
                        &a.check_kind,
                        &a.check_key,
                        &a.check_end,
                        &a.check_revision,
                        &a.check_session,
                        &a.delete,
                        &a.key,
                        &a.value,
                        &a.session,
                    ],
                )
                .await)
        })
        .await?;
        let row = answered.map_err(|error| self.commit_failed(error))?;
        let (revision, expired): (Option<i64>, Option<i64>) = (row.get(0), row.get(1));
        if let Some(session) = expired {
            return Err(Error::SessionExpired(SessionId::from_stored(session)));
        }
        Ok(revision.map(|r| Revision(u64::try_from(r).unwrap_or(0))))
    }

    async fn range(&self, prefix: &str) -> Result<Range> {
        let inner = &self.inner;
        let client = inner.client().await?;
        let end = prefix_end(prefix);
        // One statement, one snapshot: the keys and the revision agree.
        let under = under(end.as_deref());
        let statement = format!(
            "SELECT r.value, k.key, k.value, k.session, k.created, k.modified, k.left_ms
             FROM {revision} r LEFT JOIN (
                 SELECT k.key, k.value, k.session, k.created, k.modified,
                        (extract(epoch FROM h.expires_at - clock_timestamp()) * 1000)::bigint
                            AS left_ms
                 FROM {keys} k LEFT JOIN {sessions} h ON h.id = k.session
                 WHERE {under}
                   AND (k.session IS NULL OR h.expires_at > clock_timestamp())
             ) k ON true
             ORDER BY k.key",
            revision = inner.table("revision"),
            keys = inner.table("keys"),
            sessions = inner.table("sessions"),
        );
        let statement = client.prepared(&statement).await?;
        let rows = timed("read keys", client.query(&statement, &[&prefix, &end])).await?;
        let mut range = Range::default();
        for row in rows {
            range.revision = Revision(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0));
            let Some(key) = row.get::<_, Option<String>>(1) else {
                continue;
            };
            let (session, left): (Option<i64>, Option<i64>) = (row.get(3), row.get(6));
            range.entries.push(Entry {
                key,
                value: row.get(2),
                session: session.map(SessionId::from_stored),
                created: Revision(u64::try_from(row.get::<_, i64>(4)).unwrap_or(0)),
                modified: Revision(u64::try_from(row.get::<_, i64>(5)).unwrap_or(0)),
                expires_in: left.map(from_millis),
            });
        }
        Ok(range)
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<KeyWatch> {
        let (tx, rx, read) = lock(&self.inner.recent).register(prefix, from);
        if let Some(mut listening) = read {
            // What changed between the caller's read and the registration
            // was not heard here: read it once the listener listens (the
            // listener tells what comes after).
            let (keys, prefix) = (self.clone(), prefix.to_owned());
            tokio::spawn(async move {
                tokio::select! {
                    () = tx.closed() => return,
                    up = listening.wait_for(|up| *up) => if up.is_err() { return },
                }
                match keys.changed_under(&prefix, from).await {
                    Ok((now, true)) => heard::tell(&tx, now),
                    Ok((_, false)) => {}
                    // The reader reads, and meets the error itself.
                    Err(_) => {
                        tx.send_replace(Heard::Changed(from));
                    }
                }
            });
        }
        Ok(rx)
    }
}

/// The condition that `k.key` is under the prefix `$1`, `$2` being its
/// [`prefix_end`]: with an end, one the index searches between both bounds
/// (`$2 IS NULL OR k.key < $2` it cannot take: each read scanned to the
/// end of the table); without one, no string is above the keys from `$1`
/// on, and `$2` is NULL.
fn under(end: Option<&str>) -> &'static str {
    match end {
        Some(_) => "k.key >= $1 AND k.key < $2",
        None => "k.key >= $1 AND $2::text IS NULL",
    }
}

impl PgKeys {
    /// The store's revision, and whether anything under `prefix` changed
    /// after `from`: a key written or deleted since (an expiry is not
    /// told), or deletions forgotten since.
    async fn changed_under(&self, prefix: &str, from: Revision) -> Result<(Revision, bool)> {
        let client = self.inner.client().await?;
        let end = prefix_end(prefix);
        let under = under(end.as_deref());
        let statement = format!(
            "SELECT r.value, r.forgotten,
                    greatest((SELECT max(k.modified) FROM {keys} k WHERE {under}),
                             (SELECT max(k.revision) FROM {deletions} k WHERE {under}))
             FROM {revision} r",
            keys = self.inner.table("keys"),
            deletions = self.inner.table("deletions"),
            revision = self.inner.table("revision"),
        );
        let statement = client.prepared(&statement).await?;
        let row = timed(
            "read what changed",
            client.query_one(&statement, &[&prefix, &end]),
        )
        .await?;
        let (now, forgotten, last): (i64, i64, Option<i64>) = (row.get(0), row.get(1), row.get(2));
        let after = |r: i64| u64::try_from(r).is_ok_and(|r| r > from.0);
        let now = Revision(u64::try_from(now).unwrap_or(0));
        Ok((now, after(forgotten) || last.is_some_and(after)))
    }

    /// The error of a `commit_keys` the server refused, its own
    /// transaction, rolled back: nothing was written. Its one sum that can
    /// leave bigint's range is the revision's `+ 1`; `data_corrupted` is
    /// its refusal of a counter below zero.
    fn commit_failed(&self, error: tokio_postgres::Error) -> Error {
        use tokio_postgres::error::SqlState;
        if error.code() == Some(&SqlState::NUMERIC_VALUE_OUT_OF_RANGE) {
            return Error::Corrupt(format!(
                "{}: the revisions (the fencing tokens) are exhausted: the last is the largest \
                 token a store keeps; nothing was written",
                self.inner.table("revision")
            ));
        }
        if let Some(db) = error.as_db_error()
            && db.code() == &SqlState::DATA_CORRUPTED
        {
            return Error::Corrupt(format!("{}; nothing was written", db.message()));
        }
        unavailable("commit", error)
    }
}
