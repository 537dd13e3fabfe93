//! The watches of the store primitive on ZooKeeper (see `keys`): one
//! persistent recursive watch per node watched by a handle (a directory,
//! or the keys' root for a prefix without `:`), set once and kept while
//! the handle lives, shared by every watch of a prefix under it; each is
//! told of the keys under its own prefix alone.
//!
//! Kept rather than set and dropped with each watch: the client removes
//! the server's watch of a path when its last watcher there goes, and a
//! removal sent while another watch of the path was being set could take
//! that one with it, leaving it deaf.

use std::sync::Weak;

use tokio::sync::OnceCell;
use zookeeper_client::WatchedEvent;

use super::keys::{changed_at, revision, unescape};
use super::*;
use crate::mutex::lock;
use crate::store::keys::{Heard, KeyWatch, Revision};

/// The shared watches of one handle, by the node they watch.
pub(super) type Hubs = Mutex<HashMap<String, Arc<Hub>>>;

/// One node's watch and the watches of prefixes under it.
#[derive(Debug, Default)]
pub(super) struct Hub {
    /// Set once the server's watch is set and its task runs.
    started: OnceCell<()>,
    subscribers: Mutex<Vec<Subscriber>>,
}

#[derive(Debug)]
struct Subscriber {
    prefix: String,
    tx: crate::watch::Sender<Heard>,
}

/// Tells `tx` a change at `at`, unless it told one as late already.
fn tell(tx: &crate::watch::Sender<Heard>, at: Revision) {
    tx.send_if_modified(|heard| match heard {
        Heard::Changed(told) if *told >= at => false,
        _ => {
            *heard = Heard::Changed(at);
            true
        }
    });
}

/// Tells each of `concerned` to read again: a change at `at` (or as late
/// as it was told already), or that the store does not answer.
fn told(concerned: &[crate::watch::Sender<Heard>], at: Result<Revision>) {
    for tx in concerned {
        match &at {
            Ok(at) => tx.send_modify(|heard| {
                let told = match heard {
                    Heard::Changed(told) => *told,
                    Heard::Unknown { .. } => Revision(0),
                };
                *heard = Heard::Changed(told.max(*at));
            }),
            Err(error) => {
                tx.send_replace(Heard::Unknown {
                    error: error.to_string(),
                });
            }
        }
    }
}

/// What the task of one node's watch needs: the handle (weakly: the task
/// ends with it) and where the keys live.
struct Follower {
    inner: Weak<Inner>,
    /// The node watched.
    path: String,
    /// The keys' root (`{root}/elections`; a recipe's, the store's root).
    root: String,
    /// Whether a key is its node's path under `root` as it is (a recipe's
    /// layout), rather than escaped in leasehold's.
    raw: bool,
    hub: Arc<Hub>,
}

/// The node a hub watches, and how its keys are named.
pub(super) struct Watched {
    /// The node.
    pub(super) path: String,
    /// The keys' root.
    pub(super) root: String,
    /// Whether keys are paths under `root` as they are.
    pub(super) raw: bool,
}

/// A new watch of `prefix` from `from`, told by the hub of `node` among
/// `hubs` (set and started at its first use); the caller tells it at once
/// of a change already made since `from` ([`tell_since`]).
pub(super) async fn subscribe(
    inner: &Arc<Inner>,
    hubs: &Hubs,
    node: Watched,
    prefix: &str,
    from: Revision,
) -> Result<(KeyWatch, crate::watch::Sender<Heard>)> {
    let hub = Arc::clone(lock(hubs).entry(node.path.clone()).or_default());
    (hub.started)
        .get_or_try_init(|| start_hub(inner, node, &hub))
        .await?;
    let (tx, rx) = crate::watch::channel(Heard::Changed(from));
    lock(&hub.subscribers).push(Subscriber {
        prefix: prefix.to_owned(),
        tx: tx.clone(),
    });
    Ok((rx, tx))
}

/// Tells `tx` of the change at `last` if it came after `from`.
pub(super) fn tell_since(tx: &crate::watch::Sender<Heard>, last: Revision, from: Revision) {
    if last > from {
        tell(tx, last);
    }
}

/// Sets the server's watch of `node` and starts its task.
async fn start_hub(inner: &Arc<Inner>, node: Watched, hub: &Arc<Hub>) -> Result<()> {
    let watcher = set_watch(inner, &node.path).await?;
    let follower = Follower {
        inner: Arc::downgrade(inner),
        path: node.path,
        root: node.root,
        raw: node.raw,
        hub: Arc::clone(hub),
    };
    tokio::spawn(Arc::new(follower).supervise(watcher));
    Ok(())
}

