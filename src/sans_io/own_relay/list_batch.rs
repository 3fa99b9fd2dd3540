//! Parts waiting their turn, asked of the own relay together, and the
//! answer routed back to them.
//!
//! The engine lists the sink in parts of one repo or root each (the one
//! split, `engine::listing_cache::parts`), so that relays holding the same
//! repos share them. A first sync of 2,000 relays then asked the own relay
//! 14,000 REQs, most of them for nothing: each one a query of its own, and
//! on nostr-rs-relay a reader holding the WAL while the writer stores the
//! sync. Parts that differ only in the one value of their one tag (the
//! same letter, kinds, `since`) are asked as one filter with those values
//! ([`Batch`]): it matches exactly what they match together. An event it
//! lists goes to the parts whose value it carries under that letter
//! ([`Batch::route`]: a lookup per tag of the event, not a match of the
//! event against every part). Only parts already waiting are batched, so
//! a lone part is asked at once as before, and a burst costs a hundredth
//! of the queries. The merge stays here, on the link that sees the events:
//! the sink's answer to the engine is ids and timestamps only (the public
//! `Sink::list`), which could not be routed to parts.

use std::collections::{HashMap, VecDeque};

use nostr::prelude::{Event, Filter, MatchEventOptions, SingleLetterTag};

use crate::sans_io::query::filters::{one_tag, same_but_tags};

/// Values one batched filter carries at most, until the own relay refuses
/// as many (`ListQueries` learns its count): eventstore's SQL backends
/// (khatru relays) take 100 tag values a filter, as the engine's REQs to
/// other relays assume (`Limits::tag_values`). Every query is a scan on
/// some own relays (LocalRelay's memory store reads every event for a tag
/// filter): at ten values, the listings of a GRASP-shaped first sync cost
/// the own relay 10 CPU seconds more than storing its 50,000 events, and
/// the sync twice its time (issue 46).
pub(crate) const MAX_VALUES: usize = 100;

/// Waiting listings looked through for ones to batch with the first, per
/// value a batch may carry. A burst queues each relay's parts one after
/// the other (seven letters and kinds), so a batch's values of a kind lie
/// within ten times their count; the bound keeps a queue of tens of
/// thousands from being scanned for every REQ.
const SCAN_PER_VALUE: usize = 10;

/// A waiting listing: the engine's request and the filter it lists.
pub(crate) type Part = (u64, Filter);

/// Takes the first waiting listing and those that can be asked with it in
/// one filter of at most `values` values (looking through
/// [`SCAN_PER_VALUE`] times that many), in queue order; `None` when none
/// waits.
pub(crate) fn take_batch(waiting: &mut VecDeque<Part>, values: usize) -> Option<Vec<Part>> {
    let first = waiting.pop_front()?;
    let Some(letter) = single_value_tag(&first.1) else {
        return Some(vec![first]);
    };
    let mut picked = Vec::new();
    let scan = values.saturating_mul(SCAN_PER_VALUE);
    for (i, (_, filter)) in waiting.iter().enumerate().take(scan) {
        if picked.len() + 1 >= values {
            break;
        }
        if same_but_value(&first.1, filter, letter) {
            picked.push(i);
        }
    }
    let mut batch = Vec::with_capacity(picked.len() + 1);
    batch.push(first);
    // From the back, so the indexes still hold.
    let mut taken: Vec<Part> = picked
        .into_iter()
        .rev()
        .filter_map(|i| waiting.remove(i))
        .collect();
    taken.reverse();
    batch.extend(taken);
    Some(batch)
}

/// The filter asking for every part of `batch` at once: the first's, with
/// every part's value of the batched tag.
pub(crate) fn batch_filter(batch: &[Part]) -> Filter {
    let mut filter = batch[0].1.clone();
    if batch.len() == 1 {
        return filter;
    }
    if let Some((_, values)) = filter.generic_tags.iter_mut().next() {
        for (_, part) in &batch[1..] {
            values.extend(part.generic_tags.values().flatten().cloned());
        }
    }
    filter
}

/// How a batch's answer reaches its parts.
#[derive(Debug)]
pub(crate) enum Batch {
    /// One part: every event the query lists is its.
    One,
    /// Parts differing in the value of tag `letter`: each value's parts
    /// (by index; two requests may list one filter, when the engine asked
    /// again a listing it gave up waiting for).
    ByValue {
        /// The batched tag.
        letter: SingleLetterTag,
        /// Part indexes by value.
        parts: HashMap<String, Vec<usize>>,
    },
}

impl Batch {
    /// How to route the answer of `batch`.
    pub(crate) fn of(batch: &[Part]) -> Batch {
        let letter = match batch {
            [_] => None,
            [first, ..] => single_value_tag(&first.1),
            [] => None,
        };
        let Some(letter) = letter else {
            return Batch::One;
        };
        let mut parts: HashMap<String, Vec<usize>> = HashMap::with_capacity(batch.len());
        for (i, (_, part)) in batch.iter().enumerate() {
            for value in part.generic_tags.values().flatten() {
                parts.entry(value.clone()).or_default().push(i);
            }
        }
        Batch::ByValue { letter, parts }
    }

