//! The NIP-42 AUTH event, shared by remote relays (`engine`) and the own
//! relay (`own_relay`).

use nostr::prelude::*;

use crate::sans_io::timing::time::Time;

/// The NIP-42 answer to `challenge` from `relay_url`, signed at `now`.
pub(crate) fn auth_event(
    keys: &Keys,
    relay_url: &str,
    challenge: &str,
    now: Time,
) -> Result<Event, nostr::error::Error> {
    EventBuilder::new(Kind::Authentication, "")
        .tags([
            Tag::custom("relay", [relay_url]),
            Tag::custom("challenge", [challenge]),
        ])
        .custom_created_at(Timestamp::from_secs(now.as_secs()))
        .finalize(keys)
}
