//! One way to take a [`Mutex`] whose holder may have panicked.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, using a poisoned lock as it is: for state that a panic
/// while the lock was held cannot leave half-changed. The lease core is
/// such state (each `handle` call completes or changes nothing that
/// matters for safety), and so is every map and counter this crate keeps
/// behind a mutex (each change is one insertion, removal or assignment).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