    /// The parts `event` belongs to, each once: those whose value it
    /// carries under the batched letter, if `filter` (what was asked)
    /// matches it at all.
    pub(crate) fn route(&self, filter: &Filter, event: &Event, mut to: impl FnMut(usize)) {
        let Batch::ByValue { letter, parts } = self else {
            return to(0);
        };
        if !filter.match_event(event, MatchEventOptions::new()) {
            return;
        }
        let mut given: Vec<usize> = Vec::new();
        let values = event.tags.iter().filter_map(|t| {
            (t.single_letter_tag()? == *letter)
                .then(|| t.content())
                .flatten()
        });
        for value in values {
            for &i in parts.get(value).into_iter().flatten() {
                if !given.contains(&i) {
                    given.push(i);
                    to(i);
                }
            }
        }
    }
}

/// The letter of `filter`'s one tag, if it has exactly one tag and one
/// value for it: only such filters are batched.
fn single_value_tag(filter: &Filter) -> Option<SingleLetterTag> {
    one_tag(filter)
        .filter(|(_, values)| values.len() == 1)
        .map(|(letter, _)| *letter)
}

/// True when `b` is `a` but for the one value of tag `letter`.
fn same_but_value(a: &Filter, b: &Filter, letter: SingleLetterTag) -> bool {
    single_value_tag(b) == Some(letter) && same_but_tags(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::*;

    fn e_part(request: u64, value: &str) -> Part {
        (
            request,
            Filter::new().custom_tag(SingleLetterTag::LOWERCASE_E, value),
        )
    }

    #[test]
    fn parts_differing_only_in_their_value_are_asked_together_in_queue_order() {
        let d = Filter::new()
            .kind(Kind::from_u16(30618))
            .custom_tag(SingleLetterTag::LOWERCASE_D, "repo");
        let since = e_part(9, "c").1.since(Timestamp::from_secs(5));
        let mut waiting = VecDeque::from([
            e_part(1, "a"),
            (2, d),
            e_part(3, "b"),
            (4, since),
            e_part(5, "a2"),
        ]);
        let batch = take_batch(&mut waiting, MAX_VALUES).unwrap();
        let requests: Vec<u64> = batch.iter().map(|(r, _)| *r).collect();
        assert_eq!(requests, [1, 3, 5]);
        let json = batch_filter(&batch).as_json();
        assert_eq!(json, r##"{"#e":["a","a2","b"]}"##);
        let rest: Vec<u64> = waiting.iter().map(|(r, _)| *r).collect();
        assert_eq!(rest, [2, 4], "another kind or `since` waits its own turn");
        assert_eq!(take_batch(&mut waiting, MAX_VALUES).unwrap().len(), 1);
    }

    #[test]
    fn a_batch_carries_the_values_asked_at_most() {
        let mut waiting: VecDeque<Part> = (0..25).map(|i| e_part(i, &format!("v{i}"))).collect();
        assert_eq!(take_batch(&mut waiting, 10).unwrap().len(), 10);
        assert_eq!(take_batch(&mut waiting, 10).unwrap().len(), 10);
        assert_eq!(take_batch(&mut waiting, 10).unwrap().len(), 5);
        assert_eq!(take_batch(&mut waiting, 10), None);
        let mut waiting: VecDeque<Part> = (0..250).map(|i| e_part(i, &format!("v{i}"))).collect();
        assert_eq!(take_batch(&mut waiting, MAX_VALUES).unwrap().len(), 100);
        assert_eq!(take_batch(&mut waiting, 1).unwrap().len(), 1);
    }

    #[test]
    fn a_filter_of_two_tags_or_values_is_asked_alone() {
        let two = e_part(1, "a")
            .1
            .custom_tag(SingleLetterTag::LOWERCASE_E, "b");
        let mut waiting = VecDeque::from([(1, two), e_part(2, "c"), e_part(3, "d")]);
        assert_eq!(take_batch(&mut waiting, MAX_VALUES).unwrap().len(), 1);
        assert_eq!(take_batch(&mut waiting, MAX_VALUES).unwrap().len(), 2);
    }

    /// The answer goes to parts by the value the event carries, each part
    /// once, and what the asked filter does not match goes nowhere.
    #[test]
    fn a_listed_event_goes_to_the_parts_whose_value_it_carries() {
        let batch = vec![
            e_part(1, "a"),
            e_part(2, "b"),
            e_part(3, "c"),
            e_part(4, "a"),
        ];
        let filter = batch_filter(&batch).kind(Kind::from_u16(1111));
        let route = Batch::of(&batch);
        let keys = Keys::generate();
        let event = |kind: u16, values: &[&str]| {
            let tags = values.iter().map(|v| Tag::parse(["e", v]).unwrap());
            EventBuilder::new(Kind::from_u16(kind), "")
                .tags(tags)
                .finalize(&keys)
                .unwrap()
        };
        let to = |e: &Event| {
            let mut parts = Vec::new();
            route.route(&filter, e, |i| parts.push(i));
            parts.sort();
            parts
        };
        assert_eq!(to(&event(1111, &["a", "c", "a"])), [0, 2, 3]);
        assert_eq!(to(&event(1111, &["b", "z"])), [1]);
        assert!(to(&event(1, &["b"])).is_empty(), "not what was asked");
        let one = Batch::of(&batch[..1]);
        let mut parts = Vec::new();
        one.route(&filter, &event(1, &[]), |i| parts.push(i));
        assert_eq!(parts, [0], "a lone part takes what the relay sends");
    }
}
