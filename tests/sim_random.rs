//! Randomized runs with fixed seeds: announcements, roots, connects,
//! disconnects, refusals, silent relays and time jumps interleaved, with the
//! engine's invariants checked after every step and convergence checked once
//! the world is quiet. Plus arbitrary bytes as relay messages.

mod support;

use std::time::Duration;

use nostr::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use support::*;

const RELAYS: [&str; 5] = [
    "wss://r0.example",
    "wss://r1.example",
    "wss://r2.example",
    "ws://r3.example:8080",
    "wss://r4.example/nostr",
];
const REASONS: [&str; 6] = [
    "rate-limited: slow",
    "auth-required: x",
    "restricted: no",
    "error: boom",
    "ERROR: too many concurrent REQs",
    "ERROR: Rate-Limited: x",
];

/// Replies published on remote relays: (relay, reply, root id).
type Published = Vec<(&'static str, Event, EventId)>;

fn step(
    sim: &mut Sim,
    rng: &mut SmallRng,
    coords: &mut Vec<String>,
    roots: &mut Vec<Event>,
    published: &mut Published,
    clock: &mut u64,
) {
    let relay = RELAYS[rng.gen_range(0..RELAYS.len())];
    *clock += 1;
    match rng.gen_range(0..100) {
        0..=14 => {
            let owner = keys(rng.gen_range(1..4));
            let d = format!("d{}", rng.gen_range(0..6));
            let listed: Vec<&str> = RELAYS
                .iter()
                .copied()
                .filter(|_| rng.gen_bool(0.4))
                .collect();
            let created = T0 + rng.gen_range(0..1_000);
            let own = sim.own.clone();
            sim.publish(&own, &announcement(&owner, &d, &listed, created));
            let c = coord(&owner, &d);
            if !coords.contains(&c) {
                coords.push(c);
            }
        }
        15..=29 if !coords.is_empty() => {
            let n = rng.gen_range(1..3);
            let picked: Vec<&str> = (0..n)
                .map(|_| coords[rng.gen_range(0..coords.len())].as_str())
                .collect();
            let kind = [1617, 1618, 1621][rng.gen_range(0..3)];
            let ev = root(
                &keys(9),
                kind,
                &picked,
                T0 + *clock,
                &format!("root {clock}"),
            );
            let own = sim.own.clone();
            sim.publish(&own, &ev);
            roots.push(ev);
        }
        30..=39 if !roots.is_empty() => {
            let r = &roots[rng.gen_range(0..roots.len())];
            let ev = reply(&keys(8), r, T0 + *clock, &format!("reply {clock}"));
            sim.publish(relay, &ev);
            published.push((relay, ev, r.id));
        }
        40..=47 => sim.stop_relay(relay),
        48..=57 => sim.start_relay(relay),
        58..=62 => sim
            .relay(relay)
            .close_next
            .push_back(REASONS[rng.gen_range(0..REASONS.len())].into()),
        63..=65 => sim.relay(relay).silent = rng.gen_bool(0.5),
        66..=67 => {
            let own = sim.own.clone();
            sim.stop_relay(&own);
            sim.start_relay(&own);
        }
        68..=70 => {
            sim.relay(relay).max_subs = Some((
                rng.gen_range(2..5),
                if rng.gen_bool(0.5) {
                    Refuse::Closed
                } else {
                    Refuse::Notice
                },
            ))
        }
        _ => {
            let ms = match rng.gen_range(0..10) {
                0..=5 => rng.gen_range(1..6_000),
                6..=8 => rng.gen_range(6_000..120_000),
                _ => rng.gen_range(120_000..4 * 3_600_000),
            };
            sim.advance(Duration::from_millis(ms));
        }
    }
}

#[test]
fn random_interleavings_keep_invariants_and_converge() {
    let (mut neg_sessions, mut neg_fetched) = (0, 0);
    for seed in 0..12u64 {
        let mut cfg = config();
        cfg.seed = seed;
        cfg.consolidation_threshold = 12;
        cfg.chunk_size = 3;
        cfg.max_filters_per_req = 8;
        let mut sim = Sim::new(cfg);
        // Relays of every NIP-77 kind: the negentropy path and each of its
        // fallbacks run under the same invariants as the REQ path.
        let modes = [
            NegMode::Supported,
            NegMode::Unknown,
            NegMode::Supported,
            NegMode::Error,
            NegMode::Silent,
        ];
        for (r, mode) in RELAYS.iter().zip(modes) {
            sim.add_relay(r).negentropy = mode;
        }
        let mut rng = SmallRng::seed_from_u64(seed);
        let (mut coords, mut roots, mut published, mut clock) =
            (Vec::new(), Vec::new(), Vec::new(), 0);
        for i in 0..1_500 {
            step(
                &mut sim,
                &mut rng,
                &mut coords,
                &mut roots,
                &mut published,
                &mut clock,
            );
            if let Err(e) = sim.engine.check_invariants() {
                panic!("seed {seed} step {i}: {e}");
            }
        }
        // Quiet world: every relay honest and up; wait out any backoff.
        for r in RELAYS {
            let fake = sim.relay(r);
            fake.online = true;
            fake.silent = false;
            fake.close_next.clear();
        }
        let own = sim.own.clone();
        sim.start_relay(&own);
        sim.advance(Duration::from_secs(26 * 3600));
        sim.engine.check_invariants().unwrap();
        for url in RELAYS {
            let Some(id) = sim.engine.relay_id(url) else {
                continue;
            };
            let counts = sim.engine.item_counts(id);
            if counts.confirmed + counts.queued + counts.pending == 0 {
                continue;
            }
            assert_eq!(
                sim.engine.relay_status(id),
                grasp_sync::Status::Connected,
                "seed {seed} {url}"
            );
            assert_eq!(
                (counts.queued, counts.pending),
                (0, 0),
                "seed {seed} {url}: everything targeted confirmed ({counts:?})"
            );
        }
        let mut checked = 0;
        for (url, ev, root_id) in &published {
            let Some(id) = sim.engine.relay_id(url) else {
                panic!(
                    "seed {seed}: {url} unknown; known: {:?}",
                    sim.engine
                        .relays()
                        .map(|r| sim.engine.relay_url(r).to_owned())
                        .collect::<Vec<_>>()
                );
            };
            if sim
                .engine
                .item_state(id, &grasp_sync::ItemKey::Root(*root_id))
                .is_some()
            {
                assert!(
                    sim.synced(&ev.id),
                    "seed {seed}: reply on {url} to a targeted root was lost"
                );
                checked += 1;
            }
        }
        assert!(
            checked > 0,
            "seed {seed}: the run published replies that had to arrive"
        );
        neg_sessions += sim.engine.stats().neg_sessions;
        neg_fetched += sim.engine.stats().neg_ids_fetched;
    }
    assert!(
        neg_sessions > 0 && neg_fetched > 0,
        "{neg_sessions} {neg_fetched}"
    );
}

#[test]
fn arbitrary_bytes_as_relay_messages_never_panic() {
    let mut sim = Sim::new(config());
    let url = RELAYS[0];
    sim.add_relay(url);
    let owner = keys(1);
    let own = sim.own.clone();
    sim.publish(&own, &announcement(&owner, "r", &[url], T0));
    sim.advance(Duration::from_secs(10));
    let id = sim.id(url);
    let own_id = sim.engine.own_relay();
    let valid = [
        format!(
            r#"["EVENT","1",{}]"#,
            reply(&owner, &announcement(&owner, "x", &[], T0), T0, "x").as_json()
        ),
        r#"["EOSE","1"]"#.to_owned(),
        r#"["CLOSED","1","rate-limited: x"]"#.to_owned(),
        r#"["NOTICE","too many concurrent REQs"]"#.to_owned(),
        r#"["OK","00","true",""]"#.to_owned(),
        r#"["AUTH","challenge"]"#.to_owned(),
    ];
    let mut rng = SmallRng::seed_from_u64(42);
    for i in 0..20_000 {
        let text = if i % 2 == 0 {
            let len = rng.gen_range(0..200);
            let bytes: Vec<u8> = (0..len).map(|_| rng.r#gen()).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            let mut bytes = valid[rng.gen_range(0..valid.len())].clone().into_bytes();
            for _ in 0..rng.gen_range(1..4) {
                let at = rng.gen_range(0..bytes.len());
                bytes[at] = rng.r#gen();
            }
            if rng.gen_bool(0.2) {
                bytes.truncate(rng.gen_range(0..bytes.len()));
            }
            String::from_utf8_lossy(&bytes).into_owned()
        };
        // The own relay is trusted and hears everything; the remote one is
        // cut for misbehaving early and then hears nothing until it is back.
        sim.engine.handle_message(sim.now, own_id, &text);
        sim.engine.handle_message(sim.now, id, &text);
        if i % 1_000 == 0 {
            sim.settle();
            sim.engine.check_invariants().unwrap();
        }
    }
    assert!(sim.engine.stats().messages_malformed > 5_000);
    assert!(sim.engine.relay_penalties(id) >= 1);
    assert!(sim.engine.stats().penalties >= 1);
}
