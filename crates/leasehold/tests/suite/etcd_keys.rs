//! The store primitive on etcd (`EtcdKeys`), and the elections written
//! once over it (`KeyedStore`), on a prefix of their own of the run's
//! shared cluster: both conformance suites.

use std::sync::Arc;

use async_trait::async_trait;
use leasehold::store::etcd::{EtcdKeys, EtcdStore};
use leasehold::store::keyed::KeyedStore;
use leasehold::store::{Access, Store};
use leasehold::testing::StoreHarness;
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
        let store = EtcdStore::open(&self.url, Access::ReadWrite)
            .await
            .expect("open");
        EtcdKeys::new(store)
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

/// The elections written once, over etcd's primitive.
mod keyed {
    use super::*;

    struct Keyed(Etcd);

    #[async_trait]
    impl StoreHarness for Keyed {
        async fn open(&self) -> Arc<dyn Store> {
            Arc::new(KeyedStore::over(self.0.keys().await))
        }

        fn durable(&self) -> bool {
            true
        }

        fn campaigns_unwaited(&self) -> bool {
            true
        }
    }

    leasehold::conformance_tests!(async { Keyed(etcd().await) });
}
