//! Notes on ZooKeeper (see [`crate::line`]): ephemeral nodes
//! `{root}/notes/{election}/{session}-{name}` holding the note's text,
//! created by the session's own client, so that ZooKeeper deletes them when
//! the session ends; a note's order is its node's `czxid`. An election's
//! last released token is the data of the persistent node
//! `{root}/releases/{election}`, set in the multi-op that deletes the
//! grant's node. Nodes get the store's ACL, as every node leasehold makes.
//! A note's data may be replaced by any client of the store
//! ([`crate::store::Store::amend_note`]); a one-note watch is a persistent
//! watch on that note's node alone.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use zookeeper_client::{AddWatchMode, Client, CreateMode, EventType, SessionState};

use super::{Inner, WATCH_RETRY, encode, request};
use crate::error::{Error, Result};
use crate::names::ElectionName;
use crate::store::note_watch::NoteSource;
use crate::store::watch_driver::Event;
use crate::store::{FencingToken, Note, SessionId, check_note};

impl Inner {
    fn notes_root(&self) -> String {
        format!("{}/notes", self.root)
    }

    pub(super) fn notes_dir(&self, election: &ElectionName) -> String {
        format!("{}/{}", self.notes_root(), encode(election))
    }

    fn releases_dir(&self) -> String {
        format!("{}/releases", self.root)
    }

    pub(super) fn release_node(&self, election: &ElectionName) -> String {
        format!("{}/{}", self.releases_dir(), encode(election))
    }

    /// Creates the persistent nodes of `path`'s parents under the root
    /// that are missing (`notes` or `releases`, and the election's), and
    /// `path` itself when `leaf` holds its data; nodes already there are
    /// left as they are.
    pub(super) async fn make_parents(
        &self,
        client: &Client,
        nodes: &[&str],
        leaf: Option<&[u8]>,
    ) -> Result<()> {
        const WHAT: &str = "create a node for planned moves";
        for (i, node) in nodes.iter().enumerate() {
            let data = if i + 1 == nodes.len() {
                leaf.unwrap_or(&[])
            } else {
                &[]
            };
            match request(WHAT, client.create(node, data, &self.persistent())).await? {
                Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
                Err(zookeeper_client::Error::NoNode) => {
                    return Err(Error::Corrupt(format!(
                        "zookeeper node {} is gone: leasehold's nodes were deleted; nothing was written",
                        self.root
                    )));
                }
                Err(error) => return Err(self.failed(WHAT, node, error)),
            }
        }
        Ok(())
    }

