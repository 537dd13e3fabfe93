//! [`Shards`]: a member of a group of `n` shards, owning its share.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::ownership::{Action, Back, Campaigned, Ownership, Phase, RETRY};
use super::{GroupKind, LeaderWatches, Member, join, members};
use crate::elector::{Elector, Leadership};
use crate::error::{Error, Result};
use crate::names::{CandidateId, ElectionName};
use crate::session::Session;
use crate::store::{FencingToken, Grant, Leader, NoteWatch};
use crate::watch;

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
            .map(|m| self.holders.iter().flatten().filter(|h| m.holds(h)).count())
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
            ownership: Ownership::new(elector.candidate().clone(), count as usize),
            campaigns: vec![None; count as usize],
            revokes: vec![None; count as usize],
            gained: gained_tx,
            returned_tx,
            returned: returned_rx,
            reports_tx,
            reports: reports_rx,
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
    /// The decisions ([`Ownership`]); what follows carries them out.
    ownership: Ownership,
    /// Per shard, its campaign's cancellation while one runs.
    campaigns: Vec<Option<CancellationToken>>,
    /// Per shard handed out, its revoke signal.
    revokes: Vec<Option<watch::Sender<bool>>>,
    gained: mpsc::UnboundedSender<Result<Shard>>,
    returned_tx: mpsc::UnboundedSender<Returned>,
    returned: mpsc::UnboundedReceiver<Returned>,
    reports_tx: mpsc::UnboundedSender<Report>,
    reports: mpsc::UnboundedReceiver<Report>,
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
            let wake = self.ownership.wake();
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
        for cancel in self.campaigns.iter().flatten() {
            cancel.cancel();
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

    /// Recomputes the assignment and acts on it (see [`Ownership::assigned`]).
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
        let now = self.elector.clock().now();
        // Campaigns only on the session the membership is on: once it has
        // ended, none until the member joined again on a new one.
        let live = self.session.over_now().is_none();
        // A holder on no member's session (a single election's, or a
        // member's that left and has yet to let go) is nobody's here.
        let held: Vec<Option<Leader>> = self
            .holders
            .holders()
            .iter()
            .map(|h| {
                h.as_ref()
                    .filter(|h| members.iter().any(|m| m.holds(h)))
                    .cloned()
            })
            .collect();
        let actions = self.ownership.assigned(now, live, &ids, &held);
        self.carry_out(actions, None, None);
        let view = GroupView {
            members,
            holders: self.holders.holders().to_vec(),
            mine: self.ownership.mine(),
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

    /// Carries `actions` out: `leadership` is the one a campaign returned
    /// or a shard brought back, `error` the one a campaign failed with.
    fn carry_out(
        &mut self,
        actions: Vec<Action>,
        mut leadership: Option<Leadership>,
        mut error: Option<Error>,
    ) {
        for action in actions {
            match action {
                Action::Campaign(index) => self.campaign(index),
                Action::Withdraw(index) => {
                    if let Some(cancel) = self.campaigns[index as usize].take() {
                        cancel.cancel();
                    }
                }
                Action::Revoke(index) => {
                    tracing::info!(group = %self.group, shard = index, id = %self.me, "shard moves to another member; revoking it");
                    if let Some(revoke) = &self.revokes[index as usize] {
                        revoke.send_replace(true);
                    }
                }
                Action::HandOut(index) => {
                    if let Some(leadership) = leadership.take() {
                        self.hand_out(index, leadership);
                    }
                }
                Action::ReleaseLeadership(index) => {
                    if let Some(leadership) = leadership.take() {
                        self.release(index, ToRelease::Leadership(leadership));
                    }
                }
                Action::ReleaseGrant(index, token) => {
                    tracing::debug!(group = %self.group, shard = index, token = token.0, "releasing a grant of this member's");
                    let grant = Grant {
                        election: self.elections[index as usize].clone(),
                        candidate: self.me.clone(),
                        session: self.session.id(),
                        token,
                    };
                    self.release(index, ToRelease::Grant(grant));
                }
                Action::Fail(_) => {
                    if let Some(error) = error.take() {
                        let _ = self.gained.send(Err(error));
                    }
                }
            }
        }
    }

    /// Starts shard `index`'s campaign on the membership's session;
    /// withdrawn on its own, and all at once when the member stops
    /// (without waiting for the task to see it).
    fn campaign(&mut self, index: u32) {
        let elector = Arc::clone(&self.elector);
        let election = self.elections[index as usize].clone();
        let reports = self.reports_tx.clone();
        let cancel = self.stop.child_token();
        let cancelled = cancel.clone();
        let on = Arc::clone(&self.session);
        tokio::spawn(async move {
            let outcome = tokio::select! {
                biased;
                () = cancelled.cancelled() => None,
                outcome = elector.campaign_on(on, &election) => Some(outcome),
            };
            let _ = reports.send(Report::Campaign(index, outcome));
        });
        self.campaigns[index as usize] = Some(cancel);
    }

    /// Hands shard `index` out, granted: a member that stopped listening
    /// drops it, and it comes back here to be released.
    fn hand_out(&mut self, index: u32, leadership: Leadership) {
        let (revoke, revoked) = watch::channel(false);
        self.revokes[index as usize] = Some(revoke);
        let _ = self.gained.send(Ok(Shard {
            index,
            count: self.kind.count(),
            leadership: Some(leadership),
            revoked,
            returned: self.returned_tx.clone(),
            rest: Duration::ZERO,
        }));
    }

    /// Lets `what` go in a release task, which reports its end.
    fn release(&self, index: u32, what: ToRelease) {
        tokio::spawn(release(
            Arc::clone(self.elector.store()),
            index,
            what,
            self.reports_tx.clone(),
            self.stop.clone(),
        ));
    }

    fn report(&mut self, report: Report) {
        let now = self.elector.clock().now();
        match report {
            Report::Campaign(index, outcome) => {
                self.campaigns[index as usize] = None;
                let (campaigned, leadership, error) = match outcome {
                    Some(Ok(leadership)) => (
                        Campaigned::Granted {
                            token: leadership.token(),
                            leading: leadership.is_leader(),
                        },
                        Some(leadership),
                        None,
                    ),
                    Some(Err(Error::SessionExpired(_))) => (Campaigned::SessionEnded, None, None),
                    Some(Err(error)) => {
                        tracing::warn!(group = %self.group, shard = index, %error, "campaign for a shard failed; retrying");
                        let transient = error.is_transient();
                        (Campaigned::Failed { transient }, None, Some(error))
                    }
                    None => (Campaigned::Withdrawn, None, None),
                };
                let actions = self.ownership.campaigned(index, campaigned, now);
                self.carry_out(actions, leadership, error);
            }
            Report::Released(index, token, gone) => {
                let actions = self.ownership.release_ended(index, token, gone, now);
                self.carry_out(actions, None, None);
            }
        }
    }

    fn returned(&mut self, returned: Returned) {
        let now = self.elector.clock().now();
        let (how, leadership) = match returned.how {
            Given::Released => (Back::Released, None),
            Given::NotReleased => (Back::NotReleased, None),
            Given::Dropped(leadership) => (Back::Dropped, Some(leadership)),
        };
        let actions =
            self.ownership
                .given_back(returned.index, returned.token, returned.rest, how, now);
        let index = returned.index as usize;
        if !matches!(self.ownership.phases().get(index), Some(Phase::Held { .. }))
            && let Some(revoke) = self.revokes.get_mut(index)
        {
            *revoke = None;
        }
        self.carry_out(actions, leadership, None);
    }
}
