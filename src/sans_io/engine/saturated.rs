//! Seconds that hold more matching events than a relay returns.
//!
//! Relays clamp `limit` (strfry to 500, khatru over eventstore to 100) and
//! page by `until`, which is a second: when one second holds more events
//! for a filter than the cap, every page from that second returns the same
//! events, and paging can only step past it. Replies imported in bulk,
//! bridged or backdated share seconds that way: 150 replies in one second
//! behind a cap of 100 lost 50.
//!
//! Such a second ([`Saturated`]) is asked again in parts, each its own
//! chain that completes the same chunks: first the filter's values in
//! halves (a tag's values are alternatives, so the halves together match
//! what it matched), down to one value; then, with one value left, NIP-77
//! over that second where the relay may speak it (an empty local set: the
//! relay lists every id it holds there, fetched by `ids`); then the kinds
//! the page showed, one each. A part returning fewer events than the
//! saturated page holds all there is (the relay returns at least that many
//! for one filter). What still fills the cap with one value and one kind,
//! on a relay without NIP-77, cannot be read: it is counted
//! (`Stats::seconds_unreachable`) and logged with relay, filter and second.

use std::collections::BTreeSet;

use log::{debug, info, warn};
use nostr::prelude::{Filter, Kind};

use super::ctx::Ctx;
use super::relay::RelayState;
use crate::sans_io::query::subscription::{NextPage, PageFilter, Saturated, Scope, WorkRef};
use crate::sans_io::timing::time::Time;
use crate::sans_io::wire::relay_text::{dropped, relay_text};

/// Unsure seconds a connection keeps at most; the oldest go first.
const MAX_UNSURE: usize = 256;

/// The smallest page size taken for a relay's cap without proof.
const SMALLEST_CAP_GUESS: usize = 20;

/// A second that may be saturated, as a connection keeps it until its
/// pages show the relay's cap: the filter as its JSON, one allocation
/// where a [`Filter`] is a tree of them (a string per tag value). Kept
/// through a relay's idle life, the trees were a sixth of an idle
/// relay's memory (demo at 1,000 and 4,000 relays).
#[derive(Debug)]
pub(super) struct Unsure {
    filter: Box<str>,
    count: usize,
    alone: bool,
    kinds: Box<[u16]>,
    scope: Scope,
}

impl Unsure {
    fn new(sat: Saturated, scope: Scope) -> Unsure {
        Unsure {
            filter: sat.filter.as_json().into_boxed_str(),
            count: sat.count,
            alone: sat.alone,
            kinds: sat.kinds.into_boxed_slice(),
            scope,
        }
    }

    /// The second to split, or `None` if its filter no longer parses.
    fn into_saturated(self) -> Option<(Saturated, Scope)> {
        let filter = Filter::from_json(&*self.filter).ok()?;
        let sat = Saturated {
            filter,
            count: self.count,
            alone: self.alone,
            kinds: self.kinds.into_vec(),
        };
        Some((sat, self.scope))
    }
}

