//! One test (or a few) per numbered GRASP-02 rule, against fake relays with
//! a simulated clock.

mod support;

use std::time::Duration;

use grasp_sync::{Config, Health, ItemKey, ItemState, Status};
use nostr::prelude::*;
use support::*;

const A: &str = "wss://a.example";
const B: &str = "wss://b.example";
const C: &str = "wss://c.example";

#[test]
fn rule1_self_subscription_kinds_batching_and_reconnect_since() {
    let mut sim = Sim::new(config());
    sim.settle();
    let own = sim.own.clone();
    let (_, filters) = sim.reqs(&own)[0].clone();
    let kinds: Vec<u16> = filters[0]
        .kinds
        .clone()
        .unwrap()
        .iter()
        .map(|k| k.as_u16())
        .collect();
    assert_eq!(kinds.len(), 5);
    // Deletions (5) release what they delete from the index (issue 13).
    for k in [30617, 1617, 1618, 1621, 5] {
        assert!(kinds.contains(&k), "self-subscription asks kind {k}");
    }
    assert!(!kinds.contains(&1619), "1619 is not a root");
    assert!(filters[0].since.is_none(), "first connect has no since");

    // The batch window opens at the first event and is not extended.
    sim.add_relay(A);
    announce(&mut sim, &keys(1), "r1", &[A], T0);
    sim.advance(Duration::from_secs(3));
    announce(&mut sim, &keys(1), "r2", &[A], T0);
    sim.advance(Duration::from_millis(1_900));
    assert!(
        sim.engine.relay_id(A).is_none(),
        "nothing indexed before the window closes"
    );
    sim.advance(Duration::from_millis(200));
    assert!(
        sim.engine.relay_id(A).is_some(),
        "window closed 5 s after the first event"
    );
    let a = sim.id(A);
    assert_eq!(
        sim.engine.item_counts(a).confirmed,
        2,
        "both events in one batch"
    );

    // Own relay reconnect: since = when it was lost - 15 min.
    let lost_at = sim.now;
    sim.stop_relay(&own);
    sim.start_relay(&own);
    sim.advance(Duration::from_secs(60));
    let (_, filters) = sim.reqs(&own).last().unwrap().clone();
    assert_eq!(
        filters[0].since,
        Some(Timestamp::from_secs(lost_at.as_secs() - 900))
    );
}

#[test]
fn rule2_diff_touches_only_affected_relays_and_waits_for_connect() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    sim.add_relay(B).online = false;
    announce(&mut sim, &keys(1), "r1", &[A], T0);
    sim.advance(Duration::from_secs(10));
    let a_reqs = sim.reqs(A).len();
    // A batch about B only: A sees no new REQ.
    let repo_b = announce(&mut sim, &keys(2), "r2", &[B], T0);
    sim.advance(Duration::from_secs(10));
    assert_eq!(
        sim.reqs(A).len(),
        a_reqs,
        "relay A untouched by a batch about B"
    );
    let b = sim.id(B);
    assert_eq!(sim.engine.relay_status(b), Status::Disconnected);
    assert_eq!(
        sim.engine.item_state(b, &ItemKey::Repo(repo_b.clone())),
        Some(ItemState::Queued)
    );
    sim.start_relay(B);
    sim.advance(Duration::from_secs(60));
    assert_eq!(
        sim.engine.item_state(b, &ItemKey::Repo(repo_b)),
        Some(ItemState::Confirmed),
        "gets it on connect"
    );
}

#[test]
fn rule3_filters_chunked_one_letter_each_and_packed_within_limits() {
    let mut cfg = config();
    cfg.max_subscriptions = 4;
    let mut sim = Sim::new(cfg);
    sim.add_relay(A);
    let owner = keys(1);
    for i in 0..250 {
        announce(&mut sim, &owner, &format!("repo-{i}"), &[A], T0);
    }
    sim.advance(Duration::from_secs(30));
    let a = sim.id(A);
    assert_eq!(sim.engine.item_counts(a).confirmed, 250);
    for (_, filters) in sim.reqs(A) {
        assert!(filters.len() <= 20, "filters per REQ");
        let json = filters.iter().map(|f| f.as_json().len()).sum::<usize>();
        assert!(json <= 64 * 1024, "message size");
        for f in filters {
            assert!(f.generic_tags.len() <= 1, "one tag letter per filter");
            assert!(
                f.generic_tags.values().all(|v| v.len() <= 100),
                "chunks of 100"
            );
        }
    }
    let letters: std::collections::BTreeSet<char> = sim
        .reqs(A)
        .iter()
        .flat_map(|(_, fs)| {
            fs.iter()
                .flat_map(|f| f.generic_tags.keys().map(|k| k.as_char()))
        })
        .collect();
    assert_eq!(letters, ['A', 'a', 'd', 'q'].into_iter().collect());
    assert!(sim.engine.open_subscriptions(a) <= 4);
}

