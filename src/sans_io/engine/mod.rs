//! The sans-IO sync engine: every GRASP-02 rule as a deterministic state machine.
//!
//! Inputs arrive as `handle_*(now, ...)` calls; outputs are drained with
//! `poll_action` (connect, send, disconnect), `poll_output` (events to hand
//! to the sink) and `poll_timeout` (when to call `handle_timeout` next). The
//! engine never reads a clock, a socket or a global RNG, so a test can run
//! days of relay life in milliseconds by jumping the clock to the next
//! deadline, and every run with the same seed is the same run. The driving
//! contract is on [`Engine`].
//!
//! One type, one folder. This file holds the engine's vocabulary (actions,
//! outputs, statuses, timers), its state, and the one `impl` block of its
//! public interface: each input is a thin entry point into the aspect that
//! does the work, so the whole surface reads in one place. The aspects are
//! child modules, each the state types it owns with the steps that change
//! them, plus an `impl Engine` block that routes: it finds the relay,
//! calls the step on the state that owns it, and turns what the step
//! returns into actions, timers, counters and log lines. A step that
//! reads or writes one relay's state only is a method of that state
//! (`RelayState`, `Facts`, `Connection`, `Flight`, `Targets`, `Auth`,
//! `BadValues`, `NegJob`), not of the engine, even when it needs the
//! config, the index or an output: those it reaches through a `Ctx`:
//!
//! - `inbound`: messages from relays (events, EOSE, CLOSED, NOTICE, OK).
//! - `lifecycle`: connect, reconnect, disconnect, keepalive, daily sync.
//! - `diff`: the batch window and the three-way diff (`Batching`).
//! - `requests`: history packed into REQs within a relay's limits, and
//!   a relay's subscriptions opened and closed. The filters it built for
//!   a REQ they did not fit are a `BuiltChunk` (`built_chunk`), held by
//!   the relay table.
//! - `live_set`: a relay's live subscriptions, per-id or wide, and their
//!   consolidation.
//! - `ctx`: what a step of one relay's state reaches of the engine
//!   (`Ctx`: config, index, counters, and the queues of actions and
//!   timers), lent beside the relay's state by `Engine::at`.
//! - `nip77`: the NIP-77 pipeline, listings → reconciliations → id
//!   fetches. `Nip77` owns what relays share (the sink's listings,
//!   `listing_cache`; the turns, `neg_turns`; the bound on ids in hand,
//!   `id_budget`); each `NegJob` (`neg_job`) lives in its connection's
//!   `Flight` and owns its session and the ids it found; `NegSupport`
//!   (there too) is a relay fact. A job's steps that touch one relay are
//!   `RelayState`'s, in `nip77`.
//! - `auth`: NIP-42 (`Auth`, whose state machine is private to it;
//!   the relay's steps answer challenges with the config's keys).
//! - `bad_values`: a refusal of one value narrowed down to its item
//!   (`BadValues`, in a relay's facts).
//! - `resume`: restarts; the state file's mapping is on `RelayState` and
//!   `Facts` there, the waiting relays and the anchor in `Resume`.
//! - `unanswered`: subscriptions a relay leaves silent.
//! - `conduct`: offences and penalties (`Conduct`, [`Offence`]).
//! - `limit_probe`: a subscription limit lowered by a refusal climbs
//!   back once it held quietly (`LimitProbe`, in a relay's facts).
//! - `relay`: the relay table. A relay is its three lifetimes, each an
//!   owner of its own: `Facts` (the process's life: health, conduct,
//!   `limits`, NIP-11, NIP-77 support), `Targets` (`targets`: the items
//!   the index wants there, each queued, pending or confirmed), one
//!   `Coverage` watermark (`coverage`: across connections), and a `Link`
//!   that holds a `Connection` (`connection`: subscriptions, AUTH,
//!   keepalive, and the `Flight` of history while it runs) only while
//!   connected. A disconnect drops the connection; what outlives it is
//!   handed back by `RelayState::end_connection`. The link's steps
//!   (`start_connecting`, `connect_up`, `start_reading`) are
//!   `RelayState`'s; the keepalive, pong and paused reads the
//!   `Connection`'s.
//! - `relay_view`: one relay as a status page shows it
//!   (`RelayState::view`), and the per-relay counters the aspects note
//!   for it.
//!
//! Imports go one way, so no two files import each other. The state
//! types that `connection` and `relay` aggregate live in files that
//! import neither (`bad_values`, `conduct`, `limit_probe`, `neg_job`,
//! `sub_table`), or only `relay`, for steps that are `RelayState`'s
//! (`auth`, `saturated`: `connection` holds their types, and `relay`
//! names nothing of them). `limits`, `targets`, `coverage`, `timers` and
//! `ctx` are leaves. `inbound`, `lifecycle`, `diff`, `requests`,
//! `live_set`, `unanswered`, `nip77`, `resume` and `relay_view` work on
//! the relay table: each names `relay`, which names none of them. This
//! file names only the children's types: their state (`RelayState`,
//! `Connection`, `Flight`, `Limits`, `Role`, `Batching`, `Nip77`), the
//! `Ctx` it lends them, and the public `ItemState` and `Offence` it
//! re-exports. The aspects still call each other's
//! functions through `self`: they are parts of one state machine, and a
//! call needs no import. Fields are private: only this folder sees them.
//!
//! The `Engine`'s own fields are what the aspects share (config, index,
//! relay table, timers, RNG, the queues of actions and outputs, stats, the
//! dirty list every aspect feeds the diff through, the ids REQs and
//! negentropy sessions share), the two aspect states above, and two fields
//! of leaf types: `seen` (inbound's duplicate filter) and `self_since` (the
//! self-subscription's resume point, kept by `inbound` and `requests`).

