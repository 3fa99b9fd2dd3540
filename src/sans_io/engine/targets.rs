//! A relay's wanted targets: the items (repos, roots) the index makes it
//! sync, each in exactly one state. They live as long as the index wants
//! them there, across connections; a connection's batches only point at
//! them (`ItemState::Pending`).
//!
//! Each targeted item has exactly one state — queued, pending in one
//! batch, or confirmed — so "pending and confirmed overlap" cannot be
//! represented. An item exists in the map only while the index targets it
//! on this relay (`refs` counts the repos that make it a target), so
//! "confirmed but not targeted" cannot be represented either.

use std::collections::HashMap;

use crate::sans_io::memory::index::Item;
use crate::sans_io::timing::time::Time;

/// Where a targeted item stands on one relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemState {
    /// Wanted, not yet asked (the three-way diff's "new").
    Queued,
    /// Asked in the pending batch with this id.
    Pending(u64),
    /// History fetched to EOSE; live events follow.
    Confirmed,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub refs: u32,
    pub state: ItemState,
    /// When the item was last confirmed, in Unix seconds rounded up (0
    /// for one confirmed before a restart): a save claims it only if the
    /// sink confirmed every event received before then (`resume`). Kept
    /// in what was the struct's padding.
    pub confirmed_at: u32,
}

impl Slot {
    /// A new target: confirmed already if `restored` (a saved claim
    /// from before the restart), else queued.
    pub(super) fn new(restored: bool) -> Slot {
        Slot {
            refs: 0,
            state: if restored {
                ItemState::Confirmed
            } else {
                ItemState::Queued
            },
            confirmed_at: 0,
        }
    }

    /// The item's history was fetched to its end at `now`.
    pub(super) fn confirm(&mut self, now: Time) {
        self.state = ItemState::Confirmed;
        let secs = now.as_millis().div_ceil(1000);
        self.confirmed_at = u32::try_from(secs).unwrap_or(u32::MAX);
    }

    /// True when every event received before the item was confirmed had
    /// been taken by the sink, if the oldest it has not taken was
    /// received at `unsettled` (`None`: it took everything).
    pub(super) fn settled(&self, unsettled: Option<Time>) -> bool {
        let confirmed = Time::from_secs(u64::from(self.confirmed_at));
        self.state == ItemState::Confirmed && unsettled.is_none_or(|t| confirmed < t)
    }
}

/// The items a relay is wanted for, and which of them wait for the diff.
#[derive(Debug, Default)]
pub(super) struct Targets {
    /// Targeted items and their state.
    pub items: HashMap<Item, Slot>,
    /// Items that became `Queued` since the last diff (may be stale).
    pub queued: Vec<Item>,
}

impl Targets {
    /// The index made `item` a target once more (for one more repo): a
    /// new one starts confirmed if `restored` (`Slot::new`), and goes up
    /// for the next diff if the relay is `connected`.
    pub(super) fn add(&mut self, item: Item, restored: bool, connected: bool) {
        let slot = self.items.entry(item).or_insert(Slot::new(restored));
        slot.refs += 1;
        if slot.refs == 1 && connected {
            self.queued.push(item);
        }
    }

    /// The index made `item` a target once less: gone with its last
    /// reference, whatever its state.
    pub(super) fn remove(&mut self, item: Item) {
        if let Some(slot) = self.items.get_mut(&item) {
            slot.refs -= 1;
            if slot.refs == 0 {
                self.items.remove(&item);
            }
        }
    }

    /// Counts items per state: (queued, pending, confirmed).
    pub(super) fn counts(&self) -> (usize, usize, usize) {
        self.items
            .values()
            .fold((0, 0, 0), |(q, p, c), slot| match slot.state {
                ItemState::Queued => (q + 1, p, c),
                ItemState::Pending(_) => (q, p + 1, c),
                ItemState::Confirmed => (q, p, c + 1),
            })
    }

    /// Moves every item in `state`-matching slots back to `Queued`.
    pub(super) fn requeue_where(&mut self, pred: impl Fn(ItemState) -> bool) {
        for (item, slot) in self.items.iter_mut() {
            if pred(slot.state) {
                slot.state = ItemState::Queued;
                self.queued.push(*item);
            }
        }
    }

    /// Puts every queued item up for the next diff (a new connection asks
    /// them all); true when there is one.
    pub(super) fn requeue_all(&mut self) -> bool {
        let queued =
            |(item, slot): (&Item, &Slot)| (slot.state == ItemState::Queued).then_some(*item);
        self.queued = self.items.iter().filter_map(queued).collect();
        !self.queued.is_empty()
    }

    /// Those of `items` confirmed go back to queued (their live
    /// subscription was refused).
    pub(super) fn demote_confirmed(&mut self, items: &[Item]) {
        for item in items {
            if let Some(slot) = self.items.get_mut(item)
                && slot.state == ItemState::Confirmed
            {
                slot.state = ItemState::Queued;
                self.queued.push(*item);
            }
        }
    }

    /// The items confirmed before `unsettled` (see [`Slot::settled`]), in
    /// no order: what a save may claim.
    pub(super) fn settled(&self, unsettled: Option<Time>) -> impl Iterator<Item = Item> + '_ {
        let settled = move |(item, slot): (&Item, &Slot)| slot.settled(unsettled).then_some(*item);
        self.items.iter().filter_map(settled)
    }

    /// The confirmed items, in no order.
    pub(super) fn confirmed(&self) -> Vec<Item> {
        self.items
            .iter()
            .filter(|(_, s)| s.state == ItemState::Confirmed)
            .map(|(i, _)| *i)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An item's confirmation time costs no memory: it sits in what was
    /// the slot's padding (relays times items can be millions of slots).
    #[test]
    fn a_slot_stays_24_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 24);
    }
}
