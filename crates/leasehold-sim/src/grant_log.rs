//! The store every simulated candidate shares: the memory store, with
//! every grant it makes written to the history.

use super::*;

/// Records, at the store, every grant in the order the store makes it.
#[derive(Debug)]
pub(super) struct GrantLog {
    pub(super) store: MemoryStore,
    pub(super) history: Arc<Mutex<History>>,
}

impl GrantLog {
    pub(super) fn record(&self, grant: &Grant) {
        let granted = Granted {
            shard: shard_of(&grant.election),
            candidate: candidate_index(&grant.candidate),
            token: grant.token.0,
        };
        let mut history = lock(&self.history);
        // A campaign repeated after a lost reply gets the same grant again.
        if !history
            .grants
            .iter()
            .any(|g| g.shard == granted.shard && g.token == granted.token)
        {
            history.grants.push(granted);
        }
    }
}

#[async_trait]
impl Store for GrantLog {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        self.store.open_session(ttl).await
    }
    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        self.store.keep_alive(session).await
    }
    async fn close_session(&self, session: SessionId) -> Result<()> {
        self.store.close_session(session).await
    }
    async fn campaign(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Grant> {
        let grant = self.store.campaign(session, election, candidate).await?;
        self.record(&grant);
        Ok(grant)
    }
    async fn try_campaign_unwaited(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Option<Grant>> {
        let grant = self
            .store
            .try_campaign_unwaited(session, election, candidate)
            .await?;
        if let Some(grant) = &grant {
            self.record(grant);
        }
        Ok(grant)
    }
    async fn resign(&self, grant: &Grant) -> Result<()> {
        self.store.resign(grant).await
    }
    async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        self.store.leader(election).await
    }
    async fn watch(&self, election: &ElectionName) -> Result<LeaderWatch> {
        self.store.watch(election).await
    }
    async fn elections(&self) -> Result<Vec<ElectionState>> {
        self.store.elections().await
    }
    async fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        self.store.put_note(session, election, name, text).await
    }
    async fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        self.store.delete_note(session, election, name).await
    }
    async fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        self.store.amend_note(session, election, name, text).await
    }
    async fn watch_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<NoteWatch> {
        self.store.watch_note(session, election, name).await
    }
    async fn notes(&self, election: &ElectionName) -> Result<Vec<Note>> {
        self.store.notes(election).await
    }
    async fn watch_notes(&self, election: &ElectionName) -> Result<NoteWatch> {
        self.store.watch_notes(election).await
    }
    async fn last_release(&self, election: &ElectionName) -> Result<Option<FencingToken>> {
        self.store.last_release(election).await
    }
    async fn release_orphaned(&self, grant: &Grant) -> Result<()> {
        self.store.release_orphaned(grant).await
    }
    async fn watch_grant(&self, grant: &Grant) -> Result<LeaderWatch> {
        self.store.watch_grant(grant).await
    }
    async fn watch_status(&self, election: &ElectionName) -> Result<StatusWatch> {
        self.store.watch_status(election).await
    }
    async fn watch_notes_since_unwaited(&self, grant: &Grant) -> Result<NoteWatch> {
        self.store.watch_notes_since_unwaited(grant).await
    }
    async fn session_ended(&self, session: SessionId) {
        self.store.session_ended(session).await;
    }
    fn session_lock_file(&self) -> Option<std::fs::File> {
        self.store.session_lock_file()
    }
}
