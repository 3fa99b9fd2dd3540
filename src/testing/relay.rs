//! A small NIP-01 relay over real loopback websockets, for integration tests
//! of the network shell and for the `grasp-sync demo` command. It is not part
//! of the engine and the engine never uses it.
//!
//! [`TestRelay`] stores events in memory, answers `REQ` with stored events
//! (newest first, optionally capped like real relays cap them), delivers new
//! events live to open subscriptions, accepts `EVENT`s from clients after
//! checking their id and signature, and can refuse subscriptions over a
//! per-connection limit the two ways real relays do (`CLOSED` or a bare
//! `NOTICE`). Tests can cut every connection, stop it and restart it on the
//! same port with the same store, and serve `wss://` with a given TLS config.
//! With [`RelayOptions::fault`] set it misbehaves instead, in one of the
//! ways real relays do (see [`Fault`]).
//!
//! It can also be limited as relays in the wild are (see
//! [`crate::testing::limits`]): results capped per filter as khatru caps
//! them ([`RelayOptions::max_results_per_filter`]), filters with too many
//! ids, authors, kinds or tag values refused as eventstore's SQL backends
//! refuse them ([`RelayOptions::value_caps`]), and a NIP-11 document naming
//! those limits served on the same port ([`RelayOptions::nip11`]).
//!
//! # Why threads
//!
//! The relay runs one acceptor thread and one thread per connection, with
//! blocking sockets and shared state behind a mutex. That would be the wrong
//! design for the engine's event loop, but here simplicity wins: a test relay
//! serves a handful of connections, and plain threads keep it obviously
//! correct and independent of the code under test.
//!
//! Each connection thread owns its websocket. Everything written to a client
//! (replies and live deliveries from other threads) goes through the
//! connection's outbound channel, which the thread drains between short
//! socket reads (a 10 ms read timeout). Replies to a `REQ` are
//! queued under the same lock that live deliveries take, so a client sees
//! every event either among the stored results (before `EOSE`) or live
//! (after it), never both and never neither.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nostr::prelude::{
    ClientMessage, Event, EventId, Filter, MatchEventOptions, RelayMessage, SubscriptionId,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ServerConfig, ServerConnection, StreamOwned};
use tungstenite::handshake::HandshakeError;
use tungstenite::{Message, WebSocket};

use crate::shell::tls::MaybeTls;

use super::fault::{Answer, ConnFaults, Fault, Injector, Opening, Pace, Publish, Upgrade};
use super::limits::{
    BucketLevel, EventBucket, HttpHead, Limitation, MAX_HEAD, RATE_LIMITED, ValueCapRefusal,
    ValueCaps, classify_http, nip11_document, nip11_response,
};
use super::lock::lock;
use super::relay_message::to_json;
use super::store::{Store, Stored};

/// How long a connection thread waits for client data before it flushes its
/// outbound channel again; the worst-case latency of a live delivery.
const READ_TIMEOUT: Duration = Duration::from_millis(10);

/// How often the acceptor checks for new connections and for `stop`.
const ACCEPT_POLL: Duration = Duration::from_millis(10);

/// A client that has not finished the websocket (and TLS) handshake by then
/// is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// `CLOSED` reason when a `REQ` is over the subscription limit.
pub const TOO_MANY_REQS: &str = "error: too many concurrent REQs";

/// `NOTICE` text when a `REQ` is over the subscription limit (nostr-rs-relay
/// style: it names no subscription).
pub const MAX_SUBS_NOTICE: &str = "Maximum concurrent subscription count reached";

/// `NOTICE` text for a client message that is not valid NIP-01.
pub const PARSE_ERROR: &str = "error: could not parse";

/// How a relay refuses a `REQ` over its per-connection subscription limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refuse {
    /// `["CLOSED", <sub id>, "error: too many concurrent REQs"]`.
    Closed,
    /// `["NOTICE", "Maximum concurrent subscription count reached"]`, naming
    /// no subscription, as nostr-rs-relay does.
    Notice,
}

