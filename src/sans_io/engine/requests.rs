//! Turning wanted work into REQs within a relay's limits.
//!
//! Relays cap concurrent subscriptions (10 is common), filters per REQ and
//! message size. Historic chunks wait in a per-relay queue and are packed
//! into as few REQs as the limits allow, started as earlier ones end. Live
//! coverage is kept small: while the per-id filters of everything confirmed
//! fit under the consolidation threshold, they stay open as they are;
//! beyond that a relay's live traffic is one kind-based filter with `since`,
//! matched against the index locally. Consolidation (GRASP-02) covers what
//! the live set lacks, `since` reaching back over any gap: a per-id set
//! keeps its subscriptions and gains REQs for the new items only (merging
//! its smallest subscriptions in when the budget requires); a wide one, or
//! one that goes wide, is closed and re-packed whole.

use log::{debug, info};
use nostr::prelude::Timestamp;

use std::collections::HashSet;

use super::built_chunk::BuiltChunk;
use super::connection::LiveMode;
use super::limits::{Limits, REQ_OVERHEAD};
use super::{Action, ConnTimer, Engine};
use crate::sans_io::memory::index::{Item, RelayId};
use crate::sans_io::query::filters::{
    Encoded, REPO_FILTERS_PER_CHUNK, ROOT_FILTERS_PER_CHUNK, announcement_filter,
    chunk_filters_encoded, close_message, req_message_encoded, self_filter, wide_filter,
};
use crate::sans_io::query::subscription::{Purpose, Scope, Subscription, WorkRef};
use crate::sans_io::timing::time::Time;

impl Engine {
    /// Starts as much queued historic work on `relay` as its limits allow.
    pub(super) fn schedule(&mut self, relay: RelayId, now: Time) {
        self.open_next_pages(relay, now);
        self.recount_ids(relay);
        loop {
            let state = &self.relays[relay.index()];
            let Some(conn) = state.conn() else {
                break;
            };
            let Some(flight) = conn.flight().filter(|f| !f.work.is_empty()) else {
                break;
            };
            if conn.paused_until.is_some() {
                break;
            }
            // A suspect of a refused value goes by REQ: only a REQ's
            // answer clears it (a relay may take in NEG-OPEN what it
            // refuses in a REQ, and the live set would be refused again).
            let bypass = flight.work.front().is_some_and(|w| {
                flight.neg_bypass.contains(&w.batch) || self.is_suspect_chunk(relay, w)
            });
            let neg = !bypass && self.negentropy_usable(relay);
            if !state.req_room() && !self.evict_live_for_history(relay, now) {
                break;
            }
            if neg && (!self.relays[relay.index()].neg_room() || !self.neg_admit(relay)) {
                break;
            }
            let (chunks, filters) = self.take_packed_chunks(relay);
            if neg {
                self.start_neg_job(relay, chunks, filters, now);
                continue;
            }
            if let Some(flight) = self.flight_mut(relay) {
                for w in &chunks {
                    flight.neg_bypass.remove(&w.batch);
                }
            }
            let purpose = self.purpose_for(relay, filters.len());
            if purpose == Purpose::Page {
                self.relay(relay).mark_uncovered(now);
            }
            let covers = (purpose == Purpose::Live).then(|| {
                chunks
                    .iter()
                    .flat_map(|w| w.items.iter().copied())
                    .collect()
            });
            let scope = Scope::Exact;
            let id = self.open_subscription(relay, filters, purpose, scope, chunks, 1, now, now);
            self.set_cover(relay, id, covers, false);
        }
        self.maybe_consolidate(relay, now);
    }

