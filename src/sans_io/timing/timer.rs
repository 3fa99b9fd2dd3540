//! Hierarchical timer wheel for the sans-IO state machine.
//!
//! # Why a wheel
//!
//! The state machine keeps up to ~100,000 live timers (reconnect backoff,
//! batch windows, daily jitter up to 25 h, 24 h retries), and most of them are
//! cancelled or rescheduled before they fire. A binary heap makes cancellation
//! O(n) (or leaves tombstones that pile up). This wheel gives:
//!
//! * O(1) [`TimerWheel::cancel`] and near-O(1) [`TimerWheel::insert`]:
//!   entries live in a `Vec` slab and sit on intrusive doubly-linked lists
//!   (one per slot, `u32` prev/next indices). Past slab growth there is no
//!   per-timer heap allocation. Free entries are handed out lowest first
//!   (see `free_set`), so after a burst [`TimerWheel::shrink_to_fit`] can
//!   give the slab's emptied tail back.
//! * Cheap [`TimerWheel::next_deadline`] for the poll timeout. A `u64`
//!   occupancy bitmap per level finds the earliest non-empty slot in
//!   O(levels). The exact minimum deadline is cached, so it is usually O(1).
//! * Time jumps that cost nothing per elapsed millisecond. A simulated clock can
//!   jump hours at once. Advancing goes straight to the next occupied slot, so
//!   the cost depends on the slots that hold timers, not on elapsed time.
//!
//! # Layout
//!
//! The resolution is 1 ms. There are 6 levels of 64 slots. A slot on level `L`
//! spans `64^L` ms, and the whole wheel spans `64^6` ms = 2^36 ms (about 2.2
//! years). A timer is stored on the level given by the highest bit in which its
//! deadline differs from the wheel's current time. When time reaches a slot on
//! a higher level, that slot is cascaded, meaning its timers are re-filed onto
//! lower levels. This happens lazily, as time advances. Two extra lists
//! complete the picture:
//!
//! * the *overflow* list holds timers in a later 2^36 ms block than the current
//!   time. It is re-filed when time enters a later block, so those timers
//!   still fire exactly on time.
//! * the *ready* list holds timers whose deadline is `<=` the current time.
//!
//! Time is a plain `u64` of milliseconds supplied by the caller; this module
//! never reads a clock.

use std::cell::Cell;
use std::fmt;
use std::iter;

use free_set::FreeSet;

mod free_set;

/// Bits of time consumed by one level (64 slots).
const SLOT_BITS: usize = 6;
/// Slots per level.
const SLOTS: usize = 1 << SLOT_BITS;
/// Mask selecting a slot digit.
const SLOT_MASK: u64 = (SLOTS as u64) - 1;
/// Number of wheel levels.
const LEVELS: usize = 6;
/// Bits of time covered by the whole wheel (2^36 ms, about 2.2 years).
const WHEEL_BITS: usize = SLOT_BITS * LEVELS;
/// Mask selecting the time bits covered by the whole wheel.
const WHEEL_MASK: u64 = (1 << WHEEL_BITS) - 1;
/// List index of the overflow list (timers in a later 2^36 ms block).
const OVERFLOW: usize = LEVELS * SLOTS;
/// List index of the ready list (deadline <= current time).
const READY: usize = OVERFLOW + 1;
/// Total number of intrusive lists.
const NUM_LISTS: usize = READY + 1;
/// Null link / "no entry" marker.
const NIL: u32 = u32::MAX;

// List indices are stored as `u16` inside entries.
const _: () = assert!(NUM_LISTS <= u16::MAX as usize);

/// Handle to a scheduled timer; stale handles (already fired or cancelled) are harmless.
///
/// It holds a slab index plus a generation counter. The generation changes
/// whenever a slab slot is freed, so a stale handle never matches a newer
/// timer that reuses the same slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerId {
    index: u32,
    generation: u32,
}

/// One slab entry. `value` is `None` while the entry is free.
struct Entry<T> {
    value: Option<T>,
    deadline: u64,
    generation: u32,
    prev: u32,
    /// Next entry on the slot list.
    next: u32,
    list: u16,
}

/// Hierarchical timer wheel with 1 ms resolution, O(1) insert and cancel.
///
/// The design is in the `timer` module documentation.
pub struct TimerWheel<T> {
    entries: Vec<Entry<T>>,
    free: FreeSet,
    /// The generation an entry pushed onto the slab starts at: above every
    /// generation an entry given back by `shrink_to_fit` had reached, so
    /// an id of a timer in a given-back entry never matches a later one.
    fresh_generation: u32,
    heads: [u32; NUM_LISTS],
    occupied: [u64; LEVELS],
    /// The wheel's current time.
    elapsed: u64,
    len: usize,
    /// Cached `(min deadline, number of pending timers with that deadline)`;
    /// `None` means unknown (recomputed lazily by `next_deadline`).
    min_cache: Cell<Option<(u64, usize)>>,
}

