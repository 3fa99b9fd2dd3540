//! The only place the shell reads the wall clock and turns it into the
//! engine's [`Time`]; everything else is handed `now`.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::sans_io::timing::time::Time;

/// Monotonic time anchored to the Unix epoch once, so timers ignore wall-clock jumps.
pub(super) struct Clock {
    start: Instant,
    unix_ms: u64,
}

impl Clock {
    /// Anchors the clock at the current wall-clock time.
    pub(super) fn new() -> Self {
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Clock {
            start: Instant::now(),
            unix_ms,
        }
    }

    /// The wall clock now, in Unix seconds: what the state file's times
    /// are measured in, as the next process cannot read monotonic time.
    pub(super) fn unix_secs(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    /// The current time, on the monotonic clock since the anchor.
    pub(super) fn now(&self) -> Time {
        Time::from_millis(self.unix_ms + self.start.elapsed().as_millis() as u64)
    }
}
