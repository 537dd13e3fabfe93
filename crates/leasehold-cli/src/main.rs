//! `leasehold`: run a command only while this replica holds an election.
//!
//! Exit codes: 0 success; 1 a runtime failure (store unreachable or
//! corrupt); 2 bad usage or input; 3 `tune --ttl` judged the TTL unsafe;
//! `run` passes on its command's status (128+N for signal N) and exits 127
//! when the command cannot be started.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

mod campaign;
mod capped;
mod child;
mod cli;
mod events;
mod generate;
mod guard;
mod http;
mod inspect;
mod logfields;
mod logwriter;
mod metrics;
mod run;
mod shards;
mod sidecar;
mod signals;
mod stdio;
mod stopping;
mod term;
mod transfer;
mod tune;
mod watch;

/// Bad usage or input. (3, an unsafe `tune --ttl`, is `tune::EXIT_UNSAFE`.)
const EXIT_USAGE: u8 = 2;
/// A runtime failure.
const EXIT_FAILURE: u8 = 1;

fn main() -> ExitCode {
    // First of all, before any file is opened (see stdio.rs).
    if let Err(line) = stdio::reopen_closed_standard_fds() {
        say(&line);
        return ExitCode::from(EXIT_FAILURE);
    }
    // `run`'s guard process (see guard.rs): internal, so not a subcommand
    // that help, completions or man pages would show. `run` starts it with
    // no other argument; in any other shape it was started by hand.
    if std::env::args_os().nth(1).is_some_and(|a| a == guard::ARG) {
        return if std::env::args_os().len() == 2 {
            guard::main()
        } else {
            guard::by_hand()
        };
    }
    let parsed = cli::Args::command()
        .try_get_matches()
        .and_then(|matches| cli::Args::from_arg_matches(&matches).map(|a| (a, matches)));
    let args = match parsed {
        Ok((mut args, matches)) => {
            if let Err(error) = args.leave_the_outer_term(&matches) {
                say(&one_line(&anyhow::Error::new(error)));
                return ExitCode::from(EXIT_USAGE);
            }
            args
        }
        Err(error) => {
            // Logging is not set up yet; a JSON log reader still gets the
            // reason as a JSON line if the format was asked for.
            if json_requested() {
                init_logging(0, false, cli::LogFormat::Json);
            }
            let code = usage_error(&error);
            // The JSON logger writes through the stderr thread.
            logwriter::flush(LAST_LINES);
            return code;
        }
    };
    init_logging(args.verbose, args.quiet, args.log_format);
    let code = match run(args) {
        Ok(code) => code,
        Err(error) => {
            let usage = error
                .downcast_ref::<leasehold::Error>()
                .is_some_and(|e| matches!(e, leasehold::Error::InvalidInput { .. }));
            say(&one_line(&error));
            ExitCode::from(if usage { EXIT_USAGE } else { EXIT_FAILURE })
        }
    };
    // The last lines (say, "election released") out before exiting, unless
    // stderr does not take them.
    logwriter::flush(LAST_LINES);
    code
}

/// How long an exiting process waits for its last log lines to be written.
pub const LAST_LINES: std::time::Duration = std::time::Duration::from_secs(1);

/// `error` as one line: the contexts, then the library's error, whose
/// message already names its cause — its sources would only repeat it (or
/// show a client library's internals). A message already said is not
/// repeated.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        if cause.is::<leasehold::Error>() {
            break;
        }
    }
    line
}

/// Whether `--log-format json` (or `LEASEHOLD_LOG_FORMAT=json`) was asked
/// for, judged from the raw arguments when they do not parse.
fn json_requested() -> bool {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let given = args
        .windows(2)
        .any(|w| w[0] == "--log-format" && w[1] == "json")
        || args.iter().any(|a| a == "--log-format=json");
    given || std::env::var_os("LEASEHOLD_LOG_FORMAT").is_some_and(|v| v == "json")
}

