//! The relay table: per relay, what is confirmed, what is in flight, and the
//! connection it rides on.
//!
//! Each targeted item of a relay has exactly one state — queued, pending in
//! one batch, or confirmed — so "pending and confirmed overlap" cannot be
//! represented. An item exists in a relay's map only while the index
//! targets it there (`refs` counts the repos that make it a target), so
//! "confirmed but not targeted" cannot be represented either.
//!
//! [`RelayState`] is also where the aspects' per-relay state meets: it holds
//! `auth`'s [`Auth`], `conduct`'s [`Conduct`] and `negentropy`'s jobs,
//! so those modules own their types and this one only aggregates them
//! (they never import it back).

use std::collections::{HashMap, HashSet, VecDeque};

use super::Status;
use super::auth::Auth;
use super::built_chunk::BuiltChunk;
use super::conduct::Conduct;
use super::negentropy::{NegJob, NegSupport};
use super::sub_table::SubTable;
use crate::sans_io::memory::index::Item;
use crate::sans_io::query::refusal::Refusal;
use crate::sans_io::query::result_cap::ResultCap;
use crate::sans_io::query::subscription::{
    NextPage, Purpose, Saturated, Scope, Subscription, WorkRef,
};
use crate::sans_io::timing::health::HealthTracker;
use crate::sans_io::timing::silence::SilenceGrace;
use crate::sans_io::timing::time::Time;

/// Where a targeted item stands on one relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemState {
    /// Wanted, not yet asked (the three-way diff's "new").
    Queued,
    /// Asked in the pending batch with this id.
    Pending(u64),
    /// History fetched to EOSE; live events follow.
    Confirmed,
}

/// What a relay is to us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// The relay we sync into (self-subscription).
    Own,
    /// A relay we sync from; bootstrap relays are never dropped.
    Remote {
        /// Configured by the operator; kept connected without targets.
        bootstrap: bool,
    },
}

/// How a relay's live traffic is covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LiveMode {
    /// Per-id filters for every confirmed item.
    PerId,
    /// One kind-based filter matched locally (per-id filters would not fit).
    Wide,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub refs: u32,
    pub state: ItemState,
    /// When the item was last confirmed, in Unix seconds rounded up (0
    /// for one confirmed before a restart): a save claims it only if the
    /// sink confirmed every event received before then (`resume`). Kept
    /// in what was the struct's padding.
    pub confirmed_at: u32,
}

impl Slot {
    /// A new target: confirmed already if `restored` (a saved claim
    /// from before the restart), else queued.
    pub(super) fn new(restored: bool) -> Slot {
        Slot {
            refs: 0,
            state: if restored {
                ItemState::Confirmed
            } else {
                ItemState::Queued
            },
            confirmed_at: 0,
        }
    }

    /// The item's history was fetched to its end at `now`.
    pub(super) fn confirm(&mut self, now: Time) {
        self.state = ItemState::Confirmed;
        let secs = now.as_millis().div_ceil(1000);
        self.confirmed_at = u32::try_from(secs).unwrap_or(u32::MAX);
    }

    /// True when every event received before the item was confirmed had
    /// been taken by the sink, if the oldest it has not taken was
    /// received at `unsettled` (`None`: it took everything).
    pub(super) fn settled(&self, unsettled: Option<Time>) -> bool {
        let confirmed = Time::from_secs(u64::from(self.confirmed_at));
        self.state == ItemState::Confirmed && unsettled.is_none_or(|t| confirmed < t)
    }
}

/// Items of one pending batch and how many of its chunks are still fetching.
#[derive(Debug)]
pub(super) struct Batch {
    pub items: Vec<Item>,
    pub chunks_left: u32,
    /// When the batch was made, before any of its REQs: history was read
    /// up to at least then, so live coverage must reach back to it.
    pub started: Time,
}

/// Limits of one relay, lowered when it refuses.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// REQs open at once.
    pub subscriptions: usize,
    /// NIP-77 sessions open at once. strfry counts them apart from REQs
    /// (each against `maxSubsPerConnection`) and refuses one over it with
    /// its own NOTICE, so each kind has its own limit, learnt apart.
    pub neg_sessions: usize,
    pub filters_per_req: usize,
    pub message_bytes: usize,
    /// `limit` asked per filter: ours, or the relay's NIP-11 `max_limit`.
    pub page_limit: usize,
    /// Values per tag filter (repo refs, root ids) the relay accepts.
    pub tag_values: usize,
    /// Kinds per filter the relay accepts.
    pub kinds: usize,
    /// Bytes of one tag value the relay accepts in a filter (strfry: 255);
    /// an item with a longer value cannot be asked there.
    pub value_bytes: usize,
}

