//! The first sync's progress: after a start, every relay's history is
//! read once; how far along that is, how fast it goes and how long it
//! will take, for the log, the metrics and the status page.
//!
//! The shell samples it every few seconds ([`FirstSync::observe`]) with
//! the engine and the events the sink stored; time is passed in, so the
//! same code runs under the simulated clock. A relay counts as done once
//! its first history was read to the end ([`RelayView::first_history_done`]),
//! as failing while it is not done and not healthy: it cannot be reached,
//! keeps refusing, or asked us to slow down (a relay that closes every
//! REQ would otherwise hold the pass open for ever). The pass is complete once the own relay's repositories
//! were read and every relay known is done or failing, twice in a row (an
//! announcement found on a remote relay goes through the own relay before
//! its relays are known, so one sample with nothing left to read may be a
//! gap between the two). Relays learnt after that are not part of it.
//!
//! The estimate of the time left assumes the relays still read finish at
//! the pace relays finished so far, since the start: per relay, what is
//! left is unknown until it is read (its history's size), and items (a
//! repository or root on one relay) are a poor measure, as the slowest
//! relay's last few items can take longer than thousands on fast ones (in
//! `tests/sim_progress.rs` an estimate by items said 36 s with 225 s
//! left). The rate of events stored is over the last `WINDOW`: it is what
//! the sync does now.
//!
//! [`RelayView::first_history_done`]: crate::sans_io::engine::RelayView

use std::collections::VecDeque;
use std::time::Duration;

use crate::sans_io::engine::{Engine, RelayView};
use crate::sans_io::timing::health::Health;
use crate::sans_io::timing::time::Time;

/// How far back the rates look.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);

/// How often the progress is logged at most while the pass runs.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(60);

/// The first sync's figures at the last sample.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct Progress {
    /// When the engine started.
    pub started: Time,
    /// When the pass completed.
    pub finished: Option<Time>,
    /// Remote relays this engine reads (bootstrap relays and those with
    /// repositories or roots to read).
    pub relays_total: usize,
    /// Of those, relays whose first history was read to the end.
    pub relays_done: usize,
    /// Relays not done that fail now: unreachable, refusing or
    /// rate-limiting (their health is not healthy).
    pub relays_failing: usize,
    /// Items (a repository or root on one relay) to read in all.
    pub items_total: usize,
    /// Items read.
    pub items_done: usize,
    /// Events the sink stored since the start (the metric
    /// `grasp_sync_sink_events_total{outcome="stored"}`).
    pub events_stored: u64,
    /// Events stored a second over the last minute, to 0.01.
    pub events_per_sec: f64,
    /// While the pass runs, once a relay finished: the time left.
    pub eta: Option<Duration>,
    /// The own relay's repositories were read: the relays known are the
    /// ones there are.
    pub index_read: bool,
}

/// What to log after a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressLine {
    /// The progress line (at most once a minute).
    Running,
    /// The pass just completed (once).
    Done,
}

/// One sample of the counter the rate is taken from.
#[derive(Debug, Clone, Copy)]
struct Mark {
    at: Time,
    stored: u64,
}

/// Samples the first sync as it runs.
#[derive(Debug)]
pub struct FirstSync {
    latest: Progress,
    marks: VecDeque<Mark>,
    logged_at: Option<Time>,
    /// The last sample found nothing left: one more confirms it.
    nothing_left: bool,
}

impl FirstSync {
    /// A pass starting at `now`.
    pub fn new(now: Time) -> Self {
        FirstSync {
            latest: Progress {
                started: now,
                ..Progress::default()
            },
            // Nothing was stored at the start: the first rate counts from it.
            marks: VecDeque::from([Mark { at: now, stored: 0 }]),
            logged_at: None,
            nothing_left: false,
        }
    }

    /// The figures at the last sample.
    pub fn progress(&self) -> &Progress {
        &self.latest
    }

