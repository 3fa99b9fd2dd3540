//! `grasp-sync demo --unfinished-kib K`: what unfinished messages cost the
//! engine. Once it has converged (and idled, with `--idle-secs`), every
//! connection of the relay farm sends the first fragment of a K KiB text
//! message without FIN and an unsolicited pong, then nothing but control
//! frames (the `NeverFinished` fault, on every relay at once); the engine's
//! RSS is read before and a few seconds after, well within the deadline
//! it gives an unfinished message (30 s by default).

use std::time::Duration;

use grasp_sync::testing::farm::RelayFarm;

use super::shards::EngineSet;

/// Time the engine gets to read every relay's fragment.
const SETTLE: Duration = Duration::from_secs(5);

/// Runs the measurement and prints its line.
pub fn measure(farm: &RelayFarm, engine: &EngineSet, kib: u64) {
    let connected = || {
        engine
            .metric("grasp_sync_relays{status=\"connected\"}")
            .unwrap_or(0)
    };
    let relays = connected();
    let (_, before) = engine.rss_kib();
    farm.send_unfinished(usize::try_from(kib * 1024).unwrap_or(usize::MAX));
    std::thread::sleep(SETTLE);
    let (_, after) = engine.rss_kib();
    let per_relay = after.saturating_sub(before) as f64 / relays.max(1) as f64;
    println!(
        "demo: unfinished: {relays} relays each sent {kib} KiB of a message they never finish: \
         rss_before_kib={before} rss_after_kib={after} growth_per_relay_kib={per_relay:.2} \
         relays_connected_after={} unfinished_cut={}",
        connected(),
        engine
            .metric("grasp_sync_unfinished_cut_total")
            .unwrap_or(0),
    );
}
