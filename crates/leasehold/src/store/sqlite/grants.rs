//! Sessions and grants: opening, renewing and closing sessions, the
//! acquisition attempts (batched into shared transactions), and release.

use super::*;

/// One acquisition attempt's outcome, as [`Db::try_acquire`] gives it.
pub(super) struct Tried {
    pub(super) attempt: Attempt,
    /// Whether the attempt made the grant.
    pub(super) fresh: bool,
    /// The holder session, when the kernel says its process is there: wait
    /// for its lock to go (see `liveness`).
    pub(super) watch: Option<i64>,
}

impl Tried {
    pub(super) fn existing(attempt: Attempt) -> Self {
        Tried {
            attempt,
            fresh: false,
            watch: None,
        }
    }
}

/// Attempts waiting to be made (see [`Db::attempt_queued`]).
#[derive(Default)]
pub(super) struct AttemptQueue {
    pub(super) waiting: Vec<QueuedAttempt>,
    /// Whether a thread is making the waiting attempts; it takes new ones
    /// until none is left.
    pub(super) running: bool,
}

impl std::fmt::Debug for AttemptQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttemptQueue")
            .field("waiting", &self.waiting.len())
            .field("running", &self.running)
            .finish()
    }
}

/// One campaign's attempt, and where its outcome goes.
pub(super) struct QueuedAttempt {
    pub(super) session: SessionId,
    pub(super) election: ElectionName,
    pub(super) candidate: CandidateId,
    /// Only if nobody holds or waits (see `Db::attempt`).
    pub(super) unwaited: bool,
    pub(super) outcome: tokio::sync::oneshot::Sender<Result<Tried>>,
}

/// At most this many attempts share a transaction.
pub(super) const ATTEMPTS_PER_TRANSACTION: usize = 256;

/// A live holder as read from the database.
pub(super) struct Holder {
    pub(super) candidate: String,
    pub(super) token: i64,
    pub(super) expires_in_ns: i64,
    pub(super) session: i64,
}

