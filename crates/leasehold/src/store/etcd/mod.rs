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
//!
//! What is leasehold's: the keys under `{prefix}/` once the marker key
//! `{prefix}/leasehold` (value `leasehold 1`, the layout version) is there.
//! The first writer creates the marker in a transaction that requires the
//! prefix to hold no key at all, and no enclosing prefix to hold a store,
//! so a prefix that holds other programs' keys is refused before anything
//! is written. Within the
//! space, leasehold writes only keys it creates: a candidate key is
//! created only if absent, and an election's `{prefix}/k/{election}` key
//! only if absent (it is never overwritten). Keys it did not write that
//! appear later are never taken for candidates: a candidate key is
//! `{16 hex digits}` naming the lease attached to it, holding a candidate
//! id; anything else is skipped, with a warning. A store opened read-only
//! ([`EtcdStore::connect_read_only`]) writes nothing, not even the marker.
//!
//! `?layout=concurrency` ([`Layout::Concurrency`]) lays elections out as
//! etcd's own `concurrency.Election` does, so that its clients (Go services,
//! `etcdctl elect`) and leasehold's contend in one election:
//! - Election `E` is the key prefix `{prefix}/E/` (`E/` without a prefix,
//!   `/E/` with the prefix `/`), the name taken as it is. A candidate is `E/{lease id in lower-case
//!   hex, unpadded}` with the lease attached and the candidate id as its
//!   value (the recipe's proposal), created only if absent.
//! - Every key under `E/` is a candidate, whoever wrote it, since the
//!   recipe counts them all: the lowest create revision leads, and its
//!   value is shown as the leader's id, its create revision as the token.
//!   A waiter waits for the deletion of the key just ahead of it, as the
//!   recipe's waiters do, so the two kinds of clients wait in one line.
//! - Nothing else of leasehold's is written anywhere: no marker, no notes,
//!   no record of releases. So what needs them — the line of standbys with
//!   priorities, lock-delay, transfers, groups, the list of elections — is
//!   refused ([`Error::Unsupported`]); the recipe's order is the only line.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Mutex;

use crate::config::StoreTtl;
use crate::error::{Error, Result};
use crate::names::{CandidateId, ElectionName};
use crate::store::cleanup::OnDrop;
use crate::store::layout::Layout;
use crate::store::security::Security;
use crate::store::shared_read::SharedReads;
use crate::store::watch_driver::{self as leader_watch, Event, Source};
use crate::store::{
    ElectionState, FencingToken, Grant, Leader, LeaderWatch, Note, NoteWatch, SessionId,
    SessionLease, StatusWatch, Store, session_key,
};

mod client;
mod connect;
mod notes;
mod watch_hub;

pub use client::ATTEMPT_TIMEOUT;
use client::{EtcdError, KeepAlive, Members, prefix_end};
use watch_hub::{WatchHub, Woken};

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

/// How etcd keeps a TTL: a lease has whole seconds (a request is rounded
/// up, never down), at most etcd's `MaxLeaseTTL`.
const TTL: StoreTtl = StoreTtl {
    store: "etcd",
    unit: Duration::from_secs(1),
    max: Duration::from_secs(9_000_000_000),
};

/// Pause before re-establishing a broken watch.
const WATCH_RETRY: Duration = Duration::from_millis(200);
/// The layout of leasehold's keys that this build writes and understands,
/// recorded in the marker key.
pub const LAYOUT_VERSION: i64 = 1;
/// The marker key's name under the prefix.
const MARKER: &str = "leasehold";
/// How often opening or campaigning re-reads a prefix that changed between
/// its read and its write before giving up.
const ATTEMPTS: usize = 5;

/// One session's keep-alive stream, opened at its first renewal.
type KeeperSlot = Arc<Mutex<Option<KeepAlive>>>;

/// The etcd store. Cloning shares the connections.
#[derive(Clone)]
pub struct EtcdStore {
    members: Arc<Members>,
    prefix: String,
    /// Each session's keep-alive stream, behind a lock of its own.
    keepers: Arc<std::sync::Mutex<HashMap<i64, KeeperSlot>>>,
    /// Opened by [`EtcdStore::connect_read_only`]: opens no session.
    read_only: bool,
    /// leasehold's own layout, or etcd's `concurrency.Election`.
    layout: Layout,
    /// Every watch of this handle, on one stream.
    watches: Arc<WatchHub>,
    /// Reads of a whole line of standbys, shared by this handle's callers.
    line_reads: Arc<SharedReads<String, (Vec<crate::store::Note>, i64)>>,
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

/// No key in `[key, range_end)` at all (an empty range compares as a key
/// that was never created).
fn no_key_in(range: &RangeRequest) -> pb::Compare {
    pb::Compare {
        range_end: range.range_end.clone(),
        ..created_at(range.key.clone(), 0)
    }
}

/// No key in `[key, range_end)` (or `key` alone, without a `range_end`)
/// was created or changed after `revision`.
fn unchanged_since(range: &RangeRequest, revision: i64) -> pb::Compare {
    pb::Compare {
        result: CompareResult::Less as i32,
        target: CompareTarget::Mod as i32,
        key: range.key.clone(),
        target_union: Some(TargetUnion::ModRevision(revision.saturating_add(1))),
        range_end: range.range_end.clone(),
    }
}

/// `key` exists.
/// `key` is there with an empty value (fails when it is absent).
fn empty(key: &str) -> pb::Compare {
    pb::Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Value as i32,
        key: key.as_bytes().to_vec(),
        target_union: Some(TargetUnion::Value(Vec::new())),
        range_end: Vec::new(),
    }
}

