//! A relay flooding refusing NOTICEs (long, with newlines) cannot flood the
//! log: its text is cut, escaped and limited per relay. The log is captured
//! by this test binary's own logger, so this file holds one test only.

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

#[test]
fn a_notice_flood_is_cut_escaped_and_rate_limited_in_the_log() {
    log::set_logger(&Capture).unwrap();
    log::set_max_level(LevelFilter::Info);
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
