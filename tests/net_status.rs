//! `/status.json` and `/status` of the real shell over loopback: the same
//! numbers as `/metrics`, relays with problems first, the first sync
//! completed, and a page that is self-contained HTML.

mod support;

use std::collections::BTreeMap;

use grasp_sync::status::StatusReport;
use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use serde_json::Value;
use support::running::*;
use support::*;

/// `docs/status.schema.json`.
static SCHEMA: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| {
    serde_json::from_str(include_str!("../docs/status.schema.json")).expect("the schema parses")
});

/// `value` as `schema` (the parts of JSON Schema the file uses: `$ref`,
/// `oneOf`, `type`, `enum`, `const`, `required`, `properties`, `items`)
/// has it, every field documented; panics naming the `path` that is not.
fn conforms(value: &Value, schema: &Value, path: &str) {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.rsplit('/').next().unwrap();
        return conforms(value, &SCHEMA["$defs"][name], path);
    }
    if let Some(options) = schema["oneOf"].as_array() {
        let fits = |s: &Value| std::panic::catch_unwind(|| conforms(value, s, path)).is_ok();
        assert!(options.iter().any(fits), "{path}: none of oneOf");
        return;
    }
    let kind = match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    let fits = |t: &&str| *t == kind || (*t == "number" && kind == "integer");
    assert!(
        types.is_empty() || types.iter().any(fits),
        "{path}: {kind}, not {types:?}"
    );
    if let Some(allowed) = schema["enum"].as_array() {
        assert!(
            allowed.contains(value),
            "{path}: {value} not in {allowed:?}"
        );
    }
    if !schema["const"].is_null() {
        assert_eq!(value, &schema["const"], "{path}");
    }
    if let Value::Object(fields) = value {
        for name in schema["required"].as_array().into_iter().flatten() {
            let name = name.as_str().unwrap();
            assert!(fields.contains_key(name), "{path}.{name} missing");
        }
        for (name, field) in fields {
            let documented = &schema["properties"][name];
            assert!(documented.is_object(), "{path}.{name} is not in the schema");
            conforms(field, documented, &format!("{path}.{name}"));
        }
    }
    if let (Value::Array(items), Some(each)) = (value, schema.get("items")) {
        for (i, item) in items.iter().enumerate() {
            conforms(item, each, &format!("{path}[{i}]"));
        }
    }
}

/// A relay URL where nothing listens: connects are refused.
fn dead_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("ws://127.0.0.1:{port}")
}

/// The body of an HTTP response.
fn body(response: &str) -> &str {
    response.split_once("\r\n\r\n").expect("a body").1
}

