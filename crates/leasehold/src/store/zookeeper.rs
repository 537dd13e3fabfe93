//! The ZooKeeper store: `zk://host:port[,host:port…][/chroot]`, in
//! leasehold's own layout of nodes (described first), or in the layout of
//! another client's election recipe (`?layout=curator|kazoo`, below).
//!
//! - A leasehold session is a ZooKeeper session: its TTL is the session
//!   timeout the server negotiated (ZooKeeper clamps the request between
//!   its `minSessionTimeout` and `maxSessionTimeout`, by default 2 and 20
//!   ticks), and the server expires it by its own clock. A renewal is one
//!   request on the session, which the server counts as activity.
//! - The ZooKeeper client pings the server by itself, which would keep a
//!   session alive after its holder stopped renewing. So the store ends a
//!   session (closing it, which deletes its nodes) when no renewal has
//!   succeeded for a TTL: a session lives as long as it is renewed, as on
//!   every other store. If the process dies or is cut off, the server
//!   expires the session after the negotiated timeout.
//! - A candidate is an ephemeral sequential node
//!   `{chroot}/elections/{election}/c-{session}-{sequence}` holding
//!   `{ttl_ms} {candidate}`; the lowest sequence leads and its `czxid` (the
//!   ensemble-wide transaction id that created it; its high half is the
//!   leader epoch, so it grows across restarts) is the fencing token. Each
//!   waiter watches only its predecessor. `/` in an election name is stored
//!   as `:`.
//! - A session the client reports expired or closed ends leadership at once
//!   ([`Store::session_ended`]).
//!
//! What is leasehold's: the root node once its data is the marker
//! `leasehold 1` (the layout version), and the nodes under it. The first
//! use creates the root with the marker and `{root}/elections` in one
//! transaction (parents of the root that are missing are created empty). A
//! root that exists without the marker is another program's, refused
//! before anything is written. Roots inside another leasehold store, and
//! ZooKeeper's own `/zookeeper`, are refused. Within the space, a candidate is a node named
//! `c-{session}-{sequence}` that is ephemeral to that very session; other
//! nodes among an election's candidates are skipped, with a warning. A
//! store opened read-only ([`ZkStore::connect_read_only`]) writes nothing.
//!
//! Another recipe's layout (`zk://…[/PATH]?layout=curator|kazoo`): the
//! store's candidates then stand in the same line as that recipe's own
//! clients, with nodes named, ordered and watched as theirs are, so that
//! leasehold replicas and, say, Java services on Curator elect one leader
//! between them. Election `E` is the node `{PATH}/{E}` (`/{E}` without a
//! path; a `/` in `E` nests it deeper), shared with the other clients:
//! leasehold writes no marker there, makes no root of its own and checks
//! none.
//! - `curator` is Apache Curator's `LeaderLatch` (as in Curator 5.4). A
//!   candidate is an ephemeral sequential node `_c_{uuid}-latch-{sequence}`
//!   (Curator's protected name, the UUID random and its creator's), whose
//!   data is the candidate id in UTF-8 (Curator's participant id). Every
//!   child of the election's node stands in line (Curator skips none),
//!   sorted by the text after the last `latch-` in its name, or by its
//!   whole name if it has none: another program's node there can lead, or
//!   hold everyone behind it, exactly as it does for Curator. Missing nodes
//!   of the path are made as containers (the server deletes them once they
//!   are empty again), as Curator makes them.
//! - `kazoo` is kazoo's `Election`, that is its `Lock` (as in kazoo 2.8). A
//!   candidate is an ephemeral sequential node `{uuid hex}__lock__{sequence}`
//!   whose data is the candidate id (kazoo's identifier). Only the nodes
//!   whose name ends in `__lock__` and a ten-digit sequence stand in line,
//!   by that sequence; any other node (a read lock's `__rlock__`, another
//!   recipe's) is no contender and holds nobody, as in kazoo. Missing nodes
//!   of the path are made persistent, as kazoo's `ensure_path` makes them.
//! - In both, the first in line leads and each waiter watches only the
//!   node just ahead of it. The token is the leader's node's `czxid`:
//!   ZooKeeper hands out sequences under a node in the order of the
//!   transactions, so tokens grow from one leader to the next among nodes
//!   the recipes name (a node another program names out of that order,
//!   which only Curator's line admits, could lead with a lower one). The
//!   leader shown is its node's data as text (invalid UTF-8 and control
//!   characters replaced, cut to [`crate::MAX_NAME_LEN`] bytes, `(empty id)`
//!   when empty). Its `expires_in` is the TTL of this store's session when
//!   the node is ephemeral to one; otherwise ZooKeeper does not tell another
//!   client's session timeout, and the session timeout the store's own
//!   client negotiated stands for it, an estimate.
//! - A session's node name (its UUID) is made at its first campaign in an
//!   election and kept for the session's life: a campaign again after a
//!   lost reply finds the node the server made, as the recipes' own retries
//!   do, rather than add a second. A dropped campaign deletes its node. A
//!   resign, and the release of a dead holder's grant, delete only the node
//!   that is ephemeral to the grant's session and whose `czxid` is the
//!   grant's token: leasehold never changes or deletes a node it did not
//!   create.
//! - The recipe's order is the only line: nothing else is kept there, so
//!   notes (and what needs them: priorities, lock-delay, transfers, groups
//!   of shards or slots), the record of releases and the list of elections
//!   are [`Error::Unsupported`]; the elector then campaigns directly.
//! - With credentials, the nodes leasehold makes there get the ACL below
//!   too: the other clients must then use the same ZooKeeper user to join
//!   an election whose node leasehold made.
//!
//! Authentication and ACLs (`zk://USER[:PASSWORD]@…`):
//! - Every client the store opens (its reader, each session's, the one
//!   that releases a dead holder's grant) adds the digest `USER:PASSWORD`
//!   at connect, the password read anew (from its file, if it comes from
//!   one) at each connection. A user without a password is bad input.
//! - With credentials, every node leasehold creates (the root's missing
//!   parents, the root with its marker, `elections`, election nodes,
//!   candidates) gets the ACL `auth` ALL (only the creating identity may
//!   write, create, delete or change the ACL) plus `world:anyone` READ,
//!   so that `status`, `list` and `observe` read without credentials (see
//!   `GUARDED` in this module's source for why). ZooKeeper checks CREATE and DELETE against the
//!   parent, so another identity can neither add a candidate nor delete a
//!   leader's node: every replica of one store must use the same
//!   ZooKeeper user and password. Without credentials, nodes are open to
//!   anyone (ZooKeeper's default), who can then delete a leader's node.
//! - Stock ZooKeeper accepts any digest: a wrong password is another
//!   identity, refused ([`Error::Denied`]) on the first write, which every
//!   opening for writing makes (the `elections` node's create); the node's
//!   ACL then tells whether it names the same user (a wrong password) or
//!   another. A store opened read-only cannot tell.
//! - A root made by a run without credentials still works with
//!   credentials, with a warning at each opening
//!   that its nodes are open: leasehold never changes the ACL of a node it
//!   did not create so. To protect such a store, stop its replicas and
//!   delete the root (or choose a new one) so an authenticated run creates
//!   it again.

mod notes;
mod recipes;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::watch;
use async_trait::async_trait;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{
    Acl, Acls, AddWatchMode, Client, CreateMode, CreateOptions, EventType, Permission, SessionState,
};

use crate::config::StoreTtl;
use crate::error::{Error, Result};
use crate::names::{CandidateId, ElectionName};
use crate::store::cleanup::OnDrop;
use crate::store::layout::Layout;
use crate::store::security::Security;
use crate::store::watch_driver::{self as leader_watch, Event, Source};
use crate::store::{
    ElectionState, FencingToken, Grant, Leader, LeaderWatch, Note, NoteWatch, SessionId,
    SessionLease, StatusWatch, Store,
};
use recipes::Recipe;

