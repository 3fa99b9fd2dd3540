//! The own-relay client: the protocol spoken on the one connection that
//! publishes synced events to the own relay and lists what it holds.
//!
//! It is a second state machine beside the engine, and sans-IO like it:
//! the shell reports the connection (`handle_connected`,
//! `handle_disconnected`) and its messages (`handle_message`), and drains
//! texts to send ([`OwnRelayClient::poll_transmit`]), what the engine must
//! learn ([`OwnRelayClient::poll_output`]), when to connect
//! ([`OwnRelayClient::poll_connect`]) and when to wake it
//! ([`OwnRelayClient::poll_timeout`]). So AUTH, feedback, listings and the
//! reconnect schedule are unit tests under a simulated clock, not socket
//! tests.
//!
//! Texts queued for a connection die with it: a listing page or an AUTH
//! answer means nothing to the next connection, while the outbox puts its
//! events in flight back in the queue and sends them again.
//!
//! What the own relay cannot take is set aside by the outbox, never
//! retried forever (see `outbox`): the client feeds it the own relay's size
//! `NOTICE`s and its deadlines ([`OwnRelayClient::handle_timeout`]).

use std::collections::VecDeque;
use std::time::Duration;

use log::{debug, info, warn};
use nostr::prelude::{ClientMessage, Event, EventId, Filter, Keys, RelayMessage, Timestamp};

use crate::sans_io::memory::index::is_index_kind;
use crate::sans_io::own_relay::link_budget::LinkBudget;
use crate::sans_io::own_relay::list_query::{ListQueries, ListStep};
use crate::sans_io::own_relay::outbox::{Outbox, OutboxStats};
use crate::sans_io::timing::health::{BackoffPolicy, HealthTracker};
use crate::sans_io::timing::time::Time;
use crate::sans_io::wire::nip42::auth_event;
use crate::sans_io::wire::relay_info::RelayInfo;
use crate::sans_io::wire::relay_text::{LogBudget, dropped, relay_text};

/// When to connect to the own relay again after a connection failed: 500
/// ms after the first failure in a row, doubling to a 30 s cap, back to the
/// start once a connection opens. The own relay is never given up on (it
/// is where every synced event goes, and where new repos and roots are
/// seen), so nothing here ever counts as dead. Both links keep it: this
/// write link (synced events and the listings), and the engine's read
/// link (the self-subscription), which had the remote relays' backoff and
/// came back up to an hour after the relay did.
pub(crate) const RECONNECT: BackoffPolicy = BackoffPolicy {
    base: Duration::from_millis(500),
    max: Duration::from_secs(30),
    dead_after: Duration::MAX,
    dead_retry: Duration::MAX,
    rate_limit_cooldown: Duration::ZERO,
};

/// Events in flight (sent, no `OK` yet) at most: enough to keep an own
/// relay that takes thousands a second busy across a round trip (a
/// pipelined publisher reaches LocalRelay's pace at 250-500), few enough
/// that a cut connection costs little to resend.
const WINDOW: usize = 256;

/// A text for the own-relay connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Transmit {
    /// An `EVENT` from the outbox (counted as the sink's traffic).
    Publish(String),
    /// A listing `REQ`/`CLOSE` or an `AUTH`.
    Control(String),
}

impl Transmit {
    /// The text to send.
    pub(crate) fn into_text(self) -> String {
        match self {
            Transmit::Publish(text) | Transmit::Control(text) => text,
        }
    }
}

/// What the engine must learn from the own relay.
#[derive(Debug, PartialEq)]
pub(crate) enum ClientOutput {
    /// The own relay now holds this announcement or root event (`OK true`
    /// or `duplicate:`). GRASP-01: the index learns a remotely found repo
    /// only once the own relay took it, so a repo it refuses is never synced.
    Stored(Event),
    /// The own relay refused this event for good (`blocked:`, `invalid:`,
    /// its size limit): the engine is not to fetch or offer it again.
    RefusedForGood(EventId),
    /// The own relay refused to list engine request `request`: its jobs
    /// need not wait for it.
    Unlisted(u64),
    /// The own relay listed what it holds for engine request `request`.
    Listed {
        /// The engine's request id.
        request: u64,
        /// What the own relay holds.
        listed: Vec<(EventId, Timestamp)>,
    },
}

/// Where a connection stands with NIP-42: one answer per connection, as
/// the engine does for relays it reads (a relay challenging with every
/// refusal must not get a burst of AUTHs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Auth {
    None,
    Sent(EventId),
    Accepted,
    Rejected,
}

/// The connection as the client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// None; the next may start at `retry_at`.
    Down { retry_at: Time },
    /// The shell is connecting.
    Connecting,
    /// Open, with where NIP-42 stands on it.
    Open { auth: Auth },
}

/// The client of the own relay: outbox, listings, AUTH and reconnects.
pub(crate) struct OwnRelayClient {
    url: String,
    /// NIP-42 key (the engine has its own copy for the relays it reads).
    keys: Option<Keys>,
    outbox: Outbox,
    /// Negentropy listings in flight on the connection.
    listings: ListQueries,
    link: Link,
    health: HealthTracker,
    /// Shutting down: connect only to flush what the outbox holds.
    draining: bool,
    /// Listing pages and AUTH for the open connection, in order.
    control: VecDeque<String>,
    outputs: VecDeque<ClientOutput>,
    /// When the operator was last told the own relay throttles the sync.
    throttle_warned: Option<Time>,
    /// What remote reads hold back while the outbox is full, as the shell
    /// last said (`handle_held_back`), for the warning's backlog.
    held_back: HeldBack,
    /// Messages the open connection carried so far.
    sent_on_link: usize,
    /// How many a connection may carry before the relay cuts it.
    budget: LinkBudget,
    /// Lines left for refused listings: a first sync of thousands of
    /// repos against an own relay refusing listings past its REQ limit
    /// logged one line per listing (1,600 in the 2,000-relay load run).
    listing_log: LogBudget,
}