fn exists(key: impl Into<Vec<u8>>) -> pb::Compare {
    pb::Compare {
        result: CompareResult::Greater as i32,
        target: CompareTarget::Version as i32,
        key: key.into(),
        target_union: Some(TargetUnion::Version(0)),
        range_end: Vec::new(),
    }
}

fn shown(key: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(key))
}

/// The candidate id in `kv` if it is a candidate key leasehold wrote in the
/// election whose keys start with `election_prefix`: named by the lease
/// attached to it (16 hex digits), holding a valid candidate id.
fn candidate_of(election_prefix: &str, kv: &KeyValue) -> Option<CandidateId> {
    let name = kv.key.strip_prefix(election_prefix.as_bytes())?;
    if kv.lease <= 0 || name != format!("{:016x}", kv.lease).as_bytes() {
        return None;
    }
    CandidateId::new(std::str::from_utf8(&kv.value).ok()?).ok()
}

/// The candidate a key under an election's prefix stands for in etcd's
/// `concurrency.Election`: every key there is a candidate (the recipe
/// skips none), and its value is its proposal. A proposal that is no valid
/// candidate id is shown as well as it can be.
fn proposal_of(election_prefix: &str, kv: &KeyValue) -> Option<CandidateId> {
    kv.key.strip_prefix(election_prefix.as_bytes())?;
    Some(CandidateId::shown(&kv.value, "(empty proposal)"))
}

/// How long a candidate key without a lease is shown to have left: it
/// never expires (a year stands for that).
const NO_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The layout version a marker key records; `Corrupt` if it is not one.
fn marker_version(kv: &KeyValue) -> Result<i64> {
    std::str::from_utf8(&kv.value)
        .ok()
        .and_then(|v| v.strip_prefix("leasehold "))
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|v| *v >= 1)
        .ok_or_else(|| {
            Error::Corrupt(format!(
                "etcd key {} does not hold leasehold's marker; the prefix belongs to another program",
                shown(&kv.key)
            ))
        })
}

/// What a prefix holds, read in one transaction.
struct Survey {
    revision: i64,
    marker: Option<KeyValue>,
    /// The first key under `{prefix}/` (the marker, when it is the only
    /// one), if any.
    first_key: Option<Vec<u8>>,
    /// An enclosing prefix that holds a leasehold store.
    enclosing: Option<String>,
    /// The enclosing prefixes' marker keys this client may read (all of
    /// them, unless etcd's permissions confine it to its prefix).
    readable: Vec<String>,
}

impl EtcdStore {
    /// Connects to the cluster at `endpoints` (`host:port`) and checks that
    /// one of them answers; `prefix` is where leasehold keeps its keys.
    /// The first use of a prefix creates the store there (the marker key);
    /// a prefix holding keys leasehold did not write, or inside another
    /// leasehold store, is refused with [`Error::Corrupt`] and left as it
    /// is, and one written by a newer leasehold with
    /// [`Error::IncompatibleSchema`].
    pub async fn connect(endpoints: &[String], prefix: &str, security: &Security) -> Result<Self> {
        Self::connect_with_layout(endpoints, prefix, security, Layout::Leasehold).await
    }

    /// Connects as [`EtcdStore::connect`] does, with the elections laid
    /// out as `layout` says: [`Layout::Concurrency`] speaks etcd's
    /// `concurrency.Election` below `prefix` (which may then be empty).
    pub async fn connect_with_layout(
        endpoints: &[String],
        prefix: &str,
        security: &Security,
        layout: Layout,
    ) -> Result<Self> {
        let store = Self::reach(endpoints, prefix, security, false, layout).await?;
        if layout == Layout::Leasehold {
            store.open_space().await?;
        }
        warn_if_unencrypted(security);
        Ok(store)
    }

    /// Connects as [`EtcdStore::connect`] does, for reading only: writes
    /// nothing, not even the marker, and opens no session. A prefix where
    /// no leasehold store was ever created is [`Error::NotFound`].
    pub async fn connect_read_only(
        endpoints: &[String],
        prefix: &str,
        security: &Security,
    ) -> Result<Self> {
        Self::connect_read_only_with_layout(endpoints, prefix, security, Layout::Leasehold).await
    }

    /// [`EtcdStore::connect_read_only`] with a layout
    /// ([`EtcdStore::connect_with_layout`]).
    pub async fn connect_read_only_with_layout(
        endpoints: &[String],
        prefix: &str,
        security: &Security,
        layout: Layout,
    ) -> Result<Self> {
        let store = Self::reach(endpoints, prefix, security, true, layout).await?;
        if layout == Layout::Leasehold {
            store.open_space().await?;
        }
        warn_if_unencrypted(security);
        Ok(store)
    }

