//! Historic sync by NIP-77 negentropy: fetch only what the sink lacks.
//!
//! A fresh connect, a stale reconnect and the daily sync all re-read a
//! relay's whole history for every targeted item; almost all of it is
//! already stored. Where the relay speaks negentropy, each packed chunk of
//! historic work becomes a job instead of a REQ:
//!
//! 0. **Turn**: at most `Config::neg_jobs_at_once` jobs run over all
//!    relays; a relay finding no room waits its turn with its work queued
//!    (`neg_turns`).
//! 1. **Listing**: the shell asks the sink what it holds for the chunk's
//!    filters, in parts shared with other jobs (`listing_cache`;
//!    `Action::ListLocal`, answered by `handle_local_list`).
//! 2. **Reconciling**: one `NEG-OPEN`/`NEG-MSG` exchange per filter
//!    ([`Reconciliation`]), gathering the ids the relay has and we lack.
//! 3. **Fetching**: those ids not seen since the listing, by `ids` REQs,
//!    which complete the chunk's batches exactly like the REQ path does at
//!    EOSE.
//!
//! Anything short of that falls back to REQ + pagination for the job: a
//! sink that cannot list, nothing held locally (negentropy would only add a
//! round), or a failed session. A relay that shows it does not speak
//! negentropy (`NEG-ERR`, a `NOTICE` saying so before its first `NEG-MSG`,
//! or no answer within `neg_timeout`) is remembered and never asked again.

use std::borrow::Cow;

use log::{debug, info};
use nostr::prelude::{ClientMessage, EventId, Filter, RelayMessage, SubscriptionId, Timestamp};

use super::id_budget::IdBudget;
use super::listing_cache::{Held, Join, ListingCache, Waiter, parts};
use super::neg_turns::Turns;
use super::{Action, ConnTimer, Engine};
use crate::sans_io::memory::index::RelayId;
use crate::sans_io::query::filters::Encoded;
use crate::sans_io::query::reconcile::{
    IDS_PER_FILTER, Reconciliation, Step, fetch_filters, means_unsupported,
};
use crate::sans_io::query::refusal::Refusal;
use crate::sans_io::query::subscription::{NextPage, PageFilter, Saturated, Scope, WorkRef};
use crate::sans_io::timing::time::Time;
use crate::sans_io::wire::relay_text::{dropped, relay_text};

/// How many `neg_timeout`s a job may wait for the sink's listings.
const LISTING_TIMEOUT_FACTOR: u32 = 4;

/// Whether a relay speaks NIP-77, as far as we know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum NegSupport {
    /// Not tried yet.
    #[default]
    Unknown,
    /// A reconciliation completed.
    Supported,
    /// It said or showed it does not; REQ only from now on.
    Unsupported,
}

/// The engine's side of the sink's listings, and the jobs in flight.
#[derive(Debug)]
pub(super) struct Listings {
    /// The sink can list what it holds (until it says it cannot).
    sink_lists: bool,
    /// Listings in use, shared by the jobs asking the same filter.
    cache: ListingCache,
    /// Jobs in flight over all relays, and whose turn is next.
    turns: Turns,
    /// Ids found missing and not asked yet, over all relays.
    ids: IdBudget,
}

impl Listings {
    /// At most `jobs` negentropy jobs at once, holding at most `ids` ids.
    pub(super) fn new(jobs: usize, ids: usize) -> Self {
        Listings {
            sink_lists: true,
            cache: ListingCache::default(),
            turns: Turns::new(jobs),
            ids: IdBudget::new(ids),
        }
    }
}

/// Why a negentropy job goes to the REQ path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ToReq {
    /// The sink holds nothing for it: not a failure, REQ costs less.
    NothingHeld,
    /// This job failed (a stalled session, a limit too small, no listing).
    Failed,
    /// The relay showed it does not speak NIP-77: remembered.
    Unsupported,
    /// The relay refused the session for its limit on sessions: its
    /// work waits in the queue for negentropy again, once one ends.
    Limit,
}

