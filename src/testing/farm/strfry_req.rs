//! How strfry (f8a56a8) reads a client message before it acts on it: the
//! command array (`RelayIngester.cpp`), a `REQ`'s shape
//! (`ingesterProcessReq`), each filter (`NostrFilter` in `filters.h`),
//! subscription ids (`SubId` in `Subscription.h`) and hex (hoytech's
//! `from_hex`). Every refusal is the text strfry throws, so the farm's
//! strfry relay can send it with strfry's prefixes (see `strfry`).
//!
//! This works on the raw JSON, not on nostr's `Filter`: strfry refuses
//! things nostr's parser takes or drops silently (empty arrays, unknown
//! keys, odd-length hex, tag values of any size), and the first refusal
//! depends on strfry's order: filters in turn, each filter's keys in byte
//! order (its JSON objects are sorted maps), the tag-letter count last.
//!
//! Pure functions, no IO.

use serde_json::Value;

use super::super::limits::{STRFRY_MAX_INDEXED_TAG_VALUE, STRFRY_MAX_SUB_ID};

/// Largest total of one filter set's distinct values, in bytes after hex
/// decoding (strfry stores offsets as 16 bits).
const MAX_SET_BYTES: usize = 65_535;

/// The elements of a client message strfry goes on to act on; `Ok(None)`
/// for a lone newline (strfry ignores it, for people typing into
/// websocat); `Err` with strfry's text otherwise (sent as `NOTICE "ERROR:
/// bad msg: ..."`). A JSON syntax error is worded by serde_json, not by
/// strfry's parser: the farm cannot reproduce that text.
pub(super) fn command(text: &str) -> Result<Option<Vec<Value>>, String> {
    if !text.starts_with('[') {
        return if text == "\n" {
            Ok(None)
        } else {
            Err("unparseable message".to_owned())
        };
    }
    let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let Value::Array(elements) = value else {
        return Err("message is not an array".to_owned());
    };
    if elements.len() < 2 {
        return Err("too few array elements".to_owned());
    }
    if !elements[0].is_string() {
        return Err("first element not a command like REQ".to_owned());
    }
    Ok(Some(elements))
}

/// A `REQ` strfry refuses: the reason (after `bad req: `) and the
/// subscription to name in `CLOSED`, if strfry had read one (otherwise it
/// sends a `NOTICE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Refusal {
    pub(super) sub: Option<String>,
    pub(super) reason: String,
}

/// A `REQ` strfry takes: its subscription id (not yet checked, see
/// [`check_sub_id`]) and, per filter, whether it can match at all (a
/// filter with an empty `ids`, `authors`, `kinds` or tag array never does,
/// and strfry drops it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ReqShape {
    pub(super) sub: String,
    pub(super) matches: Vec<bool>,
}

/// Checks a `REQ`'s elements (`["REQ", sub, filter...]`) in strfry's order:
/// at least one filter, a string id, at most `max_filters` filters, then
/// each filter ([`check_filter`]); the first failure refuses the whole
/// `REQ`.
pub(super) fn check_req(
    elements: &[Value],
    max_filters: usize,
    max_tags: usize,
) -> Result<ReqShape, Refusal> {
    let refuse = |sub: Option<&str>, reason: String| Refusal {
        sub: sub.map(str::to_owned),
        reason,
    };
    if elements.len() < 3 {
        return Err(refuse(None, "arr too small".to_owned()));
    }
    let Some(sub) = elements[1].as_str() else {
        return Err(refuse(None, "subscription id was not a string".to_owned()));
    };
    if elements.len() - 2 > max_filters {
        return Err(refuse(Some(sub), "arr too big".to_owned()));
    }
    let matches = elements[2..]
        .iter()
        .map(|f| check_filter(f, max_tags))
        .collect::<Result<Vec<bool>, String>>()
        .map_err(|reason| refuse(Some(sub), reason))?;
    Ok(ReqShape {
        sub: sub.to_owned(),
        matches,
    })
}

