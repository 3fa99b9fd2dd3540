//! grasp-sync: keeps a GRASP relay in sync with every relay its
//! repositories live on (GRASP-02 proactive sync).
//!
//! The core is [`Engine`], a sans-IO state machine: feed it what happened
//! (`handle_*` with the current [`Time`]), drain what it wants done
//! ([`Engine::poll_action`]), what it synced ([`Engine::poll_output`]) and
//! when to wake it ([`Engine::poll_timeout`]). It never touches a socket or
//! a clock, so it can be embedded in any event loop and tested with a
//! simulated clock.

#![warn(missing_docs)]

pub mod address;
pub mod cli;
pub mod config;
mod diff;
pub mod dns;
pub mod engine;
pub mod filters;
pub mod health;
mod inbound;
pub mod index;
mod lifecycle;
pub mod metrics;
pub mod outbox;
pub mod refusal;
pub mod relay;
pub mod relay_url;
mod requests;
pub mod seen;
pub mod shell;
pub mod sink;
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
pub use shell::{Shell, ShellHandle, ShellOptions, SinkTarget};
pub use sink::Sink;
pub use time::Time;
