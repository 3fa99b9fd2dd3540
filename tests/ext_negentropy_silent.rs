//! Issue 23's finding 4's world over real sockets: a remote relay that
//! does not speak NIP-77 and says nothing to `NEG-OPEN` (no `NEG-ERR`, no
//! `NOTICE`), refuses filters over 10 tag values with `CLOSED`, beside a
//! LocalRelay own relay capped at 100 per filter that lets a connection
//! hold 4 subscriptions, so it refuses the sink's listings past 4
//! (`rate-limited: too many REQs`), as the report's own relay refused
//! about 70.
//!
//! The cause of the finding: a refused listing was never reported, so
//! each negentropy job waited out the listing timeout (a minute) before
//! its REQ, and the roots' batch did so twice (before the value refusal
//! and after the re-chunk). The report's log pair, "negentropy job timed
//! out" then at once "batch confirmed (40 items)", is the end of that wait:
//! the REQ that follows fetches the replies. With the binary the report
//! ran, its world synced 80 of 80 after 122 s (0.8 s when no listing was
//! refused: the report's "80/80 in 0.6 s" when it passed); a check sooner
//! than two minutes finds the 40 replies missing.

mod support;

use grasp_sync::testing::limits::ValueCaps;
use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use nostr::prelude::EventId;
use support::real::{GraspSync, PyRelay};
use support::running::wait_for;
use support::*;

/// The world's relays: the own relay (LocalRelay, 100 per filter, 4
/// subscriptions a connection) and the remote one, silent to `NEG-OPEN`
/// and refusing filters over 10 tag values with `CLOSED`.
fn relays() -> (PyRelay, TestRelay) {
    let own = PyRelay::start_capped_with_reqs(100, 4);
    let x = TestRelay::start(RelayOptions {
        value_caps: Some(ValueCaps::eventstore().closed()),
        silent_on_unknown: true,
        ..RelayOptions::default()
    })
    .unwrap();
    (own, x)
}

/// Runs the engine until the own relay holds `wanted`, for `secs` at
/// most; checks that the own relay refused listings and no job waited for
/// one, and returns the log.
fn sync(own: &PyRelay, wanted: &[EventId], secs: u64) -> String {
    let engine = GraspSync::start_logged(&own.url, &[], &[("RUST_LOG", "grasp_sync=info")]);
    let synced = wait_for(secs, || own.missing(wanted) == 0);
    let log = engine.log();
    assert_eq!(engine.stop(), Some(0));
    let missing = own.missing(wanted);
    assert!(synced, "{missing} of {} missing\n{log}", wanted.len());
    assert!(
        log.contains("own relay refused a listing with"),
        "the own relay refused listings past its count\n{log}"
    );
    assert!(
        !log.contains("timed out waiting for the own relay's listings"),
        "no job waited for a refused listing\n{log}"
    );
    log
}

#[test]
fn a_relay_silent_to_neg_open_beside_an_own_relay_refusing_listings_loses_nothing() {
    let (own, x) = relays();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let mut on_own = vec![announcement(&owner, "repo", &[&x.url()], T0)];
    let mut wanted = Vec::new();
    for i in 0..40u64 {
        let issue = root(&owner, 1621, &[&repo], T0 + i, &format!("issue {i}"));
        // The own relay holds replies of each root: negentropy is tried.
        for j in 0..17u64 {
            let old = reply(&keys(3), &issue, T0 + 100 + j, &format!("old {i}.{j}"));
            on_own.push(old);
        }
        let answer = reply(&keys(2), &issue, T0 + 1000 + i, &format!("new {i}"));
        x.publish(answer.clone());
        wanted.push(answer.id);
        on_own.push(issue);
    }
    own.publish(&on_own);
    // The sessions time out after --neg-timeout (15 s by default) first.
    let log = sync(&own, &wanted, 180);
    assert!(log.contains("timed out"), "the session timed out\n{log}");
    assert!(log.contains("no negentropy; REQ from now on"), "{log}");
    assert!(
        log.contains("limits now"),
        "the value refusal was learnt\n{log}"
    );
}

/// The report's world as it reads: the 40 issues and their 40 replies
/// live on the remote relay alone, so 80 events are expected, and the own
/// relay holds the announcement. The roots' listings are refused past 4.
#[test]
fn the_reported_world_syncs_80_of_80_in_seconds_while_listings_are_refused() {
    let (own, x) = relays();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    own.publish(&[announcement(&owner, "repo", &[&x.url()], T0)]);
    let mut wanted = Vec::new();
    for i in 0..40u64 {
        let issue = root(&owner, 1621, &[&repo], T0 + i, &format!("issue {i}"));
        let answer = reply(&keys(2), &issue, T0 + 1000 + i, &format!("new {i}"));
        x.publish(issue.clone());
        x.publish(answer.clone());
        wanted.extend([issue.id, answer.id]);
    }
    // Under a second here; two listing timeouts (two minutes) before.
    sync(&own, &wanted, 60);
}
