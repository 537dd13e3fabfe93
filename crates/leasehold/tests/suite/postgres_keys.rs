//! The store primitive on PostgreSQL (`PgKeys`), in a schema of its own on
//! the run's shared server. (The elections over it, `PostgresStore`, run
//! the whole conformance suite in `postgres.rs`.)

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold::backend::postgres::PgKeys;
use leasehold::store::Access;
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

/// A watch that starts from a revision older than what its handle's
/// listening connection heard reads whether its prefix changed since:
/// a write elsewhere is not told (before, any commit in the store was),
/// and a key of its prefix deleted meanwhile is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_watch_tells_its_own_prefix_alone() {
    use leasehold::backend::{Check, Keys, Write};
    let postgres = postgres().await;
    let first = postgres.keys().await;
    let put = |key: &str| Write::Put {
        key: key.to_owned(),
        value: String::new(),
        session: None,
    };
    first
        .commit(&[], &[put("mine:a")])
        .await
        .expect("commit")
        .expect("written");
    let before = first.range("mine:").await.expect("read").revision;
    first
        .commit(&[Check::Absent("theirs:b".into())], &[put("theirs:b")])
        .await
        .expect("commit")
        .expect("written");
    // A handle whose listener starts after both: it heard neither.
    let late = postgres.keys().await;
    let admin = sql(&postgres).await;
    let listening = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT value FROM \"{}\".revision'",
        postgres.schema
    );
    let started = tokio::time::Instant::now();
    while admin
        .query_one(&listening, &[])
        .await
        .expect("count")
        .get::<_, i64>(0)
        < 2
    {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "never listening"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut quiet = late.watch("mine:", before).await.expect("watch");
    let told = tokio::time::timeout(Duration::from_millis(500), quiet.changed()).await;
    assert!(told.is_err(), "a write under another prefix was told");
    first
        .commit(&[], &[Write::Delete("mine:a".into())])
        .await
        .expect("commit")
        .expect("deleted");
    let mut deleted = late.watch("mine:", before).await.expect("watch");
    tokio::time::timeout(Duration::from_secs(5), deleted.changed())
        .await
        .expect("a deletion under the prefix is told")
        .expect("watch open");
}

async fn sql(postgres: &Postgres) -> tokio_postgres::Client {
    let (client, connection) =
        tokio_postgres::connect(&postgres.server.url(), tokio_postgres::NoTls)
            .await
            .expect("connect");
    tokio::spawn(connection);
    client
}