/// Unsure seconds a relay keeps at most; the oldest go first.
pub(super) const MAX_UNSURE: usize = 256;

/// REQs, and negentropy sessions, a relay gets at once while its NIP-11
/// document is on its way.
pub(super) const PROVISIONAL_LIMIT: usize = 4;

/// The smallest message limit a refusal may lower us to.
pub(super) const MIN_MESSAGE_BYTES: usize = 4096;

/// The shortest tag value limit a relay may teach us: a root id is 64 hex
/// characters, and a limit below it would make every root unaskable.
pub(super) const MIN_VALUE_BYTES: usize = 64;

/// Limits a relay stated (its NIP-11 document, or a state file that
/// remembers what it taught us); `None` where it said nothing.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct StatedLimits {
    pub subscriptions: Option<usize>,
    pub filters_per_req: Option<usize>,
    pub message_bytes: Option<usize>,
    pub page_limit: Option<usize>,
    pub tag_values: Option<usize>,
    pub kinds: Option<usize>,
    pub value_bytes: Option<usize>,
}

impl Limits {
    /// Lowers ours to what the relay stated, never raising them (ours are
    /// what we can afford) and never below a usable floor.
    pub(super) fn lower_to(&mut self, stated: StatedLimits) {
        let lower = |ours: &mut usize, theirs: Option<usize>, floor: usize| {
            if let Some(t) = theirs {
                *ours = (*ours).min(t.max(floor));
            }
        };
        lower(&mut self.subscriptions, stated.subscriptions, 1);
        lower(&mut self.neg_sessions, stated.subscriptions, 1);
        lower(&mut self.filters_per_req, stated.filters_per_req, 1);
        lower(
            &mut self.message_bytes,
            stated.message_bytes,
            MIN_MESSAGE_BYTES,
        );
        lower(&mut self.page_limit, stated.page_limit, 1);
        lower(&mut self.tag_values, stated.tag_values, 1);
        lower(&mut self.kinds, stated.kinds, 1);
        lower(&mut self.value_bytes, stated.value_bytes, MIN_VALUE_BYTES);
    }

    /// True when the limit `refusal` names cannot be lowered any further.
    pub(super) fn at_floor(&self, refusal: Refusal) -> bool {
        match refusal {
            Refusal::TooManySubscriptions => self.subscriptions <= 1,
            Refusal::TooManyFilters => self.filters_per_req <= 1,
            Refusal::TooLarge => self.message_bytes <= MIN_MESSAGE_BYTES,
            Refusal::TooManyValues => self.tag_values <= 1,
            Refusal::TooManyKinds => self.kinds <= 1,
            _ => false,
        }
    }
}

/// What the aspects note per relay for its status view (`relay_view`);
/// each counter adds up over all relays to the engine counter it names.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Notes {
    /// `Stats::events_received` from this relay.
    pub events_received: u64,
    /// `Stats::events_ingested` from this relay.
    pub events_ingested: u64,
    /// `Stats::refusals` by this relay.
    pub refusals: u64,
    /// When its last EVENT came.
    pub last_event_at: Option<Time>,
    /// Its first history was read to the end.
    pub first_history_done: bool,
}

