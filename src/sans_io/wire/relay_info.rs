//! What a relay says about its own limits (NIP-11 `limitation`).
//!
//! Many relays publish a relay information document at their websocket URL
//! over plain HTTP (`Accept: application/nostr+json`). Its `limitation`
//! object names the caps the relay enforces: results per filter
//! (`max_limit`), concurrent subscriptions, filters per REQ, message size.
//! Asking below them from the first REQ saves the refusals we would learn
//! them from, and asking `limit` at the relay's own cap makes a capped page
//! look full, so it is never mistaken for the end of history.
//!
//! The document is relay input like any other: parsed leniently (one bad
//! field does not discard the rest), every number clamped to a sane range,
//! and used only to *lower* what we ask. A relay that lies gets what it
//! asked for: smaller pages, or refusals we learn from as before.

use serde_json::Value;

/// Limits a relay published, each `None` when absent or nonsense.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayInfo {
    /// `max_limit`: events the relay returns per filter at most.
    pub max_limit: Option<usize>,
    /// `max_subscriptions`: concurrent subscriptions per connection.
    pub max_subscriptions: Option<usize>,
    /// `max_filters`: filters per REQ; where the document states none,
    /// what its `software` is known to take (strfry 200; khatru and
    /// nostr-rs-relay any number).
    pub max_filters: Option<usize>,
    /// `max_message_length`: bytes per message the relay reads.
    pub max_message_length: Option<usize>,
    /// The longest tag value the relay takes in a filter. NIP-11 has no
    /// field for it; it is known from `software` for relays that refuse a
    /// whole REQ over one value: strfry, 255 bytes.
    pub max_value_bytes: Option<usize>,
}

/// strfry's longest filter tag value (its `filter item too large`).
const STRFRY_VALUE_BYTES: usize = 255;

/// Filters per REQ the relays whose NIP-11 `software` names them are
/// known to take, from their sources: strfry refuses past
/// `relay.maxReqFilterSize` (200); khatru and nostr-rs-relay check no
/// count (`NO_FILTER_LIMIT`). Neither states it, and a relay we know
/// nothing of gets 20 (`Limits`), so this is what lets a long history on
/// them be read many windows to a REQ.
fn known_filters(software: &str) -> Option<usize> {
    let software = software.to_ascii_lowercase();
    if software.contains("strfry") {
        Some(200)
    } else if software.contains("khatru") || software.contains("nostr-rs-relay") {
        Some(NO_FILTER_LIMIT)
    } else {
        None
    }
}

/// "No limit" on filters per REQ, as [`known_filters`] reports it.
pub(crate) const NO_FILTER_LIMIT: usize = UNLIMITED as usize;

/// The largest document we read; real ones are a few KiB.
pub(crate) const MAX_DOCUMENT_BYTES: usize = 64 * 1024;

/// Numbers above this are taken as "no limit" (some relays write huge
/// sentinels) rather than as a limit.
const UNLIMITED: u64 = 1 << 30;

impl RelayInfo {
    /// Reads the `limitation` object of a NIP-11 document; `None` if the
    /// text is not a JSON object. Fields that are missing, not positive
    /// integers, or absurdly large are left `None`.
    pub fn parse(json: &str) -> Option<RelayInfo> {
        if json.len() > MAX_DOCUMENT_BYTES {
            return None;
        }
        let doc: Value = serde_json::from_str(json).ok()?;
        let doc = doc.as_object()?;
        let software = doc.get("software").and_then(Value::as_str).unwrap_or("");
        let strfry = software.to_ascii_lowercase().contains("strfry");
        let max_value_bytes = strfry.then_some(STRFRY_VALUE_BYTES);
        let known_filters = known_filters(software);
        let Some(limitation) = doc.get("limitation").and_then(Value::as_object) else {
            return Some(RelayInfo {
                max_value_bytes,
                max_filters: known_filters,
                ..RelayInfo::default()
            });
        };
        let field = |name: &str| {
            let n = limitation.get(name)?.as_u64()?;
            (n > 0 && n < UNLIMITED).then_some(n as usize)
        };
        Some(RelayInfo {
            max_limit: field("max_limit"),
            max_subscriptions: field("max_subscriptions"),
            max_filters: field("max_filters").or(known_filters),
            max_message_length: field("max_message_length"),
            max_value_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_limitation_and_ignores_the_rest() {
        let doc = r#"{"name":"x","pubkey":"not a key","limitation":{"max_limit":100,
            "max_subscriptions":20,"max_filters":10,"max_message_length":131072,
            "auth_required":false}}"#;
        assert_eq!(
            RelayInfo::parse(doc),
            Some(RelayInfo {
                max_limit: Some(100),
                max_subscriptions: Some(20),
                max_filters: Some(10),
                max_message_length: Some(131_072),
                max_value_bytes: None,
            })
        );
    }

    #[test]
    fn strfry_is_known_by_its_software() {
        let doc = r#"{"software":"git+https://github.com/hoytech/strfry.git",
            "limitation":{"max_limit":500}}"#;
        let info = RelayInfo::parse(doc).unwrap();
        assert_eq!(info.max_value_bytes, Some(255));
        assert_eq!(info.max_limit, Some(500));
        let bare = RelayInfo::parse(r#"{"software":"strfry"}"#).unwrap();
        assert_eq!(bare.max_value_bytes, Some(255));
        assert_eq!(info.max_filters, Some(200), "maxReqFilterSize");
    }

    #[test]
    fn filters_per_req_come_from_the_document_else_from_known_software() {
        let filters = |doc: &str| RelayInfo::parse(doc).unwrap().max_filters;
        let khatru = r#"{"software":"https://github.com/fiatjaf/khatru"}"#;
        assert_eq!(filters(khatru), Some(NO_FILTER_LIMIT));
        let rs = r#"{"software":"https://git.sr.ht/~gheartsfield/nostr-rs-relay",
            "limitation":{"max_subscriptions":32}}"#;
        assert_eq!(filters(rs), Some(NO_FILTER_LIMIT));
        let stated = r#"{"software":"strfry","limitation":{"max_filters":50}}"#;
        assert_eq!(filters(stated), Some(50), "the relay's word first");
        assert_eq!(filters(r#"{"software":"ngit-grasp"}"#), None);
        assert_eq!(filters(r#"{"name":"x"}"#), None);
    }

    #[test]
    fn nonsense_fields_are_none_not_errors() {
        let doc = r#"{"limitation":{"max_limit":-1,"max_subscriptions":"ten",
            "max_filters":0,"max_message_length":99999999999999}}"#;
        assert_eq!(RelayInfo::parse(doc), Some(RelayInfo::default()));
        assert_eq!(
            RelayInfo::parse(r#"{"name":"no limits"}"#),
            Some(RelayInfo::default())
        );
        assert_eq!(RelayInfo::parse("<html>"), None);
        assert_eq!(RelayInfo::parse("[1,2]"), None);
        let huge = format!(r#"{{"x":"{}"}}"#, "a".repeat(MAX_DOCUMENT_BYTES));
        assert_eq!(RelayInfo::parse(&huge), None);
    }
}