impl<T> TimerWheel<T> {
    /// Creates an empty wheel. `now` is the current time in ms; deadlines
    /// before it fire on the next `poll_expired`.
    pub fn new(now: u64) -> Self {
        Self {
            entries: Vec::new(),
            free: FreeSet::default(),
            fresh_generation: 0,
            heads: [NIL; NUM_LISTS],
            occupied: [0; LEVELS],
            elapsed: now,
            len: 0,
            min_cache: Cell::new(None),
        }
    }

    /// Schedules `value` to fire at `deadline` (ms). O(1). A deadline `<=` the
    /// wheel's current time fires at the next `poll_expired`.
    ///
    /// # Panics
    ///
    /// Panics if more than `u32::MAX - 1` timers are live at once.
    pub fn insert(&mut self, deadline: u64, value: T) -> TimerId {
        let index = self.alloc(deadline, value);
        self.place(index);
        self.note_inserted(deadline);
        self.len += 1;
        let generation = self.entries[index as usize].generation;
        TimerId { index, generation }
    }

    /// Cancels a timer. O(1). Returns its value if the timer was still pending.
    /// Returns `None` for a stale id (already fired, already cancelled, or a
    /// slot since reused by another timer).
    pub fn cancel(&mut self, id: TimerId) -> Option<T> {
        let entry = self.entries.get(id.index as usize)?;
        if entry.generation != id.generation {
            return None;
        }
        // `remove` returns None for a free entry, so this covers that case too.
        self.remove(id.index).map(|(_, value)| value)
    }

    /// Returns the exact deadline of the earliest pending timer, or `None` when
    /// the wheel is empty. The value is not rounded to a slot.
    ///
    /// The result can be `<=` the current time when a timer is already due. It
    /// is cached, so repeated calls are O(1). After the earliest timer fires or
    /// is cancelled, the next call recomputes it: it finds the earliest
    /// occupied slot through the bitmaps and scans only that slot.
    pub fn next_deadline(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        if let Some((min, _)) = self.min_cache.get() {
            return Some(min);
        }
        let computed = self.compute_min();
        self.min_cache.set(computed);
        computed.map(|(min, _)| min)
    }

    /// Advances the wheel to `now` and returns one expired timer (deadline
    /// `<= now`), or `None`. Callers loop until `None`.
    ///
    /// Every timer with deadline `<= now` is returned before `None`, and no
    /// timer with a later deadline is returned. Timers the wheel advances over
    /// come out in non-decreasing deadline order. Timers inserted with a
    /// deadline already due come out first, in no particular order. A `now`
    /// earlier than the wheel's current time does not move the wheel back.
    pub fn poll_expired(&mut self, now: u64) -> Option<(TimerId, T)> {
        loop {
            if let Some(index) = self.ready_entry(now) {
                // Entries on a list are always live, so `remove` returns Some.
                return self.remove(index);
            }
            if !self.advance(now) {
                return None;
            }
        }
    }

    /// Number of pending timers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when no timers are pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Gives back the slab's tail of free entries, and the room above it:
    /// a burst of short timers grows the slab, and the long-lived timers
    /// re-armed after it move to the lowest free entries. Ids stay valid.
    pub fn shrink_to_fit(&mut self) {
        while let Some(last) = self.entries.last()
            && last.value.is_none()
        {
            self.fresh_generation = self.fresh_generation.max(last.generation);
            self.entries.pop();
            // The slab's length fits u32: `alloc` never grows it past NIL.
            self.free.remove(self.entries.len() as u32);
        }
        self.entries.shrink_to_fit();
        self.free.shrink_to_fit();
    }

    // ----- slab -----

    /// Takes the lowest free slab entry (or grows the slab) and fills it.
    fn alloc(&mut self, deadline: u64, value: T) -> u32 {
        if let Some(index) = self.free.take_lowest() {
            let entry = &mut self.entries[index as usize];
            entry.value = Some(value);
            entry.deadline = deadline;
            return index;
        }
        let index = match u32::try_from(self.entries.len()) {
            Ok(index) if index != NIL => index,
            _ => panic!("TimerWheel: more than u32::MAX - 1 live timers"),
        };
        self.entries.push(Entry {
            value: Some(value),
            deadline,
            generation: self.fresh_generation,
            prev: NIL,
            next: NIL,
            list: 0,
        });
        index
    }

