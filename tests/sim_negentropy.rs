//! NIP-77 negentropy for historic sync, in the core against fake relays
//! with a simulated clock: only missing events are fetched, and every way a
//! relay can lack negentropy ends in the REQ path with nothing lost.

mod support;

use std::time::Duration;

use grasp_sync::Config;
use nostr::prelude::*;
use support::*;

const A: &str = "wss://a.example";

/// A repo on `A` with `n` comments, of which the own relay already holds
/// all but `missing`; returns (all comments, the missing ones).
fn world(sim: &mut Sim, mode: NegMode, n: usize, missing: usize) -> (Vec<Event>, Vec<Event>) {
    let owner = keys(1);
    let coord = coord(&owner, "r");
    sim.add_relay(A).negentropy = mode;
    let own = sim.own.clone();
    let comments: Vec<Event> = (0..n)
        .map(|i| repo_comment(&owner, &coord, T0 - 1_000 + i as u64, &format!("c{i}")))
        .collect();
    for (i, c) in comments.iter().enumerate() {
        sim.seed(A, c);
        if i >= missing {
            sim.seed(&own, c);
        }
    }
    sim.publish(&own, &announcement(&owner, "r", &[A], T0));
    let gone = comments[..missing].to_vec();
    (comments, gone)
}

/// Events the engine fetched by `ids` REQ.
fn ids_asked(sim: &Sim) -> usize {
    sim.reqs(A)
        .iter()
        .flat_map(|(_, fs)| fs.iter())
        .filter_map(|f| f.ids.as_ref())
        .map(|ids| ids.len())
        .sum()
}

/// REQs that re-read history by tag (the REQ path).
fn tag_reqs(sim: &Sim) -> usize {
    sim.reqs(A)
        .iter()
        .filter(|(_, fs)| {
            fs.iter()
                .any(|f| !f.generic_tags.is_empty() && f.since.is_none())
        })
        .count()
}

#[test]
fn a_relay_with_negentropy_gets_asked_only_for_what_is_missing() {
    let mut sim = Sim::new(config());
    let (all, gone) = world(&mut sim, NegMode::Supported, 300, 7);
    sim.advance(Duration::from_secs(10));
    assert!(sim.missing(&all).is_empty(), "{:?}", sim.missing(&all));
    assert_eq!(ids_asked(&sim), gone.len());
    let stats = sim.engine.stats();
    assert_eq!(stats.neg_ids_fetched, gone.len() as u64);
    assert!(stats.neg_sessions >= 1 && stats.neg_rounds >= 1);
    assert_eq!(stats.neg_fallbacks, 0);
    assert_eq!(tag_reqs(&sim), 0, "no history re-read by REQ");
    let a = sim.id(A);
    assert_eq!(sim.engine.item_counts(a).pending, 0);
    assert!(sim.engine.item_counts(a).confirmed >= 1);

    // Live events still arrive: the synced items got live coverage.
    let owner = keys(1);
    let live = repo_comment(&owner, &coord(&owner, "r"), T0 + 50, "live");
    sim.publish(A, &live);
    sim.advance(Duration::from_secs(70));
    sim.publish(
        A,
        &repo_comment(&owner, &coord(&owner, "r"), T0 + 90, "later"),
    );
    sim.settle();
    assert!(sim.synced(&live.id));
    sim.engine.check_invariants().unwrap();
}

#[test]
fn the_daily_sync_reconciles_again_and_fetches_only_the_gap() {
    let mut config = config();
    config.daily_min = Duration::from_secs(3_600);
    config.daily_max = Duration::from_secs(3_600);
    let mut sim = Sim::new(config);
    let (all, _) = world(&mut sim, NegMode::Supported, 100, 0);
    sim.advance(Duration::from_secs(10));
    assert!(sim.missing(&all).is_empty());
    let fetched = sim.engine.stats().neg_ids_fetched;
    // Drift the live stream missed: on the relay only, not delivered live.
    let owner = keys(1);
    let drift = repo_comment(&owner, &coord(&owner, "r"), T0 - 5, "missed live");
    sim.seed(A, &drift);
    sim.advance(Duration::from_secs(3_700));
    assert!(sim.synced(&drift.id));
    assert_eq!(sim.engine.stats().neg_ids_fetched, fetched + 1);
    assert_eq!(tag_reqs(&sim), 0);
}

#[test]
fn a_notice_saying_unknown_falls_back_and_is_remembered() {
    let mut sim = Sim::new(config());
    let (all, _) = world(&mut sim, NegMode::Unknown, 50, 5);
    sim.advance(Duration::from_secs(10));
    assert!(sim.missing(&all).is_empty());
    assert_eq!(sim.relays[A].neg_opens, 1);
    assert!(sim.engine.stats().neg_fallbacks >= 1);
    assert!(tag_reqs(&sim) >= 1);
    // Reconnect: REQ at once, no second NEG-OPEN.
    sim.stop_relay(A);
    sim.start_relay(A);
    sim.advance(Duration::from_secs(600));
    assert_eq!(sim.relays[A].neg_opens, 1);
}

