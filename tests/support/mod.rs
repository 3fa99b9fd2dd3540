//! A simulated world for the sans-IO engine: fake relays that speak NIP-01
//! in memory, a clock that jumps to the engine's next deadline, and signed
//! NIP-34 events built from fixed keys. No sockets, no sleeps.

#![allow(dead_code)]

pub mod client;
pub mod real;
pub mod running;

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use grasp_sync::{Action, Config, Engine, Output, RelayId, RelayInfo, Time};
use negentropy::{Id, Negentropy, NegentropyStorageVector};
use nostr::prelude::*;

/// How a fake relay refuses a subscription over its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refuse {
    /// `CLOSED` with a limit reason.
    Closed,
    /// `NOTICE` naming no subscription (nostr-rs-relay).
    Notice,
}

/// What an eventstore SQL backend (under khatru) refuses per filter: more
/// tag values (all tags together), kinds, or ids/authors than this. It
/// answers with `CLOSED` and `error: too many tag values` (`kinds`, `ids`,
/// `authors`), refusing the whole REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueCaps {
    pub tag_values: usize,
    pub kinds: usize,
    pub ids: usize,
}

impl ValueCaps {
    /// fiatjaf/eventstore's SQL backends: 10 tag values, 10 kinds, 500 ids.
    pub const EVENTSTORE: ValueCaps = ValueCaps {
        tag_values: 10,
        kinds: 10,
        ids: 500,
    };

    /// The refusal reason for `filter`, if it passes a cap.
    pub fn refusal(&self, filter: &Filter) -> Option<&'static str> {
        let tag_values: usize = filter.generic_tags.values().map(|v| v.len()).sum();
        let kinds = filter.kinds.as_ref().map_or(0, |k| k.len());
        let ids = filter.ids.as_ref().map_or(0, |v| v.len());
        let authors = filter.authors.as_ref().map_or(0, |v| v.len());
        if tag_values > self.tag_values {
            Some("error: too many tag values")
        } else if kinds > self.kinds {
            Some("error: too many kinds")
        } else if ids > self.ids {
            Some("error: too many ids")
        } else if authors > self.ids {
            Some("error: too many authors")
        } else {
            None
        }
    }
}

/// An in-memory NIP-01 relay.
#[derive(Debug)]
pub struct FakeRelay {
    pub events: Vec<Event>,
    pub online: bool,
    /// Stored results returned per REQ at most (all filters together).
    pub cap: usize,
    /// Stored results returned per FILTER at most, whatever `limit` asks
    /// (khatru over eventstore's SQL backends: 100; strfry 500). A filter
    /// without `limit` gets this many too.
    pub filter_cap: usize,
    /// Filters refused for too many values (eventstore SQL backends).
    pub value_caps: Option<ValueCaps>,
    /// REQs refused by `value_caps`.
    pub value_refusals: usize,
    pub max_subs: Option<(usize, Refuse)>,
    pub subs: HashMap<String, Vec<Filter>>,
    /// Every REQ received: (sub id, filters).
    pub reqs: Vec<(String, Vec<Filter>)>,
    /// Answer the next REQs that ask tags (Layer 2/3 work, not Layer 1)
    /// with CLOSED and these reasons, in order.
    pub close_next: VecDeque<String>,
    /// Never send EOSE.
    pub silent: bool,
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
    /// The NIP-11 limits it publishes (`None`: no document).
    pub info: Option<RelayInfo>,
    /// NIP-11 documents asked of it.
    pub info_fetches: usize,
    neg_sessions: HashMap<String, Negentropy<'static, NegentropyStorageVector>>,
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
}

