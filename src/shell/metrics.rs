//! Prometheus text exposition of the engine's and the shell's counters
//! (served by `metrics_server`).

use std::fmt::Write as _;

use crate::sans_io::engine::Engine;
use crate::sans_io::engine::Offence;
use crate::sans_io::engine::Stats;
use crate::sans_io::engine::Status;
use crate::sans_io::own_relay::outbox::{OutboxStats, OwnRefusal};
use crate::sans_io::progress::Progress;
use crate::sans_io::timing::health::Health;
use crate::sans_io::timing::time::Time;
use crate::shell::process_metrics::ProcessStats;

/// Counters only the shell knows.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ShellStats {
    /// Websocket payload bytes received.
    pub bytes_in: u64,
    /// Websocket payload bytes sent.
    pub bytes_out: u64,
    /// Connections refused by the address guard (websockets and NIP-11
    /// fetches alike: one guard for every socket to a relay).
    pub address_refused: u64,
    /// Connections refused by the relay cap.
    pub relay_cap_refused: u64,
    /// DNS lookups failed or timed out (for websockets and NIP-11 fetches).
    pub dns_failures: u64,
    /// Events handed to a custom sink.
    pub sink_stored: u64,
    /// Events the own relay listed for negentropy (ids only kept).
    pub sink_listed: u64,
    /// Times a relay's reads were paused for exceeding its frame rate.
    pub reads_throttled: u64,
    /// Relay connections cut for leaving a message unfinished too long.
    pub unfinished_cut: u64,
    /// NIP-11 documents fetched and read.
    pub relay_info_ok: u64,
    /// NIP-11 fetches that failed (refused address, DNS, connect, TLS,
    /// status, size, deadline, not a JSON object, cut by shutdown).
    pub relay_info_failed: u64,
    /// NIP-11 fetches not started: shutdown came while they waited.
    pub relay_info_skipped: u64,
    /// Metrics connections closed to make room for a newer one.
    pub metrics_evicted: u64,
    /// Pages the metrics port rendered: `/metrics` (one per scrape),
    /// `/status`, `/status.json` (each shared by the requests of its
    /// second).
    pub metrics_renders: [u64; 3],
}

/// The sink's view for metrics.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SinkView {
    /// Whether the websocket to the own relay is open; `None` for a custom
    /// sink, which has no connection to watch.
    pub own_relay_open: Option<bool>,
    /// Events waiting or in flight to the own relay.
    pub outbox_depth: usize,
    /// Events the outbox holds before remote reads pause.
    pub outbox_capacity: usize,
    /// Own-relay delivery counters.
    pub outbox: OutboxStats,
    /// Events a minute the own relay takes while it rate-limits us.
    pub accepted_per_minute: Option<u64>,
    /// Failed connects or lost connections to the own relay in a row.
    pub own_relay_failures: u32,
    /// Listing pages the own relay left silent, asked again.
    pub listings_unanswered: u64,
}

impl SinkView {
    /// Events the sink stored that it did not have (the outcome `stored`
    /// of `grasp_sync_sink_events_total`).
    pub(crate) fn stored_new(&self, shell: &ShellStats) -> u64 {
        self.outbox.stored.saturating_sub(self.outbox.duplicate) + shell.sink_stored
    }
}

/// Renders every metric as Prometheus text.
pub(crate) fn render(engine: &Engine, now: Time, shell: &ShellStats, sink: &SinkView) -> String {
    let mut out = String::with_capacity(4096);
    let s = engine.stats();
    build_info(&mut out);
    shard_info(&mut out, engine);
    relays(&mut out, engine, now, s, shell);
    subscriptions(&mut out, engine);
    events(&mut out, s);
    relay_conduct(&mut out, engine, s);
    history(&mut out, s, shell);
    connections_and_pages(&mut out, s, shell);
    requests(&mut out, s, sink);
    own_relay(&mut out, engine, sink);
    sink_outcomes(&mut out, engine, s, shell, sink);
    counter_labeled(
        &mut out,
        "grasp_sync_bytes_total",
        "Websocket payload bytes.",
        "direction",
        &[("in", shell.bytes_in), ("out", shell.bytes_out)],
    );
    ProcessStats::read().render(&mut out);
    out
}

