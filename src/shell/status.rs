//! The operator's status view: every relay with its state, what it
//! taught us and what it gave, the own relay's link and backlog, the
//! state file and the first sync's progress, as one value served as
//! `/status.json` (this file) and `/status` (`status_page`), and read back
//! by `grasp-sync status`.
//!
//! It is built only when asked, on the loop thread, from the same sources
//! as `/metrics` (the engine's counters and relay table, the shell's and
//! the sink's), so a number both show is the same number. It holds one
//! page of relays ([`Window`]; thousands of relays made a view of
//! megabytes) with the total count, so a reader pages with
//! `?offset=`: every relay is ranked, only the page's are described. Relays are
//! sorted so problems come first: dead, rate-limited, backing off or
//! failing, then connected ones that refuse, misbehave or cannot be asked
//! for something, then the ones still reading, then the healthy. Times
//! are Unix seconds. `docs/status.schema.json` is its schema; a field is
//! only ever added.

use serde::{Deserialize, Serialize};

use crate::sans_io::engine::{Engine, RelayView, Status};
use crate::sans_io::memory::index::RelayId;
use crate::sans_io::progress::Progress;
use crate::sans_io::timing::health::Health;
use crate::sans_io::timing::time::Time;
use crate::shell::metrics::{ShellStats, SinkView};

/// The version of this layout; a change that is not an added field bumps it.
/// 2: `relays` is one page of them (`relays_total` counts them all).
pub const SCHEMA: u32 = 2;

/// Relays a page holds unless asked otherwise: about 1 KB of JSON each,
/// so a page stays under 1 MB.
pub const DEFAULT_LIMIT: usize = 500;
/// Relays a page holds at most, whatever is asked.
pub const MAX_LIMIT: usize = 1000;

/// Which relays, in the view's order (problems first), a view describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// Relays skipped.
    pub offset: usize,
    /// Relays described at most.
    pub limit: usize,
}

impl Default for Window {
    fn default() -> Self {
        Window {
            offset: 0,
            limit: DEFAULT_LIMIT,
        }
    }
}

/// The whole view.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusReport {
    /// [`SCHEMA`].
    pub schema: u32,
    /// The engine's version.
    pub version: String,
    /// When this was taken.
    pub generated_at: u64,
    /// When the engine started.
    pub started_at: u64,
    /// This engine's shard: index and count.
    pub shard: [u32; 2],
    /// The history pass after the start.
    pub first_sync: FirstSyncStatus,
    /// Where synced events go.
    pub own_relay: OwnRelayStatus,
    /// `--state-file`, if given.
    pub state_file: Option<StateFileStatus>,
    /// Counters over every relay, as `/metrics` has them.
    pub totals: Totals,
    /// This shard's remote relays.
    pub relays_total: usize,
    /// Of them, the ones with a problem.
    pub problems_total: usize,
    /// Relays of the order skipped before `relays` (`?offset=`).
    pub relays_offset: usize,
    /// Relays this page holds at most (`?limit=`, at most [`MAX_LIMIT`]).
    pub relays_limit: usize,
    /// One page of this shard's remote relays, problems first.
    pub relays: Vec<RelayStatus>,
}

/// The first sync's progress (`sans_io::progress`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FirstSyncStatus {
    /// `running` or `done`.
    pub state: String,
    /// Relays to read.
    pub relays_total: usize,
    /// Relays whose first history was read to the end.
    pub relays_done: usize,
    /// Relays not done that fail now (unreachable, refusing, rate-limiting).
    pub relays_failing: usize,
    /// Items (a repository or root on one relay) to read.
    pub items_total: usize,
    /// Items read.
    pub items_done: usize,
    /// Events the sink stored since the start.
    pub events_stored: u64,
    /// Events stored a second over the last minute.
    pub events_per_sec: f64,
    /// The time left, once a relay finished and while it runs.
    pub eta_secs: Option<u64>,
    /// When it completed.
    pub finished_at: Option<u64>,
}

