//! What the fuzz targets share: the engine wired to scripted relays that
//! connect, refuse or hang on command, a clock the target moves, and a pool
//! of validly signed NIP-34 events built once per process (signing is the
//! costly part of an input, so it is not repeated per run).

pub mod model;

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use grasp_sync::{Action, Config, Engine, RelayId, Time};
use nostr::prelude::*;

/// The own relay of every fuzzed engine.
pub const OWN: &str = "wss://own.example";
/// Start of the fuzzed clock, in seconds.
pub const T0: u64 = 1_700_000_000;
/// Remote relays the setup announcements list.
pub const REMOTES: [&str; 3] = [
    "wss://r0.example",
    "wss://r1.example",
    "ws://r2.example:8080",
];
/// A relay only a pool event names, so the engine learns it mid-run.
pub const LATE: &str = "wss://late.example";
/// The bootstrap relay, which gets the announcement subscription.
pub const BOOT: &str = "wss://boot.example";

/// How a scripted relay answers the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Connects at once and answers pings.
    Up,
    /// Refuses connects.
    Down,
    /// Never finishes a connect and never answers a ping.
    Hanging,
    /// Answers the websocket upgrade with HTTP 429.
    Busy,
}

/// How the sink answers the engine's `ListLocal` (negentropy) requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// With the pool events the filter matches.
    Held,
    /// With nothing.
    Empty,
    /// That it cannot list.
    Unable,
    /// Never.
    Silent,
}

/// An engine and the relays it talks to, all driven by the fuzz input.
pub struct World {
    /// The engine under test.
    pub engine: Engine,
    /// The current time.
    pub now: Time,
    /// How the sink answers `ListLocal`.
    pub listing: Listing,
    links: HashMap<RelayId, Link>,
    /// Open subscription and negentropy session ids per relay, oldest
    /// first, as the engine's REQ/NEG-OPEN and CLOSE/NEG-CLOSE left them.
    subs: HashMap<RelayId, Vec<String>>,
    /// Id of the last AUTH event sent to each relay, for its `OK`.
    auths: HashMap<RelayId, String>,
}

impl World {
    /// An engine at `T0` with every relay up; its first connects are answered.
    pub fn new(config: Config) -> World {
        let now = Time::from_secs(T0);
        // The configs of the targets are built from constants that parse.
        let engine = Engine::new(config, now).expect("fuzz config is valid");
        let mut world = World {
            engine,
            now,
            listing: Listing::Held,
            links: HashMap::new(),
            subs: HashMap::new(),
            auths: HashMap::new(),
        };
        world.drive();
        world
    }

    /// Answers every action the engine asked for and drains its outputs.
    pub fn drive(&mut self) {
        while let Some(action) = self.engine.poll_action() {
            match action {
                Action::Connect { relay, .. } => self.answer_connect(relay),
                Action::Send { relay, message } => self.track(relay, &message),
                Action::Ping { relay } if self.link(relay) == Link::Up => {
                    self.engine.handle_pong(self.now, relay)
                }
                Action::Ping { .. } => {}
                Action::Disconnect { relay } => {
                    self.subs.remove(&relay);
                }
                Action::ListLocal { request, filter } => self.answer_list(request, &filter),
                Action::FetchInfo { relay, .. } => {
                    self.engine.handle_relay_info(self.now, relay, None)
                }
            }
        }
        while self.engine.poll_output().is_some() {}
    }

    fn answer_connect(&mut self, relay: RelayId) {
        match self.link(relay) {
            Link::Up => {
                self.subs.remove(&relay);
                self.engine.handle_connected(self.now, relay);
            }
            Link::Down => self.engine.handle_connect_failed(self.now, relay),
            Link::Busy => self.engine.handle_connect_refused(self.now, relay, 429),
            Link::Hanging => {}
        }
    }

