//! `leasehold`: run a command only while this replica holds an election.
//!
//! Exit codes: 0 success; 1 a runtime failure (store unreachable or
//! corrupt, leadership lost); 2 bad usage or input.

use std::process::ExitCode;

use clap::Parser;

mod campaign;
mod cli;
mod events;

/// Bad usage or input.
const EXIT_USAGE: u8 = 2;
/// A runtime failure.
const EXIT_FAILURE: u8 = 1;

fn main() -> ExitCode {
    let args = cli::Args::parse();
    init_logging(args.verbose, args.quiet);
    match run(args) {
        Ok(code) => code,
        Err(error) => {
            let usage = error
                .downcast_ref::<leasehold::Error>()
                .is_some_and(|e| matches!(e, leasehold::Error::InvalidInput { .. }));
            eprintln!("leasehold: {error:#}");
            ExitCode::from(if usage { EXIT_USAGE } else { EXIT_FAILURE })
        }
    }
}

fn run(args: cli::Args) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match args.command {
            cli::Command::Campaign(cmd) => campaign::run(cmd).await,
        }
    })
}

fn init_logging(verbose: u8, quiet: bool) {
    use tracing_subscriber::EnvFilter;
    let default = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        (false, _) => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
