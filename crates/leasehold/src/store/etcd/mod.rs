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
//! ([`EtcdStore::open`] with [`Access::ReadOnly`]) writes nothing, not even the marker.
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
use crate::store::{Access, ClusterUrl};
use crate::store::{
    ElectionState, FencingToken, Grant, Leader, LeaderWatch, Note, NoteWatch, SessionId,
    SessionLease, StatusWatch, Store, session_key,
};

mod campaign;
use campaign::{unwaited_granted, unwaited_txn};
mod client;
mod connect;
mod elections;
mod keys;
mod notes;
mod primitive;
mod space;
mod watch_hub;

pub use client::ATTEMPT_TIMEOUT;
use client::{EtcdError, KeepAlive, Members, prefix_end};
pub use primitive::EtcdKeys;
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
    /// Opened for [`Access::ReadOnly`]: opens no session.
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
    ///
    /// [`EtcdStore::open`] with [`Access::ReadWrite`] and leasehold's
    /// layout, for a cluster given by its parts.
    pub async fn connect(endpoints: &[String], prefix: &str, security: &Security) -> Result<Self> {
        Self::start(
            endpoints,
            prefix,
            security,
            Access::ReadWrite,
            Layout::Leasehold,
        )
        .await
    }

    /// Connects to the cluster `url` names for `access`, with its layout:
    /// [`Layout::Concurrency`] speaks etcd's `concurrency.Election` below
    /// the prefix (which may then be empty). [`Access::ReadOnly`] writes
    /// nothing, not even the marker, and opens no session; a prefix where
    /// no leasehold store was ever created is then [`Error::NotFound`].
    /// [`Access::ReleaseOnly`] opens as [`Access::ReadWrite`] does.
    pub async fn open(url: &ClusterUrl, access: Access) -> Result<Self> {
        let (endpoints, security) = (url.endpoints(), url.security());
        Self::start(endpoints, url.path(), security, access, url.layout()).await
    }

    async fn start(
        endpoints: &[String],
        prefix: &str,
        security: &Security,
        access: Access,
        layout: Layout,
    ) -> Result<Self> {
        let read_only = access == Access::ReadOnly;
        let store = Self::reach(endpoints, prefix, security, read_only, layout).await?;
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
}

impl EtcdStore {
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
/// hold the election later. Tried again while etcd is out of reach: the
/// session (and so the key) may live on with its elector, and a key left
/// there would come to hold the election for a campaign nobody runs, with
/// every other candidate waiting behind it.
async fn withdraw(store: EtcdStore, key: String, revision: i64) {
    crate::store::cleanup::until_done("withdraw a cancelled campaign", || {
        let (store, key) = (store.clone(), key.clone());
        async move {
            let txn = TxnRequest {
                compare: vec![created_at(key.clone(), revision)],
                success: vec![delete(key)],
                failure: Vec::new(),
            };
            store.txn("withdraw", txn).await?;
            Ok(())
        }
    })
    .await;
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
