//! The test relay (`grasp_sync::testing::relay`) against a plain blocking
//! tungstenite client over real loopback sockets.

mod support;

use std::collections::HashSet;
use std::net::TcpStream;
use std::sync::Arc;
use support::client::{Client, WAIT, ids, is_timeout, kinds, note, wait_until};
use support::{T0, keys, sign, tag};

use grasp_sync::testing::limits::{
    TOO_MANY_AUTHORS, TOO_MANY_IDS, TOO_MANY_KINDS, TOO_MANY_TAG_VALUES, ValueCaps,
};
use grasp_sync::testing::relay::{
    MAX_SUBS_NOTICE, PARSE_ERROR, Refuse, RelayOptions, TOO_MANY_REQS, TestRelay, server_tls_config,
};
use nostr::prelude::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use serde_json::{Value, json};
use tungstenite::Message;
use tungstenite::stream::MaybeTlsStream;

// ---------------------------------------------------------------- events

fn letter(c: char) -> SingleLetterTag {
    SingleLetterTag::from_char(c).expect("a single letter")
}

/// Newest first, ties by id: the order a relay answers a REQ in.
fn newest_first(mut events: Vec<Event>) -> Vec<Event> {
    events.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
    events
}

// ---------------------------------------------------------------- client

fn connect(relay: &TestRelay) -> Client<MaybeTlsStream<TcpStream>> {
    let (ws, _) = tungstenite::connect(relay.url()).expect("client connects");
    if let MaybeTlsStream::Plain(s) = ws.get_ref() {
        s.set_read_timeout(Some(WAIT)).expect("set read timeout");
    }
    Client { ws }
}

// ---------------------------------------------------------------- EVENT

#[test]
fn client_event_is_acknowledged_and_stored() {
    let relay = TestRelay::start(RelayOptions::default()).unwrap();
    let mut c = connect(&relay);
    let e = note(&keys(1), T0, "hello");
    assert_eq!(c.publish(&e), (true, String::new()));
    assert!(relay.has(&e.id));
    assert_eq!(relay.len(), 1);
    assert_eq!(relay.events(), vec![e]);
}

#[test]
fn duplicate_event_is_acknowledged_as_duplicate() {
    let relay = TestRelay::start(RelayOptions::default()).unwrap();
    let mut c = connect(&relay);
    let e = note(&keys(1), T0, "hello");
    assert_eq!(c.publish(&e), (true, String::new()));
    let (ok, msg) = c.publish(&e);
    assert!(ok);
    assert!(msg.starts_with("duplicate:"), "{msg}");
    assert_eq!(relay.len(), 1);
}

#[test]
fn bad_signature_or_id_is_rejected() {
    let relay = TestRelay::start(RelayOptions::default()).unwrap();
    let mut c = connect(&relay);
    let good = note(&keys(1), T0, "good");
    let other = note(&keys(1), T0, "other");

    let mut wrong_sig: Value = serde_json::from_str(&good.as_json()).unwrap();
    wrong_sig["sig"] = json!(other.sig.to_string());
    let mut wrong_content: Value = serde_json::from_str(&good.as_json()).unwrap();
    wrong_content["content"] = json!("tampered");

    for bad in [wrong_sig, wrong_content] {
        c.send(json!(["EVENT", bad]).to_string());
        let ok = c.recv();
        assert_eq!(ok[0], "OK");
        assert_eq!(ok[1], good.id.to_hex());
        assert_eq!(ok[2], false);
        assert!(ok[3].as_str().unwrap().starts_with("invalid:"), "{ok}");
    }
    assert!(relay.is_empty());
    assert_eq!(c.publish(&good), (true, String::new()));
}

#[test]
fn read_only_relay_refuses_client_events() {
    let opts = RelayOptions {
        accept_events: false,
        ..RelayOptions::default()
    };
    let relay = TestRelay::start(opts).unwrap();
    let mut c = connect(&relay);
    let e = note(&keys(1), T0, "hello");
    let (ok, msg) = c.publish(&e);
    assert!(!ok);
    assert!(msg.starts_with("blocked:"), "{msg}");
    assert!(relay.is_empty());
    // The test itself can still seed it.
    relay.publish(e.clone());
    assert_eq!(c.req("s", vec![kinds(1)]), vec![e]);
}