/// A relay's steps on its saturated seconds: each part is a follow-up
/// page of the connection's history in flight. `neg` says whether the
/// relay may be asked by NIP-77 now (`Engine::negentropy_usable`).
impl RelayState {
    /// Asks saturated second `sat` again in parts, each a chain of its own
    /// that completes `work` too.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn split_saturated(
        &mut self,
        cx: &mut Ctx,
        neg: bool,
        sat: Saturated,
        scope: Scope,
        work: &[WorkRef],
        started: Time,
        now: Time,
    ) {
        if !sat.alone {
            // Its count may include events sent for a sibling filter: the
            // second asked on its own tells what the relay returns for it.
            let alone = vec![sat.filter.clone()];
            return self.ask_parts(cx, &sat, alone, scope, work, started);
        }
        if let Some(parts) = value_halves(&sat.filter) {
            return self.ask_parts(cx, &sat, parts, scope, work, started);
        }
        let tagged = !sat.filter.generic_tags.is_empty();
        if scope != Scope::Own && tagged && neg {
            cx.stats.seconds_split += 1;
            if let Some(conn) = self.conn_mut() {
                let flight = conn.start_flight();
                flight.add_chains(work, 1);
                flight.next_pages.push_back(NextPage {
                    filters: Vec::new(),
                    scope,
                    work: work.to_vec(),
                    page: 1,
                    started,
                    reconcile: Some(sat),
                });
            }
            return;
        }
        self.split_by_kind(cx, sat, scope, work, started, now);
    }

    /// The last resort for saturated second `sat` (one value, and NIP-77
    /// not spoken or failed): one part per kind the page showed, or, if
    /// it showed one kind only, unreachable.
    pub(super) fn split_by_kind(
        &mut self,
        cx: &mut Ctx,
        sat: Saturated,
        scope: Scope,
        work: &[WorkRef],
        started: Time,
        now: Time,
    ) {
        let asked = sat.filter.kinds.as_ref().map_or(usize::MAX, BTreeSet::len);
        if sat.kinds.len() > 1 && asked > 1 {
            // Each part asks one kind instead of the filter's (`kind()`
            // would add it to them and ask the same again).
            let parts = sat
                .kinds
                .iter()
                .map(|&k| Filter {
                    kinds: Some(BTreeSet::from([Kind::from_u16(k)])),
                    ..sat.filter.clone()
                })
                .collect();
            // Kinds the cut page did not show are not asked: a filter
            // cannot say "every other kind". What they hold stays unknown.
            cx.stats.seconds_unverified += 1;
            if let Some(n) = cx.admit_log(now) {
                info!(
                    "{}: second {} split by the {} kinds it showed; events of other kinds there are unverified (no NIP-77){}",
                    cx.url(),
                    sat.filter.until.map_or(0, |t| t.as_secs()),
                    sat.kinds.len(),
                    dropped(n)
                );
            }
            return self.ask_parts(cx, &sat, parts, scope, work, started);
        }
        self.unreachable_second(cx, &sat, now);
    }

    /// Seconds that may be saturated if the relay caps as low as their
    /// count: kept until the connection shows which.
    pub(super) fn note_unsure(&mut self, cx: &Ctx, unsure: Vec<Saturated>, scope: Scope) {
        let Some(conn) = self.conn_mut() else {
            return;
        };
        conn.unsure
            .extend(unsure.into_iter().map(|s| Unsure::new(s, scope)));
        let over = conn.unsure.len().saturating_sub(MAX_UNSURE);
        if over > 0 {
            conn.unsure.drain(..over);
            debug!("{}: {over} unsure seconds dropped", cx.url());
        }
    }

    /// What the connection showed of the relay's cap settles unsure
    /// seconds: a cut at or below one's count makes it saturated (split,
    /// outside any batch: the chain that found it has ended, and its
    /// events are historic), a larger page makes it complete.
    ///
    /// Once the relay's history is read (no batch, chunk or page left) and
    /// nothing settled one, a second as large as the largest page the
    /// relay returned for any filter is taken as saturated: that size is
    /// the likeliest cap (a relay capping at 50 whose crowded second is
    /// its newest shows no cut below it), if it is at least
    /// [`SMALLEST_CAP_GUESS`]: a relay whose largest page is smaller has
    /// too few events to be capping them.
    pub(super) fn recheck_unsure(&mut self, cx: &mut Ctx, neg: bool, now: Time) {
        let cap = self.facts.result_cap;
        let Some(conn) = self.conn_mut() else {
            return;
        };
        if conn.unsure.is_empty() {
            return;
        }
        let read = conn
            .flight()
            .is_none_or(|f| f.batches.is_empty() && f.work.is_empty() && f.next_pages.is_empty());
        let cut = |s: &Unsure| {
            cap.proven().is_some_and(|c| s.count >= c)
                || (read && s.count >= cap.floor() && s.count >= SMALLEST_CAP_GUESS)
        };
        let (saturated, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut conn.unsure)
            .into_iter()
            .filter(|s| cut(s) || s.count >= cap.floor())
            .partition(|s| cut(s));
        conn.unsure = rest;
        for unsure in saturated {
            let Some((sat, scope)) = unsure.into_saturated() else {
                // Our own JSON of a filter the relay was asked with.
                warn!("{}: an unsure second's filter did not parse", cx.url());
                cx.stats.seconds_unverified += 1;
                continue;
            };
            self.split_saturated(cx, neg, sat, scope, &[], now, now);
        }
    }

    /// One chain per part of a saturated second.
    fn ask_parts(
        &mut self,
        cx: &mut Ctx,
        sat: &Saturated,
        parts: Vec<Filter>,
        scope: Scope,
        work: &[WorkRef],
        started: Time,
    ) {
        cx.stats.seconds_split += 1;
        debug!(
            "{}: {} events in one second fill its cap; asking it in {} parts",
            cx.url(),
            sat.count,
            parts.len()
        );
        let Some(conn) = self.conn_mut() else {
            return;
        };
        let flight = conn.start_flight();
        flight.add_chains(work, parts.len() as u32);
        for filter in parts {
            flight.next_pages.push_back(NextPage {
                filters: vec![PageFilter::first(filter)],
                scope,
                work: work.to_vec(),
                page: 1,
                started,
                reconcile: None,
            });
        }
    }

    /// Says that saturated second `sat` cannot be read whole. Where the
    /// relay showed it cuts at this size (a proven cap, or our page limit
    /// filled), events are surely left there; otherwise the relay may
    /// simply hold no more (its cap is unknown on this connection), which
    /// is said apart so that an alert on the first means a loss.
    pub(super) fn unreachable_second(&mut self, cx: &mut Ctx, sat: &Saturated, now: Time) {
        let facts = &self.facts;
        let cut = sat.count >= facts.limits.page_limit
            || facts.result_cap.proven().is_some_and(|c| sat.count >= c);
        if cut {
            cx.stats.seconds_unreachable += 1;
        } else {
            cx.stats.seconds_unverified += 1;
        }
        let Some(n) = cx.admit_log(now) else {
            return;
        };
        let (url, second) = (cx.url(), sat.filter.until.map_or(0, |t| t.as_secs()));
        let filter = sat.filter.as_json();
        let (count, filter) = (sat.count, relay_text(&filter));
        if cut {
            warn!(
                "{url}: second {second} holds more events for {filter} than the {count} it returns; the rest are unreachable there (no NIP-77){}",
                dropped(n)
            );
        } else {
            info!(
                "{url}: cannot tell whether second {second} holds more events for {filter} than the {count} it returned (cap unknown, no NIP-77){}",
                dropped(n)
            );
        }
    }
}

