//! `leasehold completions SHELL` and `leasehold man`: generated from the
//! same argument definitions as `--help`, so they cannot disagree with it.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::{Args, CompletionsArgs, ManArgs};

/// The binary's name, as completions and man pages call it.
const NAME: &str = "leasehold";

/// Prints the completion script for one shell.
pub fn completions(args: &CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut command = Args::command();
    // Generated into memory first: clap_complete panics on a write error,
    // and stdout may be a closed pipe.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, NAME, &mut script);
    write_stdout(&script)?;
    Ok(ExitCode::SUCCESS)
}

/// Prints leasehold(1), or writes it and a page per subcommand to `--dir`.
pub fn man(args: &ManArgs) -> anyhow::Result<ExitCode> {
    // As clap_mangen::generate_to does: `help` is not a page of its own.
    let command = Args::command().name(NAME).disable_help_subcommand(true);
    match &args.dir {
        Some(dir) => {
            // Named cut short: checked for length, but still as long as
            // the system takes.
            let shown = || leasehold::quoted(&dir.to_string_lossy());
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", shown()))?;
            clap_mangen::generate_to(command, dir)
                .with_context(|| format!("cannot write manual pages into {}", shown()))?;
        }
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(command).render(&mut page)?;
            write_stdout(&page)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `bytes` to stdout and flushes: a full disk or a closed pipe is
/// an error ("cannot write to stdout: …", exit 1), never a panic; so is a
/// stdout that was closed when leasehold started (it is /dev/null now).
pub(crate) fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    if crate::stdio::stdout_closed() {
        anyhow::bail!(crate::stdio::STDOUT_IS_CLOSED);
    }
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .context("cannot write to stdout")
}
