//! An embedding relay's sink over real loopback sockets: what `store`
//! answers (stored, full, rejected) and what the shell does about it, the
//! index fed from what the sink stored, listings answered later through the
//! handle, and the JSON edge.

mod support;

use support::running::*;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use grasp_sync::{
    Config, JsonOutcome, JsonSink, ListRequest, Listing, ShellHandle, ShellOptions, Sink,
    SinkTarget, StoreOutcome,
};
use nostr::prelude::*;
use support::*;

/// A shell with `sink` for the own relay `OWN` (never connected: no
/// self-subscription), metrics on an OS-picked port.
fn embedded(tune: impl FnOnce(&mut Config), sink: SinkTarget) -> (Running, ShellHandle) {
    embedded_with(|c, _| tune(c), |_| sink)
}

/// [`embedded`], with the shell's options to tune too, and the sink made
/// with the shell's handle (`Shell::with_sink`).
fn embedded_with(
    tune: impl FnOnce(&mut Config, &mut ShellOptions),
    make_sink: impl FnOnce(&ShellHandle) -> SinkTarget,
) -> (Running, ShellHandle) {
    let running = Running::start_with(
        OWN,
        |config, opts| {
            config.self_subscribe = false;
            config.batch_window = Duration::from_millis(100);
            tune(config, opts);
        },
        make_sink,
    );
    let handle = running.handle.clone();
    (running, handle)
}

/// `n` comments on `repo`, published on `relay`.
fn comments_on(relay: &TestRelay, repo: &str, n: u64) -> Vec<Event> {
    let history: Vec<Event> = (0..n)
        .map(|i| repo_comment(&keys(2), repo, T0 + i, &format!("comment {i}")))
        .collect();
    for e in &history {
        relay.publish(e.clone());
    }
    history
}

/// A store behind a queue of `QUEUE` events: `Full` when the queue is,
/// and a record of every store call made while an event was handed back
/// and no room was signalled since (the shell must wait for the signal,
/// or its one-second retry).
struct Queued {
    tx: SyncSender<Event>,
    fulls: Arc<AtomicUsize>,
    /// Set on `Full`: the writer signals room once it took one more.
    wants_room: Arc<AtomicBool>,
    readies: Arc<AtomicU64>,
    /// The signal count and time of the last `Full`.
    last_full: Option<(u64, Instant)>,
    early: Arc<AtomicUsize>,
}

const QUEUE: usize = 8;

impl Sink for Queued {
    fn store(&mut self, _from: &str, event: Event) -> StoreOutcome {
        if let Some((readies, at)) = self.last_full.take()
            && self.readies.load(Ordering::SeqCst) == readies
            && at.elapsed() < Duration::from_millis(900)
        {
            self.early.fetch_add(1, Ordering::SeqCst);
        }
        match self.tx.try_send(event) {
            Ok(()) => StoreOutcome::Stored,
            Err(TrySendError::Full(event)) => {
                self.fulls.fetch_add(1, Ordering::SeqCst);
                self.last_full = Some((self.readies.load(Ordering::SeqCst), Instant::now()));
                self.wants_room.store(true, Ordering::SeqCst);
                StoreOutcome::Full(Box::new(event))
            }
            Err(TrySendError::Disconnected(_)) => StoreOutcome::Rejected("error: closed".into()),
        }
    }
}

/// The relay's writer: stores one event a millisecond, and signals room
/// after one the sink had to hand back (counted before the signal).
fn writer(
    rx: Receiver<Event>,
    handle: ShellHandle,
    wants_room: Arc<AtomicBool>,
    readies: Arc<AtomicU64>,
) -> Arc<Mutex<Vec<EventId>>> {
    let stored = Arc::new(Mutex::new(Vec::new()));
    let out = stored.clone();
    std::thread::spawn(move || {
        for event in rx.iter() {
            std::thread::sleep(Duration::from_millis(1));
            out.lock().unwrap().push(event.id);
            if wants_room.swap(false, Ordering::SeqCst) {
                readies.fetch_add(1, Ordering::SeqCst);
                handle.sink_ready();
            }
        }
    });
    stored
}

