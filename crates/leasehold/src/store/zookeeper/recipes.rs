//! The store primitive on ZooKeeper in another client's recipe's layout
//! (`?layout=curator|kazoo`), for the elections written once over it in
//! that layout (see `keyed::recipes`): only what the recipes' own clients
//! write, so that they and leasehold's candidates stand in one line.
//!
//! - A key `E/NAME` is the node `{root}/E/NAME`, a `/` in `E` making a
//!   nested path, as the recipes' clients name it; its value the node's
//!   data (the candidate id: Curator's participant id, kazoo's
//!   identifier), its session the node's ephemeral owner, its creation
//!   revision the node's `czxid`.
//! - A put creates the node `{key}{sequence}`, ephemeral to its session
//!   and sequential (the recipes' candidates end with ZooKeeper's
//!   sequence, which no writer chooses), after the missing nodes of its
//!   path (Curator's as containers, kazoo's persistent); the key read
//!   back is the node's whole name. A delete is checked on the node's
//!   `czxid` and owner, then sent at the version read. Nothing else is
//!   written: no marker, no directory version, no notes.
//! - A read of `E/` lists the election node's children; a watch of `E/`
//!   is the handle's persistent recursive watch of the election node
//!   (see `key_watch`); a watch of one candidate is a data watch of its
//!   node, as the recipes' waiters set on the node just ahead of theirs.

use std::collections::HashSet;

use zookeeper_client::{Client, CreateMode, MultiReadResult, Stat};

use super::key_watch::{self, Watched, tell_since};
use super::keys::revision;
use super::*;
use crate::store::keys::{Check, Entry, Heard, KeyWatch, Keys, Properties, Range, Revision, Write};

/// The election recipe whose wire layout a store speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recipe {
    /// Apache Curator's `LeaderLatch`.
    Curator,
    /// kazoo's `Election` (its `Lock`).
    Kazoo,
}

impl Recipe {
    /// The recipe `layout` names; `None` for leasehold's own layout.
    pub(super) fn of(layout: Layout) -> Option<Recipe> {
        match layout {
            Layout::Curator => Some(Recipe::Curator),
            Layout::Kazoo => Some(Recipe::Kazoo),
            _ => None,
        }
    }

    pub(super) fn layout(self) -> Layout {
        match self {
            Recipe::Curator => Layout::Curator,
            Recipe::Kazoo => Layout::Kazoo,
        }
    }

    /// How the recipe creates the missing nodes of an election's path:
    /// Curator as containers (which the server deletes once they are
    /// empty again), kazoo as persistent nodes.
    fn parent_mode(self) -> CreateMode {
        match self {
            Recipe::Curator => CreateMode::Container,
            Recipe::Kazoo => CreateMode::Persistent,
        }
    }
}

/// The store primitive on a ZooKeeper ensemble in a recipe's layout (see
/// the module).
#[derive(Debug, Clone)]
pub struct RecipeKeys {
    pub(super) inner: Arc<Inner>,
    recipe: Recipe,
    /// The watches of this handle's election nodes (see `key_watch`).
    hubs: Arc<key_watch::Hubs>,
    /// The election nodes found to be no leasehold store's, nor inside one.
    outside_stores: Arc<Mutex<HashSet<String>>>,
}

impl Inner {
    /// The node of `election` in a recipe's layout: `{root}/{election}`
    /// (`/{election}` without a root), a `/` in the name making a nested
    /// path, as the recipe's own clients name it. A name ZooKeeper would
    /// refuse as a path, or inside ZooKeeper's own `/zookeeper`, is bad
    /// input.
    pub(super) fn recipe_dir(&self, name: &str) -> Result<String> {
        recipe_path(&self.root, name)
    }

    /// How long the holder of the node `stat` describes has left, as well
    /// as the store can tell: the TTL of this store's session when the
    /// node is ephemeral to one, else (another client's session, whose
    /// timeout ZooKeeper does not tell, or a node that is not ephemeral)
    /// the session timeout the server negotiated with `client`, an
    /// estimate.
    fn expiry_estimate(&self, client: &Client, stat: &zookeeper_client::Stat) -> Duration {
        match self.session(SessionId::from_bits(stat.ephemeral_owner)) {
            Some(session) => session.ttl,
            None => client.session_timeout(),
        }
    }
}

