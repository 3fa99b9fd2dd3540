//! The flags: one row of `FLAGS` per flag (its name, whether it takes a
//! value, its default as the help page shows it, a one-line meaning and a
//! setter), and the value parsers the setters share, whose errors are the
//! part after `--flag: ` of what the binary prints.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use grasp_sync::Shard;
use grasp_sync::normalize_relay_url as normalize;

use super::Options;

/// Smallest accepted frame size: below this not even a REQ fits.
const MIN_FRAME_BYTES: u64 = 1024;

/// Sets one value of a flag; the error is the part after `--flag: `.
type Setter = fn(&mut Options, &str) -> Result<(), String>;

/// How a flag takes its input.
pub(super) enum Kind {
    /// No value: present means on. Its variable takes a boolean.
    Switch(fn(&mut Options, bool)),
    /// One value (placeholder for help); giving it twice is an error.
    Single(&'static str, Setter),
    /// Any number of values (placeholder for help); its variable is a
    /// comma-separated list.
    Repeated(&'static str, Setter),
}

/// One flag of the binary.
pub(super) struct Flag {
    /// Name without the leading `--`; the variable is derived from it.
    pub(super) name: &'static str,
    pub(super) kind: Kind,
    /// Default as the help page shows it.
    pub(super) default: &'static str,
    /// One-line meaning for the help page.
    pub(super) help: &'static str,
}

/// Every flag, in help-page order. Setters run in this order too, which
/// only matters for cross-checks done in `build` afterwards.
pub(super) static FLAGS: &[Flag] = &[
    Flag {
        name: "own-relay",
        kind: Kind::Single("<ws-url>", |o, v| {
            o.config.own_relay = relay_url(v)?;
            Ok(())
        }),
        default: "required",
        help: "The relay to keep in sync (ws:// or wss://): repos are learned from it, synced into it.",
    },
    Flag {
        name: "domain",
        kind: Kind::Single("<host[:port]>", |o, v| {
            o.config.domain = Some(domain(v)?);
            Ok(())
        }),
        default: "host of --own-relay",
        help: "Host that remote announcements must list in their relays to be synced (GRASP-01).",
    },
    Flag {
        name: "bootstrap",
        kind: Kind::Repeated("<ws-url>", |o, v| {
            o.config.bootstrap.push(relay_url(v)?);
            Ok(())
        }),
        default: "none",
        help: "Relay always connected to discover repositories; repeat the flag for more.",
    },
    Flag {
        name: "metrics",
        kind: Kind::Single("<ip:port>", |o, v| {
            o.shell.metrics = Some(socket_addr(v)?);
            Ok(())
        }),
        default: "off",
        help: "Serve metrics over HTTP on this address; port 0 picks a free port, printed on stdout as `grasp-sync: metrics on ADDR`.",
    },
    Flag {
        name: "metrics-host",
        kind: Kind::Repeated("<name>", |o, v| {
            o.shell.metrics_hosts.push(host_name(v)?);
            Ok(())
        }),
        default: "IP addresses and localhost only",
        help: "A name the metrics port answers under (its Host header) beside IP addresses and localhost; others get 421, so no web page can reach it by DNS rebinding. Repeat the flag for more.",
    },
    Flag {
        name: "shard",
        kind: Kind::Single("<I/N>", |o, v| {
            o.config.shard = Shard::parse(v).ok_or_else(|| {
                format!("invalid value {v:?} (expected I/N with 0 <= I < N, e.g. 0/2)")
            })?;
            Ok(())
        }),
        default: "0/1",
        help: "Connect only to the remote relays of shard I of N (a stable hash of each URL); N engines with one own relay cover every relay once.",
    },
    Flag {
        name: "allow-private-addresses",
        kind: Kind::Switch(|o, on| o.shell.allow_private_addresses = on),
        default: "off",
        help: "Also connect to relays on private, loopback and link-local addresses.",
    },
    Flag {
        name: "no-self-subscribe",
        kind: Kind::Switch(|o, on| o.config.self_subscribe = !on),
        default: "off",
        help: "Do not subscribe to the own relay to learn repositories.",
    },
    Flag {
        name: "no-negentropy",
        kind: Kind::Switch(|o, on| o.config.negentropy = !on),
        default: "off",
        help: "Never use NIP-77 negentropy; historic sync re-reads relays with REQ.",
    },
    Flag {
        name: "neg-timeout-secs",
        kind: Kind::Single("<secs>", |o, v| {
            o.config.neg_timeout = secs(v, 1)?;
            Ok(())
        }),
        default: "15",
        help: "A negentropy job silent this long falls back to REQ.",
    },
    Flag {
        name: "batch-window-ms",
        kind: Kind::Single("<ms>", |o, v| {
            o.config.batch_window = Duration::from_millis(integer(v, 0)?);
            Ok(())
        }),
        default: "5000",
        help: "Collect own-relay events this long into one batch before acting on them.",
    },
    Flag {
        name: "backoff-base-secs",
        kind: Kind::Single("<secs>", |o, v| {
            o.config.backoff_base = secs(v, 0)?;
            Ok(())
        }),
        default: "5",
        help: "First reconnect backoff; doubles with every consecutive failure.",
    },
    Flag {
        name: "backoff-max-secs",
        kind: Kind::Single("<secs>", |o, v| {
            o.config.backoff_max = secs(v, 0)?;
            Ok(())
        }),
        default: "3600",
        help: "Longest reconnect backoff.",
    },
    Flag {
        name: "quick-reconnect-secs",
        kind: Kind::Single("<secs>", |o, v| {
            o.config.quick_reconnect = secs(v, 0)?;
            Ok(())
        }),
        default: "900",
        help: "A reconnect within this window keeps synced state and catches up with since.",
    },
    Flag {
        name: "consolidation-threshold",
        kind: Kind::Single("<n>", |o, v| {
            o.config.consolidation_threshold = integer(v, 1)?;
            Ok(())
        }),
        default: "70",
        help: "Live filters on one relay above which its subscriptions are consolidated.",
    },
    Flag {
        name: "consolidation-timeout-secs",
        kind: Kind::Single("<secs>", |o, v| {
            o.config.consolidation_timeout = secs(v, 0)?;
            Ok(())
        }),
        default: "30",
        help: "Longest wait for pending batches before consolidating anyway.",
    },
    Flag {
        name: "disconnect-check-secs",
        kind: Kind::Single("<secs>", |o, v| {
            o.config.disconnect_check = secs(v, 1)?;
            Ok(())
        }),
        default: "60",
        help: "Period of the check that drops relays no repository needs any more.",
    },
    Flag {
        name: "daily-min-secs",
        kind: Kind::Single("<secs>", |o, v| {
            o.config.daily_min = secs(v, 0)?;
            Ok(())
        }),
        default: "82800",
        help: "Lower bound of the per-relay daily fresh sync period.",
    },
    Flag {
        name: "daily-max-secs",
        kind: Kind::Single("<secs>", |o, v| {
            o.config.daily_max = secs(v, 0)?;
            Ok(())
        }),
        default: "90000",
        help: "Upper bound of the per-relay daily fresh sync period (at least --daily-min-secs).",
    },
    Flag {
        name: "page-limit",
        kind: Kind::Single("<n>", |o, v| {
            o.config.page_limit = integer(v, 1)?;
            Ok(())
        }),
        default: "500",
        help: "The limit of every historic request; a full page asks for the next one.",
    },
    Flag {
        name: "max-subscriptions",
        kind: Kind::Single("<n>", |o, v| {
            o.config.max_subscriptions = integer(v, 1)?;
            Ok(())
        }),
        default: "10",
        help: "Concurrent subscriptions per relay to start with (lowered when a relay refuses).",
    },
    Flag {
        name: "max-filters-per-req",
        kind: Kind::Single("<n>", |o, v| {
            o.config.max_filters_per_req = integer(v, 1)?;
            Ok(())
        }),
        default: "100",
        help: "Most filters per REQ (20 until a relay's NIP-11 shows it takes more; lowered when a relay refuses).",
    },
    Flag {
        name: "chunk-size",
        kind: Kind::Single("<n>", |o, v| {
            o.config.chunk_size = integer(v, 1)?;
            Ok(())
        }),
        default: "100",
        help: "Repo refs or root ids per tag filter.",
    },
    Flag {
        name: "max-relays",
        kind: Kind::Single("<n>", |o, v| {
            o.shell.max_relays = integer(v, 1)?;
            Ok(())
        }),
        default: "10000",
        help: "Cap on relays connected in total.",
    },
    Flag {
        name: "outbox-capacity",
        kind: Kind::Single("<n>", |o, v| {
            o.shell.outbox_capacity = integer(v, 1)?;
            Ok(())
        }),
        default: "10000",
        help: "Events the own-relay outbox holds before remote reads pause.",
    },
    Flag {
        name: "max-frame-bytes",
        kind: Kind::Single("<bytes>", |o, v| {
            o.shell.max_frame_bytes = integer(v, MIN_FRAME_BYTES)?;
            Ok(())
        }),
        default: "1048576",
        help: "Websocket max message and frame size (at least 1024).",
    },
    Flag {
        name: "max-unfinished-bytes",
        kind: Kind::Single("<bytes>", |o, v| {
            o.shell.max_unfinished_bytes = integer(v, MIN_FRAME_BYTES)?;
            Ok(())
        }),
        default: "67108864",
        help: "Bytes of unfinished websocket messages all relays together may make us hold (at least --max-frame-bytes); a relay passing it is cut.",
    },
    Flag {
        name: "max-frames-per-sec",
        kind: Kind::Single("<n>", |o, v| {
            o.shell.max_frames_per_sec = integer(v, 1)?;
            Ok(())
        }),
        default: "20000",
        help: "Frames read per second from one relay at most; a flooding relay waits, others do not.",
    },
    Flag {
        name: "extra-ca-file",
        kind: Kind::Repeated("<path>", |o, v| {
            o.shell.extra_ca_files.push(path(v)?);
            Ok(())
        }),
        default: "none",
        help: "PEM file with extra root certificates for wss:// (private CAs); repeat for more.",
    },
    Flag {
        name: "shutdown-timeout-secs",
        kind: Kind::Single("<secs>", |o, v| {
            o.shell.shutdown_timeout = secs(v, 0)?;
            Ok(())
        }),
        default: "10",
        help: "On SIGTERM, time to flush before exiting anyway.",
    },
    Flag {
        name: "state-file",
        kind: Kind::Single("<path>", |o, v| {
            o.shell.state_file = Some(path(v)?);
            Ok(())
        }),
        default: "none (every start is fresh)",
        help: "Keep what the engine learned of each relay here across restarts (written every few minutes and at shutdown; a bad file is set aside as PATH.bad-<time>).",
    },
    Flag {
        name: "state-save-secs",
        kind: Kind::Single("<secs>", |o, v| {
            o.shell.state_save_every = secs(v, 1)?;
            Ok(())
        }),
        default: "180",
        help: "How often --state-file is written while running.",
    },
    Flag {
        name: "auth-key-file",
        kind: Kind::Single("<path>", |o, v| {
            o.config.auth_keys =
                Some(grasp_sync::read_key_file(&path(v)?).map_err(|e| e.to_string())?);
            Ok(())
        }),
        default: "none",
        help: "File holding an nsec or hex secret key for NIP-42 AUTH (never pass a key itself).",
    },
    Flag {
        name: "own-relay-auth-key-file",
        kind: Kind::Single("<path>", |o, v| {
            o.config.own_relay_auth_keys =
                Some(grasp_sync::read_key_file(&path(v)?).map_err(|e| e.to_string())?);
            Ok(())
        }),
        default: "the --auth-key-file key",
        help: "Key file for the own relay's AUTH only; without it the shared key answers the own relay too, and a hostile relay could relay its challenge.",
    },
    Flag {
        name: "seed",
        kind: Kind::Single("<u64>", |o, v| {
            o.config.seed = integer(v, 0)?;
            o.seed_given = true;
            Ok(())
        }),
        default: "random",
        help: "Seed of the engine's RNG (jitter); a fixed seed makes runs repeatable.",
    },
];

/// A relay URL, normalized so it compares with the engine's spelling.
fn relay_url(raw: &str) -> Result<String, String> {
    normalize(raw).map_err(|e| format!("invalid value {raw:?} ({e})"))
}

/// A `host[:port]` as announcements list it: no scheme, path or spaces.
fn domain(raw: &str) -> Result<String, String> {
    if raw.is_empty() || raw.contains(char::is_whitespace) || raw.contains('/') {
        return Err(format!(
            "invalid value {raw:?} (expected host[:port] without scheme or path)"
        ));
    }
    Ok(raw.to_owned())
}

/// A host name as a `Host` header carries it, without port: letters,
/// digits, `-` and `.`.
fn host_name(raw: &str) -> Result<String, String> {
    let name = raw.trim().trim_end_matches('.');
    let valid = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'.';
    if name.is_empty() || name.len() > 253 || !name.bytes().all(valid) {
        return Err(format!(
            "invalid value {raw:?} (expected a host name without port, e.g. metrics.example.net)"
        ));
    }
    Ok(name.to_ascii_lowercase())
}

/// An IP address and port; host names are not resolved here.
fn socket_addr(raw: &str) -> Result<SocketAddr, String> {
    raw.trim()
        .parse()
        .map_err(|_| format!("invalid value {raw:?} (expected ip:port, e.g. 127.0.0.1:9100)"))
}

/// A file path; whether it exists is found out when it is read.
fn path(raw: &str) -> Result<PathBuf, String> {
    if raw.is_empty() {
        return Err("invalid value \"\" (expected a file path)".to_owned());
    }
    Ok(PathBuf::from(raw))
}

/// Whole seconds, at least `min`.
fn secs(raw: &str, min: u64) -> Result<Duration, String> {
    integer(raw, min).map(Duration::from_secs)
}

/// A decimal integer of at least `min` that fits `T`. Digits only (after
/// trimming surrounding blanks), so signs, garbage and overflow are errors.
fn integer<T: TryFrom<u64>>(raw: &str, min: u64) -> Result<T, String> {
    let text = raw.trim();
    let expected = match min {
        0 => "a non-negative integer".to_owned(),
        1 => "a positive integer".to_owned(),
        _ => format!("an integer of at least {min}"),
    };
    let invalid = || format!("invalid value {raw:?} (expected {expected})");
    let too_large = || format!("invalid value {raw:?} (too large)");
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    // All digits, so parsing can only fail by overflowing.
    let n: u64 = text.parse().map_err(|_| too_large())?;
    if n < min {
        return Err(invalid());
    }
    T::try_from(n).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use crate::cli::tests::{OWN, error, run};

    #[test]
    fn the_auth_key_is_read_from_a_file_as_nsec_or_hex() {
        let dir = std::env::temp_dir().join(format!("grasp-sync-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let keys = nostr::prelude::Keys::generate();
        let hex = dir.join("hex");
        std::fs::write(&hex, format!("  {}\n", keys.secret_key().to_secret_hex())).unwrap();
        let nsec = dir.join("nsec");
        use nostr::prelude::ToBech32;
        std::fs::write(&nsec, keys.secret_key().to_bech32().unwrap()).unwrap();
        for file in [&hex, &nsec] {
            let arg = format!("--auth-key-file={}", file.display());
            let o = run(&["--own-relay", OWN, &arg], &[]);
            assert_eq!(o.config.auth_keys.unwrap().public_key(), keys.public_key());
            let env = [("GRASP_SYNC_AUTH_KEY_FILE", file.to_str().unwrap())];
            let o = run(&["--own-relay", OWN], &env);
            assert_eq!(o.config.auth_keys.unwrap().public_key(), keys.public_key());
        }
        let bad = dir.join("bad");
        std::fs::write(&bad, "not a key").unwrap();
        let e = error(
            &["--own-relay", OWN, "--auth-key-file", bad.to_str().unwrap()],
            &[],
        );
        assert!(e.contains("not an nsec or hex secret key"), "{e}");
        assert!(
            !e.contains("not a key"),
            "the file's content is never echoed: {e}"
        );
        let e = error(
            &["--own-relay", OWN, "--auth-key-file", "/nonexistent/key"],
            &[],
        );
        assert!(e.starts_with("--auth-key-file: /nonexistent/key"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The own relay's key is its own flag; a key passed where its file's
    /// path belongs is never echoed.
    #[test]
    fn the_own_relay_has_its_own_key_and_keys_are_never_echoed() {
        let dir = std::env::temp_dir().join(format!("grasp-sync-own-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (shared, own) = (
            nostr::prelude::Keys::generate(),
            nostr::prelude::Keys::generate(),
        );
        let (shared_file, own_file) = (dir.join("shared"), dir.join("own"));
        std::fs::write(&shared_file, shared.secret_key().to_secret_hex()).unwrap();
        std::fs::write(&own_file, own.secret_key().to_secret_hex()).unwrap();
        let o = run(
            &[
                "--own-relay",
                OWN,
                "--auth-key-file",
                shared_file.to_str().unwrap(),
            ],
            &[(
                "GRASP_SYNC_OWN_RELAY_AUTH_KEY_FILE",
                own_file.to_str().unwrap(),
            )],
        );
        assert_eq!(
            o.config.auth_keys.unwrap().public_key(),
            shared.public_key()
        );
        assert_eq!(
            o.config.own_relay_auth_keys.unwrap().public_key(),
            own.public_key()
        );
        let hex = shared.secret_key().to_secret_hex();
        for flag in ["--auth-key-file", "--own-relay-auth-key-file"] {
            let e = error(&["--own-relay", OWN, flag, &hex], &[]);
            assert!(e.starts_with(flag), "{e}");
            assert!(!e.contains(&hex), "the key is echoed: {e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
