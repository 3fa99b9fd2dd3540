//! The mio shell over real loopback sockets against the in-process test
//! relay: discovery, history, live events, reconnects, pagination, restarts.

mod support;

use support::running::*;

use std::time::{Duration, Instant};

use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use nostr::prelude::*;
use support::*;

#[test]
fn discovery_history_then_live_over_real_sockets() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let b = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    let ann = announcement(&owner, "repo", &[&a.url(), &b.url(), &own.url()], T0);
    own.publish(ann.clone());
    let repo = coord(&owner, "repo");
    let issue = root(&keys(2), 1621, &[&repo], T0 + 1, "issue");
    let patch = root(&keys(2), 1617, &[&repo], T0 + 2, "patch");
    let pr = root(&owner, 1618, &[&repo], T0 + 3, "pr");
    let history = vec![
        issue.clone(),
        patch.clone(),
        pr.clone(),
        reply(&owner, &issue, T0 + 4, "NIP-22 reply"),
        status(&owner, &patch, 1631, T0 + 5),
        state(&owner, "repo", T0 + 6),
        repo_comment(&keys(3), &repo, T0 + 7, "about the repo"),
    ];
    for (i, e) in history.iter().enumerate() {
        if i % 2 == 0 {
            a.publish(e.clone())
        } else {
            b.publish(e.clone())
        }
    }
    let running = Running::start(&own, |_, _| {});
    assert!(
        wait_for(20, || missing(&own, &history) == 0),
        "history synced: {} missing",
        missing(&own, &history)
    );

    let live = reply(&keys(4), &pr, Timestamp::now().as_secs(), "live");
    let published = Instant::now();
    b.publish(live.clone());
    assert!(wait_for(30, || own.has(&live.id)));
    // Live, not found by a later pass (the disconnect check runs every 60
    // s): generous for a loaded machine, far below any other path.
    assert!(
        published.elapsed() < Duration::from_secs(10),
        "live within 10 s: {:?}",
        published.elapsed()
    );
    running.stop();
}

#[test]
fn remote_restart_events_published_while_away_arrive_after_quick_reconnect() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    own.publish(announcement(&owner, "repo", &[&a.url()], T0));
    let repo = coord(&owner, "repo");
    let issue = root(&owner, 1621, &[&repo], T0, "issue");
    own.publish(issue.clone());
    let running = Running::start(&own, |_, _| {});
    let first = reply(&keys(2), &issue, T0 + 1, "before restart");
    a.publish(first.clone());
    assert!(wait_for(20, || own.has(&first.id)));

    let port = a.port();
    let stored = a.stop();
    let a = TestRelay::start_on(port, RelayOptions::default(), stored).unwrap();
    // Published before the engine reconnects: only the catch-up REQ can find it.
    let away = reply(
        &keys(3),
        &issue,
        Timestamp::now().as_secs() - 5,
        "while away",
    );
    a.publish(away.clone());
    assert!(
        wait_for(20, || own.has(&away.id)),
        "event published during the restart arrives"
    );
    running.stop();
}

#[test]
fn twelve_hundred_events_through_a_500_cap() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let a = TestRelay::start(RelayOptions {
        max_results_per_req: 500,
        ..RelayOptions::default()
    })
    .unwrap();
    let owner = keys(1);
    own.publish(announcement(&owner, "repo", &[&a.url()], T0));
    let repo = coord(&owner, "repo");
    let issue = root(&owner, 1621, &[&repo], T0, "issue");
    own.publish(issue.clone());
    let replies: Vec<Event> = (0..1_200)
        .map(|i| reply(&keys(2), &issue, T0 + 10 + i, &format!("r{i}")))
        .collect();
    for r in &replies {
        a.publish(r.clone());
    }
    let running = Running::start(&own, |_, _| {});
    assert!(
        wait_for(30, || missing(&own, &replies) == 0),
        "{} of 1,200 missing",
        missing(&own, &replies)
    );
    running.stop();
}

#[test]
fn recursive_discovery_of_a_repo_announced_only_remotely() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let c = TestRelay::start(RelayOptions::default()).unwrap();
    own.publish(announcement(&keys(1), "seed", &[&a.url()], T0));
    let remote_owner = keys(2);
    // GRASP-01: it lists the own relay in `relays` and `clone`.
    let ann =
        support::real::grasp_announcement(&remote_owner, "remote", &own.url(), &[&c.url()], T0);
    a.publish(ann.clone());
    let repo = coord(&remote_owner, "remote");
    let issue = root(&keys(3), 1621, &[&repo], T0, "issue on C");
    let answer = reply(&remote_owner, &issue, T0 + 1, "reply on C");
    c.publish(issue.clone());
    c.publish(answer.clone());
    let running = Running::start(&own, |_, _| {});
    assert!(wait_for(30, || own.has(&ann.id)
        && own.has(&issue.id)
        && own.has(&answer.id)));
    running.stop();
}

