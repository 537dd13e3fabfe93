//! Many responsibilities at scale, on every store, in one table.
//!
//! `cargo bench -p leasehold --bench groups [-- --held 1,10000
//! --contenders 1000 --rounds 20 --shards 256 --stores sqlite,etcd,zookeeper,postgres]`
//!
//! Per store:
//!
//! - **held N**: one process (this one), one session, takes N elections
//!   (`Elector::campaign`, 100 at a time, or `GROUPS_AT_ONCE`) and then
//!   idles for five renewal
//!   periods. Reported: the time to take them; the store requests per
//!   renewal period while idle (renewals, and anything else, the reads
//!   watches make on their own included); this process's CPU while idle
//!   (user + system, share of one core), its resident memory grown and
//!   the heap it keeps (allocated, not freed: a counting allocator) per
//!   held election, and how many of the elections are still led at the
//!   end (why the others were lost goes to stderr; `GROUPS_TRACE=1` prints
//!   every renewal and the runtime's worst lateness).
//! - **contenders C**: C candidates in this process, each on its own
//!   session over one shared store handle, campaign for one election. The
//!   time to the first grant, the time until all the others wait in line
//!   (the line read every 100 ms), then R handovers (the leader resigns): the
//!   time from the release to the next grant (p50 / p99), and the store
//!   requests of all candidates per handover, renewals excepted
//!   (`GROUPS_TRACE=1` prints each handover's by kind).
//! - **group of S shards over 4 members** (each its own handle): time to
//!   settle from a cold start (all four at once); a fourth member joining
//!   three settled ones (time to settle, shards moved); a member killed as
//!   `run` is killed — cut off from the store, its grants released and its
//!   membership removed from another handle, as its guards do — (time to
//!   settle, shards moved).
//!
//! Servers start on loopback (a 3-member etcd cluster, a standalone
//! ZooKeeper, a PostgreSQL server; Debian's packages) and stop at the end;
//! SQLite is a file in a temporary folder. Nothing asserts a timing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::store::{Store, StoreUrl};
use leasehold::testing::{CountingStore, Counts, watch_reads};
use leasehold::{CandidateId, ElectionName, Elector, LeaseConfig};
use leasehold_testkit::{EtcdCluster, PostgresServer, ZooKeeperServer};
use tokio::task::JoinSet;

#[path = "groups/shards.rs"]
mod shards;
use shards::{Grouped, group, open_patiently};

/// The system allocator, counting the bytes allocated and not yet freed,
/// so that the bench can tell what held elections keep on the heap apart
/// from what the allocator keeps resident (freed memory it has not given
/// back, a peak's arenas).
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every method passes its arguments unchanged to `System`, which
// upholds `GlobalAlloc`'s contract; the counter is a relaxed atomic that
// never allocates, so it cannot reenter the allocator.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's obligations for `alloc` are `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`,
        // with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from `System` with `layout`, as `dealloc`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes on the heap now (allocated and not yet freed).
fn heap() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Lease TTL of every session (renewal every second).
const TTL: Duration = Duration::from_secs(3);
/// How long one phase may take before the bench reports it unfinished.
const CAP: Duration = Duration::from_secs(300);

fn id(name: &str) -> CandidateId {
    CandidateId::new(name).expect("id")
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn elector(store: Arc<dyn Store>, name: &str) -> Elector {
    Elector::new(store, id(name), LeaseConfig::new(TTL)).expect("config")
}

/// This process's CPU time (user + system) and resident memory.
fn usage() -> (Duration, u64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields
        .get(11)
        .and_then(|u| u.parse::<u64>().ok())
        .unwrap_or(0)
        + fields
            .get(12)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0);
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // USER_HZ is 100 on Linux; pages are 4 KiB here.
    (Duration::from_millis(ticks * 10), pages * 4096)
}

/// Store requests other than renewals: those made through the store's
/// API, and the reads watch tasks make on their own (counted for every
/// store in this process: the bench runs one store at a time).
fn requests(c: &Counts, watch_reads: u64) -> u64 {
    c.reads + c.watches + c.campaigns + c.unwaited + c.writes + watch_reads
}

struct Held {
    n: usize,
    taken: String,
    renewals_per_period: f64,
    others_per_period: f64,
    idle_cpu: String,
    memory: String,
    /// The heap this process keeps (allocated, not freed) for them.
    heap_kept: String,
    /// How many of the elections taken are still led after the idle time.
    leading: usize,
}

