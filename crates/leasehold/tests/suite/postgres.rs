//! The conformance suite and PostgreSQL-specific cases against a real
//! server (Debian's postgresql), started per test on a free loopback port.

use std::sync::Arc;
use std::time::Duration;

use leasehold::backend::postgres::{PostgresStore, SCHEMA_VERSION};
use leasehold::store::StatusWatch;
use leasehold::store::{Access, Store};
use leasehold::testing::{
    ServerHarness, StoreHarness, campaign_until_granted, spawn_campaign, unique_election,
};
use leasehold::{CandidateId, Elector, Error, Grant, LeaderStatus, LeaseConfig};
use leasehold_testkit::PostgresServer;
use leasehold_testkit::shared::{self, Server};
use tokio::time::Instant;

async fn server() -> PostgresServer {
    tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .expect("server start")
}

/// The conformance suite's store: a schema of its own on the run's shared
/// server (see `leasehold_testkit::shared`), whose token counters a test
/// may set.
struct PgHarness {
    harness: ServerHarness<Server<PostgresServer>>,
    schema: String,
}

async fn harness() -> PgHarness {
    let server = tokio::task::spawn_blocking(shared::postgres)
        .await
        .expect("server start");
    let schema = shared::unique("conformance");
    let url = format!("{}?schema={schema}", server.url());
    PgHarness {
        harness: ServerHarness::new(server, &url),
        schema,
    }
}

#[async_trait::async_trait]
impl StoreHarness for PgHarness {
    async fn open(&self) -> Arc<dyn Store> {
        self.harness.open().await
    }

    fn durable(&self) -> bool {
        self.harness.durable()
    }

    fn campaigns_unwaited(&self) -> bool {
        self.harness.campaigns_unwaited()
    }
}

leasehold::conformance_tests!(harness());

/// Sets the store's revision counter (the last token given) by hand, as
/// an operator's own tools would.
async fn set_revision(harness: &PgHarness, last: i64) {
    let set = sql(&harness.harness.server().url())
        .await
        .execute(
            &format!("UPDATE {}.revision SET value = $1", harness.schema),
            &[&last],
        )
        .await
        .expect("set the counter");
    assert_eq!(set, 1, "one revision row");
}

async fn revision(harness: &PgHarness) -> i64 {
    sql(&harness.harness.server().url())
        .await
        .query_one(
            &format!("SELECT value FROM {}.revision", harness.schema),
            &[],
        )
        .await
        .expect("read the counter")
        .get(0)
}

/// The revisions (the tokens) at the largest bigint: a grant gets the
/// largest token, and the next change is refused as corrupt, naming the
/// counter, with nothing written (`bigint out of range` was an outage,
/// retried forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_revision_counter_is_corrupt() {
    let harness = harness().await;
    let store = harness.open().await;
    let election = unique_election("exhausted");
    set_revision(&harness, i64::MAX - 1).await;
    let last = leasehold::testing::campaign_on_new_session(
        &*store,
        &election,
        "a",
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(last.token.to_i64(), Some(i64::MAX), "the largest token");
    let refused = store.resign(&last).await;
    match &refused {
        Err(Error::Corrupt(message)) => {
            assert!(message.contains("exhausted"), "{message}");
            assert!(message.contains(&harness.schema), "{message}");
            assert!(!message.contains('\n'), "{message}");
        }
        other => panic!("a change past the largest revision must be Corrupt, got {other:?}"),
    }
    let lease = store
        .open_session(Duration::from_secs(30))
        .await
        .expect("open");
    let elector = Elector::new(
        Arc::clone(&store),
        CandidateId::new("b").expect("id"),
        LeaseConfig::new(Duration::from_secs(30)),
    )
    .expect("config");
    let other = unique_election("exhausted-other");
    match tokio::time::timeout(Duration::from_secs(15), elector.campaign(&other)).await {
        Ok(Err(Error::Corrupt(message))) => assert!(message.contains("exhausted"), "{message}"),
        other => panic!("a campaign past the largest revision must be Corrupt, got {other:?}"),
    }
    assert_eq!(store.leader(&other).await.expect("read"), None);
    assert_eq!(revision(&harness).await, i64::MAX, "the counter changed");
    store.close_session(lease.id).await.ok();
}

