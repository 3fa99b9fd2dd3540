//! The load run of BENCHMARKS.md: a history of `--events` comments (half
//! on each of two remote LocalRelays) synced into the embedded relay's
//! store, written at `--rate` events a second through a queue of
//! `--queue` events (a huge one stands for the unbounded queue an
//! embedder had before `StoreOutcome::Full`). Prints the time taken and
//! the peak resident memory of the sync alone (the peak is reset after
//! the remote relays are filled).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use grasp_sync_relay_builder::py_relay::{PyRelay, peak_rss_kib, publish, rss_kib};
use grasp_sync_relay_builder::scenario::{announcement, coord, history};
use grasp_sync_relay_builder::{EmbeddedRelay, Options};
use nostr_relay_builder::prelude::*;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (events, rate, queue) = (
        arg("--events", 5_000),
        arg("--rate", 200),
        arg("--queue", 256),
    );
    let (a, b) = (PyRelay::start(), PyRelay::start());
    eprintln!("remote relays at {} and {}", a.url, b.url);
    let opts = Options {
        queue,
        store_rate: Some(rate as u32),
        allow_private_addresses: true,
        ..Options::default()
    };
    let relay = EmbeddedRelay::start(opts).await?;
    let owner = Keys::generate();
    let author = Keys::generate();
    let t0 = Timestamp::now().as_secs() - 100_000;
    let ann = announcement(&owner, "repo", &[&relay.url, &a.url, &b.url], t0);
    let repo = coord(&owner, "repo");
    let all = history(&author, &repo, t0 + 1, events);
    let (on_a, on_b) = all.split_at(events / 2);
    publish(&a.url, on_a);
    publish(&b.url, on_b);
    eprintln!("{events} events published");
    // From here on the peak is the sync's.
    std::fs::write("/proc/self/clear_refs", "5")?;
    let base = rss_kib();
    let start = Instant::now();
    publish(&relay.url, &[ann]);
    let db = relay.db.clone();
    loop {
        let written = relay.counters.written.load(Ordering::Relaxed);
        if written as usize >= events {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut missing = 0;
    for e in &all {
        if !matches!(db.check_id(&e.id).await, Ok(DatabaseEventStatus::Saved)) {
            missing += 1;
        }
    }
    println!(
        "events={events} rate={rate} queue={queue}: synced in {:.1} s, missing {missing}, queue peak {}, full {} times, rss_before_kib={base} peak_rss_kib={}",
        start.elapsed().as_secs_f64(),
        relay.counters.queue_peak.load(Ordering::Relaxed),
        relay.counters.fulls.load(Ordering::Relaxed),
        peak_rss_kib()
    );
    tokio::task::spawn_blocking(move || relay.shutdown()).await??;
    Ok(())
}
