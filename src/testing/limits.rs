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
//! - **strfry** ([`StrfryLimits`], [`strfry_nip11_document`],
//!   [`classify_http_strfry`]): the numbers of strfry's configuration
//!   (f8a56a8 defaults) for a farm relay that answers like strfry, its
//!   NIP-11 document (served only for `Accept: application/nostr+json`
//!   exactly) and the landing page it serves any other plain `GET`.
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

/// khatru's `EventIPRateLimiter(tokens_per_interval, interval,
/// max_tokens)`, as ngit-relay runs it (3, 3 min, 15): a bucket per client
/// address that holds `max_tokens`, gains `tokens_per_interval` every
/// `interval`, and is charged for every `EVENT`, duplicates included (khatru
/// runs its reject policies before the duplicate check). An `EVENT` with no
/// token left is refused with [`RATE_LIMITED`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EventBucket {
    /// Tokens added each `interval`.
    pub tokens_per_interval: u32,
    /// How often tokens are added.
    pub interval: std::time::Duration,
    /// Tokens the bucket holds at most (and at first).
    pub max_tokens: u32,
}

/// khatru's refusal of an `EVENT` over its rate limiter.
pub const RATE_LIMITED: &str = "rate-limited: slow down, please";

impl EventBucket {
    /// ngit-relay's limiter: 15 at once, then 3 every three minutes.
    pub fn ngit_relay() -> EventBucket {
        EventBucket {
            tokens_per_interval: 3,
            interval: std::time::Duration::from_secs(180),
            max_tokens: 15,
        }
    }

    /// Tokens per second it adds.
    pub fn rate(&self) -> f64 {
        f64::from(self.tokens_per_interval) / self.interval.as_secs_f64()
    }
}

/// An [`EventBucket`]'s tokens, refilled continuously with the time that
/// passes between takes: the test relay's model on the wall clock, and
/// the outbox's and pacer's tests' on simulated time.
#[derive(Debug, Clone, Copy)]
pub struct BucketLevel {
    tokens: f64,
}

impl BucketLevel {
    /// A full bucket.
    pub fn full(bucket: &EventBucket) -> Self {
        BucketLevel {
            tokens: f64::from(bucket.max_tokens),
        }
    }

    /// Takes a token, `elapsed` after the last take, if there is one.
    pub fn take(&mut self, bucket: &EventBucket, elapsed: std::time::Duration) -> bool {
        let refill = elapsed.as_secs_f64() * bucket.rate();
        self.tokens = (self.tokens + refill).min(f64::from(bucket.max_tokens));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
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

/// The parts of a complete `GET` head the test relays look at.
struct GetHead<'a> {
    /// Bytes of the head, the blank line included.
    len: usize,
    /// An `Upgrade` header names `websocket`.
    upgrade: bool,
    /// The values of its `Accept` headers, trimmed, in order.
    accepts: Vec<&'a str>,
}

/// What the start of a connection's bytes is, as far as it goes.
enum Head<'a> {
    /// No blank line yet, and what came may still be a `GET` head.
    Incomplete,
    /// Not a `GET` head (or one too long to look at).
    NotGet,
    Get(GetHead<'a>),
}

/// Splits the start of a connection's bytes into what [`classify_http`]
/// and [`classify_http_strfry`] decide on.
fn read_head(bytes: &[u8]) -> Head<'_> {
    let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if bytes.len() >= MAX_HEAD
            || (!bytes.is_empty() && !b"GET ".starts_with(&bytes[..bytes.len().min(4)]))
        {
            Head::NotGet
        } else {
            Head::Incomplete
        };
    };
    let Ok(head) = std::str::from_utf8(&bytes[..end]) else {
        return Head::NotGet;
    };
    let mut lines = head.split("\r\n");
    if !lines.next().is_some_and(|l| l.starts_with("GET ")) {
        return Head::NotGet;
    }
    let mut get = GetHead {
        len: end + 4,
        upgrade: false,
        accepts: Vec::new(),
    };
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        match name.trim().to_ascii_lowercase().as_str() {
            "upgrade" => get.upgrade |= value.to_ascii_lowercase().contains("websocket"),
            "accept" => get.accepts.push(value.trim()),
            _ => {}
        }
    }
    Head::Get(get)
}

/// Reads the start of a connection's bytes the way khatru routes them: a
/// `GET` whose `Accept` mentions `application/nostr+json` (in any case,
/// among other types) and that is no websocket upgrade is a NIP-11
/// request.
pub fn classify_http(bytes: &[u8]) -> HttpHead {
    let get = match read_head(bytes) {
        Head::Incomplete => return HttpHead::Incomplete,
        Head::NotGet => return HttpHead::Other,
        Head::Get(get) => get,
    };
    let nostr_json = get
        .accepts
        .iter()
        .any(|a| a.to_ascii_lowercase().contains("application/nostr+json"));
    if nostr_json && !get.upgrade {
        HttpHead::Nip11(get.len)
    } else {
        HttpHead::Other
    }
}

// ---------------------------------------------------------------- strfry

