//! Relays that cap what they return, end to end through the `grasp-sync`
//! binary: nothing may be lost because a relay answered fewer events than
//! asked, or refused a filter for having too many values.
//!
//! - the PyPI `nostr-relay` 1.14 (Python, sqlite) with `max_limit: 100`:
//!   every REQ returns at most 100 stored events, all its filters together;
//! - rust-nostr's LocalRelay with `max_filter_limit(100)`: at most 100 per
//!   filter;
//! - the in-process test relay limited like khatru over eventstore's SQL
//!   backends: 100 per filter, and filters with more than 10 tag values or
//!   kinds refused (a `NOTICE` then `EOSE` as khatru sends it, or `CLOSED`).
//!
//! Each relay is capped once as the own relay (holding more announcements
//! than one page: the engine must page its own relay to know every repo)
//! and once as a remote (holding more replies to one issue than one page).
//! The Python relays install themselves on first use (tests/pyrelays.py).

mod support;

use grasp_sync::testing::limits::ValueCaps;
use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use nostr::prelude::*;
use support::real::{GraspSync, NostrRelay, PyRelay, grasp_announcement, missing, publish_bulk};
use support::running::wait_for;
use support::*;

/// The cap every relay here applies.
const CAP: usize = 100;

/// Longest a sync may take (generous: the Python relays are slow).
const DEADLINE_SECS: u64 = 180;

fn ids(events: &[Event]) -> Vec<EventId> {
    events.iter().map(|e| e.id).collect()
}

/// A relay under test, whatever runs it.
trait Capped {
    fn url(&self) -> String;
    fn publish(&self, events: &[Event]);
    fn missing(&self, ids: &[EventId]) -> usize;
}

impl Capped for NostrRelay {
    fn url(&self) -> String {
        self.url.clone()
    }
    fn publish(&self, events: &[Event]) {
        NostrRelay::publish(self, events);
    }
    fn missing(&self, ids: &[EventId]) -> usize {
        NostrRelay::missing(self, ids)
    }
}

impl Capped for PyRelay {
    fn url(&self) -> String {
        self.url.clone()
    }
    fn publish(&self, events: &[Event]) {
        publish_bulk(&self.url, events);
    }
    fn missing(&self, ids: &[EventId]) -> usize {
        PyRelay::missing(self, ids)
    }
}

impl Capped for TestRelay {
    fn url(&self) -> String {
        TestRelay::url(self)
    }
    fn publish(&self, events: &[Event]) {
        for e in events {
            TestRelay::publish(self, e.clone());
        }
    }
    fn missing(&self, ids: &[EventId]) -> usize {
        ids.iter().filter(|id| !self.has(id)).count()
    }
}

/// An own relay holding `repos` announcements (more than one capped page),
/// each listing `remote`, which holds one comment and one state event per
/// repo: every repo's events must reach the own relay.
fn own_relay_capped_every_repo_synced(own: &dyn Capped, repos: usize) {
    let remote = TestRelay::start(RelayOptions::default()).unwrap();
    let remote_url = Capped::url(&remote);
    let own_url = own.url();
    let owner = keys(1);
    let mut announcements = Vec::new();
    let mut expected = Vec::new();
    for i in 0..repos {
        let d = format!("repo-{i}");
        // Distinct seconds: nostr-relay pages with an exclusive `until`.
        announcements.push(announcement(&owner, &d, &[&remote_url], T0 + i as u64));
        let repo = coord(&owner, &d);
        expected.push(repo_comment(&keys(2), &repo, T0 + 10_000 + i as u64, &d));
        expected.push(state(&owner, &d, T0 + 20_000 + i as u64));
    }
    assert!(repos > CAP + 50, "more announcements than one capped page");
    own.publish(&announcements);
    assert_eq!(
        own.missing(&ids(&announcements)),
        0,
        "the own relay holds them"
    );
    Capped::publish(&remote, &expected);
    let engine = GraspSync::start(&own_url, &[]);
    let done = wait_for(DEADLINE_SECS, || own.missing(&ids(&expected)) == 0);
    let lost = own.missing(&ids(&expected));
    assert!(
        done,
        "{lost} of {} events of {repos} repos never reached the own relay \
         (repos announced past the own relay's first capped page were not synced)",
        expected.len()
    );
    assert_eq!(engine.stop(), Some(0));
}

