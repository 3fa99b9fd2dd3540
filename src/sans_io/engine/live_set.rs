//! A relay's live set: the subscriptions kept open for new events.
//!
//! Live coverage is kept small: while the per-id filters of everything
//! confirmed fit under the consolidation threshold, they stay open as they
//! are; beyond that a relay's live traffic is one kind-based filter with
//! `since`, matched against the index locally. Consolidation (GRASP-02)
//! covers what the live set lacks, `since` reaching back over any gap: a
//! per-id set keeps its subscriptions and gains REQs for the new items
//! only (merging its smallest subscriptions in when the budget requires);
//! a wide one, or one that goes wide, is closed and re-packed whole.
//!
//! The set lives and dies with the relay's connection, and its coverage
//! watermark with the relay: every step here is `RelayState`'s, reaching
//! the engine's config, index and outputs through [`Ctx`].

use std::collections::HashSet;

use log::{debug, info};
use nostr::prelude::Timestamp;

use super::connection::LiveMode;
use super::ctx::Ctx;
use super::limits::{Limits, REQ_OVERHEAD};
use super::relay::RelayState;
use super::timers::ConnTimer;
use crate::sans_io::memory::index::Item;
use crate::sans_io::query::filters::{
    Encoded, REPO_FILTERS_PER_CHUNK, ROOT_FILTERS_PER_CHUNK, announcement_filter,
    chunk_filters_encoded, wide_filter,
};
use crate::sans_io::query::subscription::{Purpose, Scope, Subscription};
use crate::sans_io::timing::time::Time;

impl RelayState {
    /// Opens the live set: Layer 1 and, when `with_confirmed`, the
    /// confirmed items — per-id if they fit the threshold, else one wide
    /// filter — all with `since`, packed into as few REQs as allowed.
    pub(super) fn subscribe_live(
        &mut self,
        cx: &mut Ctx,
        since: Option<Timestamp>,
        with_confirmed: bool,
        now: Time,
    ) {
        let mut confirmed = if with_confirmed {
            self.targets.confirmed()
        } else {
            Vec::new()
        };
        let fits = self.per_id_fits(cx, self.per_id_filter_count(cx, &confirmed));
        let mode = if fits {
            LiveMode::PerId
        } else {
            LiveMode::Wide
        };
        if let Some(conn) = self.conn_mut() {
            conn.live_mode = mode;
        }
        let layer1_since = self.layer1_since(since);
        let (units, scope) = match mode {
            LiveMode::PerId => {
                // Sorted, so a chunk holds neighbours (a repo's roots together).
                confirmed.sort_unstable();
                let units = self.live_units(cx, &confirmed, Some(layer1_since), since);
                (units, Scope::Exact)
            }
            LiveMode::Wide => {
                let since = since.unwrap_or_else(|| {
                    Timestamp::from_secs(now.saturating_sub(cx.config.quick_reconnect).as_secs())
                });
                (self.wide_units(cx, layer1_since, since), Scope::Wide)
            }
        };
        let groups = pack_units(self.facts.limits, units);
        let filters: usize = groups.iter().map(|g| g.filters.len()).sum();
        debug!("{}: live set of {filters} filters ({mode:?})", cx.url());
        self.open_live_groups(cx, groups, scope, now);
    }

    /// Opens one live subscription per group and records what each covers.
    fn open_live_groups(&mut self, cx: &mut Ctx, groups: Vec<Group>, scope: Scope, now: Time) {
        for group in groups {
            let covers = if scope == Scope::Exact {
                group.covers
            } else {
                None
            };
            let (live, none) = (Purpose::Live, Vec::new());
            let id = self.open_subscription(cx, group.filters, live, scope, none, 1, now, now);
            self.set_cover(id, covers, group.layer1);
        }
    }

    /// Records what a live subscription covers (see [`Subscription::covers`]).
    pub(super) fn set_cover(&mut self, id: u64, covers: Option<Vec<Item>>, layer1: bool) {
        if let Some(s) = self.conn_mut().and_then(|c| c.subs.get_mut(id)) {
            s.covers = covers.map(Vec::into_boxed_slice);
            s.layer1 = layer1;
        }
    }

