//! What the log says, captured by this test binary's own logger (installed
//! once, shared by the tests, each reading only its own lines): a relay
//! flooding refusing NOTICEs (long, with newlines) cannot flood the log
//! (its text is cut, escaped and limited per relay); a relay refused for
//! its private address is said at info, once.

mod support;

use std::sync::Mutex;

use log::{Level, LevelFilter, Log, Metadata, Record};
use support::*;

const A: &str = "wss://a.example";

/// Every log line at info or above, as formatted.
static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl Log for Capture {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= Level::Info
    }

    fn log(&self, record: &Record) {
        if self.enabled(record.metadata()) {
            LINES.lock().unwrap().push(record.args().to_string());
        }
    }

    fn flush(&self) {}
}

/// Installs the capture once for every test of this binary.
fn capture() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        log::set_logger(&Capture).unwrap();
        log::set_max_level(LevelFilter::Info);
    });
}

#[test]
fn a_notice_flood_is_cut_escaped_and_rate_limited_in_the_log() {
    capture();
    let mut sim = Sim::new(config());
    let owner = keys(1);
    let own = sim.own.clone();
    sim.add_relay(A);
    sim.publish(&own, &announcement(&owner, "r", &[A], T0));
    sim.advance(std::time::Duration::from_secs(10));
    let notice = format!(
        "too many concurrent REQs\n[INFO] forged line{}",
        "x".repeat(100_000)
    );
    let frame = serde_json::json!(["NOTICE", notice]).to_string();
    for _ in 0..200 {
        sim.inject(A, &frame);
    }
    let lines = LINES.lock().unwrap();
    let flood: Vec<&String> = lines.iter().filter(|l| l.contains("forged")).collect();
    assert!(!flood.is_empty(), "the notice is logged at all");
    assert!(
        flood.len() <= 10,
        "{} lines of one relay's notices",
        flood.len()
    );
    for line in flood {
        assert!(!line.contains('\n'), "a newline forges a line: {line}");
        assert!(line.len() < 400, "{} bytes logged", line.len());
    }
}

#[test]
fn a_private_relay_is_said_at_info_once() {
    capture();
    let mut sim = Sim::new(config());
    let own = sim.own.clone();
    let private = ["ws://10.9.8.7:7000", "ws://192.168.77.1"];
    for (i, owner) in [keys(3), keys(4)].iter().enumerate() {
        for t in 0..3 {
            let d = format!("p{i}-{t}");
            sim.publish(&own, &announcement(owner, &d, &private, T0 + t));
        }
    }
    sim.advance(std::time::Duration::from_secs(10));
    let lines = LINES.lock().unwrap();
    for url in private {
        let said: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains(&format!("relay {url} refused")))
            .collect();
        assert_eq!(said.len(), 1, "{url}: {said:?}");
        assert!(said[0].contains("--allow-private-addresses"), "{}", said[0]);
    }
}
