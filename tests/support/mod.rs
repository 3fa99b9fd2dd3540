//! What the integration tests share. The simulated world of the `sim_*`
//! tests (the engine wired to in-memory fake relays, a clock that jumps to
//! the engine's next deadline, signed NIP-34 events from fixed keys) is the
//! crate's one simulation harness, [`grasp_sync::testing::sim`], re-exported
//! here; the modules below are the socket-level extras of the `net_*` and
//! `ext_*` tests.

#![allow(dead_code, unused_imports)]

pub mod client;
pub mod real;
pub mod round_trips;
pub mod running;

pub use grasp_sync::testing::limits::ValueCaps;
pub use grasp_sync::testing::sim::*;
