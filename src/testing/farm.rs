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
//! filters with too many values refused, a NIP-11 document published.
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
//! [`TestRelay`]: crate::testing::relay::TestRelay

mod auth;
mod neg;
mod port;

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
use tungstenite::handshake::MidHandshake;
use tungstenite::handshake::server::{Callback, ErrorResponse, Request, Response, ServerHandshake};
use tungstenite::protocol::WebSocketConfig;
use tungstenite::protocol::frame::Frame;
use tungstenite::protocol::frame::coding::{Data as OpData, OpCode};
use tungstenite::{HandshakeError, Message, WebSocket};

use crate::shell::tls::MaybeTls;

use auth::challenge;
use neg::{NegSessions, neg_err};

use super::limits::{
    HttpHead, Limitation, MAX_HEAD, ValueCapRefusal, ValueCaps, classify_http, nip11_document,
    nip11_response,
};
use super::relay::{MAX_SUBS_NOTICE, PARSE_ERROR, Refuse, TOO_MANY_REQS};
use super::store::{EventKey, Store, Stored};

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
    /// "unsupported message" `NOTICE` most relays send today.
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
            relays.push(Relay {
                port,
                profile,
                auth: opts.auth_required.contains(&i),
                listener: Some(listener),
                reserved: None,
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

// ---------------------------------------------------------------- streams

/// A client socket that counts the bytes written to it.
struct Socket {
    tcp: TcpStream,
    counters: Arc<Counters>,
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.tcp.read(buf)
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.tcp.write(buf)?;
        self.counters
            .bytes_out
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}

/// The byte stream under a websocket: plain TCP or TLS over TCP.
type Stream = MaybeTls<StreamOwned<ServerConnection, Socket>, Socket>;

/// True for "the socket would block": try again on the next readiness.
fn would_block(e: &tungstenite::Error) -> bool {
    matches!(e, tungstenite::Error::Io(io) if io.kind() == io::ErrorKind::WouldBlock)
}

/// Serializes a relay message; `None` (logged) only if serde_json fails on
/// it, which for these plain messages would be a bug in nostr.
fn to_json(msg: &RelayMessage<'_>) -> Option<String> {
    match msg.try_as_json() {
        Ok(text) => Some(text),
        Err(e) => {
            log::error!("relay farm: cannot serialize a relay message: {e}");
            None
        }
    }
}

// ---------------------------------------------------------------- state

/// One relay.
struct Relay {
    port: u16,
    /// Its limits beyond the farm's.
    profile: RelayProfile,
    /// Reads need NIP-42 AUTH first.
    auth: bool,
    /// `None` while down after a restart.
    listener: Option<TcpListener>,
    /// While down: the port, bound but not listening (see [`port`]).
    reserved: Option<std::os::fd::OwnedFd>,
    /// Bumped by every restart: tags the listener's token and the re-listen
    /// timer.
    generation: u32,
    store: Store,
    /// Slab keys of its connections.
    conns: Vec<usize>,
}

/// Where a connection stands.
enum Phase {
    /// A relay serving NIP-11 looks at the request head (peeked, not
    /// consumed) before any handshake.
    Sniffing(Stream),
    /// TLS and websocket handshakes in flight.
    Handshaking(MidHandshake<ServerHandshake<Stream, OwnClient>>),
    /// Websocket open.
    Open(WebSocket<Stream>),
    /// Transient, while the phase is being replaced.
    Closed,
}

/// Something queued for a client, not yet handed to tungstenite.
enum Out {
    /// A serialized message.
    Text(String),
    /// The stored results of a `REQ`, serialized as they leave (an event
    /// replaced meanwhile is skipped), then its `EOSE`.
    Stored {
        sub: SubscriptionId,
        keys: std::vec::IntoIter<EventKey>,
    },
}

/// The handshake callback that marks a connection (and counts it in
/// [`FarmStats::own_connections`]) when its request carries the farm's
/// token, as [`RelayFarm::own_url`] puts it.
struct OwnClient {
    token: Arc<str>,
    own: Arc<AtomicBool>,
    counters: Arc<Counters>,
}

impl Callback for OwnClient {
    fn on_request(self, request: &Request, response: Response) -> Result<Response, ErrorResponse> {
        let query = request.uri().query().unwrap_or_default();
        if query
            .split('&')
            .any(|kv| kv.strip_prefix("farm=") == Some(&*self.token))
        {
            self.own.store(true, Ordering::Relaxed);
            self.counters
                .own_connections
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(response)
    }
}

/// One client connection.
struct Conn {
    relay: usize,
    generation: u32,
    /// Set by the handshake when the client came through `own_url`.
    own: Arc<AtomicBool>,
    phase: Phase,
    /// Open subscriptions.
    subs: HashMap<SubscriptionId, Vec<Filter>>,
    /// Open negentropy reconciliations.
    negs: NegSessions,
    /// The NIP-42 challenge sent, on a relay that requires AUTH.
    challenge: Option<String>,
    /// A valid AUTH arrived: reads are served.
    authed: bool,
    out: VecDeque<Out>,
    /// Bytes of the `Text` entries of `out`.
    queued: usize,
    /// tungstenite (or rustls) holds bytes the socket did not take: wait
    /// for writability before handing over more.
    blocked: bool,
    /// A message was begun and is never finished: nothing else is sent.
    mute: bool,
}

impl Conn {
    /// Queues a message; false if the client is too far behind (it must be
    /// disconnected).
    fn queue(&mut self, msg: &RelayMessage<'_>) -> bool {
        if let Some(text) = to_json(msg) {
            self.queued += text.len();
            self.out.push_back(Out::Text(text));
        }
        self.queued <= MAX_QUEUED
    }

    /// Hands queued messages to tungstenite while the socket takes them,
    /// then flushes. An error means the connection is dead.
    fn write(&mut self, store: &Store) -> tungstenite::Result<()> {
        let Phase::Open(ws) = &mut self.phase else {
            return Ok(());
        };
        if self.mute {
            self.out.clear();
            self.queued = 0;
        }
        if self.blocked {
            match ws.flush() {
                Ok(()) => self.blocked = false,
                Err(e) if would_block(&e) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        while let Some(next) = self.out.front_mut() {
            let text = match next {
                Out::Text(text) => {
                    let text = std::mem::take(text);
                    self.out.pop_front();
                    self.queued -= text.len();
                    Some(text)
                }
                Out::Stored { sub, keys } => match keys.find_map(|k| store.get_by_key(&k)) {
                    Some(event) => to_json(&RelayMessage::Event {
                        subscription_id: Cow::Borrowed(sub),
                        event: Cow::Borrowed(event),
                    }),
                    None => {
                        let eose = to_json(&RelayMessage::eose(sub.clone()));
                        self.out.pop_front();
                        eose
                    }
                },
            };
            let Some(text) = text else { continue };
            match ws.write(Message::text(text)) {
                Ok(()) => {}
                // The frame stays in tungstenite's buffer for the next flush.
                Err(e) if would_block(&e) => {
                    self.blocked = true;
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        // Pongs and close replies, and TLS records rustls still holds.
        match ws.flush() {
            Ok(()) => Ok(()),
            Err(e) if would_block(&e) => {
                self.blocked = true;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Sends the first fragment of a `bytes`-byte text message and an
    /// unsolicited pong; from now on the connection sends nothing else.
    fn begin_unfinished(&mut self, bytes: usize) {
        let Phase::Open(ws) = &mut self.phase else {
            return;
        };
        self.mute = true;
        let fragment = Frame::message(vec![b'x'; bytes], OpCode::Data(OpData::Text), false);
        for frame in [fragment, Frame::pong(Vec::new())] {
            if ws.write(Message::Frame(frame)).is_err() {
                self.blocked = true;
            }
        }
        if ws.flush().is_err() {
            self.blocked = true;
        }
    }

    fn stream(&mut self) -> Option<&mut Stream> {
        match &mut self.phase {
            Phase::Sniffing(stream) => Some(stream),
            Phase::Handshaking(mid) => Some(mid.get_mut().get_mut()),
            Phase::Open(ws) => Some(ws.get_mut()),
            Phase::Closed => None,
        }
    }
}

/// Something scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// Listen again after a restart (or retry binding), and accept what is
    /// pending (or retry a failed accept), if the relay's generation still
    /// matches.
    Listen { relay: usize, generation: u32 },
    /// Drop the connection if it is still handshaking.
    Handshake { key: usize, generation: u32 },
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
            }
        }
    }

    /// Listens again (after a restart) and accepts what is pending.
    fn listen(&mut self, relay: usize, generation: u32) {
        let Some(r) = self.relays.get_mut(relay) else {
            return;
        };
        if r.generation != generation {
            return;
        }
        if r.listener.is_none() {
            let bound = match r.reserved.take() {
                Some(reserved) => port::listen(reserved),
                None => TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, r.port))),
            }
            .and_then(|mut listener| {
                self.poll
                    .registry()
                    .register(
                        &mut listener,
                        listener_token(relay, generation),
                        Interest::READABLE,
                    )
                    .map(|()| listener)
            });
            match bound {
                Ok(listener) => r.listener = Some(listener),
                Err(e) => {
                    log::warn!("relay farm: relay {relay} cannot listen again: {e}");
                    self.schedule(Instant::now() + RETRY, Timer::Listen { relay, generation });
                    return;
                }
            }
        }
        self.accept(relay, generation);
    }

    /// Accepts every pending connection of a relay.
    fn accept(&mut self, relay: usize, generation: u32) {
        loop {
            let Some(r) = self.relays.get(relay) else {
                return;
            };
            if r.generation != generation {
                return;
            }
            let Some(listener) = &r.listener else {
                return;
            };
            match listener.accept() {
                Ok((socket, _)) => self.add_conn(relay, socket),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted
                            | io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                    ) => {}
                Err(e) => {
                    // E.g. out of file descriptors: the pending connections
                    // stay queued; try again shortly.
                    log::warn!("relay farm: relay {relay} accept failed: {e}");
                    self.schedule(Instant::now() + RETRY, Timer::Listen { relay, generation });
                    return;
                }
            }
        }
    }

    /// Registers an accepted connection and starts its handshake.
    fn add_conn(&mut self, relay: usize, mut tcp: TcpStream) {
        let own = Arc::new(AtomicBool::new(false));
        let own_client = self.own_client(&own);
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        if key >= INDEX_LIMIT {
            log::warn!("relay farm: too many connections, dropping one");
            return;
        }
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1) & GEN_MASK;
        // Nagle would delay small replies; failing to disable it is harmless.
        let _ = tcp.set_nodelay(true);
        let token = conn_token(key, generation);
        if let Err(e) =
            self.poll
                .registry()
                .register(&mut tcp, token, Interest::READABLE | Interest::WRITABLE)
        {
            log::warn!("relay farm: cannot register a connection: {e}");
            return;
        }
        let socket = Socket {
            tcp,
            counters: Arc::clone(&self.counters),
        };
        let stream = match &self.tls {
            None => MaybeTls::Plain(socket),
            Some(config) => match ServerConnection::new(Arc::clone(config)) {
                Ok(tls) => MaybeTls::Tls(Box::new(StreamOwned::new(tls, socket))),
                Err(e) => {
                    log::warn!("relay farm: TLS setup failed: {e}");
                    let mut socket = socket;
                    let _ = self.poll.registry().deregister(&mut socket.tcp);
                    return;
                }
            },
        };
        let phase = if self.relays[relay].profile.nip11 && self.tls.is_none() {
            Phase::Sniffing(stream)
        } else {
            match Farm::start_handshake(stream, self.ws_config, own_client) {
                Some(phase) => phase,
                None => return,
            }
        };
        let challenge = self.relays[relay].auth.then(|| challenge(&mut self.rng));
        let mut conn = Conn {
            relay,
            generation,
            own,
            phase,
            subs: HashMap::new(),
            negs: NegSessions::default(),
            challenge: challenge.clone(),
            authed: false,
            out: VecDeque::new(),
            queued: 0,
            blocked: false,
            mute: false,
        };
        if let Some(challenge) = challenge {
            // Sent as soon as the websocket is open: the first thing queued.
            conn.queue(&RelayMessage::auth(challenge));
        }
        entry.insert(conn);
        self.relays[relay].conns.push(key);
        self.counters.connections.fetch_add(1, Ordering::Relaxed);
        self.schedule(
            Instant::now() + HANDSHAKE_TIMEOUT,
            Timer::Handshake { key, generation },
        );
        self.drive(key);
    }

    /// What recognizes a client of [`RelayFarm::own_url`] at its handshake.
    fn own_client(&self, own: &Arc<AtomicBool>) -> OwnClient {
        OwnClient {
            token: Arc::clone(&self.token),
            own: Arc::clone(own),
            counters: Arc::clone(&self.counters),
        }
    }

    /// Sets a websocket handshake up (nothing is read yet), or fails.
    fn start_handshake(stream: Stream, config: WebSocketConfig, own: OwnClient) -> Option<Phase> {
        match tungstenite::accept_hdr_with_config(stream, own, Some(config)) {
            Ok(ws) => Some(Phase::Open(ws)),
            Err(HandshakeError::Interrupted(mid)) => Some(Phase::Handshaking(mid)),
            Err(HandshakeError::Failure(e)) => {
                log::debug!("relay farm: handshake failed: {e}");
                None
            }
        }
    }

    /// A connection to a relay serving NIP-11, before its handshake: a
    /// NIP-11 request is answered and the connection closed (false); any
    /// other request goes on to the websocket handshake (true); an
    /// incomplete head waits for more bytes (false).
    fn sniff(&mut self, key: usize) -> bool {
        let Some((relay, own)) = self.conns.get(key).map(|c| (c.relay, Arc::clone(&c.own))) else {
            return false;
        };
        let own_client = self.own_client(&own);
        let limitation = self.limitation(relay);
        let ws_config = self.ws_config;
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        let Phase::Sniffing(stream) = &mut conn.phase else {
            return true;
        };
        let mut buf = vec![0u8; MAX_HEAD];
        let seen = match stream.transport_mut().tcp.peek(&mut buf) {
            Ok(0) => {
                self.close(key);
                return false;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return false,
            Err(_) => {
                self.close(key);
                return false;
            }
        };
        match classify_http(&buf[..seen]) {
            // Readiness is edge-triggered: the rest of the head raises
            // another event.
            HttpHead::Incomplete => false,
            HttpHead::Other => {
                let Phase::Sniffing(stream) = std::mem::replace(&mut conn.phase, Phase::Closed)
                else {
                    return false;
                };
                match Farm::start_handshake(stream, ws_config, own_client) {
                    Some(phase) => {
                        if let Some(conn) = self.conns.get_mut(key) {
                            conn.phase = phase;
                        }
                        true
                    }
                    None => {
                        self.close(key);
                        false
                    }
                }
            }
            HttpHead::Nip11(head) => {
                let document = nip11_document(&limitation);
                let tcp = &mut stream.transport_mut().tcp;
                // Consumed first: closing with unread bytes would reset the
                // connection and could lose the answer. The document is
                // small: one write fits an empty socket buffer.
                let mut consumed = vec![0u8; head];
                let served = tcp.read_exact(&mut consumed).is_ok()
                    && tcp.write_all(&nip11_response(&document)).is_ok();
                if served {
                    self.counters.info_served.fetch_add(1, Ordering::Relaxed);
                }
                let _ = tcp.shutdown(Shutdown::Write);
                self.close(key);
                false
            }
        }
    }

    /// The NIP-11 `limitation` of relay `relay`.
    fn limitation(&self, relay: usize) -> Limitation {
        let cap = self.relays[relay]
            .profile
            .max_results_per_filter
            .unwrap_or(usize::MAX)
            .min(self.cap);
        Limitation {
            max_limit: (cap != usize::MAX).then_some(cap),
            max_subscriptions: self.max_subscriptions.map(|(n, _)| n),
            max_filters: None,
            max_message_length: None,
        }
    }

    /// Drives a connection after readiness: handshake, then every frame
    /// readable, then everything writable.
    fn drive(&mut self, key: usize) {
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
                Ok(Message::Binary(_)) => self.reply(key, &RelayMessage::notice(PARSE_ERROR)),
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
        }
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

    /// Answers one text message.
    fn on_text(&mut self, key: usize, text: &str) {
        match ClientMessage::from_json(text) {
            Ok(ClientMessage::Event(event)) => self.on_event(key, event.into_owned()),
            Ok(ClientMessage::Req {
                subscription_id,
                filters,
            }) => self.on_req(
                key,
                subscription_id.into_owned(),
                filters.into_iter().map(|f| f.into_owned()).collect(),
            ),
            Ok(ClientMessage::Close(id)) => {
                if let Some(conn) = self.conns.get_mut(key) {
                    conn.subs.remove(&*id);
                }
            }
            Ok(ClientMessage::Auth(event)) => self.on_auth(key, &event),
            Ok(ClientMessage::NegOpen {
                subscription_id,
                filter,
                initial_message,
            }) if self.speaks_nip77(key) => {
                self.on_neg_open(key, subscription_id.into_owned(), &filter, &initial_message)
            }
            Ok(ClientMessage::NegMsg {
                subscription_id,
                message,
            }) if self.speaks_nip77(key) => {
                self.on_neg_msg(key, subscription_id.into_owned(), &message)
            }
            Ok(ClientMessage::NegClose { subscription_id }) if self.speaks_nip77(key) => {
                if let Some(conn) = self.conns.get_mut(key) {
                    conn.negs.close(&subscription_id);
                }
            }
            Ok(_) => self.reply(key, &RelayMessage::notice("error: unsupported message")),
            Err(_) => self.reply(key, &RelayMessage::notice(PARSE_ERROR)),
        }
    }

    /// True if the relay of connection `key` answers NIP-77.
    fn speaks_nip77(&self, key: usize) -> bool {
        self.negentropy
            && self
                .conns
                .get(key)
                .is_some_and(|c| !self.relays[c.relay].profile.no_negentropy)
    }

    fn on_event(&mut self, key: usize, event: Event) {
        self.counters
            .events_received
            .fetch_add(1, Ordering::Relaxed);
        let id = event.id;
        if event.verify().is_err() {
            self.reply(key, &RelayMessage::ok(id, false, "invalid: bad signature"));
            return;
        }
        let Some(relay) = self.conns.get(key).map(|c| c.relay) else {
            return;
        };
        if self.relays[relay]
            .profile
            .max_event_bytes
            .is_some_and(|max| event.as_json().len() > max)
        {
            self.counters
                .events_too_large
                .fetch_add(1, Ordering::Relaxed);
            self.reply(key, &RelayMessage::notice("error: event exceeded max size"));
            return;
        }
        let stored = self.relays[relay].store.insert(event.clone());
        if stored == Stored::New {
            self.counters.events_stored.fetch_add(1, Ordering::Relaxed);
        }
        // Live deliveries first, as TestRelay queues them: a client
        // subscribed to its own event sees it before the OK.
        if matches!(stored, Stored::New | Stored::Ephemeral) {
            self.deliver(relay, &event);
        }
        let reply = match stored {
            Stored::New | Stored::Ephemeral => RelayMessage::ok(id, true, ""),
            Stored::Duplicate => RelayMessage::ok(id, true, "duplicate: already have it"),
            Stored::Stale => RelayMessage::ok(id, true, "duplicate: have a newer version"),
        };
        self.reply(key, &reply);
    }

    fn on_req(&mut self, key: usize, sub: SubscriptionId, filters: Vec<Filter>) {
        self.counters.reqs.fetch_add(1, Ordering::Relaxed);
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if conn.challenge.is_some() && !conn.authed {
            self.counters.auth_refusals.fetch_add(1, Ordering::Relaxed);
            self.reply(key, &RelayMessage::closed(sub, AUTH_REQUIRED));
            return;
        }
        if let Some((max, refuse)) = self.max_subscriptions
            && !conn.subs.contains_key(&sub)
            && conn.subs.len() >= max
        {
            let refusal = match refuse {
                Refuse::Closed => RelayMessage::closed(sub, TOO_MANY_REQS),
                Refuse::Notice => RelayMessage::notice(MAX_SUBS_NOTICE),
            };
            self.reply(key, &refusal);
            return;
        }
        let relay = &self.relays[conn.relay];
        // eventstore's value caps: a refused filter is queried for nothing.
        let mut queried = Vec::with_capacity(filters.len());
        let mut notices = Vec::new();
        for filter in &filters {
            match relay
                .profile
                .value_caps
                .and_then(|caps| Some((caps, caps.check(filter)?)))
            {
                None => queried.push(filter.clone()),
                Some((caps, error)) => {
                    self.counters.value_refusals.fetch_add(1, Ordering::Relaxed);
                    match caps.refusal {
                        ValueCapRefusal::Notice => notices.push(error),
                        ValueCapRefusal::Closed => {
                            let reason = ValueCaps::closed_reason(error);
                            self.reply(key, &RelayMessage::closed(sub, reason));
                            return;
                        }
                    }
                }
            }
        }
        let per_filter = relay.profile.max_results_per_filter.unwrap_or(usize::MAX);
        if per_filter != usize::MAX {
            // Counted for the demo's report: how often the cap bit.
            let cut = queried
                .iter()
                .filter(|f| f.limit.is_none_or(|l| l > per_filter))
                .filter(|f| {
                    let wider = Filter {
                        limit: Some(per_filter + 1),
                        ..(*f).clone()
                    };
                    relay
                        .store
                        .query_keys(std::slice::from_ref(&wider), usize::MAX)
                        .len()
                        > per_filter
                })
                .count();
            self.counters
                .capped_filters
                .fetch_add(cut as u64, Ordering::Relaxed);
        }
        let keys = relay
            .store
            .query_keys_capped(&queried, per_filter, self.cap);
        for error in notices {
            conn.queue(&RelayMessage::notice(error));
        }
        conn.out.push_back(Out::Stored {
            sub: sub.clone(),
            keys: keys.into_iter(),
        });
        conn.subs.insert(sub, filters);
    }

    /// NIP-42 `AUTH`: `OK true` and reads served from now on, or `OK false`
    /// with the reason (see [`auth::check`]).
    fn on_auth(&mut self, key: usize, event: &Event) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let port = self.relays[conn.relay].port;
        let verdict = auth::check(event, conn.challenge.as_deref(), port, Timestamp::now());
        let reply = match verdict {
            Ok(()) => {
                conn.authed = true;
                self.counters.auth_accepted.fetch_add(1, Ordering::Relaxed);
                RelayMessage::ok(event.id, true, "")
            }
            Err(reason) => {
                self.counters.auth_rejected.fetch_add(1, Ordering::Relaxed);
                RelayMessage::ok(event.id, false, reason)
            }
        };
        self.reply(key, &reply);
    }

    /// NIP-77 `NEG-OPEN`: reconcile against every stored event the filter
    /// matches (no result cap: the set is ids and timestamps, and the point
    /// is to compare all of it).
    fn on_neg_open(&mut self, key: usize, sub: SubscriptionId, filter: &Filter, initial: &str) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let reply = if conn.challenge.is_some() && !conn.authed {
            // NIP-77 answers a refused NEG-OPEN with NEG-ERR; the reason is
            // the one a REQ gets.
            self.counters.auth_refusals.fetch_add(1, Ordering::Relaxed);
            neg_err(sub, AUTH_REQUIRED)
        } else {
            let store = &self.relays[conn.relay].store;
            let items = store
                .query_keys(std::slice::from_ref(filter), usize::MAX)
                .into_iter()
                .filter_map(|k| store.get_by_key(&k))
                .map(|e| (e.created_at, e.id));
            let reply = conn.negs.open(sub, items, initial);
            if matches!(reply, RelayMessage::NegMsg { .. }) {
                self.counters.neg_sessions.fetch_add(1, Ordering::Relaxed);
            }
            reply
        };
        self.neg_reply(key, &reply);
    }

    /// NIP-77 `NEG-MSG`: the next round of an open reconciliation.
    fn on_neg_msg(&mut self, key: usize, sub: SubscriptionId, hex: &str) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let reply = conn.negs.message(sub, hex);
        if matches!(reply, RelayMessage::NegMsg { .. }) {
            self.counters.neg_rounds.fetch_add(1, Ordering::Relaxed);
        }
        self.neg_reply(key, &reply);
    }

    /// Queues a `NEG-MSG` or `NEG-ERR`, counting the errors.
    fn neg_reply(&mut self, key: usize, reply: &RelayMessage<'_>) {
        if matches!(reply, RelayMessage::NegErr { .. }) {
            self.counters.neg_errors.fetch_add(1, Ordering::Relaxed);
        }
        self.reply(key, reply);
    }

    /// Sends `event` to every matching subscription of a relay's
    /// connections.
    fn deliver(&mut self, relay: usize, event: &Event) {
        let Some(r) = self.relays.get(relay) else {
            return;
        };
        let mut slow = Vec::new();
        for &key in &r.conns {
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            let mut keep = true;
            let matching: Vec<SubscriptionId> = conn
                .subs
                .iter()
                .filter(|(_, filters)| {
                    filters
                        .iter()
                        .any(|f| f.match_event(event, MatchEventOptions::new()))
                })
                .map(|(id, _)| id.clone())
                .collect();
            for sub in &matching {
                keep &= conn.queue(&RelayMessage::Event {
                    subscription_id: Cow::Borrowed(sub),
                    event: Cow::Borrowed(event),
                });
            }
            if !keep {
                slow.push(key);
            } else if !matching.is_empty()
                && let Err(e) = conn.write(&r.store)
            {
                log::debug!("relay farm: write failed: {e}");
                slow.push(key);
            }
        }
        for key in slow {
            self.close(key);
        }
    }

    /// Cuts a relay's connections, closes its listener and schedules
    /// listening again.
    fn restart(&mut self, relay: usize, down_for: Duration) {
        let Some(r) = self.relays.get_mut(relay) else {
            return;
        };
        r.generation = r.generation.wrapping_add(1) & GEN_MASK;
        let generation = r.generation;
        if let Some(mut listener) = r.listener.take() {
            let _ = self.poll.registry().deregister(&mut listener);
            drop(listener);
            // Without it, listening again is retried until the port is free.
            r.reserved = port::reserve(r.port)
                .inspect_err(|e| log::warn!("relay farm: relay {relay} cannot keep its port: {e}"))
                .ok();
        }
        for key in std::mem::take(&mut r.conns) {
            self.close(key);
        }
        self.schedule(
            Instant::now() + down_for,
            Timer::Listen { relay, generation },
        );
    }

    /// Drops a connection: TCP shutdown, no close frame.
    fn close(&mut self, key: usize) {
        let Some(mut conn) = self.conns.try_remove(key) else {
            return;
        };
        if let Some(r) = self.relays.get_mut(conn.relay)
            && let Some(pos) = r.conns.iter().position(|&k| k == key)
        {
            r.conns.swap_remove(pos);
        }
        if let Some(stream) = conn.stream() {
            let tcp = &mut stream.transport_mut().tcp;
            let _ = self.poll.registry().deregister(tcp);
            // Already closed by the peer is fine: the goal is a closed socket.
            let _ = tcp.shutdown(Shutdown::Both);
        }
        self.counters.connections.fetch_sub(1, Ordering::Relaxed);
        if conn.own.load(Ordering::Relaxed) {
            self.counters
                .own_connections
                .fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Cuts every connection (on stop).
    fn close_all(&mut self) {
        let keys: Vec<usize> = self.conns.iter().map(|(key, _)| key).collect();
        for key in keys {
            self.close(key);
        }
    }
}
