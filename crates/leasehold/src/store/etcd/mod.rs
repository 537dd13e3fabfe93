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
//!   within [`ATTEMPT_TIMEOUT`] is retried on the next endpoint. Every
//!   retried request is idempotent: the campaign transaction creates the
//!   candidate key only if absent.
//! - The gRPC code is generated from `proto/etcd.proto` (the subset of
//!   etcd's API that leasehold uses) and checked in, so building needs no
//!   protobuf compiler.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Mutex, watch};

use crate::error::{Error, Result};
use crate::names::{CandidateId, ElectionName};
use crate::store::{
    ElectionState, FencingToken, Grant, Leader, LeaderStatus, LeaderWatch, SessionId, SessionLease,
    StatusWatch, Store, known_only, publish_leader, read_until_ok,
};

mod client;

pub use client::ATTEMPT_TIMEOUT;
use client::{KeepAlive, Members, Watch, describe, prefix_end, request};

/// The messages and client stubs generated from `proto/etcd.proto`.
#[allow(
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations,
    unused_qualifications,
    unreachable_pub
)]
mod pb {
    include!("etcdserverpb.rs");
}

use pb::compare::{CompareResult, CompareTarget, TargetUnion};
use pb::range_request::{SortOrder, SortTarget};
use pb::{KeyValue, RangeRequest, RequestOp, TxnRequest, TxnResponse};

/// Pause before re-establishing a broken watch.
const WATCH_RETRY: Duration = Duration::from_millis(200);

/// The etcd store. Cloning shares the connections.
#[derive(Clone)]
pub struct EtcdStore {
    members: Arc<Members>,
    prefix: String,
    keepers: Arc<Mutex<HashMap<i64, KeepAlive>>>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// `create_revision(key) == revision`, the guard of every write that must
/// only land while a candidate key is the one we created.
fn created_at(key: impl Into<Vec<u8>>, revision: i64) -> pb::Compare {
    pb::Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: key.into(),
        target_union: Some(TargetUnion::CreateRevision(revision)),
        range_end: Vec::new(),
    }
}

fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
            key: key.into(),
            value: value.into(),
            lease,
        })),
    }
}

fn delete(key: impl Into<Vec<u8>>) -> RequestOp {
    RequestOp {
        request: Some(pb::request_op::Request::RequestDeleteRange(
            pb::DeleteRangeRequest {
                key: key.into(),
                range_end: Vec::new(),
            },
        )),
    }
}

fn get(key: impl Into<Vec<u8>>) -> RequestOp {
    RequestOp {
        request: Some(pb::request_op::Request::RequestRange(RangeRequest {
            key: key.into(),
            ..Default::default()
        })),
    }
}

/// Every key under `prefix`.
fn range_of_prefix(prefix: &str) -> RangeRequest {
    RangeRequest {
        key: prefix.as_bytes().to_vec(),
        range_end: prefix_end(prefix.as_bytes()),
        ..Default::default()
    }
}

fn revision_of(header: Option<&pb::ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision)
}

