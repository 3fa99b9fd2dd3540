//! A no-loss oracle: random worlds of relays as they are (per-filter result
//! caps, NIP-11 documents, eventstore value caps, low subscription limits,
//! negentropy or not), repos announced on the own relay or found only on
//! remote ones, repos moving between relays or withdrawn, events seeded,
//! published live, backdated behind live streams, and in bursts past a
//! relay's cap, relays moving to stores that cap lower than the pages they
//! served before, with relays going down and up all along. Once the world is
//! quiet and a daily cycle has passed, a model computed from what the
//! relays hold and how the world made it (never from the engine) says which
//! events the sink must hold. Checked: every one of them is there; before
//! any daily cycle could repair it, every live event published on a
//! connected relay that holds its repo or root confirmed is in the sink
//! within seconds, whatever its kind, and (in even worlds, which let the
//! first sync finish before anything else happens) every event of the
//! history is there when the first sync ends; nothing
//! reached the sink twice; no relay was counted an offence or penalised (none
//! is hostile); no announcement without the service in `relays` and
//! `clone` was passed on, and a withdrawn repo is no target; the own relay
//! was never connected under another name; every relay of ours ends
//! connected with all confirmed; the engine's invariants hold after every
//! step.
//!
//! Fixed seeds in the normal suite (20 worlds, a few seconds). A long run
//! (about 200 worlds a minute in a debug build on two cores):
//!
//! ```text
//! ORACLE_WORLDS=3000 ORACLE_SEED=10000 cargo test --test sim_oracle -- --nocapture
//! ```
//!
//! prints the seeds that failed and what failed; `ORACLE_SEED=<seed>
//! ORACLE_WORLDS=1 ORACLE_VERBOSE=1` replays one with its step log (the
//! world is the same for a seed; the engine's hash maps may order a few
//! things differently from run to run). `ORACLE_AVOID=3,4,6,7,8,9` leaves
//! out what triggers those known bugs (see `Avoid`; `S` the sibling-filter
//! pagination bug this oracle found), to look for others on code that still
//! has them. `ORACLE_TRACE=<text>` prints every relay message containing it
//! (an event id, a relay host), and `RUST_LOG=grasp_sync=debug` the
//! engine's log.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use grasp_sync::Offence;
use grasp_sync::{Config, ItemKey, ItemState, RelayInfo, Status};
use nostr::prelude::*;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use support::*;

/// The service the own relay runs (GRASP-01): announcements list
/// `wss://own.example` in `relays` and `https://own.example/...` in `clone`.
const DOMAIN: &str = "own.example";
/// The own relay under a local address, the domain being its public name.
const LOCAL_OWN: &str = "ws://127.0.0.1:7777";
const REMOTES: [&str; 7] = [
    "wss://r0.example",
    "wss://r1.example",
    "wss://r2.example",
    "wss://r3.example",
    "wss://r4.example",
    "ws://r5.example:8080",
    "wss://r6.example/nostr",
];
/// Stored events per filter real relays return at most.
const CAPS: [usize; 6] = [50, 100, 250, 500, 1000, 5000];
/// Key numbers (see [`keys`]) of repo owners by role, and of authors.
const OWNERS: u8 = 1;
const AUTHORS: u8 = 40;
const MAINTAINER: u8 = 60;

/// Which known bugs' triggers a run leaves out, by bug number.
#[derive(Debug, Clone, Copy, Default)]
struct Avoid {
    /// 3: no copies of an event on relays that do not carry its repo, and
    /// no relay goes wide (a wide relay sends what it does not carry yet).
    overlap: bool,
    /// 4: no relay reconnecting through the final daily cycle, and no
    /// root published on the own relay with an old `created_at` (only the
    /// own relay's daily re-read finds it).
    daily: bool,
    /// 6: no announcement names the own relay but by its canonical URL,
    /// and the own relay is never run under a local address.
    own_names: bool,
    /// 7: no live events for a moved repo on the relay it left; the
    /// offence count is not checked (penalties still are).
    move_bursts: bool,
    /// 8: no announcement that lists the service in only one of
    /// `relays`/`clone`, and no withdrawals.
    grasp01: bool,
    /// `S` (sibling filters, found by this oracle): no event matches two
    /// filters of one REQ (NIP-22 replies tag their root with `E` only).
    sibling: bool,
}

impl Avoid {
    fn from_env() -> Avoid {
        let list = std::env::var("ORACLE_AVOID").unwrap_or_default();
        let has = |n: &str| list.split(',').any(|x| x.trim() == n);
        Avoid {
            overlap: has("3"),
            daily: has("4"),
            own_names: has("6"),
            move_bursts: has("7"),
            grasp01: has("8"),
            sibling: has("S"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// On the own relay, never moves: its relays hold the remote-only
    /// announcements, so they are read for the whole run.
    Anchor,
    /// On the own relay, moves between relays.
    Own,
    /// Found only on remote relays (an anchor relay, or the relay of
    /// another such repo), listing the service in relays and clone.
    Remote,
    /// On the own relay, later withdrawn by a newer remote announcement
    /// that no longer lists the service.
    Withdrawn,
    /// On remote relays, not (properly) listing the service: never ours.
    Foreign,
    /// Many small repos on the own relay, to fill its result cap.
    Filler,
}

/// How an announcement lists the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listing {
    Both,
    RelaysOnly,
    CloneOnly,
    Neither,
}

#[derive(Debug)]
struct Repo {
    owner: u8,
    d: String,
    coord: String,
    role: Role,
    /// Relays (indices into `REMOTES`) of its newest announcement.
    relays: Vec<usize>,
    /// `created_at` of its newest announcement (0: none yet).
    last: u64,
    /// A withdrawal was published.
    withdrawn: bool,
}

/// What the generator knows of an announcement it made.
#[derive(Debug, Clone)]
struct Ann {
    id: EventId,
    repo: usize,
    created_at: u64,
    relays: Vec<usize>,
    /// Lists the service in `relays` and `clone` (GRASP-01).
    accepted: bool,
    /// Placed on the own relay by the world (trusted as accepted there).
    own_origin: bool,
}

/// A repo of ours at the end, as the model sees it.
#[derive(Debug)]
struct Ours {
    /// Relays of its announcement in force.
    relays: Vec<usize>,
    /// That announcement.
    announcement: EventId,
    /// Placed on the own relay by the world, not found remotely.
    on_own: bool,
}

#[derive(Debug)]
struct RootRec {
    id: EventId,
    repos: Vec<usize>,
    own_origin: bool,
}

#[derive(Debug, Clone, Copy)]
enum Target {
    Repo(usize),
    Root(usize),
}

/// Where an event went and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Stored before the engine looks (history).
    Seed,
    /// Published now: live to open subscriptions.
    Publish,
}

struct World {
    seed: u64,
    rng: SmallRng,
    avoid: Avoid,
    sim: Sim,
    own: String,
    keyring: Vec<Keys>,
    repos: Vec<Repo>,
    roots: Vec<RootRec>,
    anns: HashMap<EventId, Ann>,
    /// How each event came to be, for the report.
    origin: HashMap<EventId, String>,
    log: Vec<String>,
    /// Pending restarts: (at, remote index or `OWN_SLOT`).
    restarts: Vec<(u64, usize)>,
    anchors: Vec<usize>,
    counter: u64,
    desc: String,
    /// The engine may use NIP-77.
    negentropy: bool,
    /// A cap to lower halfway through the run (see [`CapDrop`]).
    cap_drop: Option<CapDrop>,
    /// Events that reached the sink later than they must, found while the
    /// world ran (see [`World::live`] and [`World::first_sync`]).
    late: Vec<String>,
}

/// How long a live event on a relay that covers it may take to reach the
/// sink: seconds, not the daily sync.
const LIVE_DEADLINE: Duration = Duration::from_secs(10);
/// How long the first sync of an even world may take before its history
/// is checked: well before any daily cycle.
const FIRST_SYNC_LIMIT: Duration = Duration::from_secs(3_600);
/// How long the engine must have had nothing queued or pending anywhere
/// for its first sync to count as over.
const FIRST_SYNC_QUIET: Duration = Duration::from_secs(60);

/// A relay that served the first sync a page of `floor` events for one
/// filter (so the engine learnt it returns at least that many) and later
/// moves to a store capping below it: a page under that old floor is no
/// proof that history ended (issue 23's finding 1).
#[derive(Debug, Clone, Copy)]
struct CapDrop {
    relay: usize,
    floor: usize,
}

const OWN_SLOT: usize = usize::MAX;

/// What a world ended with, for the summary of a run.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    expected: usize,
    events: usize,
    ingested: usize,
}

/// Why a world failed: short labels (for the summary) and the report.
struct Failure {
    labels: Vec<String>,
    report: String,
}

