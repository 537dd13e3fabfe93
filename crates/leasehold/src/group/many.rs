//! Watches on the holders of many elections at once, as one stream.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::error::Result;
use crate::names::ElectionName;
use crate::store::{Leader, LeaderWatch, Store};

/// How many watches open at once.
const OPENING: usize = 32;

/// The holders of a list of elections, kept up to date from one watch
/// each; [`LeaderWatches::changed`] yields the index of each election
/// whose holder changed. Dropping it stops the watches.
#[derive(Debug)]
pub(crate) struct LeaderWatches {
    holders: Vec<Option<Leader>>,
    changes: mpsc::UnboundedReceiver<(usize, Option<Leader>)>,
    _tasks: JoinSet<()>,
}

impl LeaderWatches {
    /// Opens a watch on each of `elections`, [`OPENING`] at a time.
    pub(crate) async fn open(store: &Arc<dyn Store>, elections: &[ElectionName]) -> Result<Self> {
        let (tx, changes) = mpsc::unbounded_channel();
        let mut tasks = JoinSet::new();
        let mut watches: Vec<LeaderWatch> = Vec::with_capacity(elections.len());
        for chunk in elections.chunks(OPENING) {
            let mut opening = JoinSet::new();
            for (i, election) in chunk.iter().enumerate() {
                let (store, election) = (Arc::clone(store), election.clone());
                opening.spawn(async move { (i, store.watch(&election).await) });
            }
            let mut opened: Vec<(usize, Result<LeaderWatch>)> = opening.join_all().await;
            opened.sort_by_key(|(i, _)| *i);
            for (_, watch) in opened {
                watches.push(watch?);
            }
        }
        let mut holders = Vec::with_capacity(elections.len());
        for (index, mut watch) in watches.into_iter().enumerate() {
            holders.push(watch.borrow_and_update().clone());
            let tx = tx.clone();
            tasks.spawn(async move {
                while watch.changed().await.is_ok() {
                    let holder = watch.borrow_and_update().clone();
                    if tx.send((index, holder)).is_err() {
                        return;
                    }
                }
            });
        }
        Ok(LeaderWatches {
            holders,
            changes,
            _tasks: tasks,
        })
    }

    /// The holders as last seen, one per election.
    pub(crate) fn holders(&self) -> &[Option<Leader>] {
        &self.holders
    }

    /// Waits for a change of holder, and takes every change that came
    /// with it; the indices of the elections that changed.
    pub(crate) async fn changed(&mut self) -> Vec<usize> {
        let Some((index, holder)) = self.changes.recv().await else {
            return std::future::pending().await;
        };
        let mut changed = vec![index];
        self.holders[index] = holder;
        while let Ok((index, holder)) = self.changes.try_recv() {
            self.holders[index] = holder;
            changed.push(index);
        }
        changed
    }
}
