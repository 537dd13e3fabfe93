//! Planned handovers asked from outside: [`request_transfer`] asks the
//! leader of an election to hand over, through a note in the store (see
//! [`crate::line`] for the notes), and waits until a new leader has taken
//! the election up.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::grant::{FencingToken, Leader, SessionId};
use crate::line::{Standby, TRANSFER, line, successor, taken_up, watch_ended};
use crate::names::{CandidateId, ElectionName};
use crate::store::{Note, Store};

/// What a transfer achieved ([`request_transfer`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transferred {
    /// The leader before.
    pub from: Leader,
    /// The leader after: a new grant, with a higher token.
    pub to: Leader,
    /// The standby the request named, when it named one; if it is not
    /// `to`'s candidate, that standby left the line during the transfer
    /// and another took over.
    pub asked_for: Option<CandidateId>,
}

/// Why `election` cannot be transferred when it is a group's name or one
/// of a group's shards or slots: those move by the group's own rules,
/// never by a request. `None` otherwise (also when the store cannot say).
async fn group_refusal(store: &dyn Store, election: &ElectionName) -> Option<String> {
    let kind = |notes: Vec<Note>| crate::group::kind_of(&notes);
    let how = |kind: crate::group::GroupKind| match kind {
        crate::group::GroupKind::Shards(_) => {
            "its shards move by the group's assignment, when a member joins or leaves"
        }
        crate::group::GroupKind::Slots(_) => {
            "a slot is freed when its holder stops, and goes to the next waiter"
        }
    };
    if let Some(kind) = store.notes(election).await.ok().and_then(kind) {
        return Some(format!(
            "{election} is a group of {kind}, not a single election: {}; nothing is handed over by transfer",
            how(kind)
        ));
    }
    let group = crate::group::group_of(election)?;
    let kind = store.notes(&group).await.ok().and_then(kind)?;
    Some(format!(
        "{election} belongs to {group}, a group of {kind}: {}; nothing is handed over by transfer",
        how(kind)
    ))
}

/// Asks the current leader of `election` to hand over — to the waiting
/// candidate `to`, or without `to` to the first in line — and waits up to
/// `timeout` for a new leader to hold.
///
/// The request is a note of a session opened for it (with `ttl`), so it
/// reaches the leader through the store and ends with this call. Fails
/// with [`Error::InvalidInput`], changing nothing, when nobody leads,
/// when `to` does not wait in line, when nobody waits, or when `election`
/// is a group's name or one of its shards or slots (those move by the
/// group's rules); with
/// [`Error::Timeout`] when no new leader took the election up within
/// `timeout`: a leader that does not honour requests (an older leasehold,
/// or one busy stopping its command for longer), or a chosen standby that
/// does not act on its grant (stopped, or killed before its session
/// expired) — on etcd and ZooKeeper the store then shows that standby
/// holding, until its session expires. Success means the new leader's
/// elector said, on the request's note, that it took its grant up.
pub async fn request_transfer(
    store: &Arc<dyn Store>,
    election: &ElectionName,
    to: Option<&CandidateId>,
    ttl: Duration,
    timeout: Duration,
) -> Result<Transferred> {
    if let Some(refusal) = group_refusal(&**store, election).await {
        return Err(Error::invalid("transfer", refusal));
    }
    let mut leaders = store.watch(election).await?;
    let Some(from) = leaders.borrow_and_update().clone() else {
        return Err(Error::invalid(
            "transfer",
            format!("{election} has no leader: there is nothing to hand over"),
        ));
    };
    let line = line(&**store, election).await?;
    let target = target_of(&line, &from, to, election)?;
    let target_session = target.parse::<u64>().ok().map(SessionId);
    let mut notes = store.watch_notes(election).await?;
    let session = store.open_session(ttl).await?;
    let outcome = async {
        store
            .put_note(
                session.id,
                election,
                TRANSFER,
                &format!("{} {target}", from.token.0),
            )
            .await?;
        let asked = Asked {
            after: from.token,
            named: target_session,
            request: session.id,
        };
        let waited = tokio::time::timeout(
            timeout,
            taken_over(&**store, election, &mut leaders, &mut notes, asked),
        )
        .await;
        match waited {
            Ok(leader) => leader,
            Err(_) => Err(Error::Timeout(timeout)),
        }
    }
    .await;
    if let Err(error) = store.close_session(session.id).await {
        tracing::debug!(%election, %error, "closing the transfer request's session failed; it expires");
    }
    Ok(Transferred {
        from,
        to: outcome?,
        asked_for: to.cloned(),
    })
}

