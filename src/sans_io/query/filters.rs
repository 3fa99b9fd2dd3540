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

use std::collections::BTreeSet;

use nostr::prelude::{Filter, Kind, SingleLetterTag, Timestamp};

use crate::sans_io::memory::index::{
    Item, KIND_ANNOUNCEMENT, KIND_DELETION, KIND_STATE, ROOT_KINDS, RepoIndex,
};

/// The filter's one tag condition, if it has exactly one: a filter that
/// is batched with others by value, or paired with its twin, must.
pub(crate) fn one_tag(f: &Filter) -> Option<(&SingleLetterTag, &BTreeSet<String>)> {
    let mut tags = f.generic_tags.iter();
    let tag = tags.next()?;
    tags.next().is_none().then_some(tag)
}

/// `a` and `b` ask the same but, maybe, for their tag conditions.
/// Compared field by field, cheapest first: callers pair filters on every
/// page or every REQ, and cloning one to compare it whole would copy its
/// tag values.
pub(crate) fn same_but_tags(a: &Filter, b: &Filter) -> bool {
    (a.since, a.until, a.limit) == (b.since, b.until, b.limit)
        && a.kinds == b.kinds
        && a.ids == b.ids
        && a.authors == b.authors
        && a.search == b.search
}

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
    let base = with_since(Filter::new(), since);
    chunk_parts(index, items)
        .into_iter()
        .flat_map(|part| part.into_filters(&base))
        .collect()
}

/// [`chunk_filters`] with `limit`, each with its JSON. Filters of one chunk
/// share their values (`#a`, `#A` and `#q` the repo coordinates; `#e`,
/// `#E` and `#q` the root ids), so each value list is sorted once and
/// serialized once for all the filters that carry it: a big relay's first
/// sync is mostly this.
pub(crate) fn chunk_filters_encoded(
    index: &RepoIndex,
    items: &[Item],
    since: Option<Timestamp>,
    limit: usize,
) -> Vec<Encoded> {
    let base = with_since(Filter::new(), since).limit(limit);
    let mut encoded = Vec::with_capacity(7);
    for mut part in chunk_parts(index, items) {
        let values = values_json(&mut part);
        let head_json = part.head(&base).as_json();
        let letters = part.letters;
        for (filter, &letter) in part.into_filters(&base).into_iter().zip(letters) {
            let json = with_tag_json(&head_json, letter, &values);
            encoded.push(Encoded { filter, json });
        }
    }
    encoded
}

/// One value list of a chunk and the tag letters (one filter each) that
/// carry it, on filters of `kind` if any.
struct ChunkPart {
    kind: Option<u16>,
    letters: &'static [SingleLetterTag],
    values: BTreeSet<String>,
}

const REPO_LETTERS: &[SingleLetterTag] = &[
    SingleLetterTag::LOWERCASE_A,
    SingleLetterTag::UPPERCASE_A,
    SingleLetterTag::LOWERCASE_Q,
];
const STATE_LETTERS: &[SingleLetterTag] = &[SingleLetterTag::LOWERCASE_D];
const ROOT_LETTERS: &[SingleLetterTag] = &[
    SingleLetterTag::LOWERCASE_E,
    SingleLetterTag::UPPERCASE_E,
    SingleLetterTag::LOWERCASE_Q,
];

/// The value lists of a chunk, in the order its filters go out.
fn chunk_parts(index: &RepoIndex, items: &[Item]) -> Vec<ChunkPart> {
    let repos = items.iter().filter(|i| matches!(i, Item::Repo(_))).count();
    let mut coords = Vec::with_capacity(repos);
    let mut identifiers = Vec::with_capacity(repos);
    let mut roots = Vec::with_capacity(items.len() - repos);
    for item in items {
        match *item {
            Item::Repo(repo) => {
                coords.push(index.repo_coord(repo).to_owned());
                identifiers.push(index.repo_identifier(repo).to_owned());
            }
            Item::Root(root) => roots.push(index.root_event(root).to_hex()),
        }
    }
    let parts = [
        (None, REPO_LETTERS, coords),
        (Some(KIND_STATE), STATE_LETTERS, identifiers),
        (None, ROOT_LETTERS, roots),
    ];
    // Collected from a `Vec`, a set is sorted once and built in bulk,
    // cheaper than inserting the values one at a time.
    parts
        .into_iter()
        .filter(|(_, _, values)| !values.is_empty())
        .map(|(kind, letters, values)| ChunkPart {
            kind,
            letters,
            values: values.into_iter().collect(),
        })
        .collect()
}

