//! Pacing `EVENT`s to an own relay that rate-limits them.
//!
//! GRASP relays throttle writes per client: ngit-relay runs khatru's
//! `EventIPRateLimiter(3, 3 min, 15)` (15 at once, then 3 every three
//! minutes, per IP, duplicates counted), rust-nostr's relay builder takes
//! 60 `EVENT`s a minute per connection. Pausing and then resending a whole
//! window after each refusal made 9.6 attempts per delivered event against
//! the first (2,753 of 3,073 refused), 70 against the second.
//!
//! A refusal (`rate-limited:`) turns pacing on: one event in flight at a
//! time, each sent a `gap` after the one before. The gap follows the rate
//! the relay takes, as a token bucket refills: a refusal right after
//! another doubles it (still searching for the rate), one after an
//! accepted event widens it by [`WIDEN`], and each accepted event narrows
//! it, the faster the more were accepted in a row ([`NARROW`]). Against a
//! bucket of rate `r` the gap settles a little above `1/r`: a few events go
//! through per refusal, at over 90 % of the bucket's rate. Once the gap is below
//! [`UNPACED`] the relay is keeping up with anything we send, and the
//! whole window is used again.

use std::time::Duration;

use crate::sans_io::timing::time::Time;

/// The first gap after a refusal: a bucket that refused has no token, and
/// one token a second is a slow relay's pace (rust-nostr's 60 a minute).
const FIRST_GAP: Duration = Duration::from_secs(1);

/// Longest gap: ngit-relay's bucket gives a token every 60 s.
const MAX_GAP: Duration = Duration::from_secs(120);

/// Events in flight at first, and after pacing ends: a relay that limits
/// us refuses a few, not a whole window of hundreds.
pub(crate) const INITIAL_WINDOW: usize = 16;

/// Below this gap pacing ends: the relay took everything for a long run.
const UNPACED: Duration = Duration::from_millis(2);

/// Gap factor after a refusal that follows an accepted event.
const WIDEN: f64 = 1.15;

/// Gap factor after an accepted event, raised to the events accepted in a
/// row (at most [`MAX_STREAK`]): far above the relay's rate the gap closes
/// fast, near it (a refusal every few events) slowly.
const NARROW: f64 = 0.98;

/// Longest streak [`NARROW`] is raised to.
const MAX_STREAK: u32 = 8;

/// Whether and how fast to send to the own relay.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pacer {
    /// `Some` while paced: the spacing between sends.
    gap: Option<Duration>,
    /// The last answer was a refusal.
    refused_last: bool,
    /// When the last event went out.
    last_sent: Option<Time>,
    /// When the last refusal came: events sent before it were refused
    /// with it (a window in flight), and count as that one refusal.
    last_refusal: Option<Time>,
    /// Events accepted since the last refusal.
    streak: u32,
    /// The last event went out as soon as the gap allowed: its acceptance
    /// says the relay takes that pace. One sent after the outbox sat empty
    /// says nothing (the relay's bucket refilled meanwhile): narrowing on
    /// those ended pacing while the relay still limited us, and each end
    /// cost a window of refusals.
    pressed: bool,
    /// While not paced, events in flight at most: from
    /// [`INITIAL_WINDOW`], one more for each window's worth accepted (one
    /// more a round trip), so a relay that limits us refuses a window of
    /// about that size once, not hundreds, before pacing starts. (Doubling
    /// each round trip had 31 in flight when a bucket of 15 ran dry.)
    /// Zero until the first send. Until the relay first refuses, the
    /// window doubles instead, once a whole window was taken: a relay
    /// that never limited us takes what we send, and growing by one a
    /// round trip from 16 kept a first sync's outbox at a quarter of its
    /// window for the first 5,000 events. Growing per event taken sent a
    /// second window before the first one's refusal came back.
    cwnd: usize,
    /// The relay refused an event for its rate at least once.
    ever_refused: bool,
    /// Events accepted toward the window's next growth.
    acked: usize,
}

impl Pacer {
    /// How many events may be in flight of at most `window`: one while
    /// paced, else a window that grows as events are accepted.
    pub(crate) fn window(&self, window: usize) -> usize {
        match self.gap {
            Some(_) => 1,
            None => self.cwnd.max(INITIAL_WINDOW).min(window),
        }
    }

    /// When the next event may go, if pacing holds it back.
    pub(crate) fn next_send(&self) -> Option<Time> {
        Some(self.last_sent? + self.gap?)
    }

    /// True when an event may go at `now`.
    pub(crate) fn may_send(&self, now: Time) -> bool {
        self.next_send().is_none_or(|at| now >= at)
    }

    /// An event went out at `now`.
    pub(crate) fn sent(&mut self, now: Time) {
        self.pressed = match (self.next_send(), self.gap) {
            (Some(at), Some(gap)) => now < at + gap,
            _ => true,
        };
        self.last_sent = Some(now);
    }

    /// The relay took an event.
    pub(crate) fn accepted(&mut self) {
        self.refused_last = false;
        if self.gap.is_none() {
            self.cwnd = self.cwnd.max(INITIAL_WINDOW);
            self.acked += 1;
            if self.acked >= self.cwnd {
                self.acked = 0;
                self.cwnd = match self.ever_refused {
                    true => self.cwnd + 1,
                    false => self.cwnd * 2,
                };
            }
        }
        if !self.pressed {
            return;
        }
        self.streak = self.streak.saturating_add(1);
        let factor = NARROW.powi(self.streak.min(MAX_STREAK) as i32);
        self.gap = self
            .gap
            .map(|g| g.mul_f64(factor))
            .filter(|g| *g >= UNPACED);
    }

