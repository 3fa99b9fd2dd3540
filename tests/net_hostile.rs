//! Relays that send bad events and an oversized frame, or stream binary
//! frames and pings: the bad events are dropped and counted, the oversized
//! frame skipped, the stream throttled, and an honest relay next to them
//! is unaffected.

mod support;

use std::net::TcpListener;
use std::time::Duration;

use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use nostr::prelude::*;
use support::running::*;
use support::*;
use tungstenite::Message;

/// Answers every REQ asking tags with: a forged-signature event, an event
/// outside the filter, one good event, then a frame over the size cap.
fn start_hostile(good: Event, forged: Event, outside: Event) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (good, forged, outside) = (good.clone(), forged.clone(), outside.clone());
            std::thread::spawn(move || {
                let Ok(mut ws) = tungstenite::accept(stream) else {
                    return;
                };
                while let Ok(msg) = ws.read() {
                    let Message::Text(text) = msg else { continue };
                    let Ok(ClientMessage::Req {
                        subscription_id,
                        filters,
                    }) = ClientMessage::from_json(text.as_str())
                    else {
                        continue;
                    };
                    let id = subscription_id.to_string();
                    if filters.iter().any(|f| !f.generic_tags.is_empty()) {
                        for e in [&forged, &outside, &good] {
                            let _ = ws.send(Message::text(format!(
                                r#"["EVENT","{id}",{}]"#,
                                e.as_json()
                            )));
                        }
                        let _ = ws.send(Message::text(format!(
                            r#"["NOTICE","{}"]"#,
                            "x".repeat(100_000)
                        )));
                    }
                    let _ = ws.send(Message::text(format!(r#"["EOSE","{id}"]"#)));
                }
            });
        }
    });
    url
}

#[test]
fn bad_events_are_dropped_and_an_oversized_frame_skipped_without_harming_others() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let honest = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let good = repo_comment(&keys(2), &repo, T0, "good");
    let other = repo_comment(&keys(2), &repo, T0 + 1, "other");
    let forged = Event::new(
        good.id,
        good.pubkey,
        good.created_at,
        good.kind,
        good.tags.clone(),
        good.content.clone(),
        other.sig,
    );
    let forged = Event::new(
        EventId::compute(
            &forged.pubkey,
            &forged.created_at,
            &forged.kind,
            &forged.tags,
            "forged",
        ),
        forged.pubkey,
        forged.created_at,
        forged.kind,
        forged.tags.clone(),
        "forged",
        forged.sig,
    );
    let outside = sign(
        &keys(3),
        1111,
        T0,
        vec![tag(&["a", "30617:00:not-ours"])],
        "outside",
    );
    let hostile = start_hostile(good.clone(), forged.clone(), outside.clone());
    own.publish(announcement(&owner, "repo", &[&hostile, &honest.url()], T0));
    let honest_event = repo_comment(&keys(4), &repo, T0 + 2, "from the honest relay");
    honest.publish(honest_event.clone());

    let running = Running::start(&own, |_, o| o.max_frame_bytes = 64 * 1024);
    assert!(wait_for(20, || own.has(&good.id) && own.has(&honest_event.id)));
    assert!(
        wait_for(30, || running
            .metric("grasp_sync_events_total{outcome=\"invalid\"}")
            >= 1),
        "forged event counted"
    );
    assert!(
        running.metric("grasp_sync_events_total{outcome=\"unwanted\"}") >= 1,
        "outside-filter event counted"
    );
    assert!(
        !own.has(&forged.id) && !own.has(&outside.id),
        "neither reached the sink"
    );
    assert!(
        wait_for(30, || running.metric("grasp_sync_messages_oversized_total")
            >= 1),
        "oversized frame skipped and counted"
    );

    assert_honest_relay_unaffected(&honest, &own, &repo);
    std::thread::sleep(Duration::from_millis(50));
    running.stop();
}

/// A live comment on `repo` published on `honest` reaches `own`.
fn assert_honest_relay_unaffected(honest: &TestRelay, own: &TestRelay, repo: &str) {
    let live = repo_comment(
        &keys(5),
        repo,
        Timestamp::now().as_secs(),
        "live on the honest relay",
    );
    honest.publish(live.clone());
    assert!(
        wait_for(30, || own.has(&live.id)),
        "the honest relay is unaffected"
    );
}

/// A relay that answers nothing and streams 64 KiB binary frames and pings
/// as fast as the socket takes them.
fn start_binary_flood() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let Ok(mut ws) = tungstenite::accept(stream) else {
                    return;
                };
                let frame = vec![0u8; 64 * 1024];
                loop {
                    let binary = ws.send(Message::binary(frame.clone()));
                    let ping = ws.send(Message::Ping(Vec::new().into()));
                    if binary.is_err() || ping.is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

#[test]
fn binary_frames_and_pings_count_against_the_read_budget() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let honest = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let flood = start_binary_flood();
    own.publish(announcement(&owner, "repo", &[&flood, &honest.url()], T0));
    let running = Running::start(&own, |_, o| o.max_frames_per_sec = 200);
    assert!(
        wait_for(20, || running.metric("grasp_sync_reads_throttled_total")
            >= 3),
        "a relay streaming binary frames and pings was never throttled"
    );
    assert_honest_relay_unaffected(&honest, &own, &repo);
    running.stop();
}
