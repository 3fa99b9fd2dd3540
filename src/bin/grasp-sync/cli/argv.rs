//! Flags from argv: the first step of [`parse`](super::parse), which splits
//! the arguments into the raw values of each flag, and its structural
//! errors (unknown flag, missing value, positional argument, a single
//! flag given twice).

use super::flags::{FLAGS, Kind};
use super::{CliError, Given};

/// Splits argv into the raw values of each flag, indexed like `FLAGS`.
pub(super) fn scan_args(args: &[String]) -> Result<Vec<Option<Given>>, CliError> {
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

#[cfg(test)]
mod tests {
    use crate::cli::tests::{EVERY_FLAG, OWN, SWITCHES, check_every_flag, run};
    use std::path::PathBuf;

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
}