impl FakeRelay {
    pub fn new() -> Self {
        FakeRelay {
            events: Vec::new(),
            online: true,
            cap: usize::MAX,
            filter_cap: usize::MAX,
            value_caps: None,
            value_refusals: 0,
            max_subs: None,
            subs: HashMap::new(),
            reqs: Vec::new(),
            close_next: VecDeque::new(),
            silent: false,
            peak_subs: 0,
            largest_req: 0,
            require_auth: None,
            reject_auth: false,
            restricted_after_auth: false,
            auths: Vec::new(),
            authed: false,
            negentropy: NegMode::Unknown,
            neg_opens: 0,
            info: None,
            info_fetches: 0,
            neg_sessions: HashMap::new(),
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
                NegMode::Supported => {}
            }
            let mut storage = NegentropyStorageVector::new();
            for e in self
                .events
                .iter()
                .filter(|e| filter.match_event(e, MatchEventOptions::new()))
            {
                storage
                    .insert(e.created_at.as_secs(), Id::from_byte_array(e.id.to_bytes()))
                    .unwrap();
            }
            storage.seal().unwrap();
            let neg = Negentropy::owned(storage, 0).unwrap();
            self.neg_sessions.insert(sub.clone(), neg);
        }
        let Some(neg) = self.neg_sessions.get_mut(&sub) else {
            return vec![format!(r#"["NEG-ERR","{sub}","closed: unknown"]"#)];
        };
        let bytes = grasp_sync::internal::hex::decode(hex).unwrap();
        let reply = neg.reconcile(&bytes).unwrap();
        let hex = grasp_sync::internal::hex::encode(&reply);
        vec![format!(r#"["NEG-MSG","{sub}","{hex}"]"#)]
    }

    /// A connection ended: authentication is per connection.
    pub fn on_disconnect(&mut self) {
        self.subs.clear();
        self.neg_sessions.clear();
        self.authed = false;
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

    /// Answers one client message; returns the relay's replies.
    pub fn handle(&mut self, text: &str) -> Vec<String> {
        let msg = ClientMessage::from_json(text).expect("engine sends valid client messages");
        match msg {
            ClientMessage::Req {
                subscription_id,
                filters,
            } => {
                let id = subscription_id.to_string();
                let filters: Vec<Filter> = filters.into_iter().map(|f| f.into_owned()).collect();
                self.reqs.push((id.clone(), filters.clone()));
                self.largest_req = self.largest_req.max(text.len());
                let tagged = filters.iter().any(|f| !f.generic_tags.is_empty());
                if let Some(challenge) = self.require_auth.clone().filter(|_| !self.authed) {
                    return vec![
                        RelayMessage::auth(challenge).as_json(),
                        RelayMessage::closed(SubscriptionId::new(&id), "auth-required: log in")
                            .as_json(),
                    ];
                }
                if tagged && self.authed && self.restricted_after_auth {
                    return vec![
                        RelayMessage::closed(SubscriptionId::new(&id), "restricted: members only")
                            .as_json(),
                    ];
                }
                if let Some(reason) = self.close_next.pop_front_if(|_| tagged) {
                    return vec![RelayMessage::closed(SubscriptionId::new(&id), reason).as_json()];
                }
                if let Some(reason) = self
                    .value_caps
                    .and_then(|caps| filters.iter().find_map(|f| caps.refusal(f)))
                {
                    self.value_refusals += 1;
                    return vec![RelayMessage::closed(SubscriptionId::new(&id), reason).as_json()];
                }
                if let Some((max, style)) = self.max_subs
                    && self.subs.len() >= max
                {
                    return vec![match style {
                        Refuse::Closed => RelayMessage::closed(
                            SubscriptionId::new(&id),
                            "error: too many concurrent REQs",
                        )
                        .as_json(),
                        Refuse::Notice => {
                            RelayMessage::notice("Maximum concurrent subscription count reached")
                                .as_json()
                        }
                    }];
                }
                let mut out: Vec<String> = self
                    .stored(&filters)
                    .into_iter()
                    .map(|e| RelayMessage::event(SubscriptionId::new(&id), e).as_json())
                    .collect();
                if !self.silent {
                    out.push(RelayMessage::eose(SubscriptionId::new(&id)).as_json());
                }
                self.subs.insert(id, filters);
                self.peak_subs = self.peak_subs.max(self.subs.len());
                out
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

    /// Stored events for a REQ: per filter newest first up to its limit
    /// and the per-filter cap, merged, newest first, capped per REQ.
    fn stored(&self, filters: &[Filter]) -> Vec<Event> {
        let mut seen = HashSet::new();
        let mut all = Vec::new();
        for f in filters {
            let mut hits: Vec<&Event> = self
                .events
                .iter()
                .filter(|e| f.match_event(e, MatchEventOptions::new()))
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

    /// Stores an event and returns the live EVENT messages for open subscriptions.
    pub fn publish(&mut self, event: Event) -> Vec<String> {
        if self.events.iter().any(|e| e.id == event.id) {
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

    pub fn has(&self, id: &EventId) -> bool {
        self.events.iter().any(|e| e.id == *id)
    }
}

/// The engine wired to fake relays; the own relay doubles as the sink.
pub struct Sim {
    pub engine: Engine,
    pub now: Time,
    pub own: String,
    pub relays: HashMap<String, FakeRelay>,
    pub connected: HashSet<RelayId>,
    inbox: VecDeque<(RelayId, String)>,
    /// Every ingested event with the relay URL it came from.
    pub ingested: Vec<(String, Event)>,
    /// Every Connect action seen, with its time.
    pub connects: Vec<(Time, String)>,
    /// Pings the engine asked for.
    pub pings: usize,
    /// Connections that stopped answering (half-open TCP).
    pub deaf: HashSet<RelayId>,
    /// Debugging: print every message to or from the engine that contains
    /// this text (an event id, a subscription id, a relay URL's host).
    pub trace: Option<String>,
    /// Events the own relay refuses (`OK false`, e.g. by its GRASP-01
    /// rules): the engine's output is recorded in `ingested`, but the own
    /// relay neither stores it nor feeds it back.
    pub sink_refuses: HashSet<EventId>,
}

pub const OWN: &str = "wss://own.example";
pub const T0: u64 = 1_700_000_000;

pub fn config() -> Config {
    let mut c = Config::new(OWN);
    c.seed = 7;
    c
}

impl Sim {
    pub fn new(config: Config) -> Sim {
        let now = Time::from_secs(T0);
        let own = grasp_sync::normalize_relay_url(&config.own_relay).unwrap();
        let engine = Engine::new(config, now).expect("valid config");
        let mut relays = HashMap::new();
        relays.insert(own.clone(), FakeRelay::new());
        Sim {
            engine,
            now,
            own,
            relays,
            connected: HashSet::new(),
            inbox: VecDeque::new(),
            ingested: Vec::new(),
            connects: Vec::new(),
            pings: 0,
            deaf: HashSet::new(),
            trace: None,
            sink_refuses: HashSet::new(),
        }
    }

    pub fn add_relay(&mut self, url: &str) -> &mut FakeRelay {
        self.relays
            .entry(url.to_owned())
            .or_insert_with(FakeRelay::new)
    }

    pub fn relay(&mut self, url: &str) -> &mut FakeRelay {
        self.relays.get_mut(url).expect("relay exists")
    }

    pub fn id(&self, url: &str) -> RelayId {
        self.engine.relay_id(url).expect("engine knows relay")
    }

    /// Seeds an event on a relay without live delivery.
    pub fn seed(&mut self, url: &str, event: &Event) {
        self.add_relay(url).events.push(event.clone());
    }

    /// Publishes an event on a relay, delivering it live to open subscriptions.
    pub fn publish(&mut self, url: &str, event: &Event) {
        let out = self.add_relay(url).publish(event.clone());
        if let Some(id) = self.engine.relay_id(url)
            && self.connected.contains(&id)
        {
            self.inbox.extend(out.into_iter().map(|m| (id, m)));
        }
    }

    /// Delivers a raw message from a relay, as if it sent it now.
    pub fn inject(&mut self, url: &str, text: &str) {
        let id = self.id(url);
        self.inbox.push_back((id, text.to_owned()));
        self.settle();
    }

    /// An open subscription id on a fake relay whose filters ask `letter`.
    pub fn sub_asking(&self, url: &str, letter: SingleLetterTag) -> String {
        self.relays[url]
            .subs
            .iter()
            .find(|(_, fs)| fs.iter().any(|f| f.generic_tags.contains_key(&letter)))
            .map(|(id, _)| id.clone())
            .expect("such a subscription is open")
    }

    /// Processes actions and messages until nothing moves.
    pub fn settle(&mut self) {
        for _ in 0..1_000_000 {
            if let Some(action) = self.engine.poll_action() {
                self.apply(action);
            } else if let Some((relay, msg)) = self.inbox.pop_front() {
                if self.connected.contains(&relay) {
                    self.trace_message("<-", relay, &msg);
                    self.engine.handle_message(self.now, relay, &msg);
                }
            } else if let Some(Output::Ingest { relay, event }) = self.engine.poll_output() {
                let url = self.engine.relay_url(relay).to_owned();
                self.ingested.push((url, (*event).clone()));
                if self.sink_refuses.contains(&event.id) {
                    continue;
                }
                let own = self.own.clone();
                self.publish(&own, &event);
                // The own relay accepted it: the shell feeds accepted
                // announcements and roots back (its `OK true`), as an
                // embedding relay feeds what it stores.
                if grasp_sync::internal::is_index_kind(event.kind) {
                    self.engine.handle_local_event(self.now, *event);
                }
            } else {
                return;
            }
        }
        panic!("simulation did not settle");
    }

    fn apply(&mut self, action: Action) {
        match action {
            Action::Connect { relay, url } => {
                self.connects.push((self.now, url.clone()));
                if self.relays.get(&url).is_some_and(|r| r.online) {
                    self.connected.insert(relay);
                    self.engine.handle_connected(self.now, relay);
                } else {
                    self.engine.handle_connect_failed(self.now, relay);
                }
            }
            Action::Send { relay, message } => {
                let url = self.engine.relay_url(relay).to_owned();
                if !self.connected.contains(&relay) {
                    return;
                }
                self.trace_message("->", relay, &message);
                let replies = self
                    .relays
                    .get_mut(&url)
                    .map(|r| r.handle(&message))
                    .unwrap_or_default();
                self.inbox.extend(replies.into_iter().map(|m| (relay, m)));
            }
            Action::Ping { relay } => {
                self.pings += 1;
                if self.connected.contains(&relay) && !self.deaf.contains(&relay) {
                    self.engine.handle_pong(self.now, relay);
                }
            }
            Action::ListLocal { request, filter } => {
                let held = self.relays[&self.own]
                    .events
                    .iter()
                    .filter(|e| filter.match_event(e, MatchEventOptions::new()))
                    .map(|e| (e.id, e.created_at))
                    .collect();
                self.engine.handle_local_list(self.now, request, Some(held));
            }
            Action::FetchInfo { relay, url } => {
                let info = self.relays.get_mut(&url).and_then(|r| {
                    r.info_fetches += 1;
                    r.info.filter(|_| r.online)
                });
                self.engine.handle_relay_info(self.now, relay, info);
            }
            Action::Disconnect { relay } => {
                self.connected.remove(&relay);
                let url = self.engine.relay_url(relay).to_owned();
                if let Some(r) = self.relays.get_mut(&url) {
                    r.on_disconnect();
                }
                self.inbox.retain(|(r, _)| *r != relay);
            }
        }
    }

    fn trace_message(&self, dir: &str, relay: RelayId, msg: &str) {
        let Some(needle) = &self.trace else { return };
        let url = self.engine.relay_url(relay);
        if msg.contains(needle.as_str()) || url.contains(needle.as_str()) {
            let t = self.now.as_secs() as i64 - T0 as i64;
            let cut = msg.char_indices().nth(3000).map_or(msg.len(), |(i, _)| i);
            eprintln!("t{t:+} {url} {dir} {}", &msg[..cut]);
        }
    }

    /// Advances the clock by `d`, firing every timer on the way.
    pub fn advance(&mut self, d: Duration) {
        let target = self.now + d;
        self.settle();
        while let Some(next) = self.engine.poll_timeout() {
            if next > target {
                break;
            }
            self.now = self.now.max(next);
            self.engine.handle_timeout(self.now);
            self.settle();
        }
        self.now = target;
        self.engine.handle_timeout(self.now);
        self.settle();
    }

    /// Takes a relay down: the connection drops and connects fail.
    pub fn stop_relay(&mut self, url: &str) {
        let r = self.relay(url);
        r.online = false;
        r.on_disconnect();
        if let Some(id) = self.engine.relay_id(url)
            && self.connected.remove(&id)
        {
            self.inbox.retain(|(r, _)| *r != id);
            self.engine.handle_disconnected(self.now, id);
        }
        self.settle();
    }

    pub fn start_relay(&mut self, url: &str) {
        self.relay(url).online = true;
    }

    /// True if the own relay (the sink) holds the event.
    pub fn synced(&self, id: &EventId) -> bool {
        self.relays[&self.own].has(id)
    }

    /// Ids from `events` missing from the own relay.
    pub fn missing<'a>(&self, events: impl IntoIterator<Item = &'a Event>) -> Vec<EventId> {
        events
            .into_iter()
            .filter(|e| !self.synced(&e.id))
            .map(|e| e.id)
            .collect()
    }

    /// REQs a relay has received.
    pub fn reqs(&self, url: &str) -> &[(String, Vec<Filter>)] {
        &self.relays[url].reqs
    }
}

/// An event with a made-up id and signature, for the local-feed path that
/// trusts its input (an embedding relay already verified it). Cheap enough
/// to build a hundred thousand.
pub fn unsigned_local(pubkey: PublicKey, n: u64, kind: u16, tags: Vec<Tag>) -> Event {
    let mut id = [0u8; 32];
    id[..8].copy_from_slice(&n.to_be_bytes());
    id[8] = (kind & 0xff) as u8;
    let sig = Signature::from_slice(&[1u8; 64]).expect("64 bytes");
    Event::new(
        EventId::from_byte_array(id),
        pubkey,
        Timestamp::from_secs(T0),
        Kind::from_u16(kind),
        tags,
        "",
        sig,
    )
}

/// Deterministic keys.
pub fn keys(n: u8) -> Keys {
    let mut sk = [0x11u8; 32];
    sk[0] = n.max(1);
    Keys::new(SecretKey::from_slice(&sk).expect("valid secret"))
}

pub fn tag(values: &[&str]) -> Tag {
    Tag::parse(values.iter().copied()).expect("valid tag")
}

pub fn sign(k: &Keys, kind: u16, created_at: u64, tags: Vec<Tag>, content: &str) -> Event {
    EventBuilder::new(Kind::from_u16(kind), content)
        .tags(tags)
        .custom_created_at(Timestamp::from_secs(created_at))
        .finalize(k)
        .expect("signing works")
}

/// A repo announcement listing `relays` in one `relays` tag. When they
/// list the simulated own relay ([`OWN`], any spelling), it is named as the
/// GRASP server in a `clone` tag too (`https://own.example/<npub>/<d>.git`),
/// as GRASP-01 wants of an announcement the own relay accepts.
pub fn announcement(k: &Keys, d: &str, relays: &[&str], created_at: u64) -> Event {
    let mut values = vec!["relays"];
    values.extend_from_slice(relays);
    let mut tags = vec![tag(&["d", d]), tag(&values)];
    let host = OWN.split_once("://").map_or(OWN, |(_, h)| h);
    let lists_own = relays.iter().any(|r| {
        r.split_once("://")
            .is_some_and(|(_, rest)| rest.trim_end_matches('/').eq_ignore_ascii_case(host))
    });
    if lists_own {
        let npub = k.public_key().to_bech32().expect("bech32 of a key");
        tags.push(tag(&["clone", &format!("https://{host}/{npub}/{d}.git")]));
    }
    sign(k, 30617, created_at, tags, "")
}

/// Announces one repo on the own relay listing `relays`; returns its coord.
pub fn announce(sim: &mut Sim, owner: &Keys, d: &str, relays: &[&str], created_at: u64) -> String {
    let own = sim.own.clone();
    sim.publish(&own, &announcement(owner, d, relays, created_at));
    coord(owner, d)
}

pub fn coord(k: &Keys, d: &str) -> String {
    format!("30617:{}:{d}", k.public_key().to_hex())
}

/// A root event (1617 patch, 1618 PR, 1621 issue) under the given repos.
pub fn root(k: &Keys, kind: u16, repos: &[&str], created_at: u64, content: &str) -> Event {
    let tags = repos.iter().map(|c| tag(&["a", c])).collect();
    sign(k, kind, created_at, tags, content)
}

/// A NIP-22 reply (kind 1111) to a root, scoped with uppercase `E`.
pub fn reply(k: &Keys, root: &Event, created_at: u64, content: &str) -> Event {
    let id = root.id.to_hex();
    sign(
        k,
        1111,
        created_at,
        vec![tag(&["E", &id]), tag(&["e", &id])],
        content,
    )
}

/// A status event (1630-1633) for a root.
pub fn status(k: &Keys, root: &Event, kind: u16, created_at: u64) -> Event {
    sign(
        k,
        kind,
        created_at,
        vec![tag(&["e", &root.id.to_hex()])],
        "",
    )
}

/// An event tagging a repo with `a` (e.g. a comment on the repo).
pub fn repo_comment(k: &Keys, coord: &str, created_at: u64, content: &str) -> Event {
    sign(k, 1111, created_at, vec![tag(&["A", coord])], content)
}

/// A 30618 state event.
pub fn state(k: &Keys, d: &str, created_at: u64) -> Event {
    sign(
        k,
        30618,
        created_at,
        vec![tag(&["d", d]), tag(&["refs/heads/main", "abc"])],
        "",
    )
}
