//! Command line and environment of the `grasp-sync` binary.
//!
//! Every flag is one row of `FLAGS` (`flags`): its name, whether it takes
//! a value, its default as the help page shows it, a one-line meaning and
//! a setter. The environment variable is derived from the name, so the
//! flag, its variable and its help line cannot drift apart.
//!
//! Parsing runs in three short steps:
//! 1. `scan_args` (`argv`) splits argv into the raw values of each flag
//!    (structural errors: unknown flag, missing value, positional
//!    argument);
//! 2. `resolve` (`env`) fills in every flag argv did not give from its
//!    `GRASP_SYNC_*` variable, so a flag always beats its variable;
//! 3. `build` (here) runs the setters in table order and the cross-checks.
//!
//! Each step remembers where a value came from (`--flag` or the variable),
//! so every error names what the user has to fix. Errors are one line: the
//! binary prints them and exits with code 2. Errors of the running binary
//! are named the same way (`startup_error`); `help` and `settings` hold
//! the texts it prints.
//!
//! `grasp-sync demo ...` and `grasp-sync status ...` are separate
//! subcommands the caller routes before calling [`parse`]; they only
//! appear in the help text here.

mod argv;
mod env;
mod flags;
mod help;
mod settings;
mod startup_error;

use std::fmt;

use grasp_sync::{Config, ShellOptions};

use argv::scan_args;
use env::{env_name, resolve};
use flags::{Flag, Kind};
pub use help::{help_text, version_text};
pub use settings::settings_text;
pub use startup_error::describe;

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::PathBuf;
    use std::time::Duration;

    use grasp_sync::Shard;

    pub(super) const OWN: &str = "wss://own.example";

    pub(super) fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    pub(super) fn parse_with(args: &[&str], env: &[(&str, &str)]) -> Result<Command, CliError> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse(strings(args), &|key| env.get(key).cloned())
    }

    pub(super) fn run(args: &[&str], env: &[(&str, &str)]) -> Options {
        match parse_with(args, env) {
            Ok(Command::Run(options)) => options,
            other => panic!("expected Run for {args:?} {env:?}, got {other:?}"),
        }
    }

    /// The one-line error message.
    pub(super) fn error(args: &[&str], env: &[(&str, &str)]) -> String {
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
    pub(super) const EVERY_FLAG: &[(&str, &str)] = &[
        ("own-relay", "WSS://Own.Example:443/"),
        ("domain", "git.example.com:8443"),
        ("bootstrap", "wss://boot.example/"),
        ("metrics", "127.0.0.1:9100"),
        ("metrics-host", "Metrics.Example.net."),
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
    pub(super) const SWITCHES: &[&str] = &[
        "allow-private-addresses",
        "no-self-subscribe",
        "no-negentropy",
    ];

    /// Checks that every value of [`EVERY_FLAG`] and both switches landed,
    /// in the right field and unit.
    pub(super) fn check_every_flag(o: &Options) {
        let c = &o.config;
        assert_eq!(c.own_relay, OWN);
        assert_eq!(c.domain.as_deref(), Some("git.example.com:8443"));
        assert_eq!(c.bootstrap, vec!["wss://boot.example".to_owned()]);
        assert_eq!(o.shell.metrics, Some("127.0.0.1:9100".parse().unwrap()));
        assert_eq!(
            o.shell.metrics_hosts,
            vec!["metrics.example.net".to_owned()]
        );
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
    fn defaults_with_only_own_relay() {
        let o = run(&["--own-relay", "WSS://Own.Example/"], &[]);
        assert_eq!(
            format!("{:?}", o.config),
            format!("{:?}", Config::new(OWN)),
            "every engine default kept"
        );
        assert_eq!(o.shell.metrics, None);
        assert!(o.shell.metrics_hosts.is_empty());
        assert!(!o.shell.allow_private_addresses);
        assert_eq!(o.shell.max_relays, 10_000);
        assert!(o.shell.extra_ca_files.is_empty());
        assert_eq!(o.shell.max_frame_bytes, 1_048_576);
        assert_eq!(o.shell.shutdown_timeout, Duration::from_secs(10));
        assert!(!o.seed_given);
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
                &["--own-relay", OWN, "--metrics-host", "evil.example:80"],
                &[],
                "--metrics-host: invalid value \"evil.example:80\" (expected a host name without port, e.g. metrics.example.net)",
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
}