/// The node of election `name` below `root` in a recipe's layout: `{root}/{name}`,
/// a `/` in the name making a nested path, as the recipe's own clients
/// name it. A name ZooKeeper would refuse as a path, or inside
/// ZooKeeper's own `/zookeeper`, is bad input.
pub(crate) fn recipe_path(root: &str, name: &str) -> Result<String> {
    if name
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(Error::invalid(
            "election name",
            format!(
                "{name:?} is no ZooKeeper path (an empty, . or .. segment); with \
                 ?layout=curator or kazoo an election is the path its clients join"
            ),
        ));
    }
    let dir = format!("{root}/{name}");
    if dir == "/zookeeper" || dir.starts_with("/zookeeper/") {
        return Err(Error::invalid(
            "election name",
            format!("{dir} is inside ZooKeeper's own node /zookeeper"),
        ));
    }
    Ok(dir)
}

impl RecipeKeys {
    /// Connects to the ensemble `url` names for `access`, in the layout
    /// of the recipe it names ([`Layout::Curator`] or [`Layout::Kazoo`]):
    /// below the root (which may then be empty), with no check of it and
    /// nothing written until a campaign (see the module documentation).
    /// [`Access::ReadOnly`] writes nothing and opens no session (an
    /// election nobody joined has no leader). [`Access::ReleaseOnly`]
    /// checks nothing; its release deletes only a candidate node ephemeral
    /// to the holder's session and carrying its token.
    pub async fn open(url: &ClusterUrl, access: Access) -> Result<Self> {
        let Some(recipe) = Recipe::of(url.layout()) else {
            return Err(Error::invalid(
                "ZooKeeper store URL",
                format!(
                    "a recipe's store speaks ?layout=curator or kazoo, not {}",
                    url.layout()
                ),
            ));
        };
        let (endpoints, root, security) = (url.endpoints(), url.path(), url.security());
        Ok(RecipeKeys {
            inner: start(endpoints, root, security, access, url.layout()).await?,
            recipe,
            hubs: Arc::default(),
            outside_stores: Arc::default(),
        })
    }

    /// The node of `key` (`E/NAME`), and that of its election.
    fn node(&self, key: &str) -> Result<(String, String)> {
        let (election, name) = key.rsplit_once('/').unwrap_or(("", key));
        let dir = self.inner.recipe_dir(election)?;
        if name.is_empty() || name == "." || name == ".." {
            return Err(Error::invalid("key", format!("{key:?} names no node")));
        }
        Ok((format!("{dir}/{name}"), dir))
    }

    /// The election node of the prefix `E/`.
    fn dir(&self, prefix: &str) -> Result<String> {
        match prefix.strip_suffix('/') {
            Some(election) => self.inner.recipe_dir(election),
            None => Err(Error::Unsupported(format!(
                "in a recipe's layout a read is of one election's candidates (E/), not {prefix:?}"
            ))),
        }
    }

    fn entry(&self, client: &Client, key: String, data: &[u8], stat: &Stat) -> Entry {
        let session =
            (stat.ephemeral_owner != 0).then(|| SessionId::from_bits(stat.ephemeral_owner));
        Entry {
            key,
            value: String::from_utf8_lossy(data).into_owned(),
            session,
            created: revision(stat.czxid),
            modified: revision(stat.mzxid),
            expires_in: Some(self.inner.expiry_estimate(client, stat)),
        }
    }

