//! Restarts resume (issue 15): an engine saves its state, a new engine
//! takes it back after simulated downtime, and the relays see the
//! difference. Within the quick-reconnect window every relay catches up
//! with `since` (no history re-read), a dead relay waits for its retry,
//! and learned limits hold; past the window each relay gets a fresh sync.
//! A hostile state file is taken no further than relay input.

mod support;

use std::time::Duration;

use grasp_sync::{Config, Engine, SavedLimits, SavedRelay, SavedState, Time};
use nostr::prelude::*;
use support::*;

const A: &str = "wss://a.example";
const B: &str = "wss://b.example";
const DEAD: &str = "wss://dead.example";
const UNLISTED: &str = "wss://unlisted.example";

/// Short death so the test need not wait a day for one.
fn restart_config() -> Config {
    let mut c = config();
    c.dead_after = Duration::from_secs(3_600);
    c.dead_retry = Duration::from_secs(6 * 3_600);
    c
}

/// A world that ran for a few hours: a repo on A and B with an issue and
/// a reply, a repo on A and a relay that has been down the whole time
/// (dead by now), and A taught the engine a subscription limit and that
/// it lacks NIP-77. Returns the sim and the issue.
fn ran_for_hours() -> (Sim, Event) {
    let mut sim = Sim::new(restart_config());
    sim.add_relay(A).max_subs = Some((2, Refuse::Closed));
    sim.add_relay(B);
    sim.add_relay(DEAD).online = false;
    let owner = keys(1);
    let repo = announce(&mut sim, &owner, "r", &[A, B], T0);
    announce(&mut sim, &owner, "s", &[A, DEAD], T0);
    let issue = root(&keys(2), 1621, &[&repo], T0 + 1, "issue");
    sim.seed(A, &issue);
    sim.seed(A, &reply(&keys(3), &issue, T0 + 2, "first reply"));
    // The own relay holds the issue already, so A's history is first
    // tried by NIP-77, which A answers as unknown.
    let own = sim.own.clone();
    sim.seed(&own, &issue);
    sim.advance(Duration::from_secs(3 * 3_600));
    assert!(sim.relays[A].neg_opens > 0, "A was asked NIP-77");
    sim.check();
    (sim, issue)
}

/// Stops the engine at the sim's clock (saving its state, through the
/// file's JSON), lets `downtime` pass, and starts a new engine that takes
/// the state back if `resume`. Relays forget the old connections; their
/// REQ and NEG-OPEN records restart empty so they show the new engine only.
fn restart(sim: &mut Sim, downtime: Duration, resume: bool) {
    restart_with(sim, restart_config(), downtime, resume);
}

/// [`restart`] with the new engine's `config`.
fn restart_with(sim: &mut Sim, config: Config, downtime: Duration, resume: bool) {
    restart_edited(sim, config, downtime, resume, |_| {});
}

/// [`restart_with`], the saved state changed by `edit` on its way.
fn restart_edited(
    sim: &mut Sim,
    config: Config,
    downtime: Duration,
    resume: bool,
    edit: impl FnOnce(&mut SavedState),
) {
    let saved = sim.engine.save_state(sim.now, sim.now.as_secs(), None);
    let mut saved = SavedState::decode(&saved.encode()).expect("own encoding decodes");
    edit(&mut saved);
    for relay in sim.relays.values_mut() {
        relay.on_disconnect();
        relay.reqs.clear();
        relay.neg_opens = 0;
    }
    sim.connected.clear();
    sim.connects.clear();
    sim.now = sim.now + downtime;
    sim.engine = Engine::new(config, sim.now).expect("valid config");
    if resume {
        sim.engine.restore_state(sim.now, sim.now.as_secs(), saved);
    }
    sim.settle();
}

/// Every filter of every REQ `url` got, and how many were without `since`.
fn reqs_without_since(sim: &Sim, url: &str) -> (usize, usize) {
    let filters: Vec<&Filter> = sim.reqs(url).iter().flat_map(|(_, fs)| fs).collect();
    let without = filters.iter().filter(|f| f.since.is_none()).count();
    (filters.len(), without)
}

fn connects_to(sim: &Sim, url: &str) -> usize {
    sim.connects.iter().filter(|(_, u)| u == url).count()
}

