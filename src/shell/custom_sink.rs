//! An embedder's [`Sink`] as the loop drives it: what each store answered
//! and what the loop does about it.
//!
//! `Full` is the own-relay outbox's back-pressure with a queue of one: the
//! event handed back is held here, the loop stops reading remote relays
//! while it is (`Shell::sink_has_room`, the same `deferred` path as a full
//! outbox), and it is offered again once the embedder signals room
//! (`ShellHandle::sink_ready`) or [`RETRY_EVERY`] later, so a signal
//! missed costs a second, never a stall. `Rejected` is counted, logged by
//! reason once a minute (the own relay's `RefusalLog`), and the engine
//! forgets the id. `Stored` announcements and roots are handed back for
//! the index, as the own relay's `OK true` is.

use std::time::Duration;

use nostr::prelude::{Event, EventId, Filter};

use crate::sans_io::memory::index::{RelayId, is_index_kind};
use crate::sans_io::own_relay::outbox::OutboxStats;
use crate::sans_io::own_relay::refusal_log::RefusalLog;
use crate::sans_io::timing::time::Time;
use crate::shell::sink::{ListRequest, Listing, Sink, StoreOutcome};

/// Longest a held event waits for the embedder's signal before it is
/// offered again anyway.
pub(super) const RETRY_EVERY: Duration = Duration::from_secs(1);

/// An embedder's sink and the one event it had no room for.
pub(super) struct CustomSink {
    sink: Box<dyn Sink + Send>,
    /// The event the sink handed back, with the relay it came from and
    /// when the engine received it.
    held: Option<(RelayId, Box<Event>, Time)>,
    /// When the held event is offered again without a signal.
    retry_at: Option<Time>,
    /// The embedder signalled room since the event was handed back.
    ready: bool,
    /// `rejected` and `retried` (times an event was handed back).
    pub(super) stats: OutboxStats,
    refusals: RefusalLog,
}

/// What one offer came to, for the loop.
pub(super) enum Offered {
    /// Stored; the event is here if the index must learn it.
    Stored(Option<Event>),
    /// Handed back and held: reads pause.
    Full,
    /// Refused for good: the engine must forget the id.
    Rejected(EventId),
}

impl CustomSink {
    pub(super) fn new(sink: Box<dyn Sink + Send>) -> CustomSink {
        CustomSink {
            sink,
            held: None,
            retry_at: None,
            ready: false,
            stats: OutboxStats::default(),
            refusals: RefusalLog::new("sink"),
        }
    }

    /// False while an event is held.
    pub(super) fn has_room(&self) -> bool {
        self.held.is_none()
    }

    /// When the held event is offered again without a signal.
    pub(super) fn timeout(&self) -> Option<Time> {
        self.retry_at
    }

    /// The embedder says the sink has room.
    pub(super) fn handle_ready(&mut self) {
        self.ready = self.held.is_some();
    }

    /// When the held event was received: a state save claims nothing
    /// past it (`Stored` is the embedder's confirmation).
    pub(super) fn unsettled(&self) -> Option<Time> {
        self.held.as_ref().map(|(_, _, received)| *received)
    }

    /// Hands `event` (from `relay`, at `url`, received at `received`) to
    /// the sink.
    pub(super) fn offer(
        &mut self,
        now: Time,
        relay: RelayId,
        url: &str,
        event: Event,
        received: Time,
    ) -> Offered {
        debug_assert!(self.held.is_none(), "offered while holding one");
        let index = is_index_kind(event.kind).then(|| event.clone());
        let id = event.id;
        match self.sink.store(url, event) {
            StoreOutcome::Stored => Offered::Stored(index),
            StoreOutcome::Full(event) => {
                self.stats.retried += 1;
                self.held = Some((relay, event, received));
                self.retry_at = Some(now + RETRY_EVERY);
                self.ready = false;
                Offered::Full
            }
            StoreOutcome::Rejected(reason) => {
                self.stats.rejected += 1;
                let prefix = reason.split(':').next().unwrap_or_default();
                self.refusals.refused(now, &id, prefix, &reason);
                Offered::Rejected(id)
            }
        }
    }

    /// The held event, once the embedder signalled room or its retry is due.
    pub(super) fn take_due(&mut self, now: Time) -> Option<(RelayId, Event, Time)> {
        if !self.ready && self.retry_at.is_none_or(|at| now < at) {
            return None;
        }
        self.ready = false;
        self.retry_at = None;
        self.held
            .take()
            .map(|(relay, event, received)| (relay, *event, received))
    }

    /// Asks the sink what it holds for `filter`.
    pub(super) fn list(&mut self, request: u64, filter: &Filter) -> Listing {
        self.sink.list(ListRequest(request), filter)
    }
}