#[test]
fn rule4_closed_fails_the_batch_and_items_return_after_cooldown_or_backoff() {
    for (reason, wait) in [
        ("rate-limited: slow down", 65),
        ("ERROR: Rate-Limited: slow down", 65),
        ("auth-required: who are you", 5),
        ("restricted: members only", 5),
        ("error: internal", 5),
    ] {
        let mut sim = Sim::new(config());
        sim.add_relay(A).close_next.push_back(reason.into());
        let repo = announce(&mut sim, &keys(1), "r", &[A], T0);
        // The own relay's stored announcement is acted on at its EOSE, so
        // the REQ goes, and is refused, at once.
        sim.advance(Duration::from_millis(1));
        let a = sim.id(A);
        let key = ItemKey::Repo(repo);
        assert_eq!(
            sim.engine.item_state(a, &key),
            Some(ItemState::Queued),
            "{reason}: back to the diff"
        );
        assert_eq!(sim.engine.pending_batches(a), 0);
        let reqs = sim.reqs(A).len();
        sim.advance(Duration::from_secs(wait - 1));
        assert_eq!(
            sim.reqs(A).len(),
            reqs,
            "{reason}: no retry before {wait} s"
        );
        if wait == 65 {
            assert_eq!(sim.engine.relay_health(a, sim.now), Health::RateLimited);
        } else {
            assert_eq!(sim.engine.relay_health(a, sim.now), Health::Degraded);
        }
        sim.advance(Duration::from_secs(2));
        assert_eq!(
            sim.engine.item_state(a, &key),
            Some(ItemState::Confirmed),
            "{reason}: retried and confirmed"
        );
        sim.engine.check_invariants().unwrap();
    }
}

#[test]
fn rule4_refusal_by_limit_lowers_the_limit_and_loses_nothing() {
    for style in [Refuse::Closed, Refuse::Notice] {
        let mut cfg = config();
        cfg.max_filters_per_req = 4; // one repo chunk per REQ: many REQs
        cfg.chunk_size = 10;
        let mut sim = Sim::new(cfg);
        sim.add_relay(A).max_subs = Some((3, style));
        let owner = keys(1);
        let mut history = Vec::new();
        let mut repos = Vec::new();
        for i in 0..60 {
            let d = format!("r{i}");
            repos.push(announce(&mut sim, &owner, &d, &[A], T0));
            let ev = repo_comment(&keys(2), &coord(&owner, &d), T0 - 100, "history");
            sim.seed(A, &ev);
            history.push(ev);
        }
        sim.advance(Duration::from_secs(120));
        let a = sim.id(A);
        assert!(
            sim.engine.stats().refusals > 0,
            "{style:?}: the relay refused"
        );
        assert!(
            sim.engine.subscription_limit(a) <= 3,
            "{style:?}: limit learnt"
        );
        assert_eq!(sim.missing(&history), vec![], "{style:?}: nothing lost");
        assert_eq!(sim.engine.item_counts(a).confirmed, 60);
        let live = repo_comment(&keys(3), &repos[59], T0 + 500, "live");
        sim.publish(A, &live);
        sim.settle();
        assert!(
            sim.synced(&live.id),
            "{style:?}: live coverage within the learnt limit"
        );
        sim.engine.check_invariants().unwrap();
    }
}

#[test]
fn rule5_history_paginates_across_three_pages() {
    let mut sim = Sim::new(config());
    sim.add_relay(A).cap = 500;
    let owner = keys(1);
    let repo = announce(&mut sim, &owner, "r", &[A], T0);
    let issue = root(&owner, 1621, &[&repo], T0 - 100_000, "issue");
    let own = sim.own.clone();
    sim.publish(&own, &issue);
    let replies: Vec<Event> = (0..1_200)
        .map(|i| reply(&keys(2), &issue, T0 - 50_000 + i, &format!("r{i}")))
        .collect();
    for r in &replies {
        sim.seed(A, r);
    }
    sim.advance(Duration::from_secs(60));
    assert_eq!(
        sim.missing(&replies).len(),
        0,
        "all 1,200 replies arrive through a 500 cap"
    );
    let pages = sim
        .reqs(A)
        .iter()
        .filter(|(_, fs)| fs.iter().any(|f| f.until.is_some()))
        .count();
    assert!(pages >= 2, "follow-up pages asked with until ({pages})");
    let a = sim.id(A);
    assert_eq!(
        sim.engine.item_state(a, &ItemKey::Root(issue.id)),
        Some(ItemState::Confirmed)
    );
    let open = &sim.relays[A].subs;
    assert!(
        open.values().flatten().all(|f| f.until.is_none()),
        "follow-up pages are closed after EOSE"
    );
    assert!(
        open.values()
            .flatten()
            .any(|f| f.generic_tags.contains_key(&SingleLetterTag::UPPERCASE_E)),
        "the first page stays open for live events"
    );
}

