//! What lives and dies with one socket to a relay: its subscriptions,
//! NIP-42 state, keepalive, paused reads, and the history work in flight
//! on it. A disconnect drops the whole [`Connection`]; nothing in it
//! needs resetting, and no timer of it can fire into the next one (its
//! `generation` is in every timer it arms). What must survive the socket
//! is handed back by `RelayState::end_connection`: the coverage watermark
//! and the pending items, back to queued.
//!
//! The aspects own the types held here (`auth`'s [`Auth`], `nip77`'s
//! jobs, `sub_table`'s table); this module aggregates them, and owns the
//! steps that touch only the connection: the keepalive and its pong,
//! paused reads, the round of silent suspects, which negentropy sessions
//! are open, and how work a job gives back or finds goes into the
//! [`Flight`]'s queues.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use super::auth::Auth;
use super::built_chunk::BuiltChunk;
use super::neg_job::NegJobs;
use super::saturated::Unsure;
use super::sub_table::SubTable;
use crate::sans_io::memory::index::Item;
use crate::sans_io::query::refusal::Refusal;
use crate::sans_io::query::subscription::{
    NextPage, PageFilter, Purpose, Saturated, Scope, Subscription, WorkRef,
};
use crate::sans_io::timing::silence::SilenceGrace;
use crate::sans_io::timing::time::Time;
use nostr::prelude::Filter;

/// How a relay's live traffic is covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LiveMode {
    /// Per-id filters for every confirmed item.
    PerId,
    /// One kind-based filter matched locally (per-id filters would not fit).
    Wide,
}

/// What a connection's keepalive check finds (`Connection::keepalive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keepalive {
    /// Heard from lately: check again at `next`.
    Heard { next: Time },
    /// Silent too long: ping it, and check again at `next`.
    Ping { next: Time },
    /// Silent through the ping's grace too: the connection is dead.
    Dead { silent: Duration },
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

/// One open connection to a relay.
#[derive(Debug)]
pub(super) struct Connection {
    /// Unique over the engine's life: timers armed for this connection
    /// carry it, and fire only while it is the relay's connection.
    pub generation: u32,
    /// NIP-42 on this connection.
    pub auth: Auth,
    /// Rounds of silent subscriptions taken as unanswered on this
    /// connection (`RelayState::unanswered`): each doubles the next
    /// suspects' grace.
    pub silence: SilenceGrace,
    /// Last time the relay sent a whole message, or answered our ping.
    pub last_heard: Time,
    /// A keepalive ping is out and not answered: only then is a pong news.
    pinged: bool,
    /// The shell leaves this relay's frames unread (the sink is full):
    /// nothing it answered can be seen, so no session of it is silent.
    reads_paused: bool,
    /// Historic work paused (after a refusal) until this time.
    pub paused_until: Option<Time>,
    /// How the live set of this connection covers the relay.
    pub live_mode: LiveMode,
    pub subs: SubTable,
    /// Seconds that may hold more than the relay returned, if it caps as
    /// low as their count (`saturated`): split once a cut that low shows,
    /// dropped once a larger page does. At most `saturated::MAX_UNSURE`; they
    /// outlive the history that found them, until the connection shows
    /// the relay's cap.
    pub unsure: Vec<Unsure>,
    /// History being fetched; none while the connection is idle, so an
    /// idle connection holds none of its queues (`Connection::settle`).
    flight: Option<Box<Flight>>,
}

/// The history work in flight on a connection: what a daily sync starts
/// over, and what a disconnect drops.
#[derive(Debug, Default)]
pub(super) struct Flight {
    pub batches: HashMap<u64, Batch>,
    /// Chunks of pending batches waiting for a subscription slot.
    pub work: VecDeque<WorkRef>,
    /// Follow-up pages waiting for a subscription slot; they go before
    /// new chunks, so chains finish first.
    pub next_pages: VecDeque<NextPage>,
    /// The front chunk's filters, built for a REQ they did not fit.
    pub built_front: Option<BuiltChunk>,
    /// Negentropy jobs in flight, by subscription id (each holds a
    /// subscription slot on the relay).
    pub neg_jobs: NegJobs,
    /// Batches whose chunks fell back from negentropy: REQ for them.
    pub neg_bypass: HashSet<u64>,
    /// NOTICEs refusing a session for the relay's limit, which name none,
    /// not yet tied to the sessions they refused
    /// (`RelayState::settle_refusals`).
    pub neg_refused: usize,
    /// A value or kind refusal heard by NOTICE, which names no
    /// subscription: the next subscription not heard from yet that the
    /// relay answers is the refused one (see `RelayState::blame_value_notice`).
    pub value_notice: Option<Refusal>,
    /// Waiting for pending batches before consolidating.
    pub consolidating: bool,
}

