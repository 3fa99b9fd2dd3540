//! The real binary beside a LocalRelay own relay at its default rate limit
//! (60 `EVENT`s a minute per connection, as relays on rust-nostr's relay
//! builder run, ngit-grasp among them): issue 24.

mod support;

use nostr::prelude::*;
use support::real::{GraspSync, PyRelay, announced_issue, replies_to};
use support::running::wait_for;

#[test]
fn a_local_relay_at_its_default_rate_limit_gets_every_event() {
    let own = PyRelay::start_rate_limited();
    let remote = PyRelay::start();
    let issue = announced_issue(&own, &remote.url);
    let replies = replies_to(&issue, 90);
    remote.publish(&replies);
    let ids: Vec<EventId> = replies.iter().map(|e| e.id).collect();
    let engine = GraspSync::start_logged(&own.url, &[], &[("RUST_LOG", "grasp_sync=warn")]);
    // More than a minute's worth: the relay's limit holds the rest back.
    assert!(
        wait_for(240, || own.missing(&ids) == 0),
        "{} of 90 missing",
        own.missing(&ids)
    );
    let log = engine.log();
    assert_eq!(engine.stop(), Some(0));
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("rate-limits the sync"))
        .collect();
    assert!(
        (1..=5).contains(&warnings.len()),
        "the operator is told, at most once a minute: {}\n{log}",
        warnings.len()
    );
    // The rate it takes, the backlog (outbox and what reads hold back),
    // the time to drain it, and what to change.
    for part in [
        "events a minute",
        "backlog",
        "held back",
        "min to drain",
        "README",
    ] {
        assert!(warnings[0].contains(part), "{part}: {}", warnings[0]);
    }
    eprintln!("{}", warnings[0]);
}
