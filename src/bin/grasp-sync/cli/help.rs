//! The texts of the informational subcommands: `--help` (generated from
//! `FLAGS`, so the page, the flags and their variables cannot drift
//! apart) and `--version`.

use super::env::env_name;
use super::flags::{FLAGS, Kind};

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
    use crate::cli::Command;
    use crate::cli::tests::{OWN, parse_with, run};

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
        assert_eq!(numeric, 21);
    }
}
