//! [`Store`] over etcd: sessions as leases, campaigns, grants,
//! releases, notes and watches.

use super::*;

#[async_trait]
impl Store for EtcdStore {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        if self.read_only {
            return Err(Error::invalid(
                "session",
                "the store was opened read-only (Access::ReadOnly)",
            ));
        }
        let seconds = TTL.check(ttl)?.units;
        let lease = self
            .members
            .call("lease grant", |link| async move {
                pb::lease_client::LeaseClient::new(link.channel())
                    .lease_grant(link.request(pb::LeaseGrantRequest {
                        ttl: seconds,
                        id: 0,
                    }))
                    .await
            })
            .await?;
        if !lease.error.is_empty() {
            return Err(Error::Unavailable {
                reason: format!("etcd lease grant failed: {}", lease.error),
                source: None,
            });
        }
        Ok(SessionLease {
            id: SessionId::from_stored(lease.id),
            ttl: Duration::from_secs(lease.ttl.max(0).unsigned_abs()),
        })
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        let id = session_key(session)?;
        self.keep_alive_once(session, id).await
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        let id = session_key(session)?;
        self.forget_keeper(id);
        let revoked = self
            .members
            .call("lease revoke", |link| async move {
                pb::lease_client::LeaseClient::new(link.channel())
                    .lease_revoke(link.request(pb::LeaseRevokeRequest { id }))
                    .await
            })
            .await;
        match revoked {
            Err(error) if error.is_lease_not_found() => Ok(()),
            other => other.map(|_| ()).map_err(Error::from),
        }
    }

    async fn campaign(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Grant> {
        // The key is created in a task of its own, so that a campaign
        // dropped while the creation is on its way still learns whether it
        // landed and withdraws it: a key left there would wait in etcd's
        // order for a campaign nobody runs, and come to hold the election
        // for a session that does not know it (everyone behind it waiting
        // until that session ends).
        let creating = tokio::spawn({
            let (store, election, candidate) = (self.clone(), election.clone(), candidate.clone());
            async move { store.create_candidate(session, &election, &candidate).await }
        });
        let mut pending = OnDrop::new(creating, {
            let (store, key) = (self.clone(), self.candidate_key(election, session));
            move |creating| async move {
                if let Ok(Ok((revision, true))) = creating.await {
                    withdraw(store, key, revision).await;
                }
            }
        });
        let created = pending.get_mut().await;
        pending.disarm();
        let (my_revision, created) =
            created.map_err(|e| Error::unavailable("etcd campaign task failed", e))??;
        let guard = created.then(|| {
            let (store, key) = (self.clone(), self.candidate_key(election, session));
            OnDrop::new((), move |()| withdraw(store, key, my_revision))
        });
        loop {
            let (ahead, revision) = self.predecessor(election, my_revision).await?;
            match ahead {
                // Our key is gone: the lease expired (or was revoked).
                Err(()) => return Err(Error::SessionExpired(session)),
                Ok(Some(predecessor)) => {
                    let predecessor = String::from_utf8_lossy(&predecessor.key).into_owned();
                    self.wait_deleted(&predecessor, revision + 1).await;
                }
                Ok(None) => {
                    // Checked while the guard would still withdraw the key.
                    let token = self.granted_token(election, my_revision)?;
                    if let Some(guard) = guard {
                        guard.disarm();
                    }
                    return Ok(Grant {
                        election: election.clone(),
                        candidate: candidate.clone(),
                        session,
                        token,
                    });
                }
            }
        }
    }

    /// One transaction: `session`'s candidate key is created only if the
    /// election has no key at all (nobody holds it or waits in etcd's
    /// order) and no note (nobody waits in leasehold's line). The
    /// transaction runs as a task of its own, so that a campaign dropped
    /// while it is on its way still learns whether it landed, and
    /// withdraws exactly the key it created.
    async fn try_campaign_unwaited(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Option<Grant>> {
        if self.layout == Layout::Concurrency {
            return Ok(None);
        }
        let lease = session_key(session)?;
        let key = self.candidate_key(election, session);
        let known = self.known_key(election);
        let candidates = range_of_prefix(&self.election_prefix(election));
        let notes = range_of_prefix(&self.notes_prefix(election));
        let txn = unwaited_txn(
            &key,
            &known,
            &self.marker_key(),
            candidate,
            lease,
            [no_key_in(&candidates), no_key_in(&notes)],
        );
        let store = self.clone();
        let attempt = tokio::spawn(async move { store.txn("campaign", txn).await });
        let (store, withdrawn) = (self.clone(), key.clone());
        let mut guard = OnDrop::new(attempt, move |attempt| async move {
            if let Ok(Ok(done)) = attempt.await
                && unwaited_granted(&done)
            {
                withdraw(store, withdrawn, revision_of(done.header.as_ref())).await;
            }
        });
        let done = guard.get_mut().await;
        guard.disarm();
        let done = match done.map_err(|e| Error::unavailable("etcd campaign task failed", e))? {
            Err(error) if error.is_lease_not_found() => {
                return Err(Error::SessionExpired(session));
            }
            other => other?,
        };
        // Not granted: the election is not free, or its `k/` key holds
        // another program's value (the campaign in line says so).
        if !unwaited_granted(&done) {
            return Ok(None);
        }
        Ok(Some(Grant {
            election: election.clone(),
            candidate: candidate.clone(),
            session,
            token: self.granted_token(election, revision_of(done.header.as_ref()))?,
        }))
    }

    async fn resign(&self, grant: &Grant) -> Result<()> {
        let key = self.candidate_key(&grant.election, grant.session);
        let token = grant.token.to_i64_saturating();
        let mut success = vec![delete(key.clone())];
        if self.layout != Layout::Concurrency {
            success.push(self.record_release(&grant.election, token));
        }
        let mut compare = vec![created_at(key.clone(), token)];
        if self.layout == Layout::Concurrency {
            // Another program's put on the key (which keeps its create
            // revision) makes it that program's: it is not deleted.
            compare.push(pb::Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Lease as i32,
                key: key.into_bytes(),
                target_union: Some(TargetUnion::Lease(session_key(grant.session)?)),
                range_end: Vec::new(),
            });
        }
        let txn = TxnRequest {
            compare,
            success,
            failure: Vec::new(),
        };
        if !self.txn("resign", txn).await?.succeeded {
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
        self.own_layout("a note")?;
        self.put_note_in(session, election, name, text).await
    }

    async fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        self.own_layout("a note")?;
        self.delete_note_in(session, election, name).await
    }

    async fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        self.own_layout("a note")?;
        self.amend_note_in(session, election, name, text).await
    }

    async fn watch_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<NoteWatch> {
        self.own_layout("a note")?;
        self.watch_notes_of(election, Some((session, name))).await
    }

    async fn notes(&self, election: &ElectionName) -> Result<Vec<Note>> {
        self.own_layout("the line of standbys")?;
        Ok(self.notes_at(election, None).await?.0)
    }

    async fn watch_notes(&self, election: &ElectionName) -> Result<NoteWatch> {
        self.own_layout("the line of standbys")?;
        self.watch_notes_of(election, None).await
    }

    async fn watch_notes_since_unwaited(&self, grant: &Grant) -> Result<NoteWatch> {
        self.own_layout("the line of standbys")?;
        Ok(self.watch_notes_since(grant))
    }

    async fn last_release(&self, election: &ElectionName) -> Result<Option<FencingToken>> {
        self.own_layout("the record of releases")?;
        self.last_release_in(election).await
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        Ok(self.leader_at(election).await?.0)
    }

    async fn watch(&self, election: &ElectionName) -> Result<LeaderWatch> {
        self.watch_held(election, None).await
    }

    async fn watch_status(&self, election: &ElectionName) -> Result<StatusWatch> {
        self.watch_held(election, None).await
    }

    async fn watch_grant(&self, grant: &Grant) -> Result<LeaderWatch> {
        // The grant's token is the revision that made it: watching from
        // just after it misses nothing, and needs no read (nor a lookup of
        // the lease's time to live, which a holder's watch never uses).
        let source = EtcdWatch {
            store: self.clone(),
            election: grant.election.clone(),
            from: grant.token.to_i64_saturating().saturating_add(1),
        };
        Ok(leader_watch::start_held(source, grant))
    }

    async fn elections(&self) -> Result<Vec<ElectionState>> {
        self.own_layout("listing elections")?;
        let prefix = self.known_key_prefix();
        let known = self.range("get", range_of_prefix(&prefix)).await?;
        let mut states = Vec::new();
        for kv in &known.kvs {
            // leasehold writes these keys empty and without a lease.
            let election = kv
                .key
                .strip_prefix(prefix.as_bytes())
                .and_then(|name| std::str::from_utf8(name).ok())
                .and_then(|name| ElectionName::new(name).ok())
                .filter(|_| kv.value.is_empty() && kv.lease == 0);
            let Some(election) = election else {
                tracing::warn!(key = %String::from_utf8_lossy(&kv.key),
                    "etcd: ignoring a key leasehold did not write among the elections");
                continue;
            };
            let leader = self.leader(&election).await?;
            states.push(ElectionState { election, leader });
        }
        Ok(states)
    }
}