mod auth;
mod bad_values;
mod built_chunk;
mod conduct;
mod connection;
mod coverage;
mod ctx;
mod diff;
mod echo_wait;
mod failure_log;
mod id_budget;
mod inbound;
mod lifecycle;
mod limit_probe;
mod limits;
mod listing_cache;
mod live_set;
mod neg_job;
mod neg_turns;
mod nip77;
mod relay;
mod relay_view;
mod requests;
mod resume;
mod saturated;
mod sub_table;
mod targets;
mod timers;
mod unanswered;

pub use conduct::Offence;
pub use relay_view::{LimitsView, RelayView};
pub use targets::ItemState;

use std::collections::VecDeque;
use std::fmt;

use nostr::prelude::{Event, EventId, Filter, Timestamp};
use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::sans_io::config::Config;
use crate::sans_io::identity::relay_url::{UrlError, normalize};
use crate::sans_io::identity::service::Service;
use crate::sans_io::memory::index::{IndexLimits, Item, RelayId, RepoIndex};
use crate::sans_io::memory::refused::RefusedIds;
use crate::sans_io::memory::saved_state::SavedState;
use crate::sans_io::memory::seen::Seen;
use crate::sans_io::timing::health::{BackoffPolicy, Health};
use crate::sans_io::timing::time::Time;
use crate::sans_io::timing::timer::{TimerId, TimerWheel};
use crate::sans_io::wire::relay_info::RelayInfo;
use crate::sans_io::wire::relay_text::LogBudget;
use crate::sans_io::wire::signature::Verifier;
use connection::{Connection, Flight};
use ctx::Ctx;
use diff::Batching;
use limits::Limits;
use nip77::Nip77;
use relay::{RelayState, Role};
use timers::{ConnTimer, Timer, whole_second};

/// Something the shell must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Open a websocket to `url` and report `handle_connected` or `handle_connect_failed`.
    Connect {
        /// The relay.
        relay: RelayId,
        /// Its normalized URL.
        url: String,
    },
    /// Send this text frame on the relay's websocket.
    Send {
        /// The relay.
        relay: RelayId,
        /// A complete client message (REQ or CLOSE).
        message: String,
    },
    /// Send a websocket ping; its pong, or any whole text frame, counts as
    /// an answer. Pongs nobody asked for do not.
    Ping {
        /// The relay.
        relay: RelayId,
    },
    /// Close the relay's websocket, or abandon the connect in progress. The
    /// engine has already dropped the connection: report nothing more for it.
    Disconnect {
        /// The relay.
        relay: RelayId,
    },
    /// Fetch the relay's NIP-11 information document (HTTP GET on its URL
    /// with `Accept: application/nostr+json`, off the loop like a connect)
    /// and report it with `handle_relay_info`, `None` if it failed. Asked
    /// once per relay, right after its first `Connect`; the connection does
    /// not wait for it.
    FetchInfo {
        /// The relay.
        relay: RelayId,
        /// Its normalized websocket URL (`ws`→`http`, `wss`→`https`).
        url: String,
    },
    /// List what the sink holds matching `filter` (id and `created_at`,
    /// for negentropy) and report it with `handle_local_list(request, ..)`;
    /// `None` there if the sink cannot list.
    ListLocal {
        /// Echoed in the answer.
        request: u64,
        /// What to list (no `limit`: all of it).
        filter: Filter,
    },
}

/// Something the engine produced for the embedding application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A verified event, matching what we asked, to hand to the sink.
    Ingest {
        /// The relay that delivered it.
        relay: RelayId,
        /// The event.
        event: Box<Event>,
        /// When the engine received it. What a state save may claim is
        /// bounded by the oldest such time among the events the sink has
        /// not confirmed yet: pass it to [`Engine::save_state`].
        received: Time,
    },
}

/// Connection status of a relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// No connection; maybe waiting for a backoff to end.
    Disconnected,
    /// Connect asked of the shell, not yet reported.
    Connecting,
    /// Connected and subscribed.
    Connected,
}

/// A repo or root named the way users name them, for queries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemKey {
    /// Repo ref `30617:<pubkey>:<d>`.
    Repo(String),
    /// Root event id.
    Root(EventId),
}

/// Items of one relay per state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ItemCounts {
    /// Targeted, not yet asked.
    pub queued: usize,
    /// In a pending batch.
    pub pending: usize,
    /// Confirmed.
    pub confirmed: usize,
    /// Targeted but never asked: the relay refuses one of its values
    /// (see [`Stats::items_unaskable`]).
    pub unaskable: usize,
}

