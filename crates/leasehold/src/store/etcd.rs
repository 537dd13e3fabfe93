//! `etcd://host:port[,host:port…][/prefix]` — the etcd v3 store, for
//! elections across hosts.
//!
//! The recipe of etcd's own `concurrency` package, tightened:
//! - A session is an etcd lease; its keep-alives renew every election the
//!   process takes part in.
//! - A candidate is the key `{prefix}/e/{election}/{lease id}`, created in
//!   one transaction (only if absent) with the lease attached. The lowest
//!   create revision leads; its create revision is the fencing token (etcd
//!   revisions only grow, across restarts too).
//! - A waiter watches only the key just ahead of it, from the revision of
//!   the read that found it: a handover wakes one waiter, not all (no herd),
//!   and no deletion between the read and the watch can be missed.
//! - Followers learn of releases and expiries from watches (etcd deletes a
//!   lease's keys when it expires), never from polling; a watch that breaks
//!   or falls behind a compaction starts over from a fresh read.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, LeaseKeepAliveStream,
    LeaseKeeper, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::{Mutex, watch};

use crate::error::{Error, Result};
use crate::names::{CandidateId, ElectionName};
use crate::store::{
    ElectionState, FencingToken, Grant, Leader, LeaderWatch, SessionId, SessionLease, Store,
    publish_leader,
};

/// How long one unary request may take before the store counts as unavailable.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause before re-establishing a broken watch.
const WATCH_RETRY: Duration = Duration::from_millis(200);

/// The etcd store. Cloning shares the connection.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    prefix: String,
    keepers: std::sync::Arc<Mutex<HashMap<i64, Keeper>>>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore").field("prefix", &self.prefix).finish_non_exhaustive()
    }
}

struct Keeper {
    keeper: LeaseKeeper,
    replies: LeaseKeepAliveStream,
}

fn unavailable(what: &str, error: etcd_client::Error) -> Error {
    Error::unavailable(format!("etcd {what} failed"), error)
}

async fn timed<T>(what: &str, fut: impl Future<Output = Result<T, etcd_client::Error>>) -> Result<T> {
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(outcome) => outcome.map_err(|e| unavailable(what, e)),
        Err(_) => Err(Error::Unavailable {
            reason: format!("etcd {what} did not answer within {REQUEST_TIMEOUT:?}"),
            source: None,
        }),
    }
}

impl EtcdStore {
    /// Connects to the cluster at `endpoints` (`host:port`) and checks that it
    /// answers; `prefix` is where leasehold keeps its keys.
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<Self> {
        let urls: Vec<String> = endpoints.iter().map(|e| format!("http://{e}")).collect();
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        let client = timed("connect", Client::connect(&urls, Some(options))).await?;
        let store = EtcdStore {
            client,
            prefix: prefix.trim_end_matches('/').to_owned(),
            keepers: Default::default(),
        };
        // Fail now, with the endpoints named, rather than at the first campaign.
        timed("status check", store.client.kv_client().get(store.known_key_prefix(), Some(GetOptions::new().with_prefix().with_count_only())))
            .await
            .map_err(|e| Error::Unavailable {
                reason: format!("cannot reach etcd at {}: {e}", endpoints.join(",")),
                source: None,
            })?;
        Ok(store)
    }

    /// `{prefix}/e/{election}/`; slashes in the name are escaped so that no
    /// election's keys fall under another's prefix.
    fn election_prefix(&self, election: &ElectionName) -> String {
        format!("{}/e/{}/", self.prefix, election.as_str().replace('/', "%2F"))
    }

    fn candidate_key(&self, election: &ElectionName, session: SessionId) -> String {
        format!("{}{:016x}", self.election_prefix(election), session.0)
    }

    fn known_key_prefix(&self) -> String {
        format!("{}/k/", self.prefix)
    }

    fn known_key(&self, election: &ElectionName) -> String {
        format!("{}{}", self.known_key_prefix(), election.as_str())
    }

    fn lease_id(session: SessionId) -> Result<i64> {
        i64::try_from(session.0).map_err(|_| Error::SessionExpired(session))
    }

    /// The lowest candidate of `election` and the revision of the read.
    async fn first_candidate(&self, election: &ElectionName) -> Result<(Option<KeyValue>, i64)> {
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let mut resp = timed("get", self.client.kv_client().get(self.election_prefix(election), Some(options))).await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        Ok((resp.take_kvs().into_iter().next(), revision))
    }

    async fn to_leader(&self, kv: &KeyValue) -> Result<Leader> {
        let candidate = CandidateId::new(kv.value_str().unwrap_or_default())
            .map_err(|e| Error::Corrupt(format!("etcd key {:?}: {e}", String::from_utf8_lossy(kv.key()))))?;
        let ttl = timed("lease time-to-live", self.client.lease_client().time_to_live(kv.lease(), None)).await?;
        Ok(Leader {
            candidate,
            token: FencingToken(kv.create_revision().unsigned_abs()),
            expires_in: Duration::from_secs(ttl.ttl().max(0).unsigned_abs()),
        })
    }

