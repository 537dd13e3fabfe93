//! The primitive in one process: the reference every backend is compared
//! with, and the store of the simulation.
//!
//! Its sessions expire on an injectable [`Clock`]; a task ends each one
//! that keeps keys at its expiry, so that watches hear of it then.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use super::{Check, Entry, Heard, KeyWatch, Keys, Properties, Range, Revision, Write};
use crate::clock::{Clock, Instant, TokioClock};
use crate::config::StoreTtl;
use crate::error::{Error, Result};
use crate::grant::{FencingToken, SessionId, SessionLease};
use crate::watch;

/// How this store keeps a TTL: exactly.
const TTL: StoreTtl = StoreTtl {
    store: "the memory store",
    unit: Duration::from_nanos(1),
    max: Duration::MAX,
};

/// The fewest watches kept before those nobody reads are forgotten.
const PRUNE_AT: usize = 64;

/// How many deletions are kept for watches that start from before them.
const TOMBSTONES: usize = 4096;

/// The largest revision: the largest fencing token.
const LAST_REVISION: u64 = FencingToken::LAST.0;

/// Keys in memory. Cloning gives another handle onto the same keys.
#[derive(Clone, Debug)]
pub struct MemoryKeys {
    clock: Arc<dyn Clock>,
    shared: Arc<Shared>,
    /// Dropped with the last handle (after `shared`), which ends the
    /// task that ends expired sessions.
    handle: Arc<Handle>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    reaping: AtomicBool,
}

/// Wakes the task that ends expired sessions: when a key is attached to
/// a session (its expiry may be the next), and when the last handle goes.
#[derive(Debug, Default)]
struct Handle {
    wake: Arc<Notify>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

#[derive(Debug, Default)]
struct State {
    revision: u64,
    next_session: u64,
    sessions: HashMap<SessionId, Session>,
    keys: BTreeMap<String, Stored>,
    /// The revision at which each key that is gone was deleted, for
    /// watches that start from before; at most [`TOMBSTONES`] of them.
    deleted: BTreeMap<String, Revision>,
    /// The latest deletion forgotten: a watch that starts from before it
    /// is told of a change at once (its reader reads again, and finds
    /// what there is).
    forgotten: Revision,
    watches: Vec<(String, watch::Sender<Heard>)>,
    /// When the task that ends expired sessions is to look next; `None`
    /// while it waits for a key to be attached to a session.
    reap_at: Option<Instant>,
    /// The watches dropped by their readers are forgotten when this many
    /// are kept (and at every write).
    prune_at: usize,
}

#[derive(Debug, Clone, Copy)]
struct Session {
    expires_at: Instant,
    ttl: Duration,
}

#[derive(Debug, Clone)]
struct Stored {
    value: String,
    session: Option<SessionId>,
    created: Revision,
    modified: Revision,
}

impl Default for MemoryKeys {
    fn default() -> Self {
        MemoryKeys::new()
    }
}

impl MemoryKeys {
    /// Keys whose sessions expire by the host's monotonic clock.
    pub fn new() -> Self {
        MemoryKeys::with_clock(Arc::new(TokioClock))
    }

    /// Keys whose sessions expire by `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        let state = State {
            next_session: 1,
            prune_at: PRUNE_AT,
            ..State::default()
        };
        MemoryKeys {
            clock,
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                reaping: AtomicBool::new(false),
            }),
            handle: Arc::new(Handle::default()),
        }
    }

    /// Test support: sets the store's last revision, as a damaged store
    /// might hold it.
    #[cfg(any(test, feature = "testing"))]
    pub fn set_revision(&self, last: u64) {
        self.state().0.revision = last;
    }

    /// The state, with every session that expired by now ended.
    fn state(&self) -> (MutexGuard<'_, State>, Instant) {
        lock(&self.shared, &*self.clock)
    }

    /// Starts the task that ends expired sessions unless it runs (it
    /// ends with its runtime: a handle used on another runtime later
    /// starts another there); `true` if this started it.
    fn reaping(&self) -> bool {
        if self.shared.reaping.swap(true, Ordering::Relaxed) {
            return false;
        }
        // Made before the task: dropped with it, even unpolled.
        let running = Reaping(Arc::downgrade(&self.shared));
        let (wake, clock) = (Arc::clone(&self.handle.wake), Arc::clone(&self.clock));
        let shared = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            let _running = running;
            reap(shared, wake, clock).await;
        });
        true
    }
}

