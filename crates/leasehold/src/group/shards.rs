//! [`Shards`]: a member of a group of `n` shards, owning its share.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{GroupKind, LeaderWatches, Member, assign, join, members};
use crate::clock::Instant;
use crate::elector::{Elector, Leadership};
use crate::error::{Error, Result};
use crate::names::{CandidateId, ElectionName};
use crate::session::Session;
use crate::store::{FencingToken, Grant, Leader, NoteWatch};
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
/// (balanced, and moving only the shards it must) gives it and hands each one out as a [`Shard`] once
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
    elector: Arc<Elector>,
    /// The coordinator's task; it ends with the session the membership
    /// was last on.
    coordinator: Option<tokio::task::JoinHandle<Arc<Session>>>,
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
    how: Given,
}

/// How a shard came back.
#[derive(Debug)]
enum Given {
    /// Released (or found gone) by its holder.
    Released,
    /// Its holder's release failed: the grant may still be there.
    NotReleased,
    /// Dropped: the coordinator releases it.
    Dropped(Leadership),
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
                let how = match &outcome {
                    Ok(()) | Err(Error::NotHolder { .. } | Error::SessionExpired(_)) => {
                        Given::Released
                    }
                    Err(_) => Given::NotReleased,
                };
                let _ = self.returned.send(Returned {
                    index: self.index,
                    token,
                    rest: self.rest,
                    how,
                });
                outcome
            }
            None => Ok(()),
        }
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        // The coordinator releases it, and campaigns for the shard again
        // only once the release is done.
        if let Some(leadership) = self.leadership.take() {
            let _ = self.returned.send(Returned {
                index: self.index,
                token: leadership.token(),
                rest: self.rest,
                how: Given::Dropped(leadership),
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
        // The shards' watches first: once this member's note shows, the
        // others give up shards for it, which it must then see at once.
        let elections = (0..count)
            .map(|k| kind.election(&group, k))
            .collect::<Result<Vec<_>>>()?;
        let holders = LeaderWatches::open(&store, &elections).await?;
        join(&*store, session.id(), &group, kind, elector.candidate()).await?;
        let notes = store.watch_notes(&group).await?;
        let (gained_tx, gained) = mpsc::unbounded_channel();
        let (returned_tx, returned_rx) = mpsc::unbounded_channel();
        let (reports_tx, reports_rx) = mpsc::unbounded_channel();
        let (view_tx, view) = watch::channel(GroupView::default());
        let stop = CancellationToken::new();
        let coordinator = Coordinator {
            me: elector.candidate().clone(),
            elector: Arc::clone(&elector),
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
            reports_tx,
            reports: reports_rx,
            released: vec![None; count as usize],
            view: view_tx,
            stop: stop.clone(),
        };
        let coordinator = tokio::spawn(coordinator.run());
        Ok(Shards {
            group,
            count,
            gained,
            view,
            elector,
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

    /// Stops campaigning and leaves the group: returns once this member
    /// no longer asks for anything and its note is gone, so that the
    /// others take each of its shards as soon as it is released. The
    /// shards handed out stay held until dropped or resigned.
    pub async fn leave(self) {
        let Shards {
            coordinator,
            _stop,
            elector,
            group,
            ..
        } = self;
        // Stopped, the coordinator withdraws its campaigns before it ends.
        drop(_stop);
        let Some(coordinator) = coordinator else {
            return;
        };
        // No member any more: the others take this member's shards as soon
        // as each is released, not once the last of them is. (A session
        // that ended took the note with it.)
        if let Ok(session) = coordinator.await
            && session.over_now().is_none()
            && let Err(error) = elector
                .store()
                .delete_note(session.id(), &group, super::MEMBER)
                .await
        {
            tracing::debug!(%group, %error, "could not leave the group; it ends with the session");
        }
    }

    /// The group as this member sees it, kept up to date.
    pub fn view(&self) -> watch::Receiver<GroupView> {
        self.view.clone()
    }
}

/// Where this member is with one shard. At most one campaign, one
/// [`Leadership`] and one release of a shard are under way at any time, so
/// that no campaign on this member's session can return a grant that a
/// release in flight is about to end.
#[derive(Debug)]
enum State {
    /// Neither held nor asked for, nothing in flight.
    Idle,
    /// A campaign runs; cancelling it withdraws it.
    Campaigning(CancellationToken),
    /// A campaign was withdrawn: waiting for its task's last word (it may
    /// have been granted meanwhile, and then is released).
    Withdrawing,
    /// Handed out; the sender revokes it.
    Held {
        token: FencingToken,
        revoke: watch::Sender<bool>,
    },
    /// A grant of this member's session is being released: a shard given
    /// back, or a grant nothing acts on (a campaign whose reply was lost,
    /// a release that failed). Then rests until `then`, if given.
    Releasing {
        token: FencingToken,
        then: Option<Instant>,
    },
    /// Given back with a rest: not asked for again before then.
    Resting(Instant),
}

/// What a campaign task or a release task reports.
#[derive(Debug)]
enum Report {
    /// A campaign ended: granted, failed, or (`None`) withdrawn first.
    Campaign(u32, Option<Result<Leadership>>),
    /// A release ended; whether the grant is gone.
    Released(u32, FencingToken, bool),
}

/// What a release task releases.
enum ToRelease {
    /// A leadership handed back without a release.
    Leadership(Leadership),
    /// A grant known by its token only.
    Grant(Grant),
}

/// Releases a grant and reports whether it is gone (released, or already
/// gone); stops trying when the member stops (the grant then ends with
/// its session).
async fn release(
    store: Arc<dyn crate::store::Store>,
    index: u32,
    what: ToRelease,
    reports: mpsc::UnboundedSender<Report>,
    stop: CancellationToken,
) {
    let (token, outcome) = match what {
        ToRelease::Leadership(leadership) => {
            let token = leadership.token();
            (token, leadership.resign().await)
        }
        ToRelease::Grant(grant) => {
            let outcome = tokio::select! {
                () = stop.cancelled() => return,
                outcome = store.resign(&grant) => outcome,
            };
            (grant.token, outcome)
        }
    };
    let gone = match outcome {
        Ok(()) | Err(Error::NotHolder { .. } | Error::SessionExpired(_)) => true,
        Err(error) => {
            tracing::debug!(shard = index, %error, "releasing a shard failed");
            false
        }
    };
    let _ = reports.send(Report::Released(index, token, gone));
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
    reports_tx: mpsc::UnboundedSender<Report>,
    reports: mpsc::UnboundedReceiver<Report>,
    /// Per shard, the token of the last grant of this member's that a
    /// release ended: a watch that still shows it is behind, not a grant
    /// nothing acts on.
    released: Vec<Option<FencingToken>>,
    view: watch::Sender<GroupView>,
    stop: CancellationToken,
}

impl Coordinator {
    async fn run(mut self) -> Arc<Session> {
        let clock = Arc::clone(self.elector.clock());
        // Stopped, it starts nothing more: a campaign begun now could
        // still reach the store after the member closed its session.
        while !self.stop.is_cancelled() {
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
                Some(report) = self.reports.recv() => self.report(report),
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
            if let State::Campaigning(cancel) = state {
                cancel.cancel();
            }
        }
        self.session
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
                // Being let go: not this member's any more.
                State::Releasing { .. } => None,
                _ => holder.as_ref().map(|h| h.candidate.clone()),
            })
            .collect();
        let target = assign(self.states.len(), &ids, &holders);
        let me = ids.iter().position(|c| *c == self.me);
        let now = self.elector.clock().now();
        let session = self.session.id();
        // Campaigns only on the session the membership is on: once it has
        // ended, none until the member joined again on a new one.
        let live = self.session.over_now().is_none();
        for (index, assigned) in target.iter().enumerate() {
            let shard = u32::try_from(index).unwrap_or(u32::MAX);
            let mine = me.is_some() && *assigned == me;
            let state = &mut self.states[index];
            if let State::Resting(until) = state
                && *until <= now
            {
                *state = State::Idle;
            }
            // A grant of this member's that nothing here acts on: released
            // (a fresh campaign follows, with a new token).
            let orphan = self.holders.holders()[index]
                .as_ref()
                .filter(|h| h.candidate == self.me && Some(h.token) != self.released[index])
                .map(|h| h.token);
            if let Some(token) = orphan
                && let State::Idle | State::Resting(_) = state
            {
                let then = match state {
                    State::Resting(until) => Some(*until),
                    _ => None,
                };
                tracing::debug!(group = %self.group, shard = index, token = token.0,
                    "releasing a grant of this member that nothing acts on");
                let grant = Grant {
                    election: self.elections[index].clone(),
                    candidate: self.me.clone(),
                    session,
                    token,
                };
                *state = State::Releasing { token, then };
                tokio::spawn(release(
                    Arc::clone(self.elector.store()),
                    shard,
                    ToRelease::Grant(grant),
                    self.reports_tx.clone(),
                    self.stop.clone(),
                ));
                continue;
            }
            match state {
                State::Idle if mine && live => {
                    let elector = Arc::clone(&self.elector);
                    let election = self.elections[index].clone();
                    let reports = self.reports_tx.clone();
                    // Withdrawn one by one, and all at once when the member
                    // stops (without waiting for this task to see it).
                    let cancel = self.stop.child_token();
                    let cancelled = cancel.clone();
                    let on = Arc::clone(&self.session);
                    tokio::spawn(async move {
                        let outcome = tokio::select! {
                            biased;
                            () = cancelled.cancelled() => None,
                            outcome = elector.campaign_on(on, &election) => Some(outcome),
                        };
                        let _ = reports.send(Report::Campaign(shard, outcome));
                    });
                    *state = State::Campaigning(cancel);
                }
                State::Campaigning(cancel) if !mine => {
                    cancel.cancel();
                    *state = State::Withdrawing;
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

    /// Lets `what` go in a release task; the shard rests until `then`
    /// once the release is done.
    fn let_go(&mut self, index: u32, token: FencingToken, what: ToRelease, then: Option<Instant>) {
        if let Some(state) = self.states.get_mut(index as usize) {
            *state = State::Releasing { token, then };
            tokio::spawn(release(
                Arc::clone(self.elector.store()),
                index,
                what,
                self.reports_tx.clone(),
                self.stop.clone(),
            ));
        }
    }

    fn report(&mut self, report: Report) {
        match report {
            Report::Campaign(index, outcome) => self.campaigned(index, outcome),
            Report::Released(index, token, gone) => {
                let Some(state) = self.states.get_mut(index as usize) else {
                    return;
                };
                let State::Releasing {
                    token: releasing,
                    then,
                } = state
                else {
                    return;
                };
                if *releasing != token {
                    return;
                }
                if gone {
                    self.released[index as usize] = Some(token);
                    *state = then.map_or(State::Idle, State::Resting);
                } else {
                    // Tried again after a pause: the shard rests meanwhile.
                    let retry_at = self.elector.clock().now() + RETRY;
                    let then = Some(then.map_or(retry_at, |t| t.max(retry_at)));
                    let grant = Grant {
                        election: self.elections[index as usize].clone(),
                        candidate: self.me.clone(),
                        session: self.session.id(),
                        token,
                    };
                    self.let_go(index, token, ToRelease::Grant(grant), then);
                }
            }
        }
    }

    fn campaigned(&mut self, index: u32, outcome: Option<Result<Leadership>>) {
        let Some(state) = self.states.get_mut(index as usize) else {
            return;
        };
        let wanted = matches!(state, State::Campaigning(_));
        match outcome {
            Some(Ok(leadership)) if wanted && leadership.is_leader() => {
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
                // comes back here to be released.
                let _ = self.gained.send(Ok(shard));
            }
            // Withdrawn meanwhile, or lost already: let go.
            Some(Ok(leadership)) => {
                let token = leadership.token();
                self.let_go(index, token, ToRelease::Leadership(leadership), None);
            }
            // The membership's session ended: campaigned for again once
            // the member joined on a new one.
            Some(Err(Error::SessionExpired(_))) => *state = State::Idle,
            Some(Err(error)) => {
                tracing::warn!(group = %self.group, shard = index, %error, "campaign for a shard failed; retrying");
                *state = State::Resting(self.elector.clock().now() + RETRY);
                if wanted && !error.is_transient() {
                    let _ = self.gained.send(Err(error));
                }
            }
            None => *state = State::Idle,
        }
    }

    fn returned(&mut self, returned: Returned) {
        let Some(state) = self.states.get_mut(returned.index as usize) else {
            return;
        };
        if !matches!(state, State::Held { token, .. } if *token == returned.token) {
            return;
        }
        let now = self.elector.clock().now();
        let then = (!returned.rest.is_zero()).then(|| now + returned.rest);
        match returned.how {
            Given::Released => {
                self.released[returned.index as usize] = Some(returned.token);
                *state = then.map_or(State::Idle, State::Resting);
            }
            Given::NotReleased => {
                let grant = Grant {
                    election: self.elections[returned.index as usize].clone(),
                    candidate: self.me.clone(),
                    session: self.session.id(),
                    token: returned.token,
                };
                self.let_go(
                    returned.index,
                    returned.token,
                    ToRelease::Grant(grant),
                    then,
                );
            }
            Given::Dropped(leadership) => {
                self.let_go(
                    returned.index,
                    returned.token,
                    ToRelease::Leadership(leadership),
                    then,
                );
            }
        }
    }
}