#[test]
fn rule6_disconnect_clears_pending_and_reconnect_resumes() {
    let mut sim = Sim::new(config());
    sim.add_relay(A).silent = true; // pages never end: the batch stays pending
    let repo = announce(&mut sim, &keys(1), "r", &[A], T0);
    sim.advance(Duration::from_secs(6));
    let a = sim.id(A);
    assert_eq!(sim.engine.pending_batches(a), 1);
    sim.stop_relay(A);
    assert_eq!(
        sim.engine.pending_batches(a),
        0,
        "pending cleared on disconnect"
    );
    assert_eq!(
        sim.engine.item_state(a, &ItemKey::Repo(repo.clone())),
        Some(ItemState::Queued)
    );
    sim.relay(A).silent = false;
    sim.start_relay(A);
    sim.advance(Duration::from_secs(30));
    assert_eq!(
        sim.engine.item_state(a, &ItemKey::Repo(repo)),
        Some(ItemState::Confirmed)
    );
}

#[test]
fn rule7_consolidation_waits_for_pending_batches_at_most_the_timeout() {
    let mut cfg = config();
    cfg.consolidation_threshold = 6;
    cfg.eose_timeout = Duration::from_secs(3_600);
    let mut sim = Sim::new(cfg);
    sim.add_relay(A);
    let owner = keys(1);
    announce(&mut sim, &owner, "r0", &[A], T0);
    sim.advance(Duration::from_secs(10));
    let a = sim.id(A);
    assert_eq!(
        sim.engine.live_filter_count(a),
        5,
        "Layer 1 + one repo chunk live"
    );
    // The next batch would pass the threshold; its page never ends.
    sim.relay(A).silent = true;
    announce(&mut sim, &owner, "r1", &[A], T0);
    sim.advance(Duration::from_secs(6));
    assert_eq!(sim.engine.pending_batches(a), 1);
    let before = sim.engine.stats().consolidations;
    sim.advance(Duration::from_secs(25));
    assert_eq!(
        sim.engine.stats().consolidations,
        before,
        "waits while a batch is pending"
    );
    sim.relay(A).silent = false;
    sim.advance(Duration::from_secs(10));
    assert_eq!(
        sim.engine.stats().consolidations,
        before + 1,
        "consolidates once the timeout passes"
    );
    assert_eq!(
        sim.engine.pending_batches(a),
        1,
        "the pending page keeps running"
    );
}

#[test]
fn rule8_daily_sync_period_is_uniform_between_23_and_25_hours() {
    let mut periods = Vec::new();
    for seed in 0..20 {
        let mut cfg = config();
        cfg.seed = seed;
        let mut sim = Sim::new(cfg);
        sim.add_relay(A);
        announce(&mut sim, &keys(1), "r", &[A], T0);
        sim.advance(Duration::from_secs(10));
        let start = sim.now;
        let first = sim.reqs(A).len();
        let mut t = 0;
        while sim.reqs(A).len() == first {
            sim.advance(Duration::from_secs(600));
            t += 600;
            assert!(t <= 26 * 3600, "daily sync ran");
        }
        periods.push(sim.now.since(start).as_secs());
    }
    assert!(
        periods
            .iter()
            .all(|&p| (23 * 3600..=25 * 3600 + 600).contains(&p)),
        "{periods:?}"
    );
    let spread = periods.iter().max().unwrap() - periods.iter().min().unwrap();
    assert!(spread > 3600, "jittered, not fixed: {periods:?}");
}

#[test]
fn rule9_relays_without_targets_are_dropped_except_bootstrap() {
    let mut cfg = config();
    cfg.bootstrap = vec![C.into()];
    let mut sim = Sim::new(cfg);
    sim.add_relay(A);
    sim.add_relay(B);
    sim.add_relay(C);
    let owner = keys(1);
    announce(&mut sim, &owner, "r", &[A, B], T0);
    sim.advance(Duration::from_secs(10));
    let (a, b, c) = (sim.id(A), sim.id(B), sim.id(C));
    assert_eq!(
        sim.engine.relay_status(c),
        Status::Connected,
        "bootstrap connected at start"
    );
    // A newer announcement drops B.
    announce(&mut sim, &owner, "r", &[A], T0 + 1);
    sim.advance(Duration::from_secs(10));
    assert_eq!(
        sim.engine.item_counts(b),
        Default::default(),
        "B targets nothing"
    );
    sim.advance(Duration::from_secs(60));
    assert_eq!(
        sim.engine.relay_status(b),
        Status::Disconnected,
        "B dropped by the 60 s check"
    );
    assert_eq!(sim.engine.relay_status(a), Status::Connected);
    assert_eq!(
        sim.engine.relay_status(c),
        Status::Connected,
        "bootstrap kept without targets"
    );
}

