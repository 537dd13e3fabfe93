//! The store primitive on PostgreSQL (`PgKeys`), and the elections written
//! once over it (`KeyedStore`), in a schema of their own on the run's
//! shared server: the primitive's suite, and a budget of the store's.

use std::sync::Arc;

use async_trait::async_trait;
use leasehold::store::Store;
use leasehold::store::keyed::KeyedStore;
use leasehold::store::postgres::{PgKeys, PostgresStore};
use leasehold::testing::StoreHarness;
use leasehold::testing::keys::KeysHarness;
use leasehold_testkit::PostgresServer;
use leasehold_testkit::shared::{self, Server};

/// A schema of its own on the shared server; every handle connects anew.
struct Postgres {
    server: Server<PostgresServer>,
    schema: String,
}

async fn postgres() -> Postgres {
    let server = tokio::task::spawn_blocking(shared::postgres)
        .await
        .expect("server start");
    Postgres {
        server,
        schema: shared::unique("keys"),
    }
}

impl Postgres {
    async fn keys(&self) -> PgKeys {
        let store = PostgresStore::connect(&self.server.url(), &self.schema)
            .await
            .expect("connect");
        PgKeys::new(store)
    }
}

#[async_trait]
impl KeysHarness for Postgres {
    type Keys = PgKeys;

    async fn open(&self) -> Arc<PgKeys> {
        Arc::new(self.keys().await)
    }
}

leasehold::keys_conformance_tests!(postgres());

/// The elections written once, over PostgreSQL's primitive.
mod keyed {
    use super::*;

    struct Keyed(Postgres);

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

    // A budget of the cases on the shared server: the election's rules,
    // the paths only a store across a network shows (a request still on
    // its way when a campaign is dropped), and expiries the store does
    // not tell. Every case runs over the primitive in memory (`memory.rs`);
    // all 40 passed here too, before this budget was set.
    leasehold::conformance_tests!(@cases async { Keyed(postgres().await) };
        one_winner_among_concurrent_candidates,
        tokens_strictly_increase,
        resign_never_removes_a_successor,
        an_orphaned_grant_is_released_from_another_handle,
        a_campaign_dropped_at_any_point_never_holds,
        an_unwaited_campaign_takes_only_a_free_election,
        notes_watch_sees_puts_deletes_and_expiries,
        transfer_goes_to_the_named_standby,
        no_takeover_before_expiry,
        lock_delay_after_expiry_not_after_release,
        a_transfer_wakes_only_the_front_of_the_line,
    );
}
