//! One test per fault of the matrix (`grasp_sync::testing::fault::Fault`),
//! over real loopback sockets: an own relay, an honest relay and a faulty
//! relay, both remote relays named in the announcement and both holding the
//! same history. Each test asserts that every honest event reaches the own
//! relay, that no invalid event does, that the honest relay is unaffected
//! (one connection all along, a live event on it arrives within 2 s), that
//! the fault really fired, and that the engine counted it.

mod support;

use std::time::{Duration, Instant};

use grasp_sync::testing::fault::{Fault, TARPIT_LOOKUP, TARPIT_ZONE, tarpit_dns};
use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use grasp_sync::{Config, ShellOptions};
use nostr::prelude::*;
use support::running::*;
use support::*;

/// Frame cap of the engine under test; [`Fault::Oversized`] goes over it.
const MAX_FRAME: usize = 64 * 1024;

/// An engine syncing one repo from an honest and a faulty relay.
struct World {
    own: TestRelay,
    honest: TestRelay,
    faulty: TestRelay,
    repo: String,
    /// On both remote relays before the engine starts.
    history: Vec<Event>,
    running: Running,
}

/// Timings short enough for a fault to play out in seconds.
fn short_timings(config: &mut Config, opts: &mut ShellOptions) {
    config.connect_timeout = Duration::from_secs(1);
    config.eose_timeout = Duration::from_secs(1);
    opts.max_frame_bytes = MAX_FRAME;
    opts.unfinished_timeout = Duration::from_secs(2);
}

impl World {
    /// Starts the relays (the faulty one holding `faulty_only` too) and the
    /// engine; the faulty relay is listed first.
    fn start(fault: Fault, faulty_only: &[Event]) -> World {
        World::start_with(fault, faulty_only, |_, _| {})
    }

    /// [`World::start`], the engine's options changed by `tweak` after
    /// the short timings.
    fn start_with(
        fault: Fault,
        faulty_only: &[Event],
        tweak: fn(&mut Config, &mut ShellOptions),
    ) -> World {
        // RUST_LOG=debug shows the engine's side of each fault.
        let _ = env_logger::builder().is_test(true).try_init();
        let own = TestRelay::start(RelayOptions::default()).unwrap();
        let honest = TestRelay::start(RelayOptions::default()).unwrap();
        let faulty = TestRelay::start(RelayOptions {
            fault: Some(fault),
            ..RelayOptions::default()
        })
        .unwrap();
        let owner = keys(1);
        let repo = coord(&owner, "repo");
        let history = history(&owner, &repo);
        for e in &history {
            honest.publish(e.clone());
            faulty.publish(e.clone());
        }
        for e in faulty_only {
            faulty.publish(e.clone());
        }
        own.publish(announcement(
            &owner,
            "repo",
            &[&faulty.url(), &honest.url()],
            T0,
        ));
        let running = Running::start(&own, |config, opts| {
            short_timings(config, opts);
            tweak(config, opts);
        });
        World {
            own,
            honest,
            faulty,
            repo,
            history,
            running,
        }
    }

    /// Waits until the faulty relay has misbehaved at least `n` times.
    fn wait_for_faults(&self, n: usize) {
        assert!(
            wait_for(30, || self.faulty.faults_injected() >= n),
            "the fault fired {} times, not {n}",
            self.faulty.faults_injected()
        );
    }

    /// Waits until the metric reaches `at_least`.
    fn wait_for_metric(&self, name: &str, at_least: u64) {
        assert!(
            wait_for(30, || self.running.metric(name) >= at_least),
            "{name} is {}, not at least {at_least}",
            self.running.metric(name)
        );
    }

    /// Everything every test asserts: the whole history synced, the honest
    /// relay untouched and live, nothing invalid in the sink. Stops the
    /// engine.
    fn assert_honest_world(self) {
        assert!(
            wait_for(30, || missing(&self.own, &self.history) == 0),
            "{} honest events missing",
            missing(&self.own, &self.history)
        );
        let live = repo_comment(
            &keys(9),
            &self.repo,
            Timestamp::now().as_secs(),
            "live on the honest relay",
        );
        let published = Instant::now();
        self.honest.publish(live.clone());
        assert!(wait_for(30, || self.own.has(&live.id)), "live event lost");
        // Generous for a loaded machine, far below any path but the live one.
        assert!(
            published.elapsed() < Duration::from_secs(10),
            "live event took {:?}",
            published.elapsed()
        );
        assert_eq!(
            self.honest.accepted_count(),
            1,
            "the honest relay was reconnected"
        );
        assert_eq!(self.honest.connection_count(), 1);
        for id in self.faulty.invalid_sent() {
            assert!(!self.own.has(&id), "invalid event {id} reached the sink");
        }
        assert_eq!(
            self.own.rejected_count(),
            0,
            "invalid events were published"
        );
        assert_eq!(
            self.running
                .metric("grasp_sync_sink_events_total{outcome=\"rejected\"}"),
            0
        );
        self.running.stop();
    }

