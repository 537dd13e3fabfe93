//! The store's connections: its root and the marker that makes it
//! leasehold's, the clients and sessions every operation uses, and the
//! reads they share.

use super::*;

/// The root node's data when it is leasehold's marker.
pub(super) fn marker(version: i64) -> Vec<u8> {
    format!("leasehold {version}").into_bytes()
}

/// The layout version in a root node's data, if it is leasehold's marker.
pub(super) fn marker_version(data: &[u8]) -> Option<i64> {
    std::str::from_utf8(data)
        .ok()?
        .strip_prefix("leasehold ")?
        .parse()
        .ok()
        .filter(|v| *v >= 1)
}

/// Refuses a root leasehold cannot use: not an absolute ZooKeeper path of
/// plain segments, `/` itself, or ZooKeeper's reserved `/zookeeper`.
pub(super) fn check_root(root: &str) -> Result<()> {
    let bad = |reason: String| Error::invalid("zookeeper root", format!("{root:?}: {reason}"));
    if root.is_empty() {
        return Err(Error::invalid(
            "zookeeper root",
            "/ is the whole ensemble; leasehold needs a node of its own below it, such as /leasehold",
        ));
    }
    let Some(path) = root.strip_prefix('/') else {
        return Err(bad("must start with /".into()));
    };
    for segment in path.split('/') {
        if segment.is_empty() {
            return Err(bad("has an empty segment".into()));
        }
        if segment == "." || segment == ".." {
            return Err(bad(format!("segment {segment:?} is not allowed")));
        }
        // The characters ZooKeeper refuses in a path.
        if segment.chars().any(|c| {
            let u = u32::from(c);
            [0..=0x1f, 0x7f..=0x9f, 0xd800..=0xf8ff, 0xfff0..=0xffff]
                .iter()
                .any(|r| r.contains(&u))
        }) {
            return Err(bad("has a character ZooKeeper does not allow".into()));
        }
    }
    if path.split('/').next() == Some("zookeeper") {
        return Err(bad(
            "/zookeeper is ZooKeeper's own node; leasehold needs a node of its own".into(),
        ));
    }
    Ok(())
}

/// A connector for `cluster` that adds `security`'s digest credentials, the
/// password read now (from its file, if it comes from one).
pub(super) fn connector(security: &Security) -> Result<zookeeper_client::Connector> {
    let connector = Client::connector();
    Ok(match security.credentials()? {
        Some((user, password)) => {
            let auth = format!("{user}:{}", password.expose());
            connector.with_auth("digest", auth.as_bytes())
        }
        None => connector,
    })
}

impl Inner {
    /// The store's state before any connection: refuses a malformed root,
    /// TLS settings and a user without a password (or a password without a
    /// user).
    pub(super) fn new(
        endpoints: &[String],
        root: &str,
        security: &Security,
        read_only: bool,
        layout: Layout,
    ) -> Result<Self> {
        if security.tls() || security.cert.is_some() || security.key.is_some() {
            return Err(Error::invalid(
                "ZooKeeper store URL",
                "leasehold's ZooKeeper store does not speak TLS",
            ));
        }
        let authenticated = match (&security.user, &security.password) {
            (Some(_), Some(_)) => true,
            (None, None) => false,
            (Some(user), None) => {
                return Err(Error::invalid(
                    "ZooKeeper store URL",
                    format!(
                        "user {user:?} has no password: give it in the URL, by \
                         ?password_file=PATH or by LEASEHOLD_STORE_PASSWORD"
                    ),
                ));
            }
            (None, Some(_)) => {
                return Err(Error::invalid(
                    "ZooKeeper store URL",
                    "a password without a user (zk://USER@…)",
                ));
            }
        };
        let root = root.trim_end_matches('/');
        if !matches!(layout, Layout::Leasehold | Layout::Curator | Layout::Kazoo) {
            return Err(Error::invalid(
                "ZooKeeper store URL",
                format!("ZooKeeper speaks ?layout=leasehold, curator or kazoo, not {layout}"),
            ));
        }
        let recipe = Recipe::of(layout);
        // A recipe's elections may be joined right below `/`.
        if recipe.is_none() || !root.is_empty() {
            check_root(root)?;
        }
        Ok(Inner {
            cluster: endpoints.join(","),
            root: root.to_owned(),
            read_only,
            recipe,
            security: security.clone(),
            user: security.user.clone(),
            acls: node_acls(authenticated),
            reader: tokio::sync::Mutex::new(None),
            sessions: Mutex::new(HashMap::new()),
        })
    }

