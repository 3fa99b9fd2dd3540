//! An in-memory NIP-01 relay for [`Sim`](super::Sim): stored events, open
//! subscriptions, the limits and refusals relays in the wild answer with,
//! NIP-42 and NIP-77. No sockets: [`FakeRelay::handle`] takes one client
//! message and returns the relay's replies.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use negentropy::{Id, Negentropy, NegentropyStorageVector};
use nostr::prelude::*;

use crate::RelayInfo;
use crate::testing::limits::{ValueCapRefusal, ValueCaps};

/// How a fake relay refuses a subscription over its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refuse {
    /// `CLOSED` with a limit reason.
    Closed,
    /// `NOTICE` naming no subscription (nostr-rs-relay).
    Notice,
    /// strfry's `NOTICE "ERROR: too many concurrent REQs"`, naming no
    /// subscription either: worded as the real one, so a test of the
    /// refusal issue 46 met reads as it did.
    StrfryNotice,
}

/// How a fake relay answers NIP-77.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NegMode {
    /// `NOTICE "ERROR: unknown cmd"`, as most relays today.
    Unknown,
    /// A real responder (the negentropy crate, as rust-nostr's relays).
    Supported,
    /// `NEG-ERR` to every NEG-OPEN.
    Error,
    /// No answer at all.
    Silent,
    /// A hostile responder whose exchange never converges: every answer
    /// reports `ids_per_round` ids no one stores and a fingerprint no set
    /// matches, so the client always has another round to send.
    Endless {
        /// Fresh (fake) ids reported missing per round.
        ids_per_round: usize,
    },
}

/// What a connect to a relay that is not [`online`](FakeRelay::online) meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offline {
    /// The connect fails (refused, unreachable).
    Refused,
    /// The connect is never answered.
    Hangs,
    /// The websocket upgrade is answered with this HTTP status (429, 503).
    Busy(u16),
}

