//! The Grafana dashboard and the Prometheus alert rules in `examples/` name
//! only metrics, and label values, that a running engine really exports: a
//! renamed metric must break this test, not an operator's dashboard.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use std::time::Duration;

use grasp_sync::testing::limits::EventBucket;
use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use support::running::*;

const DASHBOARD: &str = include_str!("../examples/grafana/grasp-sync.json");
const ALERTS: &str = include_str!("../examples/prometheus/alerts.yml");

/// The alerts issues 15 and 27 ask for, by name.
const REQUIRED_ALERTS: [&str; 7] = [
    "GraspSyncDown",
    "GraspSyncAbsent",
    "GraspSyncOwnRelayUnreachable",
    "GraspSyncOutboxFilling",
    "GraspSyncEventsLostToRefusals",
    "GraspSyncMostRelaysDead",
    "GraspSyncNoEventsIngested",
];

/// Metric name → label name → values seen, from a Prometheus text page.
type Exported = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn parse_exposition(page: &str) -> Exported {
    let body = page.split("\r\n\r\n").nth(1).expect("an HTTP body");
    let mut out = Exported::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let series = line.split(' ').next().expect("a series before the value");
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let entry = out.entry(name.to_string()).or_default();
        for pair in labels.split(',').filter(|p| !p.is_empty()) {
            let (label, value) = pair.split_once('=').expect("label=value");
            entry
                .entry(label.to_string())
                .or_default()
                .insert(value.trim_matches('"').to_string());
        }
    }
    out
}

/// One `grasp_sync_*` selector in a PromQL expression: its name and its
/// exact label matchers (`label="v"` or `label=~"a|b"`, alternatives split).
#[derive(Debug)]
struct Selector {
    name: String,
    matchers: Vec<(String, Vec<String>)>,
}

fn selectors(expr: &str) -> Vec<Selector> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("grasp_sync_") {
        rest = &rest[at..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let name = rest[..end].to_string();
        rest = &rest[end..];
        let mut matchers = Vec::new();
        if let Some(inner) = rest.strip_prefix('{') {
            let close = inner.find('}').expect("a closed label set");
            for m in inner[..close].split(',').map(str::trim) {
                matchers.extend(matcher(m));
            }
            rest = &inner[close..];
        }
        out.push(Selector { name, matchers });
    }
    out
}

/// A label matcher with values to check; dashboard variables (`$instance`)
/// and wildcards say nothing about what the engine exports and are skipped.
fn matcher(m: &str) -> Option<(String, Vec<String>)> {
    let (label, value) = m.split_once("=~").or_else(|| m.split_once('='))?;
    let value = value.trim().trim_matches('"');
    if value.contains('$') || value.contains('*') {
        return None;
    }
    let values = value.split('|').map(str::to_string).collect();
    Some((label.trim().to_string(), values))
}

/// Every expression of the dashboard: panel targets and variable queries.
fn dashboard_exprs() -> Vec<String> {
    let dash: serde_json::Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let panels = dash["panels"].as_array().expect("panels");
    assert!(!panels.is_empty(), "the dashboard has panels");
    let mut exprs = Vec::new();
    for panel in panels {
        let targets = panel["targets"]
            .as_array()
            .expect("every panel has targets");
        assert!(
            !targets.is_empty(),
            "panel {} shows something",
            panel["title"]
        );
        for t in targets {
            exprs.push(t["expr"].as_str().expect("a PromQL expr").to_string());
        }
    }
    for var in dash["templating"]["list"].as_array().expect("variables") {
        exprs.push(var["query"].as_str().expect("a query").to_string());
    }
    exprs
}

/// The alert rules' names and expressions (comments dropped, folded
/// `expr: >` blocks joined).
fn alert_rules() -> Vec<(String, String)> {
    let mut rules: Vec<(String, String)> = Vec::new();
    let mut in_expr = false;
    for line in ALERTS.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("- alert:") {
            rules.push((name.trim().to_string(), String::new()));
            in_expr = false;
        } else if let Some(expr) = t.strip_prefix("expr:") {
            let rule = rules.last_mut().expect("expr inside a rule");
            rule.1 = expr.trim().trim_start_matches('>').to_string();
            in_expr = true;
        } else if in_expr && line.starts_with("          ") && !t.contains(':') {
            let rule = rules.last_mut().expect("expr inside a rule");
            rule.1.push(' ');
            rule.1.push_str(t);
        } else {
            in_expr = false;
        }
    }
    rules
}

