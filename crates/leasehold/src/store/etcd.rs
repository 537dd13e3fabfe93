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
//! - Member outages: the store keeps one connection per endpoint and pins
//!   the one that last answered; a request that fails or does not answer
//!   within [`ATTEMPT_TIMEOUT`] is retried on the next endpoint (etcd-client
//!   leaves failover to its users). Every retried request is idempotent:
//!   the campaign transaction creates the candidate key only if absent.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue,
    LeaseKeepAliveStream, LeaseKeeper, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, WatchOptions,
};
use tokio::sync::{Mutex, watch};

use crate::error::{Error, Result};
use crate::names::{CandidateId, ElectionName};
use crate::store::{
    ElectionState, FencingToken, Grant, Leader, LeaderWatch, SessionId, SessionLease, Store,
    publish_leader, read_until_ok,
};

/// How long one request may take, over every endpoint tried, before the
/// store counts as unavailable.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one attempt on one endpoint may take before the next is tried.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(750);
/// Pause before re-establishing a broken watch.
const WATCH_RETRY: Duration = Duration::from_millis(200);

/// The etcd store. Cloning shares the connections.
#[derive(Clone)]
pub struct EtcdStore {
    members: std::sync::Arc<Members>,
    prefix: String,
    keepers: std::sync::Arc<Mutex<HashMap<i64, Keeper>>>,
}

/// One client per endpoint, and which one answered last.
struct Members {
    endpoints: Vec<String>,
    clients: Vec<Client>,
    active: std::sync::atomic::AtomicUsize,
}

impl Members {
    fn active(&self) -> usize {
        self.active.load(std::sync::atomic::Ordering::Relaxed) % self.clients.len()
    }

    /// The pinned client (for streams, which are re-established on failure).
    fn client(&self) -> Client {
        self.clients[self.active()].clone()
    }

    /// Runs `op` on the pinned endpoint, failing over to the next ones on
    /// transient errors and timeouts, within [`REQUEST_TIMEOUT`].
    async fn call<T, F, Fut>(&self, what: &str, op: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let started = tokio::time::Instant::now();
        let first = self.active();
        let mut last = String::new();
        // Until the request's time is up: every endpoint in turn, pausing
        // after each full round (a cluster electing a new leader answers
        // "no leader" at once for about an election timeout).
        let mut pause = Duration::from_millis(25);
        for attempt in 0.. {
            let i = (first + attempt) % self.clients.len();
            if attempt > 0 && i == first {
                tokio::time::sleep(pause.min(REQUEST_TIMEOUT.saturating_sub(started.elapsed())))
                    .await;
                pause = (pause * 2).min(Duration::from_millis(400));
            }
            let left = REQUEST_TIMEOUT.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            match tokio::time::timeout(ATTEMPT_TIMEOUT.min(left), op(self.clients[i].clone())).await
            {
                Ok(Ok(value)) => {
                    self.active.store(i, std::sync::atomic::Ordering::Relaxed);
                    return Ok(value);
                }
                Ok(Err(error)) if !is_transient(&error) => return Err(classify(what, error)),
                Ok(Err(error)) => last = format!("{}: {error}", self.endpoints[i]),
                Err(_) => {
                    last = format!(
                        "{}: no answer within {:?}",
                        self.endpoints[i],
                        ATTEMPT_TIMEOUT.min(left)
                    )
                }
            }
            tracing::debug!(what, endpoint = %self.endpoints[i], %last, "etcd request failed; trying the next endpoint");
        }
        Err(Error::Unavailable {
            reason: format!("etcd {what} failed on every endpoint (last: {last})"),
            source: None,
        })
    }
}

