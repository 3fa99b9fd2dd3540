//! One relay as an operator sees it: the figures the status page and the
//! first sync's progress are made of, read off the relay's state when
//! asked (`RelayState::view`, `RelayState::item_counts`).
//!
//! Most of it is state the other aspects keep anyway (status, health,
//! limits, items); the rest are four small per-relay records the aspects
//! feed through the `note_*` functions here: events received and handed
//! to the sink, refusals, when the last event came, and whether the
//! relay's first history was read to its end. Each per-relay counter adds
//! up, over every relay, to the engine counter of the same name in
//! [`Stats`](super::Stats), so the status page and `/metrics` agree.

use super::connection::LiveMode;
use super::ctx::Ctx;
use super::relay::{Facts, RelayState, Role};
use super::targets::ItemState;
use super::{Engine, ItemCounts, Status};
use crate::sans_io::memory::index::RelayId;
use crate::sans_io::timing::health::{BackoffPolicy, Health};
use crate::sans_io::timing::time::Time;

/// What the engine knows of one relay, for a status page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayView {
    /// Connection status.
    pub status: Status,
    /// Health at the time asked.
    pub health: Health,
    /// Failed connects or lost connections in a row.
    pub failures: u32,
    /// While disconnected and backing off: when the next attempt may start.
    pub retry_at: Option<Time>,
    /// While connected and refusing: when REQs may go out again (after a
    /// `rate-limited:` refusal, or one at a limit already at its floor).
    /// Until then what the refused REQs covered is not read live.
    pub paused_until: Option<Time>,
    /// When the current or last connection began.
    pub last_connected: Option<Time>,
    /// When the last connection ended (`None` while connected).
    pub disconnected_at: Option<Time>,
    /// Its first history was read to the end (or it had none to read):
    /// stays true for the process's life, daily re-reads included.
    pub first_history_done: bool,
    /// Nothing is waiting to be read now: connected, every targeted item
    /// confirmed (or unaskable), no batch pending.
    pub history_done: bool,
    /// Items (repos, roots) it is asked for, per state.
    pub items: ItemCounts,
    /// Subscriptions open (historic pages and live sets).
    pub subscriptions_open: usize,
    /// Filters of its live subscriptions.
    pub live_filters: usize,
    /// Live traffic is one wide filter matched locally, not per-id filters.
    pub live_wide: bool,
    /// What it taught us of its limits (or ours, where it taught nothing).
    pub limits: LimitsView,
    /// NIP-77: `None` not tried yet, else whether it speaks it.
    pub negentropy: Option<bool>,
    /// Penalties for misbehaving.
    pub penalties: u32,
    /// EVENT messages received from it.
    pub events_received: u64,
    /// Events from it handed to the sink (new, verified, wanted).
    pub events_ingested: u64,
    /// Subscriptions it refused or closed.
    pub refusals: u64,
    /// When the last EVENT came from it.
    pub last_event_at: Option<Time>,
    /// A bootstrap relay (configured, kept connected without targets).
    pub bootstrap: bool,
}

/// A relay's limits as the engine applies them now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitsView {
    /// REQs open at once.
    pub subscriptions: usize,
    /// Filters per REQ.
    pub filters_per_req: usize,
    /// `limit` asked per filter.
    pub page_limit: usize,
    /// Stored events it returns per filter, where a cut page proved it
    /// (this connection, or an earlier one as a hint).
    pub result_cap: Option<usize>,
    /// The most events one filter got in one page.
    pub result_floor: usize,
    /// Tag values per filter.
    pub tag_values: usize,
    /// Kinds per filter; `None`: no limit learnt.
    pub kinds: Option<usize>,
    /// Bytes of one tag value; `None`: no limit learnt.
    pub value_bytes: Option<usize>,
    /// Bytes of one message we send.
    pub message_bytes: usize,
}

