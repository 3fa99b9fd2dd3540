//! What the engine keeps across a restart, as plain data with a versioned
//! JSON form.
//!
//! Per relay: when it was last connected and disconnected, up to when its
//! live coverage was unbroken, when its next full sync is due, its health
//! (failures, retry time, penalties), the limits it taught us, and a hash
//! of each item it had confirmed (so a restart within the quick-reconnect
//! window catches up with `since` instead of re-reading history).
//!
//! Times are wall-clock Unix seconds: the engine's `Time` is monotonic
//! and means nothing to the next process, so the engine converts with a
//! `(Time, unix)` pair the caller passes in.
//!
//! The own relay's side rides along: the ids it refused for good (so a
//! re-sync neither fetches nor offers them again, `refused`) and what was
//! still in its outbox when the last shutdown's deadline passed (offered
//! first at the next start).
//!
//! The file is input like any relay's: `decode` checks every field's type
//! and shape and rejects the whole file on any doubt (the caller starts
//! fresh), and the engine clamps every value it takes from it. Decoding is
//! bounded and streams: the text is read straight into these structs (a
//! tree of JSON values first cost 16 times the file's size), and at most
//! [`MAX_RELAYS`] relays and [`MAX_CONFIRMED`] hashes are kept, whatever
//! the file holds.

use std::borrow::Cow;
use std::fmt;

use nostr::prelude::{Event, EventId};
use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The format version written; a file of another version is set aside.
/// Fields added since (`refused`, `outbox`) are optional: a file of an
/// older build reads the same.
pub(crate) const VERSION: u64 = 1;
/// Relays saved and restored at most (most recently useful first).
pub(crate) const MAX_RELAYS: usize = 2_000;
/// Confirmed-item hashes saved and restored at most, over all relays.
/// 16 bytes each in the file: 1.6 MB at most; with [`MAX_RELAYS`]
/// records of about 500 bytes the relays stay under about 2.5 MiB.
pub(crate) const MAX_CONFIRMED: usize = 100_000;
/// Bytes of outbox events saved at most (their JSON): with the refused
/// ids (`refused::MAX_REFUSED`, 640 kB) the whole file stays under about
/// 5 MiB, well inside what `state_file` reads.
pub(crate) const MAX_OUTBOX_BYTES: usize = 2 * 1024 * 1024;

/// The engine's state worth keeping across a restart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedState {
    /// When it was saved (Unix seconds).
    pub saved_at: u64,
    /// Relays, most recently useful first.
    pub relays: Vec<SavedRelay>,
    /// Events the sink refused for good, oldest first.
    pub refused: Vec<EventId>,
    /// Events still waiting for the own relay when the engine stopped, in
    /// the order they were to be offered.
    pub outbox: Vec<Event>,
}

/// What one relay taught us. Times are Unix seconds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedRelay {
    /// Normalized URL.
    pub url: String,
    /// When its last connection began.
    pub last_connected: Option<u64>,
    /// When its last connection ended (the save, for one still open).
    pub disconnected: Option<u64>,
    /// Live coverage was unbroken up to here, and the sink had confirmed
    /// every event received before it.
    pub covered_until: Option<u64>,
    /// Announcements (layer 1) were not read to the end.
    pub layer1_unread: bool,
    /// When its next daily full sync is due.
    pub next_full_sync: Option<u64>,
    /// Failures since the last success.
    pub failures: u32,
    /// Refusals of historic work in a row.
    pub refusals: u32,
    /// Failing without a success since.
    pub failing_since: Option<u64>,
    /// Rate-limited until.
    pub rate_limited_until: Option<u64>,
    /// Next connect attempt allowed at.
    pub retry_at: Option<u64>,
    /// Penalties earned for misbehaving.
    pub penalties: u32,
    /// Learned limits; `None` where ours still stand.
    pub limits: SavedLimits,
    /// NIP-77: `Some(true)` it reconciled, `Some(false)` it does not.
    pub negentropy: Option<bool>,
    /// Hashes of the items it had confirmed (FNV-1a of a repo's
    /// coordinate or a root's hex id), each with every event of its
    /// history confirmed by the sink.
    pub confirmed: Vec<u64>,
}

