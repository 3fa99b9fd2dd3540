//! Historic sync by NIP-77 negentropy, as one pipeline: fetch only what
//! the sink lacks.
//!
//! A fresh connect, a stale reconnect and the daily sync all re-read a
//! relay's whole history for every targeted item; almost all of it is
//! already stored. Where the relay speaks negentropy, each packed chunk of
//! historic work becomes a job ([`NegJob`]) instead of a REQ, and goes
//! through the pipeline [`Nip77`] owns:
//!
//! 0. **Turn**: at most `Config::neg_jobs_at_once` jobs run over all
//!    relays; a relay finding no room waits its turn with its work queued
//!    (`neg_turns::Turns`).
//! 1. **Listing**: the shell asks the sink what it holds for the chunk's
//!    filters, in parts of one value shared with other jobs
//!    (`listing_cache`; `Action::ListLocal`, answered by
//!    `handle_local_list`). The split into parts happens there, once; the
//!    own relay asks waiting parts of one shape together and routes the
//!    answer back by value (`own_relay::list_batch`).
//! 2. **Reconciling**: one `NEG-OPEN`/`NEG-MSG` exchange per filter
//!    (`Reconciliation`), gathering the ids the relay has and we lack.
//! 3. **Fetching**: those ids not seen since the listing, by `ids` REQs,
//!    which complete the chunk's batches exactly like the REQ path does at
//!    EOSE; the ids found and not fetched yet are bounded over all relays
//!    (`id_budget::IdBudget`).
//!
//! Who owns what: [`Nip77`] (one per engine) owns what is shared between
//! relays: whether the sink lists, the listings, the turns and the id
//! budget. A [`NegJob`] (`neg_job`) lives in its connection's `Flight`
//! (it dies with the socket) and owns its listings' shares, its session
//! and the ids it found. The job's own steps are methods on [`NegJob`];
//! `impl Engine` here only routes: it finds the job, applies what a step
//! returns (messages to send, REQ pages, counters) and schedules.
//!
//! Anything short of that falls back to REQ + pagination for the job: a
//! sink that cannot list, nothing listed locally (negentropy would only
//! add a round), or a failed session. A relay that shows it does not speak
//! negentropy (`NEG-ERR`, a `NOTICE` saying so before its first `NEG-MSG`,
//! or no answer within `neg_timeout`) is remembered and never asked again.

use log::{debug, info};
use nostr::prelude::{ClientMessage, EventId, Filter, RelayMessage, SubscriptionId, Timestamp};
use std::borrow::Cow;

use super::connection::Connection;
use super::ctx::Ctx;
use super::id_budget::IdBudget;
use super::listing_cache::{Join, Listed, ListingCache, Waiter, parts};
use super::neg_job::{Due, Listings, NegJob, NegSupport};
use super::neg_turns::Turns;
use super::relay::RelayState;
use super::{Action, ConnTimer, Engine};
use crate::sans_io::memory::index::RelayId;
use crate::sans_io::query::filters::Encoded;
use crate::sans_io::query::reconcile::{IDS_PER_FILTER, Step, fetch_filters, means_unsupported};
use crate::sans_io::query::refusal::Refusal;
use crate::sans_io::query::subscription::{Saturated, Scope, WorkRef};
use crate::sans_io::timing::time::Time;
use crate::sans_io::wire::relay_text::{dropped, relay_text};

/// How many `neg_timeout`s a job may wait for the sink's listings.
const LISTING_TIMEOUT_FACTOR: u32 = 4;

/// The NIP-77 pipeline's state shared by every relay: the sink's
/// listings, whose turn it is, and the bound on ids found. Its jobs live
/// in their connections (`Flight::neg_jobs`).
#[derive(Debug)]
pub(super) struct Nip77 {
    /// The sink can list what it holds (until it says it cannot).
    sink_lists: bool,
    /// Listings in use, shared by the jobs asking the same part.
    cache: ListingCache,
    /// Jobs in flight over all relays, and whose turn is next.
    turns: Turns,
    /// Ids found missing and not asked yet, over all relays.
    ids: IdBudget,
}

/// A part of a job's filter the sink is to list: `Action::ListLocal`.
pub(super) struct ListAsk {
    /// The request id the answer echoes.
    pub request: u64,
    /// The part.
    pub filter: Filter,
}

impl Nip77 {
    /// At most `jobs` negentropy jobs at once, holding at most `ids` ids.
    pub(super) fn new(jobs: usize, ids: usize) -> Self {
        Nip77 {
            sink_lists: true,
            cache: ListingCache::default(),
            turns: Turns::new(jobs),
            ids: IdBudget::new(ids),
        }
    }

    /// True while the sink lists what it holds.
    pub(super) fn sink_lists(&self) -> bool {
        self.sink_lists
    }

    /// True when `relay` may start a job now (see [`Turns::admit`]).
    pub(super) fn admit(&mut self, relay: RelayId) -> bool {
        self.turns.admit(relay)
    }

