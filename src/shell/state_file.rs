//! The state file (`--state-file`): the engine's [`SavedState`] read once
//! at start, written every [`SAVE_EVERY`] and at shutdown.
//!
//! Reading never stops the engine from starting: a missing file is a
//! first start, and a file that cannot be read or decoded (corrupt,
//! truncated, written by a newer version) is logged and set aside as
//! `PATH.bad-<unix time>` for the operator to look at, and the engine
//! starts fresh. Writing is atomic: a temporary file in the same folder,
//! fsynced, renamed over the old one, and the folder fsynced, so a crash
//! leaves the old file or the new one, never half of one.
//!
//! The write runs on the loop thread: the state is bounded (see
//! `saved_state`: about 500 bytes a relay plus 16 a synced item, 2.5 MiB
//! at most), written once every few minutes, and its fsyncs are the only
//! wait, so it costs the loop milliseconds where a thread would cost
//! a copy of the state and a hand-off. Each write logs its size and time.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use log::{info, warn};

use crate::sans_io::saved_state::SavedState;

/// How often the state is written while running.
pub(super) const SAVE_EVERY: Duration = Duration::from_secs(180);

/// Largest state file read: far above what the engine writes, so a file
/// this size is not ours.
const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// The saved state at `path`, or `None` for a fresh start (missing,
/// unreadable or invalid; an invalid file is set aside). `unix_now` names
/// the set-aside copy.
pub(super) fn load(path: &Path, unix_now: u64) -> Option<SavedState> {
    let text = match read_bounded(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            info!("state file {} not found: first start", path.display());
            return None;
        }
        Err(e) => {
            warn!("--state-file {}: {e}; starting fresh", path.display());
            set_aside(path, unix_now);
            return None;
        }
    };
    match SavedState::decode(&text) {
        Ok(state) => {
            info!(
                "state file {}: {} relays saved at {}",
                path.display(),
                state.relays.len(),
                state.saved_at
            );
            Some(state)
        }
        Err(e) => {
            warn!("--state-file {}: {e}; starting fresh", path.display());
            set_aside(path, unix_now);
            None
        }
    }
}

/// Reads the file as UTF-8, refusing one over [`MAX_FILE_BYTES`].
fn read_bounded(path: &Path) -> io::Result<String> {
    let mut bytes = Vec::new();
    File::open(path)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "too large"));
    }
    String::from_utf8(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"))
}

/// Renames a bad file to `PATH.bad-<unix_now>`, so the next save does not
/// overwrite what the operator may want to look at.
fn set_aside(path: &Path, unix_now: u64) {
    let aside = with_suffix(path, &format!(".bad-{unix_now}"));
    match fs::rename(path, &aside) {
        Ok(()) => warn!("set the bad state file aside as {}", aside.display()),
        Err(e) => warn!("could not set {} aside: {e}", path.display()),
    }
}

/// Writes `state` to `path` atomically: temporary file in the same folder,
/// fsync, rename, fsync of the folder. Returns the bytes written.
pub(super) fn save(path: &Path, state: &SavedState) -> io::Result<usize> {
    let tmp = with_suffix(path, ".tmp");
    let text = state.encode();
    let written = write_synced(&tmp, text.as_bytes());
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()?;
    Ok(text.len())
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sans_io::saved_state::SavedRelay;

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("grasp-state-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[test]
    fn saves_atomically_and_loads_back() {
        let dir = dir("ok");
        let path = dir.join("state.json");
        assert_eq!(load(&path, 1), None);
        let state = SavedState {
            saved_at: 5,
            relays: vec![SavedRelay {
                url: "wss://a.example".into(),
                ..SavedRelay::default()
            }],
        };
        save(&path, &state).expect("save");
        save(&path, &state).expect("save over");
        assert_eq!(load(&path, 1), Some(state));
        let names: Vec<_> = fs::read_dir(&dir).expect("dir").collect();
        assert_eq!(names.len(), 1, "no temporary file left");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_files_are_set_aside() {
        let dir = dir("bad");
        let path = dir.join("state.json");
        for (i, bad) in [
            &b"{\"version\":1,\"saved_at\""[..],
            b"\xff\xfe",
            b"{\"version\":99}",
        ]
        .into_iter()
        .enumerate()
        {
            fs::write(&path, bad).expect("write");
            assert_eq!(load(&path, 100 + i as u64), None);
            assert!(!path.exists());
            let aside = dir.join(format!("state.json.bad-{}", 100 + i));
            assert_eq!(fs::read(&aside).expect("set aside"), bad);
        }
        let _ = fs::remove_dir_all(&dir);
    }
}