    /// How leasehold creates a persistent node: with [`Inner::acls`].
    pub(super) fn persistent(&self) -> CreateOptions<'static> {
        CreateMode::Persistent.with_acls(self.acls)
    }

    /// The error for the request `what` on the node `path` ([`failed`]).
    pub(super) fn failed(&self, what: &str, path: &str, error: zookeeper_client::Error) -> Error {
        failed(self.user.as_deref(), what, path, error)
    }

    pub(super) fn elections_dir(&self) -> String {
        format!("{}/elections", self.root)
    }

    /// Checks that the root is a leasehold store this build can use and,
    /// unless read-only, creates it if it does not exist. Writes nothing
    /// otherwise.
    pub(super) async fn open_root(&self, client: &Client) -> Result<()> {
        self.refuse_enclosing_store(client).await?;
        let root = self.root.as_str();
        for _ in 0..ATTEMPTS {
            let data = match request("read the root node", client.get_data(root)).await? {
                Ok((data, _)) => data,
                Err(zookeeper_client::Error::NoNode) => {
                    if self.read_only {
                        return Err(Error::NotFound(format!(
                            "at zookeeper node {root}: nothing has campaigned there yet"
                        )));
                    }
                    if self.create_root(client).await? {
                        return Ok(());
                    }
                    // Created meanwhile by someone else: read it again.
                    continue;
                }
                Err(error) => return Err(self.failed("read the root node", root, error)),
            };
            return match marker_version(&data) {
                Some(found) if found > LAYOUT_VERSION => Err(Error::IncompatibleSchema {
                    found,
                    supported: LAYOUT_VERSION,
                }),
                Some(_) if self.read_only => Ok(()),
                Some(_) => {
                    self.restore_elections_node(client).await?;
                    self.warn_if_open(client).await;
                    Ok(())
                }
                None => Err(Error::Corrupt(format!(
                    "zookeeper node {root} exists but leasehold did not create it \
                     (it holds no leasehold marker); use a root of its own"
                ))),
            };
        }
        Err(Error::Unavailable {
            reason: format!("zookeeper node {root} kept changing while leasehold checked it"),
            source: None,
        })
    }

    /// Refuses a root inside a leasehold store at an enclosing node: its
    /// nodes are not for us to use.
    pub(super) async fn refuse_enclosing_store(&self, client: &Client) -> Result<()> {
        let root = self.root.as_str();
        match self.first_store_at(client, false).await? {
            Some(outer) => Err(Error::Corrupt(format!(
                "zookeeper node {root} is inside the leasehold store at {outer}; \
                 use a root of its own"
            ))),
            None => Ok(()),
        }
    }

    /// Refuses a recipe's layout at a path that is, or lies inside, a
    /// leasehold store: its candidates would stand among that store's
    /// nodes (found by a review; etcd refuses the same).
    pub(super) async fn refuse_a_store_path(&self, client: &Client) -> Result<()> {
        let Some(outer) = self.first_store_at(client, true).await? else {
            return Ok(());
        };
        let layout = self.recipe.map_or(Layout::Leasehold, |r| r.layout());
        let place = match outer == self.root {
            true => "is a leasehold store".to_owned(),
            false => format!("is inside the leasehold store at {outer}"),
        };
        Err(Error::invalid(
            "store URL",
            format!(
                "zookeeper node {} {place}; ?layout={layout} needs a path of its own",
                self.root
            ),
        ))
    }

    /// The first node from the top down to the root (the root itself
    /// with `and_root`) whose data is leasehold's marker.
    async fn first_store_at(&self, client: &Client, and_root: bool) -> Result<Option<String>> {
        self.first_store_on(client, &self.root, and_root).await
    }

    /// The first node from the top down to `path` (`path` itself with
    /// `and_path`) whose data is leasehold's marker.
    pub(super) async fn first_store_on(
        &self,
        client: &Client,
        path: &str,
        and_path: bool,
    ) -> Result<Option<String>> {
        let root = path;
        let mut ends: Vec<usize> = (root.match_indices('/').map(|(i, _)| i))
            .filter(|i| *i > 0)
            .collect();
        if and_path && !root.is_empty() {
            ends.push(root.len());
        }
        for end in ends {
            let outer = &root[..end];
            match request("read the root node", client.get_data(outer)).await? {
                Ok((data, _)) if marker_version(&data).is_some() => {
                    return Ok(Some(outer.to_owned()));
                }
                // A node this client may not read is not a leasehold
                // store's root: those are readable by anyone.
                Ok(_) | Err(zookeeper_client::Error::NoAuth) => {}
                Err(zookeeper_client::Error::NoNode) => break,
                Err(error) => return Err(self.failed("read the root node", outer, error)),
            }
        }
        Ok(None)
    }

    /// The root is leasehold's: puts back its elections node should someone
    /// have deleted it.
    ///
    /// Every opening for writing sends this create, so it is also where an
    /// identity that may not write the store (a wrong password, another
    /// user, no credentials on a store made with them) is refused: ZooKeeper
    /// checks the CREATE permission on the root before whether the node
    /// exists.
    pub(super) async fn restore_elections_node(&self, client: &Client) -> Result<()> {
        const WHAT: &str = "create the elections node";
        let elections = self.elections_dir();
        match request(WHAT, client.create(&elections, &[], &self.persistent())).await? {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => Ok(()),
            Err(zookeeper_client::Error::NoAuth) => Err(self
                .explain_denial(client, WHAT, &self.root, Permission::CREATE)
                .await),
            Err(error) => Err(self.failed(WHAT, &self.root, error)),
        }
    }

    /// Why ZooKeeper refused this store's identity the `needed` permission
    /// on `path` for the request `what`, from the node's ACL when it can be
    /// read: the digest users it admits with that permission name the
    /// store's user (so the password differs: a digest is made of both),
    /// or others. Never the digests themselves.
    pub(super) async fn explain_denial(
        &self,
        client: &Client,
        what: &str,
        path: &str,
        needed: Permission,
    ) -> Error {
        let generic = self.failed(what, path, zookeeper_client::Error::NoAuth);
        let Ok(Ok((acls, _))) = request("read an ACL", client.get_acl(path)).await else {
            return generic;
        };
        let mut owners: Vec<&str> = acls
            .iter()
            .filter(|acl| acl.scheme() == "digest" && acl.permission().has(needed))
            .filter_map(|acl| acl.id().split_once(':').map(|(user, _)| user))
            .collect();
        owners.dedup();
        if owners.is_empty() {
            return generic;
        }
        let shown = owners
            .iter()
            .map(|owner| format!("{owner:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        Error::Denied(match self.user.as_deref() {
            Some(user) if owners.contains(&user) => format!(
                "wrong password for zookeeper user {user:?}: permission denied on zookeeper \
                 node {path} ({what}), whose ACL admits {user:?} with another password"
            ),
            Some(user) => format!(
                "permission denied on zookeeper node {path} to user {user:?} ({what}): it \
                 belongs to zookeeper user {shown}; every replica of a store must use the \
                 same user"
            ),
            None => format!(
                "permission denied on zookeeper node {path} ({what}): it belongs to \
                 zookeeper user {shown}; give that user and its password (zk://USER@…, \
                 ?password_file=PATH or LEASEHOLD_STORE_PASSWORD)"
            ),
        })
    }

    /// With credentials, warns if the root or its elections node lets
    /// anyone change it (made by a run without credentials): anyone can then delete leasehold's nodes
    /// and depose a leader. Leasehold never changes the ACL of a node it
    /// did not create with the ACL it wants; new nodes under these get the
    /// guarded ACL, but ZooKeeper checks a delete against the parent.
    pub(super) async fn warn_if_open(&self, client: &Client) {
        if self.user.is_none() {
            return;
        }
        let mut open = Vec::new();
        for path in [self.root.clone(), self.elections_dir()] {
            if let Ok(Ok((acls, _))) = request("read an ACL", client.get_acl(&path)).await
                && acls.iter().any(|acl| {
                    acl.scheme() == "world"
                        && acl.id() == "anyone"
                        && acl.permission() != Permission::READ
                        && acl.permission() != Permission::NONE
                })
            {
                open.push(path);
            }
        }
        if !open.is_empty() {
            tracing::warn!(
                nodes = open.join(" "),
                "zookeeper: these nodes were made without credentials and anyone may change or \
                 delete them, and so depose a leader; leasehold leaves their ACL as it is. To \
                 protect the store, stop every replica and delete the root (or use a new one) \
                 so that an authenticated run creates it again"
            );
        }
    }

    /// Creates the root with the marker and its `elections` node in one
    /// transaction (after any missing parent, empty); `false` if the root
    /// appeared meanwhile.
    pub(super) async fn create_root(&self, client: &Client) -> Result<bool> {
        const WHAT: &str = "create the root node";
        let root = self.root.as_str();
        let parent = match root.rsplit_once('/') {
            Some((parent, _)) if !parent.is_empty() => parent,
            _ => "/",
        };
        if parent != "/" {
            request(WHAT, client.mkdir(parent, &self.persistent()))
                .await?
                .map_err(|e| self.failed(WHAT, parent, e))?;
        }
        let mut multi = client.new_multi_writer();
        let (elections, marker) = (self.elections_dir(), marker(LAYOUT_VERSION));
        let options = self.persistent();
        multi
            .add_create(root, &marker, &options)
            .and_then(|()| multi.add_create(&elections, &[], &options))
            .map_err(|e| self.failed(WHAT, root, e))?;
        let commit = multi.commit();
        let committed = request(WHAT, async {
            commit.await.map_err(zookeeper_client::Error::from)
        })
        .await?;
        match committed {
            Ok(_) => Ok(true),
            Err(zookeeper_client::Error::NodeExists) => Ok(false),
            Err(zookeeper_client::Error::NoAuth) => Err(self
                .explain_denial(client, WHAT, parent, Permission::CREATE)
                .await),
            Err(error) => Err(self.failed(WHAT, parent, error)),
        }
    }

    pub(super) async fn connect(&self, timeout: Duration) -> Result<Client> {
        let connecting = connector(&self.security)?
            .with_session_timeout(timeout)
            .with_fail_eagerly()
            .connect(&self.cluster);
        match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(zookeeper_client::Error::AuthFailed)) => Err(auth_failed(self.user.as_deref())),
            Ok(Err(error)) => Err(Error::Unavailable {
                reason: format!(
                    "cannot connect to zookeeper at {}: {}",
                    self.cluster,
                    crate::error::with_causes(&error)
                ),
                source: Some(Box::new(error)),
            }),
            Err(_) => Err(Error::Unavailable {
                reason: format!(
                    "cannot connect to zookeeper at {} within {CONNECT_TIMEOUT:?}",
                    self.cluster
                ),
                source: None,
            }),
        }
    }

    /// The store's own client, reconnected if its session ended.
    pub(super) async fn reader(&self) -> Result<Client> {
        let mut reader = self.reader.lock().await;
        if let Some(client) = reader.as_ref()
            && !client.state().is_terminated()
        {
            return Ok(client.clone());
        }
        let client = self.connect(READER_SESSION_TIMEOUT).await?;
        *reader = Some(client.clone());
        Ok(client)
    }

    pub(super) fn session(&self, id: SessionId) -> Option<Arc<ZkSession>> {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .cloned()
    }

    pub(super) fn live_session(&self, id: SessionId) -> Result<(Arc<ZkSession>, Client)> {
        let session = self.session(id).ok_or(Error::SessionExpired(id))?;
        let client = session.client().ok_or(Error::SessionExpired(id))?;
        Ok((session, client))
    }

    /// Refuses a commit of a store opened read-only.
    pub(super) fn writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::invalid(
                "commit",
                "the store was opened read-only (Access::ReadOnly)",
            ));
        }
        Ok(())
    }

    /// Resolves when `session` has ended (at once for one this store does
    /// not know: it has ended, or never was).
    pub(super) async fn session_ended(&self, session: SessionId) {
        if let Some(zk) = self.session(session) {
            zk.ended.cancelled().await;
        }
    }

    pub(super) fn forget(&self, id: SessionId) {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// Closes sessions a TTL after their last successful renewal, and
    /// notices sessions the client reports ended.
    pub(super) async fn supervise(
        self: Arc<Self>,
        session: Arc<ZkSession>,
        mut states: zookeeper_client::StateWatcher,
    ) {
        let mut renewed = session.renewed.subscribe();
        loop {
            let expiry = *renewed.borrow_and_update() + session.ttl;
            tokio::select! {
                biased;
                () = session.ended.cancelled() => break,
                state = states.changed() => {
                    if state.is_terminated() {
                        tracing::warn!(session = %session.id, ?state, "zookeeper session ended");
                        session.end();
                        break;
                    }
                }
                changed = renewed.changed() => if changed.is_err() { break },
                () = tokio::time::sleep_until(expiry) => {
                    tracing::debug!(session = %session.id, "not renewed for a TTL; closing the zookeeper session");
                    session.end();
                    break;
                }
            }
        }
        self.forget(session.id);
    }
}