/// Limits a relay taught us (each only ever lowers ours on restore).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedLimits {
    /// Concurrent subscriptions.
    #[serde(default)]
    pub subscriptions: Option<u64>,
    /// Filters per REQ.
    #[serde(default)]
    pub filters: Option<u64>,
    /// Bytes per REQ message.
    #[serde(default)]
    pub message_bytes: Option<u64>,
    /// `limit` asked per filter.
    #[serde(default)]
    pub page_limit: Option<u64>,
    /// Tag values per filter.
    #[serde(default)]
    pub tag_values: Option<u64>,
    /// Kinds per filter.
    #[serde(default)]
    pub kinds: Option<u64>,
    /// Proven per-filter result cap.
    #[serde(default)]
    pub result_cap: Option<u64>,
    /// Most events one filter ever got.
    #[serde(default)]
    pub result_floor: Option<u64>,
}

/// Why a saved file was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Not JSON (corrupt or truncated).
    Json(String),
    /// Written by another (newer) version of the format.
    Version(u64),
    /// A field is missing or of the wrong shape.
    Field(&'static str),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Json(e) => write!(f, "not valid JSON: {e}"),
            DecodeError::Version(v) => write!(f, "format version {v}, this build reads {VERSION}"),
            DecodeError::Field(name) => write!(f, "field `{name}` missing or malformed"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// A stable 64-bit hash of an item's key (a repo's coordinate, or a root
/// event's hex id): FNV-1a, fixed across builds so a file outlives an
/// upgrade. A collision can only make one item on one relay count as
/// confirmed after a restart; its history is then read by the relay's
/// next full sync, a day at most.
pub(crate) fn item_hash(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl SavedState {
    /// The JSON form.
    pub fn encode(&self) -> String {
        let relays: Vec<_> = self.relays.iter().map(encode_relay).collect();
        let refused: String = self.refused.iter().map(EventId::to_hex).collect();
        let mut bytes = 0;
        let outbox: Vec<_> = self
            .outbox
            .iter()
            .map(|e| (e.as_json(), e))
            .take_while(|(text, _)| {
                bytes += text.len();
                bytes <= MAX_OUTBOX_BYTES
            })
            .map(|(_, e)| e)
            .collect();
        json!({
            "version": VERSION,
            "saved_at": self.saved_at,
            "relays": relays,
            "refused": refused,
            "outbox": outbox,
        })
        .to_string()
    }

    /// Parses the JSON form, keeping at most 2,000 relays and 100,000
    /// hashes. Any doubt is an error: a file that is half right is not
    /// worth the risk of trusting the other half. The version is read
    /// first, so a newer file says so whatever its other fields are.
    pub fn decode(text: &str) -> Result<SavedState, DecodeError> {
        let head: Head = serde_json::from_str(text).map_err(classify)?;
        if head.version != VERSION {
            return Err(DecodeError::Version(head.version));
        }
        let wire: WireState<'_> = serde_json::from_str(text).map_err(classify)?;
        let mut budget = MAX_CONFIRMED;
        let relays = wire
            .relays
            .0
            .into_iter()
            .map(|r| r.into_saved(&mut budget))
            .collect::<Result<_, _>>()?;
        Ok(SavedState {
            saved_at: wire.saved_at,
            relays,
            refused: decode_ids(&wire.refused)?,
            outbox: wire.outbox,
        })
    }
}

/// A serde error as ours: a syntax or truncation is not JSON; anything
/// else names the field serde's message names.
fn classify(e: serde_json::Error) -> DecodeError {
    use serde_json::error::Category;
    match e.classify() {
        Category::Syntax | Category::Eof | Category::Io => DecodeError::Json(e.to_string()),
        Category::Data => DecodeError::Field(field_named(&e.to_string())),
    }
}

/// The first of our field names that `message` mentions, so the log says
/// which one was wrong; `(top level)` when none is.
fn field_named(message: &str) -> &'static str {
    const FIELDS: [&str; 25] = [
        "last_connected",
        "disconnected",
        "covered_until",
        "layer1_unread",
        "next_full_sync",
        "failures",
        "refusals",
        "failing_since",
        "rate_limited_until",
        "retry_at",
        "penalties",
        "limits",
        "negentropy",
        "confirmed",
        "subscriptions",
        "filters",
        "message_bytes",
        "page_limit",
        "tag_values",
        "kinds",
        "result_cap",
        "result_floor",
        "saved_at",
        "refused",
        "outbox",
    ];
    let quoted = |f: &str| message.contains(&format!("`{f}`"));
    FIELDS
        .into_iter()
        .chain(["url", "relays", "version"])
        .find(|f| quoted(f))
        .unwrap_or("(top level)")
}

/// Only the version, everything else skipped unread.
#[derive(Deserialize)]
struct Head {
    version: u64,
}

#[derive(Deserialize)]
struct WireState<'a> {
    saved_at: u64,
    #[serde(borrow)]
    relays: Relays<'a>,
    #[serde(default, borrow)]
    refused: Cow<'a, str>,
    #[serde(default)]
    outbox: Vec<Event>,
}

/// The relay records, the first [`MAX_RELAYS`] decoded and the rest
/// skipped without building anything.
struct Relays<'a>(Vec<WireRelay<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for Relays<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Capped<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for Capped<'a> {
            type Value = Relays<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of relays")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Relays<'a>, A::Error> {
                let mut relays = Vec::new();
                while relays.len() < MAX_RELAYS {
                    match seq.next_element()? {
                        Some(r) => relays.push(r),
                        None => return Ok(Relays(relays)),
                    }
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Relays(relays))
            }
        }
        d.deserialize_seq(Capped(std::marker::PhantomData))
    }
}

