//! The store every simulated candidate shares: the memory store, with
//! every grant it makes written to the history.

use super::*;

/// Records, at the store, every grant in the order the store makes it.
#[derive(Debug)]
pub(super) struct GrantLog {
    pub(super) store: MemoryStore,
    pub(super) history: Arc<Mutex<History>>,
}

impl GrantLog {
    pub(super) fn record(&self, grant: &Grant) {
        let granted = Granted {
            shard: shard_of(&grant.election),
            candidate: candidate_index(&grant.candidate),
            token: grant.token.0,
        };
        let mut history = lock(&self.history);
        // A campaign repeated after a lost reply gets the same grant again.
        if !history
            .grants
            .iter()
            .any(|g| g.shard == granted.shard && g.token == granted.token)
        {
            history.grants.push(granted);
        }
    }
}

impl Wrapper for GrantLog {
    fn inner(&self) -> &dyn Store {
        &self.store
    }

    fn granted<'a>(&'a self, grant: &'a Grant) -> Request<'a, ()> {
        self.record(grant);
        Box::pin(async { Ok(()) })
    }
}
