//! The watches of the store primitive on SQLite (see `primitive`): one
//! task per handle reads, for every prefix its watches follow, the
//! prefix's last change when something may have changed it, and tells the
//! prefix's receivers. A prefix costs an entry in a map, not a task.
//!
//! What makes it read a prefix: a commit of this handle that wrote a key
//! under it ([`Follows::wrote`]: the other prefixes are not read), any
//! commit of another connection (inotify on the notify file, see
//! `notify`: it cannot tell what changed, so every prefix is read), the
//! death of a session's process that holds a key under it (see
//! `liveness`), and the expiry of such a session by its TTL. A session
//! this handle renews sets no timer at all: it cannot expire before this
//! handle stops renewing it (closes it, or a renewal finds it gone), which
//! marks the prefixes that saw it. So a line of standbys, or thousands of
//! elections held, on one handle neither read nor wake at each renewal
//! period.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Weak;
use std::time::Instant;

use tokio::sync::Notify;

use super::*;
use crate::store::keys::{Heard, KeyWatch, Revision};

/// How soon a watch that could not read tries again.
const UNKNOWN_RETRY: Duration = Duration::from_millis(250);

/// At most this many prefixes are read in one read transaction.
const PREFIXES_PER_READ: usize = 256;

/// The smallest [`FollowMap::prune_at`].
const PRUNE_AT: usize = 64;

/// The prefixes this handle's watches follow, and the wake-up of the task
/// that reads them.
#[derive(Debug)]
pub(super) struct Follows {
    map: Mutex<FollowMap>,
    wake: Arc<Notify>,
}

/// What the task knows of each prefix followed (its decisions, without
/// the reads).
#[derive(Debug, Default)]
struct FollowMap {
    by_prefix: HashMap<String, Followed>,
    /// The prefixes to read at the next pass, each once.
    dirty: Vec<String>,
    /// Whether the task runs: it ends once no prefix is followed.
    running: bool,
    /// Prefixes nobody watches any more are dropped when the map reaches
    /// this many (and whenever they are read).
    prune_at: usize,
}

#[derive(Debug)]
struct Followed {
    tx: watch::Sender<Heard>,
    /// The last revision told.
    told: Revision,
    /// The sessions of its live keys at the last read, with when each
    /// expires unless renewed.
    seen: Vec<(i64, Instant)>,
    /// Those the kernel found alive at the last read: their deaths wake
    /// the task.
    alive: Vec<i64>,
    unknown: bool,
    dirty: bool,
    /// When it is read again unless something else makes it read sooner.
    next_at: Option<Instant>,
}

/// What a prefix's read leaves the task to carry out.
#[derive(Debug, Default, PartialEq)]
struct Applied {
    /// Sessions whose processes died, to end.
    gone: Vec<i64>,
    /// Sessions whose processes' deaths to watch.
    alive: Vec<i64>,
    /// When to read the prefix again.
    next_at: Option<Instant>,
}

impl FollowMap {
    /// Follows `prefix` from `from` (a new entry, to read at the next
    /// pass), or joins the entry that follows it already (told at once
    /// if it told a change after `from`); `true` if the task must start.
    fn watch(&mut self, prefix: &str, from: Revision) -> (KeyWatch, bool) {
        if let Some(followed) = self.by_prefix.get(prefix) {
            let mut rx = followed.tx.subscribe();
            if !matches!(*followed.tx.borrow(), Heard::Changed(told) if told <= from) {
                rx.mark_changed();
            }
            return (rx, false);
        }
        if self.by_prefix.len() >= self.prune_at {
            self.by_prefix.retain(|_, f| f.tx.receiver_count() > 0);
            self.prune_at = (self.by_prefix.len() * 2).max(PRUNE_AT);
        }
        let (tx, rx) = watch::channel(Heard::Changed(from));
        let followed = Followed {
            tx,
            told: from,
            seen: Vec::new(),
            alive: Vec::new(),
            unknown: false,
            dirty: false,
            next_at: None,
        };
        self.by_prefix.insert(prefix.to_owned(), followed);
        self.mark(prefix);
        let start = !self.running;
        self.running = true;
        (rx, start)
    }

