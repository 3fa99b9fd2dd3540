//! Everything pure: the sync engine and the data structures it is made of.
//!
//! Nothing in this folder touches a socket, a file, a thread or a clock;
//! `.ci/run` fails if a file here so much as names the event loop's crate,
//! TCP sockets, the file system, threads or the wall clock. Time comes in
//! as a [`time::Time`] argument, bytes come in as parsed messages, and what
//! should happen goes out as values, so every rule can be tested under a
//! simulated clock and the same engine runs in any event loop.

pub(crate) mod address;
pub(crate) mod config;
pub(crate) mod engine;
pub(crate) mod filters;
pub(crate) mod health;
pub mod hex;
pub(crate) mod index;
// NIP-11 over HTTP: the shell's alone.
#[cfg(feature = "shell")]
pub(crate) mod info_fetch;
pub(crate) mod nip42;
pub(crate) mod own_relay;
pub(crate) mod progress;
pub(crate) mod reconcile;
pub(crate) mod refusal;
pub(crate) mod refused;
pub(crate) mod relay_info;
pub(crate) mod relay_text;
pub(crate) mod relay_url;
pub(crate) mod result_cap;
pub(crate) mod saved_state;
pub(crate) mod seen;
pub(crate) mod service;
pub(crate) mod shard;
pub(crate) mod subscription;
pub(crate) mod time;
pub(crate) mod timer;
#[cfg(feature = "shell")]
pub(crate) mod ws_reader;
#[cfg(feature = "shell")]
pub(crate) mod ws_writer;
