//! Config from the environment: every flag argv did not give is read from
//! its `GRASP_SYNC_*` variable (the second step of [`parse`](super::parse)),
//! so a flag always beats its variable, and each value remembers which of
//! the two it came from for its errors.

use super::flags::{FLAGS, Kind};
use super::{CliError, Given, Input};

/// Prefix of every environment variable; the rest is the flag name.
const ENV_PREFIX: &str = "GRASP_SYNC_";

/// The environment variable of a flag: `--page-limit` reads `GRASP_SYNC_PAGE_LIMIT`.
pub(super) fn env_name(flag: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        flag.to_ascii_uppercase().replace('-', "_")
    )
}

/// Takes each flag from argv if given there, else from its variable.
///
/// A variable that is empty (or blank) counts as unset, since env files and
/// compose files often define a variable empty to mean "not set".
pub(super) fn resolve(
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

/// A boolean variable: 1/true/yes/on or 0/false/no/off, any case.
fn boolean(raw: &str) -> Option<bool> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::tests::{EVERY_FLAG, OWN, SWITCHES, check_every_flag, error, run};
    use std::path::PathBuf;
    use std::time::Duration;

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
}
