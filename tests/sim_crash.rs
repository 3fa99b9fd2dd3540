//! Nothing lost to a crash (issue 34): a state save claims only what the
//! sink confirmed. The engine runs with a sink that takes nothing (a full
//! outbox behind a throttling own relay), its state is saved as the
//! shell's timer saves it, and the process dies without another word: a
//! new engine starts over that state inside the quick-reconnect window
//! and must still deliver every event the relays hold, within the hour
//! (the daily full sync, a day later, would be too late to count).

mod support;

use std::time::Duration;

use grasp_sync::{Engine, Output, SavedState, Time};
use nostr::prelude::*;
use support::*;

const A: &str = "wss://a.example";

/// A repo on A with an old issue and replies to it (history, not live).
fn world(sim: &mut Sim) -> Vec<Event> {
    sim.add_relay(A);
    let repo = announce(sim, &keys(1), "r", &[A], T0 - 86_400);
    let issue = root(&keys(2), 1621, &[&repo], T0 - 3_600, "issue");
    let mut events = vec![issue.clone()];
    events.extend((0..3).map(|i| reply(&keys(3), &issue, T0 - 3_000 + i, "reply")));
    for e in &events {
        sim.seed(A, e);
    }
    events
}

/// The process dies now, its last save taken now (through the file's
/// JSON), and a new one starts over it `down` later with a sink that
/// stores: what it delivers within the hour is what survived.
fn crash_and_restart(sim: &mut Sim, down: Duration) {
    crash_with_unsettled(sim, down, None);
}

/// [`crash_and_restart`] where the driver's sink holds events unconfirmed
/// (an outbox), the oldest received at `unsettled`.
fn crash_with_unsettled(sim: &mut Sim, down: Duration, unsettled: Option<Time>) {
    let saved = sim.engine.save_state(sim.now, sim.now.as_secs(), unsettled);
    let saved = SavedState::decode(&saved.encode()).expect("own encoding decodes");
    for relay in sim.relays.values_mut() {
        relay.on_disconnect();
    }
    sim.connected.clear();
    sim.now = sim.now + down;
    sim.engine = Engine::new(config(), sim.now).expect("valid config");
    sim.engine.restore_state(sim.now, sim.now.as_secs(), saved);
    sim.sink = Sink::Stores;
    sim.settle();
    sim.advance(Duration::from_secs(3_600));
}

/// History fetched to its EOSE while the sink had no room: the repo is
/// confirmed on A, its events wait in the engine. A save that claimed the
/// repo confirmed made the restart skip its history for a day.
#[test]
fn history_held_behind_a_full_sink_is_read_again_after_a_crash() {
    let mut sim = Sim::new(config());
    let events = world(&mut sim);
    sim.sink = Sink::Full;
    sim.advance(Duration::from_secs(60));
    let counts = sim.engine.item_counts(sim.id(A));
    assert!(counts.confirmed > 0, "A's history was read: {counts:?}");
    assert!(sim.engine.outputs_waiting() > 0, "and waits for the sink");
    crash_and_restart(&mut sim, Duration::from_secs(60));
    assert_eq!(sim.missing(&events), Vec::<EventId>::new());
    sim.check();
}

/// A live event held behind a full sink for longer than the quick
/// window: a save that claimed A covered up to the save made the restart
/// ask `since` the save minus 15 minutes, after the event.
#[test]
fn a_live_event_held_longer_than_the_window_is_read_again_after_a_crash() {
    let mut sim = Sim::new(config());
    let events = world(&mut sim);
    sim.advance(Duration::from_secs(60));
    assert_eq!(sim.missing(&events), Vec::<EventId>::new());
    sim.sink = Sink::Full;
    let live = reply(&keys(4), &events[0], sim.now.as_secs(), "live");
    sim.publish(A, &live);
    sim.advance(Duration::from_secs(30 * 60));
    assert_eq!(sim.engine.outputs_waiting(), 1, "the live reply waits");
    crash_and_restart(&mut sim, Duration::from_secs(60));
    assert!(sim.synced(&live.id), "the live reply arrived");
    sim.check();
}

/// The events left the engine for the driver's outbox, where the own
/// relay has not confirmed them: the driver says when the oldest was
/// received, and the save claims nothing past it.
#[test]
fn events_in_the_drivers_outbox_bound_what_a_save_claims() {
    let mut sim = Sim::new(config());
    let events = world(&mut sim);
    sim.sink = Sink::Full;
    sim.advance(Duration::from_secs(60));
    let mut outbox = Vec::new();
    while let Some(Output::Ingest { received, .. }) = sim.engine.poll_output() {
        outbox.push(received);
    }
    assert!(!outbox.is_empty(), "A's history is in the outbox");
    sim.advance(Duration::from_secs(60));
    crash_with_unsettled(&mut sim, Duration::from_secs(60), outbox.into_iter().min());
    assert_eq!(sim.missing(&events), Vec::<EventId>::new());
    sim.check();
}