/// Checks one filter as strfry's `NostrFilter` parses it: true if it can
/// match, false if an empty array makes it match nothing, or strfry's
/// error.
pub(super) fn check_filter(filter: &Value, max_tags: usize) -> Result<bool, String> {
    let Value::Object(fields) = filter else {
        return Err("provided filter is not an object".to_owned());
    };
    let mut fields: Vec<(&String, &Value)> = fields.iter().collect();
    fields.sort_by(|a, b| a.0.cmp(b.0));
    let (mut matches, mut tags) = (true, 0);
    for (key, value) in fields {
        match key.as_str() {
            "since" | "until" | "limit" => {
                if value.as_u64().is_none() {
                    return Err(format!("error parsing {key}"));
                }
                continue;
            }
            "ids" | "authors" | "kinds" => {}
            k if k.starts_with('#') => {}
            _ => return Err(format!("unrecognised filter item: {key}")),
        }
        let Value::Array(items) = value else {
            return Err(format!("{key} not an array"));
        };
        if items.is_empty() {
            matches = false;
            continue;
        }
        check_set(key, items).map_err(|e| format!("error parsing {key}: {e}"))?;
        tags += usize::from(key.starts_with('#'));
    }
    if tags > max_tags {
        return Err("too many tags in filter".to_owned());
    }
    Ok(matches)
}

/// Checks a non-empty value set of filter field `key`: `kinds` are
/// unsigned integers; `ids`, `authors`, `#e` and `#p` are 32 bytes of hex;
/// other single-letter tags are strings of at most 255 bytes; a longer tag
/// key is "unindexed".
fn check_set(key: &str, items: &[Value]) -> Result<(), String> {
    if key == "kinds" {
        return match items.iter().all(|k| k.as_u64().is_some()) {
            true => Ok(()),
            // tao::json's type error: its wording is not reproduced.
            false => Err("kind is not an unsigned integer".to_owned()),
        };
    }
    let hex = match key {
        "ids" | "authors" | "#e" | "#p" => true,
        k if k.len() == 2 => false,
        _ => return Err("unindexed tag filter".to_owned()),
    };
    let mut values = Vec::with_capacity(items.len());
    for item in items {
        let Some(text) = item.as_str() else {
            // tao::json's type error: its wording is not reproduced.
            return Err("filter item is not a string".to_owned());
        };
        let value = if hex {
            from_hex(text, false)?
        } else {
            text.as_bytes().to_vec()
        };
        let (min, max) = if hex {
            (32, 32)
        } else {
            (0, STRFRY_MAX_INDEXED_TAG_VALUE)
        };
        if value.len() < min {
            return Err("filter item too small".to_owned());
        }
        if value.len() > max {
            return Err("filter item too large".to_owned());
        }
        values.push(value);
    }
    values.sort_unstable();
    values.dedup();
    if values.iter().map(Vec::len).sum::<usize>() > MAX_SET_BYTES {
        return Err("total filter items too large".to_owned());
    }
    Ok(())
}

/// strfry's `SubId`: 1 to 64 bytes, no control characters, `\`, `"` or
/// non-ASCII.
pub(super) fn check_sub_id(sub: &str) -> Result<(), &'static str> {
    if sub.is_empty() || sub.len() > STRFRY_MAX_SUB_ID {
        return Err("invalid subscription id length");
    }
    let bad = |b: &u8| *b < 0x20 || *b == b'\\' || *b == b'"' || *b >= 0x7f;
    if sub.as_bytes().iter().any(bad) {
        return Err("invalid character in subscription id");
    }
    Ok(())
}

