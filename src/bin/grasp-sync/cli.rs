//! Command line and environment of the `grasp-sync` binary.
//!
//! Every flag is one row of `FLAGS`: its name, whether it takes a value,
//! its default as the help page shows it, a one-line meaning and a setter.
//! The environment variable is derived from the name, so the flag, its
//! variable and its help line cannot drift apart.
//!
//! Parsing runs in three short steps:
//! 1. `scan_args` splits argv into the raw values of each flag (structural
//!    errors: unknown flag, missing value, positional argument);
//! 2. `resolve` fills in every flag argv did not give from its
//!    `GRASP_SYNC_*` variable, so a flag always beats its variable;
//! 3. `build` runs the setters in table order and the cross-checks.
//!
//! Each step remembers where a value came from (`--flag` or the variable),
//! so every error names what the user has to fix. Errors are one line: the
//! binary prints them and exits with code 2.
//!
//! `grasp-sync demo ...` and `grasp-sync status ...` are separate
//! subcommands the caller routes before calling [`parse`]; they only
//! appear in the help text here.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use grasp_sync::normalize_relay_url as normalize;
use grasp_sync::{Config, ConfigError, Shard, ShellError, ShellOptions};

/// Smallest accepted frame size: below this not even a REQ fits.
const MIN_FRAME_BYTES: u64 = 1024;
/// Prefix of every environment variable; the rest is the flag name.
const ENV_PREFIX: &str = "GRASP_SYNC_";

/// What the binary was asked to do.
#[derive(Debug, Clone)]
#[allow(
    clippy::large_enum_variant,
    reason = "built once per process; boxing would only complicate the API"
)]
pub enum Command {
    /// Run the sync engine.
    Run(Options),
    /// Print [`help_text`] and exit successfully.
    Help,
    /// Print [`version_text`] and exit successfully.
    Version,
}

/// Everything `run` needs besides the engine config.
#[derive(Debug, Clone)]
pub struct Options {
    /// Engine config: defaults overridden by flags and environment.
    pub config: Config,
    /// Shell settings: [`ShellOptions::default`] overridden by flags and
    /// environment.
    pub shell: ShellOptions,
    /// Whether `--seed` was given; if not, the binary picks a random seed
    /// (`config.seed` is left at its default).
    pub seed_given: bool,
}

impl Options {
    /// `config` with the binary's defaults for everything else.
    pub fn new(config: Config) -> Options {
        Options {
            config,
            shell: ShellOptions::default(),
            seed_given: false,
        }
    }
}

/// A usage error: one line, exit code 2.
#[derive(Debug, PartialEq, Eq)]
pub struct CliError(pub String);

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CliError {}

/// Sets one value of a flag; the error is the part after `--flag: `.
type Setter = fn(&mut Options, &str) -> Result<(), String>;

/// How a flag takes its input.
enum Kind {
    /// No value: present means on. Its variable takes a boolean.
    Switch(fn(&mut Options, bool)),
    /// One value (placeholder for help); giving it twice is an error.
    Single(&'static str, Setter),
    /// Any number of values (placeholder for help); its variable is a
    /// comma-separated list.
    Repeated(&'static str, Setter),
}

/// One flag of the binary.
struct Flag {
    /// Name without the leading `--`; the variable is derived from it.
    name: &'static str,
    kind: Kind,
    /// Default as the help page shows it.
    default: &'static str,
    /// One-line meaning for the help page.
    help: &'static str,
}

/// Every flag, in help-page order. Setters run in this order too, which
/// only matters for cross-checks done in `build` afterwards.
static FLAGS: &[Flag] = &[
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
        default: "20",
        help: "Filters per REQ to start with (lowered when a relay refuses).",
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
        default: "5000",
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

/// The environment variable of a flag: `--page-limit` reads `GRASP_SYNC_PAGE_LIMIT`.
fn env_name(flag: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        flag.to_ascii_uppercase().replace('-', "_")
    )
}

/// Parses the arguments (without argv\[0\]) and the environment, read
/// through `env` so tests need not touch the process environment.
///
/// `-h`/`--help` anywhere wins, then `-V`/`--version`, so a user can always
/// get help, even while the rest of the line is wrong.
pub fn parse<I: IntoIterator<Item = String>>(
    args: I,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Command, CliError> {
    let args: Vec<String> = args.into_iter().collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        return Ok(Command::Help);
    }
    if args.iter().any(|a| a == "-V" || a == "--version") {
        return Ok(Command::Version);
    }
    let given = scan_args(&args)?;
    let inputs = resolve(given, env)?;
    build(&inputs).map(Command::Run)
}

/// What one flag was given.
#[derive(Debug)]
enum Given {
    Switch(bool),
    Values(Vec<String>),
}

/// What one flag was given, and where (`--flag` or the variable), which
/// is what its errors name.
struct Input {
    flag: &'static Flag,
    label: String,
    given: Given,
}

/// Splits argv into the raw values of each flag, indexed like `FLAGS`.
fn scan_args(args: &[String]) -> Result<Vec<Option<Given>>, CliError> {
    let mut given: Vec<Option<Given>> = FLAGS.iter().map(|_| None).collect();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let Some(body) = arg.strip_prefix("--") else {
            return Err(not_a_flag(arg));
        };
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (body, None),
        };
        let Some(index) = FLAGS.iter().position(|f| f.name == name) else {
            return Err(CliError(format!("unknown flag --{name} (see --help)")));
        };
        let flag = &FLAGS[index];
        if let Kind::Switch(_) = flag.kind {
            if inline.is_some() {
                return Err(CliError(format!("--{name} takes no value")));
            }
            given[index] = Some(Given::Switch(true));
            continue;
        }
        // `--flag value`: a following `--other` means the value was
        // forgotten; a value starting with `--` needs `--flag=value`.
        let value = match inline {
            Some(value) => value.to_owned(),
            None => match rest.next() {
                Some(value) if !value.starts_with("--") => value.clone(),
                _ => return Err(CliError(format!("--{name}: missing value"))),
            },
        };
        match (&flag.kind, &mut given[index]) {
            (_, slot @ None) => *slot = Some(Given::Values(vec![value])),
            (Kind::Repeated(..), Some(Given::Values(values))) => values.push(value),
            _ => return Err(CliError(format!("--{name} given more than once"))),
        }
    }
    Ok(given)
}