#[test]
fn rule10_backoff_doubles_then_dead_relays_retry_daily() {
    let mut sim = Sim::new(config());
    sim.add_relay(A).online = false;
    announce(&mut sim, &keys(1), "r", &[A], T0);
    sim.advance(Duration::from_secs(5));
    sim.advance(Duration::from_secs(3 * 24 * 3600));
    let attempts: Vec<u64> = sim
        .connects
        .iter()
        .filter(|(_, u)| u == A)
        .map(|(t, _)| t.as_secs())
        .collect();
    let gaps: Vec<u64> = attempts.windows(2).map(|w| w[1] - w[0]).collect();
    for (i, expected) in [5u64, 10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600, 3600]
        .iter()
        .enumerate()
    {
        assert!(
            gaps[i] >= *expected && gaps[i] <= expected + expected / 10 + 1,
            "gap {i}: {} vs {expected}",
            gaps[i]
        );
    }
    let a = sim.id(A);
    assert_eq!(sim.engine.relay_health(a, sim.now), Health::Dead);
    assert!(
        gaps.iter().rev().take(1).all(|&g| g == 24 * 3600),
        "dead relays are tried once a day: {gaps:?}"
    );
    sim.start_relay(A);
    sim.advance(Duration::from_secs(24 * 3600));
    assert_eq!(sim.engine.relay_status(a), Status::Connected);
    assert_eq!(
        sim.engine.relay_health(a, sim.now),
        Health::Healthy,
        "a served EOSE heals"
    );
}