/// The own relay: its links, throughput, throttling and backlog.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OwnRelayStatus {
    /// Its URL.
    pub url: String,
    /// The write link (synced events) is open; `null` for an embedder's sink.
    pub write_connected: Option<bool>,
    /// The read link (self-subscription) is open; `null` without one.
    pub read_connected: Option<bool>,
    /// Failed connects or lost connections of the write link in a row.
    pub failures: u32,
    /// Events it stored a second over the last minute.
    pub stored_per_sec: f64,
    /// While it rate-limits the sync: the events a minute it takes.
    pub throttled_per_minute: Option<u64>,
    /// Events waiting for it or in flight.
    pub outbox_depth: usize,
    /// Events the outbox holds before remote reads pause.
    pub outbox_capacity: usize,
    /// Events the engine holds back while the outbox is full.
    pub held_back: usize,
    /// Remote relays whose reads wait for room in the outbox.
    pub reads_paused: usize,
    /// Events stored (new), as `grasp_sync_sink_events_total`.
    pub stored: u64,
    /// Events it already had.
    pub duplicate: u64,
    /// Events it refused for good.
    pub rejected: u64,
    /// Events it could never take.
    pub set_aside: u64,
    /// Subscriptions it refused or closed (listings, self-subscription).
    pub refusals: u64,
}

/// The state file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StateFileStatus {
    /// Its path.
    pub path: String,
    /// When it was last written.
    pub saved_at: Option<u64>,
    /// Its size then.
    pub saved_bytes: Option<u64>,
    /// Why the last write failed, if it did.
    pub error: Option<String>,
}

/// Counters over every relay, named as on `/metrics`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Totals {
    /// `grasp_sync_events_total{outcome="received"}`.
    pub events_received: u64,
    /// `grasp_sync_events_total{outcome="ingested"}`.
    pub events_ingested: u64,
    /// `grasp_sync_refusals_total`.
    pub refusals: u64,
    /// `grasp_sync_bytes_total{direction="in"}`.
    pub bytes_in: u64,
    /// `grasp_sync_bytes_total{direction="out"}`.
    pub bytes_out: u64,
}

/// One remote relay.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RelayStatus {
    /// Its normalized URL.
    pub url: String,
    /// `dead`, `rate_limited`, `backing_off`, `failing`, `connecting`,
    /// `syncing` (reading history), `live` or `idle`.
    pub state: String,
    /// Why it is listed among the problems; `null` when it is not one.
    pub problem: Option<String>,
    /// `disconnected`, `connecting` or `connected`, as `grasp_sync_relays`.
    pub status: String,
    /// `healthy`, `degraded`, `dead` or `rate_limited`, as
    /// `grasp_sync_relays_health`.
    pub health: String,
    /// While backing off: when it is tried again.
    pub retry_at: Option<u64>,
    /// Failed connects or lost connections in a row.
    pub failures: u32,
    /// Penalties for misbehaving.
    pub penalties: u32,
    /// When the current or last connection began.
    pub connected_at: Option<u64>,
    /// When the last connection ended.
    pub disconnected_at: Option<u64>,
    /// Its first history was read to the end.
    pub history_done: bool,
    /// Connected with live subscriptions open.
    pub live: bool,
    /// Items (repositories, roots) it is asked for: `[queued, pending,
    /// confirmed, unaskable]`.
    pub items: [usize; 4],
    /// Subscriptions open.
    pub subscriptions_open: usize,
    /// Filters of its live subscriptions.
    pub live_filters: usize,
    /// Its limits as applied now.
    pub limits: LimitsStatus,
    /// NIP-77: `null` not tried yet.
    pub negentropy: Option<bool>,
    /// When its last EVENT came.
    pub last_event_at: Option<u64>,
    /// EVENT messages received.
    pub events_received: u64,
    /// Events handed to the sink (new, verified, wanted).
    pub events_ingested: u64,
    /// Subscriptions it refused or closed.
    pub refusals: u64,
    /// A bootstrap relay.
    pub bootstrap: bool,
}

/// A relay's limits: learnt from it (NIP-11, refusals, cut pages), or ours.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LimitsStatus {
    /// REQs open at once.
    pub subscriptions: usize,
    /// Filters per REQ.
    pub filters_per_req: usize,
    /// `limit` asked per filter.
    pub page_limit: usize,
    /// Events it returns per filter, where a cut page proved it.
    pub result_cap: Option<usize>,
    /// Tag values per filter.
    pub tag_values: usize,
    /// Kinds per filter; `null`: none learnt.
    pub kinds: Option<usize>,
    /// Bytes of one tag value; `null`: none learnt.
    pub value_bytes: Option<usize>,
}

