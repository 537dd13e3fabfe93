//! [`Store`] over ZooKeeper: sessions, campaigns, grants, releases,
//! notes and watches.

use super::*;

#[async_trait]
impl Store for RecipeStore {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        self.inner.open_session(ttl).await
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        self.inner.keep_alive(session).await
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        self.inner.close_session(session).await
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