#[test]
fn replaceable_and_addressable_events_keep_the_newest() {
    let relay = TestRelay::start(RelayOptions::default()).unwrap();
    let mut c = connect(&relay);
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

    assert!(relay.has(&list_new.id) && !relay.has(&list_old.id));
    assert!(relay.has(&repo_a_new.id) && !relay.has(&repo_a_old.id));
    assert!(relay.has(&repo_b.id));
    assert_eq!(relay.len(), 3);
    let got = c.req("s", vec![kinds(30617)]);
    assert_eq!(ids(&got), vec![repo_a_new.id, repo_b.id]);
}

// ---------------------------------------------------------------- REQ

#[test]
fn req_returns_newest_first_per_filter_limits_then_eose() {
    let relay = TestRelay::start(RelayOptions::default()).unwrap();
    let (a, b) = (keys(1), keys(2));
    let by_a: Vec<Event> = (0..10)
        .map(|i| note(&a, T0 + i, &format!("a{i}")))
        .collect();
    let by_b: Vec<Event> = (0..5)
        .map(|i| note(&b, T0 + 100 + i, &format!("b{i}")))
        .collect();
    // Two events at the same second: ties go by id.
    let tie: Vec<Event> = (0..2)
        .map(|i| note(&b, T0 + 200, &format!("tie{i}")))
        .collect();
    for e in by_a.iter().chain(&by_b).chain(&tie) {
        relay.publish(e.clone());
    }
    let mut c = connect(&relay);

    let got = c.req(
        "s",
        vec![
            Filter::new().author(a.public_key()).limit(3),
            Filter::new()
                .author(b.public_key())
                .kind(Kind::TextNote)
                .limit(4),
        ],
    );
    let mut expected = newest_first(tie.clone());
    expected.extend([&by_b[4], &by_b[3]].map(|e| e.clone()));
    expected.extend([&by_a[9], &by_a[8], &by_a[7]].map(|e| e.clone()));
    assert_eq!(ids(&got), ids(&expected));

    // Overlapping filters are merged without duplicates.
    let got = c.req("s2", vec![kinds(1), Filter::new().author(a.public_key())]);
    let all: Vec<Event> = by_a.iter().chain(&by_b).chain(&tie).cloned().collect();
    assert_eq!(ids(&got), ids(&newest_first(all)));

    // `since`/`until` bound the results; a zero limit returns nothing.
    let got = c.req(
        "s3",
        vec![
            kinds(1)
                .since(Timestamp::from_secs(T0 + 2))
                .until(Timestamp::from_secs(T0 + 4)),
        ],
    );
    assert_eq!(ids(&got), vec![by_a[4].id, by_a[3].id, by_a[2].id]);
    assert!(c.req("s4", vec![kinds(1).limit(0)]).is_empty());
    assert_eq!(relay.req_count(), 4);
}

#[test]
fn results_are_capped_and_until_pages_through() {
    let k = keys(3);
    let events: Vec<Event> = (0..1_200)
        .map(|i| note(&k, T0 + i, &i.to_string()))
        .collect();
    let opts = RelayOptions {
        max_results_per_req: 500,
        ..RelayOptions::default()
    };
    let relay = TestRelay::start_on(0, opts, events.clone()).unwrap();
    assert_eq!(relay.len(), 1_200);
    let mut c = connect(&relay);

    let mut seen = HashSet::new();
    let mut pages = Vec::new();
    let mut filter = kinds(1);
    loop {
        let page = c.req("page", vec![filter.clone()]);
        pages.push(page.len());
        let Some(oldest) = page.last() else { break };
        assert_eq!(ids(&page), ids(&newest_first(page.clone())));
        for e in &page {
            assert!(seen.insert(e.id), "no event twice");
        }
        filter = filter.until(oldest.created_at - 1);
    }
    assert_eq!(pages, vec![500, 500, 200, 0]);
    assert_eq!(seen.len(), 1_200);
    // The first page is the newest 500.
    assert_eq!(relay.req_count(), 4);

    // The cap applies to all filters of a REQ together.
    let half = |lo: u64, hi: u64| {
        kinds(1)
            .since(Timestamp::from_secs(T0 + lo))
            .until(Timestamp::from_secs(T0 + hi))
    };
    let got = c.req("two", vec![half(0, 399), half(800, 1_199)]);
    assert_eq!(got.len(), 500);
    assert_eq!(got[0].id, events[1_199].id);
    assert_eq!(got[399].id, events[800].id);
    assert_eq!(got[400].id, events[399].id);
    assert_eq!(got[499].id, events[300].id);
}

