//! What a relay means when it ends or refuses a subscription.
//!
//! `CLOSED` reasons carry a machine-readable prefix (NIP-01), but relays
//! differ: strfry writes `ERROR: rate-limited: ...`, some capitalise, and
//! nostr-rs-relay refuses a subscription over its limit with a `NOTICE`
//! that names no subscription at all. Everything is matched
//! case-insensitively so a relay's spelling cannot turn a limit into a loop.

/// The engine's reading of a `CLOSED` reason or a `NOTICE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Too many concurrent subscriptions: lower the relay's limit and retry.
    TooManySubscriptions,
    /// Too many filters in one REQ: lower the per-REQ filter limit and retry.
    TooManyFilters,
    /// The message was too large: lower the message limit and retry.
    TooLarge,
    /// Too many values in one tag (or `ids`/`authors`) list of a filter,
    /// as eventstore's SQL backends refuse: chunk smaller and retry.
    TooManyValues,
    /// Too many kinds in one filter (eventstore's SQL backends: 10).
    TooManyKinds,
    /// One value of a filter is refused, not the message's size: strfry's
    /// `bad req: error parsing #a: filter item too large` (a tag value
    /// over 255 bytes) or `filter item too small` (an `#e`/`#p` value not
    /// 64 hex). The whole REQ is refused for it: isolate the value.
    /// `too_long` when the text says the value was too large or long (a
    /// length limit the engine can learn), not malformed.
    BadValue {
        /// The value was refused for its length.
        too_long: bool,
    },
    /// `rate-limited:`: cool down, then retry.
    RateLimited,
    /// `auth-required:`: the relay wants NIP-42 first.
    AuthRequired,
    /// `restricted:`: not allowed for us; back off.
    Restricted,
    /// `error:` or anything else: back off.
    Error,
}

impl Refusal {
    /// Classifies a `CLOSED` reason.
    pub(crate) fn of_closed(reason: &str) -> Refusal {
        let lower = reason.trim().to_ascii_lowercase();
        let body = lower
            .strip_prefix("error:")
            .map_or(lower.as_str(), str::trim_start);
        if let Some(limit) = limit_kind(body) {
            return limit;
        }
        match body.split_once(':').map(|(prefix, _)| prefix.trim()) {
            Some("rate-limited") => Refusal::RateLimited,
            Some("auth-required") => Refusal::AuthRequired,
            Some("restricted") | Some("blocked") => Refusal::Restricted,
            _ => Refusal::Error,
        }
    }

    /// Classifies a `NOTICE`; `None` when it does not refuse anything we sent.
    pub(crate) fn of_notice(text: &str) -> Option<Refusal> {
        let lower = text.to_ascii_lowercase();
        limit_kind(&lower).or_else(|| {
            let closed = Refusal::of_closed(&lower);
            (closed == Refusal::RateLimited).then_some(closed)
        })
    }

    /// True when the refused work may be retried at once with lower limits.
    pub(crate) fn is_limit(self) -> bool {
        matches!(
            self,
            Refusal::TooManySubscriptions
                | Refusal::TooManyFilters
                | Refusal::TooLarge
                | Refusal::TooManyValues
                | Refusal::TooManyKinds
        )
    }
}

/// The limit to try after `refused` (a count of filters, values, ...) was
/// refused: the largest of `known`, the limits relays are known to set
/// (largest first), below it, else half, never below one. A relay on a
/// known limit is found at the first refusal, not halved past it.
pub(crate) fn step_below(known: &[usize], refused: usize) -> usize {
    let below = known.iter().copied().find(|&limit| limit < refused);
    below.unwrap_or(refused / 2).max(1)
}

/// Recognises the ways relays word their per-connection limits.
fn limit_kind(lower: &str) -> Option<Refusal> {
    let subs = [
        "concurrent",
        "subscription",
        "too many req",
        "max_subscriptions",
    ];
    let values = [
        "tag values",
        "values",
        "ids",
        "authors",
        "tags",
        "max_tag_values",
    ];
    if is_value_refusal(lower) {
        let too_long = lower.contains("too large") || lower.contains("too long");
        Some(Refusal::BadValue { too_long })
    } else if lower.contains("too many kinds") || lower.contains("max_kinds") {
        Some(Refusal::TooManyKinds)
    } else if (lower.contains("too many") || lower.contains("max_"))
        && values.iter().any(|v| lower.contains(v))
    {
        Some(Refusal::TooManyValues)
    } else if lower.contains("too many filters")
        || lower.contains("max_filters")
        || lower.contains("max filter count")
        || lower.contains("arr too big")
    {
        Some(Refusal::TooManyFilters)
    } else if lower.contains("too large")
        || lower.contains("too big")
        || lower.contains("max_message")
    {
        Some(Refusal::TooLarge)
    } else if (lower.contains("too many") || lower.contains("maximum") || lower.contains("limit"))
        && subs.iter().any(|s| lower.contains(s))
    {
        Some(Refusal::TooManySubscriptions)
    } else {
        None
    }
}

