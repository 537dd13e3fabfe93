//! What `run` (or `sidecar`) knows about its own leadership, for
//! `/status`, `/metrics` and the leadership events of `/watch`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold::{FencingToken, RenewalEvent, RenewalObserver, Session};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use tokio::sync::broadcast;

use crate::watch::{Change, LeadershipEvent, millis};

/// Why a term of leadership ended, as a metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepDown {
    /// No renewal confirmed before the lease deadline.
    DeadlineExpired,
    /// The store expired the session.
    SessionExpired,
    /// The store shows the grant gone or another holder.
    Superseded,
    /// Renewals were failing; the command was stopped before the deadline.
    AtRisk,
    /// `run` was told to stop (SIGTERM/SIGINT).
    Stopped,
    /// The command exited by itself.
    CommandExited,
    /// Handed over on request (a transfer, a higher priority).
    HandedOver,
    /// Any other end (session closed, resigned elsewhere).
    Other,
}

impl StepDown {
    /// Every reason, so that each counter is exported (at 0) from the start:
    /// a series that appears only with its first increment breaks `rate()`
    /// and alerts on `absent()`.
    pub const ALL: [StepDown; 8] = [
        StepDown::DeadlineExpired,
        StepDown::SessionExpired,
        StepDown::Superseded,
        StepDown::AtRisk,
        StepDown::Stopped,
        StepDown::CommandExited,
        StepDown::HandedOver,
        StepDown::Other,
    ];

    pub fn from_lost(reason: &leasehold::LostReason) -> Self {
        use leasehold::LostReason as L;
        match reason {
            L::DeadlineExpired { .. } => StepDown::DeadlineExpired,
            L::SessionExpired => StepDown::SessionExpired,
            L::Superseded => StepDown::Superseded,
            L::HandedOver => StepDown::HandedOver,
            _ => StepDown::Other,
        }
    }

