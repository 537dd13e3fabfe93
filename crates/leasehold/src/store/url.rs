//! Store selection by URL (`--store`, `LEASEHOLD_STORE`).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::store::Store;
use crate::store::memory::MemoryStore;

/// A parsed store URL.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// `memory:` — in-process; every [`open`] creates a new, empty store.
    Memory,
    /// `sqlite:PATH` — the embedded store in the file at `PATH`.
    Sqlite(PathBuf),
    /// `etcd://host:port[,host:port…][/prefix]` — an etcd v3 cluster.
    Etcd {
        /// `host:port` of each member to try.
        endpoints: Vec<String>,
        /// Where leasehold's keys live (default `/leasehold`).
        prefix: String,
    },
    /// `zk://host:port[,host:port…][/chroot]` — a ZooKeeper ensemble.
    ZooKeeper {
        /// `host:port` of each server to try.
        endpoints: Vec<String>,
        /// The node under which leasehold's nodes live (default `/leasehold`).
        root: String,
    },
    /// `postgres://…` or `postgresql://…` — a PostgreSQL database.
    Postgres {
        /// The connection URL as given, without leasehold's own `schema`
        /// parameter.
        url: String,
        /// The schema leasehold's tables live in (`?schema=NAME`, default
        /// `leasehold`).
        schema: String,
    },
}

const SCHEMES: &str = "sqlite:PATH, etcd://HOST:PORT[,HOST:PORT…][/PREFIX], \
     zk://HOST:PORT[,HOST:PORT…][/CHROOT], postgres://USER@HOST[:PORT]/DB[?schema=NAME] or memory:";

/// The default PostgreSQL schema.
pub const DEFAULT_POSTGRES_SCHEMA: &str = "leasehold";

/// `HOST:PORT[,HOST:PORT…][/PATH]` after `scheme://`: the endpoints and the
/// path (without a trailing `/`, empty if none).
fn parse_cluster(url: &str, scheme: &str, rest: &str) -> Result<(Vec<String>, String)> {
    let bad = |reason: String| Error::invalid("store URL", format!("{url:?}: {reason}"));
    let path_name = if scheme == "zk" { "CHROOT" } else { "PREFIX" };
    let rest = rest.strip_prefix("//").ok_or_else(|| {
        bad(format!(
            "expected {scheme}://HOST:PORT[,HOST:PORT…][/{path_name}]"
        ))
    })?;
    let (hosts, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/').to_owned()),
        None => (rest, String::new()),
    };
    let mut endpoints = Vec::new();
    for host in hosts.split(',') {
        let Some((name, port)) = host.rsplit_once(':') else {
            return Err(bad(format!("endpoint {host:?} has no :PORT")));
        };
        if name.is_empty() || port.parse::<u16>().is_err() {
            return Err(bad(format!("endpoint {host:?} is not HOST:PORT")));
        }
        endpoints.push(host.to_owned());
    }
    if prefix.contains("//") {
        return Err(bad(format!("{path_name} {prefix:?} has an empty segment")));
    }
    Ok((endpoints, prefix))
}

fn parse_etcd(url: &str, rest: &str) -> Result<StoreUrl> {
    let (endpoints, prefix) = parse_cluster(url, "etcd", rest)?;
    let prefix = if prefix.is_empty() {
        crate::store::etcd_default_prefix().to_owned()
    } else {
        prefix
    };
    Ok(StoreUrl::Etcd { endpoints, prefix })
}

fn parse_zookeeper(url: &str, rest: &str) -> Result<StoreUrl> {
    let (endpoints, root) = parse_cluster(url, "zk", rest)?;
    let root = if root.is_empty() {
        crate::store::etcd_default_prefix().to_owned()
    } else {
        root
    };
    Ok(StoreUrl::ZooKeeper { endpoints, root })
}

