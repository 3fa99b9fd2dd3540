//! The one simulation harness of grasp-sync: the sans-IO [`Engine`] wired to
//! in-memory fake relays by URL, a clock that jumps to the engine's next
//! deadline, and signed NIP-34 events built from fixed keys. No sockets, no
//! sleeps, no threads: a run is a function of its inputs.
//!
//! Tests, benches and fuzz targets all drive the engine through it:
//!
//! - [`Sim`] with honest [`FakeRelay`]s that answer REQs from stored
//!   events (and refuse, hang, cap or go down as told): the `sim_*` tests.
//! - [`Sim`] with [`FakeRelay::scripted`] relays that answer nothing on
//!   their own while a script speaks for them ([`Sim::deliver`]), and a
//!   sink that drops what it is given ([`Sink::Drops`]): the fuzz targets.
//! - [`instant`]: the cheapest relay, straight on an [`Engine`], for
//!   benches, where a fake relay's bookkeeping would be measured too.
//!
//! Only the engine's public interface is used; the harness sees what an
//! embedder sees.

pub mod events;
pub mod fake_relay;
pub mod instant;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use nostr::prelude::{EventId, Filter, Keys, MatchEventOptions, SingleLetterTag};

use crate::{Action, Config, Engine, Output, RelayId, Time};
pub use events::*;
pub use fake_relay::{FakeRelay, NegMode, Offline, Refuse};

/// The own relay of every simulated engine.
pub const OWN: &str = "wss://own.example";
/// Start of simulated time, in seconds.
pub const T0: u64 = 1_700_000_000;

/// A config for [`OWN`] with a fixed seed.
pub fn config() -> Config {
    let mut c = Config::new(OWN);
    c.seed = 7;
    c
}

/// How the own relay answers the engine's `ListLocal` (negentropy) requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// With the events it stores that the filter matches.
    Held,
    /// With nothing.
    Empty,
    /// That it cannot list.
    Unable,
    /// Never.
    Silent,
    /// With what it stores, except every `n`th request, which it never
    /// answers (a listing the own relay drops without a word: only the
    /// engine's listing timeout ends its jobs' wait).
    Flaky(usize),
    /// With what it stores, except every `n`th request, which it refuses
    /// (a LocalRelay own relay's `CLOSED` for a listing's REQ past a limit
    /// no lower count helps with: the shell tells the engine at once).
    Refusing(usize),
}

/// What becomes of the events the engine outputs for the sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    /// Recorded in [`Sim::ingested`] and stored on the own relay, which
    /// feeds the announcements and roots it accepts back to the engine (as
    /// the shell does on `OK true`), unless [`Sim::sink_refuses`] them.
    Stores,
    /// Drained and forgotten.
    Drops,
    /// Never drained: the sink has no room (a full outbox, a throttling
    /// own relay), so the engine's outputs wait in it, unconfirmed.
    Full,
}

/// The engine wired to fake relays; the own relay doubles as the sink.
pub struct Sim {
    /// The engine under test.
    pub engine: Engine,
    /// The simulated clock.
    pub now: Time,
    /// The own relay's URL, normalized.
    pub own: String,
    /// The fake relays, by URL.
    pub relays: HashMap<String, FakeRelay>,
    /// Relays the engine names that no one added: `None`, they do not
    /// exist (connects fail); `Some(make)`, they come up as `make()`.
    pub new_relays: Option<fn() -> FakeRelay>,
    /// Relays connected.
    pub connected: HashSet<RelayId>,
    inbox: VecDeque<(RelayId, String)>,
    /// Messages of relays with a [`reply_delay`](FakeRelay::reply_delay)
    /// or [`query_delay`](FakeRelay::query_delay), by due time (and order
    /// sent), moved to the inbox when the clock reaches them.
    in_flight: BTreeMap<(Time, u64), (RelayId, String)>,
    sent: u64,
    /// When each relay with a [`per_message`](FakeRelay::per_message) cost
    /// is done with the messages it has.
    busy_until: HashMap<RelayId, Time>,
    /// What the sink does with the engine's outputs.
    pub sink: Sink,
    /// How the own relay answers `ListLocal`.
    pub listing: Listing,
    /// `ListLocal` requests the engine made.
    pub lists_asked: usize,
    /// Every ingested event with the relay URL it came from ([`Sink::Stores`]).
    pub ingested: Vec<(String, nostr::prelude::Event)>,
    /// Every Connect action seen, with its time.
    pub connects: Vec<(Time, String)>,
    /// Pings the engine asked for.
    pub pings: usize,
    /// Connections that stopped answering (half-open TCP).
    pub deaf: HashSet<RelayId>,
    /// Relays whose messages wait unread, as the shell leaves a relay's
    /// frames while the sink is full ([`Sim::pause_reads`]).
    paused: HashSet<RelayId>,
    /// Debugging: print every message to or from the engine that contains
    /// this text (an event id, a subscription id, a relay URL's host).
    pub trace: Option<String>,
    /// Events the own relay refuses (`OK false`, e.g. by its GRASP-01
    /// rules): the engine's output is recorded in `ingested`, but the own
    /// relay neither stores it nor feeds it back.
    pub sink_refuses: HashSet<EventId>,
}