    /// Unlinks a live entry, frees it and returns its id and value.
    /// Returns `None` (and changes nothing) if the entry is already free.
    fn remove(&mut self, index: u32) -> Option<(TimerId, T)> {
        let value = self.entries[index as usize].value.take()?;
        self.unlink(index);
        let entry = &mut self.entries[index as usize];
        let id = TimerId {
            index,
            generation: entry.generation,
        };
        let deadline = entry.deadline;
        entry.generation = entry.generation.wrapping_add(1);
        self.free.insert(index);
        self.len -= 1;
        self.note_removed(deadline);
        Some((id, value))
    }

    // ----- intrusive lists -----

    /// Pushes an entry onto the front of `list`, marking the slot occupied.
    fn link(&mut self, index: u32, list: usize) {
        let head = self.heads[list];
        let entry = &mut self.entries[index as usize];
        entry.prev = NIL;
        entry.next = head;
        // Fits: NUM_LISTS <= u16::MAX is asserted at compile time.
        entry.list = list as u16;
        if head != NIL {
            self.entries[head as usize].prev = index;
        }
        self.heads[list] = index;
        if list < OVERFLOW {
            self.occupied[list / SLOTS] |= 1 << (list % SLOTS);
        }
    }

    /// Removes an entry from whatever list it is on.
    fn unlink(&mut self, index: u32) {
        let entry = &self.entries[index as usize];
        let (prev, next, list) = (entry.prev, entry.next, usize::from(entry.list));
        if prev == NIL {
            self.heads[list] = next;
        } else {
            self.entries[prev as usize].next = next;
        }
        if next != NIL {
            self.entries[next as usize].prev = prev;
        }
        if list < OVERFLOW && self.heads[list] == NIL {
            self.occupied[list / SLOTS] &= !(1 << (list % SLOTS));
        }
    }

