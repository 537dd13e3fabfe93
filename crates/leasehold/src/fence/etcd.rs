//! etcd keys written only while a grant leads (feature `etcd`):
//! [`EtcdFence::put`] is one etcd transaction that writes only if the
//! election's leader key still carries the grant's token (its create
//! revision), so a leader that has lost the election, paused or not, can
//! no longer write.

use crate::error::{Error, Result};
use crate::grant::Grant;
use crate::store::etcd::EtcdStore;
use crate::store::{Access, StoreUrl};

/// Fenced writes to the etcd cluster of an `etcd://` store, to keys
/// outside that store.
#[derive(Debug, Clone)]
pub struct EtcdFence {
    store: EtcdStore,
}

impl EtcdFence {
    /// Connects to the cluster `url` names: the URL the elections use
    /// (its prefix and layout tell where their keys are). Anything but an
    /// `etcd://` URL is [`Error::InvalidInput`].
    pub async fn open(url: &StoreUrl) -> Result<Self> {
        let StoreUrl::Etcd(cluster) = url else {
            return Err(Error::invalid(
                "store URL",
                format!("fenced etcd writes need an etcd:// URL, not {url}"),
            ));
        };
        let store = EtcdStore::open(cluster, Access::ReadWrite).await?;
        Ok(EtcdFence { store })
    }

    /// Writes `value` at `key` (a key of etcd's, outside the store's
    /// space: a key inside it is [`Error::InvalidInput`], as it would be
    /// taken for the store's own) only while `grant` still leads its
    /// election. Once leadership has moved, the write cannot land:
    /// [`Error::Stale`] names the successor's token, or
    /// [`Error::NotHolder`] if nobody holds the election.
    pub async fn put(&self, grant: &Grant, key: &str, value: impl Into<Vec<u8>>) -> Result<()> {
        self.store.put_fenced(grant, key, value).await
    }
}
