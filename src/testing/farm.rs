//! Many simulated NIP-01 relays on `127.0.0.1`, served by one thread: the
//! remote relays of `grasp-sync demo --relays N` and of scale tests.
//!
//! Each relay of a [`RelayFarm`] has its own listener (its own port), its
//! own store and its own connections, and behaves exactly like a
//! [`TestRelay`]: the storage rules and `REQ` answers are the same code
//! ([`Store`]), client `EVENT`s are verified, stored and acknowledged with
//! `OK`, a `REQ` gets the stored matches (newest first, per-filter limits,
//! an optional cap), `EOSE`, then live deliveries; subscriptions over a
//! per-connection limit are refused the same two ways; garbage gets a
//! `NOTICE`. Tests and the demo seed relays, publish live events, restart
//! relays (cut connections, refuse new ones for a while, then serve the same
//! store on the same port) and read counters.
//!
//! Two options make the relays behave like the ones the engine meets
//! today, so the demo shows it coping: [`FarmOptions::negentropy`] answers
//! NIP-77 `NEG-OPEN`/`NEG-MSG`/`NEG-CLOSE` as rust-nostr's relays do (see
//! `neg`), and [`FarmOptions::auth_required`] makes chosen relays serve
//! reads only after NIP-42 AUTH (see `auth`). Both are off by default:
//! without them a relay answers `NEG-OPEN` with an "unsupported" `NOTICE`
//! and never challenges, like most relays. [`FarmOptions::profiles`] limits
//! chosen relays the way khatru relays over eventstore's SQL backends are
//! limited (see [`crate::testing::limits`]): results capped per filter,
//! filters with too many values refused, a NIP-11 document published; or
//! makes them answer like strfry ([`RelayProfile::strfry`]).
//! [`FarmOptions::links`] puts chosen relays behind a network [`Link`] of
//! some round-trip time (and bandwidth), so a test on loopback meets the
//! latency real relays sit behind and can count round trips (issue 46):
//! every byte both ways is held half the round trip, handshakes included,
//! by the farm's timers, never by sleeping (see `link`).
//!
//! # Why one mio thread
//!
//! Scale. [`TestRelay`] spends two threads per relay and polls every 10 ms;
//! a demo against 5,000 relays cannot afford that. The farm runs a single
//! `mio::Poll` on one helper thread for every listener and connection:
//! readiness is edge-triggered and each event is drained until
//! `WouldBlock`, so work is proportional to traffic. When nothing is
//! scheduled (a restart or a handshake deadline) the thread blocks in
//! `poll` without a timeout, so an idle farm costs no CPU. An idle relay
//! without a connection costs a listening socket and a small struct; a
//! connection costs a few KiB (tungstenite reads through a 4 KiB buffer and
//! writes each frame straight to the socket).
//!
//! It is not the engine's event loop and shares no code with it; like the
//! rest of [`crate::testing`] it is the other side of the wire.
//!
//! Commands from the [`RelayFarm`] handle reach the thread over a channel
//! plus a [`mio::Waker`]; blocking calls ([`seed`](RelayFarm::seed),
//! [`count_present`](RelayFarm::count_present)) wait for the answer on a
//! one-shot channel. Counters are atomics, cheap to read from any thread.
//!
//! Writes never block the thread. Replies and live events wait in a
//! per-connection queue and are handed to tungstenite one frame at a time
//! while the socket takes them; the stored results of a `REQ` wait as keys
//! into the store and are serialized as they leave, so a large answer costs
//! little memory and a slow reader is simply fed on writability. A client
//! that lets more than 8 MiB of replies and live events pile up is
//! disconnected, as a real relay would.
//!
//! # File descriptors
//!
//! A farm of N relays holds N listening sockets plus one socket per client
//! connection (and the clients hold their ends too, when in the same
//! process). The default soft limit is often 1,024; raising it is the
//! caller's business. [`RelayFarm::start`] reports a failing bind (e.g.
//! `EMFILE`) as an error naming the relay.
//!
//! # Files
//!
//! This file holds the handle, its options and the thread's loop (commands,
//! timers, readiness); `conn` what is kept per relay and per connection;
//! `connections` listening, accepting, restarting and closing; `http` plain
//! HTTP (NIP-11) before the handshake; `protocol` the answers to nostr
//! messages and live delivery; `auth` and `neg` NIP-42 and NIP-77; `link`
//! the round-trip time and bandwidth of [`Link`]s; `port` a
//! restarted relay's port while it is down. `strfry` answers for relays
//! that behave like strfry ([`RelayProfile::strfry`]), reading messages
//! with `strfry_req` and checking events with `strfry_event`.
//!
//! [`TestRelay`]: crate::testing::relay::TestRelay

