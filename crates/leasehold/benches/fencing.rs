//! What fencing costs: a fenced write against the same write unfenced, in
//! SQLite and PostgreSQL, and the in-memory check per call.
//!
//! `cargo bench -p leasehold --bench fencing [-- --writes N]`
//!
//! The PostgreSQL server is the test kit's (Debian's binaries, loopback,
//! `fsync=off`), so its figures show the check's cost, not disk latency.

use std::time::{Duration, Instant};

use leasehold::FencingToken;
use leasehold::fence::MemoryFence;
use leasehold::fence::sqlite::{check_and_advance, create_table};
use leasehold_testkit::PostgresServer;
use rusqlite::TransactionBehavior;

fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn sqlite(writes: usize, fenced: bool) -> Vec<Duration> {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut conn = rusqlite::Connection::open(dir.path().join("bench.db")).expect("open");
    conn.pragma_update(None, "journal_mode", "WAL")
        .expect("wal");
    conn.pragma_update(None, "synchronous", "FULL")
        .expect("sync");
    create_table(&conn).expect("fence table");
    conn.execute_batch("CREATE TABLE objects (name TEXT PRIMARY KEY, body TEXT)")
        .expect("table");
    (0..writes)
        .map(|i| {
            let t = Instant::now();
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .expect("begin");
            if fenced {
                check_and_advance(&tx, "object-x", FencingToken(i as u64)).expect("fresh token");
            }
            tx.execute(
                "INSERT INTO objects VALUES ('object-x', ?1) ON CONFLICT (name) DO UPDATE SET body = excluded.body",
                [i.to_string()],
            )
            .expect("write");
            tx.commit().expect("commit");
            t.elapsed()
        })
        .collect()
}

async fn postgres(url: &str, writes: usize, fenced: bool) -> Vec<Duration> {
    let (mut client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    leasehold::fence::postgres::create_table(&client)
        .await
        .expect("fence table");
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS objects (name text PRIMARY KEY, body text)")
        .await
        .expect("table");
    let resource = if fenced { "fenced" } else { "plain" };
    let mut samples = Vec::with_capacity(writes);
    for i in 0..writes {
        let t = Instant::now();
        let tx = client.transaction().await.expect("begin");
        if fenced {
            leasehold::fence::postgres::check_and_advance(&tx, resource, FencingToken(i as u64))
                .await
                .expect("fresh token");
        }
        tx.execute(
            "INSERT INTO objects VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET body = EXCLUDED.body",
            &[&resource, &i.to_string()],
        )
        .await
        .expect("write");
        tx.commit().await.expect("commit");
        samples.push(t.elapsed());
    }
    samples
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let writes = args
        .iter()
        .position(|a| a == "--writes")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(500usize);

    let plain_sqlite = sqlite(writes, false);
    let fenced_sqlite = sqlite(writes, true);

    let server = PostgresServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // Let the fresh server finish starting up before measuring.
    std::thread::sleep(Duration::from_millis(300));
    let plain_pg = runtime.block_on(postgres(&server.url(), writes, false));
    let fenced_pg = runtime.block_on(postgres(&server.url(), writes, true));

    let memory = MemoryFence::new();
    let calls = 1_000_000u64;
    let t = Instant::now();
    for i in 0..calls {
        memory
            .fenced("object-x", FencingToken(i), || ())
            .expect("fresh token");
    }
    let per_call = t.elapsed() / u32::try_from(calls).expect("fits");

    println!("{writes} writes each; one transaction per write");
    println!(
        "{:<44} {:>12} {:>12} {:>12}",
        "write", "p50 µs", "p99 µs", "p50 ratio"
    );
    for (name, plain, fenced) in [
        (
            "SQLite (WAL, synchronous=FULL)",
            &plain_sqlite,
            &fenced_sqlite,
        ),
        ("PostgreSQL (loopback, fsync=off)", &plain_pg, &fenced_pg),
    ] {
        let (p50, f50) = (percentile(plain, 50.0), percentile(fenced, 50.0));
        println!(
            "{:<44} {:>12} {:>12}",
            format!("{name}, unfenced"),
            us(p50),
            us(percentile(plain, 99.0))
        );
        println!(
            "{:<44} {:>12} {:>12} {:>12.2}",
            format!("{name}, fenced"),
            us(f50),
            us(percentile(fenced, 99.0)),
            f50.as_secs_f64() / p50.as_secs_f64()
        );
    }
    println!(
        "in-memory check (MemoryFence::fenced): {} ns per call over {calls} calls",
        per_call.as_nanos()
    );
}
