//! Filter building and packing for one relay's first historic sync: one
//! relay announced by 10,000 repos carrying 100,000 roots (scaled by
//! `GRASP_BENCH_SCALE`).
//!
//! - `engine_window_to_reqs`: from `handle_timeout` closing the batch window
//!   (index update included), through `handle_connected`, to every REQ of
//!   the sync, each answered with EOSE at once so the next can start.
//! - `engine_connect_to_reqs`: the same from `handle_connected` on (filter
//!   building, packing, scheduling, EOSE handling; no index update).
//! - `seed_one_req_per_filter`: the seed's builders over the relay's target
//!   sets (one filter per tag letter per 100 values), one REQ per filter,
//!   each serialized with `ClientMessage::req(..).as_json()`.
//! - `parts/*`: where the engine's time goes, through public API on the
//!   same index: `build_filters` builds every chunk's filters once
//!   (`filters::chunk_filters`, as the engine does per chunk);
//!   `single_pass_reqs` builds them once, serializes each filter once and
//!   packs the JSON into REQs within the same limits (20 filters, 64 KiB):
//!   the floor for packed REQs.

mod common;

use std::collections::HashSet;
use std::hint::black_box;

use common::seed;
use common::*;
use criterion::{BatchSize, Criterion, SamplingMode, criterion_group, criterion_main};
use grasp_sync::internal::RepoIndex;
use grasp_sync::internal::chunk_filters;
use grasp_sync::{Action, Config, Engine, Item, RelayId, Time};
use nostr::prelude::*;

const RELAY: &str = "wss://big.example";
const ROOT_BASE: u64 = 1 << 40;

struct World {
    events: Vec<Event>,
    coords: Vec<String>,
    roots: Vec<EventId>,
}

impl World {
    fn new() -> World {
        let n_repos = scaled(10_000, 1);
        let n_roots = scaled(100_000, 1);
        let owner = keys(1).public_key();
        let coords: Vec<String> = (0..n_repos)
            .map(|i| format!("30617:{}:r{i}", owner.to_hex()))
            .collect();
        let mut events = Vec::with_capacity(n_repos + n_roots);
        for i in 0..n_repos {
            let tags = vec![tag(&["d", &format!("r{i}")]), tag(&["relays", RELAY])];
            events.push(local_event(owner, i as u64, 30617, tags));
        }
        let mut roots = Vec::with_capacity(n_roots);
        for i in 0..n_roots {
            let tags = vec![tag(&["a", &coords[i % n_repos]])];
            let event = local_event(owner, ROOT_BASE + i as u64, 1621, tags);
            roots.push(event.id);
            events.push(event);
        }
        World {
            events,
            coords,
            roots,
        }
    }

    fn items(&self) -> usize {
        self.coords.len() + self.roots.len()
    }
}

fn t0() -> Time {
    Time::from_secs(T0)
}

/// An engine with the whole world fed in, the batch window still open.
fn loaded_engine(world: &World) -> Engine {
    let mut config = Config::new(OWN);
    config.self_subscribe = false;
    let mut engine = Engine::new(config, t0()).expect("valid config");
    for event in &world.events {
        engine.handle_local_event(t0(), event.clone());
    }
    engine
}

/// The batch window closed; returns the relay the engine asks to connect.
fn window_closed(world: &World) -> (Engine, RelayId) {
    let mut engine = loaded_engine(world);
    engine.handle_timeout(t0() + WINDOW);
    match engine.poll_action() {
        Some(Action::Connect { relay, .. }) => (engine, relay),
        other => panic!("expected a connect, got {other:?}"),
    }
}

/// One untimed run: REQs, bytes, filters, and the limits they respect.
fn engine_profile(world: &World) {
    let (mut engine, relay) = window_closed(world);
    let now = t0() + WINDOW;
    engine.handle_connected(now, relay);
    let mut count = ReqCount::default();
    let (mut filters, mut most_filters, mut largest) = (0, 0, 0);
    while let Some(action) = engine.poll_action() {
        if let Action::Send { message, .. } = &action
            && let Ok(ClientMessage::Req { filters: f, .. }) = ClientMessage::from_json(message)
        {
            filters += f.len();
            most_filters = most_filters.max(f.len());
            largest = largest.max(message.len());
        }
        answer(&mut engine, now, action, &mut count);
    }
    let confirmed = all_confirmed(&engine).expect("all confirmed");
    assert_eq!(confirmed, world.items());
    eprintln!(
        "filters: engine: {} REQs, {} bytes, {filters} filters (at most {most_filters} per REQ, \
         largest REQ {largest} bytes), {confirmed} items confirmed, {} consolidations, \
         {} live filters after",
        count.reqs,
        count.bytes,
        engine.stats().consolidations,
        engine.live_filter_count(relay)
    );
}

/// Page limit and REQ limits of the default config.
const PAGE_LIMIT: usize = 500;
const FILTERS_PER_REQ: usize = 20;
const MESSAGE_BYTES: usize = 64 * 1024;