/// How ZooKeeper keeps a TTL: the session timeout, an `int` of
/// milliseconds, which the server then negotiates into its own
/// `minSessionTimeout`..`maxSessionTimeout` (the session's TTL is the
/// negotiated one).
const TTL: StoreTtl = StoreTtl {
    store: "ZooKeeper",
    unit: Duration::from_millis(1),
    max: Duration::from_millis(i32::MAX as u64),
};

/// How long to wait for a connection to the ensemble.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Session timeout of the store's own client, used for reads and watches.
const READER_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause before a watch reconnects after its session ended.
const WATCH_RETRY: Duration = Duration::from_millis(250);
/// Candidate node names start with this.
const CANDIDATE: &str = "c-";
/// The layout of leasehold's nodes that this build writes and understands,
/// recorded in the root node's data.
pub const LAYOUT_VERSION: i64 = 1;
/// How often opening re-reads a root that changed between its read and its
/// write before giving up.
const ATTEMPTS: usize = 5;

/// An election store in a ZooKeeper ensemble.
#[derive(Debug, Clone)]
pub struct ZkStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// `host:port,host:port` as the client takes it.
    cluster: String,
    /// Where leasehold's nodes live, e.g. `/leasehold`.
    root: String,
    /// Opened by [`ZkStore::connect_read_only`]: writes nothing and opens
    /// no session.
    read_only: bool,
    /// The recipe whose layout the elections follow (`?layout=`), or
    /// `None` for leasehold's own.
    recipe: Option<Recipe>,
    /// The credentials every client adds at connect (the password is read
    /// anew each time).
    security: Security,
    /// The digest user, if any (for messages).
    user: Option<String>,
    /// The ACL of every node the store creates ([`node_acls`]).
    acls: Acls<'static>,
    reader: tokio::sync::Mutex<Option<Client>>,
    sessions: Mutex<HashMap<SessionId, Arc<ZkSession>>>,
}

#[derive(Debug)]
struct ZkSession {
    id: SessionId,
    /// The digest user the session's client authenticated as, if any.
    user: Option<String>,
    /// `None` once the session is being closed: dropping the last client
    /// closes the ZooKeeper session.
    client: Mutex<Option<Client>>,
    ttl: Duration,
    /// When the last successful renewal was sent; the session is closed a
    /// TTL after it.
    renewed: watch::Sender<Instant>,
    /// Cancelled when the session ended, whatever the cause.
    ended: CancellationToken,
    /// Elections this session was granted (and has not resigned).
    held: Mutex<HashSet<ElectionName>>,
    /// In a recipe's layout, the prefix of this session's candidate node
    /// in each election it campaigned in, and its latest campaign there.
    recipe_campaigns: Mutex<recipes::RecipeCampaigns>,
}

