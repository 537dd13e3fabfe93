//! Work asked for at once through one handle, done together: renewals,
//! commits and reads each wait in a [`Batches`] queue that one thread
//! drains, taking everything waiting (up to a limit) at a time, so that a
//! thousand of them cost a few transactions rather than a thousand.

use super::*;

/// Work waiting for the thread that does it, and whether that thread runs.
/// Every change under its lock is one assignment or one `Vec` operation,
/// so a lock whose holder panicked is used as it is ([`lock`]).
pub(super) struct Batches<T> {
    waiting: Vec<T>,
    running: bool,
}

impl<T> Default for Batches<T> {
    fn default() -> Self {
        Batches {
            waiting: Vec::new(),
            running: false,
        }
    }
}

impl<T> std::fmt::Debug for Batches<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batches")
            .field("waiting", &self.waiting.len())
            .field("running", &self.running)
            .finish()
    }
}

/// Queues `item`; whether the caller must start the thread that drains
/// the queue (none runs).
pub(super) fn queue<T>(batches: &Mutex<Batches<T>>, item: T) -> bool {
    let mut batches = lock(batches);
    batches.waiting.push(item);
    !std::mem::replace(&mut batches.running, true)
}

/// Gives what `start` could not start a thread for back, to be failed.
pub(super) fn not_started<T>(batches: &Mutex<Batches<T>>) -> Vec<T> {
    let mut batches = lock(batches);
    batches.running = false;
    std::mem::take(&mut batches.waiting)
}

/// The draining thread: `each` batch of up to `limit` waiting, until none
/// is left. Should `each` panic, the next item queued starts a thread
/// again (the panicking batch's senders are dropped, failing it).
pub(super) fn drain<T>(batches: &Mutex<Batches<T>>, limit: usize, mut each: impl FnMut(Vec<T>)) {
    struct Stopped<'a, T>(&'a Mutex<Batches<T>>);
    impl<T> Drop for Stopped<'_, T> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                lock(self.0).running = false;
            }
        }
    }
    let _stopped = Stopped(batches);
    loop {
        let batch: Vec<T> = {
            let mut batches = lock(batches);
            if batches.waiting.is_empty() {
                batches.running = false;
                return;
            }
            let n = batches.waiting.len().min(limit);
            batches.waiting.drain(..n).collect()
        };
        each(batch);
    }
}
