//! `memory:` — an in-process store, for library use and tests.
//!
//! Expiry runs on an injectable [`Clock`], so tests can drive it under
//! simulated time.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::{Clock, Instant, TokioClock};
use crate::config::StoreTtl;
use crate::error::{Error, Result};
use crate::names::{CandidateId, ElectionName};
use crate::store::local::{self, Attempt, ChangeHub, Changes, Expired, LocalBackend, Topic};
use crate::store::{
    ElectionState, FencingToken, Grant, Leader, LeaderWatch, Note, NoteWatch, SessionId,
    SessionLease, StatusWatch, Store, check_note,
};

/// How the memory store keeps a TTL: exactly.
const TTL: StoreTtl = StoreTtl {
    store: "the memory store",
    unit: Duration::from_nanos(1),
    max: Duration::MAX,
};

/// An in-process store. Cloning gives another handle to the same state.
#[derive(Clone, Debug)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    changes: ChangeHub,
}

#[derive(Debug, Default)]
struct State {
    next_session: u64,
    sessions: HashMap<SessionId, Session>,
    elections: BTreeMap<ElectionName, Election>,
    /// Notes by election, in order.
    notes: BTreeMap<ElectionName, Vec<Note>>,
    last_order: u64,
}

#[derive(Debug, Clone, Copy)]
struct Session {
    expires_at: Instant,
    ttl: Duration,
}

#[derive(Debug, Default)]
struct Election {
    last_token: u64,
    holder: Option<Grant>,
    last_release: Option<FencingToken>,
}

impl State {
    fn alive(&self, session: SessionId, now: Instant) -> Option<Duration> {
        self.sessions
            .get(&session)
            .filter(|s| s.expires_at > now)
            .map(|s| s.expires_at - now)
    }

    fn live_holder(&self, election: &ElectionName, now: Instant) -> Option<(Grant, Duration)> {
        let grant = self.elections.get(election)?.holder.as_ref()?;
        let left = self.alive(grant.session, now)?;
        Some((grant.clone(), left))
    }

    /// The live notes on `election`, and how long until the first of
    /// their sessions expires.
    fn live_notes(
        &self,
        election: &ElectionName,
        only: Option<&local::NoteKey>,
        now: Instant,
    ) -> (Vec<Note>, Option<Duration>) {
        let mut first_expiry = None::<Duration>;
        let notes = self
            .notes
            .get(election)
            .into_iter()
            .flatten()
            .filter(|note| only.is_none_or(|(s, n)| note.session == *s && note.name == *n))
            .filter(|note| {
                let left = self.alive(note.session, now);
                if let Some(left) = left {
                    first_expiry = Some(first_expiry.map_or(left, |f| f.min(left)));
                }
                left.is_some()
            })
            .cloned()
            .collect();
        (notes, first_expiry)
    }

    fn leader(&self, election: &ElectionName, now: Instant) -> Option<Leader> {
        self.live_holder(election, now)
            .map(|(grant, expires_in)| Leader {
                candidate: grant.candidate,
                token: grant.token,
                expires_in,
                session: Some(grant.session),
            })
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// A store whose expiry follows the host's monotonic clock.
    pub fn new() -> Self {
        MemoryStore::with_clock(Arc::new(TokioClock))
    }

    /// A store whose expiry follows `clock` (the store's own notion of time).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryStore {
            inner: Arc::new(Inner {
                clock,
                state: Mutex::new(State {
                    next_session: 1,
                    ..State::default()
                }),
                changes: ChangeHub::new(),
            }),
        }
    }

    /// Test support: sets the token counter of `election` (granted at
    /// least once; otherwise nothing is set) to `last`, the token of its
    /// last grant, as a damaged or hand-edited store might hold it.
    #[cfg(feature = "testing")]
    pub fn set_last_token(&self, election: &ElectionName, last: u64) {
        if let Some(entry) = self.inner.state().elections.get_mut(election) {
            entry.last_token = last;
        }
    }

    /// Test support: the token counter of `election`, if it was granted.
    #[cfg(feature = "testing")]
    pub fn last_token(&self, election: &ElectionName) -> Option<u64> {
        let state = self.inner.state();
        state.elections.get(election).map(|e| e.last_token)
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in
        // a way that breaks the invariants (every mutation is one assignment),
        // so recover the guard rather than poisoning every later call.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Anything may have changed (a session closed with its grants and
    /// notes): wakes every waiter and watch.
    fn changed(&self) {
        self.changes.everything();
    }

    /// `election` was granted or released: wakes its waiters and leader
    /// watches.
    fn touched(&self, election: &ElectionName) {
        self.changes.holder_written(election);
    }
}