impl ZkSession {
    fn client(&self) -> Option<Client> {
        if self.ended.is_cancelled() {
            return None;
        }
        self.client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// `fut`'s output, or [`Error::SessionExpired`] if the session ends
    /// first (`fut` is then dropped).
    async fn unless_ended<T>(&self, fut: impl Future<Output = T>) -> Result<T> {
        tokio::select! {
            biased;
            () = self.ended.cancelled() => Err(Error::SessionExpired(self.id)),
            out = fut => Ok(out),
        }
    }

    /// ZooKeeper's answer to the request `what` (see [`request`]), unless
    /// the session ends first.
    async fn ask<T>(
        &self,
        what: &str,
        fut: impl Future<Output = std::result::Result<T, zookeeper_client::Error>>,
    ) -> Result<std::result::Result<T, zookeeper_client::Error>> {
        self.unless_ended(request(what, fut)).await?
    }

    /// The error for the request `what` on the node `path` that ZooKeeper
    /// refused with `error`.
    fn refused(&self, what: &str, path: &str, error: zookeeper_client::Error) -> Error {
        match error {
            zookeeper_client::Error::SessionExpired => Error::SessionExpired(self.id),
            error => failed(self.user.as_deref(), what, path, error),
        }
    }

    /// Ends the session: every campaign on it stops and drops its client,
    /// and the last client dropped closes the ZooKeeper session.
    fn end(&self) -> Option<Client> {
        self.ended.cancel();
        self.client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

fn unavailable(what: &str, error: zookeeper_client::Error) -> Error {
    Error::Unavailable {
        reason: format!("zookeeper {what}: {}", crate::error::with_causes(&error)),
        source: Some(Box::new(error)),
    }
}

/// Runs one request with [`REQUEST_TIMEOUT`].
async fn request<T, E>(
    what: &str,
    fut: impl Future<Output = std::result::Result<T, E>>,
) -> Result<std::result::Result<T, E>> {
    tokio::time::timeout(REQUEST_TIMEOUT, fut)
        .await
        .map_err(|_| Error::no_answer(&format!("zookeeper {what}"), REQUEST_TIMEOUT))
}

/// The error for the request `what` on the node `path` that ZooKeeper
/// refused with `error`, the store's clients authenticating as `user`:
/// [`Error::Denied`] for a refused authentication or permission, one line
/// that never holds a password; [`unavailable`] otherwise.
///
/// Stock ZooKeeper accepts any digest `user:password` (the digest is only
/// the identity the connection then has), so a wrong password shows up as
/// a permission refused on nodes the right identity created, never as a
/// failed authentication; which of the two it is, only the node's ACL can
/// tell ([`Inner::explain_denial`]).
fn failed(user: Option<&str>, what: &str, path: &str, error: zookeeper_client::Error) -> Error {
    match (error, user) {
        (zookeeper_client::Error::NoAuth, Some(user)) => Error::Denied(format!(
            "permission denied on zookeeper node {path} to user {user:?} ({what}): \
             wrong password, or another user created it"
        )),
        (zookeeper_client::Error::NoAuth, None) => Error::Denied(format!(
            "permission denied on zookeeper node {path} ({what}): its ACL admits only \
             the user that created it, and the store URL names no user (zk://USER@…)"
        )),
        (zookeeper_client::Error::AuthFailed, user) => auth_failed(user),
        (error, _) => unavailable(what, error),
    }
}

/// ZooKeeper refused the authentication (an authentication provider other
/// than stock ZooKeeper's digest one, or `zookeeper.enforce.auth.enabled`).
fn auth_failed(user: Option<&str>) -> Error {
    Error::Denied(match user {
        Some(user) => format!("authentication failed for zookeeper user {user:?}"),
        None => "zookeeper requires authentication and the store URL names no user \
                 (zk://USER@…)"
            .to_owned(),
    })
}

/// The ACL of every node leasehold creates when it has credentials: the
/// creating identity (ZooKeeper's `auth` scheme: the digest
/// `user:password` the connection added) may do everything, and anyone may
/// read.
///
/// World-readable on purpose: observers (`status`, `list`, `observe`) and
/// monitoring read the leader without being given the store's password,
/// as with Curator's leader-latch nodes, whose default ACL is open. What
/// they can read is the candidate ids, TTLs and the layout marker — no
/// secret (a candidate id names a replica, as its logs and `status` do;
/// one who wants it private gives ids that reveal nothing, such as a
/// random one). What they cannot do is
/// what would depose a leader or forge one: create, change or delete any
/// node (ZooKeeper checks DELETE and CREATE on the parent, which is
/// leasehold's too), or change an ACL.
static GUARDED: [Acl; 2] = [
    Acl::new_const(Permission::ALL, "auth", ""),
    Acl::new_const(Permission::READ, "world", "anyone"),
];

/// The ACL of the nodes leasehold creates: [`GUARDED`] with credentials;
/// open to anyone without (as ZooKeeper's default: any client can then
/// delete a leader's node and depose it).
fn node_acls(authenticated: bool) -> Acls<'static> {
    if authenticated {
        Acls::new(&GUARDED)
    } else {
        Acls::anyone_all()
    }
}

fn encode(election: &ElectionName) -> String {
    election.as_str().replace('/', ":")
}

fn decode(node: &str) -> Option<ElectionName> {
    ElectionName::new(node.replace(':', "/")).ok()
}

/// A candidate node: its sequence, name, and the session its name says
/// it is ephemeral to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    sequence: i64,
    name: String,
    owner: u64,
}

/// The nodes among `children` named as candidates
/// (`c-{16 hex digits}-{sequence}`), lowest sequence first.
fn queue(children: Vec<String>) -> Vec<Candidate> {
    let mut queue: Vec<Candidate> = children
        .into_iter()
        .filter_map(|name| {
            let (owner, sequence) = name.strip_prefix(CANDIDATE)?.split_once('-')?;
            if owner.len() != 16 || !owner.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            let owner = u64::from_str_radix(owner, 16).ok()?;
            let sequence = sequence.parse().ok()?;
            Some(Candidate {
                sequence,
                name,
                owner,
            })
        })
        .collect();
    queue.sort();
    queue
}

/// Whether a candidate node's `stat` shows it ephemeral to the session its
/// name gives: leasehold created it; another program's node named like one
/// is skipped.
fn owned(candidate: &Candidate, stat: &zookeeper_client::Stat) -> bool {
    SessionId::from_bits(stat.ephemeral_owner).0 == candidate.owner
}

fn warn_foreign(path: &str) {
    tracing::warn!(
        node = path,
        "zookeeper: ignoring a node leasehold did not create among an election's candidates"
    );
}

/// The root node's data when it is leasehold's marker.
fn marker(version: i64) -> Vec<u8> {
    format!("leasehold {version}").into_bytes()
}

/// The layout version in a root node's data, if it is leasehold's marker.
fn marker_version(data: &[u8]) -> Option<i64> {
    std::str::from_utf8(data)
        .ok()?
        .strip_prefix("leasehold ")?
        .parse()
        .ok()
        .filter(|v| *v >= 1)
}

/// Refuses a root leasehold cannot use: not an absolute ZooKeeper path of
/// plain segments, `/` itself, or ZooKeeper's reserved `/zookeeper`.
fn check_root(root: &str) -> Result<()> {
    let bad = |reason: String| Error::invalid("zookeeper root", format!("{root:?}: {reason}"));
    if root.is_empty() {
        return Err(Error::invalid(
            "zookeeper root",
            "/ is the whole ensemble; leasehold needs a node of its own below it, such as /leasehold",
        ));
    }
    let Some(path) = root.strip_prefix('/') else {
        return Err(bad("must start with /".into()));
    };
    for segment in path.split('/') {
        if segment.is_empty() {
            return Err(bad("has an empty segment".into()));
        }
        if segment == "." || segment == ".." {
            return Err(bad(format!("segment {segment:?} is not allowed")));
        }
        // The characters ZooKeeper refuses in a path.
        if segment.chars().any(|c| {
            let u = u32::from(c);
            [0..=0x1f, 0x7f..=0x9f, 0xd800..=0xf8ff, 0xfff0..=0xffff]
                .iter()
                .any(|r| r.contains(&u))
        }) {
            return Err(bad("has a character ZooKeeper does not allow".into()));
        }
    }
    if path.split('/').next() == Some("zookeeper") {
        return Err(bad(
            "/zookeeper is ZooKeeper's own node; leasehold needs a node of its own".into(),
        ));
    }
    Ok(())
}

fn session_prefix(session: SessionId) -> String {
    format!("{CANDIDATE}{:016x}-", session.0)
}

fn node_data(ttl: Duration, candidate: &CandidateId) -> Vec<u8> {
    format!("{} {candidate}", ttl.as_millis()).into_bytes()
}

fn parse_node_data(path: &str, data: &[u8]) -> Result<(Duration, CandidateId)> {
    let corrupt = || {
        Error::Corrupt(format!(
            "zookeeper node {path} is not a leasehold candidate"
        ))
    };
    let text = std::str::from_utf8(data).map_err(|_| corrupt())?;
    let (ttl, candidate) = text.split_once(' ').ok_or_else(corrupt)?;
    let ttl = ttl.parse().map_err(|_| corrupt())?;
    let candidate = CandidateId::new(candidate).map_err(|_| corrupt())?;
    Ok((Duration::from_millis(ttl), candidate))
}

fn token_of(stat: &zookeeper_client::Stat) -> FencingToken {
    FencingToken::from_stored(stat.czxid)
}

/// The token of a grant whose node has `stat`: its czxid, which
/// ZooKeeper numbers from 1 up; [`Error::Corrupt`] for any other value,
/// which is no token and must not be granted as one.
fn granted_token(election: &ElectionName, stat: &zookeeper_client::Stat) -> Result<FencingToken> {
    FencingToken::issued(stat.czxid)
        .ok_or_else(|| Error::not_a_token(&"zookeeper", election.as_str(), stat.czxid))
}

impl ZkStore {
    /// Connects to the ensemble at `endpoints` (`host:port` each), keeping
    /// leasehold's nodes under `root`, which the first use creates (with
    /// leasehold's marker). A root that exists but was not created by
    /// leasehold, or is inside another leasehold store, is refused with
    /// [`Error::Corrupt`], one written by a newer leasehold with
    /// [`Error::IncompatibleSchema`], `/zookeeper` and malformed paths
    /// with [`Error::InvalidInput`]; nothing is written then.
    pub async fn connect(endpoints: &[String], root: &str, security: &Security) -> Result<Self> {
        Self::connect_with_layout(endpoints, root, security, Layout::Leasehold).await
    }

    /// Connects as [`ZkStore::connect`] does, with the elections laid out
    /// as `layout` says: [`Layout::Curator`] or [`Layout::Kazoo`] speak
    /// those recipes below `root` (which may then be empty), with no check
    /// of it and nothing written until a campaign (see the module
    /// documentation).
    pub async fn connect_with_layout(
        endpoints: &[String],
        root: &str,
        security: &Security,
        layout: Layout,
    ) -> Result<Self> {
        Self::open(endpoints, root, security, false, layout).await
    }

    /// Connects as [`ZkStore::connect`] does, for reading only: writes
    /// nothing and opens no session. A root that does not exist is
    /// [`Error::NotFound`].
    pub async fn connect_read_only(
        endpoints: &[String],
        root: &str,
        security: &Security,
    ) -> Result<Self> {
        Self::connect_read_only_with_layout(endpoints, root, security, Layout::Leasehold).await
    }

    /// [`ZkStore::connect_read_only`] with a layout
    /// ([`ZkStore::connect_with_layout`]); in a recipe's layout nothing is
    /// checked, and an election nobody joined has no leader.
    pub async fn connect_read_only_with_layout(
        endpoints: &[String],
        root: &str,
        security: &Security,
        layout: Layout,
    ) -> Result<Self> {
        Self::open(endpoints, root, security, true, layout).await
    }

    /// Connects only to release a dead holder's grant
    /// ([`crate::store::release_orphaned`]): no check of the root (the
    /// holder's process made it); the release deletes only a candidate
    /// node named for the holder's session (in a recipe's layout: ephemeral
    /// to it) and carrying its token.
    pub(crate) fn to_release(
        endpoints: &[String],
        root: &str,
        security: &Security,
        layout: Layout,
    ) -> Result<Self> {
        Ok(ZkStore {
            inner: Arc::new(Inner::new(endpoints, root, security, false, layout)?),
        })
    }