/// This shard's remote relays by connection status and by health, and
/// connect attempts by result.
fn relays(out: &mut String, engine: &Engine, now: Time, s: &Stats, shell: &ShellStats) {
    let (status, health) = count_relays(engine, now);
    gauge_labeled(
        out,
        "grasp_sync_relays",
        "This shard's remote relays by connection status (the own relay: grasp_sync_own_relay_connected).",
        "status",
        &[
            ("disconnected", status[0] as u64),
            ("connecting", status[1] as u64),
            ("connected", status[2] as u64),
        ],
    );
    gauge_labeled(
        out,
        "grasp_sync_relays_health",
        "This shard's remote relays by health.",
        "health",
        &[
            ("healthy", health[0] as u64),
            ("degraded", health[1] as u64),
            ("dead", health[2] as u64),
            ("rate_limited", health[3] as u64),
        ],
    );
    counter_labeled(
        out,
        "grasp_sync_connection_attempts_total",
        "Connect attempts by result.",
        "result",
        &[
            ("started", s.connects),
            ("failed", s.connect_failures),
            ("address_refused", shell.address_refused),
            ("relay_cap_refused", shell.relay_cap_refused),
            ("dns_failed", shell.dns_failures),
        ],
    );
}

/// This shard's remote relays by connection status (disconnected,
/// connecting, connected) and by health (healthy, degraded, dead, rate
/// limited).
fn count_relays(engine: &Engine, now: Time) -> ([usize; 3], [usize; 4]) {
    let mut status = [0usize; 3];
    let mut health = [0usize; 4];
    // This shard's remote relays only: another shard's relays are its
    // engine's to count, and the own relay has gauges of its own.
    let (own, shard) = (engine.own_relay(), engine.shard());
    let counted = engine
        .relays()
        .filter(|&r| r != own && shard.owns(engine.relay_url(r)));
    for relay in counted {
        status[match engine.relay_status(relay) {
            Status::Disconnected => 0,
            Status::Connecting => 1,
            Status::Connected => 2,
        }] += 1;
        health[match engine.relay_health(relay, now) {
            Health::Healthy => 0,
            Health::Degraded => 1,
            Health::Dead => 2,
            Health::RateLimited => 3,
        }] += 1;
    }
    (status, health)
}

/// Subscriptions open and batches waiting for EOSE, on all relays.
fn subscriptions(out: &mut String, engine: &Engine) {
    let (mut subs, mut pending) = (0, 0);
    for relay in engine.relays() {
        subs += engine.open_subscriptions(relay);
        pending += engine.pending_batches(relay);
    }
    gauge(
        out,
        "grasp_sync_subscriptions_open",
        "Subscriptions open on all relays.",
        subs as u64,
    );
    gauge(
        out,
        "grasp_sync_pending_batches",
        "Batches waiting for EOSE.",
        pending as u64,
    );
}

/// Events from remote relays by outcome, and messages that were no
/// event to take.
fn events(out: &mut String, s: &Stats) {
    counter_labeled(
        out,
        "grasp_sync_events_total",
        "Events from remote relays by outcome.",
        "outcome",
        &[
            ("received", s.events_received),
            ("duplicate", s.events_duplicate),
            ("invalid", s.events_invalid),
            ("unwanted", s.events_unwanted),
            ("ingested", s.events_ingested),
        ],
    );
    counter(
        out,
        "grasp_sync_messages_malformed_total",
        "Relay messages that were not nostr JSON.",
        s.messages_malformed,
    );
    counter(
        out,
        "grasp_sync_messages_oversized_total",
        "Relay messages skipped for exceeding --max-frame-bytes (not an offence).",
        s.messages_oversized,
    );
}

/// How relays and the announcements they carry behaved: offences, input
/// refused or damped, penalties, and NIP-42 AUTH.
fn relay_conduct(out: &mut String, engine: &Engine, s: &Stats) {
    let offences: Vec<(&str, u64)> = Offence::ALL
        .iter()
        .map(|o| (o.label(), s.offences[*o as usize]))
        .collect();
    counter_labeled(
        out,
        "grasp_sync_relay_offences_total",
        "Misbehaviour by relays, by kind.",
        "offence",
        &offences,
    );
    let ix = engine.index().stats();
    counter_labeled(
        out,
        "grasp_sync_announcement_input_total",
        "Hostile or sloppy announcement input refused or damped, by what.",
        "what",
        &[
            ("announcement_rejected", ix.announcements_rejected),
            ("relay_url_rejected", ix.relay_urls_rejected),
            ("relay_url_over_cap", ix.relay_urls_over_cap),
            ("relay_change_held", ix.relay_changes_held),
        ],
    );
    counter(
        out,
        "grasp_sync_relay_penalties_total",
        "Relays cut and backed off longer for repeated misbehaviour.",
        s.penalties,
    );
    counter_labeled(
        out,
        "grasp_sync_auth_total",
        "NIP-42: AUTH sent, rejected, and subscriptions refused with auth-required.",
        "event",
        &[
            ("attempt", s.auth_attempts),
            ("rejected", s.auth_failures),
            ("auth_required", s.auth_required),
        ],
    );
}