/// A remote relay holding `replies` replies to one issue (more than one
/// capped page): all must reach the own relay. The repo is announced on a
/// third relay only, listing the own relay in `relays` and `clone`
/// (GRASP-01), and found there by recursive discovery.
fn remote_capped_all_replies_arrive(remote: &dyn Capped, replies: usize) {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let hub = TestRelay::start(RelayOptions::default()).unwrap();
    let own_url = Capped::url(&own);
    let remote_url = remote.url();
    let owner = keys(1);
    // The own relay knows the hub through a seed repo listing it.
    own.publish(announcement(&keys(9), "seed", &[&hub.url()], T0));
    let ann = grasp_announcement(&owner, "busy", &own_url, &[&remote_url], T0 + 1);
    hub.publish(ann.clone());
    let repo = coord(&owner, "busy");
    let issue = root(&keys(2), 1621, &[&repo], T0 + 2, "a busy issue");
    let answers: Vec<Event> = (0..replies)
        .map(|i| reply(&keys(3), &issue, T0 + 10 + i as u64, &format!("reply {i}")))
        .collect();
    let mut on_remote = vec![issue.clone()];
    on_remote.extend(answers.iter().cloned());
    remote.publish(&on_remote);
    assert_eq!(remote.missing(&ids(&on_remote)), 0, "the remote holds them");
    assert!(replies > 2 * CAP, "more replies than two capped pages");
    let engine = GraspSync::start(&own_url, &[]);
    let mut want = vec![ann.id, issue.id];
    want.extend(ids(&answers));
    let done = wait_for(DEADLINE_SECS, || missing(&own_url, &want) == 0);
    assert!(
        done,
        "{} of {} events missing (announcement, issue, {replies} replies)",
        missing(&own_url, &want),
        want.len()
    );
    assert_eq!(engine.stop(), Some(0));
}

// ------------------------------------------------------------ nostr-relay

#[test]
fn nostr_relay_capped_at_100_as_own_relay_with_160_announcements_every_repo_synced() {
    let own = NostrRelay::start(CAP);
    own_relay_capped_every_repo_synced(&own, 160);
}

#[test]
fn nostr_relay_capped_at_100_as_remote_with_250_replies_to_one_issue_all_arrive() {
    let remote = NostrRelay::start(CAP);
    remote_capped_all_replies_arrive(&remote, 250);
}

// ------------------------------------------------------------ LocalRelay

#[test]
fn local_relay_capped_at_100_as_own_relay_with_160_announcements_every_repo_synced() {
    let own = PyRelay::start_capped(CAP);
    own_relay_capped_every_repo_synced(&own, 160);
}

#[test]
fn local_relay_capped_at_100_as_remote_with_250_replies_to_one_issue_all_arrive() {
    let remote = PyRelay::start_capped(CAP);
    remote_capped_all_replies_arrive(&remote, 250);
}

// ------------------------------------------------------------ khatru-like test relay

/// Options of a test relay limited like khatru over eventstore's SQL
/// backends with their pre-2025 defaults, refusing as `caps` says.
fn khatru_like(caps: ValueCaps) -> RelayOptions {
    RelayOptions {
        max_results_per_filter: CAP,
        value_caps: Some(caps),
        nip11: true,
        ..RelayOptions::default()
    }
}

#[test]
fn khatru_like_test_relay_capped_at_100_as_own_relay_every_repo_synced() {
    let own = TestRelay::start(khatru_like(ValueCaps::eventstore())).unwrap();
    own_relay_capped_every_repo_synced(&own, 160);
}

#[test]
fn khatru_like_test_relay_capped_at_100_as_remote_with_250_replies_all_arrive() {
    let remote = TestRelay::start(khatru_like(ValueCaps::eventstore())).unwrap();
    remote_capped_all_replies_arrive(&remote, 250);
}

