//! leasehold in other recipes' elections: `leasehold run` with a store URL's
//! `?layout=` contends in one election with the real clients of etcd's
//! `concurrency.Election` (`etcdctl elect`), Curator's `LeaderLatch` and
//! kazoo's `Election` (tests/interop/), on real servers.
//!
//! leasehold's command, the foreign clients (through their drivers) and
//! the tests themselves append to one log, events.log, in the order things
//! happen:
//!
//! - `ID start TOKEN PID`, `ID stop TOKEN`: leasehold's command started, or
//!   got SIGTERM and is exiting (before `run` releases the election);
//! - `ID leader ID`, `ID releasing`, … : a foreign client's events as they
//!   arrive (after it gained leadership; `releasing` before it leaves);
//! - `ID stopping`, `ID killed`: written here just before a foreign client
//!   gets SIGTERM or either side gets SIGKILL.
//!
//! Each line of a holder's term is written inside its leadership, so a
//! term that begins before the previous one ended in the log would be two
//! leaders at once. No timing is asserted: waits have generous limits.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

#[path = "../interop/drivers.rs"]
mod drivers;

use drivers::{Foreign, Recipe, Site, mark};

use super::harness::{Proc, Scratch, alive, leasehold, read_lines, status_json, wait_until};

const SECOND: Duration = Duration::from_secs(1);
const ELECTION: &str = "svc";
/// How long a new client may take to start and lead or queue: a JVM on a
/// busy machine is slow to start.
const START: Duration = Duration::from_secs(60);

/// leasehold's command: notes its start (token and pid) and, on SIGTERM,
/// its stop, then works until stopped.
const COMMAND: &str = r#"trap 'echo "$LEASEHOLD_ID stop $LEASEHOLD_TOKEN" >> events.log; exit 0' TERM
echo "$LEASEHOLD_ID start $LEASEHOLD_TOKEN $$" >> events.log
while :; do sleep 0.05; done"#;

/// `leasehold run --ttl 2s` of the election as `id`, in `scratch`, its log
/// in ID.err.
fn run(site: &Site, scratch: &Scratch, id: &str) -> Proc {
    let log = std::fs::File::create(scratch.path(&format!("{id}.err"))).expect("log file");
    Proc::spawn(
        leasehold()
            .args(["run", "--election", ELECTION, "--id", id, "--ttl", "2s"])
            .args(["--store", &site.store(), "--", "sh", "-c", COMMAND])
            .current_dir(scratch.dir.path())
            .stdout(Stdio::null())
            .stderr(log),
    )
}

/// `(token, pid)` of each start of `id`'s command.
fn starts(dir: &Path, id: &str) -> Vec<(u64, i32)> {
    read_lines(&dir.join("events.log"))
        .iter()
        .filter_map(|l| {
            let mut f = l.strip_prefix(&format!("{id} start "))?.split(' ');
            Some((
                f.next()?.parse().ok()?,
                super::harness::seen(f.next()?.parse().ok()?),
            ))
        })
        .collect()
}

