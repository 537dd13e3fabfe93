//! Fencing at the resource: each check refuses a lower token atomically
//! with the write, whatever the interleaving of writers.

use std::sync::Arc;
use std::time::Duration;

use leasehold::backend::memory::MemoryStore;
use leasehold::fence::sqlite::SqliteFence;
use leasehold::fence::{Fence, MemoryFence};
use leasehold::store::Store;
use leasehold::testing::{FaultyStore, unique_election};
use leasehold::{CandidateId, Elector, Error, FencingToken, LeaseConfig, LostReason};
use proptest::prelude::*;

fn sqlite_fence_log(path: &std::path::Path) -> Vec<u64> {
    let conn = rusqlite::Connection::open(path).expect("open");
    let mut stmt = conn
        .prepare("SELECT token FROM writes ORDER BY rowid")
        .expect("prepare");
    stmt.query_map([], |r| r.get::<_, i64>(0))
        .expect("query")
        .map(|t| t.expect("row").unsigned_abs())
        .collect()
}

fn sqlite_fences(n: usize) -> (tempfile::TempDir, std::path::PathBuf, Vec<SqliteFence>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("resource.db");
    let fences: Vec<_> = (0..n)
        .map(|_| SqliteFence::open(&path).expect("open fence"))
        .collect();
    fences[0]
        .fenced("setup", FencingToken(0), |tx| {
            tx.execute_batch("CREATE TABLE IF NOT EXISTS writes (token INTEGER NOT NULL)")
                .map_err(|e| Error::Corrupt(e.to_string()))
        })
        .expect("create table");
    (dir, path, fences)
}

