//! The three-way diff for one batch of 100 new roots at 10,000 relays,
//! 100,000 repos and 1,000,000 roots (scaled by `GRASP_BENCH_SCALE`).
//!
//! - `incremental_engine`: the engine, every relay connected and every item
//!   confirmed; one step feeds 100 new roots for existing repos through
//!   `handle_local_event`, fires the batch window with `handle_timeout` and
//!   drains `poll_action` (the REQs it builds are part of the cost).
//! - `seed_full_recompute`: the seed's algorithm with String keys: insert the
//!   100 roots into the repo index, `derive_relay_targets` over everything,
//!   then `compute_actions` over every relay against everything confirmed.
//!
//! - `incremental_engine_full_cycle`: the engine step plus the relays'
//!   answers: every REQ gets EOSE, and the REQs that sets off (consolidation
//!   of a relay's live set) are built and answered, until nothing moves.
//!
//! Both sides confirm what a step asked (untimed, except in the full cycle)
//! before the next step, so each step starts from a steady state that grows
//! by 100 roots.

mod common;

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use common::seed::{self, ConnectionStatus, PendingBatch, RelayState, RepoSyncNeeds};
use common::*;
use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use grasp_sync::{Action, Config, Engine, Time};
use nostr::prelude::*;

/// New roots per batch.
const BATCH: usize = 100;
/// Relays each announcement lists.
const RELAYS_PER_REPO: usize = 3;
/// Event numbers of roots start here (announcements use `0..repos`).
const ROOT_BASE: u64 = 1 << 40;
/// Distinct repo owners.
const OWNERS: usize = 1_000;

struct Repo {
    owner: usize,
    d: String,
    coord: String,
    relays: Vec<usize>,
}

/// The synthetic world both sides load.
struct World {
    relay_urls: Vec<String>,
    owners: Vec<PublicKey>,
    repos: Vec<Repo>,
    /// Repo of each initial root.
    root_repo: Vec<usize>,
}

impl World {
    fn new() -> World {
        let n_relays = scaled(10_000, RELAYS_PER_REPO);
        let n_repos = scaled(100_000, 1);
        let n_roots = scaled(1_000_000, 1);
        let mut rng = Rng::new(0x5eed);
        let relay_urls: Vec<String> = (0..n_relays)
            .map(|i| format!("wss://relay{i}.example"))
            .collect();
        let owners: Vec<PublicKey> = (0..OWNERS.min(n_repos))
            .map(|i| keys(i as u32).public_key())
            .collect();
        let repos = (0..n_repos)
            .map(|i| {
                let owner = i % owners.len();
                let d = format!("repo-{i}");
                let coord = format!("30617:{}:{d}", owners[owner].to_hex());
                let mut relays = Vec::with_capacity(RELAYS_PER_REPO);
                while relays.len() < RELAYS_PER_REPO {
                    let r = rng.below(n_relays as u64) as usize;
                    if !relays.contains(&r) {
                        relays.push(r);
                    }
                }
                Repo {
                    owner,
                    d,
                    coord,
                    relays,
                }
            })
            .collect();
        let root_repo = (0..n_roots)
            .map(|_| rng.below(n_repos as u64) as usize)
            .collect();
        World {
            relay_urls,
            owners,
            repos,
            root_repo,
        }
    }

    fn announcement(&self, i: usize) -> Event {
        let repo = &self.repos[i];
        let mut relays = vec!["relays"];
        relays.extend(repo.relays.iter().map(|&r| self.relay_urls[r].as_str()));
        let tags = vec![tag(&["d", &repo.d]), tag(&relays)];
        local_event(self.owners[repo.owner], i as u64, 30617, tags)
    }

    fn root_event(&self, n: u64, repo: usize) -> Event {
        let tags = vec![tag(&["a", &self.repos[repo].coord])];
        local_event(self.owners[0], ROOT_BASE + n, 1621, tags)
    }

    fn root_id(n: u64) -> EventId {
        local_id(ROOT_BASE + n, 1621)
    }

    /// Items the engine should confirm: each repo and each of its roots, per relay.
    fn expected_items(&self) -> usize {
        let mut roots_of = vec![0usize; self.repos.len()];
        for &r in &self.root_repo {
            roots_of[r] += 1;
        }
        self.repos
            .iter()
            .zip(&roots_of)
            .map(|(repo, roots)| repo.relays.len() * (1 + roots))
            .sum()
    }
}

/// Fresh roots for existing repos, numbered after the initial ones.
struct Fresh {
    next: u64,
    rng: Rng,
}

