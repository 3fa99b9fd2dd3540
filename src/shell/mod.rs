//! The mio shell: one thread, one `Poll`, every socket.
//!
//! It only moves bytes and time. Relay connections live in a `Slab` under
//! generation-tagged tokens, so a readiness event or a DNS answer for a
//! dropped connection can never reach the connection that reused its slot.
//! The poll timeout is the engine's next deadline. DNS runs on worker
//! threads (`dns`) that wake the loop through one `Waker`. Synced events go
//! to the sink: the own relay over its own websocket with an outbox, or a
//! [`Sink`] supplied by an embedding relay. When the outbox is full the shell
//! stops reading remote relays until it drains, so a slow own relay slows
//! syncing down instead of losing events. What is said on the own-relay
//! connection (outbox, listings, AUTH, when to reconnect) is the sans-IO
//! `OwnRelayClient`; the shell only carries its texts.
//!
//! Two more things ride on the own-relay sink and the connections:
//!
//! - NIP-11 fetches (`Action::FetchInfo`): an HTTP GET per relay through the
//!   same DNS pool, address guard, TLS roots and slab as a websocket
//!   connect, bounded in bytes (`info_fetch`) and time
//!   ([`info_fetch::DEADLINE`]), each answered to the engine exactly once.
//! - The index follows the own relay (GRASP-01): an announcement or root
//!   event the own relay answers `OK true` (or `duplicate:`) is fed back to
//!   the engine, so a remotely found repo is synced only once the own relay
//!   took it. A custom sink's embedder feeds what it stores itself.

pub(crate) mod connect_error;
pub(crate) mod dns;
pub(crate) mod info_fetch;
pub(crate) mod key_file;
pub(crate) mod metrics;
pub(crate) mod metrics_server;
pub(crate) mod read_budget;
pub(crate) mod rlimit;
pub(crate) mod sink;
pub(crate) mod tls;
pub(crate) mod ws;

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use log::{debug, info, warn};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};
use nostr::prelude::{Event, Filter};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use slab::Slab;
use tungstenite::protocol::WebSocketConfig;

use crate::sans_io::address::{host_and_port, ip_literal, refusal_reason};
use crate::sans_io::config::Config;
use crate::sans_io::engine::Offence;
use crate::sans_io::engine::{Action, ConfigError, Engine, Output};
use crate::sans_io::index::RelayId;
use crate::sans_io::own_relay::{ClientOutput, OwnRelayClient, Transmit};
use crate::sans_io::time::Time;
use crate::sans_io::timer::TimerWheel;
use crate::shell::connect_error::ConnectError;
use crate::shell::dns::{Resolved, Resolver};
use crate::shell::metrics::{ShellStats, SinkView, render};
use crate::shell::metrics_server::{MetricsConn, MetricsListener};
use crate::shell::read_budget::ReadRate;
use crate::shell::sink::Sink;
use crate::shell::ws::{GetEvent, HttpGet, TlsTarget, WsConnection, WsEvent};

const WAKER: Token = Token(usize::MAX);
const METRICS: Token = Token(usize::MAX - 2);
/// Time a connection (DNS, TCP, TLS, websocket) may take.
const CONNECT_DEADLINE: Duration = Duration::from_secs(30);

/// Default of [`ShellOptions::max_relays`].
pub(crate) const DEFAULT_MAX_RELAYS: usize = 10_000;
/// Default of [`ShellOptions::max_frame_bytes`] (1 MiB).
pub(crate) const DEFAULT_MAX_FRAME_BYTES: usize = 1_048_576;
/// Default of [`ShellOptions::max_frames_per_sec`].
pub(crate) const DEFAULT_MAX_FRAMES_PER_SEC: u32 = 5_000;
/// Default of [`ShellOptions::shutdown_timeout`].
pub(crate) const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// Shell settings besides the engine's.
#[derive(Debug, Clone)]
pub struct ShellOptions {
    /// Connect to relays that resolve to loopback/private/link-local addresses.
    pub allow_private_addresses: bool,
    /// Relays connected at once at most; also the most NIP-11 fetches in
    /// flight at once (counted apart: a relay's fetch runs beside its
    /// websocket, and one past the cap is skipped, not queued).
    pub max_relays: usize,
    /// PEM files with extra root certificates (private CAs).
    pub extra_ca_files: Vec<PathBuf>,
    /// Largest websocket message and frame accepted.
    pub max_frame_bytes: usize,
    /// Longest flush of the outbox at shutdown.
    pub shutdown_timeout: Duration,
    /// Serve Prometheus metrics here.
    pub metrics: Option<SocketAddr>,
    /// DNS worker threads.
    pub dns_threads: usize,
    /// Events the own-relay outbox holds before reading pauses.
    pub outbox_capacity: usize,
    /// Frames read per second from one remote relay at most (see
    /// `read_budget`); the rest waits in the kernel's socket buffers.
    pub max_frames_per_sec: u32,
}

impl Default for ShellOptions {
    fn default() -> Self {
        ShellOptions {
            allow_private_addresses: false,
            max_relays: DEFAULT_MAX_RELAYS,
            extra_ca_files: Vec::new(),
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            metrics: None,
            dns_threads: 2,
            outbox_capacity: 10_000,
            max_frames_per_sec: DEFAULT_MAX_FRAMES_PER_SEC,
        }
    }
}

