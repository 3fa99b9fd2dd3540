//! The relay farm (`grasp_sync::testing::farm`) against plain blocking
//! tungstenite clients over real loopback sockets: NIP-01 behaviour per
//! relay (compared with `TestRelay`), isolation between relays, restarts,
//! slow readers, TLS, and a farm of 2,000 relays.

mod support;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::client::{Client, WAIT, ids, kinds, note, wait_until};
use support::{T0, keys, sign, tag};

use grasp_sync::testing::farm::{FarmOptions, RelayFarm};
use grasp_sync::testing::relay::{
    MAX_SUBS_NOTICE, PARSE_ERROR, Refuse, RelayOptions, TOO_MANY_REQS, TestRelay, server_tls_config,
};
use nostr::prelude::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use serde_json::{Value, json};
use tungstenite::Message;
use tungstenite::protocol::WebSocketConfig;
use tungstenite::stream::MaybeTlsStream;

// ---------------------------------------------------------------- events

fn farm(count: usize) -> RelayFarm {
    RelayFarm::start(count, FarmOptions::default()).expect("farm starts")
}

/// Resident set size of this process, KiB.
fn vm_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

// ---------------------------------------------------------------- client

type PlainClient = Client<MaybeTlsStream<TcpStream>>;

fn connect(url: &str) -> PlainClient {
    // A small read buffer keeps the RSS measured below about the farm.
    let config = WebSocketConfig::default().read_buffer_size(4 * 1024);
    let (ws, _) =
        tungstenite::client::connect_with_config(url, Some(config), 0).expect("client connects");
    if let MaybeTlsStream::Plain(s) = ws.get_ref() {
        s.set_read_timeout(Some(WAIT)).expect("set read timeout");
    }
    Client { ws }
}

// ---------------------------------------------------------------- start

#[test]
fn fifty_relays_have_distinct_urls_and_serve() {
    let farm = farm(50);
    assert_eq!(farm.len(), 50);
    assert!(!farm.is_empty());
    let urls: HashSet<String> = (0..50).map(|i| farm.url(i)).collect();
    assert_eq!(urls.len(), 50);
    for i in 0..50 {
        assert_eq!(farm.url(i), format!("ws://127.0.0.1:{}", farm.port(i)));
    }
    for i in [0, 17, 49] {
        let mut c = connect(&farm.own_url(i));
        assert!(c.req("s", vec![kinds(1)]).is_empty());
    }
    assert_eq!(farm.stats().reqs, 3);
    assert!(
        RelayFarm::start(0, FarmOptions::default())
            .unwrap()
            .is_empty()
    );
}

// ---------------------------------------------------------------- REQ

#[test]
fn seeded_events_come_newest_first_capped_and_page_with_until() {
    let k = keys(3);
    let events: Vec<Event> = (0..1_200)
        .map(|i| note(&k, T0 + i, &i.to_string()))
        .collect();
    let opts = FarmOptions {
        max_results_per_req: Some(500),
        ..FarmOptions::default()
    };
    let farm = RelayFarm::start(3, opts).unwrap();
    // Seeded out of order: answers are sorted anyway.
    farm.seed(1, events.iter().rev().cloned().collect());
    assert_eq!(farm.count_present(1, &ids(&events)), 1_200);
    assert_eq!(farm.count_present(0, &ids(&events)), 0);
    let mut c = connect(&farm.own_url(1));

    let first = c.req("all", vec![kinds(1)]);
    let newest_500: Vec<EventId> = events.iter().rev().take(500).map(|e| e.id).collect();
    assert_eq!(ids(&first), newest_500);

    let mut seen = HashSet::new();
    let mut pages = Vec::new();
    let mut filter = kinds(1);
    loop {
        let page = c.req("page", vec![filter.clone()]);
        pages.push(page.len());
        let Some(oldest) = page.last() else { break };
        for e in &page {
            assert!(seen.insert(e.id), "no event twice");
        }
        filter = filter.until(oldest.created_at - 1);
    }
    assert_eq!(pages, vec![500, 500, 200, 0]);
    assert_eq!(seen.len(), 1_200);

    // A filter limit below the cap wins.
    let got = c.req("ten", vec![kinds(1).limit(10)]);
    assert_eq!(ids(&got), newest_500[..10].to_vec());

    // The cap applies to all filters of a REQ together.
    let part = |lo: u64, hi: u64| {
        kinds(1)
            .since(Timestamp::from_secs(T0 + lo))
            .until(Timestamp::from_secs(T0 + hi))
    };
    let got = c.req("two", vec![part(0, 399), part(800, 1_199)]);
    assert_eq!(got.len(), 500);
    assert_eq!(got[0].id, events[1_199].id);
    assert_eq!(got[399].id, events[800].id);
    assert_eq!(got[400].id, events[399].id);
    assert_eq!(got[499].id, events[300].id);

    // The other relays hold nothing.
    let mut other = connect(&farm.own_url(2));
    assert!(other.req("all", vec![kinds(1)]).is_empty());
}

