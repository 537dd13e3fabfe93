//! The SQLite store's waiting: it cannot push per-election events, but it
//! knows when anything was committed and when the current holder's
//! session expires. So waiters sleep until either happens, never on a
//! fixed polling period.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::watch;

use crate::error::{Error, Result};
use crate::names::{CandidateId, ElectionName};
use crate::store::note_watch::{self, NoteSource};
use crate::store::watch_driver::{self as leader_watch, Event, Source};
use crate::store::{FencingToken, Grant, Leader, Note, NoteWatch, SessionId};
use async_trait::async_trait;

/// What wakes a local store's waiters and watches: a bump of everything
/// (anything may have changed: another process wrote, a holder's process
/// died) or of one [`Topic`] (this process wrote to it). A write to one
/// election's holder thus wakes only that election's waiters and leader
/// watches, so a process holding N elections does not read N of them at
/// every grant; and a write to one note wakes only the watches of that
/// note and of the election's whole line, so a line of C standbys, each
/// watching its own note and the one ahead, does not read C notes at
/// every step of the line.
#[derive(Debug)]
pub(crate) struct ChangeHub {
    /// Bumped when anything may have changed. In an `Arc` so that threads
    /// may hold it weakly (SQLite's watches of holders' processes).
    all: Arc<watch::Sender<u64>>,
    /// One channel per topic someone waits on or watches, bumped when
    /// this process wrote to it.
    each: Mutex<Each>,
}

/// What a local store's write changed, and what a waiter or watch waits
/// on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Topic {
    /// The holder of an election: grants and releases.
    Holder(ElectionName),
    /// Any note on an election: what a watch of the whole line waits on.
    Notes(ElectionName),
    /// One note: its election, session and name.
    Note(ElectionName, SessionId, String),
}

#[derive(Debug, Default)]
struct Each {
    channels: HashMap<Topic, watch::Sender<u64>>,
    /// Channels nobody listens to are dropped when the map reaches this.
    prune_at: usize,
}

/// The smallest [`Each::prune_at`].
const PRUNE_AT: usize = 64;

/// Wakes the receivers of a change counter.
pub(crate) fn bump(tx: &watch::Sender<u64>) {
    tx.send_modify(|v| *v = v.wrapping_add(1));
}

impl ChangeHub {
    pub(crate) fn new() -> Self {
        ChangeHub {
            all: Arc::new(watch::channel(0).0),
            each: Mutex::new(Each {
                channels: HashMap::new(),
                prune_at: PRUNE_AT,
            }),
        }
    }

    fn each(&self) -> std::sync::MutexGuard<'_, Each> {
        // Every mutation is one map operation: nothing half-done to recover.
        self.each.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Anything may have changed: wakes every waiter and watch.
    pub(crate) fn everything(&self) {
        bump(&self.all);
    }

    /// This process wrote to `topic`: wakes its waiters and watches.
    fn touched(&self, topic: &Topic) {
        let mut each = self.each();
        if let Some(tx) = each.channels.get(topic) {
            if tx.receiver_count() == 0 {
                each.channels.remove(topic);
            } else {
                bump(tx);
            }
        }
    }

    /// This process granted or released `election`.
    pub(crate) fn holder_written(&self, election: &ElectionName) {
        self.touched(&Topic::Holder(election.clone()));
    }

    /// This process put, amended or deleted `session`'s note `name` on
    /// `election`.
    pub(crate) fn note_written(&self, election: &ElectionName, session: SessionId, name: &str) {
        self.touched(&Topic::Notes(election.clone()));
        self.touched(&Topic::Note(election.clone(), session, name.to_owned()));
    }

    /// The channel bumped for everything, for those that hold it weakly.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn all(&self) -> &Arc<watch::Sender<u64>> {
        &self.all
    }

    /// What wakes a waiter on, or a watch of, `topic`.
    pub(crate) fn subscribe(&self, topic: Topic) -> Changes {
        let all = self.all.subscribe();
        let mut each = self.each();
        if each.channels.len() >= each.prune_at {
            each.channels.retain(|_, tx| tx.receiver_count() > 0);
            each.prune_at = (each.channels.len() * 2).max(PRUNE_AT);
        }
        let one = each
            .channels
            .entry(topic)
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        Changes { all, one }
    }
}

