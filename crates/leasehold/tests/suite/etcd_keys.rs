//! The store primitive on etcd (`EtcdKeys`), and the elections written
//! once over it (`KeyedStore`), on a prefix of their own of the run's
//! shared cluster: the primitive's suite, and a budget of the store's.

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

    // A budget of the cases on the shared cluster: the election's rules and
    // the paths only a store across a network shows (a request still on
    // its way when a campaign is dropped). Every case runs over the
    // primitive in memory (`memory.rs`).
    leasehold::conformance_tests!(@cases async { Keyed(etcd().await) };
        one_winner_among_concurrent_candidates,
        tokens_strictly_increase,
        resign_never_removes_a_successor,
        an_orphaned_grant_is_released_from_another_handle,
        a_campaign_dropped_at_any_point_never_holds,
        an_unwaited_campaign_takes_only_a_free_election,
        notes_watch_sees_puts_deletes_and_expiries,
        transfer_goes_to_the_named_standby,
    );
}