/// How a [`TestRelay`] behaves.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// Most stored events returned for one `REQ`, all its filters together
    /// (real relays cap results, typically at 500). Default: no cap.
    pub max_results_per_req: usize,
    /// Most stored events returned for one filter: each filter gets its
    /// `min(limit, cap)` newest matches (a filter without `limit` gets
    /// `cap`), as khatru over eventstore's SQL backends answers with 100.
    /// Default: no cap.
    pub max_results_per_filter: usize,
    /// Refuse filters with too many ids, authors, kinds or tag values, as
    /// eventstore's SQL backends do (see [`ValueCaps`]). Default: none.
    pub value_caps: Option<ValueCaps>,
    /// Answer an HTTP `GET` with `Accept: application/nostr+json` on the
    /// relay's port with a NIP-11 document whose `limitation` names the
    /// caps above (`max_limit`: the per-filter cap, else the per-`REQ`
    /// one), the subscription limit and a size fault's limit
    /// (`max_message_length`). Plain `ws://` only: over TLS the
    /// request fails like any non-websocket request. Default: false (every
    /// connection is a websocket handshake, as before).
    pub nip11: bool,
    /// Most open subscriptions per connection, and how a `REQ` over that
    /// limit is refused (the subscription is then not opened). Reusing an
    /// open subscription id replaces it and is never refused. Default: none.
    pub max_subscriptions: Option<(usize, Refuse)>,
    /// Serve `wss://` with this TLS configuration (see [`server_tls_config`]);
    /// the certificate should be for `localhost`. Default: plain `ws://`.
    pub tls: Option<Arc<ServerConfig>>,
    /// Store `EVENT`s published by clients. When false they are answered
    /// with `OK false "blocked: ..."` and dropped. Default: true.
    pub accept_events: bool,
    /// Misbehave this way (see [`Fault`]). Default: none, an honest relay.
    pub fault: Option<Fault>,
    /// Rate-limit client `EVENT`s as khatru does (one bucket: every client
    /// here comes from 127.0.0.1). Default: none.
    pub event_bucket: Option<EventBucket>,
    /// ngit-relay's write policy: an event that is not an announcement,
    /// references no stored event or repository (`a`/`A`/`q`, `e`/`E`/`q`)
    /// and is referenced by no stored event is refused with `blocked:
    /// event does not relate to a stored repository`. Default: false.
    pub grasp_write_policy: bool,
    /// Says nothing to a client message it does not know (`NEG-OPEN`
    /// included), instead of a `NOTICE`: a relay that does not speak
    /// NIP-77 and lets a session time out (issue 23's finding 4).
    pub silent_on_unknown: bool,
}

impl RelayOptions {
    /// The NIP-11 `limitation` these options amount to.
    pub fn limitation(&self) -> Limitation {
        let cap = self.max_results_per_filter.min(self.max_results_per_req);
        Limitation {
            max_limit: (cap != usize::MAX).then_some(cap),
            max_subscriptions: self.max_subscriptions.map(|(n, _)| n),
            max_filters: None,
            max_message_length: self.size_limit(),
        }
    }

    /// The largest message a size fault lets through: a relay that refuses
    /// larger events states so, as `max_message_length`.
    fn size_limit(&self) -> Option<usize> {
        match self.fault {
            Some(Fault::LargeEventNotice { max_bytes } | Fault::LargeEventCut { max_bytes }) => {
                Some(max_bytes)
            }
            _ => None,
        }
    }
}

impl Default for RelayOptions {
    fn default() -> Self {
        RelayOptions {
            max_results_per_req: usize::MAX,
            max_results_per_filter: usize::MAX,
            value_caps: None,
            nip11: false,
            max_subscriptions: None,
            tls: None,
            accept_events: true,
            fault: None,
            event_bucket: None,
            grasp_write_policy: false,
            silent_on_unknown: false,
        }
    }
}

/// Builds a TLS server configuration (ring provider, safe default protocol
/// versions) from a PEM certificate chain (leaf first) and a PEM private
/// key, for [`RelayOptions::tls`].
pub fn server_tls_config(cert_chain_pem: &[u8], key_pem: &[u8]) -> io::Result<Arc<ServerConfig>> {
    let certs = CertificateDer::pem_slice_iter(cert_chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(invalid_input)?;
    if certs.is_empty() {
        return Err(invalid_input("no certificate in PEM"));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(invalid_input)?;
    let config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(invalid_input)?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(invalid_input)?;
    Ok(Arc::new(config))
}

fn invalid_input(e: impl ToString) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
}

/// A NIP-01 relay on `127.0.0.1`, running on its own threads until
/// [`stop`](TestRelay::stop) or drop.
pub struct TestRelay {
    shared: Arc<Shared>,
    port: u16,
    acceptor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TestRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestRelay")
            .field("url", &self.url())
            .field("events", &self.len())
            .field("connections", &self.connection_count())
            .finish()
    }
}

impl TestRelay {
    /// Starts an empty relay on a free port of `127.0.0.1`.
    pub fn start(opts: RelayOptions) -> io::Result<TestRelay> {
        TestRelay::start_on(0, opts, Vec::new())
    }

    /// Starts a relay on `127.0.0.1:port` (0 picks a free port) holding
    /// `events`, e.g. the store a previous [`stop`](TestRelay::stop)
    /// returned: restarting on the same port right after a stop works (std
    /// sets `SO_REUSEADDR` on listeners on Unix). The events are trusted, not
    /// verified, and stored by the same rules as published ones.
    pub fn start_on(port: u16, opts: RelayOptions, events: Vec<Event>) -> io::Result<TestRelay> {
        let listener = TcpListener::bind(("127.0.0.1", port))?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let mut store = Store::default();
        for event in events {
            store.insert(event);
        }
        let bucket = opts
            .event_bucket
            .map(|b| (BucketLevel::full(&b), std::time::Instant::now()));
        let shared = Arc::new(Shared {
            injector: Injector::new(opts.fault.clone()),
            opts,
            state: Mutex::new(State {
                store,
                conns: HashMap::new(),
                next_conn: 0,
            }),
            req_count: AtomicUsize::new(0),
            reqs: Mutex::new(VecDeque::new()),
            rejected: AtomicUsize::new(0),
            info_served: AtomicUsize::new(0),
            info_requests: AtomicUsize::new(0),
            ws_connections: AtomicUsize::new(0),
            value_refusals: AtomicUsize::new(0),
            bucket: Mutex::new(bucket),
            event_attempts: AtomicUsize::new(0),
            rate_limited: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("test-relay-{port}"))
                .spawn(move || accept_loop(&shared, listener, port))?
        };
        Ok(TestRelay {
            shared,
            port,
            acceptor: Some(acceptor),
        })
    }

