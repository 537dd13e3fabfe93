//! The store primitive on SQLite ([`Keys`]): a session is a row of
//! `sessions` (expiring on the host's monotonic clock, its process tested
//! by the kernel: see `liveness`), a key a row of `keys`, a commit one
//! `BEGIN IMMEDIATE` transaction that takes the next revision from
//! `revision`, with the file checked before it commits as every write is.
//! A key whose session has ended — closed, past its expiry, or of a
//! process the kernel saw die — is dead: reads and checks skip it, and the
//! commit that next writes it replaces it.
//!
//! A watch reads its prefix's last change after every commit, this
//! process's or another's (inotify on the notify file: see `notify`), and
//! after a death the kernel saw of a session that holds a key under it. An
//! expiry by the TTL goes untold: a key comes with the time its session
//! had left, and whoever needs to know reads again then.

use rusqlite::types::Value;
use std::collections::BTreeMap;
use std::time::Instant;

use super::*;
use crate::store::keys::{
    Check, Entry, KeyWatch, Keys, Properties, Range, Revision, Write, prefix_end,
};

/// What a commit did: its revision (`None`: a check failed, nothing was
/// written), and the keys of the sessions it ended (their processes were
/// gone).
#[derive(Default)]
pub(super) struct Committed {
    pub(super) revision: Option<Revision>,
    pub(super) ended: Vec<String>,
}

/// A live key as read, with its session's time left (nanoseconds on the
/// monotonic clock; `None` for a key of no session).
struct KeyRow {
    key: String,
    value: String,
    session: Option<i64>,
    created: i64,
    modified: i64,
    left_ns: Option<i64>,
}

impl KeyRow {
    fn entry(self) -> Entry {
        Entry {
            key: self.key,
            value: self.value,
            session: self.session.map(SessionId::from_stored),
            created: revision(self.created),
            modified: revision(self.modified),
            expires_in: self.left_ns.map(duration_ns),
        }
    }
}

/// Says that a commit or a watch ended the sessions of dead processes,
/// whose `keys` went with them.
pub(super) fn log_ended(keys: &[String]) {
    if !keys.is_empty() {
        tracing::info!(
            keys = keys.len(),
            "ended the sessions of processes that died holding keys (the kernel released their locks on this host)"
        );
    }
}

/// A value SQLite holds, for a message.
fn stored_value(value: &rusqlite::types::Value) -> String {
    use rusqlite::types::Value;
    match value {
        Value::Null => "nothing".to_owned(),
        Value::Integer(n) => n.to_string(),
        Value::Real(r) => format!("the real number {r}"),
        Value::Text(text) => format!("the text {}", crate::error::quoted(text)),
        Value::Blob(blob) => format!("a blob of {} bytes", blob.len()),
    }
}

fn revision(stored: i64) -> Revision {
    Revision(u64::try_from(stored).unwrap_or(0))
}

/// The keys from `?1` up to `?2` (none: to the end), with their sessions'
/// time left at `?3` under boot `?4` (NULL: ended, or none) and the
/// sessions' locks.
pub(super) const KEY_ROWS: &str = "
SELECT k.key, k.value, k.session, k.created, k.modified, s.expires_at_ns - ?3, l.dev, l.ino
FROM keys k
LEFT JOIN sessions s ON s.id = k.session AND s.boot_id = ?4 AND s.expires_at_ns > ?3
LEFT JOIN session_locks l ON l.session = k.session
WHERE k.key >= ?1 AND k.key < ?2
ORDER BY k.key";

/// The bound `key < ?` of the keys that start with `prefix`: the least
/// string above them all, or, where there is none, an empty BLOB, which
/// SQLite sorts after every TEXT. Either way the index takes it as the end
/// of its range (`?2 IS NULL OR key < ?2` it does not: each read of a
/// prefix then scanned to the end of the table).
pub(super) fn below(prefix: &str) -> Value {
    prefix_end(prefix).map_or(Value::Blob(Vec::new()), Value::Text)
}

/// What the kernel said of the sessions read by one statement or
/// transaction: each is tested once.
#[derive(Default)]
pub(super) struct Tested(BTreeMap<i64, Process>);

impl Tested {
    /// The sessions found in `process`'s state.
    pub(super) fn found(&self, process: Process) -> Vec<i64> {
        self.0
            .iter()
            .filter_map(|(session, p)| (*p == process).then_some(*session))
            .collect()
    }
}

