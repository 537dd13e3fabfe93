//! The store primitive on etcd ([`Keys`]), natively: a session is a
//! lease, a key attached to it carries the lease, a creation revision is
//! etcd's `create_revision`, a commit is one transaction, a watch is one
//! of the handle's watches on its shared stream. Keys live under the
//! store's prefix (`{prefix}/{key}`); etcd tells an expiry (its lease's
//! keys are deleted then).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::pb::compare::{CompareResult, CompareTarget, TargetUnion};
use super::pb::{self, RangeRequest, RequestOp, TxnRequest};
use super::{EtcdStore, Woken, prefix_end};
use crate::error::{Error, Result};
use crate::grant::{SessionId, SessionLease};
use crate::store::keys::{Check, Entry, Heard, KeyWatch, Keys, Range, Revision, Write};
use crate::store::{Store, session_key};
use crate::watch;

/// Pause before a broken watch is opened again.
const WATCH_RETRY: Duration = Duration::from_millis(200);

/// The primitive on an etcd store's connections (opened with its URL, for
/// its access). Cloning shares them.
#[derive(Clone, Debug)]
pub struct EtcdKeys {
    store: EtcdStore,
}

impl EtcdKeys {
    /// The primitive on `store`'s prefix and connections.
    pub fn new(store: EtcdStore) -> Self {
        EtcdKeys { store }
    }

    fn full(&self, key: &str) -> Vec<u8> {
        format!("{}/{key}", self.store.prefix).into_bytes()
    }

    fn compare(&self, check: &Check) -> Result<pb::Compare> {
        let (key, range_end, target, union) = match check {
            Check::Absent(key) => (
                key,
                false,
                CompareTarget::Create,
                TargetUnion::CreateRevision(0),
            ),
            Check::NoneUnder(prefix) => (
                prefix,
                true,
                CompareTarget::Create,
                TargetUnion::CreateRevision(0),
            ),
            Check::Created { key, revision, .. } => {
                let revision = i64::try_from(revision.0).unwrap_or(i64::MAX);
                (
                    key,
                    false,
                    CompareTarget::Create,
                    TargetUnion::CreateRevision(revision),
                )
            }
        };
        let key = self.full(key);
        Ok(pb::Compare {
            result: CompareResult::Equal as i32,
            target: target as i32,
            range_end: if range_end {
                prefix_end(&key)
            } else {
                Vec::new()
            },
            key,
            target_union: Some(union),
        })
    }

    /// The lease a `Created` check also compares.
    fn lease_compare(&self, check: &Check) -> Result<Option<pb::Compare>> {
        let Check::Created { key, session, .. } = check else {
            return Ok(None);
        };
        let lease = session.map(session_key).transpose()?.unwrap_or(0);
        Ok(Some(pb::Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Lease as i32,
            key: self.full(key),
            range_end: Vec::new(),
            target_union: Some(TargetUnion::Lease(lease)),
        }))
    }

    fn op(&self, write: &Write) -> Result<RequestOp> {
        let request = match write {
            Write::Put {
                key,
                value,
                session,
            } => pb::request_op::Request::RequestPut(pb::PutRequest {
                key: self.full(key),
                value: value.clone().into_bytes(),
                lease: session.map(session_key).transpose()?.unwrap_or(0),
            }),
            Write::Delete(key) => {
                pb::request_op::Request::RequestDeleteRange(pb::DeleteRangeRequest {
                    key: self.full(key),
                    ..Default::default()
                })
            }
        };
        Ok(RequestOp {
            request: Some(request),
        })
    }

    fn entry(&self, kv: &pb::KeyValue) -> Result<Entry> {
        let corrupt = || {
            Error::Corrupt(format!(
                "etcd: key {:?} under leasehold's prefix is not UTF-8 text",
                String::from_utf8_lossy(&kv.key)
            ))
        };
        let key = std::str::from_utf8(&kv.key).map_err(|_| corrupt())?;
        let key = key
            .strip_prefix(&format!("{}/", self.store.prefix))
            .ok_or_else(corrupt)?;
        Ok(Entry {
            key: key.to_owned(),
            value: String::from_utf8(kv.value.clone()).map_err(|_| corrupt())?,
            session: (kv.lease != 0).then(|| SessionId::from_stored(kv.lease)),
            created: Revision(u64::try_from(kv.create_revision).unwrap_or(0)),
            modified: Revision(u64::try_from(kv.mod_revision).unwrap_or(0)),
            expires_in: None,
        })
    }
}

