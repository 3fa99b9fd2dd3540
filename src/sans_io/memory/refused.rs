//! Events the sink refused for good, remembered so that re-syncs do not
//! fetch and offer them again.
//!
//! The own relay refuses some events for reasons that do not change by
//! asking again (`blocked:`, `invalid:`, over its size limit). Without a
//! memory, every daily full sync and every restart downloads them from
//! the remote relays, offers them, and has them refused once more, each
//! day, with a line in the log. Refusals that can change (`rate-limited:`,
//! `auth-required:`, `error:`) are retried instead and never land here.
//!
//! Bounded: at most [`MAX_REFUSED`] ids, the oldest forgotten first. A
//! forgotten id costs one more offer and one more refusal, never an event.

use std::collections::{HashSet, VecDeque};

use nostr::prelude::EventId;

/// Ids remembered at most: 64 hex digits each in the state file, so
/// 640 kB at most there.
pub(crate) const MAX_REFUSED: usize = 10_000;

/// The ids refused for good, oldest first.
#[derive(Debug, Default)]
pub(crate) struct RefusedIds {
    ids: HashSet<EventId>,
    order: VecDeque<EventId>,
}

impl RefusedIds {
    /// Remembers `id`, forgetting the oldest once [`MAX_REFUSED`] are held.
    pub(crate) fn insert(&mut self, id: EventId) {
        if !self.ids.insert(id) {
            return;
        }
        self.order.push_back(id);
        if self.order.len() > MAX_REFUSED
            && let Some(oldest) = self.order.pop_front()
        {
            self.ids.remove(&oldest);
        }
    }

    pub(crate) fn contains(&self, id: &EventId) -> bool {
        self.ids.contains(id)
    }

    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }

    /// Oldest first, as [`insert`](Self::insert) wants them back.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &EventId> {
        self.order.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u32) -> EventId {
        let mut bytes = [0u8; 32];
        bytes[..4].copy_from_slice(&n.to_be_bytes());
        EventId::from_byte_array(bytes)
    }

    #[test]
    fn keeps_the_newest_and_forgets_the_oldest() {
        let mut refused = RefusedIds::default();
        for n in 0..(MAX_REFUSED as u32 + 10) {
            refused.insert(id(n));
            refused.insert(id(n));
        }
        assert_eq!(refused.len(), MAX_REFUSED);
        assert!(!refused.contains(&id(9)));
        assert!(refused.contains(&id(10)));
        assert!(refused.contains(&id(MAX_REFUSED as u32 + 9)));
        assert_eq!(refused.iter().next(), Some(&id(10)));
    }
}