/// Counters for metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    /// EVENT messages received from remote relays.
    pub events_received: u64,
    /// Dropped as already seen, before verification.
    pub events_duplicate: u64,
    /// Dropped for a bad id or signature.
    pub events_invalid: u64,
    /// Dropped because the sink refused them for good before (`refused`):
    /// neither fetched by negentropy nor offered again.
    pub events_refused_skipped: u64,
    /// Dropped for not matching the subscription (or the GRASP-01 domain rule).
    pub events_unwanted: u64,
    /// Handed to the sink.
    pub events_ingested: u64,
    /// Relay messages that were not valid nostr JSON.
    pub messages_malformed: u64,
    /// Relay messages skipped for being over the size cap (not an offence).
    pub messages_oversized: u64,
    /// REQ messages sent.
    pub reqs_sent: u64,
    /// Subscriptions ended by CLOSED or a refusing NOTICE.
    pub refusals: u64,
    /// Batches confirmed.
    pub batches_confirmed: u64,
    /// Batches failed and sent back to the diff.
    pub batches_failed: u64,
    /// Consolidations run.
    pub consolidations: u64,
    /// Negentropy jobs that fetched a finished filter's missing ids while
    /// reconciling the next one.
    pub neg_fetched_ahead: u64,
    /// Subscriptions a relay left silent past their grace (refused by a
    /// NOTICE blamed on another, or dropped without a word), asked again.
    pub unanswered: u64,
    /// Connect attempts asked.
    pub connects: u64,
    /// Connect attempts or connections that failed.
    pub connect_failures: u64,
    /// Offences by kind, indexed like [`Offence::ALL`].
    pub offences: [u64; Offence::ALL.len()],
    /// Relays cut and backed off longer for misbehaving.
    pub penalties: u64,
    /// Websocket upgrades refused with an HTTP status.
    pub upgrades_refused: u64,
    /// NIP-42 AUTH events sent.
    pub auth_attempts: u64,
    /// NIP-42 AUTH events the relay rejected.
    pub auth_failures: u64,
    /// Subscriptions refused with `auth-required:`.
    pub auth_required: u64,
    /// Negentropy sessions opened (one per historic filter).
    pub neg_sessions: u64,
    /// `NEG-MSG`s received.
    pub neg_rounds: u64,
    /// Event ids negentropy found missing and fetched.
    pub neg_ids_fetched: u64,
    /// Negentropy jobs that fell back to REQ (the relay failed or lacks it).
    pub neg_fallbacks: u64,
    /// Negentropy jobs sent to REQ because they would have held more ids
    /// than `Config::neg_ids_held` allows over all relays.
    pub neg_over_id_budget: u64,
    /// Filters (or time windows of them) a relay refused to reconcile for
    /// matching more than it takes at once, split in two time windows
    /// reconciled apart instead of read whole by REQ.
    pub neg_size_splits: u64,
    /// Negentropy jobs sent to REQ because the sink held nothing for them.
    pub neg_skipped: u64,
    /// The most negentropy jobs ever in flight at once, over all relays
    /// (bounded by `Config::neg_jobs_at_once`).
    pub neg_jobs_peak: u64,
    /// Items (repos, roots) a relay cannot be asked for: it refuses one of
    /// their values (strfry: a tag value over 255 bytes). Their events on
    /// that relay are unreachable.
    pub items_unaskable: u64,
    /// Seconds of a relay's history that hold more events for one filter
    /// than the relay returns, and that no split or NIP-77 could read
    /// whole: some of their events are unreachable there.
    pub seconds_unreachable: u64,
    /// Saturated seconds that no split or NIP-77 could read whole, on a
    /// relay whose cap is unknown: they may hold no more than was read.
    pub seconds_unverified: u64,
    /// Saturated seconds split into smaller queries or reconciled by NIP-77.
    pub seconds_split: u64,
}

