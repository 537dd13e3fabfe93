//! The conformance suite and etcd-specific faults against a real 3-member
//! cluster (Debian's etcd-server), started per test on free loopback ports.

use std::sync::Arc;

use async_trait::async_trait;
use leasehold::store::Store;
use leasehold::store::etcd::EtcdStore;
use leasehold::testing::{EtcdCluster, StoreHarness};

struct EtcdHarness {
    cluster: EtcdCluster,
}

#[async_trait]
impl StoreHarness for EtcdHarness {
    async fn open(&self) -> Arc<dyn Store> {
        Arc::new(
            EtcdStore::connect(&self.cluster.endpoints(), "/conformance")
                .await
                .expect("connect to the test cluster"),
        )
    }

    fn durable(&self) -> bool {
        true
    }
}

async fn harness() -> EtcdHarness {
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(3))
        .await
        .expect("cluster start");
    EtcdHarness { cluster }
}

leasehold::conformance_tests!(harness());
