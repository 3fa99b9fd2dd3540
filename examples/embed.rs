//! Embedding grasp-sync in a relay: the relay supplies its own sink and
//! feeds the events it accepted, instead of a websocket to itself.
//!
//! Run: `cargo run --example embed -- ws://127.0.0.1:7777`
//! (the URL names the embedding relay; it is never connected because the
//! self-subscription is off and the sink is the relay's own store).

use std::sync::mpsc;

use grasp_sync::{Config, Shell, ShellOptions, Sink, SinkTarget};
use nostr::prelude::Event;

/// Stand-in for the relay's database: a channel to its writer thread.
struct RelayStore(mpsc::Sender<Event>);

impl Sink for RelayStore {
    fn store(&mut self, from_relay: &str, event: Event) {
        log::info!("synced {} from {from_relay}", event.id);
        // Never block the sync loop: the writer thread does the slow part.
        let _ = self.0.send(event);
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::init();
    let own = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "ws://127.0.0.1:7777".to_owned());
    let mut config = Config::new(own);
    config.self_subscribe = false;
    let (tx, rx) = mpsc::channel();
    let shell = Shell::new(
        config,
        ShellOptions::default(),
        SinkTarget::Custom(Box::new(RelayStore(tx))),
    )?;
    let handle = shell.handle();
    let sync = std::thread::spawn(move || shell.run());

    // The relay's writer: stores synced events (here: counts them).
    std::thread::spawn(move || {
        let stored = rx.iter().count();
        log::info!("writer stopped after {stored} events");
    });

    // Whenever the relay accepts an announcement or a root event (from any
    // client), it feeds it in; the engine learns repos and relays from it:
    //     handle.feed(accepted_event);
    // On shutdown:
    handle.shutdown();
    sync.join().map_err(|_| "sync thread panicked")??;
    Ok(())
}
