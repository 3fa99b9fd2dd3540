//! Relay identity: which relay a URL names and whether we may reach it.
//! One spelling per relay (`relay_url`), the addresses a relay may
//! resolve to (`address`, the SSRF guard), the own relay under every name
//! the world gives it (`service`, GRASP-01), and which engine of a
//! sharded set a relay belongs to (`shard`).
//!
//! Pure functions of URLs and addresses: may use nothing of `sans_io`
//! outside this folder, only `nostr` (`RelayUrl`, the announcement's
//! `Event`) and `std`.

pub(crate) mod address;
pub(crate) mod relay_url;
pub(crate) mod service;
pub(crate) mod shard;