impl Db {
    /// The live keys from `from` up to `end` at monotonic time `now`,
    /// with the sessions among them the kernel says are alive.
    fn key_rows(
        &self,
        conn: &Connection,
        from: &str,
        end: &Value,
        now: i64,
        tested: &mut Tested,
    ) -> Result<Vec<KeyRow>> {
        type Read = (KeyRow, Option<Option<i64>>, Option<(i64, i64)>);
        let mut stmt = conn.prepare_cached(KEY_ROWS).map_err(self.err())?;
        let rows = stmt
            .query_map(params![from, end, now, self.boot_id], |r| {
                let session: Option<i64> = r.get(2)?;
                let left: Option<i64> = r.get(5)?;
                let lock = match (r.get::<_, Option<i64>>(6)?, r.get::<_, Option<i64>>(7)?) {
                    (Some(dev), Some(ino)) => Some((dev, ino)),
                    _ => None,
                };
                let row = KeyRow {
                    key: r.get(0)?,
                    value: r.get(1)?,
                    session,
                    created: r.get(3)?,
                    modified: r.get(4)?,
                    left_ns: left,
                };
                Ok((row, session.map(|_| left), lock))
            })
            .map_err(self.err())?
            .collect::<rusqlite::Result<Vec<Read>>>()
            .map_err(self.err())?;
        let mut live = Vec::with_capacity(rows.len());
        for (row, left, lock) in rows {
            let ended = match (left, row.session) {
                (Some(None), _) => true,
                (_, Some(session)) => self.process(session, lock, tested) == Process::Gone,
                _ => false,
            };
            if !ended {
                live.push(row);
            }
        }
        Ok(live)
    }

    /// What the kernel says of `session`'s process, tested once per
    /// `tested`.
    fn process(&self, session: i64, lock: Option<(i64, i64)>, tested: &mut Tested) -> Process {
        match (&self.liveness, lock) {
            (Some(liveness), Some(lock)) => *tested
                .0
                .entry(session)
                .or_insert_with(|| liveness.probe(session, lock)),
            _ => Process::Untested,
        }
    }

    /// The live key `key`, if any.
    fn live_key(
        &self,
        conn: &Connection,
        key: &str,
        now: i64,
        tested: &mut Tested,
    ) -> Result<Option<KeyRow>> {
        // The keys from `key` up to `key` followed by U+0000: `key` alone.
        let end = Value::Text(format!("{key}\0"));
        Ok(self.key_rows(conn, key, &end, now, tested)?.pop())
    }

    /// Whether `check` holds in `conn` at `now`.
    fn holds(
        &self,
        conn: &Connection,
        check: &Check,
        now: i64,
        tested: &mut Tested,
    ) -> Result<bool> {
        Ok(match check {
            Check::Absent(key) => self.live_key(conn, key, now, tested)?.is_none(),
            Check::Created {
                key,
                revision,
                session,
            } => {
                let session = session.map(session_key).transpose()?;
                self.live_key(conn, key, now, tested)?.is_some_and(|row| {
                    u64::try_from(row.created).ok() == Some(revision.0) && row.session == session
                })
            }
            Check::NoneUnder(prefix) => self
                .key_rows(conn, prefix, &below(prefix), now, tested)?
                .is_empty(),
        })
    }

    /// Fails with [`Error::SessionExpired`] unless every session a put of
    /// `writes` attaches its key to lives at `now`.
    fn sessions_live(&self, conn: &Connection, writes: &[Write], now: i64) -> Result<()> {
        for session in writes.iter().filter_map(Write::session) {
            self.session_alive(conn, session, now)?;
            let (process, _) = self.holder_process(conn, session_key(session)?)?;
            if process == Process::Gone {
                return Err(Error::SessionExpired(session));
            }
        }
        Ok(())
    }

    /// The last revision given, refused if it is no count of commits (set
    /// by hand, or a damaged store): not a whole number, below 0, or the
    /// largest token, after which none is left to give.
    pub(super) fn last_revision(&self, conn: &Connection) -> Result<i64> {
        let last: rusqlite::types::Value = conn
            .query_row("SELECT value FROM revision", [], |r| r.get(0))
            .optional()
            .map_err(self.err())?
            .unwrap_or(rusqlite::types::Value::Null);
        let path = self.path.display();
        match last {
            rusqlite::types::Value::Integer(i64::MAX) => Err(Error::Corrupt(format!(
                "{path}: the revisions (the fencing tokens) are exhausted: the last is the \
                 largest token a store keeps; nothing was written"
            ))),
            rusqlite::types::Value::Integer(last) if last >= 0 => self.not_below_a_key(conn, last),
            other => Err(Error::Corrupt(format!(
                "{path}: the revision counter holds {}, which is no count of grants; nothing \
                 was written",
                stored_value(&other)
            ))),
        }
    }

