//! The learned subscription limit (issue 46): real strfry with five
//! subscriptions per connection and its NIP-11 unreadable refuses the
//! sixth REQ with a NOTICE that names no subscription, and the engine
//! stepped its limit 7 → 6 → 1 and stayed at 1: every page on that relay
//! then waited for the one before it. These tests hold the limit near
//! what the relay allows, climbing back after a refusal left it low, and
//! never past a limit the relay stated.

mod support;

use std::time::Duration;

use grasp_sync::{RelayInfo, SavedLimits, SavedRelay, SavedState};
use nostr::prelude::*;
use support::*;

const A: &str = "wss://a.example";

/// Runs `sim` for `total` in steps of `step`, recording `A`'s limit
/// after each: (seconds since the start, limit).
fn limits_over(sim: &mut Sim, total: Duration, step: Duration) -> Vec<(u64, usize)> {
    let start = sim.now;
    let mut seen = Vec::new();
    while sim.now.since(start) < total {
        sim.advance(step);
        let a = sim.id(A);
        seen.push((
            sim.now.since(start).as_secs(),
            sim.engine.subscription_limit(a),
        ));
    }
    seen
}

/// The wire order issue 46 met, scripted: ten REQs out at once, the
/// relay answers the five it holds (pages, closed at their EOSE) and
/// then refuses the other five with NOTICEs naming none, as strfry does
/// on a path where our CLOSEs reach it a trip late. Counting what was
/// still open as each NOTICE landed stepped the limit to 1.
#[test]
fn refusals_landing_after_the_pages_they_counted_closed_leave_the_limit_at_the_relays() {
    let mut c = config();
    c.chunk_size = 1;
    c.max_filters_per_req = 1;
    c.consolidation_threshold = 0;
    let mut sim = Sim::new(c);
    sim.add_relay(A).scripted = true;
    let owner = keys(1);
    for i in 0..9 {
        announce(&mut sim, &owner, &format!("r{i}"), &[A], T0);
    }
    sim.advance(Duration::from_secs(1));
    let a = sim.id(A);
    let mut sent: Vec<u64> = sim.relays[A]
        .open()
        .iter()
        .map(|id| u64::from_str_radix(id, 16).expect("hex ids"))
        .collect();
    sent.sort_unstable();
    assert_eq!(sent.len(), 10, "a burst at our limit: {sent:?}");
    for id in &sent[..5] {
        sim.deliver(a, &format!(r#"["EOSE","{id:x}"]"#));
    }
    for _ in 0..5 {
        sim.deliver(a, r#"["NOTICE","ERROR: too many concurrent REQs"]"#);
    }
    assert_eq!(sim.engine.stats().refusals, 5);
    assert_eq!(
        sim.engine.subscription_limit(a),
        5,
        "one step per refusal: the five the relay held"
    );
}

/// Runs `sim` until every event of `history` is in, or `give_up` passes;
/// returns the seconds it took.
fn secs_to_sync(sim: &mut Sim, history: &[Event], give_up: Duration) -> u64 {
    let start = sim.now;
    while !sim.missing(history).is_empty() && sim.now.since(start) < give_up {
        sim.advance(Duration::from_secs(5));
    }
    sim.now.since(start).as_secs()
}

/// A limit an earlier process left at 1 (the issue's end state, saved)
/// on a relay that holds 5: under a long first sync it climbs back.
#[test]
fn a_limit_left_at_the_floor_climbs_back_to_what_the_relay_holds() {
    let (mut sim, history) = slow_world(5, 2, Some(1));
    let limits = limits_over(&mut sim, Duration::from_secs(600), Duration::from_secs(5));
    let stats = *sim.engine.stats();
    let a = sim.id(A);
    let first_at_4 = limits.iter().find(|(_, l)| *l >= 4).map(|(t, _)| *t);
    assert!(
        first_at_4.is_some_and(|t| t <= 400),
        "climbed within minutes: {limits:?}"
    );
    let took = secs_to_sync(&mut sim, &history, Duration::from_secs(3_600));
    assert_eq!(
        sim.missing(&history),
        vec![],
        "everything synced ({took}s more)"
    );
    assert!(sim.engine.subscription_limit(a) >= 4);
    assert!(
        stats.refusals <= 3,
        "a climb past 5 costs a refusal: {stats:?}"
    );
    sim.check();
}

/// A relay `A` holding `max` subscriptions (strfry's NOTICE past them,
/// no NIP-11), a page per `page_secs` per subscription, and 40 repos of
/// 45 comments read 5 a page (360 pages): minutes of history at any
/// limit. The engine starts from a saved state with `A`'s limit at
/// `saved`, if given.
fn slow_world(max: usize, page_secs: u64, saved: Option<u64>) -> (Sim, Vec<Event>) {
    let mut c = config();
    c.chunk_size = 1;
    c.max_filters_per_req = 1;
    let mut sim = Sim::new(c.clone());
    let a = sim.add_relay(A);
    a.max_subs = Some((max, Refuse::StrfryNotice));
    a.filter_cap = 5;
    a.reply_delay = Duration::from_secs(page_secs);
    let owner = keys(1);
    let mut history = Vec::new();
    for i in 0..40 {
        let d = format!("r{i}");
        let repo = announce(&mut sim, &owner, &d, &[A], T0);
        for j in 0..45 {
            let at = T0 - 100_000 + (i * 45 + j) as u64;
            let ev = repo_comment(&keys(2), &repo, at, &format!("{i}/{j}"));
            sim.seed(A, &ev);
            history.push(ev);
        }
    }
    let Some(saved) = saved else {
        return (sim, history);
    };
    let saved = SavedState {
        saved_at: sim.now.as_secs(),
        relays: vec![SavedRelay {
            url: A.to_owned(),
            limits: SavedLimits {
                subscriptions: Some(saved),
                ..SavedLimits::default()
            },
            ..SavedRelay::default()
        }],
        ..SavedState::default()
    };
    sim.engine.restore_state(sim.now, sim.now.as_secs(), saved);
    (sim, history)
}

/// A relay that states 3 (NIP-11) and holds 10: a limit saved at 1
/// climbs to the stated 3 and never past it.
#[test]
fn the_climb_never_passes_a_stated_limit() {
    let (mut sim, history) = slow_world(10, 2, Some(1));
    sim.relay(A).info = Some(RelayInfo {
        max_subscriptions: Some(3),
        ..RelayInfo::default()
    });
    let limits = limits_over(&mut sim, Duration::from_secs(600), Duration::from_secs(5));
    assert!(limits.iter().all(|(_, l)| *l <= 3), "{limits:?}");
    assert!(
        limits.iter().any(|(_, l)| *l == 3),
        "climbed to it: {limits:?}"
    );
    assert!(sim.relays[A].peak_subs <= 3, "the relay never saw a fourth");
    assert_eq!(sim.engine.stats().refusals, 0);
    secs_to_sync(&mut sim, &history, Duration::from_secs(3_600));
    assert_eq!(sim.missing(&history), vec![]);
    sim.check();
}
