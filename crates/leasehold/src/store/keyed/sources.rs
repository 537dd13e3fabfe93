//! What the shared watches (of a holder, of notes) read and wait on,
//! over the primitive: a read of a prefix, and its watch.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::election;
use crate::error::{Error, Result};
use crate::grant::Leader;
use crate::names::ElectionName;
use crate::store::Note;
use crate::store::keys::{Heard, KeyWatch, Keys, Range, Revision};
use crate::store::layout::Layout;
use crate::store::note_watch::NoteSource;
use crate::store::shared_read::SharedRanges;
use crate::store::watch_driver::{Event, Source};

/// After a failed read, a watch reads again after this.
const RETRY: Duration = Duration::from_millis(250);

/// A prefix followed: its first read, kept for the watch's first read,
/// and the watch of it from there.
struct Following<K: Keys> {
    keys: Arc<SharedRanges<K>>,
    prefix: String,
    first: Option<Range>,
    watch: KeyWatch,
}

impl<K: Keys> Following<K> {
    async fn new(keys: Arc<SharedRanges<K>>, prefix: String) -> Result<Self> {
        let first = keys.range(&prefix).await?;
        let watch = keys.watch(&prefix, first.revision).await?;
        Ok(Following {
            keys,
            prefix,
            first: Some(first),
            watch,
        })
    }

    /// Follows `prefix` from `from`, known without a read: the first
    /// read comes after the first change told.
    async fn since(keys: Arc<SharedRanges<K>>, prefix: String, from: Revision) -> Result<Self> {
        let watch = keys.watch(&prefix, from).await?;
        Ok(Following {
            keys,
            prefix,
            first: None,
            watch,
        })
    }

    async fn read(&mut self) -> Result<Range> {
        // The first read stands only if the watch, started from its
        // revision, told nothing since: a change between the two (told
        // at once) would otherwise be marked seen here and never read.
        let told = self.watch.has_changed().unwrap_or(true);
        // Seen before the read: a change made during it wakes the watch.
        self.watch.borrow_and_update();
        match self.first.take() {
            Some(first) if !told => Ok(first),
            _ => self.keys.range(&self.prefix).await,
        }
    }

    async fn changed(&mut self) -> Event {
        if self.watch.changed().await.is_err() {
            return Event::Ended;
        }
        match &*self.watch.borrow() {
            Heard::Changed(_) => Event::Changed,
            Heard::Unknown { error } => Event::Unavailable(Error::Unavailable {
                reason: error.clone(),
                source: None,
            }),
        }
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.keys.sleep(duration)
    }
}

/// `holder` with the time its session has left, where the store's reads
/// did not tell it.
pub(super) async fn with_time_left<K: Keys>(
    keys: &K,
    holder: Option<Leader>,
) -> Result<Option<Leader>> {
    let Some(mut leader) = holder else {
        return Ok(None);
    };
    if let Some(session) = leader.session
        && let Some(left) = keys.time_left(session).await?
    {
        leader.expires_in = left;
    }
    Ok(Some(leader))
}

/// The candidates of an election, for a watch of its holder.
pub(super) struct CandidatesSource<K: Keys> {
    following: Following<K>,
    layout: Layout,
}

impl<K: Keys> CandidatesSource<K> {
    pub(super) async fn new(
        keys: Arc<SharedRanges<K>>,
        layout: Layout,
        election: &ElectionName,
    ) -> Result<Self> {
        let prefix = election::candidates(layout, election);
        Ok(CandidatesSource {
            following: Following::new(keys, prefix).await?,
            layout,
        })
    }

    /// For the holder of a grant made at revision `granted`: the
    /// candidates are known from there without a read.
    pub(super) async fn since(
        keys: Arc<SharedRanges<K>>,
        layout: Layout,
        election: &ElectionName,
        granted: Revision,
    ) -> Result<Self> {
        let prefix = election::candidates(layout, election);
        Ok(CandidatesSource {
            following: Following::since(keys, prefix, granted).await?,
            layout,
        })
    }
}

impl<K: Keys> Source for CandidatesSource<K> {
    const RETRY: Duration = RETRY;

    async fn read(&mut self) -> Result<Option<Leader>> {
        let holder = election::holder(self.layout, &self.following.read().await?)?;
        with_time_left(&*self.following.keys, holder).await
    }

    fn changed(&mut self) -> impl Future<Output = Event> + Send {
        self.following.changed()
    }

    fn tells_expiry(&self) -> bool {
        self.following.keys.tells_expiries()
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.following.sleep(duration)
    }
}

/// The notes of an election under a prefix (all of them, or one), for a
/// watch of them.
pub(super) struct NotesSource<K: Keys> {
    following: Following<K>,
    election: ElectionName,
}

impl<K: Keys> NotesSource<K> {
    pub(super) async fn new(
        keys: Arc<SharedRanges<K>>,
        election: &ElectionName,
        prefix: String,
    ) -> Result<Self> {
        Ok(NotesSource {
            following: Following::new(keys, prefix).await?,
            election: election.clone(),
        })
    }

    /// All the notes of `election`, known to be none at revision `from`.
    pub(super) async fn since(
        keys: Arc<SharedRanges<K>>,
        election: &ElectionName,
        from: Revision,
    ) -> Result<Self> {
        let prefix = election::notes(election);
        Ok(NotesSource {
            following: Following::since(keys, prefix, from).await?,
            election: election.clone(),
        })
    }
}

impl<K: Keys> NoteSource for NotesSource<K> {
    const RETRY: Duration = RETRY;

    async fn read(&mut self) -> Result<(Vec<Note>, Option<Duration>)> {
        let range = self.following.read().await?;
        let (notes, expiry) = election::read_notes(&self.election, &range)?;
        // A store that tells expiries needs no read at them.
        let told = self.following.keys.tells_expiries();
        Ok((notes, expiry.filter(|_| !told)))
    }

    fn changed(&mut self) -> impl Future<Output = Event> + Send {
        self.following.changed()
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.following.sleep(duration)
    }
}