/// Where synced events go.
pub enum SinkTarget {
    /// Publish to the own relay (`Config::own_relay`) with `EVENT`.
    OwnRelay,
    /// Hand to an embedding relay's sink.
    Custom(Box<dyn Sink + Send>),
}

/// Why the shell could not start.
#[derive(Debug)]
pub enum ShellError {
    /// The engine configuration is invalid.
    Config(ConfigError),
    /// A file of [`ShellOptions::extra_ca_files`] could not be used:
    /// unreadable, not PEM, without a certificate, or one TLS refuses.
    CaFile {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        error: io::Error,
    },
    /// The TLS client configuration could not be built.
    Tls(rustls::Error),
    /// A socket or the poll could not be set up.
    Io(io::Error),
}

impl std::fmt::Display for ShellError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShellError::Config(e) => write!(f, "{e}"),
            ShellError::CaFile { path, error } => write!(f, "tls: {}: {error}", path.display()),
            ShellError::Tls(e) => write!(f, "tls: {e}"),
            ShellError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ShellError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ShellError::Config(e) => Some(e),
            ShellError::CaFile { error, .. } => error.get_ref().map(|e| e as _),
            ShellError::Tls(e) => Some(e),
            ShellError::Io(e) => Some(e),
        }
    }
}

impl From<io::Error> for ShellError {
    fn from(e: io::Error) -> Self {
        ShellError::Io(e)
    }
}

/// Requests from other threads.
enum Command {
    Feed(Box<Event>),
    Shutdown,
}

/// A cloneable handle to a running shell, usable from any thread.
#[derive(Clone)]
pub struct ShellHandle {
    tx: Sender<Command>,
    waker: Arc<Waker>,
}

impl ShellHandle {
    /// Feeds an event the embedding relay accepted (instead of the self-subscription).
    pub fn feed(&self, event: Event) {
        if self.tx.send(Command::Feed(Box::new(event))).is_ok() {
            let _ = self.waker.wake();
        }
    }

    /// Asks the shell to stop: no new work, outbox flushed within the deadline.
    pub fn shutdown(&self) {
        if self.tx.send(Command::Shutdown).is_ok() {
            let _ = self.waker.wake();
        }
    }
}

/// Monotonic time anchored to the Unix epoch once, so timers ignore wall-clock jumps.
struct Clock {
    start: Instant,
    unix_ms: u64,
}

impl Clock {
    fn new() -> Self {
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Clock {
            start: Instant::now(),
            unix_ms,
        }
    }

    fn now(&self) -> Time {
        Time::from_millis(self.unix_ms + self.start.elapsed().as_millis() as u64)
    }
}

/// A connection's transport: waiting for DNS, a websocket in progress, or
/// a NIP-11 fetch in progress.
enum Conn {
    Resolving {
        url: String,
        port: u16,
        tls: Option<TlsTarget>,
        trusted: bool,
    },
    Ws(Box<WsConnection>),
    Http(Box<HttpGet>),
}

impl Conn {
    fn socket(&mut self) -> Option<&mut TcpStream> {
        match self {
            Conn::Resolving { .. } => None,
            Conn::Ws(ws) => ws.socket(),
            Conn::Http(get) => get.socket(),
        }
    }
}

enum SlotKind {
    Relay {
        relay: RelayId,
        conn: Conn,
        opened: bool,
        rate: ReadRate,
        /// Reads stopped until the rate window refills (a timer is armed).
        throttled: bool,
    },
    OwnSink {
        conn: Conn,
        opened: bool,
    },
    /// A NIP-11 fetch for `relay`; answered to the engine when it ends,
    /// however it ends.
    Info {
        relay: RelayId,
        conn: Conn,
    },
    Metrics(MetricsConn),
}

struct Slot {
    generation: u32,
    kind: SlotKind,
}

/// The own relay as the sink: its client, and the slot of its connection
/// while there is one.
struct OwnSink {
    client: OwnRelayClient,
    slot: Option<Token>,
}