#[test]
fn tag_filters_match_e_and_a() {
    let relay = TestRelay::start(RelayOptions::default()).unwrap();
    let k = keys(4);
    let coord = format!("30617:{}:repo", k.public_key().to_hex());
    let repo = sign(&k, 30617, T0, vec![tag(&["d", "repo"])], "");
    let patch = sign(&k, 1617, T0 + 1, vec![tag(&["a", &coord])], "patch");
    let reply = sign(
        &k,
        1111,
        T0 + 2,
        vec![
            tag(&["E", &patch.id.to_hex()]),
            tag(&["e", &patch.id.to_hex()]),
        ],
        "reply",
    );
    let unrelated = sign(&k, 1111, T0 + 3, vec![tag(&["e", &repo.id.to_hex()])], "x");
    for e in [&repo, &patch, &reply, &unrelated] {
        relay.publish(e.clone());
    }
    let mut c = connect(&relay);

    let by_e = Filter::new().custom_tag(letter('e'), patch.id.to_hex());
    assert_eq!(ids(&c.req("e", vec![by_e])), vec![reply.id]);
    let by_a = Filter::new().custom_tag(letter('a'), coord.clone());
    assert_eq!(ids(&c.req("a", vec![by_a])), vec![patch.id]);
    let by_upper_e = Filter::new().custom_tag(letter('E'), patch.id.to_hex());
    assert_eq!(ids(&c.req("E", vec![by_upper_e])), vec![reply.id]);
    let nothing = Filter::new().custom_tag(letter('a'), "30617:x:y");
    assert!(c.req("none", vec![nothing]).is_empty());
}

#[test]
fn replacing_a_subscription_replaces_its_filters() {
    let relay = TestRelay::start(RelayOptions::default()).unwrap();
    let mut c = connect(&relay);
    let k = keys(5);
    assert!(c.req("s", vec![kinds(1)]).is_empty());
    assert!(c.req("s", vec![kinds(7)]).is_empty());
    assert_eq!(relay.subscription_count(), 1);
    let text = note(&k, T0, "not asked anymore");
    let reaction = sign(&k, 7, T0 + 1, Vec::new(), "+");
    relay.publish(text);
    relay.publish(reaction.clone());
    assert_eq!(c.live("s").id, reaction.id);
    c.assert_quiet();
}

// ---------------------------------------------------------------- live

#[test]
fn live_delivery_from_publish_and_from_other_clients() {
    let relay = TestRelay::start(RelayOptions::default()).unwrap();
    let k = keys(6);
    let old = note(&k, T0, "old");
    relay.publish(old.clone());
    let mut reader = connect(&relay);
    assert_eq!(ids(&reader.req("live", vec![kinds(1)])), vec![old.id]);

    let e1 = note(&k, T0 + 1, "from the test");
    relay.publish(e1.clone());
    assert_eq!(reader.live("live").id, e1.id);

    // An event the subscription does not ask for is not delivered: the next
    // delivery is the matching one published after it.
    relay.publish(sign(&k, 7, T0 + 2, Vec::new(), "+"));
    let e2 = note(&k, T0 + 3, "after the reaction");
    relay.publish(e2.clone());
    assert_eq!(reader.live("live").id, e2.id);

    let mut writer = connect(&relay);
    let e3 = note(&keys(7), T0 + 4, "from another client");
    assert_eq!(writer.publish(&e3), (true, String::new()));
    assert_eq!(reader.live("live").id, e3.id);

    // Publishing the same event again delivers nothing new.
    relay.publish(e3.clone());
    assert!(writer.publish(&e3).1.starts_with("duplicate:"));
    reader.assert_quiet();
}

#[test]
fn close_stops_live_delivery() {
    let relay = TestRelay::start(RelayOptions::default()).unwrap();
    let mut c = connect(&relay);
    assert!(c.req("s", vec![kinds(1)]).is_empty());
    assert_eq!(relay.subscription_count(), 1);
    c.close("s");
    wait_until("the CLOSE", || relay.subscription_count() == 0);
    relay.publish(note(&keys(8), T0, "nobody listens"));
    // A live EVENT for "s" would arrive before the probe's EOSE.
    c.assert_quiet();
    assert_eq!(relay.len(), 1);
}

