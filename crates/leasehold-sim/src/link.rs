//! The simulated network between one candidate and the store: every call
//! crosses it with a delay each way, and can be lost, refused (partition),
//! held (the candidate is paused) or swallowed (the candidate crashed). A
//! paused or cut-off candidate also hears nothing of its watches until it
//! resumes or the partition heals.
//! The host's witness of the candidate's death calls the store over the
//! same network (the host's partitions, losses and delays), but it is
//! another process: neither paused nor dead with the candidate.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use leasehold::clock::Instant;
use leasehold::store::{
    ElectionState, FencingToken, Grant, Leader, LeaderWatch, Note, NoteWatch, SessionId,
    SessionLease, StatusWatch, Store,
};
use leasehold::{CandidateId, ElectionName, Error, Result};

use leasehold_testkit::Rng;

/// How often a watch held by a partition looks whether it has healed.
const PARTITION_POLL: Duration = Duration::from_millis(10);

/// How long a client waits for a lost message before giving up.
const LOSS_TIMEOUT: Duration = Duration::from_millis(300);

fn unavailable(reason: &str) -> Error {
    Error::Unavailable {
        reason: reason.into(),
        source: None,
    }
}

#[derive(Debug, Default)]
struct Faults {
    /// Overlapping partitions (one candidate's, or the store's outage).
    partitions: u32,
    crashed: bool,
    paused_until: Option<Instant>,
    loss: f64,
}

fn lock_faults(faults: &Mutex<Faults>) -> std::sync::MutexGuard<'_, Faults> {
    faults.lock().unwrap_or_else(|p| p.into_inner())
}

/// One candidate's link to the store.
#[derive(Debug)]
pub struct Link {
    store: Arc<dyn Store>,
    rng: Mutex<Rng>,
    max_delay: Duration,
    faults: Arc<Mutex<Faults>>,
}

/// Who calls the store over a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// The candidate itself: paused and crashed with it.
    Candidate,
    /// The host's witness of the candidate's death (another process).
    Witness,
}

impl Link {
    pub fn new(store: Arc<dyn Store>, seed: u64, max_delay: Duration) -> Self {
        Link {
            store,
            rng: Mutex::new(Rng::new(seed)),
            max_delay,
            faults: Arc::new(Mutex::new(Faults::default())),
        }
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        lock_faults(&self.faults)
    }

    pub fn set_partitioned(&self, on: bool) {
        let mut faults = self.faults();
        if on {
            faults.partitions += 1;
        } else {
            faults.partitions = faults.partitions.saturating_sub(1);
        }
    }

    /// Ends every fault: the network is healthy again.
    pub fn heal(&self) {
        let mut faults = self.faults();
        faults.partitions = 0;
        faults.loss = 0.0;
        faults.paused_until = None;
    }

    pub fn set_loss(&self, p: f64) {
        self.faults().loss = p;
    }

    pub fn crash(&self) {
        self.faults().crashed = true;
    }

    /// Holds every message of this candidate until `until` (a process
    /// pause: nothing it sends leaves, nothing it receives is handled).
    pub fn pause_until(&self, until: Instant) {
        self.faults().paused_until = Some(until);
    }

    fn delay(&self) -> Duration {
        let ms = u64::try_from(self.max_delay.as_millis()).unwrap_or(0);
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        rng.millis(0, ms.max(1))
    }

    fn lost(&self) -> bool {
        let loss = self.faults().loss;
        loss > 0.0
            && self
                .rng
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .chance(loss)
    }

    /// Waits out a pause, then a network delay.
    pub async fn hop(&self) {
        let paused = self.faults().paused_until;
        if let Some(until) = paused {
            tokio::time::sleep_until(until).await;
        }
        tokio::time::sleep(self.delay()).await;
    }

    /// A hop of `caller`: the witness is never paused.
    async fn hop_of(&self, caller: Caller) {
        match caller {
            Caller::Candidate => self.hop().await,
            Caller::Witness => tokio::time::sleep(self.delay()).await,
        }
    }

