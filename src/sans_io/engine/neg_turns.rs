//! How many negentropy jobs run at once, over all relays, and whose turn
//! is next.
//!
//! A job holds the sink's listings of its filters and a session's sorted
//! copy of one of them until it ends. After a restart thousands of relays
//! start one at the same moment: all at once held every listing and
//! session together (the peak memory of issue 14). So at most `limit` jobs
//! run; a relay that finds no room queues once and waits, holding nothing
//! but its queued work, which no timer watches (no `NegTimeout` runs
//! before its job exists, so waiting can fail nothing). When a job ends,
//! the relay at the front of the queue gets the turn: one job, then it
//! queues again behind the others (round robin, so a relay with a hundred
//! chunks cannot starve one with a single chunk).

use std::collections::{HashSet, VecDeque};

use crate::sans_io::memory::index::RelayId;

/// The jobs in flight and the relays waiting for room.
#[derive(Debug)]
pub(super) struct Turns {
    /// Jobs at most at once.
    limit: usize,
    /// Jobs in flight: relay and job id.
    active: HashSet<(RelayId, u64)>,
    /// Relays waiting for room, in turn order.
    queue: VecDeque<RelayId>,
    /// The relays in `queue`: thousands of relays wait at once after a
    /// restart, and a scan of the queue per admission was quadratic.
    queued: HashSet<RelayId>,
    /// The relay being offered the turn right now.
    turn: Option<RelayId>,
}

impl Turns {
    /// At most `limit` jobs at once (at least one).
    pub(super) fn new(limit: usize) -> Self {
        Turns {
            limit: limit.max(1),
            active: HashSet::new(),
            queue: VecDeque::new(),
            queued: HashSet::new(),
            turn: None,
        }
    }

    /// True when `relay` may start a job now; otherwise it is queued
    /// (once) and gets its turn when room frees up. Room goes to the
    /// relay whose turn it is, or to anyone while no one waits.
    pub(super) fn admit(&mut self, relay: RelayId) -> bool {
        let room = self.active.len() < self.limit;
        if room && self.turn == Some(relay) {
            self.turn = None;
            return true;
        }
        if room && self.queue.is_empty() && self.turn.is_none() {
            return true;
        }
        if self.queued.insert(relay) {
            self.queue.push_back(relay);
        }
        false
    }

    /// Job `id` of `relay`, admitted, started.
    pub(super) fn started(&mut self, relay: RelayId, id: u64) {
        self.active.insert((relay, id));
    }

    /// Job `id` of `relay` ended: its room is free.
    pub(super) fn ended(&mut self, relay: RelayId, id: u64) {
        self.active.remove(&(relay, id));
    }

    /// Every job of `relay` ended at once (its connection was lost, or a
    /// daily sync dropped them).
    pub(super) fn relay_ended(&mut self, relay: RelayId) {
        self.active.retain(|&(r, _)| r != relay);
    }

    /// True if job `id` of `relay` holds room (for the invariant checks).
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn holds(&self, relay: RelayId, id: u64) -> bool {
        self.active.contains(&(relay, id))
    }

    /// Keeps only the jobs `alive` says still exist: a check, run now and
    /// then, that no room leaks whatever path ended a job.
    pub(super) fn retain(&mut self, mut alive: impl FnMut(RelayId, u64) -> bool) {
        self.active.retain(|&(relay, id)| alive(relay, id));
    }

    /// The next relay to offer the turn to, if there is room and someone
    /// waits. The caller runs that relay's scheduler, which takes the turn
    /// through [`Turns::admit`], then calls [`Turns::end_turn`]: a relay
    /// that did not take it (gone, or nothing left to do) loses its place,
    /// and queues again whenever its scheduler next finds no room.
    pub(super) fn next_turn(&mut self) -> Option<RelayId> {
        if self.active.len() >= self.limit {
            return None;
        }
        let relay = self.queue.pop_front()?;
        self.queued.remove(&relay);
        self.turn = Some(relay);
        Some(relay)
    }

    /// Ends the offer of [`Turns::next_turn`], taken or not.
    pub(super) fn end_turn(&mut self) {
        self.turn = None;
    }

    /// Gives back the room a restart's thousands of waiting relays left.
    pub(super) fn shrink_to_fit(&mut self) {
        self.active.shrink_to_fit();
        self.queue.shrink_to_fit();
        self.queued.shrink_to_fit();
    }

    /// Jobs in flight.
    pub(super) fn in_flight(&self) -> usize {
        self.active.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: u32) -> RelayId {
        RelayId(n)
    }

    #[test]
    fn at_most_limit_jobs_and_the_rest_take_turns_in_order() {
        let mut t = Turns::new(2);
        assert!(t.admit(r(1)));
        t.started(r(1), 10);
        assert!(t.admit(r(1)));
        t.started(r(1), 11);
        assert!(!t.admit(r(2)));
        assert!(!t.admit(r(3)));
        assert!(!t.admit(r(1)), "no room for a third");
        assert!(!t.admit(r(2)), "queued once");
        assert_eq!(t.next_turn(), None, "no room yet");
        t.ended(r(1), 10);
        // Room for one: relay 2's turn; others wait even with room.
        assert_eq!(t.next_turn(), Some(r(2)));
        assert!(!t.admit(r(3)), "not its turn");
        assert!(t.admit(r(2)));
        t.started(r(2), 20);
        t.end_turn();
        assert_eq!(t.in_flight(), 2);
        t.retain(|_, id| id != 11);
        assert_eq!(t.next_turn(), Some(r(3)));
        t.end_turn();
        // Relay 3 did not take it: relay 1 is next, behind it.
        assert_eq!(t.next_turn(), Some(r(1)));
        assert!(t.admit(r(1)));
        t.started(r(1), 12);
        t.end_turn();
        assert_eq!(t.next_turn(), None);
    }

    #[test]
    fn dropped_jobs_free_their_room() {
        let mut t = Turns::new(1);
        assert!(t.admit(r(1)));
        t.started(r(1), 1);
        assert!(!t.admit(r(2)));
        t.relay_ended(r(1));
        assert_eq!(t.next_turn(), Some(r(2)));
        assert!(t.admit(r(2)));
    }
}