    /// Connects the store's own client; in leasehold's layout, checks (and
    /// unless read-only, makes) the root. A recipe's layout has no root of
    /// leasehold's to check: its path is shared with the recipe's clients.
    async fn open(
        endpoints: &[String],
        root: &str,
        security: &Security,
        read_only: bool,
        layout: Layout,
    ) -> Result<Self> {
        let store = ZkStore {
            inner: Arc::new(Inner::new(endpoints, root, security, read_only, layout)?),
        };
        let reader = store.inner.reader().await?;
        if store.inner.recipe.is_none() {
            store.inner.open_root(&reader).await?;
        }
        Ok(store)
    }

    /// A watch of `election`; with `held`, for the holder of that grant
    /// (see [`leader_watch::start`]).
    async fn watch_held<V: crate::store::watch_driver::Initial>(
        &self,
        election: &ElectionName,
        held: Option<FencingToken>,
    ) -> Result<crate::watch::Receiver<V>> {
        let client = self.inner.reader().await?;
        // Set before the first read, so that no change between the two is
        // missed.
        let watcher = self.inner.watch_election(&client, election).await?;
        let source = ZkWatch {
            inner: Arc::clone(&self.inner),
            election: election.clone(),
            watcher: Some(watcher),
            disconnected: false,
            rewatch_failed: false,
        };
        leader_watch::start(source, election, held).await
    }
}

impl ZkStore {
    /// **Tests only**: has the server end `session` the way Curator's
    /// `KillSession` does — another connection takes the session over with
    /// its id and password and closes it — so that this store's client
    /// learns of the expiry from the server while it is connected.
    ///
    /// The intruder runs on a thread of its own while this call blocks its
    /// caller's thread: called from a current-thread runtime, the session's
    /// own client cannot reconnect (and take the session back) in between.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub async fn kill_session_from_outside(&self, session: SessionId) -> Result<()> {
        let zk = self
            .inner
            .session(session)
            .ok_or(Error::SessionExpired(session))?;
        let info = zk
            .client()
            .ok_or(Error::SessionExpired(session))?
            .session()
            .clone();
        let (cluster, ttl) = (self.inner.cluster.clone(), zk.ttl);
        // With the store's credentials, as every client the store opens.
        let connector = connector(&self.inner.security)?;
        let intruder = std::thread::spawn(move || -> std::result::Result<(), String> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async move {
                let client = connector
                    .with_session(info)
                    .with_session_timeout(ttl)
                    .connect(&cluster)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut states = client.state_watcher();
                drop(client);
                tokio::time::timeout(Duration::from_secs(5), async {
                    while !states.state().is_terminated() {
                        states.changed().await;
                    }
                })
                .await
                .map_err(|_| "the intruder's close was not confirmed".to_owned())
            })
        });
        let outcome = intruder
            .join()
            .map_err(|_| "the intruder thread panicked".to_owned())
            .and_then(|r| r);
        outcome.map_err(|reason| Error::Unavailable {
            reason: format!("could not end zookeeper session {session} from outside: {reason}"),
            source: None,
        })
    }

    /// How many candidate nodes `session` has in `election` (tests: a
    /// reconnect must never leave two).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub async fn candidate_nodes(
        &self,
        session: SessionId,
        election: &ElectionName,
    ) -> Result<usize> {
        if self.inner.recipe.is_some() {
            return self.inner.recipe_candidate_nodes(session, election).await;
        }
        let client = self.inner.reader().await?;
        let children = match request(
            "list candidates",
            client.list_children(&self.inner.election_dir(election)),
        )
        .await?
        {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(error) => {
                let dir = self.inner.election_dir(election);
                return Err(self.inner.failed("list candidates", &dir, error));
            }
        };
        let prefix = session_prefix(session);
        Ok(children.iter().filter(|c| c.starts_with(&prefix)).count())
    }
}

/// A connector for `cluster` that adds `security`'s digest credentials, the
/// password read now (from its file, if it comes from one).
fn connector(security: &Security) -> Result<zookeeper_client::Connector> {
    let connector = Client::connector();
    Ok(match security.credentials()? {
        Some((user, password)) => {
            let auth = format!("{user}:{}", password.expose());
            connector.with_auth("digest", auth.as_bytes())
        }
        None => connector,
    })
}

impl Inner {
    /// The store's state before any connection: refuses a malformed root,
    /// TLS settings and a user without a password (or a password without a
    /// user).
    fn new(
        endpoints: &[String],
        root: &str,
        security: &Security,
        read_only: bool,
        layout: Layout,
    ) -> Result<Self> {
        if security.tls() || security.cert.is_some() || security.key.is_some() {
            return Err(Error::invalid(
                "ZooKeeper store URL",
                "leasehold's ZooKeeper store does not speak TLS",
            ));
        }
        let authenticated = match (&security.user, &security.password) {
            (Some(_), Some(_)) => true,
            (None, None) => false,
            (Some(user), None) => {
                return Err(Error::invalid(
                    "ZooKeeper store URL",
                    format!(
                        "user {user:?} has no password: give it in the URL, by \
                         ?password_file=PATH or by LEASEHOLD_STORE_PASSWORD"
                    ),
                ));
            }
            (None, Some(_)) => {
                return Err(Error::invalid(
                    "ZooKeeper store URL",
                    "a password without a user (zk://USER@…)",
                ));
            }
        };
        let root = root.trim_end_matches('/');
        if !matches!(layout, Layout::Leasehold | Layout::Curator | Layout::Kazoo) {
            return Err(Error::invalid(
                "ZooKeeper store URL",
                format!("ZooKeeper speaks ?layout=leasehold, curator or kazoo, not {layout}"),
            ));
        }
        let recipe = Recipe::of(layout);
        // A recipe's elections may be joined right below `/`.
        if recipe.is_none() || !root.is_empty() {
            check_root(root)?;
        }
        Ok(Inner {
            cluster: endpoints.join(","),
            root: root.to_owned(),
            read_only,
            recipe,
            security: security.clone(),
            user: security.user.clone(),
            acls: node_acls(authenticated),
            reader: tokio::sync::Mutex::new(None),
            sessions: Mutex::new(HashMap::new()),
        })
    }