/// One packed chunk of historic work done by negentropy.
pub(super) struct NegJob {
    /// Chunks of pending batches this job completes.
    work: Vec<WorkRef>,
    /// The chunk's filters (without `limit`), reconciled one at a time.
    filters: Vec<Filter>,
    /// What the sink holds for each part of each filter (`listing_cache`):
    /// the filter's index and the part's listing as it comes in (shared
    /// with other jobs, held until the job ends).
    held: Vec<(usize, Option<Held>)>,
    /// The filter being reconciled.
    current: usize,
    /// The session of the current filter.
    session: Option<Reconciliation>,
    /// Ids found missing so far.
    need: Vec<EventId>,
    /// Ids its finished filters found and it already fetches
    /// ([`Engine::fetch_ahead`]), sorted: a later filter finding them
    /// again does not ask them twice.
    asked: Vec<EventId>,
    /// When the job started: live coverage of its items begins there.
    started: Time,
    /// Last sign of progress (a list or a relay answer), for the timeout.
    progress: Time,
    /// A saturated second reconciled against nothing held (`saturated`):
    /// what the relay lists there is fetched. It has no REQ to fall back
    /// to (REQ already read what it could), so a failure goes on to the
    /// split by kind; and the chain that found it covers it live.
    second: Option<(Saturated, Scope)>,
}

impl NegJob {
    /// Ids it holds: found missing by its finished filters and its
    /// session, and already fetched.
    pub(super) fn ids_held(&self) -> usize {
        self.need.len()
            + self.asked.len()
            + self.session.as_ref().map_or(0, Reconciliation::need_len)
    }

    /// The chunks this job completes.
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn work(&self) -> &[WorkRef] {
        &self.work
    }
}