/// Wakes when anything in the store, or one topic, may have changed
/// (see [`ChangeHub`]).
#[derive(Debug)]
pub(crate) struct Changes {
    all: watch::Receiver<u64>,
    one: watch::Receiver<u64>,
}

impl Changes {
    /// Marks what is now as seen.
    pub(crate) fn mark_seen(&mut self) {
        self.all.mark_unchanged();
        self.one.mark_unchanged();
    }

    /// Waits for a change not yet seen; `Err` once the store is gone.
    pub(crate) async fn changed(&mut self) -> std::result::Result<(), watch::error::RecvError> {
        tokio::select! {
            biased;
            changed = self.all.changed() => changed,
            changed = self.one.changed() => changed,
        }
    }
}

/// One compare-and-swap attempt's outcome.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// Granted; with the holder it took over from, when that holder's grant
    /// was not released but its session expired.
    Granted(Grant, Option<Expired>),
    /// Someone else holds the election; their session ends in `expires_in`
    /// unless renewed.
    Held { expires_in: Duration },
}

/// A grant that ended because its session expired, not by a release.
#[derive(Debug)]
pub(crate) struct Expired {
    pub(crate) candidate: String,
    pub(crate) token: FencingToken,
    /// Set, to the pid it recorded, when the holder's process was found
    /// gone by the kernel's test on this host (SQLite), and its session
    /// expired at once rather than at its TTL.
    pub(crate) dead_pid: Option<i64>,
}

/// Slack added to a known expiry so the waiter wakes just after it.
const EXPIRY_SLACK: Duration = Duration::from_millis(1);

/// After a failed read, a watch reads again after this.
const READ_RETRY: Duration = Duration::from_millis(250);

#[async_trait]
pub(crate) trait LocalBackend: Send + Sync + 'static {
    /// What wakes a waiter on, or a watch of, `topic`.
    fn changes(&self, topic: Topic) -> Changes;
    /// How long `session` is known to live without reading the store: a
    /// session this handle renews, until the deadline its last renewal
    /// set; `None` when not known (another handle's or process's).
    fn known_alive(&self, session: SessionId) -> Option<Duration> {
        let _ = session;
        None
    }
    /// One atomic acquisition attempt. `unwaited`: only if nobody holds
    /// the election, this session neither, and no live session keeps a
    /// note on it ([`Store::try_campaign_unwaited`]); else `Held`.
    ///
    /// [`Store::try_campaign_unwaited`]: crate::store::Store::try_campaign_unwaited
    async fn try_acquire(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
        unwaited: bool,
    ) -> Result<Attempt>;
    /// The current leader.
    async fn read_leader(&self, election: &ElectionName) -> Result<Option<Leader>>;
    /// The live notes on `election` — only `session`'s note `name` with
    /// `only` — in order, and how long until the first session keeping
    /// one of them expires unless renewed.
    async fn read_notes(
        &self,
        election: &ElectionName,
        only: Option<&NoteKey>,
    ) -> Result<(Vec<Note>, Option<Duration>)>;
    /// Sleeps for `duration` on the store's clock.
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

fn store_closed() -> Error {
    Error::Unavailable {
        reason: "store was closed".into(),
        source: None,
    }
}

/// Attempts acquisition, then waits for a change or the holder's expiry and
/// attempts again.
pub(crate) async fn campaign<B: LocalBackend + ?Sized>(
    backend: &B,
    session: SessionId,
    election: &ElectionName,
    candidate: &CandidateId,
) -> Result<Grant> {
    let mut changes = backend.changes(Topic::Holder(election.clone()));
    loop {
        // Mark the current version seen *before* attempting, so a change made
        // between the attempt and the wait still wakes us.
        changes.mark_seen();
        match backend
            .try_acquire(session, election, candidate, false)
            .await?
        {
            Attempt::Granted(grant, expired) => {
                log_expired(expired, election, candidate);
                return Ok(grant);
            }
            Attempt::Held { expires_in } => {
                tokio::select! {
                    biased;
                    changed = changes.changed() => changed.map_err(|_| store_closed())?,
                    () = backend.sleep(expires_in + EXPIRY_SLACK) => {}
                }
            }
        }
    }
}

/// [`crate::store::Store::try_campaign_unwaited`] on a local store.
pub(crate) async fn try_campaign_unwaited<B: LocalBackend + ?Sized>(
    backend: &B,
    session: SessionId,
    election: &ElectionName,
    candidate: &CandidateId,
) -> Result<Option<Grant>> {
    match backend
        .try_acquire(session, election, candidate, true)
        .await?
    {
        Attempt::Granted(grant, expired) => {
            log_expired(expired, election, candidate);
            Ok(Some(grant))
        }
        Attempt::Held { .. } => Ok(None),
    }
}

