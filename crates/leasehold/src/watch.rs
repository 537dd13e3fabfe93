//! A "latest value" channel with a deterministic wake order: a drop-in
//! replacement for the subset of [`tokio::sync::watch`] this crate uses.
//!
//! # Why not `tokio::sync::watch`
//!
//! tokio's watch spreads waiting receivers over eight internal `Notify`s,
//! picking one at random for each waiter, so the order in which receivers
//! wake after a send depends on tokio's thread-local RNG. That RNG can only be
//! seeded under `--cfg tokio_unstable`, so a deterministic simulation
//! (single-threaded runtime, paused time) could not replay a seed exactly.
//!
//! # Wake-order guarantee
//!
//! This channel keeps every waiting receiver in one [`tokio::sync::Notify`],
//! whose [`notify_waiters`](tokio::sync::Notify::notify_waiters) wakes its
//! waiters first-in, first-out. A receiver starts waiting at the first poll
//! of [`Receiver::changed`] (or [`Receiver::wait_for`]) that finds nothing
//! new, so **the receivers woken by one send are woken in the order in which
//! they began waiting**. On a current-thread runtime they therefore become
//! runnable, and run, in that order. The same holds for the tasks woken by
//! [`Sender::closed`] when the last receiver is dropped, and for the wake-up
//! of all receivers when the last sender is dropped. A `changed` future
//! dropped before completing (a lost `select!` branch) leaves the wait list;
//! the next call joins it at the back.
//!
//! # Semantics
//!
//! Names, signatures and semantics follow [`tokio::sync::watch`] (tokio 1.54),
//! so `use crate::watch;` can replace `use tokio::sync::watch;` unchanged.
//! The value lives behind a [`std::sync::RwLock`]: as with tokio, a [`Ref`]
//! holds a read lock and must be short-lived and never held across `.await`.
//! A panic inside [`Sender::send_if_modified`]'s closure leaves the
//! (possibly partly modified) value in place without notifying anyone, as in
//! tokio; lock poisoning is ignored.

use std::fmt;
use std::ops;
use std::pin::pin;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use tokio::sync::Notify;
use tokio::task::coop::cooperative;

/// The lowest bit of [`Shared::state`]: set once every sender is dropped.
const CLOSED: usize = 1;
/// How much each send adds to [`Shared::state`] (the bits above [`CLOSED`]).
const STEP: usize = 2;

/// Error types, as in `tokio::sync::watch::error`.
pub mod error {
    use std::fmt;

    /// Error returned by [`Sender::send`](super::Sender::send) when there is
    /// no receiver; it gives the value back.
    #[derive(PartialEq, Eq, Clone, Copy)]
    pub struct SendError<T>(pub T);

    impl<T> fmt::Debug for SendError<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("SendError").finish_non_exhaustive()
        }
    }

    impl<T> fmt::Display for SendError<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("channel closed")
        }
    }

    impl<T> std::error::Error for SendError<T> {}

    /// Error returned when waiting for a change after every sender was
    /// dropped and the last value was already seen.
    #[derive(Debug, Clone)]
    pub struct RecvError(pub(super) ());

    impl fmt::Display for RecvError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("channel closed")
        }
    }

    impl std::error::Error for RecvError {}
}

/// State shared by all the handles of one channel.
struct Shared<T> {
    /// The latest value.
    value: RwLock<T>,
    /// The version of `value` times [`STEP`], plus [`CLOSED`] once every
    /// sender is dropped. Only bumped while `value` is write-locked, so a
    /// reader holding the read lock sees the version of the value it reads.
    state: AtomicUsize,
    /// Number of live [`Receiver`]s.
    receivers: AtomicUsize,
    /// Number of live [`Sender`]s.
    senders: AtomicUsize,
    /// Wakes receivers, FIFO, on each send and when the last sender drops.
    changed: Notify,
    /// Wakes [`Sender::closed`] waiters, FIFO, when the last receiver drops.
    closed: Notify,
}

impl<T> Shared<T> {
    fn read(&self) -> RwLockReadGuard<'_, T> {
        // A panic while the value was write-locked (in a `send_if_modified`
        // closure) left no version bump behind, just as tokio's does; the
        // value is still the latest one, so poisoning carries no information.
        self.value.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn version(&self) -> usize {
        self.state.load(SeqCst) & !CLOSED
    }

