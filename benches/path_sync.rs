//! Load run (not criterion): first sync over real paths (issue 46). The
//! release binary with its default flags syncs a world a relay joining the
//! network meets: its own relay holds only the repo announcements, and the
//! roots and their replies are on remote relays some round-trip time
//! away, so discovery (announcement → roots → replies) is part of the
//! sync, and every page of history pays the path.
//!
//! ```sh
//! cargo build --release
//! # `cargo bench` and `cargo test --release` leave another build at
//! # target/release/grasp-sync (2.2 times the size): time a copy
//! cp target/release/grasp-sync /tmp/grasp-sync-under-test
//! export GRASP_SYNC_BIN=/tmp/grasp-sync-under-test
//! cargo bench --bench path_sync -- discover 20000 local,0,100,300 3
//! cargo bench --bench path_sync -- grasp 2000 60 50000 3 [rs]
//! ```
//!
//! - `discover N RTTS [rounds]`: the own relay gets one announcement; one
//!   remote holds the repo's issue and its N replies. The remote is a
//!   relay of the in-process farm behind a [`Link`] of each round-trip
//!   time in `RTTS` (milliseconds; 500 results per filter, NIP-77 and Nagle
//!   left on, as a LocalRelay), or, for `local`, a real LocalRelay on
//!   loopback. Timed: engine start until the own relay holds all N+1
//!   events, against "direct", the same N+1 events published straight to
//!   a fresh own relay; rounds alternate direct and engine; the figure is
//!   direct / engine (the issue's goals: ≥ 0.8 at 0 ms, ≥ 0.6 at 100 ms,
//!   ≥ 0.4 at 300 ms).
//! - `grasp REPOS RELAYS EVENTS [rounds]`: a GRASP-shaped world. REPOS
//!   repos of 100 owners, each on 2–4 of RELAYS farm relays; the relays'
//!   round-trip times spread evenly over 20–300 ms; even relays cap
//!   results at 100 per filter and speak no NIP-77 (khatru), odd ones cap
//!   at 500 and speak it (strfry, rust-nostr); all serve NIP-11. Each repo
//!   has 1–3 roots (issues and patches); EVENTS roots and replies in all,
//!   the replies spread over the roots by Zipf's law (the busiest root has
//!   thousands); each event is on each of its repo's relays with
//!   probability 3/4 (on the first one always). Timed: engine start until
//!   the own relay holds all EVENTS, against a lower bound: direct ingest
//!   of the same events, plus the slowest relay's handshake (two round
//!   trips: TCP, websocket) and three more of its round trips (roots,
//!   replies, one spare). The issue's goal: within 2× the bound.
//!
//! The own relay is a LocalRelay (nostr-sdk 0.45.1, limits raised as the
//! tests run it, 75,000 events at most), fresh for every measurement; with
//! `rs`, nostr-rs-relay 0.8.12 (`NOSTR_RS_RELAY_BIN`, or where `.ci/run`
//! installs it). The farm runs in this process, on its own thread.
//! `PATH_SYNC_TRACE=1` prints the engine's progress every second;
//! `PATH_SYNC_ARGS` adds engine flags (not for the issue's figures, which
//! are at default flags: e.g. `--batch-window-ms 200` shows what the
//! batch windows cost).

#[path = "common/engine_process.rs"]
mod engine_process;
#[path = "common/load_run.rs"]
mod load_run;
#[path = "common/rng.rs"]
mod rng;
#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use engine_process::cpu_seconds;
use grasp_sync::testing::farm::{FarmOptions, Link, RelayFarm, RelayProfile};
use load_run::{Own, OwnKind, direct_run, engine_run, spread};
use nostr::prelude::*;
use rng::Rng;
use support::real::{PyRelay, publish, publish_bulk};
use support::{T0, announcement, coord, keys, reply, root, wide_keys};

/// How long one first sync may take before the run fails.
const LIMIT: Duration = Duration::from_secs(1_200);