    /// Iterates over the entry indices on `list`.
    fn list_iter(&self, list: usize) -> impl Iterator<Item = u32> + '_ {
        let first = self.heads[list];
        iter::successors((first != NIL).then_some(first), move |&index| {
            let next = self.entries[index as usize].next;
            (next != NIL).then_some(next)
        })
    }

    /// Detaches a whole list and files each entry again, relative to the
    /// current time.
    fn refile_list(&mut self, list: usize) {
        let mut index = self.heads[list];
        self.heads[list] = NIL;
        if list < OVERFLOW {
            self.occupied[list / SLOTS] &= !(1 << (list % SLOTS));
        }
        while index != NIL {
            let next = self.entries[index as usize].next;
            self.place(index);
            index = next;
        }
    }

    // ----- placement -----

    /// Files an entry on the list its deadline belongs to.
    fn place(&mut self, index: u32) {
        let list = self.list_for(self.entries[index as usize].deadline);
        self.link(index, list);
    }

    /// Which list a deadline belongs on, given the current time.
    fn list_for(&self, deadline: u64) -> usize {
        if deadline <= self.elapsed {
            return READY;
        }
        let diff = deadline ^ self.elapsed;
        if diff >> WHEEL_BITS != 0 {
            return OVERFLOW;
        }
        // Highest differing bit, in 0..36; `| SLOT_MASK` maps bits 0..6 to level 0.
        let high_bit = 63 - (diff | SLOT_MASK).leading_zeros() as usize;
        let level = high_bit / SLOT_BITS;
        level * SLOTS + slot_digit(deadline, level)
    }

    // ----- advancing -----

    /// Returns a ready entry with deadline `<= now`, if there is one.
    fn ready_entry(&self, now: u64) -> Option<u32> {
        let head = self.heads[READY];
        if head == NIL || now >= self.elapsed {
            // Every ready entry is due at or before the current time, which is <= now.
            return (head != NIL).then_some(head);
        }
        // `now` went backwards: only entries due at or before `now` may fire.
        self.list_iter(READY)
            .find(|&index| self.entries[index as usize].deadline <= now)
    }

    /// Takes one step towards `now`. Returns `false` when nothing more can
    /// expire by `now`; the current time is then `max(current, now)`.
    fn advance(&mut self, now: u64) -> bool {
        match self.earliest_slot() {
            Some((start, list)) if start <= now => {
                self.elapsed = start;
                self.refile_list(list);
                true
            }
            Some(_) => {
                self.elapsed = self.elapsed.max(now);
                false
            }
            None => self.advance_overflow(now),
        }
    }

    /// Runs when all levels are empty. Moves time into the overflow timers'
    /// block once `now` has reached that block.
    fn advance_overflow(&mut self, now: u64) -> bool {
        match next_block_start(self.elapsed) {
            Some(block) if self.heads[OVERFLOW] != NIL && now >= block => {
                let min = self.scan_min(OVERFLOW).map_or(now, |(m, _)| m);
                // Every overflow deadline is >= block > elapsed, so time moves forward.
                self.elapsed = now.min(min);
                self.refile_list(OVERFLOW);
                true
            }
            _ => {
                self.elapsed = self.elapsed.max(now);
                false
            }
        }
    }

    /// Start time and list index of the earliest occupied slot over all levels;
    /// `None` if all levels are empty.
    ///
    /// Invariant: occupied slots on level `L` lie in the current time's
    /// `64^(L+1)` ms block and have a digit strictly greater than the current
    /// time's digit. So the lowest set bit is the level's earliest slot (no
    /// wrap-around), every slot starts after the current time, and two levels
    /// can never have a slot that starts at the same time: a slot on level
    /// `L' > L` starts on a `64^(L+1)` boundary, which cannot be after the
    /// current time while still inside its level-`L` block.
    fn earliest_slot(&self) -> Option<(u64, usize)> {
        let mut best: Option<(u64, usize)> = None;
        for (level, &bits) in self.occupied.iter().enumerate() {
            if bits == 0 {
                continue;
            }
            let digit = bits.trailing_zeros() as usize;
            let start = slot_start(self.elapsed, level, digit);
            debug_assert!(start > self.elapsed, "timer wheel invariant broken");
            debug_assert!(best.is_none_or(|(t, _)| t != start), "slot start tie");
            if best.is_none_or(|(t, _)| start < t) {
                best = Some((start, level * SLOTS + digit));
            }
        }
        best
    }

    // ----- minimum-deadline cache -----

    /// Finds the exact earliest deadline and how many timers share it.
    ///
    /// The minimum is always in exactly one place. If the ready list is not
    /// empty, it is there. Otherwise it is in the earliest-starting occupied
    /// slot: that slot's range ends at or before the start of any other
    /// occupied slot. If the levels are empty, it is in the overflow list.
    fn compute_min(&self) -> Option<(u64, usize)> {
        if self.heads[READY] != NIL {
            return self.scan_min(READY);
        }
        match self.earliest_slot() {
            Some((_, list)) => self.scan_min(list),
            None => self.scan_min(OVERFLOW),
        }
    }

    /// Minimum deadline on `list` and how many entries have it.
    fn scan_min(&self, list: usize) -> Option<(u64, usize)> {
        self.list_iter(list)
            .map(|index| self.entries[index as usize].deadline)
            .fold(None, |acc, deadline| match acc {
                Some((min, count)) if min < deadline => Some((min, count)),
                Some((min, count)) if min == deadline => Some((min, count + 1)),
                _ => Some((deadline, 1)),
            })
    }

    /// Updates the cache for a newly inserted deadline (call before `len += 1`).
    fn note_inserted(&self, deadline: u64) {
        let updated = match self.min_cache.get() {
            _ if self.len == 0 => Some((deadline, 1)),
            Some((min, _)) if deadline < min => Some((deadline, 1)),
            Some((min, count)) if deadline == min => Some((min, count + 1)),
            other => other,
        };
        self.min_cache.set(updated);
    }

    /// Updates the cache for a removed (fired or cancelled) deadline.
    fn note_removed(&self, deadline: u64) {
        if let Some((min, count)) = self.min_cache.get()
            && deadline == min
        {
            self.min_cache.set((count > 1).then(|| (min, count - 1)));
        }
    }
}

impl<T> fmt::Debug for TimerWheel<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimerWheel")
            .field("now", &self.elapsed)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// Slot digit of `time` on `level`.
fn slot_digit(time: u64, level: usize) -> usize {
    // Masked to 0..64, so the cast is lossless.
    ((time >> (level * SLOT_BITS)) & SLOT_MASK) as usize
}

/// Start time of slot `digit` on `level` inside the level's block that holds
/// `elapsed`.
fn slot_start(elapsed: u64, level: usize, digit: usize) -> u64 {
    let block_mask = (1u64 << ((level + 1) * SLOT_BITS)) - 1;
    (elapsed & !block_mask) | ((digit as u64) << (level * SLOT_BITS))
}

