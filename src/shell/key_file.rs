//! The NIP-42 key, read from a file: keys live in files, never on the
//! command line, where every user of the machine could read them.
//!
//! Two mistakes are guarded against. A key file others can read is warned
//! about (the key signs AUTH as the operator). And key material never
//! reaches an error message, which ends up in terminals, logs and bug
//! reports: neither the file's content nor a path argument that looks like
//! a key itself (`--auth-key-file nsec1...`, the key passed by mistake).

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use log::warn;
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
            KeyFileError::Read(path, _) if looks_like_a_key(path) => f.write_str(
                "the path given looks like a secret key itself (not shown); \
                 pass the path of a file holding the key",
            ),
            KeyFileError::Read(path, e) => write!(f, "{}: {e}", path.display()),
            KeyFileError::NotAKey(path) => {
                write!(f, "{}: not an nsec or hex secret key", path.display())
            }
        }
    }
}

impl std::error::Error for KeyFileError {}

/// Reads a NIP-42 key from a file holding an `nsec1...` or 64 hex digits
/// (surrounding whitespace ignored), warning when others may read it.
pub fn read_key_file(path: &Path) -> Result<Keys, KeyFileError> {
    let text = std::fs::read_to_string(path).map_err(|e| KeyFileError::Read(path.to_owned(), e))?;
    let secret =
        SecretKey::parse(text.trim()).map_err(|_| KeyFileError::NotAKey(path.to_owned()))?;
    if let Some(mode) = readable_by_others(path) {
        warn!(
            "{}: key file is readable by group or others (mode {mode:o}); chmod 600 it",
            path.display()
        );
    }
    Ok(Keys::new(secret))
}

/// The file's permission bits if its group or others may read it.
fn readable_by_others(path: &Path) -> Option<u32> {
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o044 != 0).then_some(mode)
}

/// True when `path` holds what could be a secret key: `nsec1` or a run of
/// 64 hex digits anywhere in it.
fn looks_like_a_key(path: &Path) -> bool {
    let text = path.to_string_lossy();
    let mut run = 0;
    text.to_ascii_lowercase().contains("nsec1")
        || text.chars().any(|c| {
            run = if c.is_ascii_hexdigit() { run + 1 } else { 0 };
            run >= 64
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::ToBech32;

    /// A directory of one test's own, removed when the test ends.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(test: &str) -> Scratch {
            let dir =
                std::env::temp_dir().join(format!("grasp-sync-key-{}-{test}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }

        fn file(&self, name: &str, content: &str, mode: u32) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, content).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            path
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_key_passed_as_the_path_is_never_echoed() {
        let keys = Keys::generate();
        let nsec = keys.secret_key().to_bech32().unwrap();
        let hex = keys.secret_key().to_secret_hex();
        for given in [nsec.clone(), hex.clone(), format!("./{hex}\n")] {
            let e = read_key_file(Path::new(&given)).unwrap_err().to_string();
            assert!(!e.contains(&nsec) && !e.contains(&hex), "{e}");
            assert!(e.contains("looks like a secret key"), "{e}");
        }
        let e = read_key_file(Path::new("/nonexistent/key")).unwrap_err();
        assert!(e.to_string().starts_with("/nonexistent/key: "), "{e}");
    }

    #[test]
    fn a_file_that_is_not_a_key_is_not_echoed() {
        let scratch = Scratch::new("garbage");
        let path = scratch.file("garbage", "nsec1notquiteakey\n", 0o600);
        let e = read_key_file(&path).unwrap_err().to_string();
        assert!(e.ends_with("not an nsec or hex secret key"), "{e}");
        assert!(!e.contains("notquiteakey"), "{e}");
    }

    #[test]
    fn group_or_world_readable_key_files_are_noticed() {
        let hex = Keys::generate().secret_key().to_secret_hex();
        let scratch = Scratch::new("modes");
        for (mode, loose) in [(0o600, false), (0o400, false), (0o640, true), (0o604, true)] {
            let path = scratch.file(&format!("key{mode:o}"), &hex, mode);
            assert_eq!(readable_by_others(&path).is_some(), loose, "{mode:o}");
            assert!(read_key_file(&path).is_ok());
        }
    }
}