impl Sim {
    /// An engine at [`T0`] with an honest own relay, and no other relay.
    pub fn new(config: Config) -> Sim {
        let now = Time::from_secs(T0);
        let own = crate::normalize_relay_url(&config.own_relay).expect("valid own relay URL");
        let engine = Engine::new(config, now).expect("valid config");
        let mut relays = HashMap::new();
        relays.insert(own.clone(), FakeRelay::new());
        Sim {
            engine,
            now,
            own,
            relays,
            new_relays: None,
            connected: HashSet::new(),
            inbox: VecDeque::new(),
            in_flight: BTreeMap::new(),
            sent: 0,
            busy_until: HashMap::new(),
            sink: Sink::Stores,
            listing: Listing::Held,
            lists_asked: 0,
            ingested: Vec::new(),
            connects: Vec::new(),
            pings: 0,
            deaf: HashSet::new(),
            paused: HashSet::new(),
            trace: None,
            sink_refuses: HashSet::new(),
        }
    }

    /// The relay at `url`, made (by [`new_relays`](Self::new_relays), else
    /// honest) if it does not exist yet.
    pub fn add_relay(&mut self, url: &str) -> &mut FakeRelay {
        let make = self.new_relays.unwrap_or(FakeRelay::new);
        self.relays.entry(url.to_owned()).or_insert_with(make)
    }

    /// The relay at `url`, which must exist.
    pub fn relay(&mut self, url: &str) -> &mut FakeRelay {
        self.relays.get_mut(url).expect("relay exists")
    }

    /// The engine's id of the relay at `url`, which it must know.
    pub fn id(&self, url: &str) -> RelayId {
        self.engine.relay_id(url).expect("engine knows relay")
    }

    /// Seeds an event on a relay without live delivery.
    pub fn seed(&mut self, url: &str, event: &nostr::prelude::Event) {
        self.add_relay(url).events.push(event.clone());
    }

    /// Publishes an event on a relay, delivering it live to open subscriptions.
    pub fn publish(&mut self, url: &str, event: &nostr::prelude::Event) {
        let out = self.add_relay(url).publish(event.clone());
        let delay = self.relays[url].reply_delay;
        if let Some(id) = self.engine.relay_id(url)
            && self.connected.contains(&id)
        {
            self.send_later(id, out, delay);
        }
    }

    /// Delivers a raw message from a connected relay, as if it sent it now.
    pub fn inject(&mut self, url: &str, text: &str) {
        let id = self.id(url);
        self.inbox.push_back((id, text.to_owned()));
        self.settle();
    }

