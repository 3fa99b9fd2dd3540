//! The NIP-42 key, read from a file: keys live in files, never on the
//! command line, where every user of the machine could read them.

use std::fmt;
use std::path::{Path, PathBuf};

use nostr::prelude::{Keys, SecretKey};

/// Why a key file could not be used.
#[derive(Debug)]
pub enum KeyFileError {
    /// The file could not be read.
    Read(PathBuf, std::io::Error),
    /// The file holds neither an `nsec1...` nor 64 hex digits.
    NotAKey(PathBuf),
}

impl fmt::Display for KeyFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyFileError::Read(path, e) => write!(f, "{}: {e}", path.display()),
            KeyFileError::NotAKey(path) => {
                write!(f, "{}: not an nsec or hex secret key", path.display())
            }
        }
    }
}

impl std::error::Error for KeyFileError {}

/// Reads a NIP-42 key from a file holding an `nsec1...` or 64 hex digits
/// (surrounding whitespace ignored).
pub fn read_key_file(path: &Path) -> Result<Keys, KeyFileError> {
    let text = std::fs::read_to_string(path).map_err(|e| KeyFileError::Read(path.to_owned(), e))?;
    let secret =
        SecretKey::parse(text.trim()).map_err(|_| KeyFileError::NotAKey(path.to_owned()))?;
    Ok(Keys::new(secret))
}
