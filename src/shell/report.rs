//! What the metrics page shows, as values for an embedder
//! ([`ShellHandle::stats`](crate::ShellHandle::stats) and
//! [`ShellHandle::status`](crate::ShellHandle::status)): counters that only
//! grow, and the state now. Taken on the loop thread when asked, like the
//! page.

use crate::sans_io::engine::{Engine, Stats, Status};
use crate::sans_io::timing::health::Health;
use crate::sans_io::timing::time::Time;
use crate::shell::metrics::{ShellStats, SinkView};

/// Counters since the shell started.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct SyncStats {
    /// The engine's counters (events, REQs, connects, negentropy, ...).
    pub engine: Stats,
    /// Websocket payload bytes received from relays.
    pub bytes_in: u64,
    /// Websocket payload bytes sent.
    pub bytes_out: u64,
    /// Connections refused by the address guard.
    pub address_refused: u64,
    /// Connections refused by `ShellOptions::max_relays`.
    pub relay_cap_refused: u64,
    /// DNS lookups failed or timed out.
    pub dns_failures: u64,
    /// Times a relay's reads paused for its frame rate.
    pub reads_throttled: u64,
    /// Relay connections cut for leaving a message unfinished.
    pub unfinished_cut: u64,
    /// Events the sink stored (duplicates included).
    pub sink_stored: u64,
    /// Of those, duplicates (the own relay's `duplicate:`).
    pub sink_duplicate: u64,
    /// Events the sink refused for good.
    pub sink_rejected: u64,
    /// Events handed back (`Full`) or put back for a retry.
    pub sink_retried: u64,
    /// Events the own relay could never take (set aside).
    pub sink_set_aside: u64,
    /// Ids the sink listed for negentropy.
    pub sink_listed: u64,
}

/// The state now.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct SyncStatus {
    /// Relays known, by connection status: disconnected, connecting, connected.
    pub relays_by_status: [usize; 3],
    /// Relays known, by health: healthy, degraded, dead, rate-limited.
    pub relays_by_health: [usize; 4],
    /// Subscriptions open on all relays.
    pub subscriptions_open: usize,
    /// Batches waiting for EOSE.
    pub pending_batches: usize,
    /// Events waiting for the sink or in flight to it (a custom sink: 1
    /// while it holds an event it handed back).
    pub sink_depth: usize,
    /// Events the own-relay outbox holds before reads pause (0 for a
    /// custom sink).
    pub sink_capacity: usize,
    /// The own relay's write link is open; `None` for a custom sink.
    pub own_relay_open: Option<bool>,
    /// Remote reads are paused because the sink is full.
    pub sink_full: bool,
}

/// The counters, from the engine's, the shell's and the sink's.
pub(super) fn stats(engine: &Engine, shell: &ShellStats, sink: &SinkView) -> SyncStats {
    SyncStats {
        engine: *engine.stats(),
        bytes_in: shell.bytes_in,
        bytes_out: shell.bytes_out,
        address_refused: shell.address_refused,
        relay_cap_refused: shell.relay_cap_refused,
        dns_failures: shell.dns_failures,
        reads_throttled: shell.reads_throttled,
        unfinished_cut: shell.unfinished_cut,
        sink_stored: sink.outbox.stored + shell.sink_stored,
        sink_duplicate: sink.outbox.duplicate,
        sink_rejected: sink.outbox.rejected,
        sink_retried: sink.outbox.retried,
        sink_set_aside: sink.outbox.set_aside,
        sink_listed: shell.sink_listed,
    }
}

/// The state at `now`.
pub(super) fn status(engine: &Engine, now: Time, sink: &SinkView, sink_full: bool) -> SyncStatus {
    let mut out = SyncStatus {
        sink_depth: sink.outbox_depth,
        sink_capacity: sink.outbox_capacity,
        own_relay_open: sink.own_relay_open,
        sink_full,
        ..SyncStatus::default()
    };
    for relay in engine.relays() {
        out.relays_by_status[match engine.relay_status(relay) {
            Status::Disconnected => 0,
            Status::Connecting => 1,
            Status::Connected => 2,
        }] += 1;
        out.relays_by_health[match engine.relay_health(relay, now) {
            Health::Healthy => 0,
            Health::Degraded => 1,
            Health::Dead => 2,
            Health::RateLimited => 3,
        }] += 1;
        out.subscriptions_open += engine.open_subscriptions(relay);
        out.pending_batches += engine.pending_batches(relay);
    }
    out
}
