//! Sessions: opening, renewing (the renewals asked for at once in one
//! transaction) and closing them, and what the kernel says of their
//! processes.

use super::*;

impl Db {
    /// Fails with [`Error::SessionExpired`] unless `session` lives at
    /// monotonic time `now`.
    pub(super) fn session_alive(
        &self,
        conn: &Connection,
        session: SessionId,
        now: i64,
    ) -> Result<()> {
        let alive = conn
            .query_row(
                "SELECT 1 FROM sessions WHERE id = ?1 AND boot_id = ?2 AND expires_at_ns > ?3",
                params![session_key(session)?, self.boot_id, now],
                |_| Ok(()),
            )
            .optional()
            .map_err(self.err())?;
        alive.ok_or(Error::SessionExpired(session))
    }

    pub(super) fn open_session(&self, ttl: CheckedTtl) -> Result<SessionLease> {
        let (granted, ttl_ms) = (ttl.ttl, ttl.units);
        self.writable()?;
        let mut conn = self.conn();
        self.usable(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let now = monotonic_ns();
        liveness::Liveness::let_expired_go(now);
        // Sessions of an earlier boot or past their expiry can never come
        // back; dropping them keeps the table small. Their keys are dead
        // already (reads join on live sessions).
        tx.execute(
            "DELETE FROM sessions WHERE boot_id <> ?1 OR expires_at_ns <= ?2",
            params![self.boot_id, now],
        )
        .map_err(self.err())?;
        tx.execute_batch(
            "DELETE FROM session_locks WHERE session NOT IN (SELECT id FROM sessions);
             DELETE FROM keys WHERE session IS NOT NULL AND session NOT IN (SELECT id FROM sessions);",
        )
        .map_err(self.err())?;
        let expires_at_ns = now.saturating_add(nanos(granted));
        let id: i64 = tx
            .query_row(
                "INSERT INTO sessions (boot_id, expires_at_ns, ttl_ms, pid) VALUES (?1, ?2, ?3, ?4)
                 RETURNING id",
                params![self.boot_id, expires_at_ns, ttl_ms, std::process::id()],
                |r| r.get(0),
            )
            .map_err(self.err())?;
        // The lock is taken before the row commits, so that whoever reads
        // the row knows the lock was held; dropped (let go) if the commit
        // does not happen.
        let lock = self.liveness.as_ref().and_then(|l| Some((l, l.lock(id)?)));
        if let Some((liveness, _)) = &lock {
            let (dev, ino) = liveness.stored_key();
            tx.execute(
                "INSERT INTO session_locks (session, dev, ino) VALUES (?1, ?2, ?3)",
                params![id, dev, ino],
            )
            .map_err(self.err())?;
        }
        self.usable(&tx)?;
        tx.commit().map_err(self.err())?;
        if let Some((liveness, taken)) = lock {
            liveness.keep(taken, expires_at_ns);
        }
        Ok(SessionLease {
            id: SessionId::from_stored(id),
            ttl: granted,
        })
    }

    /// Renewals of `sessions` in one transaction (one synced commit for
    /// all of them), each result in the order asked. Once the file was
    /// replaced a session is gone with it ([`Error::SessionExpired`]), so
    /// that its leaders step down at once.
    pub(super) fn keep_alive(&self, sessions: &[SessionId]) -> Vec<Result<Duration>> {
        match self.renew_all(sessions) {
            Ok(rows) => rows
                .into_iter()
                .zip(sessions)
                .map(|(ttl_ms, &session)| match ttl_ms {
                    Some(ms) => Ok(Duration::from_millis(ms.unsigned_abs())),
                    None => {
                        // Gone or past its expiry, which the shared monotonic
                        // clock never takes back: no one will test its lock
                        // again.
                        self.release_lock(session);
                        Err(Error::SessionExpired(session))
                    }
                })
                .collect(),
            Err(error) => match sessions {
                [session] => vec![Err(renewal_error(error, *session))],
                _ => sessions
                    .iter()
                    .map(|&session| Err(renewal_error(shared_error(&error), session)))
                    .collect(),
            },
        }
    }

    /// The granted TTL of each session renewed, `None` for one that is
    /// gone or past its expiry.
    pub(super) fn renew_all(&self, sessions: &[SessionId]) -> Result<Vec<Option<i64>>> {
        self.writable()?;
        let mut conn = self.conn_for_renewal();
        self.usable(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let now = monotonic_ns();
        let mut rows = Vec::with_capacity(sessions.len());
        {
            let mut update = tx
                .prepare_cached(
                    "UPDATE sessions SET expires_at_ns = ?3 + ttl_ms * 1000000
                     WHERE id = ?1 AND boot_id = ?2 AND expires_at_ns > ?3
                     RETURNING ttl_ms, expires_at_ns",
                )
                .map_err(self.err())?;
            for &session in sessions {
                // An id SQLite never issued names no session.
                let Ok(key) = session_key(session) else {
                    rows.push(None);
                    continue;
                };
                let renewed: Option<(i64, i64)> = update
                    .query_row(params![key, self.boot_id, now], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .optional()
                    .map_err(self.err())?;
                // Before the commit: the lock must outlast the row's new
                // expiry.
                if let Some((_, expires_at_ns)) = renewed {
                    liveness::Liveness::renewed(key, expires_at_ns);
                }
                rows.push(renewed.map(|(ttl_ms, _)| ttl_ms));
            }
        }
        self.usable(&tx)?;
        tx.commit().map_err(self.err())?;
        Ok(rows)
    }

    /// Ends `session` and returns the keys that ended with it. Closing a
    /// session of a replaced file is not an error: the file that holds it
    /// is no longer the store, and nothing is written to it.
    pub(super) fn close_session(&self, session: SessionId) -> Result<Vec<String>> {
        self.writable()?;
        // An id SQLite never issued names no session.
        let Ok(key) = session_key(session) else {
            return Ok(Vec::new());
        };
        let mut conn = self.conn();
        if let Err(Error::Replaced(_)) = self.usable(&conn) {
            return Ok(Vec::new());
        }
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let has_keys: bool = tx
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM keys WHERE session = ?1)",
                params![key],
                |r| r.get(0),
            )
            .map_err(self.err())?;
        // Deleting keys is a commit: the next revision (a counter that is
        // no count refuses it); a session without keys needs none.
        let next = if has_keys {
            self.last_revision(&tx)? + 1
        } else {
            0
        };
        let ended = self.end_session(&tx, key, next)?;
        if has_keys {
            tx.execute("UPDATE revision SET value = ?1", params![next])
                .map_err(self.err())?;
        }
        if let Err(Error::Replaced(_)) = self.usable(&tx) {
            return Ok(Vec::new());
        }
        tx.commit().map_err(self.err())?;
        // Only now that no one can read the row: a lock let go while the
        // row is there means the process is gone.
        self.release_lock(session);
        self.announce();
        Ok(ended)
    }

    /// What the kernel says of `session`'s process (see `liveness`), and
    /// the pid its row records.
    pub(super) fn holder_process(&self, conn: &Connection, session: i64) -> Result<(Process, i64)> {
        let Some(liveness) = &self.liveness else {
            return Ok((Process::Untested, 0));
        };
        let recorded = conn
            .query_row(
                "SELECT l.dev, l.ino, s.pid FROM session_locks l JOIN sessions s ON s.id = l.session
                 WHERE l.session = ?1",
                params![session],
                |r| Ok(((r.get(0)?, r.get(1)?), r.get(2)?)),
            )
            .optional()
            .map_err(self.err())?;
        Ok(match recorded {
            Some((file, pid)) => (liveness.probe(session, file), pid),
            None => (Process::Untested, 0),
        })
    }

    /// Lets go of `session`'s lock, if this handle holds it.
    pub(super) fn release_lock(&self, session: SessionId) {
        if let (Some(liveness), Ok(key)) = (&self.liveness, session_key(session)) {
            liveness.release(key);
        }
    }
}

/// A renewal waiting, and where its outcome goes.
pub(super) type Renewal = (SessionId, tokio::sync::oneshot::Sender<Result<Duration>>);

/// Renewals waiting for the renewal thread.
pub(super) type RenewalQueue = batches::Batches<Renewal>;

/// The renewal thread: renews, in one transaction, every renewal waiting,
/// until none is; then it ends (the next renewal starts another).
pub(super) fn renew_while_asked(db: &Db, queue: &Mutex<RenewalQueue>) {
    batches::drain(queue, usize::MAX, |batch| {
        let sessions: Vec<SessionId> = batch.iter().map(|(session, _)| *session).collect();
        for ((_, waiter), renewed) in batch.into_iter().zip(db.keep_alive(&sessions)) {
            let _ = waiter.send(renewed);
        }
    });
}

/// A renewal that failed because the file was replaced ends the session:
/// the file that held it is no longer the store.
pub(super) fn renewal_error(error: Error, session: SessionId) -> Error {
    match error {
        Error::Replaced(_) => Error::SessionExpired(session),
        other => other,
    }
}
