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
//! - In leasehold's layout, the store is the store primitive on ZooKeeper
//!   ([`ZkKeys`], whose documentation tells how keys, commits, reads and
//!   watches map onto nodes), and the elections are written once above it
//!   ([`KeyedStore`]): an election's keys are the children of the node
//!   `{root}/elections/{election}`; a candidate is the child `:c:{session}`,
//!   ephemeral to its session; the one created first (lowest `czxid`, the
//!   ensemble-wide transaction id that created it; its high half is the
//!   leader epoch, so it grows across restarts) leads, and its `czxid` is
//!   the fencing token.
//! - A session the client reports expired or closed ends leadership at once
//!   ([`Store::session_ended`]).
//!
//! What is leasehold's: the root node once its data is the marker
//! `leasehold 1` (the layout version), and the nodes under it. The first
//! use creates the root with the marker and `{root}/elections` in one
//! transaction (parents of the root that are missing are created empty). A
//! root that exists without the marker is another program's, refused
//! before anything is written. Roots inside another leasehold store, and
//! ZooKeeper's own `/zookeeper`, are refused. Within the space, a
//! candidate is a key leasehold wrote (`:c:{session}`, attached to that
//! very session); other nodes among an election's keys are never taken for
//! candidates. A store opened read-only ([`Access::ReadOnly`]) writes
//! nothing.
//!
//! Another recipe's layout (`zk://…[/PATH]?layout=curator|kazoo`): the
//! store's candidates then stand in the same line as that recipe's own
//! clients, with nodes named, ordered and watched as theirs are, so that
//! leasehold replicas and, say, Java services on Curator elect one leader
//! between them. It is the same election, written once above the store
//! primitive ([`KeyedStore`]), over the primitive in that layout
//! ([`RecipeKeys`], which writes only what the recipes write). Election `E` is the node `{PATH}/{E}` (`/{E}` without a
//! path; a `/` in `E` nests it deeper), shared with the other clients:
//! leasehold writes no marker there and makes no root of its own; a path
//! that is, or lies inside, a leasehold store is refused.
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
//! - A campaign first looks for a node of its session in the line: a
//!   campaign again after a lost reply finds the node the server made, as
//!   the recipes' own retries do, rather than add a second. A dropped
//!   campaign deletes its node. A
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

mod connection;
mod key_watch;
mod keys;
mod recipes;
mod sessions;

pub use keys::ZkKeys;
pub use recipes::RecipeKeys;
pub(crate) use recipes::recipe_path;

use std::collections::HashMap;
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
use crate::store::keyed::KeyedStore;
use crate::store::layout::Layout;
use crate::store::security::Security;
use crate::store::{Access, ClusterUrl};
use crate::store::{SessionId, SessionLease};
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
/// The layout of leasehold's nodes that this build writes and understands,
/// recorded in the root node's data.
pub const LAYOUT_VERSION: i64 = 1;
/// How often opening re-reads a root that changed between its read and its
/// write before giving up.
const ATTEMPTS: usize = 5;

/// The ZooKeeper store in leasehold's layout: the elections written once
/// over the store primitive on ZooKeeper ([`ZkKeys`]).
pub type ZkStore = KeyedStore<ZkKeys>;

/// The ZooKeeper store in the layout of another client's recipe
/// (`?layout=curator|kazoo`): the elections written once over the store
/// primitive in that layout ([`RecipeKeys`]).
pub type RecipeStore = KeyedStore<RecipeKeys>;

