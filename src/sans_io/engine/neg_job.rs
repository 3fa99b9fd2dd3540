//! A NIP-77 job: one packed chunk of historic work done by negentropy,
//! a connection's jobs, and what a relay showed of NIP-77 ([`NegSupport`],
//! one of its facts).
//!
//! A [`NegJob`] lives in its connection's `Flight` (in [`NegJobs`]) and
//! dies with the socket. It owns its listings' shares (`listing_cache`),
//! its session ([`Reconciliation`]) and the ids it found; its steps here
//! return what the engine applies (`nip77`: the pipeline over all
//! relays, and the routing).

use std::collections::HashMap;

use nostr::prelude::{EventId, Filter, RelayMessage, Timestamp};

use super::listing_cache::Listed;
use crate::sans_io::query::reconcile::{LimitTooSmall, Reconciliation, Step};
use crate::sans_io::query::subscription::{Saturated, Scope, WorkRef};
use crate::sans_io::timing::time::Time;

/// Splits of a filter refused for its size ([`NegJob::split_current`])
/// one job may make. Each split costs a refused `NEG-OPEN` and one more
/// session: a hostile relay refusing windows down to single events could
/// otherwise make one job open a session per event the sink holds. Halving
/// at the sink's median, 32 splits reconcile a filter at least 16 times
/// what the relay takes at once; past them the job reads by REQ, as it
/// did before windows.
const MAX_SIZE_SPLITS: u32 = 32;

/// A time window of a filter: `since` and `until`, both inclusive like
/// nostr's; `None` leaves the filter's own bound.
type Window = (Option<Timestamp>, Option<Timestamp>);

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

impl NegSupport {
    /// What is known: `None` not tried yet, else whether it speaks NIP-77.
    pub(super) fn known(self) -> Option<bool> {
        match self {
            NegSupport::Unknown => None,
            NegSupport::Supported => Some(true),
            NegSupport::Unsupported => Some(false),
        }
    }
}

/// Where a job stands once a listing came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Listings {
    /// Some part is not listed yet.
    Waiting,
    /// Every part is listed, and the sink holds nothing for any.
    Empty,
    /// Every part is listed: reconcile.
    Ready,
}

/// What a job's timer finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Due {
    /// Not stalled: look again at this time.
    At(Time),
    /// Stalled: in a session or waiting for listings, and whether the
    /// session never heard from the relay.
    Now { in_session: bool, silent: bool },
}

/// One packed chunk of historic work done by negentropy.
pub(super) struct NegJob {
    /// Chunks of pending batches this job completes.
    work: Vec<WorkRef>,
    /// The chunk's filters (without `limit`), reconciled one at a time.
    filters: Vec<Filter>,
    /// The listing of each part of each filter (`listing_cache`): the
    /// filter's index and the part's listing as it comes in (shared with
    /// other jobs, kept until the job ends).
    listings: Vec<(usize, Option<Listed>)>,
    /// The filter being reconciled.
    current: usize,
    /// The current filter's time windows left to reconcile, the one being
    /// reconciled last; empty, the whole filter. A relay refuses a filter
    /// matching more than it reconciles at once, and each window of it is
    /// reconciled apart ([`NegJob::split_current`]) instead of paging
    /// the whole history by REQ.
    windows: Vec<Window>,
    /// Splits made so far ([`MAX_SIZE_SPLITS`]).
    splits: u32,
    /// The session of the current filter.
    session: Option<Reconciliation>,
    /// Our other sessions open on the connection when the current one
    /// opened. The relay reads a connection's messages in order, so these
    /// are the sessions it counted against its limit when it judged this
    /// one, even if they have ended since.
    opened_beside: usize,
    /// Ids found missing so far.
    need: Vec<EventId>,
    /// Ids its finished filters found and it already fetches
    /// ([`NegJob::take_ahead`]), sorted: a later filter finding them
    /// again does not ask them twice.
    asked: Vec<EventId>,
    /// When the job started: live coverage of its items begins there.
    started: Time,
    /// Last sign of progress (a list or a relay answer), for the timeout.
    progress: Time,
    /// A saturated second reconciled against nothing listed
    /// (`saturated`): what the relay lists there is fetched. It has no REQ
    /// to fall back to (REQ already read what it could), so a failure goes
    /// on to the split by kind; and the chain that found it covers it live.
    second: Option<(Saturated, Scope)>,
}

