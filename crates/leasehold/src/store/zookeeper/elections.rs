//! [`Store`] over ZooKeeper: sessions, campaigns, grants, releases,
//! notes and watches.

use super::*;

#[async_trait]
impl Store for ZkStore {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        if self.inner.read_only {
            return Err(Error::invalid(
                "session",
                "the store was opened read-only (Access::ReadOnly)",
            ));
        }
        let ttl = TTL.check(ttl)?.ttl;
        let sent = Instant::now();
        let client = self.inner.connect(ttl).await?;
        let granted = client.session_timeout();
        let id = SessionId::from_bits(client.session_id().0);
        if granted != ttl {
            // The session logs the granted TTL for every store; this is the
            // detail of why.
            tracing::debug!(session = %id, requested = ?ttl, negotiated = ?granted,
                "zookeeper negotiated another session timeout (it clamps to its min/maxSessionTimeout); using it as the TTL");
        }
        let (renewed, _) = watch::channel(sent);
        let session = Arc::new(ZkSession {
            id,
            user: self.inner.user.clone(),
            client: Mutex::new(Some(client.clone())),
            ttl: granted,
            renewed,
            ended: CancellationToken::new(),
            held: Mutex::new(HashSet::new()),
            recipe_campaigns: Mutex::new(HashMap::new()),
        });
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Arc::clone(&session));
        let inner = Arc::clone(&self.inner);
        let states = client.state_watcher();
        drop(client);
        // The supervisor keeps only a state watcher, never a client, so that
        // ending the session closes it.
        tokio::spawn(inner.supervise(session, states));
        Ok(SessionLease { id, ttl: granted })
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        let (zk, client) = self.inner.live_session(session)?;
        let sent = Instant::now();
        // A `sync`, not a read: a follower cut off from the ensemble's
        // leader answers reads on its own until it notices (`syncLimit`
        // ticks, 10 s with ZooKeeper's usual settings), while the leader,
        // which alone expires sessions, never hears of them. A sync passes
        // through the leader, so a cut-off follower cannot confirm one.
        let outcome = zk.ask("renew the session", client.sync("/")).await?;
        match outcome {
            Ok(()) => {
                // The leader hears of this renewal with the follower's next
                // heartbeat, within half a tick; a partition in that window
                // strands it at the follower (see DESIGN, "Faults of the
                // stores").
                zk.renewed.send_replace(sent);
                Ok(zk.ttl)
            }
            Err(
                zookeeper_client::Error::SessionExpired | zookeeper_client::Error::ClientClosed,
            ) => {
                zk.end();
                Err(Error::SessionExpired(session))
            }
            Err(error) => Err(failed(zk.user.as_deref(), "renew the session", "/", error)),
        }
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        let Some(zk) = self.inner.session(session) else {
            return Ok(());
        };
        let Some(client) = zk.end() else {
            return Ok(());
        };
        let mut states = client.state_watcher();
        drop(client);
        // Wait until the server has closed the session (and so deleted its
        // nodes), so that the release is visible when this returns.
        let closed = tokio::time::timeout(REQUEST_TIMEOUT, async {
            while !states.state().is_terminated() {
                states.changed().await;
            }
        })
        .await;
        self.inner.forget(session);
        if closed.is_err() {
            tracing::warn!(%session, "zookeeper did not confirm closing the session; it expires after its timeout");
        }
        Ok(())
    }

    async fn campaign(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Grant> {
        if let Some(recipe) = self.inner.recipe {
            return (self.inner)
                .recipe_campaign(recipe, session, election, candidate)
                .await;
        }
        let (zk, client) = self.inner.live_session(session)?;
        let dir = self.inner.election_dir(election);
        let line = Line {
            zk: &zk,
            client: &client,
            dir: &dir,
            prefix: session_prefix(session),
            acls: self.inner.acls,
        };
        line.create_election_node(&self.inner.elections_dir())
            .await?;
        let guard = {
            let (session, election, dir) = (Arc::clone(&zk), election.clone(), dir.clone());
            OnDrop::new((), move |()| withdraw(session, election, dir))
        };
        // Nodes named like candidates that leasehold did not create; names
        // are never reused under a parent.
        let mut foreign: HashSet<String> = HashSet::new();
        loop {
            let queue = line.candidates(&foreign).await?;
            let Some(position) = line.own_position(&queue).await else {
                line.join(candidate).await?;
                continue;
            };
            if position == 0 {
                let me = &queue[0];
                let Some(stat) = line.read_own_node(me).await? else {
                    continue;
                };
                // Checked while the guard would still withdraw the node.
                let token = granted_token(election, &stat)?;
                zk.held
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(election.clone());
                guard.disarm();
                tracing::debug!(%election, %session, node = %me.name, "granted by zookeeper");
                return Ok(Grant {
                    election: election.clone(),
                    candidate: candidate.clone(),
                    session,
                    token,
                });
            }
            line.wait_for_predecessor(&queue[position - 1], &mut foreign)
                .await?;
        }
    }

    async fn resign(&self, grant: &Grant) -> Result<()> {
        let Ok((zk, client)) = self.inner.live_session(grant.session) else {
            return Err(not_holder(grant));
        };
        match self.inner.recipe {
            Some(recipe) => {
                let prefix = zk.known_recipe_prefix(&grant.election);
                (self.inner)
                    .recipe_delete_grant_node(recipe, &client, grant, prefix.as_deref())
                    .await?;
            }
            None => self.inner.delete_grant_node(&client, grant).await?,
        }
        zk.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&grant.election);
        Ok(())
    }

    /// The dead holder's session is not ours: the node is deleted through
    /// the store's own client. ZooKeeper lets any client that may delete
    /// children of the election's node delete an ephemeral node in it (with
    /// credentials, the same identity: every replica of a store uses one);
    /// the version check and the token make it this grant's node alone.
    ///
    /// In a recipe's layout, the node deleted is the one ephemeral to the
    /// grant's session and created by the grant's transaction (its token).
    async fn release_orphaned(&self, grant: &Grant) -> Result<()> {
        let client = self.inner.reader().await?;
        match self.inner.recipe {
            Some(recipe) => {
                (self.inner)
                    .recipe_delete_grant_node(recipe, &client, grant, None)
                    .await
            }
            None => self.inner.delete_grant_node(&client, grant).await,
        }
    }

    async fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        self.inner.own_layout("a note")?;
        self.inner.put_note(session, election, name, text).await
    }

    async fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        self.inner.own_layout("a note")?;
        self.inner.delete_note(session, election, name).await
    }

    async fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        self.inner.own_layout("a note")?;
        self.inner.amend_note(session, election, name, text).await
    }

    async fn watch_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<NoteWatch> {
        self.inner.own_layout("a note")?;
        self.inner
            .start_notes_watch(election, Some((session, name)))
            .await
    }

    async fn notes(&self, election: &ElectionName) -> Result<Vec<Note>> {
        self.inner.own_layout("the line of standbys")?;
        self.inner.read_notes(election).await
    }

    async fn watch_notes(&self, election: &ElectionName) -> Result<NoteWatch> {
        self.inner.own_layout("the line of standbys")?;
        self.inner.start_notes_watch(election, None).await
    }

    async fn last_release(&self, election: &ElectionName) -> Result<Option<FencingToken>> {
        self.inner.own_layout("the record of releases")?;
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
        self.inner.own_layout("listing elections")?;
        let client = self.inner.reader().await?;
        let nodes = match request(
            "list elections",
            client.list_children(&self.inner.elections_dir()),
        )
        .await?
        {
            Ok(nodes) => nodes,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(error) => {
                let dir = self.inner.elections_dir();
                return Err(self.inner.failed("list elections", &dir, error));
            }
        };
        let mut out = Vec::new();
        for node in nodes {
            let Some(election) = decode(&node) else {
                continue;
            };
            let leader = self.inner.leader_via(&client, &election).await?;
            out.push(ElectionState { election, leader });
        }
        out.sort_by(|a, b| a.election.cmp(&b.election));
        Ok(out)
    }

    async fn session_ended(&self, session: SessionId) {
        // A session this store does not know has ended (or never was).
        if let Some(zk) = self.inner.session(session) {
            zk.ended.cancelled().await;
        }
    }
}