/// The error for an argument that is not `--flag`.
fn not_a_flag(arg: &str) -> CliError {
    if arg.len() > 1 && arg.starts_with('-') {
        CliError(format!("unknown flag {arg} (see --help)"))
    } else {
        CliError(format!("unexpected argument {arg:?} (see --help)"))
    }
}

/// Takes each flag from argv if given there, else from its variable.
///
/// A variable that is empty (or blank) counts as unset, since env files and
/// compose files often define a variable empty to mean "not set".
fn resolve(
    given: Vec<Option<Given>>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<Input>, CliError> {
    let mut inputs = Vec::new();
    for (flag, given) in FLAGS.iter().zip(given) {
        if let Some(given) = given {
            let label = format!("--{}", flag.name);
            inputs.push(Input { flag, label, given });
            continue;
        }
        let var = env_name(flag.name);
        let Some(raw) = env(&var).filter(|raw| !raw.trim().is_empty()) else {
            continue;
        };
        let given = match flag.kind {
            Kind::Switch(_) => Given::Switch(boolean(&raw).ok_or_else(|| {
                CliError(format!(
                    "{var}: invalid value {raw:?} (expected 1/true/yes/on or 0/false/no/off)"
                ))
            })?),
            Kind::Single(..) => Given::Values(vec![raw]),
            // Blank entries are skipped so a trailing comma is harmless.
            Kind::Repeated(..) => Given::Values(
                raw.split(',')
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .map(str::to_owned)
                    .collect(),
            ),
        };
        inputs.push(Input {
            flag,
            label: var,
            given,
        });
    }
    Ok(inputs)
}

/// Runs the setters over the defaults, then checks what spans flags.
fn build(inputs: &[Input]) -> Result<Options, CliError> {
    // Empty until `--own-relay` sets it; a normalized URL is never empty.
    let mut options = Options::new(Config::new(String::new()));
    for input in inputs {
        match (&input.flag.kind, &input.given) {
            (Kind::Switch(set), Given::Switch(on)) => set(&mut options, *on),
            (Kind::Single(_, set) | Kind::Repeated(_, set), Given::Values(values)) => {
                for value in values {
                    set(&mut options, value)
                        .map_err(|e| CliError(format!("{}: {e}", input.label)))?;
                }
            }
            // `scan_args` and `resolve` build `Given` from the flag's kind.
            (_, given) => unreachable!("{given:?} does not fit --{}", input.flag.name),
        }
    }
    if options.config.own_relay.is_empty() {
        return Err(CliError(format!(
            "--own-relay is required (or {})",
            env_name("own-relay")
        )));
    }
    let shell = &options.shell;
    if shell.max_unfinished_bytes < shell.max_frame_bytes as u64 {
        return Err(CliError(format!(
            "{} ({}) is less than {} ({})",
            label(inputs, "max-unfinished-bytes"),
            shell.max_unfinished_bytes,
            label(inputs, "max-frame-bytes"),
            shell.max_frame_bytes,
        )));
    }
    let config = &options.config;
    if config.daily_max < config.daily_min {
        return Err(CliError(format!(
            "{} ({}) is less than {} ({})",
            label(inputs, "daily-max-secs"),
            config.daily_max.as_secs(),
            label(inputs, "daily-min-secs"),
            config.daily_min.as_secs(),
        )));
    }
    Ok(options)
}

/// Where a flag's value came from, or `--flag` if it is the default.
fn label(inputs: &[Input], name: &str) -> String {
    inputs
        .iter()
        .find(|input| input.flag.name == name)
        .map_or_else(|| format!("--{name}"), |input| input.label.clone())
}

/// The flag whose value a start-up error is about, if one is.
pub fn flag_of(error: &ShellError) -> Option<&'static str> {
    match error {
        ShellError::Config(ConfigError::OwnRelay(_)) => Some("own-relay"),
        ShellError::Config(ConfigError::Bootstrap(..)) => Some("bootstrap"),
        ShellError::CaFile { .. } => Some("extra-ca-file"),
        ShellError::Metrics { .. } => Some("metrics"),
        ShellError::StateFile { .. } => Some("state-file"),
        _ => None,
    }
}

