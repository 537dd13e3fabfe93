//! Several OS processes racing on one SQLite file: exactly one holder at
//! every instant, tokens strictly increasing, everyone gets a turn.

use std::process::Stdio;

use super::harness::{Event, Scratch, events, leasehold, stderr};

const PROCESSES: usize = 8;
const ROUNDS: usize = 5;

#[test]
fn processes_racing_on_one_file_never_overlap() {
    let scratch = Scratch::new();
    let children: Vec<_> = (0..PROCESSES)
        .map(|i| {
            leasehold()
                .args(["campaign", "--election", "shared-job", "--hold", "15ms"])
                .args(["--rounds", &ROUNDS.to_string(), "--ttl", "5s"])
                .args(["--store", &scratch.store_url(), "--id", &format!("p{i}")])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let mut all: Vec<Event> = Vec::new();
    for child in children {
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success(), "{}", stderr(&out));
        all.extend(events(&out.stdout));
    }
    // Pair each acquisition with its release: one interval of leadership.
    let mut intervals: Vec<(i64, i64, u64, String)> = Vec::new();
    for acquired in all.iter().filter(|e| e.event == "acquired") {
        let released = all
            .iter()
            .find(|e| e.event == "releasing" && e.token == acquired.token)
            .unwrap_or_else(|| panic!("no release for {acquired:?}"));
        assert_eq!(released.id, acquired.id);
        intervals.push((
            acquired.monotonic_ns,
            released.monotonic_ns,
            acquired.token.expect("token"),
            acquired.id.clone(),
        ));
    }
    assert_eq!(intervals.len(), PROCESSES * ROUNDS);
    intervals.sort();
    for pair in intervals.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(
            a.1 < b.0,
            "two holders at once: {} (token {}) held until {} but {} (token {}) acquired at {}",
            a.3,
            a.2,
            a.1,
            b.3,
            b.2,
            b.0
        );
        assert!(b.2 > a.2, "tokens out of order: {} then {}", a.2, b.2);
    }
}