// ---------------------------------------------------------------- limits

#[test]
fn subscription_limit_refused_with_closed() {
    let opts = RelayOptions {
        max_subscriptions: Some((2, Refuse::Closed)),
        ..RelayOptions::default()
    };
    let relay = TestRelay::start(opts).unwrap();
    let mut c = connect(&relay);
    c.req("a", vec![kinds(1)]);
    c.req("b", vec![kinds(1)]);
    c.send_req("c", vec![kinds(1)]);
    assert_eq!(c.recv(), json!(["CLOSED", "c", TOO_MANY_REQS]));
    assert_eq!(relay.subscription_count(), 2);

    // Reusing an open id replaces it and is not refused.
    c.req("a", vec![kinds(7)]);
    assert_eq!(relay.subscription_count(), 2);

    // The limit is per connection.
    let mut other = connect(&relay);
    other.req("c", vec![kinds(1)]);
    assert_eq!(relay.subscription_count(), 3);

    c.close("b");
    wait_until("the CLOSE", || relay.subscription_count() == 2);
    c.req("c", vec![kinds(1)]);
    assert_eq!(relay.subscription_count(), 3);
    assert_eq!(relay.req_count(), 6);
}

#[test]
fn subscription_limit_refused_with_notice() {
    let opts = RelayOptions {
        max_subscriptions: Some((1, Refuse::Notice)),
        ..RelayOptions::default()
    };
    let relay = TestRelay::start(opts).unwrap();
    let mut c = connect(&relay);
    c.req("a", vec![kinds(1)]);
    c.send_req("b", vec![kinds(1)]);
    assert_eq!(c.recv(), json!(["NOTICE", MAX_SUBS_NOTICE]));
    assert_eq!(relay.subscription_count(), 1);
    // The refused subscription gets no live events.
    let e = note(&keys(9), T0, "only for a");
    relay.publish(e.clone());
    assert_eq!(c.live("a").id, e.id);
    // Room for the probe; a delivery to "b" would have been queued already.
    c.close("a");
    wait_until("the CLOSE", || relay.subscription_count() == 0);
    c.assert_quiet();
    assert_eq!(relay.req_count(), 3);
}

// ---------------------------------------------------------------- caps in the wild

#[test]
fn per_filter_cap_returns_each_filters_newest_like_khatru() {
    let k = keys(3);
    let events: Vec<Event> = (0..300).map(|i| note(&k, T0 + i, &i.to_string())).collect();
    let opts = RelayOptions {
        max_results_per_filter: 100,
        ..RelayOptions::default()
    };
    let relay = TestRelay::start_on(0, opts, events.clone()).unwrap();
    let mut c = connect(&relay);
    // min(limit, cap): a larger limit and no limit both get the cap.
    let page = c.req("big", vec![kinds(1).limit(500)]);
    assert_eq!(ids(&page), ids(&newest_first(events.clone()))[..100]);
    assert_eq!(c.req("none", vec![kinds(1)]).len(), 100);
    assert_eq!(c.req("small", vec![kinds(1).limit(7)]).len(), 7);
    // Paging with `until` reaches everything, 100 at a time.
    let mut seen = HashSet::new();
    let mut pages = Vec::new();
    let mut filter = kinds(1).limit(500);
    loop {
        let page = c.req("page", vec![filter.clone()]);
        pages.push(page.len());
        let Some(oldest) = page.last() else { break };
        seen.extend(ids(&page));
        filter = filter.until(oldest.created_at - 1);
    }
    assert_eq!(pages, vec![100, 100, 100, 0]);
    assert_eq!(seen.len(), 300);
    // Per filter, not per REQ: two filters get up to 100 each.
    let half = |lo: u64, hi: u64| {
        kinds(1)
            .since(Timestamp::from_secs(T0 + lo))
            .until(Timestamp::from_secs(T0 + hi))
            .limit(500)
    };
    let got = c.req("two", vec![half(0, 149), half(150, 299)]);
    assert_eq!(got.len(), 200);
    assert_eq!(got[0].id, events[299].id);
    assert_eq!(got[99].id, events[200].id);
    assert_eq!(got[100].id, events[149].id);
    assert_eq!(got[199].id, events[50].id);
}

/// `n` distinct 64-hex values.
fn hex_values(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{i:064x}")).collect()
}

