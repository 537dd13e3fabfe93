//! A [`Store`] wrapper that counts what one client asks of the store and
//! how often the store's watches wake it, so that a test can show which
//! candidates a handover touched ("no herd") without timing anything.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::{Call, Request, Wrapper};
use crate::store::Store;
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

impl Wrapper for CountingStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn around<'a, T: Send + 'a>(&'a self, call: Call, request: Request<'a, T>) -> Request<'a, T> {
        let c = &self.counters;
        let counter = match call {
            Call::OpenSession
            | Call::CloseSession
            | Call::Resign
            | Call::PutNote
            | Call::AmendNote
            | Call::DeleteNote => Some(&c.writes),
            Call::KeepAlive => Some(&c.renewals),
            Call::Campaign => Some(&c.campaigns),
            Call::TryCampaignUnwaited => Some(&c.unwaited),
            Call::Leader | Call::Elections | Call::Notes | Call::LastRelease => Some(&c.reads),
            // A watch is counted as it is handed out (`watched`).
            Call::Watch
            | Call::WatchGrant
            | Call::WatchStatus
            | Call::WatchNote
            | Call::WatchNotes
            | Call::WatchNotesSinceUnwaited
            | Call::ReleaseOrphaned => None,
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, Ordering::SeqCst);
        }
        request
    }

    fn watched<T: Clone + Send + Sync + 'static>(
        &self,
        _: Call,
        watch: watch::Receiver<T>,
    ) -> watch::Receiver<T> {
        self.counted(watch)
    }
}