impl Db {
    pub(super) fn live_holder(
        &self,
        conn: &Connection,
        election: &str,
        now: i64,
    ) -> rusqlite::Result<Option<Holder>> {
        conn.query_row(LIVE_HOLDER, params![election, now, self.boot_id], |r| {
            Ok(Holder {
                candidate: r.get(0)?,
                token: r.get(1)?,
                expires_in_ns: r.get(2)?,
                session: r.get(3)?,
            })
        })
        .optional()
    }

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
        // back; dropping them keeps the table small. Their grants are dead
        // already (the holder query joins on live sessions).
        tx.execute(
            "DELETE FROM sessions WHERE boot_id <> ?1 OR expires_at_ns <= ?2",
            params![self.boot_id, now],
        )
        .map_err(self.err())?;
        tx.execute_batch(
            "DELETE FROM session_locks WHERE session NOT IN (SELECT id FROM sessions);
             DELETE FROM notes WHERE session NOT IN (SELECT id FROM sessions);
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

    /// Closing a session of a replaced file is not an error: the file that
    /// holds it is no longer the store, and nothing is written to it.
    pub(super) fn close_session(&self, session: SessionId) -> Result<()> {
        self.writable()?;
        // An id SQLite never issued names no session.
        let Ok(key) = session_key(session) else {
            return Ok(());
        };
        let mut conn = self.conn();
        if let Err(Error::Replaced(_)) = self.usable(&conn) {
            return Ok(());
        }
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        tx.execute(
            "UPDATE elections SET holder_session = NULL, holder_candidate = NULL, holder_token = NULL
             WHERE holder_session = ?1",
            params![key],
        )
        .map_err(self.err())?;
        tx.execute("DELETE FROM sessions WHERE id = ?1", params![key])
            .map_err(self.err())?;
        tx.execute("DELETE FROM session_locks WHERE session = ?1", params![key])
            .map_err(self.err())?;
        tx.execute("DELETE FROM notes WHERE session = ?1", params![key])
            .map_err(self.err())?;
        self.end_keys_of(&tx, key)?;
        if let Err(Error::Replaced(_)) = self.usable(&tx) {
            return Ok(());
        }
        tx.commit().map_err(self.err())?;
        // Only now that no one can read the row: a lock let go while the
        // row is there means the process is gone.
        self.release_lock(session);
        self.announce();
        Ok(())
    }

    /// Queues an acquisition attempt; the first attempt queued while no
    /// thread makes them starts one, which makes every attempt waiting
    /// (up to [`ATTEMPTS_PER_TRANSACTION`] at a time) in one transaction,
    /// so that campaigns made at once share one synced commit. Resolves
    /// with the attempt's outcome.
    pub(super) fn attempt_queued(
        self: &Arc<Self>,
        session: SessionId,
        election: ElectionName,
        candidate: CandidateId,
        unwaited: bool,
    ) -> tokio::sync::oneshot::Receiver<Result<Tried>> {
        let (outcome, received) = tokio::sync::oneshot::channel();
        let start = {
            let mut queue = self.attempts.lock().unwrap_or_else(|p| p.into_inner());
            queue.waiting.push(QueuedAttempt {
                session,
                election,
                candidate,
                unwaited,
                outcome,
            });
            !std::mem::replace(&mut queue.running, true)
        };
        if start {
            let db = Arc::clone(self);
            tokio::task::spawn_blocking(move || db.make_queued_attempts());
        }
        received
    }

    /// Makes the queued attempts until none is left.
    pub(super) fn make_queued_attempts(&self) {
        /// Should an attempt panic, the next one queued starts a thread
        /// again (the panicking batch's campaigns fail: their outcomes'
        /// senders are dropped).
        struct Stopped<'a>(&'a Mutex<AttemptQueue>);
        impl Drop for Stopped<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.lock().unwrap_or_else(|p| p.into_inner()).running = false;
                }
            }
        }
        let _stopped = Stopped(&self.attempts);
        loop {
            let batch: Vec<QueuedAttempt> = {
                let mut queue = self.attempts.lock().unwrap_or_else(|p| p.into_inner());
                if queue.waiting.is_empty() {
                    queue.running = false;
                    return;
                }
                let n = queue.waiting.len().min(ATTEMPTS_PER_TRANSACTION);
                queue.waiting.drain(..n).collect()
            };
            let outcomes = if batch.len() == 1 {
                vec![self.try_acquire(&batch[0])]
            } else {
                // A failure of the shared transaction committed nothing:
                // each attempt is then made alone, and fails (or not) alone.
                self.try_acquire_together(&batch)
                    .unwrap_or_else(|_| batch.iter().map(|a| self.try_acquire(a)).collect())
            };
            for (attempt, outcome) in batch.into_iter().zip(outcomes) {
                // A campaign gone meanwhile: its receiver's owner releases
                // what it was granted (see `Inner::try_acquire`).
                let _ = attempt.outcome.send(outcome);
            }
        }
    }

    /// Several acquisition attempts in one transaction, each in a savepoint
    /// of its own: an attempt that fails leaves nothing behind and does not
    /// fail the others.
    pub(super) fn try_acquire_together(
        &self,
        batch: &[QueuedAttempt],
    ) -> Result<Vec<Result<Tried>>> {
        self.writable()?;
        let mut conn = self.conn();
        self.usable(&conn)?;
        let mut tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let now = monotonic_ns();
        let mut outcomes = Vec::with_capacity(batch.len());
        for a in batch {
            let savepoint = tx.savepoint().map_err(self.err())?;
            let outcome = self.attempt(&savepoint, a, now);
            if outcome.is_ok() {
                savepoint.commit().map_err(self.err())?;
            }
            outcomes.push(outcome);
        }
        if outcomes.iter().any(|o| o.as_ref().is_ok_and(|t| t.fresh)) {
            self.usable(&tx)?;
            tx.commit().map_err(self.err())?;
            self.announce();
        }
        Ok(outcomes)
    }

    /// One acquisition attempt, in a transaction of its own.
    pub(super) fn try_acquire(&self, a: &QueuedAttempt) -> Result<Tried> {
        self.writable()?;
        let mut conn = self.conn();
        self.usable(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let tried = self.attempt(&tx, a, monotonic_ns())?;
        if tried.fresh {
            self.usable(&tx)?;
            tx.commit().map_err(self.err())?;
            self.announce();
        }
        Ok(tried)
    }

    /// One acquisition attempt inside the transaction `tx` (at monotonic
    /// time `now`); `fresh` with a grant that it wrote, which the caller
    /// commits. An `unwaited` attempt grants only if nobody holds the
    /// election, its own session neither, and no live session keeps a
    /// note on it (so none waits in line).
    pub(super) fn attempt(&self, tx: &Connection, a: &QueuedAttempt, now: i64) -> Result<Tried> {
        let (session, election, candidate) = (a.session, &a.election, &a.candidate);
        self.session_alive(tx, session, now)?;
        let mut dead_pid = None;
        if let Some(holder) = self
            .live_holder(tx, election.as_str(), now)
            .map_err(self.err())?
        {
            let held = Attempt::Held {
                expires_in: duration_ns(holder.expires_in_ns),
            };
            if SessionId::from_stored(holder.session) == session {
                if a.unwaited {
                    return Ok(Tried::existing(held));
                }
                let grant = holder.into_grant(&self.path, election, session)?;
                return Ok(Tried::existing(Attempt::Granted(grant, None)));
            }
            match self.holder_process(tx, holder.session)? {
                (Process::Untested, _) => return Ok(Tried::existing(held)),
                (Process::Alive, _) => {
                    return Ok(Tried {
                        watch: Some(holder.session),
                        ..Tried::existing(held)
                    });
                }
                // Its lock was taken before its row committed and is gone
                // now, while this transaction keeps the row from changing:
                // the process that held the session is gone. Expire the
                // session; its grants are no longer live.
                (Process::Gone, pid) => {
                    self.expire_session(tx, holder.session)?;
                    dead_pid = Some(pid);
                }
            }
        }
        if a.unwaited && self.anyone_waits(tx, election, now)? {
            return Ok(Tried::existing(Attempt::Held {
                expires_in: Duration::ZERO,
            }));
        }
        let expired = self.expired_holder(tx, election, dead_pid)?;
        let grant = Grant {
            election: election.clone(),
            candidate: candidate.clone(),
            session,
            token: self.write_grant(tx, a)?,
        };
        Ok(Tried {
            attempt: Attempt::Granted(grant, expired),
            fresh: true,
            watch: None,
        })
    }

    /// Ends `session` in `tx`, whose process is gone: its grants are no
    /// longer live.
    pub(super) fn expire_session(&self, tx: &Connection, session: i64) -> Result<()> {
        tx.execute("DELETE FROM sessions WHERE id = ?1", params![session])
            .map_err(self.err())?;
        tx.execute(
            "DELETE FROM session_locks WHERE session = ?1",
            params![session],
        )
        .map_err(self.err())?;
        Ok(())
    }

    /// The holder still recorded for `election` in `tx`, though not live
    /// (the caller checked): it was never released, its session expired —
    /// at once if its process was found gone, `dead_pid`.
    pub(super) fn expired_holder(
        &self,
        tx: &Connection,
        election: &ElectionName,
        dead_pid: Option<i64>,
    ) -> Result<Option<Expired>> {
        tx.query_row(
            "SELECT holder_candidate, holder_token FROM elections
             WHERE name = ?1 AND holder_session IS NOT NULL",
            params![election.as_str()],
            |r| {
                Ok(Expired {
                    candidate: r.get::<_, Option<String>>(0)?.unwrap_or_default(),
                    token: FencingToken::from_stored(r.get::<_, Option<i64>>(1)?.unwrap_or(0)),
                    dead_pid,
                })
            },
        )
        .optional()
        .map_err(self.err())
    }

    /// Grants the election of `a` to its session and candidate inside the
    /// transaction `tx`, with the token after the election's last: that
    /// token. [`Error::Corrupt`] when the counter cannot give one; the
    /// caller then rolls `tx` back, and nothing is written.
    pub(super) fn write_grant(&self, tx: &Connection, a: &QueuedAttempt) -> Result<FencingToken> {
        let token = self.next_token(tx, &a.election)?;
        tx.execute(
            "INSERT INTO elections (name, last_token, holder_session, holder_candidate, holder_token)
             VALUES (?1, ?4, ?2, ?3, ?4)
             ON CONFLICT (name) DO UPDATE SET
                 last_token = excluded.last_token,
                 holder_session = excluded.holder_session,
                 holder_candidate = excluded.holder_candidate,
                 holder_token = excluded.holder_token",
            params![
                a.election.as_str(),
                session_key(a.session)?,
                a.candidate.as_str(),
                token
            ],
        )
        .map_err(self.err())?;
        Ok(FencingToken::from_stored(token))
    }

    /// The token of the next grant of `election`: one above its counter,
    /// 1 for an election never granted. Computed here rather than by
    /// SQLite, whose `last_token + 1` at `i64::MAX` turns into a REAL:
    /// an exhausted counter, or one that holds no count (another type, a
    /// negative number), is [`Error::Corrupt`], never a wrapped token.
    pub(super) fn next_token(&self, tx: &Connection, election: &ElectionName) -> Result<i64> {
        let last = tx
            .query_row(
                "SELECT last_token FROM elections WHERE name = ?1",
                params![election.as_str()],
                |r| r.get::<_, Value>(0),
            )
            .optional()
            .map_err(self.err())?;
        let shown = self.path.display();
        match last {
            None => Ok(1),
            Some(Value::Integer(last)) if last >= 0 => last
                .checked_add(1)
                .ok_or_else(|| Error::tokens_exhausted(&shown, election.as_str())),
            Some(other) => Err(Error::Corrupt(format!(
                "{shown}: the fencing token counter of election {election} holds {}, which is \
                 no count of grants; no grant was written",
                stored_value(&other)
            ))),
        }
    }

    /// Whether a live session keeps a note on `election` (at monotonic
    /// time `now`): a candidate waits in line, or a transfer is asked.
    /// Only attempts ask, on a writable handle, whose opening created the
    /// notes table.
    pub(super) fn anyone_waits(
        &self,
        conn: &Connection,
        election: &ElectionName,
        now: i64,
    ) -> Result<bool> {
        conn.prepare_cached(
            "SELECT 1 FROM notes n JOIN sessions s ON s.id = n.session
             WHERE n.election = ?1 AND s.boot_id = ?3 AND s.expires_at_ns > ?2 LIMIT 1",
        )
        .and_then(|mut stmt| stmt.exists(params![election.as_str(), now, self.boot_id]))
        .map_err(self.err())
    }

    /// What the kernel says of the process of the holder `session`, and
    /// the pid it recorded (see `liveness`).
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

    pub(super) fn resign(&self, grant: &Grant) -> Result<()> {
        self.writable()?;
        let mut conn = self.conn();
        self.usable(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let now = monotonic_ns();
        let released = tx
            .execute(
                "UPDATE elections SET holder_session = NULL, holder_candidate = NULL, holder_token = NULL
                 WHERE name = ?1 AND holder_token = ?2 AND holder_session = ?5 AND holder_session IN
                     (SELECT id FROM sessions WHERE boot_id = ?3 AND expires_at_ns > ?4)",
                params![
                    grant.election.as_str(),
                    grant.token.to_i64_saturating(),
                    self.boot_id,
                    now,
                    session_key(grant.session)?
                ],
            )
            .map_err(self.err())?;
        if released == 0 {
            return Err(Error::NotHolder {
                election: grant.election.to_string(),
                token: grant.token,
            });
        }
        tx.execute(
            "INSERT INTO releases (election, token) VALUES (?1, ?2)
             ON CONFLICT (election) DO UPDATE SET token = excluded.token",
            params![grant.election.as_str(), grant.token.to_i64_saturating()],
        )
        .map_err(self.err())?;
        self.usable(&tx)?;
        tx.commit().map_err(self.err())?;
        self.announce();
        Ok(())
    }
}

impl Holder {
    pub(super) fn into_leader(self, path: &Path) -> Result<Leader> {
        Ok(Leader {
            candidate: stored_candidate(path, self.candidate)?,
            token: FencingToken::from_stored(self.token),
            expires_in: duration_ns(self.expires_in_ns),
            session: Some(SessionId::from_stored(self.session)),
        })
    }

    pub(super) fn into_grant(
        self,
        path: &Path,
        election: &ElectionName,
        session: SessionId,
    ) -> Result<Grant> {
        Ok(Grant {
            election: election.clone(),
            candidate: stored_candidate(path, self.candidate)?,
            session,
            token: FencingToken::from_stored(self.token),
        })
    }
}

/// A value SQLite holds, for a message.
pub(super) fn stored_value(value: &Value) -> String {
    match value {
        Value::Null => "NULL".to_owned(),
        Value::Integer(n) => n.to_string(),
        Value::Real(r) => format!("the real number {r}"),
        Value::Text(text) => format!("the text {}", crate::error::quoted(text)),
        Value::Blob(blob) => format!("a blob of {} bytes", blob.len()),
    }
}

pub(super) fn stored_candidate(path: &Path, candidate: String) -> Result<CandidateId> {
    CandidateId::new(candidate)
        .map_err(|e| Error::Corrupt(format!("{}: stored candidate id: {e}", path.display())))
}

/// Renewals waiting for the renewal thread, and whether it runs. Every
/// change under its lock is one assignment or one `Vec` operation, so a
/// lock whose holder panicked is used as it is ([`lock`]).
#[derive(Debug, Default)]
pub(super) struct RenewalQueue {
    pub(super) pending: Vec<(SessionId, tokio::sync::oneshot::Sender<Result<Duration>>)>,
    pub(super) running: bool,
}

/// The renewal thread: renews, in one transaction, every renewal waiting,
/// until none is; then it ends (the next renewal starts another).
pub(super) fn renew_while_asked(db: &Db, queue: &Mutex<RenewalQueue>) {
    loop {
        let batch = {
            let mut queue = lock(queue);
            if queue.pending.is_empty() {
                queue.running = false;
                return;
            }
            std::mem::take(&mut queue.pending)
        };
        let sessions: Vec<SessionId> = batch.iter().map(|(session, _)| *session).collect();
        for ((_, waiter), renewed) in batch.into_iter().zip(db.keep_alive(&sessions)) {
            let _ = waiter.send(renewed);
        }
    }
}

/// A renewal that failed because the file was replaced ends the session:
/// the file that held it is no longer the store.
pub(super) fn renewal_error(error: Error, session: SessionId) -> Error {
    match error {
        Error::Replaced(_) => Error::SessionExpired(session),
        other => other,
    }
}