#[test]
fn own_relay_restart_while_events_flow_loses_nothing() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    own.publish(announcement(&owner, "repo", &[&a.url()], T0));
    let repo = coord(&owner, "repo");
    let issue = root(&owner, 1621, &[&repo], T0, "issue");
    own.publish(issue.clone());
    let running = Running::start(&own, |_, _| {});
    let first = reply(&keys(2), &issue, T0 + 1, "first");
    a.publish(first.clone());
    assert!(wait_for(20, || own.has(&first.id)));

    let port = own.port();
    let stored = own.stop();
    let mut flow = Vec::new();
    for i in 0..50 {
        let e = reply(
            &keys(2),
            &issue,
            Timestamp::now().as_secs(),
            &format!("during own restart {i}"),
        );
        a.publish(e.clone());
        flow.push(e);
    }
    std::thread::sleep(Duration::from_millis(300));
    let own = TestRelay::start_on(port, RelayOptions::default(), stored).unwrap();
    assert!(
        wait_for(30, || missing(&own, &flow) == 0),
        "{} of 50 lost",
        missing(&own, &flow)
    );
    running.stop();
}

#[test]
fn metrics_endpoint_serves_prometheus_text() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    own.publish(announcement(&owner, "repo", &[&a.url()], T0));
    let repo = coord(&owner, "repo");
    let comment = repo_comment(&keys(2), &repo, T0, "hello");
    a.publish(comment.clone());
    let running = Running::start(&own, |_, _| {});
    assert!(wait_for(20, || own.has(&comment.id)));
    let text = http_get(running.metrics, "/metrics");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    for needle in [
        // The remote relay; the own relay has gauges of its own.
        "grasp_sync_relays{status=\"connected\"} 1\n",
        "grasp_sync_own_relay_connected{link=\"write\"} 1",
        "grasp_sync_build_info{version=\"0.1.0\"} 1",
        "\nprocess_resident_memory_bytes ",
        "\nprocess_open_fds ",
        "grasp_sync_events_total{outcome=\"ingested\"} 1",
        "grasp_sync_sink_events_total{outcome=\"stored\"} 1",
        "grasp_sync_outbox_depth 0",
        "grasp_sync_subscriptions_open",
        "grasp_sync_bytes_total{direction=\"in\"}",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
    assert!(http_get(running.metrics, "/other").starts_with("HTTP/1.1 404"));
    running.stop();
}

#[test]
fn embedded_sink_fed_with_accepted_events_instead_of_self_subscription() {
    use std::sync::mpsc;
    struct Collect(mpsc::Sender<Event>);
    impl grasp_sync::Sink for Collect {
        fn store(&mut self, _from: &str, event: Event) -> grasp_sync::StoreOutcome {
            let _ = self.0.send(event);
            grasp_sync::StoreOutcome::Stored
        }
    }
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let comment = repo_comment(&keys(2), &repo, T0, "history");
    a.publish(comment.clone());
    let mut config = grasp_sync::Config::new("ws://127.0.0.1:1");
    config.self_subscribe = false;
    config.batch_window = Duration::from_millis(100);
    let (tx, rx) = mpsc::channel();
    let opts = grasp_sync::ShellOptions {
        allow_private_addresses: true,
        ..Default::default()
    };
    let shell = grasp_sync::Shell::new(
        config,
        opts,
        grasp_sync::SinkTarget::Custom(Box::new(Collect(tx))),
    )
    .unwrap();
    let handle = shell.handle();
    let thread = std::thread::spawn(move || shell.run());
    handle.feed(announcement(&owner, "repo", &[&a.url()], T0));
    let got = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("synced into the embedded sink");
    assert_eq!(got.id, comment.id);
    let live = repo_comment(&keys(3), &repo, Timestamp::now().as_secs(), "live");
    a.publish(live.clone());
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(30)).unwrap().id,
        live.id
    );
    handle.shutdown();
    thread.join().unwrap().unwrap();
}

/// `/healthz` is 200 while the own relay's links are up, 503 with the
/// reason once one stayed down past its first backoff, and 200 again when
/// it is back; `HEAD` answers both paths without a body.
#[test]
fn healthz_follows_the_own_relay_and_head_is_answered() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let port = own.port();
    let running = Running::start(&own, |_, _| {});
    let status = |path: &str| {
        let text = http_get(running.metrics, path);
        text.lines().next().unwrap_or_default().to_owned()
    };
    assert!(
        wait_for(30, || own.connection_count() >= 2),
        "both links up"
    );
    assert_eq!(status("/healthz"), "HTTP/1.1 200 OK");
    assert!(http_get(running.metrics, "/healthz").ends_with("\r\n\r\nok\n"));
    for path in ["/metrics", "/healthz"] {
        let text = http_head(running.metrics, path);
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{path}: {text}");
        assert!(text.ends_with("\r\n\r\n"), "{path}: a body: {text}");
    }
    let stored = own.stop();
    assert!(
        wait_for(60, || status("/healthz").starts_with("HTTP/1.1 503")),
        "503 once the own relay stayed down"
    );
    let text = http_get(running.metrics, "/healthz");
    assert!(text.contains("link down ("), "{text}");
    let _own = TestRelay::start_on(port, RelayOptions::default(), stored).unwrap();
    assert!(
        wait_for(60, || status("/healthz") == "HTTP/1.1 200 OK"),
        "healthy again"
    );
    running.stop();
}
