//! The mio shell: one thread, one `Poll`, every socket.
//!
//! It only moves bytes and time. Relay connections live in a `Slab` under
//! generation-tagged tokens, so a readiness event or a DNS answer for a
//! dropped connection can never reach the connection that reused its slot.
//! The poll timeout is the engine's next deadline. DNS runs on worker
//! threads (`dns`) that wake the loop through one `Waker`. Synced events go
//! to the sink: the own relay over its own websocket with an outbox, or a
//! [`Sink`] supplied by an embedding relay. When the outbox is full the shell
//! stops reading remote relays' frames until it drains, so a slow own relay
//! slows syncing down instead of losing events (their handshakes and
//! keepalives go on: see `Shell::deferred`). What is said on the own-relay
//! connection (outbox, listings, AUTH, when to reconnect) is the sans-IO
//! `OwnRelayClient`; the shell only carries its texts.
//!
//! Two more things ride on the own-relay sink and the connections:
//!
//! - NIP-11 fetches (`Action::FetchInfo`): an HTTP GET per relay through the
//!   same DNS pool, address guard, TLS roots and slab as a websocket
//!   connect, bounded in bytes (the sans-IO `info_fetch`) and time
//!   (`info_fetch::DEADLINE`), each answered to the engine exactly once.
//! - The index follows the own relay (GRASP-01): an announcement or root
//!   event the own relay answers `OK true` (or `duplicate:`) is fed back to
//!   the engine, so a remotely found repo is synced only once the own relay
//!   took it. A custom sink's `Stored` answers are fed back the same way
//!   (`own_sink`); its embedder feeds what its own clients publish.
//!
//! # Files
//!
//! This file holds the [`Shell`]: its construction and the loop (`run`,
//! `drive`, `apply`, readiness dispatch, how a connection ends, timers,
//! shutdown, the metrics endpoint's slots). The rest, one concern each:
//!
//! - `options`, `error`, `handle`, `sink`, `report`: the public face
//!   ([`ShellOptions`], [`ShellError`], [`ShellHandle`], [`Sink`] and
//!   [`SinkTarget`], the stats and status the handle reports).
//! - `custom_sink`: an embedder's sink as the loop drives it.
//! - `clock`: the only wall-clock read.
//! - `slots`: the connection table and its generation-tagged tokens.
//! - `connect`: every connection's start, DNS answer, address guard and
//!   deadline; `connect_error` says why one failed.
//! - `read_budget`: how much one relay connection is read per turn and per
//!   second.
//! - `own_sink`: where synced events go; the own-relay connection's
//!   plumbing.
//! - `nip11`: the shell's side of NIP-11 fetches; their HTTP is
//!   `sans_io::wire::info_fetch`.
//! - `dns`, `tls`, `tls_stream`, `ws`: name lookups off the loop, TLS
//!   roots, a TLS client session that keeps no buffer while idle (rustls's
//!   unbuffered API over the loop-wide read buffer), websocket and HTTP
//!   transports.
//! - `metrics`, `process_metrics`, `health_check`, `metrics_server`,
//!   `metrics_pages`: the counters, the process's figures from `/proc`,
//!   what `/healthz` says, the listener serving them, and the rendered
//!   pages its connections share.
//! - `status`, `status_page`: the operator's view (`/status.json`,
//!   `/status`), with the first sync's progress the loop samples.
//! - `key_file`, `rlimit`: the AUTH key file and the file-descriptor limit,
//!   for the binary.
//!
//! [`Sink`]: sink::Sink

mod clock;
mod connect;
pub(crate) mod connect_error;
mod custom_sink;
pub(crate) mod dns;
mod error;
mod handle;
mod health_check;
pub(crate) mod key_file;
pub(crate) mod metrics;
mod metrics_pages;
pub(crate) mod metrics_server;
mod nip11;
mod options;
mod own_sink;
mod process_metrics;
pub(crate) mod read_budget;
mod ready_again;
pub(crate) mod report;
pub(crate) mod rlimit;
pub(crate) mod sink;
mod slots;
mod state_file;
pub(crate) mod status;
mod status_page;
mod tcp_options;
pub(crate) mod tls;
pub(crate) mod tls_stream;
pub(crate) mod ws;
mod ws_upgrade;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use log::{debug, info, warn};
use mio::{Events, Poll, Token, Waker};
use rustls::ClientConfig;
use tungstenite::protocol::WebSocketConfig;

pub use crate::shell::error::ShellError;
pub use crate::shell::handle::ShellHandle;
pub use crate::shell::options::{DnsLookup, ShellOptions};
pub use crate::shell::sink::SinkTarget;

