//! Notes, and what is read without a grant: the leader, the last release
//! and the list of elections.

use super::*;

/// A note's row, as read with its session: session, name, order, text,
/// nanoseconds its session has left, and its session's lock (device and
/// inode), if it has one.
type NoteRow = (i64, String, i64, String, i64, Option<(i64, i64)>);

impl Db {
    pub(super) fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        crate::store::check_note(name, text)?;
        self.writable()?;
        let mut conn = self.conn();
        self.usable(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        self.session_alive(&tx, session, monotonic_ns())?;
        tx.execute(
            "INSERT INTO notes (election, session, name, text) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (election, session, name) DO UPDATE SET text = excluded.text",
            params![election.as_str(), session_key(session)?, name, text],
        )
        .map_err(self.err())?;
        self.usable(&tx)?;
        tx.commit().map_err(self.err())?;
        self.announce();
        Ok(())
    }

    pub(super) fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        crate::store::check_note(name, text)?;
        self.writable()?;
        let Ok(key) = session_key(session) else {
            return Ok(false);
        };
        let mut conn = self.conn();
        self.usable(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let amended = tx
            .execute(
                "UPDATE notes SET text = ?4
                 WHERE election = ?1 AND session = ?2 AND name = ?3 AND EXISTS (
                     SELECT 1 FROM sessions s
                     WHERE s.id = ?2 AND s.boot_id = ?5 AND s.expires_at_ns > ?6)",
                params![
                    election.as_str(),
                    key,
                    name,
                    text,
                    self.boot_id,
                    monotonic_ns()
                ],
            )
            .map_err(self.err())?;
        self.usable(&tx)?;
        tx.commit().map_err(self.err())?;
        if amended > 0 {
            self.announce();
        }
        Ok(amended > 0)
    }

    pub(super) fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        self.writable()?;
        let Ok(key) = session_key(session) else {
            return Ok(());
        };
        let mut conn = self.conn();
        self.usable(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let deleted = tx
            .execute(
                "DELETE FROM notes WHERE election = ?1 AND session = ?2 AND name = ?3",
                params![election.as_str(), key, name],
            )
            .map_err(self.err())?;
        self.usable(&tx)?;
        tx.commit().map_err(self.err())?;
        if deleted > 0 {
            self.announce();
        }
        Ok(())
    }

    /// The live notes on `election`, and how long until the first session
    /// keeping one of them expires.
    /// The live notes on `election` (only `session`'s note `name` with
    /// `only`), how long until the first session keeping one expires, and
    /// the sessions the kernel said are alive (see `liveness`): a note of
    /// a session whose process the kernel saw die is not live, so that a
    /// waiter killed in line leaves it at once, not at its TTL.
    pub(super) fn notes(
        &self,
        election: &ElectionName,
        only: Option<&local::NoteKey>,
    ) -> Result<(Vec<Note>, Option<Duration>, Vec<i64>)> {
        let conn = self.conn();
        self.usable(&conn)?;
        let now = monotonic_ns();
        let mut stmt = conn
            .prepare_cached(
                "SELECT n.session, n.name, n.id, n.text, s.expires_at_ns - ?2, l.dev, l.ino
                 FROM notes n JOIN sessions s ON s.id = n.session
                      LEFT JOIN session_locks l ON l.session = n.session
                 WHERE n.election = ?1 AND s.boot_id = ?3 AND s.expires_at_ns > ?2
                   AND (?4 IS NULL OR (n.session = ?4 AND n.name = ?5))
                 ORDER BY n.id",
            )
            .map_err(self.err())?;
        let (session, name) = match only {
            Some((session, name)) => (Some(session_key(*session)?), Some(name.as_str())),
            None => (None, None),
        };
        let rows = stmt
            .query_map(
                params![election.as_str(), now, self.boot_id, session, name],
                |r| {
                    let lock = match (r.get::<_, Option<i64>>(5)?, r.get::<_, Option<i64>>(6)?) {
                        (Some(dev), Some(ino)) => Some((dev, ino)),
                        _ => None,
                    };
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, i64>(4)?,
                        lock,
                    ))
                },
            )
            .map_err(self.err())?
            .collect::<rusqlite::Result<Vec<NoteRow>>>()
            .map_err(self.err())?;
        Ok(self.live_notes(rows))
    }

    /// The notes of `rows` whose sessions' processes are not known gone,
    /// the time until the first of them expires, and the sessions whose
    /// processes were found alive.
    fn live_notes(&self, rows: Vec<NoteRow>) -> (Vec<Note>, Option<Duration>, Vec<i64>) {
        let mut tested: std::collections::BTreeMap<i64, Process> = Default::default();
        let mut alive = Vec::new();
        let mut notes = Vec::with_capacity(rows.len());
        let mut first_expiry: Option<i64> = None;
        for (session, name, id, text, left, lock) in rows {
            let process = match (&self.liveness, lock) {
                (Some(liveness), Some(lock)) => *tested
                    .entry(session)
                    .or_insert_with(|| liveness.probe(session, lock)),
                _ => Process::Untested,
            };
            match process {
                Process::Gone => continue,
                Process::Alive if !alive.contains(&session) => alive.push(session),
                _ => {}
            }
            first_expiry = Some(first_expiry.map_or(left, |f| f.min(left)));
            notes.push(Note {
                session: SessionId::from_stored(session),
                name,
                order: id.unsigned_abs(),
                text,
            });
        }
        (notes, first_expiry.map(duration_ns), alive)
    }

    pub(super) fn last_release(&self, election: &ElectionName) -> Result<Option<FencingToken>> {
        let conn = self.conn();
        self.usable(&conn)?;
        let token = conn
            .query_row(
                "SELECT token FROM releases WHERE election = ?1",
                params![election.as_str()],
                |r| r.get::<_, i64>(0),
            )
            .optional()
            .map_err(self.err())?;
        Ok(token.map(FencingToken::from_stored))
    }

    pub(super) fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        let conn = self.conn();
        self.usable(&conn)?;
        let holder = self
            .live_holder(&conn, election.as_str(), monotonic_ns())
            .map_err(self.err())?;
        holder.map(|h| h.into_leader(&self.path)).transpose()
    }

    pub(super) fn elections(&self) -> Result<Vec<ElectionState>> {
        let conn = self.conn();
        self.usable(&conn)?;
        let now = monotonic_ns();
        let mut stmt = conn
            .prepare("SELECT name FROM elections ORDER BY name")
            .map_err(self.err())?;
        let names = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(self.err())?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(self.err())?;
        names
            .into_iter()
            .map(|name| {
                let leader = self
                    .live_holder(&conn, &name, now)
                    .map_err(self.err())?
                    .map(|h| h.into_leader(&self.path))
                    .transpose()?;
                let election = ElectionName::new(name).map_err(|e| {
                    Error::Corrupt(format!(
                        "{}: stored election name: {e}",
                        self.path.display()
                    ))
                })?;
                Ok(ElectionState { election, leader })
            })
            .collect()
    }
}
