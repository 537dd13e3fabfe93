//! Watching an election's leader, and the line of candidate nodes a
//! campaign waits in.

use super::*;

/// The ZooKeeper side of a watch on one election: it wakes on the events
/// of a persistent watch on the election's node (a candidate node created
/// or deleted) and on the reader client's session events. While the
/// client is disconnected nothing can be read; once it reconnects, or its
/// session ended, the watch is set anew (the client's automatic reset of a
/// persistent watch was seen to leave it deaf, and events while
/// disconnected are not replayed), on a new session if need be.
pub(super) struct ZkWatch {
    pub(super) inner: Arc<Inner>,
    pub(super) election: ElectionName,
    /// `None` when the watch must be set anew.
    pub(super) watcher: Option<zookeeper_client::PersistentWatcher>,
    pub(super) disconnected: bool,
    /// The last attempt to set the watch anew failed: pause before the next.
    pub(super) rewatch_failed: bool,
}

impl Source for ZkWatch {
    const RETRY: Duration = WATCH_RETRY;

    async fn read(&mut self) -> Result<Option<Leader>> {
        self.inner.read_leader(&self.election).await
    }

    async fn changed(&mut self) -> Event {
        loop {
            let Some(watcher) = self.watcher.as_mut() else {
                return self.rewatch().await;
            };
            let event = watcher.changed().await;
            if event.event_type != EventType::Session {
                return Event::Changed;
            }
            if event.session_state.is_terminated() {
                self.watcher = None;
            } else if event.session_state == SessionState::Disconnected {
                self.disconnected = true;
                return Event::Unavailable(Error::Unavailable {
                    reason: format!("zookeeper at {}: disconnected", self.inner.cluster),
                    source: None,
                });
            } else if std::mem::take(&mut self.disconnected) {
                self.watcher = None;
            } else {
                // (Re)connected: events may have been missed.
                return Event::Changed;
            }
        }
    }
}

impl ZkWatch {
    /// Sets the watch anew on the reader (reconnected if its session
    /// ended): then re-read; or why it cannot be set now.
    pub(super) async fn rewatch(&mut self) -> Event {
        if std::mem::take(&mut self.rewatch_failed) {
            tokio::time::sleep(WATCH_RETRY).await;
        }
        let watched = match self.inner.reader().await {
            Ok(client) => self.inner.watch_election(&client, &self.election).await,
            Err(error) => Err(error),
        };
        match watched {
            Ok(watcher) => {
                self.watcher = Some(watcher);
                Event::Changed
            }
            Err(error) => {
                tracing::debug!(election = %self.election, %error, "zookeeper watch: cannot watch again; retrying");
                self.rewatch_failed = true;
                Event::Unavailable(error)
            }
        }
    }
}

/// Withdraws a candidacy whose campaign was dropped before it completed:
/// deletes the session's nodes in the election's node `dir` unless the
/// session holds the election. The list is sent after any create of the
/// dropped campaign on the same session, so ZooKeeper answers it after that
/// create. Tried again while ZooKeeper does not answer: the session (and
/// so the node) may live on with its elector, and a node left there would
/// come to hold the election for a campaign nobody runs, with every other
/// candidate waiting behind it.
pub(super) async fn withdraw(session: Arc<ZkSession>, election: ElectionName, dir: String) {
    crate::store::cleanup::until_done("withdraw a cancelled campaign", || {
        let (session, election, dir) = (Arc::clone(&session), election.clone(), dir.clone());
        async move { withdraw_once(&session, &election, &dir).await }
    })
    .await;
}

async fn withdraw_once(session: &ZkSession, election: &ElectionName, dir: &str) -> Result<()> {
    // Once the session ended, its nodes went with it.
    let Some(client) = session.client() else {
        return Ok(());
    };
    let held = session
        .held
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(election);
    if held {
        return Ok(());
    }
    let prefix = session_prefix(session.id);
    let children = match request("list candidates", client.list_children(dir)).await? {
        Ok(children) => children,
        // No election node, or no session: no node of this session.
        Err(zookeeper_client::Error::NoNode | zookeeper_client::Error::SessionExpired) => {
            return Ok(());
        }
        Err(error) => return Err(unavailable("list candidates", error)),
    };
    for node in children.iter().filter(|c| c.starts_with(&prefix)) {
        match request("withdraw", client.delete(&format!("{dir}/{node}"), None)).await? {
            Ok(())
            | Err(zookeeper_client::Error::NoNode | zookeeper_client::Error::SessionExpired) => {}
            Err(error) => return Err(unavailable("withdraw", error)),
        }
    }
    Ok(())
}