    /// How leasehold creates a persistent node: with [`Inner::acls`].
    fn persistent(&self) -> CreateOptions<'static> {
        CreateMode::Persistent.with_acls(self.acls)
    }

    /// The error for the request `what` on the node `path` ([`failed`]).
    fn failed(&self, what: &str, path: &str, error: zookeeper_client::Error) -> Error {
        failed(self.user.as_deref(), what, path, error)
    }

    fn elections_dir(&self) -> String {
        format!("{}/elections", self.root)
    }

    /// Checks that the root is a leasehold store this build can use and,
    /// unless read-only, creates it if it does not exist. Writes nothing
    /// otherwise.
    async fn open_root(&self, client: &Client) -> Result<()> {
        self.refuse_enclosing_store(client).await?;
        let root = self.root.as_str();
        for _ in 0..ATTEMPTS {
            let data = match request("read the root node", client.get_data(root)).await? {
                Ok((data, _)) => data,
                Err(zookeeper_client::Error::NoNode) => {
                    if self.read_only {
                        return Err(Error::NotFound(format!(
                            "at zookeeper node {root}: nothing has campaigned there yet"
                        )));
                    }
                    if self.create_root(client).await? {
                        return Ok(());
                    }
                    // Created meanwhile by someone else: read it again.
                    continue;
                }
                Err(error) => return Err(self.failed("read the root node", root, error)),
            };
            return match marker_version(&data) {
                Some(found) if found > LAYOUT_VERSION => Err(Error::IncompatibleSchema {
                    found,
                    supported: LAYOUT_VERSION,
                }),
                Some(_) if self.read_only => Ok(()),
                Some(_) => {
                    self.restore_elections_node(client).await?;
                    self.warn_if_open(client).await;
                    Ok(())
                }
                None => Err(Error::Corrupt(format!(
                    "zookeeper node {root} exists but leasehold did not create it \
                     (it holds no leasehold marker); use a root of its own"
                ))),
            };
        }
        Err(Error::Unavailable {
            reason: format!("zookeeper node {root} kept changing while leasehold checked it"),
            source: None,
        })
    }

    /// Refuses a root inside a leasehold store at an enclosing node: its
    /// nodes are not for us to use.
    async fn refuse_enclosing_store(&self, client: &Client) -> Result<()> {
        let root = self.root.as_str();
        for (i, _) in root.match_indices('/').filter(|(i, _)| *i > 0) {
            let outer = &root[..i];
            match request("read the root node", client.get_data(outer)).await? {
                Ok((data, _)) if marker_version(&data).is_some() => {
                    return Err(Error::Corrupt(format!(
                        "zookeeper node {root} is inside the leasehold store at {outer}; \
                         use a root of its own"
                    )));
                }
                // A node this client may not read is not a leasehold
                // store's root: those are readable by anyone.
                Ok(_) | Err(zookeeper_client::Error::NoAuth) => {}
                Err(zookeeper_client::Error::NoNode) => break,
                Err(error) => return Err(self.failed("read the root node", outer, error)),
            }
        }
        Ok(())
    }

    /// The root is leasehold's: puts back its elections node should someone
    /// have deleted it.
    ///
    /// Every opening for writing sends this create, so it is also where an
    /// identity that may not write the store (a wrong password, another
    /// user, no credentials on a store made with them) is refused: ZooKeeper
    /// checks the CREATE permission on the root before whether the node
    /// exists.
    async fn restore_elections_node(&self, client: &Client) -> Result<()> {
        const WHAT: &str = "create the elections node";
        let elections = self.elections_dir();
        match request(WHAT, client.create(&elections, &[], &self.persistent())).await? {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => Ok(()),
            Err(zookeeper_client::Error::NoAuth) => Err(self
                .explain_denial(client, WHAT, &self.root, Permission::CREATE)
                .await),
            Err(error) => Err(self.failed(WHAT, &self.root, error)),
        }
    }

    /// Why ZooKeeper refused this store's identity the `needed` permission
    /// on `path` for the request `what`, from the node's ACL when it can be
    /// read: the digest users it admits with that permission name the
    /// store's user (so the password differs: a digest is made of both),
    /// or others. Never the digests themselves.
    async fn explain_denial(
        &self,
        client: &Client,
        what: &str,
        path: &str,
        needed: Permission,
    ) -> Error {
        let generic = self.failed(what, path, zookeeper_client::Error::NoAuth);
        let Ok(Ok((acls, _))) = request("read an ACL", client.get_acl(path)).await else {
            return generic;
        };
        let mut owners: Vec<&str> = acls
            .iter()
            .filter(|acl| acl.scheme() == "digest" && acl.permission().has(needed))
            .filter_map(|acl| acl.id().split_once(':').map(|(user, _)| user))
            .collect();
        owners.dedup();
        if owners.is_empty() {
            return generic;
        }
        let shown = owners
            .iter()
            .map(|owner| format!("{owner:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        Error::Denied(match self.user.as_deref() {
            Some(user) if owners.contains(&user) => format!(
                "wrong password for zookeeper user {user:?}: permission denied on zookeeper \
                 node {path} ({what}), whose ACL admits {user:?} with another password"
            ),
            Some(user) => format!(
                "permission denied on zookeeper node {path} to user {user:?} ({what}): it \
                 belongs to zookeeper user {shown}; every replica of a store must use the \
                 same user"
            ),
            None => format!(
                "permission denied on zookeeper node {path} ({what}): it belongs to \
                 zookeeper user {shown}; give that user and its password (zk://USER@…, \
                 ?password_file=PATH or LEASEHOLD_STORE_PASSWORD)"
            ),
        })
    }

    /// With credentials, warns if the root or its elections node lets
    /// anyone change it (made by a run without credentials): anyone can then delete leasehold's nodes
    /// and depose a leader. Leasehold never changes the ACL of a node it
    /// did not create with the ACL it wants; new nodes under these get the
    /// guarded ACL, but ZooKeeper checks a delete against the parent.
    async fn warn_if_open(&self, client: &Client) {
        if self.user.is_none() {
            return;
        }
        let mut open = Vec::new();
        for path in [self.root.clone(), self.elections_dir()] {
            if let Ok(Ok((acls, _))) = request("read an ACL", client.get_acl(&path)).await
                && acls.iter().any(|acl| {
                    acl.scheme() == "world"
                        && acl.id() == "anyone"
                        && acl.permission() != Permission::READ
                        && acl.permission() != Permission::NONE
                })
            {
                open.push(path);
            }
        }
        if !open.is_empty() {
            tracing::warn!(
                nodes = open.join(" "),
                "zookeeper: these nodes were made without credentials and anyone may change or \
                 delete them, and so depose a leader; leasehold leaves their ACL as it is. To \
                 protect the store, stop every replica and delete the root (or use a new one) \
                 so that an authenticated run creates it again"
            );
        }
    }

    /// Creates the root with the marker and its `elections` node in one
    /// transaction (after any missing parent, empty); `false` if the root
    /// appeared meanwhile.
    async fn create_root(&self, client: &Client) -> Result<bool> {
        const WHAT: &str = "create the root node";
        let root = self.root.as_str();
        let parent = match root.rsplit_once('/') {
            Some((parent, _)) if !parent.is_empty() => parent,
            _ => "/",
        };
        if parent != "/" {
            request(WHAT, client.mkdir(parent, &self.persistent()))
                .await?
                .map_err(|e| self.failed(WHAT, parent, e))?;
        }
        let mut multi = client.new_multi_writer();
        let (elections, marker) = (self.elections_dir(), marker(LAYOUT_VERSION));
        let options = self.persistent();
        multi
            .add_create(root, &marker, &options)
            .and_then(|()| multi.add_create(&elections, &[], &options))
            .map_err(|e| self.failed(WHAT, root, e))?;
        let commit = multi.commit();
        let committed = request(WHAT, async {
            commit.await.map_err(zookeeper_client::Error::from)
        })
        .await?;
        match committed {
            Ok(_) => Ok(true),
            Err(zookeeper_client::Error::NodeExists) => Ok(false),
            Err(zookeeper_client::Error::NoAuth) => Err(self
                .explain_denial(client, WHAT, parent, Permission::CREATE)
                .await),
            Err(error) => Err(self.failed(WHAT, parent, error)),
        }
    }

    fn election_dir(&self, election: &ElectionName) -> String {
        format!("{}/{}", self.elections_dir(), encode(election))
    }

    async fn connect(&self, timeout: Duration) -> Result<Client> {
        let connecting = connector(&self.security)?
            .with_session_timeout(timeout)
            .with_fail_eagerly()
            .connect(&self.cluster);
        match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(zookeeper_client::Error::AuthFailed)) => Err(auth_failed(self.user.as_deref())),
            Ok(Err(error)) => Err(Error::Unavailable {
                reason: format!(
                    "cannot connect to zookeeper at {}: {}",
                    self.cluster,
                    crate::error::with_causes(&error)
                ),
                source: Some(Box::new(error)),
            }),
            Err(_) => Err(Error::Unavailable {
                reason: format!(
                    "cannot connect to zookeeper at {} within {CONNECT_TIMEOUT:?}",
                    self.cluster
                ),
                source: None,
            }),
        }
    }

    /// The store's own client, reconnected if its session ended.
    async fn reader(&self) -> Result<Client> {
        let mut reader = self.reader.lock().await;
        if let Some(client) = reader.as_ref()
            && !client.state().is_terminated()
        {
            return Ok(client.clone());
        }
        let client = self.connect(READER_SESSION_TIMEOUT).await?;
        *reader = Some(client.clone());
        Ok(client)
    }

    fn session(&self, id: SessionId) -> Option<Arc<ZkSession>> {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .cloned()
    }

    /// Deletes `grant`'s candidate node through `client`, if it is still
    /// there with the grant's token; [`Error::NotHolder`] otherwise.
    async fn delete_grant_node(&self, client: &Client, grant: &Grant) -> Result<()> {
        let dir = self.election_dir(&grant.election);
        let children = match request("list candidates", client.list_children(&dir)).await? {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => return Err(not_holder(grant)),
            Err(error) => return Err(self.failed("list candidates", &dir, error)),
        };
        // The grant's node, if it is still there, is still the current
        // grant: the nodes ahead of it were gone when it was granted, and
        // later ones queue behind it.
        let prefix = session_prefix(grant.session);
        let Some(mine) = queue(children)
            .into_iter()
            .find(|c| c.name.starts_with(&prefix))
        else {
            return Err(not_holder(grant));
        };
        let path = format!("{dir}/{}", mine.name);
        let stat = match request("read the candidate node", client.check_stat(&path)).await? {
            Ok(Some(stat)) => stat,
            Ok(None) => return Err(not_holder(grant)),
            Err(error) => return Err(self.failed("read the candidate node", &path, error)),
        };
        if token_of(&stat) != grant.token {
            return Err(not_holder(grant));
        }
        // The path names this grant's node alone (sequence numbers are
        // never reused under a parent), so deleting it cannot touch a
        // successor's node. The release's token is recorded in the same
        // multi-op; its node is made on the first release.
        const WHAT: &str = "delete the candidate node";
        let release = self.release_node(&grant.election);
        let token = grant.token.0.to_string();
        for _ in 0..2 {
            let mut multi = client.new_multi_writer();
            multi
                .add_delete(&path, Some(stat.version))
                .and_then(|()| multi.add_set_data(&release, token.as_bytes(), None))
                .map_err(|error| self.failed(WHAT, &path, error))?;
            match request(WHAT, multi.commit()).await? {
                Ok(_) => return Ok(()),
                Err(zookeeper_client::MultiWriteError::OperationFailed {
                    index: 1,
                    source: zookeeper_client::Error::NoNode,
                }) => {
                    let releases = format!("{}/releases", self.root);
                    self.make_parents(client, &[&releases, &release], None)
                        .await?;
                }
                Err(zookeeper_client::MultiWriteError::OperationFailed {
                    index: 0,
                    source: zookeeper_client::Error::NoNode | zookeeper_client::Error::BadVersion,
                }) => return Err(not_holder(grant)),
                Err(error) => return Err(self.failed(WHAT, &dir, error.into())),
            }
        }
        Err(Error::Unavailable {
            reason: format!("zookeeper {WHAT}: node {release} kept disappearing"),
            source: None,
        })
    }

    fn live_session(&self, id: SessionId) -> Result<(Arc<ZkSession>, Client)> {
        let session = self.session(id).ok_or(Error::SessionExpired(id))?;
        let client = session.client().ok_or(Error::SessionExpired(id))?;
        Ok((session, client))
    }

    fn forget(&self, id: SessionId) {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// The leader of `election`, read with the store's own client.
    async fn read_leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        let client = self.reader().await?;
        match self.recipe {
            Some(recipe) => self.recipe_leader_via(recipe, &client, election).await,
            None => self.leader_via(&client, election).await,
        }
    }

    /// A persistent watch on `election`'s node, set before a first read so
    /// that no change between the two is missed; it fires for every
    /// candidate node created or deleted (release, expiry) and for the
    /// client's connection states.
    async fn watch_election(
        &self,
        client: &Client,
        election: &ElectionName,
    ) -> Result<zookeeper_client::PersistentWatcher> {
        let dir = match self.recipe {
            Some(_) => self.recipe_dir(election)?,
            None => self.election_dir(election),
        };
        request(
            "watch the election",
            client.watch(&dir, AddWatchMode::Persistent),
        )
        .await?
        .map_err(|e| self.failed("watch the election", &dir, e))
    }

    /// The leader of `election` as `client` reads it: the lowest candidate
    /// node leasehold created (nodes it did not create are skipped).
    async fn leader_via(&self, client: &Client, election: &ElectionName) -> Result<Option<Leader>> {
        let dir = self.election_dir(election);
        'list: loop {
            let children = match request("list candidates", client.list_children(&dir)).await? {
                Ok(children) => children,
                Err(zookeeper_client::Error::NoNode) => return Ok(None),
                Err(error) => return Err(self.failed("list candidates", &dir, error)),
            };
            for first in queue(children) {
                let path = format!("{dir}/{}", first.name);
                match request("read the leader", client.get_data(&path)).await? {
                    Ok((_, stat)) if !owned(&first, &stat) => warn_foreign(&path),
                    Ok((data, stat)) => {
                        let (ttl, candidate) = parse_node_data(&path, &data)?;
                        return Ok(Some(Leader {
                            candidate,
                            token: token_of(&stat),
                            // ZooKeeper does not tell how long another client's
                            // session has left: the negotiated timeout bounds it.
                            expires_in: ttl,
                        }));
                    }
                    // Gone between the list and the read: list again.
                    Err(zookeeper_client::Error::NoNode) => continue 'list,
                    Err(error) => return Err(self.failed("read the leader", &path, error)),
                }
            }
            return Ok(None);
        }
    }

    /// Closes sessions a TTL after their last successful renewal, and
    /// notices sessions the client reports ended.
    async fn supervise(
        self: Arc<Self>,
        session: Arc<ZkSession>,
        mut states: zookeeper_client::StateWatcher,
    ) {
        let mut renewed = session.renewed.subscribe();
        loop {
            let expiry = *renewed.borrow_and_update() + session.ttl;
            tokio::select! {
                biased;
                () = session.ended.cancelled() => break,
                state = states.changed() => {
                    if state.is_terminated() {
                        tracing::warn!(session = %session.id, ?state, "zookeeper session ended");
                        session.end();
                        break;
                    }
                }
                changed = renewed.changed() => if changed.is_err() { break },
                () = tokio::time::sleep_until(expiry) => {
                    tracing::debug!(session = %session.id, "not renewed for a TTL; closing the zookeeper session");
                    session.end();
                    break;
                }
            }
        }
        self.forget(session.id);
    }
}

