//! The real shell beside an own relay that rate-limits writes as khatru's
//! `EventIPRateLimiter` does (issue 24): every event arrives, at the
//! bucket's pace, with few refused attempts, and the operator is told.

mod support;

use std::time::Duration;

use grasp_sync::testing::limits::EventBucket;
use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use support::running::*;
use support::*;

/// The scaled limit: 3 events a second, 15 at once. After each
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
        running.metric("grasp_sync_own_relay_rate_limited_total "),
        refused as u64,
        "every refusal counted"
    );
    running.stop();
}
