//! The conformance suite on `memory:`.

use std::sync::Arc;

use async_trait::async_trait;
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