/// The ZooKeeper side of a watch on one election: it wakes on the events
/// of a persistent watch on the election's node (a candidate node created
/// or deleted) and on the reader client's session events. While the
/// client is disconnected nothing can be read; once it reconnects, or its
/// session ended, the watch is set anew (the client's automatic reset of a
/// persistent watch was seen to leave it deaf, and events while
/// disconnected are not replayed), on a new session if need be.
struct ZkWatch {
    inner: Arc<Inner>,
    election: ElectionName,
    /// `None` when the watch must be set anew.
    watcher: Option<zookeeper_client::PersistentWatcher>,
    disconnected: bool,
    /// The last attempt to set the watch anew failed: pause before the next.
    rewatch_failed: bool,
}

impl Source for ZkWatch {
    const RETRY: Duration = WATCH_RETRY;

    async fn read(&mut self) -> Result<Option<Leader>> {
        self.inner.read_leader(&self.election).await
    }

    async fn changed(&mut self) -> Event {
        loop {
            let Some(watcher) = self.watcher.as_mut() else {
                return self.rewatch().await;
            };
            let event = watcher.changed().await;
            if event.event_type != EventType::Session {
                return Event::Changed;
            }
            if event.session_state.is_terminated() {
                self.watcher = None;
            } else if event.session_state == SessionState::Disconnected {
                self.disconnected = true;
                return Event::Unavailable(Error::Unavailable {
                    reason: format!("zookeeper at {}: disconnected", self.inner.cluster),
                    source: None,
                });
            } else if std::mem::take(&mut self.disconnected) {
                self.watcher = None;
            } else {
                // (Re)connected: events may have been missed.
                return Event::Changed;
            }
        }
    }
}

