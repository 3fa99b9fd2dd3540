//! Asking the own relay what it holds for the engine's listings, for
//! negentropy: one `ListQuery` (a paged REQ) per part or batch of parts.
//!
//! Negentropy needs the `(id, created_at)` of every event the sink holds
//! that matches a historic filter. The own relay is asked with a plain REQ
//! on the sink's websocket, paged backwards with `until` because relays cap
//! results per REQ; only ids and timestamps are kept (40 bytes an event).
//! `until` is inclusive, so each page asks again for the second of the
//! previous page's oldest event (siblings cut at the page boundary). A page
//! that brings nothing new is then either short (everything at or below its
//! `until` was listed: done) or a full page of events all in that one
//! second: more events share it than the relay returns at once, and paging
//! steps one second back rather than stopping, so everything older is still
//! listed. The events of that second the relay never returns cannot be
//! reached by NIP-01 paging; negentropy reports them as missing and they are
//! fetched again (duplicates for the sink, nothing lost). The traffic
//! stays on the link to the own relay, which is local in every deployment
//! this tool has; the point of negentropy is the link to remote relays.
//!
//! A listing page the own relay leaves silent while it answers a later one
//! is asked again after a grace (`timing::silence`): nostr-rs-relay drops
//! a query a WAL checkpoint aborts without a word, and a first sync of
//! 600 relays then waited 40 s for the negentropy job's timeout.

use std::collections::{HashMap, HashSet, VecDeque};

use log::info;
use nostr::prelude::{
    ClientMessage, Event, EventId, Filter, RelayMessage, SubscriptionId, Timestamp,
};

use super::list_batch::{Batch, MAX_VALUES, Part, batch_filter, take_batch};
use crate::sans_io::query::refusal::{Refusal, step_below};
use crate::sans_io::timing::silence::SilenceGrace;
use crate::sans_io::timing::time::Time;

/// Events asked per listing page; relays cap lower ones down anyway.
const PAGE: usize = 5_000;

/// What the caller does after a sink message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ListStep {
    /// Send these texts (CLOSE of the finished page, REQ of the next).
    Send(Vec<String>),
    /// The listing is complete: what the sink holds for each engine
    /// request it carried (one, or a batch: `list_batch`).
    Done {
        /// Each engine request id, and what the sink holds for it.
        lists: Vec<(u64, Vec<(EventId, Timestamp)>)>,
        /// CLOSE of the last page.
        close: String,
    },
    /// The own relay refused the listing for good (or with nothing else
    /// of ours open, so no lower count would help): the engine's jobs
    /// waiting for these requests go to REQ now.
    Refused {
        /// The engine requests the listing carried.
        requests: Vec<u64>,
        /// The relay's `CLOSED` text.
        reason: String,
    },
    /// The own relay wants NIP-42 first: these requests are asked again
    /// once our AUTH is accepted (`ListQueries::retry_refused`).
    NeedsAuth(Vec<u64>),
    /// The own relay refused the listing for its subscription limit while
    /// `open` were open: it waits its turn again, and at most `limit`
    /// listings run at once from now on (on this connection).
    Lowered {
        /// Queries of ours open when it was refused, itself included.
        open: usize,
        /// Queries let run at once from now on.
        limit: usize,
        /// The relay's `CLOSED` text.
        reason: String,
    },
    /// The own relay refused a batch for its values (a `CLOSED`, or a
    /// `NOTICE` before an empty answer, as khatru sends eventstore's "too
    /// many tag values"): its parts wait their turn again, and batches
    /// carry at most `values` values from now on. Send `texts` (the
    /// CLOSEs of batches asked again).
    Narrowed {
        /// Values a batch carries at most from now on.
        values: usize,
        /// The relay's words.
        reason: String,
        /// CLOSEs of the batches asked again.
        texts: Vec<String>,
    },
}

/// One engine request (a part) a query carries, and what of it was
/// listed so far.
struct Member {
    request: u64,
    filter: Filter,
    listed: Vec<(EventId, Timestamp)>,
}

/// One REQ chain asking the own relay for one part or a batch of them.
struct ListQuery {
    /// The parts it lists; more than one when batched.
    members: Vec<Member>,
    /// How a listed event reaches its members.
    batch: Batch,
    /// What is asked: the members' filters together.
    filter: Filter,
    /// Ids listed at the current page's `until`: the only second a page
    /// can repeat (everything above it was asked before, everything below
    /// is new). A set over every listed id would cost more than the
    /// listing itself.
    boundary: HashSet<EventId>,
    /// Ids of the current page at its oldest second so far: the next
    /// page's boundary when it asks from that second.
    at_oldest: HashSet<EventId>,
    /// Events in the current page.
    page: usize,
    /// Ids new to this listing in the current page.
    fresh: usize,
    /// Oldest `created_at` in the current page.
    oldest: Option<Timestamp>,
    /// The current page's `until`.
    until: Option<Timestamp>,
    /// The largest page so far: the relay returns at least this many when
    /// it has them, so a smaller page was not cut.
    largest: usize,
    /// When the current page's REQ went out, in REQs sent on this
    /// connection: a silent page sent before one that reached its EOSE is
    /// a suspect.
    sent: u64,
    /// A suspect silent page is asked again at this time.
    suspect_until: Option<Time>,
}

/// Queries asked of the own relay at once; the rest wait their turn. After
/// a restart thousands of relays' jobs list at the same moment: all at once
/// would hold every answer in memory together and trip the own relay's
/// own subscription limit (strfry's 20 and nostr-rs-relay's 32 are
/// refused by a `NOTICE` naming no listing, so they are kept under, not
/// learned). Each query waits behind the events in flight on the link, so
/// the count sets how fast negentropy jobs start: at 8, a GRASP-shaped
/// first sync (4,000 roots, two parts each) listed for seconds while the
/// roots' replies waited (issue 46).
const MAX_IN_FLIGHT: usize = 16;

