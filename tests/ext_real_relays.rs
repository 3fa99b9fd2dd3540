//! End to end against relays nobody here wrote, driving the `grasp-sync`
//! binary: rust-nostr's LocalRelay (nostr-sdk wheel, installed on first use
//! under `target/pyrelays/`) and nostr-rs-relay 0.8.12 (installed by
//! `.ci/run`; the tests needing it are ignored unless
//! `cargo test -- --include-ignored`).

mod support;

use std::time::Duration;

use nostr::prelude::*;
use support::real::{
    GraspSync, PyRelay, RsRelay, announced_issue, grasp_announcement, missing, publish, replies_to,
};
use support::running::wait_for;
use support::*;

fn ids(events: &[Event]) -> Vec<EventId> {
    events.iter().map(|e| e.id).collect()
}

#[test]
#[ignore = "needs nostr-rs-relay 0.8.12: .ci/run installs it"]
fn discovery_history_and_live_from_nostr_rs_relay_into_local_relay() {
    let own = PyRelay::start();
    let remote = RsRelay::start();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let issue = root(&keys(2), 1621, &[&repo], T0, "issue");
    own.publish(&[
        announcement(&owner, "repo", &[&remote.url, &own.url], T0),
        issue.clone(),
    ]);
    let history = vec![
        reply(&keys(3), &issue, T0 + 1, "NIP-22 reply"),
        status(&owner, &issue, 1632, T0 + 2),
        state(&owner, "repo", T0 + 3),
        repo_comment(&keys(4), &repo, T0 + 4, "about the repo"),
        root(
            &keys(5),
            1617,
            &[&repo],
            T0 + 5,
            "a patch only on the remote",
        ),
    ];
    publish(&remote.url, &history);
    let engine = GraspSync::start(&own.url, &[]);
    assert!(
        wait_for(60, || own.missing(&ids(&history)) == 0),
        "history synced"
    );
    let live = reply(&keys(6), &issue, Timestamp::now().as_secs(), "live");
    publish(&remote.url, std::slice::from_ref(&live));
    assert!(
        wait_for(30, || own.missing(&[live.id]) == 0),
        "live event within seconds"
    );
    assert_eq!(engine.stop(), Some(0));
}

#[test]
#[ignore = "needs nostr-rs-relay 0.8.12: .ci/run installs it"]
fn quick_reconnect_after_a_nostr_rs_relay_restart_catches_up() {
    let own = PyRelay::start();
    let mut remote = RsRelay::start();
    let issue = announced_issue(&own, &remote.url);
    let engine = GraspSync::start(&own.url, &[]);
    let first = reply(&keys(2), &issue, T0 + 1, "before");
    publish(&remote.url, std::slice::from_ref(&first));
    assert!(wait_for(60, || own.missing(&[first.id]) == 0));

    remote.restart(Duration::from_millis(500));
    let during = reply(
        &keys(3),
        &issue,
        Timestamp::now().as_secs() - 2,
        "published right after the restart",
    );
    publish(&remote.url, std::slice::from_ref(&during));
    assert!(
        wait_for(60, || own.missing(&[during.id]) == 0),
        "caught up after the quick reconnect"
    );
    assert_eq!(engine.stop(), Some(0));
}

#[test]
fn pagination_past_local_relays_500_cap() {
    let own = PyRelay::start();
    let remote = PyRelay::start();
    let issue = announced_issue(&own, &remote.url);
    let replies = replies_to(&issue, 1_200);
    remote.publish(&replies);
    let engine = GraspSync::start(&own.url, &[]);
    assert!(
        wait_for(90, || own.missing(&ids(&replies)) == 0),
        "{} of 1,200 missing",
        own.missing(&ids(&replies))
    );
    assert_eq!(engine.stop(), Some(0));
}

#[test]
#[ignore = "needs nostr-rs-relay 0.8.12: .ci/run installs it"]
fn nostr_rs_relay_32_subscription_limit_with_150_repos_and_300_roots() {
    let own = PyRelay::start();
    let remote = RsRelay::start();
    let owner = keys(1);
    let mut on_own = Vec::new();
    let mut expected = Vec::new();
    for i in 0..150 {
        let d = format!("repo-{i}");
        on_own.push(announcement(&owner, &d, &[&remote.url], T0));
        let repo = coord(&owner, &d);
        for j in 0..2 {
            let r = root(&keys(2), 1621, &[&repo], T0 + j, &format!("issue {i}/{j}"));
            expected.push(reply(&keys(3), &r, T0 + 10, &format!("reply {i}/{j}")));
            on_own.push(r);
        }
        expected.push(repo_comment(
            &keys(4),
            &repo,
            T0 + 20,
            &format!("comment {i}"),
        ));
    }
    own.publish(&on_own);
    publish(&remote.url, &expected);
    // Small chunks and REQs, and a high starting limit, so the engine asks for
    // far more than 32 subscriptions and must learn the limit from NOTICEs.
    // Negentropy off: its jobs list the own relay first and so pace the
    // REQs, which would make the burst this test needs a matter of timing
    // (negentropy against nostr-rs-relay is in tests/ext_negentropy_sync.rs).
    let metrics = format!("127.0.0.1:{}", support::real::free_port());
    let engine = GraspSync::start(
        &own.url,
        &[
            "--no-negentropy",
            "--chunk-size",
            "5",
            "--max-filters-per-req",
            "4",
            "--max-subscriptions",
            "64",
            "--metrics",
            &metrics,
        ],
    );
    let done = wait_for(120, || own.missing(&ids(&expected)) == 0);
    if !done {
        // What the engine was waiting for, for whoever reads the failure.
        let m = support::running::http_get(metrics.parse().unwrap(), "/metrics");
        eprintln!("the engine's metrics:\n{m}");
    }
    assert!(
        done,
        "{} of {} missing",
        own.missing(&ids(&expected)),
        expected.len()
    );
    let text = support::running::http_get(metrics.parse().unwrap(), "/metrics");
    let refusals: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("grasp_sync_refusals_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        refusals > 0,
        "the relay refused subscriptions over its limit and nothing was lost"
    );
    assert_eq!(engine.stop(), Some(0));
}

#[test]
#[ignore = "needs nostr-rs-relay 0.8.12: .ci/run installs it"]
fn recursive_discovery_of_a_repo_announced_only_on_a_remote_relay() {
    let own = PyRelay::start();
    let hub = RsRelay::start();
    let third = PyRelay::start();
    own.publish(&[announcement(&keys(1), "seed", &[&hub.url], T0)]);
    let remote_owner = keys(2);
    // GRASP-01: the own relay is listed in `relays` and in a `clone` URL.
    let ann = grasp_announcement(&remote_owner, "remote", &own.url, &[&third.url], T0);
    publish(&hub.url, std::slice::from_ref(&ann));
    let repo = coord(&remote_owner, "remote");
    let issue = root(&keys(3), 1621, &[&repo], T0, "issue on the third relay");
    let answer = reply(&remote_owner, &issue, T0 + 1, "reply on the third relay");
    third.publish(&[issue.clone(), answer.clone()]);
    let engine = GraspSync::start(&own.url, &[]);
    let want = [ann.id, issue.id, answer.id];
    assert!(
        wait_for(60, || missing(&own.url, &want) == 0),
        "discovered and synced"
    );
    assert_eq!(engine.stop(), Some(0));
}
