//! What a handle's listening connection heard of the primitive's keys,
//! and the watches it wakes: each registered by its prefix, woken only by
//! a change of a key under it (a key's prefixes are looked up, so a
//! change costs the key's length, not the number of watches), and never
//! behind: a watch holds only the latest change it was told. The last
//! changes are kept, so that a new watch tells one made between its
//! caller's read and its registration without reading again.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::mutex::lock;
use crate::store::keys::Revision;

/// How many key changes [`Recent`] keeps.
const RECENT: usize = 1024;

/// What a watch is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Poke {
    /// A key under its prefix changed at this revision.
    Changed(Revision),
    /// The listener (re)started listening: what changed meanwhile is
    /// unknown; read again.
    Resync,
}

/// What a registered watch holds: the last change and how many resyncs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Pokes {
    revision: u64,
    resyncs: u64,
}

type Senders = Vec<(u64, tokio::sync::watch::Sender<Pokes>)>;

/// The key changes a handle's listening connection heard lately, and the
/// watches registered with it.
#[derive(Debug, Default)]
pub(super) struct Recent {
    /// Every change after this revision is in `told` or yet to be heard;
    /// `None` while not listening.
    floor: Option<u64>,
    /// The `notify_keys` payloads heard after `floor`, with their
    /// revisions, in order.
    told: VecDeque<(u64, Arc<str>)>,
    /// The watches, by prefix.
    watches: HashMap<String, Senders>,
    next: u64,
    resyncs: u64,
}

impl Recent {
    /// A payload the listening connection heard.
    pub(super) fn heard(&mut self, payload: &Arc<str>) {
        let Some((revision, keys)) = parse(payload) else {
            return;
        };
        if self.told.len() == RECENT
            && let Some((forgotten, _)) = self.told.pop_front()
        {
            self.floor = self.floor.map(|floor| floor.max(forgotten));
        }
        self.told.push_back((revision, Arc::clone(payload)));
        let poke = |senders: &Senders| {
            for (_, tx) in senders {
                tx.send_if_modified(|p| {
                    let newer = revision > p.revision;
                    p.revision = p.revision.max(revision);
                    newer
                });
            }
        };
        if keys.is_empty() {
            self.watches.values().for_each(poke);
            return;
        }
        for key in keys.split('\n') {
            for (end, _) in key.char_indices().chain([(key.len(), ' ')]) {
                if let Some(senders) = self.watches.get(&key[..end]) {
                    poke(senders);
                }
            }
        }
    }

    /// Listening again, from the store's `revision` on: every watch reads
    /// again, since what changed while nobody listened is unknown.
    pub(super) fn listening_after(&mut self, revision: i64) {
        let revision = u64::try_from(revision).unwrap_or(0);
        self.told.retain(|(r, _)| *r > revision);
        self.floor = Some(revision);
        self.resyncs += 1;
        let resyncs = self.resyncs;
        for (_, tx) in self.watches.values().flatten() {
            tx.send_modify(|p| p.resyncs = resyncs);
        }
    }

    /// Not listening: changes go unheard.
    pub(super) fn deaf(&mut self) {
        self.floor = None;
        self.told.clear();
    }

    /// The last change under `prefix` after `from`, if any (`Some(None)`
    /// if none); `None` if what was heard cannot tell.
    fn since(&self, from: Revision, prefix: &str) -> Option<Option<Revision>> {
        if self.floor? > from.0 {
            return None;
        }
        Some(
            self.told
                .iter()
                .filter_map(|(_, payload)| concerns(payload, prefix, from))
                .max(),
        )
    }
}

/// A watch registered with a handle's [`Recent`]; dropped, it is gone.
#[derive(Debug)]
pub(super) struct Registered {
    recent: Arc<Mutex<Recent>>,
    prefix: String,
    id: u64,
    rx: tokio::sync::watch::Receiver<Pokes>,
    resyncs: u64,
}

impl Registered {
    /// Registers a watch of `prefix`; with what changed under it after
    /// `from` as far as what was heard tells (see [`Recent::since`]).
    pub(super) fn new(
        recent: &Arc<Mutex<Recent>>,
        prefix: &str,
        from: Revision,
    ) -> (Self, Option<Option<Revision>>) {
        let mut heard = lock(recent);
        heard.next += 1;
        let id = heard.next;
        let start = Pokes {
            revision: from.0,
            resyncs: heard.resyncs,
        };
        let (tx, rx) = tokio::sync::watch::channel(start);
        heard
            .watches
            .entry(prefix.to_owned())
            .or_default()
            .push((id, tx));
        let since = heard.since(from, prefix);
        drop(heard);
        let registered = Registered {
            recent: Arc::clone(recent),
            prefix: prefix.to_owned(),
            id,
            rx,
            resyncs: start.resyncs,
        };
        (registered, since)
    }