mod auth;
mod conn;
mod connections;
mod http;
mod link;
mod neg;
mod port;
mod protocol;
mod strfry;
mod strfry_event;
mod strfry_req;

pub use super::limits::StrfryLimits;
pub use link::Link;

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use nostr::prelude::{
    ClientMessage, Event, EventId, Filter, MatchEventOptions, RelayMessage, SubscriptionId,
    Timestamp,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustls::{ServerConfig, ServerConnection, StreamOwned};
use slab::Slab;
use tungstenite::protocol::WebSocketConfig;
use tungstenite::{HandshakeError, Message};

use crate::shell::tls::MaybeTls;

use auth::challenge;
use conn::{Conn, Listen, Out, OwnClient, Phase, Relay, Socket, Stream, would_block};
use neg::{NegSessions, neg_err};

use super::limits::{
    HttpHead, Limitation, MAX_HEAD, ValueCapRefusal, ValueCaps, classify_http, nip11_document,
    nip11_response,
};
use super::relay::{MAX_SUBS_NOTICE, PARSE_ERROR, Refuse, TOO_MANY_REQS};
use super::store::{Store, Stored};

/// The reason a read is refused for want of NIP-42 AUTH.
const AUTH_REQUIRED: &str = "auth-required: this relay serves authenticated clients only";

/// tungstenite's read buffer per connection.
const READ_BUFFER: usize = 4 * 1024;

/// Most bytes tungstenite may hold unsent for one connection. The farm
/// hands it one frame at a time, so this only bounds a single huge frame.
const MAX_WRITE_BUFFER: usize = 8 * 1024 * 1024;

/// Most bytes of replies and live events queued for one connection before
/// it is disconnected as too slow.
const MAX_QUEUED: usize = 8 * 1024 * 1024;

/// A client that has not finished the (TLS and) websocket handshake by then
/// is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Delay before retrying a failed accept or a failed re-bind after a
/// restart (e.g. out of file descriptors).
const RETRY: Duration = Duration::from_millis(100);

/// Readiness events taken per `poll` call.
const EVENTS_PER_POLL: usize = 1024;

// ---------------------------------------------------------------- tokens
//
// A token is [listener flag | generation | index]. The index is a relay
// number (listeners) or a slab key (connections); the generation tells a
// stale event (for a listener closed by a restart, or a connection whose
// slot was reused) from a current one.

/// Bits for the index: the low half of a token.
const INDEX_BITS: u32 = usize::BITS / 2;
/// Largest index plus one; index `INDEX_LIMIT` itself is never used, so no
/// token equals [`WAKER`].
const INDEX_LIMIT: usize = (1 << INDEX_BITS) - 1;
/// Generations use the high half of a token but its top bit.
const GEN_MASK: u32 = ((1u64 << (INDEX_BITS - 1)) - 1) as u32;
/// The top bit marks listeners.
const LISTENER_BIT: usize = 1 << (usize::BITS - 1);
/// The command channel's waker.
const WAKER: Token = Token(usize::MAX);

fn listener_token(relay: usize, generation: u32) -> Token {
    Token(LISTENER_BIT | ((generation & GEN_MASK) as usize) << INDEX_BITS | relay)
}

fn conn_token(key: usize, generation: u32) -> Token {
    Token(((generation & GEN_MASK) as usize) << INDEX_BITS | key)
}

/// What a token names.
enum Target {
    Listener { relay: usize, generation: u32 },
    Conn { key: usize, generation: u32 },
}

fn decode(token: Token) -> Target {
    let index = token.0 & INDEX_LIMIT;
    // Masked to at most 31 bits: the cast cannot truncate.
    let generation = ((token.0 >> INDEX_BITS) & GEN_MASK as usize) as u32;
    if token.0 & LISTENER_BIT != 0 {
        Target::Listener {
            relay: index,
            generation,
        }
    } else {
        Target::Conn {
            key: index,
            generation,
        }
    }
}

// ---------------------------------------------------------------- API

/// How the relays of a [`RelayFarm`] behave (all alike).
#[derive(Debug, Clone, Default)]
pub struct FarmOptions {
    /// Most stored events returned for one `REQ`, all its filters together,
    /// as real relays cap results (typically at 500). Default: no cap.
    pub max_results_per_req: Option<usize>,
    /// Most open subscriptions per connection, and how a `REQ` over that
    /// limit is refused (the subscription is then not opened). Reusing an
    /// open subscription id replaces it and is never refused. Default: none.
    pub max_subscriptions: Option<(usize, Refuse)>,
    /// Serve `wss://` with this TLS configuration (see
    /// [`server_tls_config`](crate::testing::relay::server_tls_config));
    /// the certificate should be for `localhost`. Default: plain `ws://`.
    pub tls: Option<Arc<ServerConfig>>,
    /// Answer NIP-77 negentropy (frames of at most 60,000 bytes, at most 64
    /// sessions per connection). Default: off, `NEG-OPEN` gets the
    /// "unsupported message" `NOTICE` most relays send today. strfry relays
    /// ([`RelayProfile::strfry`]) answer it either way, as strfry does.
    pub negentropy: bool,
    /// Relays (by number) that serve reads only after NIP-42 AUTH: each
    /// connection is challenged as it opens, and `REQ` (`CLOSED`) and
    /// `NEG-OPEN` (`NEG-ERR`) are refused with `auth-required:` until a
    /// valid kind 22242 event for the challenge arrives. Writes (`EVENT`)
    /// are served either way. Numbers out of range are ignored. Default:
    /// none.
    pub auth_required: Vec<usize>,
    /// Relays (by number) limited beyond the options above, each its own
    /// way (see [`RelayProfile`]); a number listed twice takes the last.
    /// Numbers out of range are ignored. Default: none.
    pub profiles: Vec<(usize, RelayProfile)>,
    /// Relays (by number) behind a network link of some round-trip time
    /// and bandwidth (see [`Link`]), so tests on loopback meet the latency
    /// of relays in the wild and can count round trips; a number listed
    /// twice takes the last, numbers out of range are ignored. Default:
    /// none, every relay straight on loopback.
    pub links: Vec<(usize, Link)>,
}

/// How one relay of a farm is limited beyond the farm-wide [`FarmOptions`],
/// as relays in the wild are (khatru over eventstore's SQL backends: 100
/// results per filter, 10 tag values and kinds per filter, no NIP-77 by
/// default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayProfile {
    /// Most stored events returned per filter: each filter gets its
    /// `min(limit, cap)` newest matches. `None`: no per-filter cap.
    pub max_results_per_filter: Option<usize>,
    /// Refuse filters over these caps (see [`ValueCaps`]).
    pub value_caps: Option<ValueCaps>,
    /// Serve a NIP-11 document (plain `ws://` only) whose `limitation`
    /// names the per-filter cap (or the farm's per-`REQ` cap) and the
    /// subscription limit.
    pub nip11: bool,
    /// Answer `NEG-OPEN` with the "unsupported" `NOTICE` even when the
    /// farm speaks NIP-77 (khatru's `Negentropy` is off by default).
    pub no_negentropy: bool,
    /// Answer an `EVENT` whose event is longer than this (as JSON) with a
    /// `NOTICE` naming no event and no `OK`, as nostr-rs-relay does past
    /// its `max_event_bytes`: the own-relay fault
    /// [`Fault::LargeEventNotice`](crate::testing::fault::Fault::LargeEventNotice)
    /// in a farm relay, for `demo --chaos`. `None`: any size is taken.
    pub max_event_bytes: Option<usize>,
    /// Answer like strfry (f8a56a8) with these limits, because strfry is
    /// among the relays the engine meets and its limits and texts differ
    /// from the farm's default everywhere a client can tell (see
    /// [`StrfryLimits`] and [`RelayProfile::strfry`]). `None`: the farm's
    /// default answers. With it, the fields above but `no_negentropy` are
    /// ignored, and so are the farm-wide `max_results_per_req` and
    /// `max_subscriptions` (strfry has its own); `no_negentropy` is
    /// strfry's `relay.negentropy.enabled = false`.
    pub strfry: Option<StrfryLimits>,
    /// Leave Nagle's algorithm on, as relays on tokio and tungstenite do
    /// (rust-nostr's LocalRelay and relay builder, nostr-rs-relay): the
    /// tail of an answer waits until what went before it is
    /// acknowledged, so a client that delays its ACKs pays for it.
    /// `false`: replies go at once (strfry, and Go's khatru, set
    /// `TCP_NODELAY`).
    pub nagle: bool,
}