use crate::sans_io::config::Config;
use crate::sans_io::engine::{Action, Engine, Offence, Output};
use crate::sans_io::memory::index::RelayId;
use crate::sans_io::progress::FirstSync;
use crate::sans_io::timing::time::Time;
use crate::sans_io::timing::timer::TimerWheel;
use crate::shell::clock::Clock;
use crate::shell::connect::Transport;
use crate::shell::dns::Resolver;
use crate::shell::handle::Command;
use crate::shell::health_check::{Link, verdict};
use crate::shell::metrics::{ShellStats, SinkView, render, render_progress};
use crate::shell::metrics_pages::{PAGES_BYTES_MAX, PageKey, Pages};
use crate::shell::metrics_server::{
    Answer, METRICS_CONNECTIONS_MAX, METRICS_DEADLINE, MetricsConn, MetricsListener, Reading,
    Request, Resource,
};
use crate::shell::own_sink::SinkState;
use crate::shell::read_budget::{
    GLOBAL_FRAMES_PER_SEC, READ_BUDGET, ReadEnd, ReadRate, read_relay,
};
use crate::shell::ready_again::ReadyAgain;
use crate::shell::slots::{Conn, Slot, SlotKind, Slots};
use crate::shell::state_file::StateFile;
use crate::shell::status::Window;
use crate::shell::ws::{Deadline, GetEvent, READ_BUFFER_BYTES, WsConnection, WsEvent};

/// The poll token of the `Waker` (DNS answers, handle commands). Slot
/// tokens never reach it or `METRICS` (see `slots`).
const WAKER: Token = Token(usize::MAX);
/// The poll token of the metrics listener.
const METRICS: Token = Token(usize::MAX - 2);

/// The shell's own timers, beside the engine's deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ShellTimer {
    ConnectDeadline(Token),
    Trim,
    /// A throttled relay connection may read again.
    Unthrottle(Token),
    /// A metrics connection's time is up.
    MetricsDeadline(Token),
    /// A relay connection's unfinished message may have overstayed.
    Unfinished(Token),
    /// Time to write the state file.
    SaveState,
    /// Time to sample the first sync's progress.
    Progress,
}

/// How often the first sync's progress (and the sink's pace) is sampled
/// while the first sync runs.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// How often the sink's pace is sampled once the first sync is done: an
/// idle engine should not wake twelve times a minute for a rate over the
/// last minute, and two samples in that minute still give it.
const PACE_EVERY: Duration = Duration::from_secs(30);

/// What we hold for one peer's unsent frames at most (what the socket did
/// not take, see `ws`), unless a frame we may send is larger: then
/// twice the largest frame, so one can wait behind another.
const WRITE_CAP: usize = 1 << 20;

/// How often memory freed after a burst is handed back to the OS while
/// the engine works.
const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Once the engine rests, trims come at doubling intervals up to this:
/// a burst is freed in steps for minutes after it (its requests' timers
/// fire up to two minutes later, and long-lived timers move down the
/// timer slab as they are re-armed), while a long idle costs a wake-up
/// every few minutes only.
const TRIM_IDLE_MAX: Duration = Duration::from_secs(600);

/// The event loop.
pub struct Shell {
    poll: Poll,
    engine: Engine,
    opts: ShellOptions,
    clock: Clock,
    slots: Slots,
    relay_slots: HashMap<RelayId, Token>,
    trusted: HashSet<RelayId>,
    resolver: Resolver,
    tls: Arc<ClientConfig>,
    ws_config: WebSocketConfig,
    sink: SinkState,
    /// Remote relay connections with frames waiting that are not read while
    /// the sink is full, each once; `pump_sink` reads them once it has
    /// room. Only frames wait: handshakes in progress are finished (they
    /// read no frame), and the relay's keepalive counts its waiting bytes
    /// as its answer (`defer`, `ping`). So an own-relay outage costs the
    /// remote relays nothing, and memory stays bounded: nothing is read
    /// that the sink could not take.
    deferred: BTreeSet<Token>,
    /// Connections whose read budget ran out with data maybe waiting; read
    /// again on the next turn, after every other ready socket had its turn.
    ready_again: ReadyAgain,
    metrics: Option<MetricsListener>,
    /// Metrics connections, oldest first (some maybe closed already).
    metrics_conns: VecDeque<Token>,
    /// Pages rendered for metrics connections, shared while fresh.
    pages: Pages,
    commands: Receiver<Command>,
    handle: ShellHandle,
    timers: TimerWheel<ShellTimer>,
    stats: ShellStats,
    stopping: Option<Time>,
    /// `--state-file`, held while the shell runs.
    state_file: Option<StateFile>,
    /// The state file's last write: when and its size, or why it failed.
    last_save: Option<(Time, Result<u64, String>)>,
    /// When the shell started, for the status page.
    started: Time,
    /// The first sync's progress, sampled every [`PROGRESS_EVERY`].
    first_sync: FirstSync,
    scratch: Vec<WsEvent>,
    /// The one buffer every relay socket is read into (see `ws`).
    read_buf: Box<[u8]>,
    /// Frames all remote relays may still read this second.
    global_rate: ReadRate,
    /// The engine's work count ([`Shell::work_done`]) at the last trim.
    trimmed_at: u64,
    /// Trims since the engine last worked: each waits twice as long.
    quiet_trims: u32,
    /// The engine's NIP-11 fetches waiting for one in flight to end.
    info_waiting: VecDeque<RelayId>,
    /// Waiting fetches are being started (one failing at once must not
    /// start the rest from inside).
    info_starting: bool,
}

