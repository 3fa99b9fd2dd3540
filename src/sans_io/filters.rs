//! The three filter layers of GRASP-02 and the packing of filters into REQs.
//!
//! Layer 1 asks a relay for repository announcements (discovery); Layer 2
//! for events tagging our repos (`#a`, `#A`, `#q`) plus their 30618 state
//! (`#d`); Layer 3 for events tagging our root events (`#e`, `#E`, `#q`).
//! Each filter carries one tag letter only (strfry caps tag letters per
//! filter, and a filter with two tag letters would AND them) and at most
//! `chunk_size` values. Filters are then packed into as few REQs as the
//! relay's limits allow, because relays cap concurrent subscriptions far
//! below the number of filters a busy repo set needs.

use nostr::prelude::{Filter, Kind, SingleLetterTag, Timestamp};

use crate::sans_io::index::{
    Item, KIND_ANNOUNCEMENT, KIND_DELETION, KIND_STATE, ROOT_KINDS, RepoIndex,
};

/// Kinds of the self-subscription to the own relay: announcements, roots
/// and deletions (which release what they delete from the index).
/// 1619 (PR update) is not a root; it arrives through Layer 3.
pub(crate) fn self_filter(since: Option<Timestamp>) -> Filter {
    let kinds = [KIND_ANNOUNCEMENT, KIND_DELETION]
        .into_iter()
        .chain(ROOT_KINDS)
        .map(Kind::from_u16);
    with_since(Filter::new().kinds(kinds), since)
}

/// Layer 1: every repository announcement on the relay.
pub(crate) fn announcement_filter(since: Option<Timestamp>) -> Filter {
    with_since(Filter::new().kind(Kind::from_u16(KIND_ANNOUNCEMENT)), since)
}

/// Live traffic for a relay whose per-id filters would not fit its limits:
/// everything of the listed kinds since `since`, matched against the index
/// locally when it arrives.
pub(crate) fn wide_filter(kinds: &[u16], since: Timestamp) -> Filter {
    Filter::new()
        .kinds(kinds.iter().copied().map(Kind::from_u16))
        .since(since)
}

/// Layer 2 or 3 filters for one chunk of items of one kind (all repos or all
/// roots): one filter per tag letter.
pub fn chunk_filters(index: &RepoIndex, items: &[Item], since: Option<Timestamp>) -> Vec<Filter> {
    let mut coords = Vec::new();
    let mut identifiers = Vec::new();
    let mut roots = Vec::new();
    for item in items {
        match *item {
            Item::Repo(repo) => {
                coords.push(index.repo_coord(repo).to_owned());
                identifiers.push(index.repo_identifier(repo).to_owned());
            }
            Item::Root(root) => roots.push(index.root_event(root).to_hex()),
        }
    }
    let mut filters = Vec::with_capacity(7);
    if !coords.is_empty() {
        for letter in [
            SingleLetterTag::LOWERCASE_A,
            SingleLetterTag::UPPERCASE_A,
            SingleLetterTag::LOWERCASE_Q,
        ] {
            filters.push(Filter::new().custom_tags(letter, coords.iter()));
        }
        filters.push(
            Filter::new()
                .kind(Kind::from_u16(KIND_STATE))
                .custom_tags(SingleLetterTag::LOWERCASE_D, identifiers.iter()),
        );
    }
    if !roots.is_empty() {
        for letter in [
            SingleLetterTag::LOWERCASE_E,
            SingleLetterTag::UPPERCASE_E,
            SingleLetterTag::LOWERCASE_Q,
        ] {
            filters.push(Filter::new().custom_tags(letter, roots.iter()));
        }
    }
    filters.into_iter().map(|f| with_since(f, since)).collect()
}

/// Filters one chunk of repos costs: `#a`, `#A`, `#q` and the 30618 `#d`.
pub(crate) const REPO_FILTERS_PER_CHUNK: usize = 4;
/// Filters one chunk of roots costs: `#e`, `#E`, `#q`.
pub(crate) const ROOT_FILTERS_PER_CHUNK: usize = 3;

/// The REQ message for `filters`, serialized once; the caller checks its size.
pub fn req_message(sub_id: &str, filters: &[Filter]) -> String {
    let mut msg = String::with_capacity(64 + filters.len() * 128);
    msg.push_str("[\"REQ\",\"");
    msg.push_str(sub_id);
    msg.push('"');
    for filter in filters {
        msg.push(',');
        msg.push_str(&filter.as_json());
    }
    msg.push(']');
    msg
}

/// A filter with its JSON, serialized once: packing needs its size and
/// the REQ needs its text.
#[derive(Debug, Clone)]
pub(crate) struct Encoded {
    /// The filter, kept to match what arrives.
    pub filter: Filter,
    /// Its JSON.
    pub json: String,
}

impl Encoded {
    /// Serializes `filter`.
    pub(crate) fn new(filter: Filter) -> Self {
        let json = filter.as_json();
        Encoded { filter, json }
    }
}

/// The REQ message for filters already serialized.
pub(crate) fn req_message_encoded(sub_id: &str, filters: &[Encoded]) -> String {
    let len: usize = filters.iter().map(|f| f.json.len() + 1).sum();
    let mut msg = String::with_capacity(16 + sub_id.len() + len);
    msg.push_str("[\"REQ\",\"");
    msg.push_str(sub_id);
    msg.push('"');
    for filter in filters {
        msg.push(',');
        msg.push_str(&filter.json);
    }
    msg.push(']');
    msg
}

/// The CLOSE message for a subscription.
pub(crate) fn close_message(sub_id: &str) -> String {
    format!("[\"CLOSE\",\"{sub_id}\"]")
}

fn with_since(filter: Filter, since: Option<Timestamp>) -> Filter {
    match since {
        Some(ts) => filter.since(ts),
        None => filter,
    }
}
