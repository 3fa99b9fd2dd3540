//! What the engine knows and remembers: the repo index (repositories,
//! root events and relays learnt from announcements, interned to small
//! ids), the event ids already verified (`seen`) or refused for good by
//! the sink (`refused`), and the state saved across a restart
//! (`saved_state`, plain data with a versioned JSON form).
//!
//! Plain structs that hold and answer, never decide what to send: may use
//! `identity` (which relays an announcement names and which of them are
//! the own relay) and `timing`; not `wire`, `query` or the engine.

pub(crate) mod index;
pub(crate) mod refused;
pub(crate) mod saved_state;
pub(crate) mod seen;
