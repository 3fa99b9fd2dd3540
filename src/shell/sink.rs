//! Where synced events go.
//!
//! The binary publishes them to the own relay (see `outbox` and the
//! shell's own-relay connection). A relay embedding this crate implements
//! [`Sink`] instead and stores events directly, with no websocket to itself;
//! a relay on another `nostr` version implements [`JsonSink`] and gets each
//! event as its JSON text. [`SinkTarget`] is that choice, made once when the
//! shell is built.

use nostr::prelude::{Event, EventId, Filter, Timestamp};

/// What became of an event handed to [`Sink::store`].
#[derive(Debug)]
pub enum StoreOutcome {
    /// The store holds it now (a duplicate it already held counts too).
    /// The shell feeds it to the index itself if it is of
    /// [`INDEX_KINDS`](crate::INDEX_KINDS): the embedder must not.
    Stored,
    /// No room now: the event comes back, the shell stops reading remote
    /// relays (as for a full own-relay outbox) and offers it again once
    /// the embedder calls [`ShellHandle::sink_ready`](crate::ShellHandle::sink_ready),
    /// or a second later at the latest. Nothing is read that could not be
    /// stored, so nothing is lost and memory stays bounded. A store error
    /// that may pass (a busy database, a full disk) is `Full` too.
    Full(Box<Event>),
    /// Refused for good, with the reason (policy, a store error retrying
    /// cannot fix). Counted (`grasp_sync_sink_events_total{outcome="rejected"}`),
    /// logged once a minute per reason, and never marked seen: a copy
    /// arriving again is offered again.
    Rejected(String),
}

/// An [`Action::ListLocal`](crate::Action::ListLocal) request, to answer
/// with [`ShellHandle::listed`](crate::ShellHandle::listed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListRequest(pub(crate) u64);

/// A sink's answer to a listing.
#[derive(Debug)]
pub enum Listing {
    /// What the store holds for the filter, now; `None`: it cannot list
    /// (historic sync then re-reads relays with REQ).
    Now(Option<Vec<(EventId, Timestamp)>>),
    /// The answer comes later through
    /// [`ShellHandle::listed`](crate::ShellHandle::listed) (an async
    /// database): the loop goes on meanwhile. One not answered within the
    /// engine's listing deadline falls back to REQ.
    Later,
    /// This listing failed (a query error, a timeout): its filters are
    /// read with REQ now, and the next listing is asked as usual, where
    /// `Now(None)` turns negentropy off for good.
    Failed,
}

/// Takes each verified event the engine synced.
///
/// # Feeding the index
///
/// The engine learns repositories and their relays from the events of
/// [`INDEX_KINDS`](crate::INDEX_KINDS) (announcements, root events,
/// deletions) the relay holds. What this sink reports
/// [`StoreOutcome::Stored`] the shell feeds in itself. The embedder feeds
/// ([`ShellHandle::feed`](crate::ShellHandle::feed)) only the events of
/// those kinds its relay stores from elsewhere (its own clients), once
/// stored, and at start replays those it already holds
/// ([`ShellHandle::replay`](crate::ShellHandle::replay)), unless
/// `Config::self_subscribe` reads them from the relay over a websocket.
/// Without the feed, repositories announced on the relay by its clients
/// are never synced, and the roots its clients publish are not followed
/// across relays; nothing else breaks.
pub trait Sink {
    /// Stores one event, from the relay at `from_relay`. Called on the loop
    /// thread: must not block. A slow store takes the event into a bounded
    /// queue and answers [`StoreOutcome::Full`] when the queue is full.
    fn store(&mut self, from_relay: &str, event: Event) -> StoreOutcome;

    /// The `(id, created_at)` of every stored event matching `filter`, so
    /// historic sync can use negentropy and fetch only what is missing:
    /// answered now or later (`request` names it then). The default
    /// answers now with [`Sink::list_now`].
    fn list(&mut self, request: ListRequest, filter: &Filter) -> Listing {
        let _ = request;
        Listing::Now(self.list_now(filter))
    }

    /// [`Sink::list`] for a store that answers at once. `None` (the
    /// default) means the sink cannot list: historic sync then re-reads
    /// relays with REQ.
    fn list_now(&mut self, filter: &Filter) -> Option<Vec<(EventId, Timestamp)>> {
        let _ = filter;
        None
    }
}

/// What became of an event handed to [`JsonSink::store_json`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonOutcome {
    /// As [`StoreOutcome::Stored`].
    Stored,
    /// As [`StoreOutcome::Full`]: the shell keeps the event and offers it again.
    Full,
    /// As [`StoreOutcome::Rejected`].
    Rejected(String),
}

/// A [`Sink`] for a relay on another `nostr` version: events and filters
/// cross as their JSON text (NIP-01), which the relay parses with its own
/// `Event::from_json`. The event was verified here: the relay need not
/// verify it again. Ids and timestamps of a listing cross as the
/// `grasp_sync::nostr` types, built from bytes and seconds. The feeding
/// contract is [`Sink`]'s.
pub trait JsonSink {
    /// Stores one event given as its JSON text (see [`Sink::store`]).
    fn store_json(&mut self, from_relay: &str, event: &str) -> JsonOutcome;

    /// Lists what the store holds for a filter given as its JSON text (see
    /// [`Sink::list`]). The default cannot list.
    fn list_json(&mut self, request: ListRequest, filter: &str) -> Listing {
        let _ = (request, filter);
        Listing::Now(None)
    }
}

/// A [`JsonSink`] as a [`Sink`]: one serialisation per event, no other
/// conversion.
struct JsonEdge<S>(S);

impl<S: JsonSink> Sink for JsonEdge<S> {
    fn store(&mut self, from_relay: &str, event: Event) -> StoreOutcome {
        match self.0.store_json(from_relay, &event.as_json()) {
            JsonOutcome::Stored => StoreOutcome::Stored,
            JsonOutcome::Full => StoreOutcome::Full(Box::new(event)),
            JsonOutcome::Rejected(reason) => StoreOutcome::Rejected(reason),
        }
    }

    fn list(&mut self, request: ListRequest, filter: &Filter) -> Listing {
        self.0.list_json(request, &filter.as_json())
    }
}

/// Where synced events go.
pub enum SinkTarget {
    /// Publish to the own relay (`Config::own_relay`) with `EVENT`.
    OwnRelay,
    /// Hand to an embedding relay's sink.
    Custom(Box<dyn Sink + Send>),
}

impl SinkTarget {
    /// An embedding relay's sink that takes events as JSON text.
    pub fn json(sink: impl JsonSink + Send + 'static) -> SinkTarget {
        SinkTarget::Custom(Box::new(JsonEdge(sink)))
    }
}