    pub(super) async fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        const WHAT: &str = "put a note";
        check_note(name, text)?;
        let (zk, client) = self.live_session(session)?;
        let dir = self.notes_dir(election);
        let path = format!("{dir}/{:016x}-{name}", session.0);
        let ephemeral = CreateMode::Ephemeral.with_acls(self.acls);
        for _ in 0..2 {
            match zk
                .ask(WHAT, client.create(&path, text.as_bytes(), &ephemeral))
                .await?
            {
                Ok(_) => return Ok(()),
                Err(zookeeper_client::Error::NodeExists) => {
                    // Replaced in place: the node keeps its czxid (order).
                    return zk
                        .ask(WHAT, client.set_data(&path, text.as_bytes(), None))
                        .await?
                        .map(drop)
                        .map_err(|error| zk.refused(WHAT, &path, error));
                }
                Err(zookeeper_client::Error::NoNode) => {
                    self.make_parents(&client, &[&self.notes_root(), &dir], None)
                        .await?;
                }
                Err(error) => return Err(zk.refused(WHAT, &path, error)),
            }
        }
        Err(Error::Unavailable {
            reason: format!("zookeeper {WHAT}: node {dir} kept disappearing"),
            source: None,
        })
    }

    pub(super) async fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        const WHAT: &str = "delete a note";
        let path = format!("{}/{:016x}-{name}", self.notes_dir(election), session.0);
        let Ok((zk, client)) = self.live_session(session) else {
            if self.session(session).is_some() {
                // An ended session's notes are gone with it.
                return Ok(());
            }
            // Another process's session (a dead member's note, removed by
            // its guard): with the store's own client.
            let client = self.reader().await?;
            return match super::request(WHAT, client.delete(&path, None)).await? {
                Ok(()) | Err(zookeeper_client::Error::NoNode) => Ok(()),
                Err(error) => Err(self.failed(WHAT, &path, error)),
            };
        };
        match zk.ask(WHAT, client.delete(&path, None)).await? {
            Ok(()) | Err(zookeeper_client::Error::NoNode) => Ok(()),
            Err(error) => Err(zk.refused(WHAT, &path, error)),
        }
    }

    /// The notes on `election`, read with the store's own client, in
    /// order; nodes leasehold did not write are skipped.
    pub(super) async fn read_notes(&self, election: &ElectionName) -> Result<Vec<Note>> {
        const WHAT: &str = "read notes";
        let client = self.reader().await?;
        let dir = self.notes_dir(election);
        let children = match request(WHAT, client.list_children(&dir)).await? {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => return Ok(Vec::new()),
            Err(error) => return Err(self.failed(WHAT, &dir, error)),
        };
        let mut notes = Vec::with_capacity(children.len());
        for child in children {
            if let Some((note, _)) = self.read_note_node(&client, &dir, &child).await? {
                notes.push(note);
            }
        }
        notes.sort_by_key(|n| n.order);
        Ok(notes)
    }

    /// The note in node `{dir}/{child}` with the node's version, if it is
    /// there and leasehold wrote it: named `{session}-{name}` by the
    /// session that owns the ephemeral node, with a valid name and text.
    async fn read_note_node(
        &self,
        client: &Client,
        dir: &str,
        child: &str,
    ) -> Result<Option<(Note, i32)>> {
        const WHAT: &str = "read notes";
        let Some((owner, name)) = child.split_once('-') else {
            return Ok(None);
        };
        let Ok(owner) = u64::from_str_radix(owner, 16) else {
            return Ok(None);
        };
        let path = format!("{dir}/{child}");
        let (data, stat) = match request(WHAT, client.get_data(&path)).await? {
            Ok(read) => read,
            // Not there, or its session ended since the list.
            Err(zookeeper_client::Error::NoNode) => return Ok(None),
            Err(error) => return Err(self.failed(WHAT, &path, error)),
        };
        let Ok(text) = String::from_utf8(data) else {
            return Ok(None);
        };
        if SessionId::from_bits(stat.ephemeral_owner).0 != owner || check_note(name, &text).is_err()
        {
            return Ok(None);
        }
        let note = Note {
            session: SessionId(owner),
            name: name.to_owned(),
            order: stat.czxid.unsigned_abs(),
            text,
        };
        Ok(Some((note, stat.version)))
    }

    /// `session`'s note `name` on `election`, read with the store's own
    /// client: a one-note list, or empty.
    pub(super) async fn read_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<Vec<Note>> {
        let client = self.reader().await?;
        let child = format!("{:016x}-{name}", session.0);
        let read = self
            .read_note_node(&client, &self.notes_dir(election), &child)
            .await?;
        Ok(read.map(|(note, _)| note).into_iter().collect())
    }

    /// Replaces a note's data through the store's own client (ZooKeeper
    /// lets any client with the store's ACL set an ephemeral node's data),
    /// checked against the version read, so that it never writes a node
    /// that was deleted, or made again, meanwhile.
    pub(super) async fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        const WHAT: &str = "amend a note";
        check_note(name, text)?;
        let client = self.reader().await?;
        let dir = self.notes_dir(election);
        let child = format!("{:016x}-{name}", session.0);
        let path = format!("{dir}/{child}");
        for _ in 0..3 {
            let Some((_, version)) = self.read_note_node(&client, &dir, &child).await? else {
                return Ok(false);
            };
            match request(WHAT, client.set_data(&path, text.as_bytes(), Some(version))).await? {
                Ok(_) => return Ok(true),
                Err(zookeeper_client::Error::NoNode) => return Ok(false),
                // Its owner put it again meanwhile: read it again.
                Err(zookeeper_client::Error::BadVersion) => {}
                Err(error) => return Err(self.failed(WHAT, &path, error)),
            }
        }
        Err(Error::Unavailable {
            reason: format!("zookeeper {WHAT}: node {path} kept changing"),
            source: None,
        })
    }

    pub(super) async fn last_release(
        &self,
        election: &ElectionName,
    ) -> Result<Option<FencingToken>> {
        const WHAT: &str = "read the last release";
        let client = self.reader().await?;
        let path = self.release_node(election);
        match request(WHAT, client.get_data(&path)).await? {
            Ok((data, _)) => std::str::from_utf8(&data)
                .ok()
                .and_then(|t| t.parse::<u64>().ok())
                .map(|t| Some(FencingToken(t)))
                .ok_or_else(|| {
                    Error::Corrupt(format!("zookeeper node {path} does not hold a token"))
                }),
            Err(zookeeper_client::Error::NoNode) => Ok(None),
            Err(error) => Err(self.failed(WHAT, &path, error)),
        }
    }

    /// A persistent watch on `election`'s notes — recursive on their
    /// node, or on the one note's node alone with `only` — set before a
    /// first read so that no change between the two is missed (also on a
    /// node not yet created).
    async fn watch_notes_node(
        &self,
        client: &Client,
        election: &ElectionName,
        only: Option<&(SessionId, String)>,
    ) -> Result<zookeeper_client::PersistentWatcher> {
        let dir = self.notes_dir(election);
        let (path, mode) = match only {
            Some((session, name)) => (
                format!("{dir}/{:016x}-{name}", session.0),
                AddWatchMode::Persistent,
            ),
            None => (dir, AddWatchMode::PersistentRecursive),
        };
        request("watch notes", client.watch(&path, mode))
            .await?
            .map_err(|e| self.failed("watch notes", &path, e))
    }

    /// Watches `election`'s notes, or with `only` that one note's node
    /// alone (changes of other notes never reach it).
    pub(super) async fn start_notes_watch(
        self: &std::sync::Arc<Self>,
        election: &ElectionName,
        only: Option<(SessionId, &str)>,
    ) -> Result<crate::store::NoteWatch> {
        let only = match only {
            Some((session, name)) => {
                check_note(name, "")?;
                Some((session, name.to_owned()))
            }
            None => None,
        };
        let client = self.reader().await?;
        let watcher = self
            .watch_notes_node(&client, election, only.as_ref())
            .await?;
        let source = ZkNotes {
            inner: std::sync::Arc::clone(self),
            election: election.clone(),
            only,
            watcher: Some(watcher),
        };
        crate::store::note_watch::start(source, election).await
    }
}

