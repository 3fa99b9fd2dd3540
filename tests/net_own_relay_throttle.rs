//! The real shell beside an own relay that rate-limits writes as khatru's
//! `EventIPRateLimiter` does (issue 24): every event arrives, at the
//! bucket's pace, with few refused attempts, and the operator is told.

mod support;

use std::time::Duration;

use grasp_sync::testing::limits::EventBucket;
use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use support::running::*;
use support::*;

/// The issue's scaled limit: 3 events a second, 15 at once. After each
/// pause a whole window went again: 9.6 attempts per event. Paced, each
/// event goes about once, and the delivery keeps the bucket's pace.
#[test]
fn a_rate_limited_own_relay_gets_every_event_at_its_pace() {
    let bucket = EventBucket {
        tokens_per_interval: 3,
        interval: Duration::from_secs(1),
        max_tokens: 15,
    };
    let own = TestRelay::start(RelayOptions {
        event_bucket: Some(bucket),
        ..RelayOptions::default()
    })
    .unwrap();
    let remote = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    // Published by the repo's owner straight to the own relay: no token.
    own.publish(announcement(&owner, "repo", &[&remote.url()], T0));
    let repo = coord(&owner, "repo");
    let history: Vec<_> = (0..60)
        .map(|i| repo_comment(&keys(2), &repo, T0 + i, &format!("c{i}")))
        .collect();
    for e in &history {
        remote.publish(e.clone());
    }
    let running = Running::start(&own, |_, _| {});
    // 15 at once, then 3 a second: 15 s for the rest; generous for CI.
    assert!(
        wait_for(120, || missing(&own, &history) == 0),
        "all synced: {} missing",
        missing(&own, &history)
    );
    let (attempts, refused) = (own.event_attempts(), own.rate_limited());
    let stored = attempts - refused;
    assert!(stored >= history.len(), "{stored} stored");
    assert!(
        attempts as f64 <= 1.5 * stored as f64,
        "{attempts} attempts for {stored} stored ({refused} refused)"
    );
    assert!(refused > 0, "the bucket did limit us");
    assert_eq!(
        running.metric("grasp_sync_own_relay_refusals_total{reason=\"rate_limited\"} "),
        refused as u64,
        "every refusal counted"
    );
    running.stop();
}

/// ngit-relay's whole write side (scaled in time): its limiter, and its
/// policy refusing an event that relates to no stored repository. The
/// engine's order (an announcement found remotely before its roots, a root
/// before its replies, refused events again in the order first sent)
/// meets the policy: every event of a repo found only on a remote relay
/// arrives, nothing is refused as unrelated.
#[test]
fn ngit_relays_write_policy_and_limiter_lose_nothing() {
    let own = TestRelay::start(RelayOptions {
        event_bucket: Some(EventBucket {
            tokens_per_interval: 3,
            interval: Duration::from_secs(1),
            max_tokens: 5,
        }),
        grasp_write_policy: true,
        ..RelayOptions::default()
    })
    .unwrap();
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let c = TestRelay::start(RelayOptions::default()).unwrap();
    own.publish(announcement(&keys(1), "seed", &[&a.url()], T0));
    let remote_owner = keys(2);
    let ann =
        support::real::grasp_announcement(&remote_owner, "remote", &own.url(), &[&c.url()], T0);
    a.publish(ann.clone());
    let repo = coord(&remote_owner, "remote");
    let mut synced = vec![ann];
    for i in 0..6 {
        let issue = root(&keys(3), 1621, &[&repo], T0 + i, &format!("issue {i}"));
        let answers: Vec<_> = (0..4)
            .map(|j| {
                reply(
                    &remote_owner,
                    &issue,
                    T0 + 10 + j,
                    &format!("reply {i}.{j}"),
                )
            })
            .collect();
        c.publish(issue.clone());
        synced.push(issue);
        for r in answers {
            c.publish(r.clone());
            synced.push(r);
        }
    }
    let running = Running::start(&own, |_, _| {});
    assert!(
        wait_for(120, || missing(&own, &synced) == 0),
        "{} of {} missing",
        missing(&own, &synced),
        synced.len()
    );
    assert_eq!(
        running.metric("grasp_sync_sink_events_total{outcome=\"rejected\"} "),
        0,
        "nothing refused as unrelated"
    );
    assert!(own.rate_limited() > 0, "the limiter did limit us");
    running.stop();
}
