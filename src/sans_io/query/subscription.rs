//! One open subscription on a relay and the pagination of its stored events.
//!
//! Relays return at most `limit` stored events per filter (or per REQ), newest
//! first. A historic subscription that got a full page before EOSE has more
//! behind it; the follow-up asks the same filters with `until` = the oldest
//! `created_at` seen, per filter, until a page comes back short. Without this
//! a relay with a 500-event cap silently loses everything older.

use crate::sans_io::timing::timer::TimerId;
use std::collections::HashSet;

use nostr::prelude::{Event, EventId, Filter, MatchEventOptions, Timestamp};

use crate::sans_io::memory::index::Item;
use crate::sans_io::query::filters::{one_tag, same_but_tags};
use crate::sans_io::query::result_cap::ResultCap;
use crate::sans_io::timing::time::Time;

/// How far a filter's `limit` may grow to page through events that share one second.
pub(crate) const MAX_LIMIT_FACTOR: usize = 16;

/// Whether a subscription stays open after its stored events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Kept open for live events after EOSE.
    Live,
    /// Closed after EOSE: a follow-up page, or a historic fetch whose live
    /// coverage comes from elsewhere.
    Page,
}

/// How events of a subscription are checked before they are passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The own relay's self-subscription: events feed the index.
    Own,
    /// Per-id or announcement filters: an event must match one of them.
    Exact,
    /// Kind-based live filter: an event must also tag an item the relay targets.
    Wide,
    /// A live subscription past its stored events, its filters dropped to
    /// save memory: an event must tag an item the relay targets (the union
    /// of every per-id filter on the relay) or be an announcement.
    Targets,
}

/// Kinds remembered per filter at its page's oldest second, for a split
/// of that second by kind; more are not needed to split it.
const KINDS_AT_OLDEST: usize = 8;

/// Events one filter returned in the current page.
#[derive(Debug, Clone, Default)]
struct PageStats {
    /// Every event of the page the filter matches.
    all: Edge,
    /// Those it alone matches in its REQ. Filters of one REQ overlap (a
    /// NIP-22 reply tags its root with `E` and `e`) and a relay sends each
    /// event once, for whichever filter it answered first: an event two
    /// filters match may have come in for the other one, below where this
    /// filter's own page was cut. Only events no other filter asked for
    /// surely belong to this filter's page, so they place its next `until`
    /// and, with the page's share of the rest, teach the relay's cap
    /// ([`PageStats::cap_bound`]); all of them count toward "maybe cut".
    own: Edge,
    /// Those it and its twin alone match.
    pair: Edge,
    /// Its twin in the REQ, if it has one: the same filter but for the
    /// case of its one tag letter (`#e` and `#E` of a root, `#a` and `#A`
    /// of a repo). None past [`MAX_TWINNED`] filters.
    twin: Option<u16>,
    /// The cap the previous page of this filter showed the relay to have
    /// at least ([`PageStats::cap_bound`]).
    prev: usize,
    /// That page was shorter than asked: if this one holds events older
    /// than all it brought for this filter (`prev_reach`), the relay cut
    /// it at `prev`.
    prev_short: bool,
    prev_oldest: Option<Timestamp>,
    prev_reach: Option<Timestamp>,
    /// Kinds of the events at the oldest second of `all`.
    kinds: Vec<u16>,
    /// An event of the filter's `until` second came (`ResultCap::learn_until`).
    at_until: bool,
}

impl PageStats {
    /// Events the relay's per-filter cap is at least, shown by this
    /// filter's page in a REQ of `filters` filters: its own events, and a
    /// `filters`-th of all it matched (each filter of the REQ got at most
    /// the cap, and together they brought all of those). An `#e` and an
    /// `#E` filter of one root match the same replies, so neither has
    /// events of its own: on own events alone, every page of such a pair
    /// was probed, and the cap it showed was never learnt.
    ///
    /// A filter and its twin (`twin`) that matched the very same events of
    /// the page, and no other filter any of them, show more: a relay
    /// returns each filter's newest matches, and two filters that agree on
    /// every event it sent return the same ones, so one filter's query
    /// brought them all. Only the order within the oldest second is the
    /// relay's own (its tie-break may differ between two indexes), so
    /// those events are left out of the proof. Without this, a pair's
    /// bound was a twentieth of its page in a REQ of twenty filters, and a
    /// relay capping at 100 was "proven" to cap at 5: every page of 5 or
    /// more then asked a next page (issue 46: a 1-event page beside every
    /// window at a cap of 100).
    fn cap_bound(&self, filters: usize, twin: Option<&PageStats>) -> usize {
        let shared = self.all.count.div_ceil(filters.max(1));
        let pair = |s: &PageStats| s.all.count > 0 && s.pair.count == s.all.count;
        let twins = match twin {
            Some(t) if pair(self) && pair(t) => self.pair.count - self.pair.at_oldest,
            _ => 0,
        };
        self.own.count.max(shared).max(twins)
    }
}

/// How many events reached down to which second.
#[derive(Debug, Clone, Copy, Default)]
struct Edge {
    count: usize,
    oldest: Option<Timestamp>,
    /// Events at the `oldest` second.
    at_oldest: usize,
    /// The newest event: with `oldest`, the span the page covered.
    newest: Option<Timestamp>,
}

impl Edge {
    fn add(&mut self, created_at: Timestamp) {
        self.count += 1;
        self.newest = self.newest.max(Some(created_at));
        match self.oldest {
            Some(o) if o == created_at => self.at_oldest += 1,
            Some(o) if o < created_at => {}
            _ => {
                self.oldest = Some(created_at);
                self.at_oldest = 1;
            }
        }
    }
}

/// An open subscription.
#[derive(Debug)]
pub(crate) struct Subscription {
    /// The filters as sent (with `since`/`until`/`limit`).
    pub filters: Vec<Filter>,
    /// Live or page.
    pub purpose: Purpose,
    /// How its events are checked.
    pub scope: Scope,
    /// Work units (chunks of a pending batch) that complete when this
    /// subscription's last page ends.
    pub work: Vec<WorkRef>,
    /// Pages asked so far in this chain (1 for the first).
    pub page: u32,
    /// EOSE seen: stored events are over.
    pub eose: bool,
    /// Any message seen for it (a refusal by NOTICE targets one that heard nothing).
    pub heard: bool,
    /// Silent when a refusal that names no subscription was blamed on
    /// another: it may be the refused one, and is taken for it if it
    /// stays silent a while longer.
    pub suspect: bool,
    /// When the first page of this chain was sent: events after it are
    /// covered by the chain, events before need another subscription.
    pub started: Time,
    /// When this page was sent: how long the relay took to answer it.
    pub sent: Time,
    /// Filters sent, kept after [`Subscription::compact`] for limit accounting.
    pub filter_count: usize,
    /// The items a per-id live subscription asks every filter of, so a
    /// consolidation can tell what is already covered and send only what
    /// is new. `None` where unknown (a chunk's filters split over REQs).
    pub covers: Option<Box<[Item]>>,
    /// It carries the Layer 1 (announcement) filter.
    pub layer1: bool,
    /// Its EOSE deadline, cancelled when the EOSE comes: a first sync
    /// arms thousands, and each would otherwise hold its timer slot for
    /// the deadline's two minutes after the page ended.
    pub eose_timer: Option<TimerId>,
    stats: Vec<PageStats>,
    total: usize,
    /// Ids counted in this page: a relay repeating one event (thousands of
    /// copies) must not make a page look full. Emptied at EOSE.
    counted: HashSet<EventId>,
}