/// Every `grasp_sync_*` series of a metrics page and its value, but the
/// port's count of its own renders (which the fetches here move).
fn series(page: &str) -> BTreeMap<String, f64> {
    body(page)
        .lines()
        .filter(|l| l.starts_with("grasp_sync_"))
        .filter(|l| !l.starts_with("grasp_sync_metrics_renders_total"))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// `/metrics`, `/status.json`, `/status` and `/metrics` again, until both
/// metrics pages agree: what the status pages say was true while both
/// were taken (the engine keeps working between requests). A status page
/// is shared for a second after its render: each round first outwaits
/// the ones taken before, so its pages are rendered between its two
/// metrics pages.
fn consistent(running: &Running) -> (BTreeMap<String, f64>, StatusReport, String) {
    for _ in 0..50 {
        std::thread::sleep(std::time::Duration::from_millis(1_100));
        let before = series(&http_get(running.metrics, "/metrics"));
        let json = http_get(running.metrics, "/status.json");
        let html = http_get(running.metrics, "/status");
        if before == series(&http_get(running.metrics, "/metrics")) {
            let report = serde_json::from_str(body(&json)).expect("status.json parses");
            return (before, report, html);
        }
    }
    panic!("the metrics never held still over a status fetch");
}

#[test]
fn status_json_and_page_agree_with_metrics_and_list_problems_first() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let b = TestRelay::start(RelayOptions::default()).unwrap();
    let dead = dead_url();
    let owner = keys(1);
    own.publish(announcement(
        &owner,
        "repo",
        &[&a.url(), &b.url(), &dead, &own.url()],
        T0,
    ));
    let repo = coord(&owner, "repo");
    let history: Vec<_> = (0..6)
        .map(|i| root(&keys(2), 1621, &[&repo], T0 + i, "an issue"))
        .collect();
    for (i, e) in history.iter().enumerate() {
        if i % 2 == 0 { &a } else { &b }.publish(e.clone());
    }
    let running = Running::start(&own, |_, _| {});
    assert!(wait_for(30, || missing(&own, &history) == 0));
    assert!(
        wait_for(60, || {
            let json = http_get(running.metrics, "/status.json");
            body(&json).contains(r#""first_sync":{"state":"done""#)
        }),
        "the first sync completes"
    );

    let (m, report, html) = consistent(&running);
    let json: Value = serde_json::to_value(&report).unwrap();
    conforms(&json, &SCHEMA, "status.json");
    let metric = |s: &str| *m.get(s).unwrap_or_else(|| panic!("{s} exported"));
    let f = &report.first_sync;
    assert_eq!((f.relays_total, f.relays_done, f.relays_failing), (3, 2, 1));
    assert_eq!(
        f.relays_done as f64,
        metric(r#"grasp_sync_first_sync_relays{state="done"}"#)
    );
    assert_eq!(
        f.relays_failing as f64,
        metric(r#"grasp_sync_first_sync_relays{state="failing"}"#)
    );
    assert_eq!(
        metric(r#"grasp_sync_first_sync_relays{state="remaining"}"#),
        0.0
    );
    assert_eq!(metric("grasp_sync_first_sync_done"), 1.0);
    assert!(!m.contains_key("grasp_sync_first_sync_eta_seconds"));
    assert_eq!(f.events_stored, history.len() as u64, "the issues");
    assert_eq!(
        f.events_stored as f64,
        metric(r#"grasp_sync_sink_events_total{outcome="stored"}"#)
    );
    assert_eq!(
        f.events_per_sec,
        metric("grasp_sync_sink_stored_per_second")
    );

    let t = &report.totals;
    for (value, series) in [
        (
            t.events_received,
            r#"grasp_sync_events_total{outcome="received"}"#,
        ),
        (
            t.events_ingested,
            r#"grasp_sync_events_total{outcome="ingested"}"#,
        ),
        (t.refusals, "grasp_sync_refusals_total"),
        (t.bytes_in, r#"grasp_sync_bytes_total{direction="in"}"#),
        (t.bytes_out, r#"grasp_sync_bytes_total{direction="out"}"#),
    ] {
        assert_eq!(value as f64, metric(series), "{series}");
    }
    let sum = |f: fn(&grasp_sync::status::RelayStatus) -> u64| -> u64 {
        report.relays.iter().map(f).sum()
    };
    assert_eq!(sum(|r| r.events_received), t.events_received);
    assert_eq!(sum(|r| r.events_ingested), t.events_ingested);
    assert_eq!(sum(|r| r.refusals) + report.own_relay.refusals, t.refusals);
    for status in ["disconnected", "connecting", "connected"] {
        let n = report.relays.iter().filter(|r| r.status == status).count();
        let series = format!(r#"grasp_sync_relays{{status="{status}"}}"#);
        assert_eq!(n as f64, metric(&series), "{series}");
    }
    for health in ["healthy", "degraded", "dead", "rate_limited"] {
        let n = report.relays.iter().filter(|r| r.health == health).count();
        let series = format!(r#"grasp_sync_relays_health{{health="{health}"}}"#);
        assert_eq!(n as f64, metric(&series), "{series}");
    }
    let o = &report.own_relay;
    assert_eq!(o.write_connected, Some(true));
    assert_eq!(o.read_connected, Some(true));
    assert_eq!(
        o.outbox_capacity as f64,
        metric("grasp_sync_outbox_capacity")
    );

    // Problems first: the relay nothing answers, then the healthy two.
    let urls: Vec<&str> = report.relays.iter().map(|r| r.url.as_str()).collect();
    assert_eq!(urls[0], dead, "{urls:?}");
    let first = &report.relays[0];
    assert!(first.problem.is_some() && first.failures > 0, "{first:?}");
    assert!(matches!(
        first.state.as_str(),
        "backing_off" | "failing" | "connecting"
    ));
    for r in &report.relays[1..] {
        assert_eq!(
            (r.state.as_str(), r.problem.as_deref()),
            ("live", None),
            "{r:?}"
        );
        assert!(r.history_done && r.live && r.last_event_at.is_some());
        assert_eq!(r.events_ingested, 3);
    }

    // The page: self-contained HTML, the same order, the same numbers.
    assert!(html.starts_with("HTTP/1.1 200 OK\r\n"));
    assert!(html.contains("Content-Type: text/html; charset=utf-8\r\n"));
    let page = body(&html);
    assert!(page.starts_with("<!DOCTYPE html>") && page.ends_with("</html>\n"));
    assert!(
        page.contains(r#"<meta name="viewport" content="width=device-width, initial-scale=1">"#)
    );
    for outside in [
        "<script", "<link", "src=", "http://", "https://", "@import", "url(",
    ] {
        assert!(!page.contains(outside), "self-contained: found {outside}");
    }
    let at = |url: &str| {
        page.find(&format!(">{url}<"))
            .unwrap_or_else(|| panic!("{url} shown"))
    };
    assert!(at(&dead) < at(urls[1]) && at(urls[1]) < at(urls[2]));
    let mut shown = 0;
    for (series, value) in data_metrics(page) {
        assert_eq!(value, metric(&series), "the page's {series}");
        shown += 1;
    }
    assert!(
        shown >= 10,
        "the page's numbers carry their series: {shown}"
    );
    running.stop();
}

/// Every `data-metric="series">value<` on the page.
fn data_metrics(page: &str) -> Vec<(String, f64)> {
    page.split(r#"data-metric=""#)
        .skip(1)
        .map(|rest| {
            let (series, rest) = rest.split_once('"').expect("a closed attribute");
            let value = rest[1..].split('<').next().expect("a value");
            (
                series.replace("&quot;", "\""),
                value
                    .parse()
                    .unwrap_or_else(|_| panic!("{series}: {value:?}")),
            )
        })
        .collect()
}
