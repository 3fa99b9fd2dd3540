//! The relay farm's per-relay limits (`RelayProfile`, as the demo's capped
//! relays use them) over real loopback sockets: a per-filter result cap,
//! eventstore's value caps refused the way khatru refuses them, a NIP-11
//! document on the same port, and NIP-77 switched off for one relay.

mod support;

use grasp_sync::testing::farm::{FarmOptions, RelayFarm, RelayProfile};
use grasp_sync::testing::limits::{TOO_MANY_TAG_VALUES, ValueCaps};
use nostr::prelude::*;
use serde_json::{Value, json};
use support::client::{connect, http_get, ids, kinds, letter, note};
use support::{T0, keys};

#[test]
fn a_profiled_relay_caps_refuses_and_publishes_nip11_and_the_others_do_not() {
    let profile = RelayProfile {
        max_results_per_filter: Some(100),
        value_caps: Some(ValueCaps::eventstore()),
        nip11: true,
        no_negentropy: true,
        ..RelayProfile::default()
    };
    let farm = RelayFarm::start(
        2,
        FarmOptions {
            negentropy: true,
            profiles: vec![(1, profile)],
            ..FarmOptions::default()
        },
    )
    .unwrap();
    let k = keys(3);
    let events: Vec<Event> = (0..150).map(|i| note(&k, T0 + i, &i.to_string())).collect();
    farm.seed(0, events.clone());
    farm.seed(1, events.clone());

    // Per filter: the capped relay returns the newest 100 of 150 whatever
    // the limit; the other all 150.
    let mut capped = connect(&farm.url(1));
    let page = capped.req("a", vec![kinds(1).limit(500)]);
    assert_eq!(page.len(), 100);
    assert_eq!(page[0].id, events[149].id);
    assert_eq!(page[99].id, events[50].id);
    let two = capped.req("b", vec![kinds(1).limit(500), kinds(1).limit(500)]);
    assert_eq!(ids(&two), ids(&page), "two equal filters, each capped");
    let mut open = connect(&farm.url(0));
    assert_eq!(open.req("a", vec![kinds(1).limit(500)]).len(), 150);
    assert!(farm.stats().capped_filters >= 2);

    // Eleven tag values: khatru's NOTICE, the other filter served, EOSE.
    let values: Vec<String> = (0..11).map(|i| format!("{i:064x}")).collect();
    let wide = Filter::new().custom_tags(letter('e'), values.clone());
    capped.send_req("c", vec![wide.clone(), kinds(1).limit(3)]);
    assert_eq!(capped.recv(), json!(["NOTICE", TOO_MANY_TAG_VALUES]));
    assert_eq!(capped.until_eose("c").len(), 3);
    assert!(open.req("c", vec![wide]).is_empty(), "no caps on relay 0");
    assert_eq!(farm.stats().value_refusals, 1);

    // NIP-77: relay 1 says it does not speak it; relay 0 answers.
    let neg_open = |sub: &str| json!(["NEG-OPEN", sub, {"kinds": [1]}, "6100000200"]).to_string();
    capped.send(neg_open("n"));
    let reply = capped.recv();
    assert_eq!(reply[0], "NOTICE", "{reply}");
    open.send(neg_open("n"));
    let reply = open.recv();
    assert_eq!(reply[0], "NEG-MSG", "{reply}");

    // NIP-11 on relay 1's port, naming the cap; relay 0 serves none.
    let response = http_get(farm.port(1), "Accept: application/nostr+json\r\n");
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    let (_, body) = response.split_once("\r\n\r\n").unwrap();
    let doc: Value = serde_json::from_str(body).unwrap();
    assert_eq!(doc["limitation"]["max_limit"], 100);
    let plain = http_get(farm.port(1), "");
    assert!(!plain.contains("200 OK"), "{plain}");
    let none = http_get(farm.port(0), "Accept: application/nostr+json\r\n");
    assert!(!none.contains("200 OK"), "{none}");
    assert_eq!(farm.stats().info_served, 1);
    // Websockets still work on the relay serving NIP-11.
    let mut again = connect(&farm.url(1));
    assert_eq!(again.req("d", vec![kinds(1).limit(5)]).len(), 5);
}

/// The own-relay fault of `demo --chaos`: an event over `max_event_bytes`
/// gets a size NOTICE and no OK (nostr-rs-relay); smaller ones are stored.
#[test]
fn a_relay_with_an_event_size_limit_answers_larger_events_with_a_notice_only() {
    let profile = RelayProfile {
        max_event_bytes: Some(1_000),
        ..RelayProfile::default()
    };
    let farm = RelayFarm::start(
        1,
        FarmOptions {
            profiles: vec![(0, profile)],
            ..FarmOptions::default()
        },
    )
    .unwrap();
    let k = keys(3);
    let mut client = connect(&farm.url(0));
    client.send(ClientMessage::event(note(&k, T0, &"x".repeat(2_000))).as_json());
    assert_eq!(
        client.recv(),
        json!(["NOTICE", "error: event exceeded max size"])
    );
    let small = note(&k, T0, "small");
    assert!(client.publish(&small).0, "the next event is taken");
    assert_eq!(farm.stats().events_too_large, 1);
}