    /// Whether `caller` is dead: only the candidate dies in a crash.
    fn dead(&self, caller: Caller) -> bool {
        caller == Caller::Candidate && self.faults().crashed
    }

    /// The host's witness releases `grant` after the candidate's death
    /// (guarded by the token, like every release): over this link's
    /// network, but neither paused nor crashed with the candidate.
    pub async fn witness_resign(&self, grant: &Grant) -> Result<()> {
        self.call_as(Caller::Witness, self.store.resign(grant))
            .await
    }

    /// The host's witness removes the dead candidate's note `name` on
    /// `election` (its membership of a group), over this link's network.
    pub async fn witness_delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        self.call_as(
            Caller::Witness,
            self.store.delete_note(session, election, name),
        )
        .await
    }

    /// A call of the candidate.
    async fn call<T>(&self, op: impl Future<Output = Result<T>>) -> Result<T> {
        self.call_as(Caller::Candidate, op).await
    }

    /// A call: request hop, the store's work, reply hop. A lost request or
    /// reply surfaces as a timeout error (the store may or may not have
    /// acted: an ambiguous failure); a crashed candidate hears nothing.
    async fn call_as<T>(&self, caller: Caller, op: impl Future<Output = Result<T>>) -> Result<T> {
        if self.dead(caller) {
            return std::future::pending().await;
        }
        self.hop_of(caller).await;
        if self.dead(caller) {
            return std::future::pending().await;
        }
        if self.faults().partitions > 0 {
            return Err(unavailable("simulated partition"));
        }
        if self.lost() {
            tokio::time::sleep(LOSS_TIMEOUT).await;
            return Err(unavailable("simulated loss of the request"));
        }
        let outcome = op.await;
        self.hop_of(caller).await;
        if self.dead(caller) {
            return std::future::pending().await;
        }
        if self.lost() {
            tokio::time::sleep(LOSS_TIMEOUT).await;
            return Err(unavailable("simulated loss of the reply"));
        }
        outcome
    }
}

#[async_trait]
impl Store for Link {
    async fn open_session(&self, ttl: Duration) -> Result<SessionLease> {
        self.call(self.store.open_session(ttl)).await
    }

    async fn keep_alive(&self, session: SessionId) -> Result<Duration> {
        self.call(self.store.keep_alive(session)).await
    }

    async fn close_session(&self, session: SessionId) -> Result<()> {
        self.call(self.store.close_session(session)).await
    }

    async fn campaign(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Grant> {
        self.call(self.store.campaign(session, election, candidate))
            .await
    }

    async fn try_campaign_unwaited(
        &self,
        session: SessionId,
        election: &ElectionName,
        candidate: &CandidateId,
    ) -> Result<Option<Grant>> {
        self.call(
            self.store
                .try_campaign_unwaited(session, election, candidate),
        )
        .await
    }

    async fn resign(&self, grant: &Grant) -> Result<()> {
        self.call(self.store.resign(grant)).await
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        self.call(self.store.leader(election)).await
    }

    /// The store's watch, seen through this candidate: while it is paused
    /// it handles nothing, and while it is cut off nothing reaches it, so a
    /// change reaches it only when it resumes and the partition heals (the
    /// latest value then); once it crashed, nothing more. (Were it to hear
    /// of a lost grant at once, a holder would step down at once, and a
    /// grant wrongly released under it would go unnoticed.)
    async fn watch(&self, election: &ElectionName) -> Result<LeaderWatch> {
        let store_side = self.call(self.store.watch(election)).await?;
        Ok(through_faults(store_side, Arc::clone(&self.faults)))
    }

    async fn put_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<()> {
        self.call(self.store.put_note(session, election, name, text))
            .await
    }

    async fn delete_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<()> {
        self.call(self.store.delete_note(session, election, name))
            .await
    }

    async fn amend_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
        text: &str,
    ) -> Result<bool> {
        self.call(self.store.amend_note(session, election, name, text))
            .await
    }

