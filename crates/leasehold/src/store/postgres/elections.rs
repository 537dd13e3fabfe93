//! [`Store`] over PostgreSQL: sessions, campaigns, grants, releases,
//! notes and watches.

use super::*;

#[async_trait]
impl Store for PostgresStore {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        if self.inner.read_only {
            return Err(Error::invalid(
                "session",
                "the store was opened read-only (Access::ReadOnly)",
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
        // Dropped, the campaign leaves the line, and releases the grant of
        // a statement still on its way (the `Store` cancellation obligation).
        let mut in_flight = OnDrop::new(InFlight::default(), {
            let (inner, election) = (Arc::clone(&self.inner), election.clone());
            move |in_flight| in_flight.abandon(inner, election, session)
        });
        let me = session.0.to_string();
        // The holder whose grant this campaign found expired, not released.
        let mut expired: Option<(String, FencingToken)> = None;
        loop {
            let attempt = in_flight
                .get_mut()
                .attempt(&self.inner, session, election, candidate);
            match attempt.await? {
                Acquired::Granted { grant, .. } => {
                    in_flight.disarm();
                    if let Some((holder, tok)) = expired {
                        tracing::info!(%election, id = %candidate, expired_leader = %holder, expired_token = tok.0,
                            "the previous leader's lease expired; taking over");
                    }
                    return Ok(grant);
                }
                Acquired::Waiting { left, token: tok } => {
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
        if !self.inner.release(grant).await? {
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
                            h.id IS NOT NULL, e.session
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
                Some(
                    self.inner
                        .leader_from(row.get(1), row.get(2), row.get(3), row.get(5))?,
                )
            } else {
                None
            };
            out.push(ElectionState { election, leader });
        }
        Ok(out)
    }
}
