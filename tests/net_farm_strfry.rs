//! The relay farm's strfry relays (`RelayProfile::strfry`) over real
//! loopback sockets: a raw websocket client sees strfry f8a56a8's limits
//! and exact texts, row by row of what strfry does differently from the
//! farm's default relay.

mod support;

use std::net::TcpStream;

use grasp_sync::testing::farm::{FarmOptions, RelayFarm, RelayProfile, StrfryLimits};
use nostr::prelude::*;
use serde_json::{Value, json};
use support::client::{Client, connect, http_get, ids, kinds, letter, note, wait_until};
use support::{T0, keys, sign, tag};
use tungstenite::Message;
use tungstenite::stream::MaybeTlsStream;

type PlainClient = Client<MaybeTlsStream<TcpStream>>;

/// One strfry relay with `limits`, NIP-77 off farm-wide (strfry speaks it
/// regardless).
fn strfry_farm(limits: StrfryLimits) -> RelayFarm {
    let profile = RelayProfile {
        strfry: Some(limits),
        ..RelayProfile::strfry()
    };
    let opts = FarmOptions {
        profiles: vec![(0, profile)],
        ..FarmOptions::default()
    };
    RelayFarm::start(1, opts).expect("farm starts")
}

fn default_farm() -> RelayFarm {
    strfry_farm(StrfryLimits::default())
}

fn now() -> u64 {
    Timestamp::now().as_secs()
}

/// `["REQ", sub, filters...]` as raw JSON.
fn raw_req(sub: &str, filters: Vec<Value>) -> String {
    let mut msg = vec![json!("REQ"), json!(sub)];
    msg.extend(filters);
    Value::Array(msg).to_string()
}

/// Sends a raw REQ; asserts it is refused with exactly `reason`.
fn assert_closed(c: &mut PlainClient, filters: Vec<Value>, reason: &str) {
    c.send(raw_req("s", filters));
    assert_eq!(c.recv(), json!(["CLOSED", "s", reason]));
}

/// Sends a raw REQ; asserts it is served (EOSE after its events).
fn assert_served(c: &mut PlainClient, filters: Vec<Value>) -> Vec<Event> {
    c.send(raw_req("ok", filters));
    c.until_eose("ok")
}

/// An initial negentropy message for an empty set (as the other farm tests
/// send it).
const NEG_INITIAL: &str = "6100000200";

fn neg_open(sub: &str) -> String {
    json!(["NEG-OPEN", sub, {"kinds": [1]}, NEG_INITIAL]).to_string()
}

// ---------------------------------------------------------------- results

#[test]
fn a_limit_over_500_is_clamped_to_500_silently() {
    let farm = default_farm();
    let k = keys(3);
    let events: Vec<Event> = (0..600).map(|i| note(&k, T0 + i, &i.to_string())).collect();
    farm.seed(0, events.clone());
    let mut c = connect(&farm.url(0));
    // until_eose fails on anything but events and EOSE: no NOTICE, no CLOSED.
    let page = c.req("a", vec![kinds(1).limit(1000)]);
    assert_eq!(page.len(), 500);
    assert_eq!(page[0].id, events[599].id, "newest first");
    assert_eq!(page[499].id, events[100].id);
    assert_eq!(c.req("b", vec![kinds(1)]).len(), 500, "no limit is 500 too");
    assert_eq!(c.req("c", vec![kinds(1).limit(7)]).len(), 7);
    assert_eq!(farm.stats().capped_filters, 2);
}

#[test]
fn filters_are_answered_in_turn_and_a_shared_event_counts_toward_both() {
    let farm = default_farm();
    let k = keys(3);
    let events: Vec<Event> = (0..10)
        .map(|i| {
            let t = if i < 5 { "old" } else { "new" };
            sign(&k, 1, T0 + i, vec![tag(&["t", t])], &i.to_string())
        })
        .collect();
    farm.seed(0, events.clone());
    let mut c = connect(&farm.url(0));
    let e = |i: usize| events[i].id;

    // The first filter's events first, though older: no merge by time.
    let old = Filter::new().hashtag("old").limit(2);
    let got = c.req("a", vec![old, kinds(1).limit(3)]);
    assert_eq!(ids(&got), [e(4), e(3), e(9), e(8), e(7)]);

    // The second filter's 5 include the first's 3, sent once: 5 in all.
    let got = c.req("b", vec![kinds(1).limit(3), kinds(1).limit(5)]);
    assert_eq!(ids(&got), [e(9), e(8), e(7), e(6), e(5)]);
}