    /// Takes a sample at `now`: the engine's relays, and `stored`, the
    /// events the sink stored since the start; `settled` when nothing is
    /// on its way to the sink (an announcement in the outbox may bring
    /// more relays). Says what to log, if anything. O(relays' items)
    /// while the pass runs, O(1) after.
    pub fn observe(
        &mut self,
        engine: &Engine,
        stored: u64,
        settled: bool,
        now: Time,
    ) -> Option<ProgressLine> {
        self.marks.push_back(Mark { at: now, stored });
        while self.marks.front().is_some_and(|m| now.since(m.at) > WINDOW) {
            self.marks.pop_front();
        }
        let oldest = self
            .marks
            .front()
            .copied()
            .unwrap_or(Mark { at: now, stored });
        let secs = now.since(oldest.at).as_secs_f64();
        let per_sec = if secs > 0.0 {
            stored.saturating_sub(oldest.stored) as f64 / secs
        } else {
            0.0
        };
        let p = &mut self.latest;
        let running = p.finished.is_none();
        if running {
            // Once done, the figures stay and only the rate is taken.
            let tally = Tally::of(engine, now);
            p.relays_total = tally.total;
            p.relays_done = tally.done;
            p.relays_failing = tally.failing;
            p.items_total = tally.items_total;
            p.items_done = tally.items_done;
            p.index_read = engine.index_read();
        }
        p.events_stored = stored;
        p.events_per_sec = (per_sec * 100.0).round() / 100.0;
        p.eta = if running { p.time_left(now) } else { None };
        if !running {
            return None;
        }
        let nothing_left =
            p.index_read && settled && p.relays_done + p.relays_failing == p.relays_total;
        if nothing_left && std::mem::replace(&mut self.nothing_left, true) {
            p.finished = Some(now);
            p.eta = None;
            return Some(ProgressLine::Done);
        }
        self.nothing_left = nothing_left;
        let due = self.logged_at.is_none_or(|at| now.since(at) >= LOG_EVERY);
        if due && now.since(p.started) >= LOG_EVERY {
            self.logged_at = Some(now);
            return Some(ProgressLine::Running);
        }
        None
    }
}

impl Progress {
    /// The relays not done nor failing, at the pace relays finished since
    /// the start; `None` before the first finished.
    fn time_left(&self, now: Time) -> Option<Duration> {
        let left = self
            .relays_total
            .saturating_sub(self.relays_done + self.relays_failing);
        let elapsed = now.since(self.started);
        (self.relays_done > 0 && left > 0)
            .then(|| elapsed.mul_f64(left as f64 / self.relays_done as f64))
    }

    /// The log line for `line` at `now`.
    pub fn line(&self, line: ProgressLine, now: Time) -> String {
        let failing = if self.relays_failing > 0 {
            format!(" ({} failing)", self.relays_failing)
        } else {
            String::new()
        };
        match line {
            ProgressLine::Running => {
                let left = match self.eta {
                    Some(eta) => format!("about {} left", spoken(eta)),
                    None => "time left unknown".to_owned(),
                };
                format!(
                    "first sync: {}/{} relays done{failing}, {} events stored, {} events/s, {left}",
                    self.relays_done, self.relays_total, self.events_stored, self.events_per_sec
                )
            }
            ProgressLine::Done => format!(
                "first sync done in {}: {}/{} relays{failing}, {} events stored",
                spoken(now.since(self.started)),
                self.relays_done,
                self.relays_total,
                self.events_stored
            ),
        }
    }
}

/// A duration as a person says it: "42 s", "3 min", "2 h 5 min", "3 d 4 h".
pub fn spoken(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..120 => format!("{s} s"),
        120..7_200 => format!("{} min", s.div_ceil(60)),
        7_200..172_800 => format!("{} h {} min", s / 3_600, s % 3_600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3_600),
    }
}

/// The relays' figures at one sample.
#[derive(Debug, Default)]
struct Tally {
    total: usize,
    done: usize,
    failing: usize,
    items_total: usize,
    items_done: usize,
}

impl Tally {
    /// This shard's remote relays that have something to read (or are
    /// bootstrap relays): a relay no repository names any more is on its
    /// way out, not work.
    fn of(engine: &Engine, now: Time) -> Tally {
        let (own, shard) = (engine.own_relay(), engine.shard());
        let mut tally = Tally::default();
        let relays = engine
            .relays()
            .filter(|&r| r != own && shard.owns(engine.relay_url(r)));
        for relay in relays {
            let view = engine.relay_view(relay, now);
            let items = view.items.queued + view.items.pending + view.items.confirmed;
            if items == 0 && !view.bootstrap {
                continue;
            }
            tally.add(&view, items);
        }
        tally
    }

    fn add(&mut self, view: &RelayView, items: usize) {
        self.total += 1;
        self.items_total += items;
        if view.first_history_done {
            self.done += 1;
            self.items_done += items;
        } else {
            self.items_done += view.items.confirmed;
            if view.health != Health::Healthy {
                self.failing += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_spoken_in_the_unit_that_reads_best() {
        assert_eq!(spoken(Duration::from_secs(42)), "42 s");
        assert_eq!(spoken(Duration::from_secs(119)), "119 s");
        assert_eq!(spoken(Duration::from_secs(121)), "3 min");
        assert_eq!(spoken(Duration::from_secs(7_500)), "2 h 5 min");
        assert_eq!(
            spoken(Duration::from_secs(3 * 86_400 + 4 * 3_600)),
            "3 d 4 h"
        );
    }
}