    async fn reach(
        endpoints: &[String],
        prefix: &str,
        security: &Security,
        read_only: bool,
        layout: Layout,
    ) -> Result<Self> {
        if endpoints.is_empty() {
            return Err(Error::invalid("etcd endpoints", "none given"));
        }
        if !matches!(layout, Layout::Leasehold | Layout::Concurrency) {
            return Err(Error::invalid(
                "store URL",
                format!("etcd speaks ?layout=leasehold or concurrency, not {layout}"),
            ));
        }
        if let (Some(user), None) = (&security.user, &security.password) {
            // Not silently dropped: etcd would then take the client
            // certificate's common name, or no user at all.
            return Err(Error::invalid(
                "store URL",
                format!(
                    "etcd user {user:?} has no password: give it by LEASEHOLD_STORE_PASSWORD, \
                     ?password_file=PATH or USER:PASSWORD@ (with a client certificate alone, \
                     leave the user out: etcd takes it from the certificate's common name)"
                ),
            ));
        }
        // In etcd's recipe layout `/` alone is the root (elections `/E/`),
        // unlike no prefix at all (elections `E/`).
        let prefix = if layout == Layout::Concurrency && prefix == "/" {
            prefix.to_owned()
        } else {
            prefix.trim_end_matches('/').to_owned()
        };
        Ok(EtcdStore {
            members: Arc::new(Members::new(endpoints, security, &format!("{prefix}/"))?),
            prefix,
            keepers: Default::default(),
            line_reads: Default::default(),
            read_only,
            layout,
            watches: Default::default(),
        })
    }

    /// `{prefix}/`: every key of the store starts with it.
    fn space(&self) -> String {
        format!("{}/", self.prefix)
    }

    fn marker_key(&self) -> String {
        format!("{}{MARKER}", self.space())
    }

    /// The marker keys a store at an enclosing prefix would have.
    fn enclosing_markers(&self) -> Vec<String> {
        self.prefix
            .match_indices('/')
            .filter(|(i, _)| *i > 0)
            .map(|(i, _)| format!("{}/{MARKER}", &self.prefix[..i]))
            .collect()
    }

    /// Reads the marker, the prefix's first key and the markers of
    /// enclosing prefixes, in one transaction.
    ///
    /// With etcd's authentication on, a user may be granted its prefix
    /// only (`readwrite --prefix=true /PREFIX/`), and then reading an
    /// enclosing prefix's marker is `permission denied`. Such a marker is
    /// then taken as absent, and left out of the guards of the marker's
    /// creation: a store inside another is refused to keep leasehold's keys
    /// apart, and a user who cannot read the enclosing prefix cannot read
    /// or write that store's keys either, so its grants keep the two apart
    /// (an operator granted this prefix alone). The markers it may read are
    /// still checked.
    async fn survey(&self) -> Result<Survey> {
        let enclosing = self.enclosing_markers();
        match self.survey_with(&enclosing).await {
            Err(EtcdError::PermissionDenied(_)) if !enclosing.is_empty() => {}
            other => return other.map_err(Error::from),
        }
        let mut survey = self.survey_with(&[]).await?;
        for key in enclosing {
            let read = RangeRequest {
                key: key.clone().into_bytes(),
                ..Default::default()
            };
            match self.range("read the store", read).await {
                Ok(found) => {
                    if survey.enclosing.is_none()
                        && found
                            .kvs
                            .first()
                            .is_some_and(|kv| marker_version(kv).is_ok())
                    {
                        survey.enclosing =
                            key.strip_suffix(&format!("/{MARKER}")).map(str::to_owned);
                    }
                    survey.readable.push(key);
                }
                Err(EtcdError::PermissionDenied(_)) => {
                    tracing::debug!(
                        key,
                        "etcd: no permission to read an enclosing prefix's marker; taken as absent"
                    );
                }
                Err(error) => return Err(error.into()),
            }
        }
        Ok(survey)
    }

    /// The marker, the first key under the prefix and the `enclosing`
    /// markers, read in one transaction.
    async fn survey_with(&self, enclosing: &[String]) -> Result<Survey, EtcdError> {
        let mut reads = vec![
            get(self.marker_key()),
            RequestOp {
                request: Some(pb::request_op::Request::RequestRange(RangeRequest {
                    limit: 1,
                    keys_only: true,
                    ..range_of_prefix(&self.space())
                })),
            },
        ];
        reads.extend(enclosing.iter().map(|key| get(key.clone())));
        let txn = TxnRequest {
            compare: Vec::new(),
            success: reads,
            failure: Vec::new(),
        };
        let read = self.txn("read the store", txn).await?;
        let mut ranges = read.responses.into_iter().map(|r| match r.response {
            Some(pb::response_op::Response::ResponseRange(range)) => range,
            _ => pb::RangeResponse::default(),
        });
        let marker = ranges.next().and_then(|r| r.kvs.into_iter().next());
        let first_key = ranges
            .next()
            .and_then(|r| r.kvs.into_iter().next())
            .map(|kv| kv.key);
        let found = ranges
            .zip(enclosing)
            .find(|(r, _)| r.kvs.first().is_some_and(|kv| marker_version(kv).is_ok()))
            .and_then(|(_, key)| key.strip_suffix(&format!("/{MARKER}")).map(str::to_owned));
        Ok(Survey {
            revision: revision_of(read.header.as_ref()),
            marker,
            first_key,
            enclosing: found,
            readable: enclosing.to_vec(),
        })
    }