/// One world: what the own relay is told before the engine starts, and
/// the events to sync.
struct World {
    /// Announcements, published to the own relay before start.
    own_setup: Vec<Event>,
    /// The roots and replies the engine must bring to the own relay.
    events: Vec<Event>,
}

impl World {
    fn ids(&self) -> Vec<EventId> {
        self.events.iter().map(|e| e.id).collect()
    }
}

/// Where `discover`'s remote is.
#[derive(Clone, Copy, Debug)]
enum Remote {
    /// A real LocalRelay on loopback.
    Local,
    /// A farm relay behind a link of this round-trip time.
    Farm(Duration),
}

/// The issue and its `n` replies, with one second each (oldest first).
fn one_issue(n: usize) -> Vec<Event> {
    let owner = keys(1);
    let start = T0 - 1_000_000;
    let issue = root(&keys(2), 1621, &[&coord(&owner, "repo")], start, "issue");
    let mut events = vec![issue.clone()];
    events.extend((0..n).map(|i| reply(&keys(3), &issue, start + 1 + i as u64, &format!("r{i}"))));
    events
}

/// `discover`: one issue with `n` replies on one remote, at each of
/// `remotes`, `rounds` rounds each.
fn discover(n: usize, remotes: &[Remote], rounds: usize, kind: OwnKind) {
    let events = one_issue(n);
    let ids: Vec<EventId> = events.iter().map(|e| e.id).collect();
    let rtts: Vec<(usize, Duration)> = remotes
        .iter()
        .filter_map(|r| match r {
            Remote::Farm(rtt) => Some(*rtt),
            Remote::Local => None,
        })
        .enumerate()
        .collect();
    // One farm relay per round-trip time, each holding the whole history:
    // the engine never writes to a remote, so the rounds share them.
    // As a LocalRelay: 500 results per filter, NIP-77, Nagle left on.
    let farm = RelayFarm::start(
        rtts.len(),
        FarmOptions {
            negentropy: true,
            links: rtts.iter().map(|&(i, rtt)| (i, Link::rtt(rtt))).collect(),
            profiles: rtts
                .iter()
                .map(|&(i, _)| {
                    let profile = RelayProfile {
                        max_results_per_filter: Some(500),
                        nagle: true,
                        ..RelayProfile::default()
                    };
                    (i, profile)
                })
                .collect(),
            ..FarmOptions::default()
        },
    )
    .expect("the farm starts");
    for &(i, _) in &rtts {
        farm.seed(i, events.clone());
    }
    let mut local = None;
    let mut next_farm = 0;
    for remote in remotes {
        // The remote's process, for its CPU: the LocalRelay's, or this
        // one, whose farm thread serves (and which polls the metrics).
        let (url, label, rtt, remote_pid) = match remote {
            Remote::Local => {
                let relay = local.get_or_insert_with(|| {
                    let relay = PyRelay::start();
                    publish_bulk(&relay.url, &events);
                    relay
                });
                let pid = relay.pid();
                (relay.url.clone(), "local".to_owned(), Duration::ZERO, pid)
            }
            Remote::Farm(rtt) => {
                let url = farm.url(next_farm);
                next_farm += 1;
                let label = format!("{}ms", rtt.as_millis());
                (url, label, *rtt, std::process::id())
            }
        };
        let world = World {
            own_setup: vec![announcement(&keys(1), "repo", &[&url], T0 - 2_000_000)],
            events: events.clone(),
        };
        let (mut direct, mut engine, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let d = direct_run(kind, &world.events, &ids);
            let remote_cpu = cpu_seconds(remote_pid);
            let e = measure(kind, &world, &ids);
            let remote_cpu = cpu_seconds(remote_pid) - remote_cpu;
            eprintln!(
                "discover {label} round {round}: direct {d:.2} s, engine {:.2} s ({:.2} s CPU, \
                 remote {remote_cpu:.2} s CPU, {} duplicates), ratio {:.2}{}",
                e.seconds,
                e.cpu_seconds,
                e.duplicates,
                d / e.seconds,
                round_trips(e.seconds - d, rtt)
            );
            direct.push(d);
            engine.push(e.seconds);
            ratios.push(d / e.seconds);
        }
        println!(
            "path_sync discover remote={label} own={} events={} rounds={rounds} \
             direct_s={} engine_s={} ratio={}",
            kind.name(),
            n + 1,
            spread(&direct, 2),
            spread(&engine, 2),
            spread(&ratios, 2),
        );
    }
}

