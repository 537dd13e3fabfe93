//! The keys of elections and candidates, and reading an election's line
//! and leader from them.

use super::*;

impl EtcdStore {
    /// `{prefix}/e/{election}/`; slashes in the name are escaped so that no
    /// election's keys fall under another's prefix.
    ///
    /// In etcd's `concurrency` layout: `{prefix}/{election}/`, or
    /// `{election}/` without a prefix, the name taken as it is — the prefix
    /// `concurrency.NewElection` (and `etcdctl elect`) is given.
    pub(super) fn election_prefix(&self, election: &ElectionName) -> String {
        if self.layout == Layout::Concurrency {
            return if self.prefix.is_empty() {
                format!("{election}/")
            } else {
                format!("{}/{election}/", self.prefix.trim_end_matches('/'))
            };
        }
        format!(
            "{}/e/{}/",
            self.prefix,
            election.as_str().replace('/', "%2F")
        )
    }

    /// A session's candidate key: named by its lease, in 16 hex digits, or
    /// in etcd's `concurrency` layout as that recipe names it (`%x`).
    pub(super) fn candidate_key(&self, election: &ElectionName, session: SessionId) -> String {
        if self.layout == Layout::Concurrency {
            return format!("{}{:x}", self.election_prefix(election), session.0);
        }
        format!("{}{:016x}", self.election_prefix(election), session.0)
    }

    /// The candidate `kv` stands for among the keys under
    /// `election_prefix`, if any: leasehold's own layout skips keys it did
    /// not write; etcd's recipe counts every key.
    pub(super) fn candidate_in(&self, election_prefix: &str, kv: &KeyValue) -> Option<CandidateId> {
        match self.layout {
            Layout::Concurrency => proposal_of(election_prefix, kv),
            _ => candidate_of(election_prefix, kv),
        }
    }

    /// Refuses what needs state of leasehold's own besides the candidate
    /// keys (notes, the record of releases, the list of elections) in
    /// etcd's `concurrency` layout, where nothing but candidates may live
    /// under an election's prefix.
    pub(super) fn own_layout(&self, what: &str) -> Result<()> {
        if self.layout == Layout::Concurrency {
            return Err(Error::Unsupported(format!(
                "{what} needs leasehold's own layout; with ?layout=concurrency etcd's \
                 recipe decides alone (its order of candidates is the only line), so \
                 priorities, lock-delay, transfers, shards, slots and listing elections \
                 are not available"
            )));
        }
        Ok(())
    }

    pub(super) fn known_key_prefix(&self) -> String {
        format!("{}/k/", self.prefix)
    }

    pub(super) fn known_key(&self, election: &ElectionName) -> String {
        format!("{}{}", self.known_key_prefix(), election.as_str())
    }

    pub(super) async fn range(
        &self,
        what: &str,
        range: RangeRequest,
    ) -> Result<pb::RangeResponse, EtcdError> {
        self.members
            .call(what, |link| {
                let range = range.clone();
                async move {
                    pb::kv_client::KvClient::new(link.channel())
                        .range(link.request(range))
                        .await
                }
            })
            .await
    }

    pub(super) async fn txn(&self, what: &str, txn: TxnRequest) -> Result<TxnResponse, EtcdError> {
        self.members
            .call(what, |link| {
                let txn = txn.clone();
                async move {
                    pb::kv_client::KvClient::new(link.channel())
                        .txn(link.request(txn))
                        .await
                }
            })
            .await
    }

    /// The lowest candidate leasehold wrote in `election`, with its
    /// candidate id, and the revision of the read. Keys it did not write
    /// are skipped.
    pub(super) async fn first_candidate(
        &self,
        election: &ElectionName,
    ) -> Result<(Option<(KeyValue, CandidateId)>, i64)> {
        let prefix = self.election_prefix(election);
        let range = RangeRequest {
            sort_target: SortTarget::Create as i32,
            sort_order: SortOrder::Ascend as i32,
            limit: 1,
            ..range_of_prefix(&prefix)
        };
        let found = self.range("get", range.clone()).await?;
        let revision = revision_of(found.header.as_ref());
        let Some(first) = found.kvs.into_iter().next() else {
            return Ok((None, revision));
        };
        if let Some(candidate) = self.candidate_in(&prefix, &first) {
            return Ok((Some((first, candidate)), revision));
        }
        // A key leasehold did not write: read the whole range, at the same
        // revision, and take the first candidate key in it.
        warn_foreign(&first);
        let all = self
            .range(
                "get",
                RangeRequest {
                    limit: 0,
                    revision,
                    ..range
                },
            )
            .await?;
        let first = all
            .kvs
            .into_iter()
            .find_map(|kv| self.candidate_in(&prefix, &kv).map(|c| (kv, c)));
        Ok((first, revision))
    }

    /// The candidate key just ahead of the one created at `my_revision`,
    /// skipping keys leasehold did not write; `Ok(None)` when there is
    /// none, `Err(None)` when the key created at `my_revision` is gone.
    /// With the revision of the read.
    pub(super) async fn predecessor(
        &self,
        election: &ElectionName,
        my_revision: i64,
    ) -> Result<(std::result::Result<Option<KeyValue>, ()>, i64)> {
        let prefix = self.election_prefix(election);
        // Our key and the candidate just ahead of it, in one read.
        let range = RangeRequest {
            max_create_revision: my_revision,
            sort_target: SortTarget::Create as i32,
            sort_order: SortOrder::Descend as i32,
            limit: 2,
            ..range_of_prefix(&prefix)
        };
        let found = self.range("get", range.clone()).await?;
        let revision = revision_of(found.header.as_ref());
        let mut kvs = found.kvs.into_iter();
        if kvs
            .next()
            .is_none_or(|kv| kv.create_revision != my_revision)
        {
            return Ok((Err(()), revision));
        }
        let Some(next) = kvs.next() else {
            return Ok((Ok(None), revision));
        };
        if self.candidate_in(&prefix, &next).is_some() {
            return Ok((Ok(Some(next)), revision));
        }
        warn_foreign(&next);
        let all = self
            .range(
                "get",
                RangeRequest {
                    limit: 0,
                    revision,
                    ..range
                },
            )
            .await?;
        let ahead = all
            .kvs
            .into_iter()
            .filter(|kv| kv.create_revision < my_revision)
            .find(|kv| self.candidate_in(&prefix, kv).is_some());
        Ok((Ok(ahead), revision))
    }

    pub(super) async fn to_leader(&self, kv: &KeyValue, candidate: CandidateId) -> Result<Leader> {
        let id = kv.lease;
        if id <= 0 {
            // A key put without a lease (only another program writes one).
            return Ok(Leader {
                candidate,
                token: FencingToken::from_stored(kv.create_revision),
                expires_in: NO_LEASE,
                session: None,
            });
        }
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
        Ok(Leader {
            candidate,
            token: FencingToken::from_stored(kv.create_revision),
            expires_in: Duration::from_secs(ttl.ttl.max(0).unsigned_abs()),
            session: Some(SessionId::from_stored(id)),
        })
    }

    pub(super) async fn leader_at(&self, election: &ElectionName) -> Result<(Option<Leader>, i64)> {
        let (first, revision) = self.first_candidate(election).await?;
        let leader = match first {
            Some((kv, candidate)) => Some(self.to_leader(&kv, candidate).await?),
            None => None,
        };
        Ok((leader, revision))
    }
}
