//! Campaigning: creating a candidate's key (or, in etcd's own layout, a
//! proposal) in one transaction, and why one was not created.

use super::*;

impl EtcdStore {
    /// Creates `session`'s candidate key in `election`, only if absent, and
    /// for an election new to the store its `k/` key, only if absent: a
    /// key that is there is never overwritten. Both only while the marker
    /// is there. The key's create revision, and whether this call created
    /// it (`false`: the session was a candidate already).
    pub(super) async fn create_candidate(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<(i64, bool)> {
        let lease = session_key(session)?;
        let key = self.candidate_key(election, session);
        if self.layout == Layout::Concurrency {
            return self.create_proposal(session, lease, key, candidate).await;
        }
        let known = self.known_key(election);
        let marker = self.marker_key();
        // Most campaigns are for an election the store has seen before.
        let mut known_exists = true;
        for _ in 0..ATTEMPTS {
            let txn = candidate_txn(&key, &known, &marker, candidate, lease, known_exists);
            let done = match self.txn("campaign", txn).await {
                Err(error) if error.is_lease_not_found() => {
                    return Err(Error::SessionExpired(session));
                }
                other => other?,
            };
            if done.succeeded {
                return Ok((revision_of(done.header.as_ref()), true));
            }
            match self.why_not_created(done.responses, lease, &marker)? {
                NotCreated::AlreadyCandidate(revision) => return Ok((revision, false)),
                NotCreated::Retry { known_exists: now } => known_exists = now,
            }
        }
        Err(Error::Unavailable {
            reason: format!("etcd campaign: the keys of election {election} kept changing"),
            source: None,
        })
    }

    /// Creates `session`'s candidate key as etcd's `Campaign` does: only if
    /// absent, with the lease attached and the candidate id as proposal.
    /// Its create revision, and whether this call created it.
    pub(super) async fn create_proposal(
        &self,
        session: SessionId,
        lease: i64,
        key: String,
        candidate: &CandidateId,
    ) -> Result<(i64, bool)> {
        let txn = TxnRequest {
            compare: vec![created_at(key.clone(), 0)],
            success: vec![put(key.clone(), candidate.as_str(), lease)],
            failure: vec![get(key.clone())],
        };
        let done = match self.txn("campaign", txn).await {
            Err(error) if error.is_lease_not_found() => {
                return Err(Error::SessionExpired(session));
            }
            other => other?,
        };
        if done.succeeded {
            return Ok((revision_of(done.header.as_ref()), true));
        }
        let mine = done.responses.into_iter().find_map(|r| match r.response {
            Some(pb::response_op::Response::ResponseRange(range)) => range.kvs.into_iter().next(),
            _ => None,
        });
        match mine {
            Some(kv) if kv.lease == lease => Ok((kv.create_revision, false)),
            Some(kv) => Err(Error::Corrupt(format!(
                "etcd key {} was not written by this session; leasehold does not overwrite it",
                shown(&kv.key)
            ))),
            None => Err(Error::Unavailable {
                reason: format!(
                    "etcd campaign: the key {} kept changing",
                    shown(key.as_bytes())
                ),
                source: None,
            }),
        }
    }

    /// Why the candidate key was not created, from the failed
    /// transaction's `responses` (the candidate key, the `k/` key, the
    /// marker); refuses keys leasehold did not write and a missing marker.
    pub(super) fn why_not_created(
        &self,
        responses: Vec<pb::ResponseOp>,
        lease: i64,
        marker: &str,
    ) -> Result<NotCreated> {
        let mut found = responses.into_iter().map(|r| match r.response {
            Some(pb::response_op::Response::ResponseRange(range)) => range.kvs.into_iter().next(),
            _ => None,
        });
        let (mine, known_kv, marker_kv) = (
            found.next().flatten(),
            found.next().flatten(),
            found.next().flatten(),
        );
        if let Some(mine) = mine {
            if mine.lease == lease {
                return Ok(NotCreated::AlreadyCandidate(mine.create_revision));
            }
            return Err(Error::Corrupt(format!(
                "etcd key {} was not written by this session; leasehold does not overwrite it",
                shown(&mine.key)
            )));
        }
        if marker_kv.is_none() {
            return Err(Error::Corrupt(format!(
                "the marker key {marker:?} is gone: leasehold's keys under etcd prefix {} \
                 were deleted; nothing was written",
                self.prefix
            )));
        }
        match known_kv {
            None => Ok(NotCreated::Retry {
                known_exists: false,
            }),
            Some(kv) if kv.value.is_empty() => Ok(NotCreated::Retry { known_exists: true }),
            Some(kv) => Err(Error::Corrupt(format!(
                "etcd key {} holds a value leasehold did not write; \
                 leasehold does not overwrite it",
                shown(&kv.key)
            ))),
        }
    }
}

/// The one request of an unwaited campaign: creates the candidate `key`
/// (with `candidate`, on `lease`) while `marker` is there, the key is
/// absent and `free` holds; with the election's `known` key created if
/// absent, or else only while it is empty as leasehold writes it (a value
/// there is another program's, never overwritten nor campaigned beside).
/// One request whether or not the store has seen the election before:
/// transactions inside a transaction (etcd 3.3 and later), whose inner
/// branches exclude each other. See [`unwaited_granted`].
pub(super) fn unwaited_txn(
    key: &str,
    known: &str,
    marker: &str,
    candidate: &CandidateId,
    lease: i64,
    free: [pb::Compare; 2],
) -> TxnRequest {
    let mut compare = vec![exists(marker.to_owned()), created_at(key.to_owned(), 0)];
    compare.extend(free);
    let take = || put(key.to_owned(), candidate.as_str(), lease);
    let known_is_ours = TxnRequest {
        compare: vec![empty(known)],
        success: vec![take()],
        failure: Vec::new(),
    };
    let known_is_new = TxnRequest {
        compare: vec![created_at(known.to_owned(), 0)],
        success: vec![put(known.to_owned(), "", 0), take()],
        failure: vec![nested(known_is_ours)],
    };
    TxnRequest {
        compare,
        success: vec![nested(known_is_new)],
        failure: Vec::new(),
    }
}

pub(super) fn nested(txn: TxnRequest) -> RequestOp {
    RequestOp {
        request: Some(pb::request_op::Request::RequestTxn(txn)),
    }
}

/// Whether [`unwaited_txn`] put the candidate key: the election was free,
/// and its `known` key was created or found empty.
pub(super) fn unwaited_granted(done: &TxnResponse) -> bool {
    fn inner(op: Option<&pb::ResponseOp>) -> Option<&TxnResponse> {
        match op.and_then(|op| op.response.as_ref()) {
            Some(pb::response_op::Response::ResponseTxn(txn)) => Some(txn),
            _ => None,
        }
    }
    if !done.succeeded {
        return false;
    }
    let Some(known_is_new) = inner(done.responses.first()) else {
        return false;
    };
    known_is_new.succeeded
        || inner(known_is_new.responses.first())
            .is_some_and(|known_is_ours| known_is_ours.succeeded)
}

/// Why [`EtcdStore::create_candidate`]'s transaction did not create the
/// candidate key.
pub(super) enum NotCreated {
    /// The session is a candidate already: its key's create revision.
    AlreadyCandidate(i64),
    /// The election's `k/` key is not as assumed: try again, knowing whether
    /// it exists.
    Retry { known_exists: bool },
}

/// The transaction that creates the candidate `key` (with `candidate`, on
/// `lease`) only if absent and only while `marker` is there; with the
/// election's `known` key: empty if `known_exists`, else created only if
/// absent. On failure it reads the three keys.
pub(super) fn candidate_txn(
    key: &str,
    known: &str,
    marker: &str,
    candidate: &CandidateId,
    lease: i64,
    known_exists: bool,
) -> TxnRequest {
    let mut compare = vec![exists(marker.to_owned()), created_at(key.to_owned(), 0)];
    let mut success = vec![put(key.to_owned(), candidate.as_str(), lease)];
    if known_exists {
        // leasehold writes it empty; anything else is not its own.
        compare.push(empty(known));
    } else {
        compare.push(created_at(known.to_owned(), 0));
        success.push(put(known.to_owned(), "", 0));
    }
    TxnRequest {
        compare,
        success,
        failure: vec![
            get(key.to_owned()),
            get(known.to_owned()),
            get(marker.to_owned()),
        ],
    }
}