/// Start of the 2^36 ms block after the one holding `elapsed`; `None` if
/// `elapsed` is in the last block of `u64` (then nothing can overflow).
fn next_block_start(elapsed: u64) -> Option<u64> {
    (elapsed | WHEEL_MASK).checked_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    const SEC: u64 = 1_000;
    const MIN: u64 = 60 * SEC;
    const HOUR: u64 = 60 * MIN;
    const DAY: u64 = 24 * HOUR;
    const YEAR: u64 = 365 * DAY;

    /// Tiny xorshift64 PRNG with a fixed seed, so runs are reproducible.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        fn below(&mut self, n: u64) -> u64 {
            if n == 0 { 0 } else { self.next() % n }
        }
    }

    fn drain<T>(wheel: &mut TimerWheel<T>, now: u64) -> Vec<(TimerId, T)> {
        iter::from_fn(|| wheel.poll_expired(now)).collect()
    }

    #[test]
    fn fires_exactly_at_deadline() {
        let offsets = [
            1,
            5,
            63,
            64,
            65,
            4_095,
            4_096,
            5 * SEC,
            262_144,
            3 * HOUR,
            25 * HOUR,
            400 * DAY,
            WHEEL_MASK,
            WHEEL_MASK + 1,
            3 * YEAR,
        ];
        for start in [0, 1, 63, 1_234_567_891, (1 << 36) - 5] {
            for offset in offsets {
                let mut wheel = TimerWheel::new(start);
                let deadline = start + offset;
                let id = wheel.insert(deadline, offset);
                assert_eq!(wheel.next_deadline(), Some(deadline));
                assert!(
                    wheel.poll_expired(deadline - 1).is_none(),
                    "{start}+{offset} fired early"
                );
                assert_eq!(wheel.next_deadline(), Some(deadline));
                assert_eq!(wheel.poll_expired(deadline), Some((id, offset)));
                assert!(wheel.poll_expired(deadline).is_none());
                assert!(wheel.is_empty());
                assert_eq!(wheel.next_deadline(), None);
            }
        }
    }

    #[test]
    fn fires_exactly_when_polled_step_by_step() {
        // Advance 1 ms at a time across level boundaries; catches off-by-one cascades.
        let mut wheel = TimerWheel::new(10);
        let deadlines: Vec<u64> = (0..300).map(|i| 10 + i * 29 + (i % 7)).collect();
        for &d in &deadlines {
            wheel.insert(d, d);
        }
        for now in 10..=deadlines[deadlines.len() - 1] {
            for (_, d) in drain(&mut wheel, now) {
                assert_eq!(d, now);
            }
        }
        assert!(wheel.is_empty());
    }

    #[test]
    fn past_and_present_deadlines_fire_on_next_poll() {
        let mut wheel = TimerWheel::new(1_000);
        let past = wheel.insert(10, "past");
        let present = wheel.insert(1_000, "present");
        assert_eq!(wheel.next_deadline(), Some(10));
        let mut fired: Vec<_> = drain(&mut wheel, 1_000);
        fired.sort_by_key(|(_, v)| *v);
        assert_eq!(fired, vec![(past, "past"), (present, "present")]);
    }

    #[test]
    fn cancel_and_stale_ids() {
        let mut wheel = TimerWheel::new(0);
        let a = wheel.insert(100, 'a');
        assert_eq!(wheel.len(), 1);
        assert_eq!(wheel.cancel(a), Some('a'));
        assert_eq!(wheel.cancel(a), None);
        assert!(wheel.is_empty());
        assert!(wheel.poll_expired(1_000).is_none());

        // The slot is reused; the stale id must not touch the new timer.
        let b = wheel.insert(2_000, 'b');
        assert_eq!(a.index, b.index);
        assert_ne!(a, b);
        assert_eq!(wheel.cancel(a), None);
        assert_eq!(wheel.len(), 1);
        assert_eq!(wheel.poll_expired(2_000), Some((b, 'b')));

        // A fired id is stale too, even after its slot is reused.
        assert_eq!(wheel.cancel(b), None);
        let c = wheel.insert(3_000, 'c');
        assert_eq!(c.index, b.index);
        assert_eq!(wheel.cancel(b), None);
        assert_eq!(wheel.cancel(c), Some('c'));

        // Ids from a different wheel / out of range are harmless.
        let bogus = TimerId {
            index: 12_345,
            generation: 0,
        };
        assert_eq!(wheel.cancel(bogus), None);
    }

    #[test]
    fn a_burst_gives_its_room_back_once_the_long_timers_move_down() {
        let mut wheel = TimerWheel::new(0);
        // Ten long-lived timers among a burst of 10,000 short ones, the
        // last of them at the slab's end.
        for i in 0..10_000u64 {
            wheel.insert(if i % 1_000 == 999 { MIN } else { SEC }, i);
        }
        assert_eq!(drain(&mut wheel, SEC).len(), 9_990);
        wheel.shrink_to_fit();
        assert_eq!(wheel.entries.len(), 10_000, "a live timer holds the tail");
        // Each fires and is re-armed, as a keepalive is: into the lowest
        // free entries.
        for (_, value) in drain(&mut wheel, MIN) {
            wheel.insert(2 * MIN, value);
        }
        wheel.shrink_to_fit();
        assert_eq!(wheel.entries.len(), 10);
        assert!(wheel.entries.capacity() < 100);
        assert_eq!(drain(&mut wheel, 2 * MIN).len(), 10);
    }

    #[test]
    fn an_id_from_a_given_back_entry_never_cancels_a_later_timer() {
        let mut wheel = TimerWheel::new(0);
        let keep = wheel.insert(100, 'k');
        let gone = wheel.insert(100, 'g');
        assert_eq!(wheel.cancel(gone), Some('g'));
        wheel.shrink_to_fit();
        assert_eq!(wheel.entries.len(), 1);
        let later = wheel.insert(100, 'l');
        assert_eq!(later.index, gone.index, "the entry is pushed again");
        assert_eq!(wheel.cancel(gone), None);
        assert_eq!(wheel.cancel(keep), Some('k'));
        assert_eq!(wheel.cancel(later), Some('l'));
    }

    #[test]
    fn cancel_middle_of_slot_keeps_others() {
        let mut wheel = TimerWheel::new(0);
        let ids: Vec<_> = (0..5).map(|i| wheel.insert(5 * SEC, i)).collect();
        assert_eq!(wheel.cancel(ids[2]), Some(2));
        assert_eq!(wheel.cancel(ids[0]), Some(0));
        assert_eq!(wheel.cancel(ids[4]), Some(4));
        assert_eq!(wheel.next_deadline(), Some(5 * SEC));
        let mut fired: Vec<_> = drain(&mut wheel, 5 * SEC)
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        fired.sort_unstable();
        assert_eq!(fired, vec![1, 3]);
    }

    #[test]
    fn next_deadline_exact_across_levels() {
        let start = 1_234_567;
        let offsets = [5, 5 * SEC, 3 * HOUR, 25 * HOUR, 400 * DAY];
        let mut wheel = TimerWheel::new(start);
        assert_eq!(wheel.next_deadline(), None);
        let ids: Vec<_> = offsets
            .iter()
            .rev()
            .map(|&o| (o, wheel.insert(start + o, o)))
            .collect();
        // Remove the earliest one at a time; the next one must be reported exactly.
        for &offset in &offsets {
            assert_eq!(wheel.next_deadline(), Some(start + offset));
            let &(_, id) = ids.iter().find(|(o, _)| *o == offset).unwrap();
            assert_eq!(wheel.cancel(id), Some(offset));
        }
        assert_eq!(wheel.next_deadline(), None);

        // Each alone, after the wheel has advanced to an unaligned time.
        for offset in offsets {
            let mut wheel = TimerWheel::new(0);
            assert!(wheel.poll_expired(start).is_none());
            wheel.insert(start + offset, ());
            assert_eq!(wheel.next_deadline(), Some(start + offset));
        }
    }

    #[test]
    fn next_deadline_exact_within_higher_slot() {
        // Both timers share one level-2 slot; the minimum is not at the slot start.
        let mut wheel = TimerWheel::new(0);
        wheel.insert(3 * 4_096 + 777, 1);
        let early = wheel.insert(3 * 4_096 + 500, 2);
        assert_eq!(wheel.next_deadline(), Some(3 * 4_096 + 500));
        wheel.cancel(early);
        assert_eq!(wheel.next_deadline(), Some(3 * 4_096 + 777));
    }

    #[test]
    fn jumping_to_next_deadline_drains_in_order() {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let start = 987_654_321;
        let mut wheel = TimerWheel::new(start);
        let scales = [64, 4_096, 5 * SEC, 3 * HOUR, 25 * HOUR, 400 * DAY, 5 * YEAR];
        let count = 10_000;
        for i in 0..count {
            let scale = scales[i % scales.len()];
            wheel.insert(start + 1 + rng.below(scale), i);
        }
        let mut fired = 0;
        let mut last = start;
        while let Some(deadline) = wheel.next_deadline() {
            assert!(deadline >= last, "deadlines went backwards");
            assert!(wheel.poll_expired(deadline - 1).is_none());
            let batch = drain(&mut wheel, deadline);
            assert!(
                !batch.is_empty(),
                "nothing fired at next_deadline {deadline}"
            );
            fired += batch.len();
            last = deadline;
        }
        assert_eq!(fired, count);
        assert!(wheel.is_empty());
    }

    #[test]
    fn big_jump_fires_everything_due_in_order() {
        let mut wheel = TimerWheel::new(0);
        let deadlines = [
            30 * HOUR,
            7,
            5 * SEC,
            25 * HOUR,
            3 * HOUR,
            64,
            4_096,
            400 * DAY,
        ];
        for d in deadlines {
            wheel.insert(d, d);
        }
        let fired: Vec<u64> = drain(&mut wheel, 26 * HOUR)
            .into_iter()
            .map(|(_, d)| d)
            .collect();
        assert_eq!(fired, vec![7, 64, 4_096, 5 * SEC, 3 * HOUR, 25 * HOUR]);
        assert_eq!(wheel.next_deadline(), Some(30 * HOUR));
        assert_eq!(wheel.len(), 2);
    }

    #[test]
    fn time_going_backwards_is_harmless() {
        let mut wheel = TimerWheel::new(10_000);
        wheel.insert(10_500, "later");
        assert!(wheel.poll_expired(5_000).is_none());
        // Inserted with deadline <= current time: on the ready list.
        wheel.insert(9_000, "due");
        wheel.insert(9_500, "due-later");
        let fired: Vec<_> = drain(&mut wheel, 9_200)
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        assert_eq!(fired, vec!["due"]);
        let fired: Vec<_> = drain(&mut wheel, 10_000)
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        assert_eq!(fired, vec!["due-later"]);
        assert!(wheel.poll_expired(10_499).is_none());
        assert_eq!(wheel.poll_expired(10_500).map(|(_, v)| v), Some("later"));
    }

    #[test]
    fn far_future_and_end_of_time() {
        let mut wheel = TimerWheel::new(u64::MAX - 1_000);
        let id = wheel.insert(u64::MAX, 1);
        assert_eq!(wheel.next_deadline(), Some(u64::MAX));
        assert!(wheel.poll_expired(u64::MAX - 1).is_none());
        assert_eq!(wheel.poll_expired(u64::MAX), Some((id, 1)));

        // Several overflow blocks away, with a nearer timer in between.
        let mut wheel = TimerWheel::new(0);
        wheel.insert(10 * YEAR + 3, 10);
        wheel.insert(3 * YEAR + 1, 3);
        wheel.insert(HOUR, 0);
        assert_eq!(wheel.next_deadline(), Some(HOUR));
        assert_eq!(drain(&mut wheel, 2 * YEAR).len(), 1);
        assert_eq!(wheel.next_deadline(), Some(3 * YEAR + 1));
        assert!(wheel.poll_expired(3 * YEAR).is_none());
        assert_eq!(wheel.next_deadline(), Some(3 * YEAR + 1));
        assert_eq!(wheel.poll_expired(3 * YEAR + 1).map(|(_, v)| v), Some(3));
        assert!(wheel.poll_expired(10 * YEAR + 2).is_none());
        assert_eq!(wheel.poll_expired(u64::MAX).map(|(_, v)| v), Some(10));
    }

    #[test]
    fn jump_across_overflow_blocks_fires_in_order() {
        let mut wheel = TimerWheel::new(5);
        let deadlines = [
            10 * YEAR,
            3 * YEAR + 5,
            4 * YEAR,
            3 * YEAR + 1,
            9 * YEAR,
            2 * YEAR,
        ];
        for d in deadlines {
            wheel.insert(d, d);
        }
        let fired: Vec<u64> = drain(&mut wheel, 9 * YEAR)
            .into_iter()
            .map(|(_, d)| d)
            .collect();
        assert_eq!(
            fired,
            vec![2 * YEAR, 3 * YEAR + 1, 3 * YEAR + 5, 4 * YEAR, 9 * YEAR]
        );
        assert_eq!(wheel.next_deadline(), Some(10 * YEAR));
    }

    #[test]
    fn many_timers_same_deadline() {
        let mut wheel = TimerWheel::new(0);
        for i in 0..1_000 {
            wheel.insert(DAY, i);
        }
        assert_eq!(wheel.next_deadline(), Some(DAY));
        assert!(wheel.poll_expired(DAY - 1).is_none());
        assert_eq!(drain(&mut wheel, DAY).len(), 1_000);
        assert!(wheel.is_empty());
    }

    /// Reference model: pending timers keyed by (deadline, value).
    struct Model {
        by_deadline: BTreeMap<(u64, u64), TimerId>,
        by_value: HashMap<u64, (u64, TimerId)>,
        values: Vec<u64>,
    }

    impl Model {
        fn remove(&mut self, value: u64) {
            let (deadline, _) = self.by_value.remove(&value).unwrap();
            self.by_deadline.remove(&(deadline, value));
            let pos = self.values.iter().position(|&v| v == value).unwrap();
            self.values.swap_remove(pos);
        }
    }

    fn random_deadline(rng: &mut XorShift, now: u64) -> u64 {
        match rng.below(12) {
            0 => now.saturating_sub(rng.below(2_000)),
            1 => now + rng.below(64),
            2 => now + rng.below(4_096),
            3 => now + rng.below(5 * SEC),
            4 => now + rng.below(3 * HOUR),
            5 => now + rng.below(25 * HOUR),
            6 => now + rng.below(400 * DAY),
            7 => now + rng.below(6 * YEAR),
            // Exactly on a level boundary, to produce slots on different
            // levels that start at the same time.
            8..=10 => {
                let level = rng.below(LEVELS as u64 + 1) as usize;
                (now | ((1u64 << (level * SLOT_BITS)) - 1)) + 1 + rng.below(3)
            }
            _ => now + 1,
        }
    }

    fn random_now(rng: &mut XorShift, now: u64, next: Option<u64>) -> u64 {
        match rng.below(8) {
            0 => now,
            1 => now + rng.below(10),
            2 => now + rng.below(5_000),
            3 | 4 => next.map_or(now, |d| d.max(now)),
            5 => next.map_or(now, |d| d.max(now) + rng.below(100)),
            6 => now + rng.below(30 * HOUR),
            _ => now + rng.below(3 * YEAR),
        }
    }

    /// Polls at `at` and checks the fired set against the model.
    fn check_poll(wheel: &mut TimerWheel<u64>, model: &mut Model, at: u64) {
        let mut fired = drain(wheel, at);
        fired.sort_by_key(|&(_, v)| v);
        let mut expected: Vec<(TimerId, u64)> = model
            .by_deadline
            .range(..=(at, u64::MAX))
            .map(|(&(_, v), &id)| (id, v))
            .collect();
        expected.sort_by_key(|&(_, v)| v);
        assert_eq!(fired, expected, "fired set mismatch at {at}");
        for (id, value) in fired {
            model.remove(value);
            assert_eq!(wheel.cancel(id), None, "fired id still cancellable");
        }
    }

    fn run_against_model(seed: u64, ops: usize) {
        let mut rng = XorShift(seed);
        let mut now = rng.below(1 << 40);
        let mut wheel = TimerWheel::new(now);
        let mut model = Model {
            by_deadline: BTreeMap::new(),
            by_value: HashMap::new(),
            values: Vec::new(),
        };
        let mut stale: Vec<TimerId> = Vec::new();
        for value in 0..ops as u64 {
            match rng.below(100) {
                0..=44 => {
                    let deadline = random_deadline(&mut rng, now);
                    let id = wheel.insert(deadline, value);
                    model.by_deadline.insert((deadline, value), id);
                    model.by_value.insert(value, (deadline, id));
                    model.values.push(value);
                }
                45..=64 if !model.values.is_empty() => {
                    let v = model.values[rng.below(model.values.len() as u64) as usize];
                    let (_, id) = model.by_value[&v];
                    assert_eq!(wheel.cancel(id), Some(v));
                    model.remove(v);
                    stale.push(id);
                }
                65..=69 if !stale.is_empty() => {
                    let id = stale[rng.below(stale.len() as u64) as usize];
                    assert_eq!(wheel.cancel(id), None);
                }
                70..=73 => {
                    let earlier = now.saturating_sub(rng.below(3_000));
                    check_poll(&mut wheel, &mut model, earlier);
                }
                // Ids, live and stale, must mean the same after the slab
                // gives its tail back and grows again.
                74 => wheel.shrink_to_fit(),
                _ => {
                    now = random_now(&mut rng, now, wheel.next_deadline());
                    check_poll(&mut wheel, &mut model, now);
                }
            }
            assert_eq!(wheel.len(), model.by_deadline.len());
            let model_min = model.by_deadline.keys().next().map(|&(d, _)| d);
            assert_eq!(wheel.next_deadline(), model_min, "next_deadline mismatch");
        }
        // Drain the rest by jumping straight to each deadline.
        while let Some(deadline) = wheel.next_deadline() {
            if deadline > now {
                assert!(
                    wheel.poll_expired(deadline - 1).is_none(),
                    "fired before {deadline}"
                );
                now = deadline;
            }
            check_poll(&mut wheel, &mut model, now);
        }
        assert!(model.by_deadline.is_empty());
        assert!(wheel.is_empty());
    }

    #[test]
    fn randomized_against_model() {
        for seed in [1, 0xDEAD_BEEF, 0x1234_5678_9ABC_DEF0, 42, 7_777_777] {
            run_against_model(seed, 20_000);
        }
    }
}
