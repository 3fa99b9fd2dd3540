//! `/status`: the [`StatusReport`] as one self-contained HTML page for a
//! person, on a desk or a phone: inline CSS, no script, no external asset,
//! a table that scrolls sideways on a narrow screen, problems first.
//!
//! Every number the page shares with `/metrics` carries the series it
//! equals in a `data-metric` attribute, so a check (`.ci/browser`, the
//! tests) can hold the rendered page against the metrics page without
//! knowing its layout. At most [`ROWS`] relays get a row, the problems
//! first (the view is taken for that window only); the rest (the
//! healthiest) are one line, so thousands of relays cannot make a page of
//! megabytes (`/status.json` pages through them all).
//! Everything a relay or an announcement chose (URLs, problem texts) is
//! escaped.

use std::fmt::Write as _;
use std::time::Duration;

use crate::sans_io::progress::spoken;
use crate::shell::status::{FirstSyncStatus, OwnRelayStatus, RelayStatus, StatusReport};

/// Relays shown as rows at most.
pub(crate) const ROWS: usize = 200;

const STYLE: &str = "\
body{font:15px/1.4 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;padding:12px;\
color:#1d2327;background:#f6f7f7}\
h1{font-size:20px;margin:0}h2{font-size:16px;margin:18px 0 6px}\
.meta{color:#50575e;font-size:13px;margin:2px 0 0}\
section{background:#fff;border:1px solid #dcdcde;border-radius:6px;padding:8px 12px;margin-top:10px}\
section h2{margin-top:0}\
.bar{height:8px;background:#dcdcde;border-radius:4px;overflow:hidden;margin:6px 0}\
.bar span{display:block;height:100%;background:#2271b1}\
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:0}\
dt{color:#50575e}dd{margin:0}\
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch}\
table{border-collapse:collapse;font-size:13px;min-width:100%}\
th,td{text-align:left;padding:4px 6px;border-bottom:1px solid #eee;vertical-align:top;white-space:nowrap}\
td.url{white-space:normal;overflow-wrap:anywhere;min-width:12.5em;max-width:20em}\
td.why{white-space:normal;min-width:9em}\
th{background:#f0f0f1;position:sticky;top:0}\
tr.problem td{background:#fcf0f1}tr.problem td:first-child{border-left:3px solid #d63638}\
.state{font-weight:600}.ok{color:#00a32a}.warn{color:#996800}.bad{color:#d63638}\
.num{text-align:right;font-variant-numeric:tabular-nums}\
.more{color:#50575e;font-size:13px}";

/// The page for `report`.
pub(crate) fn render(report: &StatusReport) -> String {
    let mut out = String::with_capacity(8 * 1024 + 600 * report.relays.len().min(ROWS));
    let problems = report.problems_total;
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>grasp-sync: {problems} problems, {} relays</title><style>{STYLE}</style></head><body>",
        report.relays_total
    );
    header(&mut out, report);
    first_sync(&mut out, &report.first_sync, report.generated_at);
    own_relay(&mut out, &report.own_relay);
    state_file(&mut out, report);
    relays(&mut out, report, problems);
    out.push_str("</body></html>\n");
    out
}

fn header(out: &mut String, r: &StatusReport) {
    let _ = write!(
        out,
        "<header><h1>grasp-sync status</h1><p class=\"meta\">version {} · shard {}/{} · \
         taken {} · up {}</p></header>",
        escape(&r.version),
        r.shard[0],
        r.shard[1],
        clock(r.generated_at),
        spoken(Duration::from_secs(
            r.generated_at.saturating_sub(r.started_at)
        ))
    );
}

