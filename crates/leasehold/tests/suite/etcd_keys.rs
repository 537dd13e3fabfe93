//! The store primitive on etcd (`EtcdKeys`), on a prefix of its own of
//! the run's shared cluster: the primitive's suite. (The elections over it
//! are `etcd://` itself: `etcd.rs` runs the store's suite.)

use std::sync::Arc;

use async_trait::async_trait;
use leasehold::backend::etcd::EtcdKeys;
use leasehold::store::Access;
use leasehold::testing::keys::KeysHarness;
use leasehold_testkit::EtcdCluster;
use leasehold_testkit::shared::{self, Server};

/// A prefix of its own on the shared cluster; every handle opens it anew.
struct Etcd {
    _cluster: Server<EtcdCluster>,
    url: leasehold::store::ClusterUrl,
}

async fn etcd() -> Etcd {
    let cluster = tokio::task::spawn_blocking(shared::etcd)
        .await
        .expect("cluster start");
    let url = cluster.url(&shared::unique("/keys"));
    Etcd {
        url: url.parse().expect("a valid etcd URL"),
        _cluster: cluster,
    }
}

impl Etcd {
    async fn keys(&self) -> EtcdKeys {
        EtcdKeys::open(&self.url, Access::ReadWrite)
            .await
            .expect("open")
    }
}

#[async_trait]
impl KeysHarness for Etcd {
    type Keys = EtcdKeys;

    async fn open(&self) -> Arc<EtcdKeys> {
        Arc::new(self.keys().await)
    }
}

leasehold::keys_conformance_tests!(etcd());