#[async_trait]
impl Keys for EtcdKeys {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        self.store.open_session(ttl).await
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        self.store.keep_alive(session).await
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        self.store.close_session(session).await
    }

    async fn commit(&self, checks: &[Check], writes: &[Write]) -> Result<Option<Revision>> {
        let mut compare = Vec::with_capacity(checks.len() * 2);
        for check in checks {
            compare.push(self.compare(check)?);
            compare.extend(self.lease_compare(check)?);
        }
        let success = writes.iter().map(|w| self.op(w)).collect::<Result<_>>()?;
        let txn = TxnRequest {
            compare,
            success,
            failure: Vec::new(),
        };
        let done = match self.store.txn("commit", txn).await {
            Ok(done) => done,
            Err(error) if error.is_lease_not_found() => {
                let session = writes
                    .iter()
                    .filter_map(Write::session)
                    .next()
                    .unwrap_or(SessionId(0));
                return Err(Error::SessionExpired(session));
            }
            Err(error) => return Err(error.into()),
        };
        let revision = done.header.map_or(0, |h| h.revision);
        Ok(done
            .succeeded
            .then(|| Revision(u64::try_from(revision).unwrap_or(0))))
    }

    async fn range(&self, prefix: &str) -> Result<Range> {
        let key = self.full(prefix);
        let request = RangeRequest {
            range_end: prefix_end(&key),
            key,
            ..Default::default()
        };
        let read = self.store.range("read", request).await?;
        let entries = read
            .kvs
            .iter()
            .map(|kv| self.entry(kv))
            .collect::<Result<_>>()?;
        let revision = read.header.map_or(0, |h| h.revision);
        Ok(Range {
            entries,
            revision: Revision(u64::try_from(revision).unwrap_or(0)),
        })
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<KeyWatch> {
        let (tx, rx) = watch::channel(Heard::Changed(from));
        tokio::spawn(follow(self.clone(), prefix.to_owned(), from, tx));
        Ok(rx)
    }

    async fn session_ended(&self, session: SessionId) {
        self.store.session_ended(session).await;
    }

    fn tells_expiries(&self) -> bool {
        true
    }
}

/// Tells `tx` of every change under `prefix` after `from`, until nobody
/// reads it; a broken watch is told as unknown, and opened again from the
/// revision a read then finds.
async fn follow(keys: EtcdKeys, prefix: String, mut from: Revision, tx: watch::Sender<Heard>) {
    let members = Arc::clone(&keys.store.members);
    let key = keys.full(&prefix);
    let range_end = prefix_end(&key);
    loop {
        let start = i64::try_from(from.0).unwrap_or(i64::MAX).saturating_add(1);
        let next = keys
            .store
            .watches
            .next_change(&members, key.clone(), range_end.clone(), start);
        let woken = tokio::select! {
            () = tx.closed() => return,
            woken = next => woken,
        };
        match woken {
            Woken::Changed(at) => {
                from = Revision(u64::try_from(at).unwrap_or(0)).max(from);
                tx.send_replace(Heard::Changed(from));
            }
            Woken::Broken => {
                tx.send_if_modified(|heard| {
                    let news = !matches!(heard, Heard::Unknown { .. });
                    *heard = Heard::Unknown {
                        error: "etcd: the watch broke".into(),
                    };
                    news
                });
                tokio::time::sleep(WATCH_RETRY).await;
                // What changed meanwhile is told by the read of whoever
                // hears the store answer again.
                if let Ok(read) = keys.range(&prefix).await {
                    from = read.revision;
                    tx.send_replace(Heard::Changed(from));
                }
            }
        }
    }
}