/// `shared`'s state, with every session that expired by now ended.
fn lock<'a>(shared: &'a Shared, clock: &dyn Clock) -> (MutexGuard<'a, State>, Instant) {
    // Every change below is made whole before the lock is let go, so a
    // panic elsewhere cannot leave it half made: recover the guard.
    let mut state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
    let now = clock.now();
    let expired: Vec<SessionId> = state
        .sessions
        .iter()
        .filter(|(_, s)| s.expires_at <= now)
        .map(|(&id, _)| id)
        .collect();
    for session in expired {
        state.end(session);
    }
    (state, now)
}

/// Says that the task that ends expired sessions no longer runs, when it
/// ends (with its runtime, say).
struct Reaping(Weak<Shared>);

impl Drop for Reaping {
    fn drop(&mut self) {
        if let Some(shared) = self.0.upgrade() {
            shared
                .state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .reap_at = None;
            shared.reaping.store(false, Ordering::Relaxed);
        }
    }
}

/// Ends each session that keeps keys at its expiry, so that watches hear
/// of it then; returns once every handle is gone.
async fn reap(shared: Weak<Shared>, wake: Arc<Notify>, clock: Arc<dyn Clock>) {
    loop {
        let next = {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let (mut state, _) = lock(&shared, &*clock);
            state.reap_at = state.next_expiry();
            state.reap_at
        };
        let expiry = match next {
            Some(at) => clock.sleep_until(at),
            None => Box::pin(std::future::pending()),
        };
        tokio::select! {
            () = expiry => {}
            () = wake.notified() => {}
        }
    }
}

impl State {
    /// When the first session that keeps a key expires.
    fn next_expiry(&self) -> Option<Instant> {
        self.keys
            .values()
            .filter_map(|k| k.session)
            .filter_map(|s| self.sessions.get(&s))
            .map(|s| s.expires_at)
            .min()
    }

    /// Ends `session` and deletes its keys, at a new revision if it had
    /// any.
    fn end(&mut self, session: SessionId) {
        self.sessions.remove(&session);
        let gone: Vec<String> = self
            .keys
            .iter()
            .filter(|(_, k)| k.session == Some(session))
            .map(|(key, _)| key.clone())
            .collect();
        if gone.is_empty() {
            return;
        }
        self.revision += 1;
        for key in &gone {
            self.delete(key);
        }
        self.tell(&gone);
    }

    fn delete(&mut self, key: &str) {
        if self.keys.remove(key).is_some() {
            self.deleted.insert(key.to_owned(), Revision(self.revision));
            if self.deleted.len() > TOMBSTONES {
                self.forget_older_half();
            }
        }
    }

    /// Forgets the older half of the deletions kept for watches, so that
    /// a process that opens and ends sessions for ever keeps a bounded
    /// record.
    fn forget_older_half(&mut self) {
        let mut at: Vec<Revision> = self.deleted.values().copied().collect();
        at.sort_unstable();
        let floor = at[at.len() / 2];
        self.deleted.retain(|_, revision| *revision > floor);
        self.forgotten = self.forgotten.max(floor);
    }

    fn holds(&self, check: &Check) -> bool {
        match check {
            Check::Absent(key) => !self.keys.contains_key(key),
            Check::Created {
                key,
                revision,
                session,
            } => self
                .keys
                .get(key)
                .is_some_and(|k| k.created == *revision && k.session == *session),
            Check::NoneUnder(prefix) => self.under(prefix).next().is_none(),
        }
    }