    fn answer_list(&mut self, request: u64, filter: &Filter) {
        let held = match self.listing {
            Listing::Held => Some(held_by_sink(filter)),
            Listing::Empty => Some(Vec::new()),
            Listing::Unable => None,
            Listing::Silent => return,
        };
        self.engine.handle_local_list(self.now, request, held);
    }

    /// Follows REQ, NEG-OPEN, their closes and AUTH, so the script can
    /// answer with real ids.
    fn track(&mut self, relay: RelayId, message: &str) {
        let subs = self.subs.entry(relay).or_default();
        let opened = ["[\"REQ\",\"", "[\"NEG-OPEN\",\""];
        let closed = ["[\"CLOSE\",\"", "[\"NEG-CLOSE\",\""];
        if let Some(id) = opened.iter().find_map(|p| quoted_after(message, p)) {
            subs.push(id.to_owned());
        } else if let Some(id) = closed.iter().find_map(|p| quoted_after(message, p)) {
            subs.retain(|s| s != id);
        } else if message.starts_with("[\"AUTH\"")
            && let Some(id) =
                quoted_after(message.split_once("\"id\":").map_or("", |(_, r)| r), "\"")
        {
            self.auths.insert(relay, id.to_owned());
        }
    }

    /// The id of the last AUTH event sent to `relay`, if any.
    pub fn auth_id(&self, relay: RelayId) -> Option<&str> {
        self.auths.get(&relay).map(String::as_str)
    }

    /// How `relay` answers.
    pub fn link(&self, relay: RelayId) -> Link {
        self.links.get(&relay).copied().unwrap_or(Link::Up)
    }

    /// Changes how `relay` answers from now on.
    pub fn set_link(&mut self, relay: RelayId, link: Link) {
        self.links.insert(relay, link);
    }

    /// Subscription ids open on `relay`, oldest first.
    pub fn subs(&self, relay: RelayId) -> &[String] {
        self.subs.get(&relay).map_or(&[], Vec::as_slice)
    }

    /// A text frame from `relay`.
    pub fn message(&mut self, relay: RelayId, text: &str) {
        self.engine.handle_message(self.now, relay, text);
        self.drive();
    }

    /// The connection to `relay` drops, and it refuses connects until told otherwise.
    pub fn drop_relay(&mut self, relay: RelayId) {
        self.set_link(relay, Link::Down);
        self.subs.remove(&relay);
        self.engine.handle_disconnected(self.now, relay);
        self.drive();
    }

    /// An event fed in by an embedding relay.
    pub fn local_event(&mut self, event: Event) {
        self.engine.handle_local_event(self.now, event);
        self.drive();
    }

    /// Moves the clock by `d`, firing timers at their deadlines for at most
    /// `steps` wake-ups and then all the rest at once at the end, as a late
    /// event loop would (so a long jump stays cheap).
    pub fn advance(&mut self, d: Duration, steps: usize) {
        let target = self.now + d;
        for _ in 0..steps {
            match self.engine.poll_timeout() {
                Some(next) if next <= target => {
                    self.now = self.now.max(next);
                    self.engine.handle_timeout(self.now);
                    self.drive();
                }
                _ => break,
            }
        }
        self.now = target;
        self.engine.handle_timeout(self.now);
        self.drive();
    }

    /// Panics with the engine's own words when an invariant is broken.
    pub fn check(&self) {
        if let Err(e) = self.engine.check_invariants() {
            panic!("invariant broken: {e}");
        }
    }
}

/// What the sink holds for `filter`: the pool events it matches.
fn held_by_sink(filter: &Filter) -> Vec<(EventId, Timestamp)> {
    let pool = pool();
    pool.setup
        .iter()
        .chain(&pool.extra)
        .filter(|e| filter.match_event(e, MatchEventOptions::new()))
        .map(|e| (e.id, e.created_at))
        .collect()
}

/// The text between `prefix` and the next quote, when `text` starts with `prefix`.
fn quoted_after<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.strip_prefix(prefix)?.split('"').next()
}

