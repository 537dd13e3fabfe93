//! The store primitive on ZooKeeper ([`Keys`]), in leasehold's layout:
//!
//! - A key `D:L…` (split at its first `:`; a key without one is all `D`)
//!   is the node `{root}/keys/{D}/{:L…}`: one node per directory `D`
//!   (leasehold's keys of one election share one), and a child per key.
//!   `%`, `/` and the characters ZooKeeper refuses in a path are written
//!   `%XX` (their UTF-8 bytes); an empty name is `%`.
//! - A session is a ZooKeeper session (see `sessions`); a key attached to
//!   it is an ephemeral node of that session, which the server deletes
//!   when the session ends. A key's creation revision is its node's
//!   `czxid`, its last write's its `mzxid`: zxids are ensemble-wide and
//!   grow across restarts.
//! - A commit reads what it checks (one multi-read), then writes in one
//!   `multi` that also sets the data of each directory it touches at the
//!   version read: a directory changed in between fails the `multi`, which
//!   is then read and tried again. That version check is what makes the
//!   checks of a creation revision exact (a node deleted and created again
//!   has the same version), and the directory's `mzxid` the last commit
//!   in it.
//! - A read of a prefix is the directory's children and its `stat` (one
//!   request), then the data of the children under the prefix (one
//!   multi-read). Its revision is the directory's last change: its
//!   `mzxid` (the last commit) or `pzxid` (the last child created or
//!   deleted, also by a session's end).
//! - A watch is a persistent recursive watch of the directory (of
//!   `{root}/keys` for a prefix without `:`), told of the keys under its
//!   prefix alone; it tells expiries, as the server deletes the nodes.

use std::collections::BTreeMap;

use zookeeper_client::{MultiReadResult, MultiWriteError, Stat, WatchedEvent};

use super::*;
use crate::store::keys::{Check, Entry, Heard, KeyWatch, Keys, Range, Revision, Write};

/// How often a commit whose directories changed between its read and its
/// write reads again before giving up.
const COMMIT_ATTEMPTS: usize = 64;

/// The store primitive on a ZooKeeper ensemble (see the module).
#[derive(Debug, Clone)]
pub struct ZkKeys {
    pub(super) inner: Arc<Inner>,
}