impl Flight {
    /// Nothing in flight, nothing waiting: the connection may let it go.
    fn is_idle(&self) -> bool {
        self.batches.is_empty()
            && self.work.is_empty()
            && self.next_pages.is_empty()
            && self.built_front.is_none()
            && self.neg_jobs.is_empty()
            && self.neg_bypass.is_empty()
            && self.value_notice.is_none()
            && !self.consolidating
    }

    /// A chunk queued before the relay refused that many tag values is
    /// split to the relay's chunk `size`, so no REQ repeats what it refused.
    pub(super) fn split_front_chunk(&mut self, size: usize) {
        if self.work.front().is_none_or(|w| w.items.len() <= size) {
            return;
        }
        let Some(work) = self.work.pop_front() else {
            return;
        };
        let parts = work.items.chunks(size).map(|items| WorkRef {
            batch: work.batch,
            items: items.to_vec(),
        });
        let parts: Vec<WorkRef> = parts.collect();
        if let Some(b) = self.batches.get_mut(&work.batch) {
            b.chunks_left += parts.len() as u32 - 1;
        }
        for part in parts.into_iter().rev() {
            self.work.push_front(part);
        }
    }
}

/// Work given back to the queues: by a negentropy job, or found by one.
impl Flight {
    /// `n` more chains complete each chunk of `work`: its batch waits for
    /// them all.
    pub(super) fn add_chains(&mut self, work: &[WorkRef], n: u32) {
        for w in work {
            if let Some(b) = self.batches.get_mut(&w.batch) {
                b.chunks_left += n;
            }
        }
    }

    /// Chunks a negentropy job gave back go to the front of the queue, in
    /// their order: `for_req` marks their batches for REQ (the job
    /// failed), else they wait for negentropy again (the relay's limit on
    /// sessions was full).
    pub(super) fn requeue_chunks(&mut self, work: Vec<WorkRef>, for_req: bool) {
        if for_req {
            self.neg_bypass.extend(work.iter().map(|w| w.batch));
        }
        for w in work.into_iter().rev() {
            self.work.push_front(w);
        }
    }

    /// A saturated second's job waits for negentropy room again, first of
    /// the follow-up pages, for the chain that found it (`work`, started
    /// at `started`).
    pub(super) fn requeue_second(
        &mut self,
        (sat, scope): (Saturated, Scope),
        work: Vec<WorkRef>,
        started: Time,
    ) {
        self.next_pages.push_front(NextPage {
            filters: Vec::new(),
            scope,
            work,
            page: 1,
            started,
            reconcile: Some(sat),
        });
    }

    /// Queues one `ids` REQ per filter of `filters` (what negentropy found
    /// missing) as follow-up pages of chunks `work`, started at `started`.
    /// Each completes the chunks once, so their batches wait for `extra`
    /// more completions.
    pub(super) fn fetch_pages(
        &mut self,
        work: &[WorkRef],
        filters: impl Iterator<Item = Filter>,
        started: Time,
        extra: u32,
    ) {
        self.add_chains(work, extra);
        for filter in filters {
            self.next_pages.push_back(NextPage {
                filters: vec![PageFilter::first(filter)],
                scope: Scope::Exact,
                work: work.to_vec(),
                page: 1,
                started,
                reconcile: None,
            });
        }
    }
}

