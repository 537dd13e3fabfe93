//! `leasehold transfer`: ask the leader to hand over, through the store.

use std::process::ExitCode;

use leasehold::line::request_transfer;

use crate::cli::TransferArgs;

/// The TTL of the session that carries the request: long enough that
/// renewals never matter during a transfer's timeout (the session is
/// closed at the end; if this process dies, the store expires it).
const REQUEST_TTL: std::time::Duration = std::time::Duration::from_secs(30);

pub async fn run(args: TransferArgs) -> anyhow::Result<ExitCode> {
    let layout = args.store.url()?.layout();
    if layout.is_foreign() {
        return Err(crate::cli::foreign_layout_refuses("transfer", layout).into());
    }
    // Nothing leads in a SQLite store that does not exist: say so, as
    // `status` does, rather than create one at a mistyped path.
    if matches!(args.store.url()?, leasehold::store::StoreUrl::Sqlite(_)) {
        args.store.open_read_only().await?;
    }
    let store = args.store.open().await?;
    let election = &args.election;
    let ttl = REQUEST_TTL.max(args.timeout);
    let ttl = ttl.min(leasehold::MAX_TTL);
    match request_transfer(&store, election, args.to.as_ref(), ttl, args.timeout).await {
        Ok(done) => {
            let now_leads = format!(
                "{election}: {} leads now (token {}); {} (token {}) led before",
                done.to.candidate, done.to.token, done.from.candidate, done.from.token
            );
            match &done.asked_for {
                Some(asked) if asked != &done.to.candidate => {
                    let still_waits = leasehold::line::line(&*store, election)
                        .await
                        .is_ok_and(|line| line.iter().any(|w| &w.candidate == asked));
                    let why = if still_waits {
                        format!(
                            "another move (a transfer or a preemption) won; {asked} still waits"
                        )
                    } else {
                        format!("{asked} left the line during the transfer")
                    };
                    crate::say(&format!("{now_leads}, not {asked}: {why}"));
                    Ok(ExitCode::FAILURE)
                }
                _ => {
                    crate::inspect::print_line(&now_leads)?;
                    Ok(ExitCode::SUCCESS)
                }
            }
        }
        // Refused (no leader, nobody waiting, not a waiting candidate):
        // nothing changed. Not a usage error: the same command may work
        // a moment later.
        Err(leasehold::Error::InvalidInput { reason, .. }) => {
            crate::say(&format!("cannot transfer: {reason}"));
            Ok(ExitCode::FAILURE)
        }
        Err(leasehold::Error::Timeout(after)) => {
            crate::say(&format!(
                "{election}: no new leader held within {}; the request stands until this command's session ends, and a handover the leader began goes on (the leader may run an older leasehold or be stopped, its command may take longer to stop, or the chosen replica may be stopped)",
                humantime::format_duration(after)
            ));
            Ok(ExitCode::FAILURE)
        }
        Err(error) => Err(error.into()),
    }
}