/// A revision counter below zero (set by hand, or a damaged store) holds
/// no count of grants: a campaign is refused as corrupt, nothing written
/// (PostgreSQL granted token 0 again and again, and could not release it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_revision_counter_is_corrupt() {
    let harness = harness().await;
    let store = harness.open().await;
    let election = unique_election("negative");
    let first = leasehold::testing::campaign_on_new_session(
        &*store,
        &election,
        "a",
        Duration::from_secs(30),
    )
    .await;
    store.resign(&first).await.expect("resign");
    set_revision(&harness, -5).await;
    let lease = refused_campaign(&harness, &*store, &election, "no count of grants").await;
    assert_eq!(store.leader(&election).await.expect("read"), None);
    // Ending a session writes nothing either (found by a review: it wrote
    // revision -4).
    assert!(matches!(
        store.close_session(lease).await,
        Err(Error::Corrupt(_))
    ));
    assert_eq!(revision(&harness).await, -5, "the counter changed");
}

/// A campaign on a new session that the store refuses as corrupt, in one
/// line that says `why` and names the schema's counter; the session.
async fn refused_campaign(
    harness: &PgHarness,
    store: &dyn Store,
    election: &leasehold::ElectionName,
    why: &str,
) -> leasehold::store::SessionId {
    let lease = store
        .open_session(Duration::from_secs(30))
        .await
        .expect("open");
    let refused = tokio::time::timeout(
        Duration::from_secs(15),
        store.campaign(lease.id, election, &CandidateId::new("b").expect("id")),
    )
    .await
    .expect("refused in time");
    match refused {
        Err(Error::Corrupt(message)) => {
            assert!(message.contains(why), "{message}");
            let counter = format!("{}.revision", harness.schema);
            assert!(message.contains(&counter), "{message}");
            assert!(!message.contains('\n'), "{message}");
        }
        other => panic!("a campaign on a counter that is no count must be Corrupt, got {other:?}"),
    }
    lease.id
}

/// A revision counter set below the revision a key was written at: a key
/// created there would lead beside the holder (found by a review: two
/// commands ran, the newcomer's with token 12 beside the holder's 124). It
/// is refused as corrupt, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revision_counter_below_a_written_key_is_corrupt() {
    let harness = harness().await;
    let store = harness.open().await;
    let election = unique_election("lowered");
    let held = leasehold::testing::campaign_on_new_session(
        &*store,
        &election,
        "a",
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(held.token.0, 1, "the schema's first commit");
    set_revision(&harness, 0).await;
    refused_campaign(&harness, &*store, &election, "below revision").await;
    assert_eq!(
        store
            .leader(&election)
            .await
            .expect("read")
            .map(|l| l.token),
        Some(held.token),
        "the holder still leads, alone"
    );
    assert_eq!(revision(&harness).await, 0, "the counter changed");
}

async fn sql(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

/// A leader's key deleted, changed or added by hand is refused: a hand-made
/// `DELETE` sends no notice, so the successor led at once while the holder
/// went on until its next renewal (a review saw both commands run, 4 times
/// in 4). leasehold's own writes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keys_are_written_by_leasehold_alone() {
    let server = server().await;
    let store = PostgresStore::connect(&server.url(), "byhand")
        .await
        .expect("first use");
    let election = leasehold::testing::unique_election("byhand");
    let grant = leasehold::testing::campaign_on_new_session(
        &store,
        &election,
        "a",
        Duration::from_secs(30),
    )
    .await;
    let admin = sql(&server.url()).await;
    for statement in [
        "DELETE FROM byhand.keys",
        "UPDATE byhand.keys SET value = 'b'",
        "INSERT INTO byhand.keys VALUES ('x:c:0000000000000001', 'x', NULL, 1, 1)",
        "TRUNCATE byhand.keys",
    ] {
        let refused = admin.batch_execute(statement).await.expect_err(statement);
        assert!(
            refused.to_string().contains("written by leasehold alone")
                || format!("{refused:?}").contains("written by leasehold alone"),
            "{statement}: {refused:?}"
        );
    }
    let leader = store.leader(&election).await.expect("read").expect("held");
    assert_eq!(leader.token, grant.token, "the grant stays");
    store.resign(&grant).await.expect("leasehold's own write");
    assert_eq!(store.leader(&election).await.expect("read"), None);
}

