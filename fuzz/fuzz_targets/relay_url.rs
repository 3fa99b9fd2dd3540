//! Relay URLs come from announcements anyone writes: normalizing one must
//! never panic, and a normalized URL must normalize to itself (otherwise one
//! relay would be interned twice, under two spellings). The relay a clone
//! URL names, and the host of any normalized URL, must hold to the same.

#![no_main]

use grasp_sync::internal::{host_port, normalize, relay_of_clone_url};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &str| {
    if let Ok(url) = normalize(raw) {
        assert_eq!(
            normalize(&url).as_ref(),
            Ok(&url),
            "not idempotent: {raw:?}"
        );
        assert!(
            url.starts_with("ws://") || url.starts_with("wss://"),
            "{url}"
        );
        assert!(!host_port(&url).is_empty(), "{url} has no host");
    }
    if let Some(url) = relay_of_clone_url(raw) {
        assert_eq!(normalize(&url).as_ref(), Ok(&url), "clone {raw:?}");
    }
});