    /// Opens waiting follow-up pages as far as the subscription limit
    /// allows (a page chain continuing from a live subscription holds one
    /// slot more than the chain before it). A page of historic work may
    /// take a live subscription's slot; a page continuing a live set's own
    /// look-back may not: the consolidation that re-covers an evicted live
    /// subscription would read the same window again and ask the same page,
    /// forever. It waits for the next free slot instead.
    fn open_next_pages(&mut self, relay: RelayId, now: Time) {
        loop {
            let state = &self.relays[relay.index()];
            let Some(conn) = state.conn() else {
                return;
            };
            let Some(next) = conn.flight().and_then(|f| f.next_pages.front()) else {
                return;
            };
            if conn.paused_until.is_some() {
                return;
            }
            let may_evict = !next.work.is_empty();
            if next.reconcile.is_some() {
                if !state.neg_room() {
                    return;
                }
            } else if !(state.req_room() || may_evict && self.evict_live_for_history(relay, now)) {
                return;
            }
            let Some(mut next) = self
                .flight_mut(relay)
                .and_then(|f| f.next_pages.pop_front())
            else {
                return;
            };
            if let Some(sat) = next.reconcile.take() {
                self.start_second_job(relay, sat, next.scope, next.work, next.started, now);
                continue;
            }
            let encoded = next.filters.iter().map(|p| Encoded::new(p.filter.clone()));
            let id = self.open_subscription(
                relay,
                encoded.collect(),
                Purpose::Page,
                next.scope,
                next.work,
                next.page,
                next.started,
                now,
            );
            if let Some(s) = self.conn_mut(relay).and_then(|c| c.subs.get_mut(id)) {
                s.set_previous(&next.filters);
            }
        }
    }

    /// When live subscriptions fill a relay's whole budget and history is
    /// waiting, history would never run: close one live subscription and let
    /// the next consolidation re-cover its gap with `since`.
    fn evict_live_for_history(&mut self, relay: RelayId, now: Time) -> bool {
        let Some(conn) = self.conn(relay) else {
            return false;
        };
        if conn.subs.values().any(|s| s.purpose == Purpose::Page) {
            return false;
        }
        let Some(id) = conn
            .subs
            .iter()
            .filter(|(_, s)| s.eose)
            .map(|(id, _)| id)
            .min()
        else {
            return false;
        };
        debug!(
            "{}: live subscription {id:x} yields to history",
            self.relay_url(relay)
        );
        if let Some(sub) = self.close_subscription(relay, id) {
            let lost = if sub.eose { now } else { sub.started.min(now) };
            self.relay(relay).coverage.gap_from(lost);
        }
        true
    }

    /// Pops queued chunks that fit in one REQ (at least one chunk). Each
    /// chunk's filters are built and serialized once: the one that did not
    /// fit is kept for the next REQ.
    fn take_packed_chunks(&mut self, relay: RelayId) -> (Vec<WorkRef>, Vec<Encoded>) {
        self.split_front_chunk(relay);
        let limit = self.page_limit(relay);
        let limits = self.relays[relay.index()].facts.limits;
        let mut chunks = Vec::new();
        let mut filters: Vec<Encoded> = Vec::new();
        let mut bytes = REQ_OVERHEAD;
        let mut built = self.flight_mut(relay).and_then(|f| f.built_front.take());
        while let Some(work) = self
            .conn(relay)
            .and_then(|c| c.flight()?.work.get(chunks.len()))
        {
            // A chunk suspected of a refused value goes alone: strfry
            // refuses a whole REQ for one value.
            if !chunks.is_empty() && self.is_suspect_chunk(relay, work) {
                break;
            }
            let more = match built.take() {
                Some(b) if b.limit == limit && b.work == *work => b.filters,
                _ => chunk_filters_encoded(&self.index, &work.items, None, limit),
            };
            let more_bytes: usize = more.iter().map(|f| f.json.len() + 1).sum();
            let fits = filters.len() + more.len() <= limits.filters_per_req
                && bytes + more_bytes <= limits.message_bytes;
            if !chunks.is_empty() && !fits {
                let work = work.clone();
                if let Some(flight) = self.flight_mut(relay) {
                    flight.built_front = Some(BuiltChunk {
                        work,
                        limit,
                        filters: more,
                    });
                }
                break;
            }
            bytes += more_bytes;
            filters.extend(more);
            chunks.push(work.clone());
            if self.is_suspect_chunk(relay, &chunks[0]) {
                break;
            }
        }
        if let Some(flight) = self.flight_mut(relay) {
            flight.work.drain(..chunks.len());
        }
        (chunks, filters)
    }