impl World {
    fn new(seed: u64, avoid: Avoid) -> World {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x6f72_6163_6c65);
        let public_name = !avoid.own_names && rng.gen_bool(0.25);
        let mut cfg = if public_name {
            let mut c = Config::new(LOCAL_OWN);
            c.domain = Some(DOMAIN.into());
            c
        } else {
            Config::new(format!("wss://{DOMAIN}"))
        };
        cfg.seed = seed;
        cfg.consolidation_threshold = *[70, 70, 12, 5].choose(&mut rng).unwrap();
        cfg.chunk_size = if rng.gen_bool(0.2) { 4 } else { 100 };
        if avoid.overlap {
            cfg.consolidation_threshold = 10_000;
            cfg.chunk_size = 100;
        }
        cfg.negentropy = rng.gen_bool(0.8);
        let mut desc = String::new();
        let _ = writeln!(
            desc,
            "world {seed}: own {} threshold {} chunk {} negentropy {}",
            cfg.own_relay, cfg.consolidation_threshold, cfg.chunk_size, cfg.negentropy
        );
        let negentropy = cfg.negentropy;
        let mut sim = Sim::new(cfg);
        sim.trace = std::env::var("ORACLE_TRACE").ok();
        let own = sim.own.clone();
        let keyring = (0..=70u8).map(keys).collect();
        let mut w = World {
            seed,
            rng,
            avoid,
            sim,
            own,
            keyring,
            repos: Vec::new(),
            roots: Vec::new(),
            anns: HashMap::new(),
            origin: HashMap::new(),
            log: Vec::new(),
            restarts: Vec::new(),
            anchors: Vec::new(),
            counter: 0,
            desc,
            negentropy,
            cap_drop: None,
            late: Vec::new(),
        };
        w.setup_relays();
        w
    }

    fn now(&self) -> u64 {
        self.sim.now.as_secs()
    }

    fn key(&self, n: u8) -> &Keys {
        &self.keyring[n as usize]
    }

    fn note(&mut self, what: String) {
        let t = self.now() as i64 - T0 as i64;
        self.log.push(format!("t+{t:>7} {what}"));
    }

    fn setup_relays(&mut self) {
        let own_cap = *[usize::MAX, usize::MAX, 500, 100, 50]
            .choose(&mut self.rng)
            .unwrap();
        // An own relay that leaves a listing unanswered now and then (a
        // sink that drops it without a word), or refuses one (LocalRelay past its
        // `max_reqs`, with nothing else of ours open).
        if self.rng.gen_bool(0.3) {
            let n = self.rng.gen_range(2..=6);
            let refuses = self.rng.gen_bool(0.5);
            self.sim.listing = sim_listing(n, refuses);
            let what = if refuses {
                "refuses"
            } else {
                "leaves unanswered"
            };
            let _ = writeln!(self.desc, "  own relay: {what} every {n}th listing");
        }
        let own = self.own.clone();
        self.sim.relay(&own).filter_cap = own_cap;
        let _ = writeln!(
            self.desc,
            "  own relay: per-filter cap {}",
            show_cap(own_cap)
        );
        for url in REMOTES {
            let cap = *CAPS.choose(&mut self.rng).unwrap();
            let max_subs = self.rng.gen_bool(0.25).then(|| {
                let style = if self.rng.gen_bool(0.5) {
                    Refuse::Closed
                } else {
                    Refuse::Notice
                };
                (self.rng.gen_range(3..=8), style)
            });
            let info = self.rng.gen_bool(0.5).then(|| RelayInfo {
                max_limit: self.rng.gen_bool(0.8).then_some(cap),
                max_subscriptions: max_subs.filter(|_| self.rng.gen_bool(0.5)).map(|(n, _)| n),
                max_filters: self.rng.gen_bool(0.2).then(|| self.rng.gen_range(4..=20)),
                max_message_length: None,
                max_value_bytes: None,
            });
            let value_caps = self
                .rng
                .gen_bool(0.25)
                .then_some(ValueCaps::eventstore().closed());
            let neg = match self.rng.gen_range(0..20) {
                0..=5 => NegMode::Supported,
                6..=16 => NegMode::Unknown,
                17 => NegMode::Error,
                18 => NegMode::Silent,
                _ => NegMode::Endless { ids_per_round: 50 },
            };
            // Some answer late, as relays over a network and with query
            // threads (nostr-rs-relay) do: refusals before answers.
            let timing = self.rng.gen_bool(0.3).then(|| {
                (
                    Duration::from_millis(self.rng.gen_range(0..=3)),
                    Duration::from_millis(self.rng.gen_range(0..=50)),
                    Duration::from_millis(self.rng.gen_range(0..=200)),
                )
            });
            // strfry refuses a whole REQ over a tag value of 256 bytes or
            // more, and counts NIP-77 sessions apart from REQs.
            let strfry = self.rng.gen_bool(0.2);
            let max_neg = (neg == NegMode::Supported && self.rng.gen_bool(0.3))
                .then(|| self.rng.gen_range(1..=3));
            let relay = self.sim.add_relay(url);
            relay.value_bytes = strfry.then_some(255);
            relay.max_neg = max_neg;
            if let Some((per_message, reply, query)) = timing {
                relay.per_message = per_message;
                relay.reply_delay = reply;
                relay.query_delay = query;
            }
            relay.filter_cap = cap;
            relay.max_subs = max_subs;
            relay.info = info;
            relay.value_caps = value_caps;
            relay.negentropy = neg;
            let _ = writeln!(
                self.desc,
                "  {url}: cap {cap}{}{}{}{}{} neg {neg:?}{}",
                if strfry { " strfry-values" } else { "" },
                max_neg.map_or(String::new(), |n| format!(" max_neg {n}")),
                info.map_or(String::new(), |i| format!(" nip11 {i:?}")),
                if value_caps.is_some() {
                    " eventstore-value-caps"
                } else {
                    ""
                },
                max_subs.map_or(String::new(), |(n, s)| format!(" max_subs {n} {s:?}")),
                timing.map_or(String::new(), |t| format!(" late {t:?}")),
            );
        }
    }

    /// One of the ways announcements spell a remote relay.
    fn spell(&mut self, r: usize) -> String {
        let url = REMOTES[r];
        let (scheme, rest) = url.split_once("://").unwrap();
        match self.rng.gen_range(0..6) {
            0 => format!(
                "{scheme}://{}",
                rest.to_uppercase().replace("/NOSTR", "/nostr")
            ),
            1 => format!("{url}/"),
            2 if scheme == "wss" && !rest.contains('/') => format!("{url}:443"),
            3 => format!("{}://{rest}", scheme.to_uppercase()),
            _ => url.to_owned(),
        }
    }

    /// The service as a `relays` value, in one of its spellings.
    fn service_spelling(&mut self) -> String {
        if self.avoid.own_names {
            return format!("wss://{DOMAIN}");
        }
        match self.rng.gen_range(0..8) {
            0 => format!("wss://{}/", DOMAIN.to_uppercase()),
            1 => format!("wss://{DOMAIN}:443"),
            2 => format!("ws://{DOMAIN}"),
            _ => format!("wss://{DOMAIN}"),
        }
    }

    fn random_relays(&mut self, min: usize, max: usize) -> Vec<usize> {
        let n = self.rng.gen_range(min..=max);
        let mut all: Vec<usize> = (0..REMOTES.len()).collect();
        all.shuffle(&mut self.rng);
        all.truncate(n);
        all.sort_unstable();
        all
    }

    fn announcement(&mut self, repo: usize, relays: &[usize], listing: Listing) -> Event {
        let created_at = (self.repos[repo].last + 1).max(self.now());
        let mut values = vec!["relays".to_owned()];
        for &r in relays {
            let spelled = self.spell(r);
            values.push(spelled);
        }
        if matches!(listing, Listing::Both | Listing::RelaysOnly) {
            let at = self.rng.gen_range(1..=values.len());
            let service = self.service_spelling();
            values.insert(at, service);
        }
        let (owner, d) = (self.repos[repo].owner, self.repos[repo].d.clone());
        let mut tags = vec![tag(&["d", &d])];
        tags.push(Tag::parse(values).unwrap());
        if matches!(listing, Listing::Both | Listing::CloneOnly) {
            let npub = self.key(owner).public_key().to_bech32().unwrap();
            tags.push(tag(&["clone", &format!("https://{DOMAIN}/{npub}/{d}.git")]));
        }
        let ev = sign(self.key(owner), 30617, created_at, tags, "");
        let r = &mut self.repos[repo];
        r.last = created_at;
        r.relays = relays.to_vec();
        ev
    }

    fn record_ann(
        &mut self,
        ev: &Event,
        repo: usize,
        relays: &[usize],
        listing: Listing,
        own: bool,
    ) {
        self.anns.insert(
            ev.id,
            Ann {
                id: ev.id,
                repo,
                created_at: ev.created_at.as_secs(),
                relays: relays.to_vec(),
                accepted: listing == Listing::Both,
                own_origin: own,
            },
        );
    }

    fn put(&mut self, relay: usize, ev: &Event, place: Place) {
        let url = if relay == OWN_SLOT {
            self.own.clone()
        } else {
            REMOTES[relay].to_owned()
        };
        match place {
            Place::Seed => self.sim.seed(&url, ev),
            Place::Publish => self.sim.publish(&url, ev),
        }
    }

    fn new_repo(&mut self, role: Role, owner: u8, d: String) -> usize {
        let coord = coord(self.key(owner), &d);
        self.repos.push(Repo {
            owner,
            d,
            coord,
            role,
            relays: Vec::new(),
            last: 0,
            withdrawn: false,
        });
        self.repos.len() - 1
    }

    /// Announces a repo on the own relay.
    fn announce_own(&mut self, repo: usize, relays: Vec<usize>, place: Place) {
        let ev = self.announcement(repo, &relays, Listing::Both);
        self.record_ann(&ev, repo, &relays, Listing::Both, true);
        self.origin
            .insert(ev.id, format!("{place:?} on own at {}", self.now()));
        self.put(OWN_SLOT, &ev, place);
    }

    /// Announces a repo on remote relay `on`.
    fn announce_remote(
        &mut self,
        repo: usize,
        relays: Vec<usize>,
        listing: Listing,
        on: usize,
        place: Place,
    ) {
        let ev = self.announcement(repo, &relays, listing);
        self.record_ann(&ev, repo, &relays, listing, false);
        self.origin.insert(
            ev.id,
            format!(
                "{place:?} on {} at {} ({listing:?})",
                REMOTES[on],
                self.now()
            ),
        );
        self.put(on, &ev, place);
    }

    /// Builds the repos and the history the relays hold before the engine starts.
    fn setup_repos(&mut self) {
        let anchor = self.new_repo(Role::Anchor, OWNERS, "anchor".into());
        let anchors = self.random_relays(1, 2);
        self.anchors = anchors.clone();
        self.announce_own(anchor, anchors, Place::Seed);
        let own_count = self.rng.gen_range(2..=4);
        for i in 0..own_count {
            let repo = self.new_repo(Role::Own, OWNERS + 1 + i as u8, format!("own{i}"));
            let relays = self.random_relays(1, 3);
            self.announce_own(repo, relays, Place::Seed);
        }
        // A repo whose `d` tag makes its coordinate longer than strfry
        // takes: its events cannot be asked for on strfry-like relays.
        if self.rng.gen_bool(0.3) {
            let d = format!("long-{}", "d".repeat(200));
            let repo = self.new_repo(Role::Own, OWNERS + 5, d);
            let relays = self.random_relays(1, 3);
            self.announce_own(repo, relays, Place::Seed);
        }
        let remote_count = self.rng.gen_range(0..=3);
        let mut remote_homes: Vec<usize> = Vec::new();
        for i in 0..remote_count {
            let repo = self.new_repo(Role::Remote, OWNERS + 10 + i as u8, format!("remote{i}"));
            let relays = self.random_relays(1, 2);
            // On an anchor relay, or (recursive discovery) on the relay of
            // a remote repo found before it.
            let on = if !remote_homes.is_empty() && self.rng.gen_bool(0.4) {
                *remote_homes.choose(&mut self.rng).unwrap()
            } else {
                *self.anchors.clone().choose(&mut self.rng).unwrap()
            };
            remote_homes.extend(&relays);
            self.announce_remote(repo, relays, Listing::Both, on, Place::Seed);
        }
        if !self.avoid.grasp01 && self.rng.gen_bool(0.5) {
            let repo = self.new_repo(Role::Withdrawn, OWNERS + 20, "withdrawn".into());
            let relays = self.random_relays(1, 2);
            self.announce_own(repo, relays, Place::Seed);
        }
        let foreign_count = self.rng.gen_range(0..=2);
        for i in 0..foreign_count {
            let repo = self.new_repo(Role::Foreign, OWNERS + 25 + i as u8, format!("foreign{i}"));
            let relays = self.random_relays(1, 2);
            let listing = if self.avoid.grasp01 {
                Listing::Neither
            } else {
                *[Listing::RelaysOnly, Listing::CloneOnly, Listing::Neither]
                    .choose(&mut self.rng)
                    .unwrap()
            };
            let on = self.rng.gen_range(0..REMOTES.len());
            self.announce_remote(repo, relays, listing, on, Place::Seed);
        }
        if self.rng.gen_bool(0.25) {
            let n = self.rng.gen_range(40..=150);
            for i in 0..n {
                let repo = self.new_repo(Role::Filler, OWNERS + 30, format!("filler{i}"));
                let relays = self.random_relays(1, 1);
                let ev = self.announcement(repo, &relays, Listing::Both);
                // Spread over time: the own relay's cap pages through them.
                let ev = resign_at(self.key(OWNERS + 30), &ev, T0 - 500_000 + i as u64);
                self.repos[repo].last = ev.created_at.as_secs();
                self.record_ann(&ev, repo, &relays, Listing::Both, true);
                self.origin.insert(ev.id, "Seed on own (filler)".into());
                self.put(OWN_SLOT, &ev, Place::Seed);
                if self.rng.gen_bool(0.3) {
                    let t = T0 - self.rng.gen_range(1_000..3_000_000);
                    let ev = self.event_for(Target::Repo(repo), t);
                    self.place_event(Target::Repo(repo), &ev, Place::Seed, "history");
                }
            }
        }
        // History of every repo but the fillers.
        for repo in 0..self.repos.len() {
            if self.repos[repo].role == Role::Filler {
                continue;
            }
            for _ in 0..self.rng.gen_range(0..=3) {
                let t = T0 - self.rng.gen_range(1_000..3_000_000);
                self.new_root(repo, t, Place::Seed);
            }
            for _ in 0..self.rng.gen_range(0..=4) {
                let t = T0 - self.rng.gen_range(1_000..3_000_000);
                let ev = self.event_for(Target::Repo(repo), t);
                self.place_event(Target::Repo(repo), &ev, Place::Seed, "history");
            }
        }
        if !self.roots.is_empty() && self.rng.gen_bool(0.3) {
            let root = self.rng.gen_range(0..self.roots.len());
            self.crowd(Target::Root(root), Place::Seed);
        }
        if self.rng.gen_bool(0.3) {
            self.plan_cap_drop();
        }
        for root in 0..self.roots.len() {
            for _ in 0..self.rng.gen_range(0..=5) {
                let t = T0 - self.rng.gen_range(1_000..1_000_000);
                let ev = self.event_for(Target::Root(root), t);
                self.place_event(Target::Root(root), &ev, Place::Seed, "history");
            }
        }
        for r in &self.repos {
            if r.role == Role::Filler {
                continue;
            }
            let _ = writeln!(
                self.desc,
                "  repo {} ({:?}) on {:?}",
                r.d,
                r.role,
                r.relays.iter().map(|&i| REMOTES[i]).collect::<Vec<_>>()
            );
        }
        let fillers = self.repos.iter().filter(|r| r.role == Role::Filler).count();
        if fillers > 0 {
            let _ = writeln!(self.desc, "  {fillers} filler repos on the own relay");
        }
    }

    /// A root (patch, PR or issue) under `repo` and sometimes another repo.
    fn new_root(&mut self, repo: usize, created_at: u64, place: Place) {
        let mut repos = vec![repo];
        if self.rng.gen_bool(0.2) {
            let other = self.rng.gen_range(0..self.repos.len());
            if other != repo && self.repos[other].role != Role::Filler {
                repos.push(other);
            }
        }
        let kind = *[1617, 1618, 1621].choose(&mut self.rng).unwrap();
        let coords: Vec<&str> = repos
            .iter()
            .map(|&r| self.repos[r].coord.as_str())
            .collect();
        self.counter += 1;
        let author = AUTHORS + self.rng.gen_range(0..10);
        // On the own relay (the sink learns it there), or on relays of its
        // repos (Layer 2 finds it), sometimes on one that carries neither.
        let own = self.repos[repo].role != Role::Foreign && self.rng.gen_bool(0.4);
        let created_at = if own && place == Place::Publish && self.avoid.daily {
            self.now()
        } else {
            created_at
        };
        let ev = root(
            self.key(author),
            kind,
            &coords,
            created_at,
            &format!("root {}", self.counter),
        );
        self.roots.push(RootRec {
            id: ev.id,
            repos,
            own_origin: own,
        });
        let idx = self.roots.len() - 1;
        if own {
            self.origin
                .insert(ev.id, format!("{place:?} root on own at {}", self.now()));
            self.put(OWN_SLOT, &ev, place);
        } else {
            self.place_event(Target::Root(idx), &ev, place, "root");
        }
    }

    /// The relays a target lives on now (its repos' newest announcements).
    fn home(&self, target: Target) -> Vec<usize> {
        let mut relays: Vec<usize> = match target {
            Target::Repo(r) => self.repos[r].relays.clone(),
            Target::Root(x) => self.roots[x]
                .repos
                .iter()
                .flat_map(|&r| self.repos[r].relays.clone())
                .collect(),
        };
        relays.sort_unstable();
        relays.dedup();
        relays
    }

    /// A random event tagging `target`.
    fn event_for(&mut self, target: Target, created_at: u64) -> Event {
        self.counter += 1;
        let n = self.counter;
        let author = AUTHORS + self.rng.gen_range(0..10);
        let k = self.key(author).clone();
        match target {
            Target::Repo(r) => {
                let c = self.repos[r].coord.clone();
                match self.rng.gen_range(0..5) {
                    0 => repo_comment(&k, &c, created_at, &format!("comment {n}")),
                    1 => sign(
                        &k,
                        1,
                        created_at,
                        vec![tag(&["a", &c])],
                        &format!("note {n}"),
                    ),
                    2 => sign(
                        &k,
                        1,
                        created_at,
                        vec![tag(&["q", &c])],
                        &format!("quote {n}"),
                    ),
                    3 => {
                        // Repo state, by the owner or a co-maintainer.
                        let by = if self.rng.gen_bool(0.5) {
                            self.repos[r].owner
                        } else {
                            MAINTAINER
                        };
                        let d = self.repos[r].d.clone();
                        sign(
                            self.key(by),
                            30618,
                            created_at,
                            vec![
                                tag(&["d", &d]),
                                tag(&["refs/heads/main", &format!("{n:x}")]),
                            ],
                            "",
                        )
                    }
                    _ => sign(
                        &k,
                        1111,
                        created_at,
                        vec![tag(&["a", &c])],
                        &format!("lc {n}"),
                    ),
                }
            }
            Target::Root(x) => {
                let id = self.roots[x].id.to_hex();
                let (kind, tags) = match self.rng.gen_range(0..7) {
                    0 if !self.avoid.sibling => (1111, vec![tag(&["E", &id]), tag(&["e", &id])]),
                    1 => (1, vec![tag(&["e", &id])]),
                    2 => (7, vec![tag(&["e", &id])]),
                    3 => (self.rng.gen_range(1630..=1633), vec![tag(&["e", &id])]),
                    4 => (1619, vec![tag(&["e", &id])]),
                    5 => (1, vec![tag(&["q", &id])]),
                    _ => (1111, vec![tag(&["E", &id])]),
                };
                sign(&k, kind, created_at, tags, &format!("on root {n}"))
            }
        }
    }

    /// Publishes a live event and, where a relay it went to covers its
    /// target live (connected, its target confirmed, nothing pending, no
    /// refusal armed or pausing it, the own relay up), checks that it reaches the sink
    /// within [`LIVE_DEADLINE`] if the model expects it from there.
    fn live(&mut self, target: Target, ev: &Event) {
        let on = self.place_event(target, ev, Place::Publish, "live");
        let covering: Vec<usize> = on
            .into_iter()
            .filter(|&r| self.covers_live(r, target))
            .collect();
        if covering.is_empty() {
            return;
        }
        self.advance(LIVE_DEADLINE);
        let synced = self.synced_repos();
        let sink = self.sink();
        let (expected, _) = self.expected(&synced, &sink);
        let late = expected
            .iter()
            .find(|(r, e, _)| e.id == ev.id && covering.contains(r) && !sink.contains(&e.id));
        if let Some((r, e, why)) = late {
            let text = format!(
                "late: live {} kind {} ({why}) on {} not in the sink {LIVE_DEADLINE:?} after",
                short(&e.id),
                e.kind.as_u16(),
                REMOTES[*r]
            );
            self.note(text.clone());
            self.late.push(text);
        }
    }

    /// True if remote relay `r` holds `target` confirmed on a live set the
    /// engine has settled, with the own relay connected to take events.
    fn covers_live(&self, r: usize, target: Target) -> bool {
        let engine = &self.sim.engine;
        let connected = |url: &str| {
            self.sim.relays[url].online
                && engine
                    .relay_id(url)
                    .is_some_and(|id| engine.relay_status(id) == Status::Connected)
        };
        let url = REMOTES[r];
        let Some(id) = engine.relay_id(url) else {
            return false;
        };
        let key = match target {
            Target::Repo(y) => ItemKey::Repo(self.repos[y].coord.clone()),
            Target::Root(x) => ItemKey::Root(self.roots[x].id),
        };
        let counts = engine.item_counts(id);
        connected(&self.own)
            && connected(url)
            && self.sim.relays[url].close_next.is_empty()
            && engine.relay_view(id, self.sim.now).paused_until.is_none()
            && counts.queued + counts.pending == 0
            && engine.item_state(id, &key) == Some(ItemState::Confirmed)
    }

    /// The first sync of an even world, before anything else happens: once
    /// every relay of ours is connected with nothing queued or pending
    /// (within [`FIRST_SYNC_LIMIT`]), every event the model expects is in
    /// the sink.
    fn first_sync(&mut self) {
        let step = Duration::from_secs(5);
        let mut waited = Duration::ZERO;
        // Settled for a minute: a root found on a remote relay goes round
        // the own relay and a batch window before its replies are asked.
        let mut quiet = Duration::ZERO;
        while quiet < FIRST_SYNC_QUIET {
            quiet = if self.all_settled() {
                quiet + step
            } else {
                Duration::ZERO
            };
            if waited >= FIRST_SYNC_LIMIT {
                self.late.push(format!(
                    "late: the first sync had not settled after {FIRST_SYNC_LIMIT:?}"
                ));
                return;
            }
            self.advance(step);
            waited += step;
        }
        self.note(format!("first sync settled after {waited:?}"));
        let synced = self.synced_repos();
        let sink = self.sink();
        let (expected, _) = self.expected(&synced, &sink);
        let missing: Vec<String> = expected
            .iter()
            .filter(|(_, e, _)| !sink.contains(&e.id))
            .map(|(r, e, why)| {
                format!(
                    "{} kind {} ({why}) on {}",
                    short(&e.id),
                    e.kind.as_u16(),
                    REMOTES[*r]
                )
            })
            .collect();
        if !missing.is_empty() {
            self.late.push(format!(
                "late: {} history events not in the sink when the first sync settled: {:?}",
                missing.len(),
                &missing[..missing.len().min(5)]
            ));
        }
    }

    /// True once the own relay and every relay of ours are connected with
    /// nothing queued or pending.
    fn all_settled(&self) -> bool {
        let engine = &self.sim.engine;
        let synced = self.synced_repos();
        let ours: BTreeSet<usize> = synced.values().flat_map(|o| o.relays.clone()).collect();
        let settled = |url: &str| {
            engine.relay_id(url).is_some_and(|id| {
                let counts = engine.item_counts(id);
                engine.relay_status(id) == Status::Connected && counts.queued + counts.pending == 0
            })
        };
        settled(&self.own) && ours.iter().all(|&r| settled(REMOTES[r]))
    }

    /// Puts an event on one or two relays of its target, sometimes also on
    /// one that does not carry it; returns the relays it went to.
    fn place_event(&mut self, target: Target, ev: &Event, place: Place, why: &str) -> Vec<usize> {
        let home = self.home(target);
        let mut on: Vec<usize> = Vec::new();
        if !home.is_empty() {
            let n = self.rng.gen_range(1..=2.min(home.len()));
            on.extend(home.choose_multiple(&mut self.rng, n).copied());
        }
        if home.is_empty() || !self.avoid.overlap && self.rng.gen_bool(0.25) {
            on.push(self.rng.gen_range(0..REMOTES.len()));
        }
        on.sort_unstable();
        on.dedup();
        let names: Vec<&str> = on.iter().map(|&r| REMOTES[r]).collect();
        self.origin.insert(
            ev.id,
            format!(
                "{place:?} {why} on {names:?} at t+{}",
                self.now() as i64 - T0 as i64
            ),
        );
        for &r in &on {
            self.put(r, ev, place);
        }
        on
    }

    fn random_target(&mut self) -> Target {
        if !self.roots.is_empty() && self.rng.gen_bool(0.5) {
            return Target::Root(self.rng.gen_range(0..self.roots.len()));
        }
        let candidates: Vec<usize> = (0..self.repos.len())
            .filter(|&r| self.repos[r].role != Role::Filler)
            .collect();
        Target::Repo(*candidates.choose(&mut self.rng).unwrap())
    }

    fn target_name(&self, target: Target) -> String {
        match target {
            Target::Repo(r) => format!("repo {}", self.repos[r].d),
            Target::Root(x) => format!("root {}", &self.roots[x].id.to_hex()[..8]),
        }
    }

    /// Advances the clock, restarting relays whose outage ends on the way.
    fn advance(&mut self, d: Duration) {
        let target = self.now() + d.as_secs();
        loop {
            self.restarts.sort_unstable();
            match self.restarts.first().copied() {
                Some((at, r)) if at <= target => {
                    self.restarts.remove(0);
                    if at > self.now() {
                        self.sim.advance(Duration::from_secs(at - self.now()));
                    }
                    let url = if r == OWN_SLOT {
                        self.own.clone()
                    } else {
                        REMOTES[r].to_owned()
                    };
                    self.sim.start_relay(&url);
                    self.sim.settle();
                }
                _ => break,
            }
        }
        if target > self.now() {
            self.sim.advance(Duration::from_secs(target - self.now()));
        } else {
            self.sim.settle();
        }
    }

    fn step(&mut self) {
        match self.rng.gen_range(0..100) {
            0..=21 => {
                let secs = match self.rng.gen_range(0..10) {
                    0..=3 => self.rng.gen_range(1..30),
                    4..=6 => self.rng.gen_range(30..900),
                    7..=8 => self.rng.gen_range(900..7_200),
                    _ => self.rng.gen_range(7_200..8 * 3_600),
                };
                self.note(format!("advance {secs} s"));
                self.advance(Duration::from_secs(secs));
            }
            22..=36 => {
                let target = self.random_target();
                let ev = self.event_for(target, self.now());
                let name = self.target_name(target);
                self.note(format!(
                    "live {} kind {} for {name}",
                    short(&ev.id),
                    ev.kind.as_u16()
                ));
                self.live(target, &ev);
            }
            37..=44 => {
                let target = self.random_target();
                let back = self.rng.gen_range(3_600..5_000_000);
                let ev = self.event_for(target, self.now() - back);
                let name = self.target_name(target);
                self.note(format!("backdated {} ({back} s) for {name}", short(&ev.id)));
                self.place_event(target, &ev, Place::Publish, "backdated");
            }
            45..=52 => {
                let r = self.rng.gen_range(0..REMOTES.len());
                if self.sim.relays[REMOTES[r]].online {
                    let outage = if self.rng.gen_bool(0.6) {
                        self.rng.gen_range(10..600)
                    } else {
                        self.rng.gen_range(1_200..6 * 3_600)
                    };
                    self.note(format!("stop {} for {outage} s", REMOTES[r]));
                    self.sim.stop_relay(REMOTES[r]);
                    self.restarts.push((self.now() + outage, r));
                }
            }
            53..=55 => {
                let own = self.own.clone();
                if self.sim.relays[&own].online {
                    let outage = self.rng.gen_range(2..600);
                    self.note(format!("stop own relay for {outage} s"));
                    self.sim.stop_relay(&own);
                    self.restarts.push((self.now() + outage, OWN_SLOT));
                }
            }
            56..=61 => self.move_repo(),
            62..=64 => self.remote_version(),
            65..=66 => self.withdraw(),
            67..=71 => {
                let candidates: Vec<usize> = (0..self.repos.len())
                    .filter(|&r| self.repos[r].role != Role::Filler)
                    .collect();
                let repo = *candidates.choose(&mut self.rng).unwrap();
                let back = if self.rng.gen_bool(0.5) {
                    0
                } else {
                    self.rng.gen_range(3_600..1_000_000)
                };
                self.note(format!("new root for repo {}", self.repos[repo].d));
                self.new_root(repo, self.now() - back, Place::Publish);
            }
            72..=73 => self.burst(),
            74 => self.same_second_burst(),
            75 => self.change_cap(),
            76..=78 => {
                let r = self.rng.gen_range(0..REMOTES.len());
                let reason = *[
                    "rate-limited: slow down",
                    "error: shutting down",
                    "ERROR: busy",
                ]
                .choose(&mut self.rng)
                .unwrap();
                self.note(format!("{} refuses its next REQ: {reason}", REMOTES[r]));
                self.sim
                    .relay(REMOTES[r])
                    .close_next
                    .push_back(reason.into());
            }
            _ => {
                let secs = self.rng.gen_range(1..20);
                self.advance(Duration::from_secs(secs));
            }
        }
        self.sim.settle();
    }

    /// A repo announced on the own relay moves: a newer announcement with
    /// other relays. The relay it left may keep streaming for it.
    fn move_repo(&mut self) {
        let movable: Vec<usize> = (0..self.repos.len())
            .filter(|&r| self.repos[r].role == Role::Own)
            .collect();
        let Some(&repo) = movable.choose(&mut self.rng) else {
            return;
        };
        let old = self.repos[repo].relays.clone();
        let relays = self.random_relays(1, 3);
        self.note(format!(
            "move repo {} from {:?} to {:?}",
            self.repos[repo].d, old, relays
        ));
        self.announce_own(repo, relays.clone(), Place::Publish);
        let left: Vec<usize> = old.into_iter().filter(|r| !relays.contains(r)).collect();
        if !self.avoid.move_bursts && !left.is_empty() && self.rng.gen_bool(0.5) {
            self.advance(Duration::from_secs(6));
            let r = *left.choose(&mut self.rng).unwrap();
            let n = self.rng.gen_range(100..=130);
            self.note(format!("{} keeps streaming {n} events for it", REMOTES[r]));
            let c = self.repos[repo].coord.clone();
            for i in 0..n {
                self.counter += 1;
                // One second apart: a relay capped per filter cannot page
                // through more events than its cap in one second.
                let t = self.now() - i;
                let ev = repo_comment(
                    self.key(AUTHORS),
                    &c,
                    t,
                    &format!("left {i} {}", self.counter),
                );
                self.origin
                    .insert(ev.id, format!("live on the relay it left, {}", REMOTES[r]));
                self.put(r, &ev, Place::Publish);
            }
        }
    }

    /// A remote-only repo gets a newer version (other relays), or a new
    /// remote-only repo appears, on an anchor relay.
    fn remote_version(&mut self) {
        let remote: Vec<usize> = (0..self.repos.len())
            .filter(|&r| self.repos[r].role == Role::Remote)
            .collect();
        let repo = match remote.choose(&mut self.rng) {
            Some(&r) if self.rng.gen_bool(0.5) => r,
            _ => {
                let i = remote.len();
                if i >= 6 {
                    return;
                }
                self.new_repo(Role::Remote, OWNERS + 10 + i as u8, format!("remote{i}"))
            }
        };
        // A remote repo's relays may hold other remote repos found through
        // it; they keep those and may add one.
        let mut relays = self.repos[repo].relays.clone();
        relays.push(self.rng.gen_range(0..REMOTES.len()));
        relays.sort_unstable();
        relays.dedup();
        let on = *self.anchors.clone().choose(&mut self.rng).unwrap();
        self.note(format!(
            "remote announcement of {} on {} listing {relays:?}",
            self.repos[repo].d, REMOTES[on]
        ));
        self.announce_remote(repo, relays, Listing::Both, on, Place::Publish);
    }

    /// A repo on the own relay is withdrawn from us: a newer announcement,
    /// found on an anchor relay, no longer lists the service.
    fn withdraw(&mut self) {
        let Some(repo) = (0..self.repos.len())
            .find(|&r| self.repos[r].role == Role::Withdrawn && !self.repos[r].withdrawn)
        else {
            return;
        };
        self.repos[repo].withdrawn = true;
        let relays = self.random_relays(1, 2);
        let on = *self.anchors.clone().choose(&mut self.rng).unwrap();
        self.note(format!(
            "withdraw repo {} (new announcement on {} lists {relays:?}, not us)",
            self.repos[repo].d, REMOTES[on]
        ));
        self.announce_remote(repo, relays, Listing::Neither, on, Place::Publish);
    }

    /// More events for one target on one relay than it returns per filter,
    /// backdated, one second apart at least.
    fn burst(&mut self) {
        let target = self.random_target();
        let home = self.home(target);
        let Some(&r) = home.choose(&mut self.rng) else {
            return;
        };
        let cap = self.sim.relays[REMOTES[r]].filter_cap;
        if cap > 1_000 {
            return;
        }
        let n = (cap as f64 * self.rng.gen_range(1.1..2.5)) as u64;
        let n = n.min(400);
        let name = self.target_name(target);
        self.note(format!(
            "burst of {n} backdated events for {name} on {}",
            REMOTES[r]
        ));
        let start = self.now() - self.rng.gen_range(10_000..500_000);
        for i in 0..n {
            let t = start - i * self.rng.gen_range(1..20);
            let ev = self.event_for(target, t);
            self.origin.insert(
                ev.id,
                format!(
                    "burst on {} at t+{}",
                    REMOTES[r],
                    self.now() as i64 - T0 as i64
                ),
            );
            self.put(r, &ev, Place::Publish);
        }
    }

    /// More events for one target in one second than a relay returns per
    /// filter, on a relay that speaks NIP-77 (elsewhere they are
    /// unreachable, and said so: `sim_no_loss` checks that).
    fn same_second_burst(&mut self) {
        let target = self.random_target();
        self.crowd(target, Place::Publish);
    }

    /// [`World::same_second_burst`] for `target`, placed as `place`: seeded
    /// before the engine starts, the first sync reads it by REQ (the sink
    /// holds nothing yet), which must split the second.
    fn crowd(&mut self, target: Target, place: Place) {
        let home = self.home(target);
        let Some(&r) = home.choose(&mut self.rng) else {
            return;
        };
        let relay = &self.sim.relays[REMOTES[r]];
        let cap = relay.filter_cap;
        if cap > 500 || relay.negentropy != NegMode::Supported || !self.negentropy {
            return;
        }
        let n = (cap as f64 * self.rng.gen_range(1.1..2.0)) as u64;
        let name = self.target_name(target);
        let at = self.now() - self.rng.gen_range(10_000..500_000);
        self.note(format!(
            "{n} events in second t{:+} for {name} on {}",
            at as i64 - T0 as i64,
            REMOTES[r]
        ));
        for _ in 0..n {
            let ev = self.event_for(target, at);
            self.origin
                .insert(ev.id, format!("same-second burst on {}", REMOTES[r]));
            self.put(r, &ev, place);
        }
    }

    /// Seeds a long history of the anchor repo on an anchor relay that
    /// returns it in one short page (a cap of 250 or more, not stated in
    /// NIP-11, which would settle pages by itself), for [`World::drop_cap`].
    fn plan_cap_drop(&mut self) {
        let candidates: Vec<usize> = self
            .anchors
            .iter()
            .copied()
            .filter(|&r| {
                let relay = &self.sim.relays[REMOTES[r]];
                relay.filter_cap >= 250 && relay.info.is_none_or(|i| i.max_limit.is_none())
            })
            .collect();
        let Some(&r) = candidates.choose(&mut self.rng) else {
            return;
        };
        let cap = self.sim.relays[REMOTES[r]].filter_cap;
        let floor = self.rng.gen_range(150..cap.min(400));
        self.seed_history(r, floor, "history before its cap drops");
        self.cap_drop = Some(CapDrop { relay: r, floor });
        let _ = writeln!(
            self.desc,
            "  {}: {floor} events of repo anchor, its cap to drop below them",
            REMOTES[r]
        );
    }

    /// The planned relay moves to a store capping at 50 or 100 and
    /// restarts; meanwhile it got more old events of the anchor repo than
    /// its new cap and fewer than the page the engine saw before. Only a
    /// full re-read finds them (they are older than any catch-up), and
    /// only one that checks its pages again.
    fn drop_cap(&mut self) {
        let Some(CapDrop { relay: r, floor }) = self.cap_drop.take() else {
            return;
        };
        let cap = if floor > 130 && self.rng.gen_bool(0.5) {
            100
        } else {
            50
        };
        let url = REMOTES[r];
        self.note(format!(
            "{url} moves to a store capping at {cap} (it served {floor})"
        ));
        self.sim.relay(url).filter_cap = cap;
        if self.sim.relays[url].online {
            self.sim.stop_relay(url);
            self.restarts.push((self.now() + 5, r));
        }
        let n = self.rng.gen_range(cap + cap / 5..floor);
        self.seed_history(r, n, "history after its cap dropped");
    }

    /// `n` old events of the anchor repo, stored on remote `r` only.
    fn seed_history(&mut self, r: usize, n: usize, why: &str) {
        for _ in 0..n {
            let t = T0 - self.rng.gen_range(1_000..3_000_000);
            let ev = self.event_for(Target::Repo(0), t);
            self.origin
                .insert(ev.id, format!("{why} on {}", REMOTES[r]));
            self.put(r, &ev, Place::Seed);
        }
    }

    /// A relay moves to a store with another cap (strfry to khatru, a
    /// config change) and restarts: what it showed before is a hint only.
    fn change_cap(&mut self) {
        let r = self.rng.gen_range(0..REMOTES.len());
        let url = REMOTES[r];
        let cap = *CAPS.choose(&mut self.rng).unwrap();
        self.note(format!("{url} moves to a store capping at {cap}"));
        let relay = self.sim.relay(url);
        relay.filter_cap = cap;
        if let Some(info) = relay.info.as_mut()
            && info.max_limit.is_some()
        {
            info.max_limit = Some(cap);
        }
        if relay.online {
            self.sim.stop_relay(url);
            self.restarts.push((self.now() + 5, r));
        }
    }

    /// All relays up, refusals cleared; a daily cycle passes. Some relays
    /// keep reconnecting through it, one with an event backdated behind its
    /// live filters.
    fn quiet(&mut self) {
        self.note("quiet".into());
        for url in REMOTES {
            let relay = self.sim.relay(url);
            relay.close_next.clear();
            relay.online = true;
        }
        let own = self.own.clone();
        self.sim.start_relay(&own);
        self.restarts.clear();
        let flap = !self.avoid.daily && self.rng.gen_bool(0.4);
        if !flap {
            self.advance(Duration::from_secs(26 * 3_600));
        } else {
            let f = *self.anchors.clone().choose(&mut self.rng).unwrap();
            let period = self.rng.gen_range(3 * 3_600..7 * 3_600);
            let _ = writeln!(
                self.desc,
                "  quiet: {} reconnects every {period} s",
                REMOTES[f]
            );
            let mut published: Option<u64> = None;
            loop {
                self.advance(Duration::from_secs(period));
                self.note(format!("blip {}", REMOTES[f]));
                self.sim.stop_relay(REMOTES[f]);
                let down = self.rng.gen_range(5..120);
                self.advance(Duration::from_secs(down));
                self.sim.start_relay(REMOTES[f]);
                self.advance(Duration::from_secs(300));
                if published.is_none() {
                    let anchor = Target::Repo(0);
                    let back = self.rng.gen_range(3_600..5_000_000);
                    let ev = self.event_for(anchor, self.now() - back);
                    self.note(format!(
                        "backdated {} behind the live stream of {}",
                        short(&ev.id),
                        REMOTES[f]
                    ));
                    self.origin.insert(
                        ev.id,
                        format!(
                            "backdated behind the live stream of {} while blipping",
                            REMOTES[f]
                        ),
                    );
                    self.put(f, &ev, Place::Publish);
                    self.sim.settle();
                    published = Some(self.now());
                }
                if published.is_some_and(|p| self.now() > p + 25 * 3_600 + 1_800) {
                    break;
                }
            }
        }
        self.advance(Duration::from_secs(600));
        // A daily sync may have started in the last minutes, its jobs
        // waiting out a listing the own relay left unanswered: let them
        // (no relay's daily sync comes again within two hours).
        for _ in 0..60 {
            if !self.any_pending() {
                break;
            }
            self.advance(Duration::from_secs(120));
        }
    }

    /// True while some relay has a batch pending.
    fn any_pending(&self) -> bool {
        let engine = &self.sim.engine;
        REMOTES
            .iter()
            .filter_map(|url| engine.relay_id(url))
            .any(|id| engine.item_counts(id).pending > 0)
    }

    fn run(mut self, steps: usize, verbose: bool) -> Result<Tally, Failure> {
        // A panic (the sim's guard against an instant that never settles)
        // keeps the world's description and steps, to replay it by.
        let mut labels = Vec::new();
        let played = catch_unwind(AssertUnwindSafe(|| self.play(steps)));
        match played {
            Ok(found) => labels.extend(found),
            Err(panic) => {
                let mut report = String::from("steps:\n");
                for line in &self.log {
                    let _ = writeln!(report, "  {line}");
                }
                return Err(Failure {
                    labels: vec![format!("panic: {}", panic_text(&*panic))],
                    report: format!("{}{report}", self.desc),
                });
            }
        }
        labels.append(&mut self.late);
        let (tally, mut report) = self.check(&mut labels);
        if verbose || !labels.is_empty() {
            let _ = writeln!(report, "steps:");
            for line in &self.log {
                let _ = writeln!(report, "  {line}");
            }
        }
        if labels.is_empty() {
            if verbose {
                eprintln!("{}{report}", self.desc);
            }
            Ok(tally)
        } else {
            Err(Failure {
                labels,
                report: format!("{}{report}", self.desc),
            })
        }
    }

    /// The world's life: its repos, its first sync on even seeds, `steps`
    /// random steps and the quiet after them. What broke an invariant.
    fn play(&mut self, steps: usize) -> Option<String> {
        self.setup_repos();
        if self.seed.is_multiple_of(2) {
            self.first_sync();
        }
        for i in 0..steps {
            if i == steps / 2 {
                self.drop_cap();
            }
            self.step();
            if let Err(e) = self.sim.engine.check_invariants() {
                return Some(format!("invariant: at step {i}: {e}"));
            }
        }
        self.quiet();
        None
    }

    /// The model: which repos are ours at the end, on which relays.
    /// Computed from the announcements the relays hold and what the world
    /// knows of them; a fixpoint because remote announcements are found
    /// only on relays of repos already ours.
    fn synced_repos(&self) -> BTreeMap<usize, Ours> {
        let mut held: Vec<(usize, &Ann)> = Vec::new();
        for (r, url) in REMOTES.iter().enumerate() {
            for e in &self.sim.relays[*url].events {
                if let Some(a) = self.anns.get(&e.id) {
                    held.push((r, a));
                }
            }
        }
        let own_origin: Vec<&Ann> = self.anns.values().filter(|a| a.own_origin).collect();
        let mut readable: BTreeSet<usize> = BTreeSet::new();
        for _ in 0..32 {
            let mut newest: BTreeMap<usize, &Ann> = BTreeMap::new();
            let found = held
                .iter()
                .filter(|(r, _)| readable.contains(r))
                .map(|(_, a)| *a);
            for a in own_origin.iter().copied().chain(found) {
                let e = newest.entry(a.repo).or_insert(a);
                if a.created_at > e.created_at {
                    *e = a;
                }
            }
            let synced: BTreeMap<usize, Ours> = newest
                .into_iter()
                .filter(|(_, a)| a.own_origin || a.accepted)
                .map(|(r, a)| {
                    let ours = Ours {
                        relays: a.relays.clone(),
                        announcement: a.id,
                        on_own: a.own_origin,
                    };
                    (r, ours)
                })
                .collect();
            let next: BTreeSet<usize> = synced.values().flat_map(|o| o.relays.clone()).collect();
            if next == readable {
                return synced;
            }
            readable = next;
        }
        panic!("world {}: the model found no fixpoint", self.seed);
    }

    /// The own relay's events: the sink.
    fn sink(&self) -> HashSet<EventId> {
        self.sim.relays[&self.own]
            .events
            .iter()
            .map(|e| e.id)
            .collect()
    }

    /// The model's verdict on every event the remote relays hold: those
    /// the sink must hold (relay, event, why), and how many events there
    /// are in all.
    fn expected(
        &self,
        synced: &BTreeMap<usize, Ours>,
        sink: &HashSet<EventId>,
    ) -> (Vec<(usize, &Event, String)>, usize) {
        let coords: HashMap<&str, usize> = self
            .repos
            .iter()
            .enumerate()
            .map(|(i, r)| (r.coord.as_str(), i))
            .collect();
        let roots: HashMap<String, usize> = self
            .roots
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id.to_hex(), i))
            .collect();
        // A repo whose coordinate a strfry-like relay refuses cannot be
        // asked for there: nothing of it is expected from that relay.
        let askable = |repo: usize, r: usize| {
            self.repos[repo].coord.len() <= 255 || self.sim.relays[REMOTES[r]].value_bytes.is_none()
        };
        let on = |repo: usize, r: usize| {
            synced.get(&repo).is_some_and(|o| o.relays.contains(&r)) && askable(repo, r)
        };
        // Roots the engine must know: on the own relay, in the sink, or on
        // a relay of a repo of ours they name (Layer 2 brings them).
        let known: Vec<bool> = self
            .roots
            .iter()
            .map(|x| {
                x.own_origin
                    || sink.contains(&x.id)
                    || REMOTES.iter().enumerate().any(|(r, url)| {
                        self.sim.relays[*url].has(&x.id) && x.repos.iter().any(|&y| on(y, r))
                    })
            })
            .collect();
        let mut expected: Vec<(usize, &Event, String)> = Vec::new();
        let mut events = 0;
        for (r, url) in REMOTES.iter().enumerate() {
            for e in &self.sim.relays[*url].events {
                events += 1;
                let mut why = None;
                if e.kind.as_u16() == 30617 {
                    // A repo found only remotely: its announcement in force
                    // reaches the sink.
                    let found = self.anns.get(&e.id).and_then(|a| {
                        synced
                            .get(&a.repo)
                            .filter(|o| o.announcement == e.id && !o.on_own)
                            .filter(|_| synced.values().any(|o| o.relays.contains(&r)))
                            .map(|_| a.repo)
                    });
                    if let Some(y) = found {
                        expected.push((r, e, format!("announces repo {}", self.repos[y].d)));
                    }
                    continue;
                }
                if e.kind.as_u16() == 30618 {
                    let d = e.tags.identifier().unwrap_or_default();
                    if let Some((&y, _)) = synced.iter().find(|(y, o)| {
                        self.repos[**y].d == d && o.relays.contains(&r) && askable(**y, r)
                    }) {
                        why = Some(format!("state of repo {}", self.repos[y].d));
                    }
                }
                for t in e.tags.iter().map(|t| t.as_slice()) {
                    let (Some(name), Some(value)) = (t.first(), t.get(1)) else {
                        continue;
                    };
                    if matches!(name.as_str(), "a" | "A" | "q")
                        && let Some(&y) = coords.get(value.as_str())
                        && on(y, r)
                    {
                        why = Some(format!("tags repo {} ({name})", self.repos[y].d));
                    }
                    if matches!(name.as_str(), "e" | "E" | "q")
                        && let Some(&x) = roots.get(value)
                        && known[x]
                        && let Some(&y) = self.roots[x].repos.iter().find(|&&y| on(y, r))
                    {
                        why = Some(format!(
                            "tags root {} ({name}) of repo {}",
                            &value[..8],
                            self.repos[y].d
                        ));
                    }
                }
                if let Some(why) = why {
                    expected.push((r, e, why));
                }
            }
        }
        (expected, events)
    }

    fn check(&self, labels: &mut Vec<String>) -> (Tally, String) {
        let mut report = String::new();
        let synced = self.synced_repos();
        let sink = self.sink();
        let (expected, events) = self.expected(&synced, &sink);
        let missing: Vec<&(usize, &Event, String)> = expected
            .iter()
            .filter(|(_, e, _)| !sink.contains(&e.id))
            .collect();
        let ingested: HashSet<EventId> = self.sim.ingested.iter().map(|(_, e)| e.id).collect();
        let mut missing_ids: Vec<EventId> = missing.iter().map(|(_, e, _)| e.id).collect();
        missing_ids.sort_unstable();
        missing_ids.dedup();
        if !missing_ids.is_empty() {
            labels.push(format!(
                "loss: {} of {} expected events",
                missing_ids.len(),
                expected.len()
            ));
            let _ = writeln!(report, "missing (relay, event, kind, why, origin):");
            for (r, e, why) in missing.iter().take(20) {
                let _ = writeln!(
                    report,
                    "  {} {}{} kind {} t{:+} {why}; {}",
                    REMOTES[*r],
                    short(&e.id),
                    if ingested.contains(&e.id) {
                        " (ingested!)"
                    } else {
                        ""
                    },
                    e.kind.as_u16(),
                    e.created_at.as_secs() as i64 - T0 as i64,
                    self.origin.get(&e.id).map_or("?", String::as_str),
                );
            }
        }
        for (r, e, _) in missing.iter().take(2) {
            let _ = writeln!(
                report,
                "REQs on {} whose filter tags {}:",
                REMOTES[*r],
                short(&e.id)
            );
            for (sub, filters) in &self.sim.relays[REMOTES[*r]].reqs {
                for f in filters {
                    let mut bare = f.clone();
                    bare.since = None;
                    bare.until = None;
                    bare.limit = None;
                    if !bare.match_event(e, MatchEventOptions::new()) {
                        continue;
                    }
                    let _ = writeln!(
                        report,
                        "  {sub}: tags {:?} since {:?} until {:?} limit {:?} matches {}",
                        f.generic_tags
                            .keys()
                            .map(|k| k.as_char())
                            .collect::<Vec<_>>(),
                        f.since.map(|t| t.as_secs() as i64 - T0 as i64),
                        f.until.map(|t| t.as_secs() as i64 - T0 as i64),
                        f.limit,
                        f.match_event(e, MatchEventOptions::new())
                    );
                }
            }
        }
        let _ = writeln!(report, "model: repos ours at the end:");
        for (y, o) in &synced {
            let rs = &o.relays;
            if self.repos[*y].role == Role::Filler {
                continue;
            }
            let _ = writeln!(
                report,
                "  {} ({:?}) on {:?}",
                self.repos[*y].d,
                self.repos[*y].role,
                rs.iter().map(|&r| REMOTES[r]).collect::<Vec<_>>()
            );
        }
        let engine = &self.sim.engine;
        let stats = engine.stats();
        let _ = writeln!(
            report,
            "engine: ingested {} duplicate {} unwanted {} refusals {} consolidations {} offences {:?} penalties {}",
            stats.events_ingested,
            stats.events_duplicate,
            stats.events_unwanted,
            stats.refusals,
            stats.consolidations,
            stats.offences,
            stats.penalties
        );
        for url in REMOTES {
            if let Some(id) = engine.relay_id(url) {
                let _ = writeln!(
                    report,
                    "  {url}: {:?} {:?} subs {} value refusals {}",
                    engine.relay_status(id),
                    engine.item_counts(id),
                    engine.open_subscriptions(id),
                    self.sim.relays[url].value_refusals
                );
            }
        }
        // (2) No honest relay is punished.
        if stats.penalties > 0 {
            labels.push(format!("penalties: {}", stats.penalties));
        }
        if stats.offences.iter().any(|&n| n > 0) {
            let outside_only = stats
                .offences
                .iter()
                .enumerate()
                .all(|(i, &n)| n == 0 || i == Offence::OutsideFilter as usize);
            if !(outside_only && self.avoid.move_bursts) {
                labels.push(format!("offences: {:?}", stats.offences));
            }
        }
        // (3) Nothing reaches the sink twice.
        let mut counts: HashMap<EventId, usize> = HashMap::new();
        for (_, e) in &self.sim.ingested {
            *counts.entry(e.id).or_default() += 1;
        }
        let twice = counts.values().filter(|&&n| n > 1).count();
        if twice > 0 {
            labels.push(format!("duplicates: {twice} events ingested twice"));
        }
        // (4) GRASP-01: no remote announcement reaches the sink unless it
        // lists the service in relays and clone.
        let bad: Vec<String> = self
            .sim
            .ingested
            .iter()
            .filter(|(_, e)| self.anns.get(&e.id).is_some_and(|a| !a.accepted))
            .map(|(url, e)| format!("{} from {url}", short(&e.id)))
            .collect();
        if !bad.is_empty() {
            labels.push(format!(
                "grasp01: announcements without the service passed on: {bad:?}"
            ));
        }
        // A withdrawn repo is no target anywhere.
        for (y, repo) in self.repos.iter().enumerate() {
            if repo.role != Role::Withdrawn || synced.contains_key(&y) {
                continue;
            }
            let key = ItemKey::Repo(repo.coord.clone());
            let still: Vec<&str> = engine
                .relays()
                .filter(|&id| engine.item_state(id, &key).is_some())
                .map(|id| engine.relay_url(id))
                .collect();
            if !still.is_empty() {
                labels.push(format!(
                    "withdrawal: repo {} still a target on {still:?}",
                    repo.d
                ));
            }
        }
        // (5) The own relay is never a sync target under any of its names.
        let own_names: BTreeSet<&str> = self
            .sim
            .connects
            .iter()
            .map(|(_, url)| url.as_str())
            .filter(|url| *url != self.own && host_of(url) == DOMAIN)
            .collect();
        if !own_names.is_empty() {
            labels.push(format!(
                "own-names: connects to the own relay as {own_names:?}"
            ));
        }
        // (7) Every relay of ours is connected with everything confirmed.
        let ours: BTreeSet<usize> = synced.values().flat_map(|o| o.relays.clone()).collect();
        for r in ours {
            let url = REMOTES[r];
            let Some(id) = engine.relay_id(url) else {
                labels.push(format!("unsettled: {url} unknown to the engine"));
                continue;
            };
            let counts = engine.item_counts(id);
            if engine.relay_status(id) != Status::Connected || counts.queued + counts.pending > 0 {
                labels.push(format!(
                    "unsettled: {url} is {:?} with {counts:?}",
                    engine.relay_status(id)
                ));
            }
        }
        if let Err(e) = engine.check_invariants() {
            labels.push(format!("invariant: {e}"));
        }
        let tally = Tally {
            expected: expected.len(),
            events,
            ingested: self.sim.ingested.len(),
        };
        let _ = writeln!(
            report,
            "{} events on remote relays, {} expected in the sink, {} ingested",
            tally.events, tally.expected, tally.ingested
        );
        (tally, report)
    }
}