    /// Whether `per_id` filters (plus Layer 1) fit the consolidation
    /// threshold and half the relay's subscription budget.
    fn per_id_fits(&self, cx: &Ctx, per_id: usize) -> bool {
        let limits = self.facts.limits;
        per_id < cx.config.consolidation_threshold
            && (1 + per_id).div_ceil(limits.filters_per_req) <= live_budget(limits.subscriptions)
    }

    /// `since` for Layer 1 in a new live set: from the beginning when it
    /// was refused before it was read to the end.
    fn layer1_since(&mut self, since: Option<Timestamp>) -> Option<Timestamp> {
        if self.coverage.take_layer1() {
            None
        } else {
            since
        }
    }

    /// How many per-id filters `items` need, counted without building them
    /// (a relay with 100,000 roots goes wide; building them first would
    /// cost more than the whole decision).
    fn per_id_filter_count(&self, cx: &Ctx, items: &[Item]) -> usize {
        let chunk = self.facts.limits.chunk_size(cx.config.chunk_size);
        let repos = items.iter().filter(|i| matches!(i, Item::Repo(_))).count();
        let roots = items.len() - repos;
        repos.div_ceil(chunk) * REPO_FILTERS_PER_CHUNK
            + roots.div_ceil(chunk) * ROOT_FILTERS_PER_CHUNK
    }

    /// Layer 1 (when `layer1` is `Some(since)`) and the per-id filters of
    /// `items` with `since`, one unit per chunk.
    fn live_units(
        &self,
        cx: &Ctx,
        items: &[Item],
        layer1: Option<Option<Timestamp>>,
        since: Option<Timestamp>,
    ) -> Vec<Unit> {
        let limit = self.page_limit();
        let chunk = self.facts.limits.chunk_size(cx.config.chunk_size);
        let mut units = Vec::new();
        if let Some(layer1_since) = layer1 {
            let filter = announcement_filter(layer1_since).limit(limit);
            units.push(Unit {
                items: Vec::new(),
                layer1: true,
                filters: vec![Encoded::new(filter)],
            });
        }
        let (repos, roots): (Vec<Item>, Vec<Item>) =
            items.iter().partition(|i| matches!(i, Item::Repo(_)));
        for part in [repos, roots] {
            for c in part.chunks(chunk) {
                units.push(Unit {
                    items: c.to_vec(),
                    layer1: false,
                    filters: chunk_filters_encoded(cx.index, c, since, limit),
                });
            }
        }
        units
    }

    /// Layer 1 and the kind-based live filters, as many kinds per filter as
    /// the relay takes.
    fn wide_units(&self, cx: &Ctx, layer1: Option<Timestamp>, since: Timestamp) -> Vec<Unit> {
        let limit = self.page_limit();
        let per_filter = self.facts.limits.kinds.max(1);
        let announcement = std::iter::once((true, announcement_filter(layer1)));
        let wide = cx
            .config
            .wide_kinds
            .chunks(per_filter)
            .map(|kinds| (false, wide_filter(kinds, since)));
        announcement
            .chain(wide)
            .map(|(layer1, f)| Unit {
                items: Vec::new(),
                layer1,
                filters: vec![Encoded::new(f.limit(limit))],
            })
            .collect()
    }

    /// Whether to consolidate now: once confirmed items lack live
    /// coverage, at once when no batch is pending, else after the pending
    /// batches or the timeout (armed here: `ConnTimer::Consolidate`).
    pub(super) fn consolidation_due(&mut self, cx: &mut Ctx, now: Time) -> bool {
        let Some(conn) = self.conn() else {
            return false;
        };
        if self.coverage.gap().is_none() || conn.paused_until.is_some() {
            return false;
        }
        if conn.batches() == 0 {
            return true;
        }
        if !conn.flight().is_some_and(|f| f.consolidating) {
            if let Some(flight) = self.conn_mut().and_then(|c| c.flight_mut()) {
                flight.consolidating = true;
            }
            let at = now + cx.config.consolidation_timeout;
            self.arm(cx, at, ConnTimer::Consolidate);
        }
        false
    }