/// Everything the engine knows about one relay.
#[derive(Debug)]
pub(super) struct RelayState {
    pub role: Role,
    pub status: Status,
    pub last_connected: Option<Time>,
    pub disconnected_at: Option<Time>,
    /// Live coverage was unbroken up to here when the last connection
    /// ended: a quick reconnect catches up from it.
    pub covered_until: Option<Time>,
    /// When the next daily full sync is due; kept across connections.
    pub daily_due: Option<Time>,
    pub health: HealthTracker,
    /// Offences and penalties (hostile-relay defence).
    pub conduct: Conduct,
    /// NIP-42 on the current connection.
    pub auth: Auth,
    /// NIP-77 support, remembered for the process's life.
    pub neg: NegSupport,
    /// The shell leaves this relay's frames unread (the sink is full):
    /// nothing it answered can be seen, so no session of it is silent.
    pub reads_paused: bool,
    /// Negentropy jobs in flight, by subscription id (each holds a
    /// subscription slot on the relay).
    pub neg_jobs: HashMap<u64, NegJob>,
    /// Batches whose chunks fell back from negentropy: REQ for them.
    pub neg_bypass: HashSet<u64>,
    /// Targeted items and their state.
    pub items: HashMap<Item, Slot>,
    /// Items that became `Queued` since the last diff (may be stale).
    pub queued: Vec<Item>,
    pub batches: HashMap<u64, Batch>,
    /// Chunks of pending batches waiting for a subscription slot.
    pub work: VecDeque<WorkRef>,
    /// Follow-up pages waiting for a subscription slot; they go before
    /// new chunks, so chains finish first.
    pub next_pages: VecDeque<NextPage>,
    /// The front chunk's filters, built for a REQ they did not fit.
    pub built_front: Option<BuiltChunk>,
    pub subs: SubTable,
    pub limits: Limits,
    /// The relay's per-filter result cap, as far as its pages showed it.
    pub result_cap: ResultCap,
    /// NIP-11 document asked (once per process).
    pub info_asked: bool,
    /// The NIP-11 fetch was answered: nothing more will report on it, so
    /// the relay's id may be released.
    pub info_answered: bool,
    pub live_mode: LiveMode,
    /// Confirmed items lack live coverage since this time; the next
    /// consolidation re-subscribes them from before it.
    pub uncovered_since: Option<Time>,
    /// Layer 1 (announcements) was refused before it was read to the end:
    /// the next live set asks it from the beginning.
    pub layer1_unread: bool,
    /// A value or kind refusal heard by NOTICE, which names no
    /// subscription: the next subscription not heard from yet that the
    /// relay answers is the refused one (see `Engine::blame_value_notice`).
    pub value_notice: Option<Refusal>,
    /// Items in a REQ the relay refused for one of its values (strfry's
    /// `filter item too large`), each with the most items its chunk may
    /// hold: halved at each refusal until the offending item stands alone.
    /// A suspect's chunk travels in a REQ of its own. Cleared by an EOSE.
    pub suspects: HashMap<Item, usize>,
    /// Items the relay cannot be asked for: one of their values is refused
    /// alone (or breaks `limits.value_bytes`). Kept out of every chunk and
    /// live filter on this relay for the process's life.
    pub unaskable: HashSet<Item>,
    /// Seconds that may hold more than the relay returned, if it caps as
    /// low as their count (`saturated`): split once a cut that low shows,
    /// dropped once a larger page does. Per connection, at most
    /// [`MAX_UNSURE`].
    pub unsure: Vec<(Saturated, Scope)>,
    /// Waiting for pending batches before consolidating.
    pub consolidating: bool,
    /// Historic work paused (after a refusal) until this time.
    pub paused_until: Option<Time>,
    /// Bumped on every connect and disconnect; timers of an older epoch are stale.
    pub epoch: u32,
    /// Rounds of silent subscriptions taken as unanswered on this
    /// connection (`Engine::on_unanswered`): each doubles the next
    /// suspects' grace.
    pub silence: SilenceGrace,
    /// Last time the relay sent a whole message, or answered our ping (keepalive).
    pub last_heard: Time,
    /// A keepalive ping is out and not answered: only then is a pong news.
    pub pinged: bool,
    /// When the next connect attempt is allowed.
    pub retry_at: Option<Time>,
    /// Historic REQs sent since connect (for metrics and tests).
    pub reqs_sent: u64,
    /// Counters and marks for the status view.
    pub notes: Notes,
}