#[test]
fn neg_err_falls_back_and_delivers_everything() {
    let mut sim = Sim::new(config());
    let (all, _) = world(&mut sim, NegMode::Error, 50, 5);
    sim.advance(Duration::from_secs(10));
    assert!(sim.missing(&all).is_empty());
    assert_eq!(sim.relays[A].neg_opens, 1);
    assert!(sim.engine.stats().neg_fallbacks >= 1);
}

#[test]
fn silence_times_out_falls_back_and_is_remembered() {
    let mut sim = Sim::new(config());
    let (all, _) = world(&mut sim, NegMode::Silent, 50, 5);
    sim.advance(Duration::from_secs(10));
    assert!(!sim.missing(&all).is_empty(), "still waiting for NEG-MSG");
    sim.advance(Duration::from_secs(20));
    assert!(sim.missing(&all).is_empty());
    assert_eq!(sim.relays[A].neg_opens, 1);
    sim.stop_relay(A);
    sim.start_relay(A);
    sim.advance(Duration::from_secs(600));
    assert_eq!(sim.relays[A].neg_opens, 1);
}

#[test]
fn negentropy_can_be_turned_off() {
    let mut config: Config = config();
    config.negentropy = false;
    let mut sim = Sim::new(config);
    let (all, _) = world(&mut sim, NegMode::Supported, 50, 5);
    sim.advance(Duration::from_secs(10));
    assert!(sim.missing(&all).is_empty());
    assert_eq!(sim.relays[A].neg_opens, 0);
    assert_eq!(sim.engine.stats().neg_sessions, 0);
}

#[test]
fn nothing_held_locally_goes_straight_to_req() {
    let mut sim = Sim::new(config());
    let owner = keys(1);
    let coord = coord(&owner, "r");
    sim.add_relay(A).negentropy = NegMode::Supported;
    let comment = repo_comment(&owner, &coord, T0 - 10, "only remote");
    sim.seed(A, &comment);
    let own = sim.own.clone();
    sim.publish(&own, &announcement(&owner, "r", &[A], T0));
    sim.advance(Duration::from_secs(10));
    assert!(sim.synced(&comment.id));
    let stats = sim.engine.stats();
    assert_eq!(stats.neg_sessions, 0);
    assert_eq!((stats.neg_skipped, stats.neg_fallbacks), (1, 0));
}

/// Issue 13, item 4: after a long downtime thousands of ids are missing.
/// Their `ids` REQs wait for free subscription slots like any historic
/// work, so a relay allowing ten at once refuses none of them.
#[test]
fn thousands_of_missing_ids_are_fetched_within_the_subscription_limit() {
    let mut sim = Sim::new(config());
    let (all, gone) = world(&mut sim, NegMode::Supported, 6_010, 6_000);
    sim.relay(A).max_subs = Some((10, Refuse::Closed));
    sim.advance(Duration::from_secs(60));
    assert!(
        sim.missing(&all).is_empty(),
        "{} missing",
        sim.missing(&all).len()
    );
    assert!(
        sim.relays[A].peak_subs <= 10,
        "{} open at once",
        sim.relays[A].peak_subs
    );
    let stats = sim.engine.stats();
    assert_eq!(stats.refusals, 0);
    assert_eq!(stats.neg_fallbacks, 0);
    assert_eq!(stats.neg_ids_fetched, gone.len() as u64);
    assert_eq!(tag_reqs(&sim), 0, "no history re-read by REQ");
    sim.engine.check_invariants().unwrap();
}

/// Issue 13, item 4: a relay whose `NEG-MSG`s never converge, reporting
/// ids no one stores (or none) round after round. The exchange ends
/// within a bounded number of rounds and ids, never opens more REQs than
/// the relay allows, and the history arrives by REQ paging.
#[test]
fn a_neg_msg_exchange_that_never_converges_ends_in_req_paging() {
    for ids_per_round in [0, 300] {
        let mut sim = Sim::new(config());
        let mode = NegMode::Endless { ids_per_round };
        let (all, _) = world(&mut sim, mode, 50, 5);
        sim.relay(A).max_subs = Some((10, Refuse::Closed));
        sim.advance(Duration::from_secs(60));
        assert!(sim.missing(&all).is_empty(), "{ids_per_round} ids a round");
        let stats = sim.engine.stats();
        // 200 rounds answered; the 201st NEG-MSG is the one given up on.
        assert!(stats.neg_rounds <= 201, "{} rounds", stats.neg_rounds);
        assert!(stats.neg_fallbacks >= 1);
        assert_eq!(stats.neg_ids_fetched, 0, "no made-up id fetched");
        assert!(
            sim.relays[A].peak_subs <= 10,
            "{} open",
            sim.relays[A].peak_subs
        );
        assert!(tag_reqs(&sim) >= 1, "history re-read by REQ");
        sim.engine.check_invariants().unwrap();
    }
}