/// `text` with `%`, `/` and what ZooKeeper refuses in a path written
/// `%XX`; `%` alone for the empty name.
fn escape(text: &str) -> String {
    if text.is_empty() {
        return "%".to_owned();
    }
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let refused = matches!(c, '%' | '/' | '\u{0}'..='\u{1F}' | '\u{7F}'..='\u{9F}')
            || matches!(c, '\u{E000}'..='\u{F8FF}' | '\u{FFF0}'..='\u{FFFF}');
        if refused {
            let mut bytes = [0; 4];
            for b in c.encode_utf8(&mut bytes).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    match out.as_str() {
        "." => "%2E".to_owned(),
        ".." => "%2E%2E".to_owned(),
        _ => out,
    }
}

/// The text [`escape`] wrote as `name`; `None` for a name it never
/// writes.
fn unescape(name: &str) -> Option<String> {
    if name == "%" {
        return Some(String::new());
    }
    let mut bytes = Vec::with_capacity(name.len());
    let mut rest = name.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    let text = String::from_utf8(bytes).ok()?;
    (escape(&text) == name).then_some(text)
}

/// A key's directory and the rest of it (from its first `:` on).
fn split(key: &str) -> (&str, &str) {
    key.find(':').map_or((key, ""), |i| key.split_at(i))
}

/// The revision of a directory's last change (see the module).
fn changed_at(stat: &Stat) -> Revision {
    let last = stat.czxid.max(stat.mzxid).max(stat.pzxid);
    Revision(u64::try_from(last).unwrap_or(0))
}

fn revision(zxid: i64) -> Revision {
    Revision(u64::try_from(zxid).unwrap_or(0))
}

/// The session a node is ephemeral to, if any.
fn owner(stat: &Stat) -> Option<SessionId> {
    (stat.ephemeral_owner != 0).then(|| SessionId::from_bits(stat.ephemeral_owner))
}

/// What a commit reads before it writes: each directory's data version,
/// each checked or written key's node, each `NoneUnder` directory's
/// children.
#[derive(Debug, Default)]
struct Seen {
    versions: BTreeMap<String, (i32, Revision)>,
    nodes: BTreeMap<String, Stat>,
    children: BTreeMap<String, Vec<String>>,
}

/// One read of a multi-read, and where its answer goes.
enum Asked {
    Version(String),
    Node(String),
    Children(String),
}

impl ZkKeys {
    /// The primitive on the ensemble `url` names (leasehold's layout),
    /// for `access`; the root is checked and made as
    /// [`ZkStore::open`] does.
    pub async fn open(url: &ClusterUrl, access: Access) -> Result<Self> {
        if url.layout() != Layout::Leasehold {
            return Err(Error::Unsupported(format!(
                "the ZooKeeper store primitive speaks leasehold's layout, not {}",
                url.layout()
            )));
        }
        let (endpoints, root, security) = (url.endpoints(), url.path(), url.security());
        Ok(ZkKeys {
            inner: start(endpoints, root, security, access, Layout::Leasehold).await?,
        })
    }

    /// The node of the keys' directories: the root's `elections`, which
    /// the first use makes with the root.
    fn keys_root(&self) -> String {
        self.inner.elections_dir()
    }

    fn dir_path(&self, dir: &str) -> String {
        format!("{}/{}", self.keys_root(), escape(dir))
    }

    fn node_path(&self, key: &str) -> String {
        let (dir, leaf) = split(key);
        format!("{}/{}", self.dir_path(dir), escape(leaf))
    }

    /// The key a node at `path` stands for, if it is one.
    fn key_at(&self, path: &str) -> Option<String> {
        let rest = path.strip_prefix(&self.keys_root())?.strip_prefix('/')?;
        let (dir, leaf) = rest.split_once('/')?;
        Some(unescape(dir)? + &unescape(leaf)?)
    }

    /// Creates the persistent node `path` unless it exists.
    async fn make(&self, client: &Client, path: &str) -> Result<()> {
        const WHAT: &str = "create a node";
        match request(WHAT, client.create(path, &[], &self.inner.persistent())).await? {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => Ok(()),
            Err(error) => Err(self.inner.failed(WHAT, path, error)),
        }
    }

    /// The client that writes for `writes`: that of the session they
    /// attach keys to where this handle opened it (a key it creates is
    /// ephemeral to that client's session), else the store's own (which
    /// can change a node of any session, but create none).
    async fn writer(&self, writes: &[Write]) -> Result<(Client, Option<Arc<ZkSession>>)> {
        let mut sessions = writes.iter().filter_map(Write::session);
        let Some(session) = sessions.next() else {
            return Ok((self.inner.reader().await?, None));
        };
        if sessions.any(|other| other != session) {
            return Err(Error::invalid(
                "commit",
                "on ZooKeeper, the keys of one commit are attached to one session",
            ));
        }
        match self.inner.session(session) {
            Some(_) => {
                let (zk, client) = self.inner.live_session(session)?;
                Ok((client, Some(zk)))
            }
            None => Ok((self.inner.reader().await?, None)),
        }
    }

    /// The keys under `leaf` in directory `dir`, and the directory's last
    /// change (0 when it does not exist).
    async fn read_dir(
        &self,
        client: &Client,
        dir: &str,
        leaf: &str,
    ) -> Result<(Vec<Entry>, Revision)> {
        const WHAT: &str = "read keys";
        let path = self.dir_path(dir);
        let (children, stat) = match request(WHAT, client.get_children(&path)).await? {
            Ok(found) => found,
            Err(zookeeper_client::Error::NoNode) => return Ok((Vec::new(), Revision(0))),
            Err(error) => return Err(self.inner.failed(WHAT, &path, error)),
        };
        let under: Vec<(String, String)> = children
            .into_iter()
            .filter_map(|name| {
                let rest = unescape(&name)?;
                rest.starts_with(leaf)
                    .then(|| (format!("{dir}{rest}"), name))
            })
            .collect();
        if under.is_empty() {
            return Ok((Vec::new(), changed_at(&stat)));
        }
        let mut reader = client.new_multi_reader();
        for (_, name) in &under {
            (reader.add_get_data(&format!("{path}/{name}")))
                .map_err(|e| self.inner.failed(WHAT, &path, e))?;
        }
        let read = request(WHAT, reader.commit()).await?;
        let read = read.map_err(|e| self.inner.failed(WHAT, &path, e))?;
        let mut entries = Vec::with_capacity(under.len());
        for ((key, _), result) in under.into_iter().zip(read) {
            match result {
                MultiReadResult::Data { data, stat } => entries.push(self.entry(key, data, &stat)?),
                // Deleted between the two reads: the directory's revision
                // is older than that, so a watch from it tells it.
                MultiReadResult::Error {
                    err: zookeeper_client::Error::NoNode,
                } => {}
                MultiReadResult::Error { err } => return Err(self.inner.failed(WHAT, &path, err)),
                _ => {}
            }
        }
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        Ok((entries, changed_at(&stat)))
    }

    fn entry(&self, key: String, data: Vec<u8>, stat: &Stat) -> Result<Entry> {
        let value = String::from_utf8(data).map_err(|_| {
            Error::Corrupt(format!(
                "zookeeper node {} is not UTF-8 text",
                self.node_path(&key)
            ))
        })?;
        let session = owner(stat);
        Ok(Entry {
            expires_in: session.map(|s| {
                self.inner
                    .session(s)
                    .map_or(READER_SESSION_TIMEOUT, |zk| zk.ttl)
            }),
            key,
            value,
            session,
            created: revision(stat.czxid),
            modified: revision(stat.mzxid),
        })
    }

    /// Reads what `checks` and `writes` need (one multi-read).
    async fn read_for_commit(
        &self,
        client: &Client,
        checks: &[Check],
        writes: &[Write],
    ) -> Result<Seen> {
        const WHAT: &str = "read before a commit";
        let mut asked: Vec<Asked> = Vec::new();
        let mut dirs: Vec<&str> = Vec::new();
        for check in checks {
            match check {
                Check::Absent(key) | Check::Created { key, .. } => {
                    asked.push(Asked::Node(key.clone()));
                    dirs.push(split(key).0);
                }
                Check::NoneUnder(prefix) => {
                    asked.push(Asked::Children(prefix.clone()));
                    dirs.push(split(prefix).0);
                }
            }
        }
        for write in writes {
            asked.push(Asked::Node(write.key().to_owned()));
            dirs.push(split(write.key()).0);
        }
        dirs.sort_unstable();
        dirs.dedup();
        asked.extend(dirs.iter().map(|d| Asked::Version((*d).to_owned())));
        let mut reader = client.new_multi_reader();
        for ask in &asked {
            let added = match ask {
                Asked::Version(dir) => reader.add_get_data(&self.dir_path(dir)),
                Asked::Node(key) => reader.add_get_data(&self.node_path(key)),
                Asked::Children(prefix) => reader.add_get_children(&self.dir_path(split(prefix).0)),
            };
            added.map_err(|e| self.inner.failed(WHAT, &self.keys_root(), e))?;
        }
        let read = request(WHAT, reader.commit()).await?;
        let read = read.map_err(|e| self.inner.failed(WHAT, &self.keys_root(), e))?;
        let mut seen = Seen::default();
        for (ask, result) in asked.into_iter().zip(read) {
            match (ask, result) {
                (Asked::Version(dir), MultiReadResult::Data { stat, .. }) => {
                    seen.versions.insert(dir, (stat.version, changed_at(&stat)));
                }
                (Asked::Node(key), MultiReadResult::Data { stat, .. }) => {
                    seen.nodes.insert(key, stat);
                }
                (Asked::Children(prefix), MultiReadResult::Children { children }) => {
                    seen.children.insert(prefix, children);
                }
                (
                    _,
                    MultiReadResult::Error {
                        err: zookeeper_client::Error::NoNode,
                    },
                ) => {}
                (_, MultiReadResult::Error { err }) => {
                    return Err(self.inner.failed(WHAT, &self.keys_root(), err));
                }
                _ => {}
            }
        }
        Ok(seen)
    }

    /// Whether `check` holds in what `seen` read.
    fn holds(seen: &Seen, check: &Check) -> bool {
        match check {
            Check::Absent(key) => !seen.nodes.contains_key(key),
            Check::Created {
                key,
                revision: created,
                session,
            } => seen
                .nodes
                .get(key)
                .is_some_and(|stat| revision(stat.czxid) == *created && owner(stat) == *session),
            Check::NoneUnder(prefix) => {
                let leaf = split(prefix).1;
                let children = seen
                    .children
                    .get(prefix)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                !children
                    .iter()
                    .filter_map(|name| unescape(name))
                    .any(|rest| rest.starts_with(leaf))
            }
        }
    }

    /// Makes the directories of the keys `checks` and `writes` name.
    async fn make_dirs(&self, client: &Client, checks: &[Check], writes: &[Write]) -> Result<()> {
        let mut dirs: Vec<&str> = checks
            .iter()
            .map(|c| match c {
                Check::Absent(key) | Check::Created { key, .. } => split(key).0,
                Check::NoneUnder(prefix) => split(prefix).0,
            })
            .chain(writes.iter().map(|w| split(w.key()).0))
            .collect();
        dirs.sort_unstable();
        dirs.dedup();
        for dir in dirs {
            self.make(client, &self.dir_path(dir)).await?;
        }
        Ok(())
    }

    /// Writes `writes` in one `multi`, unless a directory (or a node)
    /// changed since `seen` was read: `None` then.
    async fn write(
        &self,
        client: &Client,
        zk: Option<&ZkSession>,
        seen: &Seen,
        writes: &[Write],
    ) -> Result<Option<Revision>> {
        use zookeeper_client::Error as Zk;
        let mut multi = self.multi(client, seen, writes, zk)?;
        let committed = multi.commit();
        let outcome = match zk {
            Some(zk) => zk.unless_ended(request("commit", committed)).await??,
            None => request("commit", committed).await?,
        };
        let error = match outcome {
            Ok(results) => {
                let at = results.iter().find_map(|r| match r {
                    zookeeper_client::MultiWriteResult::SetData { stat } => Some(stat.mzxid),
                    _ => None,
                });
                return Ok(Some(revision(at.unwrap_or(0))));
            }
            Err(MultiWriteError::OperationFailed {
                source: Zk::BadVersion | Zk::NodeExists | Zk::NoNode,
                ..
            }) => return Ok(None),
            Err(error) => Zk::from(error),
        };
        Err(match zk {
            Some(zk) => {
                if matches!(error, Zk::SessionExpired | Zk::ClientClosed) {
                    zk.end();
                }
                zk.refused("commit", &self.keys_root(), error)
            }
            None => self.inner.failed("commit", &self.keys_root(), error),
        })
    }

    /// The `multi` of a commit whose checks held in `seen`: each
    /// directory's data set at the version read, then the writes.
    fn multi<'a>(
        &self,
        client: &'a Client,
        seen: &Seen,
        writes: &[Write],
        writer: Option<&ZkSession>,
    ) -> Result<zookeeper_client::MultiWriter<'a>> {
        let own = |session: SessionId| writer.is_some_and(|zk| zk.id == session);
        const WHAT: &str = "commit";
        let failed = |e| self.inner.failed(WHAT, &self.keys_root(), e);
        let mut multi = client.new_multi_writer();
        for (dir, (version, _)) in &seen.versions {
            (multi.add_set_data(&self.dir_path(dir), &[], Some(*version))).map_err(failed)?;
        }
        let ephemeral = CreateMode::Ephemeral.with_acls(self.inner.acls);
        let persistent = self.inner.persistent();
        for write in writes {
            let path = self.node_path(write.key());
            let found = seen.nodes.get(write.key());
            let added = match (write, found) {
                (Write::Delete(_), None) => Ok(()),
                (Write::Delete(_), Some(stat)) => multi.add_delete(&path, Some(stat.version)),
                (Write::Put { value, session, .. }, Some(stat)) if owner(stat) == *session => {
                    multi.add_set_data(&path, value.as_bytes(), Some(stat.version))
                }
                (Write::Put { key, .. }, Some(_)) => {
                    return Err(Error::Unsupported(format!(
                        "ZooKeeper cannot attach the existing key {key:?} to another session"
                    )));
                }
                (
                    Write::Put {
                        session: Some(s), ..
                    },
                    None,
                ) if !own(*s) => {
                    // Ended, or opened by another handle: its client alone
                    // could make the node.
                    return Err(Error::SessionExpired(*s));
                }
                (Write::Put { value, session, .. }, None) => {
                    let mode = if session.is_some() {
                        &ephemeral
                    } else {
                        &persistent
                    };
                    multi.add_create(&path, value.as_bytes(), mode)
                }
            };
            added.map_err(failed)?;
        }
        Ok(multi)
    }
}