impl ZkWatch {
    /// Sets the watch anew on the reader (reconnected if its session
    /// ended): then re-read; or why it cannot be set now.
    async fn rewatch(&mut self) -> Event {
        if std::mem::take(&mut self.rewatch_failed) {
            tokio::time::sleep(WATCH_RETRY).await;
        }
        let watched = match self.inner.reader().await {
            Ok(client) => self.inner.watch_election(&client, &self.election).await,
            Err(error) => Err(error),
        };
        match watched {
            Ok(watcher) => {
                self.watcher = Some(watcher);
                Event::Changed
            }
            Err(error) => {
                tracing::debug!(election = %self.election, %error, "zookeeper watch: cannot watch again; retrying");
                self.rewatch_failed = true;
                Event::Unavailable(error)
            }
        }
    }
}

/// Withdraws a candidacy whose campaign was dropped before it completed:
/// deletes the session's nodes in the election's node `dir` unless the
/// session holds the election. The list is sent after any create of the
/// dropped campaign on the same session, so ZooKeeper answers it after that
/// create.
async fn withdraw(session: Arc<ZkSession>, election: ElectionName, dir: String) {
    let Some(client) = session.client() else {
        return;
    };
    let held = session
        .held
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(&election);
    if held {
        return;
    }
    let prefix = session_prefix(session.id);
    if let Ok(Ok(children)) = request("list candidates", client.list_children(&dir)).await {
        for node in children.iter().filter(|c| c.starts_with(&prefix)) {
            let _ = request("withdraw", client.delete(&format!("{dir}/{node}"), None)).await;
        }
    }
}

/// A session's campaign in an election's node `dir`: the steps of
/// [`ZkStore::campaign`]. Every request fails with
/// [`Error::SessionExpired`] once the session ends.
struct Line<'a> {
    zk: &'a ZkSession,
    client: &'a Client,
    /// The election's node.
    dir: &'a str,
    /// How the session's candidate nodes are named ([`session_prefix`]).
    prefix: String,
    /// The ACL of the nodes it creates ([`node_acls`]).
    acls: Acls<'static>,
}

impl Line<'_> {
    fn persistent(&self) -> CreateOptions<'static> {
        CreateMode::Persistent.with_acls(self.acls)
    }

    /// Creates the election's node if it does not exist. Not `mkdir`: if
    /// leasehold's nodes were deleted (`elections_dir` among them), nothing
    /// is created in their place.
    async fn create_election_node(&self, elections_dir: &str) -> Result<()> {
        const WHAT: &str = "create the election node";
        let made = (self.zk)
            .ask(WHAT, self.client.create(self.dir, &[], &self.persistent()))
            .await?;
        match made {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => Ok(()),
            Err(zookeeper_client::Error::NoNode) => Err(Error::Corrupt(format!(
                "zookeeper node {elections_dir} is gone: leasehold's nodes were deleted; nothing was written"
            ))),
            Err(error) => Err(self.zk.refused(WHAT, elections_dir, error)),
        }
    }

    /// The election's candidate nodes in line, less the `foreign` ones.
    async fn candidates(&self, foreign: &HashSet<String>) -> Result<Vec<Candidate>> {
        const WHAT: &str = "list candidates";
        let children = (self.zk)
            .ask(WHAT, self.client.list_children(self.dir))
            .await?
            .map_err(|error| self.zk.refused(WHAT, self.dir, error))?;
        let mut queue = queue(children);
        queue.retain(|c| !foreign.contains(&c.name));
        Ok(queue)
    }

    /// Where in `queue` the session's candidate node is, if it has one.
    /// Deletes any second node of the session: a create retried after a
    /// lost reply can leave one.
    async fn own_position(&self, queue: &[Candidate]) -> Option<usize> {
        let mut mine = queue
            .iter()
            .enumerate()
            .filter(|(_, c)| c.name.starts_with(&self.prefix));
        let (position, _) = mine.next()?;
        for (_, extra) in mine {
            let _ = request(
                "delete a duplicate candidate",
                self.client
                    .delete(&format!("{}/{}", self.dir, extra.name), None),
            )
            .await;
        }
        Some(position)
    }

    /// Joins the line: creates the session's candidate node.
    async fn join(&self, candidate: &CandidateId) -> Result<()> {
        const WHAT: &str = "create a candidate node";
        let ephemeral = CreateMode::EphemeralSequential.with_acls(self.acls);
        let (data, path) = (
            node_data(self.zk.ttl, candidate),
            format!("{}/{}", self.dir, self.prefix),
        );
        (self.zk)
            .ask(WHAT, self.client.create(&path, &data, &ephemeral))
            .await?
            .map_err(|error| self.zk.refused(WHAT, self.dir, error))?;
        Ok(())
    }

    /// The stat of the session's node `me`, first in line (its creation is
    /// the grant's token), or `None` if it is gone.
    async fn read_own_node(&self, me: &Candidate) -> Result<Option<zookeeper_client::Stat>> {
        const WHAT: &str = "read the candidate node";
        let path = format!("{}/{}", self.dir, me.name);
        match self.zk.ask(WHAT, self.client.get_data(&path)).await? {
            Ok((_, stat)) => Ok(Some(stat)),
            Err(zookeeper_client::Error::NoNode) => Ok(None),
            Err(error) => Err(self.zk.refused(WHAT, &path, error)),
        }
    }

    /// Waits until the candidate `ahead` of the session's node is gone;
    /// returns at once if it already is, or if it is not a candidate (then
    /// it is added to `foreign`: it would never go away by itself).
    async fn wait_for_predecessor(
        &self,
        ahead: &Candidate,
        foreign: &mut HashSet<String>,
    ) -> Result<()> {
        const WHAT: &str = "watch the predecessor";
        let predecessor = format!("{}/{}", self.dir, ahead.name);
        let watched = (self.zk)
            .ask(WHAT, self.client.check_and_watch_stat(&predecessor))
            .await?;
        match watched {
            Ok((None, _)) => {}
            Ok((Some(stat), _)) if !owned(ahead, &stat) => {
                warn_foreign(&predecessor);
                foreign.insert(ahead.name.clone());
            }
            Ok((Some(_), watcher)) => {
                self.zk.unless_ended(watcher.changed()).await?;
            }
            Err(error) => return Err(self.zk.refused(WHAT, &predecessor, error)),
        }
        Ok(())
    }
}