/// Where flag `name`'s value came from, as [`parse`] read it: `--name` if
/// argv gave it (a flag beats its variable), else its variable if that is
/// set, else `--name`.
pub fn source_of(args: &[String], env: &dyn Fn(&str) -> Option<String>, name: &str) -> String {
    let flag = format!("--{name}");
    let in_argv = args
        .iter()
        .any(|a| *a == flag || a.strip_prefix(&flag).is_some_and(|r| r.starts_with('=')));
    let var = env_name(name);
    if !in_argv && env(&var).is_some_and(|v| !v.trim().is_empty()) {
        var
    } else {
        flag
    }
}

/// A start-up error as the binary prints it: prefixed with the flag (or
/// variable) to fix, when it is about one.
pub fn describe(
    error: &ShellError,
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> String {
    match flag_of(error) {
        Some(name) => format!("{}: {error}", source_of(args, env, name)),
        None => error.to_string(),
    }
}

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

/// A boolean variable: 1/true/yes/on or 0/false/no/off, any case.
fn boolean(raw: &str) -> Option<bool> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

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
        ("auth-key", npub(c.auth_keys.as_ref())),
        ("own-relay-auth-key", own_key),
        (
            "allow-private-addresses",
            sh.allow_private_addresses.to_string(),
        ),
        ("self-subscribe", c.self_subscribe.to_string()),
        ("negentropy", c.negentropy.to_string()),
        ("max-relays", sh.max_relays.to_string()),
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

/// What `-V`/`--version` prints.
pub fn version_text() -> String {
    format!("grasp-sync {}", env!("CARGO_PKG_VERSION"))
}

/// The `--help` page, generated from `FLAGS`.
pub fn help_text() -> String {
    let mut out = String::new();
    out.push_str(
        "Usage:\n  grasp-sync --own-relay <ws-url> [--domain <host[:port]>] [--bootstrap <ws-url>]... \
         [--metrics <ip:port>] [--allow-private-addresses] [OPTIONS]\n",
    );
    out.push_str(crate::status::USAGE);
    out.push_str(
        "  grasp-sync demo [--relays N] [--repos M] [--events K] [--seed S] [--chaos] [--shards N]   \
         (run the engine against simulated relays; --chaos: a third misbehave)\n\n",
    );
    out.push_str(
        "grasp-sync keeps a GRASP relay (--own-relay) in sync with every relay its \
         repositories live on (GRASP-02 proactive sync). It learns repositories from \
         the announcements on the own relay and the bootstrap relays, subscribes on every \
         relay those announcements list, and pulls the repositories' events (announcements, \
         state, patches, pull requests, issues and replies) into the own relay, history \
         first and then live, surviving disconnects, relay limits and bad relays.\n\n",
    );
    out.push_str(
        "Options (each is also read from the environment variable shown; a flag beats \
         its variable; use --flag value or --flag=value):\n",
    );
    for flag in FLAGS {
        let (usage, env_note) = match flag.kind {
            Kind::Switch(_) => (format!("--{}", flag.name), "=1/0"),
            Kind::Single(value, _) => (format!("--{} {value}", flag.name), ""),
            Kind::Repeated(value, _) => {
                (format!("--{} {value}...", flag.name), ", comma-separated")
            }
        };
        out.push_str(&format!(
            "  {usage}\n      {}\n      [env {}{env_note}] [default: {}]\n",
            flag.help,
            env_name(flag.name),
            flag.default,
        ));
    }
    out.push_str("  -h, --help\n      Print this help and exit.\n");
    out.push_str("  -V, --version\n      Print the version and exit.\n\n");
    out.push_str(
        "Logging is controlled by RUST_LOG (e.g. RUST_LOG=info, RUST_LOG=grasp_sync=debug).\n",
    );
    out.push_str(
        "SIGTERM, SIGINT and SIGHUP save the state file, flush the outbox (up to \
         --shutdown-timeout-secs) and exit 0; SIGHUP reloads nothing (restart to apply \
         new settings).\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const OWN: &str = "wss://own.example";

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    fn parse_with(args: &[&str], env: &[(&str, &str)]) -> Result<Command, CliError> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse(strings(args), &|key| env.get(key).cloned())
    }

    fn run(args: &[&str], env: &[(&str, &str)]) -> Options {
        match parse_with(args, env) {
            Ok(Command::Run(options)) => options,
            other => panic!("expected Run for {args:?} {env:?}, got {other:?}"),
        }
    }

    /// The one-line error message.
    fn error(args: &[&str], env: &[(&str, &str)]) -> String {
        match parse_with(args, env) {
            Err(e) => {
                assert!(!e.0.contains('\n'), "multi-line error: {e}");
                assert_eq!(e.to_string(), e.0);
                e.0
            }
            Ok(other) => panic!("expected an error for {args:?} {env:?}, got {other:?}"),
        }
    }

    /// Every flag with a non-default value, as (flag, value) pairs.
    const EVERY_FLAG: &[(&str, &str)] = &[
        ("own-relay", "WSS://Own.Example:443/"),
        ("domain", "git.example.com:8443"),
        ("bootstrap", "wss://boot.example/"),
        ("metrics", "127.0.0.1:9100"),
        ("shard", "2/3"),
        ("batch-window-ms", "250"),
        ("backoff-base-secs", "7"),
        ("backoff-max-secs", "600"),
        ("quick-reconnect-secs", "120"),
        ("consolidation-threshold", "12"),
        ("consolidation-timeout-secs", "45"),
        ("disconnect-check-secs", "90"),
        ("daily-min-secs", "1000"),
        ("daily-max-secs", "2000"),
        ("page-limit", "50"),
        ("max-subscriptions", "32"),
        ("max-filters-per-req", "4"),
        ("chunk-size", "7"),
        ("max-relays", "33"),
        ("max-frame-bytes", "4096"),
        ("max-frames-per-sec", "77"),
        ("max-unfinished-bytes", "16777216"),
        ("neg-timeout-secs", "9"),
        ("extra-ca-file", "/etc/ca/private.pem"),
        ("shutdown-timeout-secs", "3"),
        ("seed", "18446744073709551615"),
    ];
    const SWITCHES: &[&str] = &[
        "allow-private-addresses",
        "no-self-subscribe",
        "no-negentropy",
    ];

    /// Checks that every value of [`EVERY_FLAG`] and both switches landed,
    /// in the right field and unit.
    fn check_every_flag(o: &Options) {
        let c = &o.config;
        assert_eq!(c.own_relay, OWN);
        assert_eq!(c.domain.as_deref(), Some("git.example.com:8443"));
        assert_eq!(c.bootstrap, vec!["wss://boot.example".to_owned()]);
        assert_eq!(o.shell.metrics, Some("127.0.0.1:9100".parse().unwrap()));
        assert_eq!(c.shard, Shard::new(2, 3).unwrap());
        assert!(o.shell.allow_private_addresses);
        assert!(!c.self_subscribe);
        assert_eq!(c.batch_window, Duration::from_millis(250));
        assert_eq!(c.backoff_base, Duration::from_secs(7));
        assert_eq!(c.backoff_max, Duration::from_secs(600));
        assert_eq!(c.quick_reconnect, Duration::from_secs(120));
        assert_eq!(c.consolidation_threshold, 12);
        assert_eq!(c.max_subscriptions, 32);
        assert_eq!(c.max_filters_per_req, 4);
        assert_eq!(c.chunk_size, 7);
        assert_eq!(c.consolidation_timeout, Duration::from_secs(45));
        assert_eq!(c.disconnect_check, Duration::from_secs(90));
        assert_eq!(c.daily_min, Duration::from_secs(1000));
        assert_eq!(c.daily_max, Duration::from_secs(2000));
        assert_eq!(c.page_limit, 50);
        assert_eq!(o.shell.max_relays, 33);
        assert_eq!(o.shell.max_frame_bytes, 4096);
        assert_eq!(o.shell.max_frames_per_sec, 77);
        assert_eq!(o.shell.max_unfinished_bytes, 16 << 20);
        assert_eq!(c.neg_timeout, Duration::from_secs(9));
        assert!(!c.negentropy);
        assert_eq!(
            o.shell.extra_ca_files,
            vec![PathBuf::from("/etc/ca/private.pem")]
        );
        assert_eq!(o.shell.shutdown_timeout, Duration::from_secs(3));
        assert_eq!(c.seed, u64::MAX);
        assert!(o.seed_given);
    }

    #[test]
    fn state_file_from_flag_or_variable() {
        let own = ["--own-relay", OWN];
        assert_eq!(run(&own, &[]).shell.state_file, None);
        let by_flag = run(
            &[own[0], own[1], "--state-file", "/var/lib/g/state.json"],
            &[],
        );
        let by_env = run(&own, &[("GRASP_SYNC_STATE_FILE", "/var/lib/g/state.json")]);
        for o in [by_flag, by_env] {
            assert_eq!(
                o.shell.state_file,
                Some(PathBuf::from("/var/lib/g/state.json"))
            );
        }
        assert!(error(&[own[0], own[1], "--state-file", ""], &[]).contains("--state-file"));
    }

    #[test]
    fn defaults_with_only_own_relay() {
        let o = run(&["--own-relay", "WSS://Own.Example/"], &[]);
        assert_eq!(
            format!("{:?}", o.config),
            format!("{:?}", Config::new(OWN)),
            "every engine default kept"
        );
        assert_eq!(o.shell.metrics, None);
        assert!(!o.shell.allow_private_addresses);
        assert_eq!(o.shell.max_relays, 10_000);
        assert!(o.shell.extra_ca_files.is_empty());
        assert_eq!(o.shell.max_frame_bytes, 1_048_576);
        assert_eq!(o.shell.shutdown_timeout, Duration::from_secs(10));
        assert!(!o.seed_given);
    }

    #[test]
    fn every_flag_from_argv_with_separate_values() {
        let mut args = Vec::new();
        for (flag, value) in EVERY_FLAG {
            args.push(format!("--{flag}"));
            args.push(value.to_string());
        }
        args.extend(SWITCHES.iter().map(|s| format!("--{s}")));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        check_every_flag(&run(&args, &[]));
    }

    #[test]
    fn every_flag_from_argv_with_equals() {
        let mut args: Vec<String> = EVERY_FLAG
            .iter()
            .map(|(flag, value)| format!("--{flag}={value}"))
            .collect();
        args.extend(SWITCHES.iter().map(|s| format!("--{s}")));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        check_every_flag(&run(&args, &[]));
    }

    #[test]
    fn every_flag_from_env() {
        let mut env: Vec<(String, String)> = EVERY_FLAG
            .iter()
            .map(|(flag, value)| (env_name(flag), value.to_string()))
            .collect();
        env.extend(SWITCHES.iter().map(|s| (env_name(s), "yes".to_owned())));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        check_every_flag(&run(&[], &env));
    }

    #[test]
    fn env_names_follow_the_flag_names() {
        assert_eq!(env_name("own-relay"), "GRASP_SYNC_OWN_RELAY");
        assert_eq!(env_name("batch-window-ms"), "GRASP_SYNC_BATCH_WINDOW_MS");
        assert_eq!(
            env_name("allow-private-addresses"),
            "GRASP_SYNC_ALLOW_PRIVATE_ADDRESSES"
        );
    }

    #[test]
    fn flag_beats_env() {
        let o = run(
            &[
                "--own-relay",
                OWN,
                "--page-limit=9",
                "--bootstrap",
                "wss://a.example",
            ],
            &[
                ("GRASP_SYNC_OWN_RELAY", "wss://env.example"),
                ("GRASP_SYNC_PAGE_LIMIT", "not even a number"),
                ("GRASP_SYNC_BOOTSTRAP", "wss://b.example,wss://c.example"),
                ("GRASP_SYNC_BATCH_WINDOW_MS", "100"),
            ],
        );
        assert_eq!(o.config.own_relay, OWN);
        assert_eq!(o.config.page_limit, 9);
        assert_eq!(o.config.bootstrap, vec!["wss://a.example".to_owned()]);
        // Flags not given still come from the environment.
        assert_eq!(o.config.batch_window, Duration::from_millis(100));

        let o = run(
            &["--own-relay", OWN, "--allow-private-addresses"],
            &[("GRASP_SYNC_ALLOW_PRIVATE_ADDRESSES", "off")],
        );
        assert!(o.shell.allow_private_addresses);
    }

    #[test]
    fn bootstrap_and_ca_files_repeat() {
        let o = run(
            &[
                "--own-relay",
                OWN,
                "--bootstrap",
                "wss://a.example",
                "--bootstrap=WS://B.example:80/",
                "--extra-ca-file",
                "a.pem",
                "--extra-ca-file=b.pem",
            ],
            &[],
        );
        assert_eq!(
            o.config.bootstrap,
            vec!["wss://a.example".to_owned(), "ws://b.example".to_owned()]
        );
        assert_eq!(
            o.shell.extra_ca_files,
            vec![PathBuf::from("a.pem"), PathBuf::from("b.pem")]
        );
    }

    #[test]
    fn env_lists_are_comma_separated() {
        let o = run(
            &[],
            &[
                ("GRASP_SYNC_OWN_RELAY", OWN),
                (
                    "GRASP_SYNC_BOOTSTRAP",
                    " wss://a.example , wss://b.example/,",
                ),
                ("GRASP_SYNC_EXTRA_CA_FILE", "a.pem,b.pem"),
            ],
        );
        assert_eq!(
            o.config.bootstrap,
            vec!["wss://a.example".to_owned(), "wss://b.example".to_owned()]
        );
        assert_eq!(
            o.shell.extra_ca_files,
            vec![PathBuf::from("a.pem"), PathBuf::from("b.pem")]
        );
    }

    #[test]
    fn env_switches_take_booleans() {
        for on in ["1", "true", "YES", "On"] {
            let o = run(
                &["--own-relay", OWN],
                &[
                    ("GRASP_SYNC_ALLOW_PRIVATE_ADDRESSES", on),
                    ("GRASP_SYNC_NO_SELF_SUBSCRIBE", on),
                ],
            );
            assert!(o.shell.allow_private_addresses, "{on}");
            assert!(!o.config.self_subscribe, "{on}");
        }
        for off in ["0", "false", "No", "OFF"] {
            let o = run(
                &["--own-relay", OWN],
                &[
                    ("GRASP_SYNC_ALLOW_PRIVATE_ADDRESSES", off),
                    ("GRASP_SYNC_NO_SELF_SUBSCRIBE", off),
                ],
            );
            assert!(!o.shell.allow_private_addresses, "{off}");
            assert!(o.config.self_subscribe, "{off}");
        }
    }

    #[test]
    fn empty_env_counts_as_unset() {
        let o = run(
            &["--own-relay", OWN],
            &[
                ("GRASP_SYNC_PAGE_LIMIT", ""),
                ("GRASP_SYNC_ALLOW_PRIVATE_ADDRESSES", " "),
                ("GRASP_SYNC_BOOTSTRAP", ""),
            ],
        );
        assert_eq!(o.config.page_limit, 500);
        assert!(!o.shell.allow_private_addresses);
        assert!(o.config.bootstrap.is_empty());
        assert_eq!(
            error(&[], &[("GRASP_SYNC_OWN_RELAY", "")]),
            "--own-relay is required (or GRASP_SYNC_OWN_RELAY)"
        );
    }

    /// Arguments, environment and the expected error message.
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

    #[test]
    fn errors_are_one_line_and_name_the_culprit() {
        let cases: &[Case] = &[
            (
                &[],
                &[],
                "--own-relay is required (or GRASP_SYNC_OWN_RELAY)",
            ),
            (
                &["--page-limit", "5"],
                &[],
                "--own-relay is required (or GRASP_SYNC_OWN_RELAY)",
            ),
            (
                &["--own-relay", OWN, "--foo"],
                &[],
                "unknown flag --foo (see --help)",
            ),
            (
                &["--own-relay", OWN, "--foo=1"],
                &[],
                "unknown flag --foo (see --help)",
            ),
            (
                &["--own-relay", OWN, "-x"],
                &[],
                "unknown flag -x (see --help)",
            ),
            (
                &["--own-relay", OWN, "extra"],
                &[],
                "unexpected argument \"extra\" (see --help)",
            ),
            (&["--own-relay"], &[], "--own-relay: missing value"),
            (
                &["--own-relay", "--domain", "x"],
                &[],
                "--own-relay: missing value",
            ),
            (
                &["--own-relay", "https://own.example"],
                &[],
                "--own-relay: invalid value \"https://own.example\" (not a ws:// or wss:// URL)",
            ),
            (
                &[],
                &[("GRASP_SYNC_OWN_RELAY", "own.example")],
                "GRASP_SYNC_OWN_RELAY: invalid value \"own.example\" (not a ws:// or wss:// URL)",
            ),
            (
                &["--own-relay", OWN, "--bootstrap", "wss://u:p@b.example"],
                &[],
                "--bootstrap: invalid value \"wss://u:p@b.example\" (URL carries credentials)",
            ),
            (
                &["--own-relay", OWN],
                &[("GRASP_SYNC_BOOTSTRAP", "wss://a.example,nope")],
                "GRASP_SYNC_BOOTSTRAP: invalid value \"nope\" (not a ws:// or wss:// URL)",
            ),
            (
                &["--own-relay", OWN, "--domain="],
                &[],
                "--domain: invalid value \"\" (expected host[:port] without scheme or path)",
            ),
            (
                &["--own-relay", OWN, "--domain", "a b"],
                &[],
                "--domain: invalid value \"a b\" (expected host[:port] without scheme or path)",
            ),
            (
                &["--own-relay", OWN, "--domain", "wss://a.example"],
                &[],
                "--domain: invalid value \"wss://a.example\" (expected host[:port] without scheme or path)",
            ),
            (
                &["--own-relay", OWN, "--shard", "2/2"],
                &[],
                "--shard: invalid value \"2/2\" (expected I/N with 0 <= I < N, e.g. 0/2)",
            ),
            (
                &["--own-relay", OWN, "--metrics", "localhost:9100"],
                &[],
                "--metrics: invalid value \"localhost:9100\" (expected ip:port, e.g. 127.0.0.1:9100)",
            ),
            (
                &["--own-relay", OWN, "--page-limit", "abc"],
                &[],
                "--page-limit: invalid value \"abc\" (expected a positive integer)",
            ),
            (
                &["--own-relay", OWN, "--page-limit", "0"],
                &[],
                "--page-limit: invalid value \"0\" (expected a positive integer)",
            ),
            (
                &["--own-relay", OWN, "--page-limit", "-5"],
                &[],
                "--page-limit: invalid value \"-5\" (expected a positive integer)",
            ),
            (
                &["--own-relay", OWN, "--page-limit", "+5"],
                &[],
                "--page-limit: invalid value \"+5\" (expected a positive integer)",
            ),
            (
                &["--own-relay", OWN, "--backoff-base-secs=1.5"],
                &[],
                "--backoff-base-secs: invalid value \"1.5\" (expected a non-negative integer)",
            ),
            (
                &[
                    "--own-relay",
                    OWN,
                    "--batch-window-ms",
                    "99999999999999999999",
                ],
                &[],
                "--batch-window-ms: invalid value \"99999999999999999999\" (too large)",
            ),
            (
                &["--own-relay", OWN, "--consolidation-threshold", "0"],
                &[],
                "--consolidation-threshold: invalid value \"0\" (expected a positive integer)",
            ),
            (
                &["--own-relay", OWN, "--disconnect-check-secs", "0"],
                &[],
                "--disconnect-check-secs: invalid value \"0\" (expected a positive integer)",
            ),
            (
                &["--own-relay", OWN, "--max-relays", "0"],
                &[],
                "--max-relays: invalid value \"0\" (expected a positive integer)",
            ),
            (
                &["--own-relay", OWN, "--max-frame-bytes", "1023"],
                &[],
                "--max-frame-bytes: invalid value \"1023\" (expected an integer of at least 1024)",
            ),
            (
                &["--own-relay", OWN, "--seed", "18446744073709551616"],
                &[],
                "--seed: invalid value \"18446744073709551616\" (too large)",
            ),
            (
                &["--own-relay", OWN, "--extra-ca-file="],
                &[],
                "--extra-ca-file: invalid value \"\" (expected a file path)",
            ),
            (
                &["--own-relay", OWN],
                &[("GRASP_SYNC_SHUTDOWN_TIMEOUT_SECS", "10s\n")],
                "GRASP_SYNC_SHUTDOWN_TIMEOUT_SECS: invalid value \"10s\\n\" (expected a non-negative integer)",
            ),
            (
                &["--own-relay", OWN],
                &[("GRASP_SYNC_ALLOW_PRIVATE_ADDRESSES", "maybe")],
                "GRASP_SYNC_ALLOW_PRIVATE_ADDRESSES: invalid value \"maybe\" (expected 1/true/yes/on or 0/false/no/off)",
            ),
            (
                &["--own-relay", OWN, "--allow-private-addresses=yes"],
                &[],
                "--allow-private-addresses takes no value",
            ),
            (
                &["--own-relay", OWN, "--page-limit", "1", "--page-limit=2"],
                &[],
                "--page-limit given more than once",
            ),
            (
                &["--own-relay", OWN, "--own-relay", OWN],
                &[],
                "--own-relay given more than once",
            ),
        ];
        for (args, env, expected) in cases {
            assert_eq!(error(args, env), *expected, "args {args:?} env {env:?}");
        }
    }

    #[test]
    fn an_unfinished_cap_below_the_largest_message_is_rejected() {
        assert_eq!(
            error(
                &["--own-relay", OWN, "--max-unfinished-bytes", "1048575"],
                &[]
            ),
            "--max-unfinished-bytes (1048575) is less than --max-frame-bytes (1048576)"
        );
        assert_eq!(
            error(&["--own-relay", OWN, "--max-unfinished-bytes", "1023"], &[]),
            "--max-unfinished-bytes: invalid value \"1023\" (expected an integer of at least 1024)"
        );
        assert_eq!(
            error(
                &["--own-relay", OWN, "--max-unfinished-bytes", "64MiB"],
                &[]
            ),
            "--max-unfinished-bytes: invalid value \"64MiB\" (expected an integer of at least 1024)"
        );
        let o = run(
            &[
                "--own-relay",
                OWN,
                "--max-frame-bytes=4096",
                "--max-unfinished-bytes=4096",
            ],
            &[],
        );
        assert_eq!(o.shell.max_unfinished_bytes, 4096);
        let o = run(&["--own-relay", OWN], &[]);
        assert_eq!(o.shell.max_unfinished_bytes, 64 << 20);
    }

    #[test]
    fn daily_max_below_daily_min_is_rejected() {
        assert_eq!(
            error(
                &[
                    "--own-relay",
                    OWN,
                    "--daily-min-secs",
                    "100",
                    "--daily-max-secs",
                    "99"
                ],
                &[]
            ),
            "--daily-max-secs (99) is less than --daily-min-secs (100)"
        );
        // Raising the minimum past the default maximum names the default.
        assert_eq!(
            error(&["--own-relay", OWN, "--daily-min-secs=100000"], &[]),
            "--daily-max-secs (90000) is less than --daily-min-secs (100000)"
        );
        // Values from the environment name their variables.
        assert_eq!(
            error(
                &["--own-relay", OWN, "--daily-min-secs=100"],
                &[("GRASP_SYNC_DAILY_MAX_SECS", "50")]
            ),
            "GRASP_SYNC_DAILY_MAX_SECS (50) is less than --daily-min-secs (100)"
        );
        let o = run(
            &[
                "--own-relay",
                OWN,
                "--daily-min-secs=100",
                "--daily-max-secs=100",
            ],
            &[],
        );
        assert_eq!(o.config.daily_min, o.config.daily_max);
    }

    #[test]
    fn help_and_version_win_over_everything() {
        for args in [
            &["--help"][..],
            &["-h"],
            &["--bogus", "positional", "--help"],
            &["--page-limit", "abc", "-h"],
            &["--version", "--help"],
        ] {
            assert!(
                matches!(parse_with(args, &[]), Ok(Command::Help)),
                "{args:?}"
            );
        }
        for args in [&["--version"][..], &["-V"], &["--bogus", "-V"]] {
            assert!(
                matches!(parse_with(args, &[]), Ok(Command::Version)),
                "{args:?}"
            );
        }
        assert!(version_text().starts_with("grasp-sync "));
    }

    #[test]
    fn help_lists_every_flag_with_its_variable() {
        let help = help_text();
        assert!(help.starts_with(
            "Usage:\n  grasp-sync --own-relay <ws-url> [--domain <host[:port]>] \
             [--bootstrap <ws-url>]... [--metrics <ip:port>] [--allow-private-addresses] [OPTIONS]\n"
        ));
        assert!(help.contains("grasp-sync demo [--relays N] [--repos M] [--events K] [--seed S]"));
        assert!(help.contains("RUST_LOG=info"));
        for flag in FLAGS {
            assert!(
                help.contains(&format!("  --{}", flag.name)),
                "{}",
                flag.name
            );
            assert!(help.contains(&env_name(flag.name)), "{}", flag.name);
            assert!(help.contains(&format!("[default: {}]", flag.default)));
        }
        assert!(help.contains("-h, --help") && help.contains("-V, --version"));
    }

    /// The defaults the help page shows are the defaults parsing yields:
    /// giving a flag its documented default changes nothing.
    #[test]
    fn help_defaults_match_real_defaults() {
        let plain = run(&["--own-relay", OWN], &[]);
        let mut numeric = 0;
        for flag in FLAGS {
            if flag.name == "seed" || !flag.default.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            numeric += 1;
            let arg = format!("--{}={}", flag.name, flag.default);
            let explicit = run(&["--own-relay", OWN, &arg], &[]);
            assert_eq!(
                format!("{explicit:?}"),
                format!("{plain:?}"),
                "{}",
                flag.name
            );
        }
        assert_eq!(numeric, 19);
    }

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
