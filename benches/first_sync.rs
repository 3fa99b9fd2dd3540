//! Load run (not criterion): a first sync over a big history, end to end,
//! beside the rate at which the same own relay takes the same events
//! published straight to it (issue 33). Both are measured in one run, in
//! alternating rounds, so the ratio holds on a shared, noisy machine.
//!
//! ```sh
//! cargo build --release
//! cargo bench --bench first_sync -- one-issue 20000 [rounds] [rs]
//! cargo bench --bench first_sync -- relays 2000 50 [rounds] [rs]
//! ```
//!
//! - `one-issue N`: one remote LocalRelay holding one issue with N replies.
//! - `relays R E`: R remote relays (the in-process relay farm), each the
//!   only remote of its own repository, holding an issue with E replies.
//!
//! The own relay is a LocalRelay (nostr-sdk 0.45.1, its limits raised as
//! the tests run it), fresh for every measurement. Its store keeps 75,000
//! events at most, so bigger worlds take `rs`: the own relay is then
//! nostr-rs-relay 0.8.12 (sqlite; `NOSTR_RS_RELAY_BIN` or where `.ci/run`
//! installs it), and `one-issue`'s remote is a relay of the in-process
//! farm answering NIP-77 (a LocalRelay could not hold the history either). The engine is the
//! release binary (`target/release/grasp-sync`, or `GRASP_SYNC_BIN`) with
//! its default settings; the clock runs from its start until the own relay
//! confirmed every event new (its metrics), then the own relay is asked for
//! every id. "Direct" publishes the same events to a fresh own relay over
//! one websocket at a time, 500 in flight (as `publish_bulk` does).

#[path = "common/engine_process.rs"]
mod engine_process;
#[path = "common/load_run.rs"]
mod load_run;
#[path = "../tests/support/mod.rs"]
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use engine_process::{cpu_seconds, engine_bin, metric, metrics_page, start_engine};
use grasp_sync::testing::farm::{FarmOptions, RelayFarm};
use load_run::{Own, OwnKind, stats};
use nostr::prelude::*;
use support::real::{PyRelay, free_port, missing, publish, publish_bulk};
use support::{T0, announcement, coord, keys, reply, root, wide_keys};

/// One world: what the own relay is told first, what the remotes hold.
struct World {
    /// Announcements and issues, published to the own relay before start.
    own_setup: Vec<Event>,
    /// The events to sync, with the index of the remote holding each.
    events: Vec<(usize, Event)>,
}

fn one_issue(n: u64, remote: &str) -> World {
    let owner = keys(1);
    let issue = root(&owner, 1621, &[&coord(&owner, "repo")], T0, "issue");
    let announcement = announcement(&owner, "repo", &[remote], T0);
    let replies = (0..n).map(|i| (0, reply(&keys(2), &issue, T0 + 1 + i, &format!("r{i}"))));
    World {
        own_setup: vec![announcement, issue.clone()],
        events: replies.collect(),
    }
}

fn many_relays(urls: &[String], per_relay: u64) -> World {
    let mut own_setup = Vec::new();
    let mut events = Vec::new();
    for (r, url) in urls.iter().enumerate() {
        // An owner each: the index takes 500 relays per pubkey at most.
        let owner = wide_keys(r as u32);
        // A second each: thousands of index events in one second are more
        // than the own relay returns for it (LocalRelay: 500).
        let (d, at) = (format!("repo{r}"), T0 - 10_000 + r as u64);
        let issue = root(
            &owner,
            1621,
            &[&coord(&owner, &d)],
            at,
            &format!("issue {r}"),
        );
        own_setup.push(announcement(&owner, &d, &[url], at));
        own_setup.push(issue.clone());
        for i in 0..per_relay {
            events.push((r, reply(&keys(2), &issue, T0 + 1 + i, &format!("r{r}.{i}"))));
        }
    }
    World { own_setup, events }
}

/// How long a first sync may take before the run fails.
const LIMIT: Duration = Duration::from_secs(600);

