//! What a handle's listening connection heard of the primitive's keys,
//! and the watches it tells, with no task of their own: each registered by
//! its prefix, told only of a change of a key under it (a key's prefixes
//! are looked up, so a change costs the key's length, not the number of
//! watches), and never behind: a watch holds only the latest news. While
//! nobody listens they hold "unknown"; once the listener is back, a
//! change at the revision it listens from, so that their readers read
//! again. The last changes are kept, so that a new watch tells one made
//! between its caller's read and its registration without reading again.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::store::keys::{Heard, Revision};
use crate::watch;

/// How many key changes [`Recent`] keeps.
const RECENT: usize = 1024;

type Senders = Vec<watch::Sender<Heard>>;

/// How many watches may be registered before the ones nobody reads are
/// dropped.
const PRUNE_AT: usize = 64;

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
    /// How many are registered, and how many the next prune waits for.
    registered: usize,
    prune_at: usize,
    /// Why changes go unheard, while they do.
    deaf: Option<String>,
    /// Whether the listener listens (`floor` is known).
    up: Up,
}

/// Whether the listener listens, for the reads of new watches that wait
/// for it.
#[derive(Debug)]
struct Up(tokio::sync::watch::Sender<bool>);

impl Default for Up {
    fn default() -> Self {
        Up(tokio::sync::watch::Sender::new(false))
    }
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
        let at = Revision(revision);
        if keys.is_empty() {
            self.watches.values().flatten().for_each(|tx| tell(tx, at));
            return;
        }
        for key in keys.split('\n') {
            for (end, _) in key.char_indices().chain([(key.len(), ' ')]) {
                if let Some(senders) = self.watches.get(&key[..end]) {
                    senders.iter().for_each(|tx| tell(tx, at));
                }
            }
        }
    }

    /// Listening again, from the store's `revision` on: every watch that
    /// said "unknown" is told a change there, since what changed while
    /// nobody listened is unknown. (A watch made before the first listen
    /// reads once it listens: see [`Recent::register`].)
    pub(super) fn listening_after(&mut self, revision: i64) {
        let revision = u64::try_from(revision).unwrap_or(0);
        self.told.retain(|(r, _)| *r > revision);
        self.floor = Some(revision);
        self.deaf = None;
        for tx in self.watches.values().flatten() {
            tx.send_if_modified(|heard| match heard {
                Heard::Unknown { .. } => {
                    *heard = Heard::Changed(Revision(revision));
                    true
                }
                Heard::Changed(_) => false,
            });
        }
        self.up.0.send_replace(true);
    }

    /// Not listening: changes go unheard, and every watch says so.
    pub(super) fn deaf(&mut self, why: String) {
        self.floor = None;
        self.told.clear();
        self.up.0.send_replace(false);
        for tx in self.watches.values().flatten() {
            tx.send_replace(Heard::Unknown { error: why.clone() });
        }
        self.deaf = Some(why);
    }

    /// A watch of `prefix` from `from`: its receiver, which already tells
    /// what changed after `from` as far as what was heard tells; when that
    /// cannot tell, what says when the listener listens: the caller reads
    /// then what changed after `from`, and tells the watch (a change after
    /// that read is heard).
    pub(super) fn register(
        &mut self,
        prefix: &str,
        from: Revision,
    ) -> (
        watch::Sender<Heard>,
        crate::store::keys::KeyWatch,
        Option<tokio::sync::watch::Receiver<bool>>,
    ) {
        let since = self.since(from, prefix);
        let (tx, rx) = watch::channel(Heard::Changed(from));
        // What it tells already, as news to its reader.
        match (&self.deaf, since) {
            (Some(why), _) => {
                tx.send_replace(Heard::Unknown { error: why.clone() });
            }
            (None, Some(Some(at))) => {
                tx.send_replace(Heard::Changed(at));
            }
            (None, _) => {}
        }
        self.prune();
        self.registered += 1;
        self.watches
            .entry(prefix.to_owned())
            .or_default()
            .push(tx.clone());
        let read = (since.is_none() && self.deaf.is_none()).then(|| self.up.0.subscribe());
        (tx, rx, read)
    }

    /// Drops the watches nobody reads any more, once there are twice as
    /// many registered as after the last prune.
    fn prune(&mut self) {
        if self.registered < self.prune_at.max(PRUNE_AT) {
            return;
        }
        self.watches.retain(|_, senders| {
            senders.retain(|tx| !tx.is_closed());
            !senders.is_empty()
        });
        self.registered = self.watches.values().map(Vec::len).sum();
        self.prune_at = self.registered * 2;
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

/// Tells `tx` of a change at `at`.
pub(super) fn tell(tx: &watch::Sender<Heard>, at: Revision) {
    // Told whatever revision it held: a notice is anyone's to send (any
    // role that connects may NOTIFY), so one that names a revision far
    // ahead must not silence the real ones after it; the reader reads.
    tx.send_modify(|heard| {
        let told = match heard {
            Heard::Changed(told) => (*told).max(at),
            Heard::Unknown { .. } => at,
        };
        *heard = Heard::Changed(told);
    });
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
        recent.deaf("lost".into());
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

    #[test]
    fn a_change_tells_the_watches_of_its_key_s_prefixes_alone() {
        let mut recent = Recent::default();
        recent.listening_after(0);
        let (_, mut election, _) = recent.register("e:c:", Revision(0));
        let (_, mut ahead, _) = recent.register("e:c:01", Revision(0));
        let (_, mut other, _) = recent.register("f:c:", Revision(0));
        recent.heard(&Arc::from("k 3\ne:c:02"));
        assert!(election.has_changed().unwrap_or(false));
        assert_eq!(*election.borrow_and_update(), Heard::Changed(Revision(3)));
        assert!(
            !ahead.has_changed().unwrap_or(true),
            "another key's watch woke"
        );
        assert!(
            !other.has_changed().unwrap_or(true),
            "another election's watch woke"
        );
        recent.heard(&Arc::from("k 4\ne:c:01"));
        assert_eq!(*ahead.borrow_and_update(), Heard::Changed(Revision(4)));
        // A payload that names no key tells every watch; a lost listener
        // makes them unknown, and a new one tells them all a change.
        recent.heard(&Arc::from("k 5"));
        assert_eq!(*other.borrow_and_update(), Heard::Changed(Revision(5)));
        recent.deaf("lost".into());
        assert!(matches!(*other.borrow_and_update(), Heard::Unknown { .. }));
        let (_, mut late, read) = recent.register("g:", Revision(5));
        assert!(
            read.is_none(),
            "a watch registered while nobody listens says so"
        );
        assert!(matches!(*late.borrow_and_update(), Heard::Unknown { .. }));
        recent.listening_after(9);
        assert_eq!(*other.borrow_and_update(), Heard::Changed(Revision(9)));
        assert_eq!(*late.borrow_and_update(), Heard::Changed(Revision(9)));
        // A watch that heard no loss is not told by a listen.
        recent.listening_after(10);
        assert!(!other.has_changed().unwrap_or(true));
    }

    /// A forged notice that names a revision far ahead (anyone who may
    /// connect may NOTIFY) does not silence the real changes after it
    /// (found by a review: transfers then waited for the lease to expire).
    #[test]
    fn a_notice_from_far_ahead_does_not_silence_the_next() {
        let mut recent = Recent::default();
        recent.listening_after(0);
        let (_, mut watch, _) = recent.register("e:", Revision(0));
        recent.heard(&Arc::from("k 9000000000000\ne:x"));
        assert!(watch.has_changed().unwrap_or(false));
        watch.borrow_and_update();
        recent.heard(&Arc::from("k 7\ne:x"));
        assert!(
            watch.has_changed().unwrap_or(false),
            "the real change was silenced"
        );
    }

    #[test]
    fn a_new_watch_tells_what_was_heard_since_its_revision() {
        let mut recent = Recent::default();
        let (_, early, read) = recent.register("a:", Revision(3));
        let read = read.expect("not listening yet: the caller reads once it listens");
        assert!(!*read.borrow());
        recent.listening_after(4);
        assert!(*read.borrow(), "listening");
        assert!(
            !early.has_changed().unwrap_or(true),
            "the first listen tells a watch that reads nothing"
        );
        recent.heard(&Arc::from("k 5\na:x"));
        let (_, mut told, read) = recent.register("a:", Revision(4));
        assert!(read.is_none());
        assert!(told.has_changed().unwrap_or(false));
        assert_eq!(*told.borrow_and_update(), Heard::Changed(Revision(5)));
        let (_, quiet, read) = recent.register("b:", Revision(4));
        assert!(read.is_none());
        assert!(!quiet.has_changed().unwrap_or(true));
    }

    #[test]
    fn watches_nobody_reads_are_dropped() {
        let mut recent = Recent::default();
        recent.listening_after(0);
        let (_, _kept, _) = recent.register("kept:", Revision(0));
        for n in 0..200 {
            drop(recent.register(&format!("gone{n}:"), Revision(0)));
        }
        assert!(recent.watches.len() < 70, "{}", recent.watches.len());
        assert!(recent.watches.contains_key("kept:"));
    }
}
