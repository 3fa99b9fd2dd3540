//! `demo --idle-secs N`: the engine at rest after converging, its memory
//! and CPU measured.

use std::time::{Duration, Instant};

use super::shards::EngineSet;

/// The engine at rest after converging.
#[derive(Debug, Clone, Copy)]
pub struct Idle {
    /// Resident memory at the end, KiB.
    pub rss_kib: u64,
    /// CPU time used, in percent of the time idled.
    pub cpu_pct: f64,
}

/// Lets the engine sit idle for `secs` and measures its memory and CPU.
pub fn measure(engine: &EngineSet, secs: u64) -> Option<Idle> {
    if secs == 0 {
        return None;
    }
    println!("demo: measuring the idle engine for {secs} s");
    let before = engine.cpu_time();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let used = engine.cpu_time().saturating_sub(before);
    let (_, rss_kib) = engine.rss_kib();
    Some(Idle {
        rss_kib,
        cpu_pct: 100.0 * used.as_secs_f64() / start.elapsed().as_secs_f64(),
    })
}
