//! Turning wanted history into REQs within a relay's limits.
//!
//! Relays cap concurrent subscriptions (10 is common), filters per REQ and
//! message size. Historic chunks wait in a per-relay queue and are packed
//! into as few REQs as the limits allow, started as earlier ones end;
//! follow-up pages go first, so chains finish first. A REQ of history
//! stays open as a live subscription while the live set has room for it
//! (`live_set`). Opening and closing a subscription are the relay's steps
//! ([`RelayState::open_subscription`], [`RelayState::close_subscription`]):
//! they touch its connection and hand the engine the message and the EOSE
//! deadline through [`Ctx`]. The engine's part is the order: pages, then
//! negentropy or REQ for each packed chunk, then the live set.

use log::debug;
use nostr::prelude::Timestamp;

use super::built_chunk::BuiltChunk;
use super::connection::LiveMode;
use super::ctx::Ctx;
use super::limits::REQ_OVERHEAD;
use super::relay::{Link, RelayState};
use super::{ConnTimer, Engine};
use crate::sans_io::memory::index::RelayId;
use crate::sans_io::query::filters::{
    Encoded, chunk_filters_encoded, close_message, req_message_encoded, self_filter,
};
use crate::sans_io::query::subscription::{
    NextPage, PageFilter, Purpose, Scope, Subscription, WorkRef,
};
use crate::sans_io::timing::time::Time;

impl Engine {
    /// Starts as much queued historic work on `relay` as its limits allow.
    pub(super) fn schedule(&mut self, relay: RelayId, now: Time) {
        self.open_next_pages(relay, now);
        self.recount_ids(relay);
        while let Some(by_req) = self.relays[relay.index()].front_by_req() {
            let neg = !by_req && self.negentropy_usable(relay);
            let (state, mut cx) = self.at(relay);
            if !state.req_room() && !state.evict_live_for_history(&mut cx, now) {
                break;
            }
            if neg && (!self.relays[relay.index()].neg_room() || !self.neg_admit(relay)) {
                break;
            }
            let (state, mut cx) = self.at(relay);
            let (chunks, filters) = state.take_packed_chunks(&cx);
            if neg {
                self.start_neg_job(relay, chunks, filters, now);
                continue;
            }
            state.open_history(&mut cx, chunks, filters, now);
        }
        self.maybe_consolidate(relay, now);
    }

    /// Opens waiting follow-up pages as far as the subscription limit
    /// allows (`RelayState::take_next_page`); a saturated second's page
    /// starts a negentropy job instead.
    fn open_next_pages(&mut self, relay: RelayId, now: Time) {
        loop {
            let (state, mut cx) = self.at(relay);
            let Some(mut next) = state.take_next_page(&mut cx, now) else {
                return;
            };
            if let Some(sat) = next.reconcile.take() {
                self.start_second_job(relay, sat, next.scope, next.work, next.started, now);
                continue;
            }
            state.open_page(&mut cx, next, now);
        }
    }

    /// The own relay's self-subscription.
    pub(super) fn subscribe_self(&mut self, since: Option<Timestamp>, now: Time) {
        self.self_since = since;
        let (state, mut cx) = self.at(self.own);
        let filters = vec![Encoded::new(self_filter(since).limit(state.page_limit()))];
        let (live, own) = (Purpose::Live, Scope::Own);
        state.open_subscription(&mut cx, filters, live, own, Vec::new(), 1, now, now);
    }

    /// Consolidates once confirmed items lack live coverage
    /// (`RelayState::consolidation_due`).
    pub(super) fn maybe_consolidate(&mut self, relay: RelayId, now: Time) {
        let (state, mut cx) = self.at(relay);
        if state.consolidation_due(&mut cx, now) {
            self.consolidate(relay, now);
        }
    }