/// `ev` signed again with another `created_at`.
/// The sim's own-relay listing mode that leaves every `n`th request
/// unanswered, or refuses it (the oracle's own `Listing` enum is about
/// announcements).
fn sim_listing(n: usize, refuses: bool) -> grasp_sync::testing::sim::Listing {
    match refuses {
        true => grasp_sync::testing::sim::Listing::Refusing(n),
        false => grasp_sync::testing::sim::Listing::Flaky(n),
    }
}

fn resign_at(k: &Keys, ev: &Event, created_at: u64) -> Event {
    sign(
        k,
        ev.kind.as_u16(),
        created_at,
        ev.tags.iter().cloned().collect(),
        &ev.content,
    )
}

fn short(id: &EventId) -> String {
    id.to_hex()[..10].to_owned()
}

fn show_cap(cap: usize) -> String {
    if cap == usize::MAX {
        "none".into()
    } else {
        cap.to_string()
    }
}

/// The host of a normalized relay URL, without port.
fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    authority.split(':').next().unwrap_or(authority)
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs worlds `first..first + count` on a few threads; returns the
/// failures by seed.
/// The message a panic carries.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

fn run_worlds(first: u64, count: u64, avoid: Avoid, verbose: bool) -> Vec<(u64, Failure)> {
    let threads = env_u64(
        "ORACLE_THREADS",
        std::thread::available_parallelism().map_or(2, |n| n.get() as u64),
    )
    .clamp(1, 64);
    let next = Mutex::new(first);
    let failures = Mutex::new(Vec::new());
    let tallies = Mutex::new(Tally::default());
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let seed = {
                        let mut n = next.lock().unwrap();
                        if *n >= first + count {
                            return;
                        }
                        *n += 1;
                        *n - 1
                    };
                    let steps = 40 + (seed % 61) as usize;
                    let outcome = catch_unwind(AssertUnwindSafe(|| {
                        World::new(seed, avoid).run(steps, verbose)
                    }));
                    let failure = match outcome {
                        Ok(Ok(t)) => {
                            let mut all = tallies.lock().unwrap();
                            all.expected += t.expected;
                            all.events += t.events;
                            all.ingested += t.ingested;
                            continue;
                        }
                        Ok(Err(f)) => f,
                        Err(panic) => Failure {
                            labels: vec![format!("panic: {}", panic_text(&*panic))],
                            report: String::new(),
                        },
                    };
                    eprintln!("world {seed} FAILED: {}", failure.labels.join("; "));
                    failures.lock().unwrap().push((seed, failure));
                }
            });
        }
    });
    let t = tallies.into_inner().unwrap();
    let mut failures = failures.into_inner().unwrap();
    failures.sort_by_key(|(seed, _)| *seed);
    eprintln!(
        "oracle: {count} worlds from seed {first} in {:.1?}: {} failed; passing worlds held {} events on remote relays, {} expected in the sink, {} ingested",
        started.elapsed(),
        failures.len(),
        t.events,
        t.expected,
        t.ingested
    );
    failures
}