/// Takes leasehold's `schema` parameter out of a PostgreSQL URL; the rest
/// goes to tokio-postgres unchanged.
fn parse_postgres(url: &str) -> Result<StoreUrl> {
    let bad = |reason: String| Error::invalid("store URL", reason);
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, query),
        None => (url, ""),
    };
    let mut schema = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("schema", name)) => schema = Some(name.to_owned()),
            _ => kept.push(pair),
        }
    }
    let schema = schema.unwrap_or_else(|| DEFAULT_POSTGRES_SCHEMA.to_owned());
    let valid = !schema.is_empty()
        && schema.len() <= 63
        && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid {
        return Err(bad(format!(
            "schema {schema:?} must be 1–63 characters of a-z, 0-9 and _, not starting with a digit"
        )));
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok(StoreUrl::Postgres { url, schema })
}

impl StoreUrl {
    /// The default store: `sqlite:$XDG_STATE_HOME/leasehold/leasehold.db`,
    /// falling back to `~/.local/state/leasehold/leasehold.db`.
    pub fn default_sqlite() -> Result<Self> {
        let state_home = std::env::var_os("XDG_STATE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .map(|home| PathBuf::from(home).join(".local/state"))
            })
            .ok_or_else(|| {
                Error::invalid(
                    "store",
                    "no --store given and neither XDG_STATE_HOME nor HOME is set",
                )
            })?;
        Ok(StoreUrl::Sqlite(
            state_home.join("leasehold").join("leasehold.db"),
        ))
    }
}

impl FromStr for StoreUrl {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        let Some((scheme, rest)) = url.split_once(':') else {
            return Err(Error::invalid(
                "store URL",
                format!("{url:?} has no scheme; expected {SCHEMES}"),
            ));
        };
        match scheme {
            "memory" if rest.is_empty() || rest == "//" => Ok(StoreUrl::Memory),
            "memory" => Err(Error::invalid(
                "store URL",
                format!("{url:?}: memory: takes no path"),
            )),
            "sqlite" => {
                let path = rest.strip_prefix("//").unwrap_or(rest);
                if path.is_empty() {
                    return Err(Error::invalid(
                        "store URL",
                        format!("{url:?} names no file; expected sqlite:PATH"),
                    ));
                }
                Ok(StoreUrl::Sqlite(PathBuf::from(path)))
            }
            "etcd" => parse_etcd(url, rest),
            "zk" => parse_zookeeper(url, rest),
            "postgres" | "postgresql" => parse_postgres(url),
            other => Err(Error::invalid(
                "store URL",
                format!("unknown scheme {other:?} in {url:?}; expected {SCHEMES}"),
            )),
        }
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory:"),
            StoreUrl::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            StoreUrl::Etcd { endpoints, prefix } => {
                write!(f, "etcd://{}{prefix}", endpoints.join(","))
            }
            StoreUrl::ZooKeeper { endpoints, root } => {
                write!(f, "zk://{}{root}", endpoints.join(","))
            }
            // Without the password, if the URL has one.
            StoreUrl::Postgres { url, schema } => {
                f.write_str(&redact_password(url))?;
                if schema != DEFAULT_POSTGRES_SCHEMA {
                    let sep = if url.contains('?') { '&' } else { '?' };
                    write!(f, "{sep}schema={schema}")?;
                }
                Ok(())
            }
        }
    }
}

