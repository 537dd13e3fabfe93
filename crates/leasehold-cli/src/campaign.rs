//! `leasehold campaign`: win, hold, resign — and say so in JSON lines.

use std::process::ExitCode;

use anyhow::Context;
use leasehold::Elector;

use crate::cli::CampaignArgs;
use crate::events::{Event, emit, monotonic_ns};
use crate::signals::StopSignals;

pub async fn run(args: CampaignArgs) -> anyhow::Result<ExitCode> {
    let store = args.election.store.open().await?;
    let candidate = args.election.candidate();
    let elector = Elector::new(store, candidate.clone(), args.election.lease_config())?;
    // SIGTERM, SIGINT, SIGHUP or SIGQUIT end the campaign or the hold early:
    // the election is resigned (not left to expire) and no round follows.
    let mut signals = StopSignals::install()?;
    let election = &args.election.election;
    let event = |event, token: Option<u64>, reason: Option<String>| Event {
        event,
        election: election.as_str(),
        id: candidate.as_str(),
        token,
        reason,
        monotonic_ns: monotonic_ns(),
    };
    for _ in 0..args.rounds {
        emit(&event("campaigning", None, None))?;
        let leadership = tokio::select! {
            outcome = elector.campaign(election) => {
                outcome.with_context(|| format!("campaign for {election} failed"))?
            }
            signal = signals.recv() => {
                tracing::info!(%signal, "stopping while waiting to lead");
                break;
            }
        };
        let token = Some(leadership.token().0);
        emit(&event("acquired", token, None))?;
        let stopped = tokio::select! {
            () = tokio::time::sleep(args.hold) => None,
            reason = leadership.lost() => {
                emit(&event("lost", token, Some(reason.to_string())))?;
                anyhow::bail!("lost {election} while holding it: {reason}");
            }
            signal = signals.recv() => Some(signal),
        };
        let reason = stopped.map(|signal| format!("{signal} received"));
        // The last moment this process acts as leader, before the release.
        // Released even if stdout is gone (a closed terminal): the election
        // must not wait for the TTL.
        let announced = emit(&event("releasing", token, reason.clone()));
        leadership
            .resign()
            .await
            .with_context(|| format!("resigning {election} failed"))?;
        // The release is done: the next candidate may be granted now.
        emit(&event("released", token, reason))?;
        announced?;
        if let Some(signal) = stopped {
            tracing::info!(%signal, "stopped; election released");
            break;
        }
    }
    elector.close().await?;
    Ok(ExitCode::SUCCESS)
}
