//! The inbound path for one `EVENT` message on a live subscription.
//!
//! An engine with one connected remote relay: a repo announced on it
//! (`handle_local_event`), the batch window closed, the relay connected, and
//! every REQ answered with EOSE, so the repo's `#A` filter is an open live
//! subscription. Then:
//!
//! - `fresh_event`: `handle_message` with an event never seen before (a pool
//!   of signed kind-1111 events tagging the repo with `A`, cycled; the
//!   engine is rebuilt untimed whenever the pool runs out), plus draining
//!   `poll_output`.
//! - `verify_only`: `Event::verify()` on the same events: the baseline.
//! - `duplicate_event`: the same message again, already seen, on the live
//!   subscription (past EOSE).
//! - `duplicate_event_stored_phase`: the same on a subscription still
//!   returning stored events (before EOSE), where duplicates take the full
//!   path because pagination counts them.
//! - `dup_parts/*`: what the full path costs per step: parsing the relay
//!   message, matching the subscription's filters, the seen-set lookup.

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::*;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use grasp_sync::internal::Seen;
use grasp_sync::{Action, Config, Engine, RelayId, Time};
use nostr::prelude::*;

const RELAY: &str = "wss://remote.example";

fn pool_size() -> usize {
    scaled(20_000, 100)
}

struct Live {
    engine: Engine,
    relay: RelayId,
    now: Time,
    /// The subscription asking `#A` for the repo.
    sub: String,
    /// Its filters, as sent.
    filters: Vec<Filter>,
}

/// The engine with the repo's `#A` subscription open; `stored_phase` leaves
/// it before its EOSE (events count as stored), else it is live.
fn live_engine(coord_owner: &Keys, stored_phase: bool) -> Live {
    let mut config = Config::new(OWN);
    config.self_subscribe = false;
    let t0 = Time::from_secs(T0);
    let mut engine = Engine::new(config, t0).expect("valid config");
    let tags = vec![tag(&["d", "repo"]), tag(&["relays", RELAY])];
    engine.handle_local_event(t0, local_event(coord_owner.public_key(), 1, 30617, tags));
    let now = t0 + WINDOW;
    engine.handle_timeout(now);
    let Some(Action::Connect { relay, .. }) = engine.poll_action() else {
        panic!("expected a connect");
    };
    engine.handle_connected(now, relay);
    let mut reqs = Vec::new();
    while let Some(action) = engine.poll_action() {
        if let Action::Send { message, .. } = &action
            && message.starts_with("[\"REQ\"")
        {
            reqs.push(message.clone());
            if stored_phase && message.contains("\"#A\"") {
                continue;
            }
        }
        answer(&mut engine, now, action, &mut ReqCount::default());
    }
    let req = reqs
        .iter()
        .find(|m| m.contains("\"#A\""))
        .expect("a REQ asks #A");
    let sub = req_sub_id(req).expect("sub id").to_owned();
    let Ok(ClientMessage::Req { filters, .. }) = ClientMessage::from_json(req) else {
        panic!("REQ parses");
    };
    let filters = filters.into_iter().map(|f| f.into_owned()).collect();
    let confirmed = if stored_phase { 0 } else { 1 };
    assert_eq!(engine.item_counts(relay).confirmed, confirmed);
    Live {
        engine,
        relay,
        now,
        sub,
        filters,
    }
}

fn bench_inbound(c: &mut Criterion) {
    let owner = keys(1);
    let coord = format!("30617:{}:repo", owner.public_key().to_hex());
    let author = keys(2);
    let started = Instant::now();
    let events: Vec<Event> = (0..pool_size())
        .map(|i| {
            let tags = vec![tag(&["A", &coord])];
            sign(&author, 1111, T0 + i as u64, tags, &format!("comment {i}"))
        })
        .collect();
    let mut live = live_engine(&owner, false);
    let messages: Vec<String> = events
        .iter()
        .map(|e| format!("[\"EVENT\",\"{}\",{}]", live.sub, e.as_json()))
        .collect();
    eprintln!(
        "inbound: {} signed events, {} bytes per message, ready in {:.1?}",
        events.len(),
        messages[0].len(),
        started.elapsed()
    );

    // Sanity: a fresh event is ingested, a repeat is a duplicate.
    live.engine
        .handle_message(live.now, live.relay, &messages[0]);
    assert!(live.engine.poll_output().is_some(), "fresh event ingested");
    live.engine
        .handle_message(live.now, live.relay, &messages[0]);
    assert!(live.engine.poll_output().is_none());
    assert_eq!(live.engine.stats().events_duplicate, 1);

    let mut group = c.benchmark_group("inbound_event");
    group.throughput(Throughput::Elements(1));

    let mut next = 1;
    group.bench_function("fresh_event", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters as usize;
            while left > 0 {
                if next == messages.len() {
                    let sub = live.sub.clone();
                    live = live_engine(&owner, false);
                    assert_eq!(live.sub, sub, "same subscription id after a rebuild");
                    next = 0;
                }
                let n = left.min(messages.len() - next);
                let (engine, relay, now) = (&mut live.engine, live.relay, live.now);
                let start = Instant::now();
                for message in &messages[next..next + n] {
                    engine.handle_message(now, relay, message);
                    while let Some(output) = engine.poll_output() {
                        black_box(output);
                    }
                }
                total += start.elapsed();
                next += n;
                left -= n;
            }
            total
        })
    });
    let stats = live.engine.stats();
    assert_eq!(
        stats.events_invalid + stats.events_unwanted,
        0,
        "every fresh event verified and wanted"
    );

    let mut k = 0;
    group.bench_function("verify_only", |b| {
        b.iter(|| {
            k = (k + 1) % events.len();
            events[k].verify().expect("valid event")
        })
    });

    let dup = &messages[0];
    let mut fresh = None;
    for (name, stored_phase) in [
        ("duplicate_event", false),
        ("duplicate_event_stored_phase", true),
    ] {
        let mut e = live_engine(&owner, stored_phase);
        e.engine.handle_message(e.now, e.relay, dup);
        assert!(e.engine.poll_output().is_some(), "first copy ingested");
        let before = e.engine.stats().events_duplicate;
        group.bench_function(name, |b| {
            b.iter(|| e.engine.handle_message(e.now, e.relay, dup))
        });
        assert!(
            e.engine.stats().events_duplicate > before,
            "duplicates counted"
        );
        assert!(e.engine.poll_output().is_none(), "duplicates not ingested");
        if stored_phase {
            fresh = Some(e);
        }
    }
    let fresh = fresh.expect("stored-phase engine");

    group.bench_function("dup_parts/parse_relay_message", |b| {
        b.iter(|| RelayMessage::from_json(black_box(dup)).expect("parses"))
    });
    let event = &events[0];
    let filters = &fresh.filters;
    group.bench_function("dup_parts/match_filters", |b| {
        let opts = MatchEventOptions::new();
        b.iter(|| {
            filters
                .iter()
                .enumerate()
                .filter(|(_, f)| f.match_event(black_box(event), opts))
                .map(|(i, _)| i)
                .collect::<Vec<usize>>()
        })
    });
    let mut seen = Seen::new(100_000);
    for e in &events {
        seen.insert(e.id);
    }
    group.bench_function("dup_parts/seen_lookup", |b| {
        b.iter(|| seen.contains(black_box(&event.id)))
    });
    group.finish();
}

criterion_group!(benches, bench_inbound);
criterion_main!(benches);