#[test]
fn since_and_until_are_inclusive() {
    let farm = default_farm();
    let k = keys(3);
    let events: Vec<Event> = (0..3).map(|i| note(&k, T0 + i, &i.to_string())).collect();
    farm.seed(0, events.clone());
    let mut c = connect(&farm.url(0));
    let at = |t: u64| Timestamp::from_secs(t);
    let one = c.req("a", vec![kinds(1).since(at(T0 + 1)).until(at(T0 + 1))]);
    assert_eq!(ids(&one), [events[1].id]);
    let all = c.req("b", vec![kinds(1).since(at(T0)).until(at(T0 + 2))]);
    assert_eq!(all.len(), 3);
}

// ---------------------------------------------------------------- filters

#[test]
fn more_than_200_filters_are_refused_with_arr_too_big() {
    let farm = default_farm();
    let mut c = connect(&farm.url(0));
    let filter = json!({"kinds": [1]});
    assert_closed(
        &mut c,
        vec![filter.clone(); 201],
        "ERROR: bad req: arr too big",
    );
    assert!(assert_served(&mut c, vec![filter; 200]).is_empty());
}

#[test]
fn more_than_3_tag_letters_in_a_filter_are_refused() {
    let farm = default_farm();
    let mut c = connect(&farm.url(0));
    let four = json!({"#a": ["x"], "#b": ["x"], "#c": ["x"], "#d": ["x"]});
    assert_closed(
        &mut c,
        vec![four],
        "ERROR: bad req: too many tags in filter",
    );
    let three = json!({"#a": ["x"], "#b": ["x"], "#c": ["x"]});
    assert!(assert_served(&mut c, vec![three]).is_empty());
}

#[test]
fn a_tag_value_over_255_bytes_refuses_the_whole_req() {
    let farm = default_farm();
    let k = keys(3);
    farm.seed(0, vec![note(&k, T0, "x")]);
    let mut c = connect(&farm.url(0));
    let long = "x".repeat(256);
    assert_closed(
        &mut c,
        vec![json!({"#a": [long]})],
        "ERROR: bad req: error parsing #a: filter item too large",
    );
    // One bad filter refuses the others: no event, no EOSE, the CLOSED
    // names the offending letter.
    assert_closed(
        &mut c,
        vec![json!({"kinds": [1]}), json!({"#t": ["ok", long]})],
        "ERROR: bad req: error parsing #t: filter item too large",
    );
    assert!(assert_served(&mut c, vec![json!({"#a": ["x".repeat(255)]})]).is_empty());
}

#[test]
fn e_and_p_values_must_be_64_hex_digits() {
    let farm = default_farm();
    let mut c = connect(&farm.url(0));
    let e = |v: String| vec![json!({ "#e": [v] })];
    // 63 digits: strfry's hex decoder refuses an odd count before the size
    // is checked.
    assert_closed(
        &mut c,
        e("a".repeat(63)),
        "ERROR: bad req: error parsing #e: uneven size input to from_hex",
    );
    assert_closed(
        &mut c,
        e("a".repeat(62)),
        "ERROR: bad req: error parsing #e: filter item too small",
    );
    assert_closed(
        &mut c,
        e("a".repeat(66)),
        "ERROR: bad req: error parsing #e: filter item too large",
    );
    assert_closed(
        &mut c,
        vec![json!({"#p": ["z".repeat(64)]})],
        "ERROR: bad req: error parsing #p: unexpected character in from_hex: 122",
    );
    assert!(assert_served(&mut c, e("a".repeat(64))).is_empty());
}

#[test]
fn an_event_with_a_tag_value_over_255_bytes_is_stored_but_not_found_by_it() {
    let farm = default_farm();
    let k = keys(3);
    let long = "x".repeat(300);
    let event = sign(&k, 1, now(), vec![tag(&["a", &long])], "long a");
    let mut c = connect(&farm.url(0));
    assert_eq!(c.publish(&event), (true, String::new()));
    assert_eq!(ids(&c.req("k", vec![kinds(1)])), [event.id]);
    // Its first 255 bytes are another value; the value itself cannot be
    // asked for.
    let prefix = Filter::new().custom_tag(letter('a'), &long[..255]);
    assert!(c.req("p", vec![prefix]).is_empty());
    assert_closed(
        &mut c,
        vec![json!({ "#a": [long] })],
        "ERROR: bad req: error parsing #a: filter item too large",
    );
}

