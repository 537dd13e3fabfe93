//! [`Store`] over ZooKeeper in a recipe's layout: sessions, campaigns,
//! grants, releases and watches; the rest needs leasehold's layout.

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
        (self.inner)
            .recipe_campaign(self.recipe, session, election, candidate)
            .await
    }

    async fn resign(&self, grant: &Grant) -> Result<()> {
        let Ok((zk, client)) = self.inner.live_session(grant.session) else {
            return Err(not_holder(grant));
        };
        let prefix = zk.known_recipe_prefix(&grant.election);
        (self.inner)
            .recipe_delete_grant_node(self.recipe, &client, grant, prefix.as_deref())
            .await?;
        zk.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&grant.election);
        Ok(())
    }

    /// The dead holder's session is not ours: the node is deleted through
    /// the store's own client. ZooKeeper lets any client that may delete
    /// children of the election's node delete an ephemeral node in it (with
    /// credentials, the same identity: every replica of a store uses one).
    /// The node deleted is the one ephemeral to the grant's session and
    /// created by the grant's transaction (its token).
    async fn release_orphaned(&self, grant: &Grant) -> Result<()> {
        let client = self.inner.reader().await?;
        (self.inner)
            .recipe_delete_grant_node(self.recipe, &client, grant, None)
            .await
    }

    async fn put_note(&self, _: SessionId, _: &ElectionName, _: &str, _: &str) -> Result<()> {
        self.unsupported("a note")
    }

    async fn delete_note(&self, _: SessionId, _: &ElectionName, _: &str) -> Result<()> {
        self.unsupported("a note")
    }

    async fn amend_note(&self, _: SessionId, _: &ElectionName, _: &str, _: &str) -> Result<bool> {
        self.unsupported("a note")
    }

    async fn watch_note(&self, _: SessionId, _: &ElectionName, _: &str) -> Result<NoteWatch> {
        self.unsupported("a note")
    }

    async fn notes(&self, _: &ElectionName) -> Result<Vec<Note>> {
        self.unsupported("the line of standbys")
    }

    async fn watch_notes(&self, _: &ElectionName) -> Result<NoteWatch> {
        self.unsupported("the line of standbys")
    }

    async fn last_release(&self, _: &ElectionName) -> Result<Option<FencingToken>> {
        self.unsupported("the record of releases")
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        self.inner.read_leader(self.recipe, election).await
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
        self.unsupported("listing elections")
    }

    async fn session_ended(&self, session: SessionId) {
        // A session this store does not know has ended (or never was).
        if let Some(zk) = self.inner.session(session) {
            zk.ended.cancelled().await;
        }
    }
}
