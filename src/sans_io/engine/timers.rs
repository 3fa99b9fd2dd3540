//! The engine's timers, one wheel for all (`timing::timer`): what each is
//! for, and which of a connection's deadlines share whole-second wake-ups.
//! A connection's timers carry its generation, so the engine drops a stale
//! one in one place.

use crate::sans_io::memory::index::{RelayId, RepoId};
use crate::sans_io::timing::time::Time;

/// Timers of the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    BatchWindow,
    /// An echo-only batch window may be quiet enough to close.
    BatchQuiet,
    DisconnectCheck,
    Reconnect(RelayId),
    /// A repo's held relay change is due.
    ReleaseHeld(RepoId),
    /// A deadline of one connection (or connect attempt) of a relay, keyed
    /// by the relay's epoch when it was armed. Every connect and disconnect
    /// bumps the epoch, so a timer of a connection that has ended is
    /// dropped in one place ([`Engine::on_timer`]) and never fires into
    /// the next one.
    Conn(RelayId, u32, ConnTimer),
}

/// What a connection's timer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ConnTimer {
    ConnectTimeout,
    Consolidate,
    EoseTimeout(u64),
    /// A suspect subscription (silent when a refusal naming none landed,
    /// or when a later one reached EOSE) is due to have been heard from.
    Unanswered(u64),
    Resume,
    /// A connection's keepalive round, and its daily full sync once due.
    Watch,
    /// A negentropy job's progress deadline.
    NegTimeout(u64),
}

impl ConnTimer {
    /// Deadlines that only catch a lack of progress (a connect, an EOSE, a
    /// negentropy round, an answer) are rounded up to the whole second:
    /// such deadlines are armed by the thousand in a first sync, each at
    /// its own millisecond, and their expiry (stale or not) woke the idle
    /// loop 400 times in a quiet minute at 5,000 relays.
    pub(super) fn rounded(self) -> bool {
        matches!(
            self,
            ConnTimer::ConnectTimeout
                | ConnTimer::EoseTimeout(_)
                | ConnTimer::Unanswered(_)
                | ConnTimer::NegTimeout(_)
        )
    }
}

/// Rounds up to the next whole second, so timers of thousands of relays
/// share wake-ups instead of spreading over every millisecond.
pub(super) fn whole_second(t: Time) -> Time {
    Time::from_millis(t.as_millis().div_ceil(1000) * 1000)
}