/// Listing queries in flight on the sink connection, by subscription id.
pub(crate) struct ListQueries {
    pending: HashMap<String, ListQuery>,
    /// Queries let run at once: `stated`, lowered when the own relay
    /// refuses one for its subscription limit (LocalRelay's `max_reqs`:
    /// `rate-limited: too many REQs`), back up on a new connection (its
    /// limit may have changed with a restart).
    max_in_flight: usize,
    /// [`MAX_IN_FLIGHT`], or less where the own relay's NIP-11 states a
    /// lower `max_subscriptions`.
    stated: usize,
    /// Values a batched filter carries at most: [`MAX_VALUES`], lowered
    /// for good when the own relay refuses as many (its store's limit
    /// does not change with a new connection).
    values: usize,
    /// Values refusals still to come for batches closed when the first
    /// of their burst narrowed the width ([`ListQueries::on_notice`]).
    owed_notices: usize,
    /// Parts waiting for a free slot, oldest first.
    waiting: VecDeque<Part>,
    /// Parts the own relay refused (typically `auth-required:`), to ask
    /// again once it accepts our AUTH.
    refused: Vec<Part>,
    /// Subscription ids given out (they name listings).
    next: u64,
    /// Page REQs sent on this connection.
    sent: u64,
    /// Rounds of silent pages asked again on this connection.
    silence: SilenceGrace,
    /// Silent pages asked again, ever (a metric).
    unanswered: u64,
}

impl Default for ListQueries {
    fn default() -> Self {
        ListQueries {
            pending: HashMap::new(),
            max_in_flight: MAX_IN_FLIGHT,
            stated: MAX_IN_FLIGHT,
            values: MAX_VALUES,
            owed_notices: 0,
            waiting: VecDeque::new(),
            refused: Vec::new(),
            next: 0,
            sent: 0,
            silence: SilenceGrace::default(),
            unanswered: 0,
        }
    }
}