    /// REQs the faulty relay gets in `window` once things settled: a
    /// relay that keeps refusing must not be asked again in a tight loop.
    fn reqs_during(&self, window: Duration) -> usize {
        let before = self.faulty.req_count();
        std::thread::sleep(window);
        self.faulty.req_count() - before
    }
}

/// An issue, a reply, a status, a repo comment and the repo state.
fn history(owner: &Keys, repo: &str) -> Vec<Event> {
    let issue = root(&keys(2), 1621, &[repo], T0 + 1, "issue");
    vec![
        reply(&keys(3), &issue, T0 + 2, "reply"),
        status(owner, &issue, 1630, T0 + 3),
        repo_comment(&keys(4), repo, T0 + 4, "about the repo"),
        state(owner, "repo", T0 + 5),
        issue,
    ]
}

/// Replies only the faulty relay holds.
fn replies_on_faulty(n: u64) -> Vec<Event> {
    let owner = keys(1);
    let issue = root(&keys(2), 1621, &[&coord(&owner, "repo")], T0 + 1, "issue");
    (0..n)
        .map(|i| {
            reply(
                &keys(5),
                &issue,
                T0 + 10 + i,
                &format!("only on faulty {i}"),
            )
        })
        .collect()
}

#[test]
fn drop_mid_stream_loses_nothing_after_the_relay_recovers() {
    let extra = replies_on_faulty(8);
    let w = World::start(
        Fault::DropMidStream {
            after_events: 2,
            connections: 2,
        },
        &extra,
    );
    w.wait_for_faults(2);
    assert!(
        wait_for(15, || missing(&w.own, &extra) == 0),
        "{} of the faulty relay's own events missing after it recovered",
        missing(&w.own, &extra)
    );
    assert_eq!(w.faulty.faults_injected(), 2, "cut exactly twice");
    assert!(w.faulty.accepted_count() >= 3);
    w.wait_for_metric("grasp_sync_connection_attempts_total{result=\"failed\"}", 2);
    w.assert_honest_world();
}

#[test]
fn restart_events_published_while_down_arrive() {
    let w = World::start(
        Fault::Restart {
            after: Duration::from_millis(300),
            down_for: Duration::from_secs(1),
            times: 1,
        },
        &[],
    );
    w.wait_for_faults(1);
    assert!(wait_for(30, || w.faulty.connection_count() == 0));
    let away = repo_comment(
        &keys(6),
        &w.repo,
        Timestamp::now().as_secs() - 5,
        "published while the relay was down",
    );
    w.faulty.publish(away.clone());
    assert!(
        wait_for(15, || w.own.has(&away.id)),
        "event published during the restart lost"
    );
    assert!(w.faulty.accepted_count() >= 2);
    w.wait_for_metric("grasp_sync_connection_attempts_total{result=\"failed\"}", 1);
    w.assert_honest_world();
}

#[test]
fn no_eose_times_the_page_out() {
    let w = World::start(Fault::NoEose, &[]);
    w.wait_for_faults(1);
    w.wait_for_metric("grasp_sync_refusals_total", 1);
    w.assert_honest_world();
}

/// A relay closing every REQ with `reason` is not asked again in a loop.
fn closed_with(reason: &str) {
    let w = World::start(
        Fault::Closed {
            reason: reason.to_owned(),
        },
        &[],
    );
    w.wait_for_faults(1);
    w.wait_for_metric("grasp_sync_refusals_total", 1);
    std::thread::sleep(Duration::from_secs(1));
    let reqs = w.reqs_during(Duration::from_secs(2));
    assert!(reqs <= 10, "{reqs} REQs in 2 s after {reason:?}");
    w.assert_honest_world();
}

#[test]
fn closed_auth_required() {
    closed_with("auth-required: this relay wants NIP-42 first");
}

#[test]
fn closed_rate_limited() {
    closed_with("rate-limited: slow down");
}

#[test]
fn closed_restricted() {
    closed_with("restricted: members only");
}

#[test]
fn closed_error() {
    closed_with("error: internal error");
}

#[test]
fn closed_strfry_error() {
    closed_with("ERROR: bad req: unsupported filter");
}