impl std::fmt::Debug for NegJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NegJob")
            .field("work", &self.work)
            .field("filters", &self.filters.len())
            .field("current", &self.current)
            .field("reconciling", &self.session.is_some())
            .field("need", &self.need.len())
            .finish()
    }
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
            && self.listings.sink_lists
            && relay != self.own
            && self.relays[relay.index()].facts.neg != NegSupport::Unsupported
    }

    /// True when `relay` may start a negentropy job now. Otherwise it waits
    /// for its turn (`neg_turns`) with its work queued, which nothing times
    /// out; the scheduler runs again when the turn comes.
    pub(super) fn neg_admit(&mut self, relay: RelayId) -> bool {
        self.listings.turns.admit(relay)
    }

    /// Sends `NEG-CLOSE` for every session of `relay`'s jobs, which are
    /// about to be dropped on a live connection (a daily sync): a relay
    /// that counts sessions (strfry) would count them for good, and refuse
    /// every later one over its limit.
    pub(super) fn close_all_sessions(&mut self, relay: RelayId) {
        let Some(conn) = self.conn(relay) else {
            return;
        };
        let open: Vec<u64> = conn
            .flight()
            .into_iter()
            .flat_map(|f| &f.neg_jobs)
            .filter(|(_, j)| j.session.is_some())
            .map(|(id, _)| *id)
            .collect();
        for id in open {
            self.send_neg_close(relay, id);
        }
    }

    /// Sends `NEG-CLOSE` for job `id`'s session.
    fn send_neg_close(&mut self, relay: RelayId, id: u64) {
        let subscription_id = Cow::Owned(SubscriptionId::new(format!("{id:x}")));
        let message = ClientMessage::NegClose { subscription_id }.as_json();
        self.actions.push_back(Action::Send { relay, message });
    }

    /// Counts again the ids `relay`'s jobs and waiting pages hold; true
    /// when all relays together now hold more than `Config::neg_ids_held`.
    pub(super) fn recount_ids(&mut self, relay: RelayId) -> bool {
        let count = self.conn(relay).map_or(0, |c| c.ids_in_hand());
        self.listings.ids.recount(relay.index(), count);
        self.listings.ids.over()
    }

    /// Job `id` of `relay` took the ids held over all relays past the
    /// bound: it goes to REQ paging, which needs no ids held.
    fn over_id_budget(&mut self, relay: RelayId, id: u64, now: Time) {
        self.stats.neg_over_id_budget += 1;
        if let Some(n) = self.log_budget.admit(relay.index(), now) {
            info!(
                "{}: negentropy job {id:x} would hold ids past the bound of {} over all relays; REQ{}",
                self.relay_url(relay),
                self.listings.ids.max(),
                dropped(n)
            );
        }
        self.job_to_req(relay, id, ToReq::Failed, now);
        self.recount_ids(relay);
    }

    /// Offers free room to the relay whose turn is next, if one waits;
    /// false when none was offered (no room, or no one waits).
    pub(super) fn offer_turn(&mut self, now: Time) -> bool {
        let Some(relay) = self.listings.turns.next_turn() else {
            return false;
        };
        self.schedule(relay, now);
        self.listings.turns.end_turn();
        true
    }

    /// Job `id` of `relay`'s connection.
    fn neg_job_mut(&mut self, relay: RelayId, id: u64) -> Option<&mut NegJob> {
        self.flight_mut(relay)?.neg_jobs.get_mut(&id)
    }

    /// Removes job `id` of `relay`, freeing its room and, at the next
    /// sweep, its listings.
    fn end_job(&mut self, relay: RelayId, id: u64) -> Option<NegJob> {
        let job = self.flight_mut(relay)?.neg_jobs.remove(&id)?;
        self.listings.turns.ended(relay, id);
        self.listings.cache.jobs_ended(1);
        Some(job)
    }

    /// Starts a job for packed chunks `work` with their REQ `filters`
    /// (admitted by [`Engine::neg_admit`]): joins or asks the sink's listing
    /// of each filter. Called by the scheduler, so nothing here schedules.
    pub(super) fn start_neg_job(
        &mut self,
        relay: RelayId,
        work: Vec<WorkRef>,
        filters: Vec<Encoded>,
        now: Time,
    ) {
        let id = self.next_sub;
        self.next_sub += 1;
        self.listings.turns.started(relay, id);
        let in_flight = self.listings.turns.in_flight() as u64;
        self.stats.neg_jobs_peak = self.stats.neg_jobs_peak.max(in_flight);
        let filters: Vec<Filter> = filters
            .into_iter()
            .map(|e| {
                let mut f = e.filter;
                f.limit = None;
                f
            })
            .collect();
        let mut held = Vec::new();
        let stale_after = self.listing_timeout();
        for (i, filter) in filters.iter().enumerate() {
            for part in parts(filter) {
                let waiter = (relay, id, held.len());
                let key = part.as_json();
                match self.listings.cache.join(key, waiter, now, stale_after) {
                    Join::Ready(listed) => held.push((i, Some(listed))),
                    Join::Wait => held.push((i, None)),
                    Join::Ask(request) => {
                        held.push((i, None));
                        self.actions.push_back(Action::ListLocal {
                            request,
                            filter: part,
                        });
                    }
                }
            }
        }
        let job = NegJob {
            work,
            held,
            filters,
            current: 0,
            session: None,
            need: Vec::new(),
            asked: Vec::new(),
            started: now,
            progress: now,
            second: None,
        };
        self.insert_job(relay, id, job, now);
        self.job_listed(relay, id, now);
    }

    /// Records job `id` (its room taken) and arms its progress deadline.
    fn insert_job(&mut self, relay: RelayId, id: u64, job: NegJob, now: Time) {
        let Some(flight) = self.start_flight(relay) else {
            return;
        };
        flight.neg_jobs.insert(id, job);
        self.arm_conn(
            now + self.config.neg_timeout,
            relay,
            ConnTimer::NegTimeout(id),
        );
    }

    /// Starts a job over saturated second `sat` for the chain that found
    /// it (its `work`, `scope` and start): nothing is listed, the relay
    /// lists every id it holds in that second. It takes room like any job
    /// but is not made to wait for its turn: it holds no listing, and the
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
        let id = self.next_sub;
        self.next_sub += 1;
        self.listings.turns.started(relay, id);
        let mut filter = sat.filter.clone();
        filter.limit = None;
        let nothing: Held = Vec::new().into();
        let job = NegJob {
            work,
            held: vec![(0, Some(nothing))],
            filters: vec![filter],
            current: 0,
            session: None,
            need: Vec::new(),
            asked: Vec::new(),
            started,
            progress: now,
            second: Some((sat, scope)),
        };
        self.insert_job(relay, id, job, now);
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
    /// for it reconciles once all its filters are listed.
    pub(super) fn local_listed(
        &mut self,
        now: Time,
        request: u64,
        held: Option<Vec<(EventId, Timestamp)>>,
    ) {
        let Some(held) = held else {
            info!("the sink cannot list what it holds; negentropy off");
            self.listings.sink_lists = false;
            let waiters = self.listings.cache.unanswerable();
            return self.waiters_to_req(waiters, now);
        };
        let (listed, waiters) = self.listings.cache.answered(request, held);
        for (relay, id, i) in waiters {
            let Some(job) = self.neg_job_mut(relay, id) else {
                continue;
            };
            job.progress = now;
            if let Some((_, slot)) = job.held.get_mut(i) {
                *slot = Some(listed.clone());
            }
            self.job_listed(relay, id, now);
        }
        drop(listed);
        self.after_jobs_ended(now);
    }

    /// The sink will not list `request`: its waiting jobs end in REQ now
    /// (a job waiting on it would only time out later and do the same).
    pub(super) fn local_unlisted(&mut self, now: Time, request: u64) {
        let waiters = self.listings.cache.refused(request);
        self.waiters_to_req(waiters, now);
    }

    /// Jobs that waited for listings that will not come end in REQ.
    fn waiters_to_req(&mut self, waiters: Vec<Waiter>, now: Time) {
        for (relay, id, _) in waiters {
            self.requeue_job(relay, id, ToReq::Failed, now);
        }
        self.after_jobs_ended(now);
    }

    /// Once every filter of the job is listed: to REQ if the sink holds
    /// nothing for any (negentropy would only add a round), else the first
    /// session. Schedules nothing itself: its callers flush.
    fn job_listed(&mut self, relay: RelayId, id: u64, now: Time) {
        let Some(job) = self.conn(relay).and_then(|c| c.flight()?.neg_jobs.get(&id)) else {
            return;
        };
        if job.held.iter().any(|(_, h)| h.is_none()) {
            return;
        }
        if job
            .held
            .iter()
            .filter_map(|(_, h)| h.as_ref())
            .all(|h| h.is_empty())
        {
            // Not a failure: counted apart from fallbacks.
            debug!("{}: nothing held locally; REQ", self.relay_url(relay));
            return self.requeue_job(relay, id, ToReq::NothingHeld, now);
        }
        self.open_session(relay, id, now);
    }

    /// Sends `NEG-OPEN` for the job's current filter. The job keeps its
    /// share of the listing until it ends, so jobs of other relays asking
    /// the same filter meanwhile use it too.
    fn open_session(&mut self, relay: RelayId, id: u64, now: Time) {
        let limit = self.relays[relay.index()].facts.limits.message_bytes;
        let Some(job) = self.neg_job_mut(relay, id) else {
            return;
        };
        let current = job.current;
        let filter = &job.filters[current];
        let held = job
            .held
            .iter()
            .filter(|(i, _)| *i == current)
            .filter_map(|(_, h)| h.as_deref())
            .flatten()
            .copied();
        let started = Reconciliation::start(&format!("{id:x}"), filter, held, limit);
        match started {
            Ok((session, open)) => {
                if let Some(job) = self.neg_job_mut(relay, id) {
                    job.session = Some(session);
                }
                self.stats.neg_sessions += 1;
                self.actions.push_back(Action::Send {
                    relay,
                    message: open,
                });
            }
            Err(e) => {
                debug!("{}: {e:?}; REQ", self.relay_url(relay));
                self.requeue_job(relay, id, ToReq::Failed, now);
            }
        }
    }

    /// A `NEG-MSG` or `NEG-ERR` from `relay`.
    pub(super) fn on_neg_message(
        &mut self,
        relay: RelayId,
        sub: Option<u64>,
        message: &RelayMessage<'_>,
        now: Time,
    ) {
        let Some(id) = sub else { return };
        let Some(job) = self.neg_job_mut(relay, id) else {
            return;
        };
        job.progress = now;
        let Some(session) = job.session.as_mut() else {
            return;
        };
        let answered_before = session.answered();
        let Some(step) = session.handle(message) else {
            return;
        };
        if matches!(message, RelayMessage::NegMsg { .. }) {
            self.stats.neg_rounds += 1;
        }
        match step {
            Step::Send(text) => {
                if self.recount_ids(relay) {
                    self.send_neg_close(relay, id);
                    return self.over_id_budget(relay, id, now);
                }
                self.actions.push_back(Action::Send {
                    relay,
                    message: text,
                });
            }
            Step::Done { need, close } => {
                self.actions.push_back(Action::Send {
                    relay,
                    message: close,
                });
                self.relay(relay).facts.neg = NegSupport::Supported;
                self.filter_reconciled(relay, id, need, now);
            }
            Step::Failed { reason, close } => {
                if let Some(n) = self.log_budget.admit(relay.index(), now) {
                    let url = self.relay_url(relay);
                    info!(
                        "{url}: negentropy failed: {}{}",
                        relay_text(&reason),
                        dropped(n)
                    );
                }
                if let Some(close) = close {
                    self.actions.push_back(Action::Send {
                        relay,
                        message: close,
                    });
                }
                let refusal = Refusal::of_closed(&reason);
                let why = if refusal == Refusal::TooManySubscriptions {
                    self.neg_limit_refusal(relay)
                } else if answered_before
                    || matches!(refusal, Refusal::BadValue { .. })
                    || too_big(&reason)
                {
                    // A refused value, or a filter matching more than the
                    // relay reconciles at once, says nothing of NIP-77:
                    // REQ reads this job, negentropy the next.
                    ToReq::Failed
                } else {
                    ToReq::Unsupported
                };
                self.job_to_req(relay, id, why, now);
            }
        }
    }

    /// A NOTICE refusing a negentropy session for the relay's limit
    /// (strfry: `ERROR: too many concurrent NEG requests`), naming none:
    /// the newest session not answered yet is the refused one. True when
    /// the notice was one.
    pub(super) fn neg_limit_notice(&mut self, relay: RelayId, text: &str, now: Time) -> bool {
        let lower = text.to_ascii_lowercase();
        let names_neg =
            lower.contains("neg ") || lower.contains("neg-") || lower.contains("negentropy");
        if !names_neg || Refusal::of_notice(text) != Some(Refusal::TooManySubscriptions) {
            return false;
        }
        let refused = self.unanswered_sessions(relay).max();
        info!(
            "{}: negentropy session refused for its limit: {}",
            self.relay_url(relay),
            relay_text(text)
        );
        let why = self.neg_limit_refusal(relay);
        if let Some(id) = refused {
            self.job_to_req(relay, id, why, now);
        }
        true
    }

    /// A session refused for the relay's limit: the limit falls to what is
    /// open besides it, and the job waits for room. If nothing else of
    /// ours is open, the relay refuses even one (sessions counted that we
    /// cannot see): waiting would ask again at once, forever, so the job
    /// goes to REQ.
    fn neg_limit_refusal(&mut self, relay: RelayId) -> ToReq {
        let open = self.open_sessions(relay);
        self.lower_neg_limit(relay);
        if open > 1 {
            ToReq::Limit
        } else {
            ToReq::Failed
        }
    }

    /// The relay refused one session more than it allows: it allows those
    /// open besides that one.
    fn lower_neg_limit(&mut self, relay: RelayId) {
        let open = self.open_sessions(relay);
        let limits = &mut self.relay(relay).facts.limits;
        limits.neg_sessions = open.saturating_sub(1).clamp(1, limits.neg_sessions);
        debug!(
            "{}: negentropy sessions now at most {}",
            self.relay_url(relay),
            self.relays[relay.index()].facts.limits.neg_sessions
        );
    }

    /// A NOTICE; true when it told a job's relay that NEG is unknown there.
    pub(super) fn neg_notice(&mut self, relay: RelayId, text: &str, now: Time) -> bool {
        if !means_unsupported(text) {
            return false;
        }
        let waiting: Vec<u64> = self.unanswered_sessions(relay).collect();
        for &id in &waiting {
            self.job_to_req(relay, id, ToReq::Unsupported, now);
        }
        !waiting.is_empty()
    }

    /// Jobs of `relay` whose session is open.
    fn open_sessions(&self, relay: RelayId) -> usize {
        self.conn(relay).map_or(0, |c| {
            let jobs = c.flight().into_iter().flat_map(|f| f.neg_jobs.values());
            jobs.filter(|j| j.session.is_some()).count()
        })
    }

    /// Jobs of `relay` whose session the relay has not answered yet.
    fn unanswered_sessions(&self, relay: RelayId) -> impl Iterator<Item = u64> + '_ {
        let jobs = self
            .conn(relay)
            .into_iter()
            .flat_map(|c| c.flight())
            .flat_map(|f| &f.neg_jobs);
        jobs.filter(|(_, j)| j.session.as_ref().is_some_and(|s| !s.answered()))
            .map(|(id, _)| *id)
    }

    /// The job's current filter is reconciled: on to the next, or fetch.
    fn filter_reconciled(&mut self, relay: RelayId, id: u64, need: Vec<EventId>, now: Time) {
        let Some(job) = self.neg_job_mut(relay, id) else {
            return;
        };
        job.current += 1;
        job.session = None;
        // The filters of one job overlap (a NIP-22 reply tags its root with
        // both `E` and `e`): an id two of them miss is one event to fetch,
        // and counted twice it sent a 10,001-reply issue to REQ paging.
        job.need.extend(need);
        job.need.sort_unstable();
        job.need.dedup();
        let more = job.current < job.filters.len();
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
        let asked = std::mem::take(&mut job.asked);
        job.need.retain(|id| asked.binary_search(id).is_err());
        self.fetch_needed(relay, job, now);
        self.after_jobs_ended(now);
    }

    /// Fetches what job `id`'s finished filters found missing while its
    /// next filter is reconciled, instead of after it: in a first sync of
    /// one issue with 20,000 replies, the `#E` session over 20,000 items
    /// otherwise ran while nothing was fetched. The ids stay in the job
    /// (`asked`) so the next filter does not ask them again, so they are
    /// held twice while their REQs wait: only done while the bound on ids
    /// held leaves room for that and for the next filter finding as many
    /// again. Each fetch REQ counts one more completion of the job's
    /// chunks; the job keeps its own.
    fn fetch_ahead(&mut self, relay: RelayId, id: u64, now: Time) {
        let room = self
            .listings
            .ids
            .max()
            .saturating_sub(self.listings.ids.held());
        let Some(job) = self.neg_job_mut(relay, id) else {
            return;
        };
        if job.second.is_some() || job.need.is_empty() || 2 * job.need.len() > room {
            return;
        }
        let mut need = std::mem::take(&mut job.need);
        need.retain(|id| job.asked.binary_search(id).is_err());
        if need.is_empty() {
            return;
        }
        job.asked.extend_from_slice(&need);
        job.asked.sort_unstable();
        let (work, started) = (job.work.clone(), job.started);
        self.stats.neg_fetched_ahead += 1;
        self.fetch_ids(relay, need, &work, started, false, now);
        self.recount_ids(relay);
    }

    /// Fetches the missing ids, one `ids` REQ per filter (relays cap the
    /// results of one REQ, not of one filter). An id already seen was
    /// passed to the sink, or came from the own relay's live stream, since
    /// the listing was made (a listing shared between jobs can predate
    /// both): fetching it again would only bring a duplicate. The REQs wait
    /// for free subscription slots in the follow-up page queue like any
    /// historic page: thousands of missing ids after a long downtime must
    /// not open more REQs than the relay allows, or its refusals fail the
    /// job. Each REQ carries the job's chunks, and their batches count one
    /// completion per REQ, so the batches confirm when the last fetch
    /// reaches EOSE.
    fn fetch_needed(&mut self, relay: RelayId, job: NegJob, now: Time) {
        if job.second.is_none() {
            self.relay(relay).mark_uncovered(job.started);
        }
        self.fetch_ids(relay, job.need, &job.work, job.started, true, now);
    }

    /// Queues `ids` REQs for `need` (less what was seen or refused since)
    /// as follow-up pages of chunks `work`. Each REQ completes the chunks
    /// once; `last` when these end the job's own chain, which then counts
    /// as the first of them (or completes at once if none is needed).
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
        self.stats.neg_ids_fetched += need.len() as u64;
        info!(
            "{}: negentropy found {} events missing",
            self.relay_url(relay),
            need.len()
        );
        let state = &self.relays[relay.index()];
        let max_ids = IDS_PER_FILTER.min(self.page_limit(relay)).max(1);
        let groups = fetch_filters(&need, max_ids, state.facts.limits.message_bytes);
        if groups.is_empty() {
            if last {
                for w in work {
                    self.complete_chunk(relay, w.batch, now);
                }
                self.dirty.push(relay);
            }
            return;
        }
        let extra = groups.len() as u32 - u32::from(last);
        let Some(flight) = self.start_flight(relay) else {
            return;
        };
        for w in work {
            if let Some(b) = flight.batches.get_mut(&w.batch) {
                b.chunks_left += extra;
            }
        }
        for group in groups {
            flight.next_pages.push_back(NextPage {
                filters: vec![PageFilter::first(group.filter)],
                scope: Scope::Exact,
                work: work.to_vec(),
                page: 1,
                started,
                reconcile: None,
            });
        }
        self.dirty.push(relay);
        self.flush(now);
    }

    /// Moves a job's chunks to the REQ path, for reason `why`, and lets
    /// waiting relays have its room.
    fn job_to_req(&mut self, relay: RelayId, id: u64, why: ToReq, now: Time) {
        self.requeue_job(relay, id, why, now);
        self.after_jobs_ended(now);
    }

    /// Moves a job's chunks to the front of the relay's queue, marked for
    /// REQ; schedules nothing (the scheduler calls this).
    fn requeue_job(&mut self, relay: RelayId, id: u64, why: ToReq, now: Time) {
        let Some(job) = self.end_job(relay, id) else {
            return;
        };
        match why {
            ToReq::NothingHeld => self.stats.neg_skipped += 1,
            ToReq::Failed => self.stats.neg_fallbacks += 1,
            ToReq::Unsupported => {
                self.stats.neg_fallbacks += 1;
                if self.relays[relay.index()].facts.neg != NegSupport::Supported {
                    info!("{}: no negentropy; REQ from now on", self.relay_url(relay));
                    self.relay(relay).facts.neg = NegSupport::Unsupported;
                }
            }
            ToReq::Limit => self.note_refusal(relay),
        }
        if why == ToReq::Limit {
            return self.wait_for_neg_room(relay, job);
        }
        if let Some((sat, scope)) = job.second {
            // REQ already read what it could of that second: the parts
            // by kind take over from this job's chain, which ends.
            self.split_by_kind(relay, sat, scope, &job.work, job.started, now);
            for w in &job.work {
                self.complete_chunk(relay, w.batch, now);
            }
            self.dirty.push(relay);
            return;
        }
        if let Some(flight) = self.start_flight(relay) {
            flight.neg_bypass.extend(job.work.iter().map(|w| w.batch));
            for work in job.work.into_iter().rev() {
                flight.work.push_front(work);
            }
        }
        self.dirty.push(relay);
    }

    /// A job refused for the relay's session limit goes back as it was:
    /// its chunks to the front of the queue, a saturated second to the
    /// front of the follow-up pages, both for negentropy again.
    fn wait_for_neg_room(&mut self, relay: RelayId, job: NegJob) {
        let Some(flight) = self.start_flight(relay) else {
            return;
        };
        match job.second {
            Some((sat, scope)) => flight.next_pages.push_front(NextPage {
                filters: Vec::new(),
                scope,
                work: job.work,
                page: 1,
                started: job.started,
                reconcile: Some(sat),
            }),
            None => {
                for work in job.work.into_iter().rev() {
                    flight.work.push_front(work);
                }
            }
        }
        self.dirty.push(relay);
    }

    /// `relay`'s `dropped` jobs are gone (its connection, or a daily sync,
    /// cleared them): their listings and room are released.
    pub(super) fn neg_jobs_dropped(&mut self, relay: RelayId, dropped: usize, now: Time) {
        self.listings.turns.relay_ended(relay);
        self.listings.cache.jobs_ended(dropped);
        self.recount_ids(relay);
        self.after_jobs_ended(now);
    }

    /// Drops every listing no job in flight needs, and the room a burst of
    /// them left: for an engine at rest, between the sweeps jobs trigger.
    pub(super) fn shrink_listings(&mut self) {
        let relays = &self.relays;
        self.listings.cache.release(|&(relay, id, _)| {
            !relays
                .get(relay.index())
                .and_then(|s| s.conn())
                .and_then(|c| c.flight())
                .is_some_and(|f| f.neg_jobs.contains_key(&id))
        });
        self.listings.cache.shrink_to_fit();
        self.listings.turns.shrink_to_fit();
    }

    /// After jobs ended: drops the listings and room they held, schedules
    /// what they moved, and gives the room to the relays waiting for it.
    fn after_jobs_ended(&mut self, now: Time) {
        let relays = &self.relays;
        let alive = |relay: RelayId, id: u64| {
            relays
                .get(relay.index())
                .and_then(|s| s.conn())
                .and_then(|c| c.flight())
                .is_some_and(|f| f.neg_jobs.contains_key(&id))
        };
        self.listings
            .cache
            .release_due(|&(relay, id, _)| !alive(relay, id));
        self.flush(now);
    }

    /// Every job holds room and no room is held by a job that is gone.
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn check_neg_room(&self) -> Result<(), String> {
        let mut jobs = 0;
        for (i, relay) in self.relays.iter().enumerate() {
            let id = RelayId(i as u32);
            let Some(conn) = relay.conn() else {
                continue;
            };
            jobs += conn.neg_jobs();
            if let Some(job) = conn
                .flight()
                .into_iter()
                .flat_map(|f| f.neg_jobs.keys())
                .find(|&&j| !self.listings.turns.holds(id, j))
            {
                return Err(format!("{}: job {job} holds no room", self.relay_url(id)));
            }
        }
        let held = self.listings.turns.in_flight();
        if held != jobs {
            return Err(format!("{held} jobs hold room, {jobs} exist"));
        }
        let conns = self.relays.iter().filter_map(|r| r.conn());
        let ids: usize = conns.map(|c| c.ids_in_hand()).sum();
        if ids != self.listings.ids.held() {
            return Err(format!(
                "{ids} ids held, {} counted",
                self.listings.ids.held()
            ));
        }
        Ok(())
    }

    /// Forgets the room of jobs that no longer exist. Every path that ends
    /// a job frees its room at once; this periodic check makes sure a path
    /// that forgot cannot leak room for good (negentropy would stop).
    pub(super) fn prune_turns(&mut self) {
        let relays = &self.relays;
        self.listings.turns.retain(|relay, id| {
            relays
                .get(relay.index())
                .and_then(|s| s.conn())
                .and_then(|c| c.flight())
                .is_some_and(|f| f.neg_jobs.contains_key(&id))
        });
    }

    /// `relay` is read again: each of its sessions counts as progressing
    /// now, so it gets a whole `neg_timeout` to be heard.
    pub(super) fn neg_reads_resumed(&mut self, relay: RelayId, now: Time) {
        let Some(conn) = self
            .relays
            .get_mut(relay.index())
            .and_then(|s| s.conn_mut())
        else {
            return;
        };
        if !std::mem::take(&mut conn.reads_paused) {
            return;
        }
        for job in conn
            .flight_mut()
            .into_iter()
            .flat_map(|f| f.neg_jobs.values_mut())
        {
            if job.session.is_some() {
                job.progress = now;
            }
        }
    }

    /// No progress on a job within `neg_timeout`: a relay that never
    /// answered `NEG-OPEN` does not speak negentropy; a job that stalled
    /// later goes back to REQ.
    pub(super) fn on_neg_timeout(&mut self, relay: RelayId, id: u64, now: Time) {
        let Some(conn) = self.conn(relay) else {
            return;
        };
        let Some(job) = conn.flight().and_then(|f| f.neg_jobs.get(&id)) else {
            return;
        };
        let timeout = match job.session {
            Some(_) => self.config.neg_timeout,
            None => self.listing_timeout(),
        };
        if job.session.is_some() && conn.reads_paused {
            // Its answer may wait unread: asked again once reads resume.
            self.arm_conn(now + timeout, relay, ConnTimer::NegTimeout(id));
            return;
        }
        if now < job.progress + timeout {
            let at = job.progress + timeout;
            self.arm_conn(at, relay, ConnTimer::NegTimeout(id));
            return;
        }
        let silent = job.session.as_ref().is_some_and(|s| !s.answered());
        let waited = match job.session {
            Some(_) => "",
            None => " waiting for the own relay's listings",
        };
        info!(
            "{}: negentropy job {id:x} timed out{waited}",
            self.relay_url(relay)
        );
        if job.session.is_some() {
            self.send_neg_close(relay, id);
        }
        let why = if silent {
            ToReq::Unsupported
        } else {
            ToReq::Failed
        };
        self.job_to_req(relay, id, why, now);
    }
}