    /// Refuses an election node that is, or lies inside, a leasehold
    /// store: a candidate there would stand among that store's nodes (the
    /// URL's path is checked when the store opens, an election's name
    /// here; found by a review). Checked once per node and handle.
    async fn refuse_a_store_dir(&self, client: &Client, dir: &str) -> Result<()> {
        if crate::mutex::lock(&self.outside_stores).contains(dir) {
            return Ok(());
        }
        if let Some(outer) = self.inner.first_store_on(client, dir, true).await? {
            let place = match outer == dir {
                true => "is a leasehold store".to_owned(),
                false => format!("is inside the leasehold store at {outer}"),
            };
            return Err(Error::invalid(
                "election name",
                format!(
                    "zookeeper node {dir} {place}; ?layout={} needs a path of its own",
                    self.recipe.layout()
                ),
            ));
        }
        crate::mutex::lock(&self.outside_stores).insert(dir.to_owned());
        Ok(())
    }

    /// Creates the node `{key}{sequence}` for `session` (see the module).
    async fn create(&self, key: &str, value: &str, session: SessionId) -> Result<Option<Revision>> {
        const WHAT: &str = "create a candidate node";
        let (zk, client) = self.inner.live_session(session)?;
        let (path, dir) = self.node(key)?;
        self.refuse_a_store_dir(&client, &dir).await?;
        let ephemeral = CreateMode::EphemeralSequential.with_acls(self.inner.acls);
        for _ in 0..ATTEMPTS {
            match zk
                .ask(WHAT, client.create(&path, value.as_bytes(), &ephemeral))
                .await?
            {
                Ok((stat, _)) => return Ok(Some(revision(stat.czxid))),
                // Not made yet, or a container the server deleted once it
                // was empty.
                Err(zookeeper_client::Error::NoNode) => self.make_path(&zk, &client, &dir).await?,
                Err(error) => return Err(zk.refused(WHAT, &dir, error)),
            }
        }
        Err(Error::Unavailable {
            reason: format!("zookeeper {WHAT}: node {dir} kept disappearing"),
            source: None,
        })
    }

    /// Creates the election's node and its missing parents as the recipe
    /// does, with the store's ACL; nodes already there are left as they
    /// are.
    async fn make_path(&self, zk: &ZkSession, client: &Client, dir: &str) -> Result<()> {
        const WHAT: &str = "create the election node";
        let mut mode = self.recipe.parent_mode();
        loop {
            let options = mode.with_acls(self.inner.acls);
            match zk.ask(WHAT, client.mkdir(dir, &options)).await? {
                Ok(()) => return Ok(()),
                // A server without containers (before 3.5.3): persistent
                // nodes, as Curator falls back to.
                Err(zookeeper_client::Error::Unimplemented) if mode == CreateMode::Container => {
                    mode = CreateMode::Persistent;
                }
                Err(error) => return Err(zk.refused(WHAT, dir, error)),
            }
        }
    }

    /// Deletes the node of `key` if it was created at `created` and is
    /// ephemeral to `session`: read, then deleted at the version read.
    async fn delete(
        &self,
        key: &str,
        created: Revision,
        session: Option<SessionId>,
    ) -> Result<Option<Revision>> {
        const WHAT: &str = "delete a candidate node";
        let client = self.inner.reader().await?;
        let (path, _) = self.node(key)?;
        let stat = match request(WHAT, client.check_stat(&path)).await? {
            Ok(Some(stat)) => stat,
            Ok(None) => return Ok(None),
            Err(error) => return Err(self.inner.failed(WHAT, &path, error)),
        };
        let owner = (stat.ephemeral_owner != 0).then(|| SessionId::from_bits(stat.ephemeral_owner));
        if revision(stat.czxid) != created || owner != session {
            return Ok(None);
        }
        match request(WHAT, client.delete(&path, Some(stat.version))).await? {
            Ok(()) => Ok(Some(created)),
            Err(zookeeper_client::Error::NoNode | zookeeper_client::Error::BadVersion) => Ok(None),
            Err(error) => Err(self.inner.failed(WHAT, &path, error)),
        }
    }

