//! `grasp-sync demo --chaos`: a third of the remote relays misbehave, one
//! fault each, cycling through the whole fault matrix
//! ([`Fault::matrix`]), while the others are honest.
//!
//! The misbehaving relays are [`TestRelay`]s (a thread per connection is
//! fine for a third of a demo), the honest ones stay in the farm. Every
//! event is placed on honest relays, so all must arrive; none of the invalid
//! events the misbehaving relays send may reach the own relay; and the
//! engine's peak memory must stay under a ceiling fixed from the relay
//! count before the run starts.

use std::sync::Arc;

use nostr::prelude::{Event, EventId};
use rustls::ServerConfig;

use grasp_sync::ShellOptions;
use grasp_sync::testing::fault::Fault;
use grasp_sync::testing::relay::{RelayOptions, TestRelay};

/// Memory the engine may use at most however few relays it serves, KiB.
/// Generous for a process whose idle footprint is a few MiB: the faults
/// (oversized frames, floods, 10,000 duplicates) are what may push it up.
const RSS_BASE_KIB: u64 = 32 * 1024;

/// Memory the engine may add per remote relay, KiB: several times what a
/// relay costs it at scale (BENCHMARKS.md), for its first page's buffers.
const RSS_PER_RELAY_KIB: u64 = 256;

/// The misbehaving relays of one run.
pub struct Chaos {
    relays: Vec<(Fault, TestRelay)>,
}

impl Chaos {
    /// Starts `count` misbehaving relays on `127.0.0.1`, serving `wss://`
    /// with `tls` if given; relay `i` gets fault `seed + i` of the matrix,
    /// cycling, so a run of a third of the matrix's size or more has every
    /// fault and the seed picks which ones a smaller run has.
    pub fn start(count: usize, seed: u64, tls: Option<Arc<ServerConfig>>) -> Result<Chaos, String> {
        // Over the cap the engine runs with (its default).
        let matrix = Fault::matrix(2 * ShellOptions::default().max_frame_bytes);
        let first = (seed % matrix.len() as u64) as usize;
        let relays = matrix
            .iter()
            .cycle()
            .skip(first)
            .take(count)
            .map(|fault| {
                let opts = RelayOptions {
                    tls: tls.clone(),
                    fault: Some(fault.clone()),
                    ..RelayOptions::default()
                };
                TestRelay::start(opts)
                    .map(|relay| (fault.clone(), relay))
                    .map_err(|e| format!("starting a misbehaving relay: {e}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Chaos { relays })
    }

    /// The relays' URLs, in order.
    pub fn urls(&self) -> Vec<String> {
        self.relays.iter().map(|(_, r)| r.url()).collect()
    }

    /// Stores `events[i]` in relay `i` before the engine connects.
    pub fn seed(&self, events: &[Vec<Event>]) {
        for ((_, relay), events) in self.relays.iter().zip(events) {
            events.iter().for_each(|e| relay.publish(e.clone()));
        }
    }

    /// One line naming every relay's fault.
    pub fn describe(&self) -> String {
        let names: Vec<String> = self.relays.iter().map(|(f, _)| f.name()).collect();
        format!(
            "demo: chaos: {} relays misbehave: {}",
            self.relays.len(),
            names.join(", ")
        )
    }

    /// Faults the relays injected so far, all together.
    pub fn faults_injected(&self) -> usize {
        self.relays.iter().map(|(_, r)| r.faults_injected()).sum()
    }

    /// Ids of every invalid event the relays sent.
    pub fn invalid_sent(&self) -> Vec<EventId> {
        self.relays
            .iter()
            .flat_map(|(_, r)| r.invalid_sent())
            .collect()
    }

    /// REQs the relays received, all together.
    pub fn reqs(&self) -> u64 {
        self.relays.iter().map(|(_, r)| r.req_count() as u64).sum()
    }
}

/// The engine's memory ceiling for a run against `relays` remote relays, KiB.
pub fn rss_ceiling_kib(relays: usize) -> u64 {
    RSS_BASE_KIB + RSS_PER_RELAY_KIB * relays as u64
}

/// What the chaos checks found, for the summary line.
#[derive(Debug, Clone, Copy)]
pub struct ChaosSummary {
    /// Misbehaving relays.
    pub chaotic: usize,
    /// Faults they injected.
    pub faults_injected: usize,
    /// Invalid events that reached the own relay (stored there, or refused
    /// by it for a bad id or signature).
    pub invalid_ingested: u64,
    /// The engine's memory ceiling, KiB.
    pub rss_ceiling_kib: u64,
}