/// What the shell holds beside the engine for the view.
pub(crate) struct Sources<'a> {
    pub engine: &'a Engine,
    pub now: Time,
    pub started: Time,
    pub shell: &'a ShellStats,
    pub sink: &'a SinkView,
    pub progress: &'a Progress,
    pub state_file: Option<StateFileStatus>,
    pub reads_paused: usize,
}

/// Ranks below this are problems.
const PROBLEM_RANKS: u8 = 4;

/// Takes the view now, describing the relays of `window`. O(relays and
/// their items) to rank them all, plus the page's rows.
pub(crate) fn snapshot(src: &Sources, window: Window) -> StatusReport {
    let (engine, now) = (src.engine, src.now);
    let (own, shard) = (engine.own_relay(), engine.shard());
    let mut ranked: Vec<(u8, &str, RelayId)> = engine
        .relays()
        .filter(|&r| r != own && shard.owns(engine.relay_url(r)))
        .map(|r| {
            (
                classify(&engine.relay_view(r, now)).0,
                engine.relay_url(r),
                r,
            )
        })
        .collect();
    ranked.sort_unstable_by(|(a, x, _), (b, y, _)| a.cmp(b).then_with(|| x.cmp(y)));
    let problems_total = ranked
        .iter()
        .filter(|(rank, ..)| *rank < PROBLEM_RANKS)
        .count();
    let limit = window.limit.min(MAX_LIMIT);
    let relays = ranked
        .iter()
        .skip(window.offset)
        .take(limit)
        .map(|&(_, _, r)| relay_status(engine, r, now))
        .collect();
    let stats = engine.stats();
    StatusReport {
        schema: SCHEMA,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        generated_at: now.as_secs(),
        started_at: src.started.as_secs(),
        shard: [shard.index(), shard.count()],
        first_sync: first_sync(src.progress),
        own_relay: own_relay(src),
        state_file: src.state_file.clone(),
        totals: Totals {
            events_received: stats.events_received,
            events_ingested: stats.events_ingested,
            refusals: stats.refusals,
            bytes_in: src.shell.bytes_in,
            bytes_out: src.shell.bytes_out,
        },
        relays_total: ranked.len(),
        problems_total,
        relays_offset: window.offset,
        relays_limit: limit,
        relays,
    }
}

fn first_sync(p: &Progress) -> FirstSyncStatus {
    FirstSyncStatus {
        state: if p.finished.is_some() {
            "done"
        } else {
            "running"
        }
        .to_owned(),
        relays_total: p.relays_total,
        relays_done: p.relays_done,
        relays_failing: p.relays_failing,
        items_total: p.items_total,
        items_done: p.items_done,
        events_stored: p.events_stored,
        events_per_sec: p.events_per_sec,
        eta_secs: p.eta.map(|d| d.as_secs()),
        finished_at: p.finished.map(Time::as_secs),
    }
}

fn own_relay(src: &Sources) -> OwnRelayStatus {
    let (engine, sink) = (src.engine, src.sink);
    let own = engine.own_relay();
    OwnRelayStatus {
        url: engine.relay_url(own).to_owned(),
        write_connected: sink.own_relay_open,
        read_connected: engine.own_read_link().map(|(up, _)| up),
        failures: sink.own_relay_failures,
        stored_per_sec: src.progress.events_per_sec,
        throttled_per_minute: sink.accepted_per_minute,
        outbox_depth: sink.outbox_depth,
        outbox_capacity: sink.outbox_capacity,
        held_back: engine.outputs_waiting(),
        reads_paused: src.reads_paused,
        stored: sink.stored_new(src.shell),
        duplicate: sink.outbox.duplicate,
        rejected: sink.outbox.rejected,
        set_aside: sink.outbox.set_aside,
        refusals: engine.relay_view(own, src.now).refusals,
    }
}

