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

use std::collections::BTreeMap;

use super::*;
use crate::store::keys::{Check, Entry, Heard, KeyWatch, Keys, Range, Revision, Write, prefix_end};

/// The store primitive on a SQLite database: another handle onto the same
/// connection, sessions and file checks as the [`SqliteStore`] it came
/// from ([`SqliteStore::keys`]).
#[derive(Clone, Debug)]
pub struct SqliteKeys {
    inner: Arc<Inner>,
}

impl SqliteStore {
    /// The store primitive on this handle's database.
    pub fn keys(&self) -> SqliteKeys {
        SqliteKeys {
            inner: Arc::clone(&self.inner),
        }
    }
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

fn revision(stored: i64) -> Revision {
    Revision(u64::try_from(stored).unwrap_or(0))
}

/// The keys from `?1` up to `?2` (none: to the end), with their sessions'
/// time left at `?3` under boot `?4` (NULL: ended, or none) and the
/// sessions' locks.
const KEY_ROWS: &str = "
SELECT k.key, k.value, k.session, k.created, k.modified, s.expires_at_ns - ?3, l.dev, l.ino
FROM keys k
LEFT JOIN sessions s ON s.id = k.session AND s.boot_id = ?4 AND s.expires_at_ns > ?3
LEFT JOIN session_locks l ON l.session = k.session
WHERE k.key >= ?1 AND (?2 IS NULL OR k.key < ?2)
ORDER BY k.key";

/// What the kernel said of the sessions read by one statement or
/// transaction: each is tested once.
#[derive(Default)]
struct Tested(BTreeMap<i64, Process>);

impl Db {
    /// The live keys from `from` up to `end` at monotonic time `now`,
    /// with the sessions among them the kernel says are alive.
    fn key_rows(
        &self,
        conn: &Connection,
        from: &str,
        end: Option<&str>,
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
        let end = format!("{key}\0");
        Ok(self.key_rows(conn, key, Some(&end), now, tested)?.pop())
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
                .key_rows(conn, prefix, prefix_end(prefix).as_deref(), now, tested)?
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

    /// The last revision given, refused if it is no count of commits.
    fn last_revision(&self, conn: &Connection) -> Result<i64> {
        let last: i64 = conn
            .query_row("SELECT value FROM revision", [], |r| r.get(0))
            .map_err(self.err())?;
        let path = self.path.display();
        if last < 0 {
            return Err(Error::Corrupt(format!(
                "{path}: the revision counter holds {last}, which is no count of grants; \
                 nothing was written"
            )));
        }
        if last == i64::MAX {
            return Err(Error::Corrupt(format!(
                "{path}: the revisions (the fencing tokens) are exhausted: the last is the \
                 largest token a store keeps; nothing was written"
            )));
        }
        Ok(last)
    }

    /// One commit of the primitive (see [`Keys::commit`]).
    pub(super) fn commit_keys(
        &self,
        checks: &[Check],
        writes: &[Write],
    ) -> Result<Option<Revision>> {
        self.writable()?;
        let mut conn = self.conn();
        self.usable(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let now = monotonic_ns();
        self.sessions_live(&tx, writes, now)?;
        let mut tested = Tested::default();
        for check in checks {
            if !self.holds(&tx, check, now, &mut tested)? {
                return Ok(None);
            }
        }
        let last = self.last_revision(&tx)?;
        let next = last + 1;
        let mut changed = false;
        for write in writes {
            changed |= self.write_key(&tx, write, next, now, &mut tested)?;
        }
        if !changed {
            return Ok(Some(revision(last)));
        }
        tx.execute("UPDATE revision SET value = ?1", params![next])
            .map_err(self.err())?;
        self.usable(&tx)?;
        tx.commit().map_err(self.err())?;
        self.announce();
        Ok(Some(revision(next)))
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

    /// Deletes the keys of `session`, which the transaction `tx` ends, at
    /// the next revision if it had any.
    pub(super) fn end_keys_of(&self, tx: &Connection, session: i64) -> Result<()> {
        let keys = {
            let mut stmt = tx
                .prepare_cached("SELECT key FROM keys WHERE session = ?1")
                .map_err(self.err())?;
            stmt.query_map(params![session], |r| r.get::<_, String>(0))
                .map_err(self.err())?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(self.err())?
        };
        if keys.is_empty() {
            return Ok(());
        }
        let next = self.last_revision(tx)? + 1;
        for key in &keys {
            self.deleted(tx, key, next)?;
        }
        tx.execute("DELETE FROM keys WHERE session = ?1", params![session])
            .map_err(self.err())?;
        tx.execute("UPDATE revision SET value = ?1", params![next])
            .map_err(self.err())?;
        Ok(())
    }

    /// The live keys under `prefix`, as of one revision, and the sessions
    /// among them whose processes the kernel said are alive.
    fn range_keys(&self, prefix: &str) -> Result<(Range, Vec<i64>)> {
        let mut conn = self.conn();
        self.usable(&conn)?;
        // One read transaction: the keys and the revision agree.
        let tx = conn.transaction().map_err(self.err())?;
        let revision_now = tx
            .query_row("SELECT value FROM revision", [], |r| r.get::<_, i64>(0))
            .map_err(self.err())?;
        let mut tested = Tested::default();
        let end = prefix_end(prefix);
        let rows = self.key_rows(&tx, prefix, end.as_deref(), monotonic_ns(), &mut tested)?;
        let alive = tested
            .0
            .into_iter()
            .filter_map(|(session, process)| (process == Process::Alive).then_some(session))
            .collect();
        let range = Range {
            entries: rows.into_iter().map(KeyRow::entry).collect(),
            revision: revision(revision_now),
        };
        Ok((range, alive))
    }

    /// The last revision at which a key under `prefix` was written or
    /// deleted (a session's end by its TTL or its process's death is not
    /// one), and the sessions of the live keys under it.
    fn last_change(&self, prefix: &str) -> Result<(Revision, Vec<i64>)> {
        let (range, alive) = self.range_keys(prefix)?;
        let conn = self.conn();
        let end = prefix_end(prefix);
        let deleted: Option<i64> = conn
            .query_row(
                "SELECT max(revision) FROM deletions WHERE key >= ?1 AND (?2 IS NULL OR key < ?2)",
                params![prefix, end],
                |r| r.get(0),
            )
            .map_err(self.err())?;
        let written = range.entries.iter().map(|e| e.modified).max();
        let last = written.max(deleted.map(revision)).unwrap_or_default();
        let mut sessions: Vec<i64> = range
            .entries
            .iter()
            .filter_map(|e| session_key(e.session?).ok())
            .collect();
        sessions.sort_unstable();
        sessions.dedup();
        // The kernel watches those it found alive; the others end by TTL.
        sessions.retain(|s| alive.contains(s));
        Ok((last, sessions))
    }
}

impl SqliteKeys {
    /// Wakes this handle's watches once `session`'s process dies.
    fn watch_death(&self, session: i64) {
        if let Some(liveness) = &self.inner.db.liveness {
            liveness.watch(session, Arc::downgrade(self.inner.changes.all()));
        }
    }

    /// Tells `tx` what changes under `prefix` after `from`, until nobody
    /// holds its receiver.
    async fn follow(self, prefix: String, from: Revision, tx: watch::Sender<Heard>) {
        let mut wake = self.inner.changes.all().subscribe();
        let (mut told, mut watched, mut unknown) = (from, Vec::new(), false);
        loop {
            wake.mark_unchanged();
            let p = prefix.clone();
            match self.inner.blocking(move |db| db.last_change(&p)).await {
                Ok((last, sessions)) => {
                    let died = watched.iter().any(|s| !sessions.contains(s));
                    for &session in sessions.iter().filter(|s| !watched.contains(s)) {
                        self.watch_death(session);
                    }
                    if last > told || died || unknown {
                        told = told.max(last);
                        tx.send_replace(Heard::Changed(told));
                    }
                    (watched, unknown) = (sessions, false);
                }
                Err(error) => {
                    tx.send_replace(Heard::Unknown {
                        error: error.to_string(),
                    });
                    unknown = true;
                }
            }
            let retry = if unknown {
                Box::pin(tokio::time::sleep(UNKNOWN_RETRY))
                    as Pin<Box<dyn Future<Output = ()> + Send>>
            } else {
                Box::pin(std::future::pending())
            };
            tokio::select! {
                changed = wake.changed() => if changed.is_err() { return },
                () = retry => {}
                () = tx.closed() => return,
            }
        }
    }
}

/// How soon a watch that could not read tries again.
const UNKNOWN_RETRY: Duration = Duration::from_millis(250);

#[async_trait]
impl Keys for SqliteKeys {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        SqliteStore::from(self).open_session(ttl).await
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        SqliteStore::from(self).keep_alive(session).await
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        SqliteStore::from(self).close_session(session).await
    }

    async fn commit(&self, checks: &[Check], writes: &[Write]) -> Result<Option<Revision>> {
        let (checks, writes) = (checks.to_vec(), writes.to_vec());
        let committed = self
            .inner
            .blocking(move |db| db.commit_keys(&checks, &writes))
            .await?;
        self.inner.changes.everything();
        Ok(committed)
    }

    async fn range(&self, prefix: &str) -> Result<Range> {
        let prefix = prefix.to_owned();
        let (range, _) = self
            .inner
            .blocking(move |db| db.range_keys(&prefix))
            .await?;
        Ok(range)
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<KeyWatch> {
        self.inner.watch_files();
        let (tx, rx) = watch::channel(Heard::Changed(from));
        tokio::spawn(self.clone().follow(prefix.to_owned(), from, tx));
        Ok(rx)
    }

    async fn session_ended(&self, session: SessionId) {
        SqliteStore::from(self).session_ended(session).await;
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        // The database's clock is CLOCK_MONOTONIC, which tokio's timer follows.
        Box::pin(tokio::time::sleep(duration))
    }
}

impl From<&SqliteKeys> for SqliteStore {
    fn from(keys: &SqliteKeys) -> Self {
        SqliteStore {
            inner: Arc::clone(&keys.inner),
        }
    }
}
