//! Round trips per first sync, counted in simulated time (issue 46): the
//! harness of `tests/sim_round_trips.rs` and `benches/round_trips.rs`.
//!
//! A relay joining the network meets this: its own relay holds only a
//! repo's announcement, and a remote relay holds the repo's issue and the
//! issue's N replies. Every reply and live event of the remote reaches the
//! engine one round-trip time after what caused it
//! (`FakeRelay::reply_delay`); the own relay sits beside the engine (no
//! delay). The time from engine start until every reply is in
//! `Sim::ingested`, divided by the round-trip time, is the number of
//! round trips the first sync costs: the one figure that says whether it
//! runs at the speed of the path, whatever the machine. The simulation's
//! connects are instant, so the count leaves the handshakes out (two round
//! trips per relay on a real path: TCP, then the websocket upgrade).
//! Remote results are capped per filter (`FakeRelay::filter_cap`), as
//! khatru (100) and strfry (500) cap them: each runs one query per
//! filter of a REQ. (A relay capping per REQ as a whole, as nostr-relay
//! does, is `sim_no_loss`'s.)

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use grasp_sync::RelayInfo;
use grasp_sync::testing::sim::*;
use nostr::prelude::*;

/// The remote relay holding the issue and its replies.
pub const A: &str = "wss://remote.example";

/// The round-trip time of the remote relay.
pub const RTT: Duration = Duration::from_millis(100);

/// History sizes of the matrix. 100,000 is the issue's largest; see
/// [`N_MAX`].
pub const NS: [usize; 3] = [1_000, 20_000, N_MAX];

/// The largest history, the issue's. The fake relay scans its whole store
/// per REQ and the own relay its whole store per event it takes, so a run
/// costs N² (two minutes in a debug build for this one, hence the
/// `--release` in the commands of [`round_trip_table`]).
pub const N_MAX: usize = 100_000;

/// Results per filter the remote returns at most: khatru's 100 and
/// strfry's 500.
pub const CAPS: [usize; 2] = [100, 500];

/// Simulated time allowed for one first sync before the run counts as
/// stuck: far above what even sequential paging of the largest history
/// needs (1,000 pages of 100 at 100 ms is 100 s).
pub const GIVE_UP: Duration = Duration::from_secs(3_600);

/// Clock step while waiting for the replies: the resolution of the count
/// (a twentieth of a round trip).
pub const STEP: Duration = Duration::from_millis(5);

/// The repo's owner; its issue's author; the replies' author.
pub fn owner() -> Keys {
    keys(1)
}

/// The issue every world shares, older than all its replies.
pub fn issue() -> &'static Event {
    static ISSUE: OnceLock<Event> = OnceLock::new();
    ISSUE.get_or_init(|| {
        let repo = coord(&owner(), "r");
        root(
            &keys(2),
            1621,
            &[&repo],
            T0 - 10 * (N_MAX as u64 + 2),
            "an issue",
        )
    })
}

/// The newest `n` replies to [`issue`], one every 10 seconds back from
/// [`T0`], newest first: the first `n` of a longer history are the
/// history of `n`, with the same density. Signed once per test binary and
/// kept (signing 100,000 events takes seconds).
pub fn replies(n: usize) -> Vec<Event> {
    static REPLIES: Mutex<Vec<Event>> = Mutex::new(Vec::new());
    let mut replies = REPLIES.lock().unwrap_or_else(|e| e.into_inner());
    let issue = issue();
    for i in replies.len()..n {
        let at = T0 - 10 * (i as u64 + 1);
        replies.push(reply(&keys(3), issue, at, &format!("r{i}")));
    }
    replies[..n].to_vec()
}

/// One first sync, measured.
#[derive(Debug, Clone)]
pub struct Run {
    /// Replies in the history.
    pub n: usize,
    /// The remote's result cap.
    pub cap: usize,
    /// The remote answers NIP-77.
    pub nip77: bool,
    /// Engine start until the last reply was ingested.
    pub elapsed: Duration,
    /// `elapsed` over the round-trip time.
    pub round_trips: f64,
    /// REQs the remote received.
    pub reqs: usize,
    /// NEG-OPENs the remote received.
    pub neg_opens: usize,
    /// Most subscriptions the remote saw open at once.
    pub peak_subs: usize,
    /// Filters of each REQ the remote received, in order.
    pub req_sizes: Vec<usize>,
    /// Filters per REQ the engine held the remote to, each value it took
    /// in turn.
    pub filters_per_req: Vec<usize>,
}

/// Runs the first sync of a repo whose issue has `n` replies on one remote
/// relay `rtt` away that returns at most `cap` results per filter and
/// answers NIP-77 if `nip77`, with the engine's default
/// [`Config`](grasp_sync::Config) but for `batch_window` when given.
/// Panics if the replies do not all arrive within [`GIVE_UP`].
pub fn first_sync(
    n: usize,
    cap: usize,
    nip77: bool,
    rtt: Duration,
    batch_window: Option<Duration>,
) -> Run {
    first_sync_on(n, cap, nip77, rtt, batch_window, |_| {})
}