/// A schema named by a reserved word of SQL (`select`, `user`) is a schema
/// like any other: statements quote its name (a review found `?schema=user`
/// failing with a syntax error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_named_by_a_reserved_word_works() {
    let server = server().await;
    for schema in ["select", "user"] {
        let store = PostgresStore::connect(&server.url(), schema)
            .await
            .unwrap_or_else(|e| panic!("{schema}: {e}"));
        let election = leasehold::testing::unique_election("reserved");
        let grant = leasehold::testing::campaign_on_new_session(
            &store,
            &election,
            "a",
            Duration::from_secs(30),
        )
        .await;
        let leader = store.leader(&election).await.expect("read").expect("held");
        assert_eq!(leader.token, grant.token, "{schema}");
        store.resign(&grant).await.expect("release");
        let read = PostgresStore::open(&server.url(), schema, Access::ReadOnly)
            .await
            .expect("read-only");
        assert_eq!(read.leader(&election).await.expect("read"), None);
    }
}

/// First use creates the schema with a version table; a store written by a
/// newer leasehold is refused, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_is_versioned_and_a_newer_one_is_refused() {
    let server = server().await;
    let store = PostgresStore::connect(&server.url(), "jobs")
        .await
        .expect("first use");
    drop(store);
    let admin = sql(&server.url()).await;
    let version: i64 = admin
        .query_one("SELECT version FROM jobs.schema_version", &[])
        .await
        .expect("version row")
        .get(0);
    assert_eq!(version, SCHEMA_VERSION);
    // Concurrent first uses of another schema all succeed.
    let mut opens = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let url = server.url();
        opens.spawn(async move { PostgresStore::connect(&url, "racing").await.map(|_| ()) });
    }
    while let Some(opened) = opens.join_next().await {
        opened.expect("task").expect("concurrent first use");
    }

    admin
        .batch_execute("UPDATE jobs.schema_version SET version = 99")
        .await
        .expect("pretend a newer leasehold wrote it");
    let before = dump(&admin, "jobs").await;
    match PostgresStore::connect(&server.url(), "jobs").await {
        Err(Error::IncompatibleSchema { found, supported }) => {
            assert_eq!((found, supported), (99, SCHEMA_VERSION));
        }
        other => panic!("a newer schema must be refused, got {other:?}"),
    }
    assert_eq!(dump(&admin, "jobs").await, before, "something was written");

    // Tables of another program in the schema: refused, nothing written.
    admin
        .batch_execute("CREATE SCHEMA app; CREATE TABLE app.sessions (x int)")
        .await
        .expect("another program's schema");
    match PostgresStore::connect(&server.url(), "app").await {
        Err(Error::Corrupt(message)) => assert!(message.contains("did not create"), "{message}"),
        other => panic!("foreign tables must be refused, got {other:?}"),
    }
    let tables: i64 = admin
        .query_one(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'app'",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(tables, 1);
}

async fn dump(client: &tokio_postgres::Client, schema: &str) -> Vec<String> {
    let mut out = Vec::new();
    for table in ["schema_version", "sessions", "revision", "keys"] {
        for row in client
            .query(
                &format!("SELECT t::text FROM {schema}.{table} t ORDER BY 1"),
                &[],
            )
            .await
            .expect("dump")
        {
            out.push(format!("{table}: {}", row.get::<_, String>(0)));
        }
    }
    out
}