    fn is_closed(&self) -> bool {
        self.state.load(SeqCst) & CLOSED != 0
    }
}

impl<T: fmt::Debug> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("value", &self.value)
            .field("version", &(self.version() / STEP))
            .field("is_closed", &self.is_closed())
            .field("receivers", &self.receivers.load(SeqCst))
            .field("senders", &self.senders.load(SeqCst))
            .finish()
    }
}

/// A borrowed reference to the value; holds the channel's read lock.
#[derive(Debug)]
pub struct Ref<'a, T> {
    inner: RwLockReadGuard<'a, T>,
    has_changed: bool,
}

impl<T> Ref<'_, T> {
    /// Whether the borrowed value had not been marked seen by the receiver it
    /// was borrowed from. Always `false` when borrowed from a [`Sender`].
    pub fn has_changed(&self) -> bool {
        self.has_changed
    }
}

impl<T> ops::Deref for Ref<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.inner
    }
}

/// Creates a channel holding `init`, which the returned receiver has seen.
pub fn channel<T>(init: T) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        value: RwLock::new(init),
        state: AtomicUsize::new(0),
        receivers: AtomicUsize::new(1),
        senders: AtomicUsize::new(1),
        changed: Notify::new(),
        closed: Notify::new(),
    });
    let rx = Receiver {
        shared: Arc::clone(&shared),
        version: 0,
    };
    (Sender { shared }, rx)
}

/// The sending half; cloneable. Dropping the last sender closes the channel.
#[derive(Debug)]
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Sender<T> {
    /// Creates a channel holding `init` with no receiver yet (see
    /// [`Sender::subscribe`]).
    pub fn new(init: T) -> Self {
        channel(init).0
    }

    /// Replaces the value and notifies every receiver; fails, giving the
    /// value back, when there is no receiver.
    pub fn send(&self, value: T) -> Result<(), error::SendError<T>> {
        if self.receiver_count() == 0 {
            return Err(error::SendError(value));
        }
        self.send_replace(value);
        Ok(())
    }

    /// Modifies the value in place and notifies every receiver, even if
    /// there is none.
    pub fn send_modify<F>(&self, modify: F)
    where
        F: FnOnce(&mut T),
    {
        self.send_if_modified(|value| {
            modify(value);
            true
        });
    }

    /// Modifies the value in place; when `modify` returns `true`, the change
    /// is published (receivers see a new version and are woken). Returns what
    /// `modify` returned. Works with no receiver.
    ///
    /// `modify` runs under the write lock: it must not touch the channel.
    pub fn send_if_modified<F>(&self, modify: F) -> bool
    where
        F: FnOnce(&mut T) -> bool,
    {
        {
            let mut value = self
                .shared
                .value
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            if !modify(&mut value) {
                return false;
            }
            // Bump while locked, so readers see versions matching values.
            self.shared.state.fetch_add(STEP, SeqCst);
        }
        self.shared.changed.notify_waiters();
        true
    }

    /// Replaces the value, notifies every receiver (even if there is none),
    /// and returns the previous value.
    pub fn send_replace(&self, mut value: T) -> T {
        self.send_modify(|old| std::mem::swap(old, &mut value));
        value
    }

    /// Borrows the current value; its [`Ref::has_changed`] is `false`.
    pub fn borrow(&self) -> Ref<'_, T> {
        Ref {
            inner: self.shared.read(),
            has_changed: false,
        }
    }

    /// Whether every receiver has been dropped.
    pub fn is_closed(&self) -> bool {
        self.receiver_count() == 0
    }

    /// Completes once there is no receiver. Cancel-safe. A later
    /// [`Sender::subscribe`] reopens the channel.
    pub async fn closed(&self) {
        cooperative(async {
            while self.receiver_count() > 0 {
                // Register before re-checking, so that the last receiver
                // dropping in between still wakes us.
                let mut notified = pin!(self.shared.closed.notified());
                notified.as_mut().enable();
                if self.receiver_count() == 0 {
                    return;
                }
                notified.await;
            }
        })
        .await;
    }

    /// Creates a receiver that has seen the current value.
    pub fn subscribe(&self) -> Receiver<T> {
        Receiver::new(Arc::clone(&self.shared), self.shared.version())
    }

    /// The number of live receivers.
    pub fn receiver_count(&self) -> usize {
        self.shared.receivers.load(SeqCst)
    }

    /// The number of live senders.
    pub fn sender_count(&self) -> usize {
        self.shared.senders.load(SeqCst)
    }

    /// Whether both senders belong to the same channel.
    pub fn same_channel(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, SeqCst);
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T: Default> Default for Sender<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, SeqCst) == 1 {
            self.shared.state.fetch_or(CLOSED, SeqCst);
            self.shared.changed.notify_waiters();
        }
    }
}