impl RelayProfile {
    /// A relay that behaves like strfry f8a56a8 with its default
    /// configuration, as a raw client sees it:
    ///
    /// - a filter's `limit` clamped to 500, silently; filters answered one
    ///   after another, an event two filters match sent once but counted
    ///   toward both limits; `since`/`until` inclusive;
    /// - a `REQ` of more than 200 filters, a filter with more than 3 tag
    ///   letters, a tag value over 255 bytes, an `#e`/`#p` value not 64
    ///   hex digits (and other filters strfry cannot read) refused whole:
    ///   `CLOSED "ERROR: bad req: ..."`, with strfry's text;
    /// - at most 200 REQs scanning, 200 live REQs (counted at their EOSE)
    ///   and 200 NIP-77 sessions per connection, refused by
    ///   `NOTICE "ERROR: too many concurrent REQs"` or `"ERROR: too many
    ///   concurrent NEG requests"`;
    /// - every `CLOSED` and `NOTICE` text starts with `ERROR: `;
    /// - a websocket message or frame over 131,072 bytes drops the
    ///   connection;
    /// - NIP-11 on plain `ws://` for `Accept: application/nostr+json`
    ///   exactly (any other plain `GET` gets a landing page), naming
    ///   `max_message_length`, `max_subscriptions`, `max_limit`,
    ///   `negentropy: 1` and strfry's `software`;
    /// - NIP-77 answered whatever [`FarmOptions::negentropy`] says (500,000
    ///   byte frames), refused past 1,000,000 events;
    /// - events over 65,536 bytes of JSON, over 3 years old or over 15
    ///   minutes ahead (of the wall clock) refused with `OK false
    ///   "invalid: ..."`.
    ///
    /// The numbers are [`StrfryLimits::default`]; set `strfry` to other
    /// limits to reach one cheaply.
    pub fn strfry() -> RelayProfile {
        RelayProfile {
            strfry: Some(StrfryLimits::default()),
            ..RelayProfile::default()
        }
    }

