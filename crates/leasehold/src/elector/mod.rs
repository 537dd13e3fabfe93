//! The elector: campaigns on a shared session, hands out [`Leadership`]
//! handles that know their deadline and fire when leadership is lost.

mod leadership;
mod standby;
mod steward;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use crate::clock::{Clock, TokioClock};
use crate::config::LeaseConfig;
use crate::error::{Error, Result};
use crate::lease::{DeadlinePolicy, LostReason};
use crate::names::{CandidateId, ElectionName};
use crate::session::{RenewalObserver, Session};
use crate::store::{Leader, LeaderWatch, StatusWatch, Store};
use standby::Taken;

pub use leadership::Leadership;

/// Pause between attempts to open a leader's watches (monitor, steward).
const WATCH_RETRY: Duration = Duration::from_millis(250);

/// How many fresh sessions one campaign opens before giving up, when each
/// ends before the campaign completes (e.g. the store expires them at once).
const MAX_SESSIONS_PER_CAMPAIGN: usize = 3;

/// Takes part in elections as one candidate, on one store, with one session
/// (lease) shared by all its elections and reopened when it is lost.
#[derive(Debug)]
pub struct Elector {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    config: LeaseConfig,
    candidate: CandidateId,
    session: Mutex<Option<Arc<Session>>>,
    policy: DeadlinePolicy,
    observer: Option<RenewalObserver>,
    planned: Planned,
    /// How many times a campaign of this elector joined the line of each
    /// election: a campaign that left it retries deleting its note only
    /// while no later campaign has joined (and put the note again).
    joins: Arc<std::sync::Mutex<std::collections::HashMap<ElectionName, u64>>>,
}

/// How this elector takes part in planned moves (see [`crate::line`]).
#[derive(Clone, Copy, Debug)]
struct Planned {
    priority: i64,
    preempt_after: Duration,
    lock_delay: Duration,
}

impl Elector {
    /// An elector for `candidate` on `store`; fails if `config` is invalid.
    pub fn new(store: Arc<dyn Store>, candidate: CandidateId, config: LeaseConfig) -> Result<Self> {
        config.validate()?;
        Ok(Elector {
            store,
            clock: Arc::new(TokioClock),
            config,
            candidate,
            session: Mutex::new(None),
            joins: Arc::default(),
            policy: DeadlinePolicy::Conservative,
            observer: None,
            planned: Planned {
                priority: 0,
                preempt_after: config.renew_every,
                lock_delay: Duration::ZERO,
            },
        })
    }

    /// Campaigns with `priority` (default 0): among waiting candidates the
    /// highest priority is granted first, and while this candidate leads,
    /// a waiting candidate of strictly higher priority takes over by a
    /// graceful handover once it has waited [`Elector::with_preempt_after`].
    /// Equal priorities never preempt.
    pub fn with_priority(mut self, priority: i64) -> Self {
        self.planned.priority = priority;
        self
    }

    /// While this candidate leads, how long a waiting candidate of higher
    /// priority must have waited (as this process saw it) before this
    /// leader hands over to it; default the renewal period. A replica that
    /// restarts joins the line anew, so a crash-looping one never makes
    /// the leader flap.
    pub fn with_preempt_after(mut self, settle: Duration) -> Self {
        self.planned.preempt_after = settle;
        self
    }

    /// After the previous leader's lease *expired* (it did not release),
    /// waits `delay` before campaigning (default zero): the election stays
    /// unowned meanwhile, so that in-flight requests of a vanished holder
    /// drain from a resource that cannot check fencing tokens. A release
    /// (resign, a handover, a runner stopped with SIGTERM) is not delayed.
    pub fn with_lock_delay(mut self, delay: Duration) -> Self {
        self.planned.lock_delay = delay;
        self
    }

    /// This elector's priority.
    pub fn priority(&self) -> i64 {
        self.planned.priority
    }