    /// A chunk queued before the relay refused that many tag values is
    /// split to the relay's chunk size, so no REQ repeats what it refused.
    fn split_front_chunk(&mut self, relay: RelayId) {
        let size = self.chunk_size(relay);
        let Some(flight) = self.flight_mut(relay) else {
            return;
        };
        let Some(front) = flight.work.front() else {
            return;
        };
        if front.items.len() <= size {
            return;
        }
        let Some(work) = flight.work.pop_front() else {
            return;
        };
        let parts: Vec<WorkRef> = work
            .items
            .chunks(size)
            .map(|items| WorkRef {
                batch: work.batch,
                items: items.to_vec(),
            })
            .collect();
        if let Some(b) = flight.batches.get_mut(&work.batch) {
            b.chunks_left += parts.len() as u32 - 1;
        }
        for part in parts.into_iter().rev() {
            flight.work.push_front(part);
        }
    }

    /// A new historic REQ stays open for live events when the relay's live
    /// set is per-id, no consolidation is waiting, and it fits the threshold
    /// and half the subscription budget (the other half is for history).
    fn purpose_for(&self, relay: RelayId, filters: usize) -> Purpose {
        let state = &self.relays[relay.index()];
        let Some(conn) = state.conn() else {
            return Purpose::Page;
        };
        let live_subs = conn.live_subs().count();
        let fits = conn.live_mode == LiveMode::PerId
            && !conn.flight().is_some_and(|f| f.consolidating)
            && state.coverage.gap().is_none()
            && conn.live_filter_count() + filters <= self.config.consolidation_threshold
            && live_subs < (state.facts.limits.subscriptions / 2).max(1);
        if fits { Purpose::Live } else { Purpose::Page }
    }

