//! Opening the store a URL names: for use, for reading only, or to
//! release a dead holder's grant.

use super::*;

/// Fails when no endpoint's host name resolves: that is the cause to name,
/// rather than the client library's "no available hosts" later.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(super) async fn resolve_any(what: &str, endpoints: &[String]) -> Result<()> {
    let mut failures = Vec::new();
    for endpoint in endpoints {
        match tokio::net::lookup_host(endpoint.as_str()).await {
            Ok(mut addrs) => {
                if addrs.next().is_some() {
                    return Ok(());
                }
                failures.push(format!("{endpoint}: no address"));
            }
            Err(error) => failures.push(format!("{endpoint}: {error}")),
        }
    }
    Err(Error::Unavailable {
        reason: format!(
            "cannot resolve the host name of any {what} endpoint ({})",
            failures.join("; ")
        ),
        source: None,
    })
}

/// What a store is opened for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Access {
    /// Everything: sessions, campaigns, notes. The first use of a store
    /// creates it (a file, a schema, a marker key or node).
    ReadWrite,
    /// Reading alone — what `status`, `list` and `observe` need —
    /// creating and writing nothing: no file, folder, schema, node, key or
    /// marker. A store that does not exist yet is [`Error::NotFound`];
    /// sessions and campaigns fail with [`Error::InvalidInput`]. `memory:`
    /// is a new, empty store either way.
    ReadOnly,
    /// [`Store::release_orphaned`] alone, for a grant whose holder's
    /// process is known to be dead (a runner's guard does this after its
    /// runner died): PostgreSQL and ZooKeeper skip the checks of a first
    /// use (the holder's process made them) and start no watch, so the
    /// release goes out after one connection; SQLite and etcd open as for
    /// [`Access::ReadWrite`].
    ReleaseOnly,
}

/// Opens the store a URL names for `access` (connecting to it, for a
/// remote store); a `sqlite:` URL built in code is checked against the
/// grammar first.
///
/// The password may come from the environment variable
/// `LEASEHOLD_STORE_PASSWORD` ([`PASSWORD_ENV`]) instead of the URL, as
/// for the command line: the URL then names only the user (etcd,
/// ZooKeeper; PostgreSQL may take its user from elsewhere too). While it
/// is set, a URL that holds a password (or a `password_file`) and a store
/// that takes none (`memory:`, `sqlite:`) are refused
/// ([`StoreUrl::with_password_from_env`]).
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "etcd",
        feature = "zookeeper",
        feature = "postgres"
    )),
    allow(unused_variables)
)]
pub async fn open(url: &StoreUrl, access: Access) -> Result<Arc<dyn Store>> {
    if let StoreUrl::Sqlite(path) = url {
        // The one kind of URL that may be built in code.
        check_sqlite_path(path.as_os_str().as_encoded_bytes()).map_err(invalid)?;
    }
    let url = url.clone().with_password_from_env()?;
    Ok(match &url {
        StoreUrl::Memory => Arc::new(MemoryStore::new()),
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(path) => {
            use crate::store::sqlite::SqliteStore;
            Arc::new(match access {
                Access::ReadOnly => SqliteStore::open_read_only(path)?,
                Access::ReadWrite | Access::ReleaseOnly => SqliteStore::open(path)?,
            })
        }
        #[cfg(feature = "etcd")]
        StoreUrl::Etcd(c) => {
            resolve_any("etcd", &c.endpoints).await?;
            Arc::new(crate::store::etcd::EtcdStore::open(c, access).await?)
        }
        #[cfg(feature = "zookeeper")]
        StoreUrl::ZooKeeper(c) => {
            resolve_any("ZooKeeper", &c.endpoints).await?;
            use crate::store::zookeeper::{RecipeStore, ZkStore};
            match c.layout {
                Layout::Leasehold => Arc::new(ZkStore::open(c, access).await?),
                _ => Arc::new(RecipeStore::open(c, access).await?),
            }
        }
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(pg) => Arc::new(
            crate::store::postgres::PostgresStore::open(pg.connection_url(), pg.schema(), access)
                .await?,
        ),
        // A store this build was compiled without.
        #[allow(unreachable_patterns)]
        other => return Err(not_built(other)),
    })
}

/// A store this build was compiled without.
fn not_built(url: &StoreUrl) -> Error {
    let (name, feature) = match url {
        StoreUrl::Sqlite(_) => ("sqlite", "sqlite"),
        StoreUrl::Etcd(_) => ("etcd", "etcd"),
        StoreUrl::ZooKeeper(_) => ("ZooKeeper", "zookeeper"),
        StoreUrl::Memory | StoreUrl::Postgres(_) => ("PostgreSQL", "postgres"),
    };
    Error::invalid(
        "store URL",
        format!("this build of leasehold has no {name} support (cargo feature \"{feature}\")"),
    )
}