#[derive(Serialize, Deserialize)]
struct WireRelay<'a> {
    #[serde(borrow)]
    url: Cow<'a, str>,
    #[serde(default)]
    last_connected: Option<u64>,
    #[serde(default)]
    disconnected: Option<u64>,
    #[serde(default)]
    covered_until: Option<u64>,
    layer1_unread: bool,
    #[serde(default)]
    next_full_sync: Option<u64>,
    #[serde(deserialize_with = "saturating_u32")]
    failures: u32,
    #[serde(deserialize_with = "saturating_u32")]
    refusals: u32,
    #[serde(default)]
    failing_since: Option<u64>,
    #[serde(default)]
    rate_limited_until: Option<u64>,
    #[serde(default)]
    retry_at: Option<u64>,
    #[serde(deserialize_with = "saturating_u32")]
    penalties: u32,
    limits: SavedLimits,
    #[serde(default)]
    negentropy: Option<bool>,
    /// One string of 16 hex digits per hash: a large set costs 16 bytes a
    /// hash, and no JSON array of numbers.
    #[serde(borrow)]
    confirmed: Cow<'a, str>,
}

impl WireRelay<'_> {
    /// The record, with at most `budget` of its hashes (lowering it by as
    /// many).
    fn into_saved(self, budget: &mut usize) -> Result<SavedRelay, DecodeError> {
        let confirmed = decode_hashes(&self.confirmed, budget)?;
        Ok(SavedRelay {
            url: self.url.into_owned(),
            last_connected: self.last_connected,
            disconnected: self.disconnected,
            covered_until: self.covered_until,
            layer1_unread: self.layer1_unread,
            next_full_sync: self.next_full_sync,
            failures: self.failures,
            refusals: self.refusals,
            failing_since: self.failing_since,
            rate_limited_until: self.rate_limited_until,
            retry_at: self.retry_at,
            penalties: self.penalties,
            limits: self.limits,
            negentropy: self.negentropy,
            confirmed,
        })
    }
}