    /// The next thing this watch is told; `None` once the handle is gone.
    pub(super) async fn next(&mut self) -> Option<Poke> {
        self.rx.changed().await.ok()?;
        let pokes = *self.rx.borrow_and_update();
        if pokes.resyncs != self.resyncs {
            self.resyncs = pokes.resyncs;
            return Some(Poke::Resync);
        }
        Some(Poke::Changed(Revision(pokes.revision)))
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut heard = lock(&self.recent);
        if let Some(senders) = heard.watches.get_mut(&self.prefix) {
            senders.retain(|(id, _)| *id != self.id);
            if senders.is_empty() {
                heard.watches.remove(&self.prefix);
            }
        }
    }
}

/// A `notify_keys` payload's revision and the keys it names (none: any).
fn parse(payload: &str) -> Option<(u64, &str)> {
    let told = payload.strip_prefix("k ")?;
    let (revision, keys) = told.split_once('\n').unwrap_or((told, ""));
    Some((revision.parse().ok()?, keys))
}

/// The revision of a change a `notify_keys` payload tells under `prefix`,
/// after `from`.
fn concerns(payload: &str, prefix: &str, from: Revision) -> Option<Revision> {
    let (at, keys) = parse(payload)?;
    let ours = keys.is_empty() || keys.split('\n').any(|k| k.starts_with(prefix));
    (at > from.0 && ours).then_some(Revision(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heard(recent: &Arc<Mutex<Recent>>, payload: &str) {
        lock(recent).heard(&Arc::from(payload));
    }

    #[test]
    fn what_was_heard_tells_changes_under_a_prefix_after_a_revision() {
        let mut recent = Recent::default();
        recent.heard(&Arc::from("k 4\na:x"));
        assert_eq!(recent.since(Revision(3), "a:"), None, "not listening");
        recent.listening_after(4);
        for payload in ["k 5\na:x\nb:y", "jobs 17", "k 6\nb:z", "k 7"] {
            recent.heard(&Arc::from(payload));
        }
        assert_eq!(recent.since(Revision(3), "a:"), None, "before the floor");
        assert_eq!(recent.since(Revision(4), "a:"), Some(Some(Revision(7))));
        assert_eq!(recent.since(Revision(4), "b:"), Some(Some(Revision(7))));
        assert_eq!(recent.since(Revision(7), "a:"), Some(None));
        recent.listening_after(6);
        recent.heard(&Arc::from("k 8\nb:z"));
        assert_eq!(recent.since(Revision(7), "a:"), Some(None));
        assert_eq!(recent.since(Revision(7), "b:"), Some(Some(Revision(8))));
        recent.deaf();
        assert_eq!(recent.since(Revision(8), "a:"), None);
    }

    #[test]
    fn what_was_forgotten_cannot_tell() {
        let mut recent = Recent::default();
        recent.listening_after(0);
        for r in 1..=u64::try_from(RECENT).unwrap_or(0) + 2 {
            recent.heard(&Arc::from(format!("k {r}\nb:{r}")));
        }
        assert_eq!(recent.since(Revision(1), "a:"), None);
        assert_eq!(recent.since(Revision(2), "a:"), Some(None));
    }

    #[tokio::test]
    async fn a_change_wakes_the_watches_of_its_key_s_prefixes_alone() {
        let recent = Arc::new(Mutex::new(Recent::default()));
        lock(&recent).listening_after(0);
        let (mut election, _) = Registered::new(&recent, "e:c:", Revision(0));
        let (mut ahead, _) = Registered::new(&recent, "e:c:01", Revision(0));
        let (mut other, _) = Registered::new(&recent, "f:c:", Revision(0));
        heard(&recent, "k 3\ne:c:02");
        assert_eq!(election.next().await, Some(Poke::Changed(Revision(3))));
        assert!(
            !ahead.rx.has_changed().unwrap_or(true),
            "another key's watch woke"
        );
        assert!(
            !other.rx.has_changed().unwrap_or(true),
            "another election's watch woke"
        );
        heard(&recent, "k 4\ne:c:01");
        assert_eq!(ahead.next().await, Some(Poke::Changed(Revision(4))));
        // A payload that names no key wakes every watch; a new listening
        // connection makes every watch read again.
        heard(&recent, "k 5");
        assert_eq!(other.next().await, Some(Poke::Changed(Revision(5))));
        lock(&recent).listening_after(5);
        assert_eq!(other.next().await, Some(Poke::Resync));
        drop(election);
        assert_eq!(lock(&recent).watches.len(), 2, "a dropped watch is gone");
    }
}
