//! The store primitive on etcd ([`Keys`]), natively: a session is a
//! lease, a key attached to it carries the lease, a creation revision is
//! etcd's `create_revision`, a commit is one transaction, a watch is one
//! of the handle's watches on its shared stream. Keys live in the store's
//! space (`{prefix}/{key}`); etcd tells an expiry (its lease's keys are
//! deleted then).

use std::time::Duration;

use async_trait::async_trait;

use super::pb::compare::{CompareResult, CompareTarget, TargetUnion};
use super::pb::{self, RangeRequest, RequestOp, TxnRequest};
use super::{EtcdKeys, TTL, created_at, delete, exists, get, prefix_end, put, shown};
use crate::error::{Error, Result};
use crate::grant::{SessionId, SessionLease};
use crate::store::keys::{Check, Entry, KeyWatch, Keys, Properties, Range, Revision, Write};
use crate::store::session_key;

impl EtcdKeys {
    /// The etcd key of `key`: under the store's space.
    pub(super) fn full(&self, key: &str) -> Vec<u8> {
        format!("{}{key}", self.space()).into_bytes()
    }

    fn compare(&self, check: &Check) -> pb::Compare {
        let (key, range_end, revision) = match check {
            Check::Absent(key) => (key, false, 0),
            Check::NoneUnder(prefix) => (prefix, true, 0),
            Check::Created { key, revision, .. } => {
                (key, false, i64::try_from(revision.0).unwrap_or(i64::MAX))
            }
        };
        let key = self.full(key);
        pb::Compare {
            range_end: if range_end {
                prefix_end(&key)
            } else {
                Vec::new()
            },
            ..created_at(key, revision)
        }
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
        Ok(match write {
            Write::Put {
                key,
                value,
                session,
            } => {
                let lease = session.map(session_key).transpose()?.unwrap_or(0);
                put(self.full(key), value.as_bytes(), lease)
            }
            Write::Delete(key) => delete(self.full(key)),
        })
    }

    /// A key read under the space. In leasehold's layout a key or value
    /// that is not UTF-8 text is corrupt; a recipe's, whose other clients
    /// may write anything, shows it as well as it can.
    fn entry(&self, kv: &pb::KeyValue) -> Result<Entry> {
        let corrupt = || {
            Error::Corrupt(format!(
                "etcd: key {} under leasehold's prefix is not UTF-8 text",
                shown(&kv.key)
            ))
        };
        let text = |bytes: &[u8]| match std::str::from_utf8(bytes) {
            Ok(text) => Ok(text.to_owned()),
            Err(_) if self.layout.is_foreign() => Ok(String::from_utf8_lossy(bytes).into_owned()),
            Err(_) => Err(corrupt()),
        };
        let key = text(&kv.key)?;
        let key = key.strip_prefix(&self.space()).ok_or_else(corrupt)?;
        Ok(Entry {
            key: key.to_owned(),
            value: text(&kv.value)?,
            session: (kv.lease != 0).then(|| SessionId::from_stored(kv.lease)),
            created: Revision(u64::try_from(kv.create_revision).unwrap_or(0)),
            modified: Revision(u64::try_from(kv.mod_revision).unwrap_or(0)),
            expires_in: None,
        })
    }

    /// A commit that puts checks that the store's marker is still there
    /// (in leasehold's layout): once leasehold's keys were deleted under
    /// it, nothing is written again.
    fn marked(&self, writes: &[Write]) -> bool {
        !self.layout.is_foreign() && writes.iter().any(|w| matches!(w, Write::Put { .. }))
    }

    /// Why a commit checked by [`Self::marked`] failed when its marker
    /// is gone.
    fn unmarked(&self) -> Error {
        Error::Corrupt(format!(
            "the marker key {:?} is gone: leasehold's keys under etcd prefix {} were \
             deleted; nothing was written",
            self.marker_key(),
            self.prefix
        ))
    }

    /// Whether each of `writes` is in place in `reads` (a read of each
    /// written key, in order): a put's key holds its value on its
    /// session, a deleted key is absent. If so, the revision the commit
    /// was carried out at: its puts' (they share it), else `now`.
    fn in_place(
        &self,
        writes: &[Write],
        reads: &[pb::ResponseOp],
        now: Revision,
    ) -> Option<Revision> {
        if writes.len() != reads.len() {
            return None;
        }
        let mut at = None;
        for (write, read) in writes.iter().zip(reads) {
            let kvs = match &read.response {
                Some(pb::response_op::Response::ResponseRange(range)) => &range.kvs,
                _ => return None,
            };
            match (write, kvs.as_slice()) {
                (Write::Delete(_), []) => {}
                (Write::Put { value, session, .. }, [kv])
                    if kv.value == value.as_bytes()
                        && kv.lease == session.map_or(Ok(0), session_key).ok()? =>
                {
                    at = Some(Revision(u64::try_from(kv.mod_revision).ok()?));
                }
                _ => return None,
            }
        }
        Some(at.unwrap_or(now))
    }
}