    /// Closes the live subscriptions and re-subscribes Layer 1 and every
    /// confirmed item with `since` reaching back over any uncovered gap.
    /// Confirmed state is kept; historic pages in flight continue. True
    /// when it consolidated: the engine then schedules what waits.
    pub(super) fn consolidate(&mut self, cx: &mut Ctx, now: Time) -> bool {
        let Some(conn) = self.conn() else {
            return false;
        };
        if !conn.flight().is_some_and(|f| f.consolidating) && self.coverage.gap().is_none() {
            return false;
        }
        let window_start = now.saturating_sub(cx.config.quick_reconnect);
        let since = self
            .coverage
            .gap()
            .map_or(window_start, |t| t.min(window_start));
        info!("{}: consolidating live subscriptions", cx.url());
        cx.stats.consolidations += 1;
        let since = Timestamp::from_secs(since.as_secs());
        self.coverage.take_gap();
        if let Some(flight) = self.conn_mut().and_then(|c| c.flight_mut()) {
            flight.consolidating = false;
        }
        if !self.extend_live_set(cx, since, now) {
            self.resubscribe_live(cx, since, now);
        }
        if let Some(gap) = self.pages_gap() {
            self.coverage.gap_from(gap);
        }
        true
    }

    /// Where a per-id live set's coverage starts over, past a
    /// consolidation: at the oldest page still working for a pending
    /// batch (its items get no live subscription before it ends). Only
    /// pages of a pending batch count: one whose batch failed (a sibling
    /// chunk was refused) holds stale work, and with no batch pending
    /// `schedule` would consolidate again at once, and again, until the
    /// stack overflowed (found by fuzzing).
    fn pages_gap(&self) -> Option<Time> {
        let conn = self.conn().filter(|c| c.live_mode == LiveMode::PerId)?;
        let batches = conn.flight().map(|f| &f.batches);
        let pending = |b: &u64| batches.is_some_and(|bs| bs.contains_key(b));
        conn.subs
            .values()
            .filter(|s| s.purpose == Purpose::Page)
            .filter(|s| s.work.iter().any(|w| pending(&w.batch)))
            .map(|s| s.started)
            .min()
    }

    /// Closes every live subscription and opens the live set anew.
    fn resubscribe_live(&mut self, cx: &mut Ctx, since: Timestamp, now: Time) {
        let live: Vec<u64> = self.conn().map_or(Vec::new(), |c| {
            let live = c.subs.iter().filter(|(_, s)| s.purpose == Purpose::Live);
            live.map(|(id, _)| id).collect()
        });
        for id in live {
            if let Some(sub) = self.close_subscription(cx, id) {
                // A Layer 1 read from the beginning, closed before its
                // EOSE (a fresh sync's first live set replaced at once by
                // a consolidation), is owed to the new set: else the
                // announcements of the relay's downtime were never read.
                let (_, layer1) = sub.uncovered_from(now);
                self.coverage.owe_layer1(layer1);
                self.continue_work_elsewhere(sub);
            }
        }
        self.subscribe_live(cx, Some(since), true, now);
    }

