//! What a transfer costs as the line of standbys grows ("no herd"), on
//! every store, with each candidate on its own store handle (its own
//! connections), as separate replicas would be.
//!
//! `cargo bench -p leasehold --bench line [-- --rounds N --waiters 1,8,32]`
//!
//! Per store and line length: a leader and `W` standbys, each in a loop
//! (campaign; once leading, hand over when asked; campaign again). Each
//! round asks for a transfer to the last standby in line and measures:
//!
//! - from the request to the new leader holding (ms, median / max);
//! - the store operations all candidates made for it, as
//!   `leasehold::testing::CountingStore` counts them on each handle:
//!   reads, changes a watch brought, campaigns (median per transfer);
//! - how many candidates did anything at all (median).
//!
//! Servers start on loopback (a 3-member etcd cluster, a standalone
//! ZooKeeper, a PostgreSQL server; Debian's packages) and stop at the end;
//! SQLite is a file in a temporary folder. Nothing asserts a timing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::admin;
use leasehold::admin::request_transfer;
use leasehold::store::{Store, StoreUrl};
use leasehold::testing::{CountingStore, Counts};
use leasehold::{CandidateId, ElectionName, Elector, LeaseConfig};
use leasehold_testkit::{EtcdCluster, PostgresServer, ZooKeeperServer};

const TTL: Duration = Duration::from_secs(30);
const PATIENCE: Duration = Duration::from_secs(20);
/// Counts that stay the same this long: the candidates are at rest.
const QUIET: Duration = Duration::from_millis(300);

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn median<T: Ord + Copy>(samples: &mut [T]) -> T {
    samples.sort();
    samples[samples.len() / 2]
}

fn total(counts: &Counts) -> u64 {
    counts.reads + counts.wakes + counts.campaigns + counts.unwaited
}

struct Row {
    store: &'static str,
    waiters: usize,
    transfer: String,
    ops: u64,
    touched: usize,
}

/// Waits until no candidate's counts change for [`QUIET`].
async fn at_rest(handles: &[Arc<CountingStore>]) -> Vec<Counts> {
    let mut last: Vec<Counts> = handles.iter().map(|h| h.counts()).collect();
    let mut since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(25)).await;
        let now: Vec<Counts> = handles.iter().map(|h| h.counts()).collect();
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= QUIET {
            return now;
        }
    }
}

async fn measure(store: &'static str, url: &str, waiters: usize, rounds: usize) -> Row {
    let url: StoreUrl = url.parse().expect("a valid store URL");
    let election = ElectionName::new(format!("line-{waiters}")).expect("name");
    let requester = leasehold::store::open(&url, leasehold::store::Access::ReadWrite)
        .await
        .expect("open");
    let mut handles = Vec::new();
    let mut loops = Vec::new();
    for i in 0..=waiters {
        let handle = Arc::new(CountingStore::new(
            leasehold::store::open(&url, leasehold::store::Access::ReadWrite)
                .await
                .expect("open"),
        ));
        let elector = Elector::new(
            Arc::clone(&handle) as Arc<dyn Store>,
            CandidateId::new(format!("c{i}")).expect("id"),
            LeaseConfig::new(TTL),
        )
        .expect("config");
        let campaigned = election.clone();
        loops.push(tokio::spawn(async move {
            loop {
                let Ok(leadership) = elector.campaign(&campaigned).await else {
                    continue;
                };
                leadership.handover_requested().await;
                let _ = leadership.resign().await;
            }
        }));
        handles.push(handle);
        // Join in order, so the line is known.
        let joined = tokio::time::timeout(PATIENCE, async {
            loop {
                let line = admin::line(&*requester, &election).await.expect("line");
                let leader = requester.leader(&election).await.expect("leader");
                if leader.is_some() && line.len() == i {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(joined.is_ok(), "{store}: candidate c{i} did not join");
    }
    let mut times = Vec::new();
    let mut ops = Vec::new();
    let mut touched = Vec::new();
    for _ in 0..rounds {
        let before = at_rest(&handles).await;
        let line = admin::line(&*requester, &election).await.expect("line");
        let last = line.last().expect("a standby").candidate.clone();
        let started = Instant::now();
        let moved = request_transfer(&requester, &election, Some(&last), TTL, PATIENCE)
            .await
            .unwrap_or_else(|e| panic!("{store}: transfer: {e}"));
        times.push(started.elapsed());
        assert_eq!(moved.to.candidate, last, "{store}: transferred elsewhere");
        let after = at_rest(&handles).await;
        let deltas: Vec<u64> = after
            .iter()
            .zip(&before)
            .map(|(a, b)| total(a) - total(b))
            .collect();
        ops.push(deltas.iter().sum::<u64>());
        touched.push(deltas.iter().filter(|d| **d > 0).count());
    }
    for task in loops {
        task.abort();
    }
    times.sort();
    Row {
        store,
        waiters,
        transfer: format!(
            "{} / {}",
            ms(times[times.len() / 2]),
            ms(times[times.len() - 1])
        ),
        ops: median(&mut ops),
        touched: median(&mut touched),
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = arg(&args, "--rounds")
        .map(|r| r.parse().expect("--rounds takes a number"))
        .unwrap_or(5);
    let waiters: Vec<usize> = arg(&args, "--waiters")
        .unwrap_or_else(|| "1,8,32".into())
        .split(',')
        .map(|w| w.parse().expect("--waiters takes numbers, comma-separated"))
        .collect();
    let mut rows = Vec::new();
    let dir = tempfile::tempdir().expect("temporary folder");
    for &w in &waiters {
        let url = format!("sqlite:{}/line-{w}.db", dir.path().display());
        rows.push(measure("sqlite", &url, w, rounds).await);
    }
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(3))
        .await
        .expect("etcd");
    for &w in &waiters {
        rows.push(
            measure(
                "etcd (3 members)",
                &cluster.url(&format!("/line{w}")),
                w,
                rounds,
            )
            .await,
        );
    }
    drop(cluster);
    let zk = tokio::task::spawn_blocking(ZooKeeperServer::start)
        .await
        .expect("zookeeper");
    for &w in &waiters {
        rows.push(measure("zookeeper", &zk.url(&format!("/line{w}")), w, rounds).await);
    }
    drop(zk);
    let pg = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .expect("postgres");
    for &w in &waiters {
        let url = format!("{}?schema=line{w}", pg.url());
        rows.push(measure("postgres", &url, w, rounds).await);
    }
    drop(pg);
    println!(
        "\n{rounds} transfers per row to the last in line; TTL {TTL:?}; store operations of all candidates per transfer\n"
    );
    println!(
        "| {:<17} | {:>7} | {:>25} | {:>13} | {:>18} |",
        "store", "waiters", "transfer ms (median/max)", "store ops", "candidates touched"
    );
    println!(
        "|{:-<19}|{:-<9}|{:-<27}|{:-<15}|{:-<20}|",
        "", "", "", "", ""
    );
    for row in rows {
        println!(
            "| {:<17} | {:>7} | {:>25} | {:>13} | {:>18} |",
            row.store, row.waiters, row.transfer, row.ops, row.touched
        );
    }
}