impl ListQueries {
    /// True while no listing is asked, waiting or refused: a connection
    /// ended now loses none.
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.waiting.is_empty() && self.refused.is_empty()
    }

    /// The own relay's NIP-11 states `max_subscriptions`: no more
    /// listings than that run at once, on this connection and the next.
    pub(crate) fn handle_stated_limit(&mut self, max_subscriptions: usize) {
        self.stated = max_subscriptions.clamp(1, MAX_IN_FLIGHT);
        self.max_in_flight = self.max_in_flight.min(self.stated);
    }

    /// Gives back the room a burst of listings left (a restart asks tens
    /// of thousands at once, most of them waiting here).
    pub(crate) fn shrink_to_fit(&mut self) {
        self.pending.shrink_to_fit();
        self.waiting.shrink_to_fit();
        self.refused.shrink_to_fit();
    }

    /// Lists `filter` for engine request `request`: returns the REQ to send,
    /// or `None` when it waits for a slot (see [`ListQueries::start_waiting`]).
    pub(crate) fn start(&mut self, request: u64, filter: Filter) -> Option<String> {
        if self.pending.len() >= self.max_in_flight {
            self.waiting.push_back((request, filter));
            return None;
        }
        Some(self.open(vec![(request, filter)]))
    }

    /// Starts waiting listings while slots are free; returns their REQs.
    /// Called after a listing ends.
    pub(crate) fn start_waiting(&mut self) -> Vec<String> {
        let mut reqs = Vec::new();
        while self.pending.len() < self.max_in_flight {
            let Some(batch) = take_batch(&mut self.waiting, self.values) else {
                break;
            };
            reqs.push(self.open(batch));
        }
        reqs
    }

    /// Asks for `batch` (one listing or several batched) in one REQ.
    fn open(&mut self, batch: Vec<Part>) -> String {
        let sub = self.new_sub();
        let filter = batch_filter(&batch);
        let req = req(&sub, &filter, None);
        let sent = self.next_sent();
        let route = Batch::of(&batch);
        let members = batch
            .into_iter()
            .map(|(request, filter)| Member {
                request,
                filter,
                listed: Vec::new(),
            })
            .collect();
        self.pending.insert(
            sub,
            ListQuery {
                members,
                batch: route,
                filter,
                boundary: HashSet::new(),
                at_oldest: HashSet::new(),
                page: 0,
                fresh: 0,
                oldest: None,
                until: None,
                largest: 0,
                sent,
                suspect_until: None,
            },
        );
        req
    }

    /// The place of a page REQ about to go out, in the connection's order.
    fn next_sent(&mut self) -> u64 {
        self.sent += 1;
        self.sent
    }

    fn new_sub(&mut self) -> String {
        let sub = format!("list{:x}", self.next);
        self.next += 1;
        sub
    }

    /// When the first suspect page is to be asked again.
    pub(crate) fn next_deadline(&self) -> Option<Time> {
        self.pending.values().filter_map(|l| l.suspect_until).min()
    }

    /// Silent pages asked again, ever.
    pub(crate) fn unanswered(&self) -> u64 {
        self.unanswered
    }

    /// Asks again, under a new subscription id, every suspect page still
    /// silent at `now`; returns the CLOSEs and REQs to send. Nothing of the
    /// page was taken, so it starts over as it was.
    pub(crate) fn expire(&mut self, now: Time) -> Vec<String> {
        let due: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, l)| l.suspect_until.is_some_and(|at| at <= now))
            .map(|(sub, _)| sub.clone())
            .collect();
        let mut texts = Vec::with_capacity(2 * due.len());
        for old in due {
            let Some(mut l) = self.pending.remove(&old) else {
                continue;
            };
            info!(
                "own relay left listing page {old} unanswered while it answered later ones; asking again"
            );
            self.silence.count(now);
            self.unanswered += 1;
            let sub = self.new_sub();
            l.sent = self.next_sent();
            l.suspect_until = None;
            texts.push(ClientMessage::close(SubscriptionId::new(&old)).as_json());
            texts.push(req(&sub, &l.filter, l.until));
            self.pending.insert(sub, l);
        }
        texts
    }

    /// A page sent as `sent` reached its EOSE: every page still silent
    /// that went out before it is a suspect.
    fn suspect_silent(&mut self, sent: u64, now: Time) {
        let until = now + self.silence.grace();
        for l in self.pending.values_mut() {
            if l.sent < sent && l.page == 0 && l.suspect_until.is_none() {
                l.suspect_until = Some(until);
            }
        }
    }

    /// True when `sub` is one of ours.
    #[cfg(test)]
    pub(crate) fn owns(&self, sub: &str) -> bool {
        self.pending.contains_key(sub)
    }

    /// Takes a message from the own relay at `now`; `None` if it is not
    /// for a listing.
    pub(crate) fn on_message(&mut self, now: Time, message: &RelayMessage<'_>) -> Option<ListStep> {
        match message {
            RelayMessage::Event {
                subscription_id,
                event,
            } => {
                let l = self.pending.get_mut(subscription_id.as_str())?;
                l.on_event(event);
                Some(ListStep::Send(Vec::new()))
            }
            RelayMessage::EndOfStoredEvents(sub) => {
                let sent = self.pending.get(sub.as_str())?.sent;
                self.suspect_silent(sent, now);
                self.on_eose(sub.as_str())
            }
            RelayMessage::Closed {
                subscription_id,
                message,
            } => self.on_closed(subscription_id.as_str(), message),
            RelayMessage::Notice(text) => self.on_notice(text),
            _ => None,
        }
    }

    /// A `CLOSED` for listing `sub`. A refusal for the own relay's
    /// subscription limit is its count, not the listing: the listing
    /// starts over when a slot is free, under a lower count. Only with
    /// nothing else of ours open does a lower count not help; then, like
    /// any other refusal but AUTH's, the engine learns at once that this
    /// listing will not come, instead of waiting out its timeout (issue
    /// 23's finding 4: a LocalRelay own relay at its `max_reqs` refused
    /// every listing past its count, and each job waited a minute). Both
    /// steps carry the relay's words: its reason is what tells an operator
    /// which of its limits we met.
    fn on_closed(&mut self, sub: &str, reason: &str) -> Option<ListStep> {
        let open = self.pending.len();
        let l = self.pending.remove(sub)?;
        let width = l.members.len();
        let parts = l.members.into_iter().map(|m| (m.request, m.filter));
        match Refusal::of_closed(reason) {
            Refusal::TooManyValues if width > 1 => {
                self.values = self.values.min(narrower(width));
                self.wait_first(parts);
                Some(ListStep::Narrowed {
                    values: self.values,
                    reason: reason.to_owned(),
                    texts: Vec::new(),
                })
            }
            Refusal::AuthRequired => {
                let start = self.refused.len();
                self.refused.extend(parts);
                let requests = self.refused[start..].iter().map(|(r, _)| *r).collect();
                Some(ListStep::NeedsAuth(requests))
            }
            Refusal::TooManySubscriptions | Refusal::RateLimited if open > 1 => {
                self.max_in_flight = self.max_in_flight.min(open - 1);
                self.wait_first(parts);
                Some(ListStep::Lowered {
                    open,
                    limit: self.max_in_flight,
                    reason: reason.to_owned(),
                })
            }
            _ => Some(ListStep::Refused {
                requests: parts.map(|(r, _)| r).collect(),
                reason: reason.to_owned(),
            }),
        }
    }

    /// A `NOTICE` on the sink link. One refusing a filter's values names
    /// no listing, and khatru answers the refused filter with an empty
    /// page after it, which would read as "the sink holds nothing": so
    /// every batch in flight wider than the largest one's [`narrower`]
    /// width is asked again, in its turn, whatever it listed so far.
    ///
    /// khatru handles each message in a goroutine of its own, so the
    /// notices of a burst of wide batches come in any order, and may come
    /// after their batches were asked again: each batch closed here owes
    /// its notice, and an owed notice narrows nothing (one per batch
    /// closed, less the one that closed them). A batch closed that the
    /// relay took owes none; then a later refusal is taken as owed and its
    /// empty page as listed, which costs that batch's jobs a fetch of what
    /// the sink holds, never an event.
    ///
    /// `None` for any other notice, and when no batch can be narrower.
    fn on_notice(&mut self, text: &str) -> Option<ListStep> {
        if Refusal::of_notice(text) != Some(Refusal::TooManyValues) {
            return None;
        }
        if self.owed_notices > 0 {
            self.owed_notices -= 1;
            return Some(ListStep::Send(Vec::new()));
        }
        let widest = self.pending.values().map(|l| l.members.len()).max()?;
        if widest < 2 {
            return None;
        }
        self.values = self.values.min(narrower(widest));
        let values = self.values;
        let wide: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, l)| l.members.len() > values)
            .map(|(sub, _)| sub.clone())
            .collect();
        let mut texts = Vec::with_capacity(wide.len());
        for sub in wide {
            let Some(l) = self.pending.remove(&sub) else {
                continue;
            };
            texts.push(ClientMessage::close(SubscriptionId::new(&sub)).as_json());
            self.wait_first(l.members.into_iter().map(|m| (m.request, m.filter)));
        }
        self.owed_notices = texts.len().saturating_sub(1);
        Some(ListStep::Narrowed {
            values,
            reason: text.to_owned(),
            texts,
        })
    }

    /// Puts `parts` (a listing refused or closed for our limits, not for
    /// good) at the front of the queue, in their order: they go first
    /// once a slot is free.
    fn wait_first(&mut self, parts: impl DoubleEndedIterator<Item = Part>) {
        for part in parts.rev() {
            self.waiting.push_front(part);
        }
    }

    /// Asks again for every listing the own relay refused (in turn, behind
    /// the ones already waiting); returns the REQs that can go now.
    pub(crate) fn retry_refused(&mut self) -> Vec<String> {
        let refused = std::mem::take(&mut self.refused);
        self.waiting.extend(refused);
        self.start_waiting()
    }

    /// The sink connection is gone: its listings are lost. Returns their
    /// requests, for the engine to send their jobs to REQ.
    pub(crate) fn clear(&mut self) -> Vec<u64> {
        self.max_in_flight = self.stated;
        self.silence = SilenceGrace::default();
        self.owed_notices = 0;
        let pending = self.pending.drain().flat_map(|(_, l)| l.members);
        let pending = pending.map(|m| m.request);
        let waiting = self.waiting.drain(..).chain(self.refused.drain(..));
        pending.chain(waiting.map(|(request, _)| request)).collect()
    }

    fn on_eose(&mut self, sub: &str) -> Option<ListStep> {
        let close = ClientMessage::close(SubscriptionId::new(sub)).as_json();
        // The next page's place in the order of REQs, if there is one.
        let sent = self.next_sent();
        let l = self.pending.get_mut(sub)?;
        l.largest = l.largest.max(l.page);
        let until = match l.oldest {
            // More may share the oldest second, or lie below it.
            Some(oldest) if l.fresh > 0 => Some(oldest),
            // Nothing new and short: all at or below `until` is listed.
            Some(_) if l.page < l.largest => None,
            // Nothing new in a full page: events older than `until` would
            // have been new, so the whole page is that one second. Go below
            // (only from there: a relay ignoring `until` must not loop us).
            Some(oldest) if l.until == Some(oldest) => oldest
                .as_secs()
                .checked_sub(1)
                .map(Timestamp::from_secs)
                .filter(|_| l.filter.since.is_none_or(|since| since < oldest)),
            // An empty page, or one older than `until` bringing nothing new.
            _ => None,
        };
        let Some(until) = until else {
            let l = self.pending.remove(sub)?;
            let lists = l.members.into_iter().map(|m| (m.request, m.listed));
            return Some(ListStep::Done {
                lists: lists.collect(),
                close,
            });
        };
        let at_oldest = std::mem::take(&mut l.at_oldest);
        if l.until == Some(until) {
            l.boundary.extend(at_oldest);
        } else if l.oldest == Some(until) {
            l.boundary = at_oldest;
        } else {
            // One second below the page: nothing there was listed yet.
            l.boundary.clear();
        }
        l.page = 0;
        l.fresh = 0;
        l.oldest = None;
        l.until = Some(until);
        l.sent = sent;
        l.suspect_until = None;
        let next = req(sub, &l.filter, Some(until));
        Some(ListStep::Send(vec![close, next]))
    }
}