fn unknown_names(exprs: &[String], exported: &Exported) -> Vec<String> {
    let mut bad = Vec::new();
    for expr in exprs {
        let found = selectors(expr);
        assert!(!found.is_empty(), "expression names no metric: {expr}");
        for sel in found {
            let Some(labels) = exported.get(&sel.name) else {
                bad.push(format!("{} (in `{expr}`)", sel.name));
                continue;
            };
            for (label, values) in &sel.matchers {
                for v in values {
                    if !labels.get(label).is_some_and(|seen| seen.contains(v)) {
                        bad.push(format!("{}{{{label}=\"{v}\"}} (in `{expr}`)", sel.name));
                    }
                }
            }
        }
    }
    bad
}

#[test]
fn dashboard_and_alerts_name_only_exported_metrics() {
    // An own relay that throttles the sync, so the series exported only
    // while it does (the pace it takes) are on the page too.
    let own = TestRelay::start(RelayOptions {
        event_bucket: Some(EventBucket {
            tokens_per_interval: 1,
            interval: Duration::from_secs(600),
            max_tokens: 1,
        }),
        ..RelayOptions::default()
    })
    .unwrap();
    let remote = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = support::keys(1);
    own.publish(support::announcement(
        &owner,
        "repo",
        &[&remote.url()],
        support::T0,
    ));
    let repo = support::coord(&owner, "repo");
    for i in 0..3 {
        remote.publish(support::repo_comment(
            &support::keys(2),
            &repo,
            support::T0 + i,
            "c",
        ));
    }
    // What the outbox holds at the end waits out no long deadline.
    let running = Running::start(&own, |_, o| o.shutdown_timeout = Duration::from_secs(1));
    assert!(
        wait_for(60, || http_get(running.metrics, "/metrics")
            .contains("\ngrasp_sync_own_relay_accepted_per_minute ")),
        "the own relay throttles"
    );
    let page = http_get(running.metrics, "/metrics");
    running.stop();
    let exported = parse_exposition(&page);
    assert!(
        exported.contains_key("grasp_sync_own_relay_connected"),
        "the own relay's link is exported: {page}"
    );
    for link in ["read", "write"] {
        let series = format!("grasp_sync_own_relay_connected{{link=\"{link}\"}}");
        assert!(page.contains(&series), "the {link} link apart: {page}");
    }

    let dash = dashboard_exprs();
    let bad = unknown_names(&dash, &exported);
    assert!(
        bad.is_empty(),
        "the dashboard names unexported metrics: {bad:#?}"
    );

    let rules = alert_rules();
    for required in REQUIRED_ALERTS {
        assert!(
            rules
                .iter()
                .any(|(name, expr)| name == required && !expr.is_empty()),
            "alert {required} with an expression: {rules:#?}"
        );
    }
    // Alerts on the scrape itself read `up`, which Prometheus writes, not
    // the engine: they must name the job README's scrape config sets.
    let (engine, scrape): (Vec<_>, Vec<_>) = rules
        .into_iter()
        .partition(|(_, e)| e.contains("grasp_sync_"));
    for (name, expr) in &scrape {
        assert!(
            expr.contains(r#"up{job="grasp-sync"}"#),
            "{name} names no grasp_sync_ metric, so it must be about the scrape job: {expr}"
        );
    }
    let exprs: Vec<String> = engine.into_iter().map(|(_, e)| e).collect();
    let bad = unknown_names(&exprs, &exported);
    assert!(
        bad.is_empty(),
        "the alerts name unexported metrics: {bad:#?}"
    );
}

#[test]
fn the_checker_catches_a_renamed_metric_and_an_unknown_label_value() {
    let page = "HTTP/1.1 200 OK\r\n\r\n# TYPE grasp_sync_x_total counter\n\
                grasp_sync_x_total{outcome=\"stored\"} 1\n";
    let exported = parse_exposition(page);
    let ok = vec![r#"rate(grasp_sync_x_total{outcome="stored",instance=~"$instance"}[5m])"#.into()];
    assert!(unknown_names(&ok, &exported).is_empty());
    let renamed = vec!["rate(grasp_sync_y_total[5m])".to_string()];
    assert_eq!(unknown_names(&renamed, &exported).len(), 1);
    let label = vec![r#"grasp_sync_x_total{outcome=~"stored|lost"}"#.to_string()];
    assert_eq!(unknown_names(&label, &exported).len(), 1);
}