fn write(fence: &SqliteFence, token: u64) -> leasehold::Result<()> {
    fence.fenced("object-x", FencingToken(token), |tx| {
        tx.execute("INSERT INTO writes (token) VALUES (?1)", [token as i64])
            .map(|_| ())
            .map_err(|e| Error::Corrupt(e.to_string()))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Writers on separate connections, interleaved as proptest chooses:
    /// the resource never keeps a write with a lower token after a higher
    /// one was accepted, and every refusal names a higher accepted token.
    #[test]
    fn sqlite_check_refuses_lower_tokens_in_any_interleaving(
        ops in proptest::collection::vec((0usize..3, 1u64..12), 1..60)
    ) {
        let (_dir, path, fences) = sqlite_fences(3);
        let mut highest = 0;
        for (writer, token) in ops {
            match write(&fences[writer], token) {
                Ok(()) => {
                    prop_assert!(token >= highest);
                    highest = token;
                }
                Err(Error::Stale { presented, highest: seen, .. }) => {
                    prop_assert_eq!(presented.0, token);
                    prop_assert_eq!(seen.0, highest);
                    prop_assert!(token < highest);
                }
                Err(e) => prop_assert!(false, "unexpected {}", e),
            }
        }
        let log = sqlite_fence_log(&path);
        prop_assert!(log.windows(2).all(|w| w[0] <= w[1]), "{:?}", log);
    }
}

/// Real threads racing, each with its own connection and its own rising
/// tokens: the committed writes are in token order.
#[test]
fn sqlite_check_holds_under_concurrent_writers() {
    let (_dir, path, fences) = sqlite_fences(4);
    std::thread::scope(|s| {
        for (i, fence) in fences.iter().enumerate() {
            s.spawn(move || {
                for round in 0..50u64 {
                    let _ = write(fence, round * 4 + i as u64);
                }
            });
        }
    });
    let log = sqlite_fence_log(&path);
    assert!(!log.is_empty());
    assert!(log.windows(2).all(|w| w[0] <= w[1]), "{log:?}");
}

/// A write refused as stale rolls back with the check: nothing of it lands.
#[test]
fn a_refused_write_leaves_nothing_behind() {
    let (_dir, path, fences) = sqlite_fences(1);
    write(&fences[0], 42).expect("accepted");
    assert!(matches!(write(&fences[0], 41), Err(Error::Stale { .. })));
    assert_eq!(sqlite_fence_log(&path), vec![42]);
}

/// Worked example 2 through the library, under simulated time: leader A's
/// writer pauses (and with it A's renewals) longer than the TTL; B takes
/// over with a higher token and writes; A wakes, its next write is refused,
/// and telling A's leadership so ends it at once.
#[tokio::test(start_paused = true)]
async fn a_paused_writer_is_fenced_off_after_a_takeover() {
    let clock: Arc<dyn leasehold::clock::Clock> = Arc::new(leasehold::clock::TokioClock);
    let store = MemoryStore::with_clock(Arc::clone(&clock));
    let a_link = Arc::new(FaultyStore::new(
        Arc::new(store.clone()),
        Arc::clone(&clock),
    ));
    let config = LeaseConfig::new(Duration::from_secs(10));
    let a =
        Elector::new(a_link.clone(), CandidateId::new("a").expect("id"), config).expect("config");
    let b = Elector::new(
        Arc::new(store.clone()),
        CandidateId::new("b").expect("id"),
        config,
    )
    .expect("config");
    let election = unique_election("gc-pause");
    let resource = Arc::new(MemoryFence::new());
    let accepted = Arc::new(std::sync::Mutex::new(Vec::<(char, u64)>::new()));
    let write = |who: char, token: FencingToken| {
        let accepted = Arc::clone(&accepted);
        resource.fenced("object-x", token, move || {
            accepted.lock().expect("lock").push((who, token.0))
        })
    };

    let leader_a = a.campaign(&election).await.expect("a leads");
    assert_eq!(leader_a.token(), FencingToken(1));
    write('a', leader_a.token()).expect("a writes");
    // A "GC pause" of 14 s: A neither writes nor renews.
    a_link.set_unavailable(true);
    let pause = tokio::time::sleep(Duration::from_secs(14));
    let leader_b = b.campaign(&election).await.expect("b takes over");
    assert!(leader_b.token() > leader_a.token());
    write('b', leader_b.token()).expect("b writes");
    pause.await;
    a_link.set_unavailable(false);
    // A wakes and, believing nothing happened, writes with its old token.
    match write('a', leader_a.token()) {
        Err(Error::Stale {
            presented, highest, ..
        }) => {
            assert_eq!((presented, highest), (leader_a.token(), leader_b.token()));
            leader_a.end_as_stale();
        }
        other => panic!("the stale write must be refused, got {other:?}"),
    }
    assert!(!leader_a.is_leader());
    assert!(matches!(
        leader_a.lost_reason(),
        Some(LostReason::Superseded | LostReason::DeadlineExpired { .. })
    ));
    let log = accepted.lock().expect("lock").clone();
    assert_eq!(log, vec![('a', 1), ('b', leader_b.token().0)]);
}

/// `end_as_stale` ends a live leadership at once with `Superseded`.
#[tokio::test(start_paused = true)]
async fn supersede_ends_leadership_at_once() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let elector = Elector::new(
        store,
        CandidateId::new("a").expect("id"),
        LeaseConfig::new(Duration::from_secs(10)),
    )
    .expect("config");
    let leadership = elector
        .campaign(&unique_election("supersede"))
        .await
        .expect("campaign");
    assert!(leadership.is_leader());
    leadership.end_as_stale();
    assert!(!leadership.is_leader());
    assert_eq!(leadership.lost().await, LostReason::Superseded);
}

mod http {
    use super::*;
    use axum::Router;
    use axum::body::Body;
    use axum::routing::put;
    use leasehold::fence::http::{FENCING_TOKEN, check_reply, fence_router};
    use tower::ServiceExt;

    fn app(fence: Arc<dyn Fence>) -> Router {
        fence_router(
            Router::new().route(
                "/objects/{name}",
                put(|| async { "stored" }).get(|| async { "read" }),
            ),
            fence,
        )
    }

    async fn send(app: &Router, method: &str, token: Option<&str>) -> (u16, String) {
        send_to(app, "/objects/x", method, token).await
    }

    async fn send_to(app: &Router, uri: &str, method: &str, token: Option<&str>) -> (u16, String) {
        let mut request = axum::http::Request::builder().method(method).uri(uri);
        if let Some(token) = token {
            request = request.header(FENCING_TOKEN, token);
        }
        let response = app
            .clone()
            .oneshot(request.body(Body::empty()).expect("request"))
            .await
            .expect("response");
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn the_layer_refuses_stale_and_missing_tokens() {
        let app = app(Arc::new(MemoryFence::new()));
        assert_eq!(send(&app, "PUT", Some("41")).await.0, 200);
        assert_eq!(send(&app, "PUT", Some("42")).await.0, 200);
        assert_eq!(
            send(&app, "PUT", Some("42")).await.0,
            200,
            "the same leader writes again"
        );
        let (status, body) = send(&app, "PUT", Some("41")).await;
        assert_eq!(status, 409, "{body}");
        let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(
            (json["presented"].as_u64(), json["highest"].as_u64()),
            (Some(41), Some(42))
        );
        match check_reply(status, &body, "/objects/x", FencingToken(41)) {
            Err(Error::Stale { highest, .. }) => assert_eq!(highest, FencingToken(42)),
            other => panic!("{other:?}"),
        }
        assert_eq!(send(&app, "PUT", None).await.0, 428);
        assert_eq!(send(&app, "PUT", Some("soon")).await.0, 400);
        assert_eq!(send(&app, "GET", None).await.0, 200, "reads are not fenced");
    }

    #[tokio::test]
    async fn a_percent_encoded_path_meets_the_same_highest_token() {
        let app = app(Arc::new(MemoryFence::new()));
        assert_eq!(
            send_to(&app, "/objects/probe", "PUT", Some("3")).await.0,
            200
        );
        for alias in [
            "/objects/%70robe",
            "/objects/%70%72%6F%62%65",
            "/%6Fbjects/probe",
        ] {
            let (status, body) = send_to(&app, alias, "PUT", Some("1")).await;
            assert_eq!(status, 409, "{alias}: {body}");
        }
        assert_eq!(send_to(&app, "/objects/%FF", "PUT", Some("9")).await.0, 400);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_layer_keeps_its_highest_token_in_sqlite_across_restarts() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("fence.db");
        let first = app(Arc::new(SqliteFence::open(&path).expect("fence")));
        assert_eq!(send(&first, "PUT", Some("7")).await.0, 200);
        drop(first);
        let restarted = app(Arc::new(SqliteFence::open(&path).expect("fence")));
        assert_eq!(send(&restarted, "PUT", Some("6")).await.0, 409);
        assert_eq!(send(&restarted, "PUT", Some("8")).await.0, 200);
    }
}

mod postgres {
    use leasehold::fence::postgres::{check_and_advance, create_table};
    use leasehold::{Error, FencingToken};
    use leasehold_testkit::PostgresServer;

    async fn client(url: &str) -> tokio_postgres::Client {
        let mut last = None;
        for _ in 0..50 {
            match tokio_postgres::connect(url, tokio_postgres::NoTls).await {
                Ok((client, connection)) => {
                    tokio::spawn(connection);
                    return client;
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("cannot connect to the test server: {last:?}");
    }

    /// One fenced write: check and insert in one transaction.
    async fn write(client: &mut tokio_postgres::Client, token: u64) -> leasehold::Result<()> {
        let tx = client.transaction().await.expect("begin");
        check_and_advance(&tx, "object-x", FencingToken(token)).await?;
        tx.execute("INSERT INTO writes (token) VALUES ($1)", &[&(token as i64)])
            .await
            .expect("insert");
        tx.commit().await.expect("commit");
        Ok(())
    }

    async fn log(client: &tokio_postgres::Client) -> Vec<u64> {
        client
            .query("SELECT token FROM writes ORDER BY id", &[])
            .await
            .expect("read")
            .iter()
            .map(|r| r.get::<_, i64>(0).unsigned_abs())
            .collect()
    }

    async fn setup(server: &PostgresServer) -> Vec<tokio_postgres::Client> {
        let mut clients = Vec::new();
        for _ in 0..4 {
            clients.push(client(&server.url()).await);
        }
        create_table(&clients[0]).await.expect("fence table");
        clients[0]
            .batch_execute("CREATE TABLE writes (id bigserial PRIMARY KEY, token bigint NOT NULL)")
            .await
            .expect("writes table");
        clients
    }

    /// Seeded random interleavings of writers on separate connections (the
    /// seed is printed; rerun with LEASEHOLD_SEED): the committed writes
    /// never go back in token order, and every refusal names the highest.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_check_refuses_lower_tokens_in_any_interleaving() {
        let server = tokio::task::spawn_blocking(PostgresServer::start)
            .await
            .expect("server");
        let mut clients = setup(&server).await;
        let (seed, mut rng) = leasehold_testkit::Rng::from_env();
        let mut next = move |n: u64| rng.below(n);
        let mut highest = 0;
        for _ in 0..200 {
            let writer = usize::try_from(next(4)).expect("index");
            let token = 1 + next(30);
            match write(&mut clients[writer], token).await {
                Ok(()) => {
                    assert!(token >= highest, "seed {seed}");
                    highest = token;
                }
                Err(Error::Stale { highest: seen, .. }) => {
                    assert_eq!(seen.0, highest, "seed {seed}");
                    assert!(token < highest, "seed {seed}");
                }
                Err(e) => panic!("seed {seed}: {e}"),
            }
        }
        let order = log(&clients[0]).await;
        assert!(
            order.windows(2).all(|w| w[0] <= w[1]),
            "seed {seed}: {order:?}"
        );
    }

    /// Concurrent transactions racing on one row: the row lock and the
    /// re-checked WHERE keep the committed writes in token order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_check_holds_under_concurrent_transactions() {
        let server = tokio::task::spawn_blocking(PostgresServer::start)
            .await
            .expect("server");
        let clients = setup(&server).await;
        let mut tasks = tokio::task::JoinSet::new();
        for (i, mut client) in clients.into_iter().enumerate() {
            tasks.spawn(async move {
                for round in 0..40u64 {
                    let _ = write(&mut client, round * 4 + i as u64).await;
                }
                client
            });
        }
        let mut any = None;
        while let Some(client) = tasks.join_next().await {
            any = Some(client.expect("writer"));
        }
        let order = log(&any.expect("a client")).await;
        assert!(!order.is_empty());
        assert!(order.windows(2).all(|w| w[0] <= w[1]), "{order:?}");
    }
}
