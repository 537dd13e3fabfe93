//! Reads that the callers of one store handle share: while a read of a key
//! is on its way, the callers that ask for the same key wait, and the next
//! read answers all of them at once. A read never answers a caller that
//! asked after it started, so each caller still sees every write that
//! finished before it asked (the read is as fresh as one of its own).
//!
//! A process with a thousand sessions waiting for one election reads the
//! line of standbys once per round instead of a thousand times at once;
//! the shards of a group, each reading the group's members, read them once.
//! [`SharedRanges`] shares the reads of any store primitive so.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

use crate::grant::{SessionId, SessionLease};
use crate::store::keys::{Check, KeyWatch, Keys, Properties, Range, Revision, Write};

/// Shared reads by key `K` of values `V`.
pub(crate) struct SharedReads<K, V> {
    keys: Mutex<HashMap<K, Arc<Slot<V>>>>,
}

struct Slot<V> {
    /// How many callers have asked so far.
    asked: AtomicU64,
    /// One read at a time; the last one that succeeded, with how many
    /// callers had asked when it started.
    last: tokio::sync::Mutex<Option<(u64, V)>>,
}

impl<K, V> std::fmt::Debug for SharedReads<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReads").finish_non_exhaustive()
    }
}

impl<K, V> Default for SharedReads<K, V> {
    fn default() -> Self {
        SharedReads {
            keys: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> SharedReads<K, V> {
    /// The value of `key`: from a read that started after this call did,
    /// made by `read` or by another caller's. A failed read answers only
    /// its own caller; the others read again.
    pub(crate) async fn read<E, F>(&self, key: &K, read: impl FnOnce() -> F) -> Result<V, E>
    where
        F: Future<Output = Result<V, E>>,
    {
        let slot = {
            let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(keys.entry(key.clone()).or_insert_with(|| {
                Arc::new(Slot {
                    asked: AtomicU64::new(0),
                    last: tokio::sync::Mutex::new(None),
                })
            }))
        };
        let me = slot.asked.fetch_add(1, Ordering::SeqCst);
        let value = {
            let mut last = slot.last.lock().await;
            match &*last {
                Some((started, value)) if me < *started => Ok(value.clone()),
                _ => {
                    // Every caller counted so far asked before this read.
                    let started = slot.asked.load(Ordering::SeqCst);
                    let value = read().await;
                    *last = value.as_ref().ok().map(|v| (started, v.clone()));
                    value
                }
            }
        };
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        // Nobody else holds the slot (the map and this call do): forget it.
        if Arc::strong_count(&slot) == 2 {
            keys.remove(key);
        }
        value
    }
}

/// The primitive `K` whose reads of a prefix ([`Keys::range`]) the callers
/// of one handle share ([`SharedReads`]); everything else goes to `K`
/// unchanged.
#[derive(Debug)]
pub(crate) struct SharedRanges<K> {
    pub(crate) keys: K,
    /// What the store tells of itself, read once.
    pub(crate) properties: Properties,
    reads: SharedReads<String, Range>,
}

impl<K: Keys> SharedRanges<K> {
    pub(crate) fn new(keys: K) -> Self {
        SharedRanges {
            properties: keys.properties(),
            keys,
            reads: SharedReads::default(),
        }
    }

    /// Whether the store's watches tell expiries
    /// ([`Properties::tells_expiries`]).
    pub(crate) fn tells_expiries(&self) -> bool {
        self.properties.tells_expiries
    }

    /// Sleeps on the store's clock.
    pub(crate) fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.properties.clock.sleep(duration)
    }
}

#[async_trait]
impl<K: Keys> Keys for SharedRanges<K> {
    async fn open_session(&self, ttl: Duration) -> crate::Result<SessionLease> {
        self.keys.open_session(ttl).await
    }

    async fn keep_alive(&self, session: SessionId) -> crate::Result<Duration> {
        self.keys.keep_alive(session).await
    }

    async fn close_session(&self, session: SessionId) -> crate::Result<()> {
        self.keys.close_session(session).await
    }

    async fn commit(&self, checks: &[Check], writes: &[Write]) -> crate::Result<Option<Revision>> {
        self.keys.commit(checks, writes).await
    }

    async fn range(&self, prefix: &str) -> crate::Result<Range> {
        self.reads
            .read(&prefix.to_owned(), || self.keys.range(prefix))
            .await
    }

    async fn watch(&self, prefix: &str, from: Revision) -> crate::Result<KeyWatch> {
        self.keys.watch(prefix, from).await
    }

    async fn session_ended(&self, session: SessionId) {
        self.keys.session_ended(session).await;
    }

    async fn time_left(&self, session: SessionId) -> crate::Result<Option<Duration>> {
        self.keys.time_left(session).await
    }

    fn properties(&self) -> Properties {
        self.properties.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;

    /// Callers that ask while a read is on its way share the next read;
    /// none is answered by a read that started before it asked.
    #[tokio::test(start_paused = true)]
    async fn callers_share_the_next_read_never_an_earlier_one() {
        let reads = Arc::new(SharedReads::<&str, usize>::default());
        let store = Arc::new(AtomicUsize::new(0));
        let started = Arc::new(AtomicUsize::new(0));
        let read = |store: Arc<AtomicUsize>, started: Arc<AtomicUsize>| async move {
            started.fetch_add(1, Ordering::SeqCst);
            let value = store.load(Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, ()>(value)
        };
        // A first read is on its way.
        let first = tokio::spawn({
            let (reads, store, started) = (reads.clone(), store.clone(), started.clone());
            async move { reads.read(&"line", || read(store, started)).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        // A write lands, then ten callers ask.
        store.store(7, Ordering::SeqCst);
        let mut later = Vec::new();
        for _ in 0..10 {
            let (reads, store, started) = (reads.clone(), store.clone(), started.clone());
            later.push(tokio::spawn(async move {
                reads.read(&"line", || read(store, started)).await
            }));
        }
        assert_eq!(first.await.expect("task"), Ok(0));
        for caller in later {
            assert_eq!(
                caller.await.expect("task"),
                Ok(7),
                "answered by an older read"
            );
        }
        assert_eq!(started.load(Ordering::SeqCst), 2, "the ten shared one read");
        assert!(
            reads.keys.lock().expect("lock").is_empty(),
            "the slot is kept"
        );
    }

    /// A failed read answers only its caller: the others read again.
    #[tokio::test(start_paused = true)]
    async fn a_failed_read_is_not_shared() {
        let reads = Arc::new(SharedReads::<&str, usize>::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let mut callers = Vec::new();
        for _ in 0..3 {
            let (reads, calls) = (reads.clone(), calls.clone());
            callers.push(tokio::spawn(async move {
                reads
                    .read(&"line", || async move {
                        let n = calls.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if n == 1 { Err("refused") } else { Ok(n) }
                    })
                    .await
            }));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let answers: Vec<_> = futures_join(callers).await;
        assert_eq!(answers[0], Ok(0));
        assert_eq!(answers[1], Err("refused"));
        assert_eq!(answers[2], Ok(2), "the third read again after the failure");
    }

    async fn futures_join<T>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
        let mut out = Vec::new();
        for task in tasks {
            out.push(task.await.expect("task"));
        }
        out
    }
}