#[test]
fn a_filter_on_a_tag_that_is_no_letter_matches_nothing() {
    let farm = default_farm();
    farm.seed(0, vec![note(&keys(3), T0, "x")]);
    let mut c = connect(&farm.url(0));
    // nostr's Filter would drop the condition and match everything.
    assert!(assert_served(&mut c, vec![json!({"#1": ["x"]})]).is_empty());
    assert_eq!(assert_served(&mut c, vec![json!({"kinds": [1]})]).len(), 1);
}

// ---------------------------------------------------------------- subscriptions

#[test]
fn live_reqs_over_the_limit_are_refused_after_their_eose() {
    let farm = strfry_farm(StrfryLimits {
        max_subscriptions: 2,
        ..StrfryLimits::default()
    });
    let k = keys(3);
    farm.seed(0, vec![note(&k, T0, "stored")]);
    let mut c = connect(&farm.url(0));
    assert_eq!(c.req("l1", vec![kinds(1)]).len(), 1);
    assert_eq!(c.req("l2", vec![kinds(1)]).len(), 1);
    // The third is served up to its EOSE, then refused going live.
    assert_eq!(c.req("l3", vec![kinds(1)]).len(), 1);
    assert_eq!(
        c.recv(),
        json!(["NOTICE", "ERROR: too many concurrent REQs"])
    );

    // A new event reaches l1 and l2 only; the OK comes after deliveries.
    let live_event = |c: &mut PlainClient, content: &str| {
        let event = note(&k, now(), content);
        c.send(ClientMessage::event(event.clone()).as_json());
        let mut subs = Vec::new();
        loop {
            let msg = c.recv();
            match msg[0].as_str() {
                Some("EVENT") => subs.push(msg[1].as_str().unwrap().to_owned()),
                Some("OK") => {
                    assert_eq!(msg[2], true, "{msg}");
                    break;
                }
                _ => panic!("unexpected {msg}"),
            }
        }
        subs.sort();
        subs
    };
    assert_eq!(live_event(&mut c, "one"), ["l1", "l2"]);

    // Closing one makes room; reusing an open id replaces it.
    c.close("l1");
    assert_eq!(c.req("l4", vec![kinds(1)]).len(), 2);
    assert_eq!(c.req("l2", vec![kinds(1)]).len(), 2);
    assert_eq!(live_event(&mut c, "two"), ["l2", "l4"]);
}

#[test]
fn reqs_still_scanning_over_the_limit_are_refused() {
    let farm = strfry_farm(StrfryLimits {
        max_subscriptions: 2,
        ..StrfryLimits::default()
    });
    let k = keys(3);
    // 30 MB of stored answer: far more than loopback socket buffers hold
    // for a client that does not read (about 4 MB with Linux defaults), so
    // the first REQ is still scanning (its EOSE unsent) when the others
    // arrive.
    let filler = "x".repeat(60_000);
    let big: Vec<Event> = (0..500)
        .map(|i| note(&k, T0 + i, &format!("{i} {filler}")))
        .collect();
    farm.seed(0, big);
    let mut c = connect(&farm.url(0));
    c.send_req("big", vec![kinds(1).limit(500)]);
    c.send_req("s2", vec![kinds(7)]);
    c.send_req("s3", vec![kinds(7)]);
    // Not reading until the relay has taken all three keeps the first
    // answer stuck in the socket (a reading client could drain it before
    // the relay gets to the second REQ).
    wait_until("the relay read 3 REQs", || farm.stats().reqs >= 3);
    // Read raw: the events need no checking here.
    let mut events = 0;
    let rest = loop {
        let msg = c.recv();
        if msg[0] == "EVENT" && msg[1] == "big" {
            events += 1;
        } else {
            break msg;
        }
    };
    assert_eq!(events, 500);
    assert_eq!(rest, json!(["EOSE", "big"]));
    assert_eq!(c.recv(), json!(["EOSE", "s2"]));
    assert_eq!(
        c.recv(),
        json!(["NOTICE", "ERROR: too many concurrent REQs"])
    );
    // s3 was never opened: a closed filter over kind 7 gets only the OK.
    let seven = sign(&k, 7, now(), vec![], "seven");
    c.send(ClientMessage::event(seven.clone()).as_json());
    let msg = c.recv();
    assert_eq!(msg[0], "EVENT", "{msg}");
    assert_eq!(msg[1], "s2", "{msg}");
    assert_eq!(c.recv(), json!(["OK", seven.id.to_hex(), true, ""]));
}