    /// True if the relay answers plain HTTP on its port (NIP-11, and
    /// strfry's landing page), so connections are peeked at first.
    fn serves_http(&self) -> bool {
        self.nip11 || self.strfry.is_some()
    }
}

/// Counters over the whole farm, since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FarmStats {
    /// Client connections open now, counted from TCP accept.
    pub connections: usize,
    /// Websocket connections open now that came through
    /// [`RelayFarm::own_url`]: this farm's own clients. On a busy machine
    /// a client of another test run can reach one of the farm's
    /// OS-picked ports (its relay was on that port before); it is in
    /// `connections` but not here, so tests that count their clients
    /// count this.
    pub own_connections: usize,
    /// `REQ`s received, refused ones included.
    pub reqs: u64,
    /// `EVENT`s received from clients, invalid ones included.
    pub events_received: u64,
    /// Events from clients that were new and stored (not duplicates, not
    /// stale versions, not ephemeral; seeded and published ones are not
    /// counted).
    pub events_stored: u64,
    /// Bytes written to client sockets (websocket frames, and TLS records
    /// when serving `wss://`).
    pub bytes_out: u64,
    /// `NEG-OPEN`s answered with a `NEG-MSG` (a reconciliation started).
    pub neg_sessions: u64,
    /// `NEG-MSG`s answered with a `NEG-MSG` (rounds after the first).
    pub neg_rounds: u64,
    /// `NEG-ERR`s sent (refused for want of AUTH, bad frames, unknown or
    /// too many sessions).
    pub neg_errors: u64,
    /// AUTH events accepted (`OK true`).
    pub auth_accepted: u64,
    /// AUTH events rejected (`OK false`).
    pub auth_rejected: u64,
    /// Reads (`REQ`, `NEG-OPEN`) refused with `auth-required:`.
    pub auth_refusals: u64,
    /// Filters refused for a value cap (see [`RelayProfile::value_caps`]).
    pub value_refusals: u64,
    /// NIP-11 documents served.
    pub info_served: u64,
    /// `REQ` filters whose stored answer a per-filter cap cut short (it
    /// matched more events than the cap let through).
    pub capped_filters: u64,
    /// `EVENT`s answered with a size `NOTICE` and no `OK` (see
    /// [`RelayProfile::max_event_bytes`]).
    pub events_too_large: u64,
}

/// The counters behind [`FarmStats`], shared with the farm thread.
#[derive(Debug, Default)]
struct Counters {
    connections: AtomicUsize,
    own_connections: AtomicUsize,
    reqs: AtomicU64,
    events_received: AtomicU64,
    events_stored: AtomicU64,
    bytes_out: AtomicU64,
    neg_sessions: AtomicU64,
    neg_rounds: AtomicU64,
    neg_errors: AtomicU64,
    auth_accepted: AtomicU64,
    auth_rejected: AtomicU64,
    auth_refusals: AtomicU64,
    value_refusals: AtomicU64,
    info_served: AtomicU64,
    capped_filters: AtomicU64,
    events_too_large: AtomicU64,
}

