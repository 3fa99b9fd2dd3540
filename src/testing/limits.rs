//! Limits the test relays can enforce the way relays in the wild do, shared
//! by [`TestRelay`] and [`RelayFarm`] so both behave alike:
//!
//! - **Value caps** ([`ValueCaps`]): fiatjaf/eventstore's SQL backends
//!   (sqlite3, postgresql, mysql), under most khatru relays and so most
//!   GRASP servers, refuse a filter with more than 500 `ids`, 500
//!   `authors`, 10 `kinds` or (before April 2025, and on every relay
//!   deployed since with the old default) 10 tag values, counting the
//!   values of all its tags together; newer defaults allow 100 tag values.
//!   The error is the backend's bare text, checked in this order: `too many
//!   ids`, `too many authors`, `too many kinds`, `too many tag values`.
//! - **NIP-11** ([`nip11_document`], [`classify_http`]): an HTTP `GET` with
//!   `Accept: application/nostr+json` on the relay's own URL gets the relay
//!   information document, whose `limitation` names the caps above; a
//!   websocket upgrade (khatru checks `Upgrade` first) or any other request
//!   goes on to the websocket handshake as before.
//!
//! How the refusal reaches the client is [`ValueCapRefusal`]: khatru sends
//! a query error as a `NOTICE` and carries on (see there); a relay that
//! checks filters up front sends `CLOSED`.
//!
//! [`TestRelay`]: crate::testing::relay::TestRelay
//! [`RelayFarm`]: crate::testing::farm::RelayFarm

use nostr::prelude::Filter;
use serde_json::{Map, Value, json};

/// eventstore's SQL error for a filter with too many `ids`.
pub const TOO_MANY_IDS: &str = "too many ids";
/// eventstore's SQL error for a filter with too many `authors`.
pub const TOO_MANY_AUTHORS: &str = "too many authors";
/// eventstore's SQL error for a filter with too many `kinds`.
pub const TOO_MANY_KINDS: &str = "too many kinds";
/// eventstore's SQL error for a filter with too many tag values (all tags
/// of the filter together).
pub const TOO_MANY_TAG_VALUES: &str = "too many tag values";

/// How a relay with [`ValueCaps`] tells a client that a filter is over a cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueCapRefusal {
    /// khatru over eventstore (`handleRequest`): the store's query error is
    /// sent as `["NOTICE", "too many tag values"]` (the bare error text, no
    /// prefix, no subscription id); that filter yields no stored events,
    /// the REQ's other filters are served, `EOSE` follows as usual and the
    /// subscription stays open for live events (khatru adds the listener
    /// for every filter it did not reject). To a client that ignores the
    /// `NOTICE` this looks like an empty, complete answer.
    Notice,
    /// A relay that checks filters before querying (khatru's `RejectFilter`
    /// hook, which words it through `NormalizeOKMessage`): `["CLOSED", sub,
    /// "blocked: too many tag values"]`, nothing served, the subscription
    /// not opened.
    Closed,
}

/// Per-filter value caps, as eventstore's SQL backends enforce them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueCaps {
    /// Most `ids` in one filter (eventstore: 500).
    pub ids: usize,
    /// Most `authors` in one filter (eventstore: 500).
    pub authors: usize,
    /// Most `kinds` in one filter (eventstore: 10).
    pub kinds: usize,
    /// Most tag values in one filter, all its tags counted together
    /// (eventstore: 10 until April 2025, 100 since).
    pub tag_values: usize,
    /// How a filter over a cap is refused.
    pub refusal: ValueCapRefusal,
}

impl ValueCaps {
    /// eventstore's SQL defaults as most deployed GRASP relays run them
    /// (500 ids, 500 authors, 10 kinds, 10 tag values), refused the way
    /// khatru does: a `NOTICE`, then `EOSE`.
    pub fn eventstore() -> ValueCaps {
        ValueCaps {
            ids: 500,
            authors: 500,
            kinds: 10,
            tag_values: 10,
            refusal: ValueCapRefusal::Notice,
        }
    }

    /// The same caps with `tag_values` and `kinds` set to `n`.
    pub fn values(self, n: usize) -> ValueCaps {
        ValueCaps {
            tag_values: n,
            kinds: n,
            ..self
        }
    }

    /// The same caps, refused with `CLOSED` instead.
    pub fn closed(self) -> ValueCaps {
        ValueCaps {
            refusal: ValueCapRefusal::Closed,
            ..self
        }
    }

    /// The store's error for a filter over a cap (checked in eventstore's
    /// order), `None` if the filter is within them.
    pub fn check(&self, filter: &Filter) -> Option<&'static str> {
        let len = |set: Option<usize>| set.unwrap_or(0);
        if len(filter.ids.as_ref().map(|s| s.len())) > self.ids {
            return Some(TOO_MANY_IDS);
        }
        if len(filter.authors.as_ref().map(|s| s.len())) > self.authors {
            return Some(TOO_MANY_AUTHORS);
        }
        if len(filter.kinds.as_ref().map(|s| s.len())) > self.kinds {
            return Some(TOO_MANY_KINDS);
        }
        let tag_values: usize = filter.generic_tags.values().map(|v| v.len()).sum();
        (tag_values > self.tag_values).then_some(TOO_MANY_TAG_VALUES)
    }

    /// The `CLOSED` reason for [`ValueCapRefusal::Closed`].
    pub fn closed_reason(error: &str) -> String {
        format!("blocked: {error}")
    }
}