    /// Calls `observer` after every renewal of this elector's sessions
    /// (round-trip times for metrics, failures for logs).
    pub fn with_renewal_observer(mut self, observer: RenewalObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Uses `clock` for renewals and deadlines (simulation, tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// **Unsafe, for tests only**: computes the deadline from when a renewal's
    /// reply arrived, plus the full TTL, instead of DESIGN rule 3. Exists so
    /// that the simulation can prove its checkers detect a broken deadline.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn with_unsafe_deadline_from_reply(mut self) -> Self {
        self.policy = DeadlinePolicy::FromReplyUnsafe;
        self
    }

    /// This elector's candidate id.
    pub fn candidate(&self) -> &CandidateId {
        &self.candidate
    }

    /// The lease timing in force.
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// The clock renewals and deadlines follow.
    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The store elections are decided in.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The current live session, opening a new one if there is none or the
    /// last one ended.
    pub async fn session(&self) -> Result<Arc<Session>> {
        let mut current = self.session.lock().await;
        if let Some(session) = current.as_ref().filter(|s| s.over_now().is_none()) {
            return Ok(Arc::clone(session));
        }
        let session = Arc::new(
            Session::open_with(
                Arc::clone(&self.store),
                Arc::clone(&self.clock),
                self.config,
                self.policy,
                self.observer.clone(),
            )
            .await?,
        );
        tracing::debug!(session = %session.id(), candidate = %self.candidate, "session opened");
        *current = Some(Arc::clone(&session));
        Ok(session)
    }

    /// Resolves when this candidate holds `election`.
    ///
    /// Waits while another candidate holds it. If the session is lost while
    /// waiting, a new one is opened and the campaign goes on. Dropping the
    /// future withdraws the candidacy.
    pub async fn campaign(&self, election: &ElectionName) -> Result<Leadership> {
        self.campaign_as(election, true).await
    }

    /// Campaigns for `election` without the line of standbys: straight to
    /// the store's compare-and-swap, with no notes and no steward (a
    /// group's shards and slots, which one member at a time asks for).
    pub(crate) async fn campaign_direct(&self, election: &ElectionName) -> Result<Leadership> {
        self.campaign_as(election, false).await
    }

    /// Campaigns for `election` on `session` alone, straight to the
    /// store's compare-and-swap (a shard, whose member note is on that
    /// session): never opens another session, and fails with
    /// [`Error::SessionExpired`] once that one ends.
    pub(crate) async fn campaign_on(
        &self,
        session: Arc<Session>,
        election: &ElectionName,
    ) -> Result<Leadership> {
        let outcome = tokio::select! {
            biased;
            outcome = self.store.campaign(session.id(), election, &self.candidate) => outcome,
            _ = session.lost() => Err(Error::SessionExpired(session.id())),
        };
        match outcome {
            Ok(grant) => Ok(self.lead(grant, session, Taken::WithoutLine)),
            Err(error) => {
                if matches!(error, Error::SessionExpired(_)) {
                    session.mark_expired();
                }
                Err(error)
            }
        }
    }

    /// The leadership of `grant`, just won on `session`.
    fn lead(&self, grant: crate::store::Grant, session: Arc<Session>, taken: Taken) -> Leadership {
        tracing::info!(election = %grant.election, id = %self.candidate, token = grant.token.0, "became leader");
        let planned = (taken != Taken::WithoutLine).then_some(self.planned);
        Leadership::start(
            grant,
            session,
            Arc::clone(&self.store),
            planned,
            taken == Taken::Unwaited,
        )
    }

    async fn campaign_as(&self, election: &ElectionName, in_line: bool) -> Result<Leadership> {
        let mut last_loss = None;
        for _ in 0..MAX_SESSIONS_PER_CAMPAIGN {
            let session = self.session().await?;
            let outcome = tokio::select! {
                biased;
                outcome = async {
                    if in_line {
                        self.campaign_single(&session, election).await
                    } else {
                        self.store.campaign(session.id(), election, &self.candidate).await.map(|g| (g, Taken::WithoutLine))
                    }
                } => outcome,
                reason = session.lost() => {
                    last_loss = Some(reason);
                    continue;
                }
            };
            match outcome {
                Ok((grant, taken)) => return Ok(self.lead(grant, session, taken)),
                Err(Error::SessionExpired(_)) => {
                    session.mark_expired();
                    last_loss = Some(LostReason::SessionExpired);
                }
                Err(error) => return Err(error),
            }
        }
        Err(Error::Unavailable {
            reason: format!(
                "{MAX_SESSIONS_PER_CAMPAIGN} sessions in a row ended before the campaign for {election} completed \
                 (last: {})",
                last_loss.map_or_else(|| "unknown".to_owned(), |r| r.to_string())
            ),
            source: None,
        })
    }

    /// The current leader of `election`, as the store sees it.
    pub async fn leader(&self, election: &ElectionName) -> Result<Option<Leader>> {
        self.store.leader(election).await
    }

    /// Watches `election`'s leader: the receiver always holds the latest
    /// status (a slow reader may skip states, never the last), and says
    /// when the store cannot be read ([`crate::LeaderStatus::Unknown`]),
    /// then the leader once it can, so that a follower never acts on a
    /// leader who may have stepped down meanwhile.
    pub async fn observe(&self, election: &ElectionName) -> Result<StatusWatch> {
        self.store.watch_status(election).await
    }

    /// Watches `election`'s leader as [`Elector::observe`] does, but keeps
    /// the last leader it read while the store cannot be read: for showing
    /// who led last (a dashboard, a log), never for deciding who leads now.
    pub async fn observe_last_known(&self, election: &ElectionName) -> Result<LeaderWatch> {
        self.store.watch(election).await
    }

    /// Closes the session, releasing every election this elector holds.
    pub async fn close(&self) -> Result<()> {
        let session = self.session.lock().await.take();
        match session {
            Some(session) => session.close().await,
            None => Ok(()),
        }
    }
}

/// Why a leader is asked to hand over ([`Leadership::handover_requested`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandoverCause {
    /// Someone asked for it ([`crate::transfer::request_transfer`],
    /// `leasehold transfer`).
    Transfer,
    /// A waiting candidate of higher priority waited out the settling
    /// period.
    Preemption {
        /// Its priority.
        priority: i64,
    },
}

impl std::fmt::Display for HandoverCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandoverCause::Transfer => f.write_str("a transfer request"),
            HandoverCause::Preemption { priority } => {
                write!(f, "a waiting candidate of higher priority ({priority})")
            }
        }
    }
}

/// A request that this leader hand over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handover {
    /// Why.
    pub cause: HandoverCause,
    /// The standby chosen to take over; `None` when nobody waits (the
    /// first to campaign then takes over).
    pub to: Option<CandidateId>,
}