    /// Marks `prefix` for reading, if followed; whether it was newly.
    fn mark(&mut self, prefix: &str) -> bool {
        match self.by_prefix.get_mut(prefix) {
            Some(followed) if !followed.dirty => {
                followed.dirty = true;
                self.dirty.push(prefix.to_owned());
                true
            }
            _ => false,
        }
    }

    /// Marks every prefix of every key in `keys` that is followed.
    fn wrote<'a>(&mut self, keys: impl Iterator<Item = &'a str>) -> bool {
        let mut marked = false;
        for key in keys {
            let ends = key.char_indices().map(|(i, _)| i).chain([key.len()]);
            for end in ends {
                marked |= self.mark(&key[..end]);
            }
        }
        marked
    }

    /// Marks every prefix followed, and drops those nobody watches any
    /// more.
    fn all(&mut self) {
        self.by_prefix.retain(|_, f| f.tx.receiver_count() > 0);
        let unmarked: Vec<String> = (self.by_prefix.iter())
            .filter(|(_, f)| !f.dirty)
            .map(|(p, _)| p.clone())
            .collect();
        for prefix in unmarked {
            self.mark(&prefix);
        }
    }

    /// Marks the prefixes that saw one of `sessions` at their last read.
    fn stopped(&mut self, sessions: &[i64]) {
        let saw: Vec<String> = (self.by_prefix.iter())
            .filter(|(_, f)| f.seen.iter().any(|(s, _)| sessions.contains(s)))
            .map(|(p, _)| p.clone())
            .collect();
        for prefix in saw {
            self.mark(&prefix);
        }
    }

    /// Marks `prefix` if its next read is due at `at` (and not another
    /// time since: a timer set before a later read is stale).
    fn due(&mut self, prefix: &str, at: Instant) {
        if self
            .by_prefix
            .get(prefix)
            .is_some_and(|f| f.next_at == Some(at))
        {
            self.mark(prefix);
        }
    }

    /// The prefixes to read now, the unwatched ones among them dropped;
    /// `None`, the task then ending, once no prefix is followed.
    fn take(&mut self) -> Option<Vec<String>> {
        let dirty = std::mem::take(&mut self.dirty);
        let mut reading = Vec::with_capacity(dirty.len());
        for prefix in dirty {
            match self.by_prefix.get_mut(&prefix) {
                Some(followed) if followed.tx.receiver_count() == 0 => {
                    self.by_prefix.remove(&prefix);
                }
                Some(followed) => {
                    followed.dirty = false;
                    reading.push(prefix);
                }
                None => {}
            }
        }
        if self.by_prefix.is_empty() {
            self.running = false;
            return None;
        }
        Some(reading)
    }

    /// Tells `prefix`'s receivers what its read found; `renews` says which
    /// sessions this handle renews (no timer for those).
    fn apply(&mut self, prefix: &str, read: Result<Read>, renews: impl Fn(i64) -> bool) -> Applied {
        let Some(followed) = self.by_prefix.get_mut(prefix) else {
            return Applied::default();
        };
        let read = match read {
            Ok(read) => read,
            Err(error) => {
                followed.tx.send_replace(Heard::Unknown {
                    error: error.to_string(),
                });
                followed.unknown = true;
                followed.next_at = Some(Instant::now() + UNKNOWN_RETRY);
                return Applied {
                    next_at: followed.next_at,
                    ..Applied::default()
                };
            }
        };
        let ended = (followed.seen.iter()).any(|(s, _)| !read.sessions.iter().any(|(r, _)| r == s));
        if read.last > followed.told || ended || followed.unknown {
            followed.told = followed.told.max(read.last);
            followed.tx.send_replace(Heard::Changed(followed.told));
        }
        let alive = (read.alive.iter())
            .filter(|s| !followed.alive.contains(s))
            .copied()
            .collect();
        followed.next_at = (read.sessions.iter())
            .filter(|(session, _)| !renews(*session))
            .map(|(_, at)| *at)
            .min();
        followed.seen = read.sessions;
        followed.alive = read.alive;
        followed.unknown = false;
        Applied {
            gone: read.gone,
            alive,
            next_at: followed.next_at,
        }
    }

    /// Drops every prefix (their receivers see the watch end).
    fn end(&mut self) {
        self.by_prefix.clear();
        self.dirty.clear();
        self.running = false;
    }
}

