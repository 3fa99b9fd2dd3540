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
//!
//! The own relay misbehaves too, the way nostr-rs-relay does past its
//! `max_event_bytes` ([`Fault::LargeEventNotice`]): an event over
//! [`OWN_MAX_EVENT_BYTES`] gets a `NOTICE` and no `OK`. A few valid
//! events that large sit on honest relays; the own relay can never hold
//! them, so they are not among the events that must arrive: the engine
//! must set them aside (counted) without stalling the ones behind them,
//! and the summary line reports both counts.

use std::sync::Arc;

use nostr::prelude::{Event, EventBuilder, EventId, FinalizeEvent, Keys, Kind, Tag};
use rustls::ServerConfig;

use grasp_sync::ShellOptions;
use grasp_sync::testing::farm::RelayProfile;
use grasp_sync::testing::fault::Fault;
use grasp_sync::testing::relay::{RelayOptions, TestRelay};

/// Longest event (as JSON) the own relay takes in a chaos run; 64 KiB,
/// half nostr-rs-relay's default, so the large events below stay well
/// under the engine's frame cap.
pub const OWN_MAX_EVENT_BYTES: usize = 64 * 1024;

/// Valid events too large for the own relay, placed on honest relays.
const LARGE_EVENTS: usize = 3;

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

/// The own relay's profile in a chaos run: large events get a `NOTICE`.
pub fn own_profile() -> RelayProfile {
    RelayProfile {
        max_event_bytes: Some(OWN_MAX_EVENT_BYTES),
        ..RelayProfile::default()
    }
}

/// Valid comments twice [`OWN_MAX_EVENT_BYTES`] long, each on one of the
/// first honest relays (by index into `remote`) holding an event that
/// tags a repo, tagging that repo, so the engine fetches it from there.
pub fn large_events(remote: &[Vec<Event>]) -> Vec<(usize, Event)> {
    let keys = Keys::generate();
    let body = "x".repeat(2 * OWN_MAX_EVENT_BYTES);
    remote
        .iter()
        .enumerate()
        .filter_map(|(i, events)| {
            let coord = events.iter().find_map(repo_tag)?;
            let tag = Tag::parse(["A", coord.as_str()]).ok()?;
            let event = EventBuilder::new(Kind::from_u16(1111), body.clone())
                .tag(tag)
                .finalize(&keys)
                .ok()?;
            Some((i, event))
        })
        .take(LARGE_EVENTS)
        .collect()
}

/// The repo an event tags (`a` or `A`), if any.
fn repo_tag(event: &Event) -> Option<String> {
    event.tags.iter().find_map(|t| {
        let v = t.as_slice();
        let named = matches!(v.first().map(String::as_str), Some("a" | "A"));
        v.get(1)
            .filter(|c| named && c.starts_with("30617:"))
            .cloned()
    })
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
    /// Valid events too large for the own relay, on honest relays.
    pub large_events: usize,
    /// `EVENT`s the own relay answered with a size `NOTICE` (over both runs).
    pub large_refused: u64,
    /// Events the engine set aside (over both runs).
    pub set_aside: u64,
}

impl ChaosSummary {
    /// The summary line's fields for the own relay's size fault.
    pub fn large_fields(&self) -> String {
        format!(
            " large_events={} large_refused={} set_aside={}",
            self.large_events, self.large_refused, self.set_aside
        )
    }
}
