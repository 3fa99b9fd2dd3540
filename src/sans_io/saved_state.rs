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
//! The file is input like any relay's: `decode` checks every field's type
//! and shape and rejects the whole file on any doubt (the caller starts
//! fresh), and the engine clamps every value it takes from it. Decoding is
//! bounded: at most [`MAX_RELAYS`] relays and [`MAX_CONFIRMED`] hashes
//! are kept, whatever the file holds.

use std::fmt;

use serde_json::{Map, Value, json};

/// The format version written; a file of another version is set aside.
pub(crate) const VERSION: u64 = 1;
/// Relays saved and restored at most (most recently useful first).
pub(crate) const MAX_RELAYS: usize = 2_000;
/// Confirmed-item hashes saved and restored at most, over all relays.
/// 16 bytes each in the file: 1.6 MB at most; with [`MAX_RELAYS`]
/// records of about 500 bytes the file stays under about 2.5 MiB.
pub(crate) const MAX_CONFIRMED: usize = 100_000;

/// The engine's state worth keeping across a restart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedState {
    /// When it was saved (Unix seconds).
    pub saved_at: u64,
    /// Relays, most recently useful first.
    pub relays: Vec<SavedRelay>,
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
    /// Live coverage was unbroken up to here.
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
    /// coordinate or a root's hex id).
    pub confirmed: Vec<u64>,
}

/// Limits a relay taught us (each only ever lowers ours on restore).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SavedLimits {
    /// Concurrent subscriptions.
    pub subscriptions: Option<u64>,
    /// Filters per REQ.
    pub filters: Option<u64>,
    /// Bytes per REQ message.
    pub message_bytes: Option<u64>,
    /// `limit` asked per filter.
    pub page_limit: Option<u64>,
    /// Tag values per filter.
    pub tag_values: Option<u64>,
    /// Kinds per filter.
    pub kinds: Option<u64>,
    /// Proven per-filter result cap.
    pub result_cap: Option<u64>,
    /// Most events one filter ever got.
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
        let relays: Vec<Value> = self.relays.iter().map(encode_relay).collect();
        json!({ "version": VERSION, "saved_at": self.saved_at, "relays": relays }).to_string()
    }

    /// Parses the JSON form, keeping at most 2,000 relays and 100,000
    /// hashes. Any doubt is an error: a file that is
    /// half right is not worth the risk of trusting the other half.
    pub fn decode(text: &str) -> Result<SavedState, DecodeError> {
        let root: Value =
            serde_json::from_str(text).map_err(|e| DecodeError::Json(e.to_string()))?;
        let root = root.as_object().ok_or(DecodeError::Field("(top level)"))?;
        let version = root
            .get("version")
            .and_then(Value::as_u64)
            .ok_or(DecodeError::Field("version"))?;
        if version != VERSION {
            return Err(DecodeError::Version(version));
        }
        let saved_at = req_u64(root, "saved_at")?;
        let list = root
            .get("relays")
            .and_then(Value::as_array)
            .ok_or(DecodeError::Field("relays"))?;
        let mut budget = MAX_CONFIRMED;
        let relays = list
            .iter()
            .take(MAX_RELAYS)
            .map(|r| decode_relay(r, &mut budget))
            .collect::<Result<_, _>>()?;
        Ok(SavedState { saved_at, relays })
    }
}

fn encode_relay(r: &SavedRelay) -> Value {
    let l = &r.limits;
    let confirmed: String = r.confirmed.iter().map(|h| format!("{h:016x}")).collect();
    json!({
        "url": r.url,
        "last_connected": r.last_connected,
        "disconnected": r.disconnected,
        "covered_until": r.covered_until,
        "layer1_unread": r.layer1_unread,
        "next_full_sync": r.next_full_sync,
        "failures": r.failures,
        "refusals": r.refusals,
        "failing_since": r.failing_since,
        "rate_limited_until": r.rate_limited_until,
        "retry_at": r.retry_at,
        "penalties": r.penalties,
        "limits": {
            "subscriptions": l.subscriptions,
            "filters": l.filters,
            "message_bytes": l.message_bytes,
            "page_limit": l.page_limit,
            "tag_values": l.tag_values,
            "kinds": l.kinds,
            "result_cap": l.result_cap,
            "result_floor": l.result_floor,
        },
        "negentropy": r.negentropy,
        "confirmed": confirmed,
    })
}

fn decode_relay(value: &Value, budget: &mut usize) -> Result<SavedRelay, DecodeError> {
    let r = value.as_object().ok_or(DecodeError::Field("relays[]"))?;
    let l = r
        .get("limits")
        .and_then(Value::as_object)
        .ok_or(DecodeError::Field("limits"))?;
    let limits = SavedLimits {
        subscriptions: opt_u64(l, "subscriptions")?,
        filters: opt_u64(l, "filters")?,
        message_bytes: opt_u64(l, "message_bytes")?,
        page_limit: opt_u64(l, "page_limit")?,
        tag_values: opt_u64(l, "tag_values")?,
        kinds: opt_u64(l, "kinds")?,
        result_cap: opt_u64(l, "result_cap")?,
        result_floor: opt_u64(l, "result_floor")?,
    };
    Ok(SavedRelay {
        url: r
            .get("url")
            .and_then(Value::as_str)
            .ok_or(DecodeError::Field("url"))?
            .to_owned(),
        last_connected: opt_u64(r, "last_connected")?,
        disconnected: opt_u64(r, "disconnected")?,
        covered_until: opt_u64(r, "covered_until")?,
        layer1_unread: r
            .get("layer1_unread")
            .and_then(Value::as_bool)
            .ok_or(DecodeError::Field("layer1_unread"))?,
        next_full_sync: opt_u64(r, "next_full_sync")?,
        failures: req_u32(r, "failures")?,
        refusals: req_u32(r, "refusals")?,
        failing_since: opt_u64(r, "failing_since")?,
        rate_limited_until: opt_u64(r, "rate_limited_until")?,
        retry_at: opt_u64(r, "retry_at")?,
        penalties: req_u32(r, "penalties")?,
        limits,
        negentropy: match r.get("negentropy") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_bool().ok_or(DecodeError::Field("negentropy"))?),
        },
        confirmed: decode_hashes(r, budget)?,
    })
}

/// The confirmed hashes: one string of 16 hex digits per hash, so a large
/// set costs 16 bytes a hash and no JSON array of numbers. Takes at most
/// `budget` of them and lowers it by as many.
fn decode_hashes(r: &Map<String, Value>, budget: &mut usize) -> Result<Vec<u64>, DecodeError> {
    let text = r
        .get("confirmed")
        .and_then(Value::as_str)
        .ok_or(DecodeError::Field("confirmed"))?;
    if text.len() % 16 != 0 || !text.is_ascii() {
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

fn req_u64(m: &Map<String, Value>, name: &'static str) -> Result<u64, DecodeError> {
    m.get(name)
        .and_then(Value::as_u64)
        .ok_or(DecodeError::Field(name))
}

fn req_u32(m: &Map<String, Value>, name: &'static str) -> Result<u32, DecodeError> {
    Ok(u32::try_from(req_u64(m, name)?).unwrap_or(u32::MAX))
}

/// An optional number: absent or `null` is `None`; anything else must be
/// a non-negative integer.
fn opt_u64(m: &Map<String, Value>, name: &'static str) -> Result<Option<u64>, DecodeError> {
    match m.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or(DecodeError::Field(name)),
    }
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