    /// The relay refused, at `now`, an event sent at `sent_at` for its rate.
    pub(crate) fn refused(&mut self, sent_at: Time, now: Time) {
        if self.last_refusal.is_some_and(|at| sent_at <= at) {
            return;
        }
        self.last_refusal = Some(now);
        self.ever_refused = true;
        self.streak = 0;
        self.cwnd = INITIAL_WINDOW;
        self.acked = 0;
        let gap = match (self.gap, self.refused_last) {
            (None, _) => FIRST_GAP,
            (Some(g), true) => g.saturating_mul(2),
            (Some(g), false) => g.mul_f64(WIDEN),
        };
        self.gap = Some(gap.min(MAX_GAP));
        self.refused_last = true;
    }

    /// The events a second the relay takes, as far as pacing knows (none
    /// while not paced: it takes all we send).
    pub(crate) fn rate(&self) -> Option<f64> {
        self.gap.map(|g| 1.0 / g.as_secs_f64().max(1e-3))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "testing")]
    use crate::testing::limits::{BucketLevel, EventBucket};

    /// Sends `events` through `pacer` to `bucket` with a 1 ms round trip;
    /// returns (attempts, seconds until the last was taken).
    #[cfg(feature = "testing")]
    fn deliver(pacer: &mut Pacer, bucket: &EventBucket, events: usize) -> (usize, f64) {
        let mut level = BucketLevel::full(bucket);
        let start = Time::from_secs(1_000);
        let (mut now, mut last) = (start, start);
        let (mut attempts, mut taken) = (0, 0);
        while taken < events {
            now = pacer.next_send().map_or(now, |at| at.max(now));
            assert!(pacer.may_send(now));
            pacer.sent(now);
            attempts += 1;
            now = now + Duration::from_millis(1);
            let elapsed = now.since(last);
            last = now;
            if level.take(bucket, elapsed) {
                taken += 1;
                pacer.accepted();
            } else {
                pacer.refused(now - Duration::from_millis(1), now);
            }
        }
        (attempts, now.since(start).as_secs_f64())
    }

    /// Uses the test relay's model of khatru's limiter (`testing`).
    #[cfg(feature = "testing")]
    #[test]
    fn paces_to_a_token_bucket_of_any_rate() {
        // 3 a second; and ngit-relay's 15 at once then 3 every 3 minutes.
        for (every, burst, events) in [
            (Duration::from_millis(333), 3, 600),
            (Duration::from_secs(60), 15, 240),
        ] {
            let bucket = EventBucket {
                tokens_per_interval: 1,
                interval: every,
                max_tokens: burst,
            };
            let (attempts, secs) = deliver(&mut Pacer::default(), &bucket, events);
            let per_event = attempts as f64 / events as f64;
            let rate = (events as f64 - f64::from(burst)) / secs;
            let bucket_rate = bucket.rate();
            assert!(
                per_event <= 1.5,
                "{every:?}: {per_event:.2} attempts an event"
            );
            assert!(
                rate >= 0.9 * bucket_rate,
                "{every:?}: {rate:.4}/s against the bucket's {bucket_rate:.4}/s"
            );
        }
    }

    #[test]
    fn pacing_ends_once_the_relay_keeps_up() {
        let mut p = Pacer::default();
        let t = Time::from_secs(5);
        p.refused(t, t);
        p.refused(t, t + Duration::from_millis(1));
        assert_eq!(
            p.next_send(),
            None,
            "nothing sent since: the second refusal was of the same window"
        );
        p.sent(t);
        assert_eq!(p.next_send(), Some(t + FIRST_GAP), "one refusal's gap");
        assert_eq!(p.window(100), 1, "one at a time while paced");
        while p.rate().is_some() {
            p.accepted();
        }
        assert_eq!(p.window(100), INITIAL_WINDOW, "a window again");
        for _ in 0..10_000 {
            p.accepted();
        }
        assert_eq!(p.window(100), 100, "growing to the whole window");
        assert!(p.rate().is_none());
    }

    /// Issue 33: a relay that never refused takes what we send; the window
    /// doubles each round trip (a window's worth accepted) until it does.
    /// After a refusal it grows by one a round trip, as before.
    #[test]
    fn the_window_doubles_each_round_trip_until_the_first_refusal() {
        let mut p = Pacer::default();
        let t = Time::from_secs(5);
        assert_eq!(p.window(1_000), INITIAL_WINDOW);
        let round_trip = |p: &mut Pacer| {
            for _ in 0..p.window(1_000) {
                p.accepted();
            }
        };
        round_trip(&mut p);
        assert_eq!(p.window(1_000), 2 * INITIAL_WINDOW);
        round_trip(&mut p);
        assert_eq!(p.window(1_000), 4 * INITIAL_WINDOW);
        p.refused(t, t);
        p.sent(t);
        while p.rate().is_some() {
            p.accepted();
        }
        let before = p.window(1_000);
        round_trip(&mut p);
        assert_eq!(p.window(1_000), before + 1, "one more a round trip");
    }
}
