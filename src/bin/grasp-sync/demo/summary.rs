//! The demo's outcome: the summary line scripts parse, and what passes.

use super::chaos::ChaosSummary;
use super::engine_process::EngineCounters;
use super::restart::RestartSummary;

/// The outcome, as the summary line prints it.
#[derive(Debug, Clone, Copy)]
pub struct DemoSummary {
    /// Remote relays.
    pub relays: usize,
    /// Events that had to reach the own relay, over both engine runs.
    pub expected: usize,
    /// Events that did.
    pub synced: usize,
    /// Seconds from the first engine start until everything of the first
    /// run arrived (or the timeout); the restart has its own.
    pub seconds: f64,
    /// Peak resident memory of the engine (the larger of its two runs), KiB.
    pub peak_rss_kib: u64,
    /// REQs the relays received, over both runs.
    pub reqs: u64,
    /// What `--chaos` found.
    pub chaos: Option<ChaosSummary>,
    /// Both engine runs' counters together.
    pub counters: EngineCounters,
    /// `NEG-ERR`s the honest relays sent: any means a reconciliation with a
    /// relay that speaks NIP-77 failed (the engine's own fallback count
    /// also holds jobs it sent by REQ because the own relay held nothing).
    pub relay_neg_errors: u64,
    /// The engine restart.
    pub restart: RestartSummary,
    /// Engines run side by side, one per shard.
    pub shards: u32,
    /// Events placed where no relay can be asked for them (the long-`d`
    /// repo on a strfry-like relay): not in `expected`.
    pub unreachable_expected: usize,
    /// Events the first run had to bring (history and live ones).
    pub first_needed: usize,
    /// Of those, the ones on the own relay when the first run ended: what
    /// the restart fetched later does not count here.
    pub first_synced: usize,
}

impl DemoSummary {
    /// The last line of the demo's output; scripts parse it. Fields are
    /// only ever added at the end.
    pub fn line(&self) -> String {
        let missing = self.expected - self.synced;
        let chaos = self.chaos.map_or(String::new(), |c| {
            format!(
                " chaotic={} faults_injected={} events_lost={missing} invalid_ingested={} rss_ceiling_kib={}",
                c.chaotic, c.faults_injected, c.invalid_ingested, c.rss_ceiling_kib
            )
        });
        let (c, r) = (&self.counters, &self.restart);
        format!(
            "demo: relays={} expected={} synced={} missing={missing} seconds={:.1} peak_rss_kib={} reqs={}{chaos} \
             neg_sessions={} neg_rounds={} neg_ids_fetched={} neg_fallbacks={} relay_neg_errors={} auth_attempts={} \
             auth_rejected={} restart_needed={} restart_synced={} restart_fetched={} restart_received={} \
             restart_seconds={:.1} shards={}{} unreachable_expected={} unreachable_values={} \
             unreachable_seconds={} seconds_split={} first_needed={} first_synced={}",
            self.relays,
            self.expected,
            self.synced,
            self.seconds,
            self.peak_rss_kib,
            self.reqs,
            c.neg_sessions,
            c.neg_rounds,
            c.neg_ids_fetched,
            c.neg_fallbacks,
            self.relay_neg_errors,
            c.auth_attempts,
            c.auth_rejected,
            r.needed,
            r.synced,
            r.counters.neg_ids_fetched,
            r.counters.events_received,
            r.seconds,
            self.shards,
            self.chaos.map_or(String::new(), |c| c.large_fields()),
            self.unreachable_expected,
            c.unreachable_values,
            c.unreachable_seconds,
            c.seconds_split,
            self.first_needed,
            self.first_synced,
        )
    }

    /// Every expected event arrived, and the first run brought all of its
    /// own: a restart that repairs what the first run missed hides a loss.
    pub fn passed(&self) -> bool {
        self.synced == self.expected && self.first_synced == self.first_needed
    }

    /// Why the chaos checks failed, if they did: an invalid event reached
    /// the own relay, or the engine's memory passed its ceiling.
    pub fn chaos_failure(&self) -> Option<String> {
        let c = self.chaos?;
        if c.invalid_ingested > 0 {
            Some(format!(
                "{} invalid events reached the own relay",
                c.invalid_ingested
            ))
        } else if self.peak_rss_kib > c.rss_ceiling_kib {
            Some(format!(
                "the engine's peak RSS {} KiB is over its ceiling of {} KiB",
                self.peak_rss_kib, c.rss_ceiling_kib
            ))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(first_synced: usize) -> DemoSummary {
        DemoSummary {
            relays: 2,
            expected: 110,
            synced: 110,
            seconds: 30.0,
            peak_rss_kib: 0,
            reqs: 0,
            chaos: None,
            counters: EngineCounters::default(),
            relay_neg_errors: 0,
            restart: RestartSummary {
                needed: 10,
                synced: 10,
                seconds: 1.0,
                counters: EngineCounters::default(),
                peak_rss_kib: 0,
            },
            shards: 1,
            unreachable_expected: 0,
            first_needed: 100,
            first_synced,
        }
    }

    /// Issue 43: a first run that timed out with events missing failed the
    /// demo even when the restart fetched them, so `synced == expected`.
    #[test]
    fn a_first_run_short_of_its_events_fails_whatever_the_restart_fetched() {
        assert!(summary(100).passed());
        let short = summary(96);
        assert!(!short.passed());
        assert!(short.line().ends_with(" first_needed=100 first_synced=96"));
        assert!(short.line().contains(" missing=0 "));
    }
}