impl ListQuery {
    /// A new event of the query goes to its members: to the only one as
    /// the relay matched it, else to those whose value it carries
    /// ([`Batch::route`]; its indexes are the members', built together).
    fn give(&mut self, event: &Event) {
        let entry = (event.id, event.created_at);
        let members = &mut self.members;
        self.batch
            .route(&self.filter, event, |i| members[i].listed.push(entry));
    }

    /// One event of the current page: kept unless an earlier page listed
    /// it (only events at `until` can be repeats; a relay sending events
    /// above `until` repeats what it sent before).
    fn on_event(&mut self, event: &Event) {
        let (id, at) = (event.id, event.created_at);
        self.page += 1;
        self.suspect_until = None;
        let fresh = match self.until {
            Some(until) if at > until => false,
            Some(until) if at == until => self.boundary.insert(id),
            _ => !self.at_oldest.contains(&id),
        };
        if fresh {
            self.fresh += 1;
            self.give(event);
        }
        match self.oldest {
            Some(oldest) if at > oldest => {}
            Some(oldest) if at == oldest => {
                self.at_oldest.insert(id);
            }
            _ => {
                self.oldest = Some(at);
                self.at_oldest.clear();
                self.at_oldest.insert(id);
            }
        }
    }
}

/// Tag values per filter the stores GRASP relays run are known to take:
/// eventstore's SQL backends, 100 since April 2025 and 10 before.
const KNOWN_VALUE_LIMITS: [usize; 2] = [100, 10];

/// The width to try after a batch of `width` values was refused: the
/// largest known store limit below it, else half (never below one). A
/// relay on eventstore's old ten is then found at the first refusal, not
/// halved past it to six.
fn narrower(width: usize) -> usize {
    step_below(&KNOWN_VALUE_LIMITS, width)
}