#[test]
fn a_full_sink_pauses_reads_and_resumes_on_its_signal_losing_nothing() {
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let history = comments_on(&a, &repo, 400);
    let (tx, rx) = sync_channel(QUEUE);
    let fulls = Arc::new(AtomicUsize::new(0));
    let readies = Arc::new(AtomicU64::new(0));
    let early = Arc::new(AtomicUsize::new(0));
    let wants_room = Arc::new(AtomicBool::new(false));
    let sink = Queued {
        tx,
        fulls: fulls.clone(),
        wants_room: wants_room.clone(),
        readies: readies.clone(),
        last_full: None,
        early: early.clone(),
    };
    let (running, handle) = embedded(|_| {}, SinkTarget::Custom(Box::new(sink)));
    let stored = writer(rx, handle.clone(), wants_room, readies);
    handle.feed(announcement(&owner, "repo", &[&a.url(), OWN], T0));
    let want: HashSet<EventId> = history.iter().map(|e| e.id).collect();
    let all = || {
        let got: HashSet<EventId> = stored.lock().unwrap().iter().copied().collect();
        want.is_subset(&got)
    };
    assert!(wait_for(60, all), "every event stored");
    assert!(fulls.load(Ordering::SeqCst) > 0, "the queue filled up");
    assert_eq!(
        early.load(Ordering::SeqCst),
        0,
        "nothing offered while full before a signal or the retry"
    );
    let ids = stored.lock().unwrap().clone();
    assert_eq!(
        ids.len(),
        ids.iter().collect::<HashSet<_>>().len(),
        "each once"
    );
    running.stop();
}

#[test]
fn a_full_sink_that_never_signals_is_offered_again_a_second_later() {
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let history = comments_on(&a, &repo, 3);
    /// Full on every first offer of an event, stored on the second.
    struct Hesitant(Arc<Mutex<Vec<EventId>>>, HashSet<EventId>);
    impl Sink for Hesitant {
        fn store(&mut self, _from: &str, event: Event) -> StoreOutcome {
            if self.1.insert(event.id) {
                return StoreOutcome::Full(Box::new(event));
            }
            self.0.lock().unwrap().push(event.id);
            StoreOutcome::Stored
        }
    }
    let stored = Arc::new(Mutex::new(Vec::new()));
    let sink = Hesitant(stored.clone(), HashSet::new());
    let (running, handle) = embedded(|_| {}, SinkTarget::Custom(Box::new(sink)));
    handle.feed(announcement(&owner, "repo", &[&a.url(), OWN], T0));
    assert!(
        wait_for(30, || stored.lock().unwrap().len() == history.len()),
        "stored on the retry, with no signal: {:?}",
        stored.lock().unwrap()
    );
    assert_eq!(running.metric("grasp_sync_sink_retries_total"), 3);
    running.stop();
}

/// A JSON sink (a relay on another nostr version) that refuses one event
/// once, as a store error, and stores everything else.
struct RefuseOnce {
    refuse: EventId,
    refused: Arc<AtomicUsize>,
    stored: Arc<Mutex<Vec<String>>>,
}

impl JsonSink for RefuseOnce {
    fn store_json(&mut self, _from: &str, event: &str) -> JsonOutcome {
        if event.contains(&self.refuse.to_hex()) && self.refused.fetch_add(1, Ordering::SeqCst) == 0
        {
            return JsonOutcome::Rejected("error: disk full".into());
        }
        self.stored.lock().unwrap().push(event.to_owned());
        JsonOutcome::Stored
    }
}