/// A chunk of a pending batch that a subscription (chain) is fetching.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkRef {
    /// The batch the chunk belongs to.
    pub batch: u64,
    /// The chunk's items.
    pub items: Vec<Item>,
}

impl Subscription {
    /// A subscription for `filters`, nothing heard yet.
    pub(crate) fn new(
        filters: Vec<Filter>,
        purpose: Purpose,
        scope: Scope,
        work: Vec<WorkRef>,
        page: u32,
        started: Time,
    ) -> Self {
        let stats = twins(&filters)
            .into_iter()
            .map(|twin| PageStats {
                twin,
                ..PageStats::default()
            })
            .collect();
        Subscription {
            filter_count: filters.len(),
            covers: None,
            layer1: false,
            eose_timer: None,
            filters,
            purpose,
            scope,
            work,
            page,
            eose: false,
            heard: false,
            suspect: false,
            started,
            sent: started,
            stats,
            total: 0,
            counted: HashSet::new(),
        }
    }

    /// From when this live subscription's events are missing if it ends
    /// now (refused or cut with the connection): from now past EOSE, else
    /// from when it was sent. Also whether it was a Layer 1 read from the
    /// beginning (a fresh connect's announcements, no `since`): that one
    /// must be asked again from the beginning, e.g. on a relay that refused
    /// it until we authenticated, or announcements stored there before
    /// would never be found.
    pub(crate) fn uncovered_from(&self, now: Time) -> (Time, bool) {
        if self.eose {
            return (now, false);
        }
        let from_start = self.work.is_empty() && self.filters.iter().any(|f| f.since.is_none());
        (self.started.min(now), from_start)
    }

    /// Records what the previous page of each filter returned (a follow-up
    /// page, filters in the same order as [`Subscription::next_page`] gave).
    pub(crate) fn set_previous(&mut self, pages: &[PageFilter]) {
        for (s, p) in self.stats.iter_mut().zip(pages) {
            s.prev = p.prev;
            s.prev_short = p.prev_short;
            s.prev_oldest = p.prev_oldest;
            s.prev_reach = p.prev_reach;
        }
    }

    /// The filters as asked, each with what its previous page returned
    /// ([`Self::set_previous`]): the page again, to ask in smaller REQs.
    pub(crate) fn as_asked(&self) -> Vec<PageFilter> {
        let asked = self.filters.iter().enumerate().map(|(i, f)| {
            let first = PageFilter::first(f.clone());
            match self.stats.get(i) {
                Some(s) => PageFilter {
                    prev: s.prev,
                    prev_short: s.prev_short,
                    prev_oldest: s.prev_oldest,
                    prev_reach: s.prev_reach,
                    ..first
                },
                None => first,
            }
        });
        asked.collect()
    }

    /// Stored events are over: the ids counted for paging are not needed.
    pub(crate) fn end_stored(&mut self) {
        self.counted = HashSet::new();
    }

    /// Drops the filters of a live subscription whose stored events are
    /// over: thousands of relays times a few filters each (every one a
    /// B-tree of tag values) would be most of the engine's memory, and the
    /// relay's target set answers the same question.
    pub(crate) fn compact(&mut self) {
        if self.scope == Scope::Exact {
            self.scope = Scope::Targets;
            self.filters = Vec::new();
            self.stats = Vec::new();
        }
    }

    /// Indices of the filters `event` matches.
    pub(crate) fn matching<'a>(&'a self, event: &'a Event) -> impl Iterator<Item = usize> + 'a {
        let opts = MatchEventOptions::new();
        self.filters
            .iter()
            .enumerate()
            .filter(move |(_, f)| f.match_event(event, opts))
            .map(|(i, _)| i)
    }

    /// Counts a stored event (before EOSE) toward the page of the filters
    /// it matched, once per id: copies of one event are one event of the page.
    pub(crate) fn count_stored(
        &mut self,
        id: EventId,
        created_at: Timestamp,
        kind: u16,
        matched: &[usize],
    ) {
        if !self.counted.insert(id) {
            return;
        }
        self.total += 1;
        let alone = matched.len() == 1;
        let pair = match matched {
            &[a, b] => self.stats[a].twin.is_some_and(|t| usize::from(t) == b),
            _ => false,
        };
        // An event of a filter's `until` second shows the relay takes in
        // that second only if no filter it also matched could have
        // brought it below its own `until`: on nostr-relay, whose `until`
        // excludes its second, such an event still comes for the other
        // filter, and windows meeting at a second boundary would then
        // skip a second each.
        let shows_until = matched
            .iter()
            .all(|&j| self.filters[j].until == Some(created_at));
        for &i in matched {
            let at_until = shows_until && self.filters[i].until == Some(created_at);
            let s = &mut self.stats[i];
            s.at_until |= at_until;
            if s.all.oldest.is_none_or(|o| created_at < o) {
                s.kinds.clear();
            }
            s.all.add(created_at);
            if s.all.oldest == Some(created_at)
                && s.kinds.len() < KINDS_AT_OLDEST
                && !s.kinds.contains(&kind)
            {
                s.kinds.push(kind);
            }
            if alone {
                s.own.add(created_at);
            }
            if pair {
                s.pair.add(created_at);
            }
        }
    }