#[test]
fn notice_too_many_concurrent_reqs_is_not_answered_with_a_loop() {
    let w = World::start(
        Fault::Notice {
            text: "too many concurrent REQs".to_owned(),
        },
        &[],
    );
    w.wait_for_faults(1);
    w.wait_for_metric("grasp_sync_refusals_total", 1);
    std::thread::sleep(Duration::from_secs(1));
    let reqs = w.reqs_during(Duration::from_secs(2));
    assert!(
        reqs <= 10,
        "{reqs} REQs in 2 s to a relay refusing them all"
    );
    w.assert_honest_world();
}

#[test]
fn slowloris_handshake_times_out_without_stalling_others() {
    let w = World::start(Fault::Slowloris, &[]);
    w.wait_for_faults(1);
    w.wait_for_metric("grasp_sync_connection_attempts_total{result=\"failed\"}", 1);
    w.assert_honest_world();
}

#[test]
fn one_byte_per_second_times_the_page_out() {
    let w = World::start(
        Fault::Trickle {
            interval: Duration::from_secs(1),
        },
        &[],
    );
    w.wait_for_faults(1);
    w.wait_for_metric("grasp_sync_refusals_total", 1);
    w.assert_honest_world();
}

#[test]
fn flood_does_not_delay_the_honest_relay() {
    let w = World::start(Fault::Flood { events: 3_000 }, &[]);
    w.wait_for_faults(1);
    w.wait_for_metric("grasp_sync_events_total{outcome=\"received\"}", 3_000);
    w.assert_honest_world();
}

#[test]
fn oversized_frame_is_skipped_not_penalised() {
    // An honest relay may store an event larger than we accept: it is
    // skipped and counted, the connection goes on, and nothing is an
    // offence that would be penalised again on every re-read of history.
    let extra = replies_on_faulty(3);
    let w = World::start(
        Fault::Oversized {
            bytes: 2 * MAX_FRAME,
        },
        &extra,
    );
    w.wait_for_faults(1);
    w.wait_for_metric("grasp_sync_messages_oversized_total", 1);
    assert!(
        wait_for(30, || missing(&w.own, &extra) == 0),
        "the relay's events after the skipped one were not synced"
    );
    assert_eq!(
        w.running
            .metric("grasp_sync_relay_offences_total{offence=\"protocol\"}"),
        0
    );
    assert_eq!(w.running.metric("grasp_sync_relay_penalties_total"), 0);
    assert_eq!(w.faulty.accepted_count(), 1, "the relay was not cut");
    w.assert_honest_world();
}

/// A relay sending events that fail verification: counted, never synced.
fn invalid_events(fault: Fault) {
    let w = World::start(fault, &[]);
    w.wait_for_faults(1);
    assert!(!w.faulty.invalid_sent().is_empty());
    w.wait_for_metric("grasp_sync_events_total{outcome=\"invalid\"}", 1);
    w.wait_for_metric(
        "grasp_sync_relay_offences_total{offence=\"invalid_event\"}",
        1,
    );
    w.assert_honest_world();
}

#[test]
fn bad_id_is_dropped() {
    invalid_events(Fault::BadId);
}

#[test]
fn bad_signature_is_dropped() {
    invalid_events(Fault::BadSignature);
}

#[test]
fn event_outside_the_filter_is_dropped() {
    let w = World::start(Fault::OutsideFilter, &[]);
    w.wait_for_faults(1);
    assert!(!w.faulty.invalid_sent().is_empty());
    w.wait_for_metric("grasp_sync_events_total{outcome=\"unwanted\"}", 1);
    w.wait_for_metric(
        "grasp_sync_relay_offences_total{offence=\"outside_filter\"}",
        1,
    );
    w.assert_honest_world();
}

#[test]
fn ten_thousand_duplicates_reach_the_sink_once() {
    let w = World::start(Fault::Duplicates { copies: 10_000 }, &[]);
    w.wait_for_faults(1);
    // Copies that arrive after the page timed out are dropped as unwanted,
    // so only the total is sure to pass 10,000.
    w.wait_for_metric("grasp_sync_events_total{outcome=\"received\"}", 10_000);
    w.wait_for_metric("grasp_sync_events_total{outcome=\"duplicate\"}", 1_000);
    let forwarded_twice = w
        .running
        .metric("grasp_sync_sink_events_total{outcome=\"duplicate\"}");
    assert!(
        forwarded_twice < 10,
        "{forwarded_twice} duplicates forwarded to the own relay"
    );
    w.assert_honest_world();
}

