//! The sync scenario the test and the load run share: two remote relays,
//! a repository announced to the embedded relay by its own client, another
//! announced only on a remote relay (recursive discovery), histories of
//! comments on both, and a live event for each.

use nostr_relay_builder::prelude::*;

/// A GRASP-01 announcement of `d` by `owner` listing `relays`, with a clone
/// URL on each `ws://` relay of them (the embedded relay must be named in
/// both to accept it).
pub fn announcement(owner: &Keys, d: &str, relays: &[&str], at: u64) -> Event {
    let npub = owner.public_key().to_bech32().expect("bech32 of a key");
    let mut tags = vec![tag(&["d", d])];
    let mut listed = vec!["relays"];
    listed.extend_from_slice(relays);
    tags.push(tag(&listed));
    let clones: Vec<String> = relays
        .iter()
        .map(|r| format!("http://{}/{npub}/{d}.git", r.trim_start_matches("ws://")))
        .collect();
    let mut clone = vec!["clone"];
    clone.extend(clones.iter().map(String::as_str));
    tags.push(tag(&clone));
    sign(owner, 30617, at, tags, "")
}

/// The coordinate of repository `d` of `owner`.
pub fn coord(owner: &Keys, d: &str) -> String {
    format!("30617:{}:{d}", owner.public_key().to_hex())
}

/// An issue (1621) on the repository at `coord`.
pub fn issue(author: &Keys, coord: &str, at: u64, text: &str) -> Event {
    sign(author, 1621, at, vec![tag(&["a", coord])], text)
}

/// A comment (1111) on the repository at `coord`.
pub fn comment(author: &Keys, coord: &str, at: u64, text: &str) -> Event {
    sign(author, 1111, at, vec![tag(&["A", coord])], text)
}

/// `n` comments on `coord`, one a second from `at`.
pub fn history(author: &Keys, coord: &str, at: u64, n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| comment(author, coord, at + i as u64, &format!("comment {i}")))
        .collect()
}

fn tag(values: &[&str]) -> Tag {
    Tag::parse(values.iter().copied()).expect("a valid tag")
}

fn sign(keys: &Keys, kind: u16, at: u64, tags: Vec<Tag>, content: &str) -> Event {
    EventBuilder::new(Kind::from(kind), content)
        .tags(tags)
        .custom_created_at(Timestamp::from_secs(at))
        .sign_with_keys(keys)
        .expect("signing works")
}
