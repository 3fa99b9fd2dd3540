//! Why the shell could not start: the one error [`Shell::new`] returns.
//!
//! [`Shell::new`]: crate::Shell::new

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::sans_io::engine::ConfigError;

/// Why the shell could not start.
#[derive(Debug)]
pub enum ShellError {
    /// The engine configuration is invalid.
    Config(ConfigError),
    /// A file of [`ShellOptions::extra_ca_files`] could not be used:
    /// unreadable, not PEM, without a certificate, or one TLS refuses.
    ///
    /// [`ShellOptions::extra_ca_files`]: crate::ShellOptions::extra_ca_files
    CaFile {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        error: io::Error,
    },
    /// The state file cannot be used: a directory, in a folder that is
    /// missing or cannot be written, or held by another engine.
    StateFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        error: io::Error,
    },
    /// The metrics listener could not bind [`ShellOptions::metrics`]
    /// (in use, not an address of this host, a privileged port).
    ///
    /// [`ShellOptions::metrics`]: crate::ShellOptions::metrics
    Metrics {
        /// The address asked for.
        addr: SocketAddr,
        /// Why it could not be bound.
        error: io::Error,
    },
    /// The TLS client configuration could not be built.
    Tls(rustls::Error),
    /// A socket or the poll could not be set up.
    Io(io::Error),
}

impl std::fmt::Display for ShellError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShellError::Config(e) => write!(f, "{e}"),
            ShellError::CaFile { path, error } => write!(f, "tls: {}: {error}", path.display()),
            ShellError::StateFile { path, error } => write!(f, "{}: {error}", path.display()),
            ShellError::Metrics { addr, error } => write!(f, "metrics on {addr}: {error}"),
            ShellError::Tls(e) => write!(f, "tls: {e}"),
            ShellError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ShellError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ShellError::Config(e) => Some(e),
            ShellError::CaFile { error, .. } | ShellError::StateFile { error, .. } => {
                error.get_ref().map(|e| e as _)
            }
            ShellError::Metrics { error, .. } => Some(error),
            ShellError::Tls(e) => Some(e),
            ShellError::Io(e) => Some(e),
        }
    }
}

impl From<io::Error> for ShellError {
    fn from(e: io::Error) -> Self {
        ShellError::Io(e)
    }
}
