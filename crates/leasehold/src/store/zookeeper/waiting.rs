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
    pub(super) recipe: Recipe,
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
        self.inner.read_leader(self.recipe, &self.election).await
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
