//! Relay messages are hostile input: whatever the own relay, a remote relay
//! or the bootstrap relay sends, in whatever order, with time passing and
//! connections dropping in between, the engine must not panic and its
//! invariants must hold after every step.
//!
//! Input: two bytes of config knobs, then frames separated by 0xff. A frame's
//! first byte picks the relay (high nibble) and the step (low nibble); the
//! rest is the step's argument. Raw text frames have `$S` replaced by the
//! relay's newest open subscription (or negentropy session) id and `$A` by
//! the id of our last AUTH event to it, so the fuzzer can answer for real.

#![no_main]

use std::time::Duration;

use grasp_sync::Offence;
use grasp_sync::{Config, RelayId};
use grasp_sync_fuzz::{BOOT, Link, Listing, OWN, World, keys, pool};
use libfuzzer_sys::fuzz_target;
use nostr::prelude::{RelayMessage, SubscriptionId};

/// Steps per input at most: enough for long stories, short enough for speed.
const MAX_STEPS: usize = 128;

fuzz_target!(|data: &[u8]| {
    let [knobs, more, script @ ..] = data else {
        return;
    };
    let mut world = World::new(config(*knobs, *more));
    world.listing = [
        Listing::Held,
        Listing::Empty,
        Listing::Unable,
        Listing::Silent,
    ][usize::from(more >> 1 & 3)];
    for event in &pool().setup {
        world.local_event(event.clone());
    }
    world.advance(Duration::from_secs(6), 64);
    world.check();
    for frame in script.split(|&b| b == 0xff).take(MAX_STEPS) {
        step(&mut world, frame);
        world.check();
    }
});

/// Small limits by choice of the input, so pagination, consolidation,
/// chunking and refusals are reached with few messages; negentropy and
/// AUTH on or off.
fn config(knobs: u8, more: u8) -> Config {
    let bit = |n: u8| knobs & (1 << n) != 0;
    let mut c = Config::new(OWN);
    c.bootstrap = vec![BOOT.to_owned()];
    c.self_subscribe = !bit(0);
    c.page_limit = [1, 2, 5, 500][usize::from(knobs >> 1 & 3)];
    c.consolidation_threshold = [1, 3, 8, 70][usize::from(knobs >> 3 & 3)];
    c.chunk_size = if bit(5) { 1 } else { 100 };
    c.max_subscriptions = if bit(6) { 2 } else { 10 };
    if bit(7) {
        c.max_pages = 2;
        c.max_filters_per_req = 2;
    }
    c.negentropy = more & 1 == 0;
    c.auth_keys = (more & 8 != 0).then(|| keys(7));
    c
}

/// One frame: raw text (0-5), a pool event on an open subscription (6),
/// EOSE (7), CLOSED (8), NOTICE (9), time passing (10), a dropped
/// connection (11), how the relay answers connects from now on (12), a
/// protocol offence (13), a locally fed pool event (14) or a pong (15).
fn step(world: &mut World, frame: &[u8]) {
    let Some((&ctrl, arg)) = frame.split_first() else {
        return;
    };
    let relays: Vec<RelayId> = world.engine.relays().collect();
    let relay = relays[usize::from(ctrl >> 4) % relays.len()];
    let byte = |i: usize| arg.get(i).copied().unwrap_or(0);
    match ctrl & 0x0f {
        0..=5 => {
            let text = String::from_utf8_lossy(arg)
                .replace("$S", &newest_sub(world, relay))
                .replace("$A", world.auth_id(relay).unwrap_or_default());
            world.message(relay, &text);
        }
        6 => {
            let events = &pool().extra;
            let event = &events[usize::from(byte(0)) % events.len()];
            let sub = pick_sub(world, relay, byte(1));
            world.message(relay, &format!(r#"["EVENT","{sub}",{}]"#, event.as_json()));
        }
        7 => {
            let sub = pick_sub(world, relay, byte(0));
            world.message(relay, &format!(r#"["EOSE","{sub}"]"#));
        }
        8 => {
            let sub = pick_sub(world, relay, byte(0));
            let reason = String::from_utf8_lossy(arg.get(1..).unwrap_or_default());
            let msg = RelayMessage::closed(SubscriptionId::new(sub), reason);
            world.message(relay, &msg.as_json());
        }
        9 => {
            let msg = RelayMessage::notice(String::from_utf8_lossy(arg));
            world.message(relay, &msg.as_json());
        }
        10 => world.advance(duration(byte(0), byte(1), byte(2)), 256),
        11 => world.drop_relay(relay),
        12 => {
            let links = [Link::Up, Link::Down, Link::Hanging, Link::Busy];
            world.set_link(relay, links[usize::from(byte(0)) % links.len()]);
        }
        13 => {
            let now = world.now;
            world.engine.handle_offence(now, relay, Offence::Protocol);
            world.drive();
        }
        14 => {
            let events = &pool().extra;
            world.local_event(events[usize::from(byte(0)) % events.len()].clone());
        }
        _ => {
            let now = world.now;
            world.engine.handle_pong(now, relay);
            world.drive();
        }
    }
}

/// From milliseconds to tens of days, so every timer kind gets to fire.
fn duration(unit: u8, lo: u8, hi: u8) -> Duration {
    let n = u64::from(u16::from_le_bytes([lo, hi]));
    match unit % 3 {
        0 => Duration::from_millis(n),
        1 => Duration::from_secs(n),
        _ => Duration::from_secs(n * 60),
    }
}

fn newest_sub(world: &World, relay: RelayId) -> String {
    world.subs(relay).last().cloned().unwrap_or_default()
}

/// One of the relay's open subscriptions, or an id that is not ours.
fn pick_sub(world: &World, relay: RelayId, n: u8) -> String {
    let subs = world.subs(relay);
    if subs.is_empty() {
        return "zz".to_owned();
    }
    subs[usize::from(n) % subs.len()].clone()
}
