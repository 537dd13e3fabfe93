//! A fault-injecting [`Store`] wrapper: the same trait, so any backend can be
//! made slow, lossy or unavailable without mocks. (The fault point inside
//! every backend's watch task, for what a wrapper cannot reach, is in the
//! store's watch module; [`super::fail_watch_reads`] re-exports it.)

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::{Call, Request, Wrapper};
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::store::{Grant, Store};

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
    /// a grant never arrives (the future stays pending): a holder the
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

    /// A keep-alive: lost on the way, or answered late.
    async fn keep_alive<T>(&self, request: Request<'_, T>) -> Result<T> {
        if self.drop_keep_alives.load(Ordering::SeqCst) {
            return std::future::pending().await;
        }
        self.keep_alives_sent.fetch_add(1, Ordering::SeqCst);
        let outcome = request.await;
        let delay = *self
            .keep_alive_reply_delay
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if !delay.is_zero() {
            self.clock.sleep(delay).await;
        }
        outcome
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

impl Wrapper for FaultyStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn around<'a, T: Send + 'a>(&'a self, call: Call, request: Request<'a, T>) -> Request<'a, T> {
        Box::pin(async move {
            self.check()?;
            match call {
                Call::KeepAlive => self.keep_alive(request).await,
                Call::DeleteNote
                    if self
                        .failing_note_deletes
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok() =>
                {
                    Err(Error::Unavailable {
                        reason: "fault injected: the connection closed".into(),
                        source: None,
                    })
                }
                _ => request.await,
            }
        })
    }

    fn granted<'a>(&'a self, _: &'a Grant) -> Request<'a, ()> {
        Box::pin(async move {
            if self.withhold_grants.load(Ordering::SeqCst) {
                return std::future::pending().await;
            }
            Ok(())
        })
    }
}
