//! Bounded memory of event ids already verified, to drop duplicates before
//! paying for a signature check.
//!
//! The same event reaches us from many relays (and a hostile relay can send
//! one event ten thousand times), so a duplicate must cost a hash lookup, not
//! a Schnorr verification. Two generations bound memory: when the current set
//! is full it becomes the previous one and the oldest generation is dropped.
//! An id forgotten that way is verified again on its next arrival, which costs
//! time but never correctness.

use std::collections::HashSet;

use nostr::prelude::EventId;

/// Recently verified event ids, at most `2 * capacity` of them.
#[derive(Debug)]
pub struct Seen {
    current: HashSet<EventId>,
    previous: HashSet<EventId>,
    capacity: usize,
}

impl Seen {
    /// An empty memory holding up to `capacity` ids per generation.
    pub fn new(capacity: usize) -> Self {
        Seen {
            current: HashSet::new(),
            previous: HashSet::new(),
            capacity: capacity.max(1),
        }
    }

    /// True if `id` was recorded and not yet forgotten.
    pub fn contains(&self, id: &EventId) -> bool {
        self.current.contains(id) || self.previous.contains(id)
    }

    /// Records a verified id.
    pub fn insert(&mut self, id: EventId) {
        if self.contains(&id) {
            return;
        }
        if self.current.len() >= self.capacity {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(id);
    }

    /// Forgets `id`, so its next arrival is verified and ingested again
    /// (the sink refused it: another copy may be taken).
    pub fn remove(&mut self, id: &EventId) {
        self.current.remove(id);
        self.previous.remove(id);
    }

    /// Ids remembered now.
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> EventId {
        EventId::from_byte_array([n; 32])
    }

    #[test]
    fn remembers_and_stays_bounded() {
        let mut seen = Seen::new(2);
        seen.insert(id(1));
        seen.insert(id(1));
        assert_eq!(seen.len(), 1);
        seen.insert(id(2));
        seen.insert(id(3));
        assert!(seen.contains(&id(1)) && seen.contains(&id(3)));
        seen.insert(id(4));
        seen.insert(id(5));
        assert!(!seen.contains(&id(1)), "oldest generation is dropped");
        assert!(seen.contains(&id(5)));
        seen.remove(&id(5));
        assert!(!seen.contains(&id(5)), "a removed id is forgotten");
        assert!(seen.len() <= 4);
    }
}