#[test]
fn a_rejected_event_is_counted_and_not_seen_so_its_next_copy_is_offered() {
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let b = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let x = repo_comment(&keys(2), &repo, T0 + 1, "refused once");
    a.publish(x.clone());
    let refused = Arc::new(AtomicUsize::new(0));
    let stored = Arc::new(Mutex::new(Vec::new()));
    let sink = RefuseOnce {
        refuse: x.id,
        refused: refused.clone(),
        stored: stored.clone(),
    };
    let (running, handle) = embedded(|_| {}, SinkTarget::json(sink));
    let ann = announcement(&owner, "repo", &[&a.url(), &b.url(), OWN], T0);
    handle.feed_json(&ann.as_json()).expect("valid JSON");
    assert!(wait_for(20, || refused.load(Ordering::SeqCst) == 1));
    // The same event from another relay: dropped as a duplicate if the
    // refused id had been marked seen.
    b.publish(x.clone());
    let has_x = || {
        stored
            .lock()
            .unwrap()
            .iter()
            .any(|json| Event::from_json(json).is_ok_and(|e| e.id == x.id))
    };
    assert!(wait_for(20, has_x), "the second copy stored");
    assert_eq!(
        running.metric("grasp_sync_sink_events_total{outcome=\"rejected\"}"),
        1
    );
    running.stop();
}

/// Stores everything; lists nothing.
struct Keep(Arc<Mutex<Vec<Event>>>);

impl Sink for Keep {
    fn store(&mut self, _from: &str, event: Event) -> StoreOutcome {
        self.0.lock().unwrap().push(event);
        StoreOutcome::Stored
    }
}

#[test]
fn what_the_sink_stored_reaches_the_index_with_no_feed() {
    // A bootstrap relay holds the announcement; only what the sink stored
    // can teach the index the repo and its second relay.
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let b = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let ann = announcement(&owner, "repo", &[&a.url(), &b.url(), OWN], T0);
    a.publish(ann.clone());
    let issue = root(&keys(2), 1621, &[&repo], T0 + 1, "issue on b");
    let answer = reply(&keys(3), &issue, T0 + 2, "reply on b");
    b.publish(issue.clone());
    b.publish(answer.clone());
    let stored = Arc::new(Mutex::new(Vec::new()));
    let bootstrap = a.url();
    let (running, _handle) = embedded(
        |c| c.bootstrap = vec![bootstrap],
        SinkTarget::Custom(Box::new(Keep(stored.clone()))),
    );
    let has = |id: EventId| stored.lock().unwrap().iter().any(|e| e.id == id);
    assert!(wait_for(20, || has(ann.id)), "the announcement stored");
    assert!(
        wait_for(20, || has(issue.id) && has(answer.id)),
        "b's root and its reply synced: the index learnt the repo from the store"
    );
    running.stop();
}

/// Answers listings later, from a thread of its own, through the handle
/// it was built with (`Shell::with_sink`): an async store's shape.
struct ListsLater {
    keep: Keep,
    asked: Arc<Mutex<Vec<ListRequest>>>,
    shell: ShellHandle,
}

impl Sink for ListsLater {
    fn store(&mut self, from: &str, event: Event) -> StoreOutcome {
        self.keep.store(from, event)
    }

    fn list(&mut self, request: ListRequest, _filter: &Filter) -> Listing {
        self.asked.lock().unwrap().push(request);
        let shell = self.shell.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            shell.listed(request, Some(Vec::new()));
        });
        Listing::Later
    }
}

#[test]
fn a_listing_answered_later_through_the_handle_drives_negentropy() {
    // Historic sync asks the store what it holds before reading a relay.
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let history = comments_on(&a, &repo, 20);
    let stored = Arc::new(Mutex::new(Vec::new()));
    let asked = Arc::new(Mutex::new(Vec::new()));
    let keep = Keep(stored.clone());
    let sink_asked = asked.clone();
    let (running, handle) = embedded_with(
        |_, _| {},
        |handle| {
            SinkTarget::Custom(Box::new(ListsLater {
                keep,
                asked: sink_asked,
                shell: handle.clone(),
            }))
        },
    );
    handle.feed(announcement(&owner, "repo", &[&a.url(), OWN], T0));
    assert!(
        wait_for(20, || !asked.lock().unwrap().is_empty()),
        "a listing asked"
    );
    assert!(wait_for(20, || stored.lock().unwrap().len() >= history.len()));
    // An answer lost would end in the listing's deadline: a fallback.
    assert!(
        running.metric("grasp_sync_negentropy_total{event=\"skipped_nothing_held\"}") > 0,
        "the answer reached the engine: the store holds nothing, so REQ reads it all"
    );
    assert_eq!(
        running.metric("grasp_sync_negentropy_total{event=\"fallback\"}"),
        0
    );
    running.stop();
}

