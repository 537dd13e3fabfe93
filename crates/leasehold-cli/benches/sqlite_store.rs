//! SQLite store latencies and cross-process handover; prints a table.
//!
//! `cargo bench -p leasehold-cli --bench sqlite_store [-- --iterations N]`
//!
//! Figures are medians and 99th percentiles over N runs on this machine;
//! nothing here asserts a timing.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::backend::sqlite::SqliteStore;
use leasehold::store::Store;
use leasehold::{CandidateId, ElectionName};

use leasehold::clock::host_monotonic_ns as monotonic_ns;

struct Stats {
    name: &'static str,
    samples: Vec<Duration>,
}

impl Stats {
    fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.samples.clone();
        sorted.sort();
        let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
        sorted[rank.min(sorted.len() - 1)]
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let iterations = args
        .iter()
        .position(|a| a == "--iterations")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(200usize);
    let handovers = (iterations / 5).max(10);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bench.db");
    let results = runtime.block_on(async {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path)?);
        let me = CandidateId::new("bench")?;
        let lease = store.open_session(Duration::from_secs(60)).await?;
        let election = ElectionName::new("bench-latency")?;
        let mut campaign = Stats {
            name: "campaign (uncontended)",
            samples: vec![],
        };
        let mut renew = Stats {
            name: "renew (keep-alive)",
            samples: vec![],
        };
        let mut resign = Stats {
            name: "resign",
            samples: vec![],
        };
        for _ in 0..iterations {
            let t = Instant::now();
            let grant = store.campaign(lease.id, &election, &me).await?;
            campaign.samples.push(t.elapsed());
            let t = Instant::now();
            store.keep_alive(lease.id).await?;
            renew.samples.push(t.elapsed());
            let t = Instant::now();
            store.resign(&grant).await?;
            resign.samples.push(t.elapsed());
        }
        let handover = handover_to_a_process(&store, lease.id, &path, handovers).await?;
        Ok::<_, Box<dyn std::error::Error>>(vec![campaign, renew, resign, handover])
    })?;
    println!(
        "SQLite store, {iterations} iterations ({handovers} for handover), synchronous=FULL, WAL"
    );
    println!(
        "{:<44} {:>10} {:>10} {:>6}",
        "operation", "p50 ms", "p99 ms", "n"
    );
    for s in &results {
        println!(
            "{:<44} {:>10} {:>10} {:>6}",
            s.name,
            ms(s.percentile(50.0)),
            ms(s.percentile(99.0)),
            s.samples.len()
        );
    }
    Ok(())
}

/// A separate `leasehold campaign` process waits; this process resigns and
/// the time until the waiter reports the grant (both on CLOCK_MONOTONIC) is
/// the handover.
async fn handover_to_a_process(
    store: &Arc<dyn Store>,
    session: leasehold::SessionId,
    path: &std::path::Path,
    rounds: usize,
) -> Result<Stats, Box<dyn std::error::Error>> {
    let election = ElectionName::new("bench-handover")?;
    let me = CandidateId::new("bench")?;
    let mut stats = Stats {
        name: "handover to a waiting process (resign→grant)",
        samples: vec![],
    };
    for _ in 0..rounds {
        let grant = store.campaign(session, &election, &me).await?;
        let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args([
                "campaign",
                "--election",
                election.as_str(),
                "--id",
                "waiter",
            ])
            .arg("--store")
            .arg(format!("sqlite:{}", path.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next().ok_or("child said nothing")??;
        if !first.contains("\"campaigning\"") {
            return Err(format!("unexpected first line {first}").into());
        }
        // Let the waiter reach its wait after its first attempt.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let released_at = monotonic_ns();
        store.resign(&grant).await?;
        let acquired = lines
            .find_map(|l| l.ok().filter(|l| l.contains("\"acquired\"")))
            .ok_or("waiter never acquired")?;
        let value: serde_json::Value = serde_json::from_str(&acquired)?;
        let acquired_at = value["monotonic_ns"].as_i64().ok_or("no timestamp")?;
        stats.samples.push(Duration::from_nanos(u64::try_from(
            acquired_at - released_at,
        )?));
        child.wait()?;
    }
    Ok(stats)
}
