//! Beside the own relay (issue 24): how the engine's links to the relay it
//! syncs into come back after the relay went away.

mod support;

use std::time::Duration;

use grasp_sync::{Engine, SavedState};
use support::*;

const A: &str = "wss://a.example";

/// The read link (the self-subscription, which sees new repos and roots)
/// used the remote relays' doubling backoff: after an outage of ten minutes
/// it came back five minutes after the relay did (up to an hour after a
/// long one), while the write link caps at 30 s. Both cap at 30 s now.
#[test]
fn the_read_link_is_back_within_30_s_of_the_own_relay() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    let owner = keys(1);
    announce(&mut sim, &owner, "r", &[A], T0);
    sim.advance(Duration::from_secs(10));
    let own = sim.own.clone();
    let own_id = sim.id(&own);
    assert!(sim.connected.contains(&own_id), "read link up first");
    sim.stop_relay(&own);
    sim.advance(Duration::from_secs(600));
    sim.start_relay(&own);
    let back = sim.now;
    // A client publishes a root to the relay as soon as it is back; only
    // the read link can see it.
    let issue = root(&owner, 1621, &[&coord(&owner, "r")], T0 + 611, "late");
    sim.seed(&own, &issue);
    let answer = reply(&keys(2), &issue, T0 + 612, "answer");
    sim.seed(A, &answer);
    sim.advance(Duration::from_secs(31));
    assert!(
        sim.connected.contains(&own_id),
        "the read link reconnects within 30 s of the relay's return"
    );
    let first = sim
        .connects
        .iter()
        .filter(|(t, url)| *t >= back && *url == own)
        .map(|(t, _)| t.since(back))
        .min();
    assert!(
        first.is_some_and(|d| d <= Duration::from_secs(30)),
        "{first:?}"
    );
    eprintln!("read link back {first:?} after the own relay's return (10-minute outage)");
    sim.advance(Duration::from_secs(30));
    assert!(
        sim.synced(&answer.id),
        "the new root seen, its reply synced"
    );
    sim.check();
}

/// Issue 24: an event the own relay refused for good (`blocked:`,
/// `invalid:`, its size limit) was fetched and offered again by every
/// daily full sync and every restart, and refused again, each day. Now
/// the engine remembers it, in the state file too: the restarted
/// engine's full re-read neither offers it nor lets negentropy fetch it,
/// and counts it skipped, while the other events still arrive.
#[test]
fn an_event_refused_for_good_is_not_offered_again_after_a_restart() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    let owner = keys(1);
    announce(&mut sim, &owner, "r", &[A], T0);
    let own = sim.own.clone();
    let issue = root(&owner, 1621, &[&coord(&owner, "r")], T0 + 1, "issue");
    sim.seed(&own, &issue);
    let refused = reply(&keys(2), &issue, T0 + 2, "refused");
    sim.seed(A, &refused);
    sim.sink_refuses.insert(refused.id);
    sim.advance(Duration::from_secs(30));
    let offers = |sim: &Sim| {
        sim.ingested
            .iter()
            .filter(|(_, e)| e.id == refused.id)
            .count()
    };
    assert_eq!(offers(&sim), 1, "offered once");
    // What the shell does with the own-relay client's `RefusedForGood`.
    sim.engine.handle_refused_for_good(refused.id);

    let saved = sim.engine.save_state(sim.now, sim.now.as_secs(), None);
    assert_eq!(saved.refused, vec![refused.id]);
    let saved = SavedState::decode(&saved.encode()).expect("own encoding decodes");
    for relay in sim.relays.values_mut() {
        relay.on_disconnect();
    }
    sim.connected.clear();
    sim.now = sim.now + Duration::from_secs(3600);
    sim.engine = Engine::new(config(), sim.now).expect("valid config");
    sim.engine.restore_state(sim.now, sim.now.as_secs(), saved);
    let later = reply(&keys(3), &issue, T0 + 3, "later");
    sim.seed(A, &later);
    sim.advance(Duration::from_secs(60));

    assert!(sim.synced(&later.id), "the rest still syncs");
    assert_eq!(offers(&sim), 1, "not offered again");
    assert!(sim.engine.stats().events_refused_skipped >= 1);
    sim.check();
}
