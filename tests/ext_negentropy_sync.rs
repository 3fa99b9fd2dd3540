//! Issue 7, end to end: the `grasp-sync` binary syncing by NIP-77
//! negentropy from relays nobody here wrote, all on 127.0.0.1 with
//! OS-picked ports.
//!
//! - Against rust-nostr's LocalRelay (nostr-sdk 0.45.1 wheel), which speaks
//!   NIP-77: of 10,000 events the own relay lacks 10; negentropy fetches
//!   exactly those and reads at least 20× fewer bytes than a `--no-negentropy`
//!   run doing the same sync by REQ + pagination (both measured by the
//!   engine's own `grasp_sync_bytes_total{direction="in"}`). A real daily
//!   sync (short `--daily-*-secs`) then fetches only what was added.
//! - Against nostr-rs-relay 0.8.12, which answers `NEG-OPEN` with a NOTICE
//!   ("could not parse command"): the engine falls back to REQ and delivers
//!   everything, and does so again after a restart (what it learnt about
//!   the relay lives in the process only).
//! - A bulk import on the own relay (a full LocalRelay page of events in one
//!   second) no longer hides everything older from the sink listing.
//!
//! The wheel's LocalRelay has no switch to turn NIP-77 off, so "a relay
//! without NIP-77" is nostr-rs-relay here.

mod support;

use std::time::{Duration, Instant};

use nostr::prelude::*;
use support::real::{GraspSync, PyRelay, RsRelay, free_port, publish_bulk};
use support::running::{http_get, wait_for};
use support::*;

/// Events the remote holds in the byte comparison.
const HISTORY: usize = 10_000;
/// Of those, how many the own relay lacks.
const MISSING: usize = 10;

fn ids(events: &[Event]) -> Vec<EventId> {
    events.iter().map(|e| e.id).collect()
}

/// `count` NIP-22 comments on the repo `coord` (its `A` tag, which the
/// engine's Layer 2 `#A` filter asks for) by four authors, four a second
/// from `from`, each with a few sentences of text like a real comment.
fn comments(coord: &str, count: usize, from: u64) -> Vec<Event> {
    let authors: Vec<Keys> = (10..14).map(keys).collect();
    (0..count)
        .map(|i| {
            let text = format!(
                "comment {i} on the repo: {}",
                "the patch looks fine to me, but please rebase it on main. ".repeat(2)
            );
            repo_comment(&authors[i % 4], coord, from + i as u64 / 4, &text)
        })
        .collect()
}

/// The engine's metrics endpoint on an OS-picked port.
struct Metrics(String);

impl Metrics {
    fn new() -> Metrics {
        Metrics(format!("127.0.0.1:{}", free_port()))
    }

    fn addr(&self) -> &str {
        &self.0
    }