    /// Covers what a per-id live set lacks — confirmed items no live
    /// subscription asks for, and Layer 1 if none carries it — with new
    /// REQs, so only those items travel. The smallest live subscriptions
    /// are merged into them (closed and asked again) only as far as the
    /// threshold and the subscription budget require, leaving
    /// [`FREE_LIVE_SLOTS`] free if merging allows it. False when the set
    /// cannot be extended (it is or goes wide, or what a subscription
    /// covers is unknown): the caller re-subscribes it whole.
    fn extend_live_set(&mut self, cx: &mut Ctx, since: Timestamp, now: Time) -> bool {
        let Some(conn) = self.conn() else {
            return false;
        };
        let live: Vec<(u64, &Subscription)> = conn
            .subs
            .iter()
            .filter(|(_, s)| s.purpose == Purpose::Live)
            .collect();
        if conn.live_mode != LiveMode::PerId || live.iter().any(|(_, s)| s.covers.is_none()) {
            return false;
        }
        let confirmed = self.targets.confirmed();
        if !self.per_id_fits(cx, self.per_id_filter_count(cx, &confirmed)) {
            return false;
        }
        let covered: HashSet<Item> = live
            .iter()
            .flat_map(|(_, s)| s.covers.iter().flatten().copied())
            .collect();
        let uncovered: Vec<Item> = confirmed
            .into_iter()
            .filter(|i| !covered.contains(i))
            .collect();
        let need_layer1 = self.coverage.layer1_unread() || !live.iter().any(|(_, s)| s.layer1);
        // Merge candidates, smallest first: only those past EOSE (one still
        // reading history keeps its chain).
        let mut candidates: Vec<(usize, u64)> = live
            .iter()
            .filter(|(_, s)| s.eose)
            .map(|(id, s)| (s.covers.as_ref().map_or(0, |c| c.len()), *id))
            .collect();
        candidates.sort_unstable();
        let live_filters: usize = live.iter().map(|(_, s)| s.filter_count).sum();
        let (live_count, budget) = (live.len(), live_budget(self.facts.limits.subscriptions));
        if uncovered.is_empty() && !need_layer1 {
            return true;
        }
        let layer1 = self.layer1_since(Some(since));
        let wish = budget.saturating_sub(FREE_LIVE_SLOTS).max(1);
        let similar = similar_sized(uncovered.len(), &candidates);
        for (target, most) in [(wish, similar), (budget, candidates.len())] {
            for merged in 0..=most {
                let ids: Vec<u64> = candidates[..merged].iter().map(|(_, id)| *id).collect();
                let (items, with_layer1) = self.merge_set(&uncovered, &ids, need_layer1);
                let units = self.live_units(cx, &items, with_layer1.then_some(layer1), Some(since));
                let groups = pack_units(self.facts.limits, units);
                let subs = self.conn().map(|c| &c.subs);
                let dropped: usize = ids
                    .iter()
                    .filter_map(|id| subs.and_then(|subs| subs.get(*id)))
                    .map(|s| s.filter_count)
                    .sum();
                let kept = live_filters.saturating_sub(dropped);
                let added: usize = groups.iter().map(|g| g.filters.len()).sum();
                if live_count - merged + groups.len() <= target
                    && kept + added <= cx.config.consolidation_threshold
                {
                    for id in ids {
                        self.close_subscription(cx, id);
                    }
                    debug!(
                        "{}: live set extended by {added} filters ({merged} merged)",
                        cx.url()
                    );
                    self.open_live_groups(cx, groups, Scope::Exact, now);
                    return true;
                }
            }
        }
        // Layer 1 from the beginning is still owed to the full set.
        self.coverage.owe_layer1(layer1.is_none());
        false
    }

    /// The items (sorted) and whether Layer 1 go into the new live REQs:
    /// those uncovered plus what the merged subscriptions covered and the
    /// relay still targets.
    fn merge_set(
        &self,
        uncovered: &[Item],
        merged: &[u64],
        need_layer1: bool,
    ) -> (Vec<Item>, bool) {
        let mut items = uncovered.to_vec();
        let mut layer1 = need_layer1;
        let Some(conn) = self.conn() else {
            return (items, layer1);
        };
        for sub in merged.iter().filter_map(|id| conn.subs.get(*id)) {
            layer1 |= sub.layer1;
            let still = sub
                .covers
                .iter()
                .flatten()
                .filter(|i| self.targets.items.contains_key(i));
            items.extend(still);
        }
        items.sort_unstable();
        items.dedup();
        (items, layer1)
    }

    /// A live subscription closed before its chain finished: its unfinished
    /// chunks go back to the front of the work queue.
    fn continue_work_elsewhere(&mut self, sub: Subscription) {
        if sub.eose || sub.work.is_empty() {
            return;
        }
        let Some(conn) = self.conn_mut() else {
            return;
        };
        let flight = conn.start_flight();
        for work in sub.work.into_iter().rev() {
            flight.work.push_front(work);
        }
    }
}

