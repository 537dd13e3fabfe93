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
}

const SCHEMES: &str = "sqlite:PATH, etcd://HOST:PORT[,HOST:PORT…][/PREFIX] or memory:";

fn parse_etcd(url: &str, rest: &str) -> Result<StoreUrl> {
    let bad = |reason: String| Error::invalid("store URL", format!("{url:?}: {reason}"));
    let rest = rest
        .strip_prefix("//")
        .ok_or_else(|| bad("expected etcd://HOST:PORT[,HOST:PORT…][/PREFIX]".into()))?;
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
    let prefix = if prefix.is_empty() {
        crate::store::etcd_default_prefix().to_owned()
    } else {
        prefix
    };
    Ok(StoreUrl::Etcd { endpoints, prefix })
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
            "zk" | "postgres" | "postgresql" => Err(Error::invalid(
                "store URL",
                format!("the {scheme}: store is not available in this build yet; use {SCHEMES}"),
            )),
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
        }
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
    fn rejects_bad_urls_with_reason() {
        for (url, needle) in [
            ("", "no scheme"),
            ("/tmp/x.db", "no scheme"),
            ("redis://x", "unknown scheme \"redis\""),
            ("sqlite:", "names no file"),
            ("memory:foo", "takes no path"),
            ("zk://127.0.0.1:2181", "not available"),
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
        for url in ["memory:", "sqlite:/a/b.db", "etcd://h:1,k:2/p"] {
            let parsed: StoreUrl = url.parse().expect("valid");
            assert_eq!(parsed.to_string(), url);
        }
    }
}