/// ", ~K round trips" for the time the engine took beyond direct, at a
/// round-trip time above zero.
fn round_trips(extra_seconds: f64, rtt: Duration) -> String {
    match rtt.is_zero() {
        true => String::new(),
        false => format!(
            ", {:.0} round trips beyond direct",
            extra_seconds / rtt.as_secs_f64()
        ),
    }
}

/// One engine run on a fresh own relay told `world.own_setup`.
fn measure(kind: OwnKind, world: &World, ids: &[EventId]) -> load_run::EngineRun {
    let own = Own::start(kind);
    publish(own.url(), &world.own_setup);
    engine_run(&own, world.events.len(), ids, LIMIT)
}

/// Relay `i`'s round-trip time of `count`: evenly from 20 to 300 ms.
fn grasp_rtt(i: usize, count: usize) -> Duration {
    let step = 280 * i as u64 / (count.max(2) - 1) as u64;
    Duration::from_millis(20 + step)
}

/// The GRASP-shaped world (see the module doc) on `farm`'s relays.
fn grasp_world(farm: &RelayFarm, repos: usize, total: usize) -> World {
    let relays = farm.len();
    let mut rng = Rng::new(46);
    // Every event its own second: thousands of index events in one second
    // are more than a LocalRelay returns for it (500).
    let mut clock = T0 - 5_000_000;
    let mut tick = || {
        clock += 1;
        clock
    };
    let mut own_setup = Vec::new();
    let mut repo_relays = Vec::new();
    let mut roots = Vec::new();
    for r in 0..repos {
        let owner = wide_keys(r as u32 % 100);
        let d = format!("repo{r}");
        let mut on: Vec<usize> = Vec::new();
        while on.len() < 2 + r % 3 {
            let relay = rng.below(relays as u64) as usize;
            if !on.contains(&relay) {
                on.push(relay);
            }
        }
        let urls: Vec<String> = on.iter().map(|&i| farm.url(i)).collect();
        let url_refs: Vec<&str> = urls.iter().map(String::as_str).collect();
        own_setup.push(announcement(&owner, &d, &url_refs, tick()));
        for k in 0..1 + r % 3 {
            let kind = if k == 1 { 1617 } else { 1621 };
            let text = format!("root {k} of {d}");
            roots.push((
                r,
                root(
                    &wide_keys(1_000 + r as u32 % 50),
                    kind,
                    &[&coord(&owner, &d)],
                    tick(),
                    &text,
                ),
            ));
        }
        repo_relays.push(on);
    }
    // Zipf's law over the roots, in an order unrelated to the repos'.
    let replies_total = total.saturating_sub(roots.len());
    let mut order: Vec<usize> = (0..roots.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let weight: Vec<f64> = (0..roots.len())
        .map(|rank| 1.0 / (rank + 1) as f64)
        .collect();
    let sum: f64 = weight.iter().sum();
    let mut counts: Vec<usize> = weight
        .iter()
        .map(|w| (w / sum * replies_total as f64) as usize)
        .collect();
    let short = replies_total - counts.iter().sum::<usize>();
    for c in counts.iter_mut().take(short) {
        *c += 1;
    }
    let mut events = Vec::new();
    let mut per_relay = vec![Vec::new(); relays];
    let mut place = |r: usize, event: &Event, rng: &mut Rng| {
        for (k, &relay) in repo_relays[r].iter().enumerate() {
            if k == 0 || rng.below(4) != 0 {
                per_relay[relay].push(event.clone());
            }
        }
    };
    for (rank, &j) in order.iter().enumerate() {
        let (r, root) = &roots[j];
        place(*r, root, &mut rng);
        events.push(root.clone());
        for i in 0..counts[rank] {
            let author = wide_keys(2_000 + (i % 200) as u32);
            let event = reply(&author, root, tick(), &format!("reply {i}"));
            place(*r, &event, &mut rng);
            events.push(event);
        }
    }
    for (relay, held) in per_relay.into_iter().enumerate() {
        farm.seed(relay, held);
    }
    eprintln!(
        "grasp world: {repos} repos, {} roots, {} events, busiest root {} replies",
        roots.len(),
        events.len(),
        counts.first().copied().unwrap_or(0)
    );
    World { own_setup, events }
}

/// `grasp`: the GRASP-shaped world, `rounds` rounds.
fn grasp(repos: usize, relays: usize, total: usize, rounds: usize, kind: OwnKind) {
    let profile = |i: usize| match i % 2 {
        0 => RelayProfile {
            max_results_per_filter: Some(100),
            no_negentropy: true,
            nip11: true,
            ..RelayProfile::default()
        },
        _ => RelayProfile {
            max_results_per_filter: Some(500),
            nip11: true,
            ..RelayProfile::default()
        },
    };
    let farm = RelayFarm::start(
        relays,
        FarmOptions {
            negentropy: true,
            links: (0..relays)
                .map(|i| (i, Link::rtt(grasp_rtt(i, relays))))
                .collect(),
            profiles: (0..relays).map(|i| (i, profile(i))).collect(),
            ..FarmOptions::default()
        },
    )
    .expect("the farm starts");
    let world = grasp_world(&farm, repos, total);
    let ids = world.ids();
    let slowest = (0..relays)
        .map(|i| grasp_rtt(i, relays))
        .max()
        .unwrap_or_default()
        .as_secs_f64();
    let (mut direct, mut engine, mut bounds, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let d = direct_run(kind, &world.events, &ids);
        let bound = d + 5.0 * slowest;
        let e = measure(kind, &world, &ids);
        eprintln!(
            "grasp round {round}: direct {d:.2} s, bound {bound:.2} s, engine {:.2} s \
             ({:.2} s CPU, {} duplicates), engine / bound {:.2}",
            e.seconds,
            e.cpu_seconds,
            e.duplicates,
            e.seconds / bound
        );
        direct.push(d);
        bounds.push(bound);
        engine.push(e.seconds);
        ratios.push(e.seconds / bound);
    }
    println!(
        "path_sync grasp repos={repos} relays={relays} own={} events={} rounds={rounds} \
         direct_s={} bound_s={} engine_s={} engine_over_bound={}",
        kind.name(),
        world.events.len(),
        spread(&direct, 2),
        spread(&bounds, 2),
        spread(&engine, 2),
        spread(&ratios, 2),
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let num =
        |i: usize, default: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let kind = OwnKind::from_args(&args);
    match args.first().map_or("discover", String::as_str) {
        "discover" => {
            let remotes: Vec<Remote> = args
                .get(2)
                .map_or("local,0,100,300", String::as_str)
                .split(',')
                .map(|r| match r {
                    "local" => Remote::Local,
                    ms => Remote::Farm(Duration::from_millis(
                        ms.parse().expect("a round-trip time in ms, or local"),
                    )),
                })
                .collect();
            discover(num(1, 20_000), &remotes, num(3, 3), kind);
        }
        "grasp" => grasp(num(1, 2_000), num(2, 60), num(3, 50_000), num(4, 3), kind),
        other => panic!(
            "unknown world {other}: discover N RTTS [rounds] | grasp REPOS RELAYS EVENTS [rounds]"
        ),
    }
}
