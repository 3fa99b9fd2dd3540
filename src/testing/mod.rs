//! Helpers for exercising grasp-sync: the simulation harness ([`sim`]) the
//! tests, benches and fuzz targets drive the engine with, and, over real
//! sockets, the test relays, relay farm and fault injector of the network
//! shell's tests and the `grasp-sync demo` command.
//!
//! Nothing in here is used by the engine itself. The engine stays sans-IO;
//! these helpers are the "other side of the wire" that a test or a demo
//! needs to talk to.

pub mod cert;
pub mod farm;
pub mod fault;
pub mod limits;
mod lock;
pub mod log_capture;
pub mod relay;
mod relay_message;
pub mod sim;
pub mod store;
