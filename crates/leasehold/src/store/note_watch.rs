//! The watch on an election's notes that every backend shares: [`start`]
//! drives a backend's [`NoteSource`] (what wakes it, how it reads the
//! notes), publishing the live notes whenever they change, also when a
//! session that keeps notes expires without anyone writing.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::error::Result;
use crate::names::ElectionName;
use crate::store::watch_driver::Event;
use crate::store::{Note, NoteWatch};
use crate::watch;

/// Slack added to a known expiry so the watch reads just after it.
const EXPIRY_SLACK: Duration = Duration::from_millis(1);

/// What a backend gives the notes watch.
pub(crate) trait NoteSource: Send + 'static {
    /// After a failed read, the watch reads again after this.
    const RETRY: Duration;

    /// The live notes, in order, and — for a store whose sessions expire
    /// without an event (SQLite, PostgreSQL, memory) — how long until the
    /// first session keeping one of them expires unless renewed.
    fn read(&mut self) -> impl Future<Output = Result<(Vec<Note>, Option<Duration>)>> + Send;

    /// Resolves when the notes may have changed.
    fn changed(&mut self) -> impl Future<Output = Event> + Send;

    /// Sleeps on the store's clock.
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// Reads the notes once (so a failure to read is the caller's error) and
/// keeps the returned watch up to date until every receiver is dropped.
pub(crate) async fn start<S: NoteSource>(
    mut source: S,
    election: &ElectionName,
) -> Result<NoteWatch> {
    let (first, expiry) = source.read().await?;
    let (tx, rx) = watch::channel(first);
    tokio::spawn(drive(source, tx, election.clone(), expiry));
    Ok(rx)
}

/// As [`start`], without the first read: `source` already watches from
/// the moment `first` was known to be the notes (etcd: from the revision
/// after a grant whose transaction saw none), and any later change comes
/// as an event; a store whose history is gone from there breaks the watch,
/// and the task reads as after any wake.
pub(crate) fn start_known<S: NoteSource>(
    source: S,
    election: &ElectionName,
    first: Vec<Note>,
) -> NoteWatch {
    let (tx, rx) = watch::channel(first);
    tokio::spawn(drive(source, tx, election.clone(), None));
    rx
}

async fn drive<S: NoteSource>(
    mut source: S,
    tx: watch::Sender<Vec<Note>>,
    election: ElectionName,
    expiry: Option<Duration>,
) {
    let mut at_expiry = wake_at(&source, expiry);
    loop {
        tokio::select! {
            biased;
            () = tx.closed() => return,
            // Boxed, as in `watch_driver`: a waiting task holds a pointer.
            event = Box::pin(source.changed()) => match event {
                Event::Changed => {}
                Event::Unavailable(error) => {
                    tracing::debug!(%election, %error, "the notes watch cannot hear from the store");
                }
                Event::Ended => return,
            },
            () = &mut at_expiry => {}
        }
        let read = loop {
            #[cfg(feature = "testing")]
            super::watch_driver::count_watch_read(&election);
            match Box::pin(source.read()).await {
                Ok(read) => break read,
                Err(error) => {
                    tracing::debug!(%election, %error, "re-reading the notes failed; retrying");
                    let pause = source.sleep(S::RETRY);
                    tokio::select! {
                        biased;
                        () = tx.closed() => return,
                        () = pause => {}
                    }
                }
            }
        };
        let (notes, expiry) = read;
        at_expiry = wake_at(&source, expiry);
        tx.send_if_modified(|current| {
            let news = *current != notes;
            if news {
                *current = notes;
            }
            news
        });
    }
}

fn wake_at<S: NoteSource>(
    source: &S,
    expiry: Option<Duration>,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    match expiry {
        Some(left) => source.sleep(left + EXPIRY_SLACK),
        None => Box::pin(std::future::pending()),
    }
}
