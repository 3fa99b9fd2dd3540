//! What a first-sync load run measures, shared by the runs that time the
//! release binary against a fresh own relay (`path_sync`, `first_sync`):
//! the own relay,
//! the engine's run until the own relay holds every event, the direct
//! baseline (the same events published straight to a fresh own relay),
//! and min/median/max over rounds.

#![allow(dead_code)]

use std::process::Command;
use std::time::{Duration, Instant};

use nostr::prelude::{Event, EventId};

use super::engine_process::{cpu_seconds, engine_bin, metric, metrics_page, start_engine};
use super::support::real::{PyRelay, RsRelay, free_port, missing, publish_bulk};

/// Which relay serves as the own relay.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum OwnKind {
    /// rust-nostr's LocalRelay (nostr-sdk 0.45.1): memory, 75,000 events
    /// at most.
    Local,
    /// nostr-rs-relay 0.8.12 on sqlite (`NOSTR_RS_RELAY_BIN`, or where
    /// `.ci/run` installs it).
    Rs,
}

impl OwnKind {
    /// `rs` among the arguments picks nostr-rs-relay.
    pub fn from_args(args: &[String]) -> OwnKind {
        match args.iter().any(|a| a == "rs") {
            true => OwnKind::Rs,
            false => OwnKind::Local,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            OwnKind::Local => "localrelay",
            OwnKind::Rs => "nostr-rs-relay",
        }
    }
}

/// An own relay of the run, stopped when dropped.
pub enum Own {
    Local(PyRelay),
    Rs(RsRelay),
}

impl Own {
    /// A fresh, empty own relay.
    pub fn start(kind: OwnKind) -> Own {
        match kind {
            OwnKind::Local => Own::Local(PyRelay::start()),
            OwnKind::Rs => Own::Rs(RsRelay::start()),
        }
    }

    pub fn url(&self) -> &str {
        match self {
            Own::Local(r) => &r.url,
            Own::Rs(r) => &r.url,
        }
    }

    /// CPU seconds its process used so far.
    pub fn cpu(&self) -> f64 {
        let pid = match self {
            Own::Local(r) => Some(r.pid()),
            Own::Rs(r) => r.pid(),
        };
        pid.map_or(0.0, cpu_seconds)
    }
}

/// One engine run.
pub struct EngineRun {
    /// Engine start until the own relay answered `OK` to every event.
    pub seconds: f64,
    /// User and system CPU the engine used.
    pub cpu_seconds: f64,
    /// Events the own relay already held when the engine sent them.
    pub duplicates: u64,
}

/// Starts the release binary (`GRASP_SYNC_BIN`; default flags but
/// `PATH_SYNC_ARGS`) against
/// `own` and times it until the own relay has answered `OK` (new or
/// already held) to `n` events; then checks the own relay holds every one
/// of `ids`. Panics past `limit`, or if any is missing.
pub fn engine_run(own: &Own, n: usize, ids: &[EventId], limit: Duration) -> EngineRun {
    let port = free_port();
    let started = Instant::now();
    // Default flags, unless PATH_SYNC_ARGS names some to try (e.g.
    // "--batch-window-ms 200": what the batch windows cost).
    let extra = std::env::var("PATH_SYNC_ARGS").unwrap_or_default();
    let mut engine = start_engine(&engine_bin(), own.url(), port, extra.split_whitespace());
    let deadline = started + limit;
    let stored = |label| metric(port, "grasp_sync_sink_events_total", label).unwrap_or(0);
    // PATH_SYNC_TRACE=1 prints the engine's counts every second.
    let trace = std::env::var_os("PATH_SYNC_TRACE").is_some();
    let mut traced = Instant::now();
    loop {
        let done = stored("outcome=\"stored\"") + stored("outcome=\"duplicate\"");
        if done >= n as u64 {
            break;
        }
        if trace && traced.elapsed() >= Duration::from_secs(1) {
            traced = Instant::now();
            // Where the time goes: the outbox full means the own relay
            // is the bottleneck; CPU of each process says who takes it.
            eprintln!(
                "  {:6.1} s: {done} of {n} stored, outbox {}, CPU s: engine {:.2} own {:.2} \
                 this process (farm) {:.2}",
                started.elapsed().as_secs_f64(),
                metric(port, "grasp_sync_outbox_depth", "").unwrap_or(0),
                cpu_seconds(engine.id()),
                own.cpu(),
                cpu_seconds(std::process::id()),
            );
        }
        if Instant::now() > deadline {
            let page = metrics_page(port);
            let _ = engine.kill();
            let _ = engine.wait();
            panic!("no convergence in {limit:?} ({done} of {n}); its metrics:\n{page}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = cpu_seconds(engine.id());
    let duplicates = stored("outcome=\"duplicate\"");
    let _ = Command::new("kill").arg(engine.id().to_string()).status();
    let _ = engine.wait();
    assert_eq!(
        missing(own.url(), ids),
        0,
        "events missing from the own relay"
    );
    EngineRun {
        seconds,
        cpu_seconds,
        duplicates,
    }
}

/// Seconds to publish `events` straight to a fresh own relay (one
/// websocket at a time, 500 in flight, as `publish_bulk` does), checked.
pub fn direct_run(kind: OwnKind, events: &[Event], ids: &[EventId]) -> f64 {
    let own = Own::start(kind);
    let started = Instant::now();
    publish_bulk(own.url(), events);
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(missing(own.url(), ids), 0, "direct: events missing");
    seconds
}

/// (min, median, max).
pub fn stats(xs: &[f64]) -> (f64, f64, f64) {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    (xs[0], xs[xs.len() / 2], xs[xs.len() - 1])
}

/// `min/median/max` with `decimals` decimals.
pub fn spread(xs: &[f64], decimals: usize) -> String {
    let (lo, mid, hi) = stats(xs);
    format!("{lo:.decimals$}/{mid:.decimals$}/{hi:.decimals$}")
}