/// `leasehold: {line}` on stderr, its control characters escaped so that
/// it stays one line (a path or a server's message may hold any); under
/// `--log-format json`, an error event instead, so that a log collector
/// reading JSON lines sees it too. A closed or full stderr loses the line
/// but never panics (as `eprintln!` would).
pub fn say(line: &str) {
    if LOG_SETTINGS.get().is_some_and(|s| s.ends_with(" json")) {
        tracing::error!("{line}");
        return;
    }
    let mut shown = String::with_capacity(line.len());
    for c in line.chars() {
        if c.is_control() {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    logwriter::write(format!("leasehold: {shown}\n").as_bytes());
}

fn run(args: cli::Args) -> anyhow::Result<ExitCode> {
    // Before any store is opened or command started.
    args.validate()?;
    // A command whose output is the point fails before it does anything.
    // `run` and `campaign` (whose JSON lines are a trace of what it does)
    // work without a stdout.
    let prints = match &args.command {
        cli::Command::Run(_) | cli::Command::Campaign(_) | cli::Command::Sidecar(_) => false,
        cli::Command::Man(man) => man.dir.is_none(),
        _ => true,
    };
    if prints && stdio::stdout_closed() {
        anyhow::bail!(stdio::STDOUT_IS_CLOSED);
    }
    // One thread runs every task: the command is forked from this thread,
    // and PR_SET_PDEATHSIG fires when the *thread* that forked exits, so it
    // must be the one that lives as long as the process.
    //
    // Few blocking threads: the SQLite store's work queues for its one
    // connection anyway, and every thread's stack is more for each fork of
    // a guard to copy (with hundreds of them, `run --shards` spent its
    // time forking and starved its own renewals).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(16)
        .build()?;
    runtime.block_on(async move {
        match args.command {
            cli::Command::Run(cmd) => run::run(cmd).await,
            cli::Command::Status(cmd) => inspect::status(cmd).await,
            cli::Command::Observe(cmd) => inspect::observe(cmd).await,
            cli::Command::List(cmd) => inspect::list(cmd).await,
            cli::Command::Campaign(cmd) => campaign::run(cmd).await,
            cli::Command::Sidecar(cmd) => sidecar::run(cmd).await,
            cli::Command::Tune(cmd) => tune::run(cmd).await,
            cli::Command::Transfer(cmd) => transfer::run(cmd).await,
            cli::Command::Completions(cmd) => generate::completions(&cmd),
            cli::Command::Man(cmd) => generate::man(&cmd),
        }
    })
}

/// Prints help and version as clap does; any other parse error as one line
/// naming the problem, exit 2.
fn usage_error(error: &clap::Error) -> ExitCode {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        // Help lost on a full disk, a closed pipe or a closed stdout is a
        // failure, not a success.
        if stdio::stdout_closed() && !error.use_stderr() {
            say(stdio::STDOUT_IS_CLOSED);
            return ExitCode::from(EXIT_FAILURE);
        }
        if let Err(write_error) = error.print() {
            say(&format!("cannot write to stdout: {write_error}"));
            return ExitCode::from(EXIT_FAILURE);
        }
        return if error.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
            ExitCode::from(EXIT_USAGE)
        } else {
            ExitCode::SUCCESS
        };
    }
    // After global flags (`leasehold -q __guard`).
    if error.kind() == ErrorKind::InvalidSubcommand
        && matches!(error.get(ContextKind::InvalidSubcommand),
            Some(ContextValue::String(name)) if name == guard::ARG)
    {
        return guard::by_hand();
    }
    // clap's message is the first line plus indented details (such as the
    // missing arguments); fold them into one line, without the usage block.
    let rendered = error.render().to_string();
    let mut lines = rendered.lines();
    let first = lines.next().unwrap_or("invalid arguments");
    let mut message = first.strip_prefix("error: ").unwrap_or(first).to_owned();
    for detail in lines.take_while(|l| !l.trim().is_empty()) {
        message.push(' ');
        message.push_str(detail.trim());
    }
    message = shorten_values(error, message);
    if message.contains("<CMD>") {
        message =
            "no command to run: give it after --, as in: leasehold run --election E -- CMD [ARGS…]"
                .into();
    }
    if error.kind() == ErrorKind::InvalidUtf8 && !message.contains("--store") {
        message = cli::invalid_utf8_culprit();
    }
    say(&format!("{message} (see --help)"));
    ExitCode::from(EXIT_USAGE)
}

/// `message` with each long value clap quotes in it (an argument or a
/// value given) cut short ([`leasehold::quoted`]): a 100 KB value is not
/// repeated whole. Why the value is refused follows it, with its length
/// and the limit when that is what is wrong.
fn shorten_values(error: &clap::Error, mut message: String) -> String {
    use clap::error::ContextValue;
    for (_, value) in error.context() {
        let values = match value {
            ContextValue::String(value) => std::slice::from_ref(value),
            ContextValue::Strings(values) => values.as_slice(),
            _ => continue,
        };
        for value in values {
            if value.chars().nth(leasehold::QUOTED_CHARS).is_some() {
                let shown = leasehold::quoted(value);
                message = message
                    .replace(&format!("'{value}'"), &shown)
                    .replace(value, &shown);
            }
        }
    }
    message
}

/// `run`'s log settings, handed to its guard process (`guard::LOG_ENV`).
static LOG_SETTINGS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The log settings in effect, as [`init_logging_from`] reads them.
pub fn log_settings() -> String {
    LOG_SETTINGS.get().cloned().unwrap_or_default()
}

/// Sets up logging as [`log_settings`] described it (the guard's; anything
/// unreadable means the defaults).
pub fn init_logging_from(settings: &str) {
    let mut words = settings.split(' ');
    let verbose = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let quiet = words.next() == Some("quiet");
    let format = match words.next() {
        Some("json") => cli::LogFormat::Json,
        _ => cli::LogFormat::Text,
    };
    init_logging(verbose, quiet, format);
}

fn init_logging(verbose: u8, quiet: bool, format: cli::LogFormat) {
    use tracing_subscriber::EnvFilter;
    let shown = match format {
        cli::LogFormat::Json => "json",
        cli::LogFormat::Text => "text",
    };
    logwriter::start();
    let _ = LOG_SETTINGS.set(format!(
        "{verbose} {} {shown}",
        if quiet { "quiet" } else { "loud" }
    ));
    let default = match (quiet, verbose) {
        (true, _) => "error",
        // The ZooKeeper client logs every (re)connection at info.
        (false, 0) => "info,zookeeper_client=warn",
        (false, 1) => "debug",
        (false, _) => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // A log line that cannot be written (stderr closed, disk full) is
    // dropped: never a panic, never a reason to stop supervising.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .log_internal_errors(false)
        .with_writer(|| QuietStderr);
    match format {
        cli::LogFormat::Text => builder
            .fmt_fields(logfields::TextFields)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        cli::LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// stderr for log lines: a failed write is dropped, so that the logger
/// can never fail (tracing-subscriber would report it with `eprintln!`,
/// which panics on a closed stderr).
struct QuietStderr;

impl std::io::Write for QuietStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        logwriter::write(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