/// A request to the farm thread.
enum Command {
    Seed {
        relay: usize,
        events: Vec<Event>,
        done: Sender<()>,
    },
    Publish {
        relay: usize,
        event: Event,
    },
    Restart {
        relay: usize,
        down_for: Duration,
    },
    CountPresent {
        relay: usize,
        ids: Vec<EventId>,
        reply: Sender<usize>,
    },
    Unfinished {
        bytes: usize,
    },
    Stop,
}

/// Many NIP-01 relays on `127.0.0.1`, each on its own port, served by one
/// thread until [`stop`](RelayFarm::stop) or drop.
///
/// Relays are numbered `0..len()`; every method taking a relay number
/// panics if it is out of range, like slice indexing.
pub struct RelayFarm {
    ports: Vec<u16>,
    /// The secret of [`RelayFarm::own_url`].
    token: Arc<str>,
    tls: bool,
    commands: Sender<Command>,
    waker: Waker,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RelayFarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayFarm")
            .field("relays", &self.ports.len())
            .field("tls", &self.tls)
            .field("stats", &self.stats())
            .finish()
    }
}

impl RelayFarm {
    /// Binds `count` listeners on `127.0.0.1:0` (each relay gets a free
    /// port) and starts the farm thread. Every relay starts empty.
    ///
    /// Needs `count` file descriptors, plus one per client connection
    /// later; a bind that fails (e.g. `EMFILE`, too many open files) is
    /// returned with the relay number and the advice to raise the limit.
    pub fn start(count: usize, opts: FarmOptions) -> io::Result<RelayFarm> {
        if count >= INDEX_LIMIT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a relay farm holds fewer than {INDEX_LIMIT} relays"),
            ));
        }
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let mut relays = Vec::with_capacity(count);
        let mut ports = Vec::with_capacity(count);
        for i in 0..count {
            let mut listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
                .map_err(|e| bind_error(i, count, e))?;
            let port = listener.local_addr()?.port();
            poll.registry()
                .register(&mut listener, listener_token(i, 0), Interest::READABLE)?;
            let profile = opts
                .profiles
                .iter()
                .rev()
                .find(|(n, _)| *n == i)
                .map(|(_, p)| p.clone())
                .unwrap_or_default();
            let link = opts
                .links
                .iter()
                .rev()
                .find(|(n, _)| *n == i)
                .map(|(_, l)| *l)
                .unwrap_or_default();
            relays.push(Relay {
                port,
                profile,
                link,
                auth: opts.auth_required.contains(&i),
                listen: Listen::Open(listener),
                generation: 0,
                store: Store::new(),
                conns: Vec::new(),
            });
            ports.push(port);
        }
        let (commands, inbox) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let ws_config = WebSocketConfig::default()
            .read_buffer_size(READ_BUFFER)
            .write_buffer_size(0)
            .max_write_buffer_size(MAX_WRITE_BUFFER);
        let tls = opts.tls.is_some();
        let token: Arc<str> = format!("{:016x}", SmallRng::from_entropy().r#gen::<u64>()).into();
        let farm = Farm {
            poll,
            relays,
            conns: Slab::new(),
            timers: BinaryHeap::new(),
            commands: inbox,
            cap: opts.max_results_per_req.unwrap_or(usize::MAX),
            max_subscriptions: opts.max_subscriptions,
            negentropy: opts.negentropy,
            tls: opts.tls,
            ws_config,
            counters: Arc::clone(&counters),
            next_generation: 0,
            rng: SmallRng::from_entropy(),
            token: Arc::clone(&token),
        };
        let thread = thread::Builder::new()
            .name("relay-farm".to_owned())
            .spawn(move || farm.run())?;
        Ok(RelayFarm {
            ports,
            token,
            tls,
            commands,
            waker,
            counters,
            thread: Some(thread),
        })
    }

    /// Number of relays.
    pub fn len(&self) -> usize {
        self.ports.len()
    }

    /// True for a farm of no relays.
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty()
    }

    /// The port relay `relay` listens on (the same after a restart).
    pub fn port(&self, relay: usize) -> u16 {
        self.check(relay);
        self.ports[relay]
    }

    /// Relay `relay`'s URL: `ws://127.0.0.1:PORT`, or `wss://localhost:PORT`
    /// when serving TLS (certificates are for `localhost`).
    pub fn url(&self, relay: usize) -> String {
        let port = self.port(relay);
        if self.tls {
            format!("wss://localhost:{port}")
        } else {
            format!("ws://127.0.0.1:{port}")
        }
    }

    /// Relay `relay`'s URL with this farm's secret in the query
    /// (`/?farm=...`): connections made through it are counted in
    /// [`FarmStats::own_connections`], stray ones are not.
    pub fn own_url(&self, relay: usize) -> String {
        format!("{}/?farm={}", self.url(relay), self.token)
    }

    /// Stores `events` in relay `relay` without delivering them live (for
    /// seeding before clients connect), by the usual rules (duplicates and
    /// stale versions are ignored); trusted, not verified. Blocks until
    /// they are stored.
    pub fn seed(&self, relay: usize, events: Vec<Event>) {
        self.check(relay);
        let (done, wait) = mpsc::channel();
        if self.send(Command::Seed {
            relay,
            events,
            done,
        }) {
            // An error means the farm thread is gone; there is nothing to
            // wait for.
            let _ = wait.recv();
        }
    }

    /// Stores `event` in relay `relay` (trusted, not verified) and delivers
    /// it live to the matching open subscriptions of that relay's
    /// connections, unless it was already stored or is a stale version.
    /// Ephemeral kinds are delivered but not stored. Returns at once.
    pub fn publish(&self, relay: usize, event: Event) {
        self.check(relay);
        self.send(Command::Publish { relay, event });
    }

    /// Cuts relay `relay`'s connections (TCP shutdown, no close frame) and
    /// stops listening, so connecting is refused (the port stays the
    /// relay's meanwhile); after `down_for` it listens again on the same
    /// port with the same store. Restarting a
    /// relay that is down starts its downtime over. Returns at once.
    pub fn restart(&self, relay: usize, down_for: Duration) {
        self.check(relay);
        self.send(Command::Restart { relay, down_for });
    }

    /// How many of `ids` relay `relay` stores (duplicates in `ids` count
    /// each time). Blocks for the answer; costs a copy of `ids` and one
    /// hash lookup per id. 0 if the farm thread is gone.
    pub fn count_present(&self, relay: usize, ids: &[EventId]) -> usize {
        self.check(relay);
        let (reply, answer) = mpsc::channel();
        let sent = self.send(Command::CountPresent {
            relay,
            ids: ids.to_vec(),
            reply,
        });
        if sent { answer.recv().unwrap_or(0) } else { 0 }
    }

    /// Every open connection sends the first fragment (no FIN) of a text
    /// message of `bytes` bytes and an unsolicited pong, then nothing but
    /// control frames ([`Fault::NeverFinished`], on the whole farm: the
    /// demo measures what unfinished messages cost). Returns at once.
    ///
    /// [`Fault::NeverFinished`]: super::fault::Fault::NeverFinished
    pub fn send_unfinished(&self, bytes: usize) {
        self.send(Command::Unfinished { bytes });
    }

    /// The farm's counters (atomic loads; cheap, callable from any thread).
    pub fn stats(&self) -> FarmStats {
        let c = &self.counters;
        FarmStats {
            connections: c.connections.load(Ordering::Relaxed),
            own_connections: c.own_connections.load(Ordering::Relaxed),
            reqs: c.reqs.load(Ordering::Relaxed),
            events_received: c.events_received.load(Ordering::Relaxed),
            events_stored: c.events_stored.load(Ordering::Relaxed),
            bytes_out: c.bytes_out.load(Ordering::Relaxed),
            neg_sessions: c.neg_sessions.load(Ordering::Relaxed),
            neg_rounds: c.neg_rounds.load(Ordering::Relaxed),
            neg_errors: c.neg_errors.load(Ordering::Relaxed),
            auth_accepted: c.auth_accepted.load(Ordering::Relaxed),
            auth_rejected: c.auth_rejected.load(Ordering::Relaxed),
            auth_refusals: c.auth_refusals.load(Ordering::Relaxed),
            value_refusals: c.value_refusals.load(Ordering::Relaxed),
            info_served: c.info_served.load(Ordering::Relaxed),
            capped_filters: c.capped_filters.load(Ordering::Relaxed),
            events_too_large: c.events_too_large.load(Ordering::Relaxed),
        }
    }

    /// Stops the farm: cuts every connection, closes every listener and
    /// waits for the thread. Dropping the farm does the same.
    pub fn stop(mut self) {
        self.shutdown();
    }

    /// Idempotent: the thread handle is taken on the first call.
    fn shutdown(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        if self.send(Command::Stop) && thread.join().is_err() {
            log::error!("relay farm thread panicked");
        }
    }

    fn check(&self, relay: usize) {
        assert!(
            relay < self.ports.len(),
            "relay {relay} out of range: the farm has {} relays",
            self.ports.len()
        );
    }

    /// Sends a command and wakes the thread; false if the thread is gone.
    fn send(&self, command: Command) -> bool {
        if self.commands.send(command).is_err() {
            log::error!("relay farm thread is gone");
            return false;
        }
        if let Err(e) = self.waker.wake() {
            log::error!("relay farm: cannot wake the thread: {e}");
        }
        true
    }
}