/// What waits behind a full outbox, outside it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HeldBack {
    /// Events the engine verified and has not handed over yet.
    pub(crate) events: usize,
    /// Remote relays whose reads wait for room.
    pub(crate) relays: usize,
}

/// How often the operator is told, at most, that the own relay throttles.
const THROTTLE_WARN_EVERY: Duration = Duration::from_secs(60);

impl OwnRelayClient {
    /// A client of `url` whose outbox holds `capacity` events before the
    /// shell stops reading relays; it wants to connect at once.
    pub(crate) fn new(url: &str, keys: Option<Keys>, capacity: usize, now: Time) -> Self {
        OwnRelayClient {
            url: url.to_owned(),
            keys,
            outbox: Outbox::new(capacity, WINDOW),
            listings: ListQueries::default(),
            link: Link::Down { retry_at: now },
            health: HealthTracker::default(),
            draining: false,
            control: VecDeque::new(),
            outputs: VecDeque::new(),
            throttle_warned: None,
            held_back: HeldBack::default(),
            sent_on_link: 0,
            budget: LinkBudget::default(),
            listing_log: LogBudget::default(),
        }
    }

    /// The own relay's URL, to connect to.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    // ----- events and listings in -----

    /// Queues a synced event for the own relay; the engine received it at
    /// `received`.
    pub(crate) fn push(&mut self, event: Event, received: Time) {
        self.outbox.push(event, received);
    }

    /// When the oldest event the own relay has not answered yet was
    /// received (`Engine::save_state`'s `unsettled`).
    pub(crate) fn unsettled(&self) -> Option<Time> {
        self.outbox.oldest_received()
    }

    /// False while the outbox is at capacity: the shell stops taking events
    /// from the engine (and reading relays) until it drains.
    pub(crate) fn has_room(&self) -> bool {
        !self.outbox.is_full()
    }

    /// True when every event was answered by the own relay.
    pub(crate) fn is_drained(&self) -> bool {
        self.outbox.is_empty()
    }

    /// Events waiting or in flight.
    pub(crate) fn outbox_depth(&self) -> usize {
        self.outbox.depth()
    }

    /// What has not reached the own relay, in the order it was to go (for
    /// the state file at shutdown).
    pub(crate) fn leftovers(&self) -> Vec<Event> {
        self.outbox.leftovers()
    }

    /// Events the outbox holds at most.
    pub(crate) fn outbox_capacity(&self) -> usize {
        self.outbox.capacity()
    }

    /// Delivery counters.
    pub(crate) fn outbox_stats(&self) -> OutboxStats {
        self.outbox.stats
    }

    /// The engine asks what the own relay holds for `filter`. Asked on the
    /// open connection only: while it is down the engine's jobs go to REQ
    /// at once, which beats holding them up on a reconnect.
    pub(crate) fn handle_list(&mut self, request: u64, filter: Filter) {
        if !self.is_open() {
            debug!("own relay not connected; listing {request} not asked");
            return self.outputs.push_back(ClientOutput::Unlisted(request));
        }
        if let Some(req) = self.listings.start(request, filter) {
            self.control.push_back(req);
        }
    }

    /// The own relay's NIP-11 document: a `max_message_length` it states
    /// is a size limit the outbox keeps to from now on.
    pub(crate) fn handle_relay_info(&mut self, info: &RelayInfo) {
        if let Some(max_bytes) = info.max_message_length {
            debug!("own relay reads messages of {max_bytes} bytes at most");
            self.outbox.handle_stated_limit(max_bytes);
        }
        if let Some(subscriptions) = info.max_subscriptions {
            self.listings.handle_stated_limit(subscriptions);
        }
    }

    /// Gives back the room bursts left in the client's queues (a restart
    /// asks tens of thousands of listings at once).
    pub(crate) fn shrink_to_fit(&mut self) {
        self.control.shrink_to_fit();
        self.outputs.shrink_to_fit();
        self.listings.shrink_to_fit();
    }

    /// The shell is stopping: from now on connect only while events wait.
    pub(crate) fn handle_shutdown(&mut self) {
        self.draining = true;
    }

    // ----- the connection -----

    /// True when the shell should start a connection now (it then reports
    /// `handle_connected`, `handle_connect_error` or `handle_disconnected`).
    pub(crate) fn poll_connect(&mut self, now: Time) -> bool {
        match self.link {
            Link::Down { retry_at } if now >= retry_at && self.wants_link() => {
                self.link = Link::Connecting;
                true
            }
            _ => false,
        }
    }

    /// The shell could not even start a connection (a bad URL, a full DNS
    /// queue): nothing the relay did, so no backoff step, and nothing gets
    /// better soon, so the longest wait.
    pub(crate) fn handle_connect_error(&mut self, now: Time) {
        self.link = Link::Down {
            retry_at: now + RECONNECT.max,
        };
    }

    /// The websocket opened: a fresh NIP-42 state and backoff schedule.
    pub(crate) fn handle_connected(&mut self) {
        info!("own relay sink connected");
        self.link = Link::Open { auth: Auth::None };
        self.sent_on_link = 0;
        self.health.record_success();
    }

