//! What the log says about relays that fail to connect, bounded.
//!
//! Announcements are cheap: one key's can name 500 relays, and thousands
//! of dead relays each logging a WARN at every retry flooded the journal
//! past its rate limit (16,176 lines in 20 s), burying everything else.
//! So a relay's failures are said once at WARN when they start and once
//! when they end (its next connect, with the count); the repeats go to
//! DEBUG. All those lines share one budget ([`BURST`] at once, then
//! [`LINES_PER_SEC`]): past it they go to DEBUG too and are counted. Every
//! [`SUMMARY_EVERY`] while relays fail, one line says how many fail, the
//! top reasons and how many lines were held back. `/metrics` counts every
//! failure regardless. The own relay is not counted here: its failures
//! are always said (one relay, paced by its own reconnect).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::sans_io::memory::index::RelayId;
use crate::sans_io::timing::time::Time;
use crate::sans_io::wire::relay_text::relay_text;

/// Failure lines that may be logged at once.
pub(super) const BURST: u32 = 10;
/// Failure lines logged a second, past the burst.
pub(super) const LINES_PER_SEC: u32 = 1;
/// How often the summary is logged while relays fail.
pub(super) const SUMMARY_EVERY: Duration = Duration::from_secs(60);
/// Reasons a summary names.
const TOP_REASONS: usize = 3;
/// Characters of a reason a summary shows.
const REASON_MAX: usize = 80;

/// How loud a line is: said at its level, or kept to DEBUG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Loudness {
    /// At its level (WARN for a start, INFO for an end).
    Said,
    /// At DEBUG: a repeat, or over the budget.
    Quiet,
}

/// One relay's failures since its last connect.
#[derive(Debug)]
struct Streak {
    failures: u64,
    /// Its start was said, so its end is too.
    said: bool,
    cause: String,
}

/// The relays failing now and the log budget their lines share.
#[derive(Debug)]
pub(super) struct FailureLog {
    failing: HashMap<RelayId, Streak>,
    /// Lines the budget allows now, in thousandths of a line.
    allowance: u64,
    refilled_at: Option<Time>,
    /// Since the last summary: failures, and lines kept to DEBUG for the
    /// budget.
    failures: u64,
    held_back: u64,
    summarised_at: Option<Time>,
}

impl Default for FailureLog {
    fn default() -> Self {
        FailureLog {
            failing: HashMap::new(),
            allowance: u64::from(BURST) * 1000,
            refilled_at: None,
            failures: 0,
            held_back: 0,
            summarised_at: None,
        }
    }
}

impl FailureLog {
    /// `relay` failed for `cause`: said if it starts a streak and the
    /// budget allows.
    pub(super) fn failed(&mut self, relay: RelayId, cause: &str, now: Time) -> Loudness {
        self.failures += 1;
        let streak = self.failing.entry(relay).or_insert(Streak {
            failures: 0,
            said: false,
            cause: String::new(),
        });
        streak.failures += 1;
        if streak.cause != cause {
            streak.cause = cause.to_owned();
        }
        if streak.failures > 1 {
            return Loudness::Quiet;
        }
        let said = self.admit(now);
        if let Some(streak) = self.failing.get_mut(&relay) {
            streak.said = said == Loudness::Said;
        }
        said
    }

    /// `relay` connected: the failures it ends, if any, and whether to say
    /// so (only an end whose start was said, within the budget).
    pub(super) fn connected(&mut self, relay: RelayId, now: Time) -> Option<(u64, Loudness)> {
        let streak = self.failing.remove(&relay)?;
        let loud = match streak.said {
            true => self.admit(now),
            false => Loudness::Quiet,
        };
        Some((streak.failures, loud))
    }

    /// `relay` is gone (released): its streak ends unsaid.
    pub(super) fn forget(&mut self, relay: RelayId) {
        self.failing.remove(&relay);
    }