impl Fresh {
    fn new(world: &World) -> Fresh {
        Fresh {
            next: world.root_repo.len() as u64,
            rng: Rng::new(0xf2e5),
        }
    }

    fn batch(&mut self, world: &World) -> Vec<(u64, usize)> {
        (0..BATCH)
            .map(|_| {
                let n = self.next;
                self.next += 1;
                (n, self.rng.below(world.repos.len() as u64) as usize)
            })
            .collect()
    }
}

struct EngineState {
    engine: Engine,
    now: Time,
    fresh: Fresh,
    actions: Vec<Action>,
    steps: u64,
    reqs: ReqCount,
    actions_seen: u64,
    /// `stats().consolidations` when the current bench started.
    consolidations: u64,
}

fn build_engine(world: &World) -> EngineState {
    let started = Instant::now();
    let mut config = Config::new(OWN);
    config.self_subscribe = false;
    // One key authors every root, a million of them and growing each step:
    // the anti-flood caps (100,000 roots per key, a million known roots)
    // would stop following them, and the bench would measure a smaller world.
    config.max_roots_per_pubkey = usize::MAX;
    config.max_known_items = usize::MAX;
    let t0 = Time::from_secs(T0);
    let mut engine = Engine::new(config, t0).expect("valid config");
    for i in 0..world.repos.len() {
        engine.handle_local_event(t0, world.announcement(i));
    }
    for (n, &repo) in world.root_repo.iter().enumerate() {
        engine.handle_local_event(t0, world.root_event(n as u64, repo));
    }
    let now = t0 + WINDOW;
    engine.handle_timeout(now);
    let count = settle(&mut engine, now);
    let confirmed = all_confirmed(&engine).expect("every item confirmed");
    assert_eq!(confirmed, world.expected_items(), "confirmed items");
    eprintln!(
        "diff: engine loaded {} relays, {} repos, {} roots, {confirmed} items confirmed \
         with {} REQs in {:.1?}",
        world.relay_urls.len(),
        world.repos.len(),
        world.root_repo.len(),
        count.reqs,
        started.elapsed()
    );
    let consolidations = engine.stats().consolidations;
    EngineState {
        engine,
        now,
        fresh: Fresh::new(world),
        actions: Vec::new(),
        steps: 0,
        reqs: ReqCount::default(),
        actions_seen: 0,
        consolidations,
    }
}

/// One measured step of the engine; the untimed parts keep it steady.
/// With `full_cycle`, the relays' EOSE answers (and the REQs they set off:
/// follow-up work, consolidation) are timed too, until nothing moves.
fn engine_step(st: &mut EngineState, world: &World, full_cycle: bool) -> Duration {
    let batch: Vec<Event> = st
        .fresh
        .batch(world)
        .into_iter()
        .map(|(n, repo)| world.root_event(n, repo))
        .collect();
    let deadline = st.now + WINDOW;
    // Maintenance timers due by the deadline (keepalive, disconnect check)
    // fire here, untimed, so the measured `handle_timeout` fires only the
    // batch window.
    st.engine.handle_timeout(deadline);
    settle(&mut st.engine, deadline);

    let start = Instant::now();
    for event in batch {
        st.engine.handle_local_event(st.now, event);
    }
    st.engine.handle_timeout(deadline);
    while let Some(action) = st.engine.poll_action() {
        st.actions.push(action);
    }
    let mut elapsed = start.elapsed();

    // The relays answer: every REQ reaches EOSE, every item is confirmed.
    let start = Instant::now();
    st.actions_seen += st.actions.len() as u64;
    let mut count = ReqCount::default();
    for action in st.actions.drain(..) {
        answer(&mut st.engine, deadline, action, &mut count);
    }
    while let Some(action) = st.engine.poll_action() {
        answer(&mut st.engine, deadline, action, &mut count);
    }
    if full_cycle {
        elapsed += start.elapsed();
    }
    st.reqs.reqs += count.reqs;
    st.reqs.bytes += count.bytes;
    st.steps += 1;
    st.now = deadline;
    elapsed
}

struct SeedState {
    index: HashMap<String, RepoSyncNeeds>,
    pending: HashMap<String, Vec<PendingBatch>>,
    confirmed: HashMap<String, RelayState>,
    fresh: Fresh,
    steps: u64,
    new_roots: u64,
    relay_actions: u64,
}