    fn under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a String, &'a Stored)> {
        self.keys
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |(key, _)| key.starts_with(prefix))
    }

    /// Applies `writes` at a new revision, unless none changes anything
    /// (deletes of keys that are not there).
    fn apply(&mut self, writes: &[Write]) {
        let changes = writes.iter().any(|w| match w {
            Write::Put { .. } => true,
            Write::Delete(key) => self.keys.contains_key(key),
        });
        if !changes {
            return;
        }
        self.revision += 1;
        let revision = Revision(self.revision);
        for write in writes {
            match write {
                Write::Put {
                    key,
                    value,
                    session,
                } => {
                    let created = self.keys.get(key).map_or(revision, |k| k.created);
                    self.deleted.remove(key);
                    self.keys.insert(
                        key.clone(),
                        Stored {
                            value: value.clone(),
                            session: *session,
                            created,
                            modified: revision,
                        },
                    );
                }
                Write::Delete(key) => self.delete(key),
            }
        }
        let written: Vec<String> = writes
            .iter()
            .map(|w| match w {
                Write::Put { key, .. } | Write::Delete(key) => key.clone(),
            })
            .collect();
        self.tell(&written);
    }

    /// Tells the watches of a prefix of any of `keys` that they changed
    /// at the current revision; forgets the watches nobody reads.
    fn tell(&mut self, keys: &[String]) {
        let revision = Revision(self.revision);
        self.watches.retain(|(prefix, tx)| {
            if keys.iter().any(|key| key.starts_with(prefix.as_str())) {
                tx.send_replace(Heard::Changed(revision));
            }
            !tx.is_closed()
        });
    }

    /// Whether anything under `prefix` changed after `from` (or may have:
    /// a deletion since forgotten).
    fn changed_since(&self, prefix: &str, from: Revision) -> bool {
        from < self.forgotten
            || self.under(prefix).any(|(_, k)| k.modified > from)
            || self
                .deleted
                .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
                .take_while(|(key, _)| key.starts_with(prefix))
                .any(|(_, &at)| at > from)
    }
}