impl Follows {
    pub(super) fn new(wake: Arc<Notify>) -> Self {
        Follows {
            map: Mutex::new(FollowMap {
                prune_at: PRUNE_AT,
                ..FollowMap::default()
            }),
            wake,
        }
    }

    /// This handle committed writes of `keys`: the prefixes followed that
    /// they are under are read.
    pub(super) fn wrote<'a>(&self, keys: impl Iterator<Item = &'a str>) {
        if lock(&self.map).wrote(keys) {
            self.wake.notify_one();
        }
    }
}

/// The deadline that this handle's last renewal of each of its sessions
/// set: until then a session is known to live without a read. When this
/// handle stops renewing one (it closed it, a renewal failed, or its
/// deadline passed without one: one timer per session, however many
/// prefixes saw it), the prefixes that saw it are read.
#[derive(Debug)]
pub(super) struct Renewed {
    deadlines: Mutex<HashMap<SessionId, Instant>>,
    /// Sessions no longer renewed, for the task to take.
    stopped: Mutex<Vec<i64>>,
    wake: Arc<Notify>,
}

impl Renewed {
    pub(super) fn new(wake: Arc<Notify>) -> Self {
        Renewed {
            deadlines: Mutex::default(),
            stopped: Mutex::default(),
            wake,
        }
    }

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
                    self.stop(session);
                }
            }
        }
    }

    fn stop(&self, session: SessionId) {
        if let Ok(key) = session_key(session) {
            lock(&self.stopped).push(key);
            self.wake.notify_one();
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
                        renewed.stop(session);
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

/// The last deletion under a prefix (`?1`, up to `?2`, see
/// `primitive::below`).
pub(super) const LAST_DELETION: &str =
    "SELECT max(revision) FROM deletions WHERE key >= ?1 AND key < ?2";

/// What a read of a prefix found: its last change, and the sessions of
/// its live keys with when each expires unless renewed.
#[derive(Debug)]
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
        let deleted: Option<i64> = tx
            .query_row(
                LAST_DELETION,
                params![prefix, super::primitive::below(prefix)],
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

/// The task's own state between passes: the subscriptions that wake it
/// and the timers of the prefixes' next reads. It holds the handle
/// weakly: the task ends with the last handle (cancelling `stop`).
struct Waking {
    inner: Weak<Inner>,
    wake: Arc<Notify>,
    stop: CancellationToken,
    any: watch::Receiver<u64>,
    timers: BinaryHeap<Reverse<(Instant, String)>>,
}

impl SqliteKeys {
    /// Follows `prefix` from `from` (see [`Keys::watch`]).
    pub(super) fn follow(&self, prefix: &str, from: Revision) -> KeyWatch {
        let (rx, start) = lock(&self.inner.follows.map).watch(prefix, from);
        self.inner.follows.wake.notify_one();
        if start {
            tokio::spawn(Self::follow_all(Waking {
                inner: Arc::downgrade(&self.inner),
                wake: Arc::clone(&self.inner.follows.wake),
                stop: self.inner.stop_notifier.clone(),
                any: self.inner.changes.subscribe(),
                timers: BinaryHeap::new(),
            }));
        }
        rx
    }

    /// The task: reads the marked prefixes, tells what changed, and waits
    /// until some must be read again; ends once none is followed, or the
    /// handle is gone.
    async fn follow_all(mut waking: Waking) {
        loop {
            waking.any.mark_unchanged();
            let Some(keys) = waking.inner.upgrade().map(|inner| SqliteKeys { inner }) else {
                return;
            };
            let Some(reading) = lock(&keys.inner.follows.map).take() else {
                return;
            };
            for chunk in reading.chunks(PREFIXES_PER_READ) {
                if !keys.read_and_tell(chunk.to_vec(), &mut waking).await {
                    return;
                }
            }
            drop(keys);
            if !until_marked(&mut waking).await {
                return;
            }
        }
    }

    /// Reads `prefixes` in one transaction and tells their receivers;
    /// `false` once the file was replaced (every watch has ended).
    async fn read_and_tell(&self, prefixes: Vec<String>, waking: &mut Waking) -> bool {
        let names = prefixes.clone();
        let reads = self
            .inner
            .read(move |db, tx| {
                Ok(prefixes
                    .iter()
                    .map(|p| db.last_change(tx, p))
                    .collect::<Vec<_>>())
            })
            .await;
        let reads = match reads {
            Ok(reads) => reads,
            Err(error) => names.iter().map(|_| Err(shared_error(&error))).collect(),
        };
        if reads.iter().any(|r| matches!(r, Err(Error::Replaced(_)))) {
            // A replaced file never comes back: the watches end.
            lock(&self.inner.follows.map).end();
            return false;
        }
        let (mut gone, mut alive) = (Vec::new(), Vec::new());
        {
            let mut map = lock(&self.inner.follows.map);
            let renewed = &self.inner.renewed;
            for (prefix, read) in names.into_iter().zip(reads) {
                let applied = map.apply(&prefix, read, |s| renewed.renews(s));
                gone.extend(applied.gone);
                alive.extend(applied.alive);
                if let Some(at) = applied.next_at {
                    waking.timers.push(Reverse((at, prefix)));
                }
            }
        }
        for session in alive {
            self.watch_death(session);
        }
        if !gone.is_empty() {
            gone.sort_unstable();
            gone.dedup();
            self.end_dead(gone).await;
        }
        true
    }

    /// Ends the sessions of dead processes that a read found (their keys
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
                self.inner.follows.wrote(ended.iter().map(String::as_str));
            }
            Err(error) => {
                tracing::debug!(%error, "cannot end the sessions of dead processes; their TTL will")
            }
        }
    }

    /// Wakes this handle's task (every prefix is read) once `session`'s
    /// process dies.
    fn watch_death(&self, session: i64) {
        if let Some(liveness) = &self.inner.db.liveness {
            liveness.watch(session, Arc::downgrade(&self.inner.changes));
        }
    }
}