#[test]
fn after_a_minute_down_every_relay_catches_up_with_since() {
    let (mut sim, issue) = ran_for_hours();
    let sub_limit = sim.engine.subscription_limit(sim.id(A));
    assert!(sub_limit <= 2, "A taught its limit: {sub_limit}");
    let down_at = sim.now;
    let late = reply(&keys(4), &issue, down_at.as_secs() + 30, "while down");
    sim.seed(A, &late);
    restart(&mut sim, Duration::from_secs(60), true);
    sim.advance(Duration::from_secs(30));

    for url in [A, B] {
        let (filters, without) = reqs_without_since(&sim, url);
        assert!(filters > 0, "{url}: live subscriptions re-opened");
        assert_eq!(without, 0, "{url}: no filter re-reads history");
        assert_eq!(sim.relays[url].neg_opens, 0, "{url}: no reconciliation");
        let since = sim.reqs(url)[0].1[0].since.expect("since").as_secs();
        assert_eq!(since, down_at.as_secs() - 900, "{url}: from the stop");
    }
    assert!(sim.synced(&late.id), "the reply posted while down arrived");
    assert_eq!(sim.engine.subscription_limit(sim.id(A)), sub_limit);
    assert_eq!(connects_to(&sim, DEAD), 0, "the dead relay waits");
    sim.check();
}

/// A file written before the host's trailing dot and percent-encodings
/// were folded (issue 26) may spell a relay the old way: it is still that
/// relay's state.
#[test]
fn state_saved_under_an_older_spelling_is_the_relays() {
    let (mut sim, _) = ran_for_hours();
    let sub_limit = sim.engine.subscription_limit(sim.id(A));
    restart_edited(
        &mut sim,
        restart_config(),
        Duration::from_secs(60),
        true,
        |saved| {
            for relay in &mut saved.relays {
                relay.url = match relay.url.as_str() {
                    A => "wss://a.example.".to_owned(),
                    B => "wss://b.example./%7e/..".to_owned(),
                    other => other.to_owned(),
                };
            }
        },
    );
    sim.advance(Duration::from_secs(30));
    for url in [A, B] {
        let (filters, without) = reqs_without_since(&sim, url);
        assert!(filters > 0, "{url}: live subscriptions re-opened");
        assert_eq!(without, 0, "{url}: caught up, as its state allows");
    }
    assert_eq!(sim.engine.subscription_limit(sim.id(A)), sub_limit);
}

#[test]
fn a_dead_relay_is_retried_at_its_time_not_at_the_restart() {
    let (mut sim, _) = ran_for_hours();
    restart(&mut sim, Duration::from_secs(60), true);
    sim.advance(Duration::from_secs(2 * 3_600));
    assert_eq!(connects_to(&sim, DEAD), 0, "not retried before its time");
    sim.advance(Duration::from_secs(5 * 3_600));
    assert!(connects_to(&sim, DEAD) >= 1, "retried at its time");

    let (mut fresh, _) = ran_for_hours();
    restart(&mut fresh, Duration::from_secs(60), false);
    fresh.advance(Duration::from_secs(10));
    assert!(
        connects_to(&fresh, DEAD) >= 1,
        "without the state it is tried at once (the difference under test)"
    );
}

/// A bootstrap relay is asked to connect by the new engine at once; a
/// saved retry time takes that back.
#[test]
fn a_dead_bootstrap_relay_waits_for_its_retry_too() {
    let mut config = restart_config();
    config.bootstrap = vec![DEAD.to_owned()];
    let mut sim = Sim::new(config.clone());
    sim.add_relay(DEAD).online = false;
    sim.advance(Duration::from_secs(2 * 3_600));
    restart_with(&mut sim, config.clone(), Duration::from_secs(60), true);
    sim.advance(Duration::from_secs(3_600));
    assert_eq!(connects_to(&sim, DEAD), 0, "not retried before its time");
    restart_with(&mut sim, config, Duration::from_secs(60), false);
    assert_eq!(connects_to(&sim, DEAD), 1, "without the state: at once");
}

/// The daily full sync keeps its schedule across a quick restart: it
/// comes 23-25 h after the first run's, not after the restart.
#[test]
fn the_daily_full_sync_keeps_its_schedule() {
    let (mut sim, _) = ran_for_hours();
    restart(&mut sim, Duration::from_secs(60), true);
    sim.advance(Duration::from_secs(30));
    assert_eq!(reqs_without_since(&sim, B).1, 0, "quick, not fresh");
    // A schedule started at the restart would be due 23 h after it at
    // the earliest, past this.
    let due_by = Time::from_secs(T0 + 25 * 3_600 + 60);
    sim.advance(due_by.since(sim.now));
    let (_, without) = reqs_without_since(&sim, B);
    assert!(
        without + sim.relays[B].neg_opens > 0,
        "B's history read again by its daily sync, on the first run's schedule"
    );
}

