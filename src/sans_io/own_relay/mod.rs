//! The client side of the own relay: what the shell needs to store synced
//! events there and to list what it already holds, as sans-IO pieces.

pub(crate) mod listing;
pub(crate) mod outbox;