    async fn leader_at(&self, election: &ElectionName) -> Result<(Option<Leader>, i64)> {
        let (first, revision) = self.first_candidate(election).await?;
        let leader = match first {
            Some(kv) => Some(self.to_leader(&kv).await?),
            None => None,
        };
        Ok((leader, revision))
    }

    /// Waits until `key` is deleted, watching from `from_revision`. Returns
    /// early (to re-read) if the watch breaks or was compacted away.
    async fn wait_deleted(&self, key: &str, from_revision: i64) {
        let options = WatchOptions::new().with_start_revision(from_revision);
        let mut stream = match self.client.watch_client().watch(key, Some(options)).await {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(%error, key, "watch failed; re-reading");
                tokio::time::sleep(WATCH_RETRY).await;
                return;
            }
        };
        loop {
            match stream.message().await {
                Ok(Some(resp)) => {
                    if resp.canceled() || resp.compact_revision() > 0 {
                        return;
                    }
                    if resp.events().iter().any(|e| e.event_type() == EventType::Delete) {
                        return;
                    }
                }
                Ok(None) | Err(_) => {
                    tokio::time::sleep(WATCH_RETRY).await;
                    return;
                }
            }
        }
    }

    async fn keeper_reply(&self, session: SessionId) -> Result<Duration> {
        let id = Self::lease_id(session)?;
        let mut keepers = self.keepers.lock().await;
        if !keepers.contains_key(&id) {
            let (keeper, replies) = match timed("keep-alive", self.client.lease_client().keep_alive(id)).await {
                Ok(pair) => pair,
                Err(Error::Unavailable { source: Some(source), .. })
                    if source.to_string().contains("lease not found") =>
                {
                    return Err(Error::SessionExpired(session));
                }
                Err(error) => return Err(error),
            };
            keepers.insert(id, Keeper { keeper, replies });
        }
        let Some(entry) = keepers.get_mut(&id) else {
            return Err(Error::SessionExpired(session));
        };
        let reply = async {
            entry.keeper.keep_alive().await?;
            entry.replies.message().await
        };
        match timed("keep-alive", reply).await {
            Ok(Some(resp)) if resp.ttl() > 0 => Ok(Duration::from_secs(resp.ttl().unsigned_abs())),
            Ok(Some(_)) => {
                keepers.remove(&id);
                Err(Error::SessionExpired(session))
            }
            Ok(None) => {
                keepers.remove(&id);
                Err(Error::Unavailable { reason: "etcd closed the keep-alive stream".into(), source: None })
            }
            Err(error) => {
                keepers.remove(&id);
                Err(error)
            }
        }
    }
}

/// Deletes a candidate key whose campaign was dropped before it completed,
/// so a cancelled campaign never comes to hold the election later.
struct WithdrawIfAbandoned {
    armed: Option<(Client, String, i64)>,
}

impl Drop for WithdrawIfAbandoned {
    fn drop(&mut self) {
        let Some((client, key, revision)) = self.armed.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, revision)])
                .and_then([TxnOp::delete(key, None)]);
            let withdrawn = timed("withdraw", client.kv_client().txn(txn)).await;
            tracing::debug!(ok = withdrawn.is_ok(), "withdrew the candidacy of a cancelled campaign");
        });
    }
}