/// Waits until a prefix is marked for reading: by a commit of this
/// handle, another's commit or a death (every prefix), a session this
/// handle stopped renewing, or a prefix's timer; `false` once the handle
/// is gone.
async fn until_marked(waking: &mut Waking) -> bool {
    loop {
        let next = waking.timers.peek().map(|Reverse((at, _))| *at);
        let timer = async {
            match next {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        let mut all = false;
        tokio::select! {
            changed = waking.any.changed() => all = changed.is_ok(),
            () = waking.wake.notified() => {}
            () = timer => {}
            () = waking.stop.cancelled() => return false,
        }
        let Some(inner) = waking.inner.upgrade() else {
            return false;
        };
        let stopped = std::mem::take(&mut *lock(&inner.renewed.stopped));
        let mut map = lock(&inner.follows.map);
        if all {
            map.all();
        }
        if !stopped.is_empty() {
            map.stopped(&stopped);
        }
        let now = Instant::now();
        while let Some(Reverse((at, _))) = waking.timers.peek()
            && *at <= now
        {
            if let Some(Reverse((at, prefix))) = waking.timers.pop() {
                map.due(&prefix, at);
            }
        }
        if !map.dirty.is_empty() || map.by_prefix.is_empty() {
            return true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> FollowMap {
        FollowMap {
            prune_at: PRUNE_AT,
            ..FollowMap::default()
        }
    }

    fn read(last: u64, sessions: &[(i64, Instant)]) -> Result<Read> {
        Ok(Read {
            last: Revision(last),
            sessions: sessions.to_vec(),
            alive: Vec::new(),
            gone: Vec::new(),
        })
    }

    /// A new prefix is read at once, and starts the task once; a commit
    /// marks only the followed prefixes of the keys it wrote, each once.
    #[test]
    fn a_commit_marks_the_followed_prefixes_of_its_keys_alone() {
        let mut map = map();
        let (_a, start) = map.watch("e/a/", Revision(3));
        assert!(start);
        let (_b, start) = map.watch("e/b/", Revision(3));
        assert!(!start, "one task per handle");
        assert_eq!(map.take(), Some(vec!["e/a/".to_owned(), "e/b/".to_owned()]));
        assert!(map.wrote(["e/a/x", "e/a/y", "f/a/"].into_iter()));
        assert_eq!(map.take(), Some(vec!["e/a/".to_owned()]));
        assert!(!map.wrote(["e/c/x"].into_iter()));
        assert_eq!(map.take(), Some(Vec::new()));
    }

    /// A prefix nobody watches is dropped when it is read or another's
    /// commit comes, and the task ends with the last.
    #[test]
    fn unwatched_prefixes_go_and_the_task_ends_with_the_last() {
        let mut map = map();
        let (a, _) = map.watch("a", Revision(0));
        let (b, _) = map.watch("b", Revision(0));
        map.take();
        drop(a);
        map.all();
        assert_eq!(map.take(), Some(vec!["b".to_owned()]));
        drop(b);
        map.wrote(["b"].into_iter());
        assert_eq!(map.take(), None, "no prefix is followed");
        assert!(!map.running);
        let (_c, start) = map.watch("c", Revision(0));
        assert!(start, "a new watch starts the task again");
    }

    /// A read tells a change after what was told, or a session gone from
    /// the prefix; nothing else. A timer is set only for the sessions this
    /// handle does not renew, and a timer made stale by a later read marks
    /// nothing.
    #[test]
    fn a_read_tells_what_changed_and_times_what_others_renew() {
        let mut map = map();
        let (mut rx, _) = map.watch("p", Revision(5));
        map.take();
        let later = Instant::now() + Duration::from_secs(3);
        let applied = map.apply("p", read(5, &[(1, later)]), |_| true);
        assert_eq!(applied.next_at, None, "renewed here: no timer");
        assert!(
            !rx.has_changed().unwrap_or(true),
            "nothing after revision 5"
        );
        let applied = map.apply("p", read(5, &[]), |_| true);
        assert!(rx.has_changed().unwrap_or(false), "its one session ended");
        rx.mark_unchanged();
        assert_eq!(applied, Applied::default());
        let applied = map.apply("p", read(7, &[(2, later)]), |_| false);
        assert_eq!(*rx.borrow_and_update(), Heard::Changed(Revision(7)));
        assert_eq!(applied.next_at, Some(later));
        let sooner = later - Duration::from_secs(1);
        map.due("p", sooner);
        assert!(map.dirty.is_empty(), "a stale timer marks nothing");
        map.due("p", later);
        assert_eq!(map.dirty, vec!["p".to_owned()]);
    }

    /// A read that fails tells the store does not answer, reads again
    /// soon, and the next read that succeeds is told even if nothing
    /// changed.
    #[test]
    fn a_failed_read_is_told_and_retried() {
        let mut map = map();
        let (mut rx, _) = map.watch("p", Revision(5));
        map.take();
        let applied = map.apply(
            "p",
            Err(Error::unavailable("down", std::io::Error::other("busy"))),
            |_| true,
        );
        assert!(applied.next_at.is_some());
        assert!(matches!(*rx.borrow_and_update(), Heard::Unknown { .. }));
        map.apply("p", read(5, &[]), |_| true);
        assert_eq!(*rx.borrow_and_update(), Heard::Changed(Revision(5)));
    }

    /// The sessions a handle stopped renewing mark the prefixes that saw
    /// them, and those alone.
    #[test]
    fn a_session_no_longer_renewed_marks_the_prefixes_that_saw_it() {
        let mut map = map();
        let (_a, _) = map.watch("a", Revision(0));
        let (_b, _) = map.watch("b", Revision(0));
        map.take();
        let at = Instant::now();
        map.apply("a", read(1, &[(7, at)]), |_| true);
        map.apply("b", read(1, &[(8, at)]), |_| true);
        map.stopped(&[7]);
        assert_eq!(map.take(), Some(vec!["a".to_owned()]));
    }
}
