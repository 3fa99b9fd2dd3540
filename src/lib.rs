//! grasp-sync: keeps a GRASP relay in sync with every relay its
//! repositories live on (GRASP-02 proactive sync).
//!
//! Two layers:
//!
//! - [`Engine`] is the sans-IO core: feed it what happened (`handle_*` with
//!   the current [`Time`]), drain what it wants done
//!   ([`Engine::poll_action`]), what it synced ([`Engine::poll_output`]) and
//!   when to wake it ([`Engine::poll_timeout`]). It never touches a socket
//!   or a clock, so it runs in any event loop and under a simulated clock.
//! - [`Shell`] is the single-threaded mio loop that runs the engine over
//!   real websockets (TLS, DNS off the loop, metrics, signals).
//!
//! Embedding in a relay: supply a [`Sink`] and feed the events the relay
//! accepts instead of a websocket to itself.
//!
//! ```no_run
//! use grasp_sync::{Config, Shell, ShellOptions, Sink, SinkTarget};
//! use nostr::prelude::Event;
//!
//! struct Store(std::sync::mpsc::Sender<Event>);
//!
//! impl Sink for Store {
//!     fn store(&mut self, _from_relay: &str, event: Event) {
//!         let _ = self.0.send(event); // the relay's writer stores it
//!     }
//! }
//!
//! let (tx, _rx) = std::sync::mpsc::channel();
//! let mut config = Config::new("wss://my-relay.example");
//! config.self_subscribe = false; // the relay feeds accepted events instead
//! let shell = Shell::new(config, ShellOptions::default(), SinkTarget::Custom(Box::new(Store(tx))))?;
//! let handle = shell.handle(); // handle.feed(event) from the relay's threads
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

pub mod address;
pub mod auth;
pub mod cli;
pub mod conduct;
pub mod config;
pub mod demo;
mod diff;
pub mod dns;
pub mod engine;
pub mod filters;
pub mod health;
pub mod hex;
mod inbound;
pub mod index;
pub mod info_fetch;
mod lifecycle;
pub mod metrics;
pub mod neg_sync;
pub mod outbox;
pub mod read_rate;
pub mod reconcile;
pub mod refusal;
pub mod relay;
pub mod relay_info;
pub mod relay_url;
mod requests;
pub mod result_cap;
pub mod rlimit;
pub mod seen;
pub mod service;
pub mod shell;
pub mod sink;
pub mod sink_list;
pub mod subscription;
pub mod testing;
pub mod time;
pub mod timer;
pub mod tls;
pub mod ws;

pub use config::Config;
pub use engine::{Action, ConfigError, Engine, ItemCounts, ItemKey, Output, Stats};
pub use health::Health;
pub use index::{Item, RelayId, RepoId, RootId};
pub use relay::{ItemState, Status};
pub use relay_info::RelayInfo;
pub use shell::{Shell, ShellHandle, ShellOptions, SinkTarget};
pub use sink::Sink;
pub use time::Time;