impl Shell {
    /// Sets up the loop, the engine, DNS workers, TLS roots and the metrics listener.
    pub fn new(config: Config, opts: ShellOptions, sink: SinkTarget) -> Result<Shell, ShellError> {
        Shell::with_sink(config, opts, |_| sink)
    }

    /// [`Shell::new`] for a sink that needs the shell's handle (to call
    /// [`ShellHandle::sink_ready`] or [`ShellHandle::listed`] from its
    /// own tasks, or to give it to the store's hook that feeds the
    /// index): `make_sink` gets it before the shell exists, so nothing
    /// has to wait for it in a `OnceLock`.
    pub fn with_sink(
        mut config: Config,
        opts: ShellOptions,
        make_sink: impl FnOnce(&ShellHandle) -> SinkTarget,
    ) -> Result<Shell, ShellError> {
        // One switch, set in either place (see ShellOptions).
        let allow_private = config.allow_private_addresses || opts.allow_private_addresses;
        config.allow_private_addresses = allow_private;
        let mut opts = opts;
        opts.allow_private_addresses = allow_private;
        let auth_keys = own_relay_keys(&config);
        let clock = Clock::new();
        let now = clock.now();
        let own_url = config.own_relay.clone();
        let bootstrap = config.bootstrap.clone();
        let relay_info = config.relay_info;
        let mut engine = Engine::new(config, now).map_err(ShellError::Config)?;
        let state_file = match &opts.state_file {
            Some(path) => Some(
                StateFile::open(path).map_err(|error| ShellError::StateFile {
                    path: path.clone(),
                    error,
                })?,
            ),
            None => None,
        };
        let mut left_in_outbox = Vec::new();
        if let Some(mut saved) = state_file.as_ref().and_then(|f| f.load(clock.unix_secs())) {
            left_in_outbox = std::mem::take(&mut saved.outbox);
            engine.restore_state(now, clock.unix_secs(), saved);
        }
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let (handle, commands) = ShellHandle::new(waker.clone());
        let sink = make_sink(&handle);
        let resolver = match opts.dns_lookup {
            Some(lookup) => {
                Resolver::with_lookup(opts.dns_threads.max(1), 256, waker.clone(), lookup)?
            }
            None => Resolver::new(opts.dns_threads.max(1), 256, waker.clone())?,
        };
        let tls = crate::shell::tls::client_config(&opts.extra_ca_files)?;
        let metrics = match opts.metrics {
            Some(addr) => Some(
                MetricsListener::bind(addr, poll.registry(), METRICS)
                    .map_err(|error| ShellError::Metrics { addr, error })?,
            ),
            None => None,
        };
        let mut trusted: HashSet<RelayId> = bootstrap
            .iter()
            .filter_map(|u| engine.relay_id(u))
            .collect();
        trusted.insert(engine.own_relay());
        let mut sink = SinkState::new(
            sink,
            engine.relay_url(engine.own_relay()),
            auth_keys,
            opts.outbox_capacity,
            relay_info,
            now,
        );
        sink.restore_outbox(left_in_outbox, now);
        // Only the caps are used: the frames are ours (`ws`), with no
        // per-connection buffers to size.
        let ws_config = WebSocketConfig::default()
            .max_write_buffer_size(WRITE_CAP.max(2 * (opts.max_frame_bytes + 14)))
            .max_message_size(Some(opts.max_frame_bytes))
            .max_frame_size(Some(opts.max_frame_bytes));
        let mut timers = TimerWheel::new(now.as_millis());
        timers.insert((now + TRIM_EVERY).as_millis(), ShellTimer::Trim);
        if state_file.is_some() {
            let at = now + opts.state_save_every;
            timers.insert(at.as_millis(), ShellTimer::SaveState);
        }
        timers.insert((now + PROGRESS_EVERY).as_millis(), ShellTimer::Progress);
        debug!("shell for {own_url} ready");
        Ok(Shell {
            poll,
            engine,
            opts,
            clock,
            slots: Slots::default(),
            relay_slots: HashMap::new(),
            trusted,
            resolver,
            tls,
            ws_config,
            sink,
            deferred: BTreeSet::new(),
            ready_again: ReadyAgain::default(),
            metrics,
            metrics_conns: VecDeque::new(),
            pages: Pages::default(),
            commands,
            handle,
            timers,
            stats: ShellStats::default(),
            stopping: None,
            state_file,
            last_save: None,
            started: now,
            first_sync: FirstSync::new(now),
            scratch: Vec::new(),
            read_buf: vec![0; READ_BUFFER_BYTES].into_boxed_slice(),
            global_rate: ReadRate::new(GLOBAL_FRAMES_PER_SEC, now),
            trimmed_at: 0,
            quiet_trims: 0,
            info_waiting: VecDeque::new(),
            info_starting: false,
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

    /// Runs the loop on a thread of its own (named `grasp-sync`): the
    /// handle to feed and stop it, and the thread to join for its end
    /// ([`Shell::run`]'s result).
    pub fn spawn(self) -> io::Result<(ShellHandle, std::thread::JoinHandle<io::Result<()>>)> {
        let handle = self.handle();
        let thread = std::thread::Builder::new()
            .name("grasp-sync".to_owned())
            .spawn(move || self.run())?;
        Ok((handle, thread))
    }

    /// Runs on the calling thread until [`ShellHandle::shutdown`] (the one
    /// way to stop it: the library installs no signal handler; the binary
    /// calls `shutdown` on SIGINT/SIGTERM) or a poll error; returns after
    /// the sink is flushed or the shutdown deadline
    /// (`ShellOptions::shutdown_timeout`) passed.
    pub fn run(mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        self.fetch_sink_info(self.clock.now());
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
            let ready = events.iter().map(|e| e.token());
            for token in self.ready_again.take_turn(ready) {
                self.on_token(token, now);
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
                let Some(Output::Ingest {
                    relay,
                    event,
                    received,
                }) = self.engine.poll_output()
                else {
                    break;
                };
                moved = true;
                self.deliver(relay, *event, received, now);
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
            Action::Ping { relay } => self.ping(relay, now),
            Action::ListLocal { request, filter } => self.list_sink(request, filter, now),
            Action::FetchInfo { relay, url } => self.fetch_info(relay, &url, now),
            Action::Disconnect { relay } => {
                if let Some(token) = self.relay_slots.remove(&relay) {
                    self.slots.remove(token);
                }
            }
        }
    }

    fn connect_relay(&mut self, relay: RelayId, url: &str, now: Time) {
        if let Some(old) = self.relay_slots.remove(&relay) {
            self.slots.remove(old);
        }
        let remote = self
            .relay_slots
            .keys()
            .filter(|r| **r != self.engine.own_relay())
            .count();
        if relay != self.engine.own_relay() && remote >= self.opts.max_relays {
            self.stats.relay_cap_refused += 1;
            let cause = format!("relay cap of {} reached", self.opts.max_relays);
            self.engine
                .handle_connect_failed_because(now, relay, &cause);
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
            held: 0,
        };
        match self.start_conn(url, Transport::Ws, trusted, now, kind) {
            Ok(token) => {
                self.relay_slots.insert(relay, token);
            }
            Err(reason) => {
                let cause = reason.to_string();
                self.engine
                    .handle_connect_failed_because(now, relay, &cause);
            }
        }
    }

    /// Pings a relay, unless its reads are deferred: then its answer would
    /// wait unread behind frames it already sent, and those are its sign
    /// of life (our reads wait, not the relay).
    fn ping(&mut self, relay: RelayId, now: Time) {
        let token = self.relay_slots.get(&relay);
        if token.is_some_and(|t| self.deferred.contains(t)) {
            return self.engine.handle_pong(now, relay);
        }
        self.with_relay_ws(relay, now, |ws, out| ws.ping(out));
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
        }) = self.slots.get_mut(token)
        {
            f(ws, &mut out);
        }
        self.handle_ws_events(token, &mut out, now);
        self.scratch = out;
    }

    fn on_token(&mut self, token: Token, now: Time) {
        match token {
            WAKER => self.on_wake(now),
            METRICS => self.accept_metrics(now),
            _ => self.on_slot_ready(token, now),
        }
    }

    fn on_wake(&mut self, now: Time) {
        while let Some(resolved) = self.resolver.try_recv() {
            self.on_resolved(resolved, now);
        }
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::Feed(events) => {
                    for event in events {
                        self.engine.handle_local_event(now, event);
                    }
                }
                Command::SinkReady => self.sink_ready(),
                Command::Listed { request, held } => self.sink_listed(request.0, held, now),
                Command::Unlisted(request) => self.engine.handle_local_unlisted(now, request.0),
                Command::Stats(reply) => {
                    let view = self.sink_view();
                    // A caller gone before the answer wants nothing.
                    let _ = reply.send(report::stats(&self.engine, &self.stats, &view));
                }
                Command::Status(reply) => {
                    let view = self.sink_view();
                    let full = !self.sink_has_room();
                    let _ = reply.send(report::status(&self.engine, now, &view, full));
                }
                Command::Shutdown => self.begin_shutdown(now),
            }
        }
    }

    fn on_slot_ready(&mut self, token: Token, now: Time) {
        let sink_full = !self.sink_has_room();
        let own = self.engine.own_relay();
        let mut out = std::mem::take(&mut self.scratch);
        let mut again = false;
        let mut fetched = GetEvent::Pending;
        let mut defer = None;
        let mut held = None;
        match self.slots.get_mut(token).map(|s| &mut s.kind) {
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
                    if !ws.is_open() {
                        // No frame is read: the handshake meets its deadline.
                        again = ws.on_ready(&mut out, 0, now, &mut self.read_buf) && !ws.is_open();
                    }
                    defer = Some(*relay);
                } else {
                    let trusted = *relay == own;
                    let global = &mut self.global_rate;
                    let buf = &mut self.read_buf;
                    let end = read_relay(ws, rate, global, trusted, now, &mut out, buf);
                    // The own relay's data is never cut for its pace.
                    if !trusted && let Some(due) = ws.deadline_to_arm(self.opts.unfinished_timeout)
                    {
                        self.timers
                            .insert(due.as_millis(), ShellTimer::Unfinished(token));
                    }
                    held = (!trusted).then(|| ws.held());
                    match end {
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
            }) => again = ws.on_ready(&mut out, READ_BUDGET, now, &mut self.read_buf),
            Some(SlotKind::Info {
                conn: Conn::Http(get),
                ..
            }) => fetched = get.on_ready(),
            Some(SlotKind::Metrics(_)) => self.serve_metrics(token, now),
            _ => {}
        }
        match fetched {
            GetEvent::Pending => {}
            GetEvent::More => again = true,
            GetEvent::Done(body) => self.info_done(token, &body, now),
            GetEvent::Failed(reason) => self.fail_slot(token, &reason, now),
        }
        if let Some(relay) = defer {
            self.defer(token, relay, now);
        }
        if again {
            self.ready_again.insert(token);
        }
        self.handle_ws_events(token, &mut out, now);
        self.scratch = out;
        if let Some(held) = held
            && self.slots.set_held(token, held) > self.opts.max_unfinished_bytes
            && held > 0
        {
            self.fail_slot(token, "unfinished messages over the global cap", now);
        }
    }

    /// An unfinished message's deadline: a relay still in the middle of
    /// it is cut (it costs that relay a reconnect with backoff, nobody
    /// else anything).
    fn unfinished_deadline(&mut self, token: Token, now: Time) {
        let limit = self.opts.unfinished_timeout;
        let sink_full = !self.sink_has_room();
        let Some(SlotKind::Relay {
            conn: Conn::Ws(ws),
            throttled,
            ..
        }) = self.slots.get_mut(token).map(|s| &mut s.kind)
        else {
            return;
        };
        match ws.check_deadline(now, limit, sink_full || *throttled) {
            Deadline::Passed => {
                self.stats.unfinished_cut += 1;
                let reason = format!("message unfinished for {limit:?}");
                self.fail_slot(token, &reason, now);
            }
            Deadline::Rearm(due) => {
                self.timers
                    .insert(due.as_millis(), ShellTimer::Unfinished(token));
            }
            Deadline::Clear => {}
        }
    }

    /// Leaves a relay's frames unread until the sink has room. Bytes came
    /// (that is what readiness says): a sign of life for its keepalive.
    fn defer(&mut self, token: Token, relay: RelayId, now: Time) {
        self.deferred.insert(token);
        self.engine.handle_pong(now, relay);
        self.engine.handle_reads_paused(relay);
    }

    /// The relay of slot `token`, if it is a relay's.
    fn slot_relay(&mut self, token: Token) -> Option<RelayId> {
        match self.slots.get_mut(token).map(|s| &s.kind) {
            Some(SlotKind::Relay { relay, .. }) => Some(*relay),
            _ => None,
        }
    }

    fn unthrottle(&mut self, token: Token, now: Time) {
        if let Some(SlotKind::Relay { throttled, .. }) =
            self.slots.get_mut(token).map(|s| &mut s.kind)
        {
            *throttled = false;
            self.on_slot_ready(token, now);
        }
    }

    fn handle_ws_events(&mut self, token: Token, out: &mut Vec<WsEvent>, now: Time) {
        for event in out.drain(..) {
            let Some(slot) = self.slots.get_mut(token) else {
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
                (SlotKind::Relay { relay, .. }, WsEvent::Oversized(bytes)) => {
                    let relay = *relay;
                    self.engine.handle_oversized(now, relay, bytes);
                }
                (SlotKind::OwnSink { opened, .. }, WsEvent::Open) => {
                    *opened = true;
                    self.on_sink_open();
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
        self.slots.remove(token);
        if self.relay_slots.get(&relay) == Some(&token) {
            self.relay_slots.remove(&relay);
        }
    }

    /// A connection ended: tell whoever owned it.
    fn fail_slot(&mut self, token: Token, reason: &str, now: Time) {
        let Some(kind) = self.slots.remove(token) else {
            return;
        };
        match kind {
            SlotKind::Relay { relay, opened, .. } => {
                if self.relay_slots.get(&relay) == Some(&token) {
                    self.relay_slots.remove(&relay);
                }
                if opened {
                    self.engine.handle_disconnected_because(now, relay, reason);
                } else {
                    self.engine
                        .handle_connect_failed_because(now, relay, reason);
                }
            }
            SlotKind::OwnSink { .. } => self.on_sink_closed(reason, now),
            SlotKind::Info { relay, answer, .. } => {
                debug!("{}: NIP-11 fetch: {reason}", self.engine.relay_url(relay));
                self.info_failed(relay, answer, now);
            }
            SlotKind::Metrics(_) => {}
        }
    }

    fn fire_timers(&mut self, now: Time) {
        while let Some((_, timer)) = self.timers.poll_expired(now.as_millis()) {
            match timer {
                ShellTimer::ConnectDeadline(token) => {
                    let pending = match self.slots.get_mut(token).map(|s| &s.kind) {
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
                ShellTimer::MetricsDeadline(token) => {
                    if let Some(SlotKind::Metrics(_)) = self.slots.get_mut(token).map(|s| &s.kind) {
                        self.slots.remove(token);
                    }
                }
                ShellTimer::Unfinished(token) => self.unfinished_deadline(token, now),
                ShellTimer::SaveState => {
                    self.save_state(now);
                    let at = now + self.opts.state_save_every;
                    self.timers.insert(at.as_millis(), ShellTimer::SaveState);
                }
                ShellTimer::Progress => {
                    self.sample_progress(now);
                    let every = match self.first_sync.progress().finished {
                        None => PROGRESS_EVERY,
                        Some(_) => PACE_EVERY,
                    };
                    let at = now + every;
                    self.timers.insert(at.as_millis(), ShellTimer::Progress);
                }
            }
        }
    }

    /// Returns heap memory freed since the last burst to the OS. Connecting
    /// thousands of relays allocates handshake buffers that are all freed
    /// moments later; glibc keeps them mapped, so without this the idle
    /// footprint stays at the burst's peak. Collections that grew in the
    /// burst give their room back first. Every `TRIM_EVERY` while the
    /// engine works, then less and less often (`TRIM_IDLE_MAX`).
    fn trim(&mut self, now: Time) {
        let work = self.work_done();
        if work != std::mem::replace(&mut self.trimmed_at, work) {
            self.quiet_trims = 0;
        } else {
            self.quiet_trims = self.quiet_trims.saturating_add(1);
        }
        self.engine.shrink_to_fit();
        self.sink_shrink_to_fit();
        self.timers.shrink_to_fit();
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim has no preconditions; it only releases free heap pages.
        unsafe {
            libc::malloc_trim(0);
        }
        let wait = TRIM_EVERY
            .saturating_mul(1 << self.quiet_trims.min(16))
            .min(TRIM_IDLE_MAX);
        self.timers
            .insert((now + wait).as_millis(), ShellTimer::Trim);
    }

    /// What the engine did that allocates: REQs, events, connects. Keepalive
    /// pings and pongs are not work: counting every readable socket as
    /// activity made an idle engine at 5,000 relays (a pong a second or
    /// more) shrink and trim its heap every 10 s, for nothing.
    fn work_done(&self) -> u64 {
        let s = self.engine.stats();
        s.reqs_sent + s.events_received + s.connects + s.connect_failures
    }

    /// Writes the engine's state to the state file, if there is one: on
    /// the loop thread, bounded and every few minutes (`state_file`).
    fn save_state(&mut self, now: Time) {
        if self.state_file.is_none() {
            return;
        }
        let outbox = self.sink_leftovers(now);
        let unsettled = self.sink_unsettled();
        let mut state = self
            .engine
            .save_state(now, self.clock.unix_secs(), unsettled);
        state.outbox = outbox;
        let Some(file) = &mut self.state_file else {
            return;
        };
        let saved = file.save(&state);
        match &saved {
            Ok(bytes) => info!(
                "state file: {} relays, {bytes} bytes, written in {} ms",
                state.relays.len(),
                self.clock.now().since(now).as_millis()
            ),
            Err(e) => warn!("--state-file {}: {e}; not saved", file.path().display()),
        }
        self.last_save = Some((now, saved.map(|b| b as u64).map_err(|e| e.to_string())));
    }

    // ----- shutdown -----

    fn begin_shutdown(&mut self, now: Time) {
        if self.stopping.is_some() {
            return;
        }
        self.stopping = Some(now + self.opts.shutdown_timeout);
        self.save_state(now);
        self.sink_shutdown();
        self.skip_waiting_info(now);
        let relays: Vec<Token> = self.relay_slots.drain().map(|(_, t)| t).collect();
        for token in relays {
            self.slots.remove(token);
        }
        let fetches: Vec<Token> = self
            .slots
            .iter()
            .filter(|(_, kind)| matches!(kind, SlotKind::Info { .. }))
            .map(|(token, _)| token)
            .collect();
        for token in fetches {
            self.fail_slot(token, "shutting down", now);
        }
    }

    fn finished(&mut self, now: Time) -> bool {
        let Some(deadline) = self.stopping else {
            return false;
        };
        let drained = self.sink_drained();
        if drained || now >= deadline {
            if !drained {
                let left = self.sink_view().outbox_depth;
                let kept = if self.state_file.is_some() {
                    "kept in the state file, offered first at the next start"
                } else {
                    "not stored on the own relay; the next full sync fetches them again"
                };
                warn!("shutdown deadline passed with {left} events still in the outbox ({kept})");
            }
            // What the flush left (or refused for good meanwhile) outlives
            // this process.
            self.save_state(now);
            let tokens: Vec<Token> = self.slots.iter().map(|(token, _)| token).collect();
            for token in tokens {
                self.slots.remove(token);
            }
            return true;
        }
        false
    }

    // ----- metrics -----

    /// Takes every waiting metrics client, each under its deadline, making
    /// room by closing the oldest once [`METRICS_CONNECTIONS_MAX`] are held.
    fn accept_metrics(&mut self, now: Time) {
        while let Some(conn) = self.metrics.as_ref().and_then(MetricsListener::accept) {
            self.metrics_conns
                .retain(|&t| matches!(self.slots.get_mut(t), Some(s) if matches!(s.kind, SlotKind::Metrics(_))));
            if self.metrics_conns.len() >= METRICS_CONNECTIONS_MAX
                && let Some(oldest) = self.metrics_conns.pop_front()
            {
                self.stats.metrics_evicted += 1;
                self.slots.remove(oldest);
            }
            match self
                .slots
                .insert(SlotKind::Metrics(Box::new(conn)), self.poll.registry())
            {
                Ok(token) => {
                    self.metrics_conns.push_back(token);
                    self.timers.insert(
                        (now + METRICS_DEADLINE).as_millis(),
                        ShellTimer::MetricsDeadline(token),
                    );
                }
                Err(e) => warn!("metrics: {e}"),
            }
        }
    }

    /// Samples the first sync's progress and logs it when due (once a
    /// minute at most while it runs, once when it completes).
    fn sample_progress(&mut self, now: Time) {
        let view = self.sink_view();
        let stored = view.stored_new(&self.stats);
        let settled = view.outbox_depth == 0 && self.engine.outputs_waiting() == 0;
        if let Some(line) = self.first_sync.observe(&self.engine, stored, settled, now) {
            info!("{}", self.first_sync.progress().line(line, now));
        }
    }

    /// The state file's part of the status view.
    fn state_file_status(&self) -> Option<status::StateFileStatus> {
        let file = self.state_file.as_ref()?;
        let (at, saved) = match &self.last_save {
            Some((at, saved)) => (Some(at.as_secs()), Some(saved)),
            None => (None, None),
        };
        Some(status::StateFileStatus {
            path: file.path().display().to_string(),
            saved_at: at.filter(|_| saved.is_some_and(Result::is_ok)),
            saved_bytes: saved.and_then(|s| s.as_ref().ok().copied()),
            error: saved.and_then(|s| s.as_ref().err().cloned()),
        })
    }

    /// When the state file was last written, for `/metrics`.
    fn saved_at(&self) -> Option<Time> {
        match &self.last_save {
            Some((at, Ok(_))) => Some(*at),
            _ => None,
        }
    }

    /// Serves a metrics client: reads its head, answers it once complete
    /// (nothing about the engine is looked at before), writes the answer.
    fn serve_metrics(&mut self, token: Token, now: Time) {
        let Some(conn) = self.metrics_conn(token) else {
            return;
        };
        match conn.read_request() {
            Reading::Gone => {
                self.slots.remove(token);
                return;
            }
            Reading::Waiting => return,
            Reading::Answered => {}
            Reading::Complete(request) => {
                let answer = self.answer_metrics(&request, now);
                if let Some(conn) = self.metrics_conn(token) {
                    conn.answer(answer);
                }
            }
        }
        if self.metrics_conn(token).is_some_and(MetricsConn::write) {
            self.slots.remove(token);
        }
    }

    fn metrics_conn(&mut self, token: Token) -> Option<&mut MetricsConn> {
        match self.slots.get_mut(token) {
            Some(Slot {
                kind: SlotKind::Metrics(conn),
                ..
            }) => Some(conn),
            _ => None,
        }
    }

    /// The answer to a complete request: refused for its `Host`, not
    /// found, `/healthz` (always current, it is small), headers alone for
    /// `HEAD`, else the page, shared while fresh and rendered only if
    /// the port's pages leave room.
    fn answer_metrics(&mut self, request: &Request, now: Time) -> Answer {
        if !request.host_allowed(&self.opts.metrics_hosts) {
            return Answer::misdirected();
        }
        let Some(resource) = request.resource else {
            return Answer::not_found();
        };
        if resource == Resource::Health {
            let answer = match self.health(&self.sink_view()) {
                Ok(()) => Answer::text("200 OK", "ok\n"),
                Err(why) => Answer::text("503 Service Unavailable", &format!("{why}\n")),
            };
            return if request.get {
                answer
            } else {
                answer.without_body()
            };
        }
        if !request.get {
            return Answer::head_only(resource);
        }
        let key = PageKey::new(resource, request.window);
        if let Some(body) = self.pages.get(key, now) {
            return Answer::page(resource, body);
        }
        if !self.pages.has_room(now) {
            let held = self.pages.held();
            return Answer::text(
                "503 Service Unavailable",
                &format!(
                    "busy: {held} bytes of pages held (at most {PAGES_BYTES_MAX}); try again\n"
                ),
            );
        }
        let body = self.render_page(resource, request.window, now);
        self.pages.insert(key, now, Arc::clone(&body));
        Answer::page(resource, body)
    }

    /// Renders `resource` (`/status.json`'s relays of `window`), timed in
    /// the debug log: it runs on the loop thread.
    fn render_page(&mut self, resource: Resource, window: Window, now: Time) -> Arc<[u8]> {
        let view = self.sink_view();
        let sources = status::Sources {
            engine: &self.engine,
            now,
            started: self.started,
            shell: &self.stats,
            sink: &view,
            progress: self.first_sync.progress(),
            state_file: self.state_file_status(),
            reads_paused: self.deferred.len(),
        };
        let (page, body) = match resource {
            Resource::Metrics => {
                let mut body = render(&self.engine, now, &self.stats, &view);
                render_progress(&mut body, sources.progress, self.saved_at());
                (0, body)
            }
            Resource::StatusJson => {
                let report = status::snapshot(&sources, window);
                // A tree of strings, numbers and options serializes.
                let body = serde_json::to_string(&report).expect("the status report serializes");
                (2, body)
            }
            // `/healthz` is answered before it gets here; never a page.
            Resource::Status | Resource::Health => {
                let rows = Window {
                    offset: 0,
                    limit: status_page::ROWS,
                };
                (1, status_page::render(&status::snapshot(&sources, rows)))
            }
        };
        self.stats.metrics_renders[page] += 1;
        debug!(
            "metrics: {resource:?} rendered, {} bytes in {} ms",
            body.len(),
            self.clock.now().since(now).as_millis()
        );
        Arc::from(body.into_bytes())
    }

    /// What `/healthz` says (see `health_check`).
    fn health(&self, view: &SinkView) -> Result<(), String> {
        let write = view.own_relay_open.map(|up| Link {
            up,
            failures: view.own_relay_failures,
        });
        let read = self
            .engine
            .own_read_link()
            .map(|(up, failures)| Link { up, failures });
        verdict(self.stopping.is_some(), write, read)
    }
}

/// The key the own-relay sink answers AUTH with: its own if set, else the
/// shared one (see [`Config::own_relay_auth_keys`] for the risk).
fn own_relay_keys(config: &Config) -> Option<nostr::prelude::Keys> {
    if config.own_relay_auth_keys.is_none() && config.auth_keys.is_some() {
        info!(
            "the own relay's AUTH uses the shared --auth-key-file (no --own-relay-auth-key-file)"
        );
    }
    config
        .own_relay_auth_keys
        .clone()
        .or_else(|| config.auth_keys.clone())
}
