//! One open subscription on a relay and the pagination of its stored events.
//!
//! Relays return at most `limit` stored events per filter (or per REQ), newest
//! first. A historic subscription that got a full page before EOSE has more
//! behind it; the follow-up asks the same filters with `until` = the oldest
//! `created_at` seen, per filter, until a page comes back short. Without this
//! a relay with a 500-event cap silently loses everything older.

use nostr::prelude::{Event, Filter, MatchEventOptions, Timestamp};

use crate::index::Item;
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
            s.oldest = Some(s.oldest.map_or(created_at, |o| o.min(created_at)));
        }
    }

    /// The filters of the next page, or `None` when this page was the last.
    ///
    /// A page is full when the whole REQ reached `limit` events or one
    /// filter reached its own `limit`. If the whole REQ was capped, every
    /// filter may have been cut and all are asked again (below their oldest
    /// event if they had one); otherwise only the filters that reached their
    /// limit continue. `until` is inclusive, so a page whose oldest event is
    /// exactly its `until` made no progress: more events share that second
    /// than one page holds. Such a filter first asks the same second again
    /// with a doubled `limit` (up to [`MAX_LIMIT_FACTOR`] times the page
    /// limit, which relays that allow larger pages will honour), and only
    /// then steps one second back, so the chain always ends.
    pub fn next_page(&self, limit: usize) -> Option<Vec<Filter>> {
        let capped = self.total >= limit;
        let next: Vec<Filter> = self
            .filters
            .iter()
            .zip(&self.stats)
            // An `ids` filter that got every id it asked is complete.
            .filter(|(f, s)| f.ids.as_ref().is_none_or(|ids| s.count < ids.len()))
            .filter(|(f, s)| capped || s.count >= f.limit.unwrap_or(limit))
            .map(|(f, s)| match s.oldest {
                Some(oldest) if f.until == Some(oldest) => {
                    let asked = f.limit.unwrap_or(limit);
                    if asked < limit.saturating_mul(MAX_LIMIT_FACTOR) {
                        f.clone().limit(asked.saturating_mul(2))
                    } else {
                        let back = Timestamp::from_secs(oldest.as_secs().saturating_sub(1));
                        f.clone().until(back).limit(limit)
                    }
                }
                Some(oldest) => f.clone().until(oldest),
                None => f.clone(),
            })
            .collect();
        (!next.is_empty()).then_some(next)
    }
}
