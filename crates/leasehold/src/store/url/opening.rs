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

/// Opens the store a URL names (connecting to it, for a remote store),
/// after checking the URL against the grammar ([`StoreUrl::validate`]).
///
/// The password may come from the environment variable
/// `LEASEHOLD_STORE_PASSWORD` ([`PASSWORD_ENV`]) instead of the URL, as
/// for the command line: the URL then names only the user (etcd,
/// ZooKeeper; PostgreSQL may take its user from elsewhere too). While it
/// is set, a URL that holds a password (or a `password_file`) and a store
/// that takes none (`memory:`, `sqlite:`) are refused
/// ([`StoreUrl::with_password_from_env`]).
pub async fn open(url: &StoreUrl) -> Result<Arc<dyn Store>> {
    url.validate()?;
    open_checked(&url.clone().with_password_from_env()?).await
}

/// [`open`] of a URL already checked, its password from the environment
/// already taken.
pub(super) async fn open_checked(url: &StoreUrl) -> Result<Arc<dyn Store>> {
    match url {
        StoreUrl::Memory => Ok(Arc::new(MemoryStore::new())),
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(path) => Ok(Arc::new(crate::store::sqlite::SqliteStore::open(path)?)),
        #[cfg(not(feature = "sqlite"))]
        StoreUrl::Sqlite(_) => Err(Error::invalid(
            "store URL",
            "this build of leasehold has no sqlite support (cargo feature \"sqlite\")",
        )),
        #[cfg(feature = "etcd")]
        StoreUrl::Etcd {
            endpoints,
            prefix,
            security,
            layout,
        } => {
            resolve_any("etcd", endpoints).await?;
            Ok(Arc::new(
                crate::store::etcd::EtcdStore::connect_with_layout(
                    endpoints, prefix, security, *layout,
                )
                .await?,
            ))
        }
        #[cfg(not(feature = "etcd"))]
        StoreUrl::Etcd { .. } => Err(Error::invalid(
            "store URL",
            "this build of leasehold has no etcd support (cargo feature \"etcd\")",
        )),
        #[cfg(feature = "zookeeper")]
        StoreUrl::ZooKeeper {
            endpoints,
            root,
            security,
            layout,
        } => {
            resolve_any("ZooKeeper", endpoints).await?;
            Ok(Arc::new(
                crate::store::zookeeper::ZkStore::connect_with_layout(
                    endpoints, root, security, *layout,
                )
                .await?,
            ))
        }
        #[cfg(not(feature = "zookeeper"))]
        StoreUrl::ZooKeeper { .. } => Err(Error::invalid(
            "store URL",
            "this build of leasehold has no ZooKeeper support (cargo feature \"zookeeper\")",
        )),
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres { url, schema } => Ok(Arc::new(
            crate::store::postgres::PostgresStore::connect(url, schema).await?,
        )),
        #[cfg(not(feature = "postgres"))]
        StoreUrl::Postgres { .. } => Err(Error::invalid(
            "store URL",
            "this build of leasehold has no PostgreSQL support (cargo feature \"postgres\")",
        )),
    }
}

/// Releases `grant`, whose holder's process is known to be dead (a
/// runner's guard does this after its runner died), through a connection
/// opened for this alone: guarded by the token as [`Store::resign`] is, it
/// never removes a successor's grant. PostgreSQL and ZooKeeper skip the
/// checks of a first use (the holder's process made them when it opened
/// the store) and start no watch, so the release goes out after one
/// connection; SQLite and etcd open as [`open`] does.
pub async fn release_orphaned(url: &StoreUrl, grant: &crate::store::Grant) -> Result<()> {
    open_to_release(url).await?.release_orphaned(grant).await
}

/// Opens the store a URL names for [`release_orphaned`] and nothing else
/// (see there): on PostgreSQL and ZooKeeper, without the checks of a first
/// use and without watches.
pub async fn open_to_release(url: &StoreUrl) -> Result<Arc<dyn Store>> {
    url.validate()?;
    let url = &url.clone().with_password_from_env()?;
    Ok(match url {
        #[cfg(feature = "zookeeper")]
        StoreUrl::ZooKeeper {
            endpoints,
            root,
            security,
            layout,
        } => {
            resolve_any("ZooKeeper", endpoints).await?;
            Arc::new(crate::store::zookeeper::ZkStore::to_release(
                endpoints, root, security, *layout,
            )?)
        }
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres { url, schema } => {
            Arc::new(crate::store::postgres::PostgresStore::connect_to_release(url, schema).await?)
        }
        _ => open_checked(url).await?,
    })
}

/// Opens the store a URL names for reading only — what `status`, `list`
/// and `observe` need — as [`open`] does, but creating nothing and writing
/// nothing: no file, folder, schema, node, key or marker. A store that does
/// not exist yet is [`Error::NotFound`]; on the store returned, sessions
/// and campaigns fail with [`Error::InvalidInput`].
///
/// SQLite (`SqliteStore::open_read_only`), etcd
/// (`EtcdStore::connect_read_only`), ZooKeeper
/// (`ZkStore::connect_read_only`) and PostgreSQL
/// (`PostgresStore::connect_read_only`) open read-only; `memory:` is a
/// new, empty store either way.
pub async fn open_read_only(url: &StoreUrl) -> Result<Arc<dyn Store>> {
    url.validate()?;
    let url = &url.clone().with_password_from_env()?;
    #[cfg(feature = "sqlite")]
    if let StoreUrl::Sqlite(path) = url {
        return Ok(Arc::new(crate::store::sqlite::SqliteStore::open_read_only(
            path,
        )?));
    }
    #[cfg(feature = "etcd")]
    if let StoreUrl::Etcd {
        endpoints,
        prefix,
        security,
        layout,
    } = url
    {
        resolve_any("etcd", endpoints).await?;
        return Ok(Arc::new(
            crate::store::etcd::EtcdStore::connect_read_only_with_layout(
                endpoints, prefix, security, *layout,
            )
            .await?,
        ));
    }
    #[cfg(feature = "zookeeper")]
    if let StoreUrl::ZooKeeper {
        endpoints,
        root,
        security,
        layout,
    } = url
    {
        resolve_any("ZooKeeper", endpoints).await?;
        return Ok(Arc::new(
            crate::store::zookeeper::ZkStore::connect_read_only_with_layout(
                endpoints, root, security, *layout,
            )
            .await?,
        ));
    }
    #[cfg(feature = "postgres")]
    if let StoreUrl::Postgres { url, schema } = url {
        return Ok(Arc::new(
            crate::store::postgres::PostgresStore::connect_read_only(url, schema).await?,
        ));
    }
    open(url).await
}
