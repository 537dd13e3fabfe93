//! The conformance suites on `memory:`: the elections written once over
//! the store primitive, and the primitive itself, on its reference in
//! memory.

use std::sync::Arc;

use async_trait::async_trait;
use leasehold::backend::memory::MemoryKeys;
use leasehold::backend::memory::MemoryStore;
use leasehold::store::Store;
use leasehold::testing::StoreHarness;
use leasehold::testing::keys::KeysHarness;

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

/// The memory store's watches are woken by its own writes: a line on one
/// handle must not herd (see the case).
#[tokio::test]
async fn a_line_on_one_handle_reads_only_at_its_front() {
    leasehold::testing::a_line_on_one_handle_reads_only_at_its_front(&MemoryHarness(
        MemoryStore::new(),
    ))
    .await;
}

/// The primitive's own conformance suite, on its reference.
mod primitive {
    use super::*;

    struct Memory(MemoryKeys);

    #[async_trait]
    impl KeysHarness for Memory {
        type Keys = MemoryKeys;

        async fn open(&self) -> Arc<MemoryKeys> {
            Arc::new(self.0.clone())
        }
    }

    leasehold::keys_conformance_tests!(async { Memory(MemoryKeys::new()) });
}
