//! The in-memory event store behind the test relays ([`TestRelay`] and
//! [`RelayFarm`]): NIP-01 storage rules and `REQ` answers, shared so both
//! relays behave exactly alike.
//!
//! Events are kept in four indexes: by `created_at` (newest first, ties by
//! id: the order a relay answers a `REQ` in), by insertion (the order they
//! were stored), by id, and by single-letter tag value; replaceable and
//! addressable events are also indexed by address. Inserting, replacing and
//! looking up are logarithmic or constant. A `REQ` filter with tag
//! conditions reads its candidates from the tag index (the condition with
//! the fewest); any other walks the time index from its `until` and stops
//! at its `since` or once it has enough results, so a capped `REQ` costs
//! about its cap, and a tag `REQ` about its candidates, not the store size.
//! That matters for the demo's own relay, which answers the engine's
//! negentropy listings (a tag filter each, thousands at scale) from a store
//! holding every synced event.
//!
//! [`TestRelay`]: crate::testing::relay::TestRelay
//! [`RelayFarm`]: crate::testing::farm::RelayFarm

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Bound;

use nostr::prelude::{
    Event, EventId, Filter, Kind, MatchEventOptions, PublicKey, SingleLetterTag, Timestamp,
};

/// What storing an event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Stored (possibly replacing an older version): deliver it.
    New,
    /// Ephemeral (kinds 20000-29999): deliver it, do not store it.
    Ephemeral,
    /// Already stored.
    Duplicate,
    /// A newer version of this replaceable or addressable event is stored.
    Stale,
}

/// Where a stored event sits in the `REQ` order: newest first, then by id.
/// Opaque; get the event back with [`Store::get_by_key`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventKey(Reverse<Timestamp>, EventId);

impl EventKey {
    fn of(event: &Event) -> EventKey {
        EventKey(Reverse(event.created_at), event.id)
    }
}

/// What a replaceable or addressable event replaces: kind, author and, for
/// addressable kinds, the `d` tag.
type Address = (Kind, PublicKey, Option<String>);

/// The address of a replaceable (kinds 0, 3, 10000-19999) or addressable
/// (30000-39999) event; `None` for other kinds.
fn address(event: &Event) -> Option<Address> {
    let k = event.kind.as_u16();
    if k == 0 || k == 3 || (10_000..20_000).contains(&k) {
        Some((event.kind, event.pubkey, None))
    } else if (30_000..40_000).contains(&k) {
        let d = event.tags.identifier().unwrap_or_default();
        Some((event.kind, event.pubkey, Some(d)))
    } else {
        None
    }
}

/// NIP-01 order of versions of one address: newer `created_at` wins, then
/// the lowest id.
fn supersedes(a: &Event, b: &Event) -> bool {
    a.created_at > b.created_at || (a.created_at == b.created_at && a.id < b.id)
}

/// True for ephemeral kinds, which are delivered but never stored.
fn is_ephemeral(kind: Kind) -> bool {
    (20_000..30_000).contains(&kind.as_u16())
}

/// An in-memory NIP-01 event store. Events are trusted: verifying them is
/// the caller's job.
#[derive(Debug, Default)]
pub struct Store {
    /// The events, in `REQ` order.
    by_time: BTreeMap<EventKey, Event>,
    /// Insertion sequence number to event, for the order stored.
    by_seq: BTreeMap<u64, EventKey>,
    /// Id to insertion sequence number and `REQ` key.
    ids: HashMap<EventId, (u64, EventKey)>,
    /// Address to the id of the version stored.
    addresses: HashMap<Address, EventId>,
    /// Single-letter tag and its value (a tag's first value, as NIP-01
    /// matches it) to the events carrying it.
    tags: HashMap<SingleLetterTag, HashMap<String, BTreeSet<EventKey>>>,
    next_seq: u64,
}

/// The `(letter, value)` pairs of an event's tags that a `#letter` filter
/// condition matches on.
fn tag_values(event: &Event) -> impl Iterator<Item = (SingleLetterTag, &str)> + '_ {
    event
        .tags
        .iter()
        .filter_map(|t| Some((t.single_letter_tag()?, t.content()?)))
}

impl Store {
    /// An empty store (allocates nothing until the first event).
    pub fn new() -> Store {
        Store::default()
    }

