//! The demo's second act: the engine restarted over an own relay that
//! already holds everything, after more events were published while it was
//! down.
//!
//! A fresh engine knows nothing of what it synced before, so it re-reads
//! every relay's history. By REQ that downloads all of it again; with NIP-77
//! each historic filter is reconciled against what the own relay holds and
//! only the missing ids are fetched. This act shows which one happened: the
//! ids negentropy fetched against the events published meanwhile, and the
//! events downloaded against the history.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use nostr::prelude::{Event, EventId};

use super::engine_process::EngineCounters;
use super::progress::print_progress;
use super::shards::EngineSet;
use grasp_sync::testing::farm::RelayFarm;

/// How the restart went.
#[derive(Debug, Clone, Copy)]
pub struct RestartSummary {
    /// Events published while the engine was down.
    pub needed: usize,
    /// Of those, how many reached the own relay.
    pub synced: usize,
    /// Seconds from the restart until they all arrived (or the timeout).
    pub seconds: f64,
    /// The restarted engine's counters.
    pub counters: EngineCounters,
    /// The restarted engine's peak RSS, KiB.
    pub peak_rss_kib: u64,
}

/// Publishes `down` (farm relay, event) while no engine runs, starts one
/// with `spawn`, waits until every one of them reached the own relay (farm
/// relay 0) or `timeout` passed, then stops it. An engine that does not
/// exit cleanly on SIGTERM is an error.
pub fn run(
    farm: &RelayFarm,
    down: &[(usize, Event)],
    timeout: Duration,
    spawn: impl FnOnce() -> Result<EngineSet, String>,
) -> Result<RestartSummary, String> {
    for (relay, event) in down {
        farm.publish(*relay, event.clone());
    }
    let ids: Vec<EventId> = down.iter().map(|(_, e)| e.id).collect();
    println!(
        "demo: engine stopped; {} events published while it is down; restarting it",
        ids.len()
    );
    let engine = spawn()?;
    let started = Instant::now();
    let tty = std::io::stdout().is_terminal();
    let mut last_print = Instant::now() - Duration::from_secs(10);
    let synced = loop {
        let synced = farm.count_present(0, &ids);
        let done = synced == ids.len();
        if tty || last_print.elapsed() >= Duration::from_secs(1) || done {
            let connections = farm.stats().connections;
            let elapsed = started.elapsed();
            print_progress(tty, synced, ids.len(), connections, farm.len() - 1, elapsed);
            last_print = Instant::now();
        }
        if done || started.elapsed() >= timeout {
            if tty {
                println!();
            }
            break synced;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let seconds = started.elapsed().as_secs_f64();
    let counters = engine.settled_counters();
    let (peak_rss_kib, _) = engine.rss_kib();
    println!(
        "demo: restart: peak_rss_kib={peak_rss_kib} own_relay_listed={} (events the own relay listed for negentropy)",
        counters.sink_listed
    );
    let code = engine.stop();
    if code != Some(0) {
        return Err(format!(
            "the restarted engine exited with {code:?} on SIGTERM"
        ));
    }
    Ok(RestartSummary {
        needed: ids.len(),
        synced,
        seconds,
        counters,
        peak_rss_kib,
    })
}