    /// Hands the engine a text frame from `relay` at once, whatever the
    /// state of its connection (a scripted or hostile relay), then settles.
    pub fn deliver(&mut self, relay: RelayId, text: &str) {
        self.trace_message("<-", relay, text);
        self.engine.handle_message(self.now, relay, text);
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

    /// Processes actions, messages and outputs until nothing moves.
    pub fn settle(&mut self) {
        for _ in 0..1_000_000 {
            if let Some(action) = self.engine.poll_action() {
                self.apply(action);
            } else if let Some((relay, msg)) = self.next_unpaused() {
                if self.connected.contains(&relay) {
                    self.trace_message("<-", relay, &msg);
                    self.engine.handle_message(self.now, relay, &msg);
                }
            } else if self.sink == Sink::Full {
                return;
            } else if let Some(Output::Ingest { relay, event, .. }) = self.engine.poll_output() {
                if self.sink == Sink::Drops {
                    continue;
                }
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
                if crate::internal::is_index_kind(event.kind) {
                    self.engine.handle_local_event(self.now, *event);
                }
            } else {
                return;
            }
        }
        panic!("simulation did not settle");
    }

    /// The first message in the inbox from a relay whose reads are not
    /// paused.
    fn next_unpaused(&mut self) -> Option<(RelayId, String)> {
        let i = match self.paused.is_empty() {
            true => 0,
            false => self
                .inbox
                .iter()
                .position(|(r, _)| !self.paused.contains(r))?,
        };
        self.inbox.remove(i)
    }

    /// Leaves `url`'s messages unread, and tells the engine, as the shell
    /// does while the sink has no room for what the relay sends.
    pub fn pause_reads(&mut self, url: &str) {
        let relay = self.id(url);
        self.paused.insert(relay);
        self.engine.handle_reads_paused(relay);
    }

    /// Reads `url` again, first telling the engine, as the shell does.
    pub fn resume_reads(&mut self, url: &str) {
        let relay = self.id(url);
        self.paused.remove(&relay);
        self.engine.handle_reads_resumed(self.now, relay);
        self.settle();
    }

    fn apply(&mut self, action: Action) {
        match action {
            Action::Connect { relay, url } => {
                self.connects.push((self.now, url.clone()));
                if !self.relays.contains_key(&url)
                    && let Some(make) = self.new_relays
                {
                    self.relays.insert(url.clone(), make());
                }
                match self.relays.get_mut(&url).map(|r| (r.online, r.offline)) {
                    Some((true, _)) => {
                        self.relay(&url).on_connect();
                        self.connected.insert(relay);
                        self.engine.handle_connected(self.now, relay);
                    }
                    Some((false, Offline::Hangs)) => {}
                    Some((false, Offline::Busy(status))) => {
                        self.engine.handle_connect_refused(self.now, relay, status);
                    }
                    Some((false, Offline::Refused)) | None => {
                        self.engine.handle_connect_failed(self.now, relay);
                    }
                }
            }
            Action::Send { relay, message } => {
                if !self.connected.contains(&relay) {
                    return;
                }
                let url = self.engine.relay_url(relay).to_owned();
                self.trace_message("->", relay, &message);
                let Some(r) = self.relays.get_mut(&url) else {
                    return;
                };
                let replies = r.handle(&message);
                let answers = r.take_query_answers();
                let (cost, reply_delay, query_delay) =
                    (r.per_message, r.reply_delay, r.query_delay);
                let busy = self.busy_until.entry(relay).or_insert(self.now);
                *busy = (*busy).max(self.now) + cost;
                let reply_delay = reply_delay + busy.since(self.now);
                self.send_later(relay, replies, reply_delay);
                self.send_later(relay, answers, reply_delay + query_delay);
            }
            Action::Ping { relay } => {
                self.pings += 1;
                let url = self.engine.relay_url(relay);
                let online = self.relays.get(url).is_some_and(|r| r.online);
                if online && self.connected.contains(&relay) && !self.deaf.contains(&relay) {
                    self.engine.handle_pong(self.now, relay);
                }
            }
            Action::ListLocal { request, filter } => {
                self.lists_asked += 1;
                let held = match self.listing {
                    Listing::Held => Some(self.held(&filter)),
                    Listing::Empty => Some(Vec::new()),
                    Listing::Unable => None,
                    Listing::Silent => return,
                    Listing::Flaky(n) if self.lists_asked.is_multiple_of(n.max(1)) => return,
                    Listing::Refusing(n) if self.lists_asked.is_multiple_of(n.max(1)) => {
                        return self.engine.handle_local_unlisted(self.now, request);
                    }
                    Listing::Flaky(_) | Listing::Refusing(_) => Some(self.held(&filter)),
                };
                self.engine.handle_local_list(self.now, request, held);
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
                self.in_flight.retain(|_, (r, _)| *r != relay);
            }
        }
    }

    /// Messages from `relay`, to the inbox now or in flight for `delay`.
    fn send_later(&mut self, relay: RelayId, messages: Vec<String>, delay: Duration) {
        if delay.is_zero() {
            self.inbox.extend(messages.into_iter().map(|m| (relay, m)));
            return;
        }
        for m in messages {
            self.sent += 1;
            self.in_flight
                .insert((self.now + delay, self.sent), (relay, m));
        }
    }

    /// Moves the messages due by now from flight to the inbox.
    fn land(&mut self) {
        while let Some(entry) = self.in_flight.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let (relay, m) = entry.remove();
            self.inbox.push_back((relay, m));
        }
    }

