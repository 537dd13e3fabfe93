//! A fault-injecting [`Store`] wrapper: the same trait, so any backend can be
//! made slow, lossy or unavailable without mocks. (The fault point inside
//! every backend's watch task, for what a wrapper cannot reach, is in the
//! store's watch module; [`super::fail_watch_reads`] re-exports it.)

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::names::{CandidateId, ElectionName};
use crate::store::{
    ElectionState, FencingToken, Grant, Leader, LeaderWatch, Note, NoteWatch, SessionId,
    SessionLease, StatusWatch, Store,
};

/// Wraps a store and injects faults into what passes through it.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    unavailable: AtomicBool,
    drop_keep_alives: AtomicBool,
    withhold_grants: AtomicBool,
    keep_alive_reply_delay: Mutex<Duration>,
    keep_alives_sent: AtomicU64,
    failing_note_deletes: AtomicU64,
}

impl FaultyStore {
    /// Wraps `inner`; delays are slept on `clock`.
    pub fn new(inner: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Self {
        FaultyStore {
            inner,
            clock,
            unavailable: AtomicBool::new(false),
            drop_keep_alives: AtomicBool::new(false),
            withhold_grants: AtomicBool::new(false),
            keep_alive_reply_delay: Mutex::new(Duration::ZERO),
            keep_alives_sent: AtomicU64::new(0),
            failing_note_deletes: AtomicU64::new(0),
        }
    }

    /// The next `count` note deletions fail with [`Error::Unavailable`]
    /// without reaching the store (a connection lost just then).
    pub fn fail_note_deletes(&self, count: u64) {
        self.failing_note_deletes.store(count, Ordering::SeqCst);
    }

    /// Every call fails with [`Error::Unavailable`] without reaching the
    /// store while `on` (a partition between this client and the store).
    pub fn set_unavailable(&self, on: bool) {
        self.unavailable.store(on, Ordering::SeqCst);
    }

    /// Keep-alives are lost on the way to the store (never answered) while
    /// `on`; everything else passes.
    pub fn set_drop_keep_alives(&self, on: bool) {
        self.drop_keep_alives.store(on, Ordering::SeqCst);
    }

    /// While `on`, a campaign reaches the store, which may grant it, but
    /// its reply never arrives (the future stays pending): a holder the
    /// store shows, whose process never learns of its grant, while its
    /// session is renewed as before (a process stopped or hung after it
    /// asked, with a session kept alive elsewhere).
    pub fn set_withhold_grants(&self, on: bool) {
        self.withhold_grants.store(on, Ordering::SeqCst);
    }

    /// Keep-alive replies arrive `delay` after the store processed them.
    pub fn set_keep_alive_reply_delay(&self, delay: Duration) {
        *self
            .keep_alive_reply_delay
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = delay;
    }

    /// How many keep-alives reached the store.
    pub fn keep_alives_sent(&self) -> u64 {
        self.keep_alives_sent.load(Ordering::SeqCst)
    }

    fn check(&self) -> Result<()> {
        if self.unavailable.load(Ordering::SeqCst) {
            return Err(Error::Unavailable {
                reason: "fault injected: store unreachable".into(),
                source: None,
            });
        }
        Ok(())
    }
}

#[async_trait]
impl Store for FaultyStore {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        self.check()?;
        self.inner.open_session(ttl).await
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        self.check()?;
        if self.drop_keep_alives.load(Ordering::SeqCst) {
            return std::future::pending().await;
        }
        self.keep_alives_sent.fetch_add(1, Ordering::SeqCst);
        let outcome = self.inner.keep_alive(session).await;
        let delay = *self
            .keep_alive_reply_delay
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if !delay.is_zero() {
            self.clock.sleep(delay).await;
        }
        outcome
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        self.check()?;
        self.inner.close_session(session).await
    }

    async fn campaign(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Grant> {
        self.check()?;
        let grant = self.inner.campaign(session, election, candidate).await;
        if self.withhold_grants.load(Ordering::SeqCst) {
            return std::future::pending().await;
        }
        grant
    }

    async fn try_campaign_unwaited(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Option<Grant>> {
        self.check()?;
        let grant = self
            .inner
            .try_campaign_unwaited(session, election, candidate)
            .await;
        if self.withhold_grants.load(Ordering::SeqCst) && !matches!(grant, Ok(None)) {
            return std::future::pending().await;
        }
        grant
    }

    async fn resign(&self, grant: &Grant) -> Result<()> {
        self.check()?;
        self.inner.resign(grant).await
    }

    async fn release_orphaned(&self, grant: &Grant) -> Result<()> {
        self.check()?;
        self.inner.release_orphaned(grant).await
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        self.check()?;
        self.inner.leader(election).await
    }

    async fn watch(&self, election: &ElectionName) -> Result<LeaderWatch> {
        self.check()?;
        self.inner.watch(election).await
    }

    async fn watch_status(&self, election: &ElectionName) -> Result<StatusWatch> {
        self.check()?;
        self.inner.watch_status(election).await
    }

    async fn watch_grant(&self, grant: &Grant) -> Result<LeaderWatch> {
        self.check()?;
        self.inner.watch_grant(grant).await
    }

    async fn elections(&self) -> Result<Vec<ElectionState>> {
        self.check()?;
        self.inner.elections().await
    }

    async fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        self.check()?;
        self.inner.put_note(session, election, name, text).await
    }

    async fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        self.check()?;
        let failing =
            self.failing_note_deletes
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if failing.is_ok() {
            return Err(Error::Unavailable {
                reason: "fault injected: the connection closed".into(),
                source: None,
            });
        }
        self.inner.delete_note(session, election, name).await
    }

    async fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        self.check()?;
        self.inner.amend_note(session, election, name, text).await
    }

    async fn watch_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<NoteWatch> {
        self.check()?;
        self.inner.watch_note(session, election, name).await
    }

    async fn notes(&self, election: &ElectionName) -> Result<Vec<Note>> {
        self.check()?;
        self.inner.notes(election).await
    }

    async fn watch_notes(&self, election: &ElectionName) -> Result<NoteWatch> {
        self.check()?;
        self.inner.watch_notes(election).await
    }

    async fn watch_notes_since_unwaited(&self, grant: &Grant) -> Result<NoteWatch> {
        self.check()?;
        self.inner.watch_notes_since_unwaited(grant).await
    }

    async fn last_release(&self, election: &ElectionName) -> Result<Option<FencingToken>> {
        self.check()?;
        self.inner.last_release(election).await
    }

    async fn session_ended(&self, session: SessionId) {
        self.inner.session_ended(session).await;
    }

    fn session_lock_file(&self) -> Option<std::fs::File> {
        self.inner.session_lock_file()
    }
}