#[async_trait]
impl Keys for ZkKeys {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        self.inner.open_session(ttl).await
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        self.inner.keep_alive(session).await
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        self.inner.close_session(session).await
    }

    async fn commit(&self, checks: &[Check], writes: &[Write]) -> Result<Option<Revision>> {
        if self.inner.read_only {
            return Err(Error::invalid(
                "commit",
                "the store was opened read-only (Access::ReadOnly)",
            ));
        }
        let (client, zk) = self.writer(writes).await?;
        self.make_dirs(&client, checks, writes).await?;
        for _ in 0..COMMIT_ATTEMPTS {
            let seen = self.read_for_commit(&client, checks, writes).await?;
            if !checks.iter().all(|check| Self::holds(&seen, check)) {
                return Ok(None);
            }
            if writes.is_empty() {
                let last = seen.versions.values().map(|(_, at)| *at).max();
                return Ok(Some(last.unwrap_or_default()));
            }
            if let Some(written) = self.write(&client, zk.as_deref(), &seen, writes).await? {
                return Ok(Some(written));
            }
        }
        Err(Error::Unavailable {
            reason: format!(
                "zookeeper: the keys kept changing while a commit read them ({COMMIT_ATTEMPTS} tries)"
            ),
            source: None,
        })
    }

    async fn range(&self, prefix: &str) -> Result<Range> {
        let client = self.inner.reader().await?;
        let (dir, leaf) = split(prefix);
        if prefix.contains(':') {
            let (entries, revision) = self.read_dir(&client, dir, leaf).await?;
            return Ok(Range { entries, revision });
        }
        const WHAT: &str = "list key directories";
        let root = self.keys_root();
        let (dirs, stat) = request(WHAT, client.get_children(&root))
            .await?
            .map_err(|e| self.inner.failed(WHAT, &root, e))?;
        let mut range = Range {
            entries: Vec::new(),
            revision: changed_at(&stat),
        };
        for dir in dirs
            .iter()
            .filter_map(|d| unescape(d))
            .filter(|d| d.starts_with(prefix))
        {
            let (entries, revision) = self.read_dir(&client, &dir, "").await?;
            range.entries.extend(entries);
            range.revision = range.revision.max(revision);
        }
        range.entries.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(range)
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<KeyWatch> {
        let (tx, rx) = crate::watch::channel(Heard::Changed(from));
        let watching = Watching {
            keys: self.clone(),
            prefix: prefix.to_owned(),
            path: match prefix.contains(':') {
                true => self.dir_path(split(prefix).0),
                false => self.keys_root(),
            },
            told: from,
            tx,
        };
        let watcher = watching.start().await?;
        tokio::spawn(watching.follow(watcher));
        Ok(rx)
    }

    async fn session_ended(&self, session: SessionId) {
        // A session this store does not know has ended (or never was).
        if let Some(zk) = self.inner.session(session) {
            zk.ended.cancelled().await;
        }
    }

    fn tells_expiries(&self) -> bool {
        true
    }
}