/// What a relay publishes in its NIP-11 `limitation`; `None` fields are left
/// out of the document.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limitation {
    /// `max_limit`: stored events returned per filter at most.
    pub max_limit: Option<usize>,
    /// `max_subscriptions`: open subscriptions per connection.
    pub max_subscriptions: Option<usize>,
    /// `max_filters`: filters per `REQ`.
    pub max_filters: Option<usize>,
    /// `max_message_length`: bytes per client message.
    pub max_message_length: Option<usize>,
}

/// The NIP-11 relay information document of a test relay.
pub fn nip11_document(limitation: &Limitation) -> String {
    let mut limits = Map::new();
    let fields = [
        ("max_limit", limitation.max_limit),
        ("max_subscriptions", limitation.max_subscriptions),
        ("max_filters", limitation.max_filters),
        ("max_message_length", limitation.max_message_length),
    ];
    for (name, value) in fields {
        if let Some(n) = value {
            limits.insert(name.to_owned(), json!(n));
        }
    }
    limits.insert("auth_required".to_owned(), json!(false));
    json!({
        "name": "grasp-sync test relay",
        "description": "a relay of grasp_sync::testing",
        "software": "grasp-sync testing",
        "supported_nips": [1, 11],
        "limitation": Value::Object(limits),
    })
    .to_string()
}

/// The HTTP response carrying `document`.
pub fn nip11_response(document: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/nostr+json\r\n\
         Access-Control-Allow-Origin: *\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{document}",
        document.len()
    )
    .into_bytes()
}

/// Longest HTTP request head looked at; a longer one is left to the
/// websocket handshake (which refuses it).
pub const MAX_HEAD: usize = 8 * 1024;

/// What the first bytes of a connection ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpHead {
    /// The request head is not complete yet.
    Incomplete,
    /// A NIP-11 request (`GET` with `Accept: application/nostr+json` and
    /// no `Upgrade: websocket`) whose head is this many bytes.
    Nip11(usize),
    /// Anything else: a websocket upgrade, a plain `GET`, garbage.
    Other,
}

/// Reads the start of a connection's bytes.
pub fn classify_http(bytes: &[u8]) -> HttpHead {
    let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if bytes.len() >= MAX_HEAD
            || (!bytes.is_empty() && !b"GET ".starts_with(&bytes[..bytes.len().min(4)]))
        {
            HttpHead::Other
        } else {
            HttpHead::Incomplete
        };
    };
    let Ok(head) = std::str::from_utf8(&bytes[..end]) else {
        return HttpHead::Other;
    };
    let mut lines = head.split("\r\n");
    if !lines.next().is_some_and(|l| l.starts_with("GET ")) {
        return HttpHead::Other;
    }
    let (mut upgrade, mut nostr_json) = (false, false);
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim().to_ascii_lowercase();
        match name.trim().to_ascii_lowercase().as_str() {
            "upgrade" => upgrade |= value.contains("websocket"),
            "accept" => nostr_json |= value.contains("application/nostr+json"),
            _ => {}
        }
    }
    if nostr_json && !upgrade {
        HttpHead::Nip11(end + 4)
    } else {
        HttpHead::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{Kind, SingleLetterTag};

    #[test]
    fn eventstore_caps_in_its_order() {
        let caps = ValueCaps::eventstore();
        let e = SingleLetterTag::from_char('e').unwrap();
        let a = SingleLetterTag::from_char('a').unwrap();
        let values = |n: usize| (0..n).map(|i| format!("{i:064x}")).collect::<Vec<_>>();
        assert_eq!(caps.check(&Filter::new().custom_tags(e, values(10))), None);
        let eleven = Filter::new()
            .custom_tags(e, values(6))
            .custom_tags(a, values(5));
        assert_eq!(caps.check(&eleven), Some(TOO_MANY_TAG_VALUES));
        let kinds = Filter::new().kinds((0..11).map(Kind::from_u16));
        assert_eq!(caps.check(&kinds), Some(TOO_MANY_KINDS));
        assert_eq!(caps.values(20).check(&kinds), None);
        let both = kinds.custom_tags(e, values(11));
        assert_eq!(caps.check(&both), Some(TOO_MANY_KINDS), "kinds first");
    }

    #[test]
    fn nip11_requests_are_told_apart_from_upgrades() {
        let get = |headers: &str| format!("GET / HTTP/1.1\r\nHost: x\r\n{headers}\r\n");
        let nip11 = get("Accept: application/nostr+json\r\n");
        assert_eq!(
            classify_http(nip11.as_bytes()),
            HttpHead::Nip11(nip11.len())
        );
        assert_eq!(
            classify_http(get("accept: Application/Nostr+JSON, */*\r\n").as_bytes()),
            HttpHead::Nip11(get("accept: Application/Nostr+JSON, */*\r\n").len())
        );
        assert_eq!(classify_http(get("").as_bytes()), HttpHead::Other);
        let upgrade = get("Accept: application/nostr+json\r\nUpgrade: websocket\r\n");
        assert_eq!(classify_http(upgrade.as_bytes()), HttpHead::Other);
        assert_eq!(classify_http(b"GET / HT"), HttpHead::Incomplete);
        assert_eq!(classify_http(b"GE"), HttpHead::Incomplete);
        assert_eq!(classify_http(b""), HttpHead::Incomplete);
        assert_eq!(classify_http(b"\x16\x03\x01"), HttpHead::Other);
        let doc = nip11_document(&Limitation {
            max_limit: Some(100),
            ..Limitation::default()
        });
        let v: Value = serde_json::from_str(&doc).unwrap();
        assert_eq!(v["limitation"]["max_limit"], 100);
        assert!(v["limitation"].get("max_subscriptions").is_none());
    }
}
