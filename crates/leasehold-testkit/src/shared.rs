//! Servers that the tests of one run share, where each test can be kept
//! apart from the others by a name of its own ([`unique`]): an etcd key
//! prefix, a ZooKeeper root, a PostgreSQL schema.
//!
//! `scripts/test` starts one etcd cluster, one ZooKeeper server and one
//! PostgreSQL server with the `shared-servers` program before the tests,
//! names them in the environment variables below, and stops them by
//! process id when the tests end, however they end. A test run without
//! them (`cargo nextest run` by hand) starts a server of its own, as the
//! tests that stop, pause or restart servers always do.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::{EtcdCluster, PostgresServer, ZooKeeperServer};

/// The shared etcd cluster's members, `host:port,host:port,…`.
pub const ETCD: &str = "TESTKIT_SHARED_ETCD";
/// The shared ZooKeeper server, `host:port`.
pub const ZOOKEEPER: &str = "TESTKIT_SHARED_ZOOKEEPER";
/// The shared PostgreSQL server's URL for its superuser.
pub const POSTGRES: &str = "TESTKIT_SHARED_POSTGRES";
/// The shared PostgreSQL server that takes TLS only
/// ([`PostgresServer::start_secured`], with [`crate::LEAST_PRIVILEGE`]):
/// `PORT CA_FILE`, the CA that signed its certificate.
pub const POSTGRES_TLS: &str = "TESTKIT_SHARED_POSTGRES_TLS";

/// A server a test uses: the run's shared one (named by its address or
/// URL), or one of the test's own, stopped when the test drops it.
#[derive(Debug)]
pub enum Server<S> {
    Shared(String),
    Own(S),
}

fn shared(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|value| !value.is_empty())
}

/// The run's etcd cluster, or a 3-member cluster of the test's own.
pub fn etcd() -> Server<EtcdCluster> {
    shared(ETCD).map_or_else(|| Server::Own(EtcdCluster::start_steady(3)), Server::Shared)
}

/// The run's ZooKeeper server, or one of the test's own.
pub fn zookeeper() -> Server<ZooKeeperServer> {
    shared(ZOOKEEPER).map_or_else(|| Server::Own(ZooKeeperServer::start()), Server::Shared)
}

/// The run's PostgreSQL server, or one of the test's own.
pub fn postgres() -> Server<PostgresServer> {
    shared(POSTGRES).map_or_else(|| Server::Own(PostgresServer::start()), Server::Shared)
}

/// The run's secured PostgreSQL server (see [`POSTGRES_TLS`]): its port
/// and the CA file that signed its certificate. `None` without one: a
/// test then starts its own.
pub fn postgres_tls() -> Option<(u16, std::path::PathBuf)> {
    let value = shared(POSTGRES_TLS)?;
    let (port, ca) = value.split_once(' ')?;
    Some((port.parse().ok()?, ca.into()))
}

impl Server<EtcdCluster> {
    /// A store URL for the cluster with `prefix`.
    pub fn url(&self, prefix: &str) -> String {
        match self {
            Server::Shared(members) => {
                format!("etcd://{members}/{}", prefix.trim_start_matches('/'))
            }
            Server::Own(cluster) => cluster.url(prefix),
        }
    }
}

impl Server<ZooKeeperServer> {
    /// A `zk://` store URL with leasehold's nodes under `root`.
    pub fn url(&self, root: &str) -> String {
        match self {
            Server::Shared(address) => format!("zk://{address}{root}"),
            Server::Own(server) => server.url(root),
        }
    }

    /// A `zk://USER:PASSWORD@…` store URL with leasehold's nodes under
    /// `root` (`user` and `password` plain: no characters to escape).
    pub fn url_as(&self, user: &str, password: &str, root: &str) -> String {
        match self {
            Server::Shared(address) => format!("zk://{user}:{password}@{address}{root}"),
            Server::Own(server) => server.url_as(user, password, root),
        }
    }
}

impl Server<PostgresServer> {
    /// A connection string for the `postgres` database as the superuser.
    pub fn url(&self) -> String {
        match self {
            Server::Shared(url) => url.clone(),
            Server::Own(server) => server.url(),
        }
    }
}

/// `stem` followed by a suffix no other test of the run has (this
/// process's id and the clock, which a later process with the same id
/// cannot repeat): lower-case letters, digits and `_`, so that it serves
/// as a key prefix, a node name and a PostgreSQL schema alike.
pub fn unique(stem: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{stem}_{}_{}_{}",
        std::process::id(),
        crate::monotonic_ns(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