/// strfry's limits, named after its configuration keys, for a farm relay
/// that answers like strfry (see `RelayProfile::strfry`). The
/// [`Default`] is strfry's own defaults at f8a56a8 (`golpe.yaml`,
/// `src/apps/relay/golpe.yaml`); tests lower a number to reach a limit
/// cheaply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrfryLimits {
    /// `relay.maxFilterLimit` (500): a filter's `limit` (or its absence) is
    /// clamped to this, silently; also NIP-11 `max_limit`.
    pub max_limit: usize,
    /// `relay.maxReqFilterSize` (200): more filters in one `REQ` are
    /// refused with `CLOSED "ERROR: bad req: arr too big"`.
    pub max_filters: usize,
    /// `relay.maxTagsPerFilter` (3): more tag letters in one filter are
    /// refused with `CLOSED "ERROR: bad req: too many tags in filter"`.
    pub max_tags_per_filter: usize,
    /// `relay.maxSubsPerConnection` (200): the most REQs still scanning, the
    /// most live REQs and the most NIP-77 sessions of one connection, each
    /// counted on its own; also NIP-11 `max_subscriptions`.
    pub max_subscriptions: usize,
    /// `relay.maxWebsocketPayloadSize` (131,072): a larger frame or message
    /// drops the connection; also NIP-11 `max_message_length`.
    pub max_message_length: usize,
    /// `events.maxEventSize` (65,536): a larger event (as JSON) gets `OK
    /// false "invalid: event too large: N"`.
    pub max_event_bytes: usize,
    /// `events.maxNumTags` (2,000): more tags get `OK false "invalid: too
    /// many tags: N"`.
    pub max_event_tags: usize,
    /// `events.maxTagValSize` (1,024): a longer single-letter tag value gets
    /// `OK false "invalid: tag val too large: N"`. Values over 255 bytes
    /// (and up to this) are stored but not indexed, so no filter finds an
    /// event by them.
    pub max_tag_value_bytes: usize,
    /// `events.rejectEventsOlderThanSeconds` (3 years): older events get `OK
    /// false "invalid: created_at too early"`.
    pub reject_older_than_secs: u64,
    /// `events.rejectEphemeralEventsOlderThanSeconds` (60): older ephemeral
    /// events get `OK false "invalid: ephemeral event expired"`.
    pub reject_ephemeral_older_than_secs: u64,
    /// `events.rejectEventsNewerThanSeconds` (900): events further ahead get
    /// `OK false "invalid: created_at too late"`.
    pub reject_newer_than_secs: u64,
    /// `relay.negentropy.maxSyncEvents` (1,000,000): a `NEG-OPEN` whose
    /// filter matches more gets `["NEG-ERR", sub, "blocked: too many query
    /// results", max]`.
    pub max_sync_events: usize,
}

impl Default for StrfryLimits {
    fn default() -> StrfryLimits {
        StrfryLimits {
            max_limit: 500,
            max_filters: 200,
            max_tags_per_filter: 3,
            max_subscriptions: 200,
            max_message_length: 131_072,
            max_event_bytes: 65_536,
            max_event_tags: 2_000,
            max_tag_value_bytes: 1_024,
            reject_older_than_secs: 94_608_000,
            reject_ephemeral_older_than_secs: 60,
            reject_newer_than_secs: 900,
            max_sync_events: 1_000_000,
        }
    }
}

/// strfry's `MAX_INDEXED_TAG_VAL_SIZE`: a filter's tag value (other than
/// `#e`/`#p`) may be this long at most; longer event tag values are stored
/// unindexed. A constant in strfry, not configuration.
pub const STRFRY_MAX_INDEXED_TAG_VALUE: usize = 255;

/// strfry's `MAX_SUBID_SIZE`: the longest subscription id it takes.
pub const STRFRY_MAX_SUB_ID: usize = 64;

/// The frame limit of strfry's negentropy responder (`Negentropy ne(storage,
/// 500'000)`), in bytes before hex.
pub const STRFRY_NEG_FRAME_LIMIT: u64 = 500_000;

/// NIP-11 `software` of strfry.
pub const STRFRY_SOFTWARE: &str = "git+https://github.com/hoytech/strfry.git";

/// NIP-11 `version` of strfry at f8a56a8 (`git describe --tags`).
pub const STRFRY_VERSION: &str = "1.1.1-144-gf8a56a8";

/// The `NOTICE` strfry sends when a connection has as many REQs scanning,
/// or as many live, as it allows (naming no subscription).
pub const STRFRY_TOO_MANY_REQS: &str = "ERROR: too many concurrent REQs";

/// The `NOTICE` strfry sends when a connection has as many NIP-77 sessions
/// as it allows (naming no subscription).
pub const STRFRY_TOO_MANY_NEGS: &str = "ERROR: too many concurrent NEG requests";