fn first_sync(out: &mut String, f: &FirstSyncStatus, now: u64) {
    let percent = (f.relays_done * 100)
        .checked_div(f.relays_total)
        .unwrap_or(100);
    let when = match (f.finished_at, f.eta_secs) {
        (Some(at), _) => format!("done {}", relative(at, now)),
        (None, Some(eta)) => format!("about {} left", spoken(Duration::from_secs(eta))),
        (None, None) => "time left unknown".to_owned(),
    };
    let _ = write!(
        out,
        "<section id=\"first-sync\"><h2>First sync: {}</h2>\
         <div class=\"bar\"><span style=\"width:{percent}%\"></span></div><p>\
         <b data-metric=\"grasp_sync_first_sync_relays{{state=&quot;done&quot;}}\">{}</b> of \
         <b id=\"relays-total\">{}</b> relays done, \
         <b data-metric=\"grasp_sync_first_sync_relays{{state=&quot;failing&quot;}}\">{}</b> failing · \
         <b data-metric=\"grasp_sync_sink_events_total{{outcome=&quot;stored&quot;}}\">{}</b> events stored · \
         <b data-metric=\"grasp_sync_sink_stored_per_second\">{}</b> events/s · {when}</p></section>",
        escape(&f.state),
        f.relays_done,
        f.relays_total,
        f.relays_failing,
        f.events_stored,
        f.events_per_sec,
    );
}

fn own_relay(out: &mut String, o: &OwnRelayStatus) {
    let link = |up: Option<bool>| match up {
        Some(true) => "<span class=\"ok\">open</span>",
        Some(false) => "<span class=\"bad\">down</span>",
        None => "none",
    };
    let throttled = match o.throttled_per_minute {
        Some(n) => format!(
            "<span class=\"warn\">yes: it takes <b data-metric=\"grasp_sync_own_relay_accepted_per_minute\">{n}</b> events a minute</span>"
        ),
        None => "no".to_owned(),
    };
    let _ = write!(
        out,
        "<section id=\"own-relay\"><h2>Own relay</h2><dl>\
         <dt>URL</dt><dd>{}</dd>\
         <dt>Write link</dt><dd>{} ({} failures in a row)</dd><dt>Read link</dt><dd>{}</dd>\
         <dt>Throughput</dt><dd>{} events/s stored</dd><dt>Throttling</dt><dd>{throttled}</dd>\
         <dt>Backlog</dt><dd><b data-metric=\"grasp_sync_outbox_depth\">{}</b> of \
         <b data-metric=\"grasp_sync_outbox_capacity\">{}</b> in the outbox, {} held back, \
         reads of {} relays paused</dd>\
         <dt>Delivered</dt><dd>{} stored, \
         <b data-metric=\"grasp_sync_sink_events_total{{outcome=&quot;duplicate&quot;}}\">{}</b> duplicate, \
         <b data-metric=\"grasp_sync_sink_events_total{{outcome=&quot;rejected&quot;}}\">{}</b> rejected, \
         <b data-metric=\"grasp_sync_sink_events_total{{outcome=&quot;set_aside&quot;}}\">{}</b> set aside</dd>\
         </dl></section>",
        escape(&o.url),
        link(o.write_connected),
        o.failures,
        link(o.read_connected),
        o.stored_per_sec,
        o.outbox_depth,
        o.outbox_capacity,
        o.held_back,
        o.reads_paused,
        o.stored,
        o.duplicate,
        o.rejected,
        o.set_aside,
    );
}

fn state_file(out: &mut String, r: &StatusReport) {
    let Some(f) = &r.state_file else {
        return;
    };
    let saved = match (f.saved_at, f.saved_bytes) {
        (Some(at), Some(bytes)) => format!("{} ({bytes} bytes)", when(at, r.generated_at)),
        _ => "not yet".to_owned(),
    };
    let error = f.error.as_deref().map_or(String::new(), |e| {
        format!("<dt>Last error</dt><dd class=\"bad\">{}</dd>", escape(e))
    });
    let _ = write!(
        out,
        "<section id=\"state-file\"><h2>State file</h2><dl><dt>Path</dt><dd>{}</dd>\
         <dt>Last save</dt><dd>{saved}</dd>{error}</dl></section>",
        escape(&f.path)
    );
}