    /// Job `id` of `relay` for chunks `work` and their REQ `filters`
    /// (admitted): takes its room and joins or asks the listing of each
    /// part of each filter; returns the job and the parts to ask the sink.
    /// A listing unanswered for `stale_after` is asked again.
    pub(super) fn start_job(
        &mut self,
        (relay, id): (RelayId, u64),
        work: Vec<WorkRef>,
        filters: Vec<Encoded>,
        now: Time,
        stale_after: std::time::Duration,
    ) -> (NegJob, Vec<ListAsk>) {
        self.turns.started(relay, id);
        let filters: Vec<Filter> = filters
            .into_iter()
            .map(|e| {
                let mut f = e.filter;
                f.limit = None;
                f
            })
            .collect();
        let mut listings = Vec::new();
        let mut asks = Vec::new();
        for (i, filter) in filters.iter().enumerate() {
            for part in parts(filter) {
                let waiter = (relay, id, listings.len());
                match self.cache.join(part.as_json(), waiter, now, stale_after) {
                    Join::Ready(listed) => listings.push((i, Some(listed))),
                    Join::Wait => listings.push((i, None)),
                    Join::Ask(request) => {
                        listings.push((i, None));
                        asks.push(ListAsk {
                            request,
                            filter: part,
                        });
                    }
                }
            }
        }
        (NegJob::new(work, filters, listings, now, now, None), asks)
    }

    /// Job `id` of `relay` over saturated second `sat` for the chain that
    /// found it (its `work`, `scope` and start): it takes room, lists
    /// nothing (the relay lists every id it holds in that second).
    pub(super) fn start_second_job(
        &mut self,
        (relay, id): (RelayId, u64),
        (sat, scope): (Saturated, Scope),
        work: Vec<WorkRef>,
        started: Time,
        now: Time,
    ) -> NegJob {
        self.turns.started(relay, id);
        let mut filter = sat.filter.clone();
        filter.limit = None;
        let nothing: Listed = Vec::new().into();
        let listings = vec![(0, Some(nothing))];
        NegJob::new(
            work,
            vec![filter],
            listings,
            started,
            now,
            Some((sat, scope)),
        )
    }

    /// Jobs in flight over all relays.
    pub(super) fn in_flight(&self) -> usize {
        self.turns.in_flight()
    }

    /// Job `id` of `relay` ended: its room is free, its listings go at a
    /// later sweep.
    pub(super) fn job_ended(&mut self, relay: RelayId, id: u64) {
        self.turns.ended(relay, id);
        self.cache.jobs_ended(1);
    }

    /// `dropped` jobs of `relay` ended at once (its connection, or a daily
    /// sync, cleared them).
    pub(super) fn jobs_dropped(&mut self, relay: RelayId, dropped: usize) {
        self.turns.relay_ended(relay);
        self.cache.jobs_ended(dropped);
    }

    /// The sink's answer to `request`: the listing and who waited for it.
    pub(super) fn listed(
        &mut self,
        request: u64,
        listed: Vec<(EventId, Timestamp)>,
    ) -> (Listed, Vec<Waiter>) {
        self.cache.answered(request, listed)
    }

    /// The sink will not list `request`: who waited for it.
    pub(super) fn unlisted(&mut self, request: u64) -> Vec<Waiter> {
        self.cache.refused(request)
    }

    /// The sink cannot list at all: negentropy is off, and every waiter
    /// of every listing is returned.
    pub(super) fn sink_cannot_list(&mut self) -> Vec<Waiter> {
        self.sink_lists = false;
        self.cache.unanswerable()
    }

    /// Relay `relay` now holds `count` ids; true when all relays together
    /// hold more than the bound.
    pub(super) fn recount(&mut self, relay: RelayId, count: usize) -> bool {
        self.ids.recount(relay.index(), count);
        self.ids.over()
    }

    /// The bound on ids held over all relays.
    pub(super) fn max_ids(&self) -> usize {
        self.ids.max()
    }

    /// Ids the bound leaves room for now.
    pub(super) fn room_for_ids(&self) -> usize {
        self.ids.max().saturating_sub(self.ids.in_hand())
    }

    /// The relay whose turn is next, if there is room and one waits; the
    /// caller runs its scheduler, then [`Nip77::end_turn`].
    pub(super) fn next_turn(&mut self) -> Option<RelayId> {
        self.turns.next_turn()
    }

    /// Ends the offer of [`Nip77::next_turn`], taken or not.
    pub(super) fn end_turn(&mut self) {
        self.turns.end_turn();
    }

    /// After jobs ended: drops, every so many ended jobs, the listings no
    /// job `alive` still names needs.
    pub(super) fn release_due(&mut self, alive: impl Fn(RelayId, u64) -> bool) {
        self.cache.release_due(|&(relay, id, _)| !alive(relay, id));
    }

    /// Drops every listing no job `alive` names needs, and the room a
    /// burst left: for an engine at rest.
    pub(super) fn shrink(&mut self, alive: impl Fn(RelayId, u64) -> bool) {
        self.cache.release(|&(relay, id, _)| !alive(relay, id));
        self.cache.shrink_to_fit();
        self.turns.shrink_to_fit();
    }

    /// Forgets the room of jobs `alive` no longer names. Every path that
    /// ends a job frees its room at once; this periodic check makes sure a
    /// path that forgot cannot leak room for good (negentropy would stop).
    pub(super) fn prune(&mut self, alive: impl Fn(RelayId, u64) -> bool) {
        self.turns.retain(alive);
    }