/// Reading history whole: NIP-77 reconciliation, what a relay cannot be
/// asked for, and seconds asked again in parts.
fn history(out: &mut String, s: &Stats, shell: &ShellStats) {
    counter_labeled(
        out,
        "grasp_sync_negentropy_total",
        "NIP-77: sessions, NEG-MSG rounds, ids found missing, fallbacks to REQ (over_id_budget: those of them that would have held more missing ids than the engine's bound over all relays), jobs that fetched a filter's missing ids while reconciling the next (fetched_ahead), filters or windows the relay refused for their size split in two time windows reconciled apart (size_split), jobs skipped (nothing held), events the sink listed.",
        "event",
        &[
            ("session", s.neg_sessions),
            ("round", s.neg_rounds),
            ("id_fetched", s.neg_ids_fetched),
            ("fallback", s.neg_fallbacks),
            ("over_id_budget", s.neg_over_id_budget),
            ("fetched_ahead", s.neg_fetched_ahead),
            ("size_split", s.neg_size_splits),
            ("skipped_nothing_held", s.neg_skipped),
            ("sink_listed", shell.sink_listed),
        ],
    );
    counter_labeled(
        out,
        "grasp_sync_unreachable_total",
        "What a relay cannot be asked for: items with a value it refuses (value), seconds holding more events than it returns that no split or NIP-77 read whole (second; second_unverified where its cap is unknown, so the second may hold no more).",
        "cause",
        &[
            ("value", s.items_unaskable),
            ("second", s.seconds_unreachable),
            ("second_unverified", s.seconds_unverified),
        ],
    );
    counter(
        out,
        "grasp_sync_seconds_split_total",
        "Seconds holding more events for a filter than the relay returns, asked again in parts or by NIP-77.",
        s.seconds_split,
    );
}

/// Connections paused, cut or refused, the metrics port's pages, and
/// NIP-11 fetches.
fn connections_and_pages(out: &mut String, s: &Stats, shell: &ShellStats) {
    counter(
        out,
        "grasp_sync_reads_throttled_total",
        "Times a relay's reads paused for exceeding --max-frames-per-sec.",
        shell.reads_throttled,
    );
    counter(
        out,
        "grasp_sync_metrics_connections_evicted_total",
        "Metrics connections closed early to make room for a newer one.",
        shell.metrics_evicted,
    );
    let [metrics, status, status_json] = shell.metrics_renders;
    counter_labeled(
        out,
        "grasp_sync_metrics_renders_total",
        "Pages the metrics port rendered; a status page is shared by every request within a second of it, /metrics is rendered per scrape.",
        "page",
        &[
            ("metrics", metrics),
            ("status", status),
            ("status_json", status_json),
        ],
    );
    counter(
        out,
        "grasp_sync_unfinished_cut_total",
        "Relay connections cut for leaving a message unfinished past its deadline.",
        shell.unfinished_cut,
    );
    counter_labeled(
        out,
        "grasp_sync_relay_info_total",
        "NIP-11 relay information fetches by result.",
        "result",
        &[
            ("ok", shell.relay_info_ok),
            ("failed", shell.relay_info_failed),
            ("skipped", shell.relay_info_skipped),
        ],
    );
    counter(
        out,
        "grasp_sync_upgrades_refused_total",
        "Websocket upgrades a relay answered with an HTTP error (429/503 cool down).",
        s.upgrades_refused,
    );
}

/// REQs sent and how their subscriptions and batches ended.
fn requests(out: &mut String, s: &Stats, sink: &SinkView) {
    counter(
        out,
        "grasp_sync_reqs_total",
        "REQ messages sent.",
        s.reqs_sent,
    );
    counter(
        out,
        "grasp_sync_refusals_total",
        "Subscriptions refused or closed by relays.",
        s.refusals,
    );
    counter_labeled(
        out,
        "grasp_sync_batches_total",
        "Pending batches by end.",
        "result",
        &[
            ("confirmed", s.batches_confirmed),
            ("failed", s.batches_failed),
        ],
    );
    counter(
        out,
        "grasp_sync_unanswered_subscriptions_total",
        "Subscriptions a relay left silent (no event, EOSE or refusal) while answering later ones, asked again (remote relays' subscriptions and the own relay's listing pages).",
        s.unanswered + sink.listings_unanswered,
    );
    counter(
        out,
        "grasp_sync_consolidations_total",
        "Live subscription consolidations.",
        s.consolidations,
    );
}

