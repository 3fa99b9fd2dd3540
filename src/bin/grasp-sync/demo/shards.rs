//! `demo --shards N`: N engine children, shard 0/N to N-1/N, over one own
//! relay, read as one engine: counters and connections summed, memory of
//! the largest. With one shard it is the plain demo's single engine.

use std::time::Duration;

use grasp_sync::Shard;

use super::engine_process::{EngineCounters, EngineProcess};

/// The engine children of one run, one per shard.
pub struct EngineSet {
    engines: Vec<EngineProcess>,
}

impl EngineSet {
    /// Starts shard `i` of `count` with `spawn(shard)` for every `i`.
    pub fn spawn(
        count: u32,
        mut spawn: impl FnMut(Shard) -> Result<EngineProcess, String>,
    ) -> Result<EngineSet, String> {
        let engines = (0..count.max(1))
            .map(|i| {
                // i < count.max(1) by the range.
                let shard = Shard::new(i, count.max(1)).expect("index below count");
                spawn(shard)
            })
            .collect::<Result<_, _>>()?;
        Ok(EngineSet { engines })
    }

    /// Where each shard serves its metrics and status pages.
    pub fn metrics_addrs(&self) -> Vec<std::net::SocketAddr> {
        self.engines
            .iter()
            .map(EngineProcess::metrics_addr)
            .collect()
    }

    /// Each shard's counters once it went quiet, together.
    pub fn settled_counters(&self) -> EngineCounters {
        self.engines
            .iter()
            .map(EngineProcess::settled_counters)
            .fold(EngineCounters::default(), |a, b| a + b)
    }

    /// One metric summed over the shards that answered (`None` if none did).
    pub fn metric(&self, name: &str) -> Option<u64> {
        self.engines
            .iter()
            .filter_map(|e| e.metric(name))
            .reduce(|a, b| a + b)
    }

    /// Peak and current resident memory of the largest shard, KiB: what
    /// one machine running one shard must hold.
    pub fn rss_kib(&self) -> (u64, u64) {
        self.engines
            .iter()
            .map(EngineProcess::rss_kib)
            .fold((0, 0), |(p, c), (ep, ec)| (p.max(ep), c.max(ec)))
    }

    /// CPU time all shards used so far.
    pub fn cpu_time(&self) -> Duration {
        self.engines.iter().map(EngineProcess::cpu_time).sum()
    }

    /// SIGTERM to every shard; the first exit code that is not 0 (`None`
    /// if one had to be killed), else `Some(0)`.
    pub fn stop(self) -> Option<i32> {
        // Every shard is stopped, whatever the others answered.
        let codes: Vec<Option<i32>> = self.engines.into_iter().map(EngineProcess::stop).collect();
        codes.into_iter().find(|&c| c != Some(0)).unwrap_or(Some(0))
    }
}
