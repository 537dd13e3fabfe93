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
}

const SCHEMES: &str = "sqlite:PATH or memory:";

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
            "etcd" | "zk" | "postgres" | "postgresql" => Err(Error::invalid(
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
        }
    }
}

/// Opens the store a URL names.
pub fn open(url: &StoreUrl) -> Result<Arc<dyn Store>> {
    match url {
        StoreUrl::Memory => Ok(Arc::new(MemoryStore::new())),
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(path) => Ok(Arc::new(crate::store::sqlite::SqliteStore::open(path)?)),
        #[cfg(not(feature = "sqlite"))]
        StoreUrl::Sqlite(_) => Err(Error::invalid(
            "store URL",
            "this build of leasehold has no sqlite support (cargo feature \"sqlite\")",
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
    }

    #[test]
    fn rejects_bad_urls_with_reason() {
        for (url, needle) in [
            ("", "no scheme"),
            ("/tmp/x.db", "no scheme"),
            ("redis://x", "unknown scheme \"redis\""),
            ("sqlite:", "names no file"),
            ("memory:foo", "takes no path"),
            ("etcd://127.0.0.1:2379", "not available"),
        ] {
            let err = url.parse::<StoreUrl>().expect_err(url).to_string();
            assert!(err.contains(needle), "{url:?}: {err}");
        }
    }

    #[test]
    fn display_round_trips() {
        for url in ["memory:", "sqlite:/a/b.db"] {
            let parsed: StoreUrl = url.parse().expect("valid");
            assert_eq!(parsed.to_string(), url);
        }
    }
}
