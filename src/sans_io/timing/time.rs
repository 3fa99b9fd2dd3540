//! Time as the core sees it: a plain number passed in by the caller.
//!
//! The core never reads a clock. The shell hands it `Time` values built from
//! a monotonic clock anchored to the Unix epoch once at start, so timers are
//! immune to wall-clock jumps while `since`/`until` filters still get real
//! Unix timestamps. Tests build `Time` from any number and jump it forward.

use std::ops::{Add, Sub};
use std::time::Duration;

/// Milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(u64);

impl Time {
    /// A time from milliseconds since the Unix epoch.
    pub const fn from_millis(ms: u64) -> Self {
        Time(ms)
    }

    /// A time from whole seconds since the Unix epoch.
    pub const fn from_secs(secs: u64) -> Self {
        Time(secs.saturating_mul(1000))
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// Whole seconds since the Unix epoch, as nostr timestamps count them.
    pub const fn as_secs(self) -> u64 {
        self.0 / 1000
    }

    /// The time `d` earlier, stopping at the epoch.
    pub fn saturating_sub(self, d: Duration) -> Time {
        Time(self.0.saturating_sub(duration_ms(d)))
    }

    /// How long after `earlier` this is (zero when it is not later).
    pub fn since(self, earlier: Time) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(duration_ms(d)))
    }
}

impl Sub<Duration> for Time {
    type Output = Time;
    fn sub(self, d: Duration) -> Time {
        self.saturating_sub(d)
    }
}

/// A duration in whole milliseconds, saturating instead of overflowing.
fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_and_converts() {
        let t = Time::from_secs(1_000);
        assert_eq!((t + Duration::from_millis(1_500)).as_millis(), 1_001_500);
        assert_eq!(
            t.saturating_sub(Duration::from_secs(2_000)),
            Time::from_millis(0)
        );
        assert_eq!((t + Duration::MAX).as_millis(), u64::MAX);
        assert_eq!(
            (t + Duration::from_secs(5)).since(t),
            Duration::from_secs(5)
        );
        assert_eq!(t.since(t + Duration::from_secs(5)), Duration::ZERO);
        assert_eq!(Time::from_millis(1_999).as_secs(), 1);
    }
}