impl NegJob {
    pub(super) fn new(
        work: Vec<WorkRef>,
        filters: Vec<Filter>,
        listings: Vec<(usize, Option<Listed>)>,
        started: Time,
        now: Time,
        second: Option<(Saturated, Scope)>,
    ) -> Self {
        NegJob {
            work,
            filters,
            listings,
            current: 0,
            windows: Vec::new(),
            splits: 0,
            session: None,
            opened_beside: 0,
            need: Vec::new(),
            asked: Vec::new(),
            started,
            progress: now,
            second,
        }
    }

    /// The chunks it completes, and when it started (live coverage of its
    /// items begins there).
    pub(super) fn chain(&self) -> (&[WorkRef], Time) {
        (&self.work, self.started)
    }

    /// Once it ended: its chunks, its start, and the saturated second it
    /// reconciled, if it was one.
    pub(super) fn into_chain(self) -> (Vec<WorkRef>, Time, Option<(Saturated, Scope)>) {
        (self.work, self.started, self.second)
    }

    /// Ids in its hand: found missing by its finished filters and its
    /// session, and already fetched.
    pub(super) fn ids_in_hand(&self) -> usize {
        self.need.len()
            + self.asked.len()
            + self.session.as_ref().map_or(0, Reconciliation::need_len)
    }

    /// Part `i`'s listing came in at `now`: where the job stands.
    pub(super) fn listed(&mut self, i: usize, listed: &Listed, now: Time) -> Listings {
        self.progress = now;
        if let Some((_, slot)) = self.listings.get_mut(i) {
            *slot = Some(listed.clone());
        }
        self.listings_state()
    }

    /// A `NEG-MSG` or `NEG-ERR` for its session at `now`: the step it
    /// makes, if any, and whether the relay had answered the session
    /// before (a failure after an answer says nothing of NIP-77).
    pub(super) fn on_message(
        &mut self,
        message: &RelayMessage<'_>,
        now: Time,
    ) -> Option<(Step, bool)> {
        self.progress = now;
        let session = self.session.as_mut()?;
        let answered_before = session.answered();
        Some((session.handle(message)?, answered_before))
    }

    /// Whether every part is listed, and whether the sink holds anything.
    pub(super) fn listings_state(&self) -> Listings {
        if self.listings.iter().any(|(_, l)| l.is_none()) {
            return Listings::Waiting;
        }
        let mut all = self.listings.iter().filter_map(|(_, l)| l.as_ref());
        if all.all(|l| l.is_empty()) {
            Listings::Empty
        } else {
            Listings::Ready
        }
    }

    /// Starts the session of the current filter's window as subscription
    /// `id`, against its parts' listings inside the window, with
    /// `beside` other sessions of ours open; returns the `NEG-OPEN`.
    pub(super) fn open_session(
        &mut self,
        id: u64,
        message_bytes: usize,
        beside: usize,
    ) -> Result<String, LimitTooSmall> {
        let filter = self.window_filter();
        let listed = self.current_items();
        let (session, open) =
            Reconciliation::start(&format!("{id:x}"), &filter, listed, message_bytes)?;
        self.session = Some(session);
        self.opened_beside = beside;
        Ok(open)
    }

    /// Our other sessions the relay saw open when it judged this job's
    /// current session.
    pub(super) fn opened_beside(&self) -> usize {
        self.opened_beside
    }

    /// The window being reconciled: the top of the stack, or the whole
    /// filter.
    fn window(&self) -> Window {
        self.windows.last().copied().unwrap_or((None, None))
    }