impl RelayState {
    pub(super) fn new(role: Role, limits: Limits) -> Self {
        RelayState {
            role,
            status: Status::Disconnected,
            last_connected: None,
            disconnected_at: None,
            covered_until: None,
            daily_due: None,
            health: HealthTracker::default(),
            conduct: Conduct::default(),
            auth: Auth::default(),
            neg: NegSupport::default(),
            reads_paused: false,
            neg_jobs: HashMap::new(),
            neg_bypass: HashSet::new(),
            items: HashMap::new(),
            queued: Vec::new(),
            batches: HashMap::new(),
            work: VecDeque::new(),
            next_pages: VecDeque::new(),
            built_front: None,
            subs: SubTable::default(),
            limits,
            result_cap: ResultCap::default(),
            info_asked: false,
            info_answered: false,
            live_mode: LiveMode::PerId,
            uncovered_since: None,
            layer1_unread: false,
            value_notice: None,
            suspects: HashMap::new(),
            unaskable: HashSet::new(),
            unsure: Vec::new(),
            consolidating: false,
            paused_until: None,
            epoch: 0,
            silence: SilenceGrace::default(),
            last_heard: Time::default(),
            pinged: false,
            retry_at: None,
            reqs_sent: 0,
            notes: Notes::default(),
        }
    }

    /// The NIP-11 document was asked and is not answered yet: the relay's
    /// limits may be far below ours.
    pub(super) fn info_pending(&self) -> bool {
        self.info_asked && !self.info_answered
    }

    /// True when one more REQ or job fits the relay's subscription limit
    /// (a conservative one while its NIP-11 document is on its way). Jobs
    /// count too: a relay may count them with its REQs, and a job started
    /// while every REQ slot is taken mostly finds the sink holding
    /// nothing and waits for a slot anyway (ten times the listings, at
    /// 110,000 items).
    pub(super) fn req_room(&self) -> bool {
        self.subs.len() + self.neg_jobs.len() < self.budget(self.limits.subscriptions)
    }

    /// True when one more negentropy job fits: the subscription limit and
    /// the relay's own limit on sessions (strfry counts them apart and
    /// refuses one over it by its own NOTICE).
    pub(super) fn neg_room(&self) -> bool {
        self.req_room() && self.neg_jobs.len() < self.budget(self.limits.neg_sessions)
    }

    /// `limit`, or [`PROVISIONAL_LIMIT`] below it until the relay's NIP-11
    /// document is answered or failed: strfry with `maxSubsPerConnection`
    /// under our 10 refused the excess of the jobs started in the 33 ms
    /// before its document arrived, and the refused ones waited out their
    /// timeout.
    fn budget(&self, limit: usize) -> usize {
        if self.info_pending() {
            limit.min(PROVISIONAL_LIMIT)
        } else {
            limit
        }
    }

    /// Filters of subscriptions kept open for live events.
    pub(super) fn live_filter_count(&self) -> usize {
        self.live_subs().map(|s| s.filter_count).sum()
    }

    pub(super) fn live_subs(&self) -> impl Iterator<Item = &Subscription> {
        self.subs.values().filter(|s| s.purpose == Purpose::Live)
    }

    /// Counts items per state: (queued, pending, confirmed).
    pub(super) fn item_counts(&self) -> (usize, usize, usize) {
        self.items
            .values()
            .fold((0, 0, 0), |(q, p, c), slot| match slot.state {
                ItemState::Queued => (q + 1, p, c),
                ItemState::Pending(_) => (q, p + 1, c),
                ItemState::Confirmed => (q, p, c + 1),
            })
    }

    /// Moves every item in `state`-matching slots back to `Queued`.
    pub(super) fn requeue_where(&mut self, pred: impl Fn(ItemState) -> bool) {
        for (item, slot) in self.items.iter_mut() {
            if pred(slot.state) {
                slot.state = ItemState::Queued;
                self.queued.push(*item);
            }
        }
    }

    /// True if every one of `items` is covered by an open live
    /// subscription of its own.
    /// The set built is the batch's, not the relay's coverage: a first
    /// sync confirms thousands of batches on relays covering thousands of
    /// items each.
    pub(super) fn live_covers_all(&self, items: &[Item]) -> bool {
        let mut left: HashSet<Item> = items.iter().copied().collect();
        for sub in self.live_subs() {
            if left.is_empty() {
                break;
            }
            for item in sub.covers.iter().flatten() {
                left.remove(item);
            }
        }
        left.is_empty()
    }

    /// Items synced without a live subscription of their own (negentropy
    /// fetches by id) need one from the next consolidation, reaching back
    /// to `since`. A wide live filter already covers them.
    pub(super) fn mark_uncovered(&mut self, since: Time) {
        if self.live_mode == LiveMode::PerId {
            self.gap_from(since);
        }
    }

