//! `grasp-sync demo` end to end: exits 0 with the summary line scripts parse.

use std::process::Command;

#[test]
fn demo_syncs_everything_and_prints_the_summary_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_grasp-sync"))
        .args([
            "demo",
            "--relays",
            "6",
            "--seed",
            "3",
            "--timeout-secs",
            "120",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let fields: Vec<(&str, &str)> = last
        .strip_prefix("demo: ")
        .expect("summary line")
        .split(' ')
        .map(|kv| kv.split_once('=').expect("key=value"))
        .collect();
    let keys: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        [
            "relays",
            "expected",
            "synced",
            "missing",
            "seconds",
            "peak_rss_kib",
            "reqs"
        ]
    );
    let get = |k: &str| fields.iter().find(|(n, _)| *n == k).unwrap().1;
    assert_eq!(get("relays"), "6");
    assert_eq!(get("missing"), "0");
    assert_eq!(get("expected"), get("synced"));
    assert!(get("expected").parse::<u64>().unwrap() > 100);
    assert!(
        stdout.contains("restarting relay"),
        "a relay restarts midway"
    );
}

#[test]
fn demo_rejects_unknown_flags_with_exit_code_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_grasp-sync"))
        .args(["demo", "--bogus"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn demo_over_wss_with_the_test_ca() {
    let out = Command::new(env!("CARGO_BIN_EXE_grasp-sync"))
        .args([
            "demo",
            "--relays",
            "3",
            "--seed",
            "5",
            "--tls",
            "--idle-secs",
            "1",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo --tls failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("(wss, test CA)"));
    assert!(
        stdout
            .lines()
            .last()
            .unwrap_or_default()
            .contains(" missing=0 ")
    );
    let engine = stdout
        .lines()
        .find(|l| l.starts_with("demo: engine: "))
        .expect("engine line");
    assert!(engine.contains("idle_cpu_pct="), "{engine}");
}

#[test]
fn demo_chaos_loses_nothing_and_ingests_nothing_invalid() {
    // Seed 13 starts the fault cycle at the bad events: bad id, bad
    // signature, outside the filter, duplicates, garbage, HTTP 429 and 503,
    // a cut mid-stream, a restart and a missing EOSE.
    let out = Command::new(env!("CARGO_BIN_EXE_grasp-sync"))
        .args([
            "demo",
            "--chaos",
            "--relays",
            "30",
            "--seed",
            "13",
            "--timeout-secs",
            "120",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo --chaos failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("demo: chaos: 10 relays misbehave: bad-id, bad-signature, outside-filter,"),
        "{stdout}"
    );
    let last = stdout.lines().last().unwrap_or_default();
    let field = |k: &str| -> u64 {
        last.split(' ')
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} in {last}"))
            .parse()
            .unwrap()
    };
    assert_eq!(field("relays"), 30);
    assert_eq!(field("chaotic"), 10);
    assert!(field("faults_injected") > 0, "{last}");
    assert_eq!(field("events_lost"), 0, "{last}");
    assert_eq!(field("invalid_ingested"), 0, "{last}");
    assert!(field("peak_rss_kib") <= field("rss_ceiling_kib"), "{last}");
    assert_eq!(field("expected"), field("synced"));
}

#[test]
fn demo_chaos_needs_three_relays() {
    let out = Command::new(env!("CARGO_BIN_EXE_grasp-sync"))
        .args(["demo", "--chaos", "--relays", "2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
