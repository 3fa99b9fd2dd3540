//! Historic sync by NIP-77 negentropy: fetch only what the sink lacks.
//!
//! A fresh connect, a stale reconnect and the daily sync all re-read a
//! relay's whole history for every targeted item; almost all of it is
//! already stored. Where the relay speaks negentropy, each packed chunk of
//! historic work becomes a job instead of a REQ:
//!
//! 1. **Listing**: the shell asks the sink what it holds for the chunk's
//!    filter (`Action::ListLocal`, answered by `handle_local_list`).
//! 2. **Reconciling**: one `NEG-OPEN`/`NEG-MSG` exchange per filter
//!    ([`Reconciliation`]), gathering the ids the relay has and we lack.
//! 3. **Fetching**: those ids by `ids` REQs, which complete the chunk's
//!    batches exactly like the REQ path does at EOSE.
//!
//! Anything short of that falls back to REQ + pagination for the job: a
//! sink that cannot list, nothing held locally (negentropy would only add a
//! round), or a failed session. A relay that shows it does not speak
//! negentropy (`NEG-ERR`, a `NOTICE` saying so before its first `NEG-MSG`,
//! or no answer within `neg_timeout`) is remembered and never asked again.

use std::borrow::Cow;
use std::collections::HashMap;

use log::{debug, info};
use nostr::prelude::{ClientMessage, EventId, Filter, RelayMessage, SubscriptionId, Timestamp};

use super::{Action, Engine, Status, Timer};
use crate::sans_io::filters::Encoded;
use crate::sans_io::index::RelayId;
use crate::sans_io::reconcile::{
    IDS_PER_FILTER, MAX_NEED, Reconciliation, Step, fetch_filters, means_unsupported,
};
use crate::sans_io::relay_text::{dropped, relay_text};
use crate::sans_io::subscription::{NextPage, PageFilter, Scope, WorkRef};
use crate::sans_io::time::Time;

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

/// The engine's side of the sink's listings.
#[derive(Debug)]
pub(super) struct Listings {
    /// The sink can list what it holds (until it says it cannot).
    sink_lists: bool,
    /// Open `ListLocal` requests: relay, negentropy job, filter index.
    open: HashMap<u64, (RelayId, u64, usize)>,
    /// The id of the next `ListLocal` request.
    next: u64,
}