#[derive(Debug)]
struct Inner {
    /// `host:port,host:port` as the client takes it.
    cluster: String,
    /// Where leasehold's nodes live, e.g. `/leasehold`.
    root: String,
    /// Opened for [`Access::ReadOnly`]: writes nothing and opens
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

/// The store's state for `access`: its own client connected and, in
/// leasehold's layout, the root checked (and unless read-only, made). A
/// recipe's layout has no root of leasehold's to check: its path is
/// shared with the recipe's clients. [`Access::ReleaseOnly`] checks
/// nothing (the holder's process made the root).
async fn start(
    endpoints: &[String],
    root: &str,
    security: &Security,
    access: Access,
    layout: Layout,
) -> Result<Arc<Inner>> {
    let read_only = access == Access::ReadOnly;
    let inner = Arc::new(Inner::new(endpoints, root, security, read_only, layout)?);
    if access == Access::ReleaseOnly {
        return Ok(inner);
    }
    let reader = inner.reader().await?;
    match inner.recipe {
        None => inner.open_root(&reader).await?,
        Some(_) => inner.refuse_a_store_path(&reader).await?,
    }
    Ok(inner)
}

impl KeyedStore<ZkKeys> {
    /// Connects to the ensemble at `endpoints` (`host:port` each), keeping
    /// leasehold's nodes under `root`, which the first use creates (with
    /// leasehold's marker). A root that exists but was not created by
    /// leasehold, or is inside another leasehold store, is refused with
    /// [`Error::Corrupt`], one written by a newer leasehold with
    /// [`Error::IncompatibleSchema`], `/zookeeper` and malformed paths
    /// with [`Error::InvalidInput`]; nothing is written then.
    pub async fn connect(endpoints: &[String], root: &str, security: &Security) -> Result<Self> {
        let inner = start(
            endpoints,
            root,
            security,
            Access::ReadWrite,
            Layout::Leasehold,
        )
        .await?;
        Ok(KeyedStore::over(ZkKeys::new(inner)))
    }

    /// Connects to the ensemble `url` names (in leasehold's layout) for
    /// `access`, as [`ZkStore::connect`] does. [`Access::ReadOnly`] writes
    /// nothing and opens no session; a root that does not exist is then
    /// [`Error::NotFound`]. [`Access::ReleaseOnly`] checks nothing (the
    /// holder's process made the root).
    pub async fn open(url: &ClusterUrl, access: Access) -> Result<Self> {
        Ok(KeyedStore::over(ZkKeys::open(url, access).await?))
    }
}

/// A primitive on a ZooKeeper ensemble, in either layout.
#[cfg(feature = "testing")]
trait OnZooKeeper {
    fn zk(&self) -> &Inner;
}

#[cfg(feature = "testing")]
impl OnZooKeeper for ZkKeys {
    fn zk(&self) -> &Inner {
        &self.inner
    }
}

#[cfg(feature = "testing")]
impl OnZooKeeper for RecipeKeys {
    fn zk(&self) -> &Inner {
        &self.inner
    }
}

#[cfg(feature = "testing")]
#[allow(private_bounds)]
impl<K: crate::store::keys::Keys + OnZooKeeper> KeyedStore<K> {
    /// **Tests only**: see [`Inner::kill_session_from_outside`].
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub async fn kill_session_from_outside(&self, session: SessionId) -> Result<()> {
        self.keys().zk().kill_session_from_outside(session).await
    }
}

impl KeyedStore<RecipeKeys> {
    /// Connects to the ensemble `url` names for `access`, in the layout of
    /// the recipe it names (see [`RecipeKeys::open`]).
    pub async fn open(url: &ClusterUrl, access: Access) -> Result<Self> {
        let keys = RecipeKeys::open(url, access).await?;
        Ok(KeyedStore::with_layout(keys, url.layout()))
    }
}

impl Inner {
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
    async fn kill_session_from_outside(&self, session: SessionId) -> Result<()> {
        let zk = self
            .session(session)
            .ok_or(Error::SessionExpired(session))?;
        let info = zk
            .client()
            .ok_or(Error::SessionExpired(session))?
            .session()
            .clone();
        let (cluster, ttl) = (self.cluster.clone(), zk.ttl);
        // With the store's credentials, as every client the store opens.
        let connector = connection::connector(&self.security)?;
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
}