impl EtcdStore {
    /// Connects to the cluster at `endpoints` (`host:port`) and checks that
    /// one of them answers; `prefix` is where leasehold keeps its keys.
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<Self> {
        if endpoints.is_empty() {
            return Err(Error::invalid("etcd endpoints", "none given"));
        }
        let store = EtcdStore {
            members: Arc::new(Members::new(endpoints)?),
            prefix: prefix.trim_end_matches('/').to_owned(),
            keepers: Default::default(),
        };
        // Fail now, with the endpoints named, rather than at the first campaign.
        let known = RangeRequest {
            count_only: true,
            ..range_of_prefix(&store.known_key_prefix())
        };
        store.range("status check", known).await.map_err(|e| {
            let cause = match e {
                Error::Unavailable { reason, .. } => reason,
                other => other.to_string(),
            };
            Error::Unavailable {
                reason: format!("cannot reach etcd at {}: {cause}", endpoints.join(",")),
                source: None,
            }
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

    async fn range(&self, what: &str, range: RangeRequest) -> Result<pb::RangeResponse> {
        self.members
            .call(what, |channel| {
                let range = range.clone();
                async move {
                    pb::kv_client::KvClient::new(channel)
                        .range(request(range))
                        .await
                }
            })
            .await
    }

    async fn txn(&self, what: &str, txn: TxnRequest) -> Result<TxnResponse> {
        self.members
            .call(what, |channel| {
                let txn = txn.clone();
                async move {
                    pb::kv_client::KvClient::new(channel)
                        .txn(request(txn))
                        .await
                }
            })
            .await
    }

    /// The lowest candidate of `election` and the revision of the read.
    async fn first_candidate(&self, election: &ElectionName) -> Result<(Option<KeyValue>, i64)> {
        let range = RangeRequest {
            sort_target: SortTarget::Create as i32,
            sort_order: SortOrder::Ascend as i32,
            limit: 1,
            ..range_of_prefix(&self.election_prefix(election))
        };
        let found = self.range("get", range).await?;
        Ok((
            found.kvs.into_iter().next(),
            revision_of(found.header.as_ref()),
        ))
    }

    async fn to_leader(&self, kv: &KeyValue) -> Result<Leader> {
        let candidate = CandidateId::new(String::from_utf8_lossy(&kv.value)).map_err(|e| {
            Error::Corrupt(format!(
                "etcd key {:?}: {e}",
                String::from_utf8_lossy(&kv.key)
            ))
        })?;
        let id = kv.lease;
        let ttl = self
            .members
            .call("lease time-to-live", |channel| async move {
                pb::lease_client::LeaseClient::new(channel)
                    .lease_time_to_live(request(pb::LeaseTimeToLiveRequest { id, keys: false }))
                    .await
            })
            .await?;
        Ok(Leader {
            candidate,
            token: FencingToken(kv.create_revision.unsigned_abs()),
            expires_in: Duration::from_secs(ttl.ttl.max(0).unsigned_abs()),
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
        let opened = Watch::open(
            self.members.channel(0),
            key.as_bytes().to_vec(),
            Vec::new(),
            from_revision,
        )
        .await;
        let mut watch = match opened {
            Ok(watch) => watch,
            Err(status) => {
                tracing::debug!(error = %describe(&status), key, "watch failed; re-reading");
                tokio::time::sleep(WATCH_RETRY).await;
                return;
            }
        };
        loop {
            match watch.changed().await {
                Some(events) => {
                    if events
                        .iter()
                        .any(|e| e.r#type == pb::event::EventType::Delete as i32)
                    {
                        return;
                    }
                }
                None => {
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
        for attempt in 0..self.members.len() {
            let keeper = match keepers.entry(id) {
                std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
                std::collections::hash_map::Entry::Vacant(vacant) => {
                    let channel = self.members.channel(attempt);
                    match tokio::time::timeout(ATTEMPT_TIMEOUT, KeepAlive::open(channel, id)).await
                    {
                        Ok(Ok(keeper)) => vacant.insert(keeper),
                        Ok(Err(status)) if client::is_lease_not_found(&status) => {
                            return Err(Error::SessionExpired(session));
                        }
                        Ok(Err(_)) | Err(_) => continue,
                    }
                }
            };
            match tokio::time::timeout(ATTEMPT_TIMEOUT, keeper.once()).await {
                Ok(Some(ttl)) if ttl > 0 => return Ok(Duration::from_secs(ttl.unsigned_abs())),
                Ok(Some(_)) => {
                    keepers.remove(&id);
                    return Err(Error::SessionExpired(session));
                }
                Ok(None) | Err(_) => {
                    keepers.remove(&id);
                    self.members.skip_active();
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
            let txn = TxnRequest {
                compare: vec![created_at(key.clone(), revision)],
                success: vec![delete(key)],
                failure: Vec::new(),
            };
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
        let txn = TxnRequest {
            compare: vec![created_at(leader_key, token)],
            success: vec![put(key, value, 0)],
            failure: Vec::new(),
        };
        if self.txn("fenced put", txn).await?.succeeded {
            return Ok(());
        }
        match self.first_candidate(&grant.election).await?.0 {
            Some(kv) if kv.create_revision > token => Err(Error::Stale {
                resource: key.to_owned(),
                presented: grant.token,
                highest: FencingToken(kv.create_revision.unsigned_abs()),
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
            .call("lease grant", |channel| async move {
                pb::lease_client::LeaseClient::new(channel)
                    .lease_grant(request(pb::LeaseGrantRequest {
                        ttl: seconds,
                        id: 0,
                    }))
                    .await
            })
            .await?;
        if !lease.error.is_empty() {
            return Err(Error::Unavailable {
                reason: format!("etcd lease grant failed: {}", lease.error),
                source: None,
            });
        }
        Ok(SessionLease {
            id: SessionId(lease.id.unsigned_abs()),
            ttl: Duration::from_secs(lease.ttl.max(0).unsigned_abs()),
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
            .call("lease revoke", |channel| async move {
                pb::lease_client::LeaseClient::new(channel)
                    .lease_revoke(request(pb::LeaseRevokeRequest { id }))
                    .await
            })
            .await;
        match revoked {
            Err(error) if client::is_lease_not_found_error(&error) => Ok(()),
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
        let txn = TxnRequest {
            compare: vec![created_at(key.clone(), 0)],
            success: vec![
                put(key.clone(), candidate.as_str(), lease),
                put(self.known_key(election), "", 0),
            ],
            failure: vec![get(key.clone())],
        };
        let created = match self.txn("campaign", txn).await {
            Err(error) if client::is_lease_not_found_error(&error) => {
                return Err(Error::SessionExpired(session));
            }
            other => other?,
        };
        let my_revision = if created.succeeded {
            revision_of(created.header.as_ref())
        } else {
            created
                .responses
                .into_iter()
                .find_map(|r| match r.response {
                    Some(pb::response_op::Response::ResponseRange(range)) => {
                        range.kvs.first().map(|kv| kv.create_revision)
                    }
                    _ => None,
                })
                .ok_or(Error::SessionExpired(session))?
        };
        let mut guard = WithdrawIfAbandoned {
            armed: created
                .succeeded
                .then(|| (self.clone(), key.clone(), my_revision)),
        };
        loop {
            // Our key and the candidate just ahead of it, in one read.
            let range = RangeRequest {
                max_create_revision: my_revision,
                sort_target: SortTarget::Create as i32,
                sort_order: SortOrder::Descend as i32,
                limit: 2,
                ..range_of_prefix(&self.election_prefix(election))
            };
            let found = self.range("get", range).await?;
            let revision = revision_of(found.header.as_ref());
            let mut kvs = found.kvs.into_iter();
            let mine = kvs.next().filter(|kv| kv.create_revision == my_revision);
            if mine.is_none() {
                // Our key is gone: the lease expired (or was revoked).
                return Err(Error::SessionExpired(session));
            }
            match kvs.next() {
                Some(predecessor) => {
                    let predecessor = String::from_utf8_lossy(&predecessor.key).into_owned();
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
        let txn = TxnRequest {
            compare: vec![created_at(key.clone(), token)],
            success: vec![delete(key)],
            failure: Vec::new(),
        };
        if !self.txn("resign", txn).await?.succeeded {
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
        Ok(known_only(self.watch_status(election).await?))
    }

    async fn watch_status(&self, election: &ElectionName) -> Result<StatusWatch> {
        let (first, revision) = self.leader_at(election).await?;
        let (tx, rx) = watch::channel(LeaderStatus::Known(first.clone()));
        let store = self.clone();
        let election = election.clone();
        tokio::spawn(async move {
            // A re-read at the holder's expiry notices an outage that no
            // event reports (a member without quorum answers nothing).
            let expiry = |leader: &Option<Leader>| {
                leader
                    .as_ref()
                    .map(|l| tokio::time::Instant::now() + l.expires_in + Duration::from_millis(1))
            };
            let mut wake = expiry(&first);
            let at_expiry = |wake: Option<tokio::time::Instant>| async move {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let mut from = revision + 1;
            loop {
                let prefix = store.election_prefix(&election);
                let opened = tokio::select! {
                    biased;
                    () = tx.closed() => return,
                    () = at_expiry(wake) => None,
                    opened = Watch::open(
                        store.members.channel(0),
                        prefix.as_bytes().to_vec(),
                        prefix_end(prefix.as_bytes()),
                        from,
                    ) => Some(opened),
                };
                if let Some(Ok(mut watch)) = opened {
                    // The watch is opened with `hasleader`: a member that
                    // loses quorum cancels it, and the re-read then fails.
                    tokio::select! {
                        biased;
                        () = tx.closed() => return,
                        () = at_expiry(wake) => {}
                        // Events, or a broken watch: either way, re-read.
                        _ = watch.changed() => {}
                    }
                }
                // Something changed, the watch broke, or the holder's lease
                // ran out: re-read, publish, and watch again from the read's
                // revision.
                let Some((leader, revision)) =
                    read_until_ok(&tx, &election, WATCH_RETRY, || store.leader_at(&election)).await
                else {
                    return;
                };
                wake = expiry(&leader);
                publish_leader(&tx, leader);
                from = revision + 1;
            }
        });
        Ok(rx)
    }

    async fn elections(&self) -> Result<Vec<ElectionState>> {
        let prefix = self.known_key_prefix();
        let known = self
            .range(
                "get",
                RangeRequest {
                    keys_only: true,
                    ..range_of_prefix(&prefix)
                },
            )
            .await?;
        let mut states = Vec::new();
        for kv in &known.kvs {
            let name = String::from_utf8_lossy(&kv.key)
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