fn build_seed(world: &World) -> SeedState {
    let started = Instant::now();
    let mut index: HashMap<String, RepoSyncNeeds> = HashMap::new();
    for repo in &world.repos {
        let needs = index.entry(repo.coord.clone()).or_default();
        needs
            .relays
            .extend(repo.relays.iter().map(|&r| world.relay_urls[r].clone()));
    }
    for (n, &repo) in world.root_repo.iter().enumerate() {
        index
            .get_mut(&world.repos[repo].coord)
            .expect("repo known")
            .root_events
            .insert(World::root_id(n as u64));
    }
    let confirmed: HashMap<String, RelayState> = seed::derive_relay_targets(&index)
        .into_iter()
        .map(|(url, t)| {
            let state = RelayState {
                repos: t.repos,
                root_events: t.root_events,
                connection_status: ConnectionStatus::Connected,
            };
            (url, state)
        })
        .collect();
    let items: usize = confirmed
        .values()
        .map(|s| s.repos.len() + s.root_events.len())
        .sum();
    assert_eq!(items, world.expected_items(), "seed confirmed items");
    eprintln!(
        "diff: seed loaded {} relays, {items} items confirmed in {:.1?}",
        confirmed.len(),
        started.elapsed()
    );
    SeedState {
        index,
        pending: HashMap::new(),
        confirmed,
        fresh: Fresh::new(world),
        steps: 0,
        new_roots: 0,
        relay_actions: 0,
    }
}

/// One measured step of the seed's algorithm.
fn seed_step(st: &mut SeedState, world: &World) -> Duration {
    let batch: Vec<(EventId, String)> = st
        .fresh
        .batch(world)
        .into_iter()
        .map(|(n, repo)| (World::root_id(n), world.repos[repo].coord.clone()))
        .collect();

    let start = Instant::now();
    for (id, coord) in batch {
        st.index.entry(coord).or_default().root_events.insert(id);
    }
    let actions = {
        let targets = seed::derive_relay_targets(&st.index);
        seed::compute_actions(&targets, &st.pending, &st.confirmed)
    };
    let elapsed = start.elapsed();

    // The relays answer: what was asked becomes confirmed.
    for action in black_box(actions) {
        assert!(action.repos.is_empty(), "only roots are new");
        st.new_roots += action.root_events.len() as u64;
        st.relay_actions += 1;
        let state = st
            .confirmed
            .get_mut(&action.relay_url)
            .expect("relay known");
        state.root_events.extend(action.root_events);
    }
    st.steps += 1;
    elapsed
}

fn bench_diff(c: &mut Criterion) {
    let world = World::new();
    let mut group = c.benchmark_group("diff_100_roots");
    group.sample_size(10);
    group.sampling_mode(SamplingMode::Flat);

    let mut engine: Option<EngineState> = None;
    for (name, full_cycle) in [
        ("incremental_engine", false),
        ("incremental_engine_full_cycle", true),
    ] {
        group.bench_function(name, |b| {
            let st = engine.get_or_insert_with(|| build_engine(&world));
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| engine_step(st, &world, full_cycle))
                    .sum()
            });
        });
        if let Some(st) = engine.as_mut() {
            all_confirmed(&st.engine).expect("steady state kept");
            let consolidations = st.engine.stats().consolidations;
            eprintln!(
                "diff: {name}: {} steps: {:.1} actions at the window, {:.1} REQs and \
                 {:.0} REQ bytes per step in all (EOSE follow-ups included), \
                 {:.1} consolidations per step",
                st.steps,
                st.actions_seen as f64 / st.steps as f64,
                st.reqs.reqs as f64 / st.steps as f64,
                st.reqs.bytes as f64 / st.steps as f64,
                (consolidations - st.consolidations) as f64 / st.steps as f64
            );
            (st.steps, st.actions_seen, st.reqs) = (0, 0, ReqCount::default());
            st.consolidations = consolidations;
        }
    }
    drop(engine);

    let mut baseline: Option<SeedState> = None;
    group.bench_function("seed_full_recompute", |b| {
        let st = baseline.get_or_insert_with(|| build_seed(&world));
        b.iter_custom(|iters| (0..iters).map(|_| seed_step(st, &world)).sum());
    });
    if let Some(st) = baseline.take() {
        eprintln!(
            "diff: seed steps {}: {:.1} relay actions, {:.1} new (relay, root) pairs per step",
            st.steps,
            st.relay_actions as f64 / st.steps as f64,
            st.new_roots as f64 / st.steps as f64
        );
    }
    group.finish();
}

criterion_group!(benches, bench_diff);
criterion_main!(benches);