    /// Re-covers the live set (`RelayState::consolidate`), then starts
    /// the history it left room for.
    pub(super) fn consolidate(&mut self, relay: RelayId, now: Time) {
        let (state, mut cx) = self.at(relay);
        if state.consolidate(&mut cx, now) {
            self.schedule(relay, now);
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

/// A relay's subscriptions: opened, closed, and history packed into them.
impl RelayState {
    /// The `limit` to ask the relay per filter.
    pub(super) fn page_limit(&self) -> usize {
        self.facts.limits.page_limit
    }

    /// Whether queued history may start now (connected, a chunk queued,
    /// history not paused after a refusal); if so, whether its front chunk
    /// must go by REQ: its batch fell back from negentropy, or it is a
    /// suspect of a refused value (only a REQ's answer clears it: a relay
    /// may take in NEG-OPEN what it refuses in a REQ, and the live set
    /// would be refused again).
    pub(super) fn front_by_req(&self) -> Option<bool> {
        let conn = self.conn().filter(|c| c.paused_until.is_none())?;
        let front = conn.flight()?.work.front()?;
        let bypass = conn.flight()?.neg_bypass.contains(&front.batch);
        Some(bypass || self.facts.bad_values.any_suspect(&front.items))
    }

    /// The next follow-up page, taken off its queue if it may open now.
    /// A page chain continuing from a live subscription holds one slot
    /// more than the chain before it. A page of historic work may take a
    /// live subscription's slot; a page continuing a live set's own
    /// look-back may not: the consolidation that re-covers an evicted live
    /// subscription would read the same window again and ask the same
    /// page, forever. It waits for the next free slot instead.
    fn take_next_page(&mut self, cx: &mut Ctx, now: Time) -> Option<NextPage> {
        self.split_front_page();
        let conn = self.conn().filter(|c| c.paused_until.is_none())?;
        let next = conn.flight()?.next_pages.front()?;
        let may_evict = !next.work.is_empty();
        if next.reconcile.is_some() {
            if !self.neg_room() {
                return None;
            }
        } else if !(self.req_room() || may_evict && self.evict_live_for_history(cx, now)) {
            return None;
        }
        self.conn_mut()?.flight_mut()?.next_pages.pop_front()
    }

    /// Splits the first follow-up page into REQs the relay takes, if it
    /// carries more filters than the relay's limit: pages queued before a
    /// refusal lowered it would each be refused in turn. Each part is a
    /// chain of its own, so the page's chunks wait for them all.
    fn split_front_page(&mut self) {
        let limit = self.facts.limits.filters_per_req;
        let Some(flight) = self.conn_mut().and_then(|c| c.flight_mut()) else {
            return;
        };
        if flight
            .next_pages
            .front()
            .is_none_or(|p| p.filters.len() <= limit)
        {
            return;
        }
        let Some(page) = flight.next_pages.pop_front() else {
            return;
        };
        let parts = self.pack_windows(page.filters);
        let Some(flight) = self.conn_mut().and_then(|c| c.flight_mut()) else {
            return;
        };
        flight.add_chains(&page.work, parts.len().saturating_sub(1) as u32);
        for filters in parts.into_iter().rev() {
            flight.next_pages.push_front(NextPage {
                filters,
                scope: page.scope,
                work: page.work.clone(),
                page: page.page,
                started: page.started,
                reconcile: None,
            });
        }
    }

    /// When live subscriptions fill the relay's whole budget and history
    /// is waiting, history would never run: close one live subscription
    /// and let the next consolidation re-cover its gap with `since`.
    fn evict_live_for_history(&mut self, cx: &mut Ctx, now: Time) -> bool {
        let Some(conn) = self.conn() else {
            return false;
        };
        if conn.subs.values().any(|s| s.purpose == Purpose::Page) {
            return false;
        }
        let eosed = conn.subs.iter().filter(|(_, s)| s.eose);
        let Some(id) = eosed.map(|(id, _)| id).min() else {
            return false;
        };
        debug!("{}: live subscription {id:x} yields to history", cx.url());
        if let Some(sub) = self.close_subscription(cx, id) {
            let lost = if sub.eose { now } else { sub.started.min(now) };
            self.coverage.gap_from(lost);
        }
        true
    }

    /// Pops queued chunks that fit in one REQ (at least one chunk). Each
    /// chunk's filters are built and serialized once: the one that did not
    /// fit is kept for the next REQ.
    fn take_packed_chunks(&mut self, cx: &Ctx) -> (Vec<WorkRef>, Vec<Encoded>) {
        let limits = self.facts.limits;
        let (limit, size) = (limits.page_limit, limits.chunk_size(cx.config.chunk_size));
        let Link::Up(conn) = &mut self.link else {
            return (Vec::new(), Vec::new());
        };
        let Some(flight) = conn.flight_mut() else {
            return (Vec::new(), Vec::new());
        };
        let bad = &self.facts.bad_values;
        flight.split_front_chunk(size);
        let mut chunks: Vec<WorkRef> = Vec::new();
        let mut filters: Vec<Encoded> = Vec::new();
        let mut bytes = REQ_OVERHEAD;
        let mut built = flight.built_front.take();
        while let Some(work) = flight.work.get(chunks.len()) {
            // A chunk suspected of a refused value goes alone: strfry
            // refuses a whole REQ for one value.
            if !chunks.is_empty() && bad.any_suspect(&work.items) {
                break;
            }
            let more = match built.take() {
                Some(b) if b.limit == limit && b.work == *work => b.filters,
                _ => chunk_filters_encoded(cx.index, &work.items, None, limit),
            };
            let more_bytes: usize = more.iter().map(|f| f.json.len() + 1).sum();
            let fits = filters.len() + more.len() <= limits.filters_per_req
                && bytes + more_bytes <= limits.message_bytes;
            if !chunks.is_empty() && !fits {
                let (work, filters) = (work.clone(), more);
                flight.built_front = Some(BuiltChunk {
                    work,
                    limit,
                    filters,
                });
                break;
            }
            bytes += more_bytes;
            filters.extend(more);
            chunks.push(work.clone());
            if bad.any_suspect(&chunks[0].items) {
                break;
            }
        }
        flight.work.drain(..chunks.len());
        (chunks, filters)
    }

    /// Opens follow-up page `next` of a chain, which keeps what the
    /// page before it returned (`Subscription::set_previous`).
    fn open_page(&mut self, cx: &mut Ctx, next: NextPage, now: Time) {
        let encoded = next.filters.iter().map(|p| Encoded::new(p.filter.clone()));
        let (scope, page, started) = (next.scope, next.page, next.started);
        let filters = encoded.collect();
        let (purpose, work) = (Purpose::Page, next.work);
        let id = self.open_subscription(cx, filters, purpose, scope, work, page, started, now);
        if let Some(s) = self.conn_mut().and_then(|c| c.subs.get_mut(id)) {
            s.set_previous(&next.filters);
        }
    }

    /// Opens one REQ of packed history: kept open as a live subscription
    /// if the live set has room (`purpose_for`), else a page.
    fn open_history(
        &mut self,
        cx: &mut Ctx,
        chunks: Vec<WorkRef>,
        filters: Vec<Encoded>,
        now: Time,
    ) {
        if let Some(flight) = self.conn_mut().and_then(|c| c.flight_mut()) {
            for w in &chunks {
                flight.neg_bypass.remove(&w.batch);
            }
        }
        let purpose = self.purpose_for(cx, filters.len());
        if purpose == Purpose::Page {
            self.mark_uncovered(now);
        }
        let covers = (purpose == Purpose::Live).then(|| {
            let items = chunks.iter().flat_map(|w| w.items.iter().copied());
            items.collect()
        });
        let scope = Scope::Exact;
        self.open_until_probe(cx, now);
        let id = self.open_subscription(cx, filters, purpose, scope, chunks, 1, now, now);
        self.set_cover(id, covers, false);
    }

    /// Opens the relay's `until` probe (`ResultCap::until_probe`) as a REQ
    /// of its own just before a history REQ, where one is due and a
    /// subscription slot is left beside that REQ: a relay answering in
    /// order answers it first, so the history REQ's full pages may split
    /// at once. Inside the history REQ it would share that REQ's cut on a
    /// relay capping per REQ, and its accounting.
    fn open_until_probe(&mut self, cx: &mut Ctx, now: Time) {
        if !self.req_room_beside(1) {
            return;
        }
        let Some(probe) = self.facts.result_cap.until_probe() else {
            return;
        };
        let page = PageFilter::until_probe(probe.clone());
        let (purpose, scope) = (Purpose::Page, Scope::Exact);
        let filters = vec![Encoded::new(probe)];
        let id = self.open_subscription(cx, filters, purpose, scope, Vec::new(), 1, now, now);
        if let Some(s) = self.conn_mut().and_then(|c| c.subs.get_mut(id)) {
            s.set_previous(&[page]);
        }
    }

    /// A new historic REQ stays open for live events when the relay's live
    /// set is per-id, no consolidation is waiting, and it fits the threshold
    /// and half the subscription budget (the other half is for history).
    fn purpose_for(&self, cx: &Ctx, filters: usize) -> Purpose {
        let Some(conn) = self.conn() else {
            return Purpose::Page;
        };
        let live_subs = conn.live_subs().count();
        let fits = conn.live_mode == LiveMode::PerId
            && !conn.flight().is_some_and(|f| f.consolidating)
            && self.coverage.gap().is_none()
            && conn.live_filter_count() + filters <= cx.config.consolidation_threshold
            && live_subs < (self.facts.limits.subscriptions / 2).max(1);
        if fits { Purpose::Live } else { Purpose::Page }
    }

    /// Sends a REQ and records the subscription, with an EOSE deadline of
    /// its own from when it is sent: a long chain of pages must not time
    /// out its later pages on arrival.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn open_subscription(
        &mut self,
        cx: &mut Ctx,
        filters: Vec<Encoded>,
        purpose: Purpose,
        scope: Scope,
        work: Vec<WorkRef>,
        page: u32,
        started: Time,
        now: Time,
    ) -> u64 {
        let id = cx.next_sub_id();
        let message = req_message_encoded(&format!("{id:x}"), &filters);
        let filters = filters.into_iter().map(|f| f.filter).collect();
        cx.stats.reqs_sent += 1;
        if let Some(conn) = self.conn_mut() {
            let sub = Subscription::new(filters, purpose, scope, work, page, started);
            conn.subs.insert(id, sub);
        }
        cx.send(message);
        let timer = self.arm(cx, now + cx.config.eose_timeout, ConnTimer::EoseTimeout(id));
        if let Some(sub) = self.conn_mut().and_then(|c| c.subs.get_mut(id)) {
            sub.eose_timer = timer;
            sub.sent = now;
        }
        id
    }

    /// Sends CLOSE for a subscription and forgets it.
    pub(super) fn close_subscription(&mut self, cx: &mut Ctx, id: u64) -> Option<Subscription> {
        let sub = self.conn_mut()?.subs.remove(id)?;
        if let Some(timer) = sub.eose_timer {
            cx.cancel(timer);
        }
        cx.send(close_message(&format!("{id:x}")));
        Some(sub)
    }

    /// Sends CLOSE for every subscription.
    pub(super) fn close_all_subscriptions(&mut self, cx: &mut Ctx) {
        let ids: Vec<u64> = self.conn().map_or(Vec::new(), |c| c.subs.ids().collect());
        for id in ids {
            self.close_subscription(cx, id);
        }
    }
}