/// The receiving half; cloneable (a clone has seen what the original has).
#[derive(Debug)]
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
    /// The version last marked seen, times [`STEP`].
    version: usize,
}

impl<T> Receiver<T> {
    fn new(shared: Arc<Shared<T>>, version: usize) -> Self {
        shared.receivers.fetch_add(1, SeqCst);
        Self { shared, version }
    }

    /// Borrows the current value without marking it seen.
    pub fn borrow(&self) -> Ref<'_, T> {
        let inner = self.shared.read();
        // Under the read lock the version cannot move.
        let has_changed = self.shared.version() != self.version;
        Ref { inner, has_changed }
    }

    /// Borrows the current value and marks it seen.
    pub fn borrow_and_update(&mut self) -> Ref<'_, T> {
        let inner = self.shared.read();
        let version = self.shared.version();
        let has_changed = version != self.version;
        self.version = version;
        Ref { inner, has_changed }
    }

    /// Whether there is a value not yet marked seen; `Err` once every sender
    /// is dropped (even if there is such a value).
    pub fn has_changed(&self) -> Result<bool, error::RecvError> {
        let state = self.shared.state.load(SeqCst);
        if state & CLOSED != 0 {
            return Err(error::RecvError(()));
        }
        Ok(state & !CLOSED != self.version)
    }

    /// Whether every sender has been dropped.
    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }

    /// Marks the current value as not seen, so that [`Receiver::changed`]
    /// completes at once.
    pub fn mark_changed(&mut self) {
        self.version = self.version.wrapping_sub(STEP);
    }

    /// Marks the current value as seen.
    pub fn mark_unchanged(&mut self) {
        self.version = self.shared.version();
    }

    /// Waits for a value not yet marked seen, and marks it seen (without
    /// borrowing it). Cancel-safe.
    ///
    /// Returns `Err` once every sender is dropped and the latest value was
    /// seen; an unseen value is reported first with `Ok`. Waiting receivers
    /// are woken in the order in which they began waiting (module docs).
    pub async fn changed(&mut self) -> Result<(), error::RecvError> {
        cooperative(changed(&self.shared, &mut self.version)).await
    }

    /// Waits until the value satisfies `f`, marks it seen and borrows it.
    /// The current value is tested first, even if already seen. Cancel-safe.
    ///
    /// Returns `Err` once every sender is dropped and the latest value
    /// (tested once) does not satisfy `f`.
    pub async fn wait_for(
        &mut self,
        mut f: impl FnMut(&T) -> bool,
    ) -> Result<Ref<'_, T>, error::RecvError> {
        cooperative(async move {
            let mut closed = false;
            loop {
                {
                    let inner = self.shared.read();
                    let version = self.shared.version();
                    let has_changed = version != self.version;
                    self.version = version;
                    if (!closed || has_changed) && f(&inner) {
                        return Ok(Ref { inner, has_changed });
                    }
                }
                if closed {
                    return Err(error::RecvError(()));
                }
                closed = changed(&self.shared, &mut self.version).await.is_err();
            }
        })
        .await
    }

    /// Whether both receivers belong to the same channel.
    pub fn same_channel(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

/// The body of [`Receiver::changed`]: `seen` is the receiver's version.
async fn changed<T>(shared: &Shared<T>, seen: &mut usize) -> Result<(), error::RecvError> {
    loop {
        // Join the FIFO wait list *before* checking the version: a send
        // between the check and the `.await` then still wakes us, and our
        // place in the wake order is fixed here.
        let mut notified = pin!(shared.changed.notified());
        notified.as_mut().enable();
        let state = shared.state.load(SeqCst);
        if state & !CLOSED != *seen {
            *seen = state & !CLOSED;
            return Ok(());
        }
        if state & CLOSED != 0 {
            return Err(error::RecvError(()));
        }
        notified.await;
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        Self::new(Arc::clone(&self.shared), self.version)
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        if self.shared.receivers.fetch_sub(1, SeqCst) == 1 {
            self.shared.closed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::{Arc, Mutex, PoisonError};
    use std::task::{Context, Poll};
    use std::time::Duration;

    use super::{Receiver, Sender, channel};

    /// Polls `fut` exactly once (then drops it); `true` if it completed.
    async fn poll_once<F: Future>(fut: F) -> bool {
        let mut fut = pin!(fut);
        std::future::poll_fn(|cx: &mut Context<'_>| Poll::Ready(fut.as_mut().poll(cx).is_ready()))
            .await
    }

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_are_send_and_sync() {
        assert_send_sync::<Sender<String>>();
        assert_send_sync::<Receiver<String>>();
        assert_send_sync::<super::error::SendError<String>>();
        assert_send_sync::<super::error::RecvError>();
        fn future_is_send<F: Future + Send>(_: F) {}
        let (tx, mut rx) = channel(0_u32);
        future_is_send(rx.changed());
        future_is_send(rx.wait_for(|_| true));
        future_is_send(tx.closed());
    }

    #[tokio::test]
    async fn send_and_changed() {
        let (tx, mut rx) = channel("a");
        assert!(!rx.borrow().has_changed());
        assert_eq!(rx.has_changed().ok(), Some(false));
        assert!(!poll_once(rx.changed()).await, "nothing new yet");

        tx.send("b").expect("a receiver exists");
        assert_eq!(rx.has_changed().ok(), Some(true));
        assert!(rx.borrow().has_changed());
        assert_eq!(*rx.borrow(), "b");
        rx.changed().await.expect("open");
        assert!(!rx.borrow().has_changed());
        assert_eq!(*tx.borrow(), "b");
        assert!(!tx.borrow().has_changed());

        // Sends coalesce: one `changed` for several sends.
        tx.send("c").expect("open");
        tx.send("d").expect("open");
        rx.changed().await.expect("open");
        assert!(!poll_once(rx.changed()).await);
        let seen = rx.borrow_and_update();
        assert_eq!(*seen, "d");
        assert!(!seen.has_changed());
        drop(seen);

        rx.mark_changed();
        assert_eq!(rx.has_changed().ok(), Some(true));
        rx.changed().await.expect("open");
        tx.send("e").expect("open");
        rx.mark_unchanged();
        assert!(!poll_once(rx.changed()).await);

        // A clone has seen what the original has.
        tx.send("f").expect("open");
        let mut other = rx.clone();
        assert!(other.same_channel(&rx));
        assert!(!other.same_channel(&channel("x").1));
        assert_eq!(tx.receiver_count(), 2);
        other.changed().await.expect("open");
        rx.changed().await.expect("open");
        drop(other);
        assert_eq!(tx.receiver_count(), 1);
    }

    #[tokio::test]
    async fn send_if_modified_notifies_only_on_change() {
        let (tx, mut rx) = channel(1_u32);
        assert!(!tx.send_if_modified(|_| false));
        assert!(!poll_once(rx.changed()).await);
        assert!(tx.send_if_modified(|v| {
            *v = 2;
            true
        }));
        rx.changed().await.expect("open");
        assert_eq!(*rx.borrow(), 2);
    }

    #[tokio::test]
    async fn changed_wakes_a_waiting_receiver() {
        let (tx, mut rx) = channel(0_u32);
        let waiter = tokio::spawn(async move {
            rx.changed().await.expect("open");
            *rx.borrow_and_update()
        });
        tokio::task::yield_now().await;
        tx.send(7).expect("open");
        assert_eq!(waiter.await.expect("no panic"), 7);
    }

    /// A send between the version check and the `.await` is not missed,
    /// and a cancelled `changed` loses nothing.
    #[tokio::test]
    async fn no_missed_wake_up() {
        let (tx, mut rx) = channel(0_u32);
        {
            // Polled once: registered and pending. Then a send, then the
            // same future polled again must complete.
            let mut fut = pin!(rx.changed());
            assert!(!poll_once(fut.as_mut()).await);
            tx.send(1).expect("open");
            assert!(poll_once(fut.as_mut()).await);
        }
        // Cancelled after registering: the send that follows stays unseen.
        assert!(!poll_once(rx.changed()).await);
        tx.send(2).expect("open");
        rx.changed().await.expect("open");
        assert_eq!(*rx.borrow(), 2);

        // Every interleaving of sends and yields on one thread: the
        // receiver always ends up seeing the last value.
        for pattern in 0_u32..64 {
            let (tx, mut rx) = channel(0_u32);
            let last = 6;
            let reader = tokio::spawn(async move {
                while *rx.borrow_and_update() != last {
                    rx.changed().await.expect("the sender outlives this");
                }
            });
            for value in 1..=last {
                if pattern & (1 << (value - 1)) != 0 {
                    tokio::task::yield_now().await;
                }
                tx.send(value).expect("the reader holds a receiver");
            }
            tokio::time::timeout(Duration::from_secs(10), reader)
                .await
                .expect("the reader sees the last value")
                .expect("no panic");
        }
    }

    /// The same across threads: a sender on another thread racing receivers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn no_missed_wake_up_across_threads() {
        let (tx, rx) = channel(0_u32);
        let last = 20_000;
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let mut rx = rx.clone();
                tokio::spawn(async move {
                    while *rx.borrow_and_update() != last {
                        rx.changed().await.expect("the sender outlives this");
                    }
                })
            })
            .collect();
        let sender = tokio::spawn(async move {
            for value in 1..=last {
                tx.send_replace(value);
                if value % 64 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            tx
        });
        for reader in readers {
            tokio::time::timeout(Duration::from_secs(30), reader)
                .await
                .expect("every reader sees the last value")
                .expect("no panic");
        }
        drop(sender.await.expect("no panic"));
    }

    #[tokio::test]
    async fn changed_fails_after_senders_drop_but_delivers_unseen_value_first() {
        let (tx, mut rx) = channel(0_u32);
        let tx2 = tx.clone();
        assert_eq!(tx.sender_count(), 2);
        tx.send(1).expect("open");
        drop(tx);
        assert!(!rx.is_closed(), "one sender left");
        drop(tx2);
        assert!(rx.is_closed());
        assert!(rx.has_changed().is_err());
        assert!(rx.borrow().has_changed(), "the value is still unseen");
        rx.changed().await.expect("the unseen value comes first");
        assert_eq!(*rx.borrow(), 1);
        assert!(rx.changed().await.is_err());
        assert!(rx.changed().await.is_err());

        // A receiver already waiting is woken by the last sender's drop.
        let (tx, mut rx) = channel(0_u32);
        let waiter = tokio::spawn(async move { rx.changed().await.is_err() });
        tokio::task::yield_now().await;
        drop(tx);
        assert!(waiter.await.expect("no panic"), "changed fails");
    }

    #[tokio::test]
    async fn wait_for() {
        let (tx, mut rx) = channel(0_u32);
        // The current value is tested first, even though already seen.
        assert_eq!(*rx.wait_for(|v| *v == 0).await.expect("open"), 0);

        let waiter = tokio::spawn(async move {
            let seen = rx.wait_for(|v| *v >= 3).await.map(|v| *v);
            (seen, rx)
        });
        for value in 1..=4 {
            tokio::task::yield_now().await;
            tx.send(value).expect("open");
        }
        let (seen, mut rx) = waiter.await.expect("no panic");
        assert_eq!(seen.ok(), Some(3));

        // After the senders are gone: the last value is tested once.
        drop(tx);
        assert_eq!(*rx.wait_for(|v| *v == 4).await.expect("unseen, matches"), 4);
        assert!(rx.wait_for(|v| *v == 5).await.is_err());
        // Like tokio: the first test of the current value happens even when
        // the channel is closed and the value was seen.
        let (tx, mut rx) = channel(0_u32);
        drop(tx);
        assert_eq!(*rx.wait_for(|v| *v == 0).await.expect("matches"), 0);
        assert!(rx.wait_for(|v| *v == 1).await.is_err(), "seen and closed");
    }

    #[tokio::test]
    async fn send_without_receivers() {
        let (tx, rx) = channel(0_u32);
        drop(rx);
        assert!(tx.is_closed());
        assert_eq!(tx.send(1).err().map(|e| e.0), Some(1));
        assert_eq!(*tx.borrow(), 0);
        assert_eq!(tx.send_replace(2), 0);
        tx.send_modify(|v| *v += 1);
        assert_eq!(*tx.borrow(), 3);
        assert!(tx.send_if_modified(|v| {
            *v = 4;
            true
        }));
        assert_eq!(*tx.borrow(), 4);
        assert_eq!(super::error::SendError(5).to_string(), "channel closed");
        assert_eq!(
            format!("{:?}", super::error::SendError(5)),
            "SendError { .. }"
        );
    }

    #[tokio::test]
    async fn closed_resolves_when_the_last_receiver_drops() {
        let (tx, rx) = channel(0_u32);
        let rx2 = rx.clone();
        let tx = Arc::new(tx);
        assert!(!poll_once(tx.closed()).await);
        let closer = tokio::spawn({
            let tx = Arc::clone(&tx);
            async move { tx.closed().await }
        });
        tokio::task::yield_now().await;
        drop(rx);
        tokio::task::yield_now().await;
        assert!(!closer.is_finished(), "one receiver left");
        drop(rx2);
        tokio::time::timeout(Duration::from_secs(10), closer)
            .await
            .expect("closed() resolves")
            .expect("no panic");
        assert!(tx.is_closed());
        tx.closed().await;

        // Reopened by subscribe.
        let rx = tx.subscribe();
        assert!(!tx.is_closed());
        assert!(!poll_once(tx.closed()).await);
        drop(rx);
        tx.closed().await;
    }

    #[tokio::test]
    async fn subscribe_sees_the_current_value_as_seen() {
        let (tx, _rx) = channel(0_u32);
        tx.send(1).expect("open");
        let mut late = tx.subscribe();
        assert_eq!(late.has_changed().ok(), Some(false));
        assert_eq!(*late.borrow(), 1);
        assert!(!late.borrow().has_changed());
        assert!(!poll_once(late.changed()).await);
        tx.send(2).expect("open");
        late.changed().await.expect("open");
        assert_eq!(*late.borrow(), 2);
        // Also on a channel that had no receiver.
        let tx = Sender::new(5_u32);
        assert_eq!(tx.receiver_count(), 0);
        let rx = tx.subscribe();
        assert_eq!(*rx.borrow(), 5);
        assert_eq!(tx.receiver_count(), 1);
        assert!(format!("{tx:?} {rx:?}").contains("value"));
    }

    /// Runs `n` receivers on a fresh current-thread runtime with paused
    /// time. They begin waiting in a scrambled order (staggered sleeps), then
    /// one send wakes them all. Returns (order of starting to wait, order of
    /// waking).
    fn wake_order(n: usize) -> (Vec<usize>, Vec<usize>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let (tx, rx) = channel(0_u32);
            let started = Arc::new(Mutex::new(Vec::new()));
            let woken = Arc::new(Mutex::new(Vec::new()));
            let tasks: Vec<_> = (0..n)
                .map(|i| {
                    let mut rx = rx.clone();
                    let started = Arc::clone(&started);
                    let woken = Arc::clone(&woken);
                    tokio::spawn(async move {
                        // A permutation of the spawn order (7 is coprime to n).
                        let delay = (i * 7) % n;
                        tokio::time::sleep(Duration::from_millis(delay as u64)).await;
                        started
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(i);
                        // No await between recording and registering.
                        rx.changed().await.expect("open");
                        woken.lock().unwrap_or_else(PoisonError::into_inner).push(i);
                    })
                })
                .collect();
            while started.lock().unwrap_or_else(PoisonError::into_inner).len() < n {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            // Let the last ones reach their `.await`.
            tokio::task::yield_now().await;
            tx.send(1).expect("open");
            for task in tasks {
                task.await.expect("no panic");
            }
            let started = started
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            let woken = woken.lock().unwrap_or_else(PoisonError::into_inner).clone();
            (started, woken)
        })
    }

    #[test]
    fn wake_order_is_fifo_and_reproducible() {
        let n = 16;
        let (started, woken) = wake_order(n);
        assert_ne!(
            started,
            (0..n).collect::<Vec<_>>(),
            "the test scrambles the order in which receivers start waiting"
        );
        assert_eq!(woken, started, "woken in the order they began waiting");
        for _ in 0..4 {
            assert_eq!(
                wake_order(n),
                (started.clone(), woken.clone()),
                "reproducible"
            );
        }
    }
}
