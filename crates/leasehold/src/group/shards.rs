//! [`Shards`]: a member of a group of `n` shards, owning its share.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{GroupKind, LeaderWatches, Member, assign, join, members};
use crate::clock::Instant;
use crate::elector::{Elector, Leadership};
use crate::error::{Error, Result};
use crate::names::{CandidateId, ElectionName};
use crate::session::Session;
use crate::store::{FencingToken, Leader, NoteWatch};
use crate::watch;

/// Pause before a shard's campaign is tried again after it failed.
const RETRY: Duration = Duration::from_secs(1);

/// What a member of a group sees of it ([`Shards::view`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupView {
    /// The members, in the order they joined.
    pub members: Vec<Member>,
    /// Each shard's holder, as the store last showed it.
    pub holders: Vec<Option<Leader>>,
    /// The shards this member owns now (handed out and not yet returned).
    pub mine: Vec<u32>,
}

impl GroupView {
    /// How many shards each member holds, in the order of
    /// [`GroupView::members`].
    pub fn loads(&self) -> Vec<usize> {
        self.members
            .iter()
            .map(|m| {
                self.holders
                    .iter()
                    .flatten()
                    .filter(|h| h.candidate == m.candidate)
                    .count()
            })
            .collect()
    }
}

/// This process's membership of a group of shards
/// ([`Shards::join`]). It campaigns for the shards the assignment
/// ([`assign`]) gives it and hands each one out as a [`Shard`] once
/// granted ([`Shards::next`]); a shard that the assignment moves away is
/// revoked ([`Shard::revoked`]) and campaigned for by its new owner
/// once released. Dropping it stops campaigning; the shards handed out
/// stay held until they are dropped or resigned, and the membership ends
/// with the session ([`Elector::close`]).
#[derive(Debug)]
pub struct Shards {
    group: ElectionName,
    count: u32,
    gained: mpsc::UnboundedReceiver<Result<Shard>>,
    view: watch::Receiver<GroupView>,
    coordinator: Option<tokio::task::JoinHandle<()>>,
    _stop: DropGuard,
}

/// One shard this process owns: its grant, and a signal that it must be
/// given up because the assignment moved it to another member.
#[derive(Debug)]
pub struct Shard {
    index: u32,
    count: u32,
    leadership: Option<Leadership>,
    revoked: watch::Receiver<bool>,
    returned: mpsc::UnboundedSender<Returned>,
    rest: Duration,
}

/// A shard given back to the coordinator.
#[derive(Debug)]
struct Returned {
    index: u32,
    token: FencingToken,
    rest: Duration,
}

impl Shard {
    /// The shard's number, from 0.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// How many shards the group has.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The shard's grant: its own token, deadline and loss signal.
    pub fn leadership(&self) -> &Leadership {
        self.leadership
            .as_ref()
            .unwrap_or_else(|| unreachable!("taken only by resign, which consumes the shard"))
    }

    /// The shard's fencing token.
    pub fn token(&self) -> FencingToken {
        self.leadership().token()
    }

    /// Resolves when the assignment moved this shard to another member:
    /// stop its work, then [`Shard::resign`] it (the new owner waits for
    /// that release). Never resolves while the shard stays assigned here.
    pub async fn revoked(&self) {
        let mut revoked = self.revoked.clone();
        if revoked.wait_for(|r| *r).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether the assignment moved this shard away.
    pub fn is_revoked(&self) -> bool {
        *self.revoked.borrow()
    }

    /// Releases the shard. If it is still assigned here, this member
    /// campaigns for it again after `rest` (a runner's restart delay);
    /// meanwhile it stays unowned.
    pub async fn release_for(mut self, rest: Duration) -> Result<()> {
        self.rest = rest;
        self.resign().await
    }

    /// Releases the shard (guarded by its token); if it is still assigned
    /// here, this member campaigns for it again at once.
    pub async fn resign(mut self) -> Result<()> {
        match self.leadership.take() {
            Some(leadership) => {
                let token = leadership.token();
                let outcome = leadership.resign().await;
                let _ = self.returned.send(Returned {
                    index: self.index,
                    token,
                    rest: self.rest,
                });
                outcome
            }
            None => Ok(()),
        }
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        // Dropping the leadership releases it in the background.
        if let Some(leadership) = self.leadership.take() {
            let _ = self.returned.send(Returned {
                index: self.index,
                token: leadership.token(),
                rest: self.rest,
            });
        }
    }
}

impl Shards {
    /// Joins `group` as a member of a group of `count` shards, and starts
    /// campaigning for this member's share. Fails with
    /// [`Error::InvalidInput`] for a count of 0 or above
    /// [`super::MAX_SHARDS`], and with [`Error::Conflict`] when the group
    /// already has members that asked for another count (or for slots).
    pub async fn join(elector: Arc<Elector>, group: ElectionName, count: u32) -> Result<Shards> {
        let kind = GroupKind::Shards(count);
        kind.check(&group)?;
        let store = Arc::clone(elector.store());
        let session = elector.session().await?;
        join(&*store, session.id(), &group, kind, elector.candidate()).await?;
        let notes = store.watch_notes(&group).await?;
        let elections = (0..count)
            .map(|k| kind.election(&group, k))
            .collect::<Result<Vec<_>>>()?;
        let holders = LeaderWatches::open(&store, &elections).await?;
        let (gained_tx, gained) = mpsc::unbounded_channel();
        let (returned_tx, returned_rx) = mpsc::unbounded_channel();
        let (granted_tx, granted_rx) = mpsc::unbounded_channel();
        let (view_tx, view) = watch::channel(GroupView::default());
        let stop = CancellationToken::new();
        let coordinator = Coordinator {
            me: elector.candidate().clone(),
            elector,
            group: group.clone(),
            kind,
            elections,
            session,
            notes,
            holders,
            states: (0..count).map(|_| State::Idle).collect(),
            gained: gained_tx,
            returned_tx,
            returned: returned_rx,
            granted_tx,
            granted: granted_rx,
            view: view_tx,
            stop: stop.clone(),
        };
        let coordinator = tokio::spawn(coordinator.run());
        Ok(Shards {
            group,
            count,
            gained,
            view,
            coordinator: Some(coordinator),
            _stop: stop.drop_guard(),
        })
    }