    /// Checks that the prefix is a leasehold store this build can use, and
    /// (unless read-only) makes it one if it is empty. Writes nothing
    /// otherwise.
    async fn open_space(&self) -> Result<()> {
        for attempt in 0..ATTEMPTS {
            let survey = if attempt == 0 {
                self.first_survey().await?
            } else {
                self.survey().await?
            };
            if self.is_usable_store(&survey)? {
                return Ok(());
            }
            let guards = self.marking_guards(&survey)?;
            if self.mark_space(guards).await? {
                return Ok(());
            }
            // The prefix changed between the read and the write: read again.
        }
        Err(Error::Unavailable {
            reason: format!(
                "etcd prefix {} kept changing while leasehold checked it",
                self.prefix
            ),
            source: None,
        })
    }

    /// The first request: fails now, with the endpoints named, rather than
    /// at the first campaign.
    async fn first_survey(&self) -> Result<Survey> {
        self.survey().await.map_err(|e| {
            let cause = match e {
                Error::Unavailable { reason, .. } => reason,
                // A refusal or a bad TLS file says why in one line already.
                other @ (Error::Denied(_) | Error::InvalidInput { .. }) => return other,
                other => other.to_string(),
            };
            Error::Unavailable {
                reason: format!(
                    "cannot reach etcd at {}: {cause}",
                    self.members.endpoints().join(",")
                ),
                source: None,
            }
        })
    }

    /// Whether the surveyed prefix is a leasehold store this build can use
    /// (marked); refuses one inside another store or of a newer layout.
    fn is_usable_store(&self, survey: &Survey) -> Result<bool> {
        if let Some(outer) = &survey.enclosing {
            return Err(Error::Corrupt(format!(
                "etcd prefix {} is inside the leasehold store at prefix {outer}; \
                 use a prefix of its own",
                self.prefix
            )));
        }
        let Some(marker) = &survey.marker else {
            return Ok(false);
        };
        let found = marker_version(marker)?;
        if found > LAYOUT_VERSION {
            return Err(Error::IncompatibleSchema {
                found,
                supported: LAYOUT_VERSION,
            });
        }
        Ok(true)
    }

    /// The conditions under which the unmarked, surveyed prefix may be
    /// marked: empty, and no enclosing prefix became a store. A prefix that
    /// holds any key is refused with [`Error::Corrupt`], naming one; an
    /// empty one opened read-only is [`Error::NotFound`].
    fn marking_guards(&self, survey: &Survey) -> Result<Vec<pb::Compare>> {
        if let Some(key) = &survey.first_key {
            return Err(Error::Corrupt(format!(
                "etcd prefix {} holds keys leasehold did not write (such as {}); \
                 use a prefix of its own",
                self.prefix,
                shown(key)
            )));
        }
        if self.read_only {
            return Err(Error::NotFound(format!(
                "at etcd prefix {}: nothing has campaigned there yet",
                self.prefix
            )));
        }
        // No enclosing prefix (that this client may read) became a store
        // meanwhile, and the prefix is still empty.
        let mut guards: Vec<pb::Compare> = survey
            .readable
            .iter()
            .cloned()
            .map(|key| {
                let key = RangeRequest {
                    key: key.into_bytes(),
                    ..Default::default()
                };
                unchanged_since(&key, survey.revision)
            })
            .collect();
        guards.push(no_key_in(&range_of_prefix(&self.space())));
        Ok(guards)
    }

    /// Writes the marker if `guards` hold; `false` if they did not (the
    /// prefix changed).
    async fn mark_space(&self, guards: Vec<pb::Compare>) -> Result<bool> {
        let txn = TxnRequest {
            compare: guards,
            success: vec![put(
                self.marker_key(),
                format!("leasehold {LAYOUT_VERSION}"),
                0,
            )],
            failure: Vec::new(),
        };
        if self.txn("create the store", txn).await?.succeeded {
            tracing::debug!(prefix = %self.prefix, "marked the etcd prefix as leasehold's");
            return Ok(true);
        }
        Ok(false)
    }

