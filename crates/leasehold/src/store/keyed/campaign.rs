//! A campaign's key: created only if absent, withdrawn if the campaign is
//! dropped, whenever that happens — even while the request that creates
//! it is on its way (the cancellation obligation of
//! [`Store::campaign`](crate::store::Store::campaign)).

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::grant::SessionId;
use crate::store::cleanup::{self, OnDrop};
use crate::store::keys::{Check, Keys, Revision, Write};

/// A campaign's key: `key`, attached to `session`.
#[derive(Clone, Debug)]
pub(super) struct CandidateKey {
    pub(super) key: String,
    pub(super) session: SessionId,
}

impl CandidateKey {
    /// Commits `checks` with the put of this key, valued `value`. The
    /// commit runs as a task of its own: dropped before it answers, the
    /// caller leaves it to learn whether the key was created, and to
    /// withdraw it if so.
    pub(super) async fn create<K: Keys>(
        &self,
        keys: &Arc<K>,
        checks: Vec<Check>,
        value: String,
    ) -> Result<Option<Revision>> {
        let (answer, answered) = oneshot::channel();
        let (keys, candidate) = (Arc::clone(keys), self.clone());
        tokio::spawn(async move {
            let put = Write::Put {
                key: candidate.key.clone(),
                value,
                session: Some(candidate.session),
            };
            let created = keys.commit(&checks, &[put]).await;
            if let Err(Ok(Some(revision))) = answer.send(created) {
                candidate.withdraw(keys, revision).await;
            }
        });
        answered.await.map_err(|_| Error::Unavailable {
            reason: "the campaign's request was abandoned".into(),
            source: None,
        })?
    }

    /// Withdraws the key created at `revision`, retried until the store
    /// answers; never a later key of the same name.
    async fn withdraw<K: Keys>(self, keys: Arc<K>, revision: Revision) {
        cleanup::until_done("withdraw a dropped campaign's key", || {
            let check = Check::Created {
                key: self.key.clone(),
                revision,
                session: Some(self.session),
            };
            let delete = Write::Delete(self.key.clone());
            let keys = Arc::clone(&keys);
            async move { keys.commit(&[check], &[delete]).await.map(drop) }
        })
        .await;
    }

    /// Withdraws the key created at `revision` if the guard is dropped
    /// armed.
    pub(super) fn withdraw_on_drop<K: Keys>(
        &self,
        keys: &Arc<K>,
        revision: Revision,
    ) -> OnDrop<(Arc<K>, CandidateKey)> {
        OnDrop::new(
            (Arc::clone(keys), self.clone()),
            move |(keys, candidate): (Arc<K>, CandidateKey)| async move {
                candidate.withdraw(keys, revision).await;
            },
        )
    }
}
