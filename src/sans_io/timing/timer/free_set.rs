//! The timer slab's free entries, handed out lowest index first.
//!
//! A burst (a first sync at thousands of relays) can leave tens of
//! thousands of short timers in the slab at once. Once they have fired the
//! slab could give its tail back, but a free list hands out the entry
//! freed last, so the few long-lived timers re-armed after the burst stay
//! scattered to its end. Taking the lowest free entry instead moves each
//! re-armed timer down, and the tail empties.
//!
//! Two levels of bitmap keep that cheap: one bit per entry, and one bit
//! per word of those that has any bit set. Finding the lowest free entry
//! scans one summary word per 4,096 entries.

/// Bits per bitmap word.
const BITS: usize = u64::BITS as usize;

/// A set of slab indices with O(1) insert and a cheap lowest-first take.
#[derive(Debug, Default)]
pub(super) struct FreeSet {
    /// Bit `i % 64` of word `i / 64` is set when entry `i` is free.
    words: Vec<u64>,
    /// Bit `w % 64` of word `w / 64` is set when `words[w]` is not zero.
    summary: Vec<u64>,
}

impl FreeSet {
    /// Marks `index` free.
    pub(super) fn insert(&mut self, index: u32) {
        let (word, bit) = split(index as usize);
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
            self.summary.resize(word / BITS + 1, 0);
        }
        self.words[word] |= bit;
        let (sword, sbit) = split(word);
        self.summary[sword] |= sbit;
    }

    /// Takes the lowest free index out of the set.
    pub(super) fn take_lowest(&mut self) -> Option<u32> {
        let sword = self.summary.iter().position(|&s| s != 0)?;
        let word = sword * BITS + self.summary[sword].trailing_zeros() as usize;
        let index = word * BITS + self.words[word].trailing_zeros() as usize;
        self.remove_bit(index);
        // The set only holds indices given to `insert`, which are `u32`.
        Some(index as u32)
    }

    /// Takes `index` out of the set, if it is there.
    pub(super) fn remove(&mut self, index: u32) {
        if self.contains(index) {
            self.remove_bit(index as usize);
        }
    }

    pub(super) fn contains(&self, index: u32) -> bool {
        let (word, bit) = split(index as usize);
        self.words.get(word).is_some_and(|w| w & bit != 0)
    }

    /// Drops the room above the highest index still in the set.
    pub(super) fn shrink_to_fit(&mut self) {
        let words = self
            .words
            .iter()
            .rposition(|&w| w != 0)
            .map_or(0, |w| w + 1);
        self.words.truncate(words);
        self.words.shrink_to_fit();
        self.summary.truncate(words.div_ceil(BITS));
        self.summary.shrink_to_fit();
    }

    fn remove_bit(&mut self, index: usize) {
        let (word, bit) = split(index);
        self.words[word] &= !bit;
        if self.words[word] == 0 {
            let (sword, sbit) = split(word);
            self.summary[sword] &= !sbit;
        }
    }
}

/// The word an index is in, and its bit there.
fn split(index: usize) -> (usize, u64) {
    (index / BITS, 1 << (index % BITS))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeSet;

    #[test]
    fn hands_out_the_lowest_index_first() {
        let mut set = FreeSet::default();
        for i in [9000, 5, 70, 4096 * 64 + 3] {
            set.insert(i);
        }
        let taken: Vec<u32> = std::iter::from_fn(|| set.take_lowest()).collect();
        assert_eq!(taken, vec![5, 70, 9000, 4096 * 64 + 3]);
    }

    #[test]
    fn agrees_with_an_ordered_set_on_random_operations() {
        for seed in 0..20 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut set = FreeSet::default();
            let mut model = BTreeSet::new();
            for _ in 0..5_000 {
                let i = rng.gen_range(0..20_000u32);
                match rng.gen_range(0..4) {
                    0 => {
                        set.insert(i);
                        model.insert(i);
                    }
                    1 => {
                        set.remove(i);
                        model.remove(&i);
                    }
                    2 => assert_eq!(set.take_lowest(), model.pop_first(), "seed {seed}"),
                    _ => {
                        set.shrink_to_fit();
                        assert_eq!(set.contains(i), model.contains(&i), "seed {seed}");
                    }
                }
            }
        }
    }

    #[test]
    fn shrinking_keeps_only_room_for_what_is_left() {
        let mut set = FreeSet::default();
        for i in 0..100_000 {
            set.insert(i);
        }
        for _ in 0..99_990 {
            set.take_lowest();
        }
        set.shrink_to_fit();
        assert_eq!(set.words.len(), 100_000 / 64 + 1);
        while set.take_lowest().is_some() {}
        set.shrink_to_fit();
        assert!(set.words.is_empty() && set.summary.is_empty());
    }
}