/// Fails its first listing (a query error), lists every later one.
struct FailsFirstListing {
    keep: Keep,
    asked: Arc<Mutex<usize>>,
}

impl Sink for FailsFirstListing {
    fn store(&mut self, from: &str, event: Event) -> StoreOutcome {
        self.keep.store(from, event)
    }

    fn list(&mut self, _request: ListRequest, _filter: &Filter) -> Listing {
        let mut asked = self.asked.lock().unwrap();
        *asked += 1;
        match *asked {
            1 => Listing::Failed,
            _ => Listing::Now(Some(Vec::new())),
        }
    }
}

#[test]
fn a_failed_listing_reads_its_filters_with_req_and_negentropy_stays_on() {
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    let (first, second) = (coord(&owner, "first"), coord(&owner, "second"));
    let history = comments_on(&a, &first, 10);
    let stored = Arc::new(Mutex::new(Vec::new()));
    let asked = Arc::new(Mutex::new(0));
    let sink = FailsFirstListing {
        keep: Keep(stored.clone()),
        asked: asked.clone(),
    };
    let (running, handle) = embedded_with(|_, _| {}, |_| SinkTarget::Custom(Box::new(sink)));
    let has_all = |events: &[Event]| {
        let stored = stored.lock().unwrap();
        events.iter().all(|e| stored.iter().any(|s| s.id == e.id))
    };
    handle.feed(announcement(&owner, "first", &[&a.url(), OWN], T0));
    // Well inside the listing deadline (a minute) the failed one waits for.
    assert!(wait_for(20, || has_all(&history)), "read with REQ at once");
    assert_eq!(
        running.metric("grasp_sync_negentropy_total{event=\"fallback\"}"),
        1
    );
    let later = comments_on(&a, &second, 10);
    handle.feed(announcement(&owner, "second", &[&a.url(), OWN], T0 + 1));
    assert!(wait_for(20, || has_all(&later)));
    assert!(
        *asked.lock().unwrap() >= 2,
        "negentropy asked the store again"
    );
    assert!(
        running.metric("grasp_sync_negentropy_total{event=\"skipped_nothing_held\"}") > 0,
        "the next listing was answered"
    );
    running.stop();
}

#[test]
fn stats_and_status_report_what_the_metrics_page_shows() {
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let history = comments_on(&a, &repo, 5);
    let stored = Arc::new(Mutex::new(Vec::new()));
    // Private addresses allowed on the engine's Config alone: the shell's
    // options (false) must not switch it off again.
    let keep = Keep(stored.clone());
    let (running, handle) = embedded_with(
        |c, o| {
            c.allow_private_addresses = true;
            o.allow_private_addresses = false;
        },
        |_| SinkTarget::Custom(Box::new(keep)),
    );
    handle.feed(announcement(&owner, "repo", &[&a.url(), OWN], T0));
    assert!(wait_for(20, || stored.lock().unwrap().len() == history.len()));
    let stats = handle.stats().expect("running");
    assert_eq!(stats.sink_stored, history.len() as u64);
    assert_eq!(stats.engine.events_ingested, history.len() as u64);
    assert_eq!(
        stats.sink_stored,
        running.metric("grasp_sync_sink_events_total{outcome=\"stored\"}")
    );
    let status = handle.status().expect("running");
    assert_eq!(status.relays_by_status[2], 1, "a connected: {status:?}");
    assert!(!status.sink_full);
    running.stop();
    assert!(handle.stats().is_none(), "no answer once stopped");
}