    /// What follows this page: the filters of the next page (`None` when
    /// this page was the last), and the seconds it found saturated.
    /// Learns the relay's result cap from this page on the way
    /// ([`ResultCap`]).
    ///
    /// A filter continues when the relay may have cut its page: it reached
    /// its `limit`, or the relay's proven or possible cap (see
    /// [`ResultCap::may_be_cut`]), or the whole REQ brought exactly
    /// `limit` (a relay capping per REQ at the `limit` asked may have cut
    /// every filter; one that brought more does not cap there, and every
    /// short window of a REQ of twenty went on to a page of its oldest
    /// event). A REQ of several
    /// filters that returned as many events as any REQ did on this
    /// connection may have been cut as a whole too
    /// ([`ResultCap::may_cut_req`]): its other filters go on below its
    /// oldest second. `until` is inclusive, so the next page asks the
    /// oldest second again: events of it the cut left out come back.
    ///
    /// That fails when more events share one second than one page holds:
    /// a page all in one second, asked again from that second, returns
    /// the same page. Such a filter, if its page was full, first asks the
    /// second again with a doubled `limit` (up to [`MAX_LIMIT_FACTOR`]
    /// times the page limit, which relays that allow larger pages
    /// honour). Otherwise the relay caps below what the second holds
    /// (strfry clamps `limit` to 500, khatru to 100): the second is
    /// [`Saturated`], for the engine to split (`saturated`), and the chain
    /// goes on below it, so it always ends.
    ///
    /// A page with more events than asked (a filter's own events past its
    /// `limit`, or the REQ's past all its limits together) was cut by
    /// neither our limit nor a cap: the relay ignores `limit`, so it sent
    /// all it holds (or makes events up: a relay that answers every page
    /// with a fresh full page would otherwise be paged one second at a
    /// time, back to 1970). The chain ends.
    pub(crate) fn next_page(&self, limit: usize, cap: &mut ResultCap) -> PageEnd {
        let mut end = PageEnd::default();
        for (f, s) in self.filters.iter().zip(&self.stats) {
            let older = matches!((s.all.oldest, s.prev_reach), (Some(o), Some(p)) if o < p);
            if older && s.prev_short {
                cap.learn_cut(s.prev);
            }
            // A follow-up asks again the second its last page ended on.
            if let Some(until) = f.until.filter(|&u| s.prev_oldest == Some(u)) {
                cap.learn_until(s.at_until, s.all.oldest.is_some_and(|o| o < until));
            }
        }
        // More than asked: by one filter's own events, or by the REQ as a
        // whole beyond what all its filters' limits allow.
        let asked_of = |f: &Filter| f.limit.unwrap_or(limit);
        let asked_all: usize = self.filters.iter().map(asked_of).sum();
        let over = |(f, s): (&Filter, &PageStats)| s.own.count > asked_of(f);
        if self.total > asked_all || self.filters.iter().zip(&self.stats).any(over) {
            return end;
        }
        let capped = self.total == limit;
        // A REQ of several filters a relay capping per REQ may have cut:
        // every filter it returned nothing or little for is asked again
        // below the REQ's oldest second (`below_req_cut`).
        let req_cut = cap.may_cut_req(self.total) && self.filters.len() > 1 && !capped;
        let req_oldest = self.stats.iter().filter_map(|s| s.all.oldest).min();
        let mut next = Vec::new();
        for (f, s) in self.filters.iter().zip(&self.stats) {
            let asked = asked_of(f);
            let count = s.all.count;
            let cut = cap.may_be_cut(count, asked);
            // Short, and short of any proven cap: only the floor says it
            // may be cut. Ask just past the events sharing its oldest
            // second: one older event proves the cut. A hint from an
            // earlier connection that the relay cuts at this size asks a
            // full page at once: the probe would only prove it.
            let probe =
                count < asked && cap.proven().is_none_or(|c| count < c) && !cap.hinted_cut(count);
            let twin = s.twin.and_then(|t| self.stats.get(usize::from(t)));
            let bound = s.cap_bound(self.filters.len(), twin);
            cap.observe(bound);
            // An `ids` filter knows what it lacks: the ids that did not
            // come, asked again until a page brings none of them (the
            // relay does not hold those). Paging by `until` instead left
            // ids of one crowded second behind a cap below the fetch.
            if let Some(ids) = &f.ids {
                let rest: Vec<EventId> = ids
                    .iter()
                    .filter(|id| !self.counted.contains(id))
                    .copied()
                    .collect();
                if !rest.is_empty() && (rest.len() < ids.len() || req_cut) {
                    let limit = rest.len();
                    let filter = Filter {
                        ids: Some(rest.into_iter().collect()),
                        ..f.clone()
                    };
                    next.push(PageFilter::first(filter.limit(limit)));
                }
                continue;
            }
            if !(cut || capped) {
                if req_cut {
                    next.extend(below_req_cut(f, s, req_oldest, limit));
                }
                continue;
            }
            let edge = if s.own.count > 0 { s.own } else { s.all };
            let Some(oldest) = edge.oldest else {
                next.push(PageFilter::after(f.clone(), bound, s, count < asked, None));
                continue;
            };
            let short = count < asked;
            let one_second = edge.at_oldest == edge.count;
            if f.until != Some(oldest) {
                let filter = match (probe && !capped, one_second) {
                    // A page all in one second says nothing of the relay's
                    // cap beyond it: look below that second (older events
                    // there prove the cut). If the page is as large as a
                    // cap can be, the second is asked on its own too: it
                    // may hold more than the relay returned.
                    (true, true) => {
                        let second = saturated(f, s, oldest, limit);
                        let back = Timestamp::from_secs(oldest.as_secs().saturating_sub(1));
                        let filter = f.clone().until(back).limit(limit);
                        let below = PageFilter::after(filter, bound, s, short, Some(oldest));
                        if cap.may_saturate(count) {
                            end.saturated.push(second);
                        } else {
                            end.unsure.push(second);
                        }
                        next.push(below);
                        continue;
                    }
                    (true, false) => f.clone().until(oldest).limit(edge.at_oldest + 1),
                    (false, _) => {
                        // A full page below which the rest of its range
                        // may be read in parallel (`windows`).
                        let top = f.until.or(s.all.newest).unwrap_or(oldest);
                        // A proven cap from filters that share their
                        // events is a lower bound (`cap_bound`): the page
                        // itself held `count`.
                        let full = cap.proven().map_or(limit, |c| c.max(count));
                        end.spans.push(Span {
                            next: next.len(),
                            top,
                            count,
                            full,
                        });
                        f.clone().until(oldest).limit(limit)
                    }
                };
                next.push(PageFilter::after(filter, bound, s, short, Some(oldest)));
                continue;
            }
            // A bigger limit helps only a page that was full: one the
            // relay cut short at this second would come back the same.
            if count >= asked && asked < limit.saturating_mul(MAX_LIMIT_FACTOR) {
                let filter = f.clone().limit(asked.saturating_mul(2));
                next.push(PageFilter::after(filter, bound, s, false, Some(oldest)));
                continue;
            }
            // As many as the relay may cap at: it may hold more there. A
            // probe's few events at its second are all it has there; a
            // part of a saturated second (`since` = `until`) was asked
            // because it may hold more, and only its count says.
            let part = f.since == Some(oldest);
            // The second asked again with a bigger limit after a full page:
            // less than asked now may be the relay's cap, not the second's end.
            let reasked = s.prev_oldest == Some(oldest) && !s.prev_short;
            if count >= asked || part || reasked || cap.may_saturate(count) {
                end.saturated.push(saturated(f, s, oldest, limit));
            }
            if let Some(filter) = below_second(f, oldest, limit) {
                next.push(PageFilter::after(filter, bound, s, false, Some(oldest)));
            }
        }
        if req_cut && self.repeats(&next) {
            next = self.below_stuck_seconds(&mut end, limit);
        }
        end.next = (!next.is_empty()).then_some(next);
        end
    }

