//! A relay message as the text the test relay and its fault injector
//! (`relay`, `fault`) send, without a panic on the way.

use nostr::prelude::RelayMessage;

/// Serializes a relay message. `None` (logged) only if serde_json fails on
/// it, which for these plain messages would be a bug in nostr; `as_json`
/// would panic instead.
pub(super) fn to_json(msg: &RelayMessage<'_>) -> Option<String> {
    match msg.try_as_json() {
        Ok(text) => Some(text),
        Err(e) => {
            log::error!("test relay: cannot serialize a relay message: {e}");
            None
        }
    }
}