    /// The group's name.
    pub fn group(&self) -> &ElectionName {
        &self.group
    }

    /// How many shards the group has.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The next shard granted to this member; an error when the
    /// membership cannot go on (another member fixed another count, the
    /// store refuses this client). Waits while nothing is granted.
    pub async fn next(&mut self) -> Result<Shard> {
        match self.gained.recv().await {
            Some(outcome) => outcome,
            None => Err(Error::Unavailable {
                reason: format!("the membership of {} ended", self.group),
                source: None,
            }),
        }
    }

    /// Stops campaigning and returns once this member no longer asks for
    /// anything; the shards handed out stay held until dropped or
    /// resigned. Close the elector ([`Elector::close`]) afterwards to
    /// leave the group at once (else it ends with the session).
    pub async fn leave(mut self) {
        if let Some(coordinator) = self.coordinator.take() {
            coordinator.abort();
            let _ = coordinator.await;
        }
    }

    /// The group as this member sees it, kept up to date.
    pub fn view(&self) -> watch::Receiver<GroupView> {
        self.view.clone()
    }
}

/// Where this member is with one shard.
#[derive(Debug)]
enum State {
    /// Neither held nor asked for.
    Idle,
    /// A campaign runs.
    Campaigning(AbortHandle),
    /// Handed out; the sender revokes it.
    Held {
        token: FencingToken,
        revoke: watch::Sender<bool>,
    },
    /// Given back with a rest: not asked for again before then.
    Resting(Instant),
}

struct Coordinator {
    elector: Arc<Elector>,
    me: CandidateId,
    group: ElectionName,
    kind: GroupKind,
    elections: Vec<ElectionName>,
    session: Arc<Session>,
    notes: NoteWatch,
    holders: LeaderWatches,
    states: Vec<State>,
    gained: mpsc::UnboundedSender<Result<Shard>>,
    returned_tx: mpsc::UnboundedSender<Returned>,
    returned: mpsc::UnboundedReceiver<Returned>,
    granted_tx: mpsc::UnboundedSender<(u32, Result<Leadership>)>,
    granted: mpsc::UnboundedReceiver<(u32, Result<Leadership>)>,
    view: watch::Sender<GroupView>,
    stop: CancellationToken,
}

impl Coordinator {
    async fn run(mut self) {
        let clock = Arc::clone(self.elector.clock());
        loop {
            if let Err(error) = self.step() {
                let _ = self.gained.send(Err(error));
                break;
            }
            let wake = self
                .states
                .iter()
                .filter_map(|s| match s {
                    State::Resting(until) => Some(*until),
                    _ => None,
                })
                .min();
            let session = Arc::clone(&self.session);
            tokio::select! {
                biased;
                () = self.stop.cancelled() => break,
                () = self.gained.closed() => break,
                changed = self.notes.changed() => if changed.is_err() { break },
                _ = self.holders.changed() => {}
                Some((index, outcome)) = self.granted.recv() => self.granted(index, outcome),
                Some(returned) = self.returned.recv() => self.returned(returned),
                () = clock.sleep_until(wake.unwrap_or_else(|| clock.now())), if wake.is_some() => {}
                _ = session.lost() => {
                    if let Err(error) = self.rejoin().await {
                        let _ = self.gained.send(Err(error));
                        break;
                    }
                }
            }
        }
        for state in &self.states {
            if let State::Campaigning(task) = state {
                task.abort();
            }
        }
    }

