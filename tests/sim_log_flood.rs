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

#[test]
fn bidi_and_line_separators_in_relay_text_are_escaped_in_the_log() {
    logged("");
    let mut sim = Sim::new(config());
    let url = "wss://bidi.example";
    let own = sim.own.clone();
    sim.add_relay(url);
    sim.publish(&own, &announcement(&keys(5), "b", &[url], T0));
    sim.advance(std::time::Duration::from_secs(10));
    let notice = "too many concurrent REQs bidi-flip\u{202e}gpj.exe\u{2028}faked\u{2029}\u{200b}";
    sim.inject(url, &serde_json::json!(["NOTICE", notice]).to_string());
    let said = logged("bidi-flip");
    assert_eq!(said.len(), 1, "{said:?}");
    for raw in ['\u{202e}', '\u{2028}', '\u{2029}', '\u{200b}'] {
        assert!(!said[0].contains(raw), "{raw:?} raw in {:?}", said[0]);
    }
    assert!(
        said[0].contains("bidi-flip\\u{202e}gpj.exe\\u{2028}faked\\u{2029}\\u{200b}"),
        "{}",
        said[0]
    );
}

/// Relays that announcements name and that never answer: each key names
/// its share (500) in ten announcements of 50.
fn dead_flood(sim: &mut Sim, keys_n: u8) -> usize {
    let own = sim.own.clone();
    let mut n = 0;
    for k in 0..keys_n {
        let owner = keys(100 + k);
        for a in 0..10 {
            let urls: Vec<String> = (0..50)
                .map(|i| format!("wss://dead-flood-{k}-{a}-{i}.example"))
                .collect();
            let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
            n += urls.len();
            sim.publish(&own, &announcement(&owner, &format!("d{a}"), &urls, T0));
        }
    }
    n
}

#[test]
fn thousands_of_dead_relays_cannot_flood_the_log() {
    logged("");
    let mut sim = Sim::new(config());
    let relays = dead_flood(&mut sim, 4);
    sim.advance(std::time::Duration::from_secs(20));
    let failed = logged("dead-flood-");
    assert!(
        sim.engine.stats().connect_failures as usize >= relays,
        "all tried"
    );
    // A burst, then a line a second: 10 + 20.
    assert!(
        (10..=30).contains(&failed.len()),
        "{} lines in 20 s for {relays} failing relays",
        failed.len()
    );
    sim.advance(std::time::Duration::from_secs(180));
    let failed = logged("dead-flood-");
    assert!(failed.len() <= 30 + 180, "{} lines", failed.len());
    let summaries = logged("connect failures: ");
    let summary = summaries
        .iter()
        .find(|l| l.contains(&format!("{relays} relays failing")))
        .unwrap_or_else(|| panic!("a summary names them: {summaries:?}"));
    assert!(
        summary.contains("top reasons: connect failed ("),
        "{summary}"
    );
    assert!(summary.contains("lines of them not logged"), "{summary}");
}
