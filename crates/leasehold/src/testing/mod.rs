//! For backend implementers and tests: the shared conformance suite every
//! store runs, and fault-injecting wrappers (cargo feature `testing`).

pub mod conformance;
mod counting;
mod faults;
mod groups;
pub mod keys;
mod planned;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

pub use crate::store::watch_driver::{
    fail_watch_reads, failed_watch_reads, heal_watch_reads, watch_reads, watch_reads_of,
};
pub use counting::{CountingStore, Counts};
pub use faults::FaultyStore;
pub use planned::a_line_on_one_handle_reads_only_at_its_front;

use crate::names::ElectionName;
use crate::store::Store;

/// Gives the conformance suite handles onto the store under test.
#[async_trait]
pub trait StoreHarness: Send + Sync {
    /// A new handle onto the store under test; every handle sees the same
    /// data (for SQLite: a new connection to the same file, as another
    /// process would have).
    async fn open(&self) -> Arc<dyn Store>;

    /// Whether the data survives dropping every handle and opening again.
    fn durable(&self) -> bool;

    /// Whether the store grants an uncontended campaign with one request
    /// ([`Store::try_campaign_unwaited`]) rather than never (the default).
    fn campaigns_unwaited(&self) -> bool {
        false
    }
}

/// A [`StoreHarness`] over a running server (in leasehold's own tests, an
/// `EtcdCluster`, a `ZooKeeperServer` or a `PostgresServer` of the
/// workspace's test kit, `leasehold-testkit`): every handle opens the store
/// URL anew; the server lives as long as the harness.
#[derive(Debug)]
pub struct ServerHarness<S> {
    server: S,
    url: crate::store::StoreUrl,
}

impl<S> ServerHarness<S> {
    /// A harness opening `url` (panics on a bad URL: test support).
    pub fn new(server: S, url: &str) -> Self {
        ServerHarness {
            server,
            url: url.parse().expect("a valid store URL"),
        }
    }

    /// The server under test.
    pub fn server(&self) -> &S {
        &self.server
    }
}

#[async_trait]
impl<S: Send + Sync> StoreHarness for ServerHarness<S> {
    async fn open(&self) -> Arc<dyn Store> {
        crate::store::open(&self.url, crate::store::Access::ReadWrite)
            .await
            .unwrap_or_else(|e| panic!("open {}: {e}", self.url))
    }

    fn durable(&self) -> bool {
        true
    }

    fn campaigns_unwaited(&self) -> bool {
        match &self.url {
            crate::store::StoreUrl::Etcd(c) | crate::store::StoreUrl::ZooKeeper(c) => {
                c.layout() == crate::store::Layout::Leasehold
            }
            crate::store::StoreUrl::Postgres(_) => true,
            _ => false,
        }
    }
}

/// Runs [`campaign_until_granted`] in a task: when it was granted, the
/// leadership, and the elector (which must outlive the leadership).
pub fn spawn_campaign(
    elector: crate::Elector,
    election: ElectionName,
) -> tokio::task::JoinHandle<(tokio::time::Instant, crate::Leadership, crate::Elector)> {
    tokio::spawn(async move {
        let leadership = campaign_until_granted(&elector, &election).await;
        (tokio::time::Instant::now(), leadership, elector)
    })
}

/// An election name no other test uses.
pub fn unique_election(prefix: &str) -> ElectionName {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    ElectionName::new(format!("{prefix}-{}-{n}", std::process::id()))
        .expect("test election names are valid")
}

/// Opens a session with `ttl` on `store` and campaigns on it for
/// `election` as `who`; panics on any error (test support).
pub async fn campaign_on_new_session(
    store: &dyn Store,
    election: &ElectionName,
    who: &str,
    ttl: std::time::Duration,
) -> crate::store::Grant {
    let lease = store.open_session(ttl).await.expect("open a session");
    let candidate = crate::names::CandidateId::new(who).expect("a valid candidate id");
    store
        .campaign(lease.id, election, &candidate)
        .await
        .expect("campaign")
}