    /// The connection failed or was lost: events in flight go back in
    /// front of the queue, listings are lost (their jobs go to REQ), and
    /// the next connect waits one backoff step more. A busy link's cut
    /// teaches how many messages a link may carry, and is followed by a
    /// fresh link at once.
    pub(crate) fn handle_disconnected(&mut self, now: Time) {
        let busy = self.is_open() && self.budget.handle_cut(self.sent_on_link);
        self.outbox.handle_disconnect();
        let lost = self.listings.clear();
        self.outputs
            .extend(lost.into_iter().map(ClientOutput::Unlisted));
        self.control.clear();
        // A busy link's cut is the relay's limit, not a failure: the
        // backoff would stall the whole sync for nothing.
        let retry_at = match busy {
            true => now,
            false => self.health.record_failure_exact(now, &RECONNECT),
        };
        self.link = Link::Down { retry_at };
    }

    /// True when the open connection has carried its budget and nothing
    /// on it waits for an answer: the shell closes it and reports
    /// [`OwnRelayClient::handle_rotated`], before the relay cuts it.
    pub(crate) fn poll_rotate(&self) -> bool {
        self.is_open()
            && self.budget.spent(self.sent_on_link)
            && self.outbox.nothing_in_flight()
            && self.listings.is_idle()
            && self.control.is_empty()
    }

    /// The shell closed a spent connection: a fresh one at once, no
    /// backoff (nothing failed).
    pub(crate) fn handle_rotated(&mut self, now: Time) {
        debug!(
            "own relay link carried {} messages; a fresh one",
            self.sent_on_link
        );
        self.link = Link::Down { retry_at: now };
    }

    /// True while the websocket is open.
    pub(crate) fn is_open(&self) -> bool {
        matches!(self.link, Link::Open { .. })
    }

    /// Failed connects or lost connections in a row (1: in the first backoff).
    pub(crate) fn link_failures(&self) -> u32 {
        self.health.failures()
    }

    fn wants_link(&self) -> bool {
        !self.draining || !self.outbox.is_empty()
    }

    // ----- messages in -----

    /// A text from the own relay.
    pub(crate) fn handle_message(&mut self, now: Time, text: &str) {
        let Ok(message) = RelayMessage::from_json(text) else {
            return debug!("own relay sink: ignored message");
        };
        if let Some(step) = self.listings.on_message(now, &message) {
            return self.on_listing_step(now, step);
        }
        match message {
            RelayMessage::Ok {
                event_id,
                status,
                message,
            } => self.on_ok(now, event_id, status, &message),
            RelayMessage::Notice(n) => self.on_notice(&n),
            RelayMessage::Auth { challenge } => self.on_challenge(now, &challenge),
            _ => debug!("own relay sink: ignored message"),
        }
    }

    fn on_listing_step(&mut self, now: Time, step: ListStep) {
        match step {
            ListStep::Send(texts) => self.control.extend(texts),
            ListStep::Done { lists, close } => {
                self.control.push_back(close);
                let next = self.listings.start_waiting();
                self.control.extend(next);
                self.outputs.extend(
                    lists
                        .into_iter()
                        .map(|(request, listed)| ClientOutput::Listed { request, listed }),
                );
            }
            ListStep::Refused { requests, reason } => {
                if let Some(n) = self.listing_log.admit(0, now) {
                    info!(
                        "own relay refused listing {} ({}); its negentropy jobs use REQ{}",
                        requests_text(&requests),
                        relay_text(&reason),
                        dropped(n)
                    );
                }
                let next = self.listings.start_waiting();
                self.control.extend(next);
                self.outputs
                    .extend(requests.into_iter().map(ClientOutput::Unlisted));
            }
            ListStep::NeedsAuth(requests) => {
                info!(
                    "own relay wants AUTH for listing {}; asked again after it",
                    requests_text(&requests)
                );
            }
            ListStep::Narrowed {
                values,
                reason,
                texts,
            } => {
                info!(
                    "own relay refused a listing for its values ({}); at most {values} values a \
                     listing from now on",
                    relay_text(&reason)
                );
                self.control.extend(texts);
                let next = self.listings.start_waiting();
                self.control.extend(next);
            }
            ListStep::Lowered {
                open,
                limit,
                reason,
            } => {
                info!(
                    "own relay refused a listing with {open} of ours open ({}); at most \
                     {limit} at once on this connection",
                    relay_text(&reason)
                );
            }
        }
    }

    fn on_ok(&mut self, now: Time, id: EventId, accepted: bool, message: &str) {
        if let Link::Open { auth } = &mut self.link
            && *auth == Auth::Sent(id)
        {
            if !accepted {
                *auth = Auth::Rejected;
                return warn!("own relay rejected our AUTH: {}", relay_text(message));
            }
            info!("own relay sink authenticated");
            *auth = Auth::Accepted;
            // What was refused for wanting AUTH may go again now.
            self.outbox.resume();
            let again = self.listings.retry_refused();
            return self.control.extend(again);
        }
        if let Some(event) = self.outbox.handle_ok(now, &id, accepted, message)
            && is_index_kind(event.kind)
        {
            self.outputs.push_back(ClientOutput::Stored(event));
        }
        self.warn_if_throttled(now);
    }

    /// While the own relay rate-limits us, tells the operator once a
    /// minute what it takes and what waits: a throttled sync looks like a
    /// stalled one otherwise.
    fn warn_if_throttled(&mut self, now: Time) {
        let Some(rate) = self.outbox.accepted_rate() else {
            return;
        };
        if self
            .throttle_warned
            .is_some_and(|at| now < at + THROTTLE_WARN_EVERY)
        {
            return;
        }
        self.throttle_warned = Some(now);
        let waiting = self.outbox.depth();
        let HeldBack { events, relays } = self.held_back;
        let drain = Duration::from_secs_f64((waiting + events) as f64 / rate.max(1e-3));
        warn!(
            "own relay {} rate-limits the sync: it takes about {:.0} events a minute; backlog \
             {waiting} events in the outbox and {events} more held back, the reads of {relays} \
             remote relays paused meanwhile (about {} min to drain at that rate, more as reads \
             resume); let this client write faster (README: Beside your relay)",
            self.url,
            rate * 60.0,
            drain.as_secs().div_ceil(60),
        );
    }