/// A refusal of one value in a filter rather than of the message: it
/// names a filter item or the tag it parsed (strfry), or a value that is
/// too long or malformed. "Too large" alone stays a message-size refusal.
fn is_value_refusal(lower: &str) -> bool {
    let names_item = lower.contains("filter item")
        || lower.contains("error parsing #")
        || lower.contains("tag value too")
        || lower.contains("value too long")
        || lower.contains("value too large")
        || lower.contains("invalid tag value");
    names_item && !lower.contains("too many")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_prefixes_in_any_spelling() {
        assert_eq!(
            Refusal::of_closed("rate-limited: slow down"),
            Refusal::RateLimited
        );
        assert_eq!(
            Refusal::of_closed("ERROR: rate-limited: slow down"),
            Refusal::RateLimited
        );
        assert_eq!(
            Refusal::of_closed("Auth-Required: we need you"),
            Refusal::AuthRequired
        );
        assert_eq!(
            Refusal::of_closed("error: auth-required: x"),
            Refusal::AuthRequired
        );
        assert_eq!(
            Refusal::of_closed("restricted: paid relay"),
            Refusal::Restricted
        );
        assert_eq!(Refusal::of_closed("error: shutting down"), Refusal::Error);
        assert_eq!(
            Refusal::of_closed("ERROR: bad req: something"),
            Refusal::Error
        );
        assert_eq!(Refusal::of_closed(""), Refusal::Error);
    }

    #[test]
    fn limits_from_closed_and_notice() {
        assert_eq!(
            Refusal::of_closed("error: too many concurrent REQs"),
            Refusal::TooManySubscriptions
        );
        assert_eq!(
            Refusal::of_notice("Maximum concurrent subscription count reached"),
            Some(Refusal::TooManySubscriptions)
        );
        assert_eq!(
            Refusal::of_notice("too many concurrent REQs"),
            Some(Refusal::TooManySubscriptions)
        );
        assert_eq!(
            Refusal::of_closed("ERROR: too many filters"),
            Refusal::TooManyFilters
        );
        assert_eq!(
            Refusal::of_notice("message too large"),
            Some(Refusal::TooLarge)
        );
        assert_eq!(
            Refusal::of_notice("rate-limited: you are noisy"),
            Some(Refusal::RateLimited)
        );
        assert_eq!(Refusal::of_notice("welcome to my relay"), None);
        for (reason, want) in [
            ("error: too many tag values", Refusal::TooManyValues),
            ("ERROR: Too Many Tag Values", Refusal::TooManyValues),
            ("blocked: too many ids", Refusal::TooManyValues),
            ("error: too many authors", Refusal::TooManyValues),
            ("error: too many kinds", Refusal::TooManyKinds),
        ] {
            assert_eq!(Refusal::of_closed(reason), want, "{reason}");
            assert_eq!(Refusal::of_notice(reason), Some(want), "{reason}");
        }
        for (reason, too_long) in [
            (
                "ERROR: bad req: error parsing #a: filter item too large",
                true,
            ),
            (
                "ERROR: bad req: error parsing #e: filter item too small",
                false,
            ),
            ("error: Filter Item Too Large", true),
            ("invalid: tag value too long", true),
        ] {
            let want = Refusal::BadValue { too_long };
            assert_eq!(Refusal::of_closed(reason), want, "{reason}");
            assert_eq!(Refusal::of_notice(reason), Some(want), "{reason}");
        }
        assert_eq!(
            Refusal::of_closed("ERROR: bad req: arr too big"),
            Refusal::TooManyFilters,
            "strfry: over 200 filters"
        );
        assert_eq!(
            Refusal::of_closed("rate-limited: REQ exceeds max filter count 20"),
            Refusal::TooManyFilters,
            "rust-nostr's LocalRelay: over 20 filters, a limit, not a rate to wait out"
        );
        assert_eq!(
            Refusal::of_closed("error: message too large"),
            Refusal::TooLarge,
            "a size refusal names no item"
        );
        assert!(
            !Refusal::BadValue { too_long: true }.is_limit(),
            "lowers no limit"
        );
        assert!(Refusal::TooManyValues.is_limit());
        assert!(Refusal::TooLarge.is_limit());
        assert!(!Refusal::RateLimited.is_limit());
    }
}