    /// Sends a REQ and records the subscription.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn open_subscription(
        &mut self,
        relay: RelayId,
        filters: Vec<Encoded>,
        purpose: Purpose,
        scope: Scope,
        work: Vec<WorkRef>,
        page: u32,
        started: Time,
        now: Time,
    ) -> u64 {
        let id = self.next_sub;
        self.next_sub += 1;
        let sub_id = format!("{id:x}");
        let message = req_message_encoded(&sub_id, &filters);
        let filters = filters.into_iter().map(|f| f.filter).collect();
        self.stats.reqs_sent += 1;
        if let Some(conn) = self.conn_mut(relay) {
            let sub = Subscription::new(filters, purpose, scope, work, page, started);
            conn.subs.insert(id, sub);
        }
        self.actions.push_back(Action::Send { relay, message });
        // Each page gets its own EOSE deadline from when it is sent; a long
        // chain of pages must not time out its later pages on arrival.
        let timer = self.arm_conn(
            now + self.config.eose_timeout,
            relay,
            ConnTimer::EoseTimeout(id),
        );
        if let Some(sub) = self.conn_mut(relay).and_then(|c| c.subs.get_mut(id)) {
            sub.eose_timer = timer;
            sub.sent = now;
        }
        id
    }

    /// Sends CLOSE for a subscription and forgets it.
    pub(super) fn close_subscription(&mut self, relay: RelayId, id: u64) -> Option<Subscription> {
        let sub = self.conn_mut(relay)?.subs.remove(id)?;
        if let Some(timer) = sub.eose_timer {
            self.timers.cancel(timer);
        }
        self.actions.push_back(Action::Send {
            relay,
            message: close_message(&format!("{id:x}")),
        });
        Some(sub)
    }

    /// Sends CLOSE for every subscription of `relay`.
    pub(super) fn close_all_subscriptions(&mut self, relay: RelayId) {
        let ids: Vec<u64> = self
            .conn(relay)
            .map_or(Vec::new(), |c| c.subs.ids().collect());
        for id in ids {
            self.close_subscription(relay, id);
        }
    }

    /// The own relay's self-subscription.
    pub(super) fn subscribe_self(&mut self, since: Option<Timestamp>, now: Time) {
        self.self_since = since;
        let filter = self_filter(since).limit(self.page_limit(self.own));
        self.open_subscription(
            self.own,
            vec![Encoded::new(filter)],
            Purpose::Live,
            Scope::Own,
            Vec::new(),
            1,
            now,
            now,
        );
    }

    /// Opens a relay's live set: Layer 1 and, when `with_confirmed`, the
    /// confirmed items — per-id if they fit the threshold, else one wide
    /// filter — all with `since`, packed into as few REQs as allowed.
    pub(super) fn subscribe_live(
        &mut self,
        relay: RelayId,
        since: Option<Timestamp>,
        with_confirmed: bool,
        now: Time,
    ) {
        let mut confirmed = if with_confirmed {
            self.confirmed_items(relay)
        } else {
            Vec::new()
        };
        let fits = self.per_id_fits(relay, self.per_id_filter_count(relay, &confirmed));
        let mode = if fits {
            LiveMode::PerId
        } else {
            LiveMode::Wide
        };
        if let Some(conn) = self.conn_mut(relay) {
            conn.live_mode = mode;
        }
        let layer1_since = self.layer1_since(relay, since);
        let (units, scope) = match mode {
            LiveMode::PerId => {
                // Sorted, so a chunk holds neighbours (a repo's roots together).
                confirmed.sort_unstable();
                let units = self.live_units(relay, &confirmed, Some(layer1_since), since);
                (units, Scope::Exact)
            }
            LiveMode::Wide => {
                let since = since.unwrap_or_else(|| {
                    Timestamp::from_secs(now.saturating_sub(self.config.quick_reconnect).as_secs())
                });
                (self.wide_units(relay, layer1_since, since), Scope::Wide)
            }
        };
        let groups = self.pack_units(relay, units);
        debug!(
            "{}: live set of {} filters ({mode:?})",
            self.relay_url(relay),
            groups.iter().map(|g| g.filters.len()).sum::<usize>()
        );
        self.open_live_groups(relay, groups, scope, now);
    }

    /// Opens one live subscription per group and records what each covers.
    fn open_live_groups(&mut self, relay: RelayId, groups: Vec<Group>, scope: Scope, now: Time) {
        for group in groups {
            let covers = if scope == Scope::Exact {
                group.covers
            } else {
                None
            };
            let filters = group.filters;
            let id = self.open_subscription(
                relay,
                filters,
                Purpose::Live,
                scope,
                Vec::new(),
                1,
                now,
                now,
            );
            self.set_cover(relay, id, covers, group.layer1);
        }
    }

    /// Records what a live subscription covers (see [`Subscription::covers`]).
    fn set_cover(&mut self, relay: RelayId, id: u64, covers: Option<Vec<Item>>, layer1: bool) {
        if let Some(s) = self.conn_mut(relay).and_then(|c| c.subs.get_mut(id)) {
            s.covers = covers.map(Vec::into_boxed_slice);
            s.layer1 = layer1;
        }
    }

    /// The relay's confirmed items, in no order.
    fn confirmed_items(&self, relay: RelayId) -> Vec<Item> {
        self.relays[relay.index()].targets.confirmed()
    }

    /// Whether `per_id` filters (plus Layer 1) fit the consolidation
    /// threshold and half the relay's subscription budget.
    fn per_id_fits(&self, relay: RelayId, per_id: usize) -> bool {
        let limits = self.relays[relay.index()].facts.limits;
        per_id < self.config.consolidation_threshold
            && (1 + per_id).div_ceil(limits.filters_per_req) <= live_budget(limits.subscriptions)
    }

    /// `since` for Layer 1 in a new live set: from the beginning when it
    /// was refused before it was read to the end.
    fn layer1_since(&mut self, relay: RelayId, since: Option<Timestamp>) -> Option<Timestamp> {
        if self.relay(relay).coverage.take_layer1() {
            None
        } else {
            since
        }
    }

    /// How many per-id filters `items` need, counted without building them
    /// (a relay with 100,000 roots goes wide; building them first would
    /// cost more than the whole decision).
    fn per_id_filter_count(&self, relay: RelayId, items: &[Item]) -> usize {
        let chunk = self.chunk_size(relay);
        let repos = items.iter().filter(|i| matches!(i, Item::Repo(_))).count();
        let roots = items.len() - repos;
        repos.div_ceil(chunk) * REPO_FILTERS_PER_CHUNK
            + roots.div_ceil(chunk) * ROOT_FILTERS_PER_CHUNK
    }

    /// Layer 1 (when `layer1` is `Some(since)`) and the per-id filters of
    /// `items` with `since`, one unit per chunk.
    fn live_units(
        &self,
        relay: RelayId,
        items: &[Item],
        layer1: Option<Option<Timestamp>>,
        since: Option<Timestamp>,
    ) -> Vec<Unit> {
        let limit = self.page_limit(relay);
        let chunk = self.chunk_size(relay);
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
                    filters: chunk_filters_encoded(&self.index, c, since, limit),
                });
            }
        }
        units
    }

    /// Layer 1 and the kind-based live filters, as many kinds per filter as
    /// the relay takes.
    fn wide_units(&self, relay: RelayId, layer1: Option<Timestamp>, since: Timestamp) -> Vec<Unit> {
        let limit = self.page_limit(relay);
        let per_filter = self.relays[relay.index()].facts.limits.kinds.max(1);
        let announcement = std::iter::once((true, announcement_filter(layer1)));
        let wide = self
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

    /// Packs units into groups that each fit one REQ of `relay`, a unit's
    /// filters together so its items count as covered by one subscription.
    /// A unit too big for any REQ is split filter by filter; the groups it
    /// lands in then cover nothing known.
    fn pack_units(&self, relay: RelayId, units: Vec<Unit>) -> Vec<Group> {
        let limits = self.relays[relay.index()].facts.limits;
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

    /// Consolidates once confirmed items lack live coverage: at once when no
    /// batch is pending, else after the pending batches or the timeout.
    pub(super) fn maybe_consolidate(&mut self, relay: RelayId, now: Time) {
        let state = &self.relays[relay.index()];
        let Some(conn) = state.conn() else {
            return;
        };
        if state.coverage.gap().is_none() || conn.paused_until.is_some() {
            return;
        }
        if conn.batches() == 0 {
            self.consolidate(relay, now);
        } else if !conn.flight().is_some_and(|f| f.consolidating) {
            if let Some(flight) = self.flight_mut(relay) {
                flight.consolidating = true;
            }
            self.arm_conn(
                now + self.config.consolidation_timeout,
                relay,
                ConnTimer::Consolidate,
            );
        }
    }

    /// Closes the live subscriptions and re-subscribes Layer 1 and every
    /// confirmed item with `since` reaching back over any uncovered gap.
    /// Confirmed state is kept; historic pages in flight continue.
    pub(super) fn consolidate(&mut self, relay: RelayId, now: Time) {
        let state = &self.relays[relay.index()];
        let Some(conn) = state.conn() else {
            return;
        };
        if !conn.flight().is_some_and(|f| f.consolidating) && state.coverage.gap().is_none() {
            return;
        }
        let window_start = now.saturating_sub(self.config.quick_reconnect);
        let since = state
            .coverage
            .gap()
            .map_or(window_start, |t| t.min(window_start));
        info!(
            "{}: consolidating live subscriptions",
            self.relay_url(relay)
        );
        self.stats.consolidations += 1;
        let since = Timestamp::from_secs(since.as_secs());
        let state = self.relay(relay);
        state.coverage.take_gap();
        if let Some(flight) = state.conn_mut().and_then(|c| c.flight_mut()) {
            flight.consolidating = false;
        }
        if !self.extend_live_set(relay, since, now) {
            self.resubscribe_live(relay, since, now);
        }
        let state = self.relay(relay);
        if let Some(conn) = state.conn()
            && conn.live_mode == LiveMode::PerId
        {
            // Only pages still working for a pending batch count: one whose
            // batch failed (a sibling chunk was refused) holds stale work,
            // and with no batch pending `schedule` would consolidate again
            // at once, and again, until the stack overflowed (found by
            // fuzzing).
            let batches = conn.flight().map(|f| &f.batches);
            let gap = conn
                .subs
                .values()
                .filter(|s| s.purpose == Purpose::Page)
                .filter(|s| {
                    let pending = |b: &u64| batches.is_some_and(|bs| bs.contains_key(b));
                    s.work.iter().any(|w| pending(&w.batch))
                })
                .map(|s| s.started)
                .min();
            if let Some(gap) = gap {
                state.coverage.gap_from(gap);
            }
        }
        self.schedule(relay, now);
    }

    /// Closes every live subscription and opens the live set anew.
    fn resubscribe_live(&mut self, relay: RelayId, since: Timestamp, now: Time) {
        let live: Vec<u64> = self.conn(relay).map_or(Vec::new(), |c| {
            c.subs
                .iter()
                .filter(|(_, s)| s.purpose == Purpose::Live)
                .map(|(id, _)| id)
                .collect()
        });
        for id in live {
            if let Some(sub) = self.close_subscription(relay, id) {
                // A Layer 1 read from the beginning, closed before its
                // EOSE (a fresh sync's first live set replaced at once by
                // a consolidation), is owed to the new set: else the
                // announcements of the relay's downtime were never read.
                let (_, layer1) = sub.uncovered_from(now);
                self.relay(relay).coverage.owe_layer1(layer1);
                self.continue_work_elsewhere(relay, sub);
            }
        }
        self.subscribe_live(relay, Some(since), true, now);
    }

    /// Covers what a per-id live set lacks — confirmed items no live
    /// subscription asks for, and Layer 1 if none carries it — with new
    /// REQs, so only those items travel. The smallest live subscriptions
    /// are merged into them (closed and asked again) only as far as the
    /// threshold and the subscription budget require, leaving
    /// [`FREE_LIVE_SLOTS`] free if merging allows it. False when the set
    /// cannot be extended (it is or goes wide, or what a subscription
    /// covers is unknown): the caller re-subscribes it whole.
    fn extend_live_set(&mut self, relay: RelayId, since: Timestamp, now: Time) -> bool {
        let state = &self.relays[relay.index()];
        let Some(conn) = state.conn() else {
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
        let confirmed = self.confirmed_items(relay);
        if !self.per_id_fits(relay, self.per_id_filter_count(relay, &confirmed)) {
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
        let need_layer1 = state.coverage.layer1_unread() || !live.iter().any(|(_, s)| s.layer1);
        // Merge candidates, smallest first: only those past EOSE (one still
        // reading history keeps its chain).
        let mut candidates: Vec<(usize, u64)> = live
            .iter()
            .filter(|(_, s)| s.eose)
            .map(|(id, s)| (s.covers.as_ref().map_or(0, |c| c.len()), *id))
            .collect();
        candidates.sort_unstable();
        let live_filters: usize = live.iter().map(|(_, s)| s.filter_count).sum();
        let (live_count, budget) = (live.len(), live_budget(state.facts.limits.subscriptions));
        if uncovered.is_empty() && !need_layer1 {
            return true;
        }
        let layer1 = self.layer1_since(relay, Some(since));
        let wish = budget.saturating_sub(FREE_LIVE_SLOTS).max(1);
        let similar = similar_sized(uncovered.len(), &candidates);
        for (target, most) in [(wish, similar), (budget, candidates.len())] {
            for merged in 0..=most {
                let ids: Vec<u64> = candidates[..merged].iter().map(|(_, id)| *id).collect();
                let (items, with_layer1) = self.merge_set(relay, &uncovered, &ids, need_layer1);
                let units =
                    self.live_units(relay, &items, with_layer1.then_some(layer1), Some(since));
                let groups = self.pack_units(relay, units);
                let subs = self.conn(relay).map(|c| &c.subs);
                let dropped: usize = ids
                    .iter()
                    .filter_map(|id| subs.and_then(|subs| subs.get(*id)))
                    .map(|s| s.filter_count)
                    .sum();
                let kept = live_filters.saturating_sub(dropped);
                let added: usize = groups.iter().map(|g| g.filters.len()).sum();
                if live_count - merged + groups.len() <= target
                    && kept + added <= self.config.consolidation_threshold
                {
                    for id in ids {
                        self.close_subscription(relay, id);
                    }
                    debug!(
                        "{}: live set extended by {added} filters ({merged} merged)",
                        self.relay_url(relay)
                    );
                    self.open_live_groups(relay, groups, Scope::Exact, now);
                    return true;
                }
            }
        }
        // Layer 1 from the beginning is still owed to the full set.
        self.relay(relay).coverage.owe_layer1(layer1.is_none());
        false
    }

    /// The items (sorted) and whether Layer 1 go into the new live REQs:
    /// those uncovered plus what the merged subscriptions covered and the
    /// relay still targets.
    fn merge_set(
        &self,
        relay: RelayId,
        uncovered: &[Item],
        merged: &[u64],
        need_layer1: bool,
    ) -> (Vec<Item>, bool) {
        let state = &self.relays[relay.index()];
        let mut items = uncovered.to_vec();
        let mut layer1 = need_layer1;
        let Some(conn) = state.conn() else {
            return (items, layer1);
        };
        for sub in merged.iter().filter_map(|id| conn.subs.get(*id)) {
            layer1 |= sub.layer1;
            let still = sub
                .covers
                .iter()
                .flatten()
                .filter(|i| state.targets.items.contains_key(i));
            items.extend(still);
        }
        items.sort_unstable();
        items.dedup();
        (items, layer1)
    }

    /// A live subscription closed before its chain finished: its unfinished
    /// chunks go back to the front of the work queue.
    fn continue_work_elsewhere(&mut self, relay: RelayId, sub: Subscription) {
        if sub.eose || sub.work.is_empty() {
            return;
        }
        let Some(flight) = self.start_flight(relay) else {
            return;
        };
        for work in sub.work.into_iter().rev() {
            flight.work.push_front(work);
        }
    }

    /// A page never reached EOSE in time: treat it as refused.
    pub(super) fn on_eose_timeout(&mut self, relay: RelayId, id: u64, now: Time) {
        let sub = self.conn(relay).and_then(|c| c.subs.get(id));
        if sub.is_none_or(|s| s.eose) {
            return;
        }
        info!(
            "{}: subscription {id:x} got no EOSE in time",
            self.relay_url(relay)
        );
        if let Some(sub) = self.close_subscription(relay, id) {
            self.refused(
                relay,
                sub,
                crate::sans_io::query::refusal::Refusal::Error,
                now,
            );
        }
    }

    /// A pause after a refusal ended: retry what was refused.
    pub(super) fn on_resume(&mut self, relay: RelayId, now: Time) {
        let own = relay == self.own;
        let Some(conn) = self.conn_mut(relay) else {
            return;
        };
        conn.paused_until = None;
        if own {
            if conn.subs.is_empty() {
                // The refused subscription's own `since` until it reached
                // EOSE (a first read refused for AUTH must start over from
                // the beginning), the quick window before its EOSE after.
                self.subscribe_self(self.self_since, now);
            }
            return;
        }
        self.requeue_all(relay);
        // Chunks may be waiting in the work queue with nothing queued to
        // diff (a negentropy job that fell back while paused).
        self.dirty.push(relay);
        self.flush(now);
        self.maybe_consolidate(relay, now);
    }
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