/// Campaigns until granted, retrying after any store error (an outage a
/// test injects on purpose); panics on invalid input (test support).
pub async fn campaign_until_granted(
    elector: &crate::Elector,
    election: &ElectionName,
) -> crate::Leadership {
    loop {
        match elector.campaign(election).await {
            Ok(leadership) => return leadership,
            Err(error @ crate::Error::InvalidInput { .. }) => panic!("campaign: {error}"),
            Err(error) => {
                tracing::debug!(%error, "campaign failed; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Generates one `#[tokio::test]` per conformance case. `$harness` is an
/// expression evaluating to a future of a [`StoreHarness`]; it is evaluated
/// once per test.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::conformance_tests!(@cases $harness;
            one_winner_among_concurrent_candidates,
            tokens_strictly_increase,
            no_takeover_before_expiry,
            renewal_after_expiry_fails,
            resign_never_removes_a_successor,
            an_orphaned_grant_is_released_from_another_handle,
            a_release_by_another_session_of_one_id_changes_nothing,
            two_electors_of_one_id_never_lead_together,
            observe_sees_leader_release_and_successor,
            watch_ignores_renewals,
            a_holder_of_many_reads_nothing_per_period,
            watch_retries_a_failed_read,
            closing_a_session_releases_its_grants,
            cancelled_campaign_does_not_hold,
            a_campaign_dropped_at_any_point_never_holds,
            invalid_input_is_rejected,
            elections_are_listed,
            elector_loses_leadership_when_renewals_fail,
            elector_steps_down_before_a_successor_is_granted,
            watch_status_is_unknown_while_reads_fail,
            notes_are_ordered_and_end_with_their_session,
            notes_watch_sees_puts_deletes_and_expiries,
            a_note_is_amended_in_place_and_watched_alone,
            releases_are_recorded_and_expiries_are_not,
            transfer_goes_to_the_named_standby,
            transfer_without_a_name_goes_to_the_first_in_line,
            transfer_to_an_unknown_candidate_is_refused,
            a_transfer_to_a_standby_that_cannot_take_it_up_times_out,
            priority_preempts_after_the_settling_period,
            equal_priorities_never_preempt,
            the_highest_priority_standby_is_granted_first,
            a_standby_whose_campaign_ends_leaves_the_line_despite_a_failure,
            lock_delay_after_expiry_not_after_release,
            a_transfer_wakes_only_the_front_of_the_line,
            an_unwaited_campaign_takes_only_a_free_election,
            shards_balance_and_move_only_what_they_must,
            a_group_refuses_another_count,
            slots_hold_at_most_k,
            a_member_that_leaves_is_gone_at_once,
            a_group_is_never_transferred,
        );
    };
    // A store laid out as another election recipe (`?layout=`): every
    // case of one election, and the refusal of what only leasehold's own
    // layout keeps (notes: the line, transfers, priorities, groups; the
    // list of elections).
    (@recipe $harness:expr) => {
        $crate::conformance_tests!(@cases $harness;
            one_winner_among_concurrent_candidates,
            tokens_strictly_increase,
            no_takeover_before_expiry,
            renewal_after_expiry_fails,
            resign_never_removes_a_successor,
            an_orphaned_grant_is_released_from_another_handle,
            a_release_by_another_session_of_one_id_changes_nothing,
            two_electors_of_one_id_never_lead_together,
            observe_sees_leader_release_and_successor,
            watch_ignores_renewals,
            a_holder_of_many_reads_nothing_per_period,
            watch_retries_a_failed_read,
            closing_a_session_releases_its_grants,
            cancelled_campaign_does_not_hold,
            invalid_input_is_rejected,
            elector_loses_leadership_when_renewals_fail,
            elector_steps_down_before_a_successor_is_granted,
            watch_status_is_unknown_while_reads_fail,
            a_recipe_layout_refuses_what_only_leasehold_keeps,
        );
    };
    (@cases $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $harness.await;
                $crate::testing::conformance::$case(&harness).await;
            }
        )*
    };
}
