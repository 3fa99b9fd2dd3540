//! Beside the own relay (issue 24): how the engine's links to the relay it
//! syncs into come back after the relay went away.

mod support;

use std::time::Duration;

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
    sim.advance(Duration::from_secs(30));
    assert!(
        sim.synced(&answer.id),
        "the new root seen, its reply synced"
    );
    sim.check();
}
