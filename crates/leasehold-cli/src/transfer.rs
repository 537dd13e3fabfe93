//! `leasehold transfer`: ask the leader to hand over, through the store.

use std::process::ExitCode;
use std::time::Duration;

use leasehold::admin::request_transfer;
use leasehold::{CandidateId, ElectionName, Leader};

use crate::cli::TransferArgs;
use crate::logfields::shown;

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
    // The leader before, to tell after a timeout whether a grant was made.
    let before = store.leader(election).await.ok().flatten();
    match request_transfer(&store, election, args.to.as_ref(), ttl, args.timeout).await {
        Ok(done) => done_says(&*store, election, &done).await,
        // Refused (no leader, nobody waiting, not a waiting candidate):
        // nothing changed. Not a usage error: the same command may work
        // a moment later.
        Err(leasehold::Error::InvalidInput { reason, .. }) => {
            crate::say(&format!("cannot transfer: {reason}"));
            Ok(ExitCode::FAILURE)
        }
        Err(leasehold::Error::Timeout(after)) => {
            let now = store.leader(election).await.ok().flatten();
            let old = match &before {
                Some(before) => waits_in_line(&*store, election, &before.candidate).await,
                None => OldLeader::Unknown,
            };
            crate::say(&timed_out(
                election,
                before.as_ref(),
                now.as_ref(),
                old,
                after,
            ));
            Ok(ExitCode::FAILURE)
        }
        Err(error) => Err(error.into()),
    }
}

/// What `transfer` says of a transfer that was taken up: who leads now,
/// and why that is not the candidate asked for, if it is not.
async fn done_says(
    store: &dyn leasehold::store::Store,
    election: &leasehold::ElectionName,
    done: &leasehold::admin::Transferred,
) -> anyhow::Result<ExitCode> {
    let now_leads = format!(
        "{election}: {} leads now (token {}); {} (token {}) led before",
        shown(done.to.candidate.as_str()),
        done.to.token,
        shown(done.from.candidate.as_str()),
        done.from.token
    );
    match &done.asked_for {
        Some(asked) if asked != &done.to.candidate => {
            let still_waits = leasehold::admin::line(store, election)
                .await
                .is_ok_and(|line| line.iter().any(|w| &w.candidate == asked));
            let why = if still_waits {
                format!("another move (a transfer or a preemption) won; {asked} still waits")
            } else {
                format!(
                    "{asked} left the line during the transfer (it stopped waiting, or its \
                     session ended: a replica stopped or gone)"
                )
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

/// Where the leader from before a transfer that timed out is, as the
/// line read after the timeout shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OldLeader {
    /// It waits in the line again.
    Waits,
    /// It is not in the line: its `run` exited (say, on SIGTERM during the
    /// transfer) or has not rejoined (stopped before it could).
    Gone,
    /// The line could not be read.
    Unknown,
}

/// Whether `candidate` waits in the line of `election` now.
async fn waits_in_line(
    store: &dyn leasehold::store::Store,
    election: &ElectionName,
    candidate: &CandidateId,
) -> OldLeader {
    match leasehold::admin::line(store, election).await {
        Ok(line) if line.iter().any(|w| &w.candidate == candidate) => OldLeader::Waits,
        Ok(_) => OldLeader::Gone,
        Err(_) => OldLeader::Unknown,
    }
}

impl OldLeader {
    /// What it says of `candidate`, the leader before.
    fn says(self, candidate: &CandidateId) -> String {
        match self {
            OldLeader::Waits => format!("{candidate} went back into the line"),
            OldLeader::Gone => {
                format!(
                    "{candidate} is not in the line: its replica has exited or has not rejoined"
                )
            }
            OldLeader::Unknown => {
                format!("the line could not be read to tell whether {candidate} went back into it")
            }
        }
    }
}

/// What `transfer` says when no new leader took the election up within
/// `after`, from the leaders the store showed before and after, and where
/// the leader from before is (`old`).
fn timed_out(
    election: &ElectionName,
    before: Option<&Leader>,
    now: Option<&Leader>,
    old: OldLeader,
    after: Duration,
) -> String {
    let after = humantime::format_duration(after);
    let next = "then the next in line takes over";
    match (before, now) {
        (Some(before), Some(now)) if now.token > before.token => format!(
            "{election}: {} was granted the election (token {}) but did not take it up within {after}: \
             its replica is likely stopped, killed or cut off from the store; until it takes it up \
             nothing runs, and the store shows it leading until its session expires (up to its TTL), \
             {next} ({})",
            now.candidate,
            now.token,
            old.says(&before.candidate)
        ),
        (Some(before), None) => format!(
            "{election}: {} let go of the election, but no replica took it up within {after}: the \
             chosen replica is likely stopped or killed; nobody leads until its session expires (up to \
             its TTL), {next} ({})",
            before.candidate,
            old.says(&before.candidate)
        ),
        _ => format!(
            "{election}: no new leader held within {after}; the request was withdrawn, but a \
             handover the leader began goes on (the leader may run an older leasehold or be stopped, \
             its command may take longer to stop, or the chosen replica may be stopped)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(id: &str, token: u64) -> Leader {
        Leader {
            session: None,
            candidate: leasehold::CandidateId::new(id).expect("valid id"),
            token: leasehold::FencingToken(token),
            expires_in: Duration::from_secs(30),
        }
    }

    #[test]
    fn a_timeout_says_whether_a_grant_was_made_and_not_taken_up() {
        let election = ElectionName::new("jobs").expect("valid name");
        let (a, b) = (leader("a", 4), leader("b", 5));
        let second = Duration::from_secs(2);
        let granted = timed_out(&election, Some(&a), Some(&b), OldLeader::Waits, second);
        assert!(
            granted.starts_with(
                "jobs: b was granted the election (token 5) but did not take it up within 2s"
            ),
            "{granted}"
        );
        assert!(
            granted.ends_with("(a went back into the line)"),
            "{granted}"
        );
        let released = timed_out(&election, Some(&a), None, OldLeader::Waits, second);
        assert!(
            released.contains("a let go of the election, but no replica took it up"),
            "{released}"
        );
        assert!(
            released.ends_with("(a went back into the line)"),
            "{released}"
        );
        for unchanged in [
            timed_out(&election, Some(&a), Some(&a), OldLeader::Waits, second),
            timed_out(&election, None, Some(&b), OldLeader::Unknown, second),
        ] {
            assert!(
                unchanged.contains("no new leader held within 2s"),
                "{unchanged}"
            );
        }
    }

    /// The old leader is said to be back in the line only when the line
    /// read after the timeout shows it: its `run` may have ended meanwhile
    /// (a SIGTERM during the transfer).
    #[test]
    fn a_timeout_says_where_the_old_leader_is_as_the_line_shows() {
        let election = ElectionName::new("jobs").expect("valid name");
        let (a, b) = (leader("a", 4), leader("b", 5));
        let second = Duration::from_secs(2);
        for now in [Some(&b), None] {
            let gone = timed_out(&election, Some(&a), now, OldLeader::Gone, second);
            assert!(
                gone.ends_with(
                    "(a is not in the line: its replica has exited or has not rejoined)"
                ),
                "{gone}"
            );
            assert!(!gone.contains("went back"), "{gone}");
            let unknown = timed_out(&election, Some(&a), now, OldLeader::Unknown, second);
            assert!(
                unknown
                    .ends_with("(the line could not be read to tell whether a went back into it)"),
                "{unknown}"
            );
        }
    }
}
