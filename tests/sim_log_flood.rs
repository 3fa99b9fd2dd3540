//! What the log says, captured by this test binary's own logger (installed
//! once, shared by the tests, each reading only its own lines): a relay
//! flooding refusing NOTICEs (long, with newlines) cannot flood the log
//! (its text is cut, escaped and limited per relay); a relay refused for
//! its private address is said at info, once.

mod support;

use grasp_sync::testing::log_capture::logged;
use support::*;

const A: &str = "wss://a.example";

#[test]
fn a_notice_flood_is_cut_escaped_and_rate_limited_in_the_log() {
    logged("");
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
    let flood = logged("forged");
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
    logged("");
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
    for url in private {
        let said = logged(&format!("relay {url} refused"));
        assert_eq!(said.len(), 1, "{url}: {said:?}");
        assert!(said[0].contains("--allow-private-addresses"), "{}", said[0]);
    }
}