#[test]
fn nip77_sessions_over_the_limit_are_refused_and_counted_apart_from_reqs() {
    let farm = strfry_farm(StrfryLimits {
        max_subscriptions: 2,
        ..StrfryLimits::default()
    });
    let mut c = connect(&farm.url(0));
    // Two live REQs do not count against sessions.
    assert!(c.req("l1", vec![kinds(1)]).is_empty());
    assert!(c.req("l2", vec![kinds(1)]).is_empty());
    for sub in ["n1", "n2"] {
        c.send(neg_open(sub));
        let reply = c.recv();
        assert_eq!((&reply[0], &reply[1]), (&json!("NEG-MSG"), &json!(sub)));
    }
    c.send(neg_open("n3"));
    assert_eq!(
        c.recv(),
        json!(["NOTICE", "ERROR: too many concurrent NEG requests"])
    );
    // Reopening an open session replaces it; closing one makes room.
    c.send(neg_open("n2"));
    assert_eq!(c.recv()[0], "NEG-MSG");
    c.send(json!(["NEG-CLOSE", "n1"]).to_string());
    c.send(neg_open("n3"));
    let reply = c.recv();
    assert_eq!((&reply[0], &reply[1]), (&json!("NEG-MSG"), &json!("n3")));
    // Sessions do not count against REQs either (l2 is replaced).
    assert!(c.req("l2", vec![kinds(2)]).is_empty());
    c.send(json!(["NEG-MSG", "gone", NEG_INITIAL]).to_string());
    assert_eq!(
        c.recv(),
        json!(["NEG-ERR", "gone", "closed: unknown subscription handle"])
    );
}

#[test]
fn negentropy_over_max_sync_events_is_blocked() {
    let farm = strfry_farm(StrfryLimits {
        max_sync_events: 3,
        ..StrfryLimits::default()
    });
    let k = keys(3);
    let mut events: Vec<Event> = (0..3).map(|i| note(&k, T0 + i, &i.to_string())).collect();
    events.push(sign(&k, 2, T0, vec![], "kind 2"));
    farm.seed(0, events);
    let mut c = connect(&farm.url(0));
    c.send(json!(["NEG-OPEN", "all", {}, NEG_INITIAL]).to_string());
    assert_eq!(
        c.recv(),
        json!(["NEG-ERR", "all", "blocked: too many query results", 3])
    );
    c.send(neg_open("three"));
    assert_eq!(c.recv()[0], "NEG-MSG");
    assert_eq!(farm.stats().neg_sessions, 1);
}

// ---------------------------------------------------------------- texts