/// The same events and REQs, answered by a farm relay and by a TestRelay.
#[test]
fn answers_match_the_test_relay() {
    let (a, b) = (keys(1), keys(2));
    let mut events: Vec<Event> = (0..30)
        .map(|i| note(&a, T0 + i % 7, &format!("a{i}")))
        .collect();
    events.extend((0..20).map(|i| sign(&b, 7, T0 + 3 + i % 4, Vec::new(), &format!("b{i}"))));
    // Replaceable and addressable versions, older ones after newer ones.
    events.push(sign(&a, 10002, T0 + 10, Vec::new(), "new list"));
    events.push(sign(&a, 10002, T0 + 5, Vec::new(), "old list"));
    events.push(sign(&b, 30617, T0, vec![tag(&["d", "r"])], "old repo"));
    events.push(sign(&b, 30617, T0 + 1, vec![tag(&["d", "r"])], "new repo"));
    events.push(sign(&b, 30617, T0, vec![tag(&["d", "s"])], "other repo"));
    let coord = format!("30617:{}:r", b.public_key().to_hex());
    events.push(sign(&a, 1617, T0 + 2, vec![tag(&["a", &coord])], "patch"));

    let relay = TestRelay::start_on(0, RelayOptions::default(), events.clone()).unwrap();
    let farm = farm(1);
    farm.seed(0, events.clone());
    let mut t = connect(&relay.url());
    let mut f = connect(&farm.own_url(0));

    let letter = |c| SingleLetterTag::from_char(c).unwrap();
    let some_ids: Vec<EventId> = events.iter().step_by(3).map(|e| e.id).collect();
    let reqs: Vec<Vec<Filter>> = vec![
        vec![Filter::new()],
        vec![kinds(1).limit(5), kinds(7).limit(3)],
        vec![Filter::new().author(a.public_key()).limit(12), kinds(7)],
        vec![
            kinds(1)
                .since(Timestamp::from_secs(T0 + 2))
                .until(Timestamp::from_secs(T0 + 4)),
        ],
        vec![Filter::new().ids(some_ids.clone()).limit(4)],
        vec![Filter::new().ids(some_ids), kinds(30617)],
        vec![kinds(10002), kinds(30617)],
        vec![Filter::new().custom_tag(letter('a'), coord.clone())],
        vec![kinds(1).limit(0)],
        vec![
            kinds(1).until(Timestamp::from_secs(T0 + 3)).limit(9),
            kinds(1).limit(2),
        ],
    ];
    for (i, filters) in reqs.into_iter().enumerate() {
        let sub = format!("q{i}");
        let expected = t.req(&sub, filters.clone());
        assert_eq!(ids(&f.req(&sub, filters)), ids(&expected), "{sub}");
    }
}

#[test]
fn replaceable_and_addressable_events_keep_the_newest() {
    let farm = farm(1);
    let mut c = connect(&farm.own_url(0));
    let k = keys(1);
    let list_old = sign(&k, 10002, T0, Vec::new(), "old");
    let list_new = sign(&k, 10002, T0 + 10, Vec::new(), "new");
    let repo_a_old = sign(&k, 30617, T0, vec![tag(&["d", "a"])], "old");
    let repo_a_new = sign(&k, 30617, T0 + 10, vec![tag(&["d", "a"])], "new");
    let repo_b = sign(&k, 30617, T0, vec![tag(&["d", "b"])], "b");

    assert!(c.publish(&list_new).0);
    let (ok, msg) = c.publish(&list_old);
    assert!(ok);
    assert!(msg.starts_with("duplicate:"), "{msg}");
    assert!(c.publish(&repo_a_old).0);
    assert!(c.publish(&repo_a_new).0);
    assert!(c.publish(&repo_b).0);
    assert_eq!(
        farm.count_present(0, &ids(&[list_new, repo_a_new.clone(), repo_b.clone()])),
        3
    );
    assert_eq!(farm.count_present(0, &ids(&[list_old, repo_a_old])), 0);
    let got = c.req("s", vec![kinds(30617)]);
    assert_eq!(ids(&got), vec![repo_a_new.id, repo_b.id]);
}

// ---------------------------------------------------------------- live

#[test]
fn publish_is_delivered_live_on_that_relay_only() {
    let farm = farm(2);
    let k = keys(6);
    let old = note(&k, T0, "old");
    farm.seed(0, vec![old.clone()]);
    let mut here = connect(&farm.own_url(0));
    let mut there = connect(&farm.own_url(1));
    assert_eq!(ids(&here.req("live", vec![kinds(1)])), vec![old.id]);
    assert!(there.req("live", vec![kinds(1)]).is_empty());

    let e1 = note(&k, T0 + 1, "live");
    farm.publish(0, e1.clone());
    assert_eq!(here.live("live").id, e1.id);

    // Not asked for: not delivered; the next delivery is the matching one.
    farm.publish(0, sign(&k, 7, T0 + 2, Vec::new(), "+"));
    let e2 = note(&k, T0 + 3, "after the reaction");
    farm.publish(0, e2.clone());
    assert_eq!(here.live("live").id, e2.id);

    // Ephemeral: delivered, not stored.
    let flash = sign(&k, 20001, T0 + 4, Vec::new(), "flash");
    let mut eph = connect(&farm.own_url(0));
    assert!(eph.req("eph", vec![kinds(20001)]).is_empty());
    farm.publish(0, flash.clone());
    assert_eq!(eph.live("eph").id, flash.id);
    assert_eq!(farm.count_present(0, &[flash.id]), 0);

    // A second publish of the same event delivers nothing; the other relay
    // got nothing at all.
    farm.publish(0, e2.clone());
    here.assert_quiet();
    there.assert_quiet();
    assert_eq!(farm.count_present(1, &[old.id, e1.id, e2.id]), 0);
    assert_eq!(farm.count_present(0, &[old.id, e1.id, e2.id]), 3);
}