fn relays(out: &mut String, r: &StatusReport, problems: usize) {
    let t = &r.totals;
    let _ = write!(
        out,
        "<section id=\"relays\"><h2>Relays: <span id=\"relays-count\">{}</span>, \
         <span id=\"problems-count\">{problems}</span> with problems</h2>\
         <p class=\"meta\"><b data-metric=\"grasp_sync_events_total{{outcome=&quot;received&quot;}}\">{}</b> events received, \
         <b data-metric=\"grasp_sync_events_total{{outcome=&quot;ingested&quot;}}\">{}</b> new to the sink, \
         <b data-metric=\"grasp_sync_refusals_total\">{}</b> refusals</p>\
         <div class=\"scroll\"><table><thead><tr><th>Relay</th><th>State</th><th>Problem</th>\
         <th>History</th><th>Items q/p/c/u</th><th>Limits</th><th>Last event</th>\
         <th class=\"num\">Events</th><th class=\"num\">New</th><th class=\"num\">Refusals</th>\
         </tr></thead><tbody>",
        r.relays_total, t.events_received, t.events_ingested, t.refusals
    );
    let shown = &r.relays[..r.relays.len().min(ROWS)];
    for relay in shown {
        row(out, relay, r.generated_at);
    }
    out.push_str("</tbody></table></div>");
    let hidden = r.relays_total.saturating_sub(r.relays_offset + shown.len());
    if hidden > 0 {
        let problems_shown = shown.iter().filter(|x| x.problem.is_some()).count();
        let healthy = hidden.saturating_sub(problems.saturating_sub(problems_shown));
        let _ = write!(
            out,
            "<p class=\"more\" id=\"more\">{hidden} more relays ({healthy} healthy) are not shown: \
             <a href=\"status.json\">status.json</a> pages through them all \
             (<code>?offset=</code>, <code>?limit=</code>).</p>"
        );
    }
    out.push_str("</section>");
}

fn row(out: &mut String, r: &RelayStatus, now: u64) {
    let class = match r.state.as_str() {
        "live" => "ok",
        "syncing" | "connecting" | "idle" => "warn",
        _ => "bad",
    };
    let retry = r
        .retry_at
        .map_or(String::new(), |at| format!(", retry {}", relative(at, now)));
    let cap = r
        .limits
        .result_cap
        .map_or("?".to_owned(), |c| c.to_string());
    let neg = match r.negentropy {
        Some(true) => " · NIP-77",
        Some(false) => " · no NIP-77",
        None => "",
    };
    let value = r
        .limits
        .value_bytes
        .map_or(String::new(), |b| format!(" · values ≤{b} B"));
    let last = r
        .last_event_at
        .map_or("never".to_owned(), |at| when(at, now));
    let [q, p, c, u] = r.items;
    let _ = write!(
        out,
        "<tr{} data-state=\"{}\" data-health=\"{}\"><td class=\"url\">{}</td>\
         <td><span class=\"state {class}\">{}</span>{retry}</td><td class=\"why\">{}</td>\
         <td>{}</td><td>{q}/{p}/{c}/{u}</td>\
         <td>cap {cap} · {} subs · {} tags{value}{neg}</td><td>{last}</td>\
         <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
        if r.problem.is_some() {
            " class=\"problem\""
        } else {
            ""
        },
        escape(&r.state),
        escape(&r.health),
        escape(&r.url),
        escape(&r.state).replace('_', " "),
        r.problem.as_deref().map_or(String::new(), escape),
        if r.history_done { "done" } else { "reading" },
        r.limits.subscriptions,
        r.limits.tag_values,
        r.events_received,
        r.events_ingested,
        r.refusals,
    );
}

/// `at` as a UTC clock time with how long ago or ahead it is.
fn when(at: u64, now: u64) -> String {
    format!("{} ({})", clock(at), relative(at, now))
}

/// "in 42 s", "3 min ago", "now".
fn relative(at: u64, now: u64) -> String {
    match at.cmp(&now) {
        std::cmp::Ordering::Greater => format!("in {}", spoken(Duration::from_secs(at - now))),
        std::cmp::Ordering::Less => format!("{} ago", spoken(Duration::from_secs(now - at))),
        std::cmp::Ordering::Equal => "now".to_owned(),
    }
}