/// Deterministic keys number `n`.
pub fn keys(n: u8) -> Keys {
    let mut secret = [0x11u8; 32];
    secret[0] = n.max(1);
    // Any 32 bytes this close to 0x11.. are below the curve order.
    Keys::new(SecretKey::from_slice(&secret).expect("valid secret key"))
}

/// A signed event.
pub fn sign(keys: &Keys, kind: u16, created_at: u64, tags: Vec<Tag>, content: &str) -> Event {
    EventBuilder::new(Kind::from_u16(kind), content)
        .tags(tags)
        .custom_created_at(Timestamp::from_secs(created_at))
        .finalize(keys)
        // Signing with in-memory keys cannot fail.
        .expect("signing with keys works")
}

/// A tag from its values; `None` for what nostr refuses (an empty tag).
pub fn tag(values: &[&str]) -> Option<Tag> {
    Tag::parse(values.iter().copied()).ok()
}

/// The repo ref of an announcement by `keys` with identifier `d`.
pub fn coord(keys: &Keys, d: &str) -> String {
    format!("30617:{}:{d}", keys.public_key().to_hex())
}

fn announcement(k: &Keys, d: &str, relays: &[&str], created_at: u64) -> Event {
    let mut values = vec!["relays"];
    values.extend_from_slice(relays);
    let tags = [tag(&["d", d]), tag(&values)]
        .into_iter()
        .flatten()
        .collect();
    sign(k, 30617, created_at, tags, "")
}

fn root(k: &Keys, kind: u16, coords: &[String], created_at: u64) -> Event {
    let tags = coords.iter().filter_map(|c| tag(&["a", c])).collect();
    sign(k, kind, created_at, tags, "root")
}

fn tagging(k: &Keys, kind: u16, name: &str, value: &str, created_at: u64) -> Event {
    let tags = tag(&[name, value]).into_iter().collect();
    sign(k, kind, created_at, tags, "reply")
}

/// Validly signed events: `setup` builds a world with repos, roots and
/// open subscriptions; `extra` is what a script delivers or feeds later.
pub struct Pool {
    /// Announcements and roots the relay_message target starts from.
    pub setup: Vec<Event>,
    /// Replies, states, comments, newer and foreign announcements, new roots.
    pub extra: Vec<Event>,
}

/// The pool, signed on first use.
pub fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(build_pool)
}

fn build_pool() -> Pool {
    let (alice, bob, carol) = (keys(1), keys(2), keys(3));
    let [r0, r1, r2] = REMOTES;
    let (c1, c2) = (coord(&alice, "one"), coord(&bob, "two"));
    let setup = vec![
        announcement(&alice, "one", &[r0, r1, OWN], T0 - 100),
        announcement(&bob, "two", &[r1, r2], T0 - 90),
        root(&carol, 1617, std::slice::from_ref(&c1), T0 - 80),
        root(&carol, 1621, &[c1.clone(), c2.clone()], T0 - 70),
    ];
    let (root1, root2) = (setup[2].id.to_hex(), setup[3].id.to_hex());
    let extra = vec![
        tagging(&carol, 1111, "E", &root1, T0 - 60),
        tagging(&carol, 1111, "e", &root2, T0 - 50),
        tagging(&carol, 1630, "e", &root1, T0 - 40),
        tagging(&carol, 1111, "A", &c1, T0 - 30),
        tagging(&carol, 1111, "q", &c2, T0 - 30),
        sign(
            &alice,
            30618,
            T0 - 20,
            tag(&["d", "one"]).into_iter().collect(),
            "",
        ),
        announcement(&alice, "one", &[r2, LATE, OWN], T0 - 10),
        announcement(&carol, "three", &[OWN, LATE], T0 - 5),
        announcement(&carol, "elsewhere", &[r0], T0 - 5),
        root(&alice, 1618, &[c2, coord(&carol, "three")], T0 - 3),
        sign(&bob, 1, T0 - 2, Vec::new(), "unrelated"),
    ];
    Pool { setup, extra }
}