async fn held(url: &StoreUrl, n: usize) -> Held {
    // Wakes are not counted here: relaying every watch through a task of
    // the wrapper would add a task per watch to the memory measured.
    let handle = Arc::new(CountingStore::without_wakes(open_patiently(url).await));
    let ((_, rss_before), heap_before) = (usage(), heap());
    let started = Instant::now();
    let elector = Arc::new(
        elector(Arc::clone(&handle) as Arc<dyn Store>, "holder").with_renewal_observer(
            leasehold::RenewalObserver::new(move |event| {
                if std::env::var_os("GROUPS_TRACE").is_some() {
                    eprintln!("{:.3} {event:?}", started.elapsed().as_secs_f64());
                }
            }),
        ),
    );
    // How late a timer fires on this runtime while the elections are taken.
    let lateness = Arc::new(Mutex::new((Duration::ZERO, Duration::ZERO)));
    let probe = {
        let lateness = Arc::clone(&lateness);
        tokio::spawn(async move {
            loop {
                let asked = Instant::now();
                tokio::time::sleep(Duration::from_millis(10)).await;
                let late = asked.elapsed().saturating_sub(Duration::from_millis(10));
                let mut worst = lateness.lock().unwrap_or_else(|p| p.into_inner());
                if late > worst.0 {
                    *worst = (late, started.elapsed());
                }
            }
        })
    };
    // At most GROUPS_AT_ONCE campaigns at a time, by as many workers that
    // take the next election in turn: tasks waiting for a permit would
    // each hold a campaign's whole state, a peak of memory that the
    // allocator keeps resident afterwards and the memory column would
    // blame on the held elections.
    let at_once: usize = std::env::var("GROUPS_AT_ONCE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..at_once.clamp(1, n.max(1)) {
        let (elector, next) = (Arc::clone(&elector), Arc::clone(&next));
        tasks.spawn(async move {
            let mut taken = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return taken;
                }
                let election = ElectionName::new(format!("held-{n}/{i}")).expect("name");
                if let Ok(leadership) = elector.campaign(&election).await {
                    taken.push(leadership);
                }
            }
        });
    }
    let mut leaderships = Vec::with_capacity(n);
    let finished = tokio::time::timeout(CAP, async {
        while let Some(done) = tasks.join_next().await {
            if let Ok(taken) = done {
                leaderships.extend(taken);
            }
        }
    })
    .await;
    let took = started.elapsed();
    probe.abort();
    if std::env::var_os("GROUPS_TRACE").is_some() {
        let (late, at) = *lateness.lock().unwrap_or_else(|p| p.into_inner());
        eprintln!("held {n}: a 10 ms timer fired up to {late:?} late (at {at:?})");
        let c = handle.counts();
        eprintln!(
            "held {n}: taking them: reads {} watches {} campaigns {} unwaited {} writes {} watch reads {}",
            c.reads,
            c.watches,
            c.campaigns,
            c.unwaited,
            c.writes,
            watch_reads()
        );
    }
    let taken = match finished {
        Ok(()) if leaderships.len() == n => format!(
            "{:.2} s ({} ms each)",
            took.as_secs_f64(),
            ms(took / u32::try_from(n).unwrap_or(1))
        ),
        _ => format!(
            "{} of {n} in {:.0} s",
            leaderships.len(),
            took.as_secs_f64()
        ),
    };
    tasks.abort_all();
    // Idle: let the watches settle, then five renewal periods.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let period = LeaseConfig::new(TTL).renew_every;
    let (cpu_before, _) = usage();
    let counts_before = handle.counts();
    let reads_before = watch_reads();
    let idle_started = Instant::now();
    tokio::time::sleep(period * 5).await;
    let idle = idle_started.elapsed();
    let ((cpu_after, rss_after), heap_after) = (usage(), heap());
    let counts_after = handle.counts();
    let reads_after = watch_reads();
    let periods = idle.as_secs_f64() / period.as_secs_f64();
    let renewals = (counts_after.renewals - counts_before.renewals) as f64 / periods;
    let others = (requests(&counts_after, reads_after) - requests(&counts_before, reads_before))
        as f64
        / periods;
    let cpu = (cpu_after - cpu_before).as_secs_f64() / idle.as_secs_f64() * 100.0;
    let grown = rss_after.saturating_sub(rss_before);
    let kept = (heap_after - heap_before).max(0) as f64;
    let (memory, heap_kept) = if n > 1 {
        let each = leaderships.len().max(1) as f64;
        (
            format!("{:.1} KiB each", grown as f64 / 1024.0 / each),
            format!("{:.2} KiB each", kept / 1024.0 / each),
        )
    } else {
        (
            format!("{:.0} KiB", grown as f64 / 1024.0),
            format!("{:.1} KiB", kept / 1024.0),
        )
    };
    let mut lost: HashMap<String, usize> = HashMap::new();
    for reason in leaderships.iter().filter_map(|l| l.lost_reason()) {
        *lost.entry(reason.to_string()).or_default() += 1;
    }
    if !lost.is_empty() {
        eprintln!("held {n}: leaderships lost by the end: {lost:?}");
    }
    let leading = leaderships.iter().filter(|l| l.is_leader()).count();
    let _ = elector.close().await;
    drop(leaderships);
    Held {
        leading,
        n,
        taken,
        renewals_per_period: renewals,
        others_per_period: others,
        idle_cpu: format!("{cpu:.2} %"),
        memory,
        heap_kept,
    }
}