/// Why the engine could not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The own relay URL is not a relay URL.
    OwnRelay(UrlError),
    /// A bootstrap relay URL is not a relay URL.
    Bootstrap(String, UrlError),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::OwnRelay(e) => write!(f, "own relay: {e}"),
            ConfigError::Bootstrap(url, e) => write!(f, "bootstrap relay {url}: {e}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// The GRASP-02 sync engine.
///
/// # Driving it
///
/// Three kinds of methods, all in this one `impl` block:
///
/// - **Inputs**, `handle_*(now, ..)`: something happened — a frame, a
///   connect, a due timer, an answer to an [`Action`]. `now` is the
///   caller's clock and must never go backwards: every deadline and backoff
///   is computed from it, and the engine does not check.
/// - **Outputs**, drained after every input (and after [`Engine::new`]):
///   first [`poll_action`](Engine::poll_action) until `None`, applied in
///   the order given (a relay's `Send`s follow its `Connect`); then
///   [`poll_output`](Engine::poll_output), whose events the shell may hand
///   to the sink at the sink's pace (the engine keeps no state about
///   them); then [`poll_timeout`](Engine::poll_timeout) again, for inputs
///   arm timers: call [`handle_timeout`](Engine::handle_timeout) once the
///   clock reaches it.
/// - **Queries** (`&self`): status, counts and stats for metrics and tests.
///
/// What the shell reports back for each [`Action`]:
///
/// - `Connect`: exactly one of `handle_connected`, `handle_connect_failed`
///   or `handle_connect_refused`, unless a `Disconnect` for the relay comes
///   first (a connect timeout); then `handle_message` per text frame,
///   `handle_pong` per pong, `handle_oversized` per message skipped for
///   its size, `handle_offence` for protocol violations and
///   `handle_disconnected` when the connection is lost.
/// - `Send`: nothing.
/// - `Ping`: `handle_pong` when the pong comes (a whole text frame also
///   counts). Only a pong answering a ping the engine asked for is a sign
///   of life: unsolicited pongs are ignored, so a relay cannot stay
///   connected on pongs alone.
/// - `Disconnect`: nothing more for that connection or attempt. The
///   engine has already dropped it when it asks (the relay is
///   [`Status::Disconnected`], its subscriptions and batches are gone, a
///   retry is scheduled if it failed). Connection reports for it
///   (`handle_connected`, `handle_message`, `handle_pong`, the failures,
///   `handle_disconnected`) are ignored while the relay stays
///   disconnected, but would be taken for the next attempt once the engine
///   asks `Connect` again, so the shell must close the socket or abandon
///   the attempt at once.
/// - `FetchInfo`: `handle_relay_info` when the fetch ends, `None` if it
///   failed; the relay need not be connected.
/// - `ListLocal`: `handle_local_list` with the same `request`, `None` if
///   the sink cannot list at all; `handle_local_unlisted` if it will not
///   list this one. Answers the engine no longer waits for (the relay
///   disconnected meanwhile) are ignored.
///
/// Besides these, `handle_local_event` feeds events the embedding relay
/// accepted, at any time, and `handle_reads_paused` /
/// `handle_reads_resumed` say when the shell stops and starts reading a
/// relay for back-pressure.
///
/// The engine never calls out: no callbacks, no sink, no clock, no I/O. So
/// nothing runs inside it that could call back in, and it never calls its
/// own inputs either (the aspects call each other's `pub(super)` functions).
/// A shell may make inputs in any order between drains; each `relay` must
/// be an id the engine handed out, and stale or unexpected reports (a
/// frame from a relay not connected, a second connect report, an answer to
/// a forgotten `ListLocal`) are ignored. Offences are the exception: they
/// count whenever reported, for a relay's conduct outlives its connections.
pub struct Engine {
    config: Config,
    policy: BackoffPolicy,
    /// The own relay's names and its acceptance rule.
    service: Service,
    index: RepoIndex,
    relays: Vec<RelayState>,
    own: RelayId,
    timers: TimerWheel<Timer>,
    rng: SmallRng,
    actions: VecDeque<Action>,
    outputs: VecDeque<Output>,
    seen: Seen,
    /// Checks ids and signatures, keeping recent authors' keys parsed.
    verifier: Verifier,
    /// What the sink refused for good (`refused`), kept across restarts.
    refused: RefusedIds,
    /// The batch window and the batches it makes (`diff`).
    batching: Batching,
    /// The id of the next subscription or negentropy session.
    next_sub: u64,
    /// Relays with queued items to diff: every aspect marks them, `flush`
    /// (in `diff`) diffs and schedules them.
    dirty: Vec<RelayId>,
    stats: Stats,
    /// The NIP-77 pipeline's shared state: listings, turns, id budget.
    nip77: Nip77,
    /// `since` for re-opening the self-subscription after a refusal.
    self_since: Option<Timestamp>,
    /// How many lines of relay text (NOTICE, CLOSED, OK reasons) each relay
    /// may still log; a relay cannot flood the log.
    log_budget: LogBudget,
    /// Relays failing to connect and the budget of their log lines.
    failure_log: failure_log::FailureLog,
    /// What a restore left to apply as relays become known (`resume`).
    resume: resume::Resume,
    /// The last connection generation handed out (`next_generation`).
    generations: u32,
}

impl Engine {
    /// A new engine at `now`; it asks to connect the own relay (when
    /// self-subscribing) and the bootstrap relays at once.
    pub fn new(config: Config, now: Time) -> Result<Engine, ConfigError> {
        let own_url = normalize(&config.own_relay).map_err(ConfigError::OwnRelay)?;
        let service = Service::new(&own_url, config.domain.as_deref());
        let mut index = RepoIndex::new(service.clone(), index_limits(&config));
        let own = index.intern_relay(&own_url);
        let mut bootstrap = Vec::new();
        for raw in &config.bootstrap {
            let url = normalize(raw).map_err(|e| ConfigError::Bootstrap(raw.clone(), e))?;
            if !service.names(&url) {
                bootstrap.push(index.intern_relay(&url));
            }
        }
        let policy = backoff_policy(&config);
        let mut engine = Engine {
            rng: SmallRng::seed_from_u64(config.seed),
            seen: Seen::new(config.seen_capacity),
            verifier: Verifier::new(),
            refused: RefusedIds::default(),
            policy,
            service,
            index,
            relays: Vec::new(),
            own,
            timers: TimerWheel::new(now.as_millis()),
            actions: VecDeque::new(),
            outputs: VecDeque::new(),
            batching: Batching::default(),
            next_sub: 0,
            dirty: Vec::new(),
            stats: Stats::default(),
            nip77: Nip77::new(config.neg_jobs_at_once, config.neg_ids_held),
            self_since: None,
            log_budget: LogBudget::default(),
            failure_log: failure_log::FailureLog::default(),
            resume: resume::Resume::default(),
            generations: 0,
            config,
        };
        engine.ensure_relay_slots();
        engine.relays[own.index()].facts.role = Role::Own;
        for &relay in &bootstrap {
            engine.relays[relay.index()].facts.role = Role::Remote { bootstrap: true };
        }
        engine.arm(now + engine.config.disconnect_check, Timer::DisconnectCheck);
        for relay in std::iter::once(own).chain(bootstrap) {
            if engine.wants_connection(relay) {
                engine.connect(relay, now);
            }
        }
        Ok(engine)
    }

    // Inputs.

    /// Fires every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        while let Some((_, timer)) = self.timers.poll_expired(now.as_millis()) {
            self.on_timer(timer, now);
        }
        self.flush(now);
    }

    /// A text frame from `relay`. Everything in it is hostile input
    /// (`inbound`).
    pub fn handle_message(&mut self, now: Time, relay: RelayId, text: &str) {
        self.receive_message(now, relay, text);
    }

    /// The shell finished connecting `relay` (`lifecycle`).
    pub fn handle_connected(&mut self, now: Time, relay: RelayId) {
        self.connected(now, relay);
    }

    /// A connect attempt for `relay` failed.
    pub fn handle_connect_failed(&mut self, now: Time, relay: RelayId) {
        self.connect_failed(now, relay, "connect failed");
    }

    /// A connect attempt for `relay` failed for `cause` (`Connection
    /// refused`, `DNS lookup failed`, ...), which the failure's log line
    /// names.
    pub fn handle_connect_failed_because(&mut self, now: Time, relay: RelayId, cause: &str) {
        self.connect_failed(now, relay, cause);
    }

    /// The relay answered the websocket upgrade with HTTP `status`; 429 and
    /// 503 get the rate-limit cooldown, anything else the usual backoff.
    pub fn handle_connect_refused(&mut self, now: Time, relay: RelayId, status: u16) {
        self.connect_refused(now, relay, status);
    }

    /// The connection to `relay` was lost.
    pub fn handle_disconnected(&mut self, now: Time, relay: RelayId) {
        self.disconnected(now, relay, "connection lost");
    }

    /// The connection to `relay` was lost for `cause`, which the failure's
    /// log line names.
    pub fn handle_disconnected_because(&mut self, now: Time, relay: RelayId, cause: &str) {
        self.disconnected(now, relay, cause);
    }

    /// A pong from the relay; it counts only as the answer to an
    /// [`Action::Ping`] still out (see [`Engine`]).
    pub fn handle_pong(&mut self, now: Time, relay: RelayId) {
        self.heard_pong(now, relay);
    }

    /// The shell leaves `relay`'s frames unread while the sink has no
    /// room: answers to its negentropy sessions may wait among them, so
    /// none is taken as silent until reads resume. A relay that speaks
    /// NIP-77 was marked as not speaking it, for the process's life, when
    /// a first sync held its reads past `neg_timeout`.
    pub fn handle_reads_paused(&mut self, relay: RelayId) {
        if let Some(conn) = self.conn_mut(relay) {
            conn.pause_reads();
        }
    }

    /// The shell reads `relay` again: its sessions get a whole
    /// `neg_timeout` from `now` to be heard.
    pub fn handle_reads_resumed(&mut self, now: Time, relay: RelayId) {
        if let Some(conn) = self.conn_mut(relay) {
            conn.reads_resumed(now);
        }
    }

    /// The relay's NIP-11 document, fetched for [`Action::FetchInfo`]
    /// (`None`: none could be had). Its limits only ever lower ours; they
    /// apply to the next REQs.
    pub fn handle_relay_info(&mut self, now: Time, relay: RelayId, info: Option<RelayInfo>) {
        if relay.index() >= self.relays.len() {
            return;
        }
        let (state, mut cx) = self.at(relay);
        if state.relay_info(&mut cx, info) {
            self.flush(now);
        }
    }

    /// `relay` committed `offence` (the shell reports protocol violations;
    /// the engine finds the rest itself). Enough of them in one connection
    /// cut the relay and lengthen its backoff; the own relay is trusted
    /// (`conduct`).
    pub fn handle_offence(&mut self, now: Time, relay: RelayId, offence: Offence) {
        self.offended(now, relay, offence);
    }

    /// The shell skipped a message of `bytes` from `relay` for being over
    /// its size cap; the connection goes on. Counted and logged once per
    /// relay, never an offence (see `conduct`).
    pub fn handle_oversized(&mut self, _now: Time, relay: RelayId, bytes: u64) {
        self.oversized(relay, bytes);
    }

    /// The sink's answer to [`Action::ListLocal`]: what it holds, or `None`
    /// when it cannot tell (negentropy is then off for this process;
    /// `nip77`).
    pub fn handle_local_list(
        &mut self,
        now: Time,
        request: u64,
        listed: Option<Vec<(EventId, Timestamp)>>,
    ) {
        self.local_listed(now, request, listed);
    }

    /// The sink will not list `request` (the own relay refused that REQ):
    /// the jobs waiting for it go to REQ now, not after the listing
    /// timeout, and the next job asking the same filter asks again.
    pub fn handle_local_unlisted(&mut self, now: Time, request: u64) {
        self.local_unlisted(now, request);
    }

    /// The sink refused `id` for a reason that asking again does not
    /// change (the own relay's `blocked:`, `invalid:`, its size limit):
    /// re-syncs neither fetch nor offer it again, and the state file keeps
    /// it (bounded: `refused`). Refusals that can change are not for this.
    pub fn handle_refused_for_good(&mut self, id: EventId) {
        self.batching.echo_wait.ended(&id);
        self.refused.insert(id);
    }

    /// How many ids [`Engine::handle_refused_for_good`] remembers now.
    pub fn refused_remembered(&self) -> usize {
        self.refused.len()
    }

    /// An event the embedding relay accepted, fed in instead of (or besides)
    /// the self-subscription. It joins the current batch window (`diff`).
    pub fn handle_local_event(&mut self, now: Time, event: Event) {
        let echo = self.seen.contains(&event.id);
        self.push_to_batch(now, event, echo);
    }

    /// The sink refused `id` for good (an embedder's `Sink` answered
    /// `Rejected`): the id is forgotten, so a copy arriving again
    /// (from any relay, or the next historic sync) is offered again instead
    /// of being dropped as already handed over.
    pub fn handle_sink_rejected(&mut self, _now: Time, id: &EventId) {
        self.batching.echo_wait.ended(id);
        self.seen.remove(id);
    }

    /// Takes back what an earlier process saved with
    /// [`save_state`](Engine::save_state) (`resume`); `unix_now` is the
    /// wall clock at `now`, in Unix seconds. Call it right after
    /// [`Engine::new`], before the first `poll_action`. Saved relays are
    /// hints: each is applied when an announcement makes it known.
    pub fn restore_state(&mut self, now: Time, unix_now: u64, saved: SavedState) {
        self.restore(now, unix_now, saved);
    }

    /// Gives back memory bursts left behind: the room every relay's
    /// subscriptions, batches and queues grew to during a sync, and the
    /// engine's action and output queues. Nothing else changes. The shell
    /// calls it when it trims the heap, after activity, so an idle engine
    /// at thousands of relays holds what it uses, not its peak. O(relays).
    pub fn shrink_to_fit(&mut self) {
        for conn in self.relays.iter_mut().filter_map(|r| r.conn_mut()) {
            conn.shrink_to_fit();
        }
        self.shrink_listings();
        self.timers.shrink_to_fit();
        self.actions.shrink_to_fit();
        self.outputs.shrink_to_fit();
        self.dirty.shrink_to_fit();
    }

    // Outputs.

    /// The next thing the shell must do.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The next event for the sink.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// Outputs not taken yet: what a sink without room holds back.
    pub fn outputs_waiting(&self) -> usize {
        self.outputs.len()
    }

    /// When `handle_timeout` must be called next.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.timers.next_deadline().map(Time::from_millis)
    }

    // Queries.

    /// The id of a relay URL, if the engine knows it.
    pub fn relay_id(&self, url: &str) -> Option<RelayId> {
        normalize(url).ok().and_then(|u| self.index.relay_id(&u))
    }

    /// The normalized URL of a relay.
    pub fn relay_url(&self, relay: RelayId) -> &str {
        self.index.relay_url(relay)
    }

    /// The share of remote relays this engine connects to.
    pub fn shard(&self) -> crate::sans_io::identity::shard::Shard {
        self.config.shard
    }

    /// The own relay's id.
    pub fn own_relay(&self) -> RelayId {
        self.own
    }

    /// The own relay's read link, for a health check (the shell's
    /// `/healthz`, or a driver's own): `None` when the engine does not want
    /// it (`--no-self-subscribe`), else whether it is connected and its
    /// failures in a row (1: in its first backoff).
    pub fn own_read_link(&self) -> Option<(bool, u32)> {
        let own = &self.relays[self.own.index()];
        self.config.self_subscribe.then(|| {
            (
                own.status() == Status::Connected,
                own.facts.health.failures(),
            )
        })
    }

    /// Every relay the engine knows, the own relay included (released
    /// ids are not).
    pub fn relays(&self) -> impl Iterator<Item = RelayId> + '_ {
        (0..self.relays.len())
            .map(|i| RelayId(i as u32))
            .filter(|&r| self.index.relay_known(r))
    }

    /// Connection status of a relay.
    pub fn relay_status(&self, relay: RelayId) -> Status {
        self.relays[relay.index()].status()
    }

    /// Health of a relay at `now`.
    pub fn relay_health(&self, relay: RelayId, now: Time) -> Health {
        self.relays[relay.index()]
            .facts
            .health
            .health(now, &self.policy)
    }

    /// Penalties `relay` has earned so far.
    pub fn relay_penalties(&self, relay: RelayId) -> u32 {
        self.relays
            .get(relay.index())
            .map_or(0, |s| s.facts.conduct.penalties())
    }

    /// Items of a relay per state.
    pub fn item_counts(&self, relay: RelayId) -> ItemCounts {
        self.relays[relay.index()].item_counts()
    }

    /// Where `item` stands on `relay`; `None` when the relay does not target it.
    pub fn item_state(&self, relay: RelayId, item: &ItemKey) -> Option<ItemState> {
        let item = match item {
            ItemKey::Repo(coord) => Item::Repo(self.index.repo_id(coord)?),
            ItemKey::Root(id) => Item::Root(self.index.root_id(id)?),
        };
        self.relays[relay.index()]
            .targets
            .items
            .get(&item)
            .map(|s| s.state)
    }

    /// Subscriptions open on a relay.
    pub fn open_subscriptions(&self, relay: RelayId) -> usize {
        self.relays[relay.index()]
            .conn()
            .map_or(0, |c| c.subs.len())
    }

    /// Filters of a relay's live subscriptions.
    pub fn live_filter_count(&self, relay: RelayId) -> usize {
        self.relays[relay.index()]
            .conn()
            .map_or(0, |c| c.live_filter_count())
    }

    /// The relay's current limit of concurrent subscriptions.
    pub fn subscription_limit(&self, relay: RelayId) -> usize {
        self.relays[relay.index()].facts.limits.subscriptions
    }

    /// Pending batches of a relay.
    pub fn pending_batches(&self, relay: RelayId) -> usize {
        self.relays[relay.index()].conn().map_or(0, |c| c.batches())
    }

    /// What an operator's status page shows of `relay` at `now`
    /// (`relay_view`). O(the relay's items).
    pub fn relay_view(&self, relay: RelayId, now: Time) -> RelayView {
        self.relays[relay.index()].view(now, &self.policy)
    }

    /// True once the own relay's repositories and roots were read to their
    /// end (or are fed, without a self-subscription): the relays known by
    /// then are the ones a first sync has to read.
    pub fn index_read(&self) -> bool {
        self.own_index_read()
    }

    /// What is worth keeping across a restart, for
    /// [`restore_state`](Engine::restore_state); `unix_now` is the wall
    /// clock at `now`, in Unix seconds. Bounded (`saved_state`).
    ///
    /// `unsettled` is when the oldest event handed over by
    /// [`poll_output`](Engine::poll_output) that the sink has not
    /// confirmed yet was received (its `Output::Ingest::received`; `None`
    /// when the sink confirmed every one; events not polled yet the
    /// engine counts itself). The state claims nothing past it: a
    /// process killed after the save would lose those events, so their
    /// history and live traffic are read again after a restart.
    pub fn save_state(&self, now: Time, unix_now: u64, unsettled: Option<Time>) -> SavedState {
        self.saved_state(now, unix_now, unsettled)
    }

    /// Counters for metrics.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The repo index (read-only).
    pub fn index(&self) -> &RepoIndex {
        &self.index
    }

    /// Timers armed, stale ones not yet fired among them. For tests.
    #[cfg(any(test, feature = "testing"))]
    pub fn timers_armed(&self) -> usize {
        self.timers.len()
    }

    /// Every relay's state against a full recompute of targets from the
    /// index (the seed's `derive_relay_targets`), and every batch's
    /// bookkeeping. For tests and fuzzing; O(everything).
    #[cfg(any(test, feature = "testing"))]
    pub fn check_invariants(&self) -> Result<(), String> {
        let targets = self.index.derive_relay_targets();
        for (i, relay) in self.relays.iter().enumerate() {
            let id = RelayId(i as u32);
            relay.check(targets.get(&id), self.relay_url(id))?;
        }
        self.check_neg_room()?;
        Ok(())
    }
}

