//! The simulation in CI: 10,000 seeds must hold every invariant, runs must
//! be reproducible, and the checkers must catch deliberately broken setups.
//! A failure prints its seed and the command that replays it.

use leasehold_sim::{Scenario, run};

/// Seeds `start..start + count`, or `LEASEHOLD_SIM_SEEDS` seeds in total
/// split the same way.
fn seeds(part: u64, parts: u64) -> std::ops::Range<u64> {
    let total: u64 = std::env::var("LEASEHOLD_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let per = total.div_ceil(parts);
    part * per..((part + 1) * per).min(total)
}

/// Eight parts of 1,250 seeds: each stays well inside nextest's per-test
/// limit on a busy 2-core machine (four parts of 2,500 did not).
const PARTS: u64 = 8;

fn all_hold(part: u64) {
    let scenario = Scenario::default();
    let (mut faults, mut released, mut transfers) = (0, 0, 0);
    let seeds = seeds(part, PARTS);
    for seed in seeds.clone() {
        match run(seed, &scenario) {
            Ok(history) => {
                faults += history.faults;
                released += history.witness_releases;
                transfers += history.transfers_requested;
            }
            Err(failure) => panic!("{failure}"),
        }
    }
    assert!(faults > 0, "no faults were injected");
    assert!(transfers > 0, "no transfer was requested during the faults");
    // One release per seed is the liveness phase's witnessed crash; the
    // rest are witnessed crashes of leaders among the faults.
    assert!(
        released as u64 > seeds.end - seeds.start,
        "no witnessed crash released a leader's grant during the faults"
    );
}

#[test]
fn seeds_hold_every_invariant_part_1_of_8() {
    all_hold(0);
}

#[test]
fn seeds_hold_every_invariant_part_2_of_8() {
    all_hold(1);
}

#[test]
fn seeds_hold_every_invariant_part_3_of_8() {
    all_hold(2);
}

#[test]
fn seeds_hold_every_invariant_part_4_of_8() {
    all_hold(3);
}

#[test]
fn seeds_hold_every_invariant_part_5_of_8() {
    all_hold(4);
}

#[test]
fn seeds_hold_every_invariant_part_6_of_8() {
    all_hold(5);
}

#[test]
fn seeds_hold_every_invariant_part_7_of_8() {
    all_hold(6);
}

#[test]
fn seeds_hold_every_invariant_part_8_of_8() {
    all_hold(7);
}

/// Two candidates under one id (two replicas given the same `--id`):
/// neither takes the election from the other, and every invariant holds.
#[test]
fn seeds_hold_every_invariant_with_twin_ids() {
    let scenario = Scenario {
        twin_ids: true,
        ..Scenario::default()
    };
    let mut faults = 0;
    for seed in seeds(0, 20) {
        match run(seed, &scenario) {
            Ok(history) => faults += history.faults,
            Err(failure) => panic!("{failure}"),
        }
    }
    assert!(faults > 0, "no faults were injected");
}

#[test]
fn a_seed_replays_exactly() {
    // Without tokio's RNG seeded (the build has no tokio_unstable): every
    // wake-up order in the library is deterministic (`leasehold::watch`).
    let scenario = Scenario::default();
    for seed in [7, 1234, 99_999, 3, 42, 2026, 65_535, 123_456_789] {
        let a = run(seed, &scenario)
            .map_err(|f| f.to_string())
            .expect("passes");
        let b = run(seed, &scenario)
            .map_err(|f| f.to_string())
            .expect("passes");
        assert_eq!(format!("{a:?}"), format!("{b:?}"), "seed {seed}");
    }
}

/// Runs up to 1,000 seeds of `scenario` and returns the first failure.
fn first_failure(scenario: &Scenario) -> String {
    first_failing_run(scenario).to_string()
}

fn first_failing_run(scenario: &Scenario) -> Box<leasehold_sim::Failure> {
    (0..1_000)
        .find_map(|seed| run(seed, scenario).err())
        .unwrap_or_else(|| {
            panic!("1,000 seeds of a broken setup found nothing: the checkers are blind")
        })
}

#[test]
fn the_checkers_catch_a_deadline_computed_from_the_reply() {
    let failure = first_failure(&Scenario {
        unsafe_deadline: true,
        ..Scenario::default()
    });
    assert!(failure.contains("one leader at a time"), "{failure}");
    assert!(failure.contains("--unsafe-deadline"), "{failure}");
}

#[test]
fn the_checkers_catch_skew_beyond_the_bound() {
    let failure = first_failure(&Scenario {
        store_clock_step: std::time::Duration::from_millis(600),
        ..Scenario::default()
    });
    assert!(failure.contains("one leader at a time"), "{failure}");
}

#[test]
fn the_checkers_catch_an_unfenced_resource() {
    let failure = first_failure(&Scenario {
        unfenced_resource: true,
        ..Scenario::default()
    });
    assert!(failure.contains("fenced writes never go back"), "{failure}");
}

#[test]
fn the_checkers_catch_a_witness_that_takes_a_pause_for_a_death() {
    // The witness may release a grant only after a death it saw; releasing
    // a paused holder's grant hands the election over while the holder
    // still believes it leads.
    let failure = first_failing_run(&Scenario {
        witness_on_pause: true,
        ..Scenario::default()
    });
    let text = failure.to_string();
    assert!(
        text.contains("one leader at a time") || text.contains("fenced writes never go back"),
        "{text}"
    );
    assert!(text.contains("--witness-on-pause"), "{text}");
    // The same seeds, with a witness that acts on deaths alone, hold.
    for seed in 0..=failure.seed {
        if let Err(failure) = run(seed, &Scenario::default()) {
            panic!("{failure}");
        }
    }
}