/// An in-memory NIP-01 relay.
#[derive(Debug)]
pub struct FakeRelay {
    /// Stored events, oldest stored first.
    pub events: Vec<Event>,
    /// Accepts connects and answers pings; see [`offline`](Self::offline).
    pub online: bool,
    /// What a connect meets while not `online`.
    pub offline: Offline,
    /// Answers nothing on its own: messages are only tracked
    /// ([`open`](Self::open), [`last_auth`](Self::last_auth)), and the
    /// driver (a fuzz script) speaks for the relay with
    /// [`Sim::deliver`](super::Sim::deliver).
    pub scripted: bool,
    /// Stored results returned per REQ at most (all filters together).
    pub cap: usize,
    /// Stored results returned per FILTER at most, whatever `limit` asks
    /// (khatru over eventstore's SQL backends: 100; strfry 500). A filter
    /// without `limit` gets this many too.
    pub filter_cap: usize,
    /// Filters refused for too many values (eventstore's SQL backends).
    pub value_caps: Option<ValueCaps>,
    /// Longest tag value a filter may carry, as strfry (255 bytes): a REQ
    /// with a longer one is refused whole, `CLOSED "ERROR: bad req: error
    /// parsing #a: filter item too large"`.
    pub value_bytes: Option<usize>,
    /// Refusals by `value_caps`: one per REQ refused with `CLOSED`, one
    /// per filter refused with a `NOTICE`.
    pub value_refusals: usize,
    /// Most subscriptions open at once, and how one more is refused.
    pub max_subs: Option<(usize, Refuse)>,
    /// Most filters one REQ may carry; a REQ with more is refused with
    /// `CLOSED "error: too many filters"`, as relays with an unstated
    /// limit answer.
    pub max_filters: Option<usize>,
    /// Open subscriptions and their filters.
    pub subs: HashMap<String, Vec<Filter>>,
    /// Every REQ received: (sub id, filters).
    pub reqs: Vec<(String, Vec<Filter>)>,
    /// For every REQ in `reqs`, the NEG-OPENs received before it.
    pub neg_opens_before: Vec<usize>,
    /// Answer the next REQs that ask tags (Layer 2/3 work, not Layer 1)
    /// with CLOSED and these reasons, in order.
    pub close_next: VecDeque<String>,
    /// Answer a REQ that asks only one of these seconds (every filter's
    /// `since` and `until` on it: a crowded second asked in parts) with
    /// CLOSED and its reason, once each.
    pub close_second: Vec<(Timestamp, String)>,
    /// Never send EOSE.
    pub silent: bool,
    /// Take this many of the next REQs that ask `#e` (replies to roots)
    /// and never answer them: no event, EOSE, CLOSED or NOTICE, the
    /// subscription left open (and counted). nostr-rs-relay drops a query
    /// so when it aborts it for a WAL checkpoint, or after five seconds
    /// waiting for a reader.
    pub drop_next: usize,
    /// Every reply, and every live event, reaches the client this long
    /// after what caused it (the network's latency); zero: at once.
    /// [`Sim`](super::Sim) keeps them in flight meanwhile.
    pub reply_delay: Duration,
    /// Time the relay takes per client message, one at a time: replies
    /// to a burst come spread out, each after the ones before it.
    pub per_message: Duration,
    /// A REQ's stored events and EOSE come this much later still. As
    /// nostr-rs-relay: it refuses a REQ at once (a `NOTICE`) but runs each
    /// query on a worker thread, so an answer can come after the replies
    /// to later messages.
    pub query_delay: Duration,
    /// A stored query's `until` excludes its own second, as nostr-relay's
    /// SQL (`created_at < until`) does; NIP-01 includes it.
    pub until_exclusive: bool,
    /// Answers held back by [`query_delay`](Self::query_delay), for the
    /// [`Sim`](super::Sim) to send when due.
    query_answers: Vec<String>,
    /// Most subscriptions open at once.
    pub peak_subs: usize,
    /// Largest REQ message received, in bytes.
    pub largest_req: usize,
    /// NIP-42: refuse every REQ with `CLOSED auth-required:` (after sending
    /// this challenge) until a valid AUTH arrives.
    pub require_auth: Option<String>,
    /// Answer AUTH with `OK false` (wrong key).
    pub reject_auth: bool,
    /// After AUTH, refuse tag REQs with `restricted:`.
    pub restricted_after_auth: bool,
    /// AUTH events received.
    pub auths: Vec<Event>,
    authed: bool,
    /// How NEG-OPEN is answered.
    pub negentropy: NegMode,
    /// NEG-OPENs received.
    pub neg_opens: usize,
    /// Most negentropy sessions open at once, counted apart from REQs as
    /// strfry does; one more is refused with `NOTICE "ERROR: too many
    /// concurrent NEG requests"`, naming no session.
    pub max_neg: Option<usize>,
    /// NEG-OPENs refused by `max_neg`.
    pub neg_refusals: usize,
    /// Most items one negentropy session may cover; a `NEG-OPEN` whose
    /// filter matches more gets `NEG-ERR "rate-limited: too many
    /// negentropy items"`, as rust-nostr's relays answer past their
    /// `max_negentropy_items` (strfry: `"blocked: too many query
    /// results"` past `maxSyncEvents`).
    pub max_neg_items: Option<usize>,
    /// The NIP-11 limits it publishes (`None`: no document).
    pub info: Option<RelayInfo>,
    /// NIP-11 documents asked of it.
    pub info_fetches: usize,
    neg_sessions: HashMap<String, Negentropy<'static, NegentropyStorageVector>>,
    /// Fake ids an [`NegMode::Endless`] relay has reported so far.
    endless_ids: u64,
    /// Subscription and negentropy session ids the client opened on this
    /// connection and has not closed, oldest first, as its own messages
    /// left them (the relay's `CLOSED` does not count).
    open: Vec<String>,
    /// Id (hex) of the last AUTH event the client sent, on any connection.
    last_auth: Option<String>,
}