/// A watch of a prefix: a persistent recursive watch of its directory on
/// the store's own client, told of the keys under the prefix alone.
struct Watching {
    keys: ZkKeys,
    prefix: String,
    /// The node watched: the prefix's directory, or the keys' root.
    path: String,
    told: Revision,
    tx: crate::watch::Sender<Heard>,
}

impl Watching {
    /// Sets the watch, then tells at once if the node changed after the
    /// revision the watch starts from.
    async fn start(&self) -> Result<zookeeper_client::PersistentWatcher> {
        const WHAT: &str = "watch keys";
        let client = self.keys.inner.reader().await?;
        let watcher = request(
            WHAT,
            client.watch(&self.path, AddWatchMode::PersistentRecursive),
        )
        .await?
        .map_err(|e| self.keys.inner.failed(WHAT, &self.path, e))?;
        let last = self.last_change(&client).await?;
        if last > self.told {
            self.tx.send_replace(Heard::Changed(last));
        }
        Ok(watcher)
    }

    /// The watched node's last change (0 while it does not exist).
    async fn last_change(&self, client: &Client) -> Result<Revision> {
        const WHAT: &str = "read a key directory";
        match request(WHAT, client.check_stat(&self.path)).await? {
            Ok(stat) => Ok(stat.as_ref().map(changed_at).unwrap_or_default()),
            Err(error) => Err(self.keys.inner.failed(WHAT, &self.path, error)),
        }
    }