/// What the test folder holds, for a failure's message: the events and
/// every process's stderr.
fn report(dir: &Path) -> String {
    let mut out = format!(
        "events.log:\n{}\n",
        std::fs::read_to_string(dir.join("events.log")).unwrap_or_default()
    );
    let mut errs: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    errs.retain(|p| p.extension().is_some_and(|e| e == "err"));
    errs.sort();
    for path in errs {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        out.push_str(&format!(
            "--- {} (last lines):\n{}\n",
            path.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    out
}

/// Reads events.log as terms of leadership and asserts that no two
/// overlap; the holders, in order. A term begins with `start` (leasehold)
/// or `leader ID` (a foreign contender), and ends with `stop`, `stopping`,
/// `releasing`, `not-leader`, `killed` or `exited`.
fn one_at_a_time(dir: &Path) -> Vec<String> {
    let log = read_lines(&dir.join("events.log"));
    let mut holder: Option<String> = None;
    let mut holders = Vec::new();
    for line in &log {
        let mut f = line.split(' ');
        let (Some(who), Some(what)) = (f.next(), f.next()) else {
            continue;
        };
        let begins = what == "start" || (what == "leader" && f.next() == Some(who));
        let ends = matches!(
            what,
            "stop" | "stopping" | "releasing" | "not-leader" | "killed" | "exited"
        );
        if begins {
            if let Some(other) = &holder {
                assert_eq!(
                    other,
                    who,
                    "{who} leads while {other} does: {line:?}\n{}",
                    report(dir)
                );
            } else {
                holder = Some(who.to_owned());
                holders.push(who.to_owned());
            }
        } else if ends && holder.as_deref() == Some(who) {
            holder = None;
        }
    }
    holders
}

/// The foreign client's own name for its candidate: the key etcdctl
/// prints before its proposal, or the node Curator and kazoo create.
fn node_of(foreign: &mut Foreign) -> String {
    let (_, line) = foreign
        .first("key ", Duration::ZERO)
        .or_else(|| foreign.first("queued ", START))
        .unwrap_or_else(|| panic!("{} named no key or node", foreign.tag));
    line.split_once(' ')
        .map(|(_, n)| n.to_owned())
        .unwrap_or_default()
}

/// Waits until `n` candidates are in line.
fn in_line(site: &Site, n: usize, dir: &Path) {
    assert!(
        wait_until(START, || site.candidates(ELECTION) == n),
        "not {n} candidates in line, but {}\n{}",
        site.candidates(ELECTION),
        report(dir)
    );
}

/// a. The foreign contender leads first and leasehold waits: its command
///    does not run, and `status` shows the foreign leader and its token.
/// b. leasehold leads and a foreign contender waits: it does not report
///    leadership, and the recipe's observer shows leasehold's id.
/// c. Graceful hand-offs both ways, never two at once: a foreign leader's
///    graceful stop → leasehold's command runs; SIGTERM to `run` → the
///    foreign contender leads.
fn graceful_handoffs_both_ways(site: &Site) {
    let scratch = Scratch::new();
    let dir = scratch.dir.path();

    // a.
    let mut f1 = site.contend(ELECTION, "foreign-1", Some(dir));
    assert!(
        f1.first("leader foreign-1", START).is_some(),
        "foreign-1 never led\n{}",
        report(dir)
    );
    let f1_node = node_of(&mut f1);
    let mut lh = run(site, &scratch, "lh-1");
    in_line(site, 2, dir);
    // Renewals and watches go on a while: still waiting.
    std::thread::sleep(SECOND);
    assert!(
        starts(dir, "lh-1").is_empty(),
        "leasehold's command ran while foreign-1 led\n{}",
        report(dir)
    );
    let status = status_json(&site.store(), ELECTION);
    assert_eq!(status["leader"]["id"], "foreign-1", "{status}");
    let f1_token = site.token_of(&f1_node).expect("foreign-1's token");
    assert_eq!(status["leader"]["token"], f1_token, "{status}");

    // c, foreign → leasehold.
    mark(dir, "foreign-1", "stopping");
    f1.signal(Signal::SIGTERM);
    assert!(
        wait_until(START, || starts(dir, "lh-1").len() == 1),
        "leasehold's command did not run once foreign-1 stopped\n{}",
        report(dir)
    );
    let (lh_token, _) = starts(dir, "lh-1")[0];
    assert!(lh_token > f1_token, "{lh_token} after {f1_token}");
    assert!(
        f1.wait_exit(START).is_some(),
        "foreign-1 did not exit on SIGTERM"
    );
    if site.recipe.says_released() {
        assert!(f1.has("released"), "foreign-1: {:?}", f1.events());
    }

    // b.
    let mut observer = site.observe(ELECTION, "observer", Some(dir));
    assert!(
        observer.shows("leader lh-1", START),
        "the observer never showed lh-1: {:?}\n{}",
        observer.events(),
        report(dir)
    );
    let mut f2 = site.contend(ELECTION, "foreign-2", Some(dir));
    in_line(site, 2, dir);
    std::thread::sleep(SECOND);
    assert!(
        !f2.has("leader"),
        "foreign-2 leads beside leasehold: {:?}\n{}",
        f2.events(),
        report(dir)
    );
    let status = status_json(&site.store(), ELECTION);
    assert_eq!(status["leader"]["id"], "lh-1", "{status}");
    assert_eq!(status["leader"]["token"], lh_token, "{status}");

    // c, leasehold → foreign.
    lh.signal(Signal::SIGTERM);
    assert!(
        f2.first("leader foreign-2", START).is_some(),
        "foreign-2 did not lead once leasehold stopped\n{}",
        report(dir)
    );
    let status = lh.wait_for_exit(START).expect("run exits on SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", report(dir));
    assert!(
        observer.shows("leader foreign-2", START),
        "the observer never showed foreign-2: {:?}",
        observer.events()
    );
    let f2_token = site.token_of(&node_of(&mut f2)).expect("foreign-2's token");
    assert!(f2_token > lh_token, "{f2_token} after {lh_token}");

    assert_eq!(
        one_at_a_time(dir),
        ["foreign-1", "lh-1", "foreign-2"],
        "{}",
        report(dir)
    );
}

/// d. A crash of either side hands over: SIGKILL of the foreign leader →
///    leasehold leads once the foreign session has expired; SIGKILL of
///    `leasehold run` → its guard releases at once and the foreign
///    contender leads, leasehold's command gone before.
fn crashes_hand_over(site: &Site) {
    let scratch = Scratch::new();
    let dir = scratch.dir.path();

    let mut f1 = site.contend(ELECTION, "foreign-1", Some(dir));
    assert!(
        f1.first("leader foreign-1", START).is_some(),
        "foreign-1 never led\n{}",
        report(dir)
    );
    let mut lh = run(site, &scratch, "lh-1");
    in_line(site, 2, dir);
    mark(dir, "foreign-1", "killed");
    let killed = Instant::now();
    f1.signal(Signal::SIGKILL);
    assert!(
        wait_until(site.session + START, || starts(dir, "lh-1").len() == 1),
        "leasehold did not lead after foreign-1's session ({:?}) expired\n{}",
        site.session,
        report(dir)
    );
    eprintln!(
        "{}: leasehold led {:?} after the SIGKILL (session {:?})",
        site.recipe.client(),
        killed.elapsed(),
        site.session
    );
    drop(f1);

    let mut f2 = site.contend(ELECTION, "foreign-2", Some(dir));
    in_line(site, 2, dir);
    let (_, command) = starts(dir, "lh-1")[0];
    mark(dir, "lh-1", "killed");
    lh.signal(Signal::SIGKILL);
    assert!(
        f2.first("leader foreign-2", START).is_some(),
        "foreign-2 did not lead once leasehold was killed\n{}",
        report(dir)
    );
    assert!(!alive(command), "leasehold's command outlived its runner");
    let _ = lh.wait_for_exit(START);
    // The guard logs once the store confirmed the release, which may be
    // after foreign-2 saw it: its line may still be on the way.
    let said = || {
        std::fs::read_to_string(scratch.path("lh-1.err"))
            .unwrap_or_default()
            .contains("released the election for the next candidate")
    };
    assert!(
        wait_until(START, said),
        "the guard did not say it released\n{}",
        report(dir)
    );
    assert_eq!(
        one_at_a_time(dir),
        ["foreign-1", "lh-1", "foreign-2"],
        "{}",
        report(dir)
    );
}

/// Curator's and kazoo's sessions where they are to expire (the ZooKeeper
/// harness allows 200 ms to 60 s): short, so that the test is.
const ZK_CRASH_SESSION: Duration = Duration::from_secs(4);
/// And where none is to expire: long enough that a busy machine's stalls
/// never suspend a connection (Curator gives up leadership on a suspended
/// one, after two thirds of the session).
const ZK_SESSION: Duration = Duration::from_secs(10);
/// etcdctl's session lease, fixed.
const ETCDCTL_SESSION: Duration = Duration::from_secs(60);

#[test]
fn etcdctl_elect_and_leasehold_hand_over_gracefully_both_ways() {
    graceful_handoffs_both_ways(&Site::start(Recipe::Concurrency, ETCDCTL_SESSION));
}

/// etcdctl's session lease is 60 s, fixed: this test waits that long (and
/// overlaps the others).
#[test]
fn etcdctl_elect_and_leasehold_hand_over_after_crashes() {
    crashes_hand_over(&Site::start(Recipe::Concurrency, ETCDCTL_SESSION));
}

#[test]
fn curator_leader_latch_and_leasehold_hand_over_gracefully_both_ways() {
    graceful_handoffs_both_ways(&Site::start(Recipe::Curator, ZK_SESSION));
}

#[test]
fn curator_leader_latch_and_leasehold_hand_over_after_crashes() {
    crashes_hand_over(&Site::start(Recipe::Curator, ZK_CRASH_SESSION));
}

#[test]
fn kazoo_election_and_leasehold_hand_over_gracefully_both_ways() {
    graceful_handoffs_both_ways(&Site::start(Recipe::Kazoo, ZK_SESSION));
}

#[test]
fn kazoo_election_and_leasehold_hand_over_after_crashes() {
    crashes_hand_over(&Site::start(Recipe::Kazoo, ZK_CRASH_SESSION));
}