/// The index's bounds, as the config sets them.
fn index_limits(config: &Config) -> IndexLimits {
    IndexLimits {
        relays_per_announcement: config.max_relays_per_announcement,
        repos_per_root: config.max_repos_per_root,
        relay_change_interval: config.relay_change_interval,
        max_relays: config.max_known_relays,
        max_relays_per_pubkey: config.max_relays_per_pubkey,
        max_repos_per_pubkey: config.max_repos_per_pubkey,
        max_roots_per_pubkey: config.max_roots_per_pubkey,
        max_items: config.max_known_items,
        allow_private: config.allow_private_addresses,
    }
}

/// Every relay's reconnect backoff, as the config sets it.
fn backoff_policy(config: &Config) -> BackoffPolicy {
    BackoffPolicy {
        base: config.backoff_base,
        max: config.backoff_max,
        dead_after: config.dead_after,
        dead_retry: config.dead_retry,
        rate_limit_cooldown: config.rate_limit_cooldown,
    }
}

/// Helpers every aspect uses.
impl Engine {
    fn arm(&mut self, at: Time, timer: Timer) -> TimerId {
        self.timers.insert(at.as_millis(), timer)
    }

    /// The relay's state and what its steps reach of the engine, borrowed
    /// side by side: for a step of `RelayState` (or of what it holds).
    /// Unchecked, like [`Self::relay`]: for ids the engine handed out; a
    /// host's input names a relay checked first ([`Self::conn`]).
    fn at(&mut self, relay: RelayId) -> (&mut RelayState, Ctx<'_>) {
        let cx = Ctx {
            relay,
            config: &self.config,
            policy: &self.policy,
            index: &self.index,
            stats: &mut self.stats,
            rng: &mut self.rng,
            actions: &mut self.actions,
            timers: &mut self.timers,
            log_budget: &mut self.log_budget,
            next_sub: &mut self.next_sub,
            dirty: &mut self.dirty,
        };
        (&mut self.relays[relay.index()], cx)
    }