#[test]
fn client_events_are_verified_stored_and_delivered() {
    let farm = farm(2);
    let mut reader = connect(&farm.own_url(0));
    assert!(reader.req("s", vec![kinds(1)]).is_empty());
    let mut writer = connect(&farm.own_url(0));
    let good = note(&keys(1), T0, "good");
    assert_eq!(writer.publish(&good), (true, String::new()));
    assert_eq!(farm.count_present(0, &[good.id]), 1);
    assert_eq!(farm.count_present(1, &[good.id]), 0);
    assert_eq!(reader.live("s").id, good.id);

    let (ok, msg) = writer.publish(&good);
    assert!(ok);
    assert!(msg.starts_with("duplicate:"), "{msg}");

    let other = note(&keys(1), T0, "other");
    let mut wrong_sig: Value = serde_json::from_str(&good.as_json()).unwrap();
    wrong_sig["sig"] = json!(other.sig.to_string());
    let mut wrong_content: Value = serde_json::from_str(&other.as_json()).unwrap();
    wrong_content["content"] = json!("tampered");
    for (bad, id) in [(wrong_sig, good.id), (wrong_content, other.id)] {
        writer.send(json!(["EVENT", bad]).to_string());
        let ok = writer.recv();
        assert_eq!(ok[0], "OK");
        assert_eq!(ok[1], id.to_hex());
        assert_eq!(ok[2], false);
        assert!(ok[3].as_str().unwrap().starts_with("invalid:"), "{ok}");
    }
    assert_eq!(farm.count_present(0, &[other.id]), 0);
    reader.assert_quiet();
    let stats = farm.stats();
    assert_eq!(stats.events_received, 4);
    assert_eq!(stats.events_stored, 1);
    assert_eq!(stats.own_connections, 2);
    assert!(stats.bytes_out > 0);
}

#[test]
fn close_stops_live_delivery() {
    let farm = farm(1);
    let mut c = connect(&farm.own_url(0));
    assert!(c.req("s", vec![kinds(1)]).is_empty());
    c.close("s");
    // Replies come in order: once the probe's EOSE is in, the CLOSE was
    // handled.
    c.assert_quiet();
    farm.publish(0, note(&keys(8), T0, "nobody listens"));
    c.assert_quiet();
}

// ---------------------------------------------------------------- limits

#[test]
fn subscription_limit_refused_with_closed() {
    let opts = FarmOptions {
        max_subscriptions: Some((2, Refuse::Closed)),
        ..FarmOptions::default()
    };
    let farm = RelayFarm::start(1, opts).unwrap();
    let mut c = connect(&farm.own_url(0));
    c.req("a", vec![kinds(1)]);
    c.req("b", vec![kinds(1)]);
    c.send_req("c", vec![kinds(1)]);
    assert_eq!(c.recv(), json!(["CLOSED", "c", TOO_MANY_REQS]));
    // Reusing an open id replaces it and is not refused.
    c.req("a", vec![kinds(7)]);
    // The limit is per connection.
    let mut other = connect(&farm.own_url(0));
    other.req("c", vec![kinds(1)]);
    // Closing one makes room.
    c.close("b");
    c.req("c", vec![kinds(1)]);
    assert_eq!(farm.stats().reqs, 6);
}

#[test]
fn subscription_limit_refused_with_notice() {
    let opts = FarmOptions {
        max_subscriptions: Some((1, Refuse::Notice)),
        ..FarmOptions::default()
    };
    let farm = RelayFarm::start(1, opts).unwrap();
    let mut c = connect(&farm.own_url(0));
    c.req("a", vec![kinds(1)]);
    c.send_req("b", vec![kinds(1)]);
    assert_eq!(c.recv(), json!(["NOTICE", MAX_SUBS_NOTICE]));
    // The refused subscription gets no live events.
    let e = note(&keys(9), T0, "only for a");
    farm.publish(0, e.clone());
    assert_eq!(c.live("a").id, e.id);
    c.close("a");
    c.assert_quiet();
}

// ---------------------------------------------------------------- robustness

