//! What the fuzz targets share: the crate's simulation harness
//! ([`grasp_sync::testing::sim`]) set up as a fuzz script needs it, relays
//! that answer nothing on their own and connect, refuse, hang or answer busy
//! as the script says, while the script speaks for them; the clock the
//! script moves; and a pool of validly signed NIP-34 events built once per
//! process (signing is the costly part of an input, so it is not repeated
//! per run).

pub mod model;

use std::ops::{Deref, DerefMut};
use std::sync::OnceLock;
use std::time::Duration;

use grasp_sync::testing::sim::{FakeRelay, Offline, Sim, Sink, plain_announcement, root};
use grasp_sync::{Config, RelayId};
use nostr::prelude::*;

pub use grasp_sync::testing::sim::{Listing, OWN, T0, coord, keys, sign, try_tag as tag};

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

/// An engine and the relays it talks to, all driven by the fuzz input: a
/// [`Sim`] (which it derefs to) whose relays are scripted, whose sink drops
/// what it is given and whose own relay lists the pool.
pub struct World {
    sim: Sim,
}

impl Deref for World {
    type Target = Sim;
    fn deref(&self) -> &Sim {
        &self.sim
    }
}

impl DerefMut for World {
    fn deref_mut(&mut self) -> &mut Sim {
        &mut self.sim
    }
}

impl World {
    /// An engine at `T0` with every relay up; its first connects are answered.
    pub fn new(config: Config) -> World {
        let mut sim = Sim::new(config);
        sim.new_relays = Some(FakeRelay::scripted);
        sim.sink = Sink::Drops;
        let own = sim.own.clone();
        *sim.relay(&own) = FakeRelay::scripted();
        let pool = pool();
        for event in pool.setup.iter().chain(&pool.extra) {
            sim.seed(&own, event);
        }
        sim.settle();
        World { sim }
    }

    /// Answers every action the engine asked for and drains its outputs.
    pub fn drive(&mut self) {
        self.sim.settle();
    }

    fn fake(&mut self, relay: RelayId) -> &mut FakeRelay {
        let url = self.sim.engine.relay_url(relay).to_owned();
        self.sim.add_relay(&url)
    }

    /// The id of the last AUTH event sent to `relay`, if any.
    pub fn auth_id(&self, relay: RelayId) -> Option<&str> {
        self.relays
            .get(self.engine.relay_url(relay))
            .and_then(FakeRelay::last_auth)
    }

    /// How `relay` answers.
    pub fn link(&self, relay: RelayId) -> Link {
        match self.relays.get(self.engine.relay_url(relay)) {
            None => Link::Up,
            Some(r) if r.online => Link::Up,
            Some(r) => match r.offline {
                Offline::Refused => Link::Down,
                Offline::Hangs => Link::Hanging,
                Offline::Busy(_) => Link::Busy,
            },
        }
    }

    /// Changes how `relay` answers from now on.
    pub fn set_link(&mut self, relay: RelayId, link: Link) {
        let fake = self.fake(relay);
        fake.online = link == Link::Up;
        fake.offline = match link {
            Link::Up | Link::Down => Offline::Refused,
            Link::Hanging => Offline::Hangs,
            Link::Busy => Offline::Busy(429),
        };
    }

    /// Subscription ids open on `relay`, oldest first.
    pub fn subs(&self, relay: RelayId) -> &[String] {
        self.relays
            .get(self.engine.relay_url(relay))
            .map_or(&[], FakeRelay::open)
    }

    /// A text frame from `relay`.
    pub fn message(&mut self, relay: RelayId, text: &str) {
        self.sim.deliver(relay, text);
    }

    /// The connection to `relay` drops, and it refuses connects until told otherwise.
    pub fn drop_relay(&mut self, relay: RelayId) {
        self.set_link(relay, Link::Down);
        self.sim.disconnect(relay);
    }

    /// Moves the clock by `d`, firing timers at their deadlines for at most
    /// `steps` wake-ups and then all the rest at once at the end, as a late
    /// event loop would (so a long jump stays cheap).
    pub fn advance(&mut self, d: Duration, steps: usize) {
        self.sim.advance_waking(d, steps);
    }
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
        plain_announcement(&alice, "one", &[r0, r1, OWN], T0 - 100),
        plain_announcement(&bob, "two", &[r1, r2], T0 - 90),
        root(&carol, 1617, &[&c1], T0 - 80, "root"),
        root(&carol, 1621, &[&c1, &c2], T0 - 70, "root"),
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
        plain_announcement(&alice, "one", &[r2, LATE, OWN], T0 - 10),
        plain_announcement(&carol, "three", &[OWN, LATE], T0 - 5),
        plain_announcement(&carol, "elsewhere", &[r0], T0 - 5),
        root(
            &alice,
            1618,
            &[&c2, &coord(&carol, "three")],
            T0 - 3,
            "root",
        ),
        sign(&bob, 1, T0 - 2, Vec::new(), "unrelated"),
    ];
    Pool { setup, extra }
}