    /// What waits behind the outbox outside it (the shell knows: the
    /// engine's events not handed over, the relays whose reads wait), for
    /// the throttling warning's backlog.
    pub(crate) fn handle_held_back(&mut self, held_back: HeldBack) {
        self.held_back = held_back;
    }

    /// Events a minute the own relay takes while it rate-limits us.
    pub(crate) fn accepted_per_minute(&self) -> Option<u64> {
        self.outbox
            .accepted_rate()
            .map(|r| (r * 60.0).round() as u64)
    }

    /// A `NOTICE` names no event; one saying an event was too large still
    /// tells the outbox one in flight will never be answered.
    fn on_notice(&mut self, notice: &str) {
        info!("own relay notice: {}", relay_text(notice));
        if is_size_notice(notice) {
            self.outbox.handle_too_large();
        }
    }

    /// The own relay challenged the connection: answer once, with the key
    /// the engine uses. An EVENT refused with `auth-required:` is retried
    /// by the outbox's backoff and goes through once this is accepted.
    fn on_challenge(&mut self, now: Time, challenge: &str) {
        let Some(keys) = self.keys.as_ref() else {
            return info!("own relay asks for AUTH; no key configured");
        };
        let Link::Open { auth } = &mut self.link else {
            return;
        };
        if *auth != Auth::None {
            return;
        }
        match auth_event(keys, &self.url, challenge, now) {
            Ok(event) => {
                *auth = Auth::Sent(event.id);
                self.control.push_back(ClientMessage::auth(event).as_json());
            }
            Err(e) => warn!("own relay AUTH: {e}"),
        }
    }

    /// Deadlines of events in flight at `now`. True when the connection is
    /// stuck (nothing answered for too long): the shell drops it and
    /// reports `handle_disconnected`.
    pub(crate) fn handle_timeout(&mut self, now: Time) -> bool {
        if !self.is_open() {
            return false;
        }
        let again = self.listings.expire(now);
        self.control.extend(again);
        self.outbox.expire(now)
    }

    /// Listing pages the own relay left silent and was asked again.
    pub(crate) fn listings_unanswered(&self) -> u64 {
        self.listings.unanswered()
    }

    // ----- out -----

    /// The next text to send on the open connection: listing pages and
    /// AUTH first, then what the outbox's window and pause allow.
    pub(crate) fn poll_transmit(&mut self, now: Time) -> Option<Transmit> {
        if !self.is_open() {
            return None;
        }
        let transmit = match self.control.pop_front() {
            Some(text) => Transmit::Control(text),
            // A spent link takes no new EVENT: it is ended once what it
            // carries is answered (`poll_rotate`).
            None if self.budget.spent(self.sent_on_link) => return None,
            None => Transmit::Publish(self.outbox.next_message(now)?),
        };
        self.sent_on_link += 1;
        Some(transmit)
    }

    /// The next thing the engine must learn.
    pub(crate) fn poll_output(&mut self) -> Option<ClientOutput> {
        let refused = self.outbox.take_refused_for_good();
        self.outputs
            .extend(refused.into_iter().map(ClientOutput::RefusedForGood));
        self.outputs.pop_front()
    }

    /// When to call again even if nothing happens: the reconnect time while
    /// down; the end of the outbox's pause, the first deadline in flight or
    /// a silent listing page's grace while open.
    pub(crate) fn poll_timeout(&self) -> Option<Time> {
        match self.link {
            Link::Down { retry_at } if self.wants_link() => Some(retry_at),
            Link::Open { .. } => [
                self.outbox.paused_until(),
                self.outbox.next_deadline(),
                self.listings.next_deadline(),
            ]
            .into_iter()
            .flatten()
            .min(),
            Link::Down { .. } | Link::Connecting => None,
        }
    }
}