    /// Every job of `jobs` holds room, no room is held by a job that is
    /// gone, and `ids` ids are held as counted.
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn check(
        &self,
        jobs: impl Iterator<Item = (RelayId, u64)>,
        ids: usize,
        url: impl Fn(RelayId) -> String,
    ) -> Result<(), String> {
        let mut count = 0;
        for (relay, id) in jobs {
            count += 1;
            if !self.turns.holds(relay, id) {
                return Err(format!("{}: job {id} holds no room", url(relay)));
            }
        }
        let held = self.turns.in_flight();
        if held != count {
            return Err(format!("{held} jobs hold room, {count} exist"));
        }
        if ids != self.ids.in_hand() {
            return Err(format!("{ids} ids held, {} counted", self.ids.in_hand()));
        }
        Ok(())
    }
}

/// Why a negentropy job goes to the REQ path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ToReq {
    /// The sink listed nothing for it: not a failure, REQ costs less.
    NothingListed,
    /// This job failed (a stalled session, a limit too small, no listing).
    Failed,
    /// The relay showed it does not speak NIP-77: remembered.
    Unsupported,
    /// The relay refused the session for its limit on sessions: its
    /// work waits in the queue for negentropy again, once one ends.
    Limit,
}

/// What a session's failure says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// Refused for the relay's limit on sessions.
    Limit,
    /// Its filter matched more than the relay reconciles at once
    /// ([`too_big`]).
    TooBig,
    /// Only this job failed (a refused value, or after the relay answered):
    /// REQ reads this job, negentropy the next.
    Job,
    /// Refused at once for no reason above: the relay does not speak NIP-77.
    Unsupported,
}

/// Reads `reason`, the failure of a session the relay had answered before
/// when `answered_before`. A refused value, or a filter matching more than
/// the relay reconciles at once, says nothing of NIP-77.
fn failure(reason: &str, answered_before: bool) -> Failure {
    let refusal = Refusal::of_closed(reason);
    if refusal == Refusal::TooManySubscriptions {
        Failure::Limit
    } else if too_big(reason) {
        Failure::TooBig
    } else if answered_before || matches!(refusal, Refusal::BadValue { .. }) {
        Failure::Job
    } else {
        Failure::Unsupported
    }
}

/// Whether a NOTICE refuses a negentropy session for the relay's limit
/// on sessions (strfry: `ERROR: too many concurrent NEG requests`).
fn refuses_session(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    let names_neg =
        lower.contains("neg ") || lower.contains("neg-") || lower.contains("negentropy");
    names_neg && Refusal::of_notice(text) == Some(Refusal::TooManySubscriptions)
}

/// Whether a session's failure says its filter matched more than the
/// relay reconciles at once: rust-nostr's relays answer `NEG-ERR
/// "rate-limited: too many negentropy items"` past their
/// `max_negentropy_items`, strfry `"blocked: too many query results"` past
/// `maxSyncEvents`. Such a relay speaks NIP-77; only this filter is too
/// big for it.
fn too_big(reason: &str) -> bool {
    let lower = reason.to_ascii_lowercase();
    lower.starts_with("neg-err:")
        && (lower.contains("too many") || lower.contains("too big") || lower.contains("too large"))
}

impl Engine {
    /// True when `relay`'s next historic chunk should go by negentropy.
    pub(super) fn negentropy_usable(&self, relay: RelayId) -> bool {
        self.config.negentropy
            && self.nip77.sink_lists()
            && relay != self.own
            && self.relays[relay.index()].facts.neg != NegSupport::Unsupported
    }

    /// True when `relay` may start a negentropy job now. Otherwise it waits
    /// for its turn (`neg_turns`) with its work queued, which nothing times
    /// out; the scheduler runs again when the turn comes.
    pub(super) fn neg_admit(&mut self, relay: RelayId) -> bool {
        self.nip77.admit(relay)
    }

    /// Counts again the ids `relay`'s jobs and waiting pages hold; true
    /// when all relays together now hold more than `Config::neg_ids_held`.
    pub(super) fn recount_ids(&mut self, relay: RelayId) -> bool {
        let count = self.conn(relay).map_or(0, |c| c.ids_in_hand());
        self.nip77.recount(relay, count)
    }

    /// Job `id` of `relay` took the ids in hand over all relays past the
    /// bound: it goes to REQ paging, which needs no ids in hand.
    fn over_id_budget(&mut self, relay: RelayId, id: u64, now: Time) {
        self.stats.neg_over_id_budget += 1;
        if let Some(n) = self.log_budget.admit(relay.index(), now) {
            info!(
                "{}: negentropy job {id:x} would hold ids past the bound of {} over all relays; REQ{}",
                self.relay_url(relay),
                self.nip77.max_ids(),
                dropped(n)
            );
        }
        self.job_to_req(relay, id, ToReq::Failed, now);
        self.recount_ids(relay);
    }

    /// Offers free room to the relay whose turn is next, if one waits;
    /// false when none was offered (no room, or no one waits).
    pub(super) fn offer_turn(&mut self, now: Time) -> bool {
        let Some(relay) = self.nip77.next_turn() else {
            return false;
        };
        self.schedule(relay, now);
        self.nip77.end_turn();
        true
    }

    /// Removes job `id` of `relay`, freeing its room and, at the next
    /// sweep, its listings.
    fn end_job(&mut self, relay: RelayId, id: u64) -> Option<NegJob> {
        let job = self.flight_mut(relay)?.neg_jobs.remove(id)?;
        self.nip77.job_ended(relay, id);
        Some(job)
    }

