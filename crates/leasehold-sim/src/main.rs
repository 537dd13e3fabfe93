//! `leasehold-sim`: run seeds of the deterministic simulation.
//!
//! ```sh
//! cargo run --release -p leasehold-sim -- --seeds 100000          # a soak
//! cargo run -p leasehold-sim -- --seed 42                          # replay one
//! cargo run -p leasehold-sim -- --seeds 500 --unsafe-deadline      # the checkers are not blind
//! ```

use std::process::ExitCode;
use std::time::{Duration, Instant};

use leasehold_sim::{Scenario, run};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let mut scenario = Scenario::default();
    if args.iter().any(|a| a == "--unsafe-deadline") {
        scenario.unsafe_deadline = true;
    }
    if args.iter().any(|a| a == "--unfenced") {
        scenario.unfenced_resource = true;
    }
    if let Some(ms) = value("--store-clock-step-ms") {
        scenario.store_clock_step = Duration::from_millis(ms);
    }
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "usage: leasehold-sim [--seed S | --seeds N [--start S]] [--unsafe-deadline] [--unfenced] [--store-clock-step-ms MS] [--history] [--keep-going]"
        );
        return ExitCode::SUCCESS;
    }
    let (start, count) = match value("--seed") {
        Some(seed) => (seed, 1),
        None => (
            value("--start").unwrap_or(0),
            value("--seeds").unwrap_or(1000),
        ),
    };
    let keep_going = args.iter().any(|a| a == "--keep-going");
    let mut failed = 0u64;
    let began = Instant::now();
    let mut faults = 0;
    let mut terms = 0;
    let mut writes = 0;
    for seed in start..start + count {
        match run(seed, &scenario) {
            Ok(history) => {
                faults += history.faults;
                terms += history.terms.len();
                writes += history.writes.len();
            }
            Err(failure) if keep_going => {
                if failed == 0 {
                    eprintln!("{failure}");
                }
                failed += 1;
            }
            Err(failure) => {
                if args.iter().any(|a| a == "--history") {
                    for t in &failure.history.terms {
                        eprintln!("term {t:?}");
                    }
                    for w in &failure.history.writes {
                        eprintln!("write {w:?}");
                    }
                    eprintln!("grants {:?}", failure.history.grants);
                }
                eprintln!("{failure}");
                return ExitCode::FAILURE;
            }
        }
    }
    if failed > 0 {
        println!(
            "{failed} of {count} seeds broke an invariant ({start}..{})",
            start + count
        );
        return ExitCode::FAILURE;
    }
    println!(
        "{count} seeds passed ({start}..{}) in {:.1?}: {faults} faults injected, {terms} terms of leadership, {writes} fenced writes",
        start + count,
        began.elapsed()
    );
    ExitCode::SUCCESS
}
