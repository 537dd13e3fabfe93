//! The watches of the store primitive on SQLite (see `primitive`): a task
//! per watch reads its prefix's last change when something may have
//! changed it, and tells its receiver.
//!
//! What wakes it: a commit of this handle that wrote a key under its
//! prefix ([`Wakers`]: the others' watches sleep on), any commit of
//! another connection (inotify on the notify file, see `notify`: it cannot
//! tell what changed), the death of a session's process that holds a key
//! under it (see `liveness`), and the expiry of such a session by its TTL.
//! A session this handle renews sets no timer at all: it cannot expire
//! before this handle stops renewing it (closes it, or a renewal finds it
//! gone), which wakes the watches that saw it. So a line of standbys, or
//! thousands of elections held, on one handle neither read nor wake at
//! each renewal period.

use std::collections::HashMap;
use std::sync::Weak;
use std::time::Instant;

use super::*;
use crate::store::keys::{Heard, Revision, prefix_end};

/// How soon a watch that could not read tries again.
const UNKNOWN_RETRY: Duration = Duration::from_millis(250);

/// The watches of one handle, by prefix: a commit of the handle wakes
/// those whose prefix it wrote under alone, found by looking each prefix
/// of each written key up (not by testing every watch against every key:
/// 10,000 held elections made that most of a campaign's cost).
#[derive(Debug, Default)]
pub(super) struct Wakers(Mutex<WakerMap>);

#[derive(Debug, Default)]
struct WakerMap {
    by_prefix: HashMap<String, Vec<Weak<watch::Sender<u64>>>>,
    /// Prefixes nobody watches any more are dropped when the map reaches
    /// this many.
    prune_at: usize,
}

/// The smallest [`WakerMap::prune_at`].
const PRUNE_AT: usize = 64;

impl Wakers {
    /// A watch's own wake-up, woken by this handle's commits under
    /// `prefix`: the watch holds the sender; once it is dropped, the entry
    /// goes at the next commit under it, or the next pruning.
    pub(super) fn register(&self, prefix: &str) -> Arc<watch::Sender<u64>> {
        let wake = Arc::new(watch::channel(0).0);
        let mut map = lock(&self.0);
        if map.by_prefix.len() >= map.prune_at {
            map.by_prefix.retain(|_, wakes| {
                wakes.retain(|w| w.strong_count() > 0);
                !wakes.is_empty()
            });
            map.prune_at = (map.by_prefix.len() * 2).max(PRUNE_AT);
        }
        map.by_prefix
            .entry(prefix.to_owned())
            .or_default()
            .push(Arc::downgrade(&wake));
        wake
    }

    /// This handle committed writes of `keys`.
    pub(super) fn wrote<'a>(&self, keys: impl Iterator<Item = &'a str>) {
        let mut map = lock(&self.0);
        for key in keys {
            let ends = key.char_indices().map(|(i, _)| i).chain([key.len()]);
            for end in ends {
                let Some(wakes) = map.by_prefix.get_mut(&key[..end]) else {
                    continue;
                };
                wakes.retain(|wake| match wake.upgrade() {
                    Some(wake) => {
                        bump(&wake);
                        true
                    }
                    None => false,
                });
            }
        }
    }
}

/// The deadline that this handle's last renewal of each of its sessions
/// set: until then a session is known to live without a read. `stopped`
/// is bumped when this handle stops renewing one: it closed it, a renewal
/// failed, or its deadline passed without one (one timer per session,
/// however many watches saw it).
#[derive(Debug)]
pub(super) struct Renewed {
    deadlines: Mutex<HashMap<SessionId, Instant>>,
    stopped: watch::Sender<u64>,
}

impl Default for Renewed {
    fn default() -> Self {
        Renewed {
            deadlines: Mutex::default(),
            stopped: watch::channel(0).0,
        }
    }
}