struct Contended {
    contenders: usize,
    first: String,
    in_line: String,
    handover: String,
    requests: String,
}

/// How long a contender whose campaign failed waits before the next one
/// (the runner's pause).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// When (since `started`) `waiting` candidates stood in `election`'s
/// line, read every 100 ms; "-" if not within a minute.
async fn all_in_line(
    store: &dyn Store,
    election: &ElectionName,
    waiting: usize,
    started: Instant,
) -> String {
    let give_up = Instant::now() + Duration::from_secs(60);
    while Instant::now() < give_up {
        if let Ok(notes) = store.notes(election).await
            && leasehold::admin::standbys(&notes).len() >= waiting
        {
            return ms(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    "-".into()
}

async fn contenders(url: &StoreUrl, c: usize, rounds: usize) -> Contended {
    let handle = Arc::new(CountingStore::new(open_patiently(url).await));
    let election = ElectionName::new(format!("contended-{c}")).expect("name");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut loops = JoinSet::new();
    let started = Instant::now();
    for i in 0..c {
        let elector = elector(Arc::clone(&handle) as Arc<dyn Store>, &format!("c{i}"));
        let (election, tx) = (election.clone(), tx.clone());
        loops.spawn(async move {
            loop {
                match elector.campaign(&election).await {
                    Ok(leadership) => {
                        let (done_tx, done) = tokio::sync::oneshot::channel::<()>();
                        if tx.send((leadership, done_tx)).is_err() {
                            return;
                        }
                        let _ = done.await;
                    }
                    Err(error) => {
                        if std::env::var_os("GROUPS_TRACE").is_some() {
                            eprintln!("campaign failed: {error}");
                        }
                        // As `leasehold run` does: a thousand contenders
                        // retrying at once would be a herd of their own.
                        tokio::time::sleep(RETRY_AFTER).await;
                    }
                }
            }
        });
    }
    let Ok(Some((leader, done))) = tokio::time::timeout(CAP, rx.recv()).await else {
        return Contended {
            contenders: c,
            first: "none".into(),
            in_line: "-".into(),
            handover: "-".into(),
            requests: "-".into(),
        };
    };
    let first = started.elapsed();
    // Every other contender waits in line before handovers are measured.
    let in_line = all_in_line(&*handle, &election, c - 1, started).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut times = Vec::new();
    let mut ops = Vec::new();
    let mut current = Some((leader, done));
    for _ in 0..rounds {
        let Some((leader, done)) = current.take() else {
            break;
        };
        let (before, reads_before) = (handle.counts(), watch_reads());
        let released = Instant::now();
        let _ = leader.resign().await;
        let _ = done.send(());
        match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
            Ok(Some(next)) => {
                times.push(released.elapsed());
                current = Some(next);
            }
            _ => break,
        }
        // The old leader joins the line again: part of the round's cost.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (after, reads_after) = (handle.counts(), watch_reads());
        if std::env::var_os("GROUPS_TRACE").is_some() {
            eprintln!(
                "handover in {:?}: reads {} watches {} campaigns {} unwaited {} writes {} watch reads {}",
                times.last(),
                after.reads - before.reads,
                after.watches - before.watches,
                after.campaigns - before.campaigns,
                after.unwaited - before.unwaited,
                after.writes - before.writes,
                reads_after - reads_before
            );
        }
        ops.push(requests(&after, reads_after) - requests(&before, reads_before));
    }
    loops.abort_all();
    drop(current);
    times.sort();
    ops.sort_unstable();
    let pick = |v: &[Duration], q: f64| {
        v.get(((v.len() as f64 - 1.0) * q).round() as usize)
            .map_or("-".into(), |d| ms(*d))
    };
    Contended {
        contenders: c,
        first: ms(first),
        in_line,
        handover: format!("{} / {}", pick(&times, 0.5), pick(&times, 0.99)),
        requests: ops
            .get(ops.len() / 2)
            .map_or("-".into(), ToString::to_string),
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn numbers(args: &[String], name: &str, default: &str) -> Vec<usize> {
    arg(args, name)
        .unwrap_or_else(|| default.into())
        .split(',')
        .map(|w| {
            w.parse()
                .unwrap_or_else(|_| panic!("{name} takes numbers, comma-separated"))
        })
        .collect()
}

struct StoreRows {
    store: &'static str,
    held: Vec<Held>,
    contended: Vec<Contended>,
    grouped: Option<Grouped>,
}

async fn run_store(
    store: &'static str,
    url: &str,
    held_counts: &[usize],
    contender_counts: &[usize],
    rounds: usize,
    count: u32,
) -> StoreRows {
    let url: StoreUrl = url.parse().expect("a valid store URL");
    let mut rows = StoreRows {
        store,
        held: Vec::new(),
        contended: Vec::new(),
        grouped: None,
    };
    for &n in held_counts.iter().filter(|&&n| n > 0) {
        eprintln!("{store}: holding {n}");
        rows.held.push(held(&url, n).await);
    }
    for &c in contender_counts.iter().filter(|&&c| c > 0) {
        eprintln!("{store}: {c} contenders");
        rows.contended.push(contenders(&url, c, rounds).await);
    }
    if count > 0 {
        eprintln!("{store}: a group of {count} shards");
        rows.grouped = Some(group(&url, count).await);
    }
    rows
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let held_counts = numbers(&args, "--held", "1,10000");
    let contender_counts = numbers(&args, "--contenders", "1000");
    let rounds = numbers(&args, "--rounds", "20")[0];
    let count = u32::try_from(numbers(&args, "--shards", "256")[0]).expect("--shards");
    let stores = arg(&args, "--stores").unwrap_or_else(|| "sqlite,etcd,zookeeper,postgres".into());
    let mut all = Vec::new();
    let dir = tempfile::tempdir().expect("temporary folder");
    for store in stores.split(',') {
        let rows = match store {
            "sqlite" => {
                let url = format!("sqlite:{}/groups.db", dir.path().display());
                run_store(
                    "sqlite",
                    &url,
                    &held_counts,
                    &contender_counts,
                    rounds,
                    count,
                )
                .await
            }
            "etcd" => {
                let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(3))
                    .await
                    .expect("etcd");
                run_store(
                    "etcd (3 members)",
                    &cluster.url("/groups"),
                    &held_counts,
                    &contender_counts,
                    rounds,
                    count,
                )
                .await
            }
            "zookeeper" => {
                let zk = tokio::task::spawn_blocking(ZooKeeperServer::start)
                    .await
                    .expect("zookeeper");
                run_store(
                    "zookeeper",
                    &zk.url("/groups"),
                    &held_counts,
                    &contender_counts,
                    rounds,
                    count,
                )
                .await
            }
            "postgres" => {
                let pg = tokio::task::spawn_blocking(PostgresServer::start)
                    .await
                    .expect("postgres");
                run_store(
                    "postgres",
                    &format!("{}?schema=groups", pg.url()),
                    &held_counts,
                    &contender_counts,
                    rounds,
                    count,
                )
                .await
            }
            other => panic!("--stores: unknown store {other}"),
        };
        all.push(rows);
    }
    println!("\nTTL {TTL:?} (a renewal period of 1 s); one process\n");
    println!(
        "| store | held | time to take them | renewals / period | other requests / period | idle CPU | memory grown | heap kept | still leading after |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for rows in &all {
        for h in &rows.held {
            println!(
                "| {} | {} | {} | {:.1} | {:.1} | {} | {} | {} | {} |",
                rows.store,
                h.n,
                h.taken,
                h.renewals_per_period,
                h.others_per_period,
                h.idle_cpu,
                h.memory,
                h.heap_kept,
                h.leading
            );
        }
    }
    println!(
        "\n| store | contenders | first grant ms | all in line ms | handover ms p50 / p99 | requests / handover |"
    );
    println!("|---|---|---|---|---|---|");
    for rows in &all {
        for c in &rows.contended {
            println!(
                "| {} | {} | {} | {} | {} | {} |",
                rows.store, c.contenders, c.first, c.in_line, c.handover, c.requests
            );
        }
    }
    println!("\n| store | 4 members: cold start | a 4th joins 3 | one of 4 killed |");
    println!("|---|---|---|---|");
    for rows in &all {
        if let Some(g) = &rows.grouped {
            println!("| {} | {} | {} | {} |", rows.store, g.cold, g.join, g.kill);
        }
    }
}
