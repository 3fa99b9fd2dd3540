//! The history pipeline: one relay's stored events, paged in, verified and
//! handed to the sink (issue 33), so a regression in the first sync's
//! engine path shows as a number.
//!
//! One issue on the own relay with [`replies`] replies (5,000 at scale 1)
//! on one remote relay, driven through the simulation harness (the
//! engine, a fake relay answering by the same store rules as the test
//! relays, a clock that jumps): the time from the repo's announcement
//! until every reply reached the sink.
//!
//! - `req_pages`: the relay speaks no NIP-77, history comes in pages of
//!   500 by `until`.
//! - `negentropy_ids`: the relay speaks NIP-77 and the own relay holds
//!   nothing: the ids are reconciled, then fetched by `ids` REQs.
//! - `verify_only`: `Event::verify()` on the same replies, the baseline:
//!   what the sync must spend at least. The ratio to it is the pipeline's
//!   overhead (parsing, matching, paging, the fake relay's answers).

use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use grasp_sync::testing::sim::{NegMode, Sim, T0, announcement, config, coord, keys, reply, root};
use nostr::prelude::Event;

const REMOTE: &str = "wss://remote.example";

/// Replies in the history (`GRASP_BENCH_SCALE` scales it).
fn replies() -> usize {
    let scale = std::env::var("GRASP_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(1.0);
    ((5_000.0 * scale) as usize).max(600)
}

/// The remote holds the history; the own relay the repo's issue, and the
/// announcement is published last, so the sync starts when the timing does.
fn world(history: &[Event], issue: &Event, neg: NegMode) -> (Sim, Event) {
    let mut sim = Sim::new(config());
    sim.add_relay(REMOTE).negentropy = neg;
    for e in history {
        sim.seed(REMOTE, e);
    }
    let own = sim.own.clone();
    sim.seed(&own, issue);
    let owner = keys(1);
    (sim, announcement(&owner, "repo", &[REMOTE], T0 - 100_000))
}

fn sync(world: (Sim, Event)) -> Sim {
    let (mut sim, ann) = world;
    let own = sim.own.clone();
    sim.publish(&own, &ann);
    sim.advance(Duration::from_secs(120));
    sim
}

fn bench_history(c: &mut Criterion) {
    let owner = keys(1);
    let issue = root(
        &keys(2),
        1621,
        &[&coord(&owner, "repo")],
        T0 - 90_000,
        "issue",
    );
    let started = Instant::now();
    let history: Vec<Event> = (0..replies() as u64)
        .map(|i| reply(&keys(3), &issue, T0 - 80_000 + i, &format!("reply {i}")))
        .collect();
    eprintln!(
        "history: {} replies signed in {:.1?}",
        history.len(),
        started.elapsed()
    );
    for neg in [NegMode::Unknown, NegMode::Supported] {
        let done = sync(world(&history, &issue, neg));
        let missing = done.missing(&history);
        assert!(
            missing.is_empty(),
            "{neg:?}: {} replies missing",
            missing.len()
        );
        eprintln!("{neg:?}: {} REQs", done.reqs(REMOTE).len());
    }

    let mut group = c.benchmark_group("history");
    group.throughput(Throughput::Elements(history.len() as u64));
    group.sample_size(10);
    for (name, neg) in [
        ("req_pages", NegMode::Unknown),
        ("negentropy_ids", NegMode::Supported),
    ] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || world(&history, &issue, neg),
                sync,
                BatchSize::PerIteration,
            )
        });
    }
    group.bench_function("verify_only", |b| {
        b.iter(|| {
            for e in &history {
                e.verify().expect("valid event");
            }
        })
    });
    group.finish();
}

criterion_group!(benches, bench_history);
criterion_main!(benches);
