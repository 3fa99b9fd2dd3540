//! grasp-sync: keeps a GRASP relay in sync with every relay its
//! repositories live on (GRASP-02 proactive sync).
//!
//! # Three layers
//!
//! The source tree is the architecture:
//!
//! - `src/sans_io/`: the [`Engine`] (`engine/`) and everything it is made
//!   of: the own-relay client (`own_relay/`), how relays are asked
//!   (`query/`: filters, pagination, refusals, negentropy sessions), what
//!   it remembers (`memory/`: the repo index, seen ids, saved state),
//!   relay identity (`identity/`), wire formats (`wire/`) and time
//!   (`timing/`: timers, health). Pure: no sockets, files, threads or
//!   clocks, which `.ci/run` checks. Feed it what happened (`handle_*` with
//!   the current [`Time`]), drain what it wants done
//!   ([`Engine::poll_action`]), what it synced ([`Engine::poll_output`])
//!   and when to wake it ([`Engine::poll_timeout`]). It runs in any event
//!   loop and under a simulated clock.
//! - `src/shell/`: the [`Shell`], one mio thread that runs the engine over
//!   real websockets (TLS, DNS off the loop, the own-relay connection,
//!   metrics), and the [`Sink`] trait through which an embedding relay
//!   takes the events.
//! - `src/bin/grasp-sync/`: the binary (flags, logging, signals, the demo),
//!   behind the default `cli` feature. An embedder turns default features
//!   off and gets the two layers above on the fixed dependency stack.
//!
//! # Driving the engine
//!
//! The contract, stated in full on [`Engine`]:
//!
//! - Inputs are `handle_*(now, ..)`; `now` never goes backwards.
//! - After any input, drain [`Engine::poll_action`] until `None` and act on
//!   each (connect, send, disconnect, fetch NIP-11), drain
//!   [`Engine::poll_output`] into the sink, then sleep until
//!   [`Engine::poll_timeout`] and call [`Engine::handle_timeout`] then.
//! - Report the outcome of what an action asked: a `Connect` ends in
//!   `handle_connected`, `handle_connect_failed` or
//!   `handle_connect_refused`; a connection that drops on its own ends in
//!   `handle_disconnected`; after `Disconnect` nothing is reported.
//! - The engine never calls out (no callbacks, no sink inside it), so
//!   nothing is re-entrant: call any input at any time between polls, from
//!   the one thread that owns the engine.
//!
//! # Features
//!
//! - `shell` (default): the [`Shell`] and everything with a socket (mio,
//!   rustls, tungstenite). Off (`default-features = false`), the crate is
//!   the sans-IO [`Engine`] alone, for a loop of one's own ([`driver`]).
//! - `cli` (default): the binary and its demo; needs `shell` and `testing`.
//! - `testing`: the simulation harness, the threaded test relay, the relay
//!   farm and the fault injector, for tests, benches and fuzz targets (an
//!   embedder's too); needs `shell`.
//!
//! Embedding in a relay: supply a [`Sink`] and feed the events the relay
//! accepts instead of a websocket to itself.
//!
//! ```no_run
//! use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
//! use grasp_sync::{Config, Shell, ShellOptions, Sink, SinkTarget, StoreOutcome};
//! use grasp_sync::nostr::prelude::Event;
//!
//! struct Store(SyncSender<Event>);
//!
//! impl Sink for Store {
//!     fn store(&mut self, _from_relay: &str, event: Event) -> StoreOutcome {
//!         // The relay's writer stores it; when its queue is full, the shell
//!         // pauses reading until the writer calls `handle.sink_ready()`.
//!         match self.0.try_send(event) {
//!             Ok(()) => StoreOutcome::Stored,
//!             Err(TrySendError::Full(event)) => StoreOutcome::Full(Box::new(event)),
//!             Err(TrySendError::Disconnected(_)) => StoreOutcome::Rejected("error: store closed".into()),
//!         }
//!     }
//! }
//!
//! let (tx, _rx) = sync_channel(1_000);
//! let mut config = Config::new("wss://my-relay.example");
//! config.self_subscribe = false; // the relay feeds accepted events instead
//! let shell = Shell::new(config, ShellOptions::default(), SinkTarget::Custom(Box::new(Store(tx))))?;
//! // From the relay's threads: `handle.feed(event)` for what its own clients
//! // publish, `handle.sink_ready()` from the writer.
//! let handle = shell.handle();
//! std::thread::spawn(move || shell.run());
//! # handle.shutdown();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Driving the core directly, with a clock of your own:
//!
//! ```
//! use grasp_sync::{Action, Config, Engine, Time};
//!
//! let now = Time::from_secs(1_700_000_000);
//! let mut engine = Engine::new(Config::new("ws://127.0.0.1:7777"), now)?;
//! // The engine first asks to connect the own relay for its self-subscription.
//! let Some(Action::Connect { relay, url }) = engine.poll_action() else { unreachable!() };
//! assert_eq!(url, "ws://127.0.0.1:7777");
//! engine.handle_connected(now, relay);
//! // ...and then subscribes to announcements and root events on it.
//! assert!(matches!(engine.poll_action(), Some(Action::Send { message, .. }) if message.starts_with("[\"REQ\"")));
//! // Call `handle_timeout` at `poll_timeout()`; nothing reads a real clock.
//! assert!(engine.poll_timeout().is_some());
//! # Ok::<(), grasp_sync::ConfigError>(())
//! ```