/// Whom a request names in its note: the session of the standby `to`,
/// or `*` for the first in line; refused when `to` leads already or does
/// not wait, or when nobody but the leader waits.
fn target_of(
    line: &[Standby],
    from: &Leader,
    to: Option<&CandidateId>,
    election: &ElectionName,
) -> Result<String> {
    let refused = |reason: String| Err(Error::invalid("transfer", reason));
    match to {
        Some(to) if to == &from.candidate => refused(format!(
            "{} already leads {election}",
            crate::quoted(to.as_str())
        )),
        Some(to) => match line.iter().find(|w| &w.candidate == to) {
            Some(standby) => Ok(standby.session.0.to_string()),
            None => refused(format!(
                "{} is not waiting for {election}{}",
                crate::quoted(to.as_str()),
                waiting_list(line, from)
            )),
        },
        None if line.iter().all(|w| w.is_of(from)) => {
            refused(format!("nobody is waiting to take over {election}"))
        }
        None => Ok("*".to_owned()),
    }
}

/// The handover a transfer request waits for.
#[derive(Clone, Copy, Debug)]
struct Asked {
    /// The grant asked to hand over.
    after: FencingToken,
    /// The standby the request named, if it named one.
    named: Option<SessionId>,
    /// The session keeping the request's note.
    request: SessionId,
}

/// Waits for the grant that ends the handover `asked` for ([`successor`]),
/// and then for its leader to say on the request's note that it took that
/// grant up (`answers`). A grant the store made to a standby whose
/// process does not act on it (stopped, or killed before its session
/// expired) is never answered, and this waits on: for that grant to end
/// and the line to move on, or for the caller's timeout.
async fn taken_over(
    store: &dyn Store,
    election: &ElectionName,
    leaders: &mut crate::store::LeaderWatch,
    notes: &mut crate::store::NoteWatch,
    asked: Asked,
) -> Result<Leader> {
    loop {
        let leader = successor(store, election, leaders, notes, asked.after, asked.named).await?;
        loop {
            match taken_up(&notes.borrow_and_update(), asked.request) {
                Some(taken) if taken == leader.token => return Ok(leader),
                // A newer leader answered: find out who holds now.
                Some(taken) if taken > leader.token => break,
                _ => {}
            }
            tokio::select! {
                changed = leaders.changed() => {
                    changed.map_err(|_| watch_ended())?;
                    break;
                }
                changed = notes.changed() => changed.map_err(|_| watch_ended())?,
            }
        }
    }
}

fn waiting_list(line: &[Standby], leader: &Leader) -> String {
    let waiting: Vec<String> = line
        .iter()
        .filter(|w| !w.is_of(leader))
        .map(|w| crate::quoted(w.candidate.as_str()))
        .collect();
    if waiting.is_empty() {
        " (nobody is waiting)".to_owned()
    } else {
        format!(" (waiting: {})", waiting.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::waiting_list;
    use crate::grant::{FencingToken, Leader, SessionId};
    use crate::line::Standby;
    use crate::names::CandidateId;

    /// Ids that could pass for more of the list, or for another word of
    /// the message, are quoted (review 11: `(waiting: C, D)` was one id).
    #[test]
    fn the_waiting_list_quotes_each_id() {
        let id = |s: &str| CandidateId::new(s).expect("valid id");
        let standby = |name: &str, session: u64| Standby {
            candidate: id(name),
            priority: 0,
            session: SessionId(session),
            order: session,
            chosen_by: None,
        };
        let leader = Leader {
            candidate: id("a"),
            token: FencingToken(1),
            expires_in: Duration::ZERO,
            session: Some(SessionId(1)),
        };
        let line = [standby("a", 1), standby("C, D", 2), standby("a", 3)];
        assert_eq!(waiting_list(&line, &leader), r#" (waiting: "C, D", "a")"#);
    }
}
