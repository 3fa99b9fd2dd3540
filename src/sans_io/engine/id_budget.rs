//! The bound on event ids negentropy holds at once, over all relays.
//!
//! A reconciliation gathers the ids a relay holds and we lack; they wait
//! in the job, then in `ids` REQs queued for a subscription slot. A first
//! sync of a big history needs many of them (one issue with 100,000
//! replies needs 100,000), but a relay may report ids without end, and
//! thousands of relays reconcile at once. So the bound is on the sum: a
//! job that would pass it falls back to REQ paging, which loses nothing.
//!
//! The engine recounts a relay whenever its jobs or pages may have
//! changed, and this keeps each relay's last count and their sum. A
//! recount replaces the relay's old count, so a change the engine did not
//! recount at once is corrected at that relay's next recount rather than
//! remembered wrong for good.

/// Ids in hand per relay and in all.
#[derive(Debug)]
pub(super) struct IdBudget {
    /// The most held at once (`Config::neg_ids_held`).
    max: usize,
    /// Each relay's last count, by relay index.
    counted: Vec<usize>,
    /// Their sum.
    in_hand: usize,
}

impl IdBudget {
    /// At most `max` ids held over all relays.
    pub(super) fn new(max: usize) -> Self {
        IdBudget {
            max,
            counted: Vec::new(),
            in_hand: 0,
        }
    }

    /// Relay `relay` (an index) now holds `count` ids.
    pub(super) fn recount(&mut self, relay: usize, count: usize) {
        if self.counted.len() <= relay {
            self.counted.resize(relay + 1, 0);
        }
        self.in_hand = self.in_hand - self.counted[relay] + count;
        self.counted[relay] = count;
    }

    /// More ids are in hand than allowed.
    pub(super) fn over(&self) -> bool {
        self.in_hand > self.max
    }

    /// Ids in hand now, over all relays.
    pub(super) fn in_hand(&self) -> usize {
        self.in_hand
    }

    /// The bound.
    pub(super) fn max(&self) -> usize {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recount_replaces_the_relays_old_count() {
        let mut budget = IdBudget::new(100);
        budget.recount(3, 60);
        budget.recount(0, 30);
        assert_eq!(budget.in_hand(), 90);
        assert!(!budget.over());
        budget.recount(3, 80);
        assert_eq!(budget.in_hand(), 110);
        assert!(budget.over());
        budget.recount(3, 0);
        assert_eq!(budget.in_hand(), 30);
        assert!(!budget.over());
    }
}