    /// `last`, unless a key was written at a later revision: a counter set
    /// back by hand (or a damaged store) would give a new key a revision
    /// below a live leader's, and so the lead beside it.
    fn not_below_a_key(&self, conn: &Connection, last: i64) -> Result<i64> {
        let written: Option<i64> = conn
            .query_row("SELECT max(modified) FROM keys", [], |r| r.get(0))
            .map_err(self.err())?;
        match written {
            Some(written) if written > last => Err(Error::Corrupt(format!(
                "{}: the revision counter holds {last}, below revision {written} that a key was \
                 written at: it is no count of grants; nothing was written",
                self.path.display()
            ))),
            _ => Ok(last),
        }
    }

    /// One commit of the primitive (see [`Keys::commit`]).
    pub(super) fn commit_keys(&self, checks: &[Check], writes: &[Write]) -> Result<Committed> {
        self.writing(|tx| self.commit_in(tx, checks, writes))
    }

    /// One commit inside the transaction `tx`, which the caller commits
    /// if it wrote (the second of the pair).
    pub(super) fn commit_in(
        &self,
        tx: &Connection,
        checks: &[Check],
        writes: &[Write],
    ) -> Result<(Committed, bool)> {
        let now = monotonic_ns();
        self.sessions_live(tx, writes, now)?;
        let mut tested = Tested::default();
        for check in checks {
            if !self.holds(tx, check, now, &mut tested)? {
                return Ok((Committed::default(), false));
            }
        }
        let last = self.last_revision(tx)?;
        let next = last + 1;
        let mut changed = false;
        for write in writes {
            changed |= self.write_key(tx, write, next, now, &mut tested)?;
        }
        // The sessions the kernel showed dead end here, with their keys.
        let mut ended = Vec::new();
        for session in tested.found(Process::Gone) {
            ended.extend(self.end_session(tx, session, next)?);
        }
        if !changed && ended.is_empty() {
            let committed = Committed {
                revision: Some(revision(last)),
                ended,
            };
            return Ok((committed, false));
        }
        tx.execute("UPDATE revision SET value = ?1", params![next])
            .map_err(self.err())?;
        let committed = Committed {
            revision: Some(revision(next)),
            ended,
        };
        Ok((committed, true))
    }

    /// One write of a commit at revision `next`; whether it changed a
    /// live key.
    fn write_key(
        &self,
        tx: &Connection,
        write: &Write,
        next: i64,
        now: i64,
        tested: &mut Tested,
    ) -> Result<bool> {
        let live = self.live_key(tx, write.key(), now, tested)?;
        match write {
            Write::Put {
                key,
                value,
                session,
            } => {
                let session = session.map(session_key).transpose()?;
                let created = live.map_or(next, |row| row.created);
                tx.execute(
                    "INSERT OR REPLACE INTO keys (key, value, session, created, modified)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![key, value, session, created, next],
                )
                .map_err(self.err())?;
                Ok(true)
            }
            Write::Delete(key) => {
                tx.execute("DELETE FROM keys WHERE key = ?1", params![key])
                    .map_err(self.err())?;
                if live.is_some() {
                    self.deleted(tx, key, next)?;
                }
                Ok(live.is_some())
            }
        }
    }

    /// Records that `key` was deleted at revision `at`.
    fn deleted(&self, tx: &Connection, key: &str, at: i64) -> Result<()> {
        tx.execute(
            "INSERT OR REPLACE INTO deletions (key, revision) VALUES (?1, ?2)",
            params![key, at],
        )
        .map_err(self.err())?;
        Ok(())
    }

    /// Ends those of `sessions` whose processes the kernel says are gone,
    /// in one commit; returns their keys.
    pub(super) fn end_dead_sessions(&self, sessions: &[i64]) -> Result<Vec<String>> {
        self.writing(|tx| {
            let next = self.last_revision(tx)? + 1;
            let mut ended = Vec::new();
            for &session in sessions {
                if self.holder_process(tx, session)?.0 == Process::Gone {
                    ended.extend(self.end_session(tx, session, next)?);
                }
            }
            if !ended.is_empty() {
                tx.execute("UPDATE revision SET value = ?1", params![next])
                    .map_err(self.err())?;
            }
            let wrote = !ended.is_empty();
            Ok((ended, wrote))
        })
    }

