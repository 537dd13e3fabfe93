//! Slots: at most `k` holders of a group at once, each slot an election
//! with its own token.
//!
//! Waiters line up on one more election, `<group>/slot/queue`, in the
//! store's own order of campaigns (each waits on the one ahead of it): its
//! holder is the one waiter that watches the slots and takes the next
//! free one, then releases the queue to the next. Only that waiter reads
//! the slots, so a freed slot wakes one waiter, however many wait.

use super::{GroupKind, LeaderWatches, join};
use crate::elector::{Elector, Leadership};
use crate::error::{Error, Result};
use crate::names::ElectionName;

/// A slot this process holds ([`Elector::campaign_slot`]).
#[derive(Debug)]
pub struct Slot {
    /// The slot's number, from 0.
    pub index: u32,
    /// Its grant: the slot's own election, token and deadline.
    pub leadership: Leadership,
}

impl Elector {
    /// Resolves when this candidate holds one of `slots` slots of `group`
    /// (a semaphore: at most `slots` holders at once, each with its own
    /// strictly increasing token per slot). Waiters are served in the
    /// order they came; this elector's priority does not apply. Fails with [`Error::InvalidInput`] for a count of
    /// 0 or above [`super::MAX_SHARDS`], and with [`Error::Conflict`] when
    /// the group's members asked for another count (or for shards).
    /// Dropping the future withdraws from the queue.
    pub async fn campaign_slot(&self, group: &ElectionName, slots: u32) -> Result<Slot> {
        let kind = GroupKind::Slots(slots);
        kind.check(group)?;
        let elections = (0..slots)
            .map(|k| kind.election(group, k))
            .collect::<Result<Vec<_>>>()?;
        let queue = super::slot_queue(group)?;
        loop {
            let session = self.session().await?;
            join(&**self.store(), session.id(), group, kind, self.candidate()).await?;
            let turn = self.campaign_direct(&queue).await?;
            let outcome = tokio::select! {
                biased;
                _ = turn.lost() => None,
                slot = self.take_free_slot(&elections) => Some(slot),
            };
            if let Err(error) = turn.resign().await {
                tracing::debug!(%group, %error, "releasing the slot queue failed; it ends with the session");
            }
            match outcome {
                Some(slot) => return slot,
                // The queue's grant ended before a slot was free (its
                // session was lost): join the queue again.
                None => continue,
            }
        }
    }

    /// Waits for a free slot and takes it.
    async fn take_free_slot(&self, elections: &[ElectionName]) -> Result<Slot> {
        let mut holders = LeaderWatches::open(self.store(), elections).await?;
        loop {
            // A watch may lag a grant the previous holder of the queue just
            // got: a free slot is read again before it is asked for.
            let mut free = None;
            for (index, holder) in holders.holders().iter().enumerate() {
                if holder.is_none() && self.store().leader(&elections[index]).await?.is_none() {
                    free = Some(index);
                    break;
                }
            }
            let Some(index) = free else {
                holders.changed().await;
                continue;
            };
            // Only the queue's holder asks for a slot, so it is granted at
            // once; should a holder of the queue whose grant ended while it
            // asked have taken it first, this waits for that slot. (Never
            // withdrawn: a campaign dropped as it reaches the store is what
            // every store must handle, but the surest path is not to.)
            let leadership = self.campaign_direct(&elections[index]).await?;
            return Ok(Slot {
                index: u32::try_from(index).map_err(|_| Error::invalid("slot", "out of range"))?,
                leadership,
            });
        }
    }
}
