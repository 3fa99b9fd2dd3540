//! Wire formats: the bytes and texts relays exchange with us, read and
//! written without a socket. Websocket frames in and out, the NIP-11
//! fetch over HTTP and the `limitation` it carries, the NIP-42 AUTH event,
//! relay-provided text made fit for a log, the hex NIP-77 frames
//! travel as, and the id and signature check every event passes.
//!
//! What a message means for sync is the engine's, not decided here. May
//! use `timing` (the [`Time`](super::timing::time::Time) an AUTH event or
//! a log budget is stamped with) and the `nostr`, `secp256k1`,
//! `serde_json` and `tungstenite` crates; nothing else of `sans_io`.

pub mod hex;
// NIP-11 over HTTP: the shell's alone.
#[cfg(feature = "shell")]
pub(crate) mod info_fetch;
pub(crate) mod nip42;
pub(crate) mod relay_info;
pub(crate) mod relay_text;
pub(crate) mod signature;
#[cfg(feature = "shell")]
pub(crate) mod ws_reader;
#[cfg(feature = "shell")]
pub(crate) mod ws_writer;