/// The own relay limited like khatru over eventstore's old SQL defaults
/// (ten tag values; a wider filter is answered by a `NOTICE` and an empty
/// page), and a remote that speaks NIP-77 (LocalRelay): before a job
/// reconciles, the engine lists what the own relay holds in batches of up
/// to 100 values. The `NOTICE` must teach it ten, and the empty page must
/// not read as "holds nothing": then every job would fetch again what
/// only that listing held (here status events, which tag the issue with
/// `e` alone) and send the own relay what it holds.
#[test]
fn khatru_like_own_relay_teaches_the_listings_its_ten_tag_values() {
    let own = TestRelay::start(khatru_like(ValueCaps::eventstore())).unwrap();
    let remote = PyRelay::start();
    let owner = keys(1);
    let (mut on_own, mut issues, mut held, mut fresh) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..200u64 {
        let d = format!("repo-{i}");
        on_own.push(announcement(&owner, &d, &[&remote.url], T0 + i));
        let repo = coord(&owner, &d);
        let issue = root(&keys(2), 1621, &[&repo], T0 + 1_000 + i, &format!("{i}"));
        // Status events tag the issue with `e` only: no other part lists them.
        for kind in [1630, 1631, 1632] {
            held.push(status(&keys(3), &issue, kind, T0 + 2_000 + i));
        }
        fresh.push(reply(
            &keys(4),
            &issue,
            T0 + 3_000 + i,
            &format!("fresh {i}"),
        ));
        issues.push(issue);
    }
    Capped::publish(&own, &on_own);
    Capped::publish(&own, &issues);
    Capped::publish(&own, &held);
    let everything: Vec<Event> = [issues, held.clone(), fresh.clone()].concat();
    remote.publish(&everything);
    let engine = GraspSync::start_logged(&own.url(), &[], &[("RUST_LOG", "info")]);
    let done = wait_for(DEADLINE_SECS, || Capped::missing(&own, &ids(&fresh)) == 0);
    let log = engine.log();
    assert!(
        done,
        "{} of {} new replies missing\n{log}",
        Capped::missing(&own, &ids(&fresh)),
        fresh.len()
    );
    assert!(
        own.value_refusals() > 0,
        "the own relay refused wide listings"
    );
    // The new replies, and a twentieth of what it held at most: with the
    // empty pages read as listed, four runs sent 58 to 248 of the 600
    // status events it held again.
    let sent = own.event_attempts();
    assert!(
        sent < fresh.len() + held.len() / 20,
        "the own relay was sent {sent} events for {} new ones\n{log}",
        fresh.len()
    );
    assert!(
        log.contains("at most 10 values a listing") && !log.contains("at most 5 values"),
        "the listings learned ten, and only ten\n{log}"
    );
    assert_eq!(engine.stop(), Some(0));
}

/// 150 repos with 2 issues each on the own relay, all on one remote relay
/// that caps results at 100 per filter and refuses filters with more than
/// 10 tag values or kinds: the engine's usual chunks (up to 100 repos or
/// roots per filter) are refused, so it must learn to chunk at 10; and one
/// issue has 150 replies, more than a page.
fn value_capped_remote_everything_synced(caps: ValueCaps) {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let remote = TestRelay::start(khatru_like(caps)).unwrap();
    let owner = keys(1);
    let mut on_own = Vec::new();
    let mut expected = Vec::new();
    for i in 0..150u64 {
        let d = format!("repo-{i}");
        on_own.push(announcement(&owner, &d, &[&remote.url()], T0 + i));
        let repo = coord(&owner, &d);
        for j in 0..2 {
            let issue = root(
                &keys(2),
                1621,
                &[&repo],
                T0 + 1_000 + 2 * i + j,
                &format!("{i}/{j}"),
            );
            expected.push(reply(
                &keys(3),
                &issue,
                T0 + 2_000 + 2 * i + j,
                &format!("re {i}/{j}"),
            ));
            on_own.push(issue);
        }
        expected.push(repo_comment(&keys(4), &repo, T0 + 3_000 + i, &d));
    }
    let busy = on_own[1].clone();
    for k in 0..150u64 {
        expected.push(reply(&keys(5), &busy, T0 + 4_000 + k, &format!("busy {k}")));
    }
    Capped::publish(&own, &on_own);
    Capped::publish(&remote, &expected);
    let engine = GraspSync::start(&own.url(), &[]);
    let done = wait_for(DEADLINE_SECS, || {
        Capped::missing(&own, &ids(&expected)) == 0
    });
    assert!(
        done,
        "{} of {} missing; the remote refused {} filters for their values",
        Capped::missing(&own, &ids(&expected)),
        expected.len(),
        remote.value_refusals()
    );
    assert!(remote.value_refusals() > 0, "the caps bit");
    assert_eq!(engine.stop(), Some(0));
}

#[test]
fn value_caps_10_refused_with_notice_like_khatru_and_cap_100_everything_synced() {
    value_capped_remote_everything_synced(ValueCaps::eventstore());
}

#[test]
fn value_caps_10_refused_with_closed_and_cap_100_everything_synced() {
    value_capped_remote_everything_synced(ValueCaps::eventstore().closed());
}

/// A relay whose port another process took between our pick and its bind
/// is started again on another port (seen on a busy machine: a demo with
/// thousands of sockets took nostr-relay's port); any other failure is not
/// retried.
#[test]
fn a_relay_whose_port_was_taken_starts_on_another() {
    let mut ports = Vec::new();
    let started = support::real::start_on_free_port("relay", |port| {
        ports.push(port);
        if ports.len() < 3 {
            Err("OSError: [Errno 98] address already in use".to_string())
        } else {
            Ok(port)
        }
    });
    assert_eq!(ports.len(), 3);
    assert_eq!(started, ports[2]);
    let other = std::panic::catch_unwind(|| {
        support::real::start_on_free_port("relay", |_| Err::<u16, _>("no wheel".to_string()))
    });
    assert!(other.is_err(), "a real failure is not retried");
}
