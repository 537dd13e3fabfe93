//! The store primitive on ZooKeeper ([`Keys`]), in leasehold's layout:
//!
//! - A key `D:L…` (split at its first `:`; a key without one is all `D`)
//!   is the node `{root}/keys/{D}/{:L…}`: one node per directory `D`
//!   (leasehold's keys of one election share one), and a child per key.
//!   `%`, `/` and the characters ZooKeeper refuses in a path are written
//!   `%XX` (their UTF-8 bytes); an empty name is `%`.
//! - A session is a ZooKeeper session (see `sessions`); a key attached to
//!   it is an ephemeral node of that session, which the server deletes
//!   when the session ends; its data is `{ttl_ms} {value}`, the TTL the
//!   session negotiated (ZooKeeper tells no other client a session's
//!   timeout, and `status` shows it). A key's creation revision is its node's
//!   `czxid`, its last write's its `mzxid`: zxids are ensemble-wide and
//!   grow across restarts.
//! - A commit reads what it checks (one multi-read), then writes in one
//!   `multi` that also sets the data of each directory it touches at the
//!   version read (creating it first, in the same `multi`, if it did not
//!   exist): a directory changed in between fails the `multi`, which
//!   is then read and tried again. A commit that checks nothing sets the
//!   directory's data at any version: its writes' own versions guard it. That version check is what makes the
//!   checks of a creation revision exact (a node deleted and created again
//!   has the same version), and the directory's `mzxid` the last commit
//!   in it. A commit that only creates a key if it is absent (a campaign
//!   joining the line) is one `multi` without a read: the create, which
//!   checks the absence itself, and a set of the directory's data at any
//!   version, which fails the guarded commits that read it before.
//! - A read of a prefix is the directory's children and its `stat` (one
//!   request), then the data of the children under the prefix (one
//!   multi-read). Its revision is the directory's last change: its
//!   `mzxid` (the last commit) or `pzxid` (the last child created or
//!   deleted, also by a session's end).
//! - A watch is told by a persistent recursive watch of the directory (of
//!   `{root}/elections` for a prefix without `:`), one per directory and
//!   handle (see `key_watch`), of the keys under its prefix alone; it
//!   tells expiries, as the server deletes the nodes.

use std::collections::BTreeMap;

use zookeeper_client::{Error as ZkError, MultiReadResult, MultiWriteError, Stat};

use super::*;
use crate::store::keys::{Check, Entry, KeyWatch, Keys, Properties, Range, Revision, Write};

/// How often a commit whose directories changed between its read and its
/// write reads again before giving up.
const COMMIT_ATTEMPTS: usize = 64;