#[async_trait]
impl Store for ZkStore {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        if self.inner.read_only {
            return Err(Error::invalid(
                "session",
                "the store was opened read-only (ZkStore::connect_read_only)",
            ));
        }
        let ttl = TTL.check(ttl)?.ttl;
        let sent = Instant::now();
        let client = self.inner.connect(ttl).await?;
        let granted = client.session_timeout();
        let id = SessionId::from_bits(client.session_id().0);
        if granted != ttl {
            // The session logs the granted TTL for every store; this is the
            // detail of why.
            tracing::debug!(session = %id, requested = ?ttl, negotiated = ?granted,
                "zookeeper negotiated another session timeout (it clamps to its min/maxSessionTimeout); using it as the TTL");
        }
        let (renewed, _) = watch::channel(sent);
        let session = Arc::new(ZkSession {
            id,
            user: self.inner.user.clone(),
            client: Mutex::new(Some(client.clone())),
            ttl: granted,
            renewed,
            ended: CancellationToken::new(),
            held: Mutex::new(HashSet::new()),
            recipe_campaigns: Mutex::new(HashMap::new()),
        });
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Arc::clone(&session));
        let inner = Arc::clone(&self.inner);
        let states = client.state_watcher();
        drop(client);
        // The supervisor keeps only a state watcher, never a client, so that
        // ending the session closes it.
        tokio::spawn(inner.supervise(session, states));
        Ok(SessionLease { id, ttl: granted })
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        let (zk, client) = self.inner.live_session(session)?;
        let sent = Instant::now();
        // A `sync`, not a read: a follower cut off from the ensemble's
        // leader answers reads on its own until it notices (`syncLimit`
        // ticks, 10 s with ZooKeeper's usual settings), while the leader,
        // which alone expires sessions, never hears of them. A sync passes
        // through the leader, so a cut-off follower cannot confirm one.
        let outcome = zk.ask("renew the session", client.sync("/")).await?;
        match outcome {
            Ok(()) => {
                // The leader hears of this renewal with the follower's next
                // heartbeat, within half a tick; a partition in that window
                // strands it at the follower (see DESIGN, "Faults of the
                // stores").
                zk.renewed.send_replace(sent);
                Ok(zk.ttl)
            }
            Err(
                zookeeper_client::Error::SessionExpired | zookeeper_client::Error::ClientClosed,
            ) => {
                zk.end();
                Err(Error::SessionExpired(session))
            }
            Err(error) => Err(failed(zk.user.as_deref(), "renew the session", "/", error)),
        }
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        let Some(zk) = self.inner.session(session) else {
            return Ok(());
        };
        let Some(client) = zk.end() else {
            return Ok(());
        };
        let mut states = client.state_watcher();
        drop(client);
        // Wait until the server has closed the session (and so deleted its
        // nodes), so that the release is visible when this returns.
        let closed = tokio::time::timeout(REQUEST_TIMEOUT, async {
            while !states.state().is_terminated() {
                states.changed().await;
            }
        })
        .await;
        self.inner.forget(session);
        if closed.is_err() {
            tracing::warn!(%session, "zookeeper did not confirm closing the session; it expires after its timeout");
        }
        Ok(())
    }

    async fn campaign(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Grant> {
        if let Some(recipe) = self.inner.recipe {
            return (self.inner)
                .recipe_campaign(recipe, session, election, candidate)
                .await;
        }
        let (zk, client) = self.inner.live_session(session)?;
        let dir = self.inner.election_dir(election);
        let line = Line {
            zk: &zk,
            client: &client,
            dir: &dir,
            prefix: session_prefix(session),
            acls: self.inner.acls,
        };
        line.create_election_node(&self.inner.elections_dir())
            .await?;
        let guard = {
            let (session, election, dir) = (Arc::clone(&zk), election.clone(), dir.clone());
            OnDrop::new((), move |()| withdraw(session, election, dir))
        };
        // Nodes named like candidates that leasehold did not create; names
        // are never reused under a parent.
        let mut foreign: HashSet<String> = HashSet::new();
        loop {
            let queue = line.candidates(&foreign).await?;
            let Some(position) = line.own_position(&queue).await else {
                line.join(candidate).await?;
                continue;
            };
            if position == 0 {
                let me = &queue[0];
                let Some(stat) = line.read_own_node(me).await? else {
                    continue;
                };
                // Checked while the guard would still withdraw the node.
                let token = granted_token(election, &stat)?;
                zk.held
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(election.clone());
                guard.disarm();
                tracing::debug!(%election, %session, node = %me.name, "granted by zookeeper");
                return Ok(Grant {
                    election: election.clone(),
                    candidate: candidate.clone(),
                    session,
                    token,
                });
            }
            line.wait_for_predecessor(&queue[position - 1], &mut foreign)
                .await?;
        }
    }

    async fn resign(&self, grant: &Grant) -> Result<()> {
        let Ok((zk, client)) = self.inner.live_session(grant.session) else {
            return Err(not_holder(grant));
        };
        match self.inner.recipe {
            Some(recipe) => {
                let prefix = zk.known_recipe_prefix(&grant.election);
                (self.inner)
                    .recipe_delete_grant_node(recipe, &client, grant, prefix.as_deref())
                    .await?;
            }
            None => self.inner.delete_grant_node(&client, grant).await?,
        }
        zk.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&grant.election);
        Ok(())
    }

    /// The dead holder's session is not ours: the node is deleted through
    /// the store's own client. ZooKeeper lets any client that may delete
    /// children of the election's node delete an ephemeral node in it (with
    /// credentials, the same identity: every replica of a store uses one);
    /// the version check and the token make it this grant's node alone.
    ///
    /// In a recipe's layout, the node deleted is the one ephemeral to the
    /// grant's session and created by the grant's transaction (its token).
    async fn release_orphaned(&self, grant: &Grant) -> Result<()> {
        let client = self.inner.reader().await?;
        match self.inner.recipe {
            Some(recipe) => {
                (self.inner)
                    .recipe_delete_grant_node(recipe, &client, grant, None)
                    .await
            }
            None => self.inner.delete_grant_node(&client, grant).await,
        }
    }

    async fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        self.inner.own_layout("a note")?;
        self.inner.put_note(session, election, name, text).await
    }

    async fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        self.inner.own_layout("a note")?;
        self.inner.delete_note(session, election, name).await
    }

    async fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        self.inner.own_layout("a note")?;
        self.inner.amend_note(session, election, name, text).await
    }

    async fn watch_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<NoteWatch> {
        self.inner.own_layout("a note")?;
        self.inner
            .start_notes_watch(election, Some((session, name)))
            .await
    }

    async fn notes(&self, election: &ElectionName) -> Result<Vec<Note>> {
        self.inner.own_layout("the line of standbys")?;
        self.inner.read_notes(election).await
    }

    async fn watch_notes(&self, election: &ElectionName) -> Result<NoteWatch> {
        self.inner.own_layout("the line of standbys")?;
        self.inner.start_notes_watch(election, None).await
    }

    async fn last_release(&self, election: &ElectionName) -> Result<Option<FencingToken>> {
        self.inner.own_layout("the record of releases")?;
        self.inner.last_release(election).await
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        self.inner.read_leader(election).await
    }

    async fn watch(&self, election: &ElectionName) -> Result<LeaderWatch> {
        self.watch_held(election, None).await
    }

    async fn watch_status(&self, election: &ElectionName) -> Result<StatusWatch> {
        self.watch_held(election, None).await
    }

    async fn watch_grant(&self, grant: &Grant) -> Result<LeaderWatch> {
        self.watch_held(&grant.election, Some(grant.token)).await
    }

    async fn elections(&self) -> Result<Vec<ElectionState>> {
        self.inner.own_layout("listing elections")?;
        let client = self.inner.reader().await?;
        let nodes = match request(
            "list elections",
            client.list_children(&self.inner.elections_dir()),
        )
        .await?
        {
            Ok(nodes) => nodes,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(error) => {
                let dir = self.inner.elections_dir();
                return Err(self.inner.failed("list elections", &dir, error));
            }
        };
        let mut out = Vec::new();
        for node in nodes {
            let Some(election) = decode(&node) else {
                continue;
            };
            let leader = self.inner.leader_via(&client, &election).await?;
            out.push(ElectionState { election, leader });
        }
        out.sort_by(|a, b| a.election.cmp(&b.election));
        Ok(out)
    }

    async fn session_ended(&self, session: SessionId) {
        // A session this store does not know has ended (or never was).
        if let Some(zk) = self.inner.session(session) {
            zk.ended.cancelled().await;
        }
    }
}

/// The error for a grant that is no longer its election's grant.
fn not_holder(grant: &Grant) -> Error {
    Error::NotHolder {
        election: grant.election.to_string(),
        token: grant.token,
    }
}