    /// The store's one-note watch, seen through this candidate as
    /// [`Link::watch`] sees the leader.
    async fn watch_note(
        &self,
        session: SessionId,
        election: &ElectionName,
        name: &str,
    ) -> Result<NoteWatch> {
        let store_side = self
            .call(self.store.watch_note(session, election, name))
            .await?;
        Ok(through_faults(store_side, Arc::clone(&self.faults)))
    }

    async fn notes(&self, election: &ElectionName) -> Result<Vec<Note>> {
        self.call(self.store.notes(election)).await
    }

    /// The store's notes watch, seen through this candidate as
    /// [`Link::watch`] sees the leader.
    async fn watch_notes(&self, election: &ElectionName) -> Result<NoteWatch> {
        let store_side = self.call(self.store.watch_notes(election)).await?;
        Ok(through_faults(store_side, Arc::clone(&self.faults)))
    }

    async fn last_release(&self, election: &ElectionName) -> Result<Option<FencingToken>> {
        self.call(self.store.last_release(election)).await
    }

    async fn elections(&self) -> Result<Vec<ElectionState>> {
        self.call(self.store.elections()).await
    }

    async fn release_orphaned(&self, grant: &Grant) -> Result<()> {
        self.call(self.store.release_orphaned(grant)).await
    }

    /// The store's watch of a held grant, seen through this candidate as
    /// [`Link::watch`] sees the leader.
    async fn watch_grant(&self, grant: &Grant) -> Result<LeaderWatch> {
        let store_side = self.call(self.store.watch_grant(grant)).await?;
        Ok(through_faults(store_side, Arc::clone(&self.faults)))
    }

    /// The store's status watch, seen through this candidate as
    /// [`Link::watch`] sees the leader.
    async fn watch_status(&self, election: &ElectionName) -> Result<StatusWatch> {
        let store_side = self.call(self.store.watch_status(election)).await?;
        Ok(through_faults(store_side, Arc::clone(&self.faults)))
    }

    /// The notes watch of an unwaited grant's holder, seen through this
    /// candidate as [`Link::watch`] sees the leader.
    async fn watch_notes_since_unwaited(&self, grant: &Grant) -> Result<NoteWatch> {
        let store_side = self
            .call(self.store.watch_notes_since_unwaited(grant))
            .await?;
        Ok(through_faults(store_side, Arc::clone(&self.faults)))
    }

    async fn session_ended(&self, session: SessionId) {
        self.store.session_ended(session).await;
    }

    fn session_lock_file(&self) -> Option<std::fs::File> {
        self.store.session_lock_file()
    }
}

/// A store-side watch as a candidate behind `faults` sees it: while it is
/// paused it handles nothing, and while it is cut off nothing reaches it,
/// so a change reaches it only when it resumes and the partition heals (the
/// latest value then); once it crashed, nothing more. (Were it to hear of a
/// lost grant at once, a holder would step down at once, and a grant
/// wrongly released under it would go unnoticed.)
fn through_faults<T: Clone + Send + Sync + 'static>(
    mut store_side: leasehold::watch::Receiver<T>,
    faults: Arc<Mutex<Faults>>,
) -> leasehold::watch::Receiver<T> {
    let (tx, rx) = leasehold::watch::channel(store_side.borrow_and_update().clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                biased;
                () = tx.closed() => return,
                changed = store_side.changed() => if changed.is_err() { return },
            }
            loop {
                let (paused, cut_off) = {
                    let faults = lock_faults(&faults);
                    (faults.paused_until, faults.partitions > 0)
                };
                match paused {
                    Some(until) if until > Instant::now() => tokio::time::sleep_until(until).await,
                    _ if cut_off => tokio::time::sleep(PARTITION_POLL).await,
                    _ => break,
                }
            }
            if lock_faults(&faults).crashed {
                return;
            }
            let latest = store_side.borrow_and_update().clone();
            if tx.send(latest).is_err() {
                return;
            }
        }
    });
    rx
}