    /// The relay's URL: `ws://127.0.0.1:PORT`, or `wss://localhost:PORT`
    /// when serving TLS (certificates are for `localhost`).
    pub fn url(&self) -> String {
        if self.shared.opts.tls.is_some() {
            format!("wss://localhost:{}", self.port)
        } else {
            format!("ws://127.0.0.1:{}", self.port)
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stores `event` (trusted, not verified) and delivers it live to every
    /// matching open subscription of every connection. An event already
    /// stored, or an older version of a stored replaceable or addressable
    /// event, is ignored. Ephemeral kinds (20000-29999) are delivered but
    /// not stored, as NIP-01 says.
    pub fn publish(&self, event: Event) {
        self.shared.state().accept(event);
    }

    /// Every stored event, in the order stored.
    pub fn events(&self) -> Vec<Event> {
        self.shared.state().store.iter().cloned().collect()
    }

    /// True if the event with this id is stored.
    pub fn has(&self, id: &EventId) -> bool {
        self.shared.state().store.contains(id)
    }

    /// Number of stored events.
    pub fn len(&self) -> usize {
        self.shared.state().store.len()
    }

    /// True if no event is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `REQ`s received since start, refused ones included.
    pub fn req_count(&self) -> usize {
        self.shared.req_count.load(Ordering::SeqCst)
    }

    /// The filters of the last [`REQS_KEPT`] `REQ`s received, oldest first.
    pub fn reqs(&self) -> Vec<Vec<Filter>> {
        lock(&self.shared.reqs).iter().cloned().collect()
    }

    /// Client connections open now (counted from TCP accept, so a client
    /// whose websocket handshake succeeded is always counted).
    pub fn connection_count(&self) -> usize {
        self.shared.state().conns.len()
    }

    /// Websocket connections accepted so far, open or not (NIP-11
    /// requests aside): more than one from an engine means it reconnected.
    pub fn connections_made(&self) -> usize {
        self.shared.ws_connections.load(Ordering::SeqCst)
    }

    /// Subscriptions open now, all connections together.
    pub fn subscription_count(&self) -> usize {
        self.shared
            .state()
            .conns
            .values()
            .map(|c| c.subs.len())
            .sum()
    }

    /// Client connections accepted so far (TCP accepts, whether or not the
    /// websocket handshake then succeeded), NIP-11 requests left out: an
    /// HTTP `GET` with `Accept: application/nostr+json` and no websocket
    /// upgrade (plain `ws://` relays tell it apart; see
    /// [`info_requests`](TestRelay::info_requests)) is no connection.
    pub fn accepted_count(&self) -> u64 {
        let accepted = self.shared.state().next_conn;
        accepted.saturating_sub(self.shared.info_requests.load(Ordering::SeqCst) as u64)
    }

    /// NIP-11 requests received (served or not: see [`RelayOptions::nip11`]).
    pub fn info_requests(&self) -> usize {
        self.shared.info_requests.load(Ordering::SeqCst)
    }

    /// `EVENT`s from clients refused for a bad id or signature.
    pub fn rejected_count(&self) -> usize {
        self.shared.rejected.load(Ordering::SeqCst)
    }

    /// NIP-11 documents served (see [`RelayOptions::nip11`]).
    pub fn info_served(&self) -> usize {
        self.shared.info_served.load(Ordering::SeqCst)
    }

    /// Filters refused for a value cap (see [`RelayOptions::value_caps`]).
    pub fn value_refusals(&self) -> usize {
        self.shared.value_refusals.load(Ordering::SeqCst)
    }

    /// Client `EVENT`s received, answered or refused.
    pub fn event_attempts(&self) -> usize {
        self.shared.event_attempts.load(Ordering::SeqCst)
    }

    /// Client `EVENT`s refused by the [`RelayOptions::event_bucket`].
    pub fn rate_limited(&self) -> usize {
        self.shared.rate_limited.load(Ordering::SeqCst)
    }

    /// The NIP-11 document this relay serves (whether or not
    /// [`RelayOptions::nip11`] is on).
    pub fn nip11_document(&self) -> String {
        nip11_document(&self.shared.opts.limitation())
    }

    /// Faults fired so far (see [`Fault`]): one per refused `REQ`, withheld
    /// `EOSE`, cut, restart, stalled or refused handshake, paced
    /// connection, oversized frame, garbage message, bad event, flood and
    /// burst of duplicates. Always 0 for an honest relay.
    pub fn faults_injected(&self) -> usize {
        self.shared.injector.injected()
    }

    /// Ids of the invalid events this relay sent (bad id, bad signature,
    /// outside the subscription's filter): none may reach a sink.
    pub fn invalid_sent(&self) -> Vec<EventId> {
        self.shared.injector.invalid_sent()
    }

    /// Cuts every client connection now (TCP shutdown, no websocket close
    /// frame) and keeps listening for new ones.
    pub fn drop_connections(&self) {
        self.shared.cut_all();
    }

    /// Stops listening, cuts every connection, waits for all threads and
    /// returns the store (for [`start_on`](TestRelay::start_on)).
    pub fn stop(mut self) -> Vec<Event> {
        self.shutdown();
        std::mem::take(&mut self.shared.state().store).into_events()
    }

    /// Idempotent: the acceptor handle is taken on the first call.
    fn shutdown(&mut self) {
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.drop_connections();
        // The acceptor polls the flag; once it is gone no connection can be
        // added, so cutting again reaches any accepted meanwhile.
        if acceptor.join().is_err() {
            log::error!("test relay acceptor thread panicked");
        }
        self.drop_connections();
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        for handle in threads {
            if handle.join().is_err() {
                log::error!("test relay connection thread panicked");
            }
        }
    }
}

impl Drop for TestRelay {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// `REQ`s whose filters a relay keeps for [`TestRelay::reqs`].
pub const REQS_KEPT: usize = 1_000;

/// State shared by the handle, the acceptor and the connection threads.
struct Shared {
    opts: RelayOptions,
    injector: Injector,
    state: Mutex<State>,
    req_count: AtomicUsize,
    /// The filters of the last [`REQS_KEPT`] `REQ`s, oldest first.
    reqs: Mutex<VecDeque<Vec<Filter>>>,
    /// Client `EVENT`s refused for a bad id or signature.
    rejected: AtomicUsize,
    /// NIP-11 documents served.
    info_served: AtomicUsize,
    /// NIP-11 requests received, served or not.
    info_requests: AtomicUsize,
    /// Connections that went on to the websocket handshake.
    ws_connections: AtomicUsize,
    /// Filters refused for a value cap.
    value_refusals: AtomicUsize,
    /// The [`RelayOptions::event_bucket`]'s tokens.
    bucket: Mutex<Option<(BucketLevel, std::time::Instant)>>,
    /// Client `EVENT`s received.
    event_attempts: AtomicUsize,
    /// Of those, refused by the event bucket.
    rate_limited: AtomicUsize,
    stopping: AtomicBool,
    /// Connection threads, joined by `stop`.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// A token of the event bucket for one `EVENT`; true without a bucket.
    fn take_token(&self) -> bool {
        let Some(bucket) = self.opts.event_bucket else {
            return true;
        };
        let mut level = lock(&self.bucket);
        let now = std::time::Instant::now();
        let (level, at) = level.get_or_insert_with(|| (BucketLevel::full(&bucket), now));
        let elapsed = now.saturating_duration_since(*at);
        *at = now;
        level.take(&bucket, elapsed)
    }

    /// Keeps a REQ's filters for [`TestRelay::reqs`], dropping the oldest
    /// past [`REQS_KEPT`].
    fn keep_req(&self, filters: &[Filter]) {
        let mut reqs = lock(&self.reqs);
        if reqs.len() == REQS_KEPT {
            reqs.pop_front();
        }
        reqs.push_back(filters.to_vec());
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Cuts every client connection (TCP shutdown, no close frame).
    fn cut_all(&self) {
        let mut state = self.state();
        for conn in state.conns.values() {
            // Already closed by the peer is fine: the goal is a closed socket.
            let _ = conn.socket.shutdown(Shutdown::Both);
        }
        state.conns.clear();
    }
}

struct State {
    store: Store,
    conns: HashMap<u64, Conn>,
    next_conn: u64,
}

/// One client connection as the other threads see it.
struct Conn {
    /// A clone of the connection's socket, to cut it from another thread.
    socket: TcpStream,
    /// Text messages for the connection thread to send.
    outbox: Sender<String>,
    /// Open subscriptions by id.
    subs: HashMap<String, Vec<Filter>>,
}

impl State {
    /// Stores an event and delivers it live if it is new.
    /// ngit-relay's test of an event: an announcement, or one that tags a
    /// stored repository or event, or one a stored event tags.
    fn relates(&self, event: &Event) -> bool {
        if event.kind.as_u16() == 30617 {
            return true;
        }
        let id = event.id.to_hex();
        let tags_value = |e: &Event, names: &[&str], value: &str| {
            e.tags.iter().map(|t| t.as_slice()).any(|t| {
                t.first().is_some_and(|n| names.contains(&n.as_str()))
                    && t.get(1).is_some_and(|v| v == value)
            })
        };
        event.tags.iter().map(|t| t.as_slice()).any(|t| {
            let (Some(name), Some(value)) = (t.first(), t.get(1)) else {
                return false;
            };
            match name.as_str() {
                "a" | "A" | "q" if value.starts_with("30617:") => self.store.iter().any(|s| {
                    s.kind.as_u16() == 30617
                        && value
                            == &format!(
                                "30617:{}:{}",
                                s.pubkey.to_hex(),
                                s.tags.identifier().unwrap_or_default()
                            )
                }),
                "e" | "E" | "q" => EventId::from_hex(value).is_ok_and(|v| self.store.contains(&v)),
                _ => false,
            }
        }) || self
            .store
            .iter()
            .any(|s| tags_value(s, &["e", "E", "q"], &id))
    }

    fn accept(&mut self, event: Event) -> Stored {
        let stored = self.store.insert(event.clone());
        if matches!(stored, Stored::New | Stored::Ephemeral) {
            self.deliver(&event);
        }
        stored
    }

    /// Queues `event` for every open subscription it matches.
    fn deliver(&self, event: &Event) {
        for conn in self.conns.values() {
            for (id, filters) in &conn.subs {
                if filters
                    .iter()
                    .any(|f| f.match_event(event, MatchEventOptions::new()))
                {
                    let msg = RelayMessage::event(SubscriptionId::new(id), event.clone());
                    if let Some(text) = to_json(&msg) {
                        // A closed receiver means the connection thread is
                        // exiting: nobody to deliver to.
                        let _ = conn.outbox.send(text);
                    }
                }
            }
        }
    }
}

/// Accepts connections until `stop`, polling a non-blocking listener, and
/// restarts the relay when a [`Fault::Restart`] asks.
fn accept_loop(shared: &Arc<Shared>, mut listener: TcpListener, port: u16) {
    while !shared.stopping() {
        if let Some(down_for) = shared.injector.take_restart() {
            drop(listener);
            shared.cut_all();
            let Some(again) = relisten(shared, port, down_for) else {
                return;
            };
            listener = again;
        }
        match listener.accept() {
            Ok((socket, _)) => spawn_connection(shared, socket),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(ACCEPT_POLL),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // E.g. out of file descriptors: keep serving the others.
                log::warn!("test relay: accept failed: {e}");
                thread::sleep(ACCEPT_POLL);
            }
        }
    }
}

/// Keeps the port closed for `down_for`, then listens on it again; `None`
/// if the relay stops meanwhile.
fn relisten(shared: &Shared, port: u16, down_for: Duration) -> Option<TcpListener> {
    let up_at = Instant::now() + down_for;
    while !shared.stopping() {
        if Instant::now() >= up_at {
            let listener = TcpListener::bind(("127.0.0.1", port))
                .and_then(|l| l.set_nonblocking(true).map(|()| l));
            match listener {
                Ok(listener) => return Some(listener),
                Err(e) => log::warn!("test relay: cannot listen on port {port} again: {e}"),
            }
        }
        thread::sleep(ACCEPT_POLL);
    }
    None
}

/// Registers a connection and starts its thread.
fn spawn_connection(shared: &Arc<Shared>, socket: TcpStream) {
    let setup = socket
        .set_nonblocking(false)
        .and_then(|()| socket.set_nodelay(true))
        .and_then(|()| socket.set_read_timeout(Some(READ_TIMEOUT)))
        .and_then(|()| socket.try_clone());
    let handle = match setup {
        Ok(handle) => handle,
        Err(e) => {
            log::warn!("test relay: cannot set up connection: {e}");
            return;
        }
    };
    let (outbox, inbox) = mpsc::channel();
    let id = {
        let mut state = shared.state();
        let id = state.next_conn;
        state.next_conn += 1;
        state.conns.insert(
            id,
            Conn {
                socket: handle,
                outbox: outbox.clone(),
                subs: HashMap::new(),
            },
        );
        id
    };
    let spawned = {
        let shared = Arc::clone(shared);
        thread::Builder::new()
            .name(format!("test-relay-conn-{id}"))
            .spawn(move || {
                let connection = Connection {
                    shared: &shared,
                    id,
                    outbox,
                    inbox,
                    faults: ConnFaults::default(),
                    seq: std::cell::Cell::new(0),
                };
                connection.serve(socket);
                shared.state().conns.remove(&id);
            })
    };
    match spawned {
        Ok(thread) => {
            let mut threads = lock(&shared.threads);
            // Finished threads need no join; keep the list short.
            threads.retain(|t| !t.is_finished());
            threads.push(thread);
        }
        Err(e) => {
            log::warn!("test relay: cannot spawn connection thread: {e}");
            if let Some(conn) = shared.state().conns.remove(&id) {
                let _ = conn.socket.shutdown(Shutdown::Both);
            }
        }
    }
}

/// A TCP socket whose read timeouts always surface as `WouldBlock` (Unix
/// reports `WouldBlock`, Windows `TimedOut`), which is what tungstenite and
/// rustls treat as "no data yet, try again". With a pace, writes let one
/// byte out at a time and report `WouldBlock` in between.
struct Socket {
    tcp: TcpStream,
    pace: Option<Pace>,
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.tcp.read(buf).map_err(|e| {
            if e.kind() == io::ErrorKind::TimedOut {
                io::ErrorKind::WouldBlock.into()
            } else {
                e
            }
        })
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.pace {
            Some(pace) if !buf.is_empty() => match pace.allow() {
                true => self.tcp.write(&buf[..1]),
                false => Err(io::ErrorKind::WouldBlock.into()),
            },
            _ => self.tcp.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}

/// The byte stream under the websocket: plain TCP or TLS over TCP.
type Stream = MaybeTls<StreamOwned<ServerConnection, Socket>, Socket>;

/// True for the errors a read timeout produces: nothing to read yet.
fn nothing_yet(e: &tungstenite::Error) -> bool {
    matches!(e, tungstenite::Error::Io(io)
        if matches!(io.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
}

/// What the start of a plain connection asked.
enum Sniffed {
    /// A websocket handshake (or anything but a NIP-11 request).
    Websocket,
    /// A NIP-11 request to a relay not serving NIP-11.
    Nip11Unserved,
    /// Nothing more to do: a NIP-11 request was answered, or the client
    /// left or sent nothing in time.
    Done,
}

/// One connection thread.
struct Connection<'a> {
    shared: &'a Shared,
    id: u64,
    /// Its number among the relay's connections that are not NIP-11
    /// requests, from 0: what the faults count.
    seq: std::cell::Cell<u64>,
    /// This connection's own outbound channel (also registered in `State`).
    outbox: Sender<String>,
    inbox: Receiver<String>,
    faults: ConnFaults,
}

impl Connection<'_> {
    /// Serves the connection until the client leaves, it is cut, or the
    /// relay stops.
    fn serve(&self, socket: TcpStream) {
        // A NIP-11 request is no connection: it neither counts as one for
        // the faults (which misbehave on the first connections) nor is
        // stalled or refused by them.
        if self.shared.opts.tls.is_none() {
            match self.sniff_nip11(&socket) {
                Sniffed::Done => return,
                Sniffed::Nip11Unserved => {
                    // Refused by the handshake as before, faults aside.
                    let socket = Socket {
                        tcp: socket,
                        pace: None,
                    };
                    self.handshake(MaybeTls::Plain(socket), Upgrade::accept());
                    return;
                }
                Sniffed::Websocket => {}
            }
        }
        self.seq
            .set(self.shared.ws_connections.fetch_add(1, Ordering::SeqCst) as u64);
        let upgrade = match self.shared.injector.opening() {
            Opening::Handshake(upgrade) => upgrade,
            Opening::Stall => return self.stall(socket),
        };
        let socket = Socket {
            tcp: socket,
            pace: None,
        };
        let stream = match &self.shared.opts.tls {
            None => MaybeTls::Plain(socket),
            Some(config) => match ServerConnection::new(Arc::clone(config)) {
                Ok(tls) => MaybeTls::Tls(Box::new(StreamOwned::new(tls, socket))),
                Err(e) => {
                    log::warn!("test relay: TLS setup failed: {e}");
                    return;
                }
            },
        };
        let Some(mut ws) = self.handshake(stream, upgrade) else {
            return;
        };
        if let Some(frame) = self.shared.injector.greeting() {
            self.send_text(frame);
        }
        ws.get_mut().transport_mut().pace = self.shared.injector.pace();
        while !self.shared.stopping() {
            self.shared.injector.tick(self.seq.get(), &self.faults);
            if let Some(frames) = self.shared.injector.never_finished(&self.faults) {
                // Mid-message: anything else written now would be a new
                // message inside the unfinished one. Answers are dropped.
                while self.inbox.try_recv().is_ok() {}
                if let Err(e) = write_frames(&mut ws, frames) {
                    log::debug!("test relay: connection {} write: {e}", self.id);
                    return;
                }
            } else if let Err(e) = self.flush(&mut ws) {
                log::debug!("test relay: connection {} write: {e}", self.id);
                return;
            }
            match ws.read() {
                Ok(Message::Text(text)) => match self.shared.injector.publish(text.as_str()) {
                    None => self.handle(text.as_str()),
                    Some(Publish::Notice(notice)) => self.send_text(notice),
                    // Dropping `ws` cuts the socket, unread frames and all.
                    Some(Publish::Cut) => return,
                },
                Ok(Message::Binary(_)) => self.send(RelayMessage::notice(PARSE_ERROR)),
                // Pings are answered by tungstenite; a close is answered too
                // and the next read reports the connection closed.
                Ok(_) => {}
                Err(e) if nothing_yet(&e) => {}
                Err(e) => {
                    log::debug!("test relay: connection {} read: {e}", self.id);
                    return;
                }
            }
        }
        // Stopping: no close frame, the socket is cut like a crashed relay's
        // (`stop` shuts it down; dropping `ws` closes it).
    }

    /// Looks at the request head without consuming it. A NIP-11 request is
    /// counted and, on a relay serving NIP-11, answered here.
    fn sniff_nip11(&self, socket: &TcpStream) -> Sniffed {
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        let mut buf = vec![0u8; MAX_HEAD];
        loop {
            if self.shared.stopping() || Instant::now() > deadline {
                return Sniffed::Done;
            }
            let seen = match socket.peek(&mut buf) {
                Ok(0) => return Sniffed::Done,
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    continue;
                }
                Err(_) => return Sniffed::Done,
            };
            match classify_http(&buf[..seen]) {
                HttpHead::Other => return Sniffed::Websocket,
                // Part of the head is in: the peek returns at once until
                // more arrives, so do not spin.
                HttpHead::Incomplete => thread::sleep(Duration::from_millis(1)),
                HttpHead::Nip11(_) if !self.shared.opts.nip11 => {
                    self.shared.info_requests.fetch_add(1, Ordering::SeqCst);
                    return Sniffed::Nip11Unserved;
                }
                HttpHead::Nip11(head) => {
                    self.shared.info_requests.fetch_add(1, Ordering::SeqCst);
                    let mut socket = socket;
                    // Consumed first: closing with unread bytes would reset
                    // the connection and could lose the answer.
                    let mut consumed = vec![0u8; head];
                    if socket.read_exact(&mut consumed).is_err() {
                        return Sniffed::Done;
                    }
                    let response = nip11_response(&nip11_document(&self.shared.opts.limitation()));
                    if socket
                        .write_all(&response)
                        .and_then(|()| socket.flush())
                        .is_ok()
                    {
                        self.shared.info_served.fetch_add(1, Ordering::SeqCst);
                    }
                    let _ = socket.shutdown(Shutdown::Write);
                    return Sniffed::Done;
                }
            }
        }
    }

    /// Holds a connection without answering anything ([`Fault::Slowloris`])
    /// until the client leaves, it is cut, or the relay stops.
    fn stall(&self, mut socket: TcpStream) {
        let mut buf = [0u8; 1024];
        while !self.shared.stopping() {
            match socket.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }

    /// Completes the (TLS and) websocket handshake, resuming it across read
    /// timeouts; `upgrade` may refuse it with an HTTP error instead.
    fn handshake(&self, stream: Stream, upgrade: Upgrade) -> Option<WebSocket<Stream>> {
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        let mut attempt = tungstenite::accept_hdr_with_config(stream, upgrade, None);
        loop {
            match attempt {
                Ok(ws) => return Some(ws),
                Err(HandshakeError::Interrupted(mid)) => {
                    if self.shared.stopping() || Instant::now() > deadline {
                        return None;
                    }
                    attempt = mid.handshake();
                }
                Err(HandshakeError::Failure(e)) => {
                    log::debug!("test relay: connection {} handshake: {e}", self.id);
                    return None;
                }
            }
        }
    }

    /// Writes everything queued for this client; fails once a
    /// [`Fault::DropMidStream`] cuts the connection.
    fn flush(&self, ws: &mut WebSocket<Stream>) -> tungstenite::Result<()> {
        let mut wrote = false;
        while let Ok(text) = self.inbox.try_recv() {
            let event = text.starts_with("[\"EVENT\"");
            match ws.write(Message::text(text)) {
                // A blocked write keeps the frame buffered for the next flush.
                Err(e) if !nothing_yet(&e) => return Err(e),
                _ => wrote = true,
            }
            if event && self.shared.injector.cut_now(self.seq.get(), &self.faults) {
                // Whatever is buffered goes out before the cut; the rest never.
                let _ = ws.flush();
                return Err(tungstenite::Error::ConnectionClosed);
            }
        }
        if wrote {
            match ws.flush() {
                Err(e) if !nothing_yet(&e) => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// Queues a message to this client.
    fn send(&self, msg: RelayMessage<'_>) {
        if let Some(text) = to_json(&msg) {
            self.send_text(text);
        }
    }

    /// Queues a text frame to this client.
    fn send_text(&self, text: String) {
        // The receiver lives as long as this thread: sending cannot fail.
        let _ = self.outbox.send(text);
    }

    /// Answers one text message.
    fn handle(&self, text: &str) {
        match ClientMessage::from_json(text) {
            Ok(ClientMessage::Event(event)) => self.on_event(event.into_owned()),
            Ok(ClientMessage::Req {
                subscription_id,
                filters,
            }) => self.on_req(
                subscription_id.to_string(),
                filters.into_iter().map(|f| f.into_owned()).collect(),
            ),
            Ok(ClientMessage::Close(id)) => {
                if let Some(conn) = self.shared.state().conns.get_mut(&self.id) {
                    conn.subs.remove(&id.to_string());
                }
            }
            Ok(_) if self.shared.opts.silent_on_unknown => {}
            Ok(_) => self.send(RelayMessage::notice("error: unsupported message")),
            Err(_) => self.send(RelayMessage::notice(PARSE_ERROR)),
        }
    }

    fn on_event(&self, event: Event) {
        let id = event.id;
        self.shared.event_attempts.fetch_add(1, Ordering::SeqCst);
        if !self.shared.take_token() {
            self.shared.rate_limited.fetch_add(1, Ordering::SeqCst);
            self.send(RelayMessage::ok(id, false, RATE_LIMITED));
            return;
        }
        if event.verify().is_err() {
            self.shared.rejected.fetch_add(1, Ordering::SeqCst);
            self.send(RelayMessage::ok(id, false, "invalid: bad signature"));
            return;
        }
        if self.shared.opts.grasp_write_policy && !self.shared.state().relates(&event) {
            self.send(RelayMessage::ok(
                id,
                false,
                "blocked: event does not relate to a stored repository",
            ));
            return;
        }
        if !self.shared.opts.accept_events {
            self.send(RelayMessage::ok(
                id,
                false,
                "blocked: this relay does not accept events",
            ));
            return;
        }
        let stored = self.shared.state().accept(event);
        let reply = match stored {
            Stored::New | Stored::Ephemeral => RelayMessage::ok(id, true, ""),
            Stored::Duplicate => RelayMessage::ok(id, true, "duplicate: already have it"),
            Stored::Stale => RelayMessage::ok(id, true, "duplicate: have a newer version"),
        };
        self.send(reply);
    }

    fn on_req(&self, sub: String, filters: Vec<Filter>) {
        self.shared.req_count.fetch_add(1, Ordering::SeqCst);
        self.shared.keep_req(&filters);
        // Made up (and signed) before taking the lock other threads wait on.
        let answer = self.shared.injector.answer(&sub, &filters, &self.faults);
        let mut state = self.shared.state();
        let state = &mut *state;
        let Some(conn) = state.conns.get_mut(&self.id) else {
            // Cut by drop_connections: nobody will read the answer.
            return;
        };
        if let Some((max, refuse)) = self.shared.opts.max_subscriptions
            && !conn.subs.contains_key(&sub)
            && conn.subs.len() >= max
        {
            self.send(match refuse {
                Refuse::Closed => RelayMessage::closed(SubscriptionId::new(&sub), TOO_MANY_REQS),
                Refuse::Notice => RelayMessage::notice(MAX_SUBS_NOTICE),
            });
            return;
        }
        let plan = match answer {
            Answer::Refuse(text) => return self.send_text(text),
            Answer::Serve(plan) => plan,
        };
        // eventstore's value caps: a refused filter is queried for nothing.
        let mut queried = Vec::with_capacity(filters.len());
        for filter in &filters {
            match self
                .shared
                .opts
                .value_caps
                .and_then(|caps| Some((caps, caps.check(filter)?)))
            {
                None => queried.push(filter.clone()),
                Some((caps, error)) => {
                    self.shared.value_refusals.fetch_add(1, Ordering::SeqCst);
                    match caps.refusal {
                        ValueCapRefusal::Notice => self.send(RelayMessage::notice(error)),
                        ValueCapRefusal::Closed => {
                            return self.send(RelayMessage::closed(
                                SubscriptionId::new(&sub),
                                ValueCaps::closed_reason(error),
                            ));
                        }
                    }
                }
            }
        }
        // Queued under the state lock, so live deliveries of events stored
        // after this query come after the EOSE.
        let sub_id = SubscriptionId::new(&sub);
        plan.before
            .into_iter()
            .for_each(|text| self.send_text(text));
        let keys = state.store.query_keys_capped(
            &queried,
            self.shared.opts.max_results_per_filter,
            self.shared.opts.max_results_per_req,
        );
        let stored: Vec<&Event> = keys
            .iter()
            .filter_map(|k| state.store.get_by_key(k))
            .collect();
        for event in &stored {
            self.send(RelayMessage::event(sub_id.clone(), (*event).clone()));
        }
        if let Some(first) = stored.first() {
            let copies = self.shared.injector.copies(&sub_id, first, plan.copies);
            copies.into_iter().for_each(|text| self.send_text(text));
        }
        plan.after.into_iter().for_each(|text| self.send_text(text));
        if plan.eose {
            self.send(RelayMessage::eose(sub_id));
        }
        conn.subs.insert(sub, filters);
    }
}

/// Writes raw frames and flushes them ([`Fault::NeverFinished`]).
///
/// [`Fault::NeverFinished`]: super::fault::Fault::NeverFinished
fn write_frames(
    ws: &mut WebSocket<Stream>,
    frames: Vec<tungstenite::protocol::frame::Frame>,
) -> tungstenite::Result<()> {
    if frames.is_empty() {
        return Ok(());
    }
    for frame in frames {
        match ws.write(Message::Frame(frame)) {
            Err(e) if !nothing_yet(&e) => return Err(e),
            _ => {}
        }
    }
    match ws.flush() {
        Err(e) if !nothing_yet(&e) => Err(e),
        _ => Ok(()),
    }
}