    /// Stores an event by NIP-01 rules: an id already stored is a
    /// duplicate; ephemeral kinds are not stored; of the versions of a
    /// replaceable or addressable event only the newest is kept.
    pub fn insert(&mut self, event: Event) -> Stored {
        if self.ids.contains_key(&event.id) {
            return Stored::Duplicate;
        }
        if is_ephemeral(event.kind) {
            return Stored::Ephemeral;
        }
        if let Some(addr) = address(&event) {
            if let Some(old_id) = self.addresses.get(&addr).copied()
                && let Some(old) = self.get(&old_id)
            {
                if !supersedes(&event, old) {
                    return Stored::Stale;
                }
                self.remove(&old_id);
            }
            self.addresses.insert(addr, event.id);
        }
        let key = EventKey::of(&event);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.ids.insert(event.id, (seq, key));
        self.by_seq.insert(seq, key);
        for (letter, value) in tag_values(&event) {
            self.tags
                .entry(letter)
                .or_default()
                .entry(value.to_owned())
                .or_default()
                .insert(key);
        }
        self.by_time.insert(key, event);
        Stored::New
    }

    /// Removes an event from the id, insertion and time indexes (not from
    /// the address index: the caller replaces that entry).
    fn remove(&mut self, id: &EventId) {
        let Some((seq, key)) = self.ids.remove(id) else {
            return;
        };
        self.by_seq.remove(&seq);
        let Some(event) = self.by_time.remove(&key) else {
            return;
        };
        for (letter, value) in tag_values(&event) {
            if let Some(values) = self.tags.get_mut(&letter)
                && let Some(keys) = values.get_mut(value)
            {
                keys.remove(&key);
                if keys.is_empty() {
                    values.remove(value);
                }
            }
        }
    }

    /// True if the event with this id is stored.
    pub fn contains(&self, id: &EventId) -> bool {
        self.ids.contains_key(id)
    }

    /// The stored event with this id.
    pub fn get(&self, id: &EventId) -> Option<&Event> {
        let (_, key) = self.ids.get(id)?;
        self.by_time.get(key)
    }

    /// The stored event at `key` (from [`query_keys`](Store::query_keys)),
    /// unless it was replaced since.
    pub fn get_by_key(&self, key: &EventKey) -> Option<&Event> {
        self.by_time.get(key)
    }

