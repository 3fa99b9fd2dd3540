//! The first run driven and watched: live events published, one relay
//! restarted midway, progress printed until everything arrived or time
//! is up, and what never arrived named.

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use nostr::prelude::EventId;

use super::scenario::Scenario;
use super::shards::EngineSet;
use grasp_sync::testing::farm::RelayFarm;

/// How the first run went (what arrived is counted at the end, over both
/// runs).
pub struct Progress {
    /// When the engine first reached its highest count of connected relays.
    pub connected: Option<Duration>,
    /// Expected events on the own relay when the run ended.
    pub synced: usize,
}

/// Publishes the live events over the first seconds, restarts one relay
/// midway, and reports progress until everything arrived or time is up.
pub fn drive(
    farm: &RelayFarm,
    engine: &EngineSet,
    scenario: &Scenario,
    deadline: Instant,
    started: Instant,
) -> Progress {
    let tty = std::io::stdout().is_terminal();
    let total = scenario.expected.len();
    let mut live = scenario.live.iter();
    let mut restarted = false;
    let mut last_print = Instant::now() - Duration::from_secs(10);
    // Time the engine first reached its highest count of connected relays.
    let mut connected: Option<Duration> = None;
    let mut most = 0;
    loop {
        if let Some(count) = engine.metric("grasp_sync_relays{status=\"connected\"}")
            && count > most
        {
            most = count;
            connected = Some(started.elapsed());
        }
        let elapsed = started.elapsed();
        // Live events trickle in over the first 3 s; one relay restarts at 1 s,
        // so some are published to it while it is down.
        for (relay, event) in live.by_ref().take(scenario.live.len().div_ceil(30).max(1)) {
            farm.publish(*relay, event.clone());
        }
        if !restarted && elapsed > Duration::from_secs(1) && !farm.is_empty() {
            let victim = 1 + (farm.len() - 1) / 2;
            println!("demo: restarting relay {} for 2 s", farm.url(victim));
            farm.restart(victim, Duration::from_secs(2));
            restarted = true;
        }
        let synced = farm.count_present(0, &scenario.expected);
        let done = synced == total && restarted && live.len() == 0;
        if tty || last_print.elapsed() >= Duration::from_secs(1) || done {
            print_progress(
                tty,
                synced,
                total,
                farm.stats().connections,
                farm.len() - 1,
                elapsed,
            );
            last_print = Instant::now();
        }
        if done || Instant::now() >= deadline {
            if tty {
                println!();
            }
            if !done {
                report_missing(farm, scenario);
            }
            return Progress { connected, synced };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Names up to ten expected events that never arrived, with where they
/// were put (the unreachable ones are not expected, so not named).
fn report_missing(farm: &RelayFarm, scenario: &Scenario) {
    let expected: HashSet<EventId> = scenario.expected.iter().copied().collect();
    let placed = scenario
        .remote
        .iter()
        .enumerate()
        .flat_map(|(i, events)| events.iter().map(move |e| (i + 1, e)))
        .chain(scenario.live.iter().map(|(r, e)| (*r, e)))
        .filter(|(_, e)| expected.contains(&e.id));
    let mut shown = 0;
    for (relay, event) in placed {
        if shown < 10 && farm.count_present(0, &[event.id]) == 0 {
            let root = event
                .tags
                .iter()
                .map(|t| t.as_slice())
                .find(|t| t.len() > 1 && (t[0] == "e" || t[0] == "E"))
                .and_then(|t| EventId::from_hex(&t[1]).ok());
            let root_synced = root.map(|r| farm.count_present(0, &[r]) == 1);
            println!(
                "demo: missing {} (kind {}) from {} (root {root:?} synced: {root_synced:?})",
                event.id,
                event.kind.as_u16(),
                farm.url(relay)
            );
            shown += 1;
        }
    }
}

/// One progress line: on a terminal a bar redrawn in place, else a line
/// of its own.
pub fn print_progress(
    tty: bool,
    synced: usize,
    total: usize,
    connections: usize,
    relays: usize,
    elapsed: Duration,
) {
    let secs = elapsed.as_secs_f64();
    if tty {
        let width = 30;
        let filled = (synced * width).checked_div(total).unwrap_or(width);
        print!(
            "\r[{}{}] {synced}/{total} events synced, {connections} connections to {relays}+1 relays, {secs:.1} s ",
            "#".repeat(filled),
            ".".repeat(width - filled)
        );
        let _ = std::io::stdout().flush();
    } else {
        println!(
            "demo: {secs:.1} s: {synced}/{total} events synced, {connections} connections to {relays}+1 relays"
        );
    }
}