    /// True when `next` asks again exactly what this page asked: the
    /// relay would answer the same page, and the chain would go round
    /// without end.
    fn repeats(&self, next: &[PageFilter]) -> bool {
        next.len() == self.filters.len()
            && next.iter().zip(&self.filters).all(|(p, f)| p.filter == *f)
    }

    /// The continuation of a REQ that may have been cut as a whole in the
    /// very second each of its filters began at ([`below_req_cut`] asks
    /// every filter from where it began): a REQ all in one second, as
    /// large as any the relay returned before (135 replies in one second
    /// over `#e`, `#E` and `#q` went round 10,000 pages at one instant in
    /// the oracle). Each filter goes on below its second, and the second
    /// is asked for that filter alone (a saturated second whose count may
    /// be its siblings'), which a cut of the whole REQ cannot reach. An
    /// `ids` filter is asked again as it was: the others no longer repeat.
    fn below_stuck_seconds(&self, end: &mut PageEnd, limit: usize) -> Vec<PageFilter> {
        end.spans.clear();
        let mut next = Vec::new();
        for (f, s) in self.filters.iter().zip(&self.stats) {
            let Some(until) = f.until.filter(|_| f.ids.is_none()) else {
                next.push(PageFilter::after(f.clone(), 0, s, false, None));
                continue;
            };
            end.saturated.push(Saturated {
                alone: false,
                ..saturated(f, s, until, limit)
            });
            if let Some(filter) = below_second(f, until, limit) {
                next.push(PageFilter::after(filter, 0, s, false, None));
            }
        }
        next
    }
}

/// Most filters of a REQ whose twins are looked for: pages have a few
/// dozen; a consolidated live set may have hundreds, and pairing them
/// costs a comparison per pair while only sharpening a proof that holds
/// without it.
const MAX_TWINNED: usize = 64;

/// Each filter's twin among `filters` (`PageStats::twin`): pairs of
/// filters equal but for the case of their one tag letter.
fn twins(filters: &[Filter]) -> Vec<Option<u16>> {
    let mut twins = vec![None; filters.len()];
    if filters.len() > MAX_TWINNED {
        return twins;
    }
    for (i, f) in filters.iter().enumerate() {
        if twins[i].is_some() || one_tag(f).is_none() {
            continue;
        }
        let found =
            (i + 1..filters.len()).find(|&j| twins[j].is_none() && are_twins(f, &filters[j]));
        if let Some(j) = found {
            // Both below MAX_TWINNED, which fits u16.
            twins[i] = u16::try_from(j).ok();
            twins[j] = u16::try_from(i).ok();
        }
    }
    twins
}

/// `f` and `g` ask the same but for the case of their one tag letter.
fn are_twins(f: &Filter, g: &Filter) -> bool {
    let (Some((a, va)), Some((b, vb))) = (one_tag(f), one_tag(g)) else {
        return false;
    };
    a != b && a.eq_ignore_case(*b) && same_but_tags(f, g) && va == vb
}

/// Filter `f` again after a REQ that may have been cut as a whole
/// ([`ResultCap::may_cut_req`]) at `oldest`, its oldest second: such a
/// relay returned everything newer, for every filter, so `f` is asked
/// from that second (inclusive: a cut there may have left some of it)
/// down. Its page says nothing of a per-filter cap (not short).
fn below_req_cut(
    f: &Filter,
    stats: &PageStats,
    oldest: Option<Timestamp>,
    limit: usize,
) -> Option<PageFilter> {
    let oldest = oldest?;
    let until = f.until.map_or(oldest, |u| u.min(oldest));
    if f.since.is_some_and(|since| since > until) {
        return None;
    }
    let filter = f.clone().until(until).limit(limit);
    Some(PageFilter::after(filter, 0, stats, false, None))
}

/// Filter `f` from the second below `at` down, unless it asked nothing
/// below `at` (its `since`, or the first second of all).
fn below_second(f: &Filter, at: Timestamp, limit: usize) -> Option<Filter> {
    let back = at.as_secs().checked_sub(1)?;
    f.since
        .is_none_or(|since| since.as_secs() <= back)
        .then(|| f.clone().until(Timestamp::from_secs(back)).limit(limit))
}

/// Filter `f`'s page of `stats`, all at second `at`, as a saturated second.
fn saturated(f: &Filter, stats: &PageStats, at: Timestamp, limit: usize) -> Saturated {
    Saturated {
        filter: f.clone().since(at).until(at).limit(limit),
        count: stats.all.count,
        alone: stats.own.count == stats.all.count,
        kinds: stats.kinds.clone(),
    }
}

/// What follows a page of stored events ([`Subscription::next_page`]).
#[derive(Debug, Default)]
pub(crate) struct PageEnd {
    /// The next page of the chain, if it goes on.
    pub next: Option<Vec<PageFilter>>,
    /// Seconds that hold more matching events than the relay returns for
    /// one filter: paging with `until` cannot get past them.
    pub saturated: Vec<Saturated>,
    /// Seconds that may be saturated, if the relay caps as low as their
    /// count: a short page all in one second, smaller than any cap known
    /// ([`ResultCap::may_saturate`]). Later pages on the connection tell
    /// (`saturated::recheck_unsure`).
    pub unsure: Vec<Saturated>,
    /// Filters of `next` that follow a cut page: the rest of their range
    /// may be split into [`windows`].
    pub spans: Vec<Span>,
}

/// What a cut page showed of its filter's density.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    /// The filter's index in `next`.
    next: usize,
    /// The newest second the page covered (its `until`, else its newest
    /// event); the oldest is the continuation's `until`.
    top: Timestamp,
    /// Events the page held.
    count: usize,
    /// Events a full page holds (the relay's proven cap, or the page's
    /// own size if larger, else our limit).
    full: usize,
}

/// Events a window is sized to hold: nine tenths of a full page
/// (`full`). A window sized to a whole page came back as full as the
/// relay's cap, which may be a cut, so each cost another page asking its
/// oldest second again: at a cap of 100, seven round trips of such
/// one-event pages in a first sync of 100,000 replies. The tenth left is
/// room for a density that varies; a window denser than that splits
/// again. (Three quarters cost more round trips than it saved.)
fn fill(full: usize) -> u64 {
    (full as u64 * 9 / 10).max(1)
}

/// Fewest windows one full page's rest is split into, whatever the
/// relay's filters per REQ. Packed into REQs of many filters (`pack`),
/// they cost a few REQs, not one each.
const MIN_WINDOWS: usize = 16;