impl Connection {
    /// A connection just opened at `now`.
    pub(super) fn new(generation: u32, now: Time) -> Connection {
        Connection {
            generation,
            auth: Auth::default(),
            silence: SilenceGrace::default(),
            last_heard: now,
            pinged: false,
            reads_paused: false,
            paused_until: None,
            live_mode: LiveMode::PerId,
            subs: SubTable::default(),
            unsure: Vec::new(),
            flight: None,
        }
    }

    /// A pong answers our keepalive ping, once: it is a sign of life only
    /// while a ping is out. Unsolicited pongs are no progress: a relay
    /// could otherwise hold a never-finished message (and our memory for
    /// it) forever by sending pongs that keep the keepalive content.
    pub(super) fn pong(&mut self, now: Time) {
        if std::mem::take(&mut self.pinged) {
            self.last_heard = now;
        }
    }

    /// The keepalive check at `now`: a connection silent for `keepalive`
    /// is pinged; one silent for `pong` more is dead.
    pub(super) fn keepalive(
        &mut self,
        now: Time,
        keepalive: Duration,
        pong: Duration,
    ) -> Keepalive {
        let silent = now.since(self.last_heard);
        if silent >= keepalive + pong {
            Keepalive::Dead { silent }
        } else if silent >= keepalive {
            self.pinged = true;
            Keepalive::Ping { next: now + pong }
        } else {
            Keepalive::Heard {
                next: self.last_heard + keepalive,
            }
        }
    }

    /// Makes every silent subscription opened before `before` a suspect
    /// (`unanswered`): returns those newly suspected, and the grace they
    /// get to be heard.
    pub(super) fn suspect_silent(&mut self, before: u64) -> (Duration, Vec<u64>) {
        let mut newly = Vec::new();
        for (id, s) in self
            .subs
            .iter_mut()
            .filter(|(id, s)| *id < before && !s.heard && !s.suspect)
        {
            s.suspect = true;
            newly.push(id);
        }
        (self.silence.grace(), newly)
    }

    /// The history in flight, if any.
    pub(super) fn flight(&self) -> Option<&Flight> {
        self.flight.as_deref()
    }

    /// The history in flight, if any.
    pub(super) fn flight_mut(&mut self) -> Option<&mut Flight> {
        self.flight.as_deref_mut()
    }

    /// The history in flight, made if there is none: for work that starts
    /// (a batch, a page, a job), never for a lookup.
    pub(super) fn start_flight(&mut self) -> &mut Flight {
        self.flight.get_or_insert_default()
    }

    /// Drops the history in flight (a daily sync starts over), with the
    /// unsure seconds it found.
    pub(super) fn take_flight(&mut self) -> Option<Box<Flight>> {
        self.unsure = Vec::new();
        self.flight.take()
    }

    /// The shell stopped reading the relay (the sink has no room).
    pub(super) fn pause_reads(&mut self) {
        self.reads_paused = true;
    }

    /// The shell leaves the relay's frames unread: what it answered may
    /// wait among them.
    pub(super) fn reads_paused(&self) -> bool {
        self.reads_paused
    }

    /// The relay is read again at `now`: each of its negentropy sessions
    /// counts as progressing then, so it gets a whole `neg_timeout` to be
    /// heard.
    pub(super) fn reads_resumed(&mut self, now: Time) {
        if !std::mem::take(&mut self.reads_paused) {
            return;
        }
        if let Some(f) = self.flight_mut() {
            f.neg_jobs.reads_resumed(now);
        }
    }