impl ChunkPart {
    /// `base` with this part's kind, no tag yet.
    fn head(&self, base: &Filter) -> Filter {
        match self.kind {
            Some(kind) => base.clone().kind(Kind::from_u16(kind)),
            None => base.clone(),
        }
    }

    /// One filter per letter, built from `base`: the values are sorted
    /// once and cloned, the last filter takes them.
    fn into_filters(self, base: &Filter) -> Vec<Filter> {
        let head = self.head(base);
        let mut filters = Vec::with_capacity(self.letters.len());
        for (i, &letter) in self.letters.iter().enumerate() {
            let mut filter = head.clone();
            let values = if i + 1 == self.letters.len() {
                BTreeSet::new()
            } else {
                self.values.clone()
            };
            filter.generic_tags.insert(letter, values);
            filters.push(filter);
        }
        if let (Some(last), Some(&letter)) = (filters.last_mut(), self.letters.last()) {
            last.generic_tags.insert(letter, self.values);
        }
        filters
    }
}

/// The JSON array of a part's values, as nostr serializes a tag's values.
fn values_json(part: &mut ChunkPart) -> String {
    let letter = SingleLetterTag::LOWERCASE_E;
    let mut filter = Filter::new();
    let values = std::mem::take(&mut part.values);
    filter.generic_tags.insert(letter, values);
    let json = filter.as_json();
    part.values = filter.generic_tags.remove(&letter).unwrap_or_default();
    // `{"#e":[...]}`: the array sits between the key and the closing brace.
    json.get(TAG_KEY_LEN..json.len() - 1)
        .unwrap_or("[]")
        .to_owned()
}

/// Length of `{"#e":` in a filter's JSON.
const TAG_KEY_LEN: usize = 6;

/// `head_json` (a filter without tags) with `"#<letter>":<values>` added
/// last, where nostr puts tags.
fn with_tag_json(head_json: &str, letter: SingleLetterTag, values: &str) -> String {
    let open = head_json.strip_suffix('}').unwrap_or("{");
    let mut json = String::with_capacity(open.len() + values.len() + 8);
    json.push_str(open);
    if open.len() > 1 {
        json.push(',');
    }
    json.push_str("\"#");
    json.push(letter.as_char());
    json.push_str("\":");
    json.push_str(values);
    json.push('}');
    json
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nostr::prelude::*;

    use super::*;
    use crate::{Config, Engine, Time};

    fn event(keys: &Keys, kind: u16, tags: &[&[&str]]) -> nostr::prelude::Event {
        let tags = tags.iter().map(|t| Tag::parse(t.iter().copied()).unwrap());
        EventBuilder::new(Kind::from_u16(kind), "")
            .tags(tags)
            .finalize(keys)
            .unwrap()
    }

    /// An index with repos (one whose identifier needs JSON escaping) and
    /// roots, and the items of each kind.
    fn world() -> (Engine, Vec<Item>, Vec<Item>) {
        let mut config = Config::new("wss://own.example");
        config.self_subscribe = false;
        let t0 = Time::from_secs(1_000);
        let mut engine = Engine::new(config, t0).unwrap();
        let keys = Keys::generate();
        let relays: &[&str] = &["relays", "wss://a.example"];
        let names = ["plain", "with \"quotes\" and \\", "üñí"];
        let mut coords = Vec::new();
        for d in names {
            engine.handle_local_event(t0, event(&keys, 30617, &[&["d", d], relays]));
            coords.push(format!("30617:{}:{d}", keys.public_key().to_hex()));
        }
        let mut roots = Vec::new();
        for i in 0..5 {
            let root = event(&keys, 1621, &[&["a", &coords[i % 3]]]);
            roots.push(root.id);
            engine.handle_local_event(t0, root);
        }
        engine.handle_timeout(t0 + Duration::from_secs(60));
        let index = engine.index();
        let repos = coords.iter().map(|c| Item::Repo(index.repo_id(c).unwrap()));
        let roots = roots.iter().map(|r| Item::Root(index.root_id(r).unwrap()));
        let (repos, roots) = (repos.collect(), roots.collect());
        (engine, repos, roots)
    }

    #[test]
    fn encoded_chunk_filters_are_the_filters_and_their_nostr_json() {
        let (engine, repos, roots) = world();
        for since in [None, Some(Timestamp::from_secs(77))] {
            for items in [&repos, &roots] {
                let plain = chunk_filters(engine.index(), items, since);
                let encoded = chunk_filters_encoded(engine.index(), items, since, 500);
                assert_eq!(encoded.len(), plain.len());
                for (e, f) in encoded.iter().zip(plain) {
                    assert_eq!(e.filter, f.limit(500));
                    assert_eq!(e.json, e.filter.as_json());
                }
            }
        }
    }
}
