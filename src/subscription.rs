//! One open subscription on a relay and the pagination of its stored events.
//!
//! Relays return at most `limit` stored events per filter (or per REQ), newest
//! first. A historic subscription that got a full page before EOSE has more
//! behind it; the follow-up asks the same filters with `until` = the oldest
//! `created_at` seen, per filter, until a page comes back short. Without this
//! a relay with a 500-event cap silently loses everything older.

use nostr::prelude::{Event, Filter, MatchEventOptions, Timestamp};

use crate::index::Item;
use crate::result_cap::ResultCap;
use crate::time::Time;

/// How far a filter's `limit` may grow to page through events that share one second.
pub const MAX_LIMIT_FACTOR: usize = 16;

/// Whether a subscription stays open after its stored events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Kept open for live events after EOSE.
    Live,
    /// Closed after EOSE: a follow-up page, or a historic fetch whose live
    /// coverage comes from elsewhere.
    Page,
}

/// How events of a subscription are checked before they are passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
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

/// Events one filter returned in the current page.
#[derive(Debug, Clone, Copy, Default)]
struct PageStats {
    count: usize,
    oldest: Option<Timestamp>,
    /// Events of this page at its `oldest` second.
    at_oldest: usize,
    /// Events the previous page of this filter returned.
    prev: usize,
    /// That page was shorter than asked: if this one holds events older
    /// than its oldest, the relay cut it at `prev`.
    prev_short: bool,
    prev_oldest: Option<Timestamp>,
}

/// An open subscription.
#[derive(Debug)]
pub struct Subscription {
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
    /// When the first page of this chain was sent: events after it are
    /// covered by the chain, events before need another subscription.
    pub started: Time,
    /// Filters sent, kept after [`Subscription::compact`] for limit accounting.
    pub filter_count: usize,
    stats: Vec<PageStats>,
    total: usize,
}

/// A chunk of a pending batch that a subscription (chain) is fetching.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkRef {
    /// The batch the chunk belongs to.
    pub batch: u64,
    /// The chunk's items.
    pub items: Vec<Item>,
}

impl Subscription {
    /// A subscription for `filters`, nothing heard yet.
    pub fn new(
        filters: Vec<Filter>,
        purpose: Purpose,
        scope: Scope,
        work: Vec<WorkRef>,
        page: u32,
        started: Time,
    ) -> Self {
        let stats = vec![PageStats::default(); filters.len()];
        Subscription {
            filter_count: filters.len(),
            filters,
            purpose,
            scope,
            work,
            page,
            eose: false,
            heard: false,
            started,
            stats,
            total: 0,
        }
    }

    /// Records what the previous page of each filter returned (a follow-up
    /// page, filters in the same order as [`Subscription::next_page`] gave).
    pub fn set_previous(&mut self, pages: &[PageFilter]) {
        for (s, p) in self.stats.iter_mut().zip(pages) {
            s.prev = p.prev;
            s.prev_short = p.prev_short;
            s.prev_oldest = p.prev_oldest;
        }
    }

    /// Drops the filters of a live subscription whose stored events are
    /// over: thousands of relays times a few filters each (every one a
    /// B-tree of tag values) would be most of the engine's memory, and the
    /// relay's target set answers the same question.
    pub fn compact(&mut self) {
        if self.scope == Scope::Exact {
            self.scope = Scope::Targets;
            self.filters = Vec::new();
            self.stats = Vec::new();
        }
    }

    /// Indices of the filters `event` matches.
    pub fn matching<'a>(&'a self, event: &'a Event) -> impl Iterator<Item = usize> + 'a {
        let opts = MatchEventOptions::new();
        self.filters
            .iter()
            .enumerate()
            .filter(move |(_, f)| f.match_event(event, opts))
            .map(|(i, _)| i)
    }

    /// Counts a stored event (before EOSE) toward the page of the filters it matched.
    pub fn count_stored(&mut self, created_at: Timestamp, matched: &[usize]) {
        self.total += 1;
        for &i in matched {
            let s = &mut self.stats[i];
            s.count += 1;
            match s.oldest {
                Some(o) if o == created_at => s.at_oldest += 1,
                Some(o) if o < created_at => {}
                _ => {
                    s.oldest = Some(created_at);
                    s.at_oldest = 1;
                }
            }
        }
    }

    /// The filters of the next page, or `None` when this page was the last.
    /// Learns the relay's result cap from this page on the way
    /// ([`ResultCap`]).
    ///
    /// A filter continues when the relay may have cut its page: it reached
    /// its `limit`, or the relay's proven or possible cap (see
    /// [`ResultCap::may_be_cut`]), or the whole REQ reached `limit` (a
    /// relay capping per REQ may have cut every filter). `until` is
    /// inclusive, so a page whose oldest event is exactly its `until` made
    /// no progress: more events share that second than one page holds.
    /// Such a filter first asks the same second again with a doubled
    /// `limit` (up to [`MAX_LIMIT_FACTOR`] times the page limit, which
    /// relays that allow larger pages will honour), and only then steps one
    /// second back, so the chain always ends.
    pub fn next_page(&self, limit: usize, cap: &mut ResultCap) -> Option<Vec<PageFilter>> {
        for s in &self.stats {
            let older = matches!((s.oldest, s.prev_oldest), (Some(o), Some(p)) if o < p);
            if older && s.prev_short {
                cap.learn_cut(s.prev);
            }
        }
        let capped = self.total >= limit;
        let mut next = Vec::new();
        for (f, s) in self.filters.iter().zip(&self.stats) {
            let asked = f.limit.unwrap_or(limit);
            let cut = cap.may_be_cut(s.count, asked);
            // Short, and short of any proven cap: only the floor says it
            // may be cut. Ask just past the events sharing its oldest
            // second: one older event proves the cut.
            let probe = s.count < asked && cap.proven().is_none_or(|c| s.count < c);
            cap.observe(s.count);
            // An `ids` filter that got every id it asked is complete.
            let ids_done = f.ids.as_ref().is_some_and(|ids| s.count >= ids.len());
            if ids_done || !(cut || capped) {
                continue;
            }
            let filter = match s.oldest {
                Some(oldest) if f.until == Some(oldest) => {
                    if asked < limit.saturating_mul(MAX_LIMIT_FACTOR) {
                        f.clone().limit(asked.saturating_mul(2))
                    } else {
                        let back = Timestamp::from_secs(oldest.as_secs().saturating_sub(1));
                        f.clone().until(back).limit(limit)
                    }
                }
                // A page all in one second says nothing of the relay's cap
                // beyond it: look below that second.
                Some(oldest) if probe && !capped && s.at_oldest == s.count => {
                    let back = Timestamp::from_secs(oldest.as_secs().saturating_sub(1));
                    f.clone().until(back).limit(limit)
                }
                Some(oldest) if probe && !capped => f.clone().until(oldest).limit(s.at_oldest + 1),
                Some(oldest) => f.clone().until(oldest).limit(limit),
                None => f.clone(),
            };
            next.push(PageFilter {
                filter,
                prev: s.count,
                prev_short: s.count < asked,
                prev_oldest: s.oldest,
            });
        }
        (!next.is_empty()).then_some(next)
    }
}

/// A filter of a follow-up page and what its previous page returned, so
/// the follow-up can tell whether that page was cut.
#[derive(Debug, Clone)]
pub struct PageFilter {
    /// The filter to ask.
    pub filter: Filter,
    /// Events the previous page returned for it.
    pub prev: usize,
    /// The previous page was shorter than asked.
    pub prev_short: bool,
    /// The oldest event the previous page returned.
    pub prev_oldest: Option<Timestamp>,
}