#[async_trait]
impl LocalBackend for Inner {
    fn changes(&self, topic: Topic) -> Changes {
        self.changes.subscribe(topic)
    }

    fn known_alive(&self, session: SessionId) -> Option<Duration> {
        // This store holds every session: how long one lives is known
        // without a read (zero once it ended).
        let now = self.clock.now();
        Some(self.state().alive(session, now).unwrap_or_default())
    }

    async fn try_acquire(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
        unwaited: bool,
    ) -> Result<Attempt> {
        let now = self.clock.now();
        let mut state = self.state();
        if state.alive(session, now).is_none() {
            return Err(Error::SessionExpired(session));
        }
        if let Some((holder, left)) = state.live_holder(election, now) {
            if holder.session == session && !unwaited {
                return Ok(Attempt::Granted(holder, None));
            }
            return Ok(Attempt::Held { expires_in: left });
        }
        if unwaited && !state.live_notes(election, None, now).0.is_empty() {
            return Ok(Attempt::Held {
                expires_in: Duration::ZERO,
            });
        }
        let entry = state.elections.entry(election.clone()).or_default();
        // Checked before anything changes: an exhausted counter leaves the
        // election as it was.
        let Some(token) = entry
            .last_token
            .checked_add(1)
            .map(FencingToken)
            .filter(|&token| token <= FencingToken::LAST)
        else {
            return Err(Error::tokens_exhausted(&"memory:", election.as_str()));
        };
        // A holder still recorded but not live: its session expired.
        let expired = entry.holder.take().map(|g| Expired {
            candidate: g.candidate.to_string(),
            token: g.token,
            dead_pid: None,
        });
        entry.last_token = token.0;
        let grant = Grant {
            election: election.clone(),
            candidate: candidate.clone(),
            session,
            token,
        };
        entry.holder = Some(grant.clone());
        drop(state);
        self.touched(election);
        Ok(Attempt::Granted(grant, expired))
    }

