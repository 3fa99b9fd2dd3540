//! The shell as other threads see it: a [`ShellHandle`] queues a
//! [`Command`] on a channel and wakes the loop through the mio `Waker`,
//! so the loop, which owns every socket and the engine, never shares them.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};

use mio::Waker;
use nostr::prelude::{Event, EventId, Timestamp};

use crate::sans_io::memory::index::is_index_kind;
use crate::shell::report::{SyncStats, SyncStatus};
use crate::shell::sink::ListRequest;

/// Requests from other threads.
pub(super) enum Command {
    /// Events the embedding relay stored from elsewhere (or holds at start).
    Feed(Vec<Event>),
    /// The custom sink has room again.
    SinkReady,
    /// A custom sink's answer to a listing it answered `Later`.
    Listed {
        request: ListRequest,
        held: Option<Vec<(EventId, Timestamp)>>,
    },
    /// A custom sink's listing answered `Later` failed.
    Unlisted(ListRequest),
    /// Send the counters.
    Stats(Sender<SyncStats>),
    /// Send the state now.
    Status(Sender<SyncStatus>),
    /// Stop: no new work, flush the outbox.
    Shutdown,
}

/// A cloneable handle to a running shell, usable from any thread.
#[derive(Clone)]
pub struct ShellHandle {
    tx: Sender<Command>,
    waker: Arc<Waker>,
}

impl ShellHandle {
    /// A handle that wakes the loop through `waker`, and the receiving end
    /// the loop drains when woken.
    pub(super) fn new(waker: Arc<Waker>) -> (ShellHandle, Receiver<Command>) {
        let (tx, commands) = channel();
        (ShellHandle { tx, waker }, commands)
    }

    fn send(&self, command: Command) {
        if self.tx.send(command).is_ok() {
            // A failed wake means the loop is gone: nothing to tell.
            let _ = self.waker.wake();
        }
    }

    /// Feeds an event the embedding relay stored from one of its own
    /// clients (instead of the self-subscription). Events the sink reported
    /// stored need no feed: see [`Sink`](crate::Sink) for the contract.
    /// Events not of [`INDEX_KINDS`](crate::INDEX_KINDS) are ignored here.
    pub fn feed(&self, event: Event) {
        self.replay(std::iter::once(event));
    }

    /// [`ShellHandle::feed`] for an event given as its JSON text, for a
    /// relay on another `nostr` version. Parsed on the caller's thread;
    /// the relay verified it when it accepted it.
    pub fn feed_json(&self, event: &str) -> Result<(), nostr::error::Error> {
        self.feed(Event::from_json(event)?);
        Ok(())
    }

    /// Feeds what the relay already holds, once at start: every stored
    /// event of [`INDEX_KINDS`](crate::INDEX_KINDS) (others are skipped),
    /// in one message to the loop. Needed when `Config::self_subscribe` is
    /// off, or the index starts empty and learns nothing until new events
    /// arrive.
    pub fn replay(&self, events: impl IntoIterator<Item = Event>) {
        let events: Vec<Event> = events
            .into_iter()
            .filter(|e| is_index_kind(e.kind))
            .collect();
        if !events.is_empty() {
            self.send(Command::Feed(events));
        }
    }

    /// [`ShellHandle::replay`] for events given as JSON texts; stops at
    /// the first that does not parse, feeding none.
    pub fn replay_json<'a>(
        &self,
        events: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), nostr::error::Error> {
        let events = events
            .into_iter()
            .map(Event::from_json)
            .collect::<Result<Vec<_>, _>>()?;
        self.replay(events);
        Ok(())
    }

    /// The custom sink has room again, after it answered
    /// [`StoreOutcome::Full`](crate::StoreOutcome::Full): the loop offers
    /// the event it holds again, and reading resumes once it is stored.
    /// Cheap, and harmless when nothing is held: call it whenever the
    /// sink's queue drains below its bound.
    pub fn sink_ready(&self) {
        self.send(Command::SinkReady);
    }

    /// A custom sink's answer to a listing it answered
    /// [`Listing::Later`](crate::Listing::Later): what the store holds for
    /// that filter, `None` if it cannot tell.
    pub fn listed(&self, request: ListRequest, held: Option<Vec<(EventId, Timestamp)>>) {
        self.send(Command::Listed { request, held });
    }

    /// A listing answered [`Listing::Later`](crate::Listing::Later) failed
    /// this time (a query error): as [`Listing::Failed`](crate::Listing::Failed),
    /// its filters are read with REQ now and negentropy stays on.
    pub fn unlisted(&self, request: ListRequest) {
        self.send(Command::Unlisted(request));
    }

    /// The counters the metrics page shows, as values; `None` once the
    /// shell has stopped. Waits for the loop to answer (within one of its
    /// turns): never call it on the loop thread (from a [`Sink`](crate::Sink)).
    pub fn stats(&self) -> Option<SyncStats> {
        let (tx, rx) = channel();
        self.send(Command::Stats(tx));
        rx.recv().ok()
    }

    /// The state the metrics page shows (relays by status and health,
    /// subscriptions, the sink), as values; `None` once the shell has
    /// stopped. Waits like [`ShellHandle::stats`].
    pub fn status(&self) -> Option<SyncStatus> {
        let (tx, rx) = channel();
        self.send(Command::Status(tx));
        rx.recv().ok()
    }

    /// Asks the shell to stop: no new work, outbox flushed within the deadline.
    pub fn shutdown(&self) {
        self.send(Command::Shutdown);
    }
}