    /// Starts a job for packed chunks `work` with their REQ `filters`
    /// (admitted by [`Engine::neg_admit`]): joins or asks the sink's listing
    /// of each part. Called by the scheduler, so nothing here schedules.
    pub(super) fn start_neg_job(
        &mut self,
        relay: RelayId,
        work: Vec<WorkRef>,
        filters: Vec<Encoded>,
        now: Time,
    ) {
        let (_, mut cx) = self.at(relay);
        let id = cx.next_sub_id();
        let stale_after = self.listing_timeout();
        let (job, asks) = self
            .nip77
            .start_job((relay, id), work, filters, now, stale_after);
        let in_flight = self.nip77.in_flight() as u64;
        self.stats.neg_jobs_peak = self.stats.neg_jobs_peak.max(in_flight);
        for ListAsk { request, filter } in asks {
            self.actions
                .push_back(Action::ListLocal { request, filter });
        }
        let (state, mut cx) = self.at(relay);
        let listings = state.insert_job(&mut cx, id, job, now);
        if let Some(listings) = listings {
            self.go_on_listed(relay, id, listings, now);
        }
    }

    /// Starts a job over saturated second `sat` for the chain that found
    /// it (its `work`, `scope` and start). It takes room like any job but
    /// is not made to wait for its turn: it holds no listing, and the
    /// chain's subscription slot it took is free again.
    pub(super) fn start_second_job(
        &mut self,
        relay: RelayId,
        sat: Saturated,
        scope: Scope,
        work: Vec<WorkRef>,
        started: Time,
        now: Time,
    ) {
        let (_, mut cx) = self.at(relay);
        let id = cx.next_sub_id();
        let job = self
            .nip77
            .start_second_job((relay, id), (sat, scope), work, started, now);
        let (state, mut cx) = self.at(relay);
        state.insert_job(&mut cx, id, job, now);
        self.open_session(relay, id, now);
    }

    /// How long a job waits for the sink's listings: they wait in line at
    /// the own relay behind other jobs', which is not the remote's silence.
    fn listing_timeout(&self) -> std::time::Duration {
        self.config
            .neg_timeout
            .saturating_mul(LISTING_TIMEOUT_FACTOR)
    }

    /// The sink's answer to listing request `request`: every job waiting
    /// for it reconciles once all its parts are listed.
    pub(super) fn local_listed(
        &mut self,
        now: Time,
        request: u64,
        listed: Option<Vec<(EventId, Timestamp)>>,
    ) {
        let Some(listed) = listed else {
            info!("the sink cannot list what it holds; negentropy off");
            let waiters = self.nip77.sink_cannot_list();
            return self.waiters_to_req(waiters, now);
        };
        let (listed, waiters) = self.nip77.listed(request, listed);
        for (relay, id, i) in waiters {
            if let Some(job) = self.flight_mut(relay).and_then(|f| f.neg_jobs.get_mut(id)) {
                let listings = job.listed(i, &listed, now);
                self.go_on_listed(relay, id, listings, now);
            }
        }
        drop(listed);
        self.after_jobs_ended(now);
    }

    /// The sink will not list `request`: its waiting jobs end in REQ now
    /// (a job waiting on it would only time out later and do the same).
    pub(super) fn local_unlisted(&mut self, now: Time, request: u64) {
        let waiters = self.nip77.unlisted(request);
        self.waiters_to_req(waiters, now);
    }

    /// Jobs that waited for listings that will not come end in REQ.
    fn waiters_to_req(&mut self, waiters: Vec<Waiter>, now: Time) {
        for (relay, id, _) in waiters {
            self.requeue_job(relay, id, ToReq::Failed, now);
        }
        self.after_jobs_ended(now);
    }

    /// Job `id` goes on as its `listings` stand: it waits for the rest,
    /// goes to REQ if the sink holds nothing for any part (REQ costs
    /// less: not a failure, counted apart from fallbacks), or opens its
    /// first session. Schedules nothing itself: its callers flush.
    fn go_on_listed(&mut self, relay: RelayId, id: u64, listings: Listings, now: Time) {
        match listings {
            Listings::Waiting => {}
            Listings::Empty => {
                debug!("{}: nothing held locally; REQ", self.relay_url(relay));
                self.requeue_job(relay, id, ToReq::NothingListed, now);
            }
            Listings::Ready => self.open_session(relay, id, now),
        }
    }

    /// Opens the job's session (`RelayState::open_session`); one that
    /// cannot open goes to REQ.
    fn open_session(&mut self, relay: RelayId, id: u64, now: Time) {
        let (state, mut cx) = self.at(relay);
        if !state.open_session(&mut cx, id) {
            self.requeue_job(relay, id, ToReq::Failed, now);
        }
    }

    /// A `NEG-MSG` or `NEG-ERR` from `relay`: the job's session steps
    /// (`RelayState::session_step`), and the engine goes on with what the
    /// step found.
    pub(super) fn on_neg_message(
        &mut self,
        relay: RelayId,
        sub: Option<u64>,
        message: &RelayMessage<'_>,
        now: Time,
    ) {
        let Some(id) = sub else { return };
        let (state, mut cx) = self.at(relay);
        match state.session_step(&mut cx, id, message, now) {
            None => {}
            Some(SessionStep::Reply(text)) => {
                let over = self.recount_ids(relay);
                let (_, mut cx) = self.at(relay);
                if over {
                    cx.send(neg_close(id));
                    return self.over_id_budget(relay, id, now);
                }
                cx.send(text);
            }
            Some(SessionStep::Reconciled(need)) => self.filter_reconciled(relay, id, need, now),
            Some(SessionStep::Split) => {
                // The refused session's ids in hand are gone with it.
                self.recount_ids(relay);
                self.open_session(relay, id, now);
                self.after_jobs_ended(now);
            }
            Some(SessionStep::ToReq(why)) => self.job_to_req(relay, id, why, now),
        }
        self.settle_refusals(relay, now);
    }

