//! Where synced events go.
//!
//! The binary publishes them to the own relay (see `outbox` and the
//! shell's own-relay connection). A relay embedding this crate implements
//! [`Sink`] instead and stores events directly, with no websocket to itself.
//! [`SinkTarget`] is that choice, made once when the shell is built.

use nostr::prelude::{Event, EventId, Filter, Timestamp};

/// Takes each verified event the engine synced.
pub trait Sink {
    /// Stores one event. Called on the loop thread: must not block (hand the
    /// event to a channel or an in-memory queue if storing is slow).
    fn store(&mut self, from_relay: &str, event: Event);

    /// The `(id, created_at)` of every stored event matching `filter`, so
    /// historic sync can use negentropy and fetch only what is missing.
    /// `None` (the default) means the sink cannot list: historic sync then
    /// re-reads relays with REQ.
    fn list(&mut self, filter: &Filter) -> Option<Vec<(EventId, Timestamp)>> {
        let _ = filter;
        None
    }
}

/// Where synced events go.
pub enum SinkTarget {
    /// Publish to the own relay (`Config::own_relay`) with `EVENT`.
    OwnRelay,
    /// Hand to an embedding relay's sink.
    Custom(Box<dyn Sink + Send>),
}