/// `scheme://user:password@host…` → `scheme://user:***@host…`.
fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// Opens the store a URL names (connecting to it, for a remote store).
pub async fn open(url: &StoreUrl) -> Result<Arc<dyn Store>> {
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
        StoreUrl::Etcd { endpoints, prefix } => Ok(Arc::new(
            crate::store::etcd::EtcdStore::connect(endpoints, prefix).await?,
        )),
        #[cfg(not(feature = "etcd"))]
        StoreUrl::Etcd { .. } => Err(Error::invalid(
            "store URL",
            "this build of leasehold has no etcd support (cargo feature \"etcd\")",
        )),
        #[cfg(feature = "zookeeper")]
        StoreUrl::ZooKeeper { endpoints, root } => Ok(Arc::new(
            crate::store::zookeeper::ZkStore::connect(endpoints, root).await?,
        )),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_schemes() {
        assert_eq!("memory:".parse::<StoreUrl>().ok(), Some(StoreUrl::Memory));
        assert_eq!(
            "sqlite:/var/lib/x.db".parse::<StoreUrl>().ok(),
            Some(StoreUrl::Sqlite("/var/lib/x.db".into()))
        );
        assert_eq!(
            "sqlite:///var/lib/x.db".parse::<StoreUrl>().ok(),
            Some(StoreUrl::Sqlite("/var/lib/x.db".into()))
        );
        assert_eq!(
            "sqlite:rel.db".parse::<StoreUrl>().ok(),
            Some(StoreUrl::Sqlite("rel.db".into()))
        );
        assert_eq!(
            "etcd://10.0.0.1:2379,10.0.0.2:2379/team/jobs/"
                .parse::<StoreUrl>()
                .ok(),
            Some(StoreUrl::Etcd {
                endpoints: vec!["10.0.0.1:2379".into(), "10.0.0.2:2379".into()],
                prefix: "/team/jobs".into()
            })
        );
        assert_eq!(
            "etcd://localhost:2379".parse::<StoreUrl>().ok(),
            Some(StoreUrl::Etcd {
                endpoints: vec!["localhost:2379".into()],
                prefix: "/leasehold".into()
            })
        );
    }

    #[test]
    fn parses_zookeeper_and_postgres() {
        assert_eq!(
            "zk://a:2181,b:2181".parse::<StoreUrl>().ok(),
            Some(StoreUrl::ZooKeeper {
                endpoints: vec!["a:2181".into(), "b:2181".into()],
                root: "/leasehold".into()
            })
        );
        assert_eq!(
            "postgres://u@h/db?schema=jobs&sslmode=disable"
                .parse::<StoreUrl>()
                .ok(),
            Some(StoreUrl::Postgres {
                url: "postgres://u@h/db?sslmode=disable".into(),
                schema: "jobs".into()
            })
        );
        let with_password: StoreUrl = "postgres://u:secret@h/db".parse().expect("valid");
        assert_eq!(with_password.to_string(), "postgres://u:***@h/db");
    }

    #[test]
    fn rejects_bad_urls_with_reason() {
        for (url, needle) in [
            ("", "no scheme"),
            ("/tmp/x.db", "no scheme"),
            ("redis://x", "unknown scheme \"redis\""),
            ("sqlite:", "names no file"),
            ("memory:foo", "takes no path"),
            ("zk:127.0.0.1:2181", "expected zk://"),
            ("zk://127.0.0.1", "no :PORT"),
            ("zk://h:1/a//b", "empty segment"),
            ("postgres://h/db?schema=Bad-Name", "schema \"Bad-Name\""),
            ("postgresql://h/db?schema=", "schema \"\""),
            ("postgres://h/db?schema=9lives", "not starting with a digit"),
            ("etcd:127.0.0.1:2379", "expected etcd://"),
            ("etcd://127.0.0.1", "no :PORT"),
            ("etcd://127.0.0.1:x", "not HOST:PORT"),
            ("etcd://a:1,,b:2", "no :PORT"),
        ] {
            let err = url.parse::<StoreUrl>().expect_err(url).to_string();
            assert!(err.contains(needle), "{url:?}: {err}");
        }
    }

    #[test]
    fn display_round_trips() {
        for url in [
            "memory:",
            "sqlite:/a/b.db",
            "etcd://h:1,k:2/p",
            "zk://h:1,k:2/jobs",
            "postgres://u@h:5432/db",
            "postgresql://u@h/db?sslmode=disable&schema=jobs",
        ] {
            let parsed: StoreUrl = url.parse().expect("valid");
            assert_eq!(parsed.to_string(), url);
        }
    }
}
