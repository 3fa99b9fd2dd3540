//! Helpers for exercising grasp-sync against real sockets: integration tests
//! of the network shell and the `grasp-sync demo` command.
//!
//! Nothing in here is used by the engine itself. The engine stays sans-IO;
//! these helpers are the "other side of the wire" that a test or a demo
//! needs to talk to.

pub mod cert;
pub mod farm;
pub mod fault;
pub mod limits;
pub mod relay;
pub mod store;
