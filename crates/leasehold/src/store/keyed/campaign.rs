//! A campaign's key: created only if absent, withdrawn if the campaign is
//! dropped, whenever that happens — even while the request that creates
//! it is on its way (the cancellation obligation of
//! [`Store::campaign`](crate::store::Store::campaign)) — and never taken
//! up by a later campaign while it is being withdrawn.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::grant::SessionId;
use crate::store::cleanup::{self, OnDrop};
use crate::store::keys::{Check, Keys, Revision, Write};

/// The keys of dropped campaigns that a handle is withdrawing: a campaign
/// of the same session that finds one waits until it is gone rather than
/// take it up (it would vanish under it).
#[derive(Debug, Default)]
pub(super) struct Withdrawing(Mutex<HashSet<String>>);

impl Withdrawing {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mark(&self, key: &str) {
        self.set().insert(key.to_owned());
    }

    fn clear(&self, key: &str) {
        self.set().remove(key);
    }

    /// Whether `key` is being withdrawn: it is marked, or (a key the
    /// store named) starts with a marked key.
    pub(super) fn has(&self, key: &str) -> bool {
        self.set().iter().any(|k| key.starts_with(k.as_str()))
    }
}

/// A campaign's key: `key`, attached to `session`. In a layout whose
/// store names the candidates, `key` is the name's part before the
/// sequence, and `line` the candidates' prefix, where the key the store
/// made is found again (by its session and creation revision).
#[derive(Clone, Debug)]
pub(super) struct CandidateKey {
    pub(super) key: String,
    pub(super) session: SessionId,
    pub(super) line: Option<String>,
}

/// The answer to a creation, awaited; dropped before it came, it leaves
/// the key marked as being withdrawn and sees to it that it is.
struct Awaiting<K: Keys> {
    answered: oneshot::Receiver<Result<Option<Revision>>>,
    keys: Arc<K>,
    candidate: CandidateKey,
    withdrawing: Arc<Withdrawing>,
    done: bool,
}

impl<K: Keys> Drop for Awaiting<K> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.withdrawing.mark(&self.candidate.key);
        // No answer can come after this: the task learns its answer was
        // abandoned, and withdraws what it created.
        self.answered.close();
        let created = match self.answered.try_recv() {
            // Answered, but not read: withdrawn here.
            Ok(Ok(Some(revision))) => revision,
            Err(oneshot::error::TryRecvError::Empty) => return,
            Ok(_) | Err(oneshot::error::TryRecvError::Closed) => {
                self.withdrawing.clear(&self.candidate.key);
                return;
            }
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (keys, candidate) = (Arc::clone(&self.keys), self.candidate.clone());
            let withdrawing = Arc::clone(&self.withdrawing);
            runtime.spawn(async move {
                candidate.clone().withdraw(keys, created).await;
                withdrawing.clear(&candidate.key);
            });
        }
    }
}

impl CandidateKey {
    /// Commits `checks` with the put of this key, valued `value`. A
    /// commit that does not answer at once (a store across a network)
    /// goes on as a task of its own: dropped before it answers, the caller
    /// leaves it to learn whether the key was created, and to withdraw it
    /// if so. One that answers at once (the memory store) has nothing on
    /// the way, and takes no task.
    pub(super) async fn create<K: Keys>(
        &self,
        keys: &Arc<K>,
        withdrawing: &Arc<Withdrawing>,
        checks: Vec<Check>,
        value: String,
    ) -> Result<Option<Revision>> {
        let put = Write::Put {
            key: self.key.clone(),
            value,
            session: Some(self.session),
        };
        let task_keys = Arc::clone(keys);
        let mut commit: Pin<Box<dyn Future<Output = _> + Send>> =
            Box::pin(async move { task_keys.commit(&checks, &[put]).await });
        // Polled once here, with no one to wake: if it is not done, the
        // task polls it again with its own waker.
        if let Poll::Ready(created) = commit
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            return created;
        }
        let (answer, answered) = oneshot::channel();
        let (task_keys, candidate) = (Arc::clone(keys), self.clone());
        let task_withdrawing = Arc::clone(withdrawing);
        tokio::spawn(async move {
            let created = commit.await;
            if let Err(abandoned) = answer.send(created) {
                if let Ok(Some(revision)) = abandoned {
                    candidate.clone().withdraw(task_keys, revision).await;
                }
                task_withdrawing.clear(&candidate.key);
            }
        });
        let mut awaiting = Awaiting {
            answered,
            keys: Arc::clone(keys),
            candidate: self.clone(),
            withdrawing: Arc::clone(withdrawing),
            done: false,
        };
        let answer = (&mut awaiting.answered).await;
        awaiting.done = true;
        answer.map_err(|_| Error::Unavailable {
            reason: "the campaign's request was abandoned".into(),
            source: None,
        })?
    }

    /// Withdraws the key created at `revision`, retried until the store
    /// answers; never a later key of the same name.
    async fn withdraw<K: Keys>(self, keys: Arc<K>, revision: Revision) {
        cleanup::until_done("withdraw a dropped campaign's key", || {
            let keys = Arc::clone(&keys);
            let candidate = self.clone();
            async move {
                let Some(key) = candidate.made(&*keys, revision).await? else {
                    return Ok(());
                };
                let check = Check::Created {
                    key: key.clone(),
                    revision,
                    session: Some(candidate.session),
                };
                keys.commit(&[check], &[Write::Delete(key)]).await.map(drop)
            }
        })
        .await;
    }

    /// The key the creation at `revision` made: `key`, or the key the
    /// store named, if it is still there.
    async fn made<K: Keys>(&self, keys: &K, revision: Revision) -> Result<Option<String>> {
        let Some(line) = &self.line else {
            return Ok(Some(self.key.clone()));
        };
        let range = keys.range(line).await?;
        Ok((range.entries.into_iter())
            .find(|e| e.session == Some(self.session) && e.created == revision)
            .map(|e| e.key))
    }

    /// Withdraws the key created at `revision` if the guard is dropped
    /// armed; the key counts as being withdrawn from the drop on.
    pub(super) fn withdraw_on_drop<K: Keys>(
        &self,
        keys: &Arc<K>,
        withdrawing: &Arc<Withdrawing>,
        revision: Revision,
    ) -> OnDrop<(Arc<K>, CandidateKey, Arc<Withdrawing>)> {
        OnDrop::new(
            (Arc::clone(keys), self.clone(), Arc::clone(withdrawing)),
            move |(keys, candidate, withdrawing): (Arc<K>, CandidateKey, Arc<Withdrawing>)| {
                withdrawing.mark(&candidate.key);
                async move {
                    candidate.clone().withdraw(keys, revision).await;
                    withdrawing.clear(&candidate.key);
                }
            },
        )
    }
}