#[async_trait]
impl Keys for MemoryKeys {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        let ttl = TTL.check(ttl)?.ttl;
        let (mut state, now) = self.state();
        let id = SessionId(state.next_session);
        state.next_session += 1;
        let expires_at = now + ttl;
        state.sessions.insert(id, Session { expires_at, ttl });
        Ok(SessionLease { id, ttl })
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        let (mut state, now) = self.state();
        let Some(entry) = state.sessions.get_mut(&session) else {
            return Err(Error::SessionExpired(session));
        };
        entry.expires_at = now + entry.ttl;
        Ok(entry.ttl)
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        self.state().0.end(session);
        Ok(())
    }

    async fn commit(&self, checks: &[Check], writes: &[Write]) -> Result<Option<Revision>> {
        let (mut state, _) = self.state();
        if !checks.iter().all(|check| state.holds(check)) {
            return Ok(None);
        }
        if state.revision >= LAST_REVISION {
            return Err(Error::Corrupt(format!(
                "the memory store's revisions are exhausted: its last is {}, the largest \
                 token a store keeps; nothing was written",
                state.revision
            )));
        }
        for write in writes {
            if let Write::Put {
                session: Some(session),
                ..
            } = write
                && !state.sessions.contains_key(session)
            {
                return Err(Error::SessionExpired(*session));
            }
        }
        state.apply(writes);
        let revision = Revision(state.revision);
        // The task looks again if a key's session expires before it was
        // to look.
        let sooner = writes
            .iter()
            .filter_map(Write::session)
            .filter_map(|session| state.sessions.get(&session))
            .any(|s| state.reap_at.is_none_or(|at| s.expires_at < at));
        drop(state);
        if !self.reaping() && sooner {
            self.handle.wake.notify_one();
        }
        Ok(Some(revision))
    }

    async fn range(&self, prefix: &str) -> Result<Range> {
        let (state, now) = self.state();
        let entries = state
            .under(prefix)
            .map(|(key, k)| Entry {
                key: key.clone(),
                value: k.value.clone(),
                session: k.session,
                created: k.created,
                modified: k.modified,
                expires_in: k
                    .session
                    .and_then(|s| state.sessions.get(&s))
                    .map(|s| s.expires_at - now),
            })
            .collect();
        Ok(Range {
            entries,
            revision: Revision(state.revision),
        })
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<KeyWatch> {
        self.reaping();
        let (mut state, _) = self.state();
        // A revision the store has not reached yet: from its last.
        let from = from.min(Revision(state.revision));
        let (tx, rx) = watch::channel(Heard::Changed(from));
        if state.changed_since(prefix, from) {
            tx.send_replace(Heard::Changed(Revision(state.revision)));
        }
        if state.watches.len() >= state.prune_at {
            state.watches.retain(|(_, tx)| !tx.is_closed());
            state.prune_at = (2 * state.watches.len()).max(PRUNE_AT);
        }
        state.watches.push((prefix.to_owned(), tx));
        Ok(rx)
    }

    fn properties(&self) -> Properties {
        Properties {
            tells_expiries: true,
            grants_from: None,
            clock: Arc::clone(&self.clock),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest token is granted; after it, a commit is refused as
    /// corrupt and writes nothing.
    fn put(key: &str, session: Option<SessionId>) -> Write {
        Write::Put {
            key: key.to_owned(),
            value: String::new(),
            session,
        }
    }

    /// A handle used on a runtime that is gone still tells expiries on the
    /// next one (its task ended with the first).
    #[test]
    fn expiries_are_told_on_a_later_runtime() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("runtime")
        };
        let keys = MemoryKeys::new();
        runtime().block_on(async {
            let session = keys
                .open_session(Duration::from_secs(30))
                .await
                .expect("open");
            keys.commit(&[], &[put("first", Some(session.id))])
                .await
                .expect("put");
        });
        runtime().block_on(async {
            let session = keys
                .open_session(Duration::from_millis(50))
                .await
                .expect("open");
            keys.commit(&[], &[put("k", Some(session.id))])
                .await
                .expect("put");
            let at = keys.range("k").await.expect("range").revision;
            let mut watch = keys.watch("k", at).await.expect("watch");
            tokio::time::timeout(Duration::from_secs(5), watch.changed())
                .await
                .expect("the expiry is told")
                .expect("open");
        });
    }

    /// Watches dropped on a store nobody writes to are forgotten all the
    /// same.
    #[tokio::test]
    async fn dropped_watches_are_forgotten_without_writes() {
        let keys = MemoryKeys::new();
        for _ in 0..10_000 {
            drop(keys.watch("p", Revision(0)).await.expect("watch"));
        }
        let kept = keys.state().0.watches.len();
        assert!(kept <= PRUNE_AT, "{kept} watches kept");
    }

    /// A commit that changes nothing (a delete of a key that is not there)
    /// takes no revision and wakes nobody; a watch from a revision the
    /// store has not reached starts from its last.
    #[tokio::test]
    async fn a_commit_that_changes_nothing_is_no_change() {
        let keys = MemoryKeys::new();
        let written = keys.commit(&[], &[put("a", None)]).await.expect("put");
        let watch = keys.watch("z", Revision(1_000)).await.expect("watch");
        assert_eq!(*watch.borrow(), Heard::Changed(Revision(1)));
        let nothing = keys.commit(&[], &[Write::Delete("z-absent".into())]).await;
        assert_eq!(nothing.expect("commit"), written);
        assert!(!watch.has_changed().expect("open"), "woken by no change");
    }

    /// Deletions kept for watches stay bounded however many keys come and
    /// go; a watch from before a forgotten one is told at once.
    #[tokio::test]
    async fn the_record_of_deletions_stays_bounded() {
        let keys = MemoryKeys::new();
        let put = |key: String| Write::Put {
            key,
            value: String::new(),
            session: None,
        };
        let start = keys.range("").await.expect("range").revision;
        for i in 0..3 * TOMBSTONES {
            let key = format!("k{i}");
            keys.commit(&[], &[put(key.clone())]).await.expect("put");
            keys.commit(&[], &[Write::Delete(key)])
                .await
                .expect("delete");
        }
        let kept = keys.state().0.deleted.len();
        assert!(kept <= TOMBSTONES, "{kept} deletions kept");
        let mut watch = keys.watch("k1", start).await.expect("watch");
        assert!(
            watch.has_changed().expect("open"),
            "a forgotten change is told"
        );
        let now = keys.range("").await.expect("range").revision;
        let quiet = keys.watch("k1", now).await.expect("watch");
        assert!(!quiet.has_changed().expect("open"));
        keys.commit(&[], &[put("k1".into())]).await.expect("put");
        assert!(quiet.has_changed().expect("open"));
        let _ = watch.borrow_and_update();
    }

    #[tokio::test]
    async fn exhausted_revisions_are_corrupt() {
        let keys = MemoryKeys::new();
        keys.set_revision(LAST_REVISION - 1);
        let put = |key: &str| Write::Put {
            key: key.to_owned(),
            value: String::new(),
            session: None,
        };
        let last = keys.commit(&[], &[put("a")]).await.expect("commit");
        assert_eq!(last, Some(Revision(LAST_REVISION)));
        let refused = keys.commit(&[], &[put("b")]).await;
        assert!(matches!(refused, Err(Error::Corrupt(_))), "{refused:?}");
        let left = keys.range("").await.expect("range");
        assert_eq!(left.entries.len(), 1);
        assert_eq!(left.revision, Revision(LAST_REVISION));
    }
}
