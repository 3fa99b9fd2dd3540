//! NIP-77 against relays nobody here wrote: rust-nostr's LocalRelay
//! (nostr-sdk 0.45.1 wheel) reconciles with [`Reconciliation`] over a plain
//! websocket, and nostr-rs-relay 0.8.12, which lacks NIP-77, answers
//! `NEG-OPEN` in words [`means_unsupported`] reads as no support.

mod support;

use std::net::TcpStream;
use std::time::Duration;

use grasp_sync::internal::{Reconciliation, Step, means_unsupported};
use nostr::prelude::*;
use support::real::{PyRelay, RsRelay, publish};
use support::*;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// A websocket that fails a read after 10 s rather than hanging the test.
fn connect(url: &str) -> WebSocket<MaybeTlsStream<TcpStream>> {
    let (ws, _) = tungstenite::connect(url).unwrap();
    if let MaybeTlsStream::Plain(tcp) = ws.get_ref() {
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    }
    ws
}

/// The next text frame as a relay message.
fn next_message(ws: &mut WebSocket<MaybeTlsStream<TcpStream>>) -> RelayMessage<'static> {
    loop {
        if let Message::Text(text) = ws.read().unwrap() {
            return RelayMessage::from_json(text.as_str()).unwrap();
        }
    }
}

/// Runs one reconciliation over `url`; returns the need set and the rounds.
fn reconcile(
    url: &str,
    filter: &Filter,
    local: &[(EventId, Timestamp)],
    limit: usize,
) -> (Vec<EventId>, usize) {
    let mut ws = connect(url);
    let (mut recon, open) =
        Reconciliation::start("neg", filter, local.iter().copied(), limit).unwrap();
    assert!(open.len() <= limit);
    ws.send(Message::text(open)).unwrap();
    let mut rounds = 0;
    loop {
        let message = next_message(&mut ws);
        rounds += 1;
        match recon.handle(&message) {
            Some(Step::Send(text)) => {
                assert!(text.len() <= limit, "{} bytes", text.len());
                ws.send(Message::text(text)).unwrap();
            }
            Some(Step::Done { need, close }) => {
                ws.send(Message::text(close)).unwrap();
                return (need, rounds);
            }
            Some(Step::Failed { reason, .. }) => panic!("reconciliation failed: {reason}"),
            None => panic!("unexpected message: {}", message.as_json()),
        }
    }
}

#[test]
fn local_relay_reports_exactly_what_we_lack() {
    let relay = PyRelay::start();
    let author = keys(1);
    let patches: Vec<Event> = (0..1_000)
        .map(|i| sign(&author, 1617, T0 + i / 3, vec![], &format!("patch {i}")))
        .collect();
    // Outside the filter: present on the relay, never needed.
    let notes: Vec<Event> = (0..50)
        .map(|i| sign(&author, 1, T0 + i, vec![], &format!("note {i}")))
        .collect();
    relay.publish(&patches);
    relay.publish(&notes);

    let missing: Vec<EventId> = patches.iter().step_by(10).map(|e| e.id).collect();
    let local_only =
        (0..20u8).map(|i| (EventId::from_byte_array([i; 32]), Timestamp::from_secs(T0)));
    let local: Vec<(EventId, Timestamp)> = patches
        .iter()
        .filter(|e| !missing.contains(&e.id))
        .map(|e| (e.id, e.created_at))
        .chain(local_only)
        .collect();
    let mut expected = missing;
    expected.sort_unstable();

    let filter = Filter::new()
        .author(author.public_key())
        .kind(Kind::from_u16(1617));
    let (need, rounds) = reconcile(&relay.url, &filter, &local, 60_000);
    assert_eq!(need, expected);
    // A small limit cuts our frames, so the same sync takes more rounds.
    let (need, small_rounds) = reconcile(&relay.url, &filter, &local, 9_000);
    assert_eq!(need, expected);
    assert!(small_rounds > rounds, "{small_rounds} vs {rounds} rounds");
    let (need, _) = reconcile(&relay.url, &filter, &[], 60_000);
    assert_eq!(need.len(), patches.len());
}

#[test]
#[ignore = "needs nostr-rs-relay 0.8.12: .ci/run installs it"]
fn nostr_rs_relay_answers_neg_open_with_a_notice_meaning_unsupported() {
    let relay = RsRelay::start();
    publish(&relay.url, &[sign(&keys(1), 1617, T0, vec![], "patch")]);
    let filter = Filter::new().kind(Kind::from_u16(1617));
    let (_, open) = Reconciliation::start("neg", &filter, [], 60_000).unwrap();
    let mut ws = connect(&relay.url);
    ws.send(Message::text(open)).unwrap();
    match next_message(&mut ws) {
        RelayMessage::Notice(text) => assert!(means_unsupported(&text), "{text}"),
        other => panic!("expected a NOTICE, got {}", other.as_json()),
    }
}