#[test]
fn garbage_gets_a_notice_pings_get_pongs() {
    let farm = farm(1);
    let mut c = connect(&farm.own_url(0));
    for garbage in [
        "hello",
        "",
        "[]",
        "[\"REQ\"]",
        "{\"kind\":1}",
        "[\"EVENT\",{\"id\":\"zz\"}]",
        "[\"CLOSE\",42]",
        "[\"REQ\",\"s\",{\"kinds\":\"nope\"}]",
    ] {
        c.send(garbage);
        assert_eq!(c.recv(), json!(["NOTICE", PARSE_ERROR]), "for {garbage:?}");
    }
    c.ws.send(Message::binary(vec![0xff, 0x00])).unwrap();
    assert_eq!(c.recv(), json!(["NOTICE", PARSE_ERROR]));

    c.ws.send(Message::Ping(b"hi".to_vec().into())).unwrap();
    match c.ws.read().expect("a pong") {
        Message::Pong(p) => assert_eq!(&p[..], b"hi"),
        other => panic!("expected a pong, got {other:?}"),
    }

    // Not a websocket at all: dropped, the farm keeps serving.
    let mut raw = TcpStream::connect(("127.0.0.1", farm.port(0))).unwrap();
    raw.set_read_timeout(Some(WAIT)).unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    let _ = raw.read_to_end(&mut buf);

    let e = note(&keys(10), T0, "still works");
    assert_eq!(c.publish(&e), (true, String::new()));
    assert_eq!(ids(&c.req("s", vec![kinds(1)])), vec![e.id]);
    wait_until("one connection", || farm.stats().connections == 1);
}

#[test]
fn connections_come_and_go() {
    let farm = farm(2);
    let mut stayer = connect(&farm.own_url(1));
    assert!(stayer.req("s", vec![kinds(1)]).is_empty());
    for i in 0..60 {
        match i % 3 {
            // A clean websocket close.
            0 => {
                let mut c = connect(&farm.own_url(1));
                c.req("x", vec![kinds(1)]);
                c.ws.close(None).unwrap();
                while c.ws.read().is_ok() {}
            }
            // A dropped websocket.
            1 => drop(connect(&farm.own_url(1))),
            // A TCP connection that never handshakes.
            _ => drop(TcpStream::connect(("127.0.0.1", farm.port(1))).unwrap()),
        }
    }
    wait_until("only the stayer", || farm.stats().connections == 1);
    let e = note(&keys(4), T0, "for the stayer");
    farm.publish(1, e.clone());
    assert_eq!(stayer.live("s").id, e.id);
    stayer.assert_quiet();
}

#[test]
fn large_answers_reach_a_slow_reader() {
    let farm = farm(1);
    let k = keys(5);
    let filler = "x".repeat(2_000);
    let events: Vec<Event> = (0..8_000).map(|i| note(&k, T0 + i, &filler)).collect();
    farm.seed(0, events.clone());
    let mut c = connect(&farm.own_url(0));
    c.send_req("all", vec![kinds(1)]);
    // Far more than the socket buffers hold: the farm waits for the reader.
    std::thread::sleep(Duration::from_millis(300));
    let got = c.until_eose("all");
    assert_eq!(got.len(), 8_000);
    assert_eq!(got[0].id, events[7_999].id);
    c.assert_quiet();
    assert!(farm.stats().bytes_out > 16_000_000);
}

#[test]
fn a_reader_that_never_reads_is_disconnected() {
    let farm = farm(1);
    let mut lazy = connect(&farm.own_url(0));
    assert!(lazy.req("s", vec![kinds(1)]).is_empty());
    let k = keys(6);
    let filler = "y".repeat(10_000);
    for i in 0..4_000 {
        farm.publish(0, note(&k, T0 + i, &filler));
    }
    wait_until("the lazy reader is cut", || {
        farm.stats().own_connections == 0
    });
    // The relay keeps serving others.
    let mut c = connect(&farm.own_url(0));
    assert_eq!(c.req("n", vec![kinds(1).limit(3)]).len(), 3);
}

// ---------------------------------------------------------------- restart

