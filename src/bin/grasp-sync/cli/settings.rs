//! The effective settings, printed once at start-up.

use std::time::Duration;

use super::Options;

/// The effective settings as `flag=value` pairs for the start-up line:
/// what an operator needs to tell what runs, and no secret (an AUTH key
/// shows as its public key; relay URLs carry no credentials, `parse`
/// refuses them).
pub fn settings_text(o: &Options) -> String {
    let (c, sh) = (&o.config, &o.shell);
    let secs = |d: Duration| d.as_secs().to_string();
    let list = |items: Vec<String>| {
        if items.is_empty() {
            "none".to_owned()
        } else {
            items.join(",")
        }
    };
    let npub = |keys: Option<&nostr::prelude::Keys>| {
        use nostr::prelude::ToBech32;
        keys.map_or("none".to_owned(), |k| {
            k.public_key()
                .to_bech32()
                .unwrap_or_else(|_| k.public_key().to_hex())
        })
    };
    // Without its own key the own relay is answered with the shared one.
    let own_key = npub(c.own_relay_auth_keys.as_ref().or(c.auth_keys.as_ref()));
    let pairs: Vec<(&str, String)> = vec![
        ("own-relay", c.own_relay.clone()),
        (
            "domain",
            c.domain.clone().unwrap_or_else(|| authority(&c.own_relay)),
        ),
        ("bootstrap", list(c.bootstrap.clone())),
        (
            "state-file",
            sh.state_file
                .as_ref()
                .map_or("none".to_owned(), |p| p.display().to_string()),
        ),
        ("state-save-secs", secs(sh.state_save_every)),
        ("auth-key", npub(c.auth_keys.as_ref())),
        ("own-relay-auth-key", own_key),
        (
            "allow-private-addresses",
            sh.allow_private_addresses.to_string(),
        ),
        ("self-subscribe", c.self_subscribe.to_string()),
        ("negentropy", c.negentropy.to_string()),
        ("max-relays", sh.max_relays.to_string()),
        ("outbox-capacity", sh.outbox_capacity.to_string()),
        ("max-frame-bytes", sh.max_frame_bytes.to_string()),
        ("max-frames-per-sec", sh.max_frames_per_sec.to_string()),
        ("page-limit", c.page_limit.to_string()),
        ("max-subscriptions", c.max_subscriptions.to_string()),
        ("max-filters-per-req", c.max_filters_per_req.to_string()),
        ("chunk-size", c.chunk_size.to_string()),
        ("batch-window-ms", c.batch_window.as_millis().to_string()),
        ("backoff-base-secs", secs(c.backoff_base)),
        ("backoff-max-secs", secs(c.backoff_max)),
        ("quick-reconnect-secs", secs(c.quick_reconnect)),
        (
            "consolidation-threshold",
            c.consolidation_threshold.to_string(),
        ),
        ("consolidation-timeout-secs", secs(c.consolidation_timeout)),
        ("disconnect-check-secs", secs(c.disconnect_check)),
        ("daily-min-secs", secs(c.daily_min)),
        ("daily-max-secs", secs(c.daily_max)),
        ("neg-timeout-secs", secs(c.neg_timeout)),
        (
            "extra-ca-file",
            list(
                sh.extra_ca_files
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect(),
            ),
        ),
        ("shutdown-timeout-secs", secs(sh.shutdown_timeout)),
    ];
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `host[:port]` of a normalized relay URL: the default `--domain`.
fn authority(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest).to_owned()
}