/// One relay's figures, read off its state when asked.
impl RelayState {
    /// The relay as a status page shows it at `now` (`policy` judges its
    /// health). O(its items).
    pub(super) fn view(&self, now: Time, policy: &BackoffPolicy) -> RelayView {
        let items = self.item_counts();
        let history_done =
            self.status() == Status::Connected && items.queued == 0 && items.pending == 0;
        let (facts, conn) = (&self.facts, self.conn());
        RelayView {
            status: self.status(),
            health: facts.health.health(now, policy),
            failures: facts.health.failures(),
            retry_at: self.retry_at().filter(|&t| t > now),
            paused_until: conn.and_then(|c| c.paused_until).filter(|&t| t > now),
            last_connected: facts.last_connected,
            disconnected_at: facts.disconnected_at,
            first_history_done: facts.notes.first_history_done || history_done,
            history_done,
            items,
            subscriptions_open: conn.map_or(0, |c| c.subs.len()),
            live_filters: conn.map_or(0, |c| c.live_filter_count()),
            live_wide: conn.is_some_and(|c| c.live_mode == LiveMode::Wide),
            limits: facts.limits_view(),
            negentropy: facts.neg.known(),
            penalties: facts.conduct.penalties(),
            events_received: facts.notes.events_received,
            events_ingested: facts.notes.events_ingested,
            refusals: facts.notes.refusals,
            last_event_at: facts.notes.last_event_at,
            bootstrap: facts.role == Role::Remote { bootstrap: true },
        }
    }

    /// Its items per state; a queued item it cannot be asked for counts
    /// as unaskable, not queued.
    pub(super) fn item_counts(&self) -> ItemCounts {
        let (queued, pending, confirmed) = self.targets.counts();
        let unaskable = self
            .facts
            .bad_values
            .unaskable()
            .filter(|i| {
                self.targets
                    .items
                    .get(i)
                    .is_some_and(|s| s.state == ItemState::Queued)
            })
            .count();
        ItemCounts {
            queued: queued - unaskable,
            pending,
            confirmed,
            unaskable,
        }
    }

    /// A batch was confirmed: if none is left and nothing waits to be
    /// asked, its first history is read. The scan of its items runs only
    /// when its last batch ends, and never once it is done.
    pub(super) fn note_batch_confirmed(&mut self) {
        let pending = self.conn().is_some_and(|c| c.batches() > 0);
        if self.facts.notes.first_history_done || pending {
            return;
        }
        self.facts.notes.first_history_done = nothing_waits(self);
    }

    /// The relay refused or closed a subscription (`Stats::refusals`).
    pub(super) fn note_refusal(&mut self, cx: &mut Ctx) {
        cx.stats.refusals += 1;
        self.facts.notes.refusals += 1;
    }
}

impl Facts {
    /// The limits applied now: what the relay taught us, or ours.
    fn limits_view(&self) -> LimitsView {
        let limits = &self.limits;
        let cap = self.result_cap.for_saving();
        let bounded = |v: usize| (v != usize::MAX).then_some(v);
        LimitsView {
            subscriptions: limits.subscriptions,
            filters_per_req: limits.filters_per_req,
            page_limit: limits.page_limit,
            result_cap: cap.proven,
            result_floor: cap.floor,
            tag_values: limits.tag_values,
            kinds: bounded(limits.kinds),
            value_bytes: bounded(limits.value_bytes),
            message_bytes: limits.message_bytes,
        }
    }
}

impl Engine {
    /// True once the own relay's announcements and roots have been read
    /// to their end (the self-subscription's first EOSE), or when the
    /// engine does not read them (an embedder feeds them), and no batch
    /// window holds some still: until then, the relays known are not all
    /// the relays there are.
    pub(super) fn own_index_read(&self) -> bool {
        (!self.config.self_subscribe || self.self_since.is_some()) && !self.batching.is_open()
    }

    /// An EVENT came from `relay` (counted in `Stats::events_received`).
    pub(super) fn note_event(&mut self, relay: RelayId, now: Time) {
        let notes = &mut self.relay(relay).facts.notes;
        notes.events_received += 1;
        notes.last_event_at = Some(now);
    }

    /// An event from `relay` went to the sink (`Stats::events_ingested`).
    pub(super) fn note_ingested(&mut self, relay: RelayId) {
        self.relay(relay).facts.notes.events_ingested += 1;
    }
}

/// Every targeted item of `state` is confirmed or cannot be asked.
fn nothing_waits(state: &RelayState) -> bool {
    state.targets.items.iter().all(|(item, slot)| {
        slot.state == ItemState::Confirmed
            || (slot.state == ItemState::Queued && state.facts.bad_values.is_unaskable(item))
    })
}
