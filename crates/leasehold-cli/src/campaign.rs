//! `leasehold campaign`: win, hold, resign — and say so in JSON lines.

use std::process::ExitCode;

use anyhow::Context;
use leasehold::Elector;

use crate::cli::CampaignArgs;
use crate::events::{Event, emit, monotonic_ns};

pub async fn run(args: CampaignArgs) -> anyhow::Result<ExitCode> {
    let store = args.election.store.open().await?;
    let candidate = args.election.candidate();
    let elector = Elector::new(store, candidate.clone(), args.election.lease_config())?;
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
        let leadership = elector
            .campaign(election)
            .await
            .with_context(|| format!("campaign for {election} failed"))?;
        let token = Some(leadership.token().0);
        emit(&event("acquired", token, None))?;
        tokio::select! {
            () = tokio::time::sleep(args.hold) => {}
            reason = leadership.lost() => {
                emit(&event("lost", token, Some(reason.to_string())))?;
                anyhow::bail!("lost {election} while holding it: {reason}");
            }
        }
        // The last moment this process acts as leader, before the release.
        emit(&event("releasing", token, None))?;
        leadership
            .resign()
            .await
            .with_context(|| format!("resigning {election} failed"))?;
        // The release is done: the next candidate may be granted now.
        emit(&event("released", token, None))?;
    }
    elector.close().await?;
    Ok(ExitCode::SUCCESS)
}
