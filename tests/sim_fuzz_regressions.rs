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

/// A refused page failed its batch while sibling chunks of the batch were
/// still out in other pages. Consolidation counted those pages as work in
/// flight, found no batch pending and consolidated again at once:
/// `schedule` and `consolidate` called each other until the stack
/// overflowed. (fuzz target `relay_message`, 11 bytes: a CLOSED, a newer
/// announcement, three and a half hours.)
#[test]
fn pages_of_a_failed_batch_do_not_keep_consolidation_looping() {
    let mut cfg = config();
    cfg.page_limit = 1;
    cfg.consolidation_threshold = 1;
    cfg.chunk_size = 1;
    cfg.max_filters_per_req = 2;
    cfg.max_pages = 2;
    cfg.negentropy = false;
    let mut sim = Sim::new(cfg);
    let remotes = ["wss://r0.example", "wss://r1.example", "wss://r2.example"];
    for r in remotes {
        sim.add_relay(r).silent = true;
    }
    let (alice, bob) = (keys(1), keys(2));
    let (one, two) = (coord(&alice, "one"), coord(&bob, "two"));
    // Fed as an embedding relay would: one-event pages of the
    // self-subscription would end at `max_pages` before reading them all.
    for event in [
        announcement(&alice, "one", &remotes[..2], T0 - 100),
        announcement(&bob, "two", &remotes[1..], T0 - 90),
        root(&keys(3), 1617, &[&one], T0 - 80, "patch"),
        root(&keys(3), 1621, &[&one, &two], T0 - 70, "issue"),
    ] {
        sim.engine.handle_local_event(sim.now, event);
    }
    sim.advance(Duration::from_secs(6));
    let page = sim
        .reqs(remotes[0])
        .iter()
        .map(|(id, _)| id.clone())
        .filter(|id| sim.relays[remotes[0]].subs.contains_key(id))
        .nth(1)
        .expect("a page is open on r0 beside the live subscription");
    sim.inject(remotes[0], &format!(r#"["CLOSED","{page}",""]"#));
    let newer = announcement(&alice, "one", &[remotes[2], "wss://late.example"], T0 - 10);
    sim.engine.handle_local_event(sim.now, newer);
    sim.advance(Duration::from_secs(3_600));
    sim.engine.check_invariants().unwrap();
}
