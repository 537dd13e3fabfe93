//! `leasehold campaign`: win, hold, resign — and say so in JSON lines.

use std::process::ExitCode;

use anyhow::Context;
use leasehold::{Elector, Leadership};

use crate::cli::CampaignArgs;
use crate::events::{Event, emit, monotonic_ns};
use crate::signals::{AnySignal, Handled};

pub async fn run(args: CampaignArgs) -> anyhow::Result<ExitCode> {
    let store = args.election.open_store().await?;
    let candidate = args.election.candidate();
    // A group's name, or one of its shards or slots, belongs to its
    // members, as for `run`.
    crate::run::refuse_a_group(&*store, &args.election.election, true).await?;
    let elector = Elector::new(store, candidate.clone(), args.election.lease_config())?;
    // SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGPWR — and, as there is no
    // command to pass them to, the signals `run` passes to its command
    // (SIGUSR1, SIGUSR2, SIGALRM…) — end the campaign or the hold early: the
    // election is resigned (not left to expire) and no round follows. The
    // rest that would end the process (SIGABRT, SIGXCPU…) are logged and
    // ignored (see signals.rs).
    let mut signals = Handled::install()?;
    let election = &args.election.election;
    let say = Say {
        election: election.as_str(),
        id: candidate.as_str(),
    };
    for _ in 0..args.rounds {
        emit(&say.event("campaigning", None, None))?;
        let leadership = tokio::select! {
            outcome = elector.campaign(election) => match outcome {
                Ok(leadership) => leadership,
                Err(error) => {
                    // Out of the line and the session closed now, not at
                    // the TTL: a store that cannot tell that this process
                    // ended would keep it waiting in front of the others.
                    if let Err(closing) = elector.close().await {
                        tracing::debug!(error = %closing, "could not close the session");
                    }
                    return Err(anyhow::Error::new(error)
                        .context(format!("campaign for {election} failed")));
                }
            },
            signal = next_signal(&mut signals) => {
                tracing::info!(%signal, "stopping while waiting to lead");
                break;
            }
        };
        let token = Some(leadership.token().0);
        if let Err(error) = emit(&say.event("acquired", token, None)) {
            // Nobody can learn that this process leads (stdout is gone, as
            // in `campaign --hold 1m | head -1` once head has exited): let
            // the election go at once rather than at the TTL.
            let released = leadership.resign().await;
            elector.close().await?;
            released.with_context(|| format!("resigning {election} failed"))?;
            return Err(error);
        }
        if let Some(signal) = hold(&say, leadership, args.hold, &mut signals).await? {
            tracing::info!(%signal, "stopped; election released");
            break;
        }
    }
    elector.close().await?;
    Ok(ExitCode::SUCCESS)
}

/// Holds `leadership` for `hold` or until a signal comes, then releases
/// it, saying each step; the signal, if one ended the hold.
async fn hold(
    say: &Say<'_>,
    leadership: Leadership,
    hold: std::time::Duration,
    signals: &mut Handled,
) -> anyhow::Result<Option<AnySignal>> {
    let (election, token) = (say.election, Some(leadership.token().0));
    let stopped = tokio::select! {
        () = tokio::time::sleep(hold) => None,
        reason = leadership.lost() => {
            emit(&say.event("lost", token, Some(reason.to_string())))?;
            anyhow::bail!("lost {election} while holding it: {reason}");
        }
        signal = next_signal(signals) => Some(signal),
    };
    // The hold may end after the deadline (this process was stopped or
    // starved past it): then leadership is lost, not released.
    if let Some(reason) = leadership.lost_reason() {
        emit(&say.event("lost", token, Some(reason.to_string())))?;
        anyhow::bail!("lost {election} while holding it: {reason}");
    }
    let reason = stopped.map(|signal| format!("{signal} received"));
    // The last moment this process acts as leader, before the release.
    // Released even if stdout is gone (a closed terminal): the election
    // must not wait for the TTL.
    let announced = emit(&say.event("releasing", token, reason.clone()));
    leadership
        .resign()
        .await
        .with_context(|| format!("resigning {election} failed"))?;
    // The release is done: the next candidate may be granted now.
    emit(&say.event("released", token, reason))?;
    announced?;
    Ok(stopped)
}

/// What `campaign` says, as JSON lines, of one election and candidate.
struct Say<'a> {
    election: &'a str,
    id: &'a str,
}

impl Say<'_> {
    fn event(&self, event: &'static str, token: Option<u64>, reason: Option<String>) -> Event<'_> {
        Event {
            event,
            election: self.election,
            id: self.id,
            token,
            reason,
            monotonic_ns: monotonic_ns(),
        }
    }
}

/// The next signal that ends the campaign: a stop signal, or one `run`
/// would pass to its command (there is none here); ignored ones are
/// logged.
async fn next_signal(signals: &mut Handled) -> AnySignal {
    loop {
        tokio::select! {
            signal = signals.stop.recv() => return signal.into(),
            signal = signals.passed.recv() => return signal,
            signal = signals.ignored.recv() => tracing::info!(%signal, "signal ignored"),
        }
    }
}