/// Expiry is on the server's clock: the expiry the store reports matches
/// the row's `expires_at − clock_timestamp()` as the server computes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_is_the_servers_clock() {
    let server = server().await;
    let store = PostgresStore::connect(&server.url(), "clock")
        .await
        .expect("connect");
    let election = unique_election("clock");
    let lease = store
        .open_session(Duration::from_secs(30))
        .await
        .expect("open");
    store
        .campaign(lease.id, &election, &CandidateId::new("a").expect("id"))
        .await
        .expect("campaign");
    let admin = sql(&server.url()).await;
    // Move the session's expiry on the server: the store follows the row,
    // not anything it remembers or computes itself.
    admin
        .execute(
            "UPDATE clock.sessions SET expires_at = clock_timestamp() + interval '2 seconds'",
            &[],
        )
        .await
        .expect("update");
    let left = store
        .leader(&election)
        .await
        .expect("read")
        .expect("leader")
        .expires_in;
    assert!(left <= Duration::from_secs(2), "{left:?}");
    admin
        .execute(
            "UPDATE clock.sessions SET expires_at = clock_timestamp() - interval '1 second'",
            &[],
        )
        .await
        .expect("update");
    assert_eq!(store.leader(&election).await.expect("read"), None);
    assert!(matches!(
        store.keep_alive(lease.id).await,
        Err(Error::SessionExpired(_))
    ));
}

/// One renewal of a session renews every election it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_renewal_renews_every_election() {
    let server = server().await;
    let store = PostgresStore::connect(&server.url(), "many")
        .await
        .expect("connect");
    let lease = store
        .open_session(Duration::from_millis(800))
        .await
        .expect("open");
    let elections: Vec<_> = (0..3).map(|_| unique_election("many")).collect();
    let mut tokens = Vec::new();
    for election in &elections {
        let grant = store
            .campaign(lease.id, election, &CandidateId::new("a").expect("id"))
            .await
            .expect("campaign");
        tokens.push(grant.token);
    }
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        store.keep_alive(lease.id).await.expect("renew");
    }
    for (election, token) in elections.iter().zip(&tokens) {
        let leader = store
            .leader(election)
            .await
            .expect("read")
            .expect("still held");
        assert_eq!(leader.token, *token);
    }
}

/// The server restarts while a candidate leads and another waits: the
/// waiter is never granted while the leader still considers itself
/// leader, the store reconnects by itself, and tokens keep increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_while_a_candidate_leads() {
    let mut server = server().await;
    let url = server.url();
    let connect = |id: &'static str| {
        let url = url.clone();
        async move {
            let store = PostgresStore::connect(&url, "restart")
                .await
                .expect("connect");
            Elector::new(
                Arc::new(store),
                CandidateId::new(id).expect("id"),
                LeaseConfig::new(Duration::from_secs(2)),
            )
            .expect("config")
        }
    };
    let election = unique_election("restart");
    let a = connect("a").await;
    let b = connect("b").await;
    let first = a.campaign(&election).await.expect("a campaigns");
    let contender = spawn_campaign(b, election.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| server.restart());
    // Either a rides the restart out (its renewals reconnect and land
    // before its deadline), or it steps down by its deadline and b is
    // granted — never while a still considers itself leader.
    let watch_until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < watch_until && !contender.is_finished() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = if contender.is_finished() {
        let (granted_at, second, _b) = contender.await.expect("task");
        assert!(
            granted_at >= first.deadline(),
            "rule 4 broken: b granted {:?} before a's deadline",
            first.deadline() - granted_at
        );
        second
    } else {
        assert!(first.is_leader(), "a lost leadership but b was not granted");
        let token = first.token();
        first.resign().await.expect("a resigns after the restart");
        let (_, second, _b) = tokio::time::timeout(Duration::from_secs(10), contender)
            .await
            .expect("b granted after a resigned")
            .expect("task");
        assert!(second.token() > token);
        second
    };
    // The store works after the restart: tokens keep increasing.
    let token = second.token();
    second.resign().await.expect("resign after the restart");
    let third = campaign_until_granted(&a, &election).await;
    assert!(third.token() > token, "rule 2 across a restart");
}