/// The outbox to the own relay, and whether its links are open.
fn own_relay(out: &mut String, engine: &Engine, sink: &SinkView) {
    gauge(
        out,
        "grasp_sync_outbox_depth",
        "Events waiting for the own relay.",
        sink.outbox_depth as u64,
    );
    gauge(
        out,
        "grasp_sync_outbox_capacity",
        "Events the outbox holds before reads from remote relays pause.",
        sink.outbox_capacity as u64,
    );
    if let Some(open) = sink.own_relay_open {
        let read = engine.relay_status(engine.own_relay()) == Status::Connected;
        gauge_labeled(
            out,
            "grasp_sync_own_relay_connected",
            "1 while each link to the own relay is open: write (synced events go out, and the negentropy listings of what the own relay holds) and read (the self-subscription that sees new repos and roots).",
            "link",
            &[("write", u64::from(open)), ("read", u64::from(read))],
        );
    }
}

/// How the events handed to the sink ended, the own relay's refusals,
/// and what the engine remembers of them.
fn sink_outcomes(
    out: &mut String,
    engine: &Engine,
    s: &Stats,
    shell: &ShellStats,
    sink: &SinkView,
) {
    counter_labeled(
        out,
        "grasp_sync_sink_events_total",
        "Events delivered to the sink by how each ended, once: stored (new), duplicate (the own relay had it), rejected (refused for good), set_aside (too large or struck out); they add up.",
        "outcome",
        &[
            ("stored", sink.stored_new(shell)),
            ("duplicate", sink.outbox.duplicate),
            ("rejected", sink.outbox.rejected),
            ("set_aside", sink.outbox.set_aside),
        ],
    );
    counter(
        out,
        "grasp_sync_sink_retries_total",
        "EVENTs to the own relay put back for another attempt (an event retried twice counts twice).",
        sink.outbox.retried,
    );
    let refusals: Vec<(&str, u64)> = OwnRefusal::ALL
        .iter()
        .map(|r| (r.label(), sink.outbox.refused[*r as usize]))
        .collect();
    counter_labeled(
        out,
        "grasp_sync_own_relay_refusals_total",
        "EVENTs the own relay refused (OK false) by the reason it gave: rate_limited (retried, paced to what it takes), auth_required and error (retried), blocked, invalid, restricted, other (final).",
        "reason",
        &refusals,
    );
    counter(
        out,
        "grasp_sync_refused_skipped_total",
        "Events neither fetched nor offered because the sink refused them for good before (blocked, invalid, over its size limit).",
        s.events_refused_skipped,
    );
    gauge(
        out,
        "grasp_sync_refused_remembered",
        "Event ids the sink refused for good, remembered (bounded, kept in the state file).",
        engine.refused_remembered() as u64,
    );
    if let Some(per_minute) = sink.accepted_per_minute {
        gauge(
            out,
            "grasp_sync_own_relay_accepted_per_minute",
            "While the own relay rate-limits the sync: the events a minute it takes.",
            per_minute,
        );
    }
}

/// The first sync's progress, the sink's pace and the state file's last
/// save (the figures `/status` shows beside them), appended to the page.
pub(crate) fn render_progress(out: &mut String, p: &Progress, saved_at: Option<Time>) {
    gauge_labeled(
        out,
        "grasp_sync_first_sync_relays",
        "The first sync (every relay's history read once after the start): relays done, failing (not done and not healthy: unreachable, refusing, rate-limiting) and remaining; they add up to the relays it reads.",
        "state",
        &[
            ("done", p.relays_done as u64),
            ("failing", p.relays_failing as u64),
            (
                "remaining",
                p.relays_total
                    .saturating_sub(p.relays_done + p.relays_failing) as u64,
            ),
        ],
    );
    gauge(
        out,
        "grasp_sync_first_sync_done",
        "1 once the first sync completed.",
        u64::from(p.finished.is_some()),
    );
    if let Some(eta) = p.eta {
        gauge(
            out,
            "grasp_sync_first_sync_eta_seconds",
            "While the first sync runs: the time left, at the pace relays finished so far.",
            eta.as_secs(),
        );
    }
    header(
        out,
        "grasp_sync_sink_stored_per_second",
        "Events the sink stored a second over the last minute.",
        "gauge",
    );
    let _ = writeln!(
        out,
        "grasp_sync_sink_stored_per_second {}",
        p.events_per_sec
    );
    if let Some(at) = saved_at {
        gauge(
            out,
            "grasp_sync_state_file_saved_timestamp_seconds",
            "When the state file was last written (Unix seconds).",
            at.as_secs(),
        );
    }
}

