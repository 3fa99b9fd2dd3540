//! One relay carrying 10,000 of our repos and 100,000 of our roots stays
//! within its limits (10 subscriptions, 20 filters per REQ, 64 KiB per
//! message), confirms everything, and still delivers live events.

mod support;

use std::time::Duration;

use grasp_sync::Time;
use nostr::prelude::*;
use support::*;

const A: &str = "wss://big.example";

#[test]
fn ten_thousand_repos_and_a_hundred_thousand_roots_fit_one_relays_limits() {
    let mut cfg = config();
    cfg.self_subscribe = false;
    let mut sim = Sim::new(cfg);
    sim.add_relay(A);
    let owner = keys(1).public_key();
    let now = Time::from_secs(T0);
    let repos: Vec<String> = (0..10_000)
        .map(|i| format!("30617:{}:r{i}", owner.to_hex()))
        .collect();
    for i in 0..10_000u64 {
        let tags = vec![tag(&["d", &format!("r{i}")]), tag(&["relays", A])];
        sim.engine
            .handle_local_event(now, local_event(owner, i, 30617, tags));
    }
    let mut roots = Vec::new();
    for i in 0..100_000u64 {
        let ev = local_event(
            owner,
            1_000_000 + i,
            1621,
            vec![tag(&["a", &repos[(i % 10_000) as usize]])],
        );
        roots.push(ev.clone());
        sim.engine.handle_local_event(now, ev);
    }
    let history: Vec<Event> = (0..50)
        .map(|i| reply(&keys(2), &roots[i * 1_999], T0 - 1_000 + i as u64, "old"))
        .collect();
    for e in &history {
        sim.seed(A, e);
    }
    sim.advance(Duration::from_secs(600));

    let a = sim.id(A);
    let counts = sim.engine.item_counts(a);
    assert_eq!(
        counts.confirmed, 110_000,
        "every repo and root confirmed: {counts:?}"
    );
    let relay = &sim.relays[A];
    assert!(
        relay.peak_subs <= 10,
        "at most 10 concurrent subscriptions ({})",
        relay.peak_subs
    );
    assert!(
        relay.largest_req <= 64 * 1024,
        "REQs within 64 KiB ({})",
        relay.largest_req
    );
    assert!(
        relay.reqs.iter().all(|(_, fs)| fs.len() <= 20),
        "at most 20 filters per REQ"
    );
    assert_eq!(sim.missing(&history), vec![]);
    assert!(
        sim.engine.live_filter_count(a) <= 70,
        "live set widened, not per-id"
    );

    let live = reply(&keys(3), &roots[99_999], T0 + 1_000, "live on a root");
    let unrelated = sign(
        &keys(3),
        1111,
        T0 + 1_000,
        vec![tag(&["E", &"ab".repeat(32)])],
        "not ours",
    );
    sim.publish(A, &live);
    sim.publish(A, &unrelated);
    sim.settle();
    assert!(sim.synced(&live.id), "live events of any root arrive");
    assert!(
        !sim.synced(&unrelated.id),
        "wide live traffic is matched against the index"
    );
    sim.engine.check_invariants().unwrap();
}

/// A first sync's pages leave nothing in the timer wheel once they end:
/// each page's EOSE deadline goes with its EOSE. They held their slots
/// for the deadline's two minutes, about 400 bytes of every idle relay.
#[test]
fn finished_pages_leave_no_timers_behind() {
    let mut sim = Sim::new(config());
    let mut history = Vec::new();
    let relays: Vec<String> = (0..20).map(|i| format!("wss://r{i}.example")).collect();
    for (i, url) in relays.iter().enumerate() {
        sim.add_relay(url).filter_cap = 100;
        let owner = keys(10 + i as u8);
        let repo = announce(&mut sim, &owner, "repo", &[url.as_str()], T0);
        let issue = root(&owner, 1621, &[&repo], T0 - 2_000, "issue");
        sim.seed(url, &issue);
        for n in 0..1_000u64 {
            let r = reply(&keys(2), &issue, T0 - 1_000 + n, &format!("r{n}"));
            sim.seed(url, &r);
            history.push(r);
        }
        sim.local_event(issue);
    }
    sim.advance(Duration::from_secs(30));
    assert_eq!(sim.missing(&history).len(), 0, "every reply synced");
    for url in &relays {
        let a = sim.id(url);
        let counts = sim.engine.item_counts(a);
        assert_eq!((counts.queued, counts.pending), (0, 0), "{url}: {counts:?}");
        // 1,000 replies at a cap of 100: ten pages at least, several
        // packed into one REQ where the relay takes them.
        let pages: usize = sim.reqs(url).iter().map(|(_, f)| f.len()).sum();
        assert!(pages >= 10, "{url}: paged by the hundred");
    }
    let armed = sim.engine.timers_armed();
    assert!(
        armed <= 2 * relays.len() + 10,
        "{armed} timers armed for {} idle relays",
        relays.len()
    );
}