    /// Whether `event` is of a key under the prefix.
    fn concerns(&self, event: &WatchedEvent) -> bool {
        event.event_type != EventType::Session
            && self
                .keys
                .key_at(&event.path)
                .is_some_and(|key| key.starts_with(&self.prefix))
    }

    /// Tells what the events say until nobody holds the receiver. Sets
    /// the watch anew after the connection was lost (the client does not
    /// always set it again itself: a watch once went deaf after the server
    /// was paused), and after the store's client lost its session.
    async fn follow(mut self, mut watcher: zookeeper_client::PersistentWatcher) {
        let mut disconnected = false;
        loop {
            let event = tokio::select! {
                event = watcher.changed() => event,
                () = self.tx.closed() => return,
            };
            let state = event.session_state;
            if event.event_type != EventType::Session {
                if self.concerns(&event) {
                    self.tell(event.zxid).await;
                }
                continue;
            }
            if state == SessionState::Disconnected {
                disconnected = true;
                self.tx.send_replace(Heard::Unknown {
                    error: format!("zookeeper at {}: disconnected", self.keys.inner.cluster),
                });
            } else if state.is_terminated() || std::mem::take(&mut disconnected) {
                match self.restart().await {
                    Some(again) => watcher = again,
                    None => return,
                }
            } else {
                // (Re)connected: events may have been missed.
                self.tell(event.zxid).await;
            }
        }
    }