/// Windows one full page's rest is split into when `spans` of its filters
/// were cut, on a relay taking `filters_per_req` filters in a REQ: enough
/// to fill one REQ beside the continuation, so a split is one REQ of
/// windows, not a third of one (at a cap of 100, sixteen windows of a
/// twin pair filled 34 of a REQ's 100 filters, and 100,000 replies cost
/// 13 round trips, 11 once a split filled its REQ). Bounded by the
/// relay's limit, so what a relay answers cannot grow it.
pub(crate) fn windows_per_split(filters_per_req: usize, spans: usize) -> usize {
    (filters_per_req / spans.max(1))
        .saturating_sub(1)
        .max(MIN_WINDOWS)
}

/// Splits the rest of the range of the filters of `next` that followed a
/// cut page (`spans`) into time windows, each read by a chain of its
/// own, so a long history is read several pages per round trip instead
/// of one. The page showed the density: `count` events in `top - oldest`
/// seconds, so a window's [`fill`] spans that times `fill / count` (a
/// probe's two events give a narrow first guess; the windows' own first
/// pages split again with better ones). The first window, that wide,
/// stays in `next` (it
/// continues the page, so what the page showed of the relay's cap still
/// counts). Where the filter has no `since`, the next ones double in
/// width, so a history much longer than the page is split again by their
/// own first pages; where it has one, the windows share its range
/// evenly. The last reaches down to the filter's own `since`. Together
/// they ask exactly the seconds the continuation asked, no second twice.
/// Returns the other windows, newest first: rank by rank, window `j + 1`
/// of every split filter before window `j + 2` of any, for [`pack`].
pub(crate) fn windows(next: &mut [PageFilter], spans: &[Span], most: usize) -> Vec<PageFilter> {
    let mut groups: Vec<Vec<PageFilter>> = Vec::new();
    for span in spans {
        let Some(pf) = next.get_mut(span.next) else {
            continue;
        };
        let Some(until) = pf.filter.until.map(|t| t.as_secs()) else {
            continue;
        };
        let floor = pf.filter.since.map_or(0, |t| t.as_secs());
        let covered = span.top.as_secs().saturating_sub(until).max(1);
        let page = (covered.saturating_mul(fill(span.full)) / span.count.max(1) as u64).max(1);
        // A range with a known floor (a window split off before) is split
        // evenly: its first page showed the density, so each window holds
        // about a page and few split again. A range reaching back to the
        // first second doubles: nobody knows where its history starts.
        let (mut width, grow) = match pf.filter.since {
            Some(_) => (page.max((until - floor + 1).div_ceil(most as u64)), 1),
            None => (page, 2),
        };
        let mut hi = until;
        let mut lo = hi.saturating_sub(width - 1);
        if lo <= floor || pf.filter.ids.is_some() {
            continue;
        }
        let base = pf.filter.clone();
        pf.filter = base.clone().since(Timestamp::from_secs(lo));
        for rank in 0..most.saturating_sub(1) {
            hi = lo - 1;
            width = width.saturating_mul(grow);
            lo = hi.saturating_sub(width - 1).max(floor);
            let last = lo <= floor || rank + 2 == most;
            let window = base.clone().until(Timestamp::from_secs(hi));
            let window = match last {
                false => window.since(Timestamp::from_secs(lo)),
                true => Filter {
                    since: base.since,
                    ..window
                },
            };
            if groups.len() <= rank {
                groups.push(Vec::new());
            }
            groups[rank].push(PageFilter::first(window));
            if last {
                break;
            }
        }
    }
    groups.into_iter().flatten().collect()
}

/// Packs windows ([`windows`]) into REQs of at most `filters` filters and
/// `bytes` bytes of filter JSON each, in order: one REQ per window would
/// read a long history at most one page per subscription slot per round
/// trip, and relays cap results per filter (khatru 100, strfry 500), so a
/// REQ of twenty windows brings twenty pages in the same round trip. A
/// relay that caps per REQ instead cuts such a REQ as a whole, which its
/// windows then page past ([`ResultCap::may_cut_req`]): no loss, one REQ
/// of windows at a time.
pub(crate) fn pack(windows: Vec<PageFilter>, filters: usize, bytes: usize) -> Vec<Vec<PageFilter>> {
    let mut reqs: Vec<Vec<PageFilter>> = Vec::new();
    let mut size = 0;
    for window in windows {
        let len = window.filter.as_json().len() + 1;
        match reqs.last_mut() {
            Some(req) if req.len() < filters.max(1) && size + len <= bytes => req.push(window),
            _ => {
                reqs.push(vec![window]);
                size = 0;
            }
        }
        size += len;
    }
    reqs
}

/// One filter's second that filled the relay's cap: more events may share
/// it than the relay returned.
#[derive(Debug, Clone)]
pub(crate) struct Saturated {
    /// The filter narrowed to that second (`since` = `until`), `limit` at
    /// the page limit.
    pub filter: Filter,
    /// Events the page returned at that second: the relay returns at
    /// least this many for one filter, so a part of the second that
    /// returns fewer holds all it has.
    pub count: usize,
    /// No other filter of its REQ matched those events: `count` is what
    /// the relay returned for this filter alone. Otherwise part of them
    /// may have come for a sibling filter, and `count` proves nothing of
    /// the relay's cap.
    pub alone: bool,
    /// Kinds of those events (a few at most).
    pub kinds: Vec<u16>,
}

/// A follow-up page waiting for a subscription slot: its filters and the
/// chain it continues.
#[derive(Debug)]
pub(crate) struct NextPage {
    /// The filters, with what their previous page returned.
    pub filters: Vec<PageFilter>,
    /// How its events are checked.
    pub scope: Scope,
    /// The chunks the chain completes.
    pub work: Vec<WorkRef>,
    /// Its page number in the chain.
    pub page: u32,
    /// When the chain's first page was sent.
    pub started: Time,
    /// Not a REQ: a saturated second to reconcile by NIP-77 (`filters`
    /// is empty), which lists every id the relay holds in it.
    pub reconcile: Option<Saturated>,
}

/// A filter of a follow-up page and what its previous page returned, so
/// the follow-up can tell whether that page was cut.
#[derive(Debug, Clone)]
pub(crate) struct PageFilter {
    /// The filter to ask.
    pub filter: Filter,
    /// The cap the previous page showed the relay to have at least
    /// (`PageStats::cap_bound`): its size, were it cut.
    pub prev: usize,
    /// The previous page was shorter than asked.
    pub prev_short: bool,
    /// The oldest event the previous page returned.
    pub prev_oldest: Option<Timestamp>,
    /// The oldest event the previous page brought for this filter, its
    /// own or one another filter also matched. Only an event older than
    /// that proves the page cut: a page of one own event (a status at
    /// second 2) whose shared event (a reply at second 1, tagging the
    /// root with `e` and `E`) is older was "proven" cut at 1 by the
    /// reply coming again below the status, and every later second of
    /// nostr-rs-relay was then reported as holding unreachable events.
    pub prev_reach: Option<Timestamp>,
}