    /// `{prefix}/e/{election}/`; slashes in the name are escaped so that no
    /// election's keys fall under another's prefix.
    ///
    /// In etcd's `concurrency` layout: `{prefix}/{election}/`, or
    /// `{election}/` without a prefix, the name taken as it is — the prefix
    /// `concurrency.NewElection` (and `etcdctl elect`) is given.
    fn election_prefix(&self, election: &ElectionName) -> String {
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
    fn candidate_key(&self, election: &ElectionName, session: SessionId) -> String {
        if self.layout == Layout::Concurrency {
            return format!("{}{:x}", self.election_prefix(election), session.0);
        }
        format!("{}{:016x}", self.election_prefix(election), session.0)
    }

    /// The candidate `kv` stands for among the keys under
    /// `election_prefix`, if any: leasehold's own layout skips keys it did
    /// not write; etcd's recipe counts every key.
    fn candidate_in(&self, election_prefix: &str, kv: &KeyValue) -> Option<CandidateId> {
        match self.layout {
            Layout::Concurrency => proposal_of(election_prefix, kv),
            _ => candidate_of(election_prefix, kv),
        }
    }

    /// Refuses what needs state of leasehold's own besides the candidate
    /// keys (notes, the record of releases, the list of elections) in
    /// etcd's `concurrency` layout, where nothing but candidates may live
    /// under an election's prefix.
    fn own_layout(&self, what: &str) -> Result<()> {
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

    fn known_key_prefix(&self) -> String {
        format!("{}/k/", self.prefix)
    }

    fn known_key(&self, election: &ElectionName) -> String {
        format!("{}{}", self.known_key_prefix(), election.as_str())
    }

    async fn range(&self, what: &str, range: RangeRequest) -> Result<pb::RangeResponse, EtcdError> {
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

    async fn txn(&self, what: &str, txn: TxnRequest) -> Result<TxnResponse, EtcdError> {
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
    async fn first_candidate(
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
    async fn predecessor(
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

    async fn to_leader(&self, kv: &KeyValue, candidate: CandidateId) -> Result<Leader> {
        let id = kv.lease;
        if id <= 0 {
            // A key put without a lease (only another program writes one).
            return Ok(Leader {
                candidate,
                token: FencingToken::from_stored(kv.create_revision),
                expires_in: NO_LEASE,
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
        })
    }

    async fn leader_at(&self, election: &ElectionName) -> Result<(Option<Leader>, i64)> {
        let (first, revision) = self.first_candidate(election).await?;
        let leader = match first {
            Some((kv, candidate)) => Some(self.to_leader(&kv, candidate).await?),
            None => None,
        };
        Ok((leader, revision))
    }

    /// Creates `session`'s candidate key in `election`, only if absent, and
    /// for an election new to the store its `k/` key, only if absent: a
    /// key that is there is never overwritten. Both only while the marker
    /// is there. The key's create revision, and whether this call created
    /// it (`false`: the session was a candidate already).
    async fn create_candidate(
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
    async fn create_proposal(
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
    fn why_not_created(
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

    /// Waits for the first change of `key` from `from_revision` on (its
    /// deletion, mostly); returns early if the watch cannot be kept. The
    /// caller reads again either way.
    async fn wait_deleted(&self, key: &str, from_revision: i64) {
        self.next_events_in(key.as_bytes().to_vec(), Vec::new(), from_revision)
            .await;
    }

    /// One keep-alive round trip on the session's stream, (re)opening the
    /// stream on the next endpoint when the last one failed. Each lease
    /// has its own stream and its own lock: the sessions of one handle
    /// renew side by side, not one after another.
    async fn keep_alive_once(&self, session: SessionId, id: i64) -> Result<Duration> {
        let keeper = self.keeper(id);
        let mut keeper = keeper.lock().await;
        let renewed = self.keep_alive_on(&mut keeper, session, id).await;
        if matches!(renewed, Err(Error::SessionExpired(_))) {
            self.forget_keeper(id);
        }
        renewed
    }

    /// The keep-alive stream slot of lease `id`, made empty on first use.
    fn keeper(&self, id: i64) -> KeeperSlot {
        let mut keepers = self
            .keepers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(keepers.entry(id).or_default())
    }

    /// Drops lease `id`'s stream (a renewal in flight keeps its own until
    /// it ends).
    fn forget_keeper(&self, id: i64) {
        self.keepers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id);
    }

    async fn keep_alive_on(
        &self,
        slot: &mut Option<KeepAlive>,
        session: SessionId,
        id: i64,
    ) -> Result<Duration> {
        let mut denied = None;
        for attempt in 0..self.members.len() {
            let keeper = match slot {
                Some(keeper) => keeper,
                None => {
                    let member = self.members.member(attempt);
                    let opened = tokio::time::timeout(ATTEMPT_TIMEOUT, async {
                        let link = self.members.link_of(member).await?;
                        let opened = KeepAlive::open(link.clone(), id, member).await;
                        Ok::<_, EtcdError>((opened, link))
                    })
                    .await;
                    match opened {
                        Ok(Ok((Ok(keeper), _))) => slot.insert(keeper),
                        Ok(Ok((Err(status), _))) if client::lease_not_found(&status) => {
                            return Err(Error::SessionExpired(session));
                        }
                        Ok(Ok((Err(status), link))) => {
                            if status.code() == tonic::Code::Unauthenticated {
                                // The next opening authenticates again.
                                self.members.token_refused(&link);
                            }
                            continue;
                        }
                        Ok(Err(error @ (EtcdError::Denied(_) | EtcdError::Invalid { .. }))) => {
                            denied = Some(error);
                            continue;
                        }
                        Ok(Err(_)) | Err(_) => continue,
                    }
                }
            };
            let member = keeper.member();
            // Not waited for longer on a busy member, as other requests
            // are: a renewal adds nothing for the cluster to agree on, and
            // it must come before the lease's deadline.
            match tokio::time::timeout(ATTEMPT_TIMEOUT, keeper.once()).await {
                Ok(Some(ttl)) if ttl > 0 => {
                    self.members.answered(member);
                    return Ok(Duration::from_secs(ttl.unsigned_abs()));
                }
                Ok(Some(_)) => {
                    *slot = None;
                    return Err(Error::SessionExpired(session));
                }
                Ok(None) | Err(_) => {
                    *slot = None;
                    self.members.silent(member);
                    self.members.skip_active();
                }
            }
        }
        if let Some(error) = denied {
            return Err(error.into());
        }
        Err(Error::Unavailable {
            reason: "etcd keep-alive failed on every endpoint".into(),
            source: None,
        })
    }
}

/// The etcd side of a watch on one election: it wakes on the events of an
/// etcd watch on the election's keys, opened from the revision of the last
/// read so that nothing between the two is missed. A watch that breaks
/// wakes it too (the re-read then tells whether etcd answers). It is
/// opened with `hasleader`, so a member that loses quorum cancels it.
struct EtcdWatch {
    store: EtcdStore,
    election: ElectionName,
    /// The revision to watch from: one past the last read's.
    from: i64,
}

impl Source for EtcdWatch {
    const RETRY: Duration = WATCH_RETRY;

    async fn read(&mut self) -> Result<Option<Leader>> {
        let (leader, revision) = self.store.leader_at(&self.election).await?;
        self.from = revision + 1;
        Ok(leader)
    }

    async fn changed(&mut self) -> Event {
        let prefix = self.store.election_prefix(&self.election);
        self.store.next_events_under(&prefix, self.from).await;
        Event::Changed
    }
}

impl EtcdStore {
    /// Resolves at the first events under `prefix` from revision `from`,
    /// or when the watch breaks (either way, the caller reads again); after
    /// a pause if the watch cannot be opened.
    async fn next_events_under(&self, prefix: &str, from: i64) {
        self.next_events_in(
            prefix.as_bytes().to_vec(),
            prefix_end(prefix.as_bytes()),
            from,
        )
        .await;
    }

    /// Resolves at the first event on `key` (up to `range_end`; an empty
    /// end is `key` alone) from revision `from`, or after a pause if the
    /// watch cannot be opened.
    async fn next_events_in(&self, key: Vec<u8>, range_end: Vec<u8>, from: i64) {
        let woken = self
            .watches
            .next_change(&self.members, key, range_end, from)
            .await;
        if woken == Woken::Broken {
            tokio::time::sleep(WATCH_RETRY).await;
        }
    }
}

/// Once connected: a password without TLS travels in the clear (allowed,
/// for a loopback or otherwise private link, and said once).
fn warn_if_unencrypted(security: &Security) {
    if security.password.is_some() && !security.tls() {
        tracing::warn!(
            "etcd: the password goes to the server unencrypted; add ?cacert=PATH to use TLS"
        );
    }
}

/// Logs a key in an election's candidates that leasehold did not write.
fn warn_foreign(kv: &KeyValue) {
    tracing::warn!(
        key = %String::from_utf8_lossy(&kv.key),
        "etcd: ignoring a key leasehold did not write among an election's candidates"
    );
}

/// Deletes the candidate key created at `revision`, of a campaign that was
/// dropped before it completed, so that a cancelled campaign never comes to
/// hold the election later.
async fn withdraw(store: EtcdStore, key: String, revision: i64) {
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
}

impl EtcdStore {
    /// How often this handle's watch stream left a member that its
    /// requests found silent; for tests and diagnostics.
    #[doc(hidden)]
    pub fn watch_streams_moved(&self) -> u64 {
        self.members.streams_moved()
    }

    /// How many times this store's connections authenticated to etcd
    /// (user and password); for tests and diagnostics.
    #[doc(hidden)]
    pub fn authentications(&self) -> u64 {
        self.members.authentications()
    }

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
        let token = grant.token.to_i64_saturating();
        let txn = TxnRequest {
            compare: vec![created_at(leader_key, token)],
            success: vec![put(key, value, 0)],
            failure: Vec::new(),
        };
        if self.txn("fenced put", txn).await?.succeeded {
            return Ok(());
        }
        match self.first_candidate(&grant.election).await?.0 {
            Some((kv, _)) if kv.create_revision > token => Err(Error::Stale {
                resource: key.to_owned(),
                presented: grant.token,
                highest: FencingToken::from_stored(kv.create_revision),
            }),
            _ => Err(Error::NotHolder {
                election: grant.election.to_string(),
                token: grant.token,
            }),
        }
    }
}

#[async_trait]
impl Store for EtcdStore {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        if self.read_only {
            return Err(Error::invalid(
                "session",
                "the store was opened read-only (EtcdStore::connect_read_only)",
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

    async fn campaign(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Grant> {
        // The key is created in a task of its own, so that a campaign
        // dropped while the creation is on its way still learns whether it
        // landed and withdraws it: a key left there would wait in etcd's
        // order for a campaign nobody runs, and come to hold the election
        // for a session that does not know it (everyone behind it waiting
        // until that session ends).
        let creating = tokio::spawn({
            let (store, election, candidate) = (self.clone(), election.clone(), candidate.clone());
            async move { store.create_candidate(session, &election, &candidate).await }
        });
        let mut pending = OnDrop::new(creating, {
            let (store, key) = (self.clone(), self.candidate_key(election, session));
            move |creating| async move {
                if let Ok(Ok((revision, true))) = creating.await {
                    withdraw(store, key, revision).await;
                }
            }
        });
        let created = pending.get_mut().await;
        pending.disarm();
        let (my_revision, created) =
            created.map_err(|e| Error::unavailable("etcd campaign task failed", e))??;
        let guard = created.then(|| {
            let (store, key) = (self.clone(), self.candidate_key(election, session));
            OnDrop::new((), move |()| withdraw(store, key, my_revision))
        });
        loop {
            let (ahead, revision) = self.predecessor(election, my_revision).await?;
            match ahead {
                // Our key is gone: the lease expired (or was revoked).
                Err(()) => return Err(Error::SessionExpired(session)),
                Ok(Some(predecessor)) => {
                    let predecessor = String::from_utf8_lossy(&predecessor.key).into_owned();
                    self.wait_deleted(&predecessor, revision + 1).await;
                }
                Ok(None) => {
                    // Checked while the guard would still withdraw the key.
                    let token = self.granted_token(election, my_revision)?;
                    if let Some(guard) = guard {
                        guard.disarm();
                    }
                    return Ok(Grant {
                        election: election.clone(),
                        candidate: candidate.clone(),
                        session,
                        token,
                    });
                }
            }
        }
    }

    /// One transaction: `session`'s candidate key is created only if the
    /// election has no key at all (nobody holds it or waits in etcd's
    /// order) and no note (nobody waits in leasehold's line). The
    /// transaction runs as a task of its own, so that a campaign dropped
    /// while it is on its way still learns whether it landed, and
    /// withdraws exactly the key it created.
    async fn try_campaign_unwaited(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Option<Grant>> {
        if self.layout == Layout::Concurrency {
            return Ok(None);
        }
        let lease = session_key(session)?;
        let key = self.candidate_key(election, session);
        let known = self.known_key(election);
        let candidates = range_of_prefix(&self.election_prefix(election));
        let notes = range_of_prefix(&self.notes_prefix(election));
        let txn = unwaited_txn(
            &key,
            &known,
            &self.marker_key(),
            candidate,
            lease,
            [no_key_in(&candidates), no_key_in(&notes)],
        );
        let store = self.clone();
        let attempt = tokio::spawn(async move { store.txn("campaign", txn).await });
        let (store, withdrawn) = (self.clone(), key.clone());
        let mut guard = OnDrop::new(attempt, move |attempt| async move {
            if let Ok(Ok(done)) = attempt.await
                && unwaited_granted(&done)
            {
                withdraw(store, withdrawn, revision_of(done.header.as_ref())).await;
            }
        });
        let done = guard.get_mut().await;
        guard.disarm();
        let done = match done.map_err(|e| Error::unavailable("etcd campaign task failed", e))? {
            Err(error) if error.is_lease_not_found() => {
                return Err(Error::SessionExpired(session));
            }
            other => other?,
        };
        // Not granted: the election is not free, or its `k/` key holds
        // another program's value (the campaign in line says so).
        if !unwaited_granted(&done) {
            return Ok(None);
        }
        Ok(Some(Grant {
            election: election.clone(),
            candidate: candidate.clone(),
            session,
            token: self.granted_token(election, revision_of(done.header.as_ref()))?,
        }))
    }

    async fn resign(&self, grant: &Grant) -> Result<()> {
        let key = self.candidate_key(&grant.election, grant.session);
        let token = grant.token.to_i64_saturating();
        let mut success = vec![delete(key.clone())];
        if self.layout != Layout::Concurrency {
            success.push(self.record_release(&grant.election, token));
        }
        let mut compare = vec![created_at(key.clone(), token)];
        if self.layout == Layout::Concurrency {
            // Another program's put on the key (which keeps its create
            // revision) makes it that program's: it is not deleted.
            compare.push(pb::Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Lease as i32,
                key: key.into_bytes(),
                target_union: Some(TargetUnion::Lease(session_key(grant.session)?)),
                range_end: Vec::new(),
            });
        }
        let txn = TxnRequest {
            compare,
            success,
            failure: Vec::new(),
        };
        if !self.txn("resign", txn).await?.succeeded {
            return Err(Error::NotHolder {
                election: grant.election.to_string(),
                token: grant.token,
            });
        }
        Ok(())
    }

    async fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        self.own_layout("a note")?;
        self.put_note_in(session, election, name, text).await
    }

    async fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        self.own_layout("a note")?;
        self.delete_note_in(session, election, name).await
    }

    async fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        self.own_layout("a note")?;
        self.amend_note_in(session, election, name, text).await
    }

    async fn watch_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<NoteWatch> {
        self.own_layout("a note")?;
        self.watch_notes_of(election, Some((session, name))).await
    }

    async fn notes(&self, election: &ElectionName) -> Result<Vec<Note>> {
        self.own_layout("the line of standbys")?;
        Ok(self.notes_at(election, None).await?.0)
    }

    async fn watch_notes(&self, election: &ElectionName) -> Result<NoteWatch> {
        self.own_layout("the line of standbys")?;
        self.watch_notes_of(election, None).await
    }

    async fn watch_notes_since_unwaited(&self, grant: &Grant) -> Result<NoteWatch> {
        self.own_layout("the line of standbys")?;
        Ok(self.watch_notes_since(grant))
    }

    async fn last_release(&self, election: &ElectionName) -> Result<Option<FencingToken>> {
        self.own_layout("the record of releases")?;
        self.last_release_in(election).await
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        Ok(self.leader_at(election).await?.0)
    }

    async fn watch(&self, election: &ElectionName) -> Result<LeaderWatch> {
        self.watch_held(election, None).await
    }

    async fn watch_status(&self, election: &ElectionName) -> Result<StatusWatch> {
        self.watch_held(election, None).await
    }

    async fn watch_grant(&self, grant: &Grant) -> Result<LeaderWatch> {
        // The grant's token is the revision that made it: watching from
        // just after it misses nothing, and needs no read (nor a lookup of
        // the lease's time to live, which a holder's watch never uses).
        let source = EtcdWatch {
            store: self.clone(),
            election: grant.election.clone(),
            from: grant.token.to_i64_saturating().saturating_add(1),
        };
        Ok(leader_watch::start_held(source, grant))
    }

    async fn elections(&self) -> Result<Vec<ElectionState>> {
        self.own_layout("listing elections")?;
        let prefix = self.known_key_prefix();
        let known = self.range("get", range_of_prefix(&prefix)).await?;
        let mut states = Vec::new();
        for kv in &known.kvs {
            // leasehold writes these keys empty and without a lease.
            let election = kv
                .key
                .strip_prefix(prefix.as_bytes())
                .and_then(|name| std::str::from_utf8(name).ok())
                .and_then(|name| ElectionName::new(name).ok())
                .filter(|_| kv.value.is_empty() && kv.lease == 0);
            let Some(election) = election else {
                tracing::warn!(key = %String::from_utf8_lossy(&kv.key),
                    "etcd: ignoring a key leasehold did not write among the elections");
                continue;
            };
            let leader = self.leader(&election).await?;
            states.push(ElectionState { election, leader });
        }
        Ok(states)
    }
}

impl EtcdStore {
    /// A watch of `election`; with `held`, for the holder of that grant
    /// (see [`leader_watch::start`]).
    async fn watch_held<V: crate::store::watch_driver::Initial>(
        &self,
        election: &ElectionName,
        held: Option<FencingToken>,
    ) -> Result<crate::watch::Receiver<V>> {
        let source = EtcdWatch {
            store: self.clone(),
            election: election.clone(),
            from: 0,
        };
        leader_watch::start(source, election, held).await
    }

    /// The token of a grant of `election` whose key etcd created at
    /// `revision`: that revision, which etcd numbers from 1 up;
    /// [`Error::Corrupt`] for any other value, which is no token and must
    /// not be granted as one.
    fn granted_token(&self, election: &ElectionName, revision: i64) -> Result<FencingToken> {
        FencingToken::issued(revision).ok_or_else(|| {
            Error::not_a_token(
                &format_args!("etcd prefix {}", self.prefix),
                election.as_str(),
                revision,
            )
        })
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
fn unwaited_txn(
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

fn nested(txn: TxnRequest) -> RequestOp {
    RequestOp {
        request: Some(pb::request_op::Request::RequestTxn(txn)),
    }
}

/// Whether [`unwaited_txn`] put the candidate key: the election was free,
/// and its `known` key was created or found empty.
fn unwaited_granted(done: &TxnResponse) -> bool {
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
enum NotCreated {
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
fn candidate_txn(
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

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use leasehold_testkit::EtcdCluster;

    /// A renewal that hangs (its member stopped answering, say) must not
    /// hold up the renewals of the handle's other sessions: with a thousand
    /// sessions on one handle, renewals one after another came later than
    /// their leases allowed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewal_in_flight_does_not_hold_up_another_sessions() {
        let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(1))
            .await
            .expect("start etcd");
        let store = EtcdStore::connect(&cluster.endpoints(), "/renewals", &Security::none())
            .await
            .expect("connect");
        let ttl = Duration::from_secs(10);
        let stuck = store.open_session(ttl).await.expect("session");
        let other = store.open_session(ttl).await.expect("session");
        store.keep_alive(stuck.id).await.expect("renew");
        // As if the stuck session's round trip were still on its way.
        let slot = store.keeper(session_key(stuck.id).expect("id"));
        let _in_flight = slot.lock().await;
        let renewed = tokio::time::timeout(Duration::from_secs(60), store.keep_alive(other.id))
            .await
            .expect("the other session's renewal waited for the stuck one");
        assert_eq!(renewed.expect("renew"), ttl);
    }
}