#[test]
fn value_caps_are_refused_like_khatru_with_a_notice_then_eose() {
    let opts = RelayOptions {
        value_caps: Some(ValueCaps::eventstore()),
        ..RelayOptions::default()
    };
    let relay = TestRelay::start(opts).unwrap();
    let k = keys(4);
    let target = hex_values(11);
    let reply = sign(
        &k,
        1111,
        T0,
        vec![tag(&["e", &target[0]]), tag(&["E", &target[6]])],
        "on 0",
    );
    let other = note(&k, T0 + 1, "kind 1");
    relay.publish(reply.clone());
    relay.publish(other.clone());
    let mut c = connect(&relay);

    // Ten tag values (all tags counted together) are fine.
    let ten = Filter::new()
        .custom_tags(letter('e'), target[..6].to_vec())
        .custom_tags(letter('E'), target[6..10].to_vec());
    assert_eq!(ids(&c.req("ten", vec![ten])), vec![reply.id]);

    // Eleven: a NOTICE with eventstore's bare error, nothing from that
    // filter, the REQ's other filters served, then EOSE as usual.
    let eleven = Filter::new().custom_tags(letter('e'), target.clone());
    c.send_req("eleven", vec![eleven.clone(), kinds(1)]);
    assert_eq!(c.recv(), json!(["NOTICE", TOO_MANY_TAG_VALUES]));
    assert_eq!(ids(&c.until_eose("eleven")), vec![other.id]);
    assert_eq!(relay.value_refusals(), 1);
    // khatru still listens on the refused filter: live events arrive.
    let live = sign(&k, 1111, T0 + 2, vec![tag(&["e", &target[10]])], "live");
    relay.publish(live.clone());
    assert_eq!(c.live("eleven").id, live.id);

    // Kinds, ids and authors, in eventstore's order and limits.
    let many_kinds = Filter::new().kinds((1..=11).map(Kind::from_u16));
    c.send_req("kinds", vec![many_kinds]);
    assert_eq!(c.recv(), json!(["NOTICE", TOO_MANY_KINDS]));
    assert!(c.until_eose("kinds").is_empty());
    let ids_of = |n: usize| {
        hex_values(n)
            .iter()
            .map(|h| EventId::from_hex(h).unwrap())
            .collect::<Vec<_>>()
    };
    assert!(
        c.req("ids500", vec![Filter::new().ids(ids_of(500))])
            .is_empty()
    );
    c.send_req("ids501", vec![Filter::new().ids(ids_of(501))]);
    assert_eq!(c.recv(), json!(["NOTICE", TOO_MANY_IDS]));
    c.until_eose("ids501");
    let authors: Vec<PublicKey> = (0..501u32)
        .map(|i| {
            Keys::new(SecretKey::from_slice(&[&[7u8; 28][..], &i.to_be_bytes()].concat()).unwrap())
                .public_key()
        })
        .collect();
    c.send_req(
        "authors",
        vec![
            Filter::new()
                .authors(authors)
                .kinds((1..=11).map(Kind::from_u16)),
        ],
    );
    assert_eq!(
        c.recv(),
        json!(["NOTICE", TOO_MANY_AUTHORS]),
        "authors are checked before kinds"
    );
    c.until_eose("authors");
    assert_eq!(relay.value_refusals(), 4);
}

#[test]
fn value_caps_refused_with_closed_serve_nothing() {
    let opts = RelayOptions {
        value_caps: Some(ValueCaps::eventstore().values(3).closed()),
        ..RelayOptions::default()
    };
    let relay = TestRelay::start(opts).unwrap();
    let other = note(&keys(5), T0, "kind 1");
    relay.publish(other.clone());
    let mut c = connect(&relay);
    let four = Filter::new().custom_tags(letter('a'), hex_values(4));
    c.send_req("four", vec![kinds(1), four]);
    assert_eq!(
        c.recv(),
        json!(["CLOSED", "four", format!("blocked: {TOO_MANY_TAG_VALUES}")])
    );
    assert_eq!(relay.subscription_count(), 0);
    // Nothing else was queued for it: the next REQ's answer comes next.
    assert_eq!(ids(&c.req("one", vec![kinds(1)])), vec![other.id]);
    c.send_req(
        "kinds",
        vec![Filter::new().kinds((1..=4).map(Kind::from_u16))],
    );
    assert_eq!(
        c.recv(),
        json!(["CLOSED", "kinds", format!("blocked: {TOO_MANY_KINDS}")])
    );
}

