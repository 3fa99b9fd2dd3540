//! The relay-builder relay syncs from two remote LocalRelays into a store
//! slowed to 200 events a second: history (3,000 events), recursive
//! discovery and live events all arrive, and what is read but not yet
//! stored stays bounded (the back-pressure holds: nothing dropped).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use grasp_sync_relay_builder::py_relay::{PyRelay, peak_rss_kib, publish};
use grasp_sync_relay_builder::scenario::{announcement, comment, coord, history, issue};
use grasp_sync_relay_builder::{EmbeddedRelay, Options};
use nostr_relay_builder::prelude::*;

/// The store's queue.
const QUEUE: usize = 256;
/// Events read from relays and not yet in the queue at most: what the
/// engine parsed in one read turn per relay (64 frames each) and the event
/// held while the queue is full, with room to spare. Without
/// back-pressure it is the whole history.
const IN_FLIGHT_MAX: u64 = 400;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syncs_history_discovery_and_live_into_a_slow_store_with_bounded_memory() {
    let _ = env_logger::builder().is_test(true).try_init();
    let (a, b) = tokio::task::spawn_blocking(|| (PyRelay::start(), PyRelay::start()))
        .await
        .unwrap();
    let opts = Options {
        queue: QUEUE,
        store_rate: Some(200),
        allow_private_addresses: true,
        ..Options::default()
    };
    let relay = EmbeddedRelay::start(opts).await.expect("relay starts");
    let own = relay.url.clone();

    // Repository 1, announced to the embedded relay by its own client and
    // living on A; repository 2, announced only on A, living on B: found
    // by recursive discovery once the sink stored its announcement.
    let (k1, k2, k3) = (Keys::generate(), Keys::generate(), Keys::generate());
    let t0 = now() - 10_000;
    let seed = announcement(&k1, "one", &[&own, &a.url], t0);
    let remote = announcement(&k2, "two", &[&own, &b.url], t0);
    let (c1, c2) = (coord(&k1, "one"), coord(&k2, "two"));
    let mut on_a = history(&k3, &c1, t0 + 1, 1_499);
    on_a.push(remote.clone());
    let root = issue(&k3, &c2, t0 + 1, "an issue on B");
    let mut on_b = history(&k3, &c2, t0 + 2, 1_499);
    on_b.push(root.clone());
    let (a_url, b_url) = (a.url.clone(), b.url.clone());
    let (pa, pb) = (on_a.clone(), on_b.clone());
    tokio::task::spawn_blocking(move || {
        publish(&a_url, &pa);
        publish(&b_url, &pb);
    })
    .await
    .unwrap();
    let own_url = own.clone();
    let s = seed.clone();
    tokio::task::spawn_blocking(move || publish(&own_url, &[s]))
        .await
        .unwrap();

    let db = relay.db.clone();
    let missing = |events: Vec<Event>| {
        let db = db.clone();
        async move {
            let mut n = 0;
            for e in &events {
                if !matches!(db.check_id(&e.id).await, Ok(DatabaseEventStatus::Saved)) {
                    n += 1;
                }
            }
            n
        }
    };
    let history_all: Vec<Event> = on_a.iter().chain(&on_b).cloned().collect();
    assert_eq!(history_all.len(), 3_000);
    let mut worst = 0u64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let stats = relay.shell.stats().expect("running");
        let in_flight = stats.engine.events_ingested - stats.sink_stored - stats.sink_rejected;
        worst = worst.max(in_flight);
        let left = missing(history_all.clone()).await;
        if left == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{left} of 3,000 missing after 180 s; {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let counters = &relay.counters;
    let fulls = counters.fulls.load(std::sync::atomic::Ordering::Relaxed);
    let peak = counters
        .queue_peak
        .load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "history synced: queue full {fulls} times, queue peak {peak}, in flight at most {worst}, peak RSS {} KiB",
        peak_rss_kib()
    );
    assert!(
        fulls > 0,
        "the store was slower than the sync: back-pressure engaged"
    );
    assert!(peak <= QUEUE);
    assert!(
        worst <= IN_FLIGHT_MAX,
        "read but not stored at most {worst} (> {IN_FLIGHT_MAX}): reads did not pause"
    );
    let stats = relay.shell.stats().expect("running");
    assert_eq!(stats.sink_rejected, 0, "nothing dropped");

    // Live: one new event on each remote relay.
    let live_a = comment(&k3, &c1, now(), "live on A");
    let live_b = comment(&k3, &c2, now(), "live on B");
    let (a_url, b_url) = (a.url.clone(), b.url.clone());
    let (la, lb) = (live_a.clone(), live_b.clone());
    tokio::task::spawn_blocking(move || {
        publish(&a_url, &[la]);
        publish(&b_url, &[lb]);
    })
    .await
    .unwrap();
    let mut left = usize::MAX;
    for _ in 0..200 {
        left = missing(vec![
            live_a.clone(),
            live_b.clone(),
            remote.clone(),
            root.clone(),
        ])
        .await;
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(left, 0, "live events and the discovered repository arrived");
    tokio::task::spawn_blocking(move || relay.shutdown().expect("clean stop"))
        .await
        .unwrap();
}