    /// A number no connection or connect attempt had before: its timers
    /// carry it ([`Timer::Conn`]). A `u32` wraps after four billion
    /// connects, long after any timer of the first is gone.
    fn next_generation(&mut self) -> u32 {
        self.generations = self.generations.wrapping_add(1);
        self.generations
    }

    /// The relay's open connection, if any. Checked: the host's inputs
    /// name relays by id, and a stale one names no relay.
    fn conn(&self, relay: RelayId) -> Option<&Connection> {
        self.relays.get(relay.index())?.conn()
    }

    /// The relay's open connection, if any (checked, as [`Self::conn`]).
    fn conn_mut(&mut self, relay: RelayId) -> Option<&mut Connection> {
        self.relays.get_mut(relay.index())?.conn_mut()
    }

    /// The history in flight on the relay's connection, if any.
    fn flight_mut(&mut self, relay: RelayId) -> Option<&mut Flight> {
        self.conn_mut(relay)?.flight_mut()
    }

    fn relay(&mut self, relay: RelayId) -> &mut RelayState {
        &mut self.relays[relay.index()]
    }

    /// Grows the relay table to cover every interned relay.
    fn ensure_relay_slots(&mut self) {
        let limits = Limits::starting(&self.config);
        while self.relays.len() < self.index.relay_count() {
            self.relays
                .push(RelayState::new(Role::Remote { bootstrap: false }, limits));
        }
    }