#[async_trait]
impl Store for EtcdStore {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        if ttl.is_zero() {
            return Err(Error::invalid("TTL", "must be greater than zero"));
        }
        // etcd leases have whole seconds; round up, never down.
        let seconds = i64::try_from(ttl.as_millis().div_ceil(1000))
            .map_err(|_| Error::invalid("TTL", format!("{ttl:?} is too long")))?;
        let lease = timed("lease grant", self.client.lease_client().grant(seconds, None)).await?;
        Ok(SessionLease {
            id: SessionId(lease.id().unsigned_abs()),
            ttl: Duration::from_secs(lease.ttl().max(0).unsigned_abs()),
        })
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        self.keeper_reply(session).await
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        let id = Self::lease_id(session)?;
        self.keepers.lock().await.remove(&id);
        match timed("lease revoke", self.client.lease_client().revoke(id)).await {
            Err(Error::Unavailable { source: Some(source), .. }) if source.to_string().contains("lease not found") => Ok(()),
            other => other.map(|_| ()),
        }
    }

    async fn campaign(&self, session: SessionId, election: &ElectionName, candidate: &CandidateId) -> Result<Grant> {
        let lease = Self::lease_id(session)?;
        let key = self.candidate_key(election, session);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key.clone(), candidate.as_str(), Some(PutOptions::new().with_lease(lease))),
                TxnOp::put(self.known_key(election), "", None),
            ])
            .or_else([TxnOp::get(key.clone(), None)]);
        let created = timed("campaign", self.client.kv_client().txn(txn)).await;
        let created = match created {
            Err(Error::Unavailable { source: Some(source), .. }) if source.to_string().contains("lease not found") => {
                return Err(Error::SessionExpired(session));
            }
            other => other?,
        };
        let my_revision = if created.succeeded() {
            created.header().map_or(0, |h| h.revision())
        } else {
            created
                .op_responses()
                .into_iter()
                .find_map(|r| match r {
                    TxnOpResponse::Get(get) => get.kvs().first().map(KeyValue::create_revision),
                    _ => None,
                })
                .ok_or(Error::SessionExpired(session))?
        };
        let mut guard = WithdrawIfAbandoned {
            armed: created.succeeded().then(|| (self.client.clone(), key.clone(), my_revision)),
        };
        loop {
            // The candidate just ahead of us, if any.
            let options = GetOptions::new()
                .with_prefix()
                .with_max_create_revision(my_revision - 1)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(1);
            let mut ahead = timed("get", self.client.kv_client().get(self.election_prefix(election), Some(options))).await?;
            let revision = ahead.header().map_or(0, |h| h.revision());
            match ahead.take_kvs().into_iter().next() {
                Some(predecessor) => {
                    let predecessor = String::from_utf8_lossy(predecessor.key()).into_owned();
                    self.wait_deleted(&predecessor, revision + 1).await;
                }
                None => {
                    // Nobody ahead: we lead, if our key still exists.
                    let mine = timed("get", self.client.kv_client().get(key.clone(), None)).await?;
                    if mine.kvs().first().map(KeyValue::create_revision) != Some(my_revision) {
                        return Err(Error::SessionExpired(session));
                    }
                    guard.armed = None;
                    return Ok(Grant {
                        election: election.clone(),
                        candidate: candidate.clone(),
                        session,
                        token: FencingToken(my_revision.unsigned_abs()),
                    });
                }
            }
        }
    }

    async fn resign(&self, grant: &Grant) -> Result<()> {
        let key = self.candidate_key(&grant.election, grant.session);
        let token = i64::try_from(grant.token.0).unwrap_or(i64::MAX);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, token)])
            .and_then([TxnOp::delete(key, None)]);
        let resp = timed("resign", self.client.kv_client().txn(txn)).await?;
        if !resp.succeeded() {
            return Err(Error::NotHolder {
                election: grant.election.clone(),
                token: grant.token,
            });
        }
        Ok(())
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        Ok(self.leader_at(election).await?.0)
    }

    async fn watch(&self, election: &ElectionName) -> Result<LeaderWatch> {
        let (first, revision) = self.leader_at(election).await?;
        let (tx, rx) = watch::channel(first);
        let store = self.clone();
        let election = election.clone();
        tokio::spawn(async move {
            let mut from = revision + 1;
            loop {
                let prefix = store.election_prefix(&election);
                let options = WatchOptions::new().with_prefix().with_start_revision(from);
                let mut watcher = store.client.watch_client();
                let stream = tokio::select! {
                    () = tx.closed() => return,
                    stream = watcher.watch(prefix, Some(options)) => stream,
                };
                if let Ok(mut stream) = stream {
                    loop {
                        let message = tokio::select! {
                            () = tx.closed() => return,
                            message = stream.message() => message,
                        };
                        match message {
                            Ok(Some(resp)) if !resp.canceled() && resp.compact_revision() == 0 => {
                                if resp.events().is_empty() {
                                    continue;
                                }
                                break;
                            }
                            _ => break,
                        }
                    }
                }
                // Something changed, or the watch broke: re-read, publish,
                // and watch again from the read's revision.
                loop {
                    match store.leader_at(&election).await {
                        Ok((leader, revision)) => {
                            publish_leader(&tx, leader);
                            from = revision + 1;
                            break;
                        }
                        Err(error) => {
                            tracing::debug!(%election, %error, "re-reading the leader failed; retrying");
                            tokio::select! {
                                () = tx.closed() => return,
                                () = tokio::time::sleep(WATCH_RETRY) => {}
                            }
                        }
                    }
                }
            }
        });
        Ok(rx)
    }

    async fn elections(&self) -> Result<Vec<ElectionState>> {
        let known = timed(
            "get",
            self.client.kv_client().get(self.known_key_prefix(), Some(GetOptions::new().with_prefix().with_keys_only())),
        )
        .await?;
        let mut states = Vec::new();
        for kv in known.kvs() {
            let name = String::from_utf8_lossy(kv.key())
                .trim_start_matches(&self.known_key_prefix())
                .to_owned();
            let election = ElectionName::new(name).map_err(|e| Error::Corrupt(format!("etcd election key: {e}")))?;
            let leader = self.leader(&election).await?;
            states.push(ElectionState { election, leader });
        }
        Ok(states)
    }
}