    /// Joins again on a new session, once the one the membership was on
    /// has ended; waits while the store cannot be reached.
    async fn rejoin(&mut self) -> Result<()> {
        loop {
            let attempt = async {
                let session = self.elector.session().await?;
                join(
                    &**self.elector.store(),
                    session.id(),
                    &self.group,
                    self.kind,
                    &self.me,
                )
                .await?;
                Ok::<_, Error>(session)
            };
            let outcome = tokio::select! {
                biased;
                () = self.stop.cancelled() => return Ok(()),
                outcome = attempt => outcome,
            };
            match outcome {
                Ok(session) => {
                    tracing::info!(group = %self.group, id = %self.me, "joined the group again on a new session");
                    self.session = session;
                    return Ok(());
                }
                Err(error) if error.is_transient() || matches!(error, Error::SessionExpired(_)) => {
                    tracing::warn!(group = %self.group, %error, "cannot join the group again yet; retrying");
                    tokio::select! {
                        () = self.elector.clock().sleep(RETRY) => {}
                        () = self.stop.cancelled() => return Ok(()),
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Recomputes the assignment and acts on it: campaigns for this
    /// member's shards, withdraws from others, revokes what moved away.
    fn step(&mut self) -> Result<()> {
        let notes = self.notes.borrow_and_update().clone();
        let all = members(&notes);
        if let Some(first) = all.first()
            && first.kind != self.kind
        {
            return Err(super::conflict(&self.group, first, self.kind));
        }
        let members: Vec<Member> = all.into_iter().filter(|m| m.kind == self.kind).collect();
        let ids: Vec<CandidateId> = members.iter().map(|m| m.candidate.clone()).collect();
        let holders: Vec<Option<CandidateId>> = self
            .holders
            .holders()
            .iter()
            .zip(&self.states)
            .map(|(holder, state)| match state {
                State::Held { .. } => Some(self.me.clone()),
                _ => holder.as_ref().map(|h| h.candidate.clone()),
            })
            .collect();
        let target = assign(self.states.len(), &ids, &holders);
        let me = ids.iter().position(|c| *c == self.me);
        let now = self.elector.clock().now();
        for (index, state) in self.states.iter_mut().enumerate() {
            let mine = me.is_some() && target[index] == me;
            if let State::Resting(until) = state
                && *until <= now
            {
                *state = State::Idle;
            }
            match state {
                State::Idle if mine => {
                    let elector = Arc::clone(&self.elector);
                    let election = self.elections[index].clone();
                    let granted = self.granted_tx.clone();
                    let shard = u32::try_from(index).unwrap_or(u32::MAX);
                    let task = tokio::spawn(async move {
                        let outcome = elector.campaign_direct(&election).await;
                        let _ = granted.send((shard, outcome));
                    });
                    *state = State::Campaigning(task.abort_handle());
                }
                State::Campaigning(task) if !mine => {
                    task.abort();
                    *state = State::Idle;
                }
                State::Held { revoke, .. } if !mine && !*revoke.borrow() => {
                    tracing::info!(group = %self.group, shard = index, id = %self.me, "shard moves to another member; revoking it");
                    revoke.send_replace(true);
                }
                _ => {}
            }
        }
        let mine = self
            .states
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, State::Held { .. }))
            .filter_map(|(k, _)| u32::try_from(k).ok())
            .collect();
        let view = GroupView {
            members,
            holders: self.holders.holders().to_vec(),
            mine,
        };
        self.view.send_if_modified(|old| {
            if *old == view {
                false
            } else {
                *old = view;
                true
            }
        });
        Ok(())
    }

    fn granted(&mut self, index: u32, outcome: Result<Leadership>) {
        let Some(state) = self.states.get_mut(index as usize) else {
            return;
        };
        if !matches!(state, State::Campaigning(_)) {
            // Withdrawn meanwhile: a grant that came anyway is released
            // when dropped here.
            return;
        }
        match outcome {
            Ok(leadership) => {
                let (revoke, revoked) = watch::channel(false);
                *state = State::Held {
                    token: leadership.token(),
                    revoke,
                };
                let shard = Shard {
                    index,
                    count: self.kind.count(),
                    leadership: Some(leadership),
                    revoked,
                    returned: self.returned_tx.clone(),
                    rest: Duration::ZERO,
                };
                // A member that stopped listening drops the shard, which
                // releases it.
                let _ = self.gained.send(Ok(shard));
            }
            Err(error) => {
                tracing::warn!(group = %self.group, shard = index, %error, "campaign for a shard failed; retrying");
                *state = State::Resting(self.elector.clock().now() + RETRY);
                if !error.is_transient() && !matches!(error, Error::SessionExpired(_)) {
                    let _ = self.gained.send(Err(error));
                }
            }
        }
    }

    fn returned(&mut self, returned: Returned) {
        let Some(state) = self.states.get_mut(returned.index as usize) else {
            return;
        };
        if matches!(state, State::Held { token, .. } if *token == returned.token) {
            *state = if returned.rest.is_zero() {
                State::Idle
            } else {
                State::Resting(self.elector.clock().now() + returned.rest)
            };
        }
    }
}
