//! Which events strfry (f8a56a8) refuses to store, and why: the checks of
//! `parseAndVerifyEvent` (`events.cpp`) in its order — tags as it packs
//! them, then `created_at` against the clock, then id and signature, then
//! the size of the event's JSON. The reason goes out as `OK false
//! "invalid: <reason>"`.
//!
//! The clock is the farm's (the wall clock, as for NIP-42 AUTH): strfry
//! checks against its own time, not the client's.
//!
//! Not modelled: NIP-40 `expiration` tags (`event expired`), a kind 5 `a`
//! tag naming someone else's event, and NIP-70 protected events.
//!
//! Pure functions, no IO.

use nostr::prelude::{Event, Timestamp};

use super::super::limits::StrfryLimits;
use super::strfry_req::from_hex;

/// Why strfry refuses `event` at `now`, or `None` if it takes it.
pub(super) fn refusal(event: &Event, limits: &StrfryLimits, now: Timestamp) -> Option<String> {
    tag_refusal(event, limits)
        .or_else(|| time_refusal(event, limits, now).map(str::to_owned))
        .or_else(|| (!event.verify_id()).then(|| "bad event id".to_owned()))
        .or_else(|| (!event.verify_signature()).then(|| "bad signature".to_owned()))
        .or_else(|| {
            let size = event.as_json().len();
            (size > limits.max_event_bytes).then(|| format!("event too large: {size}"))
        })
}

/// strfry's tag checks while packing an event: the tag count, then per
/// single-letter tag its value's size and, for `e` and `p`, 64 hex digits.
fn tag_refusal(event: &Event, limits: &StrfryLimits) -> Option<String> {
    let count = event.tags.len();
    if count > limits.max_event_tags {
        return Some(format!("too many tags: {count}"));
    }
    for tag in event.tags.iter() {
        let fields = tag.as_slice();
        let Some(name) = fields.first().filter(|n| n.len() == 1) else {
            continue;
        };
        let value = fields.get(1).map_or("", String::as_str);
        if value.len() > limits.max_tag_value_bytes {
            return Some(format!("tag val too large: {}", value.len()));
        }
        if name == "e" || name == "p" {
            if value.len() != 64 {
                return Some(format!("unexpected size for fixed-size tag: {name}"));
            }
            if let Err(e) = from_hex(value, false) {
                return Some(e);
            }
        }
    }
    None
}

/// strfry's `verifyEventTimestamp`: ephemeral kinds (20000-29999) may be a
/// minute old, others three years; none more than 15 minutes ahead (with
/// the defaults).
fn time_refusal(event: &Event, limits: &StrfryLimits, now: Timestamp) -> Option<&'static str> {
    let (now, at) = (now.as_secs(), event.created_at.as_secs());
    let ephemeral = (20_000..30_000).contains(&event.kind.as_u16());
    let max_age = if ephemeral {
        limits.reject_ephemeral_older_than_secs
    } else {
        limits.reject_older_than_secs
    };
    if at < now.saturating_sub(max_age) {
        return Some(if ephemeral {
            "ephemeral event expired"
        } else {
            "created_at too early"
        });
    }
    (at > now.saturating_add(limits.reject_newer_than_secs)).then_some("created_at too late")
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Kind, Tag};

    fn event(kind: u16, at: u64, tags: Vec<Tag>, content: &str) -> Event {
        EventBuilder::new(Kind::from_u16(kind), content)
            .tags(tags)
            .custom_created_at(Timestamp::from_secs(at))
            .finalize(&Keys::generate())
            .unwrap()
    }

    const NOW: u64 = 1_800_000_000;

    fn why(e: &Event) -> Option<String> {
        refusal(e, &StrfryLimits::default(), Timestamp::from_secs(NOW))
    }

    #[test]
    fn time_bounds_are_strfry_defaults() {
        let three_years = 94_608_000;
        assert_eq!(why(&event(1, NOW - three_years, vec![], "")), None);
        assert_eq!(
            why(&event(1, NOW - three_years - 1, vec![], "")).as_deref(),
            Some("created_at too early")
        );
        assert_eq!(why(&event(1, NOW + 900, vec![], "")), None);
        assert_eq!(
            why(&event(1, NOW + 901, vec![], "")).as_deref(),
            Some("created_at too late")
        );
        assert_eq!(
            why(&event(20_001, NOW - 61, vec![], "")).as_deref(),
            Some("ephemeral event expired")
        );
    }

    #[test]
    fn tags_size_and_signature() {
        let tag = |t: &[&str]| Tag::parse(t.iter().copied()).unwrap();
        let long = "x".repeat(1_025);
        assert_eq!(
            why(&event(1, NOW, vec![tag(&["a", &long])], "")).as_deref(),
            Some("tag val too large: 1025")
        );
        let unindexed = "x".repeat(300);
        assert_eq!(why(&event(1, NOW, vec![tag(&["a", &unindexed])], "")), None);
        assert_eq!(
            why(&event(1, NOW, vec![tag(&["e", "abcd"])], "")).as_deref(),
            Some("unexpected size for fixed-size tag: e")
        );
        let big = event(1, NOW, vec![], &"x".repeat(70_000));
        let size = big.as_json().len();
        assert_eq!(why(&big), Some(format!("event too large: {size}")));
        let mut forged = event(1, NOW, vec![], "a");
        forged.content = "b".to_owned();
        assert_eq!(why(&forged).as_deref(), Some("bad event id"));
    }
}