#[test]
fn no_event_is_lost_in_random_worlds() {
    let first = env_u64("ORACLE_SEED", 0);
    let count = env_u64("ORACLE_WORLDS", 20);
    let verbose = std::env::var("ORACLE_VERBOSE").is_ok_and(|v| v != "0");
    let avoid = Avoid::from_env();
    if std::env::var("RUST_LOG").is_ok() {
        let _ = env_logger::builder().is_test(true).try_init();
    }
    let failures = run_worlds(first, count, avoid, verbose);
    let shown = if count <= 50 || verbose {
        usize::MAX
    } else {
        3
    };
    for (seed, f) in failures.iter().take(shown) {
        eprintln!("==== world {seed}: {}\n{}", f.labels.join("; "), f.report);
    }
    let mut by_label: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (seed, f) in &failures {
        for l in &f.labels {
            let kind = l.split(':').next().unwrap_or(l).to_owned();
            by_label.entry(kind).or_default().push(*seed);
        }
    }
    for (kind, seeds) in &by_label {
        eprintln!("  {kind}: {} worlds, seeds {seeds:?}", seeds.len());
    }
    assert!(
        failures.is_empty(),
        "{} of {count} worlds failed (seeds {:?}); replay one with ORACLE_SEED=<seed> ORACLE_WORLDS=1 ORACLE_VERBOSE=1",
        failures.len(),
        failures.iter().map(|(s, _)| *s).collect::<Vec<_>>()
    );
}