/// Unix seconds as `2026-12-03 08:21:31 UTC` (the proleptic Gregorian
/// calendar, from days since the epoch).
fn clock(unix: u64) -> String {
    let (days, secs) = (unix / 86_400, unix % 86_400);
    // Howard Hinnant's civil_from_days, for days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        secs / 3_600,
        secs % 3_600 / 60,
        secs % 60
    )
}

/// Text made safe for HTML content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_times_are_utc_calendar_dates() {
        assert_eq!(clock(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(clock(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(clock(1_796_286_091), "2026-12-03 08:21:31 UTC");
    }

    #[test]
    fn times_read_relative_to_now() {
        assert_eq!(relative(142, 100), "in 42 s");
        assert_eq!(relative(100, 280), "3 min ago");
        assert_eq!(relative(5, 5), "now");
    }

    fn relay(i: usize, problem: bool) -> RelayStatus {
        RelayStatus {
            url: format!("wss://relay{i}.example/<b>"),
            state: if problem { "dead" } else { "live" }.to_owned(),
            problem: problem.then(|| "unreachable; 9 failures in a row".to_owned()),
            status: "connected".to_owned(),
            health: "healthy".to_owned(),
            retry_at: None,
            failures: 0,
            penalties: 0,
            connected_at: Some(1_000),
            disconnected_at: None,
            history_done: true,
            live: true,
            items: [0, 0, 12, 0],
            subscriptions_open: 2,
            live_filters: 3,
            limits: crate::shell::status::LimitsStatus {
                subscriptions: 10,
                filters_per_req: 10,
                page_limit: 500,
                result_cap: Some(100),
                tag_values: 100,
                kinds: None,
                value_bytes: Some(255),
            },
            negentropy: Some(true),
            last_event_at: Some(1_900),
            events_received: 1_234,
            events_ingested: 1_000,
            refusals: 0,
            bootstrap: false,
        }
    }

    fn report(relays: Vec<RelayStatus>) -> StatusReport {
        let json = r#"{"schema":2,"version":"0.1.0","generated_at":2000,"started_at":1000,
            "shard":[0,1],"first_sync":{"state":"done","relays_total":1,"relays_done":1,
            "relays_failing":0,"items_total":12,"items_done":12,"events_stored":5,
            "events_per_sec":0.5,"eta_secs":null,"finished_at":1500},"own_relay":{
            "url":"ws://127.0.0.1:7777","write_connected":true,"read_connected":true,
            "failures":0,"stored_per_sec":0.5,"throttled_per_minute":null,"outbox_depth":0,
            "outbox_capacity":10000,"held_back":0,"reads_paused":0,"stored":5,"duplicate":0,
            "rejected":0,"set_aside":0,"refusals":0},"state_file":null,"totals":{
            "events_received":5,"events_ingested":5,"refusals":0,"bytes_in":1,"bytes_out":1},
            "relays_total":0,"problems_total":0,"relays_offset":0,"relays_limit":200,
            "relays":[]}"#;
        let mut report: StatusReport = serde_json::from_str(json).unwrap();
        report.relays_total = relays.len();
        report.problems_total = relays.iter().filter(|r| r.problem.is_some()).count();
        report.relays = relays;
        report
    }

    #[test]
    fn thousands_of_relays_make_a_page_of_rows_for_the_first_only() {
        let relays: Vec<_> = (0..5_000).map(|i| relay(i, i < 10)).collect();
        let mut view = report(relays);
        view.relays.truncate(ROWS);
        let page = render(&view);
        assert!(page.len() < 200 * 1024, "{} bytes", page.len());
        assert_eq!(page.matches("<tr class=\"problem\"").count(), 10);
        assert_eq!(
            page.matches("<tr").count(),
            ROWS + 1,
            "the header and the rows"
        );
        assert!(page.contains("4800 more relays (4800 healthy) are not shown"));
        assert!(!page.contains("<b>"), "what relays chose is escaped");
    }

    #[test]
    fn what_relays_choose_is_escaped() {
        assert_eq!(
            escape("wss://x/<script>\"&'"),
            "wss://x/&lt;script&gt;&quot;&amp;&#39;"
        );
    }
}
