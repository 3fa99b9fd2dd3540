//! Deterministic keys and NIP-34 events for simulations: signed events from
//! fixed keys, and cheap unsigned ones for the local-feed path.

use nostr::prelude::*;

use super::{OWN, T0};

/// Deterministic keys number `n` (0 is taken as 1).
pub fn keys(n: u8) -> Keys {
    let mut secret = [0x11u8; 32];
    secret[0] = n.max(1);
    // Any 32 bytes this close to 0x11.. are below the curve order.
    Keys::new(SecretKey::from_slice(&secret).expect("valid secret key"))
}

/// Deterministic keys number `n`, for worlds with more authors than
/// [`keys`] numbers (the benches' thousand repo owners).
pub fn wide_keys(n: u32) -> Keys {
    let mut secret = [0x11u8; 32];
    secret[..4].copy_from_slice(&(n + 1).to_be_bytes());
    Keys::new(SecretKey::from_slice(&secret).expect("valid secret key"))
}

/// A tag from its values.
///
/// # Panics
///
/// On what nostr refuses (an empty tag); see [`try_tag`].
pub fn tag(values: &[&str]) -> Tag {
    try_tag(values).expect("valid tag")
}

/// A tag from its values; `None` for what nostr refuses (an empty tag), for
/// inputs built from fuzz data.
pub fn try_tag(values: &[&str]) -> Option<Tag> {
    Tag::parse(values.iter().copied()).ok()
}

/// A signed event.
pub fn sign(keys: &Keys, kind: u16, created_at: u64, tags: Vec<Tag>, content: &str) -> Event {
    EventBuilder::new(Kind::from_u16(kind), content)
        .tags(tags)
        .custom_created_at(Timestamp::from_secs(created_at))
        .finalize(keys)
        // Signing with in-memory keys cannot fail.
        .expect("signing with keys works")
}

/// The repo ref (`30617:<pubkey>:<d>`) of an announcement by `keys`.
pub fn coord(keys: &Keys, d: &str) -> String {
    format!("30617:{}:{d}", keys.public_key().to_hex())
}

/// A repo announcement listing `relays` in one `relays` tag. When they
/// list the simulated own relay ([`OWN`], any spelling), it is named as the
/// GRASP server in a `clone` tag too (`https://own.example/<npub>/<d>.git`),
/// as GRASP-01 wants of an announcement the own relay accepts.
pub fn announcement(k: &Keys, d: &str, relays: &[&str], created_at: u64) -> Event {
    let mut tags = announcement_tags(d, relays);
    let host = OWN.split_once("://").map_or(OWN, |(_, h)| h);
    let lists_own = relays.iter().any(|r| {
        r.split_once("://")
            .is_some_and(|(_, rest)| rest.trim_end_matches('/').eq_ignore_ascii_case(host))
    });
    if lists_own {
        let npub = k.public_key().to_bech32().expect("bech32 of a key");
        tags.push(tag(&["clone", &format!("https://{host}/{npub}/{d}.git")]));
    }
    sign(k, 30617, created_at, tags, "")
}

/// A repo announcement with only its `d` and `relays` tags: no `clone`
/// tag, whatever it lists.
pub fn plain_announcement(k: &Keys, d: &str, relays: &[&str], created_at: u64) -> Event {
    sign(k, 30617, created_at, announcement_tags(d, relays), "")
}

fn announcement_tags(d: &str, relays: &[&str]) -> Vec<Tag> {
    let mut values = vec!["relays"];
    values.extend_from_slice(relays);
    vec![tag(&["d", d]), tag(&values)]
}

/// A root event (1617 patch, 1618 PR, 1621 issue) under the given repos.
pub fn root(k: &Keys, kind: u16, repos: &[&str], created_at: u64, content: &str) -> Event {
    let tags = repos.iter().map(|c| tag(&["a", c])).collect();
    sign(k, kind, created_at, tags, content)
}

/// A NIP-22 reply (kind 1111) to a root, scoped with uppercase `E`.
pub fn reply(k: &Keys, root: &Event, created_at: u64, content: &str) -> Event {
    let id = root.id.to_hex();
    sign(
        k,
        1111,
        created_at,
        vec![tag(&["E", &id]), tag(&["e", &id])],
        content,
    )
}

/// A status event (1630-1633) for a root.
pub fn status(k: &Keys, root: &Event, kind: u16, created_at: u64) -> Event {
    sign(
        k,
        kind,
        created_at,
        vec![tag(&["e", &root.id.to_hex()])],
        "",
    )
}

/// An event tagging a repo with `A` (a comment on the repo).
pub fn repo_comment(k: &Keys, coord: &str, created_at: u64, content: &str) -> Event {
    sign(k, 1111, created_at, vec![tag(&["A", coord])], content)
}

/// A 30618 state event.
pub fn state(k: &Keys, d: &str, created_at: u64) -> Event {
    sign(
        k,
        30618,
        created_at,
        vec![tag(&["d", d]), tag(&["refs/heads/main", "abc"])],
        "",
    )
}

/// The made-up id [`local_event`] gives event `n` of `kind`.
pub fn local_id(n: u64, kind: u16) -> EventId {
    let mut id = [0u8; 32];
    id[..8].copy_from_slice(&n.to_be_bytes());
    id[8..10].copy_from_slice(&kind.to_le_bytes());
    EventId::from_byte_array(id)
}

/// An event with a made-up id and signature, created at [`T0`], for the
/// local-feed path that trusts its input (an embedding relay already
/// verified it). Cheap enough to build a million.
pub fn local_event(pubkey: PublicKey, n: u64, kind: u16, tags: Vec<Tag>) -> Event {
    let sig = Signature::from_slice(&[1u8; 64]).expect("64 bytes");
    Event::new(
        local_id(n, kind),
        pubkey,
        Timestamp::from_secs(T0),
        Kind::from_u16(kind),
        tags,
        "",
        sig,
    )
}