fn encode_relay(r: &SavedRelay) -> WireRelay<'_> {
    WireRelay {
        url: Cow::Borrowed(&r.url),
        last_connected: r.last_connected,
        disconnected: r.disconnected,
        covered_until: r.covered_until,
        layer1_unread: r.layer1_unread,
        next_full_sync: r.next_full_sync,
        failures: r.failures,
        refusals: r.refusals,
        failing_since: r.failing_since,
        rate_limited_until: r.rate_limited_until,
        retry_at: r.retry_at,
        penalties: r.penalties,
        limits: r.limits,
        negentropy: r.negentropy,
        confirmed: Cow::Owned(r.confirmed.iter().map(|h| format!("{h:016x}")).collect()),
    }
}

/// A count too large for `u32` is the largest `u32`, not an error.
fn saturating_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = u64::deserialize(d)?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// The confirmed hashes of one relay; takes at most `budget` of them and
/// lowers it by as many.
fn decode_hashes(text: &str, budget: &mut usize) -> Result<Vec<u64>, DecodeError> {
    if !text.len().is_multiple_of(16) || !text.is_ascii() {
        return Err(DecodeError::Field("confirmed"));
    }
    let take = (text.len() / 16).min(*budget);
    *budget -= take;
    (0..take)
        .map(|i| {
            u64::from_str_radix(&text[i * 16..(i + 1) * 16], 16)
                .map_err(|_| DecodeError::Field("confirmed"))
        })
        .collect()
}