    /// A NOTICE refusing a negentropy session for the relay's limit
    /// (`RelayState::session_limit_notice`); true when the notice was one.
    pub(super) fn neg_limit_notice(&mut self, relay: RelayId, text: &str, now: Time) -> bool {
        if !refuses_session(text) {
            return false;
        }
        let (state, cx) = self.at(relay);
        state.session_limit_notice(&cx, text);
        self.settle_refusals(relay, now);
        true
    }

    /// Sessions of `relay` that limit NOTICEs refused, once they can be
    /// told (`RelayState::settle_refusals`), go as the refusal says.
    fn settle_refusals(&mut self, relay: RelayId, now: Time) {
        let (state, cx) = self.at(relay);
        let Some(refused) = state.settle_refusals(&cx) else {
            return;
        };
        for (id, why) in refused {
            self.job_to_req(relay, id, why, now);
        }
        // Work waited for the refusals to be tied (`neg_room`).
        self.flush(now);
    }

    /// A NOTICE; true when it told a job's relay that NEG is unknown there.
    pub(super) fn neg_notice(&mut self, relay: RelayId, text: &str, now: Time) -> bool {
        if !means_unsupported(text) {
            return false;
        }
        let conn = self.conn(relay);
        let waiting: Vec<u64> = conn.map_or(Vec::new(), |c| c.unanswered_sessions().collect());
        for &id in &waiting {
            self.job_to_req(relay, id, ToReq::Unsupported, now);
        }
        !waiting.is_empty()
    }

    /// The job's current filter is reconciled: on to the next, or fetch.
    fn filter_reconciled(&mut self, relay: RelayId, id: u64, need: Vec<EventId>, now: Time) {
        let Some(job) = self.flight_mut(relay).and_then(|f| f.neg_jobs.get_mut(id)) else {
            return;
        };
        let more = job.reconciled(need);
        if self.recount_ids(relay) {
            return self.over_id_budget(relay, id, now);
        }
        if more {
            self.open_session(relay, id, now);
            self.fetch_ahead(relay, id, now);
            return self.after_jobs_ended(now);
        }
        let Some(mut job) = self.end_job(relay, id) else {
            return;
        };
        let need = job.take_need();
        let (work, started, second) = job.into_chain();
        if second.is_none() {
            self.relay(relay).mark_uncovered(started);
        }
        self.fetch_ids(relay, need, &work, started, true, now);
        self.after_jobs_ended(now);
    }

    /// Fetches what job `id`'s finished filters found missing while its
    /// next filter is reconciled, instead of after it
    /// ([`NegJob::take_ahead`]): in a first sync of one issue with 20,000
    /// replies, the `#E` session over 20,000 items otherwise ran while
    /// nothing was fetched. Each fetch REQ counts one more completion of
    /// the job's chunks; the job keeps its own.
    fn fetch_ahead(&mut self, relay: RelayId, id: u64, now: Time) {
        let room = self.nip77.room_for_ids();
        let Some(job) = self.flight_mut(relay).and_then(|f| f.neg_jobs.get_mut(id)) else {
            return;
        };
        let Some(need) = job.take_ahead(room) else {
            return;
        };
        let (work, started) = job.chain();
        let work = work.to_vec();
        self.stats.neg_fetched_ahead += 1;
        self.fetch_ids(relay, need, &work, started, false, now);
        self.recount_ids(relay);
    }

    /// Fetches the missing ids (`RelayState::fetch_ids`). An id already
    /// seen was passed to the sink, or came from the own relay's live
    /// stream, since the listing was made (a listing shared between jobs
    /// can predate both): fetching it again would only bring a duplicate.
    /// One the sink refused for good is not fetched either.
    fn fetch_ids(
        &mut self,
        relay: RelayId,
        mut need: Vec<EventId>,
        work: &[WorkRef],
        started: Time,
        last: bool,
        now: Time,
    ) {
        need.sort_unstable();
        need.dedup();
        need.retain(|id| !self.seen.contains(id));
        let before = need.len();
        need.retain(|id| !self.refused.contains(id));
        self.stats.events_refused_skipped += (before - need.len()) as u64;
        let (state, mut cx) = self.at(relay);
        if state.fetch_ids(&mut cx, need, work, started, last, now) {
            self.flush(now);
        }
    }

    /// Moves a job's chunks to the REQ path, for reason `why`, and lets
    /// waiting relays have its room.
    fn job_to_req(&mut self, relay: RelayId, id: u64, why: ToReq, now: Time) {
        self.requeue_job(relay, id, why, now);
        self.after_jobs_ended(now);
    }

    /// Ends job `id` and gives its work back (`RelayState::job_ended`);
    /// schedules nothing (the scheduler calls this).
    fn requeue_job(&mut self, relay: RelayId, id: u64, why: ToReq, now: Time) {
        if let Some(job) = self.end_job(relay, id) {
            let (state, mut cx) = self.at(relay);
            state.job_ended(&mut cx, job, why, now);
        }
    }

