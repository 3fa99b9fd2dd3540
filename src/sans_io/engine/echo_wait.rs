//! The announcements and roots the engine handed to the sink and has not
//! seen come back yet (`Batching`'s echo-only window).
//!
//! A root found on a remote reaches the index only through its echo (the
//! own relay's self-subscription, or the embedding relay's feed), so its
//! replies are asked only once the batch window holding the echo closes.
//! A window of echoes alone used to close once none came for
//! `Config::echo_quiet` (200 ms): two round trips at 100 ms, paid by every
//! generation of discovery the engine caused itself. But the engine knows
//! what it handed over: once every one of them is back, the burst it
//! caused is over, and the window closes after half the quiet. (At once
//! made a generation of REQs of every few roots while the own relay's
//! outbox was full and echoes trickled back: the demo's REQs grew by
//! half.) The whole quiet stays the bound for what never echoes (a write
//! the sink dropped unseen).

use std::collections::HashMap;
use std::time::Duration;

use nostr::prelude::EventId;

use crate::sans_io::timing::time::Time;

/// Ids awaited at most. A burst of more roots than this (thousands of
/// repos found at once) is awaited in part: the window may then close on
/// the tracked ones before the rest echo, which costs one more generation
/// of REQs, never an event.
pub(super) const MAX_AWAITED: usize = 4_096;

/// Index-kind events handed to the sink, not echoed yet, with when each
/// was handed.
#[derive(Debug, Default)]
pub(super) struct EchoWait {
    awaited: HashMap<EventId, Time>,
}

impl EchoWait {
    /// `id` was handed to the sink at `now`; its echo is awaited.
    pub(super) fn handed(&mut self, id: EventId, now: Time) {
        if self.awaited.len() < MAX_AWAITED {
            self.awaited.insert(id, now);
        }
    }

    /// `id` came back, or will never come (the sink refused it).
    pub(super) fn ended(&mut self, id: &EventId) {
        self.awaited.remove(id);
    }

    /// Nothing handed over is still on its way back.
    pub(super) fn all_back(&self) -> bool {
        self.awaited.is_empty()
    }

    /// Forgets what was handed `stale` or longer before `now` and never
    /// came back (a write the sink lost without a word): it must not keep
    /// every later window waiting for the quiet.
    pub(super) fn forget_older(&mut self, now: Time, stale: Duration) {
        self.awaited.retain(|_, handed| now.since(*handed) < stale);
        if self.awaited.is_empty() {
            self.awaited.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> EventId {
        EventId::from_byte_array([n; 32])
    }

    #[test]
    fn all_back_once_every_handed_id_echoed_or_was_refused() {
        let mut wait = EchoWait::default();
        assert!(wait.all_back());
        let t = Time::from_secs(10);
        wait.handed(id(1), t);
        wait.handed(id(2), t);
        wait.ended(&id(1));
        assert!(!wait.all_back(), "the second is still on its way");
        wait.ended(&id(3));
        assert!(
            !wait.all_back(),
            "an echo of something else changes nothing"
        );
        wait.ended(&id(2));
        assert!(wait.all_back());
    }

    #[test]
    fn a_lost_write_is_forgotten_once_stale() {
        let mut wait = EchoWait::default();
        let stale = Duration::from_secs(5);
        wait.handed(id(1), Time::from_secs(10));
        wait.handed(id(2), Time::from_secs(14));
        wait.forget_older(Time::from_secs(15), stale);
        assert!(!wait.all_back(), "both still young");
        wait.forget_older(Time::from_secs(16), stale);
        wait.ended(&id(2));
        assert!(
            wait.all_back(),
            "the first, handed 6 s before, was forgotten"
        );
    }

    #[test]
    fn it_holds_at_most_its_bound() {
        let mut wait = EchoWait::default();
        for n in 0..=MAX_AWAITED as u32 {
            let mut bytes = [0; 32];
            bytes[..4].copy_from_slice(&n.to_le_bytes());
            wait.handed(EventId::from_byte_array(bytes), Time::from_secs(1));
        }
        assert_eq!(wait.awaited.len(), MAX_AWAITED);
    }
}