/// Packs units into groups that each fit one REQ within `limits`, a
/// unit's filters together so its items count as covered by one
/// subscription. A unit too big for any REQ is split filter by filter;
/// the groups it lands in then cover nothing known.
fn pack_units(limits: Limits, units: Vec<Unit>) -> Vec<Group> {
    let mut packer = Packer {
        limits,
        groups: Vec::new(),
    };
    for unit in units {
        let size: usize = unit.filters.iter().map(|f| f.json.len() + 1).sum();
        let alone = unit.filters.len() <= limits.filters_per_req
            && REQ_OVERHEAD + size <= limits.message_bytes;
        if alone {
            let g = packer.room_for(unit.filters.len(), size);
            g.filters.extend(unit.filters);
            if let Some(c) = g.covers.as_mut() {
                c.extend(unit.items);
            }
            g.layer1 |= unit.layer1;
            continue;
        }
        for filter in unit.filters {
            let g = packer.room_for(1, filter.json.len() + 1);
            g.filters.push(filter);
            g.covers = None;
            g.layer1 |= unit.layer1;
        }
    }
    packer.groups
}

/// Live slots a consolidation leaves free where the budget allows, so the
/// next batches' history REQs can stay open as live ones instead of each
/// setting off a consolidation of its own.
const FREE_LIVE_SLOTS: usize = 2;

/// How many of the merge candidates (smallest first) may be merged only to
/// free slots: each at most twice the items gathered before it. Like the
/// tiers of a log-structured merge, an item is then sent again a
/// logarithmic number of times, not at every consolidation (a growing set
/// of recent items merged into the same slot again and again would be).
fn similar_sized(new: usize, candidates: &[(usize, u64)]) -> usize {
    let mut gathered = new.max(1);
    let mut similar = 0;
    for &(size, _) in candidates {
        if size > 2 * gathered {
            break;
        }
        gathered += size;
        similar += 1;
    }
    similar
}

/// Live subscriptions a relay may hold: half its budget, the rest is for history.
fn live_budget(subscriptions: usize) -> usize {
    (subscriptions / 2).max(1)
}

/// Filters that travel in one REQ: a chunk's per-id filters (its items
/// covered only while all of them are open), or one Layer 1 or wide filter.
struct Unit {
    items: Vec<Item>,
    layer1: bool,
    filters: Vec<Encoded>,
}

/// One REQ of a live set and what it covers.
struct Group {
    filters: Vec<Encoded>,
    /// Bytes of its REQ so far.
    bytes: usize,
    /// `None` when part of a split unit landed here.
    covers: Option<Vec<Item>>,
    layer1: bool,
}

/// First-fit packing of filters into REQs within a relay's limits: a
/// small unit (Layer 1, a few new roots) fills a gap an earlier REQ left,
/// so a live set needs no more REQs than it must, and a consolidation
/// merges fewer live subscriptions to fit the budget.
struct Packer {
    limits: Limits,
    groups: Vec<Group>,
}

impl Packer {
    /// The first group that `filters` more of `size` bytes fit, else a new one.
    fn room_for(&mut self, filters: usize, size: usize) -> &mut Group {
        let limits = self.limits;
        let fits = |g: &Group| {
            g.filters.len() + filters <= limits.filters_per_req
                && g.bytes + size <= limits.message_bytes
        };
        let at = match self.groups.iter().position(fits) {
            Some(at) => at,
            None => {
                self.groups.push(Group {
                    filters: Vec::new(),
                    bytes: REQ_OVERHEAD,
                    covers: Some(Vec::new()),
                    layer1: false,
                });
                self.groups.len() - 1
            }
        };
        let group = &mut self.groups[at];
        group.bytes += size;
        group
    }
}

#[cfg(test)]
mod tests {
    use super::similar_sized;

    #[test]
    fn only_similar_sized_live_subscriptions_merge_to_free_slots() {
        // One new item: Layer 1's empty REQ, then REQs of 1 and 2 items
        // merge; a base of 300 items does not.
        let candidates = [(0, 1), (1, 2), (2, 3), (300, 4)];
        assert_eq!(similar_sized(1, &candidates), 3);
        assert_eq!(similar_sized(0, &[(5, 1)]), 0, "5 items for none new");
        assert_eq!(similar_sized(150, &candidates), 4);
    }
}