    /// `relay`'s `dropped` jobs are gone (its connection, or a daily sync,
    /// cleared them): their listings and room are released.
    pub(super) fn neg_jobs_dropped(&mut self, relay: RelayId, dropped: usize, now: Time) {
        self.nip77.jobs_dropped(relay, dropped);
        self.recount_ids(relay);
        self.after_jobs_ended(now);
    }

    /// Drops every listing no job in flight needs, and the room a burst of
    /// them left: for an engine at rest, between the sweeps jobs trigger.
    pub(super) fn shrink_listings(&mut self) {
        let relays = &self.relays;
        self.nip77
            .shrink(|relay, id| relays.get(relay.index()).is_some_and(|s| s.has_neg_job(id)));
    }

    /// After jobs ended: drops the listings and room they held, schedules
    /// what they moved, and gives the room to the relays waiting for it.
    fn after_jobs_ended(&mut self, now: Time) {
        let relays = &self.relays;
        self.nip77
            .release_due(|relay, id| relays.get(relay.index()).is_some_and(|s| s.has_neg_job(id)));
        self.flush(now);
    }

    /// Every job holds room, no room is held by a job that is gone, and
    /// the ids in hand are counted right.
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn check_neg_room(&self) -> Result<(), String> {
        let jobs = self.relays.iter().enumerate().flat_map(|(i, relay)| {
            let flight = relay.conn().and_then(|c| c.flight());
            let ids = flight.into_iter().flat_map(|f| f.neg_jobs.ids());
            ids.map(move |id| (RelayId(i as u32), id))
        });
        let conns = self.relays.iter().filter_map(|r| r.conn());
        let ids: usize = conns.map(|c| c.ids_in_hand()).sum();
        self.nip77
            .check(jobs, ids, |r| self.relay_url(r).to_string())
    }

    /// Forgets the room of jobs that no longer exist ([`Nip77::prune`]).
    pub(super) fn prune_turns(&mut self) {
        let relays = &self.relays;
        self.nip77
            .prune(|relay, id| relays.get(relay.index()).is_some_and(|s| s.has_neg_job(id)));
    }

    /// No progress on a job within `neg_timeout`
    /// (`RelayState::neg_timeout`): it goes back to REQ.
    pub(super) fn on_neg_timeout(&mut self, relay: RelayId, id: u64, now: Time) {
        let listing_timeout = self.listing_timeout();
        let (state, mut cx) = self.at(relay);
        if let Some(why) = state.neg_timeout(&mut cx, id, listing_timeout, now) {
            self.job_to_req(relay, id, why, now);
            self.settle_refusals(relay, now);
        }
    }
}

/// A relay's steps of its NIP-77 jobs: what touches only the relay's facts
/// and the jobs in its connection's flight, with the messages, timers and
/// counters handed to the engine through [`Ctx`].
impl RelayState {
    /// Job `id` of the connection, if it runs.
    fn neg_job(&self, id: u64) -> Option<&NegJob> {
        self.conn()?.flight()?.neg_jobs.get(id)
    }

    /// The same, to change.
    fn neg_job_mut(&mut self, id: u64) -> Option<&mut NegJob> {
        self.conn_mut()?.flight_mut()?.neg_jobs.get_mut(id)
    }

    /// Records job `id` (its room taken) and arms its progress deadline.
    /// Where its listings stand, if it was recorded (the relay is
    /// connected).
    fn insert_job(&mut self, cx: &mut Ctx, id: u64, job: NegJob, now: Time) -> Option<Listings> {
        let flight = self.conn_mut()?.start_flight();
        let listings = job.listings_state();
        flight.neg_jobs.insert(id, job);
        self.arm(cx, now + cx.config.neg_timeout, ConnTimer::NegTimeout(id));
        Some(listings)
    }

    /// Sends `NEG-CLOSE` for every session of the connection's jobs, which
    /// are about to be dropped on a live connection (a daily sync): a
    /// relay that counts sessions (strfry) would count them for good, and
    /// refuse every later one over its limit.
    pub(super) fn close_all_sessions(&self, cx: &mut Ctx) {
        for id in self.conn().into_iter().flat_map(|c| c.sessions()) {
            cx.send(neg_close(id));
        }
    }

    /// Sends `NEG-OPEN` for job `id`'s current filter; false when it
    /// cannot open (its filter does not fit the relay's message size).
    /// The job keeps its share of the listing until it ends, so jobs of
    /// other relays asking the same filter meanwhile use it too.
    fn open_session(&mut self, cx: &mut Ctx, id: u64) -> bool {
        let limit = self.facts.limits.message_bytes;
        let beside = self
            .conn()
            .map_or(0, |c| c.sessions().filter(|&s| s != id).count());
        let Some(job) = self.neg_job_mut(id) else {
            return true;
        };
        match job.open_session(id, limit, beside) {
            Ok(open) => {
                cx.stats.neg_sessions += 1;
                cx.send(open);
                true
            }
            Err(e) => {
                debug!("{}: {e:?}; REQ", cx.url());
                false
            }
        }
    }

