//! The five GRASP-02 scenarios, each driven through the sans-IO engine with
//! fake relays and a simulated clock.

mod support;

use std::time::Duration;

use grasp_sync::{ItemKey, ItemState, Status};
use support::*;

const A: &str = "wss://a.example";
const B: &str = "wss://b.example";

/// One repo announced on the own relay, listing A and B, with a history of
/// every kind of event spread across both.
struct World {
    repo: String,
    history: Vec<nostr::prelude::Event>,
    issue: nostr::prelude::Event,
}

fn world(sim: &mut Sim) -> World {
    let owner = keys(1);
    let other = keys(2);
    sim.add_relay(A);
    sim.add_relay(B);
    let ann = announcement(&owner, "repo", &[A, B, OWN], T0 - 10_000);
    sim.seed(OWN, &ann);
    let repo = coord(&owner, "repo");
    let issue = root(&other, 1621, &[&repo], T0 - 9_000, "an issue");
    let patch = root(&other, 1617, &[&repo], T0 - 8_000, "a patch");
    let pr = root(&owner, 1618, &[&repo], T0 - 7_000, "a PR");
    let history = vec![
        issue.clone(),
        patch.clone(),
        pr.clone(),
        reply(&owner, &issue, T0 - 6_000, "NIP-22 reply"),
        status(&owner, &patch, 1631, T0 - 5_000),
        sign(
            &other,
            1619,
            T0 - 4_500,
            vec![tag(&["e", &pr.id.to_hex()])],
            "PR update",
        ),
        repo_comment(&other, &repo, T0 - 4_000, "about the repo"),
        state(&owner, "repo", T0 - 3_000),
    ];
    for (i, e) in history.iter().enumerate() {
        sim.seed(if i % 2 == 0 { A } else { B }, e);
    }
    World {
        repo,
        history,
        issue,
    }
}

/// Issue 33: at start the batch window closes with the own relay's stored
/// events (the self-subscription's EOSE): the burst it waits for is over.
/// Waiting out its length (5 s by default) delayed every first sync.
#[test]
fn the_first_sync_starts_at_the_own_relays_eose_not_after_the_batch_window() {
    let mut config = config();
    config.batch_window = Duration::from_secs(5);
    let mut sim = Sim::new(config);
    sim.add_relay(A);
    let owner = keys(1);
    sim.seed(OWN, &announcement(&owner, "repo", &[A, OWN], T0 - 10_000));
    let issue = root(
        &keys(2),
        1621,
        &[&coord(&owner, "repo")],
        T0 - 9_000,
        "an issue",
    );
    sim.seed(OWN, &issue);
    let replies: Vec<_> = (0..3)
        .map(|i| reply(&owner, &issue, T0 - 8_000 + i, "a reply"))
        .collect();
    for r in &replies {
        sim.seed(A, r);
    }
    sim.advance(Duration::from_secs(2));
    assert_eq!(
        sim.missing(&replies),
        vec![],
        "synced well within the window"
    );
}

#[test]
fn initial_connect_fetches_full_history_then_live() {
    let mut sim = Sim::new(config());
    let w = world(&mut sim);
    sim.advance(Duration::from_secs(30));

    assert_eq!(sim.missing(&w.history), vec![], "all history synced");
    let (a, b) = (sim.id(A), sim.id(B));
    assert_eq!(sim.engine.relay_status(a), Status::Connected);
    assert_eq!(
        sim.engine.item_state(a, &ItemKey::Repo(w.repo.clone())),
        Some(ItemState::Confirmed)
    );
    assert_eq!(
        sim.engine.item_state(b, &ItemKey::Root(w.issue.id)),
        Some(ItemState::Confirmed)
    );
    assert!(
        sim.reqs(A)
            .iter()
            .flat_map(|(_, fs)| fs)
            .all(|f| f.since.is_none()),
        "a fresh connect asks full history"
    );
    for (_, filters) in sim.reqs(A) {
        for f in filters {
            assert!(
                f.generic_tags.len() <= 1,
                "one tag letter per filter: {f:?}"
            );
        }
    }

    let live = reply(&keys(3), &w.issue, T0 + 40, "live reply");
    sim.publish(B, &live);
    sim.settle();
    assert!(
        sim.synced(&live.id),
        "a live event arrives without waiting for any timer"
    );
    sim.engine.check_invariants().unwrap();
}