impl Renewed {
    /// Records (`Some`) or forgets (`None`: closed, or gone) the deadline
    /// of `session`.
    pub(super) fn set(self: &Arc<Self>, session: SessionId, deadline: Option<Instant>) {
        let mut deadlines = lock(&self.deadlines);
        match deadline {
            Some(deadline) => {
                if deadlines.insert(session, deadline).is_none() {
                    tokio::spawn(Self::until_stopped(Arc::downgrade(self), session));
                }
            }
            None => {
                if deadlines.remove(&session).is_some() {
                    bump(&self.stopped);
                }
            }
        }
    }

    /// Forgets `session` once its deadline passes without a renewal.
    async fn until_stopped(renewed: Weak<Self>, session: SessionId) {
        loop {
            let deadline = {
                let Some(renewed) = renewed.upgrade() else {
                    return;
                };
                let mut deadlines = lock(&renewed.deadlines);
                match deadlines.get(&session) {
                    None => return,
                    Some(&deadline) if deadline <= Instant::now() => {
                        deadlines.remove(&session);
                        bump(&renewed.stopped);
                        return;
                    }
                    Some(&deadline) => deadline,
                }
            };
            tokio::time::sleep_until(deadline.into()).await;
        }
    }

    fn renews(&self, session: i64) -> bool {
        lock(&self.deadlines).contains_key(&SessionId::from_stored(session))
    }
}

/// What a watch read last: its prefix's last change, and the sessions of
/// its live keys with when each expires unless renewed.
struct Read {
    last: Revision,
    sessions: Vec<(i64, Instant)>,
    /// Those the kernel found alive: their deaths are watched.
    alive: Vec<i64>,
    /// Those the kernel found dead: their keys are dead already.
    gone: Vec<i64>,
}

impl Db {
    /// The last revision at which a key under `prefix` was written or
    /// deleted (a session's end by its TTL or its process's death is not
    /// one), and the sessions of the live keys under it.
    fn last_change(&self, tx: &Connection, prefix: &str) -> Result<Read> {
        let read_at = Instant::now();
        let (range, tested) = self.range_in(tx, prefix)?;
        let end = prefix_end(prefix);
        let deleted: Option<i64> = tx
            .query_row(
                "SELECT max(revision) FROM deletions WHERE key >= ?1 AND (?2 IS NULL OR key < ?2)",
                params![prefix, end],
                |r| r.get(0),
            )
            .map_err(self.err())?;
        let written = range.entries.iter().map(|e| e.modified).max();
        let deleted = deleted.map(|d| Revision(u64::try_from(d).unwrap_or(0)));
        let mut sessions: Vec<(i64, Instant)> = range
            .entries
            .iter()
            .filter_map(|e| {
                let left = e.expires_in? + Duration::from_millis(1);
                Some((session_key(e.session?).ok()?, read_at + left))
            })
            .collect();
        sessions.sort_unstable();
        sessions.dedup_by_key(|(session, _)| *session);
        Ok(Read {
            last: written.max(deleted).unwrap_or_default(),
            sessions,
            alive: tested.found(Process::Alive),
            gone: tested.found(Process::Gone),
        })
    }
}