    /// A `NEG-MSG` or `NEG-ERR` for job `id`'s session at `now`: what
    /// its step leaves the engine to do, `None` if no session of ours
    /// takes it. A reconciled filter proves the relay speaks NIP-77; a
    /// failure is logged, closed, and read for why the job goes to REQ,
    /// unless the relay refused the filter for its size and the job could
    /// split it: each window is then reconciled apart, so only what the
    /// sink lacks is fetched, where REQ paging re-read the whole history
    /// (every daily sync and restart of a big repo).
    fn session_step(
        &mut self,
        cx: &mut Ctx,
        id: u64,
        message: &RelayMessage<'_>,
        now: Time,
    ) -> Option<SessionStep> {
        let (step, answered_before) = self.neg_job_mut(id)?.on_message(message, now)?;
        if matches!(message, RelayMessage::NegMsg { .. }) {
            cx.stats.neg_rounds += 1;
        }
        Some(match step {
            Step::Send(text) => SessionStep::Reply(text),
            Step::Done { need, close } => {
                cx.send(close);
                self.facts.neg = NegSupport::Supported;
                SessionStep::Reconciled(need)
            }
            Step::Failed { reason, close } => {
                if let Some(close) = close {
                    cx.send(close);
                }
                let failure = failure(&reason, answered_before);
                if failure == Failure::TooBig
                    && let Some(m) = self.neg_job_mut(id)?.split_current()
                {
                    cx.stats.neg_size_splits += 1;
                    if let Some(n) = cx.admit_log(now) {
                        let (url, text) = (cx.url(), relay_text(&reason));
                        let m = m.as_secs();
                        info!(
                            "{url}: negentropy refused for its size: {text}; reconciled in two time windows, up to {m} and after{}",
                            dropped(n)
                        );
                    }
                    return Some(SessionStep::Split);
                }
                if let Some(n) = cx.admit_log(now) {
                    let (url, text) = (cx.url(), relay_text(&reason));
                    info!("{url}: negentropy failed: {text}{}", dropped(n));
                }
                SessionStep::ToReq(match failure {
                    Failure::Limit => {
                        let beside = self.neg_job(id).map_or(0, NegJob::opened_beside);
                        self.session_limit_refusal(cx, beside)
                    }
                    Failure::TooBig | Failure::Job => ToReq::Failed,
                    Failure::Unsupported => ToReq::Unsupported,
                })
            }
        })
    }

    /// A NOTICE refusing a negentropy session for the relay's limit
    /// (strfry: `ERROR: too many concurrent NEG requests`) names none: it
    /// is counted, to be tied to the session it refused once that can be
    /// told (`settle_refusals`).
    fn session_limit_notice(&mut self, cx: &Ctx, text: &str) {
        let text = relay_text(text);
        info!(
            "{}: negentropy session refused for its limit: {text}",
            cx.url()
        );
        if let Some(flight) = self.conn_mut().and_then(Connection::flight_mut) {
            flight.neg_refused += 1;
        }
    }

    /// Ties the limit NOTICEs not tied yet to the sessions they refused,
    /// once that can be told: then those sessions, each with why its job
    /// goes (`session_limit_refusal`), else `None`. A relay refuses in the
    /// order it reads the sessions, but answers the ones it takes in its
    /// own time (strfry answers one once its query ran, after refusing the
    /// next), and our own sessions open while refusals are on their way:
    /// neither the newest nor the oldest session without an answer is
    /// surely the refused one. Every session it took is answered in the end, so once
    /// no more wait for an answer than refusals came, the ones waiting are
    /// the refused ones. Taking a wrong one left a refused session waiting
    /// out its timeout, and a crowded second it reconciled was given up
    /// (oracle world 334153).
    fn settle_refusals(&mut self, cx: &Ctx) -> Option<Vec<(u64, ToReq)>> {
        let conn = self.conn_mut()?;
        let mut refused: Vec<u64> = conn.unanswered_sessions().collect();
        let flight = conn.flight_mut()?;
        if flight.neg_refused == 0 || refused.len() > flight.neg_refused {
            return None;
        }
        flight.neg_refused = 0;
        if refused.is_empty() {
            // The refused sessions ended otherwise (timed out): they say
            // nothing of the limit any more.
            return Some(Vec::new());
        }
        refused.sort_unstable();
        // Each was counted open beside the refused ones sent before it.
        let seen = refused.iter().enumerate().map(|(i, &id)| {
            let beside = self.neg_job(id).map_or(0, NegJob::opened_beside);
            beside.saturating_sub(i)
        });
        let why = self.session_limit_refusal(cx, seen.min().unwrap_or(0));
        Some(refused.into_iter().map(|id| (id, why)).collect())
    }

    /// A session refused for the relay's limit while it had `seen` of ours
    /// open: it allows those, and the job waits for room. If it saw none
    /// of ours, the relay refuses even one (sessions counted that we
    /// cannot see): waiting would ask again at once, forever, so the job
    /// goes to REQ.
    fn session_limit_refusal(&mut self, cx: &Ctx, seen: usize) -> ToReq {
        let limits = &mut self.facts.limits;
        limits.neg_sessions = seen.clamp(1, limits.neg_sessions);
        let limit = limits.neg_sessions;
        debug!("{}: negentropy sessions now at most {limit}", cx.url());
        if seen > 0 {
            ToReq::Limit
        } else {
            ToReq::Failed
        }
    }

