//! The store primitive on PostgreSQL (`PgKeys`), in a schema of its own on
//! the run's shared server. (The elections over it, `PostgresStore`, run
//! the whole conformance suite in `postgres.rs`.)

use std::sync::Arc;

use async_trait::async_trait;
use leasehold::store::Access;
use leasehold::store::postgres::PgKeys;
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
        PgKeys::open(&self.server.url(), &self.schema, Access::ReadWrite)
            .await
            .expect("connect")
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
