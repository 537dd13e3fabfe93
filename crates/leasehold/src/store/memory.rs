//! `memory:` — an in-process store, for library use and tests: the
//! elections written once over the store primitive ([`KeyedStore`]), on
//! the primitive's reference in memory ([`MemoryKeys`]).
//!
//! Expiry runs on an injectable [`Clock`], so tests can drive it under
//! simulated time.

use std::sync::Arc;

use crate::clock::Clock;
use crate::store::keyed::KeyedStore;
use crate::store::keys::memory::MemoryKeys;

/// An in-process store. Cloning gives another handle onto the same state.
pub type MemoryStore = KeyedStore<MemoryKeys>;

impl Default for KeyedStore<MemoryKeys> {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl KeyedStore<MemoryKeys> {
    /// A store whose expiry follows the host's monotonic clock.
    pub fn new() -> Self {
        KeyedStore::over(MemoryKeys::new())
    }

    /// A store whose expiry follows `clock` (the store's own notion of time).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        KeyedStore::over(MemoryKeys::with_clock(clock))
    }
}
