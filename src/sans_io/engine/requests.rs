//! Turning wanted work into REQs within a relay's limits.
//!
//! Relays cap concurrent subscriptions (10 is common), filters per REQ and
//! message size. Historic chunks wait in a per-relay queue and are packed
//! into as few REQs as the limits allow, started as earlier ones end. Live
//! coverage is kept small: while the per-id filters of everything confirmed
//! fit under the consolidation threshold, they stay open as they are;
//! beyond that a relay's live traffic is one kind-based filter with `since`,
//! matched against the index locally. Consolidation (GRASP-02) closes the
//! live subscriptions and re-packs them, `since` reaching back over any gap.

use log::{debug, info};
use nostr::prelude::{Filter, Timestamp};

use super::relay::{ItemState, LiveMode};
use super::{Action, Engine, Status, Timer};
use crate::sans_io::filters::{
    Encoded, REPO_FILTERS_PER_CHUNK, ROOT_FILTERS_PER_CHUNK, announcement_filter, chunk_filters,
    close_message, req_message_encoded, self_filter, wide_filter,
};
use crate::sans_io::index::{Item, RelayId};
use crate::sans_io::subscription::{Purpose, Scope, Subscription, WorkRef};
use crate::sans_io::time::Time;

impl Engine {
    /// Starts as much queued historic work on `relay` as its limits allow.
    pub(super) fn schedule(&mut self, relay: RelayId, now: Time) {
        self.open_next_pages(relay, now);
        loop {
            let state = &self.relays[relay.index()];
            if state.status != Status::Connected
                || state.paused_until.is_some()
                || state.work.is_empty()
            {
                break;
            }
            if state.open_count() >= state.limits.subscriptions
                && !self.evict_live_for_history(relay, now)
            {
                break;
            }
            let state = &self.relays[relay.index()];
            let bypass = state
                .work
                .front()
                .is_some_and(|w| state.neg_bypass.contains(&w.batch));
            let neg = !bypass && self.negentropy_usable(relay);
            if neg && !self.neg_admit(relay) {
                break;
            }
            let (chunks, filters) = self.take_packed_chunks(relay);
            if neg {
                self.start_neg_job(relay, chunks, filters, now);
                continue;
            }
            let state = self.relay(relay);
            for w in &chunks {
                state.neg_bypass.remove(&w.batch);
            }
            let purpose = self.purpose_for(relay, filters.len());
            if purpose == Purpose::Page && self.relays[relay.index()].live_mode == LiveMode::PerId {
                let state = self.relay(relay);
                state.uncovered_since = Some(state.uncovered_since.map_or(now, |t| t.min(now)));
            }
            let scope = Scope::Exact;
            self.open_subscription(relay, filters, purpose, scope, chunks, 1, now, now);
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
            let Some(next) = state.next_pages.front() else {
                return;
            };
            if state.status != Status::Connected || state.paused_until.is_some() {
                return;
            }
            let may_evict = !next.work.is_empty();
            if state.open_count() >= state.limits.subscriptions
                && !(may_evict && self.evict_live_for_history(relay, now))
            {
                return;
            }
            let Some(next) = self.relay(relay).next_pages.pop_front() else {
                return;
            };
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
            if let Some(s) = self.relays[relay.index()].subs.get_mut(&id) {
                s.set_previous(&next.filters);
            }
        }
    }

    /// When live subscriptions fill a relay's whole budget and history is
    /// waiting, history would never run: close one live subscription and let
    /// the next consolidation re-cover its gap with `since`.
    fn evict_live_for_history(&mut self, relay: RelayId, now: Time) -> bool {
        let state = &self.relays[relay.index()];
        if state.subs.values().any(|s| s.purpose == Purpose::Page) {
            return false;
        }
        let Some(id) = state
            .subs
            .iter()
            .filter(|(_, s)| s.eose)
            .map(|(id, _)| *id)
            .min()
        else {
            return false;
        };
        debug!(
            "{}: live subscription {id:x} yields to history",
            self.relay_url(relay)
        );
        if let Some(sub) = self.close_subscription(relay, id) {
            let state = self.relay(relay);
            let lost = if sub.eose { now } else { sub.started.min(now) };
            state.uncovered_since = Some(state.uncovered_since.map_or(lost, |t| t.min(lost)));
        }
        true
    }

    /// Pops queued chunks that fit in one REQ (at least one chunk).
    fn take_packed_chunks(&mut self, relay: RelayId) -> (Vec<WorkRef>, Vec<Encoded>) {
        self.split_front_chunk(relay);
        let limit = self.page_limit(relay);
        let state = &self.relays[relay.index()];
        let limits = state.limits;
        let mut chunks = Vec::new();
        let mut filters: Vec<Encoded> = Vec::new();
        let mut bytes = 32;
        for work in state.work.iter() {
            let more: Vec<Encoded> = chunk_filters(&self.index, &work.items, None)
                .into_iter()
                .map(|f| Encoded::new(f.limit(limit)))
                .collect();
            let more_bytes: usize = more.iter().map(|f| f.json.len() + 1).sum();
            let fits = filters.len() + more.len() <= limits.filters_per_req
                && bytes + more_bytes <= limits.message_bytes;
            if !chunks.is_empty() && !fits {
                break;
            }
            bytes += more_bytes;
            filters.extend(more);
            chunks.push(work.clone());
        }
        let state = self.relay(relay);
        state.work.drain(..chunks.len());
        (chunks, filters)
    }

