//! SQLite on one host: how long after SIGKILL of a library holder process a
//! waiter in another process is granted, with a TTL (60 s) that only the
//! kernel's test of the holder's process can beat. Prints a table.
//!
//! `cargo bench -p leasehold --bench process_death [-- --rounds N]`
//!
//! Each round starts a holder process (this binary again, holding the
//! election through the library), lets this process's waiter campaign and
//! wait, SIGKILLs the holder and measures until the waiter's campaign
//! returns the grant. Nothing here asserts a timing.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::backend::sqlite::SqliteStore;
use leasehold::store::Store;
use leasehold::{CandidateId, ElectionName};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Set in the holder process: the database; the election follows in
/// [`HOLDER_ELECTION`].
const HOLDER_DB: &str = "LEASEHOLD_BENCH_HOLDER_DB";
const HOLDER_ELECTION: &str = "LEASEHOLD_BENCH_HOLDER_ELECTION";
const TTL: Duration = Duration::from_secs(60);

fn main() -> Result<(), BoxError> {
    if let Some(db) = std::env::var_os(HOLDER_DB) {
        return hold(Path::new(&db), &std::env::var(HOLDER_ELECTION)?);
    }
    let args: Vec<String> = std::env::args().collect();
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(20usize)
        .max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("bench.db");
    let mut samples = runtime.block_on(async {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db)?);
        let mut samples = Vec::with_capacity(rounds);
        for round in 0..rounds {
            samples.push(one_round(&store, &db, round).await?);
        }
        Ok::<_, BoxError>(samples)
    })?;
    samples.sort();
    let ms = |d: Duration| format!("{:.2}", d.as_secs_f64() * 1000.0);
    let median = if samples.len() % 2 == 1 {
        samples[samples.len() / 2]
    } else {
        (samples[samples.len() / 2 - 1] + samples[samples.len() / 2]) / 2
    };
    println!("SQLite, library holder process SIGKILLed, waiter in another process, TTL {TTL:?}");
    println!(
        "{:<44} {:>8} {:>8} {:>8} {:>6}",
        "measurement", "min ms", "median", "max ms", "n"
    );
    println!(
        "{:<44} {:>8} {:>8} {:>8} {:>6}",
        "SIGKILL of the holder → waiter granted",
        ms(samples[0]),
        ms(median),
        ms(samples[samples.len() - 1]),
        samples.len()
    );
    Ok(())
}

/// One holder process started, waited for, killed; the time from the kill
/// to the waiter's grant.
async fn one_round(store: &Arc<dyn Store>, db: &Path, round: usize) -> Result<Duration, BoxError> {
    let election = ElectionName::new(format!("process-death-{round}"))?;
    let mut child = Command::new(std::env::current_exe()?)
        .env(HOLDER_DB, db)
        .env(HOLDER_ELECTION, election.as_str())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let held = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line == "held");
    if !held {
        let _ = child.kill();
        return Err("the holder process never held the election".into());
    }
    let lease = store.open_session(TTL).await?;
    let waiter = {
        let (store, election) = (Arc::clone(store), election.clone());
        tokio::spawn(async move {
            let grant = store
                .campaign(lease.id, &election, &CandidateId::new("waiter")?)
                .await?;
            Ok::<_, BoxError>((Instant::now(), grant))
        })
    };
    // Let the waiter attempt once and wait on the holder's lock.
    tokio::time::sleep(Duration::from_millis(200)).await;
    if waiter.is_finished() {
        return Err("the waiter was granted while the holder lived".into());
    }
    let pid = Pid::from_raw(i32::try_from(child.id())?);
    let killed_at = Instant::now();
    kill(pid, Signal::SIGKILL)?;
    let (granted_at, _grant) = tokio::time::timeout(TTL, waiter).await???;
    child.wait()?;
    store.close_session(lease.id).await?;
    Ok(granted_at - killed_at)
}

/// The holder process: holds `election` in `db` through the library and
/// renews until it is killed, or its stdin closes (the bench is gone).
fn hold(db: &Path, election: &str) -> Result<(), BoxError> {
    std::thread::spawn(|| {
        let _ = std::io::stdin().read(&mut [0u8; 1]);
        std::process::exit(0);
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = SqliteStore::open(db)?;
        let lease = store.open_session(TTL).await?;
        store
            .campaign(
                lease.id,
                &ElectionName::new(election)?,
                &CandidateId::new("holder")?,
            )
            .await?;
        println!("held");
        loop {
            tokio::time::sleep(TTL / 3).await;
            store.keep_alive(lease.id).await?;
        }
    })
}
