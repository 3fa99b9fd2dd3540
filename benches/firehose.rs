//! Load run (not criterion): what a public relay's note firehose costs an
//! engine whose live set there went wide (issue 43). The wide set asks
//! kinds 1 and 7 by kind, so a reply to one of our roots arrives live; the
//! notes that tag nothing of ours are dropped before their signatures are
//! checked. Measured: the engine's CPU and the bytes it reads per second
//! while the relay publishes `rate` unrelated notes a second and one reply
//! to our issue a second, and how many of those replies reached the own
//! relay within seconds.
//!
//! ```sh
//! cargo build --release
//! FIREHOSE_BASELINE_BIN=/path/to/older/grasp-sync \
//!   cargo bench --bench firehose -- [rate] [seconds] [rounds]
//! ```
//!
//! Each round runs the baseline binary (if given) and `GRASP_SYNC_BIN`
//! (default: this checkout's release binary) one after the other against
//! the same in-process relay farm (relay 0 the own relay, relay 1 the
//! public one), so their figures compare within one run. Both run with
//! `--consolidation-threshold 3`: one repo and one issue send the public
//! relay wide, as thousands of roots would at the default.

#[path = "common/engine_process.rs"]
mod engine_process;
#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use engine_process::{cpu_seconds, engine_bin, metric, start_engine};
use grasp_sync::testing::farm::{FarmOptions, RelayFarm};
use grasp_sync::testing::sim::{T0, announcement, coord, keys, reply, root, sign, tag, wide_keys};
use nostr::prelude::*;
use support::real::free_port;

/// One binary's figures over one firehose window.
struct Window {
    cpu_pct: f64,
    bytes_per_sec: f64,
    replies_live: usize,
    replies: usize,
}

/// `rate` unrelated notes a second for `secs` seconds, ~600 bytes each as
/// public notes are: content, a `p` and an `e` tag naming other events.
fn firehose(rate: usize, secs: u64, now: u64) -> Vec<Event> {
    let authors: Vec<Keys> = (0..50).map(wide_keys).collect();
    let text = "gm nostr ".repeat(30);
    (0..rate * secs as usize)
        .map(|i| {
            let other = EventId::from_byte_array([(i % 251) as u8; 32]).to_hex();
            let author = &authors[i % authors.len()];
            let tags = vec![
                tag(&["e", &other]),
                tag(&["p", &authors[(i + 1) % authors.len()].public_key().to_hex()]),
            ];
            sign(author, 1, now + i as u64 / rate as u64, tags, &text)
        })
        .collect()
}

fn run(bin: &str, rate: usize, secs: u64) -> Window {
    let farm = RelayFarm::start(2, FarmOptions::default()).expect("farm starts");
    let (own, public) = (farm.url(0), farm.url(1));
    let owner = keys(1);
    let issue = root(&owner, 1621, &[&coord(&owner, "repo")], T0, "issue");
    farm.seed(
        0,
        vec![announcement(&owner, "repo", &[&public], T0), issue.clone()],
    );
    let history: Vec<Event> = (0..50)
        .map(|i| reply(&keys(2), &issue, T0 + 1 + i, "old reply"))
        .collect();
    farm.seed(1, history.clone());
    // Live events carry the time they are published at: the wide set
    // asks from a few minutes back.
    let now = Timestamp::now().as_secs();
    let notes = firehose(rate, secs, now);
    let replies: Vec<Event> = (0..secs)
        .map(|i| {
            sign(
                &keys(3),
                1,
                now + i,
                vec![tag(&["e", &issue.id.to_hex()])],
                "live reply",
            )
        })
        .collect();
    let port = free_port();
    let mut engine = start_engine(bin, &own, port, ["--consolidation-threshold", "3"]);
    let ids: Vec<EventId> = history.iter().map(|e| e.id).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while farm.count_present(0, &ids) < ids.len() {
        assert!(Instant::now() < deadline, "{bin}: no first sync in 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The live set goes wide once the history's batch confirmed.
    std::thread::sleep(Duration::from_secs(2));
    let bytes = || metric(port, "grasp_sync_bytes_total", "direction=\"in\"").unwrap_or(0);
    let (cpu0, bytes0, started) = (cpu_seconds(engine.id()), bytes(), Instant::now());
    let per_tick = rate / 10;
    for (tick, chunk) in notes.chunks(per_tick.max(1)).enumerate() {
        for note in chunk {
            farm.publish(1, note.clone());
        }
        if tick % 10 == 0 {
            farm.publish(1, replies[tick / 10].clone());
        }
        let next = started + Duration::from_millis(100 * (tick as u64 + 1));
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (cpu, read) = (cpu_seconds(engine.id()) - cpu0, bytes() - bytes0);
    std::thread::sleep(Duration::from_secs(3));
    let reply_ids: Vec<EventId> = replies.iter().map(|e| e.id).collect();
    let replies_live = farm.count_present(0, &reply_ids);
    let _ = engine.kill();
    let _ = engine.wait();
    farm.stop();
    Window {
        cpu_pct: 100.0 * cpu / elapsed,
        bytes_per_sec: read as f64 / elapsed,
        replies_live,
        replies: replies.len(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let arg = |i: usize, default: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (rate, secs, rounds) = (arg(0, 200) as usize, arg(1, 20), arg(2, 3));
    let mut bins = Vec::new();
    if let Ok(base) = std::env::var("FIREHOSE_BASELINE_BIN") {
        bins.push(("before", base));
    }
    bins.push(("after", engine_bin()));
    println!("firehose: {rate} notes/s and 1 reply/s for {secs} s, {rounds} rounds");
    for round in 1..=rounds {
        for (name, bin) in &bins {
            let w = run(bin, rate, secs);
            println!(
                "round {round} {name}: engine CPU {:.2} % of a core, {:.0} bytes/s read, {}/{} live replies in the own relay",
                w.cpu_pct, w.bytes_per_sec, w.replies_live, w.replies
            );
        }
    }
}