    /// The current filter narrowed to its window: the later `since`, the
    /// earlier `until`.
    fn window_filter(&self) -> Filter {
        let (since, until) = self.window();
        let mut filter = self.filters[self.current].clone();
        filter.since = filter.since.max(since);
        filter.until = match (filter.until, until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        filter
    }

    /// The sink's listing items of the current filter inside its window.
    fn current_items(&self) -> impl Iterator<Item = (EventId, Timestamp)> + '_ {
        let current = self.current;
        let (since, until) = self.window();
        self.listings
            .iter()
            .filter(move |(i, _)| *i == current)
            .filter_map(|(_, l)| l.as_deref())
            .flatten()
            .copied()
            .filter(move |(_, t)| since.is_none_or(|s| *t >= s) && until.is_none_or(|u| *t <= u))
    }

    /// The relay refused the current window (or the whole filter) for
    /// matching more than it reconciles at once: splits it in two at the
    /// median second of the sink's items inside it, `[since, m]` then
    /// `[m + 1, until]`, each reconciled apart; the session is gone, and
    /// what it found so far with it. Returns `m`, or `None` when it cannot
    /// split: both halves must hold items of the sink (a window can only
    /// shrink where the sink's listing shows how the history spreads; all
    /// in one second, it cannot), and at most [`MAX_SIZE_SPLITS`] per job.
    pub(super) fn split_current(&mut self) -> Option<Timestamp> {
        if self.splits >= MAX_SIZE_SPLITS {
            return None;
        }
        let mut seconds: Vec<Timestamp> = self.current_items().map(|(_, t)| t).collect();
        seconds.sort_unstable();
        let &last = seconds.last()?;
        // In bounds: `seconds` is not empty, it has a last.
        let median = seconds[(seconds.len() - 1) / 2];
        // A median in the last second leaves the upper half empty: split
        // below that second instead.
        let m = if median < last {
            median
        } else {
            *seconds.iter().rev().find(|&&t| t < last)?
        };
        let (since, until) = self.window();
        self.windows.pop();
        // `m < last`, so `m + 1` does not overflow.
        let above = Timestamp::from_secs(m.as_secs() + 1);
        self.windows.push((Some(above), until));
        self.windows.push((since, Some(m)));
        self.splits += 1;
        self.session = None;
        Some(m)
    }

    /// The current window (or filter) is reconciled, finding `need`: true
    /// when another window or filter is left.
    pub(super) fn reconciled(&mut self, need: Vec<EventId>) -> bool {
        self.session = None;
        self.windows.pop();
        if self.windows.is_empty() {
            self.current += 1;
        }
        // The filters of one job overlap (a NIP-22 reply tags its root with
        // both `E` and `e`): an id two of them miss is one event to fetch,
        // and counted twice it sent a 10,001-reply issue to REQ paging.
        self.need.extend(need);
        self.need.sort_unstable();
        self.need.dedup();
        self.current < self.filters.len()
    }

    /// What its finished filters found missing, to fetch while the next
    /// filter is reconciled, when `room` ids are left under the bound:
    /// enough for these held twice (here and in their REQs) and for the
    /// next filter finding as many again. The ids stay in `asked`.
    pub(super) fn take_ahead(&mut self, room: usize) -> Option<Vec<EventId>> {
        if self.second.is_some() || self.need.is_empty() || 2 * self.need.len() > room {
            return None;
        }
        let mut need = std::mem::take(&mut self.need);
        need.retain(|id| self.asked.binary_search(id).is_err());
        if need.is_empty() {
            return None;
        }
        self.asked.extend_from_slice(&need);
        self.asked.sort_unstable();
        Some(need)
    }