#[test]
fn rule11_only_verified_matching_events_reach_the_sink() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    sim.add_relay(B);
    let owner = keys(1);
    let repo = announce(&mut sim, &owner, "r", &[A, B], T0);
    let issue = root(&owner, 1621, &[&repo], T0, "issue");
    let own = sim.own.clone();
    sim.publish(&own, &issue);
    sim.advance(Duration::from_secs(20));
    let sub = sim.sub_asking(A, SingleLetterTag::UPPERCASE_E);

    let good = reply(&keys(2), &issue, T0 + 1, "good");
    let forged_id = {
        let mut json: serde_json::Value = serde_json::from_str(&good.as_json()).unwrap();
        json["content"] = "tampered".into();
        json.to_string()
    };
    let other = reply(&keys(2), &issue, T0 + 2, "other");
    let bad_sig = Event::new(
        good.id,
        good.pubkey,
        good.created_at,
        good.kind,
        good.tags.clone(),
        good.content.clone(),
        other.sig,
    );
    let unrelated_root = root(&owner, 1621, &[&repo], T0, "not ours yet");
    let outside = reply(&keys(2), &unrelated_root, T0 + 3, "outside the filter");
    let msg = |e: &str| format!(r#"["EVENT","{sub}",{e}]"#);

    sim.inject(A, &msg(&forged_id));
    sim.inject(A, &msg(&bad_sig.as_json()));
    sim.inject(A, &msg(&outside.as_json()));
    assert_eq!(
        sim.engine.stats().events_invalid,
        2,
        "bad id and bad signature"
    );
    assert!(
        sim.engine.stats().events_unwanted >= 1,
        "outside the filter"
    );
    assert!(!sim.synced(&good.id) && !sim.synced(&outside.id));

    sim.inject(A, &msg(&good.as_json()));
    assert!(sim.synced(&good.id));
    let ingested = sim.engine.stats().events_ingested;
    let sub_b = sim.sub_asking(B, SingleLetterTag::UPPERCASE_E);
    sim.inject(B, &format!(r#"["EVENT","{sub_b}",{}]"#, good.as_json()));
    assert_eq!(
        sim.engine.stats().events_ingested,
        ingested,
        "a duplicate from another relay is dropped"
    );
    assert!(sim.engine.stats().events_duplicate >= 1);
    sim.inject(A, &format!(r#"["EVENT","ffffff",{}]"#, other.as_json()));
    assert!(
        !sim.synced(&other.id),
        "an event for a subscription we never opened is dropped"
    );
}

#[test]
fn rule11_remote_announcements_must_list_our_domain() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    let owner = keys(1);
    announce(&mut sim, &owner, "r", &[A], T0);
    let ours = announcement(&keys(2), "lists-us", &[A, "wss://OWN.example/"], T0);
    let foreign = announcement(&keys(3), "elsewhere", &[A, "wss://other.example"], T0);
    sim.seed(A, &ours);
    sim.seed(A, &foreign);
    sim.advance(Duration::from_secs(20));
    assert!(sim.synced(&ours.id), "listing our domain: passed on");
    assert!(
        !sim.synced(&foreign.id),
        "not listing our domain: dropped (GRASP-01)"
    );
}

#[test]
fn recursive_discovery_through_the_own_relay() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    sim.add_relay(C);
    announce(&mut sim, &keys(1), "seed", &[A], T0);
    // A repo announced only on A, listing us and C; its issue and reply live on C.
    let remote_owner = keys(2);
    let ann = announcement(&remote_owner, "remote", &[OWN, C], T0);
    sim.seed(A, &ann);
    let repo = coord(&remote_owner, "remote");
    let issue = root(&keys(3), 1621, &[&repo], T0, "issue on C");
    let answer = reply(&remote_owner, &issue, T0 + 1, "reply on C");
    sim.seed(C, &issue);
    sim.seed(C, &answer);
    sim.advance(Duration::from_secs(60));
    assert!(sim.synced(&ann.id) && sim.synced(&issue.id) && sim.synced(&answer.id));
}

#[test]
fn announcements_newest_wins_in_any_order_and_drop_relays() {
    let mut sim = Sim::new(config());
    for r in [A, B, C] {
        sim.add_relay(r);
    }
    let owner = keys(1);
    let repo = coord(&owner, "r");
    let newer = announcement(&owner, "r", &[A, C], T0 + 10);
    let older = announcement(&owner, "r", &[A, B], T0);
    let own = sim.own.clone();
    sim.publish(&own, &newer);
    sim.advance(Duration::from_secs(10));
    sim.publish(&own, &older);
    sim.advance(Duration::from_secs(10));
    let key = ItemKey::Repo(repo.clone());
    let (a, c) = (sim.id(A), sim.id(C));
    assert_eq!(sim.engine.item_state(a, &key), Some(ItemState::Confirmed));
    assert_eq!(sim.engine.item_state(c, &key), Some(ItemState::Confirmed));
    assert!(
        sim.engine
            .relay_id(B)
            .is_none_or(|b| sim.engine.item_state(b, &key).is_none()),
        "an older announcement changes nothing"
    );

    let newest = announcement(&owner, "r", &[C], T0 + 20);
    sim.publish(&own, &newest);
    sim.advance(Duration::from_secs(10));
    assert_eq!(
        sim.engine.item_state(a, &key),
        None,
        "relay dropped by a newer announcement"
    );
    assert_eq!(sim.engine.item_state(c, &key), Some(ItemState::Confirmed));
    sim.engine.check_invariants().unwrap();
}

#[test]
fn relays_come_from_every_relays_value_and_clone_urls_normalized() {
    let mut sim = Sim::new(config());
    let owner = keys(1);
    let ann = sign(
        &owner,
        30617,
        T0,
        vec![
            tag(&["d", "r"]),
            tag(&[
                "relays",
                "WSS://A.example:443/",
                "wss://b.example",
                "https://not-a-relay.example",
                "garbage",
                OWN,
            ]),
            tag(&[
                "clone",
                "https://c.example/npub/r.git",
                "git@github.com:x/y.git",
            ]),
        ],
        "",
    );
    let own = sim.own.clone();
    sim.publish(&own, &ann);
    sim.advance(Duration::from_secs(6));
    let key = ItemKey::Repo(coord(&owner, "r"));
    for url in [A, B, C] {
        let id = sim
            .engine
            .relay_id(url)
            .unwrap_or_else(|| panic!("{url} learnt"));
        assert!(
            sim.engine.item_state(id, &key).is_some(),
            "{url} targets the repo"
        );
    }
    assert!(sim.engine.relay_id("wss://not-a-relay.example").is_none());
    let own_id = sim.engine.own_relay();
    assert!(
        sim.engine.item_state(own_id, &key).is_none(),
        "the own relay is never a target"
    );
    assert_eq!(sim.engine.relays().count(), 4, "own + A + B + C");
}

#[test]
fn roots_count_under_every_a_tag_and_survive_late_announcements() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    sim.add_relay(B);
    let (m1, m2) = (keys(1), keys(2));
    let (r1, r2) = (coord(&m1, "r"), coord(&m2, "r"));
    let own = sim.own.clone();
    // The root arrives before either announcement: one in the same batch, one later.
    let pr = root(
        &keys(3),
        1618,
        &[&r1, &r2],
        T0,
        "a PR to two maintainers' repos",
    );
    sim.publish(&own, &pr);
    sim.publish(&own, &announcement(&m1, "r", &[A], T0));
    sim.advance(Duration::from_secs(10));
    sim.publish(&own, &announcement(&m2, "r", &[B], T0));
    sim.advance(Duration::from_secs(10));
    let key = ItemKey::Root(pr.id);
    assert_eq!(
        sim.engine.item_state(sim.id(A), &key),
        Some(ItemState::Confirmed)
    );
    assert_eq!(
        sim.engine.item_state(sim.id(B), &key),
        Some(ItemState::Confirmed)
    );
    sim.engine.check_invariants().unwrap();
}

/// The test config with a ping after a minute of silence (the default
/// waits longer: the kernel's TCP keepalive finds dead peers first).
fn minute_keepalive() -> Config {
    let mut c = config();
    c.keepalive = Duration::from_secs(60);
    c
}

#[test]
fn keepalive_pings_silent_relays_and_drops_half_open_connections() {
    let mut sim = Sim::new(minute_keepalive());
    sim.add_relay(A);
    announce(&mut sim, &keys(1), "r", &[A], T0);
    sim.advance(Duration::from_secs(10));
    let a = sim.id(A);
    sim.advance(Duration::from_secs(600));
    assert!(
        sim.pings >= 9,
        "an idle relay is pinged about once a minute ({})",
        sim.pings
    );
    assert_eq!(
        sim.engine.relay_status(a),
        Status::Connected,
        "answered pings keep it"
    );
    let connects = sim.connects.len();
    sim.deaf.insert(a);
    sim.advance(Duration::from_secs(60));
    assert_eq!(
        sim.connects.len(),
        connects,
        "not dropped while within the pong timeout"
    );
    sim.advance(Duration::from_secs(25));
    assert_eq!(
        sim.engine.stats().connect_failures,
        1,
        "no answer: dropped as failed"
    );
    assert_eq!(
        sim.connects.len(),
        connects + 1,
        "and reconnected after backoff"
    );
    assert_eq!(sim.engine.relay_status(a), Status::Connected);
}

#[test]
fn an_idle_engine_wakes_only_on_whole_seconds() {
    // The first sync's deadlines (EOSE, connect, negentropy) expire long
    // after it, each REQ's at its own millisecond: at thousands of relays
    // that woke an idle loop hundreds of times a minute. They are armed
    // on whole seconds now, and share wake-ups.
    let mut sim = Sim::new(config());
    let urls: Vec<String> = (0..40).map(|i| format!("wss://r{i}.example")).collect();
    for (i, url) in urls.iter().enumerate() {
        // Announced at odd milliseconds, as real traffic comes.
        sim.advance(Duration::from_millis(37));
        sim.add_relay(url);
        announce(&mut sim, &keys(i as u8 + 1), "r", &[url.as_str()], T0);
    }
    sim.advance(Duration::from_secs(20));
    let quiet_until = sim.now + Duration::from_secs(400);
    let mut wakeups = 0;
    while let Some(next) = sim.engine.poll_timeout().filter(|&t| t <= quiet_until) {
        assert_eq!(next.as_millis() % 1_000, 0, "a wake-up at {next:?}");
        wakeups += 1;
        sim.advance(next.since(sim.now));
        assert!(wakeups < 1_000, "the engine keeps waking");
    }
    assert!(wakeups > 0, "the deadlines did expire in the window");
}

#[test]
fn unsolicited_pongs_are_no_sign_of_life() {
    // Relays holding a never-finished message send no whole message, only
    // pongs nobody asked for: the keepalive still finds them silent and
    // pings them (the shell reports only the pong answering that ping's
    // payload, so these pings go unanswered and the relays are dropped).
    let mut sim = Sim::new(minute_keepalive());
    sim.add_relay(A);
    announce(&mut sim, &keys(1), "r", &[A], T0);
    sim.advance(Duration::from_secs(10));
    let relays = [sim.id(A), sim.engine.own_relay()];
    sim.deaf.extend(relays);
    for _ in 0..18 {
        sim.advance(Duration::from_secs(5));
        let now = sim.now;
        for relay in relays {
            sim.engine.handle_pong(now, relay);
        }
    }
    assert!(
        sim.pings >= 2,
        "unsolicited pongs kept silent relays from being pinged ({} pings)",
        sim.pings
    );
}

#[test]
fn rule5_more_events_in_one_second_than_a_page_holds() {
    // A relay that honours larger limits: the stuck second is re-asked with a
    // doubled limit until it fits, so nothing is lost.
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    let owner = keys(1);
    let repo = announce(&mut sim, &owner, "r", &[A], T0);
    let comments: Vec<Event> = (0..1_200)
        .map(|i| repo_comment(&keys(2), &repo, T0 - 10, &format!("c{i}")))
        .collect();
    for c in &comments {
        sim.seed(A, c);
    }
    sim.advance(Duration::from_secs(60));
    assert_eq!(
        sim.missing(&comments).len(),
        0,
        "1,200 events of one second, limit 500"
    );
    let widened = sim
        .reqs(A)
        .iter()
        .flat_map(|(_, fs)| fs)
        .filter_map(|f| f.limit)
        .max();
    assert!(
        widened >= Some(1_200),
        "limit widened to fit the second ({widened:?})"
    );

    // A relay with a hard cap below the second's size: the chain still ends.
    let mut sim = Sim::new(config());
    sim.add_relay(A).cap = 500;
    let repo = announce(&mut sim, &owner, "r", &[A], T0);
    for i in 0..1_200 {
        sim.seed(A, &repo_comment(&keys(2), &repo, T0 - 10, &format!("c{i}")));
    }
    sim.advance(Duration::from_secs(60));
    let a = sim.id(A);
    assert_eq!(
        sim.engine.item_state(a, &ItemKey::Repo(repo)),
        Some(ItemState::Confirmed),
        "confirmed: the chain ended"
    );
    assert!(
        sim.reqs(A).len() < 50,
        "a bounded number of pages ({})",
        sim.reqs(A).len()
    );
}

#[test]
fn roots_synced_while_the_self_subscription_is_down_are_still_followed() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    let owner = keys(1);
    let repo = announce(&mut sim, &owner, "r", &[A], T0);
    sim.advance(Duration::from_secs(10));
    let own = sim.own.clone();
    // The own relay goes away; meanwhile a backdated root appears on A.
    sim.stop_relay(&own);
    let old_root = root(&keys(2), 1621, &[&repo], T0 - 50_000, "an old issue");
    let old_reply = reply(&keys(3), &old_root, T0 - 49_000, "its old reply");
    sim.publish(A, &old_root);
    sim.seed(A, &old_reply);
    sim.advance(Duration::from_secs(10));
    sim.start_relay(&own);
    sim.advance(Duration::from_secs(60));
    // The self-subscription's catch-up (since = last_connected - 15 min)
    // cannot return the backdated root; the engine follows it anyway.
    assert!(sim.synced(&old_root.id));
    assert!(sim.synced(&old_reply.id), "the root's history is fetched");
}