impl Drop for RelayFarm {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn bind_error(relay: usize, count: usize, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!(
            "binding relay {relay} of {count} on 127.0.0.1: {e} (a farm of N relays needs N \
             file descriptors plus one per connection; raise the open-file limit)"
        ),
    )
}

// ---------------------------------------------------------------- state

/// Something scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// Listen again after a restart (or retry binding), and accept what is
    /// pending (or retry a failed accept), if the relay's generation still
    /// matches.
    Listen { relay: usize, generation: u32 },
    /// Drop the connection if it is still handshaking.
    Handshake { key: usize, generation: u32 },
    /// Bytes a [`Link`] held are due: drive the connection, if this is
    /// still its armed timer.
    Link {
        key: usize,
        generation: u32,
        at: Instant,
    },
}

/// The farm thread's state.
struct Farm {
    poll: Poll,
    relays: Vec<Relay>,
    conns: Slab<Conn>,
    timers: BinaryHeap<Reverse<(Instant, Timer)>>,
    commands: Receiver<Command>,
    cap: usize,
    max_subscriptions: Option<(usize, Refuse)>,
    negentropy: bool,
    tls: Option<Arc<ServerConfig>>,
    ws_config: WebSocketConfig,
    counters: Arc<Counters>,
    next_generation: u32,
    /// Draws NIP-42 challenges.
    rng: SmallRng,
    /// The secret of [`RelayFarm::own_url`].
    token: Arc<str>,
}