    /// Live coverage has a gap from `since` (the watermark only moves
    /// back): the next consolidation reads it again with `since`.
    pub(super) fn gap_from(&mut self, since: Time) {
        self.uncovered_since = Some(self.uncovered_since.map_or(since, |t| t.min(since)));
    }

    /// Chains still working for each batch: chunks queued, REQs before
    /// their last EOSE, follow-up pages, negentropy jobs. A batch is
    /// confirmed when its count of chains left reaches zero, so the two
    /// must agree: more chains than counted would confirm it while some
    /// are unanswered, fewer would never confirm it.
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn open_chains(&self) -> HashMap<u64, u32> {
        let mut chains: HashMap<u64, u32> = HashMap::new();
        let refs = self
            .work
            .iter()
            .chain(self.subs.values().flat_map(|s| s.work.iter()))
            .chain(self.next_pages.iter().flat_map(|p| p.work.iter()))
            .chain(self.neg_jobs.values().flat_map(|j| j.work().iter()));
        for w in refs {
            *chains.entry(w.batch).or_default() += 1;
        }
        chains
    }

    /// Event ids its negentropy work holds: found missing by its jobs, and
    /// waiting in `ids` pages for a subscription slot (`IdBudget`).
    pub(super) fn ids_in_hand(&self) -> usize {
        let jobs: usize = self.neg_jobs.values().map(NegJob::ids_held).sum();
        let pages = self.next_pages.iter().flat_map(|p| &p.filters);
        let asked = pages
            .filter_map(|f| f.filter.ids.as_ref())
            .map(|ids| ids.len());
        jobs + asked.sum::<usize>()
    }

    /// Gives back the room a burst left in its collections (a first sync's
    /// dozens of subscriptions, batches and queued chunks) once they hold
    /// little again. Collections keep their largest size otherwise: at
    /// thousands of relays that was most of an idle relay's memory.
    pub(super) fn shrink_to_fit(&mut self) {
        self.subs.shrink_to_fit();
        self.neg_jobs.shrink_to_fit();
        self.neg_bypass.shrink_to_fit();
        self.batches.shrink_to_fit();
        self.queued.shrink_to_fit();
        self.work.shrink_to_fit();
        self.next_pages.shrink_to_fit();
    }

    /// Forgets everything in flight: batches, queued chunks, subscriptions,
    /// negentropy jobs (how many it dropped is returned, for
    /// `Engine::neg_jobs_dropped`). Pending items go back to `Queued`.
    pub(super) fn clear_in_flight(&mut self) -> usize {
        let jobs = self.neg_jobs.len();
        self.requeue_where(|s| matches!(s, ItemState::Pending(_)));
        self.batches.clear();
        self.work.clear();
        self.next_pages.clear();
        self.built_front = None;
        self.subs.clear();
        self.neg_jobs.clear();
        self.neg_bypass.clear();
        self.value_notice = None;
        self.unsure = Vec::new();
        self.consolidating = false;
        self.uncovered_since = None;
        jobs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sans_io::query::subscription::{Purpose, Scope, Subscription};

    /// An item's confirmation time costs no memory: it sits in what was
    /// the slot's padding (relays times items can be millions of slots).
    #[test]
    fn a_slot_stays_24_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 24);
    }

    #[test]
    fn a_burst_gives_its_room_back() {
        let limits = Limits {
            subscriptions: 64,
            neg_sessions: 64,
            filters_per_req: 10,
            message_bytes: 65_536,
            page_limit: 500,
            tag_values: 100,
            kinds: 100,
            value_bytes: 1024,
        };
        let mut state = RelayState::new(Role::Remote { bootstrap: false }, limits);
        for id in 0..64 {
            let sub = Subscription::new(
                Vec::new(),
                Purpose::Page,
                Scope::Targets,
                Vec::new(),
                1,
                Time::default(),
            );
            state.subs.insert(id, sub);
        }
        for id in 1..64 {
            state.subs.remove(id);
        }
        assert!(state.subs.capacity() >= 64, "a map keeps its room");
        state.shrink_to_fit();
        assert!(state.subs.capacity() < 8, "{}", state.subs.capacity());
        assert!(state.subs.get(0).is_some(), "and its contents");
    }
}