/// `grasp_sync_build_info{version} 1`: which build runs, for dashboards
/// and for telling a rollout's instances apart.
fn build_info(out: &mut String) {
    header(
        out,
        "grasp_sync_build_info",
        "The running build (version); always 1.",
        "gauge",
    );
    let _ = writeln!(
        out,
        "grasp_sync_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
}

/// `grasp_sync_shard{index,count} 1`: which share of the relays this
/// engine serves, so one dashboard can sum or tell apart N shards.
fn shard_info(out: &mut String, engine: &Engine) {
    let shard = engine.shard();
    header(
        out,
        "grasp_sync_shard",
        "This engine's shard (--shard index/count); always 1.",
        "gauge",
    );
    let (index, count) = (shard.index(), shard.count());
    let _ = writeln!(
        out,
        "grasp_sync_shard{{index=\"{index}\",count=\"{count}\"}} 1"
    );
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn gauge(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, help, "gauge");
    let _ = writeln!(out, "{name} {value}");
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, help, "counter");
    let _ = writeln!(out, "{name} {value}");
}

fn gauge_labeled(out: &mut String, name: &str, help: &str, label: &str, values: &[(&str, u64)]) {
    header(out, name, help, "gauge");
    for (v, n) in values {
        let _ = writeln!(out, "{name}{{{label}=\"{v}\"}} {n}");
    }
}

fn counter_labeled(out: &mut String, name: &str, help: &str, label: &str, values: &[(&str, u64)]) {
    header(out, name, help, "counter");
    for (v, n) in values {
        let _ = writeln!(out, "{name}{{{label}=\"{v}\"}} {n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sans_io::config::Config;
    use crate::sans_io::identity::shard::Shard;

    const T0: Time = Time::from_secs(1);

    /// The value of one series on `page`.
    fn value(page: &str, series: &str) -> Option<u64> {
        page.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn sink_outcomes_partition_and_retries_are_counted_apart() {
        let engine = Engine::new(Config::new("wss://own.example"), T0).unwrap();
        let mut sink = SinkView::default();
        sink.outbox.stored = 10;
        sink.outbox.duplicate = 4;
        sink.outbox.rejected = 1;
        sink.outbox.set_aside = 2;
        sink.outbox.retried = 7;
        let page = render(&engine, T0, &ShellStats::default(), &sink);
        let outcome = |o: &str| {
            value(
                &page,
                &format!("grasp_sync_sink_events_total{{outcome=\"{o}\"}}"),
            )
        };
        assert_eq!(outcome("stored"), Some(6), "new events only");
        assert_eq!(outcome("duplicate"), Some(4));
        let total: u64 = ["stored", "duplicate", "rejected", "set_aside"]
            .iter()
            .map(|o| outcome(o).unwrap())
            .sum();
        assert_eq!(total, 10 + 1 + 2, "each event once");
        assert_eq!(outcome("retried"), None, "a retry is no outcome");
        assert_eq!(value(&page, "grasp_sync_sink_retries_total"), Some(7));
    }

    #[test]
    fn relay_gauges_count_this_shards_remote_relays_only() {
        let shard = Shard::new(0, 2).unwrap();
        let mut config = Config::new("wss://own.example");
        config.shard = shard;
        config.bootstrap = (0..20).map(|i| format!("wss://r{i}.example")).collect();
        let mine = config.bootstrap.iter().filter(|u| shard.owns(u)).count();
        assert!(mine > 0 && mine < 20, "both shards hold some: {mine}");
        let engine = Engine::new(config, T0).unwrap();
        let page = render(&engine, T0, &ShellStats::default(), &SinkView::default());
        let sum = |name: &str, label: &str, values: &[&str]| -> u64 {
            values
                .iter()
                .map(|v| value(&page, &format!("{name}{{{label}=\"{v}\"}}")).unwrap())
                .sum()
        };
        let statuses = ["disconnected", "connecting", "connected"];
        assert_eq!(sum("grasp_sync_relays", "status", &statuses), mine as u64);
        let health = ["healthy", "degraded", "dead", "rate_limited"];
        assert_eq!(
            sum("grasp_sync_relays_health", "health", &health),
            mine as u64
        );
    }

    #[test]
    fn the_build_is_named() {
        let engine = Engine::new(Config::new("wss://own.example"), T0).unwrap();
        let page = render(&engine, T0, &ShellStats::default(), &SinkView::default());
        assert!(page.contains("\ngrasp_sync_build_info{version=\"0.1.0\"} 1\n"));
        assert!(page.contains("\n# TYPE process_start_time_seconds gauge\n"));
    }
}
