//! Synced events into the relay's database, at the database's pace.
//!
//! The sink runs on grasp-sync's loop thread and must not block: it parses
//! the event's JSON into the relay's nostr 0.44 `Event` and puts it on a
//! bounded queue. When the queue is full it answers `Full`: the shell keeps
//! the event and stops reading remote relays until the writer, which
//! drains the queue into the database, calls `ShellHandle::sink_ready`.
//! Listings are answered later, by a task querying the database, through
//! `ShellHandle::listed`: the loop never waits for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use grasp_sync::{JsonOutcome, JsonSink, ListRequest, Listing, ShellHandle};
use nostr_relay_builder::prelude::*;
use tokio::sync::mpsc;

/// What the sink and its writer did, for tests and logs.
#[derive(Debug, Default)]
pub struct SinkCounters {
    /// Events the writer saved.
    pub written: AtomicU64,
    /// Times the queue was full.
    pub fulls: AtomicU64,
    /// Most events the queue held at once.
    pub queue_peak: AtomicUsize,
}

/// The sink's half: the queue's sending end and the listing requests.
pub struct QueueSink {
    queue: mpsc::Sender<Event>,
    lists: mpsc::UnboundedSender<(ListRequest, Filter)>,
    /// Set on `Full`: the writer signals room with the next event it takes.
    wants_room: Arc<AtomicBool>,
    counters: Arc<SinkCounters>,
}

/// The tasks' half, started once the shell (and so its handle) exists.
pub struct QueueWorkers {
    queue: mpsc::Receiver<Event>,
    lists: mpsc::UnboundedReceiver<(ListRequest, Filter)>,
    wants_room: Arc<AtomicBool>,
    counters: Arc<SinkCounters>,
}

/// A sink with a queue of `capacity` events, and the workers to start.
pub fn queue_sink(capacity: usize, counters: Arc<SinkCounters>) -> (QueueSink, QueueWorkers) {
    let (tx, rx) = mpsc::channel(capacity);
    let (list_tx, list_rx) = mpsc::unbounded_channel();
    let wants_room = Arc::new(AtomicBool::new(false));
    let sink = QueueSink {
        queue: tx,
        lists: list_tx,
        wants_room: wants_room.clone(),
        counters: counters.clone(),
    };
    let workers = QueueWorkers {
        queue: rx,
        lists: list_rx,
        wants_room,
        counters,
    };
    (sink, workers)
}

impl JsonSink for QueueSink {
    fn store_json(&mut self, _from_relay: &str, event: &str) -> JsonOutcome {
        let event = match Event::from_json(event) {
            Ok(event) => event,
            Err(e) => return JsonOutcome::Rejected(format!("invalid: {e}")),
        };
        match self.queue.try_send(event) {
            Ok(()) => {
                let depth = self.queue.max_capacity() - self.queue.capacity();
                self.counters.queue_peak.fetch_max(depth, Ordering::Relaxed);
                JsonOutcome::Stored
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.counters.fulls.fetch_add(1, Ordering::Relaxed);
                self.wants_room.store(true, Ordering::SeqCst);
                JsonOutcome::Full
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                JsonOutcome::Rejected("error: the writer stopped".to_owned())
            }
        }
    }

    fn list_json(&mut self, request: ListRequest, filter: &str) -> Listing {
        let Ok(filter) = Filter::from_json(filter) else {
            return Listing::Failed;
        };
        match self.lists.send((request, filter)) {
            Ok(()) => Listing::Later,
            Err(_) => Listing::Now(None),
        }
    }
}

impl QueueWorkers {
    /// Starts the writer (saving into `db` at most `rate` events a second,
    /// telling `relay`'s subscribers) and the lister, on the current tokio
    /// runtime.
    pub fn spawn(
        self,
        db: MemoryDatabase,
        relay: LocalRelay,
        shell: ShellHandle,
        rate: Option<u32>,
    ) {
        let QueueWorkers {
            queue,
            lists,
            wants_room,
            counters,
        } = self;
        tokio::spawn(write(
            queue,
            db.clone(),
            relay,
            shell.clone(),
            wants_room,
            counters,
            rate,
        ));
        tokio::spawn(list(lists, db, shell));
    }
}

/// Drains the queue into the database, paced to `rate`.
async fn write(
    mut queue: mpsc::Receiver<Event>,
    db: MemoryDatabase,
    relay: LocalRelay,
    shell: ShellHandle,
    wants_room: Arc<AtomicBool>,
    counters: Arc<SinkCounters>,
    rate: Option<u32>,
) {
    let mut pace = rate.map(|r| tokio::time::interval(Duration::from_secs(1) / r.max(1)));
    while let Some(event) = queue.recv().await {
        if wants_room.swap(false, Ordering::SeqCst) {
            shell.sink_ready();
        }
        if let Some(pace) = &mut pace {
            pace.tick().await;
        }
        match db.save_event(&event).await {
            Ok(status) if status.is_success() => {
                relay.notify_event(event);
            }
            Ok(_) => {}
            Err(e) => log::warn!("storing {}: {e}", event.id),
        }
        counters.written.fetch_add(1, Ordering::Relaxed);
    }
}

/// Answers the engine's listings from the database.
async fn list(
    mut lists: mpsc::UnboundedReceiver<(ListRequest, Filter)>,
    db: MemoryDatabase,
    shell: ShellHandle,
) {
    use grasp_sync::nostr::prelude as n45;
    while let Some((request, filter)) = lists.recv().await {
        // A failed query is this listing's alone: negentropy stays on.
        let Ok(items) = db.negentropy_items(filter).await else {
            shell.unlisted(request);
            continue;
        };
        let held = items
            .into_iter()
            .map(|(id, at)| {
                (
                    n45::EventId::from_byte_array(id.to_bytes()),
                    n45::Timestamp::from_secs(at.as_secs()),
                )
            })
            .collect();
        shell.listed(request, Some(held));
    }
}
