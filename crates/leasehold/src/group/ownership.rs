//! Where a member of a group of shards is with each shard, decided by a
//! pure machine in the style of the lease core: what the member learns
//! (the group's members and the store's holders, the end of a campaign
//! or of a release, a shard given back) comes in with the instant, and
//! what to do (campaign, withdraw, revoke, hand out, release) goes out.
//! The coordinator ([`super::shards`]) carries the actions out and keeps
//! what they need (a campaign's cancellation, a shard's revoke signal, a
//! leadership on its way).
//!
//! At most one campaign, one handed-out shard and one release of a shard
//! are under way at any time, so that no campaign on this member's
//! session can return a grant that a release in flight is about to end.

use std::time::Duration;

use super::assign;
use crate::clock::Instant;
use crate::names::CandidateId;
use crate::store::{FencingToken, Leader};

/// Pause before a shard's campaign, or a failed release, is tried again.
pub(crate) const RETRY: Duration = Duration::from_secs(1);

/// Where this member is with one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Neither held nor asked for, nothing in flight.
    Idle,
    /// A campaign runs.
    Campaigning,
    /// A campaign was withdrawn: waiting for its last word (it may have
    /// been granted meanwhile, and then is released).
    Withdrawing,
    /// Handed out; `revoked` once the assignment moved it away.
    Held { token: FencingToken, revoked: bool },
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

/// What the coordinator does for a shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Campaign for it on the membership's session.
    Campaign(u32),
    /// Withdraw its campaign.
    Withdraw(u32),
    /// Tell its holder here that the assignment moved it away.
    Revoke(u32),
    /// Hand the leadership its campaign returned out as a shard.
    HandOut(u32),
    /// Release the leadership the coordinator holds for it (its campaign
    /// returned one that is not wanted, or its shard was dropped).
    ReleaseLeadership(u32),
    /// Release the grant of this member's session with this token.
    ReleaseGrant(u32, FencingToken),
    /// Tell the member that its campaign failed for good.
    Fail(u32),
}

/// How a campaign for a shard ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Campaigned {
    /// Granted; `leading` unless the leadership was lost already.
    Granted { token: FencingToken, leading: bool },
    /// The membership's session ended: asked for again once the member
    /// joined on a new one.
    SessionEnded,
    /// Failed; `transient` if the store may answer later.
    Failed { transient: bool },
    /// Withdrawn before it ended.
    Withdrawn,
}

/// How a handed-out shard came back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Back {
    /// Released (or found gone) by its holder.
    Released,
    /// Its holder's release failed: the grant may still be there.
    NotReleased,
    /// Dropped: the coordinator releases its leadership.
    Dropped,
}

/// The member's shards (see the [module](self)).
#[derive(Debug)]
pub(crate) struct Ownership {
    me: CandidateId,
    phases: Vec<Phase>,
    /// Per shard, the token of the last grant of this member's that a
    /// release ended: a holder's watch that still shows it is behind, not
    /// a grant nothing acts on.
    released: Vec<Option<FencingToken>>,
}

impl Ownership {
    /// A member `me` of a group of `count` shards, holding none.
    pub(crate) fn new(me: CandidateId, count: usize) -> Self {
        Ownership {
            me,
            phases: vec![Phase::Idle; count],
            released: vec![None; count],
        }
    }

    /// Where this member is with each shard.
    pub(crate) fn phases(&self) -> &[Phase] {
        &self.phases
    }

    /// The shards handed out and not given back.
    pub(crate) fn mine(&self) -> Vec<u32> {
        (0..self.phases.len())
            .filter(|&k| matches!(self.phases[k], Phase::Held { .. }))
            .filter_map(|k| u32::try_from(k).ok())
            .collect()
    }

    /// When a rest ends, if a shard rests.
    pub(crate) fn wake(&self) -> Option<Instant> {
        self.phases
            .iter()
            .filter_map(|p| match p {
                Phase::Resting(until) => Some(*until),
                _ => None,
            })
            .min()
    }

    /// The assignment of the group with `members` (in the order they
    /// joined) while the store shows `holders`, acted on at `now`:
    /// campaigns for this member's shards (`live`: only while the session
    /// the membership is on lives), withdraws from others, revokes what
    /// moved away, and releases a grant of this member's that nothing
    /// here acts on (a fresh campaign follows, with a new token).
    pub(crate) fn assigned(
        &mut self,
        now: Instant,
        live: bool,
        members: &[CandidateId],
        holders: &[Option<Leader>],
    ) -> Vec<Action> {
        let counted: Vec<Option<CandidateId>> = holders
            .iter()
            .zip(&self.phases)
            .map(|(holder, phase)| match phase {
                Phase::Held { .. } => Some(self.me.clone()),
                // Being let go: not this member's any more.
                Phase::Releasing { .. } => None,
                _ => holder.as_ref().map(|h| h.candidate.clone()),
            })
            .collect();
        let target = assign(self.phases.len(), members, &counted);
        let me = members.iter().position(|c| *c == self.me);
        let mut actions = Vec::new();
        for (index, assigned) in target.iter().enumerate() {
            let mine = me.is_some() && *assigned == me;
            let holder = holders.get(index).and_then(Option::as_ref);
            self.assigned_one(index, now, live && mine, mine, holder, &mut actions);
        }
        actions
    }