/// Whether a read among a transaction's answers found a key.
fn range_found(responses: &[pb::ResponseOp]) -> bool {
    responses.iter().any(|r| match &r.response {
        Some(pb::response_op::Response::ResponseRange(range)) => !range.kvs.is_empty(),
        _ => false,
    })
}

#[async_trait]
impl Keys for EtcdKeys {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        if self.read_only {
            return Err(Error::invalid(
                "session",
                "the store was opened read-only (Access::ReadOnly)",
            ));
        }
        let seconds = TTL.check(ttl)?.units;
        let lease = self
            .members
            .call("lease grant", |link| async move {
                pb::lease_client::LeaseClient::new(link.channel())
                    .lease_grant(link.request(pb::LeaseGrantRequest {
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
            id: SessionId::from_stored(lease.id),
            ttl: Duration::from_secs(lease.ttl.max(0).unsigned_abs()),
        })
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        let id = session_key(session)?;
        self.keep_alive_once(session, id).await
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        let id = session_key(session)?;
        self.forget_keeper(id);
        let revoked = self
            .members
            .call("lease revoke", |link| async move {
                pb::lease_client::LeaseClient::new(link.channel())
                    .lease_revoke(link.request(pb::LeaseRevokeRequest { id }))
                    .await
            })
            .await;
        match revoked {
            Err(error) if error.is_lease_not_found() => Ok(()),
            other => other.map(|_| ()).map_err(Error::from),
        }
    }

    /// One transaction. One sent again after an attempt that went
    /// unanswered may find its checks failing because that attempt was
    /// carried out: it then reads its writes back, and answers as that
    /// attempt did if they are all in place.
    async fn commit(&self, checks: &[Check], writes: &[Write]) -> Result<Option<Revision>> {
        if self.layout == crate::store::Layout::Concurrency {
            for write in writes.iter().filter(|w| matches!(w, Write::Put { .. })) {
                self.refuse_a_store_election(write.key()).await?;
            }
        }
        let mut compare = Vec::with_capacity(checks.len() * 2 + 1);
        for check in checks {
            compare.push(self.compare(check));
            compare.extend(self.lease_compare(check)?);
        }
        let marked = self.marked(writes);
        if marked {
            compare.push(exists(self.marker_key()));
        }
        let success = writes.iter().map(|w| self.op(w)).collect::<Result<_>>()?;
        // On failure: the marker (if checked), then each written key, to
        // tell a check that failed from a commit already carried out.
        let failure = marked
            .then(|| get(self.marker_key()))
            .into_iter()
            .chain(writes.iter().map(|w| get(self.full(w.key()))))
            .collect();
        let txn = TxnRequest {
            compare,
            success,
            failure,
        };
        let (done, resent) = match self.txn_counted("commit", txn).await {
            Ok(done) => done,
            Err(error) if error.is_lease_not_found() => {
                let session = writes.iter().find_map(Write::session);
                return Err(Error::SessionExpired(session.unwrap_or(SessionId(0))));
            }
            Err(error) => return Err(error.into()),
        };
        let revision = done.header.map_or(0, |h| h.revision);
        let revision = Revision(u64::try_from(revision).unwrap_or(0));
        if done.succeeded {
            return Ok(Some(revision));
        }
        let (marker, kept) = done
            .responses
            .split_at(usize::from(marked).min(done.responses.len()));
        if marked && !range_found(marker) {
            return Err(self.unmarked());
        }
        // Sent again after an attempt whose answer was lost: if every
        // write is in place, that attempt carried the commit out (a
        // campaign finds its own key, a release the key gone and its
        // token recorded) and its checks fail now only because of it.
        Ok(resent
            .then(|| self.in_place(writes, kept, revision))
            .flatten())
    }

    async fn range(&self, prefix: &str) -> Result<Range> {
        let key = self.full(prefix);
        let request = RangeRequest {
            range_end: prefix_end(&key),
            key,
            ..Default::default()
        };
        let read = self.range_of("read", request).await?;
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
        let key = self.full(prefix);
        let range_end = prefix_end(&key);
        let from = i64::try_from(from.0).unwrap_or(i64::MAX);
        Ok(self.watches.follow(&self.members, key, range_end, from))
    }

    /// The lease's time to live, as etcd counts it.
    async fn time_left(&self, session: SessionId) -> Result<Option<Duration>> {
        let id = session_key(session)?;
        let ttl = self
            .members
            .call("lease time-to-live", |link| async move {
                pb::lease_client::LeaseClient::new(link.channel())
                    .lease_time_to_live(
                        link.request(pb::LeaseTimeToLiveRequest { id, keys: false }),
                    )
                    .await
            })
            .await?;
        Ok(Some(Duration::from_secs(ttl.ttl.max(0).unsigned_abs())))
    }

    fn properties(&self) -> Properties {
        Properties {
            tells_expiries: true,
            ..Properties::default()
        }
    }
}
