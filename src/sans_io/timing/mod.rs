//! Time and when things happen: the [`Time`](time::Time) the caller
//! passes in (the core never reads a clock), the timer wheel that says
//! when the engine must be woken next, and each relay's health, the
//! backoff schedule that says when a relay that failed is tried again.
//!
//! The bottom layer of `sans_io`: may use nothing of it, only `std` and
//! `rand` (the jitter), so every other folder can use it.

pub(crate) mod health;
pub(crate) mod silence;
pub(crate) mod time;
pub(crate) mod timer;