/// The ZooKeeper side of a notes watch: a recursive persistent watch on
/// the election's notes node; set anew after the reader reconnects or its
/// session ends (events meanwhile are not replayed).
struct ZkNotes {
    inner: std::sync::Arc<Inner>,
    election: ElectionName,
    /// The one note watched, if not all.
    only: Option<(SessionId, String)>,
    watcher: Option<zookeeper_client::PersistentWatcher>,
}

impl NoteSource for ZkNotes {
    const RETRY: Duration = WATCH_RETRY;

    async fn read(&mut self) -> Result<(Vec<Note>, Option<Duration>)> {
        let notes = match &self.only {
            Some((session, name)) => self.inner.read_note(*session, &self.election, name).await?,
            None => self.inner.read_notes(&self.election).await?,
        };
        Ok((notes, None))
    }

    async fn changed(&mut self) -> Event {
        loop {
            let Some(watcher) = self.watcher.as_mut() else {
                tokio::time::sleep(WATCH_RETRY).await;
                let watched = match self.inner.reader().await {
                    Ok(client) => {
                        self.inner
                            .watch_notes_node(&client, &self.election, self.only.as_ref())
                            .await
                    }
                    Err(error) => Err(error),
                };
                return match watched {
                    Ok(watcher) => {
                        self.watcher = Some(watcher);
                        Event::Changed
                    }
                    Err(error) => Event::Unavailable(error),
                };
            };
            let event = watcher.changed().await;
            if event.event_type != EventType::Session {
                return Event::Changed;
            }
            match event.session_state {
                SessionState::SyncConnected => return Event::Changed,
                state if state.is_terminated() => self.watcher = None,
                SessionState::Disconnected => {
                    // Set anew once connected again (events may be lost).
                    self.watcher = None;
                    return Event::Unavailable(Error::Unavailable {
                        reason: format!("zookeeper at {}: disconnected", self.inner.cluster),
                        source: None,
                    });
                }
                _ => {}
            }
        }
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(tokio::time::sleep(duration))
    }
}
