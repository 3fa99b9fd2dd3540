//! The client side of the own relay: what the shell needs to store synced
//! events there and to list what it already holds, as sans-IO pieces.
//! [`client::OwnRelayClient`] ties them to one connection; `outbox` and
//! `list_query` (with `list_batch`) are its parts.

// Without the shell only the engine's reconnect policy (`client::RECONNECT`,
// shared by both links to the own relay) is used: the rest is the shell's.
#![cfg_attr(not(feature = "shell"), allow(dead_code, unused_imports))]

pub(crate) mod client;
pub(crate) mod link_budget;
pub(crate) mod list_batch;
pub(crate) mod list_query;
pub(crate) mod outbox;
pub(crate) mod pacer;
pub(crate) mod refusal_log;

pub(crate) use client::{ClientOutput, HeldBack, OwnRelayClient, Transmit};