    /// The value of the metric line starting with `name` (labels included), 0 when absent.
    fn get(&self, name: &str) -> u64 {
        let prefix = format!("{name} ");
        http_get(self.0.parse().unwrap(), "/metrics")
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    fn neg(&self, event: &str) -> u64 {
        self.get(&format!("grasp_sync_negentropy_total{{event=\"{event}\"}}"))
    }

    fn bytes_in(&self) -> u64 {
        self.get("grasp_sync_bytes_total{direction=\"in\"}")
    }

    fn serving(&self) -> bool {
        std::net::TcpStream::connect(&self.0).is_ok()
    }
}

/// What one engine run read and did, from its metrics.
#[derive(Debug, Clone, Copy)]
struct Run {
    bytes_in: u64,
    sessions: u64,
    rounds: u64,
    id_fetched: u64,
    fallbacks: u64,
    listed: u64,
    /// Subscriptions the relays refused or closed.
    refusals: u64,
    elapsed: Duration,
}

impl Run {
    fn read(metrics: &Metrics, started: Instant) -> Run {
        Run {
            bytes_in: metrics.bytes_in(),
            sessions: metrics.neg("session"),
            rounds: metrics.neg("round"),
            id_fetched: metrics.neg("id_fetched"),
            fallbacks: metrics.neg("fallback"),
            listed: metrics.neg("sink_listed"),
            refusals: metrics.get("grasp_sync_refusals_total"),
            elapsed: started.elapsed(),
        }
    }
}

/// Asserts `cond` within `secs`, showing the engine's log when it fails.
fn assert_within(secs: u64, engine: &GraspSync, what: &str, cond: impl FnMut() -> bool) {
    assert!(
        wait_for(secs, cond),
        "{what} within {secs} s; engine log:\n{}",
        engine.log()
    );
}

/// Waits until the engine has no batch waiting for EOSE, has confirmed at
/// least one, and has read nothing for half a second: its historic sync is
/// over and the byte count final.
fn settle(engine: &GraspSync, metrics: &Metrics) {
    let mut last = (u64::MAX, Instant::now());
    assert_within(30, engine, "the engine settled", || {
        if !metrics.serving() {
            return false;
        }
        let idle = metrics.get("grasp_sync_pending_batches") == 0
            && metrics.get("grasp_sync_batches_total{result=\"confirmed\"}") >= 1;
        let bytes = metrics.bytes_in();
        if !idle || bytes != last.0 {
            last = (bytes, Instant::now());
            return false;
        }
        last.1.elapsed() >= Duration::from_millis(500)
    });
}

/// An own relay holding the announcement of `owner`'s repo "repo", listing
/// `remote` as its relay, plus `held`.
fn own_relay(owner: &Keys, remote: &str, held: &[Event]) -> PyRelay {
    let own = PyRelay::start();
    publish_bulk(&own.url, &[announcement(owner, "repo", &[remote], T0)]);
    publish_bulk(&own.url, held);
    own
}

/// Runs the binary against `own` (with `extra` flags) until `wanted` is all
/// there and the sync has settled; returns what it cost.
fn sync_once(own: &PyRelay, wanted: &[EventId], extra: &[&str]) -> Run {
    let metrics = Metrics::new();
    let mut args = vec!["--metrics", metrics.addr()];
    args.extend_from_slice(extra);
    let started = Instant::now();
    let engine = GraspSync::start_logged(&own.url, &args, &[("RUST_LOG", "info")]);
    assert_within(60, &engine, "the missing events synced", || {
        own.missing(wanted) == 0
    });
    settle(&engine, &metrics);
    let run = Run::read(&metrics, started);
    assert_eq!(engine.stop(), Some(0));
    run
}

#[test]
fn negentropy_fetches_the_ten_missing_of_ten_thousand_for_a_twentieth_of_the_bytes() {
    let started = Instant::now();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    // Signed once, published to the remote and (less the missing) to both
    // own relays.
    let history = comments(&repo, HISTORY, T0 + 1);
    // Spread over the history: the oldest, the newest and between.
    let missing: Vec<Event> = (0..MISSING)
        .map(|k| history[k * (HISTORY - 1) / (MISSING - 1)].clone())
        .collect();
    let missing_ids = ids(&missing);
    let held: Vec<Event> = history
        .iter()
        .filter(|e| !missing_ids.contains(&e.id))
        .cloned()
        .collect();
    assert_eq!(held.len(), HISTORY - MISSING);

    let remote = PyRelay::start();
    publish_bulk(&remote.url, &history);
    let own_neg = own_relay(&owner, &remote.url, &held);
    let own_req = own_relay(&owner, &remote.url, &held);
    assert_eq!(own_neg.missing(&missing_ids), MISSING);
    assert_eq!(own_req.missing(&missing_ids), MISSING);
    let seeded = started.elapsed();

    // Negentropy (the default): list the own relay, reconcile, fetch the 10.
    let neg = sync_once(&own_neg, &missing_ids, &[]);
    assert_eq!(neg.id_fetched, MISSING as u64, "{neg:?}");
    assert_eq!(neg.fallbacks, 0, "{neg:?}");
    assert_eq!(neg.refusals, 0, "{neg:?}");
    assert!(neg.sessions >= 1 && neg.rounds >= 1, "{neg:?}");
    assert!(
        neg.listed >= held.len() as u64,
        "the sink listed what it holds: {neg:?}"
    );

    // The same sync by REQ + pagination, into an own relay in the same state.
    let req = sync_once(&own_req, &missing_ids, &["--no-negentropy"]);
    assert_eq!(req.sessions, 0, "{req:?}");
    assert_eq!(req.id_fetched, 0, "{req:?}");
    assert_eq!(req.listed, 0, "{req:?}");
    assert_eq!(req.refusals, 0, "{req:?}");

    let ratio = req.bytes_in as f64 / neg.bytes_in as f64;
    eprintln!(
        "negentropy_sync: {HISTORY} events, {MISSING} missing: bytes in with negentropy {} \
         ({} sessions, {} rounds, {} ids fetched, {:.1?}), with REQ {} ({:.1?}): {ratio:.1}x fewer \
         (seeding took {seeded:.1?})",
        neg.bytes_in,
        neg.sessions,
        neg.rounds,
        neg.id_fetched,
        neg.elapsed,
        req.bytes_in,
        req.elapsed,
    );
    assert!(
        neg.bytes_in * 20 <= req.bytes_in,
        "negentropy read {} bytes, REQ {}: only {ratio:.1}x fewer",
        neg.bytes_in,
        req.bytes_in
    );
    // Both runs delivered everything, not only the missing.
    assert_eq!(own_neg.missing(&ids(&history)), 0);
    assert_eq!(own_req.missing(&ids(&history)), 0);

    // A real daily sync: the own relay is complete, so the connect finds
    // nothing missing; events added to the remote afterwards with old
    // timestamps match no live subscription (those start now), so only the
    // daily sync can bring them, by negentropy.
    let metrics = Metrics::new();
    let daily_started = Instant::now();
    let engine = GraspSync::start_logged(
        &own_neg.url,
        &[
            "--metrics",
            metrics.addr(),
            "--daily-min-secs",
            "4",
            "--daily-max-secs",
            "5",
        ],
        &[("RUST_LOG", "info")],
    );
    assert_within(30, &engine, "the connect's reconciliation", || {
        metrics.serving() && metrics.neg("session") >= 1
    });
    settle(&engine, &metrics);
    let connect = Run::read(&metrics, daily_started);
    assert_eq!(connect.id_fetched, 0, "{connect:?}");
    assert_eq!(connect.fallbacks, 0, "{connect:?}");
    let added = comments(&repo, 5, T0 + 100_000);
    publish_bulk(&remote.url, &added);
    assert_within(
        30,
        &engine,
        "the daily sync brought the added events",
        || own_neg.missing(&ids(&added)) == 0,
    );
    settle(&engine, &metrics);
    let daily = Run::read(&metrics, daily_started);
    let log = engine.log();
    assert!(
        log.contains(&format!("{}: daily fresh sync", remote.url)),
        "{log}"
    );
    assert_eq!(daily.id_fetched, added.len() as u64, "{daily:?}\n{log}");
    assert_eq!(daily.fallbacks, 0, "{daily:?}");
    assert!(daily.sessions > connect.sessions, "{daily:?}");
    assert_eq!(engine.stop(), Some(0));
    eprintln!(
        "negentropy_sync: daily sync of {} events, {} added: {} bytes in \
         (the connect before it: {}); test took {:.1?}",
        HISTORY + added.len(),
        added.len(),
        daily.bytes_in - connect.bytes_in,
        connect.bytes_in,
        started.elapsed(),
    );
}

#[test]
#[ignore = "needs nostr-rs-relay 0.8.12: .ci/run installs it"]
fn a_relay_without_nip77_falls_back_to_req_and_delivers_everything() {
    let started = Instant::now();
    let remote = RsRelay::start();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let issue = root(&keys(2), 1621, &[&repo], T0, "issue");
    // Layer 2 (events tagging the repo) and Layer 3 (replies to the issue).
    let mut history = comments(&repo, 300, T0 + 1);
    history.extend((0..200).map(|i| reply(&keys(3), &issue, T0 + 200 + i, &format!("reply {i}"))));
    publish_bulk(&remote.url, std::slice::from_ref(&issue));
    publish_bulk(&remote.url, &history);
    // The own relay holds every other one: negentropy has something to
    // reconcile against, so the engine does send NEG-OPEN.
    let held: Vec<Event> = history.iter().step_by(2).cloned().collect();
    let own = own_relay(&owner, &remote.url, &held);
    publish_bulk(&own.url, std::slice::from_ref(&issue));
    assert!(own.missing(&ids(&history)) > 0);

    let no_negentropy = format!("{}: no negentropy; REQ from now on", remote.url);
    let first = {
        let metrics = Metrics::new();
        let engine = GraspSync::start_logged(
            &own.url,
            &["--metrics", metrics.addr()],
            &[("RUST_LOG", "info")],
        );
        assert_within(60, &engine, "the whole history synced", || {
            own.missing(&ids(&history)) == 0
        });
        settle(&engine, &metrics);
        let run = Run::read(&metrics, started);
        let log = engine.log();
        assert!(run.sessions >= 1, "NEG-OPEN was sent: {run:?}\n{log}");
        assert!(run.fallbacks >= 1, "{run:?}\n{log}");
        assert_eq!(run.rounds, 0, "no NEG-MSG came back: {run:?}");
        assert_eq!(run.id_fetched, 0, "{run:?}");
        assert!(log.contains(&no_negentropy), "{log}");
        assert_eq!(engine.stop(), Some(0));
        run
    };

    // A new process knows nothing of the relay: it tries again, falls back
    // again, and delivers what was added meanwhile.
    let added: Vec<Event> = (0..20)
        .map(|i| {
            reply(
                &keys(4),
                &issue,
                T0 + 1_000 + i,
                &format!("later reply {i}"),
            )
        })
        .collect();
    publish_bulk(&remote.url, &added);
    let metrics = Metrics::new();
    let restarted = Instant::now();
    let engine = GraspSync::start_logged(
        &own.url,
        &["--metrics", metrics.addr()],
        &[("RUST_LOG", "info")],
    );
    assert_within(60, &engine, "the added events synced", || {
        own.missing(&ids(&added)) == 0
    });
    settle(&engine, &metrics);
    let second = Run::read(&metrics, restarted);
    let log = engine.log();
    assert!(second.sessions >= 1, "{second:?}\n{log}");
    assert!(second.fallbacks >= 1, "{second:?}\n{log}");
    assert_eq!(second.id_fetched, 0, "{second:?}");
    assert!(log.contains(&no_negentropy), "{log}");
    assert_eq!(engine.stop(), Some(0));
    assert_eq!(own.missing(&ids(&history)), 0);
    eprintln!(
        "negentropy_sync: nostr-rs-relay fallback: {first:?}; after restart: {second:?}; \
         test took {:.1?}",
        started.elapsed()
    );
}

/// Most events one REQ gets from LocalRelay (nostr-sdk 0.45.1), whatever
/// `limit` asks; its Python builder cannot raise it.
const LOCAL_RELAY_PAGE: usize = 500;

/// A bulk import on the own relay: a full LocalRelay page of events in one
/// second, above 2,000 older ones, of which the own relay lacks 3. Listing
/// the own relay used to stop at the second page (the same 500 again,
/// nothing new), so negentropy took the 2,000 older events for missing and
/// fetched them all again; now the listing steps below that second and
/// exactly the 3 are fetched.
#[test]
fn a_full_listing_page_of_one_second_does_not_hide_older_events() {
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let mut history = comments(&repo, 2_000, T0 + 1);
    let import_second = T0 + 10_000;
    let authors: Vec<Keys> = (20..24).map(keys).collect();
    history.extend((0..LOCAL_RELAY_PAGE).map(|i| {
        repo_comment(
            &authors[i % 4],
            &repo,
            import_second,
            &format!("imported comment {i}"),
        )
    }));
    let missing: Vec<Event> = [17, 1_000, 1_999]
        .iter()
        .map(|&i| history[i].clone())
        .collect();
    let missing_ids = ids(&missing);
    let held: Vec<Event> = history
        .iter()
        .filter(|e| !missing_ids.contains(&e.id))
        .cloned()
        .collect();
    let remote = PyRelay::start();
    publish_bulk(&remote.url, &history);
    let own = own_relay(&owner, &remote.url, &held);
    // The premise: one REQ of the own relay gets one page, all of it in
    // the import's second.
    let (ws, _) = tungstenite::connect(own.url.as_str()).unwrap();
    let mut client = support::client::Client { ws };
    let page = client.req(
        "page",
        vec![Filter::new().kind(Kind::from_u16(1111)).limit(5_000)],
    );
    assert_eq!(page.len(), LOCAL_RELAY_PAGE);
    assert!(page.iter().all(|e| e.created_at.as_secs() == import_second));
    drop(client);

    let run = sync_once(&own, &missing_ids, &[]);
    eprintln!("negentropy_sync: a full page in one second: {run:?}");
    assert_eq!(run.id_fetched, missing.len() as u64, "{run:?}");
    assert_eq!(run.fallbacks, 0, "{run:?}");
    assert!(run.listed >= held.len() as u64, "{run:?}");
    assert_eq!(own.missing(&ids(&history)), 0);
}