fn req(sub: &str, filter: &Filter, until: Option<Timestamp>) -> String {
    let mut filter = filter.clone().limit(PAGE);
    if let Some(until) = until {
        filter = filter.until(until);
    }
    ClientMessage::req(SubscriptionId::new(sub), vec![filter]).as_json()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::*;
    use std::time::Duration;

    const T: Time = Time::from_secs(1_000);

    fn event(keys: &Keys, at: u64) -> nostr::prelude::Event {
        EventBuilder::new(Kind::from_u16(1621), format!("{at}"))
            .custom_created_at(Timestamp::from_secs(at))
            .finalize(keys)
            .unwrap()
    }

    fn deliver(l: &mut ListQueries, sub: &str, e: &nostr::prelude::Event) {
        let m = RelayMessage::event(SubscriptionId::new(sub), e.clone());
        assert_eq!(l.on_message(T, &m), Some(ListStep::Send(Vec::new())));
    }

    #[test]
    fn pages_back_until_a_page_brings_nothing_new() {
        let keys = Keys::generate();
        let events: Vec<_> = (0..5).map(|i| event(&keys, 100 + i)).collect();
        let mut l = ListQueries::default();
        let first = l
            .start(7, Filter::new().kind(Kind::from_u16(1621)))
            .unwrap();
        assert!(first.contains("\"limit\":5000"));
        let sub = "list0";
        for e in &events[2..] {
            deliver(&mut l, sub, e);
        }
        let eose = RelayMessage::eose(SubscriptionId::new(sub));
        let Some(ListStep::Send(texts)) = l.on_message(T, &eose) else {
            panic!("a second page");
        };
        assert!(texts[1].contains("\"until\":102"), "{}", texts[1]);
        for e in &events[..3] {
            deliver(&mut l, sub, e);
        }
        assert!(matches!(l.on_message(T, &eose), Some(ListStep::Send(_))));
        deliver(&mut l, sub, &events[0]);
        let Some(ListStep::Done { mut lists, .. }) = l.on_message(T, &eose) else {
            panic!("done");
        };
        let (request, held) = lists.pop().expect("one request");
        assert!(lists.is_empty());
        assert_eq!(request, 7);
        let mut ids: Vec<_> = held.iter().map(|(id, _)| *id).collect();
        ids.sort();
        let mut want: Vec<_> = events.iter().map(|e| e.id).collect();
        want.sort();
        assert_eq!(ids, want);
        assert!(!l.owns(sub));
    }

    /// Feeds one page (`events`, then EOSE) and returns the step.
    fn page(l: &mut ListQueries, sub: &str, events: &[&nostr::prelude::Event]) -> ListStep {
        for e in events {
            deliver(l, sub, e);
        }
        l.on_message(T, &RelayMessage::eose(SubscriptionId::new(sub)))
            .expect("a listing's EOSE")
    }

    fn until_of(step: &ListStep) -> String {
        let ListStep::Send(texts) = step else {
            panic!("another page, not {step:?}");
        };
        let filter: serde_json::Value = serde_json::from_str(&texts[1]).unwrap();
        filter[2]["until"].to_string()
    }

    /// A relay returning 2 events a REQ, holding 3 in second 200 (a bulk
    /// import) and 2 older: the listing used to stop at the second page,
    /// which brought nothing new, and never listed anything older than 200.
    #[test]
    fn a_full_page_of_one_second_steps_below_it_instead_of_stopping() {
        let keys = Keys::generate();
        let same: Vec<_> = (0..3)
            .map(|i| {
                EventBuilder::new(Kind::from_u16(1621), format!("{i}"))
                    .custom_created_at(Timestamp::from_secs(200))
                    .finalize(&keys)
                    .unwrap()
            })
            .collect();
        let older = [event(&keys, 151), event(&keys, 150)];
        let mut l = ListQueries::default();
        l.start(5, Filter::new().kind(Kind::from_u16(1621)));
        let sub = "list0";
        let step = page(&mut l, sub, &[&same[0], &same[1]]);
        assert_eq!(until_of(&step), "200");
        // The same two again: nothing new, a full page, all in second 200.
        let step = page(&mut l, sub, &[&same[0], &same[1]]);
        assert_eq!(until_of(&step), "199");
        let step = page(&mut l, sub, &[&older[0], &older[1]]);
        assert_eq!(until_of(&step), "150");
        // Second 150 again, short: done.
        let ListStep::Done { mut lists, .. } = page(&mut l, sub, &[&older[1]]) else {
            panic!("done");
        };
        let (request, held) = lists.pop().expect("one request");
        assert!(lists.is_empty());
        assert_eq!(request, 5);
        let mut ids: Vec<_> = held.iter().map(|(id, _)| *id).collect();
        ids.sort();
        // The third event of second 200 the relay never returned is left
        // for negentropy to report missing.
        let mut want = vec![same[0].id, same[1].id, older[0].id, older[1].id];
        want.sort();
        assert_eq!(ids, want);
    }

    /// Only the ids of the page boundary's second are remembered: a page
    /// repeating that second, or (against NIP-01) events above `until`,
    /// lists nothing twice.
    #[test]
    fn repeats_at_or_above_until_are_listed_once() {
        let keys = Keys::generate();
        let events: Vec<_> = (0..4).map(|i| event(&keys, 100 + i)).collect();
        let mut l = ListQueries::default();
        l.start(9, Filter::new().kind(Kind::from_u16(1621)));
        let step = page(&mut l, "list0", &[&events[3], &events[2], &events[1]]);
        assert_eq!(until_of(&step), "101");
        // 103 and 102 lie above `until`; 101 is the boundary, 100 is new.
        let step = page(
            &mut l,
            "list0",
            &[&events[3], &events[2], &events[1], &events[0]],
        );
        assert_eq!(until_of(&step), "100");
        let ListStep::Done { mut lists, .. } = page(&mut l, "list0", &[&events[0]]) else {
            panic!("done");
        };
        let (_, held) = lists.pop().expect("one request");
        assert!(lists.is_empty());
        let mut ids: Vec<_> = held.iter().map(|(id, _)| *id).collect();
        ids.sort();
        let mut want: Vec<_> = events.iter().map(|e| e.id).collect();
        want.sort();
        assert_eq!(ids, want, "each once");
    }

    #[test]
    fn an_empty_page_or_since_ends_the_listing() {
        let keys = Keys::generate();
        let a = event(&keys, 300);
        let mut l = ListQueries::default();
        l.start(1, Filter::new().kind(Kind::from_u16(1621)));
        assert_eq!(until_of(&page(&mut l, "list0", &[&a])), "300");
        // A full page (1 is the largest so far) of second 300: below it.
        assert_eq!(until_of(&page(&mut l, "list0", &[&a])), "299");
        assert!(matches!(
            page(&mut l, "list0", &[]),
            ListStep::Done { lists, .. } if lists[0].0 == 1
        ));
        // With `since` at that second there is nothing below to ask for.
        l.start(
            2,
            Filter::new()
                .kind(Kind::from_u16(1621))
                .since(Timestamp::from_secs(300)),
        );
        assert_eq!(until_of(&page(&mut l, "list1", &[&a])), "300");
        assert!(matches!(
            page(&mut l, "list1", &[&a]),
            ListStep::Done { lists, .. } if lists[0].0 == 2
        ));
    }

    #[test]
    fn a_relay_ignoring_until_does_not_keep_the_listing_going() {
        let keys = Keys::generate();
        let a = event(&keys, 300);
        let mut l = ListQueries::default();
        l.start(4, Filter::new().kind(Kind::from_u16(1621)));
        assert_eq!(until_of(&page(&mut l, "list0", &[&a])), "300");
        assert_eq!(until_of(&page(&mut l, "list0", &[&a])), "299");
        // Asked below 300, it sends 300 again.
        assert!(matches!(
            page(&mut l, "list0", &[&a]),
            ListStep::Done { lists, .. } if lists[0].0 == 4
        ));
    }

    #[test]
    fn a_refusal_ends_the_listing_and_other_subscriptions_are_not_ours() {
        let mut l = ListQueries::default();
        l.start(3, Filter::new());
        let closed = RelayMessage::closed(SubscriptionId::new("list0"), "auth-required: x");
        assert_eq!(l.on_message(T, &closed), Some(ListStep::NeedsAuth(vec![3])));
        let other = RelayMessage::eose(SubscriptionId::new("x"));
        assert_eq!(l.on_message(T, &other), None);
        let again = l.retry_refused();
        assert_eq!(again.len(), 1);
        assert!(again[0].starts_with(r#"["REQ","list1""#), "{}", again[0]);
        assert!(l.owns("list1"));
        assert!(l.retry_refused().is_empty());
    }

    fn closed(sub: &str, reason: &str) -> RelayMessage<'static> {
        RelayMessage::closed(SubscriptionId::new(sub), reason.to_owned())
    }

    #[test]
    fn a_refusal_for_the_relays_count_lowers_ours_and_the_listing_waits_its_turn() {
        let mut l = ListQueries::default();
        for r in 0..MAX_IN_FLIGHT as u64 {
            assert!(
                l.start(r, Filter::new().kind(Kind::from_u16(1621)))
                    .is_some()
            );
        }
        // LocalRelay at `max_reqs` 4 took list0..list3 and refused the rest.
        let mut limits = Vec::new();
        for sub in 4..MAX_IN_FLIGHT {
            match l.on_message(
                T,
                &closed(&format!("list{sub:x}"), "rate-limited: too many REQs"),
            ) {
                Some(ListStep::Lowered { limit, .. }) => limits.push(limit),
                other => panic!("{other:?}"),
            }
        }
        let down: Vec<usize> = (4..MAX_IN_FLIGHT).rev().collect();
        assert_eq!(limits, down, "down to the relay's count");
        assert!(l.start_waiting().is_empty(), "4 are open");
        let eose = RelayMessage::eose(SubscriptionId::new("list0"));
        assert!(matches!(
            l.on_message(T, &eose),
            Some(ListStep::Done { lists, .. }) if lists[0].0 == 0
        ));
        let again = l.start_waiting();
        assert_eq!(
            again.len(),
            1,
            "one refused listing starts over in the freed slot"
        );
        l.clear();
        assert_eq!(
            l.max_in_flight, MAX_IN_FLIGHT,
            "a new connection starts afresh"
        );
    }

    /// strfry states its 20 subscriptions in NIP-11 and refuses the 21st
    /// with a `NOTICE` that names no listing, so a stated count is kept
    /// to from the start, not learned from refusals.
    #[test]
    fn a_stated_subscription_limit_is_kept_on_every_connection() {
        let mut l = ListQueries::default();
        l.handle_stated_limit(3);
        let started = (0..10)
            .filter(|&r| {
                l.start(r, Filter::new().kind(Kind::from_u16(1621)))
                    .is_some()
            })
            .count();
        assert_eq!(started, 3, "the rest wait their turn");
        l.clear();
        assert_eq!(l.max_in_flight, 3, "a new connection keeps to it");
        l.handle_stated_limit(1_000);
        assert_eq!(l.max_in_flight, 3, "a larger count raises nothing now");
        l.clear();
        assert_eq!(l.max_in_flight, MAX_IN_FLIGHT, "nor past our own bound");
    }

    /// Fills every slot with a listing of its own, queues `parts` listings
    /// of one `#e` shape behind them and frees one slot: returns the REQ
    /// of the batch that takes it (on `list10`, the seventeenth listing).
    fn one_wide_batch(l: &mut ListQueries, parts: u64) -> String {
        for r in 0..MAX_IN_FLIGHT as u64 {
            let alone = Filter::new().kind(Kind::from_u16(30617 + r as u16));
            assert!(l.start(r, alone).is_some());
        }
        for r in 0..parts {
            let e = Filter::new().custom_tag(SingleLetterTag::LOWERCASE_E, format!("{r:064x}"));
            assert!(l.start(100 + r, e).is_none(), "the slots are taken");
        }
        assert!(matches!(page(l, "list0", &[]), ListStep::Done { .. }));
        let mut reqs = l.start_waiting();
        assert_eq!(reqs.len(), 1, "one slot was freed");
        reqs.remove(0)
    }

    /// The values of the one tag of the one filter of `req`.
    fn values_of(req: &str) -> usize {
        let Ok(ClientMessage::Req { filters, .. }) = ClientMessage::from_json(req) else {
            panic!("a REQ: {req}");
        };
        filters[0].generic_tags.values().map(|v| v.len()).sum()
    }

    /// khatru on eventstore's SQL stores answers a filter of more tag
    /// values than the store takes with a `NOTICE` and an empty page.
    /// Taken as listed, the sink would seem to hold nothing for a
    /// hundred parts, so their jobs would fetch everything again.
    #[test]
    fn a_values_notice_asks_the_wide_batches_again_narrower() {
        let mut l = ListQueries::default();
        let wide = one_wide_batch(&mut l, 250);
        assert_eq!(values_of(&wide), MAX_VALUES);
        assert!(matches!(page(&mut l, "list1", &[]), ListStep::Done { .. }));
        let second = l.start_waiting();
        assert_eq!(
            values_of(&second[0]),
            MAX_VALUES,
            "two wide batches in flight"
        );
        let notice = RelayMessage::notice("too many tag values");
        let Some(ListStep::Narrowed { values, texts, .. }) = l.on_message(T, &notice) else {
            panic!("narrowed");
        };
        assert_eq!(values, 10, "eventstore's old limit, the one below");
        let close = |sub: &str| ClientMessage::close(SubscriptionId::new(sub)).as_json();
        let mut texts = texts;
        texts.sort();
        assert_eq!(texts, [close("list10"), close("list11")]);
        let empty = RelayMessage::eose(SubscriptionId::new("list10"));
        assert_eq!(
            l.on_message(T, &empty),
            None,
            "the wide batch is no listing now"
        );
        let again = l.start_waiting();
        assert_eq!(again.len(), 2);
        assert!(again.iter().all(|req| values_of(req) == 10));
        assert_eq!(
            l.on_message(T, &notice),
            Some(ListStep::Send(Vec::new())),
            "the other closed batch's notice, in khatru's own order, narrows nothing"
        );
        assert_eq!(l.values, 10);
        let Some(ListStep::Narrowed { values, .. }) = l.on_message(T, &notice) else {
            panic!("a refusal of ten narrows again");
        };
        assert_eq!(values, 5);
        let other = RelayMessage::notice("slow down");
        assert_eq!(
            l.on_message(T, &other),
            None,
            "other notices are the client's"
        );
    }

    #[test]
    fn a_values_refusal_narrows_the_batches_down_to_one_part() {
        let mut l = ListQueries::default();
        let wide = one_wide_batch(&mut l, 100);
        assert_eq!(values_of(&wide), 100);
        let mut widths = Vec::new();
        let mut sub = 0x10;
        loop {
            let refusal = closed(&format!("list{sub:x}"), "error: too many tag values");
            match l.on_message(T, &refusal) {
                Some(ListStep::Narrowed { values, .. }) => widths.push(values),
                Some(ListStep::Refused { requests, .. }) => {
                    assert_eq!(requests.len(), 1, "a part alone is refused for good");
                    break;
                }
                other => panic!("{other:?}"),
            }
            let next = l.start_waiting();
            assert_eq!(values_of(&next[0]), *widths.last().unwrap());
            sub += 1;
        }
        assert_eq!(widths, [10, 5, 2, 1]);
        l.clear();
        assert_eq!(l.values, 1, "a store's limit outlives the link");
    }

    #[test]
    fn a_refusal_no_lower_count_helps_is_final() {
        let mut l = ListQueries::default();
        l.start(3, Filter::new());
        let alone = closed("list0", "rate-limited: too many REQs");
        assert_eq!(
            l.on_message(T, &alone),
            Some(ListStep::Refused {
                requests: vec![3],
                reason: "rate-limited: too many REQs".into()
            }),
            "nothing else was open"
        );
        l.start(4, Filter::new());
        l.start(5, Filter::new());
        let restricted = closed("list1", "restricted: members only");
        assert_eq!(
            l.on_message(T, &restricted),
            Some(ListStep::Refused {
                requests: vec![4],
                reason: "restricted: members only".into()
            })
        );
        assert!(
            l.retry_refused().is_empty(),
            "only AUTH's refusals are asked again"
        );
    }

    #[test]
    fn at_most_a_few_listings_run_at_once_the_rest_wait_their_turn() {
        let mut l = ListQueries::default();
        let kind = |k: u16| Filter::new().kind(Kind::from_u16(k));
        for r in 0..MAX_IN_FLIGHT as u64 {
            assert!(l.start(r, kind(1621)).is_some());
        }
        assert_eq!(l.start(100, kind(1617)), None);
        assert_eq!(l.start(101, kind(1618)), None);
        assert!(l.start_waiting().is_empty(), "no slot is free yet");
        let eose = RelayMessage::eose(SubscriptionId::new("list0"));
        assert!(matches!(
            l.on_message(T, &eose),
            Some(ListStep::Done { lists, .. }) if lists[0].0 == 0
        ));
        let next = l.start_waiting();
        assert_eq!(next.len(), 1);
        assert!(
            next[0].contains("1617"),
            "oldest waiting first: {}",
            next[0]
        );
        let mut lost = l.clear();
        lost.sort_unstable();
        let mut want: Vec<u64> = (1..MAX_IN_FLIGHT as u64).collect();
        want.extend([100, 101]);
        assert_eq!(lost, want, "every listing open or waiting is reported lost");
        assert!(
            l.start_waiting().is_empty(),
            "a lost connection drops the queue"
        );
    }

    /// nostr-rs-relay drops a query a WAL checkpoint aborts without a
    /// word: the listing waited for its job's timeout, 40 s into a first
    /// sync that had nothing else left to do.
    #[test]
    fn a_page_left_silent_while_a_later_one_is_answered_is_asked_again() {
        let keys = Keys::generate();
        let a = event(&keys, 300);
        let mut l = ListQueries::default();
        l.start(1, Filter::new().kind(Kind::from_u16(1621)));
        l.start(2, Filter::new().kind(Kind::from_u16(1617)));
        assert_eq!(l.next_deadline(), None, "nothing answered yet");
        let eose = |sub: &str| RelayMessage::eose(SubscriptionId::new(sub));
        assert!(matches!(
            l.on_message(T, &eose("list1")),
            Some(ListStep::Done { lists, .. }) if lists[0].0 == 2
        ));
        let grace = Duration::from_secs(10);
        assert_eq!(l.next_deadline(), Some(T + grace));
        assert!(l.expire(T + grace - Duration::from_secs(1)).is_empty());
        let again = l.expire(T + grace);
        assert_eq!(again.len(), 2, "{again:?}");
        assert!(again[0].starts_with(r#"["CLOSE","list0"]"#), "{}", again[0]);
        assert!(again[1].starts_with(r#"["REQ","list2""#), "{}", again[1]);
        assert_eq!(l.unanswered(), 1);
        assert_eq!(l.next_deadline(), None);
        // The old subscription's late answer is not ours any more.
        assert_eq!(l.on_message(T, &eose("list0")), None);
        assert_eq!(until_of(&page(&mut l, "list2", &[&a])), "300");
        let ListStep::Done { mut lists, .. } = page(&mut l, "list2", &[]) else {
            panic!("the page asked again completes the listing");
        };
        let (request, held) = lists.pop().expect("one request");
        assert!(lists.is_empty());
        assert_eq!((request, held), (1, vec![(a.id, a.created_at)]));
    }

    #[test]
    fn a_page_that_answers_late_is_not_asked_again_and_the_grace_doubles() {
        let keys = Keys::generate();
        let a = event(&keys, 300);
        let mut l = ListQueries::default();
        let kind = |k: u16| Filter::new().kind(Kind::from_u16(k));
        l.start(1, kind(1621));
        l.start(2, kind(1617));
        l.on_message(T, &RelayMessage::eose(SubscriptionId::new("list1")));
        deliver(&mut l, "list0", &a);
        assert_eq!(l.next_deadline(), None, "it spoke in its grace");
        assert!(l.expire(T + Duration::from_secs(60)).is_empty());
        // A round taken as unanswered doubles the next grace.
        l.start(3, kind(1618));
        l.start(4, kind(1618));
        let later = T + Duration::from_secs(100);
        l.on_message(later, &RelayMessage::eose(SubscriptionId::new("list3")));
        let first = later + Duration::from_secs(10);
        assert_eq!(l.expire(first).len(), 2);
        l.start(5, kind(1617));
        l.on_message(first, &RelayMessage::eose(SubscriptionId::new("list5")));
        assert_eq!(l.next_deadline(), Some(first + Duration::from_secs(20)));
        l.clear();
        l.start(6, kind(1617));
        l.start(7, kind(1617));
        l.on_message(first, &RelayMessage::eose(SubscriptionId::new("list7")));
        assert_eq!(
            l.next_deadline(),
            Some(first + Duration::from_secs(10)),
            "a new connection starts afresh"
        );
    }

    /// Parts waiting their turn that differ only in their tag's value
    /// go out as one REQ, and each gets exactly the events its own filter
    /// matches.
    #[test]
    fn waiting_listings_of_one_shape_are_asked_together_and_answered_apart() {
        let keys = Keys::generate();
        let root = |n: u8| EventId::from_byte_array([n; 32]);
        let e = |n: u8| Filter::new().event(root(n));
        let reply = |at: u64, roots: &[u8]| {
            let tags = roots.iter().map(|&n| Tag::event(root(n)));
            EventBuilder::new(Kind::from_u16(1111), format!("{at}"))
                .tags(tags)
                .custom_created_at(Timestamp::from_secs(at))
                .finalize(&keys)
                .unwrap()
        };
        let mut l = ListQueries::default();
        for r in 0..MAX_IN_FLIGHT as u64 {
            assert!(
                l.start(r, Filter::new().kind(Kind::from_u16(1621)))
                    .is_some()
            );
        }
        for (request, n) in [(100, 1), (101, 2), (102, 3)] {
            assert_eq!(l.start(request, e(n)), None);
        }
        l.on_message(T, &RelayMessage::eose(SubscriptionId::new("list0")));
        let next = l.start_waiting();
        assert_eq!(next.len(), 1, "one REQ for the three: {next:?}");
        let req: serde_json::Value = serde_json::from_str(&next[0]).unwrap();
        assert_eq!(req[2]["#e"].as_array().map(Vec::len), Some(3), "{req}");
        let sub = req[1].as_str().unwrap().to_owned();
        let (only_1, both_1_3, only_2) = (reply(10, &[1]), reply(11, &[1, 3]), reply(12, &[2]));
        let step = page(&mut l, &sub, &[&only_2, &both_1_3, &only_1]);
        assert_eq!(until_of(&step), "10");
        let ListStep::Done { mut lists, .. } = page(&mut l, &sub, &[]) else {
            panic!("done");
        };
        lists.sort();
        let ids = |events: &[&nostr::prelude::Event]| {
            let mut held: Vec<_> = events.iter().map(|e| (e.id, e.created_at)).collect();
            held.sort();
            held
        };
        for (_, held) in &mut lists {
            held.sort();
        }
        assert_eq!(
            lists,
            [
                (100, ids(&[&only_1, &both_1_3])),
                (101, ids(&[&only_2])),
                (102, ids(&[&both_1_3])),
            ]
        );
    }

    /// A batch refused for AUTH is asked again, each request as it came.
    #[test]
    fn a_refused_batch_gives_back_each_of_its_requests() {
        let root = |n: u8| EventId::from_byte_array([n; 32]);
        let mut l = ListQueries {
            max_in_flight: 1,
            ..ListQueries::default()
        };
        l.start(1, Filter::new().kind(Kind::from_u16(1621)));
        l.start(2, Filter::new().event(root(1)));
        l.start(3, Filter::new().event(root(2)));
        l.on_message(T, &RelayMessage::eose(SubscriptionId::new("list0")));
        assert_eq!(l.start_waiting().len(), 1);
        let refused = l.on_message(T, &closed("list1", "auth-required: x"));
        assert_eq!(refused, Some(ListStep::NeedsAuth(vec![2, 3])));
        let again = l.retry_refused();
        assert_eq!(again.len(), 1, "batched again: {again:?}");
        let mut lost = l.clear();
        lost.sort_unstable();
        assert_eq!(lost, [2, 3]);
    }
}
