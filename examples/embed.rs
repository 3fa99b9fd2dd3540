//! Embedding grasp-sync in a relay: the relay supplies its own sink and
//! feeds the events its own clients publish, instead of a websocket to
//! itself.
//!
//! Run: `cargo run --example embed -- ws://127.0.0.1:7777`
//! (the URL names the embedding relay; it is never connected because the
//! self-subscription is off and the sink is the relay's own store).

use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};

use grasp_sync::nostr::prelude::Event;
use grasp_sync::{Config, Shell, ShellOptions, Sink, SinkTarget, StoreOutcome};

/// Synced events waiting for the relay's writer at most: past it the shell
/// pauses reading relays, so a slow store costs time, never memory.
const QUEUE: usize = 1_000;

/// Stand-in for the relay's database: a bounded queue to its writer thread.
struct RelayStore(SyncSender<Event>);

impl Sink for RelayStore {
    fn store(&mut self, from_relay: &str, event: Event) -> StoreOutcome {
        log::debug!("synced {} from {from_relay}", event.id);
        // Never block the sync loop: the writer thread does the slow part.
        match self.0.try_send(event) {
            Ok(()) => StoreOutcome::Stored,
            Err(TrySendError::Full(event)) => StoreOutcome::Full(Box::new(event)),
            Err(TrySendError::Disconnected(_)) => {
                StoreOutcome::Rejected("error: the writer stopped".to_owned())
            }
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::init();
    let own = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "ws://127.0.0.1:7777".to_owned());
    let mut config = Config::new(own);
    config.self_subscribe = false;
    let (tx, rx) = sync_channel(QUEUE);
    let shell = Shell::new(
        config,
        ShellOptions::default(),
        SinkTarget::Custom(Box::new(RelayStore(tx))),
    )?;
    let (handle, sync) = shell.spawn()?;

    // The relay's writer: stores synced events (here: counts them), and
    // tells the shell when its queue has room again.
    let writer_handle = handle.clone();
    std::thread::spawn(move || {
        let mut stored = 0u64;
        for _event in rx.iter() {
            stored += 1;
            writer_handle.sink_ready();
        }
        log::info!("writer stopped after {stored} events");
    });

    // At start, the announcements and roots the relay already holds (its
    // query for `grasp_sync::INDEX_KINDS`):
    //     handle.replay(stored_index_events);
    // Whenever one of its own clients publishes an event of those kinds
    // and the relay stores it:
    //     handle.feed(accepted_event);
    // On shutdown:
    handle.shutdown();
    sync.join().map_err(|_| "sync thread panicked")??;
    Ok(())
}
