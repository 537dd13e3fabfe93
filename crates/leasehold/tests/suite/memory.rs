//! The conformance suite on `memory:`.

use std::sync::Arc;

use async_trait::async_trait;
use leasehold::ElectionName;
use leasehold::store::Store;
use leasehold::store::memory::MemoryStore;
use leasehold::testing::StoreHarness;

struct MemoryHarness(MemoryStore);

#[async_trait]
impl StoreHarness for MemoryHarness {
    async fn open(&self) -> Arc<dyn Store> {
        Arc::new(self.0.clone())
    }

    fn durable(&self) -> bool {
        false
    }

    fn campaigns_unwaited(&self) -> bool {
        true
    }

    async fn set_last_token(&self, election: &ElectionName, last: i64) -> bool {
        let last = u64::try_from(last).expect("a counter is not negative");
        self.0.set_last_token(election, last);
        true
    }

    async fn last_token(&self, election: &ElectionName) -> Option<i64> {
        self.0
            .last_token(election)
            .map(|t| i64::try_from(t).expect("fits"))
    }
}

leasehold::conformance_tests!(async { MemoryHarness(MemoryStore::new()) });

/// The local stores' watches are woken by the handle itself: a line on one
/// handle must not herd (see the case).
#[tokio::test]
async fn a_line_on_one_handle_reads_only_at_its_front() {
    leasehold::testing::a_line_on_one_handle_reads_only_at_its_front(&MemoryHarness(
        MemoryStore::new(),
    ))
    .await;
}

/// A counter at the largest token: the next grant is refused as corrupt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_token_counter_is_corrupt() {
    leasehold::testing::conformance::an_exhausted_token_counter_is_corrupt(&MemoryHarness(
        MemoryStore::new(),
    ))
    .await;
}