#[test]
fn quick_reconnect_catches_up_with_since_from_last_connected() {
    let mut sim = Sim::new(config());
    let w = world(&mut sim);
    sim.advance(Duration::from_secs(30));
    let connected_at = sim.now;
    let a = sim.id(A);

    sim.stop_relay(A);
    assert_eq!(sim.engine.relay_status(a), Status::Disconnected);
    let missed = reply(&keys(4), &w.issue, T0 + 60, "while away");
    sim.seed(A, &missed);
    sim.advance(Duration::from_secs(120));
    sim.start_relay(A);
    let reqs_before = sim.reqs(A).len();
    sim.advance(Duration::from_secs(300));

    assert_eq!(sim.engine.relay_status(a), Status::Connected);
    assert!(
        sim.synced(&missed.id),
        "event published while disconnected arrives"
    );
    assert_eq!(
        sim.engine.item_state(a, &ItemKey::Repo(w.repo.clone())),
        Some(ItemState::Confirmed)
    );
    let expected_since = connected_at.as_secs() - 900;
    let after: Vec<_> = sim.reqs(A)[reqs_before..]
        .iter()
        .flat_map(|(_, fs)| fs.clone())
        .collect();
    assert!(!after.is_empty());
    for f in &after {
        let since = f
            .since
            .expect("quick reconnect filters carry since")
            .as_secs();
        assert!(
            since <= expected_since,
            "since {since} reaches back to last_connected - 15 min"
        );
        assert!(
            since + 1_000 >= expected_since,
            "since is a timestamp, not a duration: {since}"
        );
    }
}

#[test]
fn stale_reconnect_clears_confirmed_and_fetches_full_history() {
    let mut sim = Sim::new(config());
    let w = world(&mut sim);
    sim.advance(Duration::from_secs(30));
    let a = sim.id(A);
    sim.stop_relay(A);
    sim.advance(Duration::from_secs(20 * 60));
    assert_eq!(sim.engine.relay_status(a), Status::Disconnected);
    let old = reply(&keys(5), &w.issue, T0 - 100_000, "old but never seen");
    sim.seed(A, &old);
    let reqs_before = sim.reqs(A).len();
    sim.start_relay(A);
    sim.advance(Duration::from_secs(3600));

    assert_eq!(sim.engine.relay_status(a), Status::Connected);
    let after: Vec<_> = sim.reqs(A)[reqs_before..]
        .iter()
        .flat_map(|(_, fs)| fs.clone())
        .collect();
    assert!(
        after
            .iter()
            .any(|f| f.since.is_none() && !f.generic_tags.is_empty()),
        "full history asked"
    );
    assert!(
        sim.synced(&old.id),
        "an old event only a full fetch finds is synced"
    );
    assert_eq!(
        sim.engine.item_state(a, &ItemKey::Repo(w.repo)),
        Some(ItemState::Confirmed)
    );
}

#[test]
fn consolidation_repacks_live_filters_and_keeps_confirmed() {
    let mut cfg = config();
    cfg.consolidation_threshold = 10;
    let mut sim = Sim::new(cfg);
    sim.add_relay(A);
    let owner = keys(1);
    let mut repos = Vec::new();
    // Announce repos one batch window at a time so each becomes its own batch.
    for i in 0..8 {
        let d = format!("r{i}");
        let ann = announcement(&owner, &d, &[A], T0 - 1000 + i);
        let own = sim.own.clone();
        sim.publish(&own, &ann);
        repos.push(coord(&owner, &d));
        sim.advance(Duration::from_secs(10));
    }
    let a = sim.id(A);
    assert!(sim.engine.stats().consolidations >= 1, "consolidation ran");
    assert!(
        sim.engine.live_filter_count(a) <= 10,
        "live filters under threshold after consolidation"
    );
    for r in &repos {
        assert_eq!(
            sim.engine.item_state(a, &ItemKey::Repo(r.clone())),
            Some(ItemState::Confirmed)
        );
    }
    // The last consolidation's REQ carries `since` on every filter.
    let (_, consolidated) = sim
        .reqs(A)
        .iter()
        .rev()
        .find(|(_, fs)| fs[0].since.is_some())
        .expect("a consolidated REQ was sent");
    assert!(
        consolidated.iter().all(|f| f.since.is_some()),
        "consolidated filters carry since"
    );
    let packed = consolidated
        .iter()
        .map(|f| f.generic_tags.values().map(|v| v.len()).sum::<usize>())
        .max();
    // Only what is new travels, merged with the smallest live REQs as far
    // as the threshold requires: one filter then holds several repos.
    assert!(
        packed >= Some(2),
        "merged: one filter holds several repos ({packed:?})"
    );

    let live = repo_comment(&keys(3), &repos[0], T0 + 500, "after consolidation");
    sim.publish(A, &live);
    sim.settle();
    assert!(
        sim.synced(&live.id),
        "live coverage kept after consolidation"
    );
    sim.engine.check_invariants().unwrap();
}