    async fn read_leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        let now = self.clock.now();
        Ok(self.state().leader(election, now))
    }

    async fn read_notes(
        &self,
        election: &ElectionName,
        only: Option<&local::NoteKey>,
    ) -> Result<(Vec<Note>, Option<Duration>)> {
        let now = self.clock.now();
        Ok(self.state().live_notes(election, only, now))
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.clock.sleep(duration)
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        let ttl = TTL.check(ttl)?.ttl;
        let now = self.inner.clock.now();
        let mut state = self.inner.state();
        let id = SessionId(state.next_session);
        state.next_session += 1;
        state.sessions.retain(|_, s| s.expires_at > now);
        let expires_at = now + ttl;
        state.sessions.insert(id, Session { expires_at, ttl });
        Ok(SessionLease { id, ttl })
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        let now = self.inner.clock.now();
        let mut state = self.inner.state();
        let Some(entry) = state.sessions.get_mut(&session) else {
            return Err(Error::SessionExpired(session));
        };
        if entry.expires_at <= now {
            state.sessions.remove(&session);
            return Err(Error::SessionExpired(session));
        }
        entry.expires_at = now + entry.ttl;
        Ok(entry.ttl)
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        let mut state = self.inner.state();
        state.sessions.remove(&session);
        for election in state.elections.values_mut() {
            if election
                .holder
                .as_ref()
                .is_some_and(|g| g.session == session)
            {
                election.holder = None;
            }
        }
        drop(state);
        self.inner.changed();
        Ok(())
    }

    async fn campaign(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Grant> {
        local::campaign(&*self.inner, session, election, candidate).await
    }

    async fn try_campaign_unwaited(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Option<Grant>> {
        local::try_campaign_unwaited(&*self.inner, session, election, candidate).await
    }

    async fn resign(&self, grant: &Grant) -> Result<()> {
        let now = self.inner.clock.now();
        let mut state = self.inner.state();
        let current = state.live_holder(&grant.election, now);
        if current.is_none_or(|(holder, _)| {
            holder.token != grant.token || holder.session != grant.session
        }) {
            return Err(Error::NotHolder {
                election: grant.election.to_string(),
                token: grant.token,
            });
        }
        if let Some(election) = state.elections.get_mut(&grant.election) {
            election.holder = None;
            election.last_release = Some(grant.token);
        }
        drop(state);
        self.inner.touched(&grant.election);
        Ok(())
    }

    async fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        check_note(name, text)?;
        let now = self.inner.clock.now();
        let mut state = self.inner.state();
        if state.alive(session, now).is_none() {
            return Err(Error::SessionExpired(session));
        }
        state.last_order += 1;
        let order = state.last_order;
        let live: std::collections::HashSet<SessionId> = state
            .sessions
            .iter()
            .filter(|(_, s)| s.expires_at > now)
            .map(|(id, _)| *id)
            .collect();
        let notes = state.notes.entry(election.clone()).or_default();
        notes.retain(|n| live.contains(&n.session));
        let kept = notes
            .iter()
            .position(|n| n.session == session && n.name == name);
        match kept {
            Some(at) => notes[at].text = text.to_owned(),
            None => notes.push(Note {
                session,
                name: name.to_owned(),
                order,
                text: text.to_owned(),
            }),
        }
        drop(state);
        self.inner.changes.note_written(election, session, name);
        Ok(())
    }

    async fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        let mut state = self.inner.state();
        if let Some(notes) = state.notes.get_mut(election) {
            notes.retain(|n| n.session != session || n.name != name);
        }
        drop(state);
        self.inner.changes.note_written(election, session, name);
        Ok(())
    }

    async fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        check_note(name, text)?;
        let now = self.inner.clock.now();
        let mut state = self.inner.state();
        if state.alive(session, now).is_none() {
            return Ok(false);
        }
        let Some(note) = state.notes.get_mut(election).and_then(|notes| {
            notes
                .iter_mut()
                .find(|n| n.session == session && n.name == name)
        }) else {
            return Ok(false);
        };
        note.text = text.to_owned();
        drop(state);
        self.inner.changes.note_written(election, session, name);
        Ok(true)
    }

    async fn notes(&self, election: &ElectionName) -> Result<Vec<Note>> {
        Ok(self.inner.read_notes(election, None).await?.0)
    }

    async fn watch_notes(&self, election: &ElectionName) -> Result<NoteWatch> {
        local::watch_notes(Arc::clone(&self.inner), election, None).await
    }

    async fn watch_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<NoteWatch> {
        local::watch_notes(Arc::clone(&self.inner), election, Some((session, name))).await
    }

    async fn last_release(&self, election: &ElectionName) -> Result<Option<FencingToken>> {
        Ok(self
            .inner
            .state()
            .elections
            .get(election)
            .and_then(|e| e.last_release))
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        self.inner.read_leader(election).await
    }

    async fn watch(&self, election: &ElectionName) -> Result<LeaderWatch> {
        local::watch(Arc::clone(&self.inner), election, None).await
    }

    async fn watch_status(&self, election: &ElectionName) -> Result<StatusWatch> {
        local::watch(Arc::clone(&self.inner), election, None).await
    }

    async fn watch_grant(&self, grant: &Grant) -> Result<LeaderWatch> {
        local::watch(Arc::clone(&self.inner), &grant.election, Some(grant.token)).await
    }

    async fn elections(&self) -> Result<Vec<ElectionState>> {
        let now = self.inner.clock.now();
        let state = self.inner.state();
        Ok(state
            .elections
            .keys()
            .map(|name| ElectionState {
                election: name.clone(),
                leader: state.leader(name, now),
            })
            .collect())
    }
}
