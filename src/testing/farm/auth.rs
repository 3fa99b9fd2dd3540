//! NIP-42 AUTH, relay side, for the relay farm.
//!
//! Many real relays serve nothing until the client authenticates; the
//! engine answers challenges with `--auth-key-file`, and the demo must show
//! it doing so against relays that insist. A relay of the farm that
//! requires AUTH sends `["AUTH", challenge]` as the websocket opens, a fresh
//! random challenge per connection, and serves reads only once a valid
//! kind 22242 event for that challenge arrived (see [`check`]).
//!
//! Pure checks, no IO: the farm thread owns the connection state.

use nostr::prelude::{Event, Kind, Timestamp};
use rand::RngCore;
use rand::rngs::SmallRng;

/// How far an AUTH event's `created_at` may be from now, in seconds: NIP-42
/// says "about 10 minutes".
pub(super) const MAX_SKEW_SECS: u64 = 600;

/// A new challenge: 16 random bytes as hex, so one connection's AUTH event
/// cannot be replayed on another.
pub(super) fn challenge(rng: &mut SmallRng) -> String {
    let mut bytes = [0u8; 16];
    rng.fill_bytes(&mut bytes);
    crate::sans_io::wire::hex::encode(&bytes)
}

/// Why an AUTH event was refused (the `OK false` message), or `Ok` when it
/// authenticates its author on a connection challenged with `challenge`
/// (`None`: no challenge was sent) of the relay listening on `port`, at
/// `now`. NIP-42: kind 22242, our challenge in a `challenge` tag, a `relay`
/// tag naming this relay (its port: the host may be written several ways),
/// `created_at` within [`MAX_SKEW_SECS`], and a valid id and signature.
pub(super) fn check(
    event: &Event,
    challenge: Option<&str>,
    port: u16,
    now: Timestamp,
) -> Result<(), &'static str> {
    let Some(challenge) = challenge else {
        return Err("auth-required: this relay sent no challenge");
    };
    if event.kind != Kind::Authentication {
        return Err("invalid: not a kind 22242 event");
    }
    if event.tags.challenge().as_deref() != Some(challenge) {
        return Err("invalid: wrong challenge");
    }
    let relay = event
        .tags
        .iter()
        .map(|t| t.as_slice())
        .find(|t| t.first().map(String::as_str) == Some("relay"))
        .and_then(|t| t.get(1));
    if !relay.is_some_and(|url| names_port(url, port)) {
        return Err("invalid: the relay tag does not name this relay");
    }
    if now.as_secs().abs_diff(event.created_at.as_secs()) > MAX_SKEW_SECS {
        return Err("invalid: created_at too far from now");
    }
    if event.verify().is_err() {
        return Err("invalid: bad id or signature");
    }
    Ok(())
}

/// True when `url` (`ws://host:port/...`) has port `port`.
fn names_port(url: &str, port: u16) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    authority
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
        == Some(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relay_tag_is_read_by_its_port() {
        assert!(names_port("ws://127.0.0.1:4000", 4000));
        assert!(names_port("wss://localhost:4000/", 4000));
        assert!(names_port("ws://[::1]:4000/path?x", 4000));
        assert!(!names_port("ws://127.0.0.1:4001", 4000));
        assert!(!names_port("ws://127.0.0.1", 4000));
        assert!(!names_port("", 4000));
    }
}
