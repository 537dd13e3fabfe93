//! `etcd://host:port[,host:port…][/prefix]` — the etcd v3 store, for
//! elections across hosts: the store primitive ([`EtcdKeys`]) on etcd's
//! own operations, under the elections written once above it
//! ([`EtcdStore`] is [`KeyedStore`] over it).
//!
//! - A session is an etcd lease; its keep-alives renew every election the
//!   process takes part in.
//! - A key is `{prefix}/{key}`, a candidate's `{prefix}/{election}:c:{lease
//!   id}` created in one transaction (only if absent) with the lease
//!   attached. The lowest create revision leads; its create revision is
//!   the fencing token (etcd revisions only grow, across restarts too).
//! - Followers learn of releases and expiries from watches (etcd deletes a
//!   lease's keys when it expires), never from polling; a watch that breaks
//!   or falls behind a compaction starts over from a fresh read.
//! - Member outages: the store keeps one connection per endpoint and pins
//!   the one that last answered; a request that fails or does not answer
//!   within [`ATTEMPT_TIMEOUT`] is retried on the next endpoint.
//! - The gRPC code is generated from `proto/etcd.proto` (the subset of
//!   etcd's API that leasehold uses) and checked in, so building needs no
//!   protobuf compiler.
//!
//! What is leasehold's: the keys under `{prefix}/` once the marker key
//! `{prefix}/leasehold` (value `leasehold 1`, the layout version) is there.
//! The first writer creates the marker in a transaction that requires the
//! prefix to hold no key at all, and no enclosing prefix to hold a store,
//! so a prefix that holds other programs' keys is refused before anything
//! is written. Every transaction that puts a key requires the marker, so
//! nothing is written once leasehold's keys were deleted. Keys it did not
//! write that appear later among an election's candidates are never taken
//! for candidates (a candidate key names the lease attached to it). A
//! store opened read-only ([`EtcdStore::open`] with [`Access::ReadOnly`])
//! writes nothing, not even the marker.
//!
//! `?layout=concurrency` ([`Layout::Concurrency`]) lays elections out as
//! etcd's own `concurrency.Election` does, so that its clients (Go services,
//! `etcdctl elect`) and leasehold's contend in one election:
//! - Election `E` is the key prefix `{prefix}/E/` (`E/` without a prefix,
//!   `/E/` with the prefix `/`), the name taken as it is. A candidate is
//!   `E/{lease id in lower-case hex, unpadded}` with the lease attached and
//!   the candidate id as its value (the recipe's proposal), created only
//!   if absent.
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

use tokio::sync::Mutex;

use crate::config::StoreTtl;
use crate::error::{Error, Result};
use crate::store::keyed::KeyedStore;
use crate::store::layout::Layout;
use crate::store::security::Security;
use crate::store::{Access, ClusterUrl};
use crate::store::{Grant, SessionId, Store};

mod client;
mod connect;
mod keep_alive;
mod keys;
mod primitive;
mod space;
mod watch_hub;

pub use client::ATTEMPT_TIMEOUT;
use client::{EtcdError, Members, prefix_end};
use keep_alive::KeepAlive;
use watch_hub::WatchHub;

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
use pb::{KeyValue, RangeRequest, RequestOp, TxnRequest, TxnResponse};

/// The store of `etcd://` URLs: elections over the primitive on etcd.
pub type EtcdStore = KeyedStore<EtcdKeys>;

/// How etcd keeps a TTL: a lease has whole seconds (a request is rounded
/// up, never down), at most etcd's `MaxLeaseTTL`.
const TTL: StoreTtl = StoreTtl {
    store: "etcd",
    unit: Duration::from_secs(1),
    max: Duration::from_secs(9_000_000_000),
};

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

/// The store primitive on an etcd cluster's connections, under a prefix.
/// Cloning shares the connections.
#[derive(Clone)]
pub struct EtcdKeys {
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
    /// In etcd's recipe layout, the elections' prefixes found to be no
    /// leasehold store's, nor inside one.
    outside_stores: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl std::fmt::Debug for EtcdKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdKeys")
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

impl KeyedStore<EtcdKeys> {
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
        let (access, layout) = (Access::ReadWrite, Layout::Leasehold);
        let keys = EtcdKeys::start(endpoints, prefix, security, access, layout).await?;
        Ok(KeyedStore::over(keys))
    }

    /// Connects to the cluster `url` names for `access`, with its layout:
    /// [`Layout::Concurrency`] speaks etcd's `concurrency.Election` below
    /// the prefix (which may then be empty). [`Access::ReadOnly`] writes
    /// nothing, not even the marker, and opens no session; a prefix where
    /// no leasehold store was ever created is then [`Error::NotFound`].
    /// [`Access::ReleaseOnly`] opens as [`Access::ReadWrite`] does.
    pub async fn open(url: &ClusterUrl, access: Access) -> Result<Self> {
        let keys = EtcdKeys::open(url, access).await?;
        let layout = keys.layout;
        Ok(KeyedStore::with_layout(keys, layout))
    }

