//! A [`Store`] wrapper that counts what one client asks of the store and
//! how often the store's watches wake it, so that a test can show which
//! candidates a handover touched ("no herd") without timing anything.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::names::{CandidateId, ElectionName};
use crate::store::{
    ElectionState, FencingToken, Grant, Leader, LeaderWatch, Note, NoteWatch, SessionId,
    SessionLease, StatusWatch, Store,
};
use crate::watch;

/// What one client of the store did, as [`CountingStore`] counted it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Reads: the line ([`Store::notes`]), the leader, the last release.
    pub reads: u64,
    /// Watches opened (the whole line, one note, the leader).
    pub watches: u64,
    /// Times a watch brought a change to this client.
    pub wakes: u64,
    /// Campaigns sent to the store.
    pub campaigns: u64,
    /// Attempts that take an election only if nobody holds or waits for
    /// it ([`Store::try_campaign_unwaited`]).
    pub unwaited: u64,
    /// Renewals (keep-alives) sent to the store.
    pub renewals: u64,
    /// Other writes: sessions opened and closed, releases, notes put,
    /// amended and deleted.
    pub writes: u64,
}

impl Counts {
    /// Whether this client did nothing at all in `since..self` but renew
    /// its session (which it does on its own clock, whatever happens).
    pub fn untouched_since(&self, since: &Counts) -> bool {
        Counts {
            renewals: since.renewals,
            ..*self
        } == *since
    }
}

#[derive(Debug, Default)]
struct Counters {
    reads: AtomicU64,
    watches: AtomicU64,
    wakes: Arc<AtomicU64>,
    campaigns: AtomicU64,
    unwaited: AtomicU64,
    renewals: AtomicU64,
    writes: AtomicU64,
}

/// Wraps a store and counts what passes through it ([`Counts`]).
#[derive(Debug)]
pub struct CountingStore {
    inner: Arc<dyn Store>,
    counters: Counters,
    /// Whether watches are relayed, to count their wakes.
    wakes: bool,
}

impl CountingStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        CountingStore {
            inner,
            counters: Counters::default(),
            wakes: true,
        }
    }

    /// Wraps `inner`, counting everything but wakes ([`Counts::wakes`]
    /// stays 0): the watches it returns are the store's own rather than
    /// relayed by a task of this wrapper, so that a measurement of the
    /// memory or the tasks of many watches sees the store's alone.
    pub fn without_wakes(inner: Arc<dyn Store>) -> Self {
        CountingStore {
            wakes: false,
            ..CountingStore::new(inner)
        }
    }

    /// What was counted so far.
    pub fn counts(&self) -> Counts {
        let c = &self.counters;
        Counts {
            reads: c.reads.load(Ordering::SeqCst),
            watches: c.watches.load(Ordering::SeqCst),
            wakes: c.wakes.load(Ordering::SeqCst),
            campaigns: c.campaigns.load(Ordering::SeqCst),
            unwaited: c.unwaited.load(Ordering::SeqCst),
            renewals: c.renewals.load(Ordering::SeqCst),
            writes: c.writes.load(Ordering::SeqCst),
        }
    }

    fn write(&self) {
        self.counters.writes.fetch_add(1, Ordering::SeqCst);
    }

    fn read(&self) {
        self.counters.reads.fetch_add(1, Ordering::SeqCst);
    }

    /// `watch` as this client sees it: every value the store's watch
    /// brings after the first counts as a wake.
    fn counted<T>(&self, mut watch: watch::Receiver<T>) -> watch::Receiver<T>
    where
        T: Clone + Send + Sync + 'static,
    {
        self.counters.watches.fetch_add(1, Ordering::SeqCst);
        if !self.wakes {
            return watch;
        }
        let wakes = Arc::clone(&self.counters.wakes);
        let (tx, rx) = watch::channel(watch.borrow_and_update().clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    () = tx.closed() => return,
                    changed = watch.changed() => if changed.is_err() { return },
                }
                let value = watch.borrow_and_update().clone();
                wakes.fetch_add(1, Ordering::SeqCst);
                tx.send_replace(value);
            }
        });
        rx
    }
}

#[async_trait]
impl Store for CountingStore {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        self.write();
        self.inner.open_session(ttl).await
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        self.counters.renewals.fetch_add(1, Ordering::SeqCst);
        self.inner.keep_alive(session).await
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        self.write();
        self.inner.close_session(session).await
    }

    async fn campaign(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Grant> {
        self.counters.campaigns.fetch_add(1, Ordering::SeqCst);
        self.inner.campaign(session, election, candidate).await
    }

    async fn try_campaign_unwaited(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Option<Grant>> {
        self.counters.unwaited.fetch_add(1, Ordering::SeqCst);
        self.inner
            .try_campaign_unwaited(session, election, candidate)
            .await
    }

    async fn resign(&self, grant: &Grant) -> Result<()> {
        self.write();
        self.inner.resign(grant).await
    }

    async fn release_orphaned(&self, grant: &Grant) -> Result<()> {
        self.inner.release_orphaned(grant).await
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        self.read();
        self.inner.leader(election).await
    }

    async fn watch(&self, election: &ElectionName) -> Result<LeaderWatch> {
        Ok(self.counted(self.inner.watch(election).await?))
    }

    async fn watch_status(&self, election: &ElectionName) -> Result<StatusWatch> {
        Ok(self.counted(self.inner.watch_status(election).await?))
    }

    async fn watch_grant(&self, grant: &Grant) -> Result<LeaderWatch> {
        Ok(self.counted(self.inner.watch_grant(grant).await?))
    }

    async fn elections(&self) -> Result<Vec<ElectionState>> {
        self.read();
        self.inner.elections().await
    }

    async fn session_ended(&self, session: SessionId) {
        self.inner.session_ended(session).await;
    }

    async fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        self.write();
        self.inner.put_note(session, election, name, text).await
    }

    async fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        self.write();
        self.inner.amend_note(session, election, name, text).await
    }

    async fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        self.write();
        self.inner.delete_note(session, election, name).await
    }

    async fn notes(&self, election: &ElectionName) -> Result<Vec<Note>> {
        self.read();
        self.inner.notes(election).await
    }

    async fn watch_notes(&self, election: &ElectionName) -> Result<NoteWatch> {
        Ok(self.counted(self.inner.watch_notes(election).await?))
    }

    async fn watch_notes_since_unwaited(&self, grant: &Grant) -> Result<NoteWatch> {
        Ok(self.counted(self.inner.watch_notes_since_unwaited(grant).await?))
    }

    async fn watch_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<NoteWatch> {
        Ok(self.counted(self.inner.watch_note(session, election, name).await?))
    }

    async fn last_release(&self, election: &ElectionName) -> Result<Option<FencingToken>> {
        self.read();
        self.inner.last_release(election).await
    }

    fn session_lock_file(&self) -> Option<std::fs::File> {
        self.inner.session_lock_file()
    }
}
