//! Log lines and messages reach stderr through a thread of their own, so
//! that a stderr nobody reads (a full pipe, a stopped terminal) can never
//! block `run` or its guard: a supervisor that blocks on a write stops
//! renewing, stops forwarding signals and lets its command outlive the
//! lease. Lines are queued (up to [`QUEUE`]); when the queue is full they
//! are dropped, never waited for.

use std::io::Write;
use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::Duration;

/// Lines kept while stderr does not take them.
const QUEUE: usize = 4096;

enum Msg {
    Line(Vec<u8>),
    Flushed(SyncSender<()>),
}

static QUEUED: OnceLock<SyncSender<Msg>> = OnceLock::new();

/// Starts the writer thread; lines written before go straight to stderr.
pub fn start() {
    let (tx, rx) = sync_channel(QUEUE);
    let started = std::thread::Builder::new()
        .name("stderr".into())
        .spawn(move || drain(&rx));
    if started.is_ok() {
        let _ = QUEUED.set(tx);
    }
}

fn drain(rx: &Receiver<Msg>) {
    while let Ok(msg) = rx.recv() {
        match msg {
            // A line that cannot be written (stderr closed, disk full) is
            // dropped.
            Msg::Line(line) => {
                let _ = std::io::stderr().write_all(&line);
            }
            Msg::Flushed(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Queues `bytes` for stderr; drops them if the queue is full.
pub fn write(bytes: &[u8]) {
    match QUEUED.get() {
        Some(tx) => match tx.try_send(Msg::Line(bytes.to_vec())) {
            Ok(()) | Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {}
        },
        None => {
            let _ = std::io::stderr().write_all(bytes);
        }
    }
}

/// Waits up to `limit` for the lines queued so far to be written (before
/// the process exits).
pub fn flush(limit: Duration) {
    let Some(tx) = QUEUED.get() else {
        return;
    };
    let (done, written) = sync_channel(1);
    if tx.try_send(Msg::Flushed(done)).is_ok() {
        let _ = written.recv_timeout(limit);
    }
}