impl Default for Listings {
    fn default() -> Self {
        Listings {
            sink_lists: true,
            open: HashMap::new(),
            next: 0,
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
}

/// One packed chunk of historic work done by negentropy.
pub(super) struct NegJob {
    /// Chunks of pending batches this job completes.
    work: Vec<WorkRef>,
    /// The chunk's filters (without `limit`), reconciled one at a time.
    filters: Vec<Filter>,
    /// What the sink holds for each filter, as its answers come in (taken
    /// when the filter's session starts).
    held: Vec<Option<Vec<(EventId, Timestamp)>>>,
    /// The filter being reconciled.
    current: usize,
    /// The session of the current filter.
    session: Option<Reconciliation>,
    /// Ids found missing so far.
    need: Vec<EventId>,
    /// When the job started: live coverage of its items begins there.
    started: Time,
    /// Last sign of progress (a list or a relay answer), for the timeout.
    progress: Time,
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

impl Engine {
    /// True when `relay`'s next historic chunk should go by negentropy.
    pub(super) fn negentropy_usable(&self, relay: RelayId) -> bool {
        self.config.negentropy
            && self.listings.sink_lists
            && relay != self.own
            && self.relays[relay.index()].neg != NegSupport::Unsupported
    }

    /// Starts a job for packed chunks `work` with their REQ `filters`:
    /// asks the sink for what it holds of each filter.
    pub(super) fn start_neg_job(
        &mut self,
        relay: RelayId,
        work: Vec<WorkRef>,
        filters: Vec<Encoded>,
        now: Time,
    ) {
        let id = self.next_sub;
        self.next_sub += 1;
        let filters: Vec<Filter> = filters
            .into_iter()
            .map(|e| {
                let mut f = e.filter;
                f.limit = None;
                f
            })
            .collect();
        for (i, filter) in filters.iter().enumerate() {
            let request = self.listings.next;
            self.listings.next += 1;
            self.listings.open.insert(request, (relay, id, i));
            let filter = filter.clone();
            self.actions
                .push_back(Action::ListLocal { request, filter });
        }
        let job = NegJob {
            work,
            held: vec![None; filters.len()],
            filters,
            current: 0,
            session: None,
            need: Vec::new(),
            started: now,
            progress: now,
        };
        let state = self.relay(relay);
        let epoch = state.epoch;
        state.neg_jobs.insert(id, job);
        self.arm(
            now + self.config.neg_timeout,
            Timer::NegTimeout(relay, epoch, id),
        );
    }

    /// The sink's answer to listing request `request`: the job waiting for
    /// it reconciles once every filter of it is listed.
    pub(super) fn local_listed(
        &mut self,
        now: Time,
        request: u64,
        held: Option<Vec<(EventId, Timestamp)>>,
    ) {
        let Some((relay, id, i)) = self.listings.open.remove(&request) else {
            return;
        };
        let Some(held) = held else {
            info!("the sink cannot list what it holds; negentropy off");
            self.listings.sink_lists = false;
            return self.job_to_req(relay, id, ToReq::Failed, now);
        };
        let Some(job) = self.relay(relay).neg_jobs.get_mut(&id) else {
            return;
        };
        job.progress = now;
        if let Some(slot) = job.held.get_mut(i) {
            *slot = Some(held);
        }
        if job.held.iter().any(Option::is_none) {
            return;
        }
        if job.held.iter().flatten().all(Vec::is_empty) {
            // Nothing to reconcile against: a plain REQ costs less. Not a
            // failure: counted apart from fallbacks.
            debug!("{}: nothing held locally; REQ", self.relay_url(relay));
            return self.job_to_req(relay, id, ToReq::NothingHeld, now);
        }
        self.open_session(relay, id, now);
    }

    /// Sends `NEG-OPEN` for the job's current filter.
    fn open_session(&mut self, relay: RelayId, id: u64, now: Time) {
        let limit = self.relays[relay.index()].limits.message_bytes;
        let Some(job) = self.relay(relay).neg_jobs.get_mut(&id) else {
            return;
        };
        let filter = job.filters[job.current].clone();
        let held = job.held[job.current].take().unwrap_or_default();
        match Reconciliation::start(&format!("{id:x}"), &filter, held, limit) {
            Ok((session, open)) => {
                job.session = Some(session);
                self.stats.neg_sessions += 1;
                self.actions.push_back(Action::Send {
                    relay,
                    message: open,
                });
            }
            Err(e) => {
                debug!("{}: {e:?}; REQ", self.relay_url(relay));
                self.job_to_req(relay, id, ToReq::Failed, now);
            }
        }
        self.flush(now);
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
        let Some(job) = self.relay(relay).neg_jobs.get_mut(&id) else {
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
            Step::Send(text) => self.actions.push_back(Action::Send {
                relay,
                message: text,
            }),
            Step::Done { need, close } => {
                self.actions.push_back(Action::Send {
                    relay,
                    message: close,
                });
                self.relay(relay).neg = NegSupport::Supported;
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
                let why = if answered_before {
                    ToReq::Failed
                } else {
                    ToReq::Unsupported
                };
                self.job_to_req(relay, id, why, now);
            }
        }
    }

    /// A NOTICE; true when it told a job's relay that NEG is unknown there.
    pub(super) fn neg_notice(&mut self, relay: RelayId, text: &str, now: Time) -> bool {
        if !means_unsupported(text) {
            return false;
        }
        let waiting: Vec<u64> = self.relays[relay.index()]
            .neg_jobs
            .iter()
            .filter(|(_, j)| j.session.as_ref().is_some_and(|s| !s.answered()))
            .map(|(id, _)| *id)
            .collect();
        for &id in &waiting {
            self.job_to_req(relay, id, ToReq::Unsupported, now);
        }
        !waiting.is_empty()
    }

    /// The job's current filter is reconciled: on to the next, or fetch.
    fn filter_reconciled(&mut self, relay: RelayId, id: u64, need: Vec<EventId>, now: Time) {
        let Some(job) = self.relay(relay).neg_jobs.get_mut(&id) else {
            return;
        };
        job.current += 1;
        job.session = None;
        job.need.extend(need);
        if job.need.len() > MAX_NEED {
            info!(
                "{}: negentropy job {id:x} found over {MAX_NEED} ids missing; REQ",
                self.relay_url(relay)
            );
            return self.job_to_req(relay, id, ToReq::Failed, now);
        }
        if job.current < job.filters.len() {
            return self.open_session(relay, id, now);
        }
        let Some(job) = self.relay(relay).neg_jobs.remove(&id) else {
            return;
        };
        self.fetch_needed(relay, job, now);
    }

    /// Fetches the missing ids, one `ids` REQ per filter (relays cap the
    /// results of one REQ, not of one filter). The REQs wait for free
    /// subscription slots in the follow-up page queue like any historic
    /// page: thousands of missing ids after a long downtime must not open
    /// more REQs than the relay allows, or its refusals fail the job. Each
    /// REQ carries the job's chunks, and their batches count one
    /// completion per REQ, so the batches confirm when the last fetch
    /// reaches EOSE.
    fn fetch_needed(&mut self, relay: RelayId, mut job: NegJob, now: Time) {
        job.need.sort_unstable();
        job.need.dedup();
        self.stats.neg_ids_fetched += job.need.len() as u64;
        info!(
            "{}: negentropy found {} events missing",
            self.relay_url(relay),
            job.need.len()
        );
        self.relay(relay).mark_uncovered(job.started);
        let state = &self.relays[relay.index()];
        let max_ids = IDS_PER_FILTER.min(self.page_limit(relay)).max(1);
        let groups = fetch_filters(&job.need, max_ids, state.limits.message_bytes);
        if groups.is_empty() {
            for w in &job.work {
                self.complete_chunk(relay, w.batch);
            }
            self.dirty.push(relay);
            return;
        }
        let extra = groups.len() as u32 - 1;
        let state = self.relay(relay);
        for w in &job.work {
            if let Some(b) = state.batches.get_mut(&w.batch) {
                b.chunks_left += extra;
            }
        }
        for group in groups {
            state.next_pages.push_back(NextPage {
                filters: vec![first_page(group.filter)],
                scope: Scope::Exact,
                work: job.work.clone(),
                page: 1,
                started: job.started,
            });
        }
        self.dirty.push(relay);
        self.flush(now);
    }

    /// Moves a job's chunks to the REQ path, for reason `why`.
    fn job_to_req(&mut self, relay: RelayId, id: u64, why: ToReq, now: Time) {
        let Some(job) = self.relay(relay).neg_jobs.remove(&id) else {
            return;
        };
        self.forget_lists(relay, Some(id));
        match why {
            ToReq::NothingHeld => self.stats.neg_skipped += 1,
            ToReq::Failed => self.stats.neg_fallbacks += 1,
            ToReq::Unsupported => {
                self.stats.neg_fallbacks += 1;
                if self.relays[relay.index()].neg != NegSupport::Supported {
                    info!("{}: no negentropy; REQ from now on", self.relay_url(relay));
                    self.relay(relay).neg = NegSupport::Unsupported;
                }
            }
        }
        let state = self.relay(relay);
        state.neg_bypass.extend(job.work.iter().map(|w| w.batch));
        for work in job.work.into_iter().rev() {
            state.work.push_front(work);
        }
        self.dirty.push(relay);
        self.flush(now);
    }

    /// Drops unanswered `ListLocal` requests of `relay` (of job `id`, or all).
    pub(super) fn forget_lists(&mut self, relay: RelayId, id: Option<u64>) {
        self.listings
            .open
            .retain(|_, (r, j, _)| *r != relay || id.is_some_and(|id| id != *j));
    }

    /// No progress on a job within `neg_timeout`: a relay that never
    /// answered `NEG-OPEN` does not speak negentropy; a job that stalled
    /// later goes back to REQ.
    pub(super) fn on_neg_timeout(&mut self, relay: RelayId, epoch: u32, id: u64, now: Time) {
        let state = &self.relays[relay.index()];
        if state.epoch != epoch || state.status != Status::Connected {
            return;
        }
        let Some(job) = state.neg_jobs.get(&id) else {
            return;
        };
        // Listings wait in line at the own relay behind every other relay's
        // (thousands after a restart): that is not the remote's silence.
        let timeout = match job.session {
            Some(_) => self.config.neg_timeout,
            None => self
                .config
                .neg_timeout
                .saturating_mul(LISTING_TIMEOUT_FACTOR),
        };
        if now < job.progress + timeout {
            let at = job.progress + timeout;
            self.arm(at, Timer::NegTimeout(relay, epoch, id));
            return;
        }
        let silent = job.session.as_ref().is_some_and(|s| !s.answered());
        info!("{}: negentropy job {id:x} timed out", self.relay_url(relay));
        if job.session.is_some() {
            let subscription_id = Cow::Owned(SubscriptionId::new(format!("{id:x}")));
            let message = ClientMessage::NegClose { subscription_id }.as_json();
            self.actions.push_back(Action::Send { relay, message });
        }
        let why = if silent {
            ToReq::Unsupported
        } else {
            ToReq::Failed
        };
        self.job_to_req(relay, id, why, now);
    }
}

/// The first page of an `ids` fetch: no previous page to compare with.
fn first_page(filter: Filter) -> PageFilter {
    PageFilter {
        filter,
        prev: 0,
        prev_short: false,
        prev_oldest: None,
    }
}