#![warn(missing_docs)]
#![warn(unreachable_pub)]

/// The `nostr` crate this one is built on (0.45), so an embedder names
/// the same types; a relay on another version uses the JSON entry points
/// ([`JsonSink`], [`ShellHandle::feed_json`]).
pub use nostr;

mod sans_io;
#[cfg(feature = "shell")]
mod shell;
#[cfg(feature = "testing")]
pub mod testing;

// The public interface is this list; every module above is private.
pub use sans_io::config::Config;
pub use sans_io::engine::{
    Action, ConfigError, Engine, ItemCounts, ItemKey, ItemState, LimitsView, Offence, Output,
    RelayView, Stats, Status,
};
pub use sans_io::identity::relay_url::{UrlError, normalize as normalize_relay_url};
pub use sans_io::identity::shard::{Shard, shard_of};
pub use sans_io::memory::index::{INDEX_KINDS, Item, RelayId, RepoId, RootId};
pub use sans_io::memory::saved_state::{DecodeError, SavedLimits, SavedRelay, SavedState};
pub use sans_io::progress::{FirstSync, Progress, ProgressLine};
pub use sans_io::timing::health::Health;
pub use sans_io::timing::time::Time;
pub use sans_io::wire::relay_info::RelayInfo;
#[cfg(feature = "shell")]
pub use shell::key_file::{KeyFileError, read_key_file};
#[cfg(feature = "shell")]
pub use shell::report::{SyncStats, SyncStatus};
#[cfg(feature = "shell")]
pub use shell::sink::{JsonOutcome, JsonSink, ListRequest, Listing, Sink, StoreOutcome};
#[cfg(feature = "shell")]
pub use shell::{DnsLookup, Shell, ShellError, ShellHandle, ShellOptions, SinkTarget};

/// The operator's status view as the metrics port serves it at
/// `/status.json` (and as HTML at `/status`): every relay with its state,
/// problems first, the own relay, the state file and the first sync's
/// progress. Its schema is `docs/status.schema.json`; fields are only
/// ever added ([`status::SCHEMA`] counts other changes). `grasp-sync
/// status` reads it.
#[cfg(feature = "shell")]
pub mod status {
    pub use crate::shell::status::{
        DEFAULT_LIMIT, FirstSyncStatus, LimitsStatus, MAX_LIMIT, OwnRelayStatus, RelayStatus,
        SCHEMA, StateFileStatus, StatusReport, Totals,
    };
}

/// Parts the benches, fuzz targets and the binary reach into. Not a stable
/// interface: anything here may change in any release.
#[doc(hidden)]
pub mod internal {
    pub use crate::sans_io::identity::address::{host_and_port, ip_literal, is_public};
    pub use crate::sans_io::identity::relay_url::{host_port, normalize, relay_of_clone_url};
    pub use crate::sans_io::memory::index::{RepoIndex, is_index_kind, is_repo_coord};
    pub use crate::sans_io::memory::seen::Seen;
    pub use crate::sans_io::progress::spoken;
    pub use crate::sans_io::query::filters::{chunk_filters, req_message};
    pub use crate::sans_io::query::reconcile::{Reconciliation, Step, means_unsupported};
    pub use crate::sans_io::timing::timer::TimerWheel;
    pub use crate::sans_io::wire::hex;
    pub use crate::sans_io::wire::relay_text::is_hidden;
    #[cfg(feature = "shell")]
    pub use crate::sans_io::wire::ws_reader::{Incoming, Violation, WsReader};
    #[cfg(feature = "shell")]
    pub use crate::shell::rlimit::raise_fd_limit;
    #[cfg(feature = "shell")]
    pub use crate::shell::tls::MaybeTls;
}

/// What a loop of one's own needs beside the [`Engine`] to do what the
/// [`Shell`] does (README, "Driving the engine from your
/// own loop"): the address policy to apply to what DNS answers (a relay
/// URL naming a public host may resolve to a private address), and the
/// websocket reader with its frame cap, which reports oversized messages
/// (feed [`Engine::handle_oversized`]) and protocol violations (feed
/// [`Engine::handle_offence`] and drop the connection), and the writer
/// that masks client frames (`tungstenite`'s) and keeps only what the
/// socket did not take.
///
/// A [`RelayId`] names a relay, not a connection: the engine reuses it
/// when it reconnects. Tag each socket with a generation of your own (the
/// shell's slots do) and drop what a closed one still reports, or a late
/// event of an old connection reaches the new one.
///
/// ```
/// use grasp_sync::driver::{host_and_port, is_public};
///
/// // What DNS answered for a relay, checked before connecting.
/// assert!(!is_public("10.0.0.7".parse().unwrap()));
/// assert!(is_public("93.184.216.34".parse().unwrap()));
/// assert_eq!(host_and_port("wss://relay.example"), Some(("relay.example".into(), 443)));
/// ```
pub mod driver {
    pub use crate::sans_io::identity::address::{host_and_port, ip_literal, is_public};
    #[cfg(feature = "shell")]
    pub use crate::sans_io::wire::ws_reader::{Incoming, Violation, WsReader};
    #[cfg(feature = "shell")]
    pub use crate::sans_io::wire::ws_writer::WsWriter;
}
