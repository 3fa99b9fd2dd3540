//! The test relay's mutexes, locked the one way its threads and its fault
//! injector (`relay`, `fault`) share.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks a mutex, recovering from poisoning: every critical section leaves
/// the state consistent, and a test relay should keep serving.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