    /// Whether its timer at `now` finds it stalled: a session waits
    /// `session` for progress, listings `listing`. A session's answer may
    /// wait unread while the relay's reads are `paused`: asked again once
    /// they resume.
    pub(super) fn due(
        &self,
        now: Time,
        paused: bool,
        (session, listing): (std::time::Duration, std::time::Duration),
    ) -> Due {
        let in_session = self.session.is_some();
        let timeout = if in_session { session } else { listing };
        if in_session && paused {
            return Due::At(now + timeout);
        }
        if now < self.progress + timeout {
            return Due::At(self.progress + timeout);
        }
        let silent = self.session.as_ref().is_some_and(|s| !s.answered());
        Due::Now { in_session, silent }
    }

    /// The job is done: what is left to fetch, less what was fetched ahead.
    pub(super) fn take_need(&mut self) -> Vec<EventId> {
        let asked = std::mem::take(&mut self.asked);
        let mut need = std::mem::take(&mut self.need);
        need.retain(|id| asked.binary_search(id).is_err());
        need
    }
}

/// A connection's negentropy jobs, by subscription id: they live in its
/// `Flight` and die with the socket.
#[derive(Debug, Default)]
pub(super) struct NegJobs(HashMap<u64, NegJob>);

impl NegJobs {
    /// Jobs in flight on the connection (each holds a subscription slot).
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// True with no job in flight.
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True while job `id` exists.
    pub(super) fn contains(&self, id: u64) -> bool {
        self.0.contains_key(&id)
    }

    /// Ids found missing and held by its jobs (`IdBudget`).
    pub(super) fn ids_in_hand(&self) -> usize {
        self.0.values().map(NegJob::ids_in_hand).sum()
    }

    /// The chunks its jobs complete.
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn work(&self) -> impl Iterator<Item = &WorkRef> {
        self.0.values().flat_map(|j| &j.work)
    }

    /// Gives back the room a burst of jobs left.
    pub(super) fn shrink_to_fit(&mut self) {
        self.0.shrink_to_fit();
    }

    pub(super) fn get(&self, id: u64) -> Option<&NegJob> {
        self.0.get(&id)
    }

    pub(super) fn get_mut(&mut self, id: u64) -> Option<&mut NegJob> {
        self.0.get_mut(&id)
    }

    pub(super) fn insert(&mut self, id: u64, job: NegJob) {
        self.0.insert(id, job);
    }

    pub(super) fn remove(&mut self, id: u64) -> Option<NegJob> {
        self.0.remove(&id)
    }

    /// The ids of its jobs.
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.0.keys().copied()
    }

    /// Jobs whose session is open.
    pub(super) fn in_session(&self) -> impl Iterator<Item = u64> + '_ {
        self.0
            .iter()
            .filter(|(_, j)| j.session.is_some())
            .map(|(id, _)| *id)
    }

    /// Jobs whose session the relay has not answered yet.
    pub(super) fn unanswered(&self) -> impl Iterator<Item = u64> + '_ {
        self.0
            .iter()
            .filter(|(_, j)| j.session.as_ref().is_some_and(|s| !s.answered()))
            .map(|(id, _)| *id)
    }

    /// The relay is read again at `now`: each open session counts as
    /// progressing, so it gets a whole `neg_timeout` to be heard.
    pub(super) fn reads_resumed(&mut self, now: Time) {
        for job in self.0.values_mut().filter(|j| j.session.is_some()) {
            job.progress = now;
        }
    }
}

