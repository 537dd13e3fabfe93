//! Notifications: the connection that listens, the watches it wakes,
//! and leaving the line when a campaign ends.

use super::*;
use crate::mutex::lock;

/// Keeps one connection LISTENing on the store's channel and broadcasts
/// what it hears; after every (re)connection it broadcasts `None`, since
/// notifications sent meanwhile were lost.
pub(super) async fn listen(inner: std::sync::Weak<Inner>, stop: CancellationToken) {
    loop {
        let Some(store) = inner.upgrade() else { return };
        let (connector, what, channel, notices, state, recent) = (
            store.connector.clone(),
            format!("listen on {}", store.display),
            store.channel.clone(),
            store.notices.clone(),
            store.listening.clone(),
            Arc::clone(&store.recent),
        );
        let revision = format!("SELECT value FROM {}", store.table("revision"));
        drop(store);
        let connected = connector.connect(&what).await;
        if let Err(error) = &connected {
            tracing::debug!(%error, "the postgres listener could not connect; retrying");
        }
        if let Ok((client, mut connection)) = connected {
            let forward = {
                let (notices, recent) = (notices.clone(), Arc::clone(&recent));
                async move {
                    loop {
                        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                            Some(Ok(AsyncMessage::Notification(n))) => {
                                let payload = Arc::from(n.payload());
                                // Kept before it is told: a watch that
                                // subscribes meanwhile finds it in one or
                                // the other.
                                lock(&recent).heard(&payload);
                                let _ = notices.send(Some(payload));
                            }
                            Some(Ok(_)) => {}
                            Some(Err(_)) | None => return,
                        }
                    }
                }
            };
            // Runs while `forward` drives the connection.
            let listening = async {
                if client
                    .batch_execute(&format!("LISTEN {channel}"))
                    .await
                    .is_ok()
                    && let Ok(row) = client.query_one(&revision, &[]).await
                {
                    // Every change after this revision is heard from now.
                    lock(&recent).listening_after(row.get(0));
                    state.send_replace(Listening::Yes);
                    let _ = notices.send(None);
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = forward => {}
                () = listening => {}
            }
            // Lost the connection: whatever happened meanwhile is unknown,
            // and nothing is heard until it is back.
            lock(&recent).deaf();
            state.send_replace(Listening::Lost);
            let _ = notices.send(None);
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}

/// The PostgreSQL side of a watch on one election: it wakes on the
/// listener's notices for the election, and on a lost listener connection
/// (anything may have changed meanwhile). While the listener is lost the
/// holder is unknown, even if a read made just as the server went down
/// succeeded: no change would be heard.
pub(super) struct PgWatch {
    pub(super) inner: Arc<Inner>,
    pub(super) election: ElectionName,
    pub(super) notices: broadcast::Receiver<Notice>,
    pub(super) listening: tokio::sync::watch::Receiver<Listening>,
    /// Whether the lost listener was reported since the last read.
    pub(super) told_deaf: bool,
}

impl Source for PgWatch {
    const RETRY: Duration = RETRY;

    async fn read(&mut self) -> Result<Option<Leader>> {
        self.inner.read_leader(&self.election).await
    }

    async fn changed(&mut self) -> Event {
        loop {
            if !self.told_deaf && *self.listening.borrow_and_update() == Listening::Lost {
                self.told_deaf = true;
                return Event::Unavailable(Error::Unavailable {
                    reason: format!(
                        "postgres listen on {}: the connection is lost, changes are not heard",
                        self.inner.display
                    ),
                    source: None,
                });
            }
            tokio::select! {
                biased;
                notice = self.notices.recv() => {
                    if let Err(broadcast::error::RecvError::Closed) = notice {
                        return Event::Ended;
                    }
                    if concerns(&notice, self.election.as_str()) {
                        self.told_deaf = false;
                        return Event::Changed;
                    }
                }
                changed = self.listening.changed() => {
                    if changed.is_err() {
                        return Event::Ended;
                    }
                }
            }
        }
    }
}

/// Whether a notice concerns `election` (for observers: any change).
pub(super) fn concerns(
    notice: &std::result::Result<Notice, broadcast::error::RecvError>,
    election: &str,
) -> bool {
    match notice {
        Ok(Some(payload)) => payload.split(' ').next() == Some(election),
        // A resync, a lagged receiver or a closed channel: re-read.
        Ok(None) | Err(_) => true,
    }
}

/// Whether a notice wakes the waiter `session` of `election`: a release
/// names the first in line; only it tries. A release that names nobody
/// wakes every waiter of the election: the line its statement read may
/// be missing a waiter whose attempt ran at the same time. A waiter that
/// leaves the line (`withdraw`) does not lock the election, so its
/// notice can be read before a concurrent attempt's waiter row commits,
/// while that attempt read the leaver as first in line and waits to be
/// named: without this, it waited for its first's session to expire.
pub(super) fn wakes(
    notice: &std::result::Result<Notice, broadcast::error::RecvError>,
    election: &str,
    session: &str,
) -> bool {
    match notice {
        Ok(Some(payload)) => match payload.split_once(' ') {
            Some((e, first)) => e == election && (first.is_empty() || first == session),
            None => false,
        },
        Ok(None) | Err(_) => true,
    }
}

/// Leaves the line, for a campaign dropped or failed before it was
/// granted, so that a release is never handed to a waiter that is gone.
/// A campaign's `acquire` statement on its way: run as a task of its own,
/// so that its answer outlives the campaign's drop.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    statement: Option<tokio::task::JoinHandle<Result<Acquired>>>,
}

impl InFlight {
    /// One `acquire`, kept here until it is answered.
    pub(super) async fn attempt(
        &mut self,
        inner: &Arc<Inner>,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Acquired> {
        let statement = self.statement.insert(tokio::spawn({
            let (inner, election, candidate) =
                (Arc::clone(inner), election.clone(), candidate.clone());
            async move { inner.try_acquire(session, &election, &candidate).await }
        }));
        let answered = statement.await;
        self.statement = None;
        answered.map_err(|e| Error::unavailable("the campaign's statement failed", e))?
    }

    /// The cleanup of a dropped campaign: once its statement on the way (if
    /// any) is answered, releases the grant it made, then leaves the line.
    pub(super) async fn abandon(
        self,
        inner: Arc<Inner>,
        election: ElectionName,
        session: SessionId,
    ) {
        if let Some(statement) = self.statement
            && let Ok(Ok(Acquired::Granted { grant, fresh: true })) = statement.await
        {
            let released = inner.release(&grant).await;
            tracing::debug!(?released, "released the grant of a dropped campaign");
        }
        leave_line(inner, election, session).await;
    }
}

/// Takes `session` out of `election`'s line.
async fn leave_line(inner: Arc<Inner>, election: ElectionName, session: SessionId) {
    let Ok(id) = session_key(session) else { return };
    let statement = format!("SELECT {}($1, $2)", inner.table("withdraw"));
    // Tried until it lands: a row left at the head of the queue while the
    // session lives would keep the election from everyone behind it.
    crate::store::cleanup::until_done("leave the line", || {
        let (inner, election, statement) = (Arc::clone(&inner), election.clone(), &statement);
        async move {
            let client = inner.client().await?;
            timed(
                "leave the line",
                client.execute(statement, &[&election.as_str(), &id]),
            )
            .await
            .map(|_| ())
        }
    })
    .await;
}