/// strfry's NIP-11 document with its default `name` and `description`,
/// `limitation` from `limits`, and NIP-77 in `supported_nips` when it
/// answers it (`negentropy: 1` is there either way, as strfry writes it).
/// Keys are sorted, as strfry's JSON library writes them.
pub fn strfry_nip11_document(limits: &StrfryLimits, negentropy: bool) -> String {
    // NIP-45 is listed: strfry answers COUNT by default (the farm does not).
    let mut nips = vec![1, 2, 4, 9, 11, 28, 40, 45, 59, 70];
    if negentropy {
        nips.push(77);
    }
    json!({
        "description": "This is a strfry instance.",
        "limitation": {
            "max_limit": limits.max_limit,
            "max_message_length": limits.max_message_length,
            "max_subscriptions": limits.max_subscriptions,
        },
        "name": "strfry default",
        "negentropy": 1,
        "software": STRFRY_SOFTWARE,
        "supported_nips": nips,
        "version": STRFRY_VERSION,
    })
    .to_string()
}

/// An HTTP response with strfry's headers (`preGenerateHttpResponse`: it
/// says `keep-alive`; the farm closes after it all the same, which a
/// client reading `Content-Length` cannot tell).
fn strfry_http_response(content_type: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nAccess-Control-Allow-Origin: *\r\n\
         Connection: keep-alive\r\nServer: strfry\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// strfry's answer to a NIP-11 request: `document` as `application/json`
/// (not `application/nostr+json`).
pub fn strfry_nip11_response(document: &str) -> Vec<u8> {
    strfry_http_response("application/json", document)
}

/// strfry's answer to any other plain `GET`: an HTML landing page (a short
/// stand-in for its template), `200 OK` all the same.
pub fn strfry_landing_response() -> Vec<u8> {
    strfry_http_response(
        "text/html",
        "<!DOCTYPE html><html><head><title>strfry</title></head>\
         <body><h1>strfry default</h1><p>This is a strfry instance.</p></body></html>",
    )
}

/// What the first bytes of a connection ask a strfry relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrfryHead {
    /// The request head is not complete yet.
    Incomplete,
    /// A websocket upgrade, or no `GET` at all: on to the handshake.
    Websocket,
    /// A NIP-11 request whose head is this many bytes.
    Nip11(usize),
    /// Any other plain `GET` (head this many bytes): the landing page.
    Landing(usize),
}

/// Reads the start of a connection's bytes the way strfry (uWebSockets)
/// routes them: an upgrade goes to the websocket; a plain `GET` whose
/// first `Accept` header is exactly `application/nostr+json` gets the
/// NIP-11 document (`req.getHeader("accept") == "application/nostr+json"`:
/// no other types, no parameters, that case); any other `GET` the landing
/// page.
pub fn classify_http_strfry(bytes: &[u8]) -> StrfryHead {
    match read_head(bytes) {
        Head::Incomplete => StrfryHead::Incomplete,
        Head::NotGet => StrfryHead::Websocket,
        Head::Get(get) if get.upgrade => StrfryHead::Websocket,
        Head::Get(get) if get.accepts.first() == Some(&"application/nostr+json") => {
            StrfryHead::Nip11(get.len)
        }
        Head::Get(get) => StrfryHead::Landing(get.len),
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

    #[test]
    fn strfry_serves_nip11_for_the_exact_accept_only() {
        let get = |headers: &str| format!("GET / HTTP/1.1\r\nHost: x\r\n{headers}\r\n");
        let exact = get("Accept: application/nostr+json\r\n");
        assert_eq!(
            classify_http_strfry(exact.as_bytes()),
            StrfryHead::Nip11(exact.len())
        );
        for other in [
            "Accept: application/nostr+json, */*\r\n",
            "Accept: Application/Nostr+JSON\r\n",
            "Accept: text/html\r\nAccept: application/nostr+json\r\n",
            "",
        ] {
            let head = get(other);
            assert_eq!(
                classify_http_strfry(head.as_bytes()),
                StrfryHead::Landing(head.len()),
                "{other}"
            );
        }
        let upgrade = get("Accept: application/nostr+json\r\nUpgrade: websocket\r\n");
        assert_eq!(
            classify_http_strfry(upgrade.as_bytes()),
            StrfryHead::Websocket
        );
        assert_eq!(classify_http_strfry(b"GET / HT"), StrfryHead::Incomplete);
        assert_eq!(classify_http_strfry(b"\x16\x03\x01"), StrfryHead::Websocket);
    }

    #[test]
    fn strfry_document_has_its_limitation_and_software() {
        let doc = strfry_nip11_document(&StrfryLimits::default(), true);
        let v: Value = serde_json::from_str(&doc).unwrap();
        let limitation = json!({
            "max_limit": 500,
            "max_message_length": 131_072,
            "max_subscriptions": 200,
        });
        assert_eq!(v["limitation"], limitation);
        assert_eq!(v["negentropy"], 1);
        assert_eq!(v["software"], STRFRY_SOFTWARE);
        assert!(v["supported_nips"].as_array().unwrap().contains(&json!(77)));
        let off: Value =
            serde_json::from_str(&strfry_nip11_document(&StrfryLimits::default(), false)).unwrap();
        assert!(
            !off["supported_nips"]
                .as_array()
                .unwrap()
                .contains(&json!(77))
        );
        let response = String::from_utf8(strfry_nip11_response(&doc)).unwrap();
        assert!(response.contains("\r\nContent-Type: application/json\r\n"));
        assert!(response.ends_with(&doc));
    }
}