    /// Ends `session` in the transaction `tx`: its row, its lock's record
    /// and its keys, deleted at revision `at`; returns the keys.
    pub(super) fn end_session(
        &self,
        tx: &Connection,
        session: i64,
        at: i64,
    ) -> Result<Vec<String>> {
        let keys = {
            let mut stmt = tx
                .prepare_cached("SELECT key FROM keys WHERE session = ?1")
                .map_err(self.err())?;
            stmt.query_map(params![session], |r| r.get::<_, String>(0))
                .map_err(self.err())?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(self.err())?
        };
        for key in &keys {
            self.deleted(tx, key, at)?;
        }
        tx.execute("DELETE FROM keys WHERE session = ?1", params![session])
            .map_err(self.err())?;
        tx.execute("DELETE FROM sessions WHERE id = ?1", params![session])
            .map_err(self.err())?;
        tx.execute(
            "DELETE FROM session_locks WHERE session = ?1",
            params![session],
        )
        .map_err(self.err())?;
        Ok(keys)
    }

    /// The live keys under `prefix`, as of one revision (read in the
    /// transaction `tx`), and what the kernel said of their sessions'
    /// processes.
    pub(super) fn range_in(&self, tx: &Connection, prefix: &str) -> Result<(Range, Tested)> {
        let revision_now = tx
            .query_row(
                // A counter that is no number (see `last_revision`) reads as
                // 0: the keys are read all the same.
                "SELECT CASE typeof(value) WHEN 'integer' THEN value ELSE 0 END FROM revision",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map_err(self.err())?;
        let mut tested = Tested::default();
        let rows = self.key_rows(tx, prefix, &below(prefix), monotonic_ns(), &mut tested)?;
        let range = Range {
            entries: rows.into_iter().map(KeyRow::entry).collect(),
            revision: revision(revision_now),
        };
        Ok((range, tested))
    }
}

#[async_trait]
impl Keys for SqliteKeys {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        let ttl = TTL.check(ttl)?;
        self.inner.watch_files();
        // Read before the request: the store's deadline is no earlier.
        let sent = Instant::now();
        let lease = self.inner.blocking(move |db| db.open_session(ttl)).await?;
        self.inner.renewed.set(lease.id, Some(sent + lease.ttl));
        Ok(lease)
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        let sent = Instant::now();
        let renewed = self.inner.renew(session).await;
        let deadline = renewed.as_ref().ok().map(|left| sent + *left);
        self.inner.renewed.set(session, deadline);
        renewed
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        self.inner.renewed.set(session, None);
        let ended = self
            .inner
            .blocking(move |db| db.close_session(session))
            .await?;
        self.inner.follows.wrote(ended.iter().map(String::as_str));
        Ok(())
    }

    async fn commit(&self, checks: &[Check], writes: &[Write]) -> Result<Option<Revision>> {
        let committed = self
            .inner
            .commit_queued(checks.to_vec(), writes.to_vec())
            .await?;
        log_ended(&committed.ended);
        let written = writes.iter().map(Write::key);
        self.inner
            .follows
            .wrote(written.chain(committed.ended.iter().map(String::as_str)));
        Ok(committed.revision)
    }

    async fn range(&self, prefix: &str) -> Result<Range> {
        let prefix = prefix.to_owned();
        let (range, _) = self
            .inner
            .read(move |db, tx| db.range_in(tx, &prefix))
            .await?;
        Ok(range)
    }

    /// One task per handle follows every prefix its watches watch (see
    /// `following`): a watch of a prefix already followed shares its
    /// entry, and is told at once if a change after `from` was told.
    async fn watch(&self, prefix: &str, from: Revision) -> Result<KeyWatch> {
        self.inner.watch_files();
        Ok(self.follow(prefix, from))
    }

    /// Resolves as soon as the database file is deleted, moved or replaced
    /// (inotify on its folder): every session in it has ended for this
    /// process, whose leaders must step down at once rather than at the
    /// next renewal (which would fail with [`Error::SessionExpired`]).
    async fn session_ended(&self, _session: SessionId) {
        self.inner.watch_files();
        self.inner.db.replaced.cancelled().await;
    }

    /// A descriptor of the open file description that carries this
    /// process's session locks on the database's notify file (see the
    /// module's documentation); `None` when the kernel's test is not in use
    /// (read-only, no usable notify file, a filesystem not known to be
    /// local).
    fn session_lock_file(&self) -> Option<File> {
        self.inner.db.liveness.as_ref()?.lock_file()
    }

    /// Its watches tell expiries; its clock is `CLOCK_MONOTONIC`, which
    /// tokio's timer (the default clock) follows.
    fn properties(&self) -> Properties {
        Properties {
            tells_expiries: true,
            grants_from: Some(self.inner.db.opened + FIRST_USE_WAIT),
            ..Properties::default()
        }
    }
}
