//! ZooKeeper sessions, one client each: opened with the TTL as the
//! session timeout, renewed by a `sync`, closed by closing the client.

use super::*;

impl Inner {
    pub(super) async fn open_session(self: &Arc<Self>, ttl: Duration) -> Result<SessionLease> {
        if self.read_only {
            return Err(Error::invalid(
                "session",
                "the store was opened read-only (Access::ReadOnly)",
            ));
        }
        let ttl = TTL.check(ttl)?.ttl;
        let sent = Instant::now();
        let client = self.connect(ttl).await?;
        let granted = client.session_timeout();
        let id = SessionId::from_bits(client.session_id().0);
        if granted != ttl {
            // The session logs the granted TTL for every store; this is the
            // detail of why.
            tracing::debug!(session = %id, requested = ?ttl, negotiated = ?granted,
                "zookeeper negotiated another session timeout (it clamps to its min/maxSessionTimeout); using it as the TTL");
        }
        let (renewed, _) = watch::channel(sent);
        let session = Arc::new(ZkSession {
            id,
            user: self.user.clone(),
            client: Mutex::new(Some(client.clone())),
            ttl: granted,
            renewed,
            ended: CancellationToken::new(),
        });
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Arc::clone(&session));
        let inner = Arc::clone(self);
        let states = client.state_watcher();
        drop(client);
        // The supervisor keeps only a state watcher, never a client, so that
        // ending the session closes it.
        tokio::spawn(inner.supervise(session, states));
        Ok(SessionLease { id, ttl: granted })
    }

    pub(super) async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        let (zk, client) = self.live_session(session)?;
        let sent = Instant::now();
        // A `sync`, not a read: a follower cut off from the ensemble's
        // leader answers reads on its own until it notices (`syncLimit`
        // ticks, 10 s with ZooKeeper's usual settings), while the leader,
        // which alone expires sessions, never hears of them. A sync passes
        // through the leader, so a cut-off follower cannot confirm one.
        let outcome = zk.ask("renew the session", client.sync("/")).await?;
        match outcome {
            Ok(()) => {
                // The leader hears of this renewal with the follower's next
                // heartbeat, within half a tick; a partition in that window
                // strands it at the follower (see DESIGN, "Faults of the
                // stores").
                zk.renewed.send_replace(sent);
                Ok(zk.ttl)
            }
            Err(
                zookeeper_client::Error::SessionExpired | zookeeper_client::Error::ClientClosed,
            ) => {
                zk.end();
                Err(Error::SessionExpired(session))
            }
            Err(error) => Err(failed(zk.user.as_deref(), "renew the session", "/", error)),
        }
    }

    pub(super) async fn close_session(&self, session: SessionId) -> Result<()> {
        let Some(zk) = self.session(session) else {
            return Ok(());
        };
        let Some(client) = zk.end() else {
            return Ok(());
        };
        let mut states = client.state_watcher();
        drop(client);
        // Wait until the server has closed the session (and so deleted its
        // nodes), so that the release is visible when this returns.
        let closed = tokio::time::timeout(REQUEST_TIMEOUT, async {
            while !states.state().is_terminated() {
                states.changed().await;
            }
        })
        .await;
        self.forget(session);
        if closed.is_err() {
            tracing::warn!(%session, "zookeeper did not confirm closing the session; it expires after its timeout");
        }
        Ok(())
    }
}