impl ZkKeys {
    /// Watches the keys under `prefix` from `from` (see [`Keys::watch`]).
    pub(super) async fn watch_prefix(&self, prefix: &str, from: Revision) -> Result<KeyWatch> {
        let path = match prefix.contains(':') {
            true => self.dir_path(super::keys::split(prefix).0),
            false => self.keys_root(),
        };
        let node = Watched {
            path: path.clone(),
            root: self.keys_root(),
            raw: false,
        };
        let (rx, tx) = subscribe(&self.inner, &self.hubs, node, prefix, from).await?;
        // Told from now on; and at once of what changed since `from`.
        tell_since(&tx, self.last_change(prefix, &path).await?, from);
        Ok(rx)
    }

    /// The last change under `prefix`, watched at `path`: its directory's
    /// (0 while it does not exist), or for a prefix without `:`, the last
    /// of the directories under it.
    async fn last_change(&self, prefix: &str, path: &str) -> Result<Revision> {
        if !prefix.contains(':') {
            return Ok(crate::store::keys::Keys::range(self, prefix)
                .await?
                .revision);
        }
        last_change(&self.inner, path).await
    }
}

/// `first` and the node events that arrived with it, up to the first
/// session event (returned apart, to be handled next): a burst of
/// changes (a thousand standbys joining) is told with one read of the
/// node on a server that sends no zxid, not one read each.
async fn with_the_ready_ones(
    first: WatchedEvent,
    watcher: &mut zookeeper_client::PersistentWatcher,
) -> (Vec<WatchedEvent>, Option<WatchedEvent>) {
    let mut batch = vec![first];
    loop {
        // Polled once: the client's queue of events loses nothing when
        // the wait for the next one is dropped.
        let ready = tokio::select! {
            biased;
            event = watcher.changed() => Some(event),
            () = std::future::ready(()) => None,
        };
        match ready {
            Some(event) if event.event_type == EventType::Session => return (batch, Some(event)),
            Some(event) => batch.push(event),
            None => return (batch, None),
        }
    }
}

/// A future that ends with `Err` instead of a panic of `future` (which
/// is dropped then, never polled again): a panic in the ZooKeeper
/// client's code ends a watch's task without a trace otherwise, and a
/// task of its own to catch it would cost each watched node a second
/// task.
struct Unwound<F> {
    future: std::pin::Pin<Box<F>>,
}

impl<F: Future<Output = ()>> Future for Unwound<F> {
    type Output = std::result::Result<(), ()>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let future = self.future.as_mut();
        // Unwind safety: after a panic the future is never polled again.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.poll(cx))) {
            Ok(polled) => polled.map(Ok),
            Err(_) => std::task::Poll::Ready(Err(())),
        }
    }
}

/// Sets a persistent recursive watch of `path` on the store's client.
async fn set_watch(inner: &Inner, path: &str) -> Result<zookeeper_client::PersistentWatcher> {
    const WHAT: &str = "watch keys";
    let client = inner.reader().await?;
    request(WHAT, client.watch(path, AddWatchMode::PersistentRecursive))
        .await?
        .map_err(|e| inner.failed(WHAT, path, e))
}

/// The last change of the node `path` (0 while it does not exist).
pub(super) async fn last_change(inner: &Inner, path: &str) -> Result<Revision> {
    const WHAT: &str = "read a key directory";
    let client = inner.reader().await?;
    match request(WHAT, client.check_stat(path)).await? {
        Ok(stat) => Ok(stat.as_ref().map(changed_at).unwrap_or_default()),
        Err(error) => Err(inner.failed(WHAT, path, error)),
    }
}

impl Follower {
    /// The key a node at `path` stands for, if it is one.
    fn key_at(&self, path: &str) -> Option<String> {
        let rest = path.strip_prefix(&self.root)?.strip_prefix('/')?;
        if self.raw {
            return Some(rest.to_owned());
        }
        let (dir, leaf) = rest.split_once('/')?;
        Some(unescape(dir)? + &unescape(leaf)?)
    }