impl std::fmt::Debug for NegJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NegJob")
            .field("work", &self.work)
            .field("filters", &self.filters.len())
            .field("current", &self.current)
            .field("windows", &self.windows.len())
            .field("reconciling", &self.session.is_some())
            .field("need", &self.need.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::Kind;

    const T: Time = Time::from_secs(1_000);

    /// A job over `filters`, each listed as the seconds in `seconds`.
    fn job(filters: Vec<Filter>, seconds: &[&[u64]]) -> NegJob {
        let mut n = 0u8;
        let listings = seconds
            .iter()
            .enumerate()
            .map(|(i, secs)| {
                let items: Vec<(EventId, Timestamp)> = secs
                    .iter()
                    .map(|&s| {
                        n += 1;
                        (EventId::from_byte_array([n; 32]), Timestamp::from_secs(s))
                    })
                    .collect();
                (i, Some(Listed::from(items)))
            })
            .collect();
        NegJob::new(Vec::new(), filters, listings, T, T, None)
    }

    fn filter() -> Filter {
        Filter::new().kind(Kind::from(1111))
    }

    /// The seconds of the current filter's items inside its window.
    fn seconds(job: &NegJob) -> Vec<u64> {
        let mut s: Vec<u64> = job.current_items().map(|(_, t)| t.as_secs()).collect();
        s.sort_unstable();
        s
    }

    /// The current window's bounds as the `NEG-OPEN` filter states them.
    fn bounds(job: &NegJob) -> (Option<u64>, Option<u64>) {
        let f = job.window_filter();
        (f.since.map(|t| t.as_secs()), f.until.map(|t| t.as_secs()))
    }

    #[test]
    fn a_refused_filter_splits_at_its_median_second_into_two_inclusive_windows() {
        let mut f = filter();
        f.since = Some(Timestamp::from_secs(5));
        f.until = Some(Timestamp::from_secs(20));
        let mut job = job(vec![f], &[&[10, 11, 12, 13, 14]]);
        assert_eq!(job.split_current(), Some(Timestamp::from_secs(12)));
        // `since` and `until` are inclusive: the halves meet with no
        // second lost or in both, within the filter's own bounds.
        assert_eq!(bounds(&job), (Some(5), Some(12)));
        assert_eq!(seconds(&job), [10, 11, 12]);
        // The lower half splits again; its upper half is one second.
        assert_eq!(job.split_current(), Some(Timestamp::from_secs(11)));
        assert_eq!(bounds(&job), (Some(5), Some(11)));
        assert_eq!(seconds(&job), [10, 11]);
        assert!(job.reconciled(Vec::new()), "windows are left");
        assert_eq!(bounds(&job), (Some(12), Some(12)));
        assert_eq!(seconds(&job), [12]);
        assert_eq!(job.split_current(), None, "one item cannot split");
        assert!(job.reconciled(Vec::new()));
        assert_eq!(bounds(&job), (Some(13), Some(20)));
        assert_eq!(seconds(&job), [13, 14]);
        assert_eq!(job.current, 0, "still the first filter");
        assert!(!job.reconciled(Vec::new()), "the last window ends the job");
        assert_eq!(job.current, 1);
    }

    #[test]
    fn a_window_splits_only_where_both_halves_hold_the_sinks_items() {
        let mut one_second = job(vec![filter()], &[&[50, 50, 50]]);
        assert_eq!(one_second.split_current(), None);
        assert_eq!(bounds(&one_second), (None, None), "left whole");
        // The median in the last second: split below it.
        let mut last = job(vec![filter()], &[&[1, 5, 5]]);
        assert_eq!(last.split_current(), Some(Timestamp::from_secs(1)));
        assert_eq!((bounds(&last), seconds(&last)), ((None, Some(1)), vec![1]));
        assert!(last.reconciled(Vec::new()));
        assert_eq!(
            (bounds(&last), seconds(&last)),
            ((Some(2), None), vec![5, 5])
        );
        let mut nothing = job(vec![filter()], &[&[]]);
        assert_eq!(nothing.split_current(), None);
    }

    #[test]
    fn a_job_splits_at_most_max_size_splits_times() {
        let filters = vec![filter(); MAX_SIZE_SPLITS as usize + 1];
        let listed = vec![&[1u64, 2][..]; filters.len()];
        let mut job = job(filters, &listed);
        for _ in 0..MAX_SIZE_SPLITS {
            assert!(job.split_current().is_some());
            assert!(job.reconciled(Vec::new()));
            assert!(job.reconciled(Vec::new()));
        }
        assert_eq!(job.split_current(), None, "past the bound");
        assert_eq!(seconds(&job), [1, 2], "though it could split");
    }
}
