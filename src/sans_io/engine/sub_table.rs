//! A relay's open subscriptions, by id.
//!
//! A relay holds a handful at once: at most its subscription limit (10 by
//! default, lowered by refusals), and one or two once it is idle. A vector
//! searched front to back serves that better than a hash map: no hasher
//! keys in every relay, no bucket array kept at up to twice the entries,
//! and an idle relay's table is as long as what it holds. At 5,000 relays
//! the map's buckets were about 730 bytes of every idle relay's memory.

use crate::sans_io::query::subscription::Subscription;

/// Open subscriptions of one relay, each under the id its REQ carries.
#[derive(Debug, Default)]
pub(super) struct SubTable {
    entries: Vec<(u64, Subscription)>,
}

impl SubTable {
    pub(super) fn get(&self, id: u64) -> Option<&Subscription> {
        self.entries.iter().find(|(i, _)| *i == id).map(|(_, s)| s)
    }

    pub(super) fn get_mut(&mut self, id: u64) -> Option<&mut Subscription> {
        self.entries
            .iter_mut()
            .find(|(i, _)| *i == id)
            .map(|(_, s)| s)
    }

    /// Files `sub` under `id`, replacing (and returning) one already there.
    pub(super) fn insert(&mut self, id: u64, sub: Subscription) -> Option<Subscription> {
        match self.get_mut(id) {
            Some(old) => Some(std::mem::replace(old, sub)),
            None => {
                self.entries.push((id, sub));
                None
            }
        }
    }

    pub(super) fn remove(&mut self, id: u64) -> Option<Subscription> {
        let at = self.entries.iter().position(|(i, _)| *i == id)?;
        Some(self.entries.swap_remove(at).1)
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(super) fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries.iter().map(|(id, _)| *id)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &Subscription)> {
        self.entries.iter().map(|(id, sub)| (*id, sub))
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (u64, &mut Subscription)> {
        self.entries.iter_mut().map(|(id, sub)| (*id, sub))
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Subscription> {
        self.entries.iter().map(|(_, sub)| sub)
    }

    /// Gives back room a burst of subscriptions left.
    pub(super) fn shrink_to_fit(&mut self) {
        self.entries.shrink_to_fit();
    }

    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.entries.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sans_io::query::subscription::{Purpose, Scope};
    use crate::sans_io::timing::time::Time;

    fn sub(page: u32) -> Subscription {
        Subscription::new(
            Vec::new(),
            Purpose::Page,
            Scope::Targets,
            Vec::new(),
            page,
            Time::default(),
        )
    }

    #[test]
    fn finds_replaces_and_removes_by_id() {
        let mut t = SubTable::default();
        assert!(t.insert(7, sub(1)).is_none());
        assert!(t.insert(9, sub(2)).is_none());
        assert_eq!(t.get(9).map(|s| s.page), Some(2));
        assert_eq!(t.insert(7, sub(3)).map(|s| s.page), Some(1));
        assert_eq!(t.len(), 2, "a replaced id is not filed twice");
        assert_eq!(t.get(7).map(|s| s.page), Some(3));
        assert_eq!(t.remove(7).map(|s| s.page), Some(3));
        assert!(t.remove(7).is_none());
        assert!(t.get(7).is_none() && t.get(9).is_some());
        assert_eq!(t.ids().collect::<Vec<_>>(), vec![9]);
    }

    #[test]
    fn shrinking_gives_back_a_burst_and_keeps_contents() {
        let mut t = SubTable::default();
        for id in 0..64 {
            t.insert(id, sub(1));
        }
        for id in (0..64).filter(|id| id % 32 != 0) {
            t.remove(id);
        }
        let mut ids: Vec<u64> = t.ids().collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![0, 32]);
        assert!(t.capacity() >= 64);
        t.shrink_to_fit();
        assert_eq!(t.capacity(), 2);
        assert!(t.get(0).is_some() && t.get(32).is_some());
    }
}