    /// The senders of the watches `event` concerns (all, for `None`);
    /// those nobody holds any more are dropped.
    fn concerned(&self, key: Option<&str>) -> Vec<crate::watch::Sender<Heard>> {
        let mut subscribers = lock(&self.hub.subscribers);
        subscribers.retain(|s| s.tx.receiver_count() > 0);
        (subscribers.iter())
            .filter(|s| key.is_none_or(|key| key.starts_with(&s.prefix)))
            .map(|s| s.tx.clone())
            .collect()
    }

    /// Follows the events of `watcher` in a task, and again on a new
    /// watch whenever that task panics: the client panics when its events
    /// end without a last session event, which a watch the server refused
    /// while being set again can do. Its watches are told that the store
    /// does not answer meanwhile, never left deaf.
    async fn supervise(self: Arc<Self>, watcher: zookeeper_client::PersistentWatcher) {
        let mut watcher = Some(watcher);
        while let Some(current) = watcher.take() {
            let followed = Box::pin(Arc::clone(&self).follow(current));
            if (Unwound { future: followed }).await.is_ok() {
                return;
            }
            tracing::warn!(path = %self.path, "a watch of the store ended in its client; setting it again");
            for tx in self.concerned(None) {
                tx.send_replace(Heard::Unknown {
                    error: "zookeeper: the watch ended".to_owned(),
                });
            }
            // Boxed, as `follow` is: this task's own future stays small
            // while it follows (each watched node has one).
            watcher = Box::pin(self.restart()).await;
        }
    }

    /// Tells what the events say, for as long as the handle lives. Sets
    /// the watch anew after the connection was lost (the client's own
    /// re-registration once left a watch deaf) and after the store's
    /// client lost its session.
    async fn follow(self: Arc<Self>, mut watcher: zookeeper_client::PersistentWatcher) {
        let mut disconnected = false;
        let mut next = None;
        loop {
            let event = match next.take() {
                Some(event) => event,
                None => watcher.changed().await,
            };
            let state = event.session_state;
            if event.event_type != EventType::Session {
                let (batch, after) = with_the_ready_ones(event, &mut watcher).await;
                next = after;
                self.node_events(&batch).await;
            } else if state == SessionState::Disconnected {
                disconnected = true;
                let error = "zookeeper: disconnected".to_owned();
                for tx in self.concerned(None) {
                    tx.send_replace(Heard::Unknown {
                        error: error.clone(),
                    });
                }
            } else if state.is_terminated() || std::mem::take(&mut disconnected) {
                match self.restart().await {
                    Some(again) => watcher = again,
                    None => return,
                }
            } else {
                // (Re)connected: events may have been missed.
                self.tell_all().await;
            }
        }
    }

    /// Tells the watches of the keys `events` name: always, even when the
    /// node's last change reads no later than what they were told (a
    /// deleted election node reads as 0: its watches once heard nothing,
    /// and its leader kept leading).
    async fn node_events(&self, events: &[WatchedEvent]) {
        let mut concerned = Vec::new();
        let mut at = Some(0);
        for event in events {
            let Some(key) = self.key_at(&event.path) else {
                continue;
            };
            let before = concerned.len();
            concerned.extend(self.concerned(Some(&key)));
            if concerned.len() > before {
                // A server before 3.9 tells no zxid.
                at = at
                    .zip((event.zxid > 0).then_some(event.zxid))
                    .map(|(a, b)| a.max(b));
            }
        }
        if concerned.is_empty() {
            return;
        }
        // Without a zxid: the node's last change, one read for the batch.
        let at = match at {
            Some(zxid) => Ok(revision(zxid)),
            None => match self.inner.upgrade() {
                Some(inner) => last_change(&inner, &self.path).await,
                None => return,
            },
        };
        told(&concerned, at);
    }

    /// Tells every watch to read again.
    async fn tell_all(&self) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let at = last_change(&inner, &self.path).await;
        told(&self.concerned(None), at);
    }

    /// Sets the watch again (on a new client of the store if its session
    /// ended), telling that the store does not answer until it does;
    /// `None` once the handle is gone.
    async fn restart(&self) -> Option<zookeeper_client::PersistentWatcher> {
        loop {
            let inner = self.inner.upgrade()?;
            match set_watch(&inner, &self.path).await {
                Ok(watcher) => {
                    drop(inner);
                    self.tell_all().await;
                    return Some(watcher);
                }
                Err(error) => {
                    for tx in self.concerned(None) {
                        tx.send_replace(Heard::Unknown {
                            error: error.to_string(),
                        });
                    }
                    drop(inner);
                    tokio::time::sleep(WATCH_RETRY).await;
                }
            }
        }
    }
}
