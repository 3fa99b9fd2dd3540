//! Helpers shared by the benches: sizes and a deterministic RNG. Events and
//! the relay that answers every REQ with EOSE at once come from the crate's
//! simulation harness ([`grasp_sync::testing::sim`]), re-exported here.

#![allow(dead_code, unused_imports)]

pub mod rng;
pub mod seed;

pub use rng::Rng;

use std::time::Duration;

pub use grasp_sync::testing::sim::instant::*;
// The benches number up to a thousand repo owners: `keys` are the wide ones.
pub use grasp_sync::testing::sim::{OWN, T0, local_event, local_id, sign, tag, wide_keys as keys};

/// The engine's default batch window.
pub const WINDOW: Duration = Duration::from_millis(5_000);

/// `GRASP_BENCH_SCALE` (default 1.0): multiplies every world size so quick
/// runs (`cargo bench -- --test`, CI) stay cheap.
pub fn scale() -> f64 {
    std::env::var("GRASP_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(1.0)
}

/// `n` scaled by [`scale`], at least `min`.
pub fn scaled(n: usize, min: usize) -> usize {
    ((n as f64 * scale()).round() as usize).max(min)
}
