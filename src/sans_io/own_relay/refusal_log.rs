//! Logging what the sink (the own relay, or an embedder's `Sink`) refuses
//! for good, aggregated.
//!
//! One WARN per refused event flooded the log (66 lines for 66 events, no
//! limit): a write policy refuses a whole class of events at once. Each
//! reason (the `OK` message's prefix: `blocked`, `invalid`, ...) logs at
//! most once a minute, with how many it refused since and one example.

use std::time::Duration;

use log::warn;
use nostr::prelude::EventId;

use crate::sans_io::timing::time::Time;
use crate::sans_io::wire::relay_text::relay_text;

/// How often one reason is logged at most.
const EVERY: Duration = Duration::from_secs(60);

/// Reasons followed apart; a relay's further ones share the last slot.
const REASONS: usize = 8;

/// Characters of a reason's prefix kept to tell reasons apart.
const PREFIX_CHARS: usize = 32;

/// One reason's refusals since it was last logged.
#[derive(Debug)]
struct Reason {
    prefix: String,
    logged: Time,
    since: u64,
}

/// Final refusals by reason, and when each was last logged.
#[derive(Debug)]
pub(crate) struct RefusalLog {
    /// Who refuses, for the log lines ("own relay", "sink").
    who: &'static str,
    reasons: Vec<Reason>,
}

impl Default for RefusalLog {
    fn default() -> Self {
        RefusalLog::new("own relay")
    }
}

impl RefusalLog {
    /// A log of what `who` refuses.
    pub(crate) fn new(who: &'static str) -> Self {
        RefusalLog {
            who,
            reasons: Vec::new(),
        }
    }

    /// The own relay refused `id` for good with `message` (its reason
    /// `prefix`) at `now`: logged now, or counted for the next line.
    pub(crate) fn refused(&mut self, now: Time, id: &EventId, prefix: &str, message: &str) {
        // The relay chooses the prefix: only its start is kept.
        let prefix: String = prefix.chars().take(PREFIX_CHARS).collect();
        let at = match self.reasons.iter().position(|r| r.prefix == prefix) {
            Some(at) => at,
            None if self.reasons.len() < REASONS => {
                self.reasons.push(Reason {
                    prefix,
                    logged: now,
                    since: 0,
                });
                return warn!("{} refused {id}: {}", self.who, relay_text(message));
            }
            None => REASONS - 1,
        };
        let reason = &mut self.reasons[at];
        reason.since += 1;
        if now >= reason.logged + EVERY {
            warn!(
                "{} refused {} events in the last minute or more, e.g. {id}: {}",
                self.who,
                reason.since,
                relay_text(message)
            );
            reason.logged = now;
            reason.since = 0;
        }
    }

    /// Refusals not logged yet, over every reason (for tests).
    #[cfg(test)]
    fn pending(&self) -> u64 {
        self.reasons.iter().map(|r| r.since).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_logs_once_a_minute_with_a_count() {
        let mut log = RefusalLog::default();
        let id = EventId::from_byte_array([1; 32]);
        let t = Time::from_secs(100);
        for i in 0..66 {
            log.refused(
                t + Duration::from_millis(i),
                &id,
                "blocked",
                "blocked: no repo",
            );
        }
        assert_eq!(log.pending(), 65, "one line, 65 counted");
        log.refused(t + EVERY, &id, "blocked", "blocked: no repo");
        assert_eq!(log.pending(), 0, "a minute on: logged with the count");
        for n in 0..20u8 {
            log.refused(t, &id, &format!("reason{n}"), "x");
        }
        assert_eq!(
            log.reasons.len(),
            REASONS,
            "relay-chosen reasons are bounded"
        );
    }
}
