//! The own relay misbehaving or away, over real loopback sockets: what it
//! cannot take is set aside without holding up what it can, and its outage
//! never costs the remote relays their connections.

mod support;

use std::time::Duration;

use grasp_sync::testing::fault::Fault;
use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use nostr::prelude::*;
use support::running::*;
use support::*;

/// Both nostr-rs-relay's `max_event_bytes` and strfry's
/// `maxWebsocketPayloadSize` default to 128 KiB.
const OWN_MAX: usize = 128 * 1024;

/// Metric line of the events the own relay could not take.
const SET_ASIDE: &str = "grasp_sync_sink_events_total{outcome=\"set_aside\"}";

/// A repo whose issue lives on the own relay and remote relay `remote`, with
/// `large` comments of about 200 KB (the newest, so they reach the outbox
/// first) and `small` ordinary ones on `remote`. Returns the own relay,
/// the large comments and the small ones.
fn world(
    own_fault: Option<Fault>,
    remote: &TestRelay,
    large: usize,
    small: usize,
) -> (TestRelay, Vec<Event>, Vec<Event>) {
    let own = RelayOptions {
        fault: own_fault,
        ..RelayOptions::default()
    };
    world_with(own, remote, large, small)
}

/// [`world`] with an own relay started with `own`.
fn world_with(
    own: RelayOptions,
    remote: &TestRelay,
    large: usize,
    small: usize,
) -> (TestRelay, Vec<Event>, Vec<Event>) {
    let own = TestRelay::start(own).unwrap();
    let owner = keys(1);
    own.publish(announcement(&owner, "repo", &[&remote.url()], T0));
    let repo = coord(&owner, "repo");
    let issue = root(&owner, 1621, &[&repo], T0, "issue");
    own.publish(issue.clone());
    let small: Vec<Event> = (0..small as u64)
        .map(|i| reply(&keys(2), &issue, T0 + 1 + i, &format!("small {i}")))
        .collect();
    let big = "x".repeat(200_000);
    let large: Vec<Event> = (0..large as u64)
        .map(|i| reply(&keys(3), &issue, T0 + 10_000 + i, &format!("{big}{i:04}")))
        .collect();
    for e in small.iter().chain(&large) {
        remote.publish(e.clone());
    }
    (own, large, small)
}

/// nostr-rs-relay answers an event over `max_event_bytes` with a `NOTICE`
/// and no `OK`. A full in-flight window of such events once stalled the
/// outbox for good; now each `NOTICE` sets the event aside and the events
/// behind them arrive.
#[test]
fn an_own_relay_that_answers_large_events_with_a_notice_takes_the_rest() {
    let remote = TestRelay::start(RelayOptions::default()).unwrap();
    let fault = Fault::LargeEventNotice { max_bytes: OWN_MAX };
    let (own, large, small) = world(Some(fault), &remote, 110, 20);
    let running = Running::start(&own, |_, _| {});
    assert!(
        wait_for(60, || missing(&own, &small) == 0),
        "{} of {} small events lost behind large ones",
        missing(&own, &small),
        small.len()
    );
    assert!(wait_for(30, || running.metric(SET_ASIDE) == large.len() as u64));
    assert_eq!(missing(&own, &large), large.len());
    assert!(own.faults_injected() >= 1);
    running.stop();
}

/// An own relay that states its size limit in NIP-11 (`max_message_length`)
/// is never offered an event over it: the large comments are set aside
/// before they are sent, so the relay never has to refuse one, and the
/// rest arrive.
#[test]
fn an_own_relay_stating_its_size_limit_is_never_offered_larger_events() {
    let remote = TestRelay::start(RelayOptions::default()).unwrap();
    let own = RelayOptions {
        fault: Some(Fault::LargeEventNotice { max_bytes: OWN_MAX }),
        nip11: true,
        ..RelayOptions::default()
    };
    let (own, large, small) = world_with(own, &remote, 5, 20);
    let running = Running::start(&own, |_, _| {});
    assert!(
        wait_for(60, || missing(&own, &small) == 0),
        "{} of {} small events lost",
        missing(&own, &small),
        small.len()
    );
    assert!(wait_for(30, || running.metric(SET_ASIDE) == large.len() as u64));
    assert_eq!(missing(&own, &large), large.len());
    assert_eq!(own.faults_injected(), 0, "a large event was offered");
    running.stop();
}

/// strfry cuts the connection on a payload over 128 KiB, and the event was
/// sent again first on every reconnect: a poison pill. Now an event in
/// flight alone when the connection was lost three times is set aside (and,
/// being large, events as large are not offered again), and the events
/// behind it arrive.
#[test]
fn an_own_relay_that_cuts_the_connection_on_large_events_takes_the_rest() {
    let remote = TestRelay::start(RelayOptions::default()).unwrap();
    let fault = Fault::LargeEventCut { max_bytes: OWN_MAX };
    let (own, large, small) = world(Some(fault), &remote, 2, 20);
    let running = Running::start(&own, |_, _| {});
    assert!(
        wait_for(60, || missing(&own, &small) == 0),
        "{} of {} small events lost behind poison pills",
        missing(&own, &small),
        small.len()
    );
    assert!(wait_for(30, || running.metric(SET_ASIDE) == large.len() as u64));
    assert!(own.faults_injected() >= 1);
    running.stop();
}

/// While the own relay is down the outbox fills and remote reads wait;
/// keepalives of the remote relays must not fail for it. With a 2 s
/// keepalive and 2 s pong timeout, a 10 s outage used to drop the healthy
/// remote relay (and back it off). (The engine checks keepalives on whole
/// seconds, so shorter timings would drop honest relays too.)
#[test]
fn an_own_relay_outage_keeps_healthy_remote_relays_connected() {
    let remote = TestRelay::start(RelayOptions::default()).unwrap();
    let (own, _, first) = world(None, &remote, 0, 1);
    let running = Running::start(&own, |config, opts| {
        config.keepalive = Duration::from_secs(2);
        config.pong_timeout = Duration::from_secs(2);
        opts.outbox_capacity = 2;
    });
    assert!(wait_for(20, || missing(&own, &first) == 0));
    let port = own.port();
    let stored = own.stop();
    let issue = stored
        .iter()
        .find(|e| e.kind == Kind::from_u16(1621))
        .cloned()
        .unwrap();
    let during: Vec<Event> = (0..20)
        .map(|i| {
            let at = Timestamp::now().as_secs();
            reply(&keys(4), &issue, at, &format!("during the outage {i}"))
        })
        .collect();
    for e in &during {
        remote.publish(e.clone());
    }
    // Two keepalive rounds of the remote relay, with the outbox full.
    assert!(!wait_for(10, || remote.connections_made() > 1));
    let own = TestRelay::start_on(port, RelayOptions::default(), stored).unwrap();
    assert!(
        wait_for(30, || missing(&own, &during) == 0),
        "{} of {} lost",
        missing(&own, &during),
        during.len()
    );
    assert_eq!(remote.connections_made(), 1, "the remote relay was dropped");
    running.stop();
}