/// Errors worth another endpoint: the member is down, partitioned, or
/// without a leader.
fn is_transient(error: &etcd_client::Error) -> bool {
    match error {
        // gRPC codes: 1 cancelled, 2 unknown, 4 deadline exceeded,
        // 13 internal, 14 unavailable (etcd-client re-exports no `Code`).
        etcd_client::Error::GRpcStatus(status) => {
            matches!(i32::from(status.code()), 1 | 2 | 4 | 13 | 14)
        }
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

fn is_lease_not_found(error: &Error) -> bool {
    matches!(error, Error::Unavailable { reason, .. } if reason.contains("lease not found"))
}

fn classify(what: &str, error: etcd_client::Error) -> Error {
    Error::Unavailable {
        reason: format!("etcd {what} failed: {error}"),
        source: Some(Box::new(error)),
    }
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

struct Keeper {
    keeper: LeaseKeeper,
    replies: LeaseKeepAliveStream,
}

impl EtcdStore {
    /// Connects to the cluster at `endpoints` (`host:port`) and checks that
    /// one of them answers; `prefix` is where leasehold keeps its keys.
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<Self> {
        if endpoints.is_empty() {
            return Err(Error::invalid("etcd endpoints", "none given"));
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        let mut clients = Vec::new();
        for endpoint in endpoints {
            // A single endpoint connects lazily: a member that is down now
            // does not stop the store from opening.
            let client = Client::connect([format!("http://{endpoint}")], Some(options.clone()))
                .await
                .map_err(|e| Error::invalid("etcd endpoint", format!("{endpoint}: {e}")))?;
            clients.push(client);
        }
        let store = EtcdStore {
            members: std::sync::Arc::new(Members {
                endpoints: endpoints.to_vec(),
                clients,
                active: Default::default(),
            }),
            prefix: prefix.trim_end_matches('/').to_owned(),
            keepers: Default::default(),
        };
        // Fail now, with the endpoints named, rather than at the first campaign.
        let known = store.known_key_prefix();
        store
            .members
            .call("status check", |mut c| {
                let known = known.clone();
                async move {
                    c.get(
                        known,
                        Some(GetOptions::new().with_prefix().with_count_only()),
                    )
                    .await
                }
            })
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
        format!(
            "{}/e/{}/",
            self.prefix,
            election.as_str().replace('/', "%2F")
        )
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

    async fn get(&self, key: String, options: GetOptions) -> Result<etcd_client::GetResponse> {
        self.members
            .call("get", |mut c| {
                let (key, options) = (key.clone(), options.clone());
                async move { c.get(key, Some(options)).await }
            })
            .await
    }

    async fn txn(&self, what: &str, txn: Txn) -> Result<etcd_client::TxnResponse> {
        self.members
            .call(what, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
    }

    /// The lowest candidate of `election` and the revision of the read.
    async fn first_candidate(&self, election: &ElectionName) -> Result<(Option<KeyValue>, i64)> {
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let mut resp = self.get(self.election_prefix(election), options).await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        Ok((resp.take_kvs().into_iter().next(), revision))
    }

    async fn to_leader(&self, kv: &KeyValue) -> Result<Leader> {
        let candidate = CandidateId::new(kv.value_str().unwrap_or_default()).map_err(|e| {
            Error::Corrupt(format!(
                "etcd key {:?}: {e}",
                String::from_utf8_lossy(kv.key())
            ))
        })?;
        let lease = kv.lease();
        let ttl = self
            .members
            .call("lease time-to-live", |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
            .await?;
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
        let mut stream = match self.members.client().watch(key, Some(options)).await {
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
                    if resp
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                    {
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

    /// One keep-alive round trip on the session's stream, (re)opening the
    /// stream on the next endpoint when the last one failed.
    async fn keep_alive_once(&self, session: SessionId, id: i64) -> Result<Duration> {
        let mut keepers = self.keepers.lock().await;
        for attempt in 0..self.members.clients.len() {
            let entry = match keepers.entry(id) {
                std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
                std::collections::hash_map::Entry::Vacant(vacant) => {
                    let i = (self.members.active() + attempt) % self.members.clients.len();
                    let mut client = self.members.clients[i].clone();
                    match tokio::time::timeout(ATTEMPT_TIMEOUT, client.lease_keep_alive(id)).await {
                        Ok(Ok((keeper, replies))) => vacant.insert(Keeper { keeper, replies }),
                        Ok(Err(error)) if error.to_string().contains("lease not found") => {
                            return Err(Error::SessionExpired(session));
                        }
                        Ok(Err(_)) | Err(_) => continue,
                    }
                }
            };
            let reply = async {
                entry.keeper.keep_alive().await?;
                entry.replies.message().await
            };
            match tokio::time::timeout(ATTEMPT_TIMEOUT, reply).await {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                    return Ok(Duration::from_secs(resp.ttl().unsigned_abs()));
                }
                Ok(Ok(Some(_))) => {
                    keepers.remove(&id);
                    return Err(Error::SessionExpired(session));
                }
                _ => {
                    keepers.remove(&id);
                    let next = (self.members.active() + 1) % self.members.clients.len();
                    self.members
                        .active
                        .store(next, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        Err(Error::Unavailable {
            reason: "etcd keep-alive failed on every endpoint".into(),
            source: None,
        })
    }
}

/// Deletes a candidate key whose campaign was dropped before it completed,
/// so a cancelled campaign never comes to hold the election later.
struct WithdrawIfAbandoned {
    armed: Option<(EtcdStore, String, i64)>,
}

impl Drop for WithdrawIfAbandoned {
    fn drop(&mut self) {
        let Some((store, key, revision)) = self.armed.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let txn = Txn::new()
                .when([Compare::create_revision(
                    key.clone(),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then([TxnOp::delete(key, None)]);
            let withdrawn = store.txn("withdraw", txn).await;
            tracing::debug!(
                ok = withdrawn.is_ok(),
                "withdrew the candidacy of a cancelled campaign"
            );
        });
    }
}

impl EtcdStore {
    /// Writes `value` at `key` only while `grant` still leads its election:
    /// one transaction that requires the leader key to carry the grant's
    /// create revision (its token). Once leadership has moved, the write
    /// cannot land: [`Error::Stale`] names the successor's token, or
    /// [`Error::NotHolder`] if nobody holds the election.
    pub async fn put_fenced(
        &self,
        grant: &Grant,
        key: &str,
        value: impl Into<Vec<u8>>,
    ) -> Result<()> {
        let leader_key = self.candidate_key(&grant.election, grant.session);
        let token = i64::try_from(grant.token.0).unwrap_or(i64::MAX);
        let txn = Txn::new()
            .when([Compare::create_revision(
                leader_key,
                CompareOp::Equal,
                token,
            )])
            .and_then([TxnOp::put(key, value, None)]);
        if self.txn("fenced put", txn).await?.succeeded() {
            return Ok(());
        }
        match self.first_candidate(&grant.election).await?.0 {
            Some(kv) if kv.create_revision() > token => Err(Error::Stale {
                resource: key.to_owned(),
                presented: grant.token,
                highest: FencingToken(kv.create_revision().unsigned_abs()),
            }),
            _ => Err(Error::NotHolder {
                election: grant.election.clone(),
                token: grant.token,
            }),
        }
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
        let lease = self
            .members
            .call("lease grant", |mut c| async move {
                c.lease_grant(seconds, None).await
            })
            .await?;
        Ok(SessionLease {
            id: SessionId(lease.id().unsigned_abs()),
            ttl: Duration::from_secs(lease.ttl().max(0).unsigned_abs()),
        })
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        let id = Self::lease_id(session)?;
        self.keep_alive_once(session, id).await
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        let id = Self::lease_id(session)?;
        self.keepers.lock().await.remove(&id);
        let revoked = self
            .members
            .call(
                "lease revoke",
                |mut c| async move { c.lease_revoke(id).await },
            )
            .await;
        match revoked {
            Err(error) if is_lease_not_found(&error) => Ok(()),
            other => other.map(|_| ()),
        }
    }

    async fn campaign(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Grant> {
        let lease = Self::lease_id(session)?;
        let key = self.candidate_key(election, session);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key.clone(),
                    candidate.as_str(),
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::put(self.known_key(election), "", None),
            ])
            .or_else([TxnOp::get(key.clone(), None)]);
        let created = match self.txn("campaign", txn).await {
            Err(error) if is_lease_not_found(&error) => return Err(Error::SessionExpired(session)),
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
            armed: created
                .succeeded()
                .then(|| (self.clone(), key.clone(), my_revision)),
        };
        loop {
            // Our key and the candidate just ahead of it, in one read.
            let options = GetOptions::new()
                .with_prefix()
                .with_max_create_revision(my_revision)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(2);
            let mut found = self.get(self.election_prefix(election), options).await?;
            let revision = found.header().map_or(0, |h| h.revision());
            let mut kvs = found.take_kvs().into_iter();
            let mine = kvs.next().filter(|kv| kv.create_revision() == my_revision);
            if mine.is_none() {
                // Our key is gone: the lease expired (or was revoked).
                return Err(Error::SessionExpired(session));
            }
            match kvs.next() {
                Some(predecessor) => {
                    let predecessor = String::from_utf8_lossy(predecessor.key()).into_owned();
                    self.wait_deleted(&predecessor, revision + 1).await;
                }
                None => {
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
            .when([Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                token,
            )])
            .and_then([TxnOp::delete(key, None)]);
        let resp = self.txn("resign", txn).await?;
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
                let mut client = store.members.client();
                let stream = tokio::select! {
                    biased;
                    () = tx.closed() => return,
                    stream = client.watch(prefix, Some(options)) => stream,
                };
                if let Ok(mut stream) = stream {
                    loop {
                        let message = tokio::select! {
                            biased;
                            () = tx.closed() => return,
                            message = stream.message() => message,
                        };
                        match message {
                            Ok(Some(resp)) if !resp.canceled() && resp.compact_revision() == 0 => {
                                if !resp.events().is_empty() {
                                    break;
                                }
                            }
                            _ => break,
                        }
                    }
                }
                // Something changed, or the watch broke: re-read, publish,
                // and watch again from the read's revision.
                let Some((leader, revision)) =
                    read_until_ok(&tx, &election, WATCH_RETRY, || store.leader_at(&election)).await
                else {
                    return;
                };
                publish_leader(&tx, leader);
                from = revision + 1;
            }
        });
        Ok(rx)
    }

    async fn elections(&self) -> Result<Vec<ElectionState>> {
        let prefix = self.known_key_prefix();
        let known = self
            .get(
                prefix.clone(),
                GetOptions::new().with_prefix().with_keys_only(),
            )
            .await?;
        let mut states = Vec::new();
        for kv in known.kvs() {
            let name = String::from_utf8_lossy(kv.key())
                .trim_start_matches(&prefix)
                .to_owned();
            let election = ElectionName::new(name)
                .map_err(|e| Error::Corrupt(format!("etcd election key: {e}")))?;
            let leader = self.leader(&election).await?;
            states.push(ElectionState { election, leader });
        }
        Ok(states)
    }
}