/// Tells how the holder before a grant left, if it did not release.
fn log_expired(expired: Option<Expired>, election: &ElectionName, candidate: &CandidateId) {
    match expired {
        Some(Expired {
            candidate: leader,
            token,
            dead_pid: Some(pid),
        }) => {
            tracing::info!(%election, id = %candidate, expired_leader = %leader, expired_token = token.0, expired_pid = pid,
                "the previous leader's process is gone (the kernel released its session's lock on this host); taking over without waiting for its lease");
        }
        Some(Expired {
            candidate: leader,
            token,
            dead_pid: None,
        }) => {
            tracing::info!(%election, id = %candidate, expired_leader = %leader, expired_token = token.0,
                "the previous leader's lease expired; taking over");
        }
        None => {}
    }
}

/// A local store's side of a watch: it wakes on any change committed to
/// the store (and, through [`leader_watch::start`], at the holder's expiry).
struct LocalWatch<B> {
    backend: Arc<B>,
    election: ElectionName,
    changes: Changes,
}

impl<B: LocalBackend> Source for LocalWatch<B> {
    const RETRY: Duration = READ_RETRY;

    async fn read(&mut self) -> Result<Option<Leader>> {
        // Mark the current version seen *before* reading, so a change made
        // during the read still wakes the watch.
        self.changes.mark_seen();
        self.backend.read_leader(&self.election).await
    }

    async fn changed(&mut self) -> Event {
        match self.changes.changed().await {
            Ok(()) => Event::Changed,
            Err(_) => Event::Ended,
        }
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.backend.sleep(duration)
    }
}

/// Watches `election`; with `held`, for the holder of that grant (see
/// [`leader_watch::start`]).
pub(crate) async fn watch<B: LocalBackend, V: leader_watch::Initial>(
    backend: Arc<B>,
    election: &ElectionName,
    held: Option<FencingToken>,
) -> Result<watch::Receiver<V>> {
    let changes = backend.changes(Topic::Holder(election.clone()));
    let source = LocalWatch {
        backend,
        election: election.clone(),
        changes,
    };
    leader_watch::start(source, election, held).await
}

/// One note: its session and name.
pub(crate) type NoteKey = (SessionId, String);

/// A local store's side of a notes watch: it wakes on any change committed
/// to the store, and when the first session keeping a note expires.
struct LocalNotes<B> {
    backend: Arc<B>,
    election: ElectionName,
    /// The one note watched, if not all.
    only: Option<NoteKey>,
    changes: Changes,
}

impl<B: LocalBackend> NoteSource for LocalNotes<B> {
    const RETRY: Duration = READ_RETRY;

    async fn read(&mut self) -> Result<(Vec<Note>, Option<Duration>)> {
        self.changes.mark_seen();
        self.backend
            .read_notes(&self.election, self.only.as_ref())
            .await
    }

    async fn changed(&mut self) -> Event {
        match self.changes.changed().await {
            Ok(()) => Event::Changed,
            Err(_) => Event::Ended,
        }
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.backend.sleep(duration)
    }

    fn known_alive(&self, notes: &[Note]) -> Option<Duration> {
        notes
            .iter()
            .map(|n| self.backend.known_alive(n.session))
            .try_fold(None, |least: Option<Duration>, left| {
                let left = left?;
                Some(Some(least.map_or(left, |least| least.min(left))))
            })
            .flatten()
    }
}

/// Watches the notes on `election`, or with `only` that one note (see
/// [`note_watch::start`]): it reads that one note at each change.
pub(crate) async fn watch_notes<B: LocalBackend>(
    backend: Arc<B>,
    election: &ElectionName,
    only: Option<(SessionId, &str)>,
) -> Result<NoteWatch> {
    let only = only.map(|(session, name)| (session, name.to_owned()));
    let changes = backend.changes(match &only {
        Some((session, name)) => Topic::Note(election.clone(), *session, name.clone()),
        None => Topic::Notes(election.clone()),
    });
    let source = LocalNotes {
        backend,
        election: election.clone(),
        only,
        changes,
    };
    note_watch::start(source, election).await
}