/// The filter with its `ids`, or else its widest tag's values, in two
/// halves, if it has more than one there (an `ids` fetch of a negentropy
/// job can hold more ids of one second than the relay's cap).
fn value_halves(filter: &Filter) -> Option<Vec<Filter>> {
    if let Some(ids) = filter.ids.as_ref().filter(|ids| ids.len() > 1) {
        let half = ids.len().div_ceil(2);
        let part = |ids: Vec<_>| Filter {
            ids: Some(ids.into_iter().collect()),
            ..filter.clone()
        };
        let low: Vec<_> = ids.iter().take(half).copied().collect();
        let high: Vec<_> = ids.iter().skip(half).copied().collect();
        return Some(vec![part(low), part(high)]);
    }
    let (tag, values) = filter
        .generic_tags
        .iter()
        .max_by_key(|(_, values)| values.len())
        .filter(|(_, values)| values.len() > 1)?;
    let half = values.len().div_ceil(2);
    let (low, high): (Vec<_>, Vec<_>) = values.iter().enumerate().partition(|(i, _)| *i < half);
    let part = |values: Vec<(usize, &String)>| {
        let mut f = filter.clone();
        f.generic_tags
            .insert(*tag, values.into_iter().map(|(_, v)| v.clone()).collect());
        f
    };
    Some(vec![part(low), part(high)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{EventId, SingleLetterTag, Timestamp};

    /// An unsure second kept as JSON comes back as the second it was: the
    /// split that may follow hours later asks what the page asked.
    #[test]
    fn an_unsure_second_comes_back_whole() {
        let a = SingleLetterTag::LOWERCASE_A;
        let coords = (0..3).map(|i| format!("30617:{i:064x}:repo-{i}"));
        let at = Timestamp::from_secs(1_700_000_000);
        let filter = Filter::new()
            .kinds([Kind::from(1617u16), Kind::from(1621u16)])
            .custom_tags(a, coords)
            .since(at)
            .until(at)
            .limit(500);
        let sat = Saturated {
            filter: filter.clone(),
            count: 100,
            alone: true,
            kinds: vec![1621],
        };
        let (back, scope) = Unsure::new(sat, Scope::Exact)
            .into_saturated()
            .expect("our own JSON parses");
        assert_eq!(back.filter, filter);
        assert_eq!(
            (back.count, back.alone, back.kinds),
            (100, true, vec![1621])
        );
        assert_eq!(scope, Scope::Exact);
    }

    #[test]
    fn halves_match_what_the_filter_matched() {
        let e = SingleLetterTag::LOWERCASE_E;
        let values: Vec<String> = (0..5).map(|i| format!("{i:064x}")).collect();
        let filter = Filter::new().custom_tags(e, values.clone());
        let halves = value_halves(&filter).expect("five values split");
        let got: Vec<Vec<String>> = halves
            .iter()
            .map(|f| f.generic_tags[&e].iter().cloned().collect())
            .collect();
        assert_eq!(got, vec![values[..3].to_vec(), values[3..].to_vec()]);
        let one = Filter::new().custom_tags(e, values[..1].to_vec());
        assert!(value_halves(&one).is_none(), "one value does not split");
        assert!(value_halves(&Filter::new()).is_none());
        let ids: Vec<EventId> = (0..3u8)
            .map(|i| EventId::from_byte_array([i; 32]))
            .collect();
        let halves = value_halves(&Filter::new().ids(ids.clone())).expect("ids split");
        let got: Vec<usize> = halves
            .iter()
            .map(|f| f.ids.as_ref().map_or(0, |i| i.len()))
            .collect();
        assert_eq!(got, vec![2, 1]);
    }
}