/// The refused ids: 64 hex digits each, at most `refused::MAX_REFUSED`
/// (the newest, as they were saved oldest first).
fn decode_ids(text: &str) -> Result<Vec<EventId>, DecodeError> {
    if !text.len().is_multiple_of(64) || !text.is_ascii() {
        return Err(DecodeError::Field("refused"));
    }
    let n = text.len() / 64;
    let skip = n.saturating_sub(crate::sans_io::memory::refused::MAX_REFUSED);
    (skip..n)
        .map(|i| {
            EventId::from_hex(&text[i * 64..(i + 1) * 64])
                .map_err(|_| DecodeError::Field("refused"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SavedState {
        SavedState {
            saved_at: 1_700_000_000,
            relays: vec![SavedRelay {
                url: "wss://a.example".into(),
                last_connected: Some(1_699_999_000),
                disconnected: Some(1_700_000_000),
                covered_until: Some(1_700_000_000),
                failures: 3,
                retry_at: Some(1_700_000_100),
                penalties: 1,
                limits: SavedLimits {
                    subscriptions: Some(4),
                    result_cap: Some(100),
                    ..SavedLimits::default()
                },
                negentropy: Some(false),
                confirmed: vec![1, u64::MAX, item_hash("x")],
                ..SavedRelay::default()
            }],
            ..SavedState::default()
        }
    }

    #[test]
    fn round_trips() {
        let s = sample();
        assert_eq!(SavedState::decode(&s.encode()), Ok(s));
    }

    #[test]
    fn rejects_corrupt_truncated_newer_and_hostile() {
        let text = sample().encode();
        assert!(matches!(
            SavedState::decode(&text[..text.len() / 2]),
            Err(DecodeError::Json(_))
        ));
        assert!(matches!(
            SavedState::decode("\u{0}\u{1}garbage"),
            Err(DecodeError::Json(_))
        ));
        let newer = text.replace("\"version\":1", "\"version\":2");
        assert_eq!(SavedState::decode(&newer), Err(DecodeError::Version(2)));
        for (from, to) in [
            ("\"failures\":3", "\"failures\":-3"),
            ("\"failures\":3", "\"failures\":3.5"),
            ("\"subscriptions\":4", "\"subscriptions\":\"4\""),
            ("\"url\":\"wss://a.example\"", "\"url\":7"),
            ("\"negentropy\":false", "\"negentropy\":1"),
        ] {
            let bad = text.replace(from, to);
            assert_ne!(bad, text, "{from}");
            assert!(
                matches!(SavedState::decode(&bad), Err(DecodeError::Field(_))),
                "{to}"
            );
        }
        let odd = text.replace("\"confirmed\":\"", "\"confirmed\":\"0");
        assert_eq!(
            SavedState::decode(&odd),
            Err(DecodeError::Field("confirmed"))
        );
        let nonhex = text.replace("\"confirmed\":\"0", "\"confirmed\":\"g");
        assert_eq!(
            SavedState::decode(&nonhex),
            Err(DecodeError::Field("confirmed"))
        );
    }

    fn note(keys: &nostr::prelude::Keys, text: &str) -> Event {
        use nostr::prelude::{EventBuilder, FinalizeEvent, Kind};
        EventBuilder::new(Kind::TextNote, text)
            .finalize(keys)
            .expect("signs")
    }

    #[test]
    fn refused_ids_and_the_outbox_round_trip_and_older_files_still_read() {
        let keys = nostr::prelude::Keys::generate();
        let event = note(&keys, "left over");
        let mut s = sample();
        s.refused = vec![event.id, EventId::from_byte_array([0; 32])];
        s.outbox = vec![event];
        assert_eq!(SavedState::decode(&s.encode()), Ok(s.clone()));
        // A file of a build before these fields: the same, without them.
        let mut older: serde_json::Value = serde_json::from_str(&sample().encode()).expect("json");
        let top = older.as_object_mut().expect("an object");
        top.remove("refused");
        top.remove("outbox");
        let older = older.to_string();
        assert!(
            !older.contains("refused") && !older.contains("outbox"),
            "{older}"
        );
        assert_eq!(SavedState::decode(&older), Ok(sample()));
        let bad = s.encode().replace("\"refused\":\"", "\"refused\":\"0");
        assert_eq!(SavedState::decode(&bad), Err(DecodeError::Field("refused")));
        let forged = s.encode().replace("left over", "forged");
        assert!(
            SavedState::decode(&forged).is_ok_and(|d| d.outbox[0].verify().is_err()),
            "decoded as it is; the shell verifies before offering"
        );
    }

    #[test]
    fn the_outbox_saved_is_bounded() {
        let keys = nostr::prelude::Keys::generate();
        let big = "x".repeat(64 * 1024);
        let mut s = sample();
        s.outbox = (0..40).map(|i| note(&keys, &format!("{i}{big}"))).collect();
        let text = s.encode();
        assert!(text.len() <= MAX_OUTBOX_BYTES + 4096, "{}", text.len());
        let back = SavedState::decode(&text).expect("valid");
        assert_eq!(
            back.outbox[..],
            s.outbox[..back.outbox.len()],
            "the first ones, in order"
        );
        assert!(back.outbox.len() < 40);
    }

    #[test]
    fn huge_numbers_saturate_and_lists_are_capped() {
        let text = sample()
            .encode()
            .replace("\"failures\":3", "\"failures\":18446744073709551615");
        assert_eq!(
            SavedState::decode(&text).map(|s| s.relays[0].failures),
            Ok(u32::MAX)
        );
        let mut many = sample();
        let relay = many.relays[0].clone();
        many.relays = vec![relay; MAX_RELAYS + 5];
        many.relays[0].confirmed = vec![7; MAX_CONFIRMED + 10];
        let back = SavedState::decode(&many.encode()).expect("valid");
        assert_eq!(back.relays.len(), MAX_RELAYS);
        let hashes: usize = back.relays.iter().map(|r| r.confirmed.len()).sum();
        assert_eq!(hashes, MAX_CONFIRMED);
    }
}
