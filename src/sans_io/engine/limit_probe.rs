//! The climb back of a learned subscription limit (issue 46).
//!
//! A refusal of a REQ over a relay's limit lowers the limit one step. A
//! NOTICE names no subscription and arrives after answers the relay sent
//! before it: the count of what we hold open when it lands says little
//! about what the relay held when it refused (real strfry with five
//! subscriptions stepped ours 7 → 6 → 1 that way, and it stayed at 1).
//! So a lowered limit climbs back one at a time once it held quietly at
//! full use — no refusal for [`CLIMB_WAIT`], an EOSE while every slot was
//! taken — up to ours or the relay's stated limit, never past it. A
//! refusal after a climb lowers it again and doubles the next wait (up to
//! [`MAX_CLIMB_WAIT`]): a relay that really allows five sees a sixth REQ
//! at most every half hour, and never a loop. Time is passed in.

use std::time::Duration;

use crate::sans_io::timing::time::Time;

/// How long a lowered limit holds, with no refusal, before it climbs one.
pub(super) const CLIMB_WAIT: Duration = Duration::from_secs(60);

/// The longest the wait grows to after climbs that were refused: one
/// probing REQ per half hour on a relay at its limit.
pub(super) const MAX_CLIMB_WAIT: Duration = Duration::from_secs(32 * 60);

/// Per relay, what the climb of its subscription limit needs.
#[derive(Debug, Clone, Copy)]
pub(super) struct LimitProbe {
    /// The highest the limit may climb: ours, or the relay's stated one.
    ceiling: usize,
    /// Since when the limit held without a refusal (its last change);
    /// `None` until something lowered it.
    quiet_since: Option<Time>,
    /// How long it must hold before it climbs.
    wait: Duration,
    /// The limit was raised by a climb and no refusal came since.
    climbed: bool,
}

impl LimitProbe {
    /// A probe for a limit starting at `ceiling` (ours).
    pub(super) fn new(ceiling: usize) -> Self {
        LimitProbe {
            ceiling: ceiling.max(1),
            quiet_since: None,
            wait: CLIMB_WAIT,
            climbed: false,
        }
    }

    /// The relay stated `limit` (NIP-11): the climb never passes it.
    pub(super) fn cap(&mut self, limit: usize) {
        self.ceiling = self.ceiling.min(limit.max(1));
    }

    /// A REQ was refused as one too many at `limit`: the limit one step
    /// lower (never below 1). A refusal after a climb doubles the wait
    /// for the next.
    pub(super) fn refused(&mut self, limit: usize, now: Time) -> usize {
        if std::mem::take(&mut self.climbed) {
            self.wait = (self.wait * 2).min(MAX_CLIMB_WAIT);
        }
        self.quiet_since = Some(now);
        limit.saturating_sub(1).max(1)
    }

    /// An EOSE came with `in_use` REQs and jobs open: the limit, one
    /// higher if it was in full use and held quietly for the wait. A
    /// limit below the ceiling that nothing here lowered (a saved state's)
    /// starts its quiet now.
    pub(super) fn climb(&mut self, limit: usize, in_use: usize, now: Time) -> usize {
        if limit >= self.ceiling {
            return limit;
        }
        let Some(since) = self.quiet_since else {
            self.quiet_since = Some(now);
            return limit;
        };
        if in_use < limit || now.since(since) < self.wait {
            return limit;
        }
        self.quiet_since = Some(now);
        self.climbed = true;
        limit + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> Time {
        Time::from_secs(1_000 + secs)
    }

    #[test]
    fn a_refusal_steps_one_and_a_refused_climb_doubles_the_wait() {
        let mut p = LimitProbe::new(10);
        assert_eq!(p.refused(7, at(0)), 6, "one step, not to the floor");
        assert_eq!(p.climb(6, 6, at(59)), 6, "not before the wait");
        assert_eq!(p.climb(6, 5, at(60)), 6, "not while a slot is free");
        assert_eq!(p.climb(6, 6, at(60)), 7);
        assert_eq!(p.refused(7, at(61)), 6);
        assert_eq!(p.climb(6, 6, at(61 + 119)), 6, "the wait doubled");
        assert_eq!(p.climb(6, 6, at(61 + 120)), 7);
        assert_eq!(p.refused(1, at(200)), 1, "never below 1");
    }

    #[test]
    fn the_climb_stops_at_the_ceiling_and_the_wait_at_its_bound() {
        let mut p = LimitProbe::new(10);
        p.cap(3);
        let mut limit = p.refused(3, at(0));
        let mut t = 0;
        for _ in 0..20 {
            t += MAX_CLIMB_WAIT.as_secs();
            limit = p.climb(limit, limit, at(t));
            assert!(limit <= 3, "never past the stated limit");
            if limit == 3 {
                limit = p.refused(limit, at(t));
            }
        }
        assert_eq!(p.wait, MAX_CLIMB_WAIT);
    }
}