enum SinkState {
    OwnRelay(Box<OwnSink>),
    Custom(Box<dyn Sink + Send>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ShellTimer {
    ConnectDeadline(Token),
    Trim,
    /// A throttled relay connection may read again.
    Unthrottle(Token),
}

/// How often memory freed after a burst is handed back to the OS.
const TRIM_EVERY: Duration = Duration::from_secs(10);

/// The event loop.
pub struct Shell {
    poll: Poll,
    engine: Engine,
    opts: ShellOptions,
    clock: Clock,
    slots: Slab<Slot>,
    generation: u32,
    relay_slots: HashMap<RelayId, Token>,
    trusted: HashSet<RelayId>,
    resolver: Resolver,
    tls: Arc<ClientConfig>,
    ws_config: WebSocketConfig,
    sink: SinkState,
    deferred: Vec<Token>,
    /// Connections whose read budget ran out with data maybe waiting; read
    /// again on the next turn, after every other ready socket had its turn.
    ready_again: Vec<Token>,
    metrics: Option<MetricsListener>,
    commands: Receiver<Command>,
    handle: ShellHandle,
    timers: TimerWheel<ShellTimer>,
    stats: ShellStats,
    stopping: Option<Time>,
    scratch: Vec<WsEvent>,
    /// Sockets were busy since the last trim.
    active: bool,
    /// NIP-11 fetches in flight (`SlotKind::Info` slots, counted by
    /// `insert_slot` and `remove_slot`), at most `max_relays`: each relay's
    /// fetch runs beside its websocket, so a burst of connects needs at
    /// most twice the sockets the operator allowed for, never more.
    info_inflight: usize,
}

impl Shell {
    /// Sets up the loop, the engine, DNS workers, TLS roots and the metrics listener.
    pub fn new(
        mut config: Config,
        opts: ShellOptions,
        sink: SinkTarget,
    ) -> Result<Shell, ShellError> {
        config.allow_private_addresses = opts.allow_private_addresses;
        let auth_keys = config.auth_keys.clone();
        let clock = Clock::new();
        let now = clock.now();
        let own_url = config.own_relay.clone();
        let bootstrap = config.bootstrap.clone();
        let engine = Engine::new(config, now).map_err(ShellError::Config)?;
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let resolver = Resolver::new(opts.dns_threads.max(1), 256, waker.clone())?;
        let tls = crate::shell::tls::client_config(&opts.extra_ca_files)?;
        let metrics = match opts.metrics {
            Some(addr) => Some(MetricsListener::bind(addr, poll.registry(), METRICS)?),
            None => None,
        };
        let mut trusted: HashSet<RelayId> = bootstrap
            .iter()
            .filter_map(|u| engine.relay_id(u))
            .collect();
        trusted.insert(engine.own_relay());
        let sink = match sink {
            SinkTarget::OwnRelay => SinkState::OwnRelay(Box::new(OwnSink {
                client: OwnRelayClient::new(
                    engine.relay_url(engine.own_relay()),
                    auth_keys,
                    opts.outbox_capacity,
                    now,
                ),
                slot: None,
            })),
            SinkTarget::Custom(s) => SinkState::Custom(s),
        };
        let ws_config = WebSocketConfig::default()
            .read_buffer_size(4 * 1024)
            .write_buffer_size(0)
            .max_write_buffer_size(4 << 20)
            .max_message_size(Some(opts.max_frame_bytes))
            .max_frame_size(Some(opts.max_frame_bytes));
        let mut timers = TimerWheel::new(now.as_millis());
        timers.insert((now + TRIM_EVERY).as_millis(), ShellTimer::Trim);
        let (tx, commands) = channel();
        let handle = ShellHandle {
            tx,
            waker: waker.clone(),
        };
        debug!("shell for {own_url} ready");
        Ok(Shell {
            poll,
            engine,
            opts,
            clock,
            slots: Slab::new(),
            generation: 0,
            relay_slots: HashMap::new(),
            trusted,
            resolver,
            tls,
            ws_config,
            sink,
            deferred: Vec::new(),
            ready_again: Vec::new(),
            metrics,
            commands,
            handle,
            timers,
            stats: ShellStats::default(),
            stopping: None,
            scratch: Vec::new(),
            active: false,
            info_inflight: 0,
        })
    }

    /// A handle for other threads (feed events, shut down).
    pub fn handle(&self) -> ShellHandle {
        self.handle.clone()
    }

    /// The address the metrics endpoint listens on, if any.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(MetricsListener::local_addr)
    }

    /// Runs until shut down (signal or handle); returns after the outbox is
    /// flushed or the shutdown deadline passed.
    pub fn run(mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        loop {
            let now = self.clock.now();
            self.drive(now);
            if self.finished(now) {
                info!("stopped");
                return Ok(());
            }
            let timeout = if self.ready_again.is_empty() {
                self.next_deadline().map(|t| t.since(self.clock.now()))
            } else {
                Some(Duration::ZERO)
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let now = self.clock.now();
            self.active |= !events.is_empty();
            for event in events.iter() {
                self.on_token(event.token(), now);
                self.drive(now);
            }
            for token in std::mem::take(&mut self.ready_again) {
                self.on_slot_ready(token, now);
                self.drive(now);
            }
            self.engine.handle_timeout(now);
            self.fire_timers(now);
        }
    }

    fn next_deadline(&self) -> Option<Time> {
        [
            self.engine.poll_timeout(),
            self.timers.next_deadline().map(Time::from_millis),
            self.stopping,
            self.sink_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Moves everything the engine and the sink want done until nothing moves.
    fn drive(&mut self, now: Time) {
        loop {
            let mut moved = false;
            while let Some(action) = self.engine.poll_action() {
                moved = true;
                if self.stopping.is_none() {
                    self.apply(action, now);
                }
            }
            while self.sink_has_room() {
                let Some(Output::Ingest { relay, event }) = self.engine.poll_output() else {
                    break;
                };
                moved = true;
                self.deliver(relay, *event);
            }
            moved |= self.pump_sink(now);
            if !moved {
                break;
            }
        }
    }

    fn apply(&mut self, action: Action, now: Time) {
        match action {
            Action::Connect { relay, url } => self.connect_relay(relay, &url, now),
            Action::Send { relay, message } => {
                self.stats.bytes_out += message.len() as u64;
                self.with_relay_ws(relay, now, |ws, out| ws.send_text(message, out));
            }
            Action::Ping { relay } => self.with_relay_ws(relay, now, |ws, out| ws.ping(out)),
            Action::ListLocal { request, filter } => self.list_sink(request, filter, now),
            Action::FetchInfo { relay, url } => self.fetch_info(relay, &url, now),
            Action::Disconnect { relay } => {
                if let Some(token) = self.relay_slots.remove(&relay) {
                    self.remove_slot(token);
                }
            }
        }
    }

    fn connect_relay(&mut self, relay: RelayId, url: &str, now: Time) {
        if let Some(old) = self.relay_slots.remove(&relay) {
            self.remove_slot(old);
        }
        let remote = self
            .relay_slots
            .keys()
            .filter(|r| **r != self.engine.own_relay())
            .count();
        if relay != self.engine.own_relay() && remote >= self.opts.max_relays {
            warn!(
                "{url}: relay cap of {} reached; not connecting",
                self.opts.max_relays
            );
            self.stats.relay_cap_refused += 1;
            self.engine.handle_connect_failed(now, relay);
            return;
        }
        let trusted = self.trusted.contains(&relay);
        let rate = ReadRate::new(self.opts.max_frames_per_sec, now);
        let kind = |conn| SlotKind::Relay {
            relay,
            conn,
            opened: false,
            rate,
            throttled: false,
        };
        match self.start_conn(url, Transport::Ws, trusted, now, kind) {
            Ok(token) => {
                self.relay_slots.insert(relay, token);
            }
            Err(reason) => {
                warn!("{url}: {reason}");
                self.engine.handle_connect_failed(now, relay);
            }
        }
    }

    /// Fetches the NIP-11 document of `relay` (websocket URL `url`) and
    /// answers `handle_relay_info` exactly once, however the fetch ends
    /// (document, failure, deadline, shutdown). Past the cap of fetches in
    /// flight the answer is `None` at once: the document only saves
    /// refusals we learn the limits from anyway.
    fn fetch_info(&mut self, relay: RelayId, url: &str, now: Time) {
        if self.info_inflight >= self.opts.max_relays.max(1) {
            debug!("{url}: NIP-11 fetch skipped; too many in flight");
            self.stats.relay_info_skipped += 1;
            return self.engine.handle_relay_info(now, relay, None);
        }
        if info_fetch::request(url).is_none() {
            self.stats.relay_info_failed += 1;
            debug!("{url}: no NIP-11 request for this URL");
            return self.engine.handle_relay_info(now, relay, None);
        }
        let trusted = self.trusted.contains(&relay);
        let kind = |conn| SlotKind::Info { relay, conn };
        match self.start_conn(url, Transport::Http, trusted, now, kind) {
            Ok(_) => {}
            Err(reason) => {
                debug!("{url}: NIP-11 fetch: {reason}");
                self.stats.relay_info_failed += 1;
                self.engine.handle_relay_info(now, relay, None);
            }
        }
    }

    /// A NIP-11 fetch got its response body: decode it and answer the engine.
    fn info_done(&mut self, token: Token, body: &[u8], now: Time) {
        let Some(SlotKind::Info { relay, .. }) = self.remove_slot(token) else {
            return;
        };
        let info = info_fetch::decode_document(body);
        if info.is_some() {
            self.stats.relay_info_ok += 1;
        } else {
            self.stats.relay_info_failed += 1;
            debug!(
                "{}: NIP-11 response is not a JSON object",
                self.engine.relay_url(relay)
            );
        }
        self.engine.handle_relay_info(now, relay, info);
    }

    /// Allocates a slot and starts resolving or connecting `url`.
    fn start_conn(
        &mut self,
        url: &str,
        transport: Transport,
        trusted: bool,
        now: Time,
        kind: impl FnOnce(Conn) -> SlotKind,
    ) -> Result<Token, ConnectError> {
        let (host, port) = host_and_port(url).ok_or(ConnectError::UnparsableUrl)?;
        let tls = if url.starts_with("wss://") {
            let name = ServerName::try_from(host.clone()).map_err(ConnectError::TlsName)?;
            Some(TlsTarget {
                config: self.tls.clone(),
                name,
            })
        } else {
            None
        };
        let conn = match ip_literal(&host) {
            Some(ip) => self.connect_ip(url, transport, ip, port, tls, trusted)?,
            None => Conn::Resolving {
                url: url.to_owned(),
                port,
                tls,
                trusted,
            },
        };
        let resolving = matches!(conn, Conn::Resolving { .. });
        let token = self.insert_slot(kind(conn))?;
        if resolving && let Err(e) = self.resolver.resolve(token.0 as u64, &host, port) {
            self.remove_slot(token);
            self.stats.dns_failures += 1;
            return Err(ConnectError::DnsQueue(e));
        }
        let deadline = match transport {
            Transport::Ws => CONNECT_DEADLINE,
            Transport::Http => info_fetch::DEADLINE,
        };
        self.timers.insert(
            (now + deadline).as_millis(),
            ShellTimer::ConnectDeadline(token),
        );
        Ok(token)
    }

    /// Starts connecting `ip` for `url` if the address guard allows it
    /// (`trusted`: the own and bootstrap relays skip it).
    fn connect_ip(
        &mut self,
        url: &str,
        transport: Transport,
        ip: IpAddr,
        port: u16,
        tls: Option<TlsTarget>,
        trusted: bool,
    ) -> Result<Conn, ConnectError> {
        if !trusted
            && !self.opts.allow_private_addresses
            && let Some(reason) = refusal_reason(ip)
        {
            self.stats.address_refused += 1;
            return Err(ConnectError::Refused { reason, ip });
        }
        let addr = SocketAddr::new(ip, port);
        match transport {
            Transport::Ws => WsConnection::connect(addr, url, tls, self.ws_config)
                .map(|ws| Conn::Ws(Box::new(ws))),
            Transport::Http => {
                let request = info_fetch::request(url).ok_or(ConnectError::NoHttpRequest)?;
                HttpGet::connect(addr, request, tls).map(|get| Conn::Http(Box::new(get)))
            }
        }
        .map_err(ConnectError::Connect)
    }

    fn insert_slot(&mut self, mut kind: SlotKind) -> Result<Token, ConnectError> {
        self.generation = (self.generation + 1) & 0x7fff_ffff;
        let entry = self.slots.vacant_entry();
        let token = slot_token(entry.key(), self.generation);
        if let Some(socket) = kind_socket(&mut kind) {
            self.poll
                .registry()
                .register(socket, token, Interest::READABLE | Interest::WRITABLE)
                .map_err(ConnectError::Register)?;
        }
        if matches!(kind, SlotKind::Info { .. }) {
            self.info_inflight += 1;
        }
        entry.insert(Slot {
            generation: self.generation,
            kind,
        });
        Ok(token)
    }

    fn slot_mut(&mut self, token: Token) -> Option<&mut Slot> {
        slot_in(&mut self.slots, token)
    }

    /// Frees a slot (closing its socket). Every slot enters through
    /// `insert_slot` and leaves through here, so the count of fetches in
    /// flight stays exact whichever way a fetch ends.
    fn remove_slot(&mut self, token: Token) -> Option<SlotKind> {
        self.slot_mut(token)?;
        let mut slot = self.slots.remove(token.0 & 0xffff_ffff);
        match &mut slot.kind {
            SlotKind::Relay {
                conn: Conn::Ws(ws), ..
            }
            | SlotKind::OwnSink {
                conn: Conn::Ws(ws), ..
            } => ws.close(),
            SlotKind::Info { .. } => self.info_inflight -= 1,
            _ => {}
        }
        Some(slot.kind)
    }

    fn with_relay_ws(
        &mut self,
        relay: RelayId,
        now: Time,
        f: impl FnOnce(&mut WsConnection, &mut Vec<WsEvent>),
    ) {
        let Some(&token) = self.relay_slots.get(&relay) else {
            return;
        };
        let mut out = std::mem::take(&mut self.scratch);
        if let Some(Slot {
            kind: SlotKind::Relay {
                conn: Conn::Ws(ws), ..
            },
            ..
        }) = self.slot_mut(token)
        {
            f(ws, &mut out);
        }
        self.handle_ws_events(token, &mut out, now);
        self.scratch = out;
    }

    fn on_token(&mut self, token: Token, now: Time) {
        match token {
            WAKER => self.on_wake(now),
            METRICS => self.accept_metrics(),
            _ => self.on_slot_ready(token, now),
        }
    }

    fn on_wake(&mut self, now: Time) {
        while let Some(resolved) = self.resolver.try_recv() {
            self.on_resolved(resolved, now);
        }
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::Feed(event) => self.engine.handle_local_event(now, *event),
                Command::Shutdown => self.begin_shutdown(now),
            }
        }
    }

    fn on_resolved(&mut self, resolved: Resolved, now: Time) {
        let token = Token(resolved.id as usize);
        let Some(slot) = self.slot_mut(token) else {
            return;
        };
        let transport = match slot.kind {
            SlotKind::Info { .. } => Transport::Http,
            _ => Transport::Ws,
        };
        let conn = match &mut slot.kind {
            SlotKind::Relay { conn, .. }
            | SlotKind::OwnSink { conn, .. }
            | SlotKind::Info { conn, .. } => conn,
            SlotKind::Metrics(_) => return,
        };
        let Conn::Resolving {
            url,
            port,
            tls,
            trusted,
        } = std::mem::replace(
            conn,
            Conn::Resolving {
                url: String::new(),
                port: 0,
                tls: None,
                trusted: false,
            },
        )
        else {
            return;
        };
        let addrs = match resolved.result {
            Ok(a) if !a.is_empty() => a,
            Ok(_) | Err(_) => {
                self.stats.dns_failures += 1;
                return self.fail_slot(token, "DNS lookup failed", now);
            }
        };
        let allowed = trusted || self.opts.allow_private_addresses;
        let Some(addr) = addrs
            .iter()
            .find(|a| allowed || refusal_reason(a.ip()).is_none())
        else {
            self.stats.address_refused += 1;
            return self.fail_slot(
                token,
                "resolves only to private addresses (see --allow-private-addresses)",
                now,
            );
        };
        match self.connect_ip(&url, transport, addr.ip(), port, tls, true) {
            Ok(mut connected) => {
                let registered = connected.socket().map(|s| {
                    self.poll
                        .registry()
                        .register(s, token, Interest::READABLE | Interest::WRITABLE)
                });
                if let Some(Err(e)) = registered {
                    return self.fail_slot(token, &ConnectError::Register(e).to_string(), now);
                }
                if let Some(Slot {
                    kind:
                        SlotKind::Relay { conn, .. }
                        | SlotKind::OwnSink { conn, .. }
                        | SlotKind::Info { conn, .. },
                    ..
                }) = self.slot_mut(token)
                {
                    *conn = connected;
                }
            }
            Err(reason) => self.fail_slot(token, &reason.to_string(), now),
        }
    }

    fn on_slot_ready(&mut self, token: Token, now: Time) {
        let sink_full = !self.sink_has_room();
        let own = self.engine.own_relay();
        let mut out = std::mem::take(&mut self.scratch);
        let mut again = false;
        let mut fetched = GetEvent::Pending;
        match self.slot_mut(token).map(|s| &mut s.kind) {
            Some(SlotKind::Relay {
                relay,
                conn: Conn::Ws(ws),
                rate,
                throttled,
                ..
            }) => {
                if *throttled {
                    // The Unthrottle timer reads it again.
                } else if sink_full && *relay != own {
                    self.deferred.push(token);
                } else {
                    let trusted = *relay == own;
                    match read_relay(ws, rate, trusted, now, &mut out) {
                        ReadEnd::Done => {}
                        ReadEnd::More => again = true,
                        ReadEnd::Throttled(until) => {
                            *throttled = true;
                            self.stats.reads_throttled += 1;
                            self.timers
                                .insert(until.as_millis(), ShellTimer::Unthrottle(token));
                        }
                    }
                }
            }
            Some(SlotKind::OwnSink {
                conn: Conn::Ws(ws), ..
            }) => again = ws.on_ready(&mut out, READ_BUDGET),
            Some(SlotKind::Info {
                conn: Conn::Http(get),
                ..
            }) => fetched = get.on_ready(),
            Some(SlotKind::Metrics(_)) => self.serve_metrics(token, now),
            _ => {}
        }
        match fetched {
            GetEvent::Pending => {}
            GetEvent::Done(body) => self.info_done(token, &body, now),
            GetEvent::Failed(reason) => self.fail_slot(token, &reason, now),
        }
        if again {
            self.ready_again.push(token);
        }
        self.handle_ws_events(token, &mut out, now);
        self.scratch = out;
    }

    fn unthrottle(&mut self, token: Token, now: Time) {
        if let Some(SlotKind::Relay { throttled, .. }) = self.slot_mut(token).map(|s| &mut s.kind) {
            *throttled = false;
            self.on_slot_ready(token, now);
        }
    }

    fn handle_ws_events(&mut self, token: Token, out: &mut Vec<WsEvent>, now: Time) {
        for event in out.drain(..) {
            let Some(slot) = self.slot_mut(token) else {
                return;
            };
            match (&mut slot.kind, event) {
                (SlotKind::Relay { relay, opened, .. }, WsEvent::Open) => {
                    *opened = true;
                    let relay = *relay;
                    self.engine.handle_connected(now, relay);
                }
                (SlotKind::Relay { relay, .. }, WsEvent::Text(text)) => {
                    let relay = *relay;
                    self.stats.bytes_in += text.len() as u64;
                    self.engine.handle_message(now, relay, &text);
                }
                (SlotKind::Relay { relay, .. }, WsEvent::Pong) => {
                    let relay = *relay;
                    self.engine.handle_pong(now, relay);
                }
                (SlotKind::OwnSink { opened, .. }, WsEvent::Open) => {
                    *opened = true;
                    if let SinkState::OwnRelay(own) = &mut self.sink {
                        own.client.handle_connected();
                    }
                }
                (SlotKind::OwnSink { .. }, WsEvent::Text(text)) => self.on_sink_message(&text, now),
                (SlotKind::Relay { relay, .. }, WsEvent::Violation(reason)) => {
                    let relay = *relay;
                    self.engine.handle_offence(now, relay, Offence::Protocol);
                    return self.fail_slot(token, &reason, now);
                }
                (SlotKind::Relay { relay, .. }, WsEvent::Refused(status)) => {
                    let relay = *relay;
                    self.drop_relay_slot(token, relay);
                    return self.engine.handle_connect_refused(now, relay, status);
                }
                (_, WsEvent::Violation(reason)) => return self.fail_slot(token, &reason, now),
                (_, WsEvent::Refused(status)) => {
                    return self.fail_slot(token, &format!("HTTP {status}"), now);
                }
                (_, WsEvent::Closed(reason)) => return self.fail_slot(token, &reason, now),
                _ => {}
            }
        }
    }

    /// Frees a relay's slot without telling the engine (the caller does).
    fn drop_relay_slot(&mut self, token: Token, relay: RelayId) {
        self.remove_slot(token);
        if self.relay_slots.get(&relay) == Some(&token) {
            self.relay_slots.remove(&relay);
        }
    }

    /// A connection ended: tell whoever owned it.
    fn fail_slot(&mut self, token: Token, reason: &str, now: Time) {
        let Some(kind) = self.remove_slot(token) else {
            return;
        };
        match kind {
            SlotKind::Relay { relay, opened, .. } => {
                debug!("{}: {reason}", self.engine.relay_url(relay));
                if self.relay_slots.get(&relay) == Some(&token) {
                    self.relay_slots.remove(&relay);
                }
                if opened {
                    self.engine.handle_disconnected(now, relay);
                } else {
                    self.engine.handle_connect_failed(now, relay);
                }
            }
            SlotKind::OwnSink { .. } => {
                if let SinkState::OwnRelay(own) = &mut self.sink {
                    warn!("own relay sink: {reason}");
                    own.slot = None;
                    own.client.handle_disconnected(now);
                }
            }
            SlotKind::Info { relay, .. } => {
                debug!("{}: NIP-11 fetch: {reason}", self.engine.relay_url(relay));
                self.stats.relay_info_failed += 1;
                self.engine.handle_relay_info(now, relay, None);
            }
            SlotKind::Metrics(_) => {}
        }
    }

    fn fire_timers(&mut self, now: Time) {
        while let Some((_, timer)) = self.timers.poll_expired(now.as_millis()) {
            match timer {
                ShellTimer::ConnectDeadline(token) => {
                    let pending = match self.slot_mut(token).map(|s| &s.kind) {
                        Some(SlotKind::Relay { opened, .. } | SlotKind::OwnSink { opened, .. }) => {
                            !opened
                        }
                        // A fetch leaves its slot when it ends.
                        Some(SlotKind::Info { .. }) => true,
                        _ => false,
                    };
                    if pending {
                        self.fail_slot(token, "connect timed out", now);
                    }
                }
                ShellTimer::Trim => self.trim(now),
                ShellTimer::Unthrottle(token) => self.unthrottle(token, now),
            }
        }
    }

    /// Returns heap memory freed since the last burst to the OS. Connecting
    /// thousands of relays allocates handshake buffers that are all freed
    /// moments later; glibc keeps them mapped, so without this the idle
    /// footprint stays at the burst's peak. Runs only after activity.
    fn trim(&mut self, now: Time) {
        if std::mem::take(&mut self.active) {
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: malloc_trim has no preconditions; it only releases free heap pages.
            unsafe {
                libc::malloc_trim(0);
            }
        }
        self.timers
            .insert((now + TRIM_EVERY).as_millis(), ShellTimer::Trim);
    }

    // ----- sink -----

    fn sink_has_room(&self) -> bool {
        match &self.sink {
            SinkState::OwnRelay(own) => own.client.has_room(),
            SinkState::Custom(_) => true,
        }
    }

    /// When the own-relay client wants to be called again (a reconnect, the
    /// end of an outbox pause).
    fn sink_timeout(&self) -> Option<Time> {
        match &self.sink {
            SinkState::OwnRelay(own) => own.client.poll_timeout(),
            SinkState::Custom(_) => None,
        }
    }

    fn deliver(&mut self, relay: RelayId, event: Event) {
        match &mut self.sink {
            SinkState::Custom(sink) => {
                self.stats.sink_stored += 1;
                sink.store(self.engine.relay_url(relay), event);
            }
            SinkState::OwnRelay(own) => own.client.push(event),
        }
    }

    /// Connects the own relay when its client asks, sends what the client
    /// has for the open connection, and resumes deferred reads once there
    /// is room. True if anything moved.
    fn pump_sink(&mut self, now: Time) -> bool {
        let SinkState::OwnRelay(own) = &mut self.sink else {
            return false;
        };
        if own.client.poll_connect(now) {
            let url = own.client.url().to_owned();
            self.connect_sink(&url, now);
            return true;
        }
        let (Some(token), true) = (own.slot, own.client.is_open()) else {
            return false;
        };
        let mut texts = Vec::new();
        while let Some(transmit) = own.client.poll_transmit(now) {
            if let Transmit::Publish(text) = &transmit {
                self.stats.bytes_out += text.len() as u64;
            }
            texts.push(transmit.into_text());
        }
        let has_room = own.client.has_room();
        let mut moved = !texts.is_empty();
        self.send_to_sink(token, texts, now);
        if has_room && !self.deferred.is_empty() {
            for token in std::mem::take(&mut self.deferred) {
                self.on_slot_ready(token, now);
            }
            moved = true;
        }
        moved
    }

    /// Starts the own-relay connection the client asked for.
    fn connect_sink(&mut self, url: &str, now: Time) {
        let kind = |conn| SlotKind::OwnSink {
            conn,
            opened: false,
        };
        let started = self.start_conn(url, Transport::Ws, true, now, kind);
        let SinkState::OwnRelay(own) = &mut self.sink else {
            return;
        };
        match started {
            Ok(token) => own.slot = Some(token),
            Err(reason) => {
                warn!("own relay sink: {reason}");
                own.client.handle_connect_error(now);
            }
        }
    }

    /// Sends texts on the own-relay connection.
    fn send_to_sink(&mut self, token: Token, texts: Vec<String>, now: Time) {
        if texts.is_empty() {
            return;
        }
        let mut out = std::mem::take(&mut self.scratch);
        if let Some(SlotKind::OwnSink {
            conn: Conn::Ws(ws), ..
        }) = self.slot_mut(token).map(|s| &mut s.kind)
        {
            for text in texts {
                ws.send_text(text, &mut out);
            }
        }
        self.handle_ws_events(token, &mut out, now);
        self.scratch = out;
    }

    /// Asks the sink what it holds for `filter` (negentropy). A custom sink
    /// answers at once; the own relay is asked by its client.
    fn list_sink(&mut self, request: u64, filter: Filter, now: Time) {
        match &mut self.sink {
            SinkState::Custom(sink) => {
                let held = sink.list(&filter);
                self.engine.handle_local_list(now, request, held);
            }
            SinkState::OwnRelay(own) => own.client.handle_list(request, filter),
        }
    }

    /// A text from the own relay: its client reads it, and the engine
    /// learns what came of it (what the relay took, what it listed). What
    /// the client answers goes out on the next `pump_sink`.
    fn on_sink_message(&mut self, text: &str, now: Time) {
        let SinkState::OwnRelay(own) = &mut self.sink else {
            return;
        };
        own.client.handle_message(now, text);
        while let Some(output) = own.client.poll_output() {
            match output {
                ClientOutput::Stored(event) => self.engine.handle_local_event(now, event),
                ClientOutput::Listed { request, held } => {
                    self.stats.sink_listed += held.len() as u64;
                    self.engine.handle_local_list(now, request, Some(held));
                }
            }
        }
    }

    // ----- shutdown -----

    fn begin_shutdown(&mut self, now: Time) {
        if self.stopping.is_some() {
            return;
        }
        self.stopping = Some(now + self.opts.shutdown_timeout);
        if let SinkState::OwnRelay(own) = &mut self.sink {
            own.client.handle_shutdown();
        }
        let relays: Vec<Token> = self.relay_slots.drain().map(|(_, t)| t).collect();
        for token in relays {
            self.remove_slot(token);
        }
        let fetches: Vec<Token> = self
            .slots
            .iter()
            .filter(|(_, s)| matches!(s.kind, SlotKind::Info { .. }))
            .map(|(key, s)| slot_token(key, s.generation))
            .collect();
        for token in fetches {
            self.fail_slot(token, "shutting down", now);
        }
    }

    fn finished(&mut self, now: Time) -> bool {
        let Some(deadline) = self.stopping else {
            return false;
        };
        let drained = match &self.sink {
            SinkState::OwnRelay(own) => own.client.is_drained(),
            SinkState::Custom(_) => true,
        };
        if drained || now >= deadline {
            if !drained {
                warn!("shutdown deadline passed with events still in the outbox");
            }
            let tokens: Vec<Token> = self
                .slots
                .iter()
                .map(|(key, s)| slot_token(key, s.generation))
                .collect();
            for token in tokens {
                self.remove_slot(token);
            }
            return true;
        }
        false
    }

    // ----- metrics -----

    fn accept_metrics(&mut self) {
        while let Some(conn) = self.metrics.as_ref().and_then(MetricsListener::accept) {
            if let Err(e) = self.insert_slot(SlotKind::Metrics(conn)) {
                warn!("metrics: {e}");
            }
        }
    }

    /// Serves a metrics client; the page is rendered only once it asked.
    fn serve_metrics(&mut self, token: Token, now: Time) {
        let view = self.sink_view();
        let (engine, stats) = (&self.engine, &self.stats);
        let Some(Slot {
            kind: SlotKind::Metrics(m),
            ..
        }) = slot_in(&mut self.slots, token)
        else {
            return;
        };
        if m.on_ready(|| render(engine, now, stats, &view)) {
            self.remove_slot(token);
        }
    }

    fn sink_view(&self) -> SinkView {
        match &self.sink {
            SinkState::OwnRelay(own) => SinkView {
                outbox_depth: own.client.outbox_depth(),
                outbox: own.client.outbox_stats(),
            },
            SinkState::Custom(_) => SinkView::default(),
        }
    }
}

/// Frames one connection may read per turn before the others get theirs.
const READ_BUDGET: usize = 64;

/// How a relay read ended.
enum ReadEnd {
    /// Nothing more waiting.
    Done,
    /// The turn's budget ran out; more may be waiting.
    More,
    /// The per-second allowance ran out; read again at this time.
    Throttled(Time),
}

/// One turn of reads from a relay connection, within the turn budget and
/// (unless `trusted`, the own relay) the connection's per-second allowance.
fn read_relay(
    ws: &mut WsConnection,
    rate: &mut ReadRate,
    trusted: bool,
    now: Time,
    out: &mut Vec<WsEvent>,
) -> ReadEnd {
    let allowance = if trusted {
        READ_BUDGET
    } else {
        rate.allowance(now).min(READ_BUDGET)
    };
    if allowance == 0 {
        return ReadEnd::Throttled(rate.refill_at());
    }
    let before = out.len();
    let more = ws.on_ready(out, allowance);
    rate.spend(out.len() - before);
    match (more, trusted || rate.allowance(now) > 0) {
        (false, _) => ReadEnd::Done,
        (true, true) => ReadEnd::More,
        (true, false) => ReadEnd::Throttled(rate.refill_at()),
    }
}

fn kind_socket(kind: &mut SlotKind) -> Option<&mut TcpStream> {
    match kind {
        SlotKind::Relay { conn, .. }
        | SlotKind::OwnSink { conn, .. }
        | SlotKind::Info { conn, .. } => conn.socket(),
        SlotKind::Metrics(m) => Some(m.socket()),
    }
}

/// The slot `token` names, unless it was freed (and maybe reused) since.
/// A function of the slab alone, so the rest of the shell stays borrowable.
fn slot_in(slots: &mut Slab<Slot>, token: Token) -> Option<&mut Slot> {
    let (key, generation) = (token.0 & 0xffff_ffff, (token.0 >> 32) as u32);
    slots.get_mut(key).filter(|s| s.generation == generation)
}

/// A slot's token: its generation above its slab key, so a token outlives
/// its slot harmlessly (a reused key gets a new generation).
fn slot_token(key: usize, generation: u32) -> Token {
    Token(((generation as usize) << 32) | key)
}

/// What a slot's connection speaks once connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// A websocket (relay or own-relay sink).
    Ws,
    /// One HTTP GET (a NIP-11 fetch).
    Http,
}