#[test]
fn after_twenty_minutes_down_each_relay_gets_its_fresh_sync() {
    let (mut sim, _) = ran_for_hours();
    let sub_limit = sim.engine.subscription_limit(sim.id(A));
    restart(&mut sim, Duration::from_secs(20 * 60), true);
    sim.advance(Duration::from_secs(30));
    for url in [A, B] {
        let (_, without) = reqs_without_since(&sim, url);
        let negs = sim.relays[url].neg_opens;
        assert!(without + negs > 0, "{url}: history read again");
    }
    assert_eq!(sim.relays[A].neg_opens, 0, "A's lack of NIP-77 remembered");
    assert_eq!(sim.engine.subscription_limit(sim.id(A)), sub_limit);
    sim.check();
}

/// Without the state the same minute of downtime re-reads everything: the
/// quick catch-up above is the state's doing.
#[test]
fn without_the_state_a_restart_re_reads_every_relay() {
    let (mut sim, _) = ran_for_hours();
    restart(&mut sim, Duration::from_secs(60), false);
    sim.advance(Duration::from_secs(30));
    for url in [A, B] {
        let (_, without) = reqs_without_since(&sim, url);
        assert!(without + sim.relays[url].neg_opens > 0, "{url}");
    }
}

/// A hostile file: unlisted relays, the own relay, times in the future,
/// limits above ours, absurd counts. Unlisted relays are never connected,
/// the own relay is read from the start, no limit is raised, no retry is
/// pushed past the policy's longest, and sync still completes.
#[test]
fn a_hostile_state_is_no_more_trusted_than_a_relay() {
    let mut sim = Sim::new(restart_config());
    sim.add_relay(A);
    sim.add_relay(UNLISTED);
    let repo = announce(&mut sim, &keys(1), "r", &[A], T0);
    let issue = root(&keys(2), 1621, &[&repo], T0 + 1, "issue");
    sim.seed(A, &issue);
    let future = T0 + 10 * 365 * 86_400;
    let hostile = |url: &str| SavedRelay {
        url: url.to_owned(),
        last_connected: Some(future),
        disconnected: Some(future),
        covered_until: Some(future),
        next_full_sync: Some(u64::MAX),
        failures: u32::MAX,
        failing_since: Some(future),
        retry_at: Some(u64::MAX),
        penalties: u32::MAX,
        limits: SavedLimits {
            subscriptions: Some(u64::MAX),
            page_limit: Some(0),
            result_cap: Some(u64::MAX),
            ..SavedLimits::default()
        },
        confirmed: vec![0, 1, u64::MAX],
        ..SavedRelay::default()
    };
    let own = sim.own.clone();
    let saved = SavedState {
        saved_at: future,
        relays: vec![
            hostile(A),
            hostile(UNLISTED),
            hostile(&own),
            hostile("not a url"),
        ],
        ..SavedState::default()
    };
    sim.engine = Engine::new(restart_config(), sim.now).expect("valid config");
    sim.engine.restore_state(sim.now, sim.now.as_secs(), saved);
    sim.advance(Duration::from_secs(10));
    let own_reads = reqs_without_since(&sim, &own);
    assert!(own_reads.1 > 0, "the own relay is read from the start");
    assert_eq!(
        connects_to(&sim, UNLISTED),
        0,
        "an unlisted relay is a hint"
    );
    assert_eq!(
        sim.engine.subscription_limit(sim.id(A)),
        config().max_subscriptions,
        "no limit raised"
    );
    assert_eq!(connects_to(&sim, A), 0, "A waits for its (clamped) retry");
    sim.advance(Duration::from_secs(6 * 3_600 + 60));
    assert!(
        connects_to(&sim, A) >= 1,
        "retry clamped to the policy's longest"
    );
    sim.advance(Duration::from_secs(60));
    assert!(sim.synced(&issue.id), "A synced once retried");
    assert_eq!(connects_to(&sim, UNLISTED), 0);
    sim.check();
}

/// What is saved stays bounded whatever was restored: 2,000 relays and
/// 100,000 confirmed-item hashes at most (README, "Restarts").
#[test]
fn a_saved_state_stays_bounded() {
    let relays = (0..2_500)
        .map(|i| SavedRelay {
            url: format!("wss://r{i}.example"),
            failures: 1,
            confirmed: (0..100).collect(),
            ..SavedRelay::default()
        })
        .collect();
    let saved = SavedState {
        saved_at: T0,
        relays,
        ..SavedState::default()
    };
    let mut sim = Sim::new(restart_config());
    sim.engine.restore_state(sim.now, T0, saved);
    sim.settle();
    let again = sim.engine.save_state(sim.now, T0, None);
    assert_eq!(again.relays.len(), 2_000);
    let hashes: usize = again.relays.iter().map(|r| r.confirmed.len()).sum();
    assert_eq!(hashes, 100_000);
    let bytes = again.encode().len();
    assert!(bytes < 5 * 1024 * 1024 / 2, "{bytes} bytes: under 2.5 MiB");
}