/// [`first_sync`] on a remote that `shape` gave more traits (a limit it
/// keeps unstated, say).
pub fn first_sync_on(
    n: usize,
    cap: usize,
    nip77: bool,
    rtt: Duration,
    batch_window: Option<Duration>,
    shape: impl FnOnce(&mut FakeRelay),
) -> Run {
    let issue = issue();
    let replies = replies(n);
    let mut cfg = config();
    if let Some(window) = batch_window {
        cfg.batch_window = window;
    }
    let mut sim = Sim::new(cfg);
    let start = sim.now;
    let remote = sim.add_relay(A);
    remote.reply_delay = rtt;
    remote.filter_cap = cap;
    remote.negentropy = match nip77 {
        true => NegMode::Supported,
        false => NegMode::Unknown,
    };
    // Their NIP-11 documents, as each serves it: khatru's names its
    // software, which checks no filter count; strfry's its software and
    // `max_limit`.
    let doc = match cap {
        100 => r#"{"software":"https://github.com/fiatjaf/khatru"}"#.to_string(),
        _ => format!(r#"{{"software":"strfry","limitation":{{"max_limit":{cap}}}}}"#),
    };
    remote.info = RelayInfo::parse(&doc);
    shape(remote);
    // Oldest first, as a relay that received them in order stores them.
    remote.events.push(issue.clone());
    remote.events.extend(replies.iter().rev().cloned());
    let own = sim.own.clone();
    sim.seed(
        &own,
        &announcement(&owner(), "r", &[OWN, A], T0 - 10_000_000),
    );

    let mut waiting: HashSet<EventId> = replies.iter().map(|e| e.id).collect();
    waiting.insert(issue.id);
    let mut seen = 0;
    let mut filters_per_req = Vec::new();
    while !waiting.is_empty() {
        assert!(
            sim.now.since(start) < GIVE_UP,
            "n={n} cap={cap} nip77={nip77}: {} of {} events still missing after {GIVE_UP:?}",
            waiting.len(),
            n + 1
        );
        sim.advance(STEP);
        let limit = sim
            .engine
            .relay_view(sim.id(A), sim.now)
            .limits
            .filters_per_req;
        if filters_per_req.last() != Some(&limit) {
            filters_per_req.push(limit);
        }
        for (_, event) in &sim.ingested[seen..] {
            waiting.remove(&event.id);
        }
        seen = sim.ingested.len();
    }
    let elapsed = sim.now.since(start);
    Run {
        n,
        cap,
        nip77,
        elapsed,
        round_trips: elapsed.as_secs_f64() / rtt.as_secs_f64(),
        reqs: sim.relays[A].reqs.len(),
        peak_subs: sim.relays[A].peak_subs,
        neg_opens: sim.relays[A].neg_opens,
        req_sizes: sim.relays[A].reqs.iter().map(|(_, f)| f.len()).collect(),
        filters_per_req,
    }
}

/// Round trips the first sync of `n` replies costs, as [`first_sync`]
/// with the default batch window.
pub fn round_trips(n: usize, cap: usize, nip77: bool, rtt: Duration) -> f64 {
    first_sync(n, cap, nip77, rtt, None).round_trips
}

/// A 200 ms batch window: the difference it makes to a first sync's
/// round trips is what waiting out the default (5 s) windows costs.
pub const SHORT_WINDOW: Duration = Duration::from_millis(200);

/// Prints runs as a table, each with its twin under [`SHORT_WINDOW`].
pub fn print(runs: &[(Run, Run)]) {
    eprintln!("first sync round trips, RTT {RTT:?} (rt = simulated time / RTT):");
    eprintln!(
        "{:>7} {:>4} {:>6} | {:>7} {:>7} {:>5} {:>4} | {:>8} {:>7} {:>5} | {:>6}",
        "N", "cap", "NIP-77", "rt", "time", "REQs", "NEG", "rt@200ms", "time", "REQs", "window"
    );
    for (default, short) in runs {
        eprintln!(
            "{:>7} {:>4} {:>6} | {:>7.1} {:>6.1}s {:>5} {:>4} | {:>8.1} {:>6.1}s {:>5} | {:>6.1}",
            default.n,
            default.cap,
            if default.nip77 { "on" } else { "off" },
            default.round_trips,
            default.elapsed.as_secs_f64(),
            default.reqs,
            default.neg_opens,
            short.round_trips,
            short.elapsed.as_secs_f64(),
            short.reqs,
            default.round_trips - short.round_trips,
        );
    }
}

/// Both runs of one cell of the matrix, checked for what holds today:
/// every reply arrived (else [`first_sync`] panics), and no first sync
/// beats the one round trip its first REQ needs.
pub fn cell(n: usize, cap: usize, nip77: bool) -> (Run, Run) {
    let default = first_sync(n, cap, nip77, RTT, None);
    let short = first_sync(n, cap, nip77, RTT, Some(SHORT_WINDOW));
    for run in [&default, &short] {
        assert!(run.round_trips >= 1.0, "faster than the path: {run:?}");
        assert!(run.reqs >= 1, "history read without a REQ: {run:?}");
    }
    (default, short)
}
