//! Everything pure: the sync engine and the data structures it is made of.
//!
//! Nothing in this folder touches a socket, a file, a thread or a clock;
//! `.ci/run` fails if a file here so much as names the event loop's crate,
//! TCP sockets, the file system, threads or the wall clock. Time comes in
//! as a [`timing::time::Time`] argument, bytes come in as parsed messages, and what
//! should happen goes out as values, so every rule can be tested under a
//! simulated clock and the same engine runs in any event loop.
//!
//! Each folder owns one part and says in its `mod.rs` what it may use;
//! imports go one way, from the bottom up: `timing` and `identity`, then
//! `wire` and `memory`, then `query`, then `engine` and `own_relay`.

pub(crate) mod config;
pub(crate) mod engine;
pub(crate) mod identity;
pub(crate) mod memory;
pub(crate) mod own_relay;
pub(crate) mod progress;
pub(crate) mod query;
pub(crate) mod timing;
pub(crate) mod wire;