    /// Its negentropy jobs whose session is open.
    pub(super) fn sessions(&self) -> impl Iterator<Item = u64> + '_ {
        self.flight()
            .into_iter()
            .flat_map(|f| f.neg_jobs.in_session())
    }

    /// Its negentropy jobs whose session the relay has not answered yet.
    pub(super) fn unanswered_sessions(&self) -> impl Iterator<Item = u64> + '_ {
        self.flight()
            .into_iter()
            .flat_map(|f| f.neg_jobs.unanswered())
    }

    /// Negentropy jobs in flight.
    pub(super) fn neg_jobs(&self) -> usize {
        self.flight().map_or(0, |f| f.neg_jobs.len())
    }

    /// Batches pending.
    pub(super) fn batches(&self) -> usize {
        self.flight().map_or(0, |f| f.batches.len())
    }

    pub(super) fn live_subs(&self) -> impl Iterator<Item = &Subscription> {
        self.subs.values().filter(|s| s.purpose == Purpose::Live)
    }

    /// Filters of subscriptions kept open for live events.
    pub(super) fn live_filter_count(&self) -> usize {
        self.live_subs().map(|s| s.filter_count).sum()
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

    /// Where live coverage would end were the connection lost at `now`
    /// (a disconnect, or a save before a restart), and whether Layer 1
    /// would then be unread: a live set cut before its EOSE covered
    /// nothing yet.
    pub(super) fn coverage_end(&self, now: Time) -> (Time, bool) {
        let mut gap = now;
        let mut layer1 = false;
        for sub in self.live_subs().filter(|s| !s.eose) {
            let (lost, from_start) = sub.uncovered_from(now);
            gap = gap.min(lost);
            layer1 |= from_start;
        }
        (gap, layer1)
    }

    /// Chains still working for each batch: chunks queued, REQs before
    /// their last EOSE, follow-up pages, negentropy jobs. A batch is
    /// confirmed when its count of chains left reaches zero, so the two
    /// must agree: more chains than counted would confirm it while some
    /// are unanswered, fewer would never confirm it.
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn open_chains(&self) -> HashMap<u64, u32> {
        let mut chains: HashMap<u64, u32> = HashMap::new();
        let f = self.flight();
        let refs = f
            .into_iter()
            .flat_map(|f| &f.work)
            .chain(self.subs.values().flat_map(|s| s.work.iter()))
            .chain(
                f.into_iter()
                    .flat_map(|f| &f.next_pages)
                    .flat_map(|p| &p.work),
            )
            .chain(f.into_iter().flat_map(|f| f.neg_jobs.work()));
        for w in refs {
            *chains.entry(w.batch).or_default() += 1;
        }
        chains
    }

    /// Event ids its negentropy work holds: found missing by its jobs, and
    /// waiting in `ids` pages for a subscription slot (`IdBudget`).
    pub(super) fn ids_in_hand(&self) -> usize {
        let Some(f) = self.flight() else {
            return 0;
        };
        let jobs = f.neg_jobs.ids_in_hand();
        let pages = f.next_pages.iter().flat_map(|p| &p.filters);
        let asked = pages
            .filter_map(|f| f.filter.ids.as_ref())
            .map(|ids| ids.len());
        jobs + asked.sum::<usize>()
    }

    /// Gives back the room a burst left in its collections (a first sync's
    /// dozens of subscriptions, batches and queued chunks) once they hold
    /// little again. Collections keep their largest size otherwise: at
    /// thousands of relays that was most of an idle relay's memory.
    /// An idle connection lets its flight go.
    pub(super) fn shrink_to_fit(&mut self) {
        self.subs.shrink_to_fit();
        self.unsure.shrink_to_fit();
        if self.flight().is_some_and(Flight::is_idle) {
            self.flight = None;
        }
        let Some(f) = self.flight.as_deref_mut() else {
            return;
        };
        f.neg_jobs.shrink_to_fit();
        f.neg_bypass.shrink_to_fit();
        f.batches.shrink_to_fit();
        f.work.shrink_to_fit();
        f.next_pages.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sans_io::query::subscription::Scope;

    #[test]
    fn a_burst_gives_its_room_back() {
        let mut conn = Connection::new(1, Time::default());
        for id in 0..64 {
            let sub = Subscription::new(
                Vec::new(),
                Purpose::Page,
                Scope::Targets,
                Vec::new(),
                1,
                Time::default(),
            );
            conn.subs.insert(id, sub);
        }
        for id in 1..64 {
            conn.subs.remove(id);
        }
        assert!(conn.subs.capacity() >= 64, "a map keeps its room");
        conn.shrink_to_fit();
        assert!(conn.subs.capacity() < 8, "{}", conn.subs.capacity());
        assert!(conn.subs.get(0).is_some(), "and its contents");
    }
}