#[test]
fn restart_cuts_refuses_then_serves_the_same_store() {
    let farm = farm(3);
    let port = farm.port(1);
    let mut c = connect(&farm.own_url(1));
    let e = note(&keys(12), T0, "survives restarts");
    assert_eq!(c.publish(&e), (true, String::new()));
    c.req("s", vec![kinds(1)]);
    let mut neighbour = connect(&farm.own_url(2));
    neighbour.req("s", vec![kinds(1)]);

    let down = Duration::from_millis(500);
    let restarted = Instant::now();
    farm.restart(1, down);
    c.assert_cut();
    // The listener closes before the connections are cut.
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    wait_until("listening again", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert!(restarted.elapsed() >= down);

    assert_eq!(farm.url(1), format!("ws://127.0.0.1:{port}"));
    let mut again = connect(&farm.own_url(1));
    assert_eq!(ids(&again.req("s", vec![kinds(1)])), vec![e.id]);
    // Live delivery works on the new connection; the neighbour was not
    // touched.
    let e2 = note(&keys(12), T0 + 1, "after");
    farm.publish(1, e2.clone());
    assert_eq!(again.live("s").id, e2.id);
    neighbour.assert_quiet();
    wait_until("two connections", || farm.stats().own_connections == 2);
}

#[test]
fn restarting_a_relay_that_is_down_starts_over() {
    let farm = farm(1);
    let port = farm.port(0);
    // The second downtime is long, so a loaded machine's late wake-up
    // cannot reach its end before the check that it is still down.
    farm.restart(0, Duration::from_millis(200));
    farm.restart(0, Duration::from_millis(3_000));
    let restarted = Instant::now();
    // Right after the first downtime would have ended, still refused.
    std::thread::sleep(Duration::from_millis(400));
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    wait_until("listening again", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert!(restarted.elapsed() >= Duration::from_millis(2_900));
    let mut c = connect(&farm.own_url(0));
    assert!(c.req("s", vec![kinds(1)]).is_empty());
}

// ---------------------------------------------------------------- stop

#[test]
fn stop_returns_promptly_with_clients_connected() {
    let farm = farm(5);
    let ports: Vec<u16> = (0..5).map(|i| farm.port(i)).collect();
    let mut clients: Vec<PlainClient> = (0..10).map(|i| connect(&farm.own_url(i % 5))).collect();
    for c in &mut clients {
        assert!(c.req("s", vec![kinds(1)]).is_empty());
    }
    assert_eq!(farm.stats().own_connections, 10);
    let started = Instant::now();
    farm.stop();
    // Generous for a loaded machine; a stop that waited on its clients
    // would never return.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    for c in &mut clients {
        c.assert_cut();
    }
    for port in ports {
        assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    }
}

#[test]
fn drop_stops_the_farm() {
    let farm = farm(2);
    let port = farm.port(1);
    let mut c = connect(&farm.own_url(1));
    c.req("s", vec![kinds(1)]);
    drop(farm);
    c.assert_cut();
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

// ---------------------------------------------------------------- scale

/// A client that does not hold the farm's token (as one of another test
/// run would not) is served but not counted as the farm's own.
#[test]
fn only_clients_of_own_url_are_counted_as_own() {
    let farm = farm(2);
    let mut stray = connect(&farm.url(1));
    let mut own = connect(&farm.own_url(1));
    let mut guess = connect(&format!("{}/?farm=0000000000000000", farm.url(1)));
    for c in [&mut stray, &mut own, &mut guess] {
        assert!(c.req("s", vec![kinds(1)]).is_empty());
    }
    let stats = farm.stats();
    assert_eq!((stats.connections, stats.own_connections), (3, 1));
    drop(own);
    wait_until("the own client gone", || farm.stats().own_connections == 0);
    assert!(
        stray.req("t", vec![kinds(1)]).is_empty(),
        "strays still served"
    );
}

#[test]
fn two_thousand_relays_each_accept_a_connection() {
    // Needs about 2,200 file descriptors.
    let _ = grasp_sync::internal::raise_fd_limit();
    let rss_before = vm_rss_kib();
    let started = Instant::now();
    let farm = farm(2_000);
    let start_time = started.elapsed();
    let rss_idle = vm_rss_kib();
    assert_eq!(farm.len(), 2_000);
    let e = note(&keys(13), T0, "everywhere");

    let sample: Vec<usize> = (0..2_000).step_by(20).collect();
    assert_eq!(sample.len(), 100);
    let connecting = Instant::now();
    let mut clients: Vec<PlainClient> = Vec::new();
    for &i in &sample {
        farm.seed(i, vec![e.clone()]);
        let mut c = connect(&farm.own_url(i));
        assert_eq!(ids(&c.req("s", vec![kinds(1)])), vec![e.id], "relay {i}");
        clients.push(c);
    }
    let connect_time = connecting.elapsed();
    // Only this test's clients: a client of another run that reaches one
    // of these OS-picked ports is in `connections` (and may send REQs),
    // not in `own_connections`. Each client's answer above proved its REQ.
    let stats = farm.stats();
    assert_eq!(stats.own_connections, 100);
    assert!(stats.reqs >= 100);
    let rss_connected = vm_rss_kib();
    eprintln!(
        "2,000 relays: started in {start_time:?}; RSS {rss_before} KiB before, {rss_idle} KiB \
         idle, {rss_connected} KiB with 100 connected; 100 connect+REQ+EOSE in {connect_time:?}"
    );

    // Unsampled relays hold nothing and still answer.
    let mut c = connect(&farm.own_url(1_999));
    assert!(c.req("s", vec![kinds(1)]).is_empty());
    drop(c);
    drop(clients);
    wait_until("every connection closed", || {
        farm.stats().own_connections == 0
    });
}

// ---------------------------------------------------------------- TLS

use grasp_sync::testing::cert::{CA_PEM, LEAF_KEY_PEM, LEAF_PEM};

type TlsClient = Client<StreamOwned<ClientConnection, TcpStream>>;

fn connect_tls(farm: &RelayFarm, relay: usize) -> TlsClient {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(CA_PEM.as_bytes()).unwrap())
        .unwrap();
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tcp = TcpStream::connect(("127.0.0.1", farm.port(relay))).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = ClientConnection::new(Arc::new(config), name).unwrap();
    let (ws, _) = tungstenite::client(farm.url(relay), StreamOwned::new(tls, tcp))
        .expect("wss handshake with a trusted localhost certificate");
    Client { ws }
}

#[test]
fn tls_farm_serves_wss() {
    let chain = format!("{LEAF_PEM}{CA_PEM}");
    let opts = FarmOptions {
        tls: Some(server_tls_config(chain.as_bytes(), LEAF_KEY_PEM.as_bytes()).unwrap()),
        ..FarmOptions::default()
    };
    let farm = RelayFarm::start(2, opts).unwrap();
    assert_eq!(farm.url(1), format!("wss://localhost:{}", farm.port(1)));

    let mut reader = connect_tls(&farm, 1);
    assert!(reader.req("s", vec![kinds(1)]).is_empty());
    let mut writer = connect_tls(&farm, 1);
    let e = note(&keys(13), T0, "over TLS");
    assert_eq!(writer.publish(&e), (true, String::new()));
    assert_eq!(reader.live("s").id, e.id);

    // A large answer crosses many TLS records and socket refills.
    let k = keys(14);
    let filler = "z".repeat(1_000);
    let many: Vec<Event> = (0..3_000).map(|i| note(&k, T0 + 10 + i, &filler)).collect();
    farm.seed(0, many);
    let mut big = connect_tls(&farm, 0);
    big.send_req("all", vec![kinds(1)]);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(big.until_eose("all").len(), 3_000);
    big.assert_quiet();

    // A plain websocket client does not get through.
    assert!(tungstenite::connect(format!("ws://127.0.0.1:{}", farm.port(1))).is_err());

    farm.restart(1, Duration::from_millis(100));
    reader.assert_cut();
    wait_until("listening again", || {
        TcpStream::connect(("127.0.0.1", farm.port(1))).is_ok()
    });
    let mut again = connect_tls(&farm, 1);
    assert_eq!(ids(&again.req("s", vec![kinds(1)])), vec![e.id]);
}

// ---------------------------------------------------------------- NIP-77

use grasp_sync::internal::{Reconciliation, Step};

fn neg_farm(count: usize) -> RelayFarm {
    let opts = FarmOptions {
        negentropy: true,
        ..FarmOptions::default()
    };
    RelayFarm::start(count, opts).expect("farm starts")
}

/// Reconciles `filter` on `client` against `local`, as the engine does;
/// returns the ids the relay holds and `local` lacks, the longest hex frame
/// the relay sent, and how many `NEG-MSG`s it sent.
fn reconcile<S: Read + Write>(
    client: &mut Client<S>,
    sub: &str,
    filter: &Filter,
    local: &[Event],
    message_limit: usize,
) -> (Vec<EventId>, usize, usize) {
    let held = local.iter().map(|e| (e.id, e.created_at));
    let (mut recon, open) = Reconciliation::start(sub, filter, held, message_limit).unwrap();
    client.send(open);
    let mut longest = 0;
    let mut answers = 0;
    loop {
        let answer = client.recv();
        answers += 1;
        assert_eq!(answer[0], "NEG-MSG", "{answer}");
        longest = longest.max(answer[2].as_str().unwrap().len());
        let message = RelayMessage::from_json(answer.to_string()).unwrap();
        match recon.handle(&message).expect("an answer for our session") {
            Step::Send(text) => client.send(text),
            Step::Done { need, close } => {
                client.send(close);
                return (need, longest, answers);
            }
            Step::Failed { reason, .. } => panic!("reconciliation failed: {reason}"),
        }
    }
}

fn sorted_ids(events: &[&Event]) -> Vec<EventId> {
    let mut ids: Vec<EventId> = events.iter().map(|e| e.id).collect();
    ids.sort_unstable();
    ids
}

#[test]
fn negentropy_needs_exactly_the_missing_ids() {
    let k = keys(20);
    // Several events per second, as on a busy relay; other kinds beside.
    let notes: Vec<Event> = (0..6_000)
        .map(|i| note(&k, T0 + i / 3, &i.to_string()))
        .collect();
    let others: Vec<Event> = (0..200)
        .map(|i| sign(&k, 1621, T0 + i, Vec::new(), "issue"))
        .collect();
    let farm = neg_farm(2);
    farm.seed(1, notes.iter().chain(&others).cloned().collect());
    let missing: Vec<&Event> = notes.iter().step_by(211).collect();
    let extra: Vec<Event> = (0..50)
        .map(|i| note(&keys(21), T0 + i, "only we hold it"))
        .collect();
    let local: Vec<Event> = notes
        .iter()
        .filter(|e| !missing.iter().any(|m| m.id == e.id))
        .chain(&extra)
        .cloned()
        .collect();
    let mut c = connect(&farm.own_url(1));

    let (need, longest, rounds) = reconcile(&mut c, "n1", &kinds(1), &local, 60_000);
    assert_eq!(need, sorted_ids(&missing));
    assert!(longest <= 2 * 60_000, "a frame of {longest} hex digits");
    // Small frames on our side: more rounds, the same answer.
    let (need, _, more) = reconcile(&mut c, "n2", &kinds(1), &local, 9_000);
    assert_eq!(need, sorted_ids(&missing));
    assert!(
        more > rounds,
        "{more} rounds with small frames, {rounds} without"
    );
    // The filter scopes the set: nothing held of kind 1621, all of it needed.
    let (need, _, scoped) = reconcile(&mut c, "n3", &kinds(1621), &[], 60_000);
    assert_eq!(need, sorted_ids(&others.iter().collect::<Vec<_>>()));
    // An empty relay needs nothing whatever we hold.
    let mut empty = connect(&farm.own_url(0));
    let (need, _, nothing) = reconcile(&mut empty, "n4", &kinds(1), &local, 60_000);
    assert_eq!(need, []);

    let stats = farm.stats();
    assert_eq!(stats.neg_sessions, 4);
    // Every NEG-MSG but the answers to the four NEG-OPENs is a round.
    let answers = rounds + more + scoped + nothing;
    assert_eq!(stats.neg_rounds as usize, answers - 4, "{stats:?}");
    assert_eq!(stats.neg_errors, 0);
    assert_eq!(stats.reqs, 0, "negentropy is not counted as REQ");
    // Sessions are closed by NEG-CLOSE: a further round is an error.
    c.send(r#"["NEG-MSG","n1","61"]"#);
    let err = c.recv();
    assert_eq!(err[0], "NEG-ERR", "{err}");
    assert!(err[2].as_str().unwrap().starts_with("closed:"), "{err}");
    c.assert_quiet();
}

#[test]
fn negentropy_garbage_gets_neg_err_and_the_connection_goes_on() {
    let farm = neg_farm(1);
    let e = note(&keys(22), T0, "x");
    farm.seed(0, vec![e.clone()]);
    let mut c = connect(&farm.own_url(0));
    for (text, sub) in [
        (r#"["NEG-OPEN","a",{"kinds":[1]},"zz"]"#, "a"),
        (r#"["NEG-OPEN","b",{"kinds":[1]},"6"]"#, "b"),
        (r#"["NEG-MSG","nobody","61"]"#, "nobody"),
    ] {
        c.send(text);
        let err = c.recv();
        assert_eq!(err[0], "NEG-ERR", "{text}: {err}");
        assert_eq!(err[1], sub, "{text}: {err}");
    }
    assert_eq!(farm.stats().neg_errors, 3);
    assert_eq!(farm.stats().neg_sessions, 0);
    // A good session after the bad ones.
    assert_eq!(reconcile(&mut c, "ok", &kinds(1), &[], 60_000).0, [e.id]);
    assert_eq!(ids(&c.req("s", vec![kinds(1)])), [e.id]);
}

#[test]
fn negentropy_is_off_by_default() {
    let farm = farm(1);
    let mut c = connect(&farm.own_url(0));
    c.send(r#"["NEG-OPEN","n",{"kinds":[1]},"6100000200"]"#);
    assert_eq!(c.recv(), json!(["NOTICE", "error: unsupported message"]));
    assert_eq!(farm.stats().neg_sessions, 0);
}

// ---------------------------------------------------------------- NIP-42

fn auth_farm() -> RelayFarm {
    let opts = FarmOptions {
        negentropy: true,
        auth_required: vec![1],
        ..FarmOptions::default()
    };
    RelayFarm::start(2, opts).expect("farm starts")
}

/// The challenge a relay requiring AUTH sends first on a new connection.
fn challenge_of(c: &mut PlainClient) -> String {
    let msg = c.recv();
    assert_eq!(msg[0], "AUTH", "{msg}");
    msg[1].as_str().expect("a string challenge").to_owned()
}

fn auth_event(k: &Keys, kind: u16, relay: &str, challenge: &str, at: Timestamp) -> Event {
    EventBuilder::new(Kind::from_u16(kind), "")
        .tags([
            Tag::custom("relay", [relay]),
            Tag::custom("challenge", [challenge]),
        ])
        .custom_created_at(at)
        .finalize(k)
        .unwrap()
}

/// Sends `["AUTH", event]` (as raw JSON) and returns the OK's status and
/// message.
fn send_auth(c: &mut PlainClient, event: &Value) -> (bool, String) {
    c.send(json!(["AUTH", event]).to_string());
    let ok = c.recv();
    assert_eq!(ok[0], "OK", "{ok}");
    assert_eq!(ok[1], event["id"], "{ok}");
    (ok[2].as_bool().unwrap(), ok[3].as_str().unwrap().to_owned())
}

fn json_of(event: &Event) -> Value {
    serde_json::from_str(&event.as_json()).unwrap()
}

#[test]
fn auth_is_required_for_reads_and_checked() {
    let farm = auth_farm();
    let e = note(&keys(30), T0, "members only");
    farm.seed(1, vec![e.clone()]);
    let url = farm.url(1);
    let mut c = connect(&url);
    let challenge = challenge_of(&mut c);
    assert_eq!(challenge.len(), 32, "16 random bytes as hex");

    // Reads are refused until AUTH; writes are not.
    c.send_req("s", vec![kinds(1)]);
    let closed = c.recv();
    assert_eq!(closed[0], "CLOSED", "{closed}");
    assert_eq!(closed[1], "s");
    assert!(closed[2].as_str().unwrap().starts_with("auth-required:"));
    c.send(r#"["NEG-OPEN","n",{"kinds":[1]},"6100000200"]"#);
    let err = c.recv();
    assert_eq!(err[0], "NEG-ERR", "{err}");
    assert!(err[2].as_str().unwrap().starts_with("auth-required:"));
    let written = note(&keys(31), T0 + 1, "writes need no AUTH");
    assert_eq!(c.publish(&written), (true, String::new()));

    // Every way to get AUTH wrong is an OK false, and reads stay refused.
    let k = keys(32);
    let now = Timestamp::now();
    let good = auth_event(&k, 22242, &url, &challenge, now);
    let mut bad_sig = json_of(&good);
    let other = auth_event(&keys(33), 22242, &url, &challenge, now);
    bad_sig["sig"] = json_of(&other)["sig"].clone();
    let wrong_port = url.replace(&farm.port(1).to_string(), &farm.port(0).to_string());
    let bad = [
        (bad_sig, "invalid: bad id or signature"),
        (
            json_of(&auth_event(&k, 22242, &url, "not-it", now)),
            "invalid: wrong challenge",
        ),
        (
            json_of(&auth_event(&k, 1, &url, &challenge, now)),
            "invalid: not a kind 22242 event",
        ),
        (
            json_of(&auth_event(&k, 22242, &wrong_port, &challenge, now)),
            "invalid: the relay tag does not name this relay",
        ),
        (
            json_of(&auth_event(&k, 22242, &url, &challenge, now - 3_600)),
            "invalid: created_at too far from now",
        ),
    ];
    for (event, reason) in &bad {
        assert_eq!(send_auth(&mut c, event), (false, (*reason).to_owned()));
    }
    c.send_req("s", vec![kinds(1)]);
    assert_eq!(c.recv()[0], "CLOSED");

    // A valid AUTH: OK true, then reads are served, REQ and NEG-OPEN alike.
    assert_eq!(send_auth(&mut c, &json_of(&good)), (true, String::new()));
    let mut want = vec![e.id, written.id];
    want.sort_unstable();
    let mut got = ids(&c.req("s", vec![kinds(1)]));
    got.sort_unstable();
    assert_eq!(got, want);
    assert_eq!(
        reconcile(&mut c, "n", &kinds(1), std::slice::from_ref(&e), 60_000).0,
        [written.id]
    );

    // AUTH is per connection, and each gets its own challenge: the first
    // connection's event is refused on the second.
    let mut second = connect(&url);
    let challenge2 = challenge_of(&mut second);
    assert_ne!(challenge2, challenge);
    assert_eq!(
        send_auth(&mut second, &json_of(&good)),
        (false, "invalid: wrong challenge".to_owned())
    );
    second.send_req("s", vec![kinds(1)]);
    assert_eq!(second.recv()[0], "CLOSED");

    let stats = farm.stats();
    assert_eq!(stats.auth_accepted, 1);
    assert_eq!(stats.auth_rejected, 6);
    assert_eq!(stats.auth_refusals, 4);
    assert_eq!(stats.neg_errors, 1);
}

#[test]
fn relays_that_do_not_require_auth_never_challenge() {
    let farm = auth_farm();
    let e = note(&keys(34), T0, "open relay");
    farm.seed(0, vec![e.clone()]);
    let mut c = connect(&farm.own_url(0));
    // The first message is the REQ's answer: no AUTH came before it.
    assert_eq!(ids(&c.req("s", vec![kinds(1)])), [e.id]);
    // An AUTH nobody asked for is refused; reads go on.
    let event = auth_event(&keys(35), 22242, &farm.url(0), "x", Timestamp::now());
    let (ok, reason) = send_auth(&mut c, &json_of(&event));
    assert!(!ok);
    assert!(reason.starts_with("auth-required:"), "{reason}");
    assert_eq!(ids(&c.req("t", vec![kinds(1)])), [e.id]);
    assert_eq!(farm.stats().auth_refusals, 0);
}

/// A relay profile with `nagle` leaves Nagle's algorithm on, as relays on
/// tokio and tungstenite do: the `EOSE` after an `EVENT` waits for the
/// client's ACK of the `EVENT`, which Linux delays by 40 ms at least for
/// a client that (like this blocking one) does not ask for quick ACKs. So
/// 20 exchanges take 0.4 s at least (half of them delayed leaves room
/// for the kernel's quick ACKs of a new connection); the bound is the
/// kernel's timer, not this machine's speed. The default profile's
/// relay answers each exchange at once.
#[cfg(target_os = "linux")]
#[test]
fn a_relay_that_leaves_nagle_on_holds_an_answers_tail_for_the_ack() {
    use grasp_sync::testing::farm::RelayProfile;
    const EXCHANGES: u32 = 20;
    let nagle = RelayProfile {
        nagle: true,
        ..RelayProfile::default()
    };
    let opts = FarmOptions {
        profiles: vec![(1, nagle)],
        ..FarmOptions::default()
    };
    let farm = RelayFarm::start(2, opts).unwrap();
    let event = note(&keys(3), T0, "stored");
    farm.seed(0, vec![event.clone()]);
    farm.seed(1, vec![event.clone()]);
    let exchanges = |relay: usize| {
        let mut c = connect(&farm.own_url(relay));
        let started = Instant::now();
        for i in 0..EXCHANGES {
            assert_eq!(ids(&c.req(&format!("s{i}"), vec![kinds(1)])), [event.id]);
        }
        started.elapsed()
    };
    let held = exchanges(1);
    assert!(
        held >= Duration::from_millis(40) * EXCHANGES / 2,
        "{EXCHANGES} exchanges took {held:?}: no tail waited for an ACK"
    );
    let direct = exchanges(0);
    assert!(
        direct < held,
        "{direct:?} with TCP_NODELAY, {held:?} without"
    );
}