/// A session's campaign in an election's node `dir`: the steps of
/// [`ZkStore::campaign`]. Every request fails with
/// [`Error::SessionExpired`] once the session ends.
pub(super) struct Line<'a> {
    pub(super) zk: &'a ZkSession,
    pub(super) client: &'a Client,
    /// The election's node.
    pub(super) dir: &'a str,
    /// How the session's candidate nodes are named ([`session_prefix`]).
    pub(super) prefix: String,
    /// The ACL of the nodes it creates ([`node_acls`]).
    pub(super) acls: Acls<'static>,
}

impl Line<'_> {
    pub(super) fn persistent(&self) -> CreateOptions<'static> {
        CreateMode::Persistent.with_acls(self.acls)
    }

    /// Creates the election's node if it does not exist. Not `mkdir`: if
    /// leasehold's nodes were deleted (`elections_dir` among them), nothing
    /// is created in their place.
    pub(super) async fn create_election_node(&self, elections_dir: &str) -> Result<()> {
        const WHAT: &str = "create the election node";
        let made = (self.zk)
            .ask(WHAT, self.client.create(self.dir, &[], &self.persistent()))
            .await?;
        match made {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => Ok(()),
            Err(zookeeper_client::Error::NoNode) => Err(Error::Corrupt(format!(
                "zookeeper node {elections_dir} is gone: leasehold's nodes were deleted; nothing was written"
            ))),
            Err(error) => Err(self.zk.refused(WHAT, elections_dir, error)),
        }
    }

    /// The election's candidate nodes in line, less the `foreign` ones.
    pub(super) async fn candidates(&self, foreign: &HashSet<String>) -> Result<Vec<Candidate>> {
        const WHAT: &str = "list candidates";
        let children = (self.zk)
            .ask(WHAT, self.client.list_children(self.dir))
            .await?
            .map_err(|error| self.zk.refused(WHAT, self.dir, error))?;
        let mut queue = queue(children);
        queue.retain(|c| !foreign.contains(&c.name));
        Ok(queue)
    }

    /// Where in `queue` the session's candidate node is, if it has one.
    /// Deletes any second node of the session: a create retried after a
    /// lost reply can leave one.
    pub(super) async fn own_position(&self, queue: &[Candidate]) -> Option<usize> {
        let mut mine = queue
            .iter()
            .enumerate()
            .filter(|(_, c)| c.name.starts_with(&self.prefix));
        let (position, _) = mine.next()?;
        for (_, extra) in mine {
            let _ = request(
                "delete a duplicate candidate",
                self.client
                    .delete(&format!("{}/{}", self.dir, extra.name), None),
            )
            .await;
        }
        Some(position)
    }

    /// Joins the line: creates the session's candidate node.
    pub(super) async fn join(&self, candidate: &CandidateId) -> Result<()> {
        const WHAT: &str = "create a candidate node";
        let ephemeral = CreateMode::EphemeralSequential.with_acls(self.acls);
        let (data, path) = (
            node_data(self.zk.ttl, candidate),
            format!("{}/{}", self.dir, self.prefix),
        );
        (self.zk)
            .ask(WHAT, self.client.create(&path, &data, &ephemeral))
            .await?
            .map_err(|error| self.zk.refused(WHAT, self.dir, error))?;
        Ok(())
    }

    /// The stat of the session's node `me`, first in line (its creation is
    /// the grant's token), or `None` if it is gone.
    pub(super) async fn read_own_node(
        &self,
        me: &Candidate,
    ) -> Result<Option<zookeeper_client::Stat>> {
        const WHAT: &str = "read the candidate node";
        let path = format!("{}/{}", self.dir, me.name);
        match self.zk.ask(WHAT, self.client.get_data(&path)).await? {
            Ok((_, stat)) => Ok(Some(stat)),
            Err(zookeeper_client::Error::NoNode) => Ok(None),
            Err(error) => Err(self.zk.refused(WHAT, &path, error)),
        }
    }

    /// Waits until the candidate `ahead` of the session's node is gone;
    /// returns at once if it already is, or if it is not a candidate (then
    /// it is added to `foreign`: it would never go away by itself).
    pub(super) async fn wait_for_predecessor(
        &self,
        ahead: &Candidate,
        foreign: &mut HashSet<String>,
    ) -> Result<()> {
        const WHAT: &str = "watch the predecessor";
        let predecessor = format!("{}/{}", self.dir, ahead.name);
        let watched = (self.zk)
            .ask(WHAT, self.client.check_and_watch_stat(&predecessor))
            .await?;
        match watched {
            Ok((None, _)) => {}
            Ok((Some(stat), _)) if !owned(ahead, &stat) => {
                warn_foreign(&predecessor);
                foreign.insert(ahead.name.clone());
            }
            Ok((Some(_), watcher)) => {
                self.zk.unless_ended(watcher.changed()).await?;
            }
            Err(error) => return Err(self.zk.refused(WHAT, &predecessor, error)),
        }
        Ok(())
    }
}
