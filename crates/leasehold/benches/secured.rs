//! What securing a store costs: each store plaintext and unauthenticated
//! beside the same store secured as GUIDE's "Securing the store" sets it
//! up, in one run, on servers the test kit starts on loopback.
//!
//! `cargo bench -p leasehold --bench secured [-- --rounds N]`
//!
//! - etcd (one member): plain HTTP/2 beside TLS with a client certificate
//!   and a password user whose role holds the prefix alone, and beside the
//!   same certificate alone (etcd takes the user from its common name);
//! - PostgreSQL: no TLS, trust, beside `sslmode=verify-full` and
//!   scram-sha-256 as a role with CONNECT and CREATE on its database;
//! - ZooKeeper: open ACLs beside digest authentication and leasehold's
//!   ACLs (there is no TLS to ZooKeeper).
//!
//! Per configuration: opening the store (connections, TLS handshakes,
//! authentication and the first-use checks) `N` times; one renewal of a
//! session (`keep_alive`), `10 N` times; a grant and its release
//! (`campaign` then `resign`, uncontested), `N` times. Milliseconds,
//! median and max.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::store::{Store, StoreUrl};
use leasehold::{CandidateId, ElectionName};
use leasehold_testkit::{EtcdCluster, PostgresServer, TestCa, Usage, ZooKeeperServer};

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// `median / max` of `samples`.
fn summary(samples: &mut [Duration]) -> String {
    samples.sort();
    format!(
        "{} / {}",
        ms(samples[samples.len() / 2]),
        ms(samples[samples.len() - 1])
    )
}

struct Row {
    store: &'static str,
    config: &'static str,
    open: String,
    renew: String,
    grant: String,
}

async fn measure(store: &'static str, config: &'static str, url: &str, rounds: usize) -> Row {
    let url: StoreUrl = url.parse().expect("a valid store URL");
    let mut opens = Vec::with_capacity(rounds);
    let mut handle: Option<Arc<dyn Store>> = None;
    for _ in 0..rounds {
        let started = Instant::now();
        let opened = leasehold::store::open(&url, leasehold::store::Access::ReadWrite)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
        opens.push(started.elapsed());
        handle = Some(opened);
    }
    let store_handle = handle.expect("at least one round");
    let session = store_handle
        .open_session(Duration::from_secs(30))
        .await
        .expect("session")
        .id;
    let mut renewals = Vec::with_capacity(rounds * 10);
    for _ in 0..rounds * 10 {
        let started = Instant::now();
        store_handle.keep_alive(session).await.expect("renewal");
        renewals.push(started.elapsed());
    }
    let election = ElectionName::new("bench-secured").expect("name");
    let candidate = CandidateId::new("bench").expect("id");
    let mut grants = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let grant = store_handle
            .campaign(session, &election, &candidate)
            .await
            .expect("grant");
        store_handle.resign(&grant).await.expect("release");
        grants.push(started.elapsed());
    }
    store_handle.close_session(session).await.expect("close");
    Row {
        store,
        config,
        open: summary(&mut opens),
        renew: summary(&mut renewals),
        grant: summary(&mut grants),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(20usize)
        .max(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new(dir.path(), "bench");
    let mut rows = Vec::new();

    {
        let plain = tokio::task::spawn_blocking(|| EtcdCluster::start(1))
            .await
            .expect("etcd");
        rows.push(measure("etcd", "plain", &plain.url("/bench"), rounds).await);
    }
    {
        let (dir, ca) = (dir.path().to_owned(), TestCa::new(dir.path(), "etcd"));
        let (cluster, etcd_ca) = tokio::task::spawn_blocking(move || {
            let cluster = EtcdCluster::start_secured(&dir, &ca, None);
            (cluster, ca)
        })
        .await
        .expect("secured etcd");
        cluster.add_user("app", "app-Pa55word", Some("/bench/"));
        let client = etcd_ca.issue("bench-app", "app", Usage::Client, false);
        let url = format!(
            "etcd://app:app-Pa55word@{}/bench?cacert={}&cert={}&key={}",
            cluster.endpoints()[0],
            etcd_ca.ca_path().display(),
            client.cert.display(),
            client.key.display()
        );
        rows.push(measure("etcd", "TLS + client cert + password", &url, rounds).await);
        // The user from the certificate's common name: no Authenticate call.
        let url = format!(
            "etcd://{}/bench?cacert={}&cert={}&key={}",
            cluster.endpoints()[0],
            etcd_ca.ca_path().display(),
            client.cert.display(),
            client.key.display()
        );
        rows.push(measure("etcd", "TLS + client cert (user by its CN)", &url, rounds).await);
    }
    {
        let plain = tokio::task::spawn_blocking(PostgresServer::start)
            .await
            .expect("postgres");
        let url = format!("{}?schema=bench", plain.url());
        rows.push(measure("postgres", "plain", &url, rounds).await);
    }
    {
        let server_files = ca.issue("pg-server", "localhost", Usage::Server, false);
        let ca_path = ca.ca_path();
        let secured = tokio::task::spawn_blocking(move || {
            PostgresServer::start_secured(&ca_path, &server_files)
        })
        .await
        .expect("secured postgres");
        secured.psql(&[
            "CREATE DATABASE lease",
            "REVOKE ALL ON DATABASE lease FROM PUBLIC",
            "CREATE ROLE app LOGIN PASSWORD 'app-Pa55word'",
            "GRANT CONNECT, CREATE ON DATABASE lease TO app",
        ]);
        let url = format!(
            "postgresql://app:app-Pa55word@localhost:{}/lease?sslmode=verify-full&sslrootcert={}&schema=bench",
            secured.port(),
            ca.ca_path().display()
        );
        rows.push(measure("postgres", "verify-full + scram", &url, rounds).await);
    }
    {
        let server = tokio::task::spawn_blocking(ZooKeeperServer::start)
            .await
            .expect("zookeeper");
        rows.push(measure("zookeeper", "plain", &server.url("/bench"), rounds).await);
        let url = server.url_as("app", "app-Pa55word", "/bench-auth");
        rows.push(measure("zookeeper", "digest + ACLs", &url, rounds).await);
    }

    println!(
        "\nsecured stores, {rounds} rounds (renewals: {}); milliseconds, median / max\n",
        rounds * 10
    );
    println!("| store | connection | open the store | one renewal | grant + release |");
    println!("|---|---|---|---|---|");
    for row in &rows {
        println!(
            "| {} | {} | {} | {} | {} |",
            row.store, row.config, row.open, row.renew, row.grant
        );
    }
}