    fn label(self) -> &'static str {
        match self {
            StepDown::DeadlineExpired => "deadline_expired",
            StepDown::SessionExpired => "session_expired",
            StepDown::Superseded => "superseded",
            StepDown::AtRisk => "at_risk",
            StepDown::Stopped => "stopped",
            StepDown::CommandExited => "command_exited",
            StepDown::HandedOver => "handed_over",
            StepDown::Other => "other",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// The current term, if leading.
#[derive(Debug)]
struct Term {
    token: FencingToken,
    session: Arc<Session>,
}

/// Metrics and leadership state of one runner.
#[derive(Debug)]
pub struct RunnerMetrics {
    registry: Registry,
    term: Mutex<Option<Term>>,
    is_leader: Gauge,
    token: Gauge,
    transitions: Counter,
    step_downs: Family<ReasonLabel, Counter>,
    renewal_seconds: Histogram,
    renewal_failures: Counter,
    lease_remaining: Gauge<f64, AtomicU64>,
    waiting: Gauge,
    shards_owned: Gauge,
    shards_gained: Counter,
    shards_released: Family<ReasonLabel, Counter>,
    group_members: Gauge,
    group: Mutex<Option<leasehold::watch::Receiver<leasehold::admin::GroupView>>>,
    /// Where `/watch` hears of this runner's leadership.
    changes: broadcast::Sender<Change>,
    /// This runner's candidate id.
    candidate: String,
}

/// `value` as a label value in the Prometheus and OpenMetrics text
/// formats: `\`, `"` and a newline escaped. prometheus-client writes label
/// values as given, so every dynamic value goes through this first; else
/// a candidate id such as `a",election="x` would add a label, and one
/// with a `"` or `\` would make every series of the scrape unreadable.
fn label_value(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped
}

impl RunnerMetrics {
    pub fn new(election: &str, candidate: &str) -> Arc<Self> {
        let mut registry = Registry::with_prefix_and_labels(
            "leasehold",
            [
                ("election".into(), label_value(election).into()),
                ("candidate".into(), label_value(candidate).into()),
            ]
            .into_iter(),
        );
        let metrics = RunnerMetrics {
            term: Mutex::new(None),
            is_leader: Gauge::default(),
            token: Gauge::default(),
            transitions: Counter::default(),
            step_downs: Family::default(),
            // 0.5 ms … 16 s.
            renewal_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            renewal_failures: Counter::default(),
            lease_remaining: Gauge::default(),
            waiting: Gauge::default(),
            shards_owned: Gauge::default(),
            shards_gained: Counter::default(),
            shards_released: Family::default(),
            group_members: Gauge::default(),
            group: Mutex::new(None),
            changes: broadcast::channel(crate::watch::BACKLOG).0,
            candidate: candidate.to_owned(),
            registry: Registry::default(),
        };
        metrics.register_leadership(&mut registry);
        metrics.register_renewals(&mut registry);
        metrics.register_shards(&mut registry);
        Arc::new(RunnerMetrics {
            registry,
            ..metrics
        })
    }

    /// The leadership series: whether it leads, the token, transitions and
    /// step-downs.
    fn register_leadership(&self, registry: &mut Registry) {
        registry.register(
            "is_leader",
            "1 while this runner holds the election (with --shards: owns a shard), else 0",
            self.is_leader.clone(),
        );
        registry.register(
            "fencing_token",
            "The fencing token of the current term (0 when not leading)",
            self.token.clone(),
        );
        registry.register(
            "leadership_transitions",
            "Times this runner became leader or stopped being leader",
            self.transitions.clone(),
        );
        for why in StepDown::ALL {
            // The guard is dropped at once: only the series' creation matters.
            drop(self.step_downs.get_or_create(&ReasonLabel {
                reason: why.label(),
            }));
        }
        registry.register(
            "step_downs",
            "Terms of leadership that ended, by reason",
            self.step_downs.clone(),
        );
    }

    /// The renewal series: round trips, failures, the lease left, the line.
    fn register_renewals(&self, registry: &mut Registry) {
        registry.register(
            "renewal_duration_seconds",
            "Round trip of each lease renewal to the store",
            self.renewal_seconds.clone(),
        );
        registry.register(
            "renewal_failures",
            "Lease renewals that failed (retried until the deadline)",
            self.renewal_failures.clone(),
        );
        registry.register(
            "lease_remaining_seconds",
            "Time left until the leader's conservative lease deadline (0 when not leading)",
            self.lease_remaining.clone(),
        );
        registry.register(
        "waiting_candidates",
        "Candidates waiting in the election's line of standbys (the leader excluded), as this runner last read it",
        self.waiting.clone(),
    );
    }

    /// The `--shards` series: shards owned, gained and released, the members.
    fn register_shards(&self, registry: &mut Registry) {
        registry.register(
            "shards_owned",
            "With --shards: the shards this runner owns now",
            self.shards_owned.clone(),
        );
        registry.register(
            "shards_gained",
            "With --shards: shards this runner was granted (moves to it)",
            self.shards_gained.clone(),
        );
        for why in StepDown::ALL {
            drop(self.shards_released.get_or_create(&ReasonLabel {
                reason: why.label(),
            }));
        }
        registry.register(
        "shards_released",
        "With --shards: shards this runner gave up or lost, by reason (handed_over: moved to another member)",
        self.shards_released.clone(),
    );
        registry.register(
            "group_members",
            "With --shards: the members of the group, as this runner last saw them",
            self.group_members.clone(),
        );
    }

    /// An observer that feeds the renewal histogram and failure counter.
    pub fn renewal_observer(self: &Arc<Self>) -> RenewalObserver {
        let metrics = Arc::clone(self);
        RenewalObserver::new(move |event| match event {
            RenewalEvent::Renewed { round_trip, .. } => {
                metrics.renewal_seconds.observe(round_trip.as_secs_f64());
                if let Some((token, left)) = metrics.leading() {
                    metrics.tell("renewed", Some(token.0), Some(left), None);
                }
            }
            RenewalEvent::Failed { .. } => {
                metrics.renewal_failures.inc();
            }
            _ => {}
        })
    }

    pub fn became_leader(&self, token: FencingToken, session: Arc<Session>) {
        *self.term.lock().unwrap_or_else(PoisonError::into_inner) = Some(Term { token, session });
        self.is_leader.set(1);
        self.token.set(i64::try_from(token.0).unwrap_or(i64::MAX));
        self.transitions.inc();
        let left = self.leading().map(|(_, left)| left);
        self.tell("gained", Some(token.0), left, None);
    }

    /// The term ended, for `reason` (told to `/watch`).
    pub fn stepped_down(&self, why: StepDown, reason: &str) {
        let ended = self
            .term
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        self.tell("lost", ended.map(|t| t.token.0), None, Some(reason));
        self.is_leader.set(0);
        self.token.set(0);
        self.transitions.inc();
        self.step_downs
            .get_or_create(&ReasonLabel {
                reason: why.label(),
            })
            .inc();
    }

    /// A shard was granted (`run --shards`).
    pub fn shard_gained(&self) {
        self.shards_owned.inc();
        self.shards_gained.inc();
    }

    /// A shard's term ended.
    pub fn shard_released(&self, why: StepDown) {
        self.shards_owned.dec();
        self.shards_released
            .get_or_create(&ReasonLabel {
                reason: why.label(),
            })
            .inc();
    }

    /// Reports the group this runner is a member of (`/status`).
    pub fn follow_group(&self, view: leasehold::watch::Receiver<leasehold::admin::GroupView>) {
        *self.group.lock().unwrap_or_else(PoisonError::into_inner) = Some(view);
    }

    /// This runner left its group.
    pub fn follow_group_end(&self) {
        *self.group.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// The group as this runner sees it, if it is a member of one.
    pub fn group(&self) -> Option<leasehold::admin::GroupView> {
        let group = self.group.lock().unwrap_or_else(PoisonError::into_inner);
        group.as_ref().map(|view| view.borrow().clone())
    }

    /// How many candidates wait in the line.
    pub fn set_waiting(&self, waiting: usize) {
        self.waiting.set(i64::try_from(waiting).unwrap_or(i64::MAX));
    }

    /// Tells `/watch` of a change of this runner's leadership.
    fn tell(
        &self,
        change: &'static str,
        token: Option<u64>,
        left: Option<Duration>,
        reason: Option<&str>,
    ) {
        let _ = self.changes.send(Change::Leadership(LeadershipEvent {
            change,
            leading: change != "lost",
            token,
            valid_for_ms: left.map(millis),
            reason: reason.map(str::to_owned),
        }));
    }

    /// This runner's candidate id.
    pub fn candidate(&self) -> &str {
        &self.candidate
    }

    /// Where `/watch` hears of this runner's leadership.
    pub fn changes(&self) -> broadcast::Sender<Change> {
        self.changes.clone()
    }

    /// This runner's leadership now, as `/watch` first tells it.
    pub fn leadership_now(&self) -> LeadershipEvent {
        let leading = self.leading();
        LeadershipEvent {
            change: "state",
            leading: leading.is_some(),
            token: leading.map(|(token, _)| token.0),
            valid_for_ms: leading.map(|(_, left)| millis(left)),
            reason: None,
        }
    }

    /// The current term's token and time left, if this runner leads now.
    pub fn leading(&self) -> Option<(FencingToken, Duration)> {
        let term = self.term.lock().unwrap_or_else(PoisonError::into_inner);
        let term = term.as_ref()?;
        if term.session.ended().is_some() {
            return None;
        }
        let left = term
            .session
            .deadline()
            .checked_duration_since(leasehold::clock::Instant::now())?;
        (!left.is_zero()).then_some((term.token, left))
    }

    /// The metrics in Prometheus text format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let leading = self.leading();
        self.is_leader.set(i64::from(leading.is_some()));
        self.lease_remaining
            .set(leading.map_or(0.0, |(_, left)| left.as_secs_f64()));
        if let Some(group) = self.group() {
            self.group_members
                .set(i64::try_from(group.members.len()).unwrap_or(i64::MAX));
            // A member leads while it owns a shard.
            self.is_leader.set(i64::from(!group.mine.is_empty()));
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::{RunnerMetrics, StepDown};

    /// Every reason's counter is exported at 0 before the first step-down.
    #[test]
    fn every_step_down_reason_is_exported_from_the_start() {
        let text = RunnerMetrics::new("e", "c").encode().expect("encode");
        for why in StepDown::ALL {
            let line = format!(
                "leasehold_step_downs_total{{election=\"e\",candidate=\"c\",reason=\"{}\"}} 0",
                why.label()
            );
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from {text}"
            );
        }
    }

    /// A candidate id holding `"`, `\` or a newline is escaped as the text
    /// format requires, so that it stays one label value: it can neither
    /// add a label (`a",election="forged`) nor break the scrape.
    #[test]
    fn label_values_are_escaped() {
        let text = RunnerMetrics::new("pr", "a\",election=\"forged\\x\ny")
            .encode()
            .expect("encode");
        let line =
            r#"leasehold_is_leader{election="pr",candidate="a\",election=\"forged\\x\ny"} 0"#;
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing from {text}"
        );
        // Every sample is checked for its labels by the scrape test
        // (tests/cli/operability.rs), which reads them as Prometheus does.
    }
}