#[test]
fn garbage_json_is_counted_and_ignored() {
    let w = World::start(Fault::Garbage, &[]);
    w.wait_for_faults(1);
    w.wait_for_metric("grasp_sync_messages_malformed_total", 1);
    w.assert_honest_world();
}

/// A relay refusing the upgrade with `status` is not retried in a loop.
fn upgrade_refused(status: u16, retry_after: Option<u64>) {
    let w = World::start(
        Fault::HttpStatus {
            status,
            retry_after,
        },
        &[],
    );
    w.wait_for_faults(1);
    w.wait_for_metric("grasp_sync_upgrades_refused_total", 1);
    std::thread::sleep(Duration::from_secs(3));
    let attempts = w.faulty.accepted_count();
    assert!(
        attempts <= 2,
        "{attempts} connection attempts in 3 s to a relay answering HTTP {status}"
    );
    w.assert_honest_world();
}

#[test]
fn http_429_cools_down() {
    upgrade_refused(429, Some(30));
}

#[test]
fn http_503_cools_down() {
    upgrade_refused(503, None);
}

#[test]
fn never_finished_message_with_pongs_is_cut_at_its_deadline() {
    // The relay sends half a message, then only unsolicited pongs: neither
    // the pongs nor the fragment keep it connected past the deadline.
    let w = World::start(
        Fault::NeverFinished {
            bytes: MAX_FRAME / 2,
            pong_every: Duration::from_millis(100),
        },
        &[],
    );
    w.wait_for_faults(1);
    w.wait_for_metric("grasp_sync_unfinished_cut_total", 1);
    w.wait_for_metric("grasp_sync_connection_attempts_total{result=\"failed\"}", 1);
    assert_eq!(
        w.running
            .metric("grasp_sync_relay_offences_total{offence=\"protocol\"}"),
        0,
        "a slow message is no protocol offence"
    );
    w.assert_honest_world();
}

/// `--max-unfinished-bytes` (issue 26): the relay's half message (32 KiB)
/// is over a cap of 16 KiB on all relays' unfinished messages, so it is
/// cut at once, long before its deadline (ten minutes here).
#[test]
fn an_unfinished_message_over_the_configured_cap_is_cut_at_once() {
    let w = World::start_with(
        Fault::NeverFinished {
            bytes: MAX_FRAME / 2,
            pong_every: Duration::from_millis(100),
        },
        &[],
        |_, opts| {
            opts.unfinished_timeout = Duration::from_secs(600);
            opts.max_unfinished_bytes = 16 * 1024;
        },
    );
    w.wait_for_faults(1);
    w.wait_for_metric("grasp_sync_connection_attempts_total{result=\"failed\"}", 1);
    assert_eq!(
        w.running.metric("grasp_sync_unfinished_cut_total"),
        0,
        "cut by the cap, not the deadline"
    );
    w.assert_honest_world();
}

/// Fault mode "a tarpit DNS name" (issue 13, item 6): the announcement
/// lists an honest relay by hostname and 200 relays whose names resolve
/// only after 10 s, and fail. The tarpit names must not starve the
/// honest relay: it connects by name, and once dropped it reconnects by
/// name and serves a live event long before one tarpit lookup ends.
#[test]
fn tarpit_dns_names_do_not_starve_an_honest_relay_reconnecting_by_name() {
    let _ = env_logger::builder().is_test(true).try_init();
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let honest = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let history = history(&owner, &repo);
    for e in &history {
        honest.publish(e.clone());
    }
    // Honest first: the per-announcement cap keeps the first relays.
    let mut urls = vec![format!("ws://honest.localtest:{}", honest.port())];
    urls.extend((0..200).map(|i| format!("wss://n{i}.{TARPIT_ZONE}")));
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    own.publish(announcement(&owner, "repo", &refs, T0));
    let running = Running::start(&own, |config, opts| {
        short_timings(config, opts);
        opts.dns_lookup = Some(tarpit_dns);
    });
    assert!(
        wait_for(30, || missing(&own, &history) == 0),
        "{} events missing",
        missing(&own, &history)
    );
    honest.drop_connections();
    let dropped = Instant::now();
    let live = repo_comment(&keys(9), &repo, Timestamp::now().as_secs(), "after");
    honest.publish(live.clone());
    assert!(wait_for(30, || own.has(&live.id)), "live event lost");
    assert!(
        dropped.elapsed() < TARPIT_LOOKUP,
        "the reconnect took {:?}",
        dropped.elapsed()
    );
    assert!(honest.connections_made() >= 2, "reconnected by name");
    running.stop();
}