/// No herd: with 30 candidates waiting, a release wakes only the first in
/// line, so a handover costs a constant number of reads of the candidates
/// (counted in the server's statement log), not one per waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_wakes_only_the_first_in_line() {
    let server = server().await;
    let admin = sql(&server.url()).await;
    for statement in [
        "ALTER SYSTEM SET log_statement = 'all'",
        "SELECT pg_reload_conf()",
    ] {
        admin
            .batch_execute(statement)
            .await
            .expect("log every statement");
    }
    let store: Arc<dyn Store> = Arc::new(
        PostgresStore::connect(&server.url(), "herd")
            .await
            .expect("connect"),
    );
    let election = unique_election("herd");
    let holder = leasehold::testing::campaign_on_new_session(
        &*store,
        &election,
        "holder",
        Duration::from_secs(30),
    )
    .await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..30 {
        let (store, election, tx) = (Arc::clone(&store), election.clone(), tx.clone());
        tokio::spawn(async move {
            let grant = leasehold::testing::campaign_on_new_session(
                &*store,
                &election,
                &format!("w{i}"),
                Duration::from_secs(30),
            )
            .await;
            let _ = tx.send(grant);
        });
    }
    let in_line = async {
        loop {
            let n: i64 = admin
                .query_one("SELECT count(*) FROM herd.keys WHERE key LIKE '%:c:%'", &[])
                .await
                .expect("count")
                .get(0);
            if n == 31 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), in_line)
        .await
        .expect("30 waiters in line");
    let acquisitions = || {
        server
            .log()
            .matches("FROM \"herd\".revision r LEFT JOIN")
            .count()
    };
    let mut grant = holder;
    for handover in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = acquisitions();
        store.resign(&grant).await.expect("resign");
        grant = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a waiter is granted")
            .expect("channel open");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let cost = acquisitions() - before;
        assert!(
            (1..=3).contains(&cost),
            "handover {handover} ran {cost} reads of the candidates for 30 waiters"
        );
        assert!(rx.try_recv().is_err(), "two waiters granted at once");
    }
}

/// Unreachable server and bad URLs: clear, typed errors.
#[tokio::test]
async fn unreachable_server_and_bad_url_are_clear_errors() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let url = format!("postgresql://postgres@127.0.0.1:{port}/postgres");
    match PostgresStore::connect(&url, "x").await {
        Err(Error::Unavailable { reason, .. }) => {
            assert!(reason.contains(&format!("127.0.0.1:{port}")), "{reason}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(matches!(
        PostgresStore::connect("postgresql://h:notaport/db", "x").await,
        Err(Error::InvalidInput { .. })
    ));
}

/// Two stores in `schema` at `url`: an observer, with its status watch of
/// a fresh election, and a holder of that election (a 60 s session), with
/// its grant.
async fn watched_holder(
    url: &str,
    schema: &str,
) -> (PostgresStore, PostgresStore, Grant, StatusWatch) {
    let observer = PostgresStore::connect(url, schema).await.expect("connect");
    let holder = PostgresStore::connect(url, schema).await.expect("connect");
    let election = unique_election(schema);
    let status = observer.watch_status(&election).await.expect("watch");
    let lease = holder
        .open_session(Duration::from_secs(60))
        .await
        .expect("open");
    let grant = holder
        .campaign(lease.id, &election, &CandidateId::new("a").expect("id"))
        .await
        .expect("campaign");
    (observer, holder, grant, status)
}

/// Issue 12: while the server is down a status watch reports the leader
/// unknown (the last known one may have stepped down meanwhile), and once
/// the server is back, the true state, even if the leader is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_watch_reports_an_outage_then_the_state_after_it() {
    let mut server = server().await;
    let (_observer, _holder, grant, mut status) = watched_holder(&server.url(), "outage").await;
    let limit = Duration::from_secs(15);
    tokio::time::timeout(
        limit,
        status.wait_for(|s| s.leader().is_some_and(|l| l.token == grant.token)),
    )
    .await
    .expect("the watch sees a")
    .expect("watch open");
    tokio::task::block_in_place(|| server.stop());
    let unknown = tokio::time::timeout(limit, status.wait_for(LeaderStatus::is_unknown))
        .await
        .expect("the watch reports the leader unknown while the server is down")
        .expect("watch open")
        .clone();
    let LeaderStatus::Unknown { error } = unknown else {
        unreachable!()
    };
    assert!(error.contains("postgres"), "{error}");
    tokio::task::block_in_place(|| server.start_again());
    tokio::time::timeout(
        limit,
        status.wait_for(|s| s.leader().is_some_and(|l| l.token == grant.token)),
    )
    .await
    .expect("the watch reports the leader again once the server answers")
    .expect("watch open");
}

