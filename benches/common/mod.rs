//! Helpers shared by the benches: sizes and a deterministic RNG. Events and
//! the relay that answers every REQ with EOSE at once come from the crate's
//! simulation harness ([`grasp_sync::testing::sim`]), re-exported here.

#![allow(dead_code, unused_imports)]

pub mod seed;

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

/// SplitMix64: small, fast, deterministic.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}
