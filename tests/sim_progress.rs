//! The first sync's progress under the simulated clock: relays done,
//! failing and known, events stored, the rate, the estimate of the time
//! left, one progress line a minute at most and one when it completes.

mod support;

use std::time::Duration;

use grasp_sync::{FirstSync, ProgressLine, Time};
use support::*;

/// How often the shell samples the progress.
const SAMPLE: Duration = Duration::from_secs(5);

/// Relay `i` of a world of slow relays.
fn slow(i: usize) -> String {
    format!("wss://slow{i}.example")
}

/// `n` relays, relay `i` answering each message `(i + 1) * step` late,
/// each with one repository of `issues` issues announced on the own
/// relay, so their histories end one after another.
fn slow_world(sim: &mut Sim, n: usize, issues: u64, step: Duration) -> Vec<nostr::prelude::Event> {
    let mut history = Vec::new();
    for i in 0..n {
        let url = slow(i);
        let owner = keys(10 + i as u8);
        sim.add_relay(&url).per_message = step * (i as u32 + 1);
        let d = format!("repo{i}");
        sim.seed(OWN, &announcement(&owner, &d, &[&url, OWN], T0 - 10_000));
        let repo = coord(&owner, &d);
        for k in 0..issues {
            let issue = root(&keys(2), 1621, &[&repo], T0 - 9_000 + k, "an issue");
            sim.seed(&url, &issue);
            history.push(issue);
        }
    }
    history
}

/// Samples the sim every [`SAMPLE`] until `until`, as the shell does;
/// every line said, with its time.
fn run(sim: &mut Sim, first: &mut FirstSync, until: Duration) -> Vec<(Time, ProgressLine)> {
    let end = sim.now + until;
    let mut said = Vec::new();
    while sim.now < end {
        sim.advance(SAMPLE);
        let stored = sim.ingested.len() as u64;
        if let Some(line) = first.observe(&sim.engine, stored, true, sim.now) {
            said.push((sim.now, line));
        }
    }
    said
}

#[test]
fn done_failing_and_total_relays_and_one_line_at_the_end() {
    let mut sim = Sim::new(config());
    let history = slow_world(&mut sim, 3, 4, Duration::ZERO);
    let owner = keys(20);
    sim.seed(
        OWN,
        &announcement(&owner, "gone", &["wss://down.example", OWN], T0 - 10_000),
    );
    sim.add_relay("wss://down.example").online = false;
    let mut first = FirstSync::new(sim.now);

    let said = run(&mut sim, &mut first, Duration::from_secs(300));

    assert_eq!(sim.missing(&history), vec![]);
    let p = *first.progress();
    assert_eq!(said.len(), 1, "one line, at the end: {said:?}");
    assert_eq!(said[0].1, ProgressLine::Done);
    let took = said[0].0.since(Time::from_secs(T0));
    assert!(
        took <= Duration::from_secs(20),
        "done within two samples of the histories' end: {took:?}"
    );
    assert_eq!((p.relays_total, p.relays_done, p.relays_failing), (4, 3, 1));
    assert_eq!(p.events_stored, sim.ingested.len() as u64);
    assert!(p.index_read);
    assert_eq!(p.finished, Some(said[0].0));
    assert_eq!(p.eta, None, "nothing left to estimate");
    let line = p.line(ProgressLine::Done, said[0].0);
    let want = format!(
        "first sync done in {} s: 3/4 relays (1 failing), {} events stored",
        took.as_secs(),
        sim.ingested.len()
    );
    assert_eq!(line, want);
}

#[test]
fn per_relay_counters_add_up_to_the_engines() {
    let mut sim = Sim::new(config());
    let history = slow_world(&mut sim, 3, 4, Duration::ZERO);
    sim.relay(&slow(1))
        .close_next
        .push_back("rate-limited: slow down".into());
    sim.advance(Duration::from_secs(120));
    assert_eq!(sim.missing(&history), vec![]);

    let views: Vec<_> = sim
        .engine
        .relays()
        .map(|r| sim.engine.relay_view(r, sim.now))
        .collect();
    let sum = |f: fn(&grasp_sync::RelayView) -> u64| views.iter().map(f).sum::<u64>();
    let stats = *sim.engine.stats();
    assert_eq!(sum(|v| v.events_received), stats.events_received);
    assert_eq!(sum(|v| v.events_ingested), stats.events_ingested);
    assert_eq!(sum(|v| v.refusals), stats.refusals);
    assert!(stats.refusals >= 1, "the refusal was counted");
    let refused = sim.engine.relay_view(sim.id(&slow(1)), sim.now);
    assert!(refused.refusals >= 1);
    assert!(refused.first_history_done && refused.history_done);
    assert!(refused.last_event_at.is_some());
}

#[test]
fn a_long_first_sync_says_where_it_is_once_a_minute_and_how_long_is_left() {
    let mut cfg = config();
    cfg.page_limit = 5;
    let mut sim = Sim::new(cfg);
    let history = slow_world(&mut sim, 8, 30, Duration::from_millis(1_500));
    let mut first = FirstSync::new(sim.now);
    let mut samples = Vec::new();
    let mut said = Vec::new();
    while first.progress().finished.is_none() && sim.now < Time::from_secs(T0 + 3_600) {
        said.extend(run(&mut sim, &mut first, SAMPLE));
        samples.push((sim.now, *first.progress()));
    }

    assert_eq!(sim.missing(&history), vec![]);
    let finished = first.progress().finished.expect("the pass completes");
    let took = finished.since(Time::from_secs(T0));
    assert!(took >= Duration::from_secs(180), "a long pass: {took:?}");
    let lines: Vec<Time> = said
        .iter()
        .filter(|(_, l)| *l == ProgressLine::Running)
        .map(|(t, _)| *t)
        .collect();
    let minutes = took.as_secs() / 60;
    assert!(
        lines.len() as u64 >= minutes.saturating_sub(1) && lines.len() as u64 <= minutes,
        "one line a minute: {} lines in {took:?}",
        lines.len()
    );
    assert!(
        lines
            .windows(2)
            .all(|w| w[1].since(w[0]) >= Duration::from_secs(60))
    );
    assert_eq!(said.last().map(|(_, l)| *l), Some(ProgressLine::Done));

    // Midway, the estimate (relays left at the pace relays finished so
    // far) is within a factor of two of what was left.
    let (at, mid) = samples
        .iter()
        .find(|(t, _)| t.since(Time::from_secs(T0)) >= took / 2)
        .expect("a sample midway");
    let left = finished.since(*at);
    let eta = mid.eta.expect("an estimate midway");
    assert!(
        eta >= left / 2 && eta <= left * 2,
        "estimated {eta:?} with {left:?} left"
    );
    assert!(mid.relays_done > 0 && mid.relays_done < mid.relays_total);
    assert!(mid.events_per_sec > 0.0);
    let line = mid.line(ProgressLine::Running, *at);
    assert!(
        line.starts_with(&format!(
            "first sync: {}/8 relays done, {} events stored, ",
            mid.relays_done, mid.events_stored
        )) && line.contains(" events/s, about "),
        "{line}"
    );
}