/// Every chunk of 100 items (repos, then roots), as the engine chunks them.
fn chunks(index: &RepoIndex, world: &World) -> Vec<Vec<Item>> {
    let repos: Vec<Item> = world
        .coords
        .iter()
        .map(|c| Item::Repo(index.repo_id(c).expect("repo known")))
        .collect();
    let roots: Vec<Item> = world
        .roots
        .iter()
        .map(|id| Item::Root(index.root_id(id).expect("root known")))
        .collect();
    repos
        .chunks(100)
        .chain(roots.chunks(100))
        .map(|c| c.to_vec())
        .collect()
}

fn build_filters(index: &RepoIndex, chunks: &[Vec<Item>]) -> usize {
    chunks
        .iter()
        .map(|chunk| {
            let filters: Vec<Filter> = chunk_filters(index, chunk, None)
                .into_iter()
                .map(|f| f.limit(PAGE_LIMIT))
                .collect();
            black_box(filters).len()
        })
        .sum()
}

/// Each filter built once and serialized once, packed by bytes and count.
fn single_pass_reqs(index: &RepoIndex, chunks: &[Vec<Item>]) -> ReqCount {
    let mut count = ReqCount::default();
    let mut message = String::new();
    let mut in_message = 0;
    let mut finish = |message: &mut String, in_message: &mut usize| {
        if *in_message > 0 {
            message.push(']');
            count.reqs += 1;
            count.bytes += black_box(&*message).len();
        }
        message.clear();
        *in_message = 0;
    };
    for (n, chunk) in chunks.iter().enumerate() {
        let json: Vec<String> = chunk_filters(index, chunk, None)
            .into_iter()
            .map(|f| f.limit(PAGE_LIMIT).as_json())
            .collect();
        let bytes: usize = json.iter().map(|j| j.len() + 1).sum();
        if in_message + json.len() > FILTERS_PER_REQ || message.len() + bytes + 1 > MESSAGE_BYTES {
            finish(&mut message, &mut in_message);
        }
        if in_message == 0 {
            message.push_str(&format!("[\"REQ\",\"{n:x}\""));
        }
        for j in json {
            message.push(',');
            message.push_str(&j);
            in_message += 1;
        }
    }
    finish(&mut message, &mut in_message);
    count
}

/// The seed's REQs for a relay's targets: one per filter.
fn seed_reqs(repos: &HashSet<String>, roots: &HashSet<EventId>) -> ReqCount {
    let filters = seed::build_layer2_and_layer3_filters(repos, roots, None);
    let mut count = ReqCount::default();
    for (i, filter) in filters.into_iter().enumerate() {
        let message = ClientMessage::req(SubscriptionId::new(format!("{i:x}")), vec![filter]);
        let json = message.as_json();
        count.reqs += 1;
        count.bytes += black_box(json).len();
    }
    count
}

fn bench_filters(c: &mut Criterion) {
    let world = World::new();
    let repos: HashSet<String> = world.coords.iter().cloned().collect();
    let roots: HashSet<EventId> = world.roots.iter().copied().collect();
    eprintln!(
        "filters: one relay, {} repos, {} roots",
        repos.len(),
        roots.len()
    );
    engine_profile(&world);
    let naive = seed_reqs(&repos, &roots);
    eprintln!(
        "filters: seed: {} REQs (one filter each), {} bytes",
        naive.reqs, naive.bytes
    );

    let mut group = c.benchmark_group("first_sync_reqs");
    group.sample_size(10);
    group.sampling_mode(SamplingMode::Flat);
    let now = t0() + WINDOW;
    group.bench_function("engine_window_to_reqs", |b| {
        b.iter_batched(
            || loaded_engine(&world),
            |mut engine| {
                engine.handle_timeout(now);
                let count = settle(&mut engine, now);
                (engine, count)
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("engine_connect_to_reqs", |b| {
        b.iter_batched(
            || window_closed(&world),
            |(mut engine, relay)| {
                engine.handle_connected(now, relay);
                let count = settle(&mut engine, now);
                (engine, count)
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("seed_one_req_per_filter", |b| {
        b.iter(|| seed_reqs(&repos, &roots))
    });
    let (engine, _) = window_closed(&world);
    let index = engine.index();
    let chunks = chunks(index, &world);
    let single = single_pass_reqs(index, &chunks);
    eprintln!(
        "filters: single pass: {} REQs, {} bytes, {} filters",
        single.reqs,
        single.bytes,
        build_filters(index, &chunks)
    );
    group.bench_function("parts/build_filters", |b| {
        b.iter(|| build_filters(index, &chunks))
    });
    group.bench_function("parts/single_pass_reqs", |b| {
        b.iter(|| single_pass_reqs(index, &chunks))
    });
    group.finish();
}

criterion_group!(benches, bench_filters);
criterion_main!(benches);