/// The engine requests a listing carried, for a log line: `7`, or `7, 9
/// and 12` for a batch.
fn requests_text(requests: &[u64]) -> String {
    let texts: Vec<String> = requests.iter().map(u64::to_string).collect();
    match texts.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// True for a `NOTICE` saying a message was over the relay's size limit:
/// nostr-rs-relay's "event exceeded max size", and the "message too large"
/// / "too long" of relays whose websocket layer refuses the frame.
fn is_size_notice(notice: &str) -> bool {
    let lower = notice.to_ascii_lowercase();
    ["exceeded max size", "too large", "too long"]
        .iter()
        .any(|phrase| lower.contains(phrase))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sans_io::own_relay::outbox::OwnRefusal;
    use nostr::prelude::{EventBuilder, FinalizeEvent, Kind, SubscriptionId};

    const URL: &str = "ws://own.example";
    const T0: Time = Time::from_secs(1_700_000_000);

    fn event(keys: &Keys, kind: u16, n: u64) -> Event {
        EventBuilder::new(Kind::from_u16(kind), format!("{n}"))
            .custom_created_at(Timestamp::from_secs(n))
            .finalize(keys)
            .unwrap()
    }

    /// A client with `keys` whose connection is open at `T0`.
    fn open_client(keys: Option<Keys>) -> OwnRelayClient {
        let mut c = OwnRelayClient::new(URL, keys, 1_000, T0);
        assert!(c.poll_connect(T0), "wants its connection at once");
        c.handle_connected();
        c
    }

    fn drain(c: &mut OwnRelayClient, now: Time) -> Vec<Transmit> {
        std::iter::from_fn(|| c.poll_transmit(now)).collect()
    }

    fn texts(c: &mut OwnRelayClient, now: Time) -> Vec<String> {
        drain(c, now).into_iter().map(Transmit::into_text).collect()
    }

    fn json(text: &str) -> Vec<serde_json::Value> {
        serde_json::from_str(text).unwrap()
    }

    fn ok(id: &str, accepted: bool, message: &str) -> String {
        serde_json::json!(["OK", id, accepted, message]).to_string()
    }

    fn challenge(c: &mut OwnRelayClient, now: Time) {
        c.handle_message(now, r#"["AUTH","c1"]"#);
    }

    /// The id of the AUTH event in `texts`, checking there is exactly one.
    fn auth_id(texts: &[String]) -> String {
        let auths: Vec<_> = texts
            .iter()
            .filter(|t| t.starts_with(r#"["AUTH""#))
            .collect();
        assert_eq!(auths.len(), 1, "{texts:?}");
        json(auths[0])[1]["id"].as_str().unwrap().to_owned()
    }

    /// Issue 24: only refusals that asking again cannot change are
    /// remembered (and then neither fetched nor offered again); a rate
    /// limit, a wish for AUTH or an error are retried and never remembered.
    #[test]
    fn only_refusals_for_good_are_handed_to_the_engine() {
        let keys = Keys::generate();
        let mut c = open_client(None);
        let answers = [
            "blocked: event does not relate to a stored repository",
            "invalid: bad signature",
            "restricted: not on the whitelist",
            "rate-limited: slow down, please",
            "auth-required: who are you",
            "error: database busy",
        ];
        let events: Vec<Event> = (0..answers.len() as u64)
            .map(|n| event(&keys, 1, n))
            .collect();
        for e in &events {
            c.push(e.clone(), Time::default());
        }
        let sent = texts(&mut c, T0);
        assert_eq!(sent.len(), events.len(), "one window");
        for (e, answer) in events.iter().zip(answers) {
            c.handle_message(T0, &ok(&e.id.to_hex(), false, answer));
        }
        let outputs: Vec<_> = std::iter::from_fn(|| c.poll_output()).collect();
        assert_eq!(
            outputs,
            vec![
                ClientOutput::RefusedForGood(events[0].id),
                ClientOutput::RefusedForGood(events[1].id),
            ]
        );
        let left: Vec<EventId> = c.leftovers().iter().map(|e| e.id).collect();
        assert_eq!(
            left,
            [events[3].id, events[4].id, events[5].id],
            "retried, in order"
        );
    }

    #[test]
    fn auth_is_answered_once_per_connection() {
        let keys = Keys::generate();
        let mut c = open_client(Some(keys.clone()));
        challenge(&mut c, T0);
        challenge(&mut c, T0);
        let sent = texts(&mut c, T0);
        let auth: serde_json::Value = json(&sent[0]).remove(1);
        assert_eq!(auth_id(&sent), auth["id"].as_str().unwrap());
        assert_eq!(auth["pubkey"], keys.public_key().to_hex());
        assert!(auth["tags"].to_string().contains(URL), "signed for our URL");
        // Rejected: the same connection does not try again.
        c.handle_message(
            T0,
            &ok(auth["id"].as_str().unwrap(), false, "restricted: no"),
        );
        challenge(&mut c, T0);
        assert!(texts(&mut c, T0).is_empty());
        // A new connection answers again.
        c.handle_disconnected(T0);
        assert!(c.poll_connect(T0 + Duration::from_secs(1)));
        c.handle_connected();
        challenge(&mut c, T0);
        auth_id(&texts(&mut c, T0));
    }

    #[test]
    fn without_a_key_a_challenge_is_not_answered() {
        let mut c = open_client(None);
        challenge(&mut c, T0);
        assert!(texts(&mut c, T0).is_empty());
    }

    #[test]
    fn accepted_auth_resends_what_wanted_it_at_once() {
        let keys = Keys::generate();
        let mut c = open_client(Some(keys.clone()));
        c.push(event(&keys, 1, 1), Time::default());
        c.handle_list(7, Filter::new().kind(Kind::from_u16(1621)));
        let sent = texts(&mut c, T0);
        assert_eq!(sent.len(), 2, "{sent:?}");
        let event_id = json(&sent[1])[1]["id"].as_str().unwrap().to_owned();
        c.handle_message(T0, &ok(&event_id, false, "auth-required: who?"));
        c.handle_message(T0, r#"["CLOSED","list0","auth-required: who?"]"#);
        assert_eq!(
            c.poll_timeout(),
            Some(T0 + Duration::from_secs(2)),
            "paused"
        );
        challenge(&mut c, T0);
        let auth = auth_id(&texts(&mut c, T0));
        c.handle_message(T0, &ok(&auth, true, ""));
        let again = texts(&mut c, T0);
        assert_eq!(
            again.len(),
            2,
            "the listing and the event, unpaused: {again:?}"
        );
        assert!(again[0].starts_with(r#"["REQ","list1""#), "{}", again[0]);
        assert_eq!(json(&again[1])[1]["id"], event_id.as_str());
    }

    #[test]
    fn ok_feeds_back_index_kinds_the_own_relay_now_holds() {
        let keys = Keys::generate();
        let mut c = open_client(None);
        let announcement = event(&keys, 30617, 1);
        let root = event(&keys, 1621, 2);
        let note = event(&keys, 1, 3);
        let refused = event(&keys, 1617, 4);
        for e in [&announcement, &root, &note, &refused] {
            c.push(e.clone(), Time::default());
        }
        let sent = drain(&mut c, T0);
        assert!(sent.iter().all(|t| matches!(t, Transmit::Publish(_))));
        c.handle_message(T0, &ok(&announcement.id.to_hex(), true, ""));
        c.handle_message(T0, &ok(&root.id.to_hex(), false, "duplicate: have it"));
        c.handle_message(T0, &ok(&note.id.to_hex(), true, ""));
        c.handle_message(T0, &ok(&refused.id.to_hex(), false, "blocked: not ours"));
        let out: Vec<_> = std::iter::from_fn(|| c.poll_output()).collect();
        assert_eq!(
            out,
            [
                ClientOutput::Stored(announcement),
                ClientOutput::Stored(root),
                ClientOutput::RefusedForGood(refused.id),
            ]
        );
        let stats = c.outbox_stats();
        assert_eq!((stats.stored, stats.duplicate, stats.rejected), (3, 1, 1));
        assert!(c.is_drained());
    }

    #[test]
    fn reconnect_backoff_doubles_to_thirty_seconds_and_an_open_resets_it() {
        let mut c = OwnRelayClient::new(URL, None, 10, T0);
        let mut now = T0;
        let mut waits = Vec::new();
        for _ in 0..9 {
            assert!(c.poll_connect(now));
            assert!(!c.poll_connect(now), "one connection at a time");
            assert_eq!(c.poll_timeout(), None, "connecting");
            c.handle_disconnected(now);
            let retry = c.poll_timeout().unwrap();
            assert!(!c.poll_connect(retry - Duration::from_millis(1)));
            waits.push(retry.since(now).as_millis());
            now = retry;
        }
        assert_eq!(
            waits,
            [
                500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000
            ]
        );
        assert!(c.poll_connect(now));
        c.handle_connected();
        c.handle_disconnected(now);
        assert_eq!(c.poll_timeout(), Some(now + Duration::from_millis(500)));
        // No connection could even be started: the longest wait, no step.
        assert!(c.poll_connect(now + Duration::from_millis(500)));
        c.handle_connect_error(now);
        assert_eq!(c.poll_timeout(), Some(now + Duration::from_secs(30)));
    }

    #[test]
    fn events_in_flight_are_sent_again_after_a_reconnect() {
        let keys = Keys::generate();
        let mut c = open_client(None);
        let events: Vec<_> = (0..3).map(|n| event(&keys, 1, n)).collect();
        for e in &events {
            c.push(e.clone(), Time::default());
        }
        assert_eq!(drain(&mut c, T0).len(), 3);
        c.handle_message(T0, &ok(&events[0].id.to_hex(), true, ""));
        c.handle_disconnected(T0);
        assert!(drain(&mut c, T0).is_empty(), "nothing goes while down");
        assert_eq!(c.outbox_depth(), 2, "nothing lost");
        let retry = c.poll_timeout().unwrap();
        assert!(c.poll_connect(retry));
        assert!(
            drain(&mut c, retry).is_empty(),
            "nothing goes while connecting"
        );
        c.handle_connected();
        // Each was in flight when the connection was lost: one at a time,
        // in order, so a poison pill among them is found.
        for e in &events[1..] {
            assert_eq!(sent_ids(&texts(&mut c, retry)), [e.id.to_hex()]);
            c.handle_message(retry, &ok(&e.id.to_hex(), true, ""));
        }
        assert!(c.is_drained());
    }

    /// Issue 33: an own relay refusing every listing past its REQ limit
    /// during a first sync of 2,000 repos logged 1,600 lines, one per
    /// listing. Now a minute logs ten, and the next line says how many
    /// were left out; every refusal still reaches the engine.
    #[test]
    fn refused_listings_log_a_few_lines_a_minute_with_a_count() {
        use crate::testing::log_capture::logged;
        logged("");
        let mut c = open_client(None);
        let filter = Filter::new().kind(Kind::from_u16(1621));
        let refuse = |c: &mut OwnRelayClient, i: u64, now: Time| {
            c.handle_list(i, filter.clone());
            let req = texts(c, now);
            assert!(
                req[0].starts_with(&format!(r#"["REQ","list{i:x}""#)),
                "{req:?}"
            );
            let closed = format!(r#"["CLOSED","list{i:x}","blocked: no listings for you"]"#);
            c.handle_message(now, &closed);
            assert_eq!(c.poll_output(), Some(ClientOutput::Unlisted(i)));
        };
        for i in 0..1_600 {
            refuse(&mut c, i, T0 + Duration::from_millis(i));
        }
        let lines = logged("refused listing");
        assert_eq!(lines.len(), 10, "{lines:?}");
        refuse(&mut c, 1_600, T0 + Duration::from_secs(61));
        let lines = logged("refused listing");
        assert_eq!(lines.len(), 11);
        assert!(lines[10].contains("1590 earlier lines"), "{}", lines[10]);
    }

    /// The client wakes for a silent listing page's grace and asks it
    /// again then (the shell only calls `handle_timeout` when woken).
    #[test]
    fn a_listing_page_the_own_relay_drops_is_asked_again_when_its_grace_ends() {
        let mut c = open_client(None);
        c.handle_list(1, Filter::new().kind(Kind::from_u16(1621)));
        c.handle_list(2, Filter::new().kind(Kind::from_u16(1617)));
        assert_eq!(texts(&mut c, T0).len(), 2);
        c.handle_message(T0, r#"["EOSE","list1"]"#);
        assert!(matches!(
            c.poll_output(),
            Some(ClientOutput::Listed { request: 2, .. })
        ));
        assert_eq!(texts(&mut c, T0), [r#"["CLOSE","list1"]"#]);
        let grace = T0 + Duration::from_secs(10);
        assert_eq!(c.poll_timeout(), Some(grace));
        assert!(!c.handle_timeout(grace), "the connection is fine");
        let again = texts(&mut c, grace);
        assert_eq!(again[0], r#"["CLOSE","list0"]"#);
        assert!(again[1].starts_with(r#"["REQ","list2""#), "{again:?}");
        assert_eq!(c.listings_unanswered(), 1);
        c.handle_message(grace, r#"["EOSE","list2"]"#);
        assert_eq!(
            c.poll_output(),
            Some(ClientOutput::Listed {
                request: 1,
                listed: Vec::new()
            })
        );
    }

    #[test]
    fn listings_are_answered_on_an_open_connection_and_reported_lost_with_it() {
        let keys = Keys::generate();
        let mut c = OwnRelayClient::new(URL, None, 10, T0);
        let filter = Filter::new().kind(Kind::from_u16(1621));
        c.handle_list(1, filter.clone());
        assert_eq!(
            c.poll_output(),
            Some(ClientOutput::Unlisted(1)),
            "its jobs need not wait"
        );
        assert!(c.poll_connect(T0));
        c.handle_connected();
        assert!(texts(&mut c, T0).is_empty(), "not asked while down");
        c.handle_list(2, filter.clone());
        let req = texts(&mut c, T0);
        assert!(req[0].starts_with(r#"["REQ","list0""#), "{req:?}");
        let held = event(&keys, 1621, 5);
        let page = RelayMessage::event(SubscriptionId::new("list0"), held.clone());
        c.handle_message(T0, &page.as_json());
        c.handle_message(T0, r#"["EOSE","list0"]"#);
        let next_page = texts(&mut c, T0);
        assert!(next_page[1].contains(r#""until":5"#), "{next_page:?}");
        c.handle_message(T0, r#"["EOSE","list0"]"#);
        assert_eq!(
            c.poll_output(),
            Some(ClientOutput::Listed {
                request: 2,
                listed: vec![(held.id, held.created_at)],
            })
        );
        assert_eq!(texts(&mut c, T0), [r#"["CLOSE","list0"]"#]);
        // A listing in flight when the connection drops is never answered
        // (the engine learns so at once) and its texts do not go on the
        // next connection.
        c.handle_list(3, filter);
        c.handle_disconnected(T0);
        assert_eq!(c.poll_output(), Some(ClientOutput::Unlisted(3)));
        assert!(c.poll_connect(c.poll_timeout().unwrap()));
        c.handle_connected();
        c.handle_message(T0, r#"["EOSE","list1"]"#);
        assert_eq!(c.poll_output(), None);
        assert!(texts(&mut c, T0).is_empty());
    }

    #[test]
    fn shutting_down_connects_only_while_events_wait() {
        let keys = Keys::generate();
        let mut c = OwnRelayClient::new(URL, None, 10, T0);
        c.handle_shutdown();
        assert!(!c.poll_connect(T0));
        assert_eq!(c.poll_timeout(), None, "nothing to wake up for");
        c.push(event(&keys, 1, 1), Time::default());
        assert_eq!(c.poll_timeout(), Some(T0));
        assert!(c.poll_connect(T0));
    }

    /// The ids of the `EVENT`s among `texts`.
    fn sent_ids(texts: &[String]) -> Vec<String> {
        texts
            .iter()
            .map(|t| json(t)[1]["id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Issue 33: an own relay that cuts a connection after `CUT` messages
    /// (LocalRelay resets one past about 6,000 a minute). The first cut
    /// swallows the `OK`s of what was in flight, and only those events go
    /// again; every later link is ended by us before the cut, with nothing
    /// in flight, so no other event is sent twice and no backoff is paid.
    #[test]
    fn a_relay_that_cuts_busy_links_gets_each_event_once_after_the_first_cut() {
        const CUT: usize = 1_500;
        const EVENTS: u64 = 6_000;
        let keys = Keys::generate();
        let events: Vec<Event> = (0..EVENTS).map(|n| event(&keys, 1, n)).collect();
        let mut c = OwnRelayClient::new(URL, None, EVENTS as usize, T0);
        for e in &events {
            c.push(e.clone(), T0);
        }
        let mut sends: std::collections::HashMap<String, usize> = Default::default();
        let (now, mut links, mut cuts, mut rotations) = (T0, 0, 0, 0);
        let mut in_flight_at_cut = 0;
        while !c.is_drained() {
            assert!(links < 100, "no end");
            assert_eq!(c.poll_timeout(), Some(now), "a fresh link at once");
            assert!(c.poll_connect(now));
            c.handle_connected();
            links += 1;
            let mut carried = 0;
            loop {
                let out = sent_ids(&texts(&mut c, now));
                if out.is_empty() && c.is_drained() {
                    break;
                }
                if out.is_empty() {
                    assert!(c.poll_rotate(), "a link stalls only when spent");
                    c.handle_rotated(now);
                    rotations += 1;
                    break;
                }
                // The relay stores what it reads up to the cut, and
                // answers all but what was in flight when it cut.
                let room = CUT - carried;
                carried += out.len().min(room);
                for id in &out[..out.len().min(room)] {
                    *sends.entry(id.clone()).or_default() += 1;
                }
                if carried == CUT {
                    in_flight_at_cut += out.len().min(room);
                    cuts += 1;
                    c.handle_disconnected(now);
                    // A link that carried its thousands is no failure:
                    // the 500 ms backoff it cost was a stall of the
                    // whole first sync (issue 33's load run).
                    assert_eq!(c.poll_timeout(), Some(now), "no backoff");
                    break;
                }
                for id in &out {
                    c.handle_message(now, &ok(id, true, ""));
                }
            }
        }
        assert_eq!(
            sends.len(),
            EVENTS as usize,
            "every event reached the relay"
        );
        let twice = sends.values().filter(|&&n| n > 1).count();
        assert_eq!(cuts, 1, "only the first busy link is cut");
        assert!(
            rotations >= 3,
            "later links end before the cut: {rotations}"
        );
        assert!(
            twice <= in_flight_at_cut && twice <= WINDOW,
            "{twice} events sent twice; {in_flight_at_cut} were in flight at the cut"
        );
        assert!(sends.values().all(|&n| n <= 2));
    }

    fn hexes(events: &[Event]) -> Vec<String> {
        events.iter().map(|e| e.id.to_hex()).collect()
    }

    /// nostr-rs-relay answers an event over its `max_event_bytes` with this
    /// `NOTICE` and no `OK`; a full window of them used to stall the outbox
    /// for good. (The first window is the pacer's initial one.)
    #[test]
    fn size_notices_set_a_full_window_aside_and_the_rest_goes() {
        const WINDOW: usize = crate::sans_io::own_relay::pacer::INITIAL_WINDOW;
        let keys = Keys::generate();
        let mut c = open_client(None);
        let big = "x".repeat(2_000);
        let large: Vec<_> = (0..WINDOW)
            .map(|n| {
                EventBuilder::new(Kind::from_u16(1), format!("{n}{big}"))
                    .finalize(&keys)
                    .unwrap()
            })
            .collect();
        let small: Vec<_> = (0..5).map(|n| event(&keys, 1, 1_000 + n)).collect();
        for e in large.iter().chain(&small) {
            c.push(e.clone(), Time::default());
        }
        assert_eq!(drain(&mut c, T0).len(), WINDOW, "a window of large events");
        for _ in 0..WINDOW {
            c.handle_message(T0, r#"["NOTICE","event exceeded max size"]"#);
        }
        assert_eq!(sent_ids(&texts(&mut c, T0)), hexes(&small));
        assert_eq!(c.outbox_stats().set_aside, WINDOW as u64);
    }

    /// An event in flight has a deadline: the client wants to be woken for
    /// it even when nothing else is due, and a connection that answered
    /// nothing by then is stuck.
    #[test]
    fn an_event_in_flight_has_a_deadline() {
        let keys = Keys::generate();
        let mut c = open_client(None);
        c.push(event(&keys, 1, 1), Time::default());
        assert_eq!(drain(&mut c, T0).len(), 1);
        let deadline = T0 + Duration::from_secs(30);
        assert_eq!(c.poll_timeout(), Some(deadline));
        assert!(!c.handle_timeout(T0 + Duration::from_secs(29)));
        assert!(c.handle_timeout(deadline), "stuck: the shell drops it");
    }

    #[test]
    fn a_full_outbox_has_no_room_until_the_own_relay_answers() {
        let keys = Keys::generate();
        let mut c = OwnRelayClient::new(URL, None, 2, T0);
        let events: Vec<_> = (0..2).map(|n| event(&keys, 1, n)).collect();
        for e in &events {
            c.push(e.clone(), Time::default());
        }
        assert!(!c.has_room());
        assert!(c.poll_connect(T0));
        c.handle_connected();
        drain(&mut c, T0);
        assert!(!c.has_room(), "in flight still counts");
        c.handle_message(T0, &ok(&events[0].id.to_hex(), true, ""));
        assert!(c.has_room());
    }

    /// Issue 24: a rate-limited own relay is paced, one event at a time
    /// after the refusal, and what it takes is known (for the warning and
    /// `grasp_sync_own_relay_accepted_per_minute`); once it takes all we
    /// send again, nothing is paced.
    #[test]
    fn a_rate_limited_own_relay_is_paced_and_its_rate_known() {
        let keys = Keys::generate();
        let mut c = open_client(None);
        let events: Vec<_> = (0..100).map(|n| event(&keys, 1, 1_000 + n)).collect();
        for e in &events {
            c.push(e.clone(), Time::default());
        }
        let first = sent_ids(&texts(&mut c, T0));
        assert_eq!(c.accepted_per_minute(), None, "not throttled yet");
        for id in &first {
            c.handle_message(T0, &ok(id, false, "rate-limited: slow down, please"));
        }
        assert_eq!(c.accepted_per_minute(), Some(60), "one a second to start");
        assert!(texts(&mut c, T0).is_empty(), "the refused window waits");
        let at = c.poll_timeout().expect("woken for the next send");
        let mut sent = sent_ids(&texts(&mut c, at));
        assert_eq!(sent, first[..1], "one, the oldest refused, goes again");
        let mut now = at;
        while !sent.is_empty() {
            for id in &sent {
                c.handle_message(now, &ok(id, true, ""));
            }
            now = c.poll_timeout().unwrap_or(now).max(now);
            sent = sent_ids(&texts(&mut c, now));
        }
        assert_eq!(c.accepted_per_minute(), None, "unpaced once it takes all");
        let refused = c.outbox_stats().refused;
        assert_eq!(
            refused[OwnRefusal::RateLimited as usize],
            first.len() as u64
        );
        assert_eq!(
            refused.iter().sum::<u64>(),
            first.len() as u64,
            "by its reason"
        );
    }
}