/// World 180 (found by the timeliness check): a consolidation ran while a
/// batch was pending whose chunk for the anchor repo waited between pages,
/// in no open page; the consolidation then counted the relay covered, the
/// batch confirmed later, and the repo had no live filter on that relay
/// until it reconnected hours later. A live comment on it was late.
#[test]
fn a_batch_confirmed_after_a_consolidation_gets_live_coverage() {
    let seed = 180;
    let outcome = World::new(seed, Avoid::default()).run(40 + (seed % 61) as usize, false);
    if let Err(f) = outcome {
        panic!("world {seed}: {}\n{}", f.labels.join("; "), f.report);
    }
}

/// World 20229 (the long run from seed 20000): a relay back after an hour
/// down got a fresh sync whose Layer 1 read from the beginning was replaced
/// at once, before its EOSE, by a consolidated live set reading from 15
/// minutes back; the announcement published while it was down was never
/// read, nor what tagged its repo. The engine's hash maps order a few
/// things differently from run to run and the world failed about two runs
/// in three, so it runs five times.
#[test]
fn a_fresh_sync_replaced_before_eose_still_reads_layer_1_from_the_beginning() {
    let seed = 20229;
    for _ in 0..5 {
        let outcome = World::new(seed, Avoid::default()).run(40 + (seed % 61) as usize, false);
        if let Err(f) = outcome {
            panic!("world {seed}: {}\n{}", f.labels.join("; "), f.report);
        }
    }
}