    /// Writes `value` at `key` (a key of etcd's, outside the store's
    /// space) only while `grant` still leads its election: one transaction
    /// that requires the leader key to carry the grant's create revision
    /// (its token). Once leadership has moved, the write cannot land:
    /// [`Error::Stale`] names the successor's token, or
    /// [`Error::NotHolder`] if nobody holds the election. (The public way
    /// in is [`crate::fence::etcd::EtcdFence`].)
    pub(crate) async fn put_fenced(
        &self,
        grant: &Grant,
        key: &str,
        value: impl Into<Vec<u8>>,
    ) -> Result<()> {
        let keys = self.keys();
        let candidates = keys.full(&self.candidates_prefix(&grant.election));
        let inside = keys.layout == Layout::Leasehold && key.starts_with(&keys.space());
        if inside || key.as_bytes().starts_with(&candidates) {
            return Err(Error::invalid(
                "fenced key",
                format!(
                    "{key:?} is inside the store's own keys, where a key of anyone else's \
                     would be taken for leasehold's (a candidate, or a foreign key that \
                     makes the store refuse to open); write outside {:?}",
                    if inside {
                        keys.space()
                    } else {
                        String::from_utf8_lossy(&candidates).into_owned()
                    }
                ),
            ));
        }
        let leader_key = keys.full(&self.candidate_key(&grant.election, grant.session));
        let token = grant.token.to_i64_saturating();
        let txn = TxnRequest {
            compare: vec![created_at(leader_key, token)],
            success: vec![put(key, value, 0)],
            failure: Vec::new(),
        };
        if keys.txn("fenced put", txn).await?.succeeded {
            return Ok(());
        }
        match self.leader(&grant.election).await? {
            Some(leader) if leader.token > grant.token => Err(Error::Stale {
                resource: key.to_owned(),
                presented: grant.token,
                highest: leader.token,
            }),
            _ => Err(Error::NotHolder {
                election: grant.election.to_string(),
                token: grant.token,
            }),
        }
    }

    /// How often this handle's watch stream left a member that its
    /// requests found silent; for tests and diagnostics.
    #[doc(hidden)]
    pub fn watch_streams_moved(&self) -> u64 {
        self.keys().members.streams_moved()
    }

    /// How many times this store's connections authenticated to etcd
    /// (user and password); for tests and diagnostics.
    #[doc(hidden)]
    pub fn authentications(&self) -> u64 {
        self.keys().members.authentications()
    }
}

impl EtcdKeys {
    /// Connects to the cluster `url` names for `access`, with its layout
    /// (see [`EtcdStore::open`]).
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
        } else {
            store.refuse_a_store_prefix().await?;
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
        Ok(EtcdKeys {
            members: Arc::new(Members::new(endpoints, security, &format!("{prefix}/"))?),
            prefix,
            keepers: Default::default(),
            read_only,
            layout,
            watches: Default::default(),
            outside_stores: Default::default(),
        })
    }

    /// What every key of the store starts with: `{prefix}/`; in etcd's
    /// recipe layout the prefix as the recipe is given it (nothing without
    /// a prefix, `/` for the root).
    fn space(&self) -> String {
        match self.layout {
            Layout::Concurrency if self.prefix.is_empty() => String::new(),
            Layout::Concurrency => format!("{}/", self.prefix.trim_end_matches('/')),
            _ => format!("{}/", self.prefix),
        }
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

impl EtcdKeys {
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

    /// Opens lease `id`'s keep-alive stream on the member for `attempt`.
    async fn open_keeper(&self, attempt: usize, id: i64) -> Opened {
        let member = self.members.member(attempt);
        let opened = tokio::time::timeout(ATTEMPT_TIMEOUT, async {
            let link = self.members.link_of(member).await?;
            let opened = KeepAlive::open(link.clone(), id, member).await;
            Ok::<_, EtcdError>((opened, link))
        })
        .await;
        match opened {
            Ok(Ok((Ok(keeper), _))) => Opened::Stream(Box::new(keeper)),
            Ok(Ok((Err(status), _))) if client::lease_not_found(&status) => Opened::LeaseGone,
            Ok(Ok((Err(status), link))) => {
                if status.code() == tonic::Code::Unauthenticated {
                    // The next opening authenticates again.
                    self.members.token_refused(&link);
                }
                Opened::Failed
            }
            Ok(Err(error @ (EtcdError::Denied(_) | EtcdError::Invalid { .. }))) => {
                Opened::Denied(error)
            }
            Ok(Err(_)) | Err(_) => Opened::Failed,
        }
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
                None => match self.open_keeper(attempt, id).await {
                    Opened::Stream(keeper) => slot.insert(*keeper),
                    Opened::LeaseGone => return Err(Error::SessionExpired(session)),
                    Opened::Denied(error) => {
                        denied = Some(error);
                        continue;
                    }
                    Opened::Failed => continue,
                },
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

/// What opening a keep-alive stream on a member came to
/// ([`EtcdKeys::open_keeper`]).
enum Opened {
    Stream(Box<KeepAlive>),
    /// The lease is gone: the session has expired.
    LeaseGone,
    /// The member refused this client (its permissions, its
    /// credentials).
    Denied(EtcdError),
    /// No answer, or another error: the next member is tried.
    Failed,
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
        let slot = store
            .keys()
            .keeper(crate::store::session_key(stuck.id).expect("id"));
        let _in_flight = slot.lock().await;
        let renewed = tokio::time::timeout(Duration::from_secs(60), store.keep_alive(other.id))
            .await
            .expect("the other session's renewal waited for the stuck one");
        assert_eq!(renewed.expect("renew"), ttl);
    }
}