impl Farm {
    /// The thread's loop, until `Stop` (or the handle is gone). Returning
    /// drops every listener and connection.
    fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS_PER_POLL);
        loop {
            let timeout = self
                .timers
                .peek()
                .map(|Reverse((at, _))| at.saturating_duration_since(Instant::now()));
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                log::error!("relay farm: poll failed, stopping: {e}");
                return;
            }
            let mut woken = false;
            for event in events.iter() {
                if event.token() == WAKER {
                    woken = true;
                    continue;
                }
                match decode(event.token()) {
                    Target::Listener { relay, generation } => self.accept(relay, generation),
                    Target::Conn { key, generation } => {
                        if self
                            .conns
                            .get(key)
                            .is_some_and(|c| c.generation == generation)
                        {
                            self.drive(key);
                        }
                    }
                }
            }
            if woken && !self.run_commands() {
                self.close_all();
                return;
            }
            self.run_timers();
        }
    }

    /// Runs every pending command; false to stop.
    fn run_commands(&mut self) -> bool {
        loop {
            let command = match self.commands.try_recv() {
                Ok(command) => command,
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            };
            match command {
                Command::Seed {
                    relay,
                    events,
                    done,
                } => {
                    if let Some(r) = self.relays.get_mut(relay) {
                        for event in events {
                            r.store.insert(event);
                        }
                    }
                    // The caller may have given up waiting: fine.
                    let _ = done.send(());
                }
                Command::Publish { relay, event } => {
                    if let Some(r) = self.relays.get_mut(relay)
                        && matches!(
                            r.store.insert(event.clone()),
                            Stored::New | Stored::Ephemeral
                        )
                    {
                        self.deliver(relay, &event);
                    }
                }
                Command::Restart { relay, down_for } => self.restart(relay, down_for),
                Command::CountPresent { relay, ids, reply } => {
                    let count = self
                        .relays
                        .get(relay)
                        .map_or(0, |r| ids.iter().filter(|id| r.store.contains(id)).count());
                    let _ = reply.send(count);
                }
                Command::Unfinished { bytes } => {
                    for (_, conn) in self.conns.iter_mut() {
                        conn.begin_unfinished(bytes);
                    }
                }
                Command::Stop => return false,
            }
        }
    }

    fn schedule(&mut self, at: Instant, timer: Timer) {
        self.timers.push(Reverse((at, timer)));
    }

    fn run_timers(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((at, timer))) = self.timers.peek().copied() {
            if at > now {
                return;
            }
            self.timers.pop();
            match timer {
                Timer::Listen { relay, generation } => self.listen(relay, generation),
                Timer::Handshake { key, generation } => {
                    let stale = self.conns.get(key).is_some_and(|c| {
                        c.generation == generation
                            && matches!(c.phase, Phase::Handshaking(_) | Phase::Sniffing(_))
                    });
                    if stale {
                        log::debug!("relay farm: handshake timed out");
                        self.close(key);
                    }
                }
                Timer::Link {
                    key,
                    generation,
                    at,
                } => {
                    let armed = self.conns.get_mut(key).and_then(|c| {
                        let current = c.generation == generation;
                        c.delay().filter(|d| current && d.armed == Some(at))
                    });
                    if let Some(delay) = armed {
                        delay.armed = None;
                        self.drive(key);
                    }
                }
            }
        }
    }

    /// Drives a connection after readiness (or when bytes its [`Link`]
    /// held are due): handshake, then every frame readable, then
    /// everything writable; then sets the timer for what its link still
    /// holds.
    fn drive(&mut self, key: usize) {
        self.drive_now(key);
        self.arm(key);
    }

    /// Sets a timer for the time the next bytes a connection's [`Link`]
    /// holds are due, if none is set for that time or earlier, after
    /// writing out what is due already. Nothing for a direct link.
    fn arm(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let generation = conn.generation;
        let Some(socket) = conn.stream().map(|s| s.transport_mut()) else {
            return;
        };
        if let Err(e) = socket.pump() {
            log::debug!("relay farm: write failed: {e}");
            self.close(key);
            return;
        }
        let Some(delay) = socket.delay.as_deref_mut() else {
            return;
        };
        let Some(at) = delay.next_wake(Instant::now()) else {
            return;
        };
        if delay.armed.is_some_and(|armed| armed <= at) {
            return;
        }
        delay.armed = Some(at);
        self.schedule(
            at,
            Timer::Link {
                key,
                generation,
                at,
            },
        );
    }

    /// [`drive`](Farm::drive) without setting the link's timer.
    fn drive_now(&mut self, key: usize) {
        if !self.sniff(key) {
            return;
        }
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if let Phase::Handshaking(_) = conn.phase {
            let Phase::Handshaking(mid) = std::mem::replace(&mut conn.phase, Phase::Closed) else {
                return;
            };
            match mid.handshake() {
                Ok(ws) => conn.phase = Phase::Open(ws),
                Err(HandshakeError::Interrupted(mid)) => {
                    conn.phase = Phase::Handshaking(mid);
                    return;
                }
                Err(HandshakeError::Failure(e)) => {
                    log::debug!("relay farm: handshake failed: {e}");
                    self.close(key);
                    return;
                }
            }
        }
        // Read until WouldBlock: readiness is edge-triggered. Data may also
        // have arrived with the handshake.
        loop {
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            let Phase::Open(ws) = &mut conn.phase else {
                return;
            };
            match ws.read() {
                Ok(Message::Text(text)) => self.on_text(key, text.as_str()),
                Ok(Message::Binary(bytes)) => self.on_binary(key, &bytes),
                // Pings are answered by tungstenite (on the next flush); a
                // close is answered too and the next read reports the end.
                Ok(_) => {}
                Err(e) if would_block(&e) => break,
                Err(e) => {
                    log::debug!("relay farm: connection closed: {e}");
                    self.close(key);
                    return;
                }
            }
            self.write(key);
        }
        self.write(key);
    }

    /// Writes what the socket takes; closes the connection on error.
    fn write(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if let Err(e) = conn.write(&self.relays[conn.relay].store) {
            log::debug!("relay farm: write failed: {e}");
            self.close(key);
            return;
        }
        self.arm(key);
    }

    /// Queues a reply to a connection (written by the caller).
    fn reply(&mut self, key: usize, msg: &RelayMessage<'_>) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if !conn.queue(msg) {
            log::debug!("relay farm: client too slow, disconnecting");
            self.close(key);
        }
    }

    /// Queues an already serialized reply (see [`Conn::queue_text`]).
    fn reply_text(&mut self, key: usize, text: String) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if !conn.queue_text(text) {
            log::debug!("relay farm: client too slow, disconnecting");
            self.close(key);
        }
    }
}
