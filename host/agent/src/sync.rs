//! Locking the agent's shared state.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking over a lock a panicked thread left poisoned: what it
/// guards (statuses, counters, the report) stays usable after a panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