impl SqliteKeys {
    /// Tells `tx` what changes under `prefix` after `from`, until nobody
    /// holds its receiver; `own` is woken by this handle's commits under
    /// the prefix.
    pub(super) async fn follow(
        self,
        prefix: String,
        from: Revision,
        tx: watch::Sender<Heard>,
        own: Arc<watch::Sender<u64>>,
    ) {
        let (mut any, mut own_wake) = (self.inner.changes.subscribe(), own.subscribe());
        let mut stopped = self.inner.renewed.stopped.subscribe();
        let (mut told, mut seen, mut unknown): (Revision, Vec<(i64, Instant)>, bool) =
            (from, Vec::new(), false);
        let mut watched: Vec<i64> = Vec::new();
        loop {
            any.mark_unchanged();
            own_wake.mark_unchanged();
            stopped.mark_unchanged();
            let p = prefix.clone();
            match self.inner.read(move |db, tx| db.last_change(tx, &p)).await {
                Ok(read) => {
                    let ended = seen
                        .iter()
                        .any(|(s, _)| !read.sessions.iter().any(|(r, _)| r == s));
                    for &session in read.alive.iter().filter(|s| !watched.contains(s)) {
                        self.watch_death(session);
                    }
                    if read.last > told || ended || unknown {
                        told = told.max(read.last);
                        tx.send_replace(Heard::Changed(told));
                    }
                    if !read.gone.is_empty() {
                        self.end_dead(read.gone).await;
                    }
                    (seen, watched, unknown) = (read.sessions, read.alive, false);
                }
                // A replaced file never comes back: the watch ends.
                Err(Error::Replaced(_)) => {
                    lock(&self.inner.follows).remove(&prefix);
                    return;
                }
                Err(error) => {
                    tx.send_replace(Heard::Unknown {
                        error: error.to_string(),
                    });
                    unknown = true;
                }
            }
            let mut wakes = [&mut any, &mut own_wake, &mut stopped];
            if !self.until_woken(&mut wakes, &seen, unknown, &tx).await && self.retire(&prefix, &tx)
            {
                return;
            }
        }
    }

    /// Waits until the watch must read again: woken, or a session it saw
    /// expires (for one this handle renews: once it stops renewing it);
    /// `false` once nobody holds the watch's receiver.
    async fn until_woken(
        &self,
        [any, own, stopped]: &mut [&mut watch::Receiver<u64>; 3],
        seen: &[(i64, Instant)],
        unknown: bool,
        tx: &watch::Sender<Heard>,
    ) -> bool {
        let renewed = &self.inner.renewed;
        let (renewed_here, others): (Vec<_>, Vec<_>) = seen
            .iter()
            .partition(|(session, _)| renewed.renews(*session));
        let next = match unknown {
            true => Some(Instant::now() + UNKNOWN_RETRY),
            false => others.iter().map(|(_, at)| *at).min(),
        };
        let mut timer = match next {
            Some(at) => Box::pin(tokio::time::sleep_until(at.into()))
                as Pin<Box<dyn Future<Output = ()> + Send>>,
            None => Box::pin(std::future::pending()),
        };
        loop {
            tokio::select! {
                changed = any.changed() => return changed.is_ok(),
                changed = own.changed() => return changed.is_ok(),
                () = tx.closed() => return false,
                () = &mut timer => return true,
                changed = stopped.changed() => if changed.is_err() { return false },
            }
            // Another session than these stopping wakes no read.
            if renewed_here
                .iter()
                .any(|(session, _)| !renewed.renews(*session))
            {
                return true;
            }
        }
    }

    /// Whether the task following `prefix` ends, nobody holding a watch of
    /// it: decided under the lock a new watch takes to join it.
    fn retire(&self, prefix: &str, tx: &watch::Sender<Heard>) -> bool {
        let mut follows = lock(&self.inner.follows);
        if tx.receiver_count() > 0 {
            return false;
        }
        follows.remove(prefix);
        true
    }

    /// Ends the sessions of dead processes that a watch found (their keys
    /// are dead already; their rows go), where this handle writes.
    async fn end_dead(&self, sessions: Vec<i64>) {
        if self.inner.db.read_only {
            return;
        }
        match self
            .inner
            .blocking(move |db| db.end_dead_sessions(&sessions))
            .await
        {
            Ok(ended) => {
                super::primitive::log_ended(&ended);
                self.inner.wakers.wrote(ended.iter().map(String::as_str));
            }
            Err(error) => {
                tracing::debug!(%error, "cannot end the sessions of dead processes; their TTL will")
            }
        }
    }

    /// Wakes this handle's watches once `session`'s process dies.
    fn watch_death(&self, session: i64) {
        if let Some(liveness) = &self.inner.db.liveness {
            liveness.watch(session, Arc::downgrade(&self.inner.changes));
        }
    }
}