#[test]
fn consolidation_sends_only_what_is_new() {
    consolidations_send_only_what_is_new(config());
}

#[test]
fn consolidation_sends_only_what_is_new_within_tight_limits() {
    let mut cfg = config();
    cfg.max_filters_per_req = 4;
    cfg.max_subscriptions = 10;
    consolidations_send_only_what_is_new(cfg);
}

/// A relay with a big per-id live set gets new roots one batch window at
/// a time: consolidations ask only the new roots (and the small live REQs
/// merged with them), within the relay's filter limit, and live coverage
/// of old and new roots holds.
fn consolidations_send_only_what_is_new(cfg: grasp_sync::Config) {
    let filters_per_req = cfg.max_filters_per_req;
    let mut sim = Sim::new(cfg);
    sim.add_relay(A);
    let owner = keys(1);
    let ann = announcement(&owner, "repo", &[A, OWN], T0 - 10_000);
    sim.seed(OWN, &ann);
    let repo = coord(&owner, "repo");
    let old_roots: Vec<nostr::prelude::Event> = (0..250)
        .map(|i| root(&keys(2), 1621, &[&repo], T0 - 9_000 + i, "old"))
        .collect();
    for r in &old_roots {
        sim.seed(OWN, r);
    }
    let old: Vec<String> = old_roots.iter().map(|r| r.id.to_hex()).collect();
    sim.advance(Duration::from_secs(30));
    let a = sim.id(A);
    let counts = sim.engine.item_counts(a);
    assert_eq!(counts.confirmed, 251, "the repo and its 250 roots");
    let consolidations = sim.engine.stats().consolidations;
    let sent = sim.reqs(A).len();
    // New roots one batch window at a time: the live set fills and is
    // consolidated again and again.
    let mut fresh = Vec::new();
    for i in 0..12 {
        let r = root(&keys(3), 1621, &[&repo], T0 + i, "new");
        let own = sim.own.clone();
        sim.publish(&own, &r);
        fresh.push(r);
        sim.advance(Duration::from_secs(10));
    }
    assert!(
        sim.engine.stats().consolidations >= consolidations + 2,
        "consolidations ran"
    );
    let resent = sim.reqs(A)[sent..]
        .iter()
        .flat_map(|(_, fs)| fs.iter())
        .flat_map(|f| f.generic_tags.values().flatten())
        .filter(|v| old.contains(v))
        .count();
    assert_eq!(resent, 0, "no consolidation asks the old roots again");
    let most = sim.reqs(A).iter().map(|(_, fs)| fs.len()).max();
    assert!(most <= Some(filters_per_req), "{most:?} filters in one REQ");
    for r in &fresh {
        let live = reply(&keys(4), r, T0 + 500, "live");
        sim.publish(A, &live);
        sim.settle();
        assert!(sim.synced(&live.id), "live coverage of every new root");
    }
    let live = reply(&keys(4), &old_roots[0], T0 + 600, "on an old root");
    sim.publish(A, &live);
    sim.settle();
    assert!(sim.synced(&live.id), "live coverage of the old roots kept");
    sim.engine.check_invariants().unwrap();
}

#[test]
fn daily_timer_runs_a_fresh_sync_between_23_and_25_hours() {
    let mut sim = Sim::new(config());
    let w = world(&mut sim);
    sim.advance(Duration::from_secs(30));
    let start = sim.now;
    let reqs_before = sim.reqs(A).len();
    // Drift: an old event appears on A that no live subscription delivers.
    let drift = reply(&keys(6), &w.issue, T0 - 50_000, "backdated");
    sim.seed(A, &drift);
    sim.advance(Duration::from_secs(23 * 3600 - 60));
    assert!(!sim.synced(&drift.id), "not before 23 h");
    assert_eq!(
        sim.reqs(A).len(),
        reqs_before,
        "nothing re-asked before the daily sync"
    );
    sim.advance(Duration::from_secs(2 * 3600 + 120));
    assert!(sim.synced(&drift.id), "daily fresh sync finds drift");
    let fresh = &sim.reqs(A)[reqs_before..];
    assert!(fresh.iter().flat_map(|(_, fs)| fs).any(|f| {
        f.since.is_none()
            && f.kinds
                .as_ref()
                .is_some_and(|k| k.contains(&nostr::prelude::Kind::from_u16(30617)))
    }));
    assert!(sim.now.since(start) >= Duration::from_secs(23 * 3600));
}
