//! Hand-offs between leasehold and other recipes' real clients in one
//! election: etcd's `concurrency.Election` (`etcdctl elect`), Curator's
//! `LeaderLatch` and kazoo's `Election` (the clients of tests/interop/).
//!
//! `cargo bench -p leasehold-cli --bench interop [-- --rounds N]`
//!
//! Per recipe, on its own server (a 1-member etcd cluster, a standalone
//! ZooKeeper; Debian's packages, on loopback), N rounds (default 10) of each:
//!
//! - foreign → leasehold: the foreign leader gets SIGTERM (a graceful stop)
//!   with `leasehold run` waiting; until leasehold's command's first line;
//! - leasehold → foreign: `leasehold run` gets SIGTERM with the foreign
//!   contender waiting; until the contender's `leader` line;
//! - foreign → foreign, the baseline: the same client handing over to
//!   another instance of itself.
//!
//! The two directions alternate in one election (each new waiter becomes
//! the next leader), the baseline runs in another. Each waiter is in line
//! (its key or node is there) and has settled before the signal. Times run
//! from just before the signal to the line arriving here (read as it
//! comes). Medians, 90th percentiles and the ratio of the median to the
//! baseline's; nothing asserts a timing.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

mod common;
use common::{Replica, arg, ms, percentile};

#[path = "../tests/interop/drivers.rs"]
mod drivers;
use drivers::{Foreign, KAZOO, Recipe, Site};

/// leasehold's command: prints `start PID`, then works until SIGTERM.
const WORK: &str = r#"trap 'exit 0' TERM; echo "start $$"; while :; do sleep 0.02; done"#;
/// leasehold's TTL, and the Curator and kazoo sessions: no hand-off here
/// waits for an expiry.
const TTL: &str = "10s";
const SESSION: Duration = Duration::from_secs(10);
/// How long a waiter is left in line before the signal, for its watch to
/// be set.
const SETTLE: Duration = Duration::from_millis(300);
const PATIENCE: Duration = Duration::from_secs(60);

/// Waits until `n` candidates are in line in `election`, then settles.
fn in_line(site: &Site, election: &str, n: usize) {
    let until = Instant::now() + PATIENCE;
    while site.candidates(election) != n {
        assert!(
            Instant::now() < until,
            "{}: not {n} candidates in line in {election}",
            site.recipe.client()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(SETTLE);
}

/// A foreign contender that leads.
fn leading(site: &Site, election: &str, id: &str) -> Foreign {
    let mut foreign = site.contend(election, id, None);
    assert!(
        foreign.first(&format!("leader {id}"), PATIENCE).is_some(),
        "{}: {id} never led",
        site.recipe.client()
    );
    foreign
}

/// Stops a foreign leader gracefully and waits for it to exit.
fn stop(mut foreign: Foreign) {
    foreign.signal(Signal::SIGTERM);
    foreign.wait_exit(PATIENCE);
}

/// Alternating hand-offs in one election: (foreign → leasehold,
/// leasehold → foreign) samples.
fn both_ways(site: &Site, rounds: usize) -> (Vec<Duration>, Vec<Duration>) {
    let election = "both-ways";
    let store = site.store();
    let (mut to_leasehold, mut to_foreign) = (Vec::new(), Vec::new());
    let mut foreign = leading(site, election, "foreign-0");
    for i in 0..rounds {
        let replica = Replica::leasehold(&store, election, &format!("lh-{i}"), TTL, WORK);
        in_line(site, election, 2);
        let t0 = Instant::now();
        foreign.signal(Signal::SIGTERM);
        let (t1, _) = replica
            .line_with("start", PATIENCE)
            .unwrap_or_else(|| panic!("{}: leasehold never ran", site.recipe.client()));
        to_leasehold.push(t1 - t0);
        stop(foreign);

        let id = format!("foreign-{}", i + 1);
        let mut next = site.contend(election, &id, None);
        in_line(site, election, 2);
        let t0 = Instant::now();
        replica.signal(Signal::SIGTERM);
        let (t1, _) = next
            .first(&format!("leader {id}"), PATIENCE)
            .unwrap_or_else(|| panic!("{}: {id} never led", site.recipe.client()));
        to_foreign.push(t1 - t0);
        let mut replica = replica;
        let _ = replica.child.wait();
        foreign = next;
    }
    stop(foreign);
    (to_leasehold, to_foreign)
}

/// The client handing over to another instance of itself.
fn baseline(site: &Site, rounds: usize) -> Vec<Duration> {
    let election = "baseline";
    let mut samples = Vec::new();
    let mut foreign = leading(site, election, "own-0");
    for i in 0..rounds {
        let id = format!("own-{}", i + 1);
        let mut next = site.contend(election, &id, None);
        in_line(site, election, 2);
        let t0 = Instant::now();
        foreign.signal(Signal::SIGTERM);
        let (t1, _) = next
            .first(&format!("leader {id}"), PATIENCE)
            .unwrap_or_else(|| panic!("{}: {id} never led", site.recipe.client()));
        samples.push(t1 - t0);
        stop(foreign);
        foreign = next;
    }
    stop(foreign);
    samples
}

fn version(command: &str, args: &[&str]) -> String {
    std::process::Command::new(command)
        .args(args)
        .output()
        .map(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned()
                + &String::from_utf8_lossy(&o.stderr);
            text.lines().next().unwrap_or_default().trim().to_owned()
        })
        .unwrap_or_default()
}

fn main() {
    let rounds = arg("--rounds", 10).max(1);
    // Debian's versioned name of the jar: curator-recipes-5.4.0.jar.
    let curator = std::fs::read_dir("/usr/share/java")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("curator-recipes-") && n.ends_with(".jar"))
        .unwrap_or_else(|| "curator-recipes.jar".to_owned());
    println!(
        "hand-offs by SIGTERM (graceful), {rounds} rounds each; leasehold TTL {TTL}, \
         Curator/kazoo sessions {SESSION:?}"
    );
    println!(
        "clients: {} (session TTL 60 s), {curator} on {}, {KAZOO} on {}",
        version("etcdctl", &["version"]),
        version("java", &["-version"]),
        version("python3", &["--version"])
    );
    println!();
    let mut rows = Vec::new();
    for recipe in Recipe::ALL {
        let site = Site::start(recipe, SESSION);
        let base = baseline(&site, rounds);
        let (to_leasehold, to_foreign) = both_ways(&site, rounds);
        let base_median = percentile(&base, 50.0);
        let ratio = |samples: &[Duration]| {
            let median = percentile(samples, 50.0).as_secs_f64();
            let base = base_median.as_secs_f64();
            if base > 0.0 {
                format!("{:.2}", median / base)
            } else {
                "-".to_owned()
            }
        };
        let name = format!("{} ({})", recipe.client(), recipe.layout());
        for (direction, samples) in [
            ("foreign → leasehold", &to_leasehold),
            ("leasehold → foreign", &to_foreign),
            ("foreign → foreign (baseline)", &base),
        ] {
            rows.push((
                name.clone(),
                direction,
                samples.len(),
                ms(percentile(samples, 50.0)),
                ms(percentile(samples, 90.0)),
                ratio(samples),
            ));
        }
        drop(site);
    }
    println!(
        "{:<36} {:<30} {:>6} {:>10} {:>10} {:>11}",
        "recipe", "direction", "rounds", "median ms", "p90 ms", "× baseline"
    );
    for (recipe, direction, n, median, p90, ratio) in rows {
        println!("{recipe:<36} {direction:<30} {n:>6} {median:>10} {p90:>10} {ratio:>11}");
    }
}