    /// Releases every relay no announcement lists any more once nothing
    /// can report on it: disconnected, no NIP-11 fetch pending. Its id goes
    /// back to the index for the next relay interned, with a fresh state;
    /// a timer armed for the old relay names a generation the new one
    /// never has. Without this, junk relays of replaced
    /// announcements would hold the known-relay cap until restart.
    fn release_unreferenced(&mut self) {
        let limits = Limits::starting(&self.config);
        for i in 0..self.relays.len() {
            let relay = RelayId(i as u32);
            if self.relays[i].releasable() && self.index.release_relay(relay) {
                self.resume.forget(relay);
                self.failure_log.forget(relay);
                self.relays[i] = RelayState::new(Role::Remote { bootstrap: false }, limits);
            }
        }
    }

    fn on_timer(&mut self, timer: Timer, now: Time) {
        match timer {
            Timer::BatchWindow => self.close_batch_window(now),
            Timer::BatchQuiet => self.on_batch_quiet(now),
            Timer::DisconnectCheck => {
                // Relays this check disconnects are released at the next
                // one: their `Disconnect` has not reached the shell yet.
                self.release_unreferenced();
                self.prune_turns();
                self.check_disconnects(now);
            }
            Timer::Reconnect(relay) => self.on_reconnect_timer(relay, now),
            Timer::ReleaseHeld(repo) => self.release_held(repo, now),
            Timer::Conn(relay, generation, timer) => {
                if self.relays[relay.index()].generation() == Some(generation) {
                    self.on_conn_timer(relay, timer, now);
                }
            }
        }
    }

    /// A timer of the relay's current connection (or connect attempt).
    fn on_conn_timer(&mut self, relay: RelayId, timer: ConnTimer, now: Time) {
        let (state, mut cx) = self.at(relay);
        match timer {
            ConnTimer::EoseTimeout(sub) => state.eose_timeout(&mut cx, sub, now),
            ConnTimer::Unanswered(sub) => state.unanswered(&mut cx, sub, now),
            ConnTimer::ConnectTimeout => self.on_connect_timeout(relay, now),
            ConnTimer::Consolidate => self.consolidate(relay, now),
            ConnTimer::Resume => self.on_resume(relay, now),
            ConnTimer::Watch => self.on_watch(relay, now),
            ConnTimer::NegTimeout(id) => self.on_neg_timeout(relay, id, now),
        }
    }
}