/// One raw HTTP/1.1 request to the relay's port; the whole response.
fn http_get(relay: &TestRelay, headers: &str) -> String {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(("127.0.0.1", relay.port())).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    write!(s, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}\r\n").unwrap();
    let mut out = String::new();
    // The relay closes after answering; a refused handshake just closes.
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn nip11_document_names_the_limits_and_websockets_still_work() {
    let opts = RelayOptions {
        max_results_per_filter: 100,
        max_subscriptions: Some((20, Refuse::Closed)),
        nip11: true,
        ..RelayOptions::default()
    };
    let relay = TestRelay::start(opts).unwrap();
    let response = http_get(&relay, "Accept: application/nostr+json\r\n");
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(
        response.contains("Content-Type: application/nostr+json"),
        "{response}"
    );
    let (_, body) = response.split_once("\r\n\r\n").unwrap();
    let doc: Value = serde_json::from_str(body).unwrap();
    assert_eq!(doc["limitation"]["max_limit"], 100);
    assert_eq!(doc["limitation"]["max_subscriptions"], 20);
    assert_eq!(body, relay.nip11_document());
    assert_eq!(relay.info_served(), 1);
    // The engine's reader takes it as the relay's limits.
    let info = grasp_sync::RelayInfo::parse(body).unwrap();
    assert_eq!(info.max_limit, Some(100));
    assert_eq!(info.max_subscriptions, Some(20));

    // A plain GET is no NIP-11 request: refused as before (no 200).
    let plain = http_get(&relay, "");
    assert!(!plain.contains("200 OK"), "{plain}");
    assert_eq!(relay.info_served(), 1);
    // Websockets work as before, on the same port.
    let mut c = connect(&relay);
    let e = note(&keys(6), T0, "hi");
    assert_eq!(c.publish(&e), (true, String::new()));
    assert_eq!(ids(&c.req("a", vec![kinds(1)])), vec![e.id]);
    // A NIP-11 request is no connection: the plain GET and the websocket are.
    assert_eq!(relay.info_requests(), 1);
    assert_eq!(relay.accepted_count(), 2);
}

#[test]
fn without_nip11_a_nostr_json_request_gets_no_document() {
    let relay = TestRelay::start(RelayOptions::default()).unwrap();
    let response = http_get(&relay, "Accept: application/nostr+json\r\n");
    assert!(!response.contains("200 OK"), "{response}");
    assert_eq!(relay.info_served(), 0);
    assert_eq!(relay.info_requests(), 1);
    assert_eq!(
        relay.accepted_count(),
        0,
        "a NIP-11 request is no connection"
    );
    // The document it would serve still says "no caps".
    let doc: Value = serde_json::from_str(&relay.nip11_document()).unwrap();
    assert!(doc["limitation"].get("max_limit").is_none(), "{doc}");
}

// ---------------------------------------------------------------- robustness

#[test]
fn garbage_gets_a_notice_and_the_connection_survives() {
    let relay = TestRelay::start(RelayOptions::default()).unwrap();
    let mut c = connect(&relay);
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

    let e = note(&keys(10), T0, "still works");
    assert_eq!(c.publish(&e), (true, String::new()));
    assert_eq!(ids(&c.req("s", vec![kinds(1)])), vec![e.id]);
    assert_eq!(relay.connection_count(), 1);
}

#[test]
fn connection_count_follows_clients() {
    let relay = TestRelay::start(RelayOptions::default()).unwrap();
    assert_eq!(relay.connection_count(), 0);
    let mut a = connect(&relay);
    let b = connect(&relay);
    assert_eq!(relay.connection_count(), 2);
    a.ws.close(None).unwrap();
    // The close handshake completes and the relay drops the connection.
    while a.ws.read().is_ok() {}
    wait_until("one connection", || relay.connection_count() == 1);
    drop(b);
    wait_until("no connection", || relay.connection_count() == 0);
}

#[test]
fn drop_connections_cuts_clients_and_keeps_accepting() {
    let relay = TestRelay::start(RelayOptions::default()).unwrap();
    let mut a = connect(&relay);
    let mut b = connect(&relay);
    a.req("s", vec![kinds(1)]);
    assert_eq!(relay.connection_count(), 2);

    relay.drop_connections();
    assert_eq!(relay.connection_count(), 0);
    assert_eq!(relay.subscription_count(), 0);
    for c in [&mut a, &mut b] {
        let err = c.ws.read().expect_err("the connection is cut");
        assert!(!is_timeout(&err), "cut, not silent: {err}");
    }

    let mut c = connect(&relay);
    let e = note(&keys(11), T0, "after the cut");
    assert_eq!(c.publish(&e), (true, String::new()));
    assert_eq!(ids(&c.req("s", vec![kinds(1)])), vec![e.id]);
    assert_eq!(relay.connection_count(), 1);
}

#[test]
fn stop_then_start_on_the_same_port_serves_the_old_store() {
    let relay = TestRelay::start(RelayOptions::default()).unwrap();
    let port = relay.port();
    assert_eq!(relay.url(), format!("ws://127.0.0.1:{port}"));
    let mut c = connect(&relay);
    let e = note(&keys(12), T0, "survives restarts");
    assert_eq!(c.publish(&e), (true, String::new()));
    c.req("s", vec![kinds(1)]);

    let store = relay.stop();
    assert_eq!(ids(&store), vec![e.id]);
    let err = c.ws.read().expect_err("stop cuts the connection");
    assert!(!is_timeout(&err), "{err}");

    // Right away, with the old connection's socket in TIME_WAIT.
    let relay = TestRelay::start_on(port, RelayOptions::default(), store).unwrap();
    assert_eq!(relay.port(), port);
    assert_eq!(relay.req_count(), 0);
    let mut c = connect(&relay);
    assert_eq!(ids(&c.req("s", vec![kinds(1)])), vec![e.id]);
}

#[test]
fn drop_stops_the_relay() {
    let relay = TestRelay::start(RelayOptions::default()).unwrap();
    let port = relay.port();
    let mut c = connect(&relay);
    c.req("s", vec![kinds(1)]);
    drop(relay);
    let err = c.ws.read().expect_err("drop cuts the connection");
    assert!(!is_timeout(&err), "{err}");
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

// ---------------------------------------------------------------- TLS

use grasp_sync::testing::cert::{CA_PEM, LEAF_KEY_PEM, LEAF_PEM};

type TlsClient = Client<StreamOwned<ClientConnection, TcpStream>>;

fn connect_tls(relay: &TestRelay) -> TlsClient {
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
    let tcp = TcpStream::connect(("127.0.0.1", relay.port())).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = ClientConnection::new(Arc::new(config), name).unwrap();
    let (ws, _) = tungstenite::client(relay.url(), StreamOwned::new(tls, tcp))
        .expect("wss handshake with a trusted localhost certificate");
    Client { ws }
}

#[test]
fn tls_relay_serves_wss() {
    let chain = format!("{LEAF_PEM}{CA_PEM}");
    let opts = RelayOptions {
        tls: Some(server_tls_config(chain.as_bytes(), LEAF_KEY_PEM.as_bytes()).unwrap()),
        ..RelayOptions::default()
    };
    let relay = TestRelay::start(opts).unwrap();
    assert_eq!(relay.url(), format!("wss://localhost:{}", relay.port()));

    let mut reader = connect_tls(&relay);
    assert!(reader.req("s", vec![kinds(1)]).is_empty());
    let mut writer = connect_tls(&relay);
    let e = note(&keys(13), T0, "over TLS");
    assert_eq!(writer.publish(&e), (true, String::new()));
    assert_eq!(reader.live("s").id, e.id);
    assert_eq!(relay.connection_count(), 2);

    // A plain websocket client does not get through.
    let plain = tungstenite::connect(format!("ws://127.0.0.1:{}", relay.port()));
    assert!(plain.is_err());

    relay.drop_connections();
    let err = reader.ws.read().expect_err("cut");
    assert!(!is_timeout(&err), "{err}");
    let mut again = connect_tls(&relay);
    assert_eq!(ids(&again.req("s", vec![kinds(1)])), vec![e.id]);
}

#[test]
fn tls_config_rejects_bad_pem() {
    assert!(server_tls_config(b"not a cert", LEAF_KEY_PEM.as_bytes()).is_err());
    assert!(server_tls_config(LEAF_PEM.as_bytes(), b"not a key").is_err());
}