    /// Number of stored events.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True if no event is stored.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The stored events in the order they were stored.
    pub fn iter(&self) -> impl Iterator<Item = &Event> + '_ {
        self.by_seq.values().filter_map(|key| self.by_time.get(key))
    }

    /// The stored events in the order they were stored, consuming the store.
    pub fn into_events(mut self) -> Vec<Event> {
        let order = std::mem::take(&mut self.by_seq);
        order
            .into_values()
            .filter_map(|key| self.by_time.remove(&key))
            .collect()
    }

    /// Stored results for a `REQ`: per filter newest first (ties by id) up
    /// to its limit; merged, de-duplicated, newest first, at most `cap`.
    pub fn query(&self, filters: &[Filter], cap: usize) -> Vec<&Event> {
        self.query_keys(filters, cap)
            .iter()
            .filter_map(|key| self.by_time.get(key))
            .collect()
    }

    /// [`query`](Store::query) as keys, to send the events later without
    /// holding a borrow of the store (see [`get_by_key`](Store::get_by_key)).
    pub fn query_keys(&self, filters: &[Filter], cap: usize) -> Vec<EventKey> {
        self.query_keys_capped(filters, usize::MAX, cap)
    }

    /// [`query_keys`](Store::query_keys) for a relay that also caps each
    /// filter: a filter gets at most `min(limit, per_filter)` of its newest
    /// matches (a filter without `limit` gets `per_filter`), as khatru over
    /// eventstore's SQL backends answers (`per_filter` 100 there); the
    /// merged results are then capped at `per_req`.
    pub fn query_keys_capped(
        &self,
        filters: &[Filter],
        per_filter: usize,
        per_req: usize,
    ) -> Vec<EventKey> {
        let mut seen = HashSet::new();
        let mut all = Vec::new();
        for f in filters {
            // The first `per_req` of the merged results can only hold a
            // filter's first `per_req` matches: every event before those in
            // the common order precedes them in the merge too.
            let take = f.limit.unwrap_or(usize::MAX).min(per_filter).min(per_req);
            if take == 0 {
                continue;
            }
            for key in self.matches(f, take) {
                if seen.insert(key) {
                    all.push(key);
                }
            }
        }
        all.sort_unstable();
        all.truncate(per_req);
        all
    }

    /// The first `take` events matching `f`, in `REQ` order.
    fn matches(&self, f: &Filter, take: usize) -> Vec<EventKey> {
        let matching = |e: &Event| f.match_event(e, MatchEventOptions::new());
        if let Some(ids) = &f.ids {
            let mut hits: Vec<EventKey> = ids
                .iter()
                .filter_map(|id| self.ids.get(id))
                .map(|(_, key)| *key)
                .filter(|key| self.by_time.get(key).is_some_and(matching))
                .collect();
            hits.sort_unstable();
            hits.truncate(take);
            return hits;
        }
        if let Some(candidates) = self.tag_candidates(f) {
            return candidates
                .into_iter()
                .filter(|key| self.by_time.get(key).is_some_and(matching))
                .take(take)
                .collect();
        }
        let start = match f.until {
            Some(until) => {
                Bound::Included(EventKey(Reverse(until), EventId::from_byte_array([0; 32])))
            }
            None => Bound::Unbounded,
        };
        let mut hits = Vec::new();
        for (key, event) in self.by_time.range((start, Bound::Unbounded)) {
            if f.since.is_some_and(|since| event.created_at < since) {
                break;
            }
            if matching(event) {
                hits.push(*key);
                if hits.len() == take {
                    break;
                }
            }
        }
        hits
    }

    /// For a filter with tag conditions, the events that can match it: the
    /// carriers of the condition with the fewest, in `REQ` order (a superset:
    /// the caller checks the whole filter). `None` without tag conditions.
    fn tag_candidates(&self, f: &Filter) -> Option<BTreeSet<EventKey>> {
        let carriers = |letter: &SingleLetterTag, value: &String| {
            self.tags.get(letter).and_then(|values| values.get(value))
        };
        let (letter, values) = f.generic_tags.iter().min_by_key(|(letter, values)| {
            values
                .iter()
                .filter_map(|v| carriers(letter, v))
                .map(BTreeSet::len)
                .sum::<usize>()
        })?;
        Some(
            values
                .iter()
                .filter_map(|v| carriers(letter, v))
                .flatten()
                .copied()
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Tag};

    fn event(keys: &Keys, kind: u16, at: u64, tags: &[[&str; 2]]) -> Event {
        EventBuilder::new(Kind::from_u16(kind), "")
            .tags(tags.iter().map(|t| Tag::parse(*t).unwrap()))
            .custom_created_at(Timestamp::from_secs(at))
            .finalize(keys)
            .unwrap()
    }

    /// Every filter answered through the tag index equals a scan of every
    /// stored event, also after addressable events were replaced by
    /// versions with other tags.
    #[test]
    fn tag_queries_match_a_full_scan() {
        let keys = Keys::generate();
        let mut store = Store::new();
        let mut all = Vec::new();
        for i in 0..300u64 {
            let a = format!("30617:x:repo-{}", i % 7);
            let e = format!("{:064x}", i % 11);
            let tags = [["a", a.as_str()], ["e", e.as_str()]];
            let kind = [1, 1621, 1111][(i % 3) as usize];
            all.push(event(&keys, kind, 1_000 + i / 2, &tags));
        }
        // Addressable: each `d` is replaced twice, its `r` tag changing.
        for (i, r) in ["one", "two", "three"].iter().enumerate() {
            for d in ["p", "q"] {
                all.push(event(&keys, 30618, 2_000 + i as u64, &[["d", d], ["r", r]]));
            }
        }
        for e in &all {
            store.insert(e.clone());
        }
        let stored: Vec<&Event> = all.iter().filter(|e| store.contains(&e.id)).collect();
        assert_eq!(stored.len(), 302);
        let filters = [
            Filter::new().custom_tag(SingleLetterTag::from_char('a').unwrap(), "30617:x:repo-3"),
            Filter::new()
                .custom_tags(
                    SingleLetterTag::from_char('a').unwrap(),
                    ["30617:x:repo-1", "30617:x:repo-2"],
                )
                .custom_tag(
                    SingleLetterTag::from_char('e').unwrap(),
                    format!("{:064x}", 4),
                )
                .kind(Kind::from_u16(1621)),
            Filter::new()
                .custom_tag(
                    SingleLetterTag::from_char('e').unwrap(),
                    format!("{:064x}", 5),
                )
                .since(Timestamp::from_secs(1_040))
                .until(Timestamp::from_secs(1_120))
                .limit(7),
            Filter::new().custom_tag(SingleLetterTag::from_char('r').unwrap(), "three"),
            Filter::new().custom_tag(SingleLetterTag::from_char('r').unwrap(), "one"),
            Filter::new().custom_tag(SingleLetterTag::from_char('a').unwrap(), "nothing"),
        ];
        for f in &filters {
            let mut want: Vec<EventKey> = stored
                .iter()
                .filter(|e| f.match_event(e, MatchEventOptions::new()))
                .map(|e| EventKey::of(e))
                .collect();
            want.sort_unstable();
            want.truncate(f.limit.unwrap_or(usize::MAX));
            assert_eq!(
                store.query_keys(std::slice::from_ref(f), usize::MAX),
                want,
                "{f:?}"
            );
        }
        // The replaced versions' tags lead nowhere.
        let r = SingleLetterTag::from_char('r').unwrap();
        assert_eq!(store.tags[&r].keys().collect::<Vec<_>>(), ["three"]);
    }
}