/// A watch whose listener lost its connection hears no change: it reports
/// the leader unknown, although a read made meanwhile (on another
/// connection, as when the server goes down between the two) succeeds; once
/// the listener is back, the leader again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_watch_reports_a_lost_listener_though_reads_succeed() {
    let server = server().await;
    let url = server.url();
    let (observer, _holder, grant, mut status) = watched_holder(&url, "deaf").await;
    let limit = Duration::from_secs(15);
    let holds = |s: &LeaderStatus| s.leader().is_some_and(|l| l.token == grant.token);
    tokio::time::timeout(limit, status.wait_for(holds))
        .await
        .expect("the watch sees a")
        .expect("watch open");
    // No new connection is let in, and the listeners' connections end: the
    // connections the stores read and write on stay.
    // (From another database: a session cannot refuse its own.)
    let other = url
        .strip_suffix("/postgres")
        .map(|server| format!("{server}/template1"))
        .expect("the server's URL names its database");
    let admin = sql(&other).await;
    // Both stores' listeners are there first (each starts its own as it
    // opens; one may still be on its way).
    // A listener's last statement: its LISTEN, then its read of the
    // revision it listens from.
    let listener = "query IN ('LISTEN leasehold_deaf', 'SELECT value FROM \"deaf\".revision')";
    let listening = format!("SELECT count(*) FROM pg_stat_activity WHERE {listener}");
    let started = tokio::time::Instant::now();
    while admin
        .query_one(&listening, &[])
        .await
        .expect("count the listeners")
        .get::<_, i64>(0)
        < 2
    {
        assert!(
            started.elapsed() < limit,
            "the stores' two listeners never listened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    admin
        .batch_execute("ALTER DATABASE postgres ALLOW_CONNECTIONS false")
        .await
        .expect("refuse new connections");
    let ended = admin
        .query(
            &format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {listener}"),
            &[],
        )
        .await
        .expect("end the listeners' connections");
    assert_eq!(ended.len(), 2, "one listener per store");
    let unknown = tokio::time::timeout(limit, status.wait_for(LeaderStatus::is_unknown))
        .await
        .expect("the watch reports the leader unknown while its listener is lost")
        .expect("watch open")
        .clone();
    let LeaderStatus::Unknown { error } = unknown else {
        unreachable!()
    };
    assert!(error.contains("listen"), "{error}");
    assert_eq!(
        observer
            .leader(&grant.election)
            .await
            .expect("a read")
            .map(|l| l.token),
        Some(grant.token),
        "reads go on meanwhile"
    );
    admin
        .batch_execute("ALTER DATABASE postgres ALLOW_CONNECTIONS true")
        .await
        .expect("let connections in again");
    tokio::time::timeout(limit, status.wait_for(holds))
        .await
        .expect("the watch reports the leader again once its listener is back")
        .expect("watch open");
}

// Issue 13: hostile input and a store that changes under us.

/// Every relation and function in `schema`, by name.
async fn objects(client: &tokio_postgres::Client, schema: &str) -> Vec<String> {
    client
        .query(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1
             UNION ALL
             SELECT p.proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = $1
             ORDER BY 1",
            &[&schema],
        )
        .await
        .expect("list objects")
        .into_iter()
        .map(|row| row.get(0))
        .collect()
}

async fn schema_exists(client: &tokio_postgres::Client, schema: &str) -> bool {
    client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            &[&schema],
        )
        .await
        .expect("read pg_namespace")
        .get(0)
}