impl Default for FakeRelay {
    fn default() -> Self {
        FakeRelay::new()
    }
}

impl FakeRelay {
    /// An empty, honest, online relay without limits.
    pub fn new() -> Self {
        FakeRelay {
            events: Vec::new(),
            online: true,
            offline: Offline::Refused,
            scripted: false,
            cap: usize::MAX,
            filter_cap: usize::MAX,
            value_caps: None,
            value_bytes: None,
            value_refusals: 0,
            max_subs: None,
            max_filters: None,
            subs: HashMap::new(),
            reqs: Vec::new(),
            neg_opens_before: Vec::new(),
            close_next: VecDeque::new(),
            close_second: Vec::new(),
            silent: false,
            drop_next: 0,
            reply_delay: Duration::ZERO,
            per_message: Duration::ZERO,
            query_delay: Duration::ZERO,
            until_exclusive: false,
            query_answers: Vec::new(),
            peak_subs: 0,
            largest_req: 0,
            require_auth: None,
            reject_auth: false,
            restricted_after_auth: false,
            auths: Vec::new(),
            authed: false,
            negentropy: NegMode::Unknown,
            neg_opens: 0,
            max_neg: None,
            max_neg_items: None,
            neg_refusals: 0,
            info: None,
            info_fetches: 0,
            neg_sessions: HashMap::new(),
            endless_ids: 0,
            open: Vec::new(),
            last_auth: None,
        }
    }

    /// A relay that answers nothing on its own (see [`scripted`](Self::scripted)).
    pub fn scripted() -> Self {
        FakeRelay {
            scripted: true,
            ..FakeRelay::new()
        }
    }

    /// Subscription and negentropy session ids the client has open, oldest
    /// first (by its own REQ/NEG-OPEN and CLOSE/NEG-CLOSE).
    pub fn open(&self) -> &[String] {
        &self.open
    }

    /// The id (hex) of the last AUTH event the client sent, if any.
    pub fn last_auth(&self) -> Option<&str> {
        self.last_auth.as_deref()
    }

    /// A connection was made: it has nothing open yet.
    pub fn on_connect(&mut self) {
        self.open.clear();
    }

    /// A connection ended: subscriptions, negentropy sessions and
    /// authentication are per connection.
    pub fn on_disconnect(&mut self) {
        self.subs.clear();
        self.neg_sessions.clear();
        self.open.clear();
        self.authed = false;
    }

    /// Follows the ids the client opens and closes, and its AUTH, from the
    /// text alone (cheap enough for every message of a fuzz run).
    fn track(&mut self, message: &str) {
        let opened = ["[\"REQ\",\"", "[\"NEG-OPEN\",\""];
        let closed = ["[\"CLOSE\",\"", "[\"NEG-CLOSE\",\""];
        if let Some(id) = opened.iter().find_map(|p| quoted_after(message, p)) {
            self.open.push(id.to_owned());
        } else if let Some(id) = closed.iter().find_map(|p| quoted_after(message, p)) {
            self.open.retain(|s| s != id);
        } else if message.starts_with("[\"AUTH\"")
            && let Some(id) =
                quoted_after(message.split_once("\"id\":").map_or("", |(_, r)| r), "\"")
        {
            self.last_auth = Some(id.to_owned());
        }
    }