    fn assigned_one(
        &mut self,
        index: usize,
        now: Instant,
        ask: bool,
        mine: bool,
        holder: Option<&Leader>,
        actions: &mut Vec<Action>,
    ) {
        let shard = u32::try_from(index).unwrap_or(u32::MAX);
        let phase = &mut self.phases[index];
        if let Phase::Resting(until) = *phase
            && until <= now
        {
            *phase = Phase::Idle;
        }
        let orphan = holder
            .filter(|h| h.candidate == self.me && Some(h.token) != self.released[index])
            .map(|h| h.token);
        match (*phase, orphan) {
            (Phase::Idle, Some(token)) => {
                *phase = Phase::Releasing { token, then: None };
                actions.push(Action::ReleaseGrant(shard, token));
            }
            (Phase::Resting(until), Some(token)) => {
                *phase = Phase::Releasing {
                    token,
                    then: Some(until),
                };
                actions.push(Action::ReleaseGrant(shard, token));
            }
            (Phase::Idle, None) if ask => {
                *phase = Phase::Campaigning;
                actions.push(Action::Campaign(shard));
            }
            (Phase::Campaigning, _) if !mine => {
                *phase = Phase::Withdrawing;
                actions.push(Action::Withdraw(shard));
            }
            (
                Phase::Held {
                    token,
                    revoked: false,
                },
                _,
            ) if !mine => {
                *phase = Phase::Held {
                    token,
                    revoked: true,
                };
                actions.push(Action::Revoke(shard));
            }
            _ => {}
        }
    }

    /// The campaign for shard `index` ended so, at `now`.
    pub(crate) fn campaigned(
        &mut self,
        index: u32,
        outcome: Campaigned,
        now: Instant,
    ) -> Vec<Action> {
        let Some(phase) = self.phases.get_mut(index as usize) else {
            return Vec::new();
        };
        let wanted = *phase == Phase::Campaigning;
        match outcome {
            Campaigned::Granted { token, leading } if wanted && leading => {
                *phase = Phase::Held {
                    token,
                    revoked: false,
                };
                vec![Action::HandOut(index)]
            }
            // Withdrawn meanwhile, or lost already: let go.
            Campaigned::Granted { token, .. } => {
                *phase = Phase::Releasing { token, then: None };
                vec![Action::ReleaseLeadership(index)]
            }
            Campaigned::SessionEnded | Campaigned::Withdrawn => {
                *phase = Phase::Idle;
                Vec::new()
            }
            Campaigned::Failed { transient } => {
                *phase = Phase::Resting(now + RETRY);
                if wanted && !transient {
                    vec![Action::Fail(index)]
                } else {
                    Vec::new()
                }
            }
        }
    }

    /// A release of the grant of shard `index` with `token` ended at
    /// `now`; `gone` if the grant is (released, or gone already). One that
    /// failed is tried again after [`RETRY`], the shard resting meanwhile.
    pub(crate) fn release_ended(
        &mut self,
        index: u32,
        token: FencingToken,
        gone: bool,
        now: Instant,
    ) -> Vec<Action> {
        let Some(phase) = self.phases.get_mut(index as usize) else {
            return Vec::new();
        };
        let Phase::Releasing {
            token: releasing,
            then,
        } = *phase
        else {
            return Vec::new();
        };
        if releasing != token {
            return Vec::new();
        }
        if gone {
            self.released[index as usize] = Some(token);
            *phase = then.map_or(Phase::Idle, Phase::Resting);
            return Vec::new();
        }
        let retry_at = now + RETRY;
        let then = Some(then.map_or(retry_at, |t| t.max(retry_at)));
        *phase = Phase::Releasing { token, then };
        vec![Action::ReleaseGrant(index, token)]
    }

    /// The shard `index` handed out with `token` came back at `now`, so;
    /// it is not asked for again before `rest` has passed.
    pub(crate) fn given_back(
        &mut self,
        index: u32,
        token: FencingToken,
        rest: Duration,
        how: Back,
        now: Instant,
    ) -> Vec<Action> {
        let Some(phase) = self.phases.get_mut(index as usize) else {
            return Vec::new();
        };
        if !matches!(*phase, Phase::Held { token: held, .. } if held == token) {
            return Vec::new();
        }
        let then = (!rest.is_zero()).then(|| now + rest);
        match how {
            Back::Released => {
                self.released[index as usize] = Some(token);
                *phase = then.map_or(Phase::Idle, Phase::Resting);
                Vec::new()
            }
            Back::NotReleased => {
                *phase = Phase::Releasing { token, then };
                vec![Action::ReleaseGrant(index, token)]
            }
            Back::Dropped => {
                *phase = Phase::Releasing { token, then };
                vec![Action::ReleaseLeadership(index)]
            }
        }
    }
}

#[cfg(test)]
mod tests;