    /// Tells a change at `zxid`, or (a server before 3.9 tells none) at
    /// the watched node's last change.
    async fn tell(&mut self, zxid: i64) {
        let at = match zxid {
            zxid if zxid > 0 => Ok(revision(zxid)),
            _ => match self.keys.inner.reader().await {
                Ok(client) => self.last_change(&client).await,
                Err(error) => Err(error),
            },
        };
        match at {
            Ok(at) => {
                self.told = self.told.max(at);
                self.tx.send_replace(Heard::Changed(self.told));
            }
            Err(error) => {
                self.tx.send_replace(Heard::Unknown {
                    error: error.to_string(),
                });
            }
        }
    }

    /// Sets the watch again on a new client of the store, telling that
    /// the store does not answer until it does; `None` once nobody holds
    /// the receiver.
    async fn restart(&mut self) -> Option<zookeeper_client::PersistentWatcher> {
        loop {
            if self.tx.receiver_count() == 0 {
                return None;
            }
            match self.start().await {
                Ok(watcher) => {
                    // Whatever happened meanwhile: read again.
                    self.tx.send_replace(Heard::Changed(self.told));
                    return Some(watcher);
                }
                Err(error) => {
                    self.tx.send_replace(Heard::Unknown {
                        error: error.to_string(),
                    });
                    tokio::time::sleep(WATCH_RETRY).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_and_read_back() {
        for text in [
            "",
            "e:c:0001",
            "a/b",
            "100%",
            ".",
            "..",
            "x\u{1}y",
            "é\u{FFF5}",
        ] {
            let name = escape(text);
            assert!(
                !name.is_empty() && !name.contains('/'),
                "{text:?} -> {name:?}"
            );
            assert!(name != "." && name != "..");
            assert_eq!(unescape(&name).as_deref(), Some(text), "{name:?}");
        }
        assert_eq!(escape("a/b%"), "a%2Fb%25");
        assert_eq!(unescape("a%2"), None, "a cut escape");
        assert_eq!(unescape("a%2f"), None, "not as escape writes it");
    }

    #[test]
    fn a_key_splits_at_its_first_colon() {
        assert_eq!(split("e/x:c:1"), ("e/x", ":c:1"));
        assert_eq!(split("plain"), ("plain", ""));
        assert_eq!(split(":x"), ("", ":x"));
    }
}