/// One relay's row.
fn relay_status(engine: &Engine, relay: RelayId, now: Time) -> RelayStatus {
    let v = engine.relay_view(relay, now);
    let (rank, state) = classify(&v);
    let limits = &v.limits;
    RelayStatus {
        url: engine.relay_url(relay).to_owned(),
        state: state.to_owned(),
        problem: problem(&v, rank),
        status: status_label(v.status).to_owned(),
        health: health_label(v.health).to_owned(),
        retry_at: v.retry_at.map(Time::as_secs),
        failures: v.failures,
        penalties: v.penalties,
        connected_at: v.last_connected.map(Time::as_secs),
        disconnected_at: v.disconnected_at.map(Time::as_secs),
        history_done: v.first_history_done,
        live: v.status == Status::Connected && v.live_filters > 0,
        items: [
            v.items.queued,
            v.items.pending,
            v.items.confirmed,
            v.items.unaskable,
        ],
        subscriptions_open: v.subscriptions_open,
        live_filters: v.live_filters,
        limits: LimitsStatus {
            subscriptions: limits.subscriptions,
            filters_per_req: limits.filters_per_req,
            page_limit: limits.page_limit,
            result_cap: limits.result_cap,
            tag_values: limits.tag_values,
            kinds: limits.kinds,
            value_bytes: limits.value_bytes,
        },
        negentropy: v.negentropy,
        last_event_at: v.last_event_at.map(Time::as_secs),
        events_received: v.events_received,
        events_ingested: v.events_ingested,
        refusals: v.refusals,
        bootstrap: v.bootstrap,
    }
}

/// A relay's rank (problems first; below [`PROBLEM_RANKS`] a problem) and
/// state. Allocates nothing: every relay is ranked for every view.
fn classify(v: &RelayView) -> (u8, &'static str) {
    match v.status {
        Status::Disconnected => match v.health {
            Health::Dead => (0, "dead"),
            Health::RateLimited => (1, "rate_limited"),
            _ if v.retry_at.is_some() => (2, "backing_off"),
            _ if v.failures > 0 => (2, "failing"),
            _ => (6, "idle"),
        },
        _ if v.health == Health::RateLimited => (1, "rate_limited"),
        Status::Connecting if v.failures > 0 => (2, "connecting"),
        Status::Connecting => (4, "connecting"),
        Status::Connected => {
            let state = if v.history_done { "live" } else { "syncing" };
            let rank = if misbehaves(v) {
                3
            } else if v.history_done {
                5
            } else {
                4
            };
            (rank, state)
        }
    }
}

/// The problem a relay of `rank` shows, if it is one.
fn problem(v: &RelayView, rank: u8) -> Option<String> {
    let failures = || format!("{} in a row", count(v.failures.into(), "failure"));
    match rank {
        0 => Some(format!("unreachable; {}", failures())),
        1 => Some("asked us to slow down".into()),
        2 => Some(failures()),
        3 => Some(connected_problem(v)),
        _ => None,
    }
}

/// Whether a connected relay does something wrong ([`connected_problem`]).
fn misbehaves(v: &RelayView) -> bool {
    v.health == Health::Degraded || v.penalties > 0 || v.items.unaskable > 0
}

/// What a connected relay does wrong: refusing still (a refusal it got
/// over, teaching us a limit, is no problem once it answers again),
/// penalties, items it cannot be asked for.
fn connected_problem(v: &RelayView) -> String {
    let mut parts = Vec::new();
    if v.health == Health::Degraded {
        parts.push(format!("refusing ({})", count(v.refusals, "refusal")));
    }
    if v.penalties > 0 {
        parts.push(count(v.penalties.into(), "penalty for misbehaving"));
    }
    if v.items.unaskable > 0 {
        let items = count(v.items.unaskable as u64, "item");
        parts.push(format!("{items} it cannot be asked for"));
    }
    parts.join(", ")
}

/// "1 refusal", "3 refusals" ("penalty" → "penalties").
fn count(n: u64, what: &str) -> String {
    match (n, what.split_once(' ')) {
        (1, _) => format!("1 {what}"),
        (_, Some((word, rest))) => format!("{n} {} {rest}", plural(word)),
        (_, None) => format!("{n} {}", plural(what)),
    }
}

fn plural(word: &str) -> String {
    match word.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None => format!("{word}s"),
    }
}

fn status_label(s: Status) -> &'static str {
    match s {
        Status::Disconnected => "disconnected",
        Status::Connecting => "connecting",
        Status::Connected => "connected",
    }
}

fn health_label(h: Health) -> &'static str {
    match h {
        Health::Healthy => "healthy",
        Health::Degraded => "degraded",
        Health::Dead => "dead",
        Health::RateLimited => "rate_limited",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_as_words() {
        assert_eq!(count(1, "refusal"), "1 refusal");
        assert_eq!(count(3, "refusal"), "3 refusals");
        assert_eq!(
            count(2, "penalty for misbehaving"),
            "2 penalties for misbehaving"
        );
        assert_eq!(count(0, "item"), "0 items");
    }
}