    /// A chunk queued before the relay refused that many tag values is
    /// split to the relay's chunk size, so no REQ repeats what it refused.
    fn split_front_chunk(&mut self, relay: RelayId) {
        let size = self.chunk_size(relay);
        let state = self.relay(relay);
        let Some(front) = state.work.front() else {
            return;
        };
        if front.items.len() <= size {
            return;
        }
        let Some(work) = state.work.pop_front() else {
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
        if let Some(b) = state.batches.get_mut(&work.batch) {
            b.chunks_left += parts.len() as u32 - 1;
        }
        for part in parts.into_iter().rev() {
            state.work.push_front(part);
        }
    }

    /// A new historic REQ stays open for live events when the relay's live
    /// set is per-id, no consolidation is waiting, and it fits the threshold
    /// and half the subscription budget (the other half is for history).
    fn purpose_for(&self, relay: RelayId, filters: usize) -> Purpose {
        let state = &self.relays[relay.index()];
        let live_subs = state.live_subs().count();
        let fits = state.live_mode == LiveMode::PerId
            && !state.consolidating
            && state.uncovered_since.is_none()
            && state.live_filter_count() + filters <= self.config.consolidation_threshold
            && live_subs < (state.limits.subscriptions / 2).max(1);
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
        let state = self.relay(relay);
        state.reqs_sent += 1;
        let epoch = state.epoch;
        state.subs.insert(
            id,
            Subscription::new(filters, purpose, scope, work, page, started),
        );
        self.actions.push_back(Action::Send { relay, message });
        // Each page gets its own EOSE deadline from when it is sent; a long
        // chain of pages must not time out its later pages on arrival.
        self.arm(
            now + self.config.eose_timeout,
            Timer::EoseTimeout(relay, epoch, id),
        );
        id
    }

    /// Sends CLOSE for a subscription and forgets it.
    pub(super) fn close_subscription(&mut self, relay: RelayId, id: u64) -> Option<Subscription> {
        let sub = self.relay(relay).subs.remove(&id)?;
        self.actions.push_back(Action::Send {
            relay,
            message: close_message(&format!("{id:x}")),
        });
        Some(sub)
    }

    /// Sends CLOSE for every subscription of `relay`.
    pub(super) fn close_all_subscriptions(&mut self, relay: RelayId) {
        let ids: Vec<u64> = self.relays[relay.index()].subs.keys().copied().collect();
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
        let limit = self.page_limit(relay);
        let confirmed: Vec<Item> = if with_confirmed {
            let mut items: Vec<Item> = self.relays[relay.index()]
                .items
                .iter()
                .filter(|(_, s)| s.state == ItemState::Confirmed)
                .map(|(i, _)| *i)
                .collect();
            items.sort_unstable();
            items
        } else {
            Vec::new()
        };
        let per_id_count = self.per_id_filter_count(relay, &confirmed);
        let state = &self.relays[relay.index()];
        let budget = (state.limits.subscriptions / 2).max(1);
        let fits = per_id_count < self.config.consolidation_threshold
            && (1 + per_id_count).div_ceil(state.limits.filters_per_req) <= budget;
        let mode = if fits {
            LiveMode::PerId
        } else {
            LiveMode::Wide
        };
        self.relay(relay).live_mode = mode;
        let layer1_since = if std::mem::take(&mut self.relay(relay).layer1_unread) {
            None
        } else {
            since
        };
        let mut filters = vec![announcement_filter(layer1_since).limit(limit)];
        let scope = match mode {
            LiveMode::PerId => {
                let per_id = self.per_id_filters(relay, &confirmed, since);
                filters.extend(per_id.into_iter().map(|f| f.limit(limit)));
                Scope::Exact
            }
            LiveMode::Wide => {
                let since = since.unwrap_or_else(|| {
                    Timestamp::from_secs(now.saturating_sub(self.config.quick_reconnect).as_secs())
                });
                let per_filter = self.relays[relay.index()].limits.kinds.max(1);
                for kinds in self.config.wide_kinds.chunks(per_filter) {
                    filters.push(wide_filter(kinds, since).limit(limit));
                }
                Scope::Wide
            }
        };
        debug!(
            "{}: live set of {} filters ({mode:?})",
            self.relay_url(relay),
            filters.len()
        );
        for group in self.pack(relay, filters) {
            self.open_subscription(relay, group, Purpose::Live, scope, Vec::new(), 1, now, now);
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

    fn per_id_filters(
        &self,
        relay: RelayId,
        items: &[Item],
        since: Option<Timestamp>,
    ) -> Vec<Filter> {
        let chunk = self.chunk_size(relay);
        let (repos, roots): (Vec<Item>, Vec<Item>) =
            items.iter().partition(|i| matches!(i, Item::Repo(_)));
        let mut filters = Vec::new();
        for part in [repos, roots] {
            for c in part.chunks(chunk) {
                filters.extend(chunk_filters(&self.index, c, since));
            }
        }
        filters
    }

    /// Splits filters into groups that each fit one REQ of `relay`.
    fn pack(&self, relay: RelayId, filters: Vec<Filter>) -> Vec<Vec<Encoded>> {
        let limits = self.relays[relay.index()].limits;
        let mut groups: Vec<Vec<Encoded>> = Vec::new();
        let mut bytes = 0;
        for filter in filters {
            let encoded = Encoded::new(filter);
            let size = encoded.json.len() + 1;
            let start_new = match groups.last() {
                None => true,
                Some(g) => g.len() >= limits.filters_per_req || bytes + size > limits.message_bytes,
            };
            if start_new {
                groups.push(Vec::new());
                bytes = 32;
            }
            bytes += size;
            if let Some(g) = groups.last_mut() {
                g.push(encoded);
            }
        }
        groups
    }

    /// Consolidates once confirmed items lack live coverage: at once when no
    /// batch is pending, else after the pending batches or the timeout.
    pub(super) fn maybe_consolidate(&mut self, relay: RelayId, now: Time) {
        let state = &self.relays[relay.index()];
        if state.status != Status::Connected
            || state.uncovered_since.is_none()
            || state.paused_until.is_some()
        {
            return;
        }
        if state.batches.is_empty() {
            self.consolidate(relay, now);
        } else if !state.consolidating {
            let epoch = state.epoch;
            self.relay(relay).consolidating = true;
            self.arm(
                now + self.config.consolidation_timeout,
                Timer::Consolidate(relay, epoch),
            );
        }
    }

    /// Closes the live subscriptions and re-subscribes Layer 1 and every
    /// confirmed item with `since` reaching back over any uncovered gap.
    /// Confirmed state is kept; historic pages in flight continue.
    pub(super) fn consolidate(&mut self, relay: RelayId, now: Time) {
        let state = &self.relays[relay.index()];
        if state.status != Status::Connected
            || (!state.consolidating && state.uncovered_since.is_none())
        {
            return;
        }
        let window_start = now.saturating_sub(self.config.quick_reconnect);
        let since = state
            .uncovered_since
            .map_or(window_start, |t| t.min(window_start));
        info!(
            "{}: consolidating live subscriptions",
            self.relay_url(relay)
        );
        self.stats.consolidations += 1;
        let live: Vec<u64> = state
            .subs
            .iter()
            .filter(|(_, s)| s.purpose == Purpose::Live)
            .map(|(id, _)| *id)
            .collect();
        for id in live {
            if let Some(sub) = self.close_subscription(relay, id) {
                self.continue_work_elsewhere(relay, sub);
            }
        }
        let state = self.relay(relay);
        state.consolidating = false;
        state.uncovered_since = None;
        self.subscribe_live(
            relay,
            Some(Timestamp::from_secs(since.as_secs())),
            true,
            now,
        );
        let mode = self.relays[relay.index()].live_mode;
        let state = self.relay(relay);
        if mode == LiveMode::PerId {
            // Only pages still working for a pending batch count: one whose
            // batch failed (a sibling chunk was refused) holds stale work,
            // and with no batch pending `schedule` would consolidate again
            // at once, and again, until the stack overflowed (found by
            // fuzzing).
            let batches = &state.batches;
            state.uncovered_since = state
                .subs
                .values()
                .filter(|s| s.purpose == Purpose::Page)
                .filter(|s| s.work.iter().any(|w| batches.contains_key(&w.batch)))
                .map(|s| s.started)
                .min();
        }
        self.schedule(relay, now);
    }

    /// A live subscription closed before its chain finished: its unfinished
    /// chunks go back to the front of the work queue.
    fn continue_work_elsewhere(&mut self, relay: RelayId, sub: Subscription) {
        if sub.eose || sub.work.is_empty() {
            return;
        }
        let state = self.relay(relay);
        for work in sub.work.into_iter().rev() {
            state.work.push_front(work);
        }
    }

    /// A page never reached EOSE in time: treat it as refused.
    pub(super) fn on_eose_timeout(&mut self, relay: RelayId, epoch: u32, id: u64, now: Time) {
        let state = &self.relays[relay.index()];
        if state.epoch != epoch || state.subs.get(&id).is_none_or(|s| s.eose) {
            return;
        }
        info!(
            "{}: subscription {id:x} got no EOSE in time",
            self.relay_url(relay)
        );
        if let Some(sub) = self.close_subscription(relay, id) {
            self.refused(relay, sub, crate::sans_io::refusal::Refusal::Error, now);
        }
    }

    /// A pause after a refusal ended: retry what was refused.
    pub(super) fn on_resume(&mut self, relay: RelayId, epoch: u32, now: Time) {
        let state = self.relay(relay);
        if state.epoch != epoch || state.status != Status::Connected {
            return;
        }
        state.paused_until = None;
        if relay == self.own {
            if self.relays[relay.index()].subs.is_empty() {
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