    /// Queues one `ids` REQ per filter of `need` (relays cap the results
    /// of one REQ, not of one filter) as follow-up pages of chunks `work`.
    /// The REQs wait for free subscription slots in the follow-up page
    /// queue like any historic page: thousands of missing ids after a long
    /// downtime must not open more REQs than the relay allows, or its
    /// refusals fail the job. Each REQ completes the chunks once, so their
    /// batches confirm when the last fetch reaches EOSE; `last` when these
    /// end the job's own chain, which then counts as the first of them
    /// (or completes at once if none is needed). True when pages were
    /// queued: the engine flushes.
    fn fetch_ids(
        &mut self,
        cx: &mut Ctx,
        need: Vec<EventId>,
        work: &[WorkRef],
        started: Time,
        last: bool,
        now: Time,
    ) -> bool {
        cx.stats.neg_ids_fetched += need.len() as u64;
        info!(
            "{}: negentropy found {} events missing",
            cx.url(),
            need.len()
        );
        let max_ids = IDS_PER_FILTER.min(self.page_limit()).max(1);
        let groups = fetch_filters(&need, max_ids, self.facts.limits.message_bytes);
        if groups.is_empty() {
            if last {
                for w in work {
                    self.complete_chunk(cx, w.batch, now);
                }
                cx.mark_dirty();
            }
            return false;
        }
        let extra = groups.len() as u32 - u32::from(last);
        let Some(conn) = self.conn_mut() else {
            return false;
        };
        let filters = groups.into_iter().map(|g| g.filter);
        conn.start_flight()
            .fetch_pages(work, filters, started, extra);
        cx.mark_dirty();
        true
    }

    /// Job `job` ended for reason `why`: counted, the relay's NIP-77
    /// support learnt, and its work given back. A job refused for the
    /// relay's session limit goes back as it was, for negentropy again:
    /// its chunks to the front of the queue, a saturated second to the
    /// front of the follow-up pages. Otherwise its chunks go to REQ; a
    /// saturated second, which REQ already read what it could of, goes
    /// to its parts by kind, which take over from the job's chain.
    fn job_ended(&mut self, cx: &mut Ctx, job: NegJob, why: ToReq, now: Time) {
        match why {
            ToReq::NothingListed => cx.stats.neg_skipped += 1,
            ToReq::Failed => cx.stats.neg_fallbacks += 1,
            ToReq::Unsupported => {
                cx.stats.neg_fallbacks += 1;
                if self.facts.neg != NegSupport::Supported {
                    info!("{}: no negentropy; REQ from now on", cx.url());
                    self.facts.neg = NegSupport::Unsupported;
                }
            }
            ToReq::Limit => self.note_refusal(cx),
        }
        let (work, started, second) = job.into_chain();
        match (why, second) {
            (ToReq::Limit, second) => {
                let Some(conn) = self.conn_mut() else {
                    return;
                };
                let flight = conn.start_flight();
                match second {
                    Some(second) => flight.requeue_second(second, work, started),
                    None => flight.requeue_chunks(work, false),
                }
            }
            (_, Some((sat, scope))) => {
                self.split_by_kind(cx, sat, scope, &work, started, now);
                for w in &work {
                    self.complete_chunk(cx, w.batch, now);
                }
            }
            (_, None) => {
                if let Some(conn) = self.conn_mut() {
                    conn.start_flight().requeue_chunks(work, true);
                }
            }
        }
        cx.mark_dirty();
    }

    /// Job `id`'s progress deadline at `now`: re-armed if it progressed
    /// (`NegJob::due`), else why it goes to REQ. A relay that never
    /// answered `NEG-OPEN` does not speak negentropy; a job that stalled
    /// later only failed. A session timed out is closed.
    fn neg_timeout(
        &mut self,
        cx: &mut Ctx,
        id: u64,
        listing_timeout: std::time::Duration,
        now: Time,
    ) -> Option<ToReq> {
        let conn = self.conn()?;
        let job = conn.flight()?.neg_jobs.get(id)?;
        let timeouts = (cx.config.neg_timeout, listing_timeout);
        let (in_session, silent) = match job.due(now, conn.reads_paused(), timeouts) {
            Due::At(at) => {
                self.arm(cx, at, ConnTimer::NegTimeout(id));
                return None;
            }
            Due::Now { in_session, silent } => (in_session, silent),
        };
        let waited = if in_session {
            ""
        } else {
            " waiting for the own relay's listings"
        };
        info!("{}: negentropy job {id:x} timed out{waited}", cx.url());
        if in_session {
            cx.send(neg_close(id));
        }
        Some(if silent {
            ToReq::Unsupported
        } else {
            ToReq::Failed
        })
    }
}

/// What a session's step leaves the engine to do
/// (`RelayState::session_step`).
enum SessionStep {
    /// Send this reply, unless the ids in hand went past the bound.
    Reply(String),
    /// The filter (or its window) is reconciled, finding these ids missing.
    Reconciled(Vec<EventId>),
    /// The relay refused the filter (or its window) for its size, and the
    /// job split it in time windows (`NegJob::split_current`): open the
    /// session of the next one.
    Split,
    /// The job goes to REQ.
    ToReq(ToReq),
}

/// The `NEG-CLOSE` of job `id`'s session.
fn neg_close(id: u64) -> String {
    let subscription_id = Cow::Owned(SubscriptionId::new(format!("{id:x}")));
    ClientMessage::NegClose { subscription_id }.as_json()
}