impl PageFilter {
    /// `filter`, following a page of `stats` (short of what it asked if
    /// `short`) whose oldest event was at `oldest` and which showed the
    /// relay's cap to be at least `prev` ([`PageStats::cap_bound`]).
    fn after(
        filter: Filter,
        prev: usize,
        stats: &PageStats,
        short: bool,
        oldest: Option<Timestamp>,
    ) -> Self {
        PageFilter {
            filter,
            prev,
            prev_short: short,
            prev_oldest: oldest,
            prev_reach: stats.all.oldest,
        }
    }

    /// A probe of the relay's `until` (`ResultCap::until_probe`): it
    /// counts as the follow-up of a page that ended on its `until`
    /// second, so its page learns the bound as any follow-up does.
    pub(crate) fn until_probe(filter: Filter) -> Self {
        PageFilter {
            prev_oldest: filter.until,
            ..PageFilter::first(filter)
        }
    }

    /// The first page of `filter`: no previous page to compare with.
    pub(crate) fn first(filter: Filter) -> Self {
        PageFilter {
            filter,
            prev: 0,
            prev_short: false,
            prev_oldest: None,
            prev_reach: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{Kind, SingleLetterTag};

    fn filter() -> Filter {
        Filter::new()
            .custom_tag(SingleLetterTag::LOWERCASE_E, "ab".repeat(32))
            .limit(500)
    }

    /// A page that got events at these `created_at`s for its one filter.
    fn page(filters: Vec<Filter>, stamps: &[u64]) -> Subscription {
        let mut sub = Subscription::new(
            filters,
            Purpose::Page,
            Scope::Exact,
            Vec::new(),
            1,
            Time::default(),
        );
        for (i, &t) in stamps.iter().enumerate() {
            sub.count_stored(id(i), Timestamp::from_secs(t), 1111, &[0]);
        }
        sub
    }

    /// A distinct id for the `i`th event.
    fn id(i: usize) -> EventId {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
        EventId::from_byte_array(bytes)
    }

    /// 100 events, newest first, one per second from `top` down.
    fn hundred(top: u64) -> Vec<u64> {
        (0..100).map(|i| top - i).collect()
    }

    /// A REQ of an `#e` filter and an `until` probe for event 0 at 500:
    /// the page and what it teaches of `until` once event 0 came (matching
    /// the probe, and the `#e` filter too when `also_e`).
    fn probed(also_e: bool) -> ResultCap {
        let probe = Filter::new()
            .id(id(0))
            .until(Timestamp::from_secs(500))
            .limit(1);
        let mut sub = Subscription::new(
            vec![filter(), probe.clone()],
            Purpose::Page,
            Scope::Exact,
            Vec::new(),
            1,
            Time::default(),
        );
        sub.set_previous(&[PageFilter::first(filter()), PageFilter::until_probe(probe)]);
        let matched: &[usize] = if also_e { &[0, 1] } else { &[1] };
        sub.count_stored(id(0), Timestamp::from_secs(500), 1111, matched);
        let mut cap = ResultCap::default();
        sub.next_page(500, &mut cap);
        cap
    }

    #[test]
    fn an_until_probe_teaches_only_what_no_other_filter_could_have_brought() {
        assert!(probed(false).until_inclusive(), "the witness came back");
        assert!(
            !probed(true).until_inclusive(),
            "the `#e` filter, with no `until`, may have brought it on a relay excluding it"
        );
    }

    #[test]
    fn a_short_page_is_probed_just_past_its_oldest_second() {
        let mut cap = ResultCap::default();
        let next = page(vec![filter()], &hundred(1_000))
            .next_page(500, &mut cap)
            .next
            .expect("100 of 500 may be a cap of 100");
        let f = &next[0].filter;
        assert_eq!(f.until, Some(Timestamp::from_secs(901)));
        assert_eq!(f.limit, Some(2), "the one event at 901 again, plus one");
        assert_eq!(cap.proven(), None);
    }

    #[test]
    fn an_older_event_in_the_probe_proves_the_cap_and_paging_goes_on() {
        let mut cap = ResultCap::default();
        let next = page(vec![filter()], &hundred(1_000))
            .next_page(500, &mut cap)
            .next
            .unwrap();
        let mut probe = page(vec![next[0].filter.clone()], &[901, 900]);
        probe.set_previous(&next);
        let more = probe
            .next_page(500, &mut cap)
            .next
            .expect("a full probe goes on");
        assert_eq!(cap.proven(), Some(100), "the relay cuts at 100");
        assert_eq!(more[0].filter.limit, Some(500), "back to full pages");
        assert_eq!(more[0].filter.until, Some(Timestamp::from_secs(900)));
        // From now on a page of 100 continues without a probe, one of 99 ends.
        let again = page(vec![filter()], &hundred(5_000))
            .next_page(500, &mut cap)
            .next;
        assert_eq!(again.unwrap()[0].filter.limit, Some(500));
        let short = page(vec![filter()], &hundred(5_000)[..99])
            .next_page(500, &mut cap)
            .next;
        assert!(short.is_none());
    }

    /// The `#e` and `#E` filters of one root: a NIP-22 reply matches both.
    fn twins() -> Vec<Filter> {
        let root = "ab".repeat(32);
        vec![
            Filter::new()
                .custom_tag(SingleLetterTag::LOWERCASE_E, root.clone())
                .limit(500),
            Filter::new()
                .custom_tag(SingleLetterTag::UPPERCASE_E, root)
                .limit(500),
        ]
    }

    /// A page of `filters` where every event matched all of them.
    fn shared_page(filters: Vec<Filter>, stamps: &[u64]) -> Subscription {
        let n = filters.len();
        let mut sub = page(filters, &[]);
        let all: Vec<usize> = (0..n).collect();
        for (i, &t) in stamps.iter().enumerate() {
            sub.count_stored(id(i), Timestamp::from_secs(t), 1111, &all);
        }
        sub
    }

    /// A first page of `filters` sharing 100 events a second apart, then
    /// its probe, which finds older events: the cap learnt.
    fn cap_learnt_by_shared_pages(filters: Vec<Filter>) -> ResultCap {
        let mut cap = ResultCap::default();
        let next = shared_page(filters, &hundred(1_000))
            .next_page(500, &mut cap)
            .next
            .expect("100 of 500 each may be a cap of 100");
        assert_eq!(next[0].filter.limit, Some(2), "a probe, as for one filter");
        let mut probe = shared_page(next.iter().map(|p| p.filter.clone()).collect(), &[901, 900]);
        probe.set_previous(&next);
        probe.next_page(500, &mut cap).next.expect("older events");
        cap
    }

    #[test]
    fn filters_that_share_their_events_still_learn_the_cap() {
        // Each of three filters got at most the cap, and together they
        // brought 100: the cap is at least 34. Without own events nothing
        // was learnt, and every page of such filters was probed.
        let mut three = twins();
        let quote = SingleLetterTag::LOWERCASE_Q;
        three.push(Filter::new().custom_tag(quote, "ab".repeat(32)).limit(500));
        let mut cap = cap_learnt_by_shared_pages(three);
        assert_eq!(cap.proven(), Some(34));
        let again = shared_page(twins(), &hundred(5_000))
            .next_page(500, &mut cap)
            .next
            .expect("a page at the cap goes on");
        assert_eq!(again[0].filter.limit, Some(500), "no probe");
    }

    #[test]
    fn twins_that_agree_on_every_event_prove_the_cap_one_query_showed() {
        // `#e` and `#E` of one root matched the same 100 events and no
        // other filter did: the relay returns each filter's newest
        // matches, so one query brought all 100. The order inside the
        // oldest second is the relay's, so its one event is left out.
        let cap = cap_learnt_by_shared_pages(twins());
        assert_eq!(cap.proven(), Some(99));
        // A page of a REQ of twenty such filters no longer proves a cap
        // of a twentieth of it.
        let mut cap = ResultCap::default();
        cap.learn_cut(99);
        // A REQ this large came before: this one was not cut as a whole.
        cap.may_cut_req(200);
        let window = twins()
            .into_iter()
            .map(|f| f.until(Timestamp::from_secs(1_000)))
            .collect();
        let end = shared_page(window, &hundred(1_000)[..75]).next_page(500, &mut cap);
        assert!(end.next.is_none(), "75 of a cap of 99: all there is");
    }

    #[test]
    fn short_windows_of_a_req_that_brought_more_than_its_limit_end() {
        // Two windows of 300 events each, under a proven cap of 400, in a
        // REQ that brought 600: a relay capping per REQ at the 500 asked
        // would have sent 500, so neither window was cut. Each went on to
        // a page of its oldest event when a REQ reaching `limit` counted
        // as capped.
        let mut cap = ResultCap::default();
        cap.learn_cut(400);
        cap.may_cut_req(1_000);
        let mut sub = page(vec![filter(), other_root()], &[]);
        for i in 0..600 {
            let at = Timestamp::from_secs(10_000 - i as u64);
            sub.count_stored(id(i), at, 1111, &[i % 2]);
        }
        assert!(sub.next_page(500, &mut cap).next.is_none());
        // Exactly 500 may be such a cut: both go on.
        let mut sub = page(vec![filter(), other_root()], &[]);
        for i in 0..500 {
            let at = Timestamp::from_secs(10_000 - i as u64);
            sub.count_stored(id(i), at, 1111, &[i % 2]);
        }
        let next = sub.next_page(500, &mut cap).next.expect("may be cut");
        assert_eq!(next.len(), 2);
    }

    fn other_root() -> Filter {
        Filter::new()
            .custom_tag(SingleLetterTag::LOWERCASE_E, "cd".repeat(32))
            .limit(500)
    }

    #[test]
    fn twins_that_disagree_on_an_event_learn_only_a_share() {
        let mut sub = page(twins(), &[]);
        for (i, t) in hundred(1_000).into_iter().enumerate() {
            sub.count_stored(id(i), Timestamp::from_secs(t), 1111, &[0, 1]);
        }
        // One event only `#e` matched: the two queries may have brought
        // different events, each at most the cap.
        sub.count_stored(id(500), Timestamp::from_secs(950), 1, &[0]);
        let mut cap = ResultCap::default();
        let next = sub.next_page(500, &mut cap).next.expect("may be cut");
        let mut probe = shared_page(next.iter().map(|p| p.filter.clone()).collect(), &[899, 898]);
        probe.set_previous(&next);
        probe.next_page(500, &mut cap);
        assert!(cap.proven().is_some_and(|c| c <= 51), "{cap:?}");
    }

    /// The span of a full page of 100 events a second apart below `top`,
    /// for the filter at `next`.
    fn span(next: usize, top: u64) -> Span {
        Span {
            next,
            top: Timestamp::from_secs(top),
            count: 100,
            full: 100,
        }
    }

    /// Each window's `since` and `until`, in seconds.
    fn ranges(windows: &[PageFilter]) -> Vec<(Option<u64>, Option<u64>)> {
        let secs = |t: Option<Timestamp>| t.map(|t| t.as_secs());
        windows
            .iter()
            .map(|p| (secs(p.filter.since), secs(p.filter.until)))
            .collect()
    }

    #[test]
    fn a_range_without_a_floor_is_split_in_doubling_windows() {
        let f = filter().until(Timestamp::from_secs(100_000));
        let mut next = vec![PageFilter::first(f)];
        let rest = windows(&mut next, &[span(0, 100_100)], 4);
        // A page of 100 in 100 seconds: a window of 90 seconds holds nine
        // tenths of a page.
        assert_eq!(next[0].filter.since, Some(Timestamp::from_secs(99_911)));
        assert_eq!(
            ranges(&rest),
            vec![
                (Some(99_731), Some(99_910)),
                (Some(99_371), Some(99_730)),
                (None, Some(99_370)),
            ]
        );
    }

    #[test]
    fn a_range_with_a_floor_is_split_evenly() {
        let f = filter()
            .since(Timestamp::from_secs(90_001))
            .until(Timestamp::from_secs(100_000));
        let mut next = vec![PageFilter::first(f)];
        let rest = windows(&mut next, &[span(0, 100_100)], 4);
        // 10,000 seconds in four windows of 2,500: a page is 100 of them.
        assert_eq!(next[0].filter.since, Some(Timestamp::from_secs(97_501)));
        assert_eq!(
            ranges(&rest),
            vec![
                (Some(95_001), Some(97_500)),
                (Some(92_501), Some(95_000)),
                (Some(90_001), Some(92_500)),
            ]
        );
    }

    #[test]
    fn windows_are_packed_within_the_filter_and_byte_limits() {
        let window = |i: u64| PageFilter::first(filter().until(Timestamp::from_secs(i)));
        let len = window(1).filter.as_json().len() + 1;
        let reqs = pack((1..=7).map(window).collect(), 3, 10 * len);
        let sizes: Vec<usize> = reqs.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![3, 3, 1], "three filters per REQ");
        let reqs = pack((1..=7).map(window).collect(), 20, 2 * len);
        let sizes: Vec<usize> = reqs.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![2, 2, 2, 1], "two filters' bytes per REQ");
        let order: Vec<_> = reqs.iter().flatten().map(|p| p.filter.until).collect();
        let asked: Vec<_> = (1..=7).map(|i| Some(Timestamp::from_secs(i))).collect();
        assert_eq!(order, asked, "in order, none lost");
    }