struct Run {
    seconds: f64,
    /// User and system CPU the engine used.
    cpu_seconds: f64,
    /// The own relay's, over the run.
    own_cpu: f64,
    /// The remote's (a LocalRelay, or the in-process farm) and this
    /// process's, over the run.
    others_cpu: f64,
    duplicates: u64,
}

/// Engine start until the own relay confirmed `n` events new.
fn engine_run(own: &Own, remote: Option<u32>, n: usize, ids: &[EventId]) -> Run {
    let port = free_port();
    let (own0, others0) = (own.cpu(), others_cpu(remote));
    let started = Instant::now();
    let extra = std::env::var("FIRST_SYNC_ARGS").unwrap_or_default();
    // Extra flags to try (FIRST_SYNC_ARGS="--max-frames-per-sec 10000").
    let mut engine = start_engine(&engine_bin(), own.url(), port, extra.split_whitespace());
    let deadline = started + LIMIT;
    let stored = |label| metric(port, "grasp_sync_sink_events_total", label).unwrap_or(0);
    // Every event answered `OK` (new or already held); the own relay is
    // asked for each of them below.
    // FIRST_SYNC_TRACE=1 prints every 250 ms; a larger number is the
    // interval in milliseconds.
    let trace = std::env::var("FIRST_SYNC_TRACE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(|ms| Duration::from_millis(if ms > 1 { ms } else { 250 }));
    let mut traced = Instant::now();
    while stored("outcome=\"stored\"") + stored("outcome=\"duplicate\"") < n as u64 {
        if trace.is_some_and(|every| traced.elapsed() >= every) {
            traced = Instant::now();
            let page = metrics_page(port);
            let value = |line: &str| {
                page.lines()
                    .find(|l| l.starts_with(line))
                    .and_then(|l| l.rsplit(' ').next().map(str::to_owned))
                    .unwrap_or_default()
            };
            eprintln!(
                "{:6.2} s: received {} ingested {} outbox {} stored {}",
                started.elapsed().as_secs_f64(),
                value("grasp_sync_events_total{outcome=\"received\"}"),
                value("grasp_sync_events_total{outcome=\"ingested\"}"),
                value("grasp_sync_outbox_depth"),
                value("grasp_sync_sink_events_total{outcome=\"stored\"}"),
            );
        }
        if Instant::now() > deadline {
            let page = metrics_page(port);
            let _ = engine.kill();
            panic!("no convergence in {LIMIT:?}; its metrics:\n{page}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = cpu_seconds(engine.id());
    let (own_cpu, others_cpu) = (own.cpu() - own0, others_cpu(remote) - others0);
    let duplicates = stored("outcome=\"duplicate\"");
    let missing = missing(own.url(), ids);
    let _ = Command::new("kill").arg(engine.id().to_string()).status();
    let _ = engine.wait();
    assert_eq!(missing, 0, "events missing from the own relay");
    Run {
        seconds,
        cpu_seconds,
        own_cpu,
        others_cpu,
        duplicates,
    }
}

/// CPU seconds the other processes of a measurement used so far: this one
/// (the publishing client, or the in-process farm) and a LocalRelay remote.
fn others_cpu(remote: Option<u32>) -> f64 {
    cpu_seconds(std::process::id()) + remote.map_or(0.0, cpu_seconds)
}

/// Seconds, and CPU seconds of the own relay and of the rest.
struct Direct {
    seconds: f64,
    own_cpu: f64,
    others_cpu: f64,
}

fn direct_run(kind: OwnKind, events: &[Event], ids: &[EventId]) -> Direct {
    let own = Own::start(kind);
    let (own0, others0) = (own.cpu(), others_cpu(None));
    let started = Instant::now();
    publish_bulk(own.url(), events);
    let seconds = started.elapsed().as_secs_f64();
    let (own_cpu, others_cpu) = (own.cpu() - own0, others_cpu(None) - others0);
    assert_eq!(missing(own.url(), ids), 0);
    Direct {
        seconds,
        own_cpu,
        others_cpu,
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let num = |i: usize, default: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let mode = args.first().map_or("one-issue", String::as_str);
    let kind = OwnKind::from_args(&args);
    let (rounds, world, _farm, remote);
    match mode {
        "one-issue" if kind == OwnKind::Rs => {
            let options = FarmOptions {
                negentropy: true,
                ..FarmOptions::default()
            };
            let farm = RelayFarm::start(1, options).expect("farm starts");
            world = one_issue(num(1, 20_000), &farm.url(0));
            farm.seed(0, world.events.iter().map(|(_, e)| e.clone()).collect());
            rounds = num(2, 3);
            (_farm, remote) = (Some(farm), None);
        }
        "one-issue" => {
            let relay = PyRelay::start();
            world = one_issue(num(1, 20_000), &relay.url);
            let events: Vec<Event> = world.events.iter().map(|(_, e)| e.clone()).collect();
            publish_bulk(&relay.url, &events);
            rounds = num(2, 3);
            (_farm, remote) = (None, Some(relay));
        }
        "relays" => {
            let count = num(1, 2_000) as usize;
            let farm = RelayFarm::start(count, FarmOptions::default()).expect("farm starts");
            let urls: Vec<String> = (0..count).map(|r| farm.url(r)).collect();
            world = many_relays(&urls, num(2, 50));
            let mut per_relay = vec![Vec::new(); count];
            for (r, e) in &world.events {
                per_relay[*r].push(e.clone());
            }
            for (r, events) in per_relay.into_iter().enumerate() {
                farm.seed(r, events);
            }
            rounds = num(3, 3);
            (_farm, remote) = (Some(farm), None);
        }
        other => panic!("unknown mode {other}: one-issue N | relays R E"),
    }
    let events: Vec<Event> = world.events.iter().map(|(_, e)| e.clone()).collect();
    let ids: Vec<EventId> = events.iter().map(|e| e.id).collect();
    let n = events.len();
    let (mut direct, mut engine, mut dups) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let direct_cpu = direct_run(kind, &events, &ids);
        let d = direct_cpu.seconds;
        let own = Own::start(kind);
        publish(own.url(), &world.own_setup);
        let e = engine_run(&own, remote.as_ref().map(PyRelay::pid), n, &ids);
        eprintln!(
            "round {round}: direct {d:.2} s ({:.0}/s), engine {:.2} s ({:.0}/s, {:.2} s CPU), ratio {:.1} %, duplicates {}",
            n as f64 / d,
            e.seconds,
            n as f64 / e.seconds,
            e.cpu_seconds,
            100.0 * d / e.seconds,
            e.duplicates
        );
        eprintln!(
            "  CPU s: direct: own relay {:.2}, publisher {:.2} ({:.2} cores busy); \
             engine run: own relay {:.2}, engine {:.2}, remote and harness {:.2} ({:.2} cores busy)",
            direct_cpu.own_cpu,
            direct_cpu.others_cpu,
            (direct_cpu.own_cpu + direct_cpu.others_cpu) / d,
            e.own_cpu,
            e.cpu_seconds,
            e.others_cpu,
            (e.own_cpu + e.cpu_seconds + e.others_cpu) / e.seconds
        );
        direct.push(d);
        engine.push(e.seconds);
        dups.push(e.duplicates as f64);
    }
    let ratios: Vec<f64> = direct.iter().zip(&engine).map(|(d, e)| d / e).collect();
    let (dmin, dmed, dmax) = stats(&direct);
    let (emin, emed, emax) = stats(&engine);
    let (rmin, rmed, rmax) = stats(&ratios);
    println!(
        "first_sync {mode} own={} events={n} rounds={rounds} direct_s={dmin:.2}/{dmed:.2}/{dmax:.2} \
         engine_s={emin:.2}/{emed:.2}/{emax:.2} ratio_pct={:.1}/{:.1}/{:.1} duplicates_max={}",
        kind.name(),
        100.0 * rmin,
        100.0 * rmed,
        100.0 * rmax,
        stats(&dups).2
    );
}
