//! Bugs the fuzz targets in `fuzz/` found, each reproduced on the smallest
//! input that showed it, so they stay fixed without a nightly toolchain.

mod support;

use std::time::Duration;

use support::*;

/// The own relay's copy of an event whose id we have seen was indexed
/// without any check, so a copy with the same id but another pubkey (or
/// tags) made the index learn a repo nobody announced. (fuzz target
/// `announcement`: a raw EVENT on the self-subscription with one byte of a
/// signed announcement's pubkey changed.)
#[test]
fn forged_copy_of_a_seen_event_from_the_own_relay_is_not_indexed() {
    let mut sim = Sim::new(config());
    sim.add_relay("wss://r0.example");
    let own = sim.own.clone();
    let real = announcement(&keys(1), "repo", &["wss://r0.example"], T0);
    sim.publish(&own, &real);
    sim.settle();
    let sub = sim.relays[&own]
        .subs
        .keys()
        .next()
        .expect("the self-subscription is open")
        .clone();
    let mut forged: serde_json::Value = serde_json::from_str(&real.as_json()).unwrap();
    let other = keys(2).public_key().to_hex();
    forged["pubkey"] = other.clone().into();
    sim.inject(&own, &format!(r#"["EVENT","{sub}",{forged}]"#));
    sim.advance(Duration::from_secs(10));
    let index = sim.engine.index();
    assert!(index.repo_id(&coord(&keys(1), "repo")).is_some());
    assert_eq!(index.repo_id(&format!("30617:{other}:repo")), None);
    assert_eq!(index.repo_count(), 1);
    sim.engine.check_invariants().unwrap();
}