    #[test]
    fn a_probe_with_nothing_older_ends_the_chain() {
        let mut cap = ResultCap::default();
        let next = page(vec![filter()], &hundred(1_000))
            .next_page(500, &mut cap)
            .next
            .unwrap();
        let mut probe = page(vec![next[0].filter.clone()], &[901]);
        probe.set_previous(&next);
        assert!(probe.next_page(500, &mut cap).next.is_none());
        assert_eq!(cap.proven(), None);
        let smaller = page(vec![filter()], &hundred(1_000)[..60])
            .next_page(500, &mut cap)
            .next;
        assert!(smaller.is_none(), "below what the relay once returned");
    }

    #[test]
    fn a_short_page_all_in_one_second_looks_below_it() {
        let mut cap = ResultCap::default();
        let next = page(vec![filter()], &[700, 700, 700])
            .next_page(500, &mut cap)
            .next
            .unwrap();
        assert_eq!(next[0].filter.until, Some(Timestamp::from_secs(699)));
        assert_eq!(next[0].filter.limit, Some(500));
    }

    #[test]
    fn copies_of_one_event_count_once() {
        let mut sub = page(vec![filter().limit(5)], &[]);
        for _ in 0..10_000 {
            sub.count_stored(id(7), Timestamp::from_secs(900), 1111, &[0]);
        }
        let mut cap = ResultCap::default();
        cap.observe(5);
        assert!(
            sub.next_page(5, &mut cap).next.is_none(),
            "one event, not a full page"
        );
    }