    /// NIP-77, relay side.
    fn on_neg(&mut self, sub: String, hex: &str, filter: Option<Filter>) -> Vec<String> {
        if let Some(filter) = filter {
            self.neg_opens += 1;
            match self.negentropy {
                NegMode::Unknown => {
                    return vec![RelayMessage::notice("ERROR: unknown cmd NEG-OPEN").as_json()];
                }
                NegMode::Error => {
                    return vec![format!(r#"["NEG-ERR","{sub}","blocked: not here"]"#)];
                }
                NegMode::Silent => return Vec::new(),
                NegMode::Supported | NegMode::Endless { .. } => {}
            }
            if self
                .value_bytes
                .is_some_and(|max| long_value(std::slice::from_ref(&filter), max).is_some())
            {
                self.value_refusals += 1;
                return vec![format!(
                    r#"["NEG-ERR","{sub}","ERROR: bad msg: filter item too large"]"#
                )];
            }
            if self
                .max_neg
                .is_some_and(|max| self.neg_sessions.len() >= max)
            {
                self.neg_refusals += 1;
                return vec![
                    RelayMessage::notice("ERROR: too many concurrent NEG requests").as_json(),
                ];
            }
            let matching = |e: &&Event| filter.match_event(e, MatchEventOptions::new());
            let items = self.events.iter().filter(matching).count();
            if self.max_neg_items.is_some_and(|max| items > max) {
                return vec![format!(
                    r#"["NEG-ERR","{sub}","rate-limited: too many negentropy items"]"#
                )];
            }
            let mut storage = NegentropyStorageVector::new();
            for e in self.events.iter().filter(matching) {
                storage
                    .insert(e.created_at.as_secs(), Id::from_byte_array(e.id.to_bytes()))
                    .expect("an unsealed storage takes items");
            }
            storage.seal().expect("sealed once");
            let neg = Negentropy::owned(storage, 0).expect("frame size 0 is valid");
            self.neg_sessions.insert(sub.clone(), neg);
        }
        if let NegMode::Endless { ids_per_round } = self.negentropy {
            return vec![self.endless_round(&sub, ids_per_round)];
        }
        let Some(neg) = self.neg_sessions.get_mut(&sub) else {
            return vec![format!(r#"["NEG-ERR","{sub}","closed: unknown"]"#)];
        };
        let bytes = crate::internal::hex::decode(hex).expect("the engine sends valid hex");
        let reply = neg
            .reconcile(&bytes)
            .expect("the engine sends valid negentropy messages");
        let hex = crate::internal::hex::encode(&reply);
        vec![format!(r#"["NEG-MSG","{sub}","{hex}"]"#)]
    }

    /// One `NEG-MSG` of an [`NegMode::Endless`] relay, in negentropy's
    /// v1 encoding: everything up to a far-future bound is an id list of
    /// `n` fresh fake ids (the client needs them all), and the rest, where
    /// the client holds nothing, a fingerprint that cannot match, so the
    /// client answers with that range again.
    fn endless_round(&mut self, sub: &str, n: usize) -> String {
        const FAR_FUTURE: u64 = 4_000_000_000;
        let mut frame = vec![0x61];
        frame.extend(var_int(FAR_FUTURE + 1));
        frame.extend([0, 2]); // no id prefix; mode IdList
        frame.extend(var_int(n as u64));
        for _ in 0..n {
            self.endless_ids += 1;
            let mut id = [0xee; 32];
            id[..8].copy_from_slice(&self.endless_ids.to_be_bytes());
            frame.extend(id);
        }
        frame.extend([0, 0, 1]); // upper bound infinity, no prefix; Fingerprint
        frame.extend([0xab; 16]);
        let hex = crate::internal::hex::encode(&frame);
        format!(r#"["NEG-MSG","{sub}","{hex}"]"#)
    }

    /// NIP-42: a valid kind 22242 with our challenge is accepted (unless
    /// `reject_auth`).
    fn on_auth(&mut self, event: Event) -> Vec<String> {
        let tag = |name: &str| {
            event
                .tags
                .iter()
                .map(|t| t.as_slice())
                .find(|t| t.first().map(String::as_str) == Some(name))
                .and_then(|t| t.get(1).cloned())
        };
        let valid = event.kind == Kind::Authentication
            && event.verify().is_ok()
            && tag("challenge") == self.require_auth
            && tag("relay").is_some();
        let accepted = valid && !self.reject_auth;
        self.authed |= accepted;
        let id = event.id;
        self.auths.push(event);
        vec![RelayMessage::ok(id, accepted, if accepted { "" } else { "restricted: no" }).as_json()]
    }

    /// The stored events and EOSEs [`query_delay`](Self::query_delay) held
    /// back since the last call.
    pub fn take_query_answers(&mut self) -> Vec<String> {
        std::mem::take(&mut self.query_answers)
    }

    /// Answers one client message; returns the relay's replies.
    pub fn handle(&mut self, text: &str) -> Vec<String> {
        self.track(text);
        if self.scripted {
            return Vec::new();
        }
        let msg = ClientMessage::from_json(text).expect("engine sends valid client messages");
        match msg {
            ClientMessage::Req {
                subscription_id,
                filters,
            } => {
                let filters: Vec<Filter> = filters.into_iter().map(|f| f.into_owned()).collect();
                self.on_req(subscription_id.to_string(), filters, text.len())
            }
            ClientMessage::Close(id) => {
                self.subs.remove(&id.to_string());
                Vec::new()
            }
            ClientMessage::Auth(event) => self.on_auth(event.into_owned()),
            ClientMessage::NegOpen {
                subscription_id,
                filter,
                initial_message,
            } => self.on_neg(
                subscription_id.to_string(),
                &initial_message,
                Some(filter.into_owned()),
            ),
            ClientMessage::NegMsg {
                subscription_id,
                message,
            } => self.on_neg(subscription_id.to_string(), &message, None),
            ClientMessage::NegClose { subscription_id } => {
                self.neg_sessions.remove(subscription_id.as_str());
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    fn on_req(&mut self, id: String, filters: Vec<Filter>, len: usize) -> Vec<String> {
        self.reqs.push((id.clone(), filters.clone()));
        self.neg_opens_before.push(self.neg_opens);
        self.largest_req = self.largest_req.max(len);
        let sub = SubscriptionId::new(&id);
        let closed = |reason: &str| vec![RelayMessage::closed(sub.clone(), reason).as_json()];
        let tagged = filters.iter().any(|f| !f.generic_tags.is_empty());
        if let Some(challenge) = self.require_auth.clone().filter(|_| !self.authed) {
            let mut out = vec![RelayMessage::auth(challenge).as_json()];
            out.extend(closed("auth-required: log in"));
            return out;
        }
        if tagged && self.authed && self.restricted_after_auth {
            return closed("restricted: members only");
        }
        if let Some(letter) = self.value_bytes.and_then(|max| long_value(&filters, max)) {
            self.value_refusals += 1;
            return closed(&format!(
                "ERROR: bad req: error parsing #{letter}: filter item too large"
            ));
        }
        if self.max_filters.is_some_and(|max| filters.len() > max) {
            return closed("error: too many filters");
        }
        // Not `pop_front_if`: it needs Rust 1.93, above the crate's rust-version.
        if let Some(reason) = tagged.then(|| self.close_next.pop_front()).flatten() {
            return closed(&reason);
        }
        let on = |at: Timestamp| {
            filters
                .iter()
                .all(|f| f.since == Some(at) && f.until == Some(at))
        };
        if let Some(i) = self.close_second.iter().position(|(at, _)| on(*at)) {
            let (_, reason) = self.close_second.remove(i);
            return closed(&reason);
        }
        // eventstore's value caps: a refused filter is queried for nothing.
        let mut out = Vec::new();
        let mut queried = Vec::with_capacity(filters.len());
        for filter in &filters {
            match self
                .value_caps
                .and_then(|caps| Some((caps, caps.check(filter)?)))
            {
                None => queried.push(filter.clone()),
                Some((caps, error)) => {
                    self.value_refusals += 1;
                    match caps.refusal {
                        ValueCapRefusal::Closed => return closed(&ValueCaps::closed_reason(error)),
                        ValueCapRefusal::Notice => out.push(RelayMessage::notice(error).as_json()),
                    }
                }
            }
        }
        if let Some((max, style)) = self.max_subs
            && self.subs.len() >= max
        {
            return match style {
                Refuse::Closed => closed("error: too many concurrent REQs"),
                Refuse::Notice => {
                    vec![
                        RelayMessage::notice("Maximum concurrent subscription count reached")
                            .as_json(),
                    ]
                }
                Refuse::StrfryNotice => {
                    vec![RelayMessage::notice("ERROR: too many concurrent REQs").as_json()]
                }
            };
        }
        if self.drop_next > 0 && asks_tag(&filters, 'e') {
            self.drop_next -= 1;
            self.subs.insert(id, filters);
            return out;
        }
        let mut answer: Vec<String> = self
            .stored(&queried)
            .into_iter()
            .map(|e| RelayMessage::event(sub.clone(), e).as_json())
            .collect();
        if !self.silent {
            answer.push(RelayMessage::eose(sub).as_json());
        }
        if self.query_delay.is_zero() {
            out.extend(answer);
        } else {
            self.query_answers.extend(answer);
        }
        self.subs.insert(id, filters);
        self.peak_subs = self.peak_subs.max(self.subs.len());
        out
    }

    /// Stored events for a REQ: per filter newest first up to its limit
    /// and the per-filter cap, merged, newest first, capped per REQ.
    fn stored(&self, filters: &[Filter]) -> Vec<Event> {
        let mut seen = HashSet::new();
        let mut all = Vec::new();
        for f in filters {
            let below =
                |e: &Event| !self.until_exclusive || f.until.is_none_or(|u| e.created_at < u);
            let mut hits: Vec<&Event> = self
                .events
                .iter()
                .filter(|e| f.match_event(e, MatchEventOptions::new()) && below(e))
                .collect();
            hits.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
            let limit = f.limit.unwrap_or(usize::MAX).min(self.filter_cap);
            for e in hits.into_iter().take(limit) {
                if seen.insert(e.id) {
                    all.push(e.clone());
                }
            }
        }
        all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
        all.truncate(self.cap);
        all
    }

    /// Stores an event and returns the live EVENT messages for open
    /// subscriptions (none if it was stored already).
    pub fn publish(&mut self, event: Event) -> Vec<String> {
        if self.has(&event.id) {
            return Vec::new();
        }
        let out = self
            .subs
            .iter()
            .filter(|(_, fs)| {
                fs.iter()
                    .any(|f| f.match_event(&event, MatchEventOptions::new()))
            })
            .map(|(id, _)| RelayMessage::event(SubscriptionId::new(id), event.clone()).as_json())
            .collect();
        self.events.push(event);
        out
    }

    /// True if the relay stores the event.
    pub fn has(&self, id: &EventId) -> bool {
        self.events.iter().any(|e| e.id == *id)
    }
}

/// The tag letter of the first value over `max` bytes in `filters`.
fn long_value(filters: &[Filter], max: usize) -> Option<char> {
    filters.iter().find_map(|f| {
        f.generic_tags
            .iter()
            .find(|(_, values)| values.iter().any(|v| v.len() > max))
            .map(|(tag, _)| tag.as_char())
    })
}

/// True when a filter of `filters` asks tag `letter`.
fn asks_tag(filters: &[Filter], letter: char) -> bool {
    filters
        .iter()
        .any(|f| f.generic_tags.keys().any(|tag| tag.as_char() == letter))
}

/// Negentropy's variable-length integer: base 128, most significant
/// group first, the high bit set on every byte but the last.
fn var_int(mut n: u64) -> Vec<u8> {
    let mut out = vec![(n & 0x7f) as u8];
    n >>= 7;
    while n > 0 {
        out.push((n & 0x7f) as u8 | 0x80);
        n >>= 7;
    }
    out.reverse();
    out
}

/// The text between `prefix` and the next quote, when `text` starts with `prefix`.
fn quoted_after<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.strip_prefix(prefix)?.split('"').next()
}
