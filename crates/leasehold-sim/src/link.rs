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

use leasehold::backend::{Call, Request, Wrapper};
use leasehold::clock::Instant;
use leasehold::store::{Grant, SessionId, Store};
use leasehold::{ElectionName, Error, Result};

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

/// Every call crosses the network ([`Link::call`]). Every watch is the
/// store's, seen through this candidate: while it is paused it handles
/// nothing, and while it is cut off nothing reaches it, so a change
/// reaches it only when it resumes and the partition heals (the latest
/// value then); once it crashed, nothing more. (Were it to hear of a lost
/// grant at once, a holder would step down at once, and a grant wrongly
/// released under it would go unnoticed.)
impl Wrapper for Link {
    fn inner(&self) -> &dyn Store {
        &*self.store
    }

    fn around<'a, T: Send + 'a>(&'a self, _: Call, request: Request<'a, T>) -> Request<'a, T> {
        Box::pin(self.call(request))
    }

    fn watched<T: Clone + Send + Sync + 'static>(
        &self,
        _: Call,
        watch: leasehold::watch::Receiver<T>,
    ) -> leasehold::watch::Receiver<T> {
        through_faults(watch, Arc::clone(&self.faults))
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