    /// The summary line, when one is due: relays failed since the last
    /// and [`SUMMARY_EVERY`] passed.
    pub(super) fn summary(&mut self, now: Time) -> Option<String> {
        let since = *self.summarised_at.get_or_insert(now);
        if self.failures == 0 || now.since(since) < SUMMARY_EVERY {
            return None;
        }
        self.summarised_at = Some(now);
        let mut line = format!(
            "connect failures: {} relays failing, {} failures in the last {} s",
            self.failing.len(),
            std::mem::take(&mut self.failures),
            now.since(since).as_secs()
        );
        let held = std::mem::take(&mut self.held_back);
        if held > 0 {
            let _ = write!(line, " ({held} lines of them not logged)");
        }
        let reasons = self.top_reasons();
        if !reasons.is_empty() {
            let _ = write!(line, "; top reasons: {}", reasons.join(", "));
        }
        Some(line)
    }

    /// The commonest causes of the relays failing now, with their counts.
    fn top_reasons(&self) -> Vec<String> {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for streak in self.failing.values() {
            *counts.entry(streak.cause.as_str()).or_default() += 1;
        }
        let mut counts: Vec<(&str, usize)> = counts.into_iter().collect();
        counts.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        counts
            .into_iter()
            .take(TOP_REASONS)
            .map(|(cause, n)| {
                let cause: String = cause.chars().take(REASON_MAX).collect();
                format!("{} ({n})", relay_text(&cause))
            })
            .collect()
    }

    /// Takes a line from the budget, refilled at [`LINES_PER_SEC`].
    fn admit(&mut self, now: Time) -> Loudness {
        let refilled = self.refilled_at.replace(now).unwrap_or(now);
        let gained = now.since(refilled).as_millis() as u64 * u64::from(LINES_PER_SEC);
        self.allowance = (self.allowance + gained).min(u64::from(BURST) * 1000);
        if self.allowance < 1000 {
            self.held_back += 1;
            return Loudness::Quiet;
        }
        self.allowance -= 1000;
        Loudness::Said
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> Time {
        Time::from_millis(1_000_000 + secs * 1000)
    }

    #[test]
    fn a_relay_says_its_failures_once_when_they_start_and_once_when_they_end() {
        let mut log = FailureLog::default();
        let r = RelayId(7);
        assert_eq!(log.failed(r, "connection refused", at(0)), Loudness::Said);
        for t in 1..50 {
            assert_eq!(log.failed(r, "connection refused", at(t)), Loudness::Quiet);
        }
        assert_eq!(log.connected(r, at(60)), Some((50, Loudness::Said)));
        assert_eq!(log.connected(r, at(61)), None, "a connect without failures");
        assert_eq!(
            log.failed(r, "lost", at(62)),
            Loudness::Said,
            "a new streak"
        );
    }

    #[test]
    fn no_number_of_relays_logs_more_than_the_budget() {
        let mut log = FailureLog::default();
        let said = |log: &mut FailureLog, from: u32, t: u64| {
            (from..from + 5_000)
                .filter(|&i| log.failed(RelayId(i), "refused", at(t)) == Loudness::Said)
                .count()
        };
        assert_eq!(said(&mut log, 0, 0), BURST as usize);
        assert_eq!(
            said(&mut log, 10_000, 20),
            BURST as usize,
            "refilled, to the burst"
        );
        assert_eq!(said(&mut log, 20_000, 21), LINES_PER_SEC as usize);
        let quiet_end = log.connected(RelayId(4_999), at(20));
        assert_eq!(
            quiet_end,
            Some((1, Loudness::Quiet)),
            "its start was not said"
        );
    }

    #[test]
    fn the_summary_names_the_failing_relays_and_top_reasons_once_a_minute() {
        let mut log = FailureLog::default();
        assert_eq!(log.summary(at(0)), None);
        for i in 0..30 {
            let cause = if i < 20 {
                "connection refused"
            } else {
                "DNS\n: no such host"
            };
            log.failed(RelayId(i), cause, at(1));
        }
        log.failed(RelayId(0), "connect timed out", at(2));
        assert_eq!(log.summary(at(59)), None, "not a minute yet");
        let line = log.summary(at(60)).expect("due");
        assert_eq!(
            line,
            "connect failures: 30 relays failing, 31 failures in the last 60 s \
             (20 lines of them not logged); top reasons: connection refused (19), \
             DNS\\n: no such host (10), connect timed out (1)"
        );
        assert_eq!(log.summary(at(130)), None, "nothing failed since");
    }
}