/// PostgreSQL's own schemas are refused before connecting: `public` got
/// leasehold's tables, sequences and functions among other programs'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresqls_own_schemas_are_refused_up_front() {
    let server = server().await;
    let admin = sql(&server.url()).await;
    admin
        .batch_execute("CREATE TABLE public.orders (id int)")
        .await
        .expect("another program's table");
    let public = objects(&admin, "public").await;
    let information_schema = objects(&admin, "information_schema").await;
    for schema in [
        "public",
        "information_schema",
        "pg_catalog",
        "pg_temp",
        "pg_leasehold",
    ] {
        for read_only in [false, true] {
            let opened = if read_only {
                PostgresStore::open(&server.url(), schema, Access::ReadOnly).await
            } else {
                PostgresStore::connect(&server.url(), schema).await
            };
            match opened {
                Err(Error::InvalidInput { reason, .. }) => {
                    assert!(reason.contains("of its own"), "{schema}: {reason}");
                }
                other => panic!("{schema} (read-only {read_only}) must be refused, got {other:?}"),
            }
        }
    }
    assert_eq!(objects(&admin, "public").await, public, "written in public");
    assert_eq!(
        objects(&admin, "information_schema").await,
        information_schema
    );
    assert!(!schema_exists(&admin, "pg_leasehold").await);
}

/// A schema leasehold did not create — another program's, or an empty one
/// — is refused without writing: only a same-named table was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_leasehold_did_not_create_is_refused_untouched() {
    let server = server().await;
    let admin = sql(&server.url()).await;
    admin
        .batch_execute(
            "CREATE SCHEMA shop; CREATE TABLE shop.orders (id int);
             CREATE SCHEMA empty;
             CREATE SCHEMA versioned; CREATE TABLE versioned.schema_version (version bigint)",
        )
        .await
        .expect("other programs' schemas");
    for schema in ["shop", "empty", "versioned"] {
        let before = objects(&admin, schema).await;
        for read_only in [false, true] {
            let opened = if read_only {
                PostgresStore::open(&server.url(), schema, Access::ReadOnly).await
            } else {
                PostgresStore::connect(&server.url(), schema).await
            };
            match opened {
                Err(Error::Corrupt(message)) => assert!(
                    message.contains("did not create") || message.contains("not created by"),
                    "{schema}: {message}"
                ),
                other => panic!("{schema} (read-only {read_only}) must be refused, got {other:?}"),
            }
        }
        assert_eq!(objects(&admin, schema).await, before, "{schema}: written");
    }
}