    /// What the own relay stores that `filter` matches, for `ListLocal`.
    fn held(&self, filter: &Filter) -> Vec<(EventId, nostr::prelude::Timestamp)> {
        self.relays[&self.own]
            .events
            .iter()
            .filter(|e| filter.match_event(e, MatchEventOptions::new()))
            .map(|e| (e.id, e.created_at))
            .collect()
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
        self.advance_waking(d, usize::MAX);
    }

    /// Advances the clock by `d`, firing timers at their deadlines for at
    /// most `wakeups` wake-ups and then all the rest at once at the end, as
    /// a late event loop would (so a long jump stays cheap).
    pub fn advance_waking(&mut self, d: Duration, wakeups: usize) {
        let target = self.now + d;
        self.settle();
        for _ in 0..wakeups {
            let landing = self.in_flight.keys().next().map(|(t, _)| *t);
            let next = match (self.engine.poll_timeout(), landing) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match next {
                Some(next) if next <= target => {
                    self.now = self.now.max(next);
                    self.land();
                    self.engine.handle_timeout(self.now);
                    self.settle();
                }
                _ => break,
            }
        }
        self.now = target;
        self.land();
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
            self.in_flight.retain(|_, (r, _)| *r != id);
            self.engine.handle_disconnected(self.now, id);
        }
        self.settle();
    }

    /// Brings a relay back up: connects succeed again.
    pub fn start_relay(&mut self, url: &str) {
        self.relay(url).online = true;
    }

    /// The connection to `relay` drops (or its connect attempt dies): the
    /// engine hears of it whatever state it thinks the relay is in.
    pub fn disconnect(&mut self, relay: RelayId) {
        self.connected.remove(&relay);
        self.inbox.retain(|(r, _)| *r != relay);
        self.in_flight.retain(|_, (r, _)| *r != relay);
        let url = self.engine.relay_url(relay).to_owned();
        if let Some(r) = self.relays.get_mut(&url) {
            r.on_disconnect();
        }
        self.engine.handle_disconnected(self.now, relay);
        self.settle();
    }

    /// An event fed in by an embedding relay (the local feed), then settles.
    pub fn local_event(&mut self, event: nostr::prelude::Event) {
        self.engine.handle_local_event(self.now, event);
        self.settle();
    }

    /// Panics with the engine's own words when one of its invariants is broken.
    pub fn check(&self) {
        if let Err(e) = self.engine.check_invariants() {
            panic!("invariant broken: {e}");
        }
    }

    /// True if the own relay (the sink) holds the event.
    pub fn synced(&self, id: &EventId) -> bool {
        self.relays[&self.own].has(id)
    }

    /// Ids from `events` missing from the own relay.
    pub fn missing<'a>(
        &self,
        events: impl IntoIterator<Item = &'a nostr::prelude::Event>,
    ) -> Vec<EventId> {
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

/// Announces one repo on the own relay listing `relays`; returns its coord.
pub fn announce(sim: &mut Sim, owner: &Keys, d: &str, relays: &[&str], created_at: u64) -> String {
    let own = sim.own.clone();
    sim.publish(&own, &announcement(owner, d, relays, created_at));
    coord(owner, d)
}