    #[test]
    fn more_than_asked_is_not_a_cut_page() {
        let mut cap = ResultCap::default();
        let flooded = page(vec![filter(), filter()], &[700; 2_000]);
        assert!(
            flooded.next_page(500, &mut cap).next.is_none(),
            "2,000 events asked with limit 500: the relay ignores limit, nothing was cut"
        );
    }

    #[test]
    fn an_empty_page_or_a_kind_filter_with_nothing_ends() {
        let mut cap = ResultCap::default();
        let kinds = Filter::new().kind(Kind::from_u16(30617)).limit(500);
        assert!(
            page(vec![kinds], &[])
                .next_page(500, &mut cap)
                .next
                .is_none()
        );
    }

    #[test]
    fn a_page_stuck_in_one_second_is_saturated_and_paging_goes_below_it() {
        let mut cap = ResultCap::default();
        let stuck = filter().until(Timestamp::from_secs(700));
        let end = page(vec![stuck], &[700; 100]).next_page(500, &mut cap);
        let [sat] = end.saturated.as_slice() else {
            panic!("one saturated second: {end:?}");
        };
        assert_eq!(sat.filter.since, Some(Timestamp::from_secs(700)));
        assert_eq!(sat.filter.until, Some(Timestamp::from_secs(700)));
        assert_eq!(sat.count, 100);
        assert!(sat.alone);
        assert_eq!(sat.kinds, vec![1111]);
        let next = end.next.expect("and below it");
        assert_eq!(next[0].filter.until, Some(Timestamp::from_secs(699)));
    }

    /// A REQ of a root's `#e`, `#E` and `#q` filters from second 700,
    /// answered with 135 events all at 700, 45 each, on a connection that
    /// returned 100 for one filter before (none of the three is cut by
    /// itself): as large as any REQ of it, so it may have been cut whole.
    /// With `last_at`, the last of them is at that second instead.
    fn req_in_one_second(cap: &mut ResultCap, last_at: u64) -> PageEnd {
        cap.observe(100);
        let root = "ab".repeat(32);
        let filters: Vec<Filter> = [
            SingleLetterTag::LOWERCASE_E,
            SingleLetterTag::UPPERCASE_E,
            SingleLetterTag::LOWERCASE_Q,
        ]
        .into_iter()
        .map(|t| {
            Filter::new()
                .custom_tag(t, root.clone())
                .until(Timestamp::from_secs(700))
                .limit(500)
        })
        .collect();
        let mut sub = page(filters, &[]);
        for i in 0..135 {
            let matched = [i * 3 / 135];
            let at = if i == 134 { last_at } else { 700 };
            sub.count_stored(id(i), Timestamp::from_secs(at), 1111, &matched);
        }
        sub.next_page(500, cap)
    }

    #[test]
    fn a_req_cut_whole_in_the_second_it_began_at_goes_below_it() {
        let mut cap = ResultCap::default();
        let end = req_in_one_second(&mut cap, 700);
        let next = end.next.expect("the cut may have left older events");
        assert_eq!(next.len(), 3);
        for p in &next {
            assert_eq!(
                p.filter.until,
                Some(Timestamp::from_secs(699)),
                "asked from 700 again, the relay returns the same page"
            );
        }
        assert_eq!(end.saturated.len(), 3, "700 asked for each filter alone");
        for sat in &end.saturated {
            assert_eq!(sat.filter.since, Some(Timestamp::from_secs(700)));
            assert_eq!(sat.filter.until, Some(Timestamp::from_secs(700)));
            assert!(!sat.alone, "the REQ's cap, not the filter's, may have cut");
        }
    }

    #[test]
    fn a_req_cut_whole_below_where_it_began_goes_on_from_its_oldest_second() {
        let mut cap = ResultCap::default();
        let end = req_in_one_second(&mut cap, 690);
        let next = end.next.expect("the cut may have left older events");
        assert_eq!(next.len(), 3);
        for p in &next {
            assert_eq!(p.filter.until, Some(Timestamp::from_secs(690)));
        }
        assert!(end.saturated.is_empty(), "the next REQ is another one");
    }

    #[test]
    fn a_full_page_stuck_in_one_second_first_asks_a_bigger_limit() {
        let mut cap = ResultCap::default();
        let stuck = filter().until(Timestamp::from_secs(700)).limit(100);
        let end = page(vec![stuck], &[700; 100]).next_page(500, &mut cap);
        assert!(end.saturated.is_empty(), "the relay may allow more");
        assert_eq!(end.next.unwrap()[0].filter.limit, Some(200));
    }

    #[test]
    fn a_first_page_as_large_as_a_cap_all_in_one_second_is_asked_alone() {
        let mut cap = ResultCap::default();
        let end = page(vec![filter()], &[700; 100]).next_page(500, &mut cap);
        assert_eq!(
            end.saturated.len(),
            1,
            "100 may be a cap cutting the second"
        );
        assert_eq!(
            end.next.unwrap()[0].filter.until,
            Some(Timestamp::from_secs(699))
        );
        let mut cap = ResultCap::default();
        let few = page(vec![filter()], &[700; 3]).next_page(500, &mut cap);
        assert!(
            few.saturated.is_empty(),
            "no relay caps at 3: the probe below decides"
        );
        assert!(few.next.is_some());
    }
}