    /// A data watch of the node of `key`, as the recipes' waiters set on
    /// the node ahead of theirs: told once, when it changes or goes (or at
    /// once, if it is gone or changed since `from`).
    async fn watch_node(&self, key: &str, from: Revision) -> Result<KeyWatch> {
        const WHAT: &str = "watch the predecessor";
        let client = self.inner.reader().await?;
        let (path, _) = self.node(key)?;
        let (tx, rx) = crate::watch::channel(Heard::Changed(from));
        let told = Revision(from.0 + 1);
        match request(WHAT, client.get_and_watch_data(&path)).await? {
            Ok((_, stat, watcher)) => {
                tell_since(&tx, revision(stat.mzxid), from);
                tokio::spawn(async move {
                    tokio::select! {
                        () = tx.closed() => {}
                        _ = watcher.changed() => {
                            tx.send_modify(|heard| *heard = Heard::Changed(told));
                        }
                    }
                });
            }
            // Gone: a data watch of a node already gone is never set, so
            // none is left behind on the server.
            Err(zookeeper_client::Error::NoNode) => {
                tx.send_replace(Heard::Changed(told));
            }
            Err(error) => return Err(self.inner.failed(WHAT, &path, error)),
        }
        Ok(rx)
    }
}

#[async_trait]
impl Keys for RecipeKeys {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        self.inner.open_session(ttl).await
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        self.inner.keep_alive(session).await
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        self.inner.close_session(session).await
    }

    /// The recipes' own writes alone: a candidate's creation (a put with
    /// a session, checking nothing), and its deletion checked on its
    /// creation revision and session.
    async fn commit(&self, checks: &[Check], writes: &[Write]) -> Result<Option<Revision>> {
        self.inner.writable()?;
        match (checks, writes) {
            (
                [],
                [
                    Write::Put {
                        key,
                        value,
                        session: Some(session),
                    },
                ],
            ) => self.create(key, value, *session).await,
            (
                [
                    Check::Created {
                        key,
                        revision,
                        session,
                    },
                ],
                [Write::Delete(deleted)],
            ) if key == deleted => self.delete(key, *revision, *session).await,
            _ => Err(Error::Unsupported(format!(
                "with ?layout={} leasehold writes only its candidates",
                self.recipe.layout()
            ))),
        }
    }

    async fn range(&self, prefix: &str) -> Result<Range> {
        const WHAT: &str = "list candidates";
        let dir = self.dir(prefix)?;
        let client = self.inner.reader().await?;
        let (children, stat) = match request(WHAT, client.get_children(&dir)).await? {
            Ok(found) => found,
            Err(zookeeper_client::Error::NoNode) => return Ok(Range::default()),
            Err(error) => return Err(self.inner.failed(WHAT, &dir, error)),
        };
        let mut entries = Vec::with_capacity(children.len());
        if !children.is_empty() {
            let mut reader = client.new_multi_reader();
            for child in &children {
                (reader.add_get_data(&format!("{dir}/{child}")))
                    .map_err(|e| self.inner.failed(WHAT, &dir, e))?;
            }
            let read = request(WHAT, reader.commit()).await?;
            let read = read.map_err(|e| self.inner.failed(WHAT, &dir, e))?;
            for (child, result) in children.into_iter().zip(read) {
                match result {
                    MultiReadResult::Data { data, stat } => {
                        entries.push(self.entry(&client, format!("{prefix}{child}"), &data, &stat));
                    }
                    // Deleted between the two reads: the election node's
                    // revision is older, so a watch from it tells it.
                    MultiReadResult::Error {
                        err: zookeeper_client::Error::NoNode,
                    } => {}
                    MultiReadResult::Error { err } => {
                        return Err(self.inner.failed(WHAT, &dir, err));
                    }
                    _ => {}
                }
            }
        }
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Range {
            entries,
            revision: keys::changed_at(&stat),
        })
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<KeyWatch> {
        if !prefix.ends_with('/') {
            return self.watch_node(prefix, from).await;
        }
        let path = self.dir(prefix)?;
        let node = Watched {
            path: path.clone(),
            root: self.inner.root.clone(),
            raw: true,
        };
        let (rx, tx) = key_watch::subscribe(&self.inner, &self.hubs, node, prefix, from).await?;
        tell_since(&tx, key_watch::last_change(&self.inner, &path).await?, from);
        Ok(rx)
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
