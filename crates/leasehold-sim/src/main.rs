//! `leasehold-sim`: run seeds of the deterministic simulation.
//!
//! ```sh
//! cargo run --release -p leasehold-sim -- --seeds 100000          # a soak
//! cargo run -p leasehold-sim -- --seed 42                          # replay one
//! cargo run -p leasehold-sim -- --seeds 500 --unsafe-deadline      # the checkers are not blind
//! cargo run -p leasehold-sim -- --seeds 100 --shards 8             # a group of 8 shards
//! ```

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use leasehold_sim::history::History;
use leasehold_sim::{Scenario, run};

/// Runs seeds of the deterministic fault simulation of the leasehold
/// elector and checks every invariant; a failure prints its seed and the
/// command that replays it.
///
/// Exit codes: 0 every seed held every invariant; 1 a seed broke one; 2 bad
/// usage.
#[derive(Debug, Parser)]
#[command(name = "leasehold-sim", version)]
struct Args {
    /// Replay this one seed.
    #[arg(long, value_name = "S", conflicts_with_all = ["seeds", "start"])]
    seed: Option<u64>,
    /// How many seeds to run, from --start.
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    seeds: u64,
    /// The first seed of --seeds.
    #[arg(long, value_name = "S", default_value_t = 0)]
    start: u64,
    /// Test the checkers: compute the holder's deadline from the reply,
    /// without margins (breaks "one leader at a time").
    #[arg(long)]
    unsafe_deadline: bool,
    /// Test the checkers: the resource accepts every write (no fencing).
    #[arg(long)]
    unfenced: bool,
    /// Test the checkers: the host's witness also releases the grant of a
    /// paused candidate, as if a stop were a death (breaks "one leader at a
    /// time").
    #[arg(long)]
    witness_on_pause: bool,
    /// Simulate a sharded group instead of one election: each candidate
    /// joins one group of N shards (1 to 65536) and works on the shards it
    /// is granted; every shard is checked as an election of its own, and
    /// the group must settle evenly over the live members once the faults
    /// end and after each later crash or return of a member.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65_536))]
    shards: Option<u32>,
    /// Candidate 1 campaigns under candidate 0's id, as two replicas given
    /// one id would; every invariant must still hold.
    #[arg(long)]
    twin_ids: bool,
    /// Largest forward step of the store's clock, in milliseconds; beyond
    /// the 100 ms skew bound safety is not promised. [default: 100]
    #[arg(long, value_name = "MS")]
    store_clock_step_ms: Option<u64>,
    /// On a failure, print the run's terms, writes and grants.
    #[arg(long)]
    history: bool,
    /// Run every seed even after one fails; report how many failed.
    #[arg(long)]
    keep_going: bool,
}

/// A failed run's terms, writes, grants and windows, on stderr.
fn print_history(history: &History) {
    for t in &history.terms {
        eprintln!("term {t:?}");
    }
    for w in &history.writes {
        eprintln!("write {w:?}");
    }
    eprintln!("grants {:?}", history.grants);
    for w in &history.windows {
        eprintln!("window {w:?}");
    }
}

/// The scenario the flags ask for.
fn scenario_of(args: &Args) -> Scenario {
    let mut scenario = Scenario {
        unsafe_deadline: args.unsafe_deadline,
        unfenced_resource: args.unfenced,
        witness_on_pause: args.witness_on_pause,
        shards: args.shards,
        twin_ids: args.twin_ids,
        ..Scenario::default()
    };
    if let Some(ms) = args.store_clock_step_ms {
        scenario.store_clock_step = Duration::from_millis(ms);
    }
    scenario
}

fn main() -> ExitCode {
    // Bad usage exits 2 with clap's message; --help and --version exit 0.
    let args = Args::parse();
    let scenario = scenario_of(&args);
    let (start, count) = match args.seed {
        Some(seed) => (seed, 1),
        None => (args.start, args.seeds),
    };
    let Some(end) = start.checked_add(count) else {
        eprintln!(
            "leasehold-sim: --start {start} plus --seeds {count} is past the last seed {}",
            u64::MAX
        );
        return ExitCode::from(2);
    };
    let keep_going = args.keep_going;
    let mut failed = 0u64;
    let began = Instant::now();
    let mut totals = Totals::default();
    for seed in start..end {
        match run(seed, &scenario) {
            Ok(history) => totals.add(&history),
            Err(failure) if keep_going => {
                if failed == 0 {
                    eprintln!("{failure}");
                }
                failed += 1;
            }
            Err(failure) => {
                if args.history {
                    print_history(&failure.history);
                }
                eprintln!("{failure}");
                return ExitCode::FAILURE;
            }
        }
    }
    if failed > 0 {
        println!("{failed} of {count} seeds broke an invariant ({start}..{end})");
        return ExitCode::FAILURE;
    }
    println!(
        "{count} seeds passed ({start}..{end}) in {:.1?}: {}",
        began.elapsed(),
        totals.summary(scenario.shards)
    );
    ExitCode::SUCCESS
}

/// What the passing seeds did, in all.
#[derive(Default)]
struct Totals {
    faults: usize,
    terms: usize,
    writes: usize,
    released: usize,
    stops: usize,
    rests: usize,
}

impl Totals {
    /// What they did, in words; with the shards per run of a group.
    fn summary(&self, shards: Option<u32>) -> String {
        let Totals {
            faults,
            terms,
            writes,
            released,
            stops,
            rests,
        } = self;
        let group = match shards {
            Some(shards) => format!(
                " ({shards} shards per run; {stops} graceful stops, {rests} shards given back for a rest)"
            ),
            None => String::new(),
        };
        format!(
            "{faults} faults injected, {released} grants released by a witness, {terms} terms of leadership, {writes} fenced writes{group}"
        )
    }

    fn add(&mut self, history: &History) {
        self.faults += history.faults;
        self.terms += history.terms.len();
        self.writes += history.writes.len();
        self.released += history.witness_releases;
        self.stops += history.graceful_stops;
        self.rests += history.rests;
    }
}