#[test]
fn live_state_from_any_maintainer_after_the_live_subscription_dropped_its_filters() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    let owner = keys(1);
    announce(&mut sim, &owner, "r", &[A], T0);
    sim.advance(Duration::from_secs(10));
    // A co-maintainer publishes the repo state under their own key.
    let maintainer_state = state(&keys(7), "r", T0 + 100);
    let other_repo_state = state(&keys(7), "not-ours", T0 + 100);
    sim.publish(A, &maintainer_state);
    sim.publish(A, &other_repo_state);
    sim.settle();
    assert!(
        sim.synced(&maintainer_state.id),
        "30618 for our repo's d arrives live"
    );
    assert!(
        !sim.synced(&other_repo_state.id),
        "30618 for another d does not"
    );
}

#[test]
fn every_page_gets_its_own_eose_deadline() {
    let mut cfg = config();
    cfg.eose_timeout = Duration::from_secs(10);
    let mut sim = Sim::new(cfg);
    let relay = sim.add_relay(A);
    relay.cap = 500;
    relay.silent = true; // EOSE is sent by hand below, late
    let owner = keys(1);
    let repo = announce(&mut sim, &owner, "r", &[A], T0);
    let comments: Vec<Event> = (0..700)
        .map(|i| repo_comment(&keys(2), &repo, T0 - 1_000 + i, &format!("c{i}")))
        .collect();
    for c in &comments {
        sim.seed(A, c);
    }
    sim.advance(Duration::from_millis(1)); // the own relay's EOSE: page 1 is sent
    let layer1 = sim.relays[A]
        .subs
        .iter()
        .find(|(_, fs)| fs.iter().all(|f| f.generic_tags.is_empty()))
        .map(|(id, _)| id.clone())
        .expect("Layer 1 is open");
    sim.inject(A, &format!(r#"["EOSE","{layer1}"]"#));
    sim.advance(Duration::from_secs(7));
    let page1 = sim.sub_asking(A, SingleLetterTag::LOWERCASE_A);
    sim.inject(A, &format!(r#"["EOSE","{page1}"]"#)); // 7 s after page 1: page 2 goes out
    sim.advance(Duration::from_secs(6)); // 13 s after page 1, 6 s after page 2
    let page2 = sim.relays[A]
        .subs
        .iter()
        .find(|(_, fs)| fs.iter().any(|f| f.until.is_some()))
        .map(|(id, _)| id.clone())
        .expect("page 2 is open");
    sim.inject(A, &format!(r#"["EOSE","{page2}"]"#));
    let a = sim.id(A);
    assert_eq!(
        sim.engine.stats().refusals,
        0,
        "page 2 did not inherit page 1's deadline"
    );
    assert_eq!(
        sim.engine.item_state(a, &ItemKey::Repo(repo)),
        Some(ItemState::Confirmed)
    );
    assert_eq!(sim.missing(&comments).len(), 0);
}

/// A connection's timers never fire into the next one (issue 45): the
/// first connection's pause after a `rate-limited:` refusal has its resume
/// timer; the connection drops, the next one is refused too and pauses
/// longer; the old timer, due first, must not end the new pause.
#[test]
fn a_pause_of_an_ended_connection_does_not_end_the_next_ones() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    let owner = keys(1);
    let own = sim.own.clone();
    sim.publish(&own, &announcement(&owner, "r", &[A], T0));
    sim.advance(Duration::from_secs(10));
    let a = sim.id(A);
    assert_eq!(sim.engine.relay_status(a), Status::Connected);
    let paused = |sim: &Sim| sim.engine.relay_view(a, sim.now).paused_until;
    sim.relay(A)
        .close_next
        .push_back("rate-limited: slow down".into());
    let repo = coord(&owner, "r");
    sim.publish(&own, &root(&owner, 1621, &[&repo], T0 + 1, "issue"));
    sim.advance(Duration::from_secs(6));
    let first = paused(&sim).expect("the first connection pauses");
    sim.stop_relay(A);
    sim.advance(Duration::from_secs(1));
    sim.relay(A)
        .close_next
        .push_back("rate-limited: again".into());
    sim.start_relay(A);
    sim.advance(Duration::from_secs(15));
    assert_eq!(sim.engine.relay_status(a), Status::Connected);
    let second = paused(&sim).expect("the second connection pauses");
    assert!(second > first, "{second:?} after {first:?}");
    let past_first = first.as_millis() + 1_000 - sim.now.as_millis();
    sim.advance(Duration::from_millis(past_first));
    assert_eq!(
        paused(&sim),
        Some(second),
        "the ended connection's resume left the new pause alone"
    );
}

/// A root the engine found on a remote comes back through the own relay
/// as an echo of what it stored; a window holding only such echoes closes
/// once they stop (`Config::echo_quiet`), so the root's replies are asked
/// at once instead of a whole batch window later. Someone else's event
/// still waits out the window (rule 1).
#[test]
fn an_echo_only_batch_window_closes_when_quiet() {
    let mut sim = Sim::new(config());
    let owner = keys(1);
    let own = sim.own.clone();
    let repo = coord(&owner, "r");
    sim.seed(&own, &announcement(&owner, "r", &[A], T0 - 100));
    let issue = root(&owner, 1621, &[&repo], T0 - 50, "issue");
    sim.seed(A, &issue);
    let replies: Vec<Event> = (0..3)
        .map(|i| reply(&keys(2), &issue, T0 - 40 + i, &format!("r{i}")))
        .collect();
    for r in &replies {
        sim.seed(A, r);
    }
    sim.advance(Duration::from_secs(1));
    assert!(sim.synced(&issue.id), "the issue was found at once");
    assert_eq!(
        sim.missing(&replies),
        Vec::<EventId>::new(),
        "its replies within a second, not after a 5 s window"
    );
}

/// The engine knows what it handed to the sink: once every root it
/// handed over is back, the window of their echoes closes after half the
/// quiet period (100 ms of 200, one round trip at 100 ms instead of two,
/// paid by every generation of discovery). Here the quiet is set past
/// the test's end: only the echoes being all back can close the window
/// in time.
#[test]
fn an_echo_only_batch_window_closes_once_all_handed_roots_are_back() {
    let mut config = config();
    config.echo_quiet = Duration::from_millis(2_400);
    let mut sim = Sim::new(config);
    let owner = keys(1);
    let own = sim.own.clone();
    let repo = coord(&owner, "r");
    sim.seed(&own, &announcement(&owner, "r", &[A], T0 - 100));
    let issues: Vec<Event> = (0..3)
        .map(|i| root(&owner, 1621, &[&repo], T0 - 50 + i, &format!("issue {i}")))
        .collect();
    let mut replies = Vec::new();
    for issue in &issues {
        sim.seed(A, issue);
        let reply = reply(&keys(2), issue, T0 - 10, "a reply");
        sim.seed(A, &reply);
        replies.push(reply);
    }
    sim.advance(Duration::from_secs(2));
    assert!(issues.iter().all(|i| sim.synced(&i.id)));
    assert_eq!(
        sim.missing(&replies),
        Vec::<EventId>::new(),
        "the replies of all three within 2 s, not after the 2.4 s quiet"
    );
}

/// A relay whose backoff had passed was connected by the diff (a repo
/// naming it came in) before its reconnect timer ran; the late timer then
/// set its link down, dropping the new attempt without a `Disconnect` or
/// the hand-back of its coverage, and asked a second connect. Driven
/// through the engine's API, so the timer runs only when asked.
#[test]
fn a_late_reconnect_timer_leaves_a_connection_the_diff_made() {
    use grasp_sync::testing::sim::instant::req_sub_id;
    use grasp_sync::{Action, Engine, Time};
    let mut config = Config::new(OWN);
    config.bootstrap = vec![B.to_owned()];
    let start = Time::from_millis(0);
    let mut engine = Engine::new(config, start).unwrap();
    let own = engine.own_relay();
    let b = engine.relay_id(B).unwrap();
    let drain = |e: &mut Engine| std::iter::from_fn(|| e.poll_action()).collect::<Vec<_>>();
    let connects = |actions: &[Action]| {
        let to_b = |a: &&Action| matches!(a, Action::Connect { relay, .. } if *relay == b);
        actions.iter().filter(to_b).count()
    };
    drain(&mut engine);
    engine.handle_connect_failed(start, b);
    engine.handle_connected(start, own);
    let sub = drain(&mut engine)
        .iter()
        .find_map(|a| match a {
            Action::Send { relay, message } if *relay == own => {
                req_sub_id(message).map(str::to_owned)
            }
            _ => None,
        })
        .expect("the self-subscription");
    // An hour on, long past B's backoff, before its timer runs: a repo
    // naming B, then the self-subscription's EOSE, which closes the batch
    // window at once; the diff connects B.
    let late = Time::from_millis(3_600_000);
    let repo = announcement(&keys(1), "r", &[OWN, B], T0);
    let sub = SubscriptionId::new(sub);
    engine.handle_message(late, own, &RelayMessage::event(sub.clone(), repo).as_json());
    engine.handle_message(late, own, &RelayMessage::eose(sub).as_json());
    // The own relay's later pages hold nothing more.
    let mut actions = Vec::new();
    loop {
        let batch = drain(&mut engine);
        let pages: Vec<String> = batch
            .iter()
            .filter_map(|a| match a {
                Action::Send { relay, message } if *relay == own => {
                    req_sub_id(message).map(str::to_owned)
                }
                _ => None,
            })
            .collect();
        actions.extend(batch);
        if pages.is_empty() {
            break;
        }
        for page in pages {
            let eose = RelayMessage::eose(SubscriptionId::new(page));
            engine.handle_message(late, own, &eose.as_json());
        }
    }
    assert_eq!(connects(&actions), 1, "the diff connects B");
    assert_eq!(engine.relay_status(b), Status::Connecting);
    engine.handle_timeout(late);
    assert_eq!(connects(&drain(&mut engine)), 0, "no second connect");
    assert_eq!(
        engine.relay_status(b),
        Status::Connecting,
        "the attempt stands"
    );
}