/// The store primitive on a ZooKeeper ensemble (see the module).
#[derive(Debug, Clone)]
pub struct ZkKeys {
    pub(super) inner: Arc<Inner>,
    /// The watches of this handle (see `key_watch`).
    pub(super) hubs: Arc<key_watch::Hubs>,
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
pub(super) fn unescape(name: &str) -> Option<String> {
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
pub(super) fn split(key: &str) -> (&str, &str) {
    key.find(':').map_or((key, ""), |i| key.split_at(i))
}

/// The revision of a directory's last change (see the module).
pub(super) fn changed_at(stat: &Stat) -> Revision {
    let last = stat.czxid.max(stat.mzxid).max(stat.pzxid);
    Revision(u64::try_from(last).unwrap_or(0))
}

pub(super) fn revision(zxid: i64) -> Revision {
    Revision(u64::try_from(zxid).unwrap_or(0))
}

/// A node's data: for a key attached to a session, `{ttl_ms} ` (the
/// session's TTL, which ZooKeeper tells no other client) before the value.
fn node_data(ttl: Option<Duration>, value: &str) -> Vec<u8> {
    match ttl {
        Some(ttl) => format!("{} {value}", ttl.as_millis()).into_bytes(),
        None => value.as_bytes().to_vec(),
    }
}

/// The TTL and value [`node_data`] wrote (`ephemeral`: with a TTL).
fn read_node(ephemeral: bool, data: Vec<u8>) -> Option<(Option<Duration>, String)> {
    let text = String::from_utf8(data).ok()?;
    if !ephemeral {
        return Some((None, text));
    }
    let (ttl, value) = text.split_once(' ')?;
    let ttl = Duration::from_millis(ttl.parse().ok()?);
    Some((Some(ttl), value.to_owned()))
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
    /// `None` for a directory that does not exist yet.
    versions: BTreeMap<String, Option<(i32, Revision)>>,
    /// Each node found, with its session's TTL as its data tells it.
    nodes: BTreeMap<String, (Stat, Option<Duration>)>,
    children: BTreeMap<String, Vec<String>>,
    /// Whether the commit checks anything: its `multi` then sets each
    /// directory's data at the version read. One that checks nothing is
    /// guarded by its own keys' versions alone, and sets the directories'
    /// data at any version: writers of different keys of one directory (a
    /// thousand standbys' notes) do not make each other try again.
    guarded: bool,
}

impl Seen {
    /// Keeps what the multi-read answered to `ask`; a node that does not
    /// exist is left out (a directory: `None`).
    fn add(&mut self, ask: Asked, result: MultiReadResult) -> std::result::Result<(), ZkError> {
        match (ask, result) {
            (Asked::Version(dir), MultiReadResult::Data { stat, .. }) => {
                self.versions
                    .insert(dir, Some((stat.version, changed_at(&stat))));
            }
            (Asked::Node(key), MultiReadResult::Data { stat, data }) => {
                let ttl = read_node(owner(&stat).is_some(), data).and_then(|(ttl, _)| ttl);
                self.nodes.insert(key, (stat, ttl));
            }
            (Asked::Children(prefix), MultiReadResult::Children { children }) => {
                self.children.insert(prefix, children);
            }
            (
                Asked::Version(dir),
                MultiReadResult::Error {
                    err: ZkError::NoNode,
                },
            ) => {
                self.versions.insert(dir, None);
            }
            (
                _,
                MultiReadResult::Error {
                    err: ZkError::NoNode,
                },
            ) => {}
            (_, MultiReadResult::Error { err }) => return Err(err),
            _ => {}
        }
        Ok(())
    }
}

/// What a commit of `checks` and `writes` reads first: each checked or
/// written key's node, each `NoneUnder` directory's children, then each
/// directory's version.
fn asks(checks: &[Check], writes: &[Write]) -> Vec<Asked> {
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
    asked
}

/// The revision of a `multi` that wrote: that of the directory's data it
/// set (a created node's stat may be invalid in a `multi`'s answer, as
/// ZOOKEEPER-4026 and ZOOKEEPER-4667 say).
fn written_at(results: &[zookeeper_client::MultiWriteResult]) -> Revision {
    let at = results.iter().find_map(|r| match r {
        zookeeper_client::MultiWriteResult::SetData { stat } => Some(stat.mzxid),
        _ => None,
    });
    revision(at.unwrap_or(0))
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
        let inner = start(endpoints, root, security, access, Layout::Leasehold).await?;
        Ok(ZkKeys::new(inner))
    }

    pub(super) fn new(inner: Arc<Inner>) -> Self {
        ZkKeys {
            inner,
            hubs: Arc::default(),
        }
    }

    /// The node of the keys' directories: the root's `elections`, which
    /// the first use makes with the root.
    pub(super) fn keys_root(&self) -> String {
        self.inner.elections_dir()
    }

    pub(super) fn dir_path(&self, dir: &str) -> String {
        format!("{}/{}", self.keys_root(), escape(dir))
    }

    fn node_path(&self, key: &str) -> String {
        let (dir, leaf) = split(key);
        format!("{}/{}", self.dir_path(dir), escape(leaf))
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
        for ((key, name), result) in under.into_iter().zip(read) {
            match result {
                MultiReadResult::Data { data, stat } => {
                    let node = format!("{path}/{name}");
                    entries.push(self.entry(key, &node, data, &stat)?);
                }
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

    /// The entry of `key`, read from its node at `node`.
    fn entry(&self, key: String, node: &str, data: Vec<u8>, stat: &Stat) -> Result<Entry> {
        let session = owner(stat);
        let (ttl, value) = read_node(session.is_some(), data).ok_or_else(|| {
            Error::Corrupt(format!("zookeeper node {node} is not one leasehold writes"))
        })?;
        Ok(Entry {
            expires_in: ttl,
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
        let asked = asks(checks, writes);
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
        let mut seen = Seen {
            guarded: !checks.is_empty(),
            ..Seen::default()
        };
        for (ask, result) in asked.into_iter().zip(read) {
            if let Err(err) = seen.add(ask, result) {
                return Err(self.inner.failed(WHAT, &self.keys_root(), err));
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
            } => seen.nodes.get(key).is_some_and(|(stat, _)| {
                revision(stat.czxid) == *created && owner(stat) == *session
            }),
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

    /// The error of a commit on `path` that ZooKeeper refused: a session
    /// it found ended is ended here too.
    fn refused(&self, zk: Option<&ZkSession>, path: &str, error: ZkError) -> Error {
        match zk {
            Some(zk) => {
                if matches!(error, ZkError::SessionExpired | ZkError::ClientClosed) {
                    zk.end();
                }
                zk.refused("commit", path, error)
            }
            None => self.inner.failed("commit", path, error),
        }
    }

    /// A commit that only creates a key if it is absent (a campaign
    /// joining the line) is one `multi` without a read: the create, which
    /// checks the absence itself, and a set of the directory's data at any
    /// version. Campaigns joining at once do not make each other try
    /// again, and the version moves, failing a commit that checked the
    /// directory between its read and its write (a free election taken
    /// with one request beside a campaign that just joined). `None` for
    /// any other commit, and for one whose directory does not exist yet
    /// (the general path makes it).
    async fn create_alone(
        &self,
        client: &Client,
        zk: Option<&ZkSession>,
        checks: &[Check],
        writes: &[Write],
    ) -> Result<Option<Option<Revision>>> {
        let (
            [Check::Absent(absent)],
            [
                Write::Put {
                    key,
                    value,
                    session,
                },
            ],
        ) = (checks, writes)
        else {
            return Ok(None);
        };
        let (data, mode) = match (session, zk) {
            (None, _) => (node_data(None, value), self.inner.persistent()),
            (Some(s), Some(zk)) if zk.id == *s => (
                node_data(Some(zk.ttl), value),
                CreateMode::Ephemeral.with_acls(self.inner.acls),
            ),
            // Not this handle's session: the general path says why.
            (Some(_), _) => return Ok(None),
        };
        if absent != key {
            return Ok(None);
        }
        let path = self.node_path(key);
        let mut multi = client.new_multi_writer();
        let failed = |e| self.inner.failed("commit", &path, e);
        multi.add_create(&path, &data, &mode).map_err(failed)?;
        let dir = self.dir_path(split(key).0);
        multi.add_set_data(&dir, &[], None).map_err(failed)?;
        let created = request("commit", multi.commit());
        let outcome = match zk {
            Some(zk) => zk.unless_ended(created).await??,
            None => created.await?,
        };
        let error = match outcome {
            Ok(results) => return Ok(Some(Some(written_at(&results)))),
            Err(MultiWriteError::OperationFailed { source, .. }) => source,
            Err(error) => ZkError::from(error),
        };
        match error {
            ZkError::NodeExists => Ok(Some(None)),
            ZkError::NoNode => Ok(None),
            error => Err(self.refused(zk, &path, error)),
        }
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
            Ok(results) => return Ok(Some(written_at(&results))),
            Err(MultiWriteError::OperationFailed {
                source: Zk::BadVersion | Zk::NodeExists | Zk::NoNode,
                ..
            }) => return Ok(None),
            Err(error) => Zk::from(error),
        };
        Err(self.refused(zk, &self.keys_root(), error))
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
        const WHAT: &str = "commit";
        let failed = |e| self.inner.failed(WHAT, &self.keys_root(), e);
        let mut multi = client.new_multi_writer();
        let persistent = self.inner.persistent();
        for (dir, found) in &seen.versions {
            let path = self.dir_path(dir);
            // A directory is made by the first commit in it, atomically.
            if found.is_none() {
                multi.add_create(&path, &[], &persistent).map_err(failed)?;
            }
            let version = found.map_or(0, |(version, _)| version);
            let version = (seen.guarded || found.is_none()).then_some(version);
            (multi.add_set_data(&path, &[], version)).map_err(failed)?;
        }
        for write in writes {
            self.add_write(&mut multi, seen, write, writer)?;
        }
        Ok(multi)
    }
}

impl ZkKeys {
    /// Adds `write` to `multi`, as `seen` found its node: a create (of an
    /// ephemeral node only by `writer`, the session's own client), a set
    /// of its data or a delete at the version read.
    fn add_write(
        &self,
        multi: &mut zookeeper_client::MultiWriter<'_>,
        seen: &Seen,
        write: &Write,
        writer: Option<&ZkSession>,
    ) -> Result<()> {
        let path = self.node_path(write.key());
        let added = match (write, seen.nodes.get(write.key())) {
            (Write::Delete(_), None) => Ok(()),
            (Write::Delete(_), Some((stat, _))) => multi.add_delete(&path, Some(stat.version)),
            (Write::Put { value, session, .. }, Some((stat, ttl))) if owner(stat) == *session => {
                multi.add_set_data(&path, &node_data(*ttl, value), Some(stat.version))
            }
            (Write::Put { key, .. }, Some(_)) => {
                return Err(Error::Unsupported(format!(
                    "ZooKeeper cannot attach the existing key {key:?} to another session"
                )));
            }
            (
                Write::Put {
                    value,
                    session: Some(s),
                    ..
                },
                None,
            ) => match writer {
                Some(zk) if zk.id == *s => {
                    let ephemeral = CreateMode::Ephemeral.with_acls(self.inner.acls);
                    multi.add_create(&path, &node_data(Some(zk.ttl), value), &ephemeral)
                }
                // Ended, or opened by another handle: its client alone
                // could make the node.
                _ => return Err(Error::SessionExpired(*s)),
            },
            (
                Write::Put {
                    value,
                    session: None,
                    ..
                },
                None,
            ) => multi.add_create(&path, value.as_bytes(), &self.inner.persistent()),
        };
        added.map_err(|e| self.inner.failed("commit", &self.keys_root(), e))
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
        self.inner.writable()?;
        let (client, zk) = self.writer(writes).await?;
        if let Some(created) = self
            .create_alone(&client, zk.as_deref(), checks, writes)
            .await?
        {
            return Ok(created);
        }
        for _ in 0..COMMIT_ATTEMPTS {
            let seen = self.read_for_commit(&client, checks, writes).await?;
            if !checks.iter().all(|check| Self::holds(&seen, check)) {
                return Ok(None);
            }
            if writes.is_empty() {
                let last = seen.versions.values().flatten().map(|(_, at)| *at).max();
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
        self.watch_prefix(prefix, from).await
    }

    async fn session_ended(&self, session: SessionId) {
        self.inner.session_ended(session).await;
    }

    fn properties(&self) -> Properties {
        Properties {
            tells_expiries: true,
            ..Properties::default()
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
    fn a_session_s_ttl_goes_before_its_keys_values() {
        let ttl = Some(Duration::from_millis(4000));
        assert_eq!(node_data(ttl, "a b"), b"4000 a b");
        assert_eq!(
            read_node(true, b"4000 a b".to_vec()),
            Some((ttl, "a b".into()))
        );
        assert_eq!(
            read_node(false, b"4000 a".to_vec()),
            Some((None, "4000 a".into()))
        );
        assert_eq!(read_node(true, b"a".to_vec()), None, "no TTL");
        assert_eq!(read_node(true, vec![0xff]), None, "not UTF-8");
    }

    #[test]
    fn a_key_splits_at_its_first_colon() {
        assert_eq!(split("e/x:c:1"), ("e/x", ":c:1"));
        assert_eq!(split("plain"), ("plain", ""));
        assert_eq!(split(":x"), ("", ":x"));
    }
}