/// Reading a schema that does not exist says so and creates nothing; a
/// store opened read-only opens no session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_a_schema_that_does_not_exist_creates_nothing() {
    let server = server().await;
    let admin = sql(&server.url()).await;
    match PostgresStore::open(&server.url(), "nothing", Access::ReadOnly).await {
        Err(Error::NotFound(message)) => assert!(message.contains("nothing"), "{message}"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(!schema_exists(&admin, "nothing").await, "created");
    PostgresStore::connect(&server.url(), "nothing")
        .await
        .expect("first use");
    let created = objects(&admin, "nothing").await;
    let reader = PostgresStore::open(&server.url(), "nothing", Access::ReadOnly)
        .await
        .expect("read-only");
    let election = unique_election("read-only");
    assert_eq!(reader.leader(&election).await.expect("read"), None);
    assert!(reader.elections().await.expect("list").is_empty());
    assert!(matches!(
        reader.open_session(Duration::from_secs(10)).await,
        Err(Error::InvalidInput { .. })
    ));
    assert_eq!(objects(&admin, "nothing").await, created);
    let sessions: i64 = admin
        .query_one("SELECT count(*) FROM nothing.sessions", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(sessions, 0, "read-only wrote");
}

/// A schema with another program's table named `schema_version` (Flyway's
/// old history table, or one shaped like leasehold's but not holding what
/// leasehold writes) is not leasehold's: refused, read-only too, with
/// nothing written (before: taken for leasehold's, then "relation
/// sessions does not exist" on every use, retried forever by `run`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_version_table_leasehold_did_not_write_is_not_its_marker() {
    let server = server().await;
    let admin = sql(&server.url()).await;
    admin
        .batch_execute(
            "CREATE SCHEMA flyway; CREATE TABLE flyway.schema_version (version text);
             CREATE TABLE flyway.orders (id int);
             CREATE SCHEMA flyway_row; CREATE TABLE flyway_row.schema_version (version text);
             INSERT INTO flyway_row.schema_version VALUES ('1');
             CREATE SCHEMA history; CREATE TABLE history.schema_version (
                 installed_rank int NOT NULL, version varchar(50), description varchar(200));
             INSERT INTO history.schema_version VALUES (1, '1', 'init');
             CREATE SCHEMA wider; CREATE TABLE wider.schema_version (
                 version bigint NOT NULL, applied_by text);
             INSERT INTO wider.schema_version VALUES (1, 'me');
             CREATE SCHEMA two_rows; CREATE TABLE two_rows.schema_version (version bigint NOT NULL);
             INSERT INTO two_rows.schema_version VALUES (1), (1);
             CREATE SCHEMA no_tables; CREATE TABLE no_tables.schema_version (version bigint NOT NULL);
             INSERT INTO no_tables.schema_version VALUES (1);",
        )
        .await
        .expect("other programs' schemas");
    for schema in [
        "flyway",
        "flyway_row",
        "history",
        "wider",
        "two_rows",
        "no_tables",
    ] {
        let before = objects(&admin, schema).await;
        for read_only in [false, true] {
            let opened = if read_only {
                PostgresStore::open(&server.url(), schema, Access::ReadOnly).await
            } else {
                PostgresStore::connect(&server.url(), schema).await
            };
            match opened {
                Err(Error::Corrupt(message)) => assert!(
                    message.contains("did not create")
                        || message.contains("not created by")
                        || message.contains("damaged"),
                    "{schema}: {message}"
                ),
                other => panic!("{schema} (read-only {read_only}) must be refused, got {other:?}"),
            }
        }
        assert_eq!(objects(&admin, schema).await, before, "{schema}: written");
    }
    let rows: i64 = admin
        .query_one("SELECT count(*) FROM flyway.schema_version", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, 0, "written");
}

/// The cancellation obligation, where the race lives: a campaign whose
/// statement is still waiting in the server when it is dropped is granted
/// after the drop (the holder's session ends while it waits). The drop's
/// cleanup must take that grant back, not only forget the campaign. The
/// statement is held in the server by a transaction of the test's own that
/// ends the holder's session through the store's own function (holding
/// the store's revision row) and commits only after the campaign is
/// dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_granted_in_the_server_after_its_drop_is_released() {
    let server = tokio::task::spawn_blocking(shared::postgres)
        .await
        .expect("server start");
    let schema = shared::unique("dropped_in_server");
    let store: Arc<dyn Store> = Arc::new(
        PostgresStore::connect(&server.url(), &schema)
            .await
            .expect("connect"),
    );
    let election = unique_election("dropped-in-server");
    let held = leasehold::testing::campaign_on_new_session(
        &*store,
        &election,
        "a",
        Duration::from_secs(30),
    )
    .await;
    let admin = sql(&server.url()).await;
    admin.batch_execute("BEGIN").await.expect("begin");
    admin
        .execute(
            &format!("SELECT {schema}.end_session($1)"),
            &[&i64::try_from(held.session.0).expect("a stored session id")],
        )
        .await
        .expect("end the holder's session, uncommitted");
    let lease = store
        .open_session(Duration::from_secs(30))
        .await
        .expect("open");
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        store.campaign(lease.id, &election, &CandidateId::new("b").expect("id")),
    )
    .await;
    assert!(dropped.is_err(), "the campaign waits on the held row");
    admin.batch_execute("COMMIT").await.expect("commit");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        store.leader(&election).await.expect("read"),
        None,
        "a campaign dropped while its statement waited was left holding the election"
    );
}
