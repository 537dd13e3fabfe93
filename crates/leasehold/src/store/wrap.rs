//! Wrappers of a store — counting, fault injection, the simulation's
//! network — written once: a [`Wrapper`] says what it adds around the
//! calls it passes on, and is a [`Store`] by the one implementation here,
//! which forwards every method of the trait. That implementation is held
//! to every method (`clippy::missing_trait_methods`), so a method added to
//! [`Store`] and not forwarded here fails the lint run rather than falling
//! back, unseen, to the trait's default in every wrapper.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::names::{CandidateId, ElectionName};
use crate::store::{
    ElectionState, FencingToken, Grant, Leader, LeaderWatch, Note, NoteWatch, SessionId,
    SessionLease, StatusWatch, Store,
};
use crate::watch;

/// A call on its way to the wrapped store.
pub type Request<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// Which method of [`Store`] a wrapped call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // each is the method of the same name
pub enum Call {
    OpenSession,
    KeepAlive,
    CloseSession,
    Campaign,
    TryCampaignUnwaited,
    Resign,
    ReleaseOrphaned,
    Leader,
    Watch,
    WatchGrant,
    WatchStatus,
    Elections,
    PutNote,
    DeleteNote,
    AmendNote,
    WatchNote,
    Notes,
    WatchNotes,
    WatchNotesSinceUnwaited,
    LastRelease,
}

/// What a wrapper of a store adds; every type that implements it is a
/// [`Store`] that passes each call to [`Wrapper::inner`] through these
/// hooks. The defaults add nothing.
pub trait Wrapper: Send + Sync + std::fmt::Debug {
    /// The wrapped store.
    fn inner(&self) -> &dyn Store;

    /// Carries `request`, a call of the wrapped store, out: delayed,
    /// counted, failed without sending it, or its answer held back.
    fn around<'a, T: Send + 'a>(&'a self, call: Call, request: Request<'a, T>) -> Request<'a, T> {
        let _ = call;
        request
    }

    /// Every grant a campaign got, before its caller sees it.
    fn granted<'a>(&'a self, grant: &'a Grant) -> Request<'a, ()> {
        let _ = grant;
        Box::pin(async { Ok(()) })
    }

    /// Every watch the wrapped store handed out, as the caller gets it.
    fn watched<T: Clone + Send + Sync + 'static>(
        &self,
        call: Call,
        watch: watch::Receiver<T>,
    ) -> watch::Receiver<T> {
        let _ = call;
        watch
    }
}

/// A campaign's call: its grant goes through [`Wrapper::granted`].
async fn campaigned<W: Wrapper>(w: &W, call: Call, request: Request<'_, Grant>) -> Result<Grant> {
    let grant = w.around(call, request).await?;
    w.granted(&grant).await?;
    Ok(grant)
}

/// A watch's call: its watch goes through [`Wrapper::watched`].
async fn watching<W: Wrapper, T: Clone + Send + Sync + 'static>(
    w: &W,
    call: Call,
    request: Request<'_, watch::Receiver<T>>,
) -> Result<watch::Receiver<T>> {
    Ok(w.watched(call, w.around(call, request).await?))
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<W: Wrapper> Store for W {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        let request = self.inner().open_session(ttl);
        self.around(Call::OpenSession, request).await
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        let request = self.inner().keep_alive(session);
        self.around(Call::KeepAlive, request).await
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        let request = self.inner().close_session(session);
        self.around(Call::CloseSession, request).await
    }

    async fn campaign(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Grant> {
        let request = self.inner().campaign(session, election, candidate);
        campaigned(self, Call::Campaign, request).await
    }

    async fn try_campaign_unwaited(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Option<Grant>> {
        let request = self
            .inner()
            .try_campaign_unwaited(session, election, candidate);
        let grant = self.around(Call::TryCampaignUnwaited, request).await?;
        if let Some(grant) = &grant {
            self.granted(grant).await?;
        }
        Ok(grant)
    }

    async fn resign(&self, grant: &Grant) -> Result<()> {
        let request = self.inner().resign(grant);
        self.around(Call::Resign, request).await
    }

    async fn release_orphaned(&self, grant: &Grant) -> Result<()> {
        let request = self.inner().release_orphaned(grant);
        self.around(Call::ReleaseOrphaned, request).await
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        let request = self.inner().leader(election);
        self.around(Call::Leader, request).await
    }

    async fn watch(&self, election: &ElectionName) -> Result<LeaderWatch> {
        let request = self.inner().watch(election);
        watching(self, Call::Watch, request).await
    }

    async fn watch_grant(&self, grant: &Grant) -> Result<LeaderWatch> {
        let request = self.inner().watch_grant(grant);
        watching(self, Call::WatchGrant, request).await
    }

    async fn watch_status(&self, election: &ElectionName) -> Result<StatusWatch> {
        let request = self.inner().watch_status(election);
        watching(self, Call::WatchStatus, request).await
    }

    async fn elections(&self) -> Result<Vec<ElectionState>> {
        let request = self.inner().elections();
        self.around(Call::Elections, request).await
    }

    /// Not a request: the wrapped store's own word, as it comes.
    async fn session_ended(&self, session: SessionId) {
        self.inner().session_ended(session).await;
    }

    async fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        let request = self.inner().put_note(session, election, name, text);
        self.around(Call::PutNote, request).await
    }

    async fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        let request = self.inner().delete_note(session, election, name);
        self.around(Call::DeleteNote, request).await
    }

    async fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        let request = self.inner().amend_note(session, election, name, text);
        self.around(Call::AmendNote, request).await
    }

    async fn watch_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<NoteWatch> {
        let request = self.inner().watch_note(session, election, name);
        watching(self, Call::WatchNote, request).await
    }

    async fn notes(&self, election: &ElectionName) -> Result<Vec<Note>> {
        let request = self.inner().notes(election);
        self.around(Call::Notes, request).await
    }

    async fn watch_notes(&self, election: &ElectionName) -> Result<NoteWatch> {
        let request = self.inner().watch_notes(election);
        watching(self, Call::WatchNotes, request).await
    }

    async fn watch_notes_since_unwaited(&self, grant: &Grant) -> Result<NoteWatch> {
        let request = self.inner().watch_notes_since_unwaited(grant);
        watching(self, Call::WatchNotesSinceUnwaited, request).await
    }

    async fn last_release(&self, election: &ElectionName) -> Result<Option<FencingToken>> {
        let request = self.inner().last_release(election);
        self.around(Call::LastRelease, request).await
    }

    /// Not a request: the wrapped store's descriptor.
    fn session_lock_file(&self) -> Option<std::fs::File> {
        self.inner().session_lock_file()
    }
}
