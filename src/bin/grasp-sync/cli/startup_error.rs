//! Start-up errors named by their flag: an error the shell returns while
//! starting (a bad own relay URL, an unreadable CA file, a metrics address
//! in use) is printed prefixed with the flag or variable that set the
//! value to fix, as [`parse`](super::parse) read it.

use grasp_sync::{ConfigError, ShellError};

use super::env::env_name;

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