#[test]
fn every_closed_and_notice_text_starts_with_error() {
    let farm = default_farm();
    let mut c = connect(&farm.url(0));
    let notice = |c: &mut PlainClient, msg: &str, text: &str| {
        c.send(msg);
        assert_eq!(c.recv(), json!(["NOTICE", text]), "{msg}");
    };
    notice(&mut c, "hello", "ERROR: bad msg: unparseable message");
    notice(&mut c, r#"["HELLO", 1]"#, "ERROR: bad msg: unknown cmd");
    notice(
        &mut c,
        r#"["REQ"]"#,
        "ERROR: bad msg: too few array elements",
    );
    notice(&mut c, r#"["REQ", "s"]"#, "ERROR: bad req: arr too small");
    notice(
        &mut c,
        r#"["CLOSE", "s", 1]"#,
        "ERROR: bad close: arr too small/big",
    );
    notice(
        &mut c,
        r##"["NEG-OPEN", "n", {"#e": ["00"]}, "61"]"##,
        "ERROR: negentropy error: error parsing #e: filter item too small",
    );
    let long_id = "s".repeat(65);
    c.send(raw_req(&long_id, vec![json!({})]));
    assert_eq!(
        c.recv(),
        json!([
            "CLOSED",
            long_id,
            "ERROR: bad req: invalid subscription id length"
        ])
    );
    assert_closed(
        &mut c,
        vec![json!({"search": "x"})],
        "ERROR: bad req: unrecognised filter item: search",
    );
    // Binary frames are read as text.
    c.ws.send(Message::binary(b"nope".to_vec())).unwrap();
    assert_eq!(
        c.recv(),
        json!(["NOTICE", "ERROR: bad msg: unparseable message"])
    );
    c.send(r#"["COUNT", "n", {"kinds": [1]}]"#);
    assert_eq!(c.recv(), json!(["COUNT", "n", {"count": 0}]));
}

#[test]
fn reads_before_auth_are_refused_in_strfrys_words() {
    let opts = FarmOptions {
        profiles: vec![(0, RelayProfile::strfry())],
        auth_required: vec![0],
        ..FarmOptions::default()
    };
    let farm = RelayFarm::start(1, opts).expect("farm starts");
    let mut c = connect(&farm.url(0));
    assert_eq!(c.recv()[0], "AUTH");
    c.send_req("s", vec![kinds(1)]);
    let reason = "auth-required: requested filter requires authentication";
    assert_eq!(c.recv(), json!(["CLOSED", "s", format!("ERROR: {reason}")]));
    c.send(neg_open("n"));
    assert_eq!(c.recv(), json!(["NEG-ERR", "n", reason]));
    assert_eq!(farm.stats().auth_refusals, 2);
}

// ---------------------------------------------------------------- size

#[test]
fn a_frame_over_131072_bytes_drops_the_connection() {
    let farm = default_farm();
    let mut c = connect(&farm.url(0));
    // Exactly the limit, padded with JSON whitespace: served.
    let req = raw_req("fits", vec![json!({"kinds": [1]})]);
    let exact = format!("{req}{}", " ".repeat(131_072 - req.len()));
    assert_eq!(exact.len(), 131_072);
    c.send(exact);
    assert!(c.until_eose("fits").is_empty());
    // One byte more: the connection is dropped (the write itself may fail
    // once the relay has gone).
    let over = format!("{req}{}", " ".repeat(131_073 - req.len()));
    let _ = c.ws.send(Message::text(over));
    c.assert_cut();
}

// ---------------------------------------------------------------- writes

#[test]
fn events_too_large_too_early_or_too_late_get_ok_false() {
    let farm = default_farm();
    let k = keys(3);
    let mut c = connect(&farm.url(0));
    let large = note(&k, now(), &"x".repeat(70_000));
    let size = large.as_json().len();
    assert_eq!(
        c.publish(&large),
        (false, format!("invalid: event too large: {size}"))
    );
    let three_years = 94_608_000;
    let early = note(&k, now() - three_years - 60, "early");
    assert_eq!(
        c.publish(&early),
        (false, "invalid: created_at too early".to_owned())
    );
    let late = note(&k, now() + 900 + 60, "late");
    assert_eq!(
        c.publish(&late),
        (false, "invalid: created_at too late".to_owned())
    );
    let fine = note(&k, now(), "fine");
    assert_eq!(c.publish(&fine), (true, String::new()));
    assert_eq!(
        c.publish(&fine),
        (true, "duplicate: have this event".to_owned())
    );
    assert_eq!(
        farm.count_present(0, &[large.id, early.id, late.id, fine.id]),
        1
    );
}

// ---------------------------------------------------------------- NIP-11

#[test]
fn nip11_is_strfrys_document_for_the_exact_accept_only() {
    let farm = default_farm();
    let response = http_get(farm.port(0), "Accept: application/nostr+json\r\n");
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.contains("\r\nServer: strfry\r\n"), "{response}");
    let (_, body) = response.split_once("\r\n\r\n").unwrap();
    let doc: Value = serde_json::from_str(body).unwrap();
    assert_eq!(
        doc["limitation"],
        json!({"max_limit": 500, "max_message_length": 131_072, "max_subscriptions": 200})
    );
    assert_eq!(doc["negentropy"], 1);
    assert_eq!(doc["software"], "git+https://github.com/hoytech/strfry.git");
    assert_eq!(farm.stats().info_served, 1);

    // Any other Accept gets the landing page, not the document.
    for headers in [
        "Accept: application/nostr+json, */*\r\n",
        "Accept: application/nostr+json; q=1\r\n",
        "",
    ] {
        let page = http_get(farm.port(0), headers);
        assert!(
            page.contains("Content-Type: text/html"),
            "{headers}: {page}"
        );
        assert!(!page.contains("max_limit"), "{headers}: {page}");
    }
    assert_eq!(farm.stats().info_served, 1);
    // Websockets still work on the same port.
    let mut c = connect(&farm.url(0));
    assert!(c.req("s", vec![kinds(1)]).is_empty());
}