/// hoytech's `from_hex`: an optional `0x` prefix is dropped; an odd number
/// of digits is refused, or (`allow_uneven`, as for negentropy payloads)
/// padded with a leading `0`; any other character is refused by its code.
pub(super) fn from_hex(text: &str, allow_uneven: bool) -> Result<Vec<u8>, String> {
    let digits = text.strip_prefix("0x").unwrap_or(text).as_bytes();
    let padded: Vec<u8>;
    let digits = if digits.len().is_multiple_of(2) {
        digits
    } else if allow_uneven {
        padded = [b"0", digits].concat();
        &padded
    } else {
        return Err("uneven size input to from_hex".to_owned());
    };
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        b'A'..=b'F' => Ok(c - b'A' + 10),
        _ => Err(format!("unexpected character in from_hex: {c}")),
    };
    digits
        .chunks_exact(2)
        .map(|pair| Ok(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(filters: Vec<Value>) -> Vec<Value> {
        let mut elements = vec![json!("REQ"), json!("s")];
        elements.extend(filters);
        elements
    }

    fn reason(elements: &[Value]) -> String {
        check_req(elements, 200, 3).unwrap_err().reason
    }

    #[test]
    fn commands_are_read_as_strfry_reads_them() {
        assert_eq!(command("\n"), Ok(None));
        assert_eq!(command("hello"), Err("unparseable message".to_owned()));
        assert_eq!(
            command("[\"REQ\"]"),
            Err("too few array elements".to_owned())
        );
        assert_eq!(
            command("[1, 2]"),
            Err("first element not a command like REQ".to_owned())
        );
        assert!(command("[\"X\", 1]").unwrap().is_some());
        assert!(command("[\"X\", ").is_err());
    }

    #[test]
    fn req_shape_is_checked_before_its_filters() {
        let too_small = check_req(&[json!("REQ"), json!("s")], 200, 3).unwrap_err();
        assert_eq!(
            (too_small.sub, too_small.reason.as_str()),
            (None, "arr too small")
        );
        let no_id = check_req(&[json!("REQ"), json!(1), json!({})], 200, 3).unwrap_err();
        assert_eq!(no_id.sub, None);
        let big = req(vec![json!({"bad": 1}); 201]);
        let refused = check_req(&big, 200, 3).unwrap_err();
        assert_eq!(
            (refused.sub.as_deref(), refused.reason.as_str()),
            (Some("s"), "arr too big")
        );
        let fine = check_req(&req(vec![json!({}); 200]), 200, 3).unwrap();
        assert_eq!(fine.matches, vec![true; 200]);
    }

    #[test]
    fn tag_values_follow_strfry_sizes_and_hex() {
        let a = |v: &str| reason(&req(vec![json!({"#a": [v]})]));
        assert_eq!(
            a(&"x".repeat(256)),
            "error parsing #a: filter item too large"
        );
        assert!(check_req(&req(vec![json!({"#a": ["x".repeat(255)]})]), 200, 3).is_ok());
        let e = |v: String| reason(&req(vec![json!({"#e": [v]})]));
        assert_eq!(
            e("a".repeat(63)),
            "error parsing #e: uneven size input to from_hex"
        );
        assert_eq!(e("a".repeat(62)), "error parsing #e: filter item too small");
        assert_eq!(e("a".repeat(66)), "error parsing #e: filter item too large");
        assert_eq!(
            e("z".repeat(64)),
            "error parsing #e: unexpected character in from_hex: 122"
        );
        assert!(
            check_req(
                &req(vec![json!({"#p": [format!("0x{}", "A".repeat(64))]})]),
                200,
                3
            )
            .is_ok()
        );
        assert_eq!(
            reason(&req(vec![json!({"#ab": ["x"]})])),
            "error parsing #ab: unindexed tag filter"
        );
        assert_eq!(reason(&req(vec![json!({"#a": "x"})])), "#a not an array");
    }

    #[test]
    fn filters_are_checked_in_turn_and_keys_in_byte_order() {
        // `#a` sorts before `#e`: its error wins, whatever the JSON order.
        let both = json!({"#e": ["00"], "#a": ["x".repeat(300)]});
        assert_eq!(
            reason(&req(vec![json!({}), both])),
            "error parsing #a: filter item too large"
        );
        let four = json!({"#a": ["x"], "#b": ["x"], "#c": ["x"], "#d": ["x"]});
        assert_eq!(reason(&req(vec![four])), "too many tags in filter");
        let three = json!({"#a": ["x"], "#b": ["x"], "#c": ["x"], "#d": []});
        assert_eq!(
            check_req(&req(vec![three]), 200, 3).unwrap().matches,
            [false]
        );
        assert_eq!(
            reason(&req(vec![json!({"search": "x"})])),
            "unrecognised filter item: search"
        );
        assert_eq!(
            reason(&req(vec![json!({"limit": -1})])),
            "error parsing limit"
        );
        assert_eq!(
            reason(&req(vec![json!([])])),
            "provided filter is not an object"
        );
    }

    #[test]
    fn sub_ids_and_hex_as_strfry_takes_them() {
        assert_eq!(check_sub_id(""), Err("invalid subscription id length"));
        assert_eq!(
            check_sub_id(&"s".repeat(65)),
            Err("invalid subscription id length")
        );
        assert_eq!(
            check_sub_id("a\"b"),
            Err("invalid character in subscription id")
        );
        assert_eq!(check_sub_id(&"s".repeat(64)), Ok(()));
        assert_eq!(from_hex("0x0aFf", false), Ok(vec![0x0a, 0xff]));
        assert_eq!(from_hex("abc", true), Ok(vec![0x0a, 0xbc]));
        assert!(from_hex("abc", false).is_err());
    }
}
