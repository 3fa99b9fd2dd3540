//! The state file (`--state-file`): the engine's [`SavedState`] read once
//! at start, written every `ShellOptions::state_save_every` (3 minutes
//! unless `--state-save-secs` says otherwise) and at shutdown.
//!
//! Opening it is checked at start, where a mistake is cheap to fix: a
//! path that is a directory (a slip with systemd's `StateDirectory=`), a
//! folder that is missing or cannot be written, or a file another engine
//! holds (a copied unit, two shards given one path) stops the start with
//! an error naming the path, instead of failing at the first save minutes
//! later or corrupting each other's writes. The hold is a `flock` on
//! `PATH.lock`, kept while the engine runs and released by the kernel
//! however it ends; the file names the holder's pid for the message.
//!
//! Reading never stops the engine from starting: a missing file is a
//! first start, and a file that cannot be read or decoded (corrupt,
//! truncated, too large to be ours, written by a newer version) is logged
//! and set aside as `PATH.bad-<unix time>` for the operator to look at,
//! and the engine starts fresh. Writing is atomic: a temporary file of a
//! name no one else uses, created exclusively in the same folder, fsynced,
//! renamed over the old one, and the folder fsynced, so a crash leaves the
//! old file or the new one, never half of one.
//!
//! The write runs on the loop thread: the state is bounded (see
//! `saved_state`: 5 MiB at most, 2.5 MiB of it relays), written once every
//! few minutes, and its fsyncs are the only wait, so it costs the loop
//! milliseconds where a thread would cost a copy of the state and a
//! hand-off. Each write logs its size and time.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use log::{info, warn};

use crate::sans_io::memory::saved_state::SavedState;

/// Largest state file read: over what the engine writes at most (about
/// 5 MiB, `saved_state`), so a file this size is not ours. Checked before
/// reading, so a huge file costs nothing.
const MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;

/// The state file, held by this engine while it runs.
#[derive(Debug)]
pub(super) struct StateFile {
    path: PathBuf,
    /// `PATH.lock`, locked; closing it (at drop or exit) releases it.
    _lock: File,
    /// Saves so far, for the temporary file's unique name.
    saves: u64,
}

impl StateFile {
    /// Checks `path` and takes the hold on it. Errors are the operator's
    /// to fix before the engine can run: the message says what is wrong.
    pub(super) fn open(path: &Path) -> io::Result<StateFile> {
        if fs::metadata(path).is_ok_and(|m| m.is_dir()) {
            return Err(io::Error::other(
                "is a directory; name a file in it (e.g. DIR/state.json)",
            ));
        }
        let lock_path = with_suffix(path, ".lock");
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot create {} in its folder: {e}", lock_path.display()),
                )
            })?;
        // SAFETY: flock takes any open descriptor; `lock` owns this one
        // for the call's duration.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let mut holder = String::new();
            let _ = lock.read_to_string(&mut holder);
            let holder = holder.trim();
            let who = if holder.is_empty() { "?" } else { holder };
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "in use by another grasp-sync (pid {who}, holding {}); give each engine its own state file",
                    lock_path.display()
                ),
            ));
        }
        lock.set_len(0)?;
        lock.rewind()?;
        write!(lock, "{}", std::process::id())?;
        remove_stale_temporaries(path);
        Ok(StateFile {
            path: path.to_owned(),
            _lock: lock,
            saves: 0,
        })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The saved state, or `None` for a fresh start (missing, unreadable
    /// or invalid; an invalid file is set aside). `unix_now` names the
    /// set-aside copy.
    pub(super) fn load(&self, unix_now: u64) -> Option<SavedState> {
        let path = &self.path;
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

    /// Writes `state` atomically: a temporary file created exclusively in
    /// the same folder, fsync, rename, fsync of the folder. Returns the
    /// bytes written.
    pub(super) fn save(&mut self, state: &SavedState) -> io::Result<usize> {
        self.saves += 1;
        let path = &self.path;
        let tmp = with_suffix(path, &format!(".tmp-{}-{}", std::process::id(), self.saves));
        let text = state.encode();
        let written = write_synced(&tmp, text.as_bytes());
        if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        File::open(folder(path))?.sync_all()?;
        Ok(text.len())
    }
}

/// Reads the file as UTF-8, refusing one over [`MAX_FILE_BYTES`] before
/// reading it (and one that grows past it while read).
fn read_bounded(path: &Path) -> io::Result<String> {
    let file = File::open(path)?;
    let too_large = || io::Error::new(io::ErrorKind::InvalidData, "too large to be ours");
    if file.metadata()?.len() > MAX_FILE_BYTES {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large());
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

/// Temporary files a crashed save left (`PATH.tmp-*`); only the holder of
/// the lock writes them, so none is live.
fn remove_stale_temporaries(path: &Path) {
    let (Some(name), Ok(entries)) = (path.file_name(), fs::read_dir(folder(path))) else {
        return;
    };
    let mut prefix = name.to_owned();
    prefix.push(".tmp-");
    let prefix = prefix.to_string_lossy().into_owned();
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

fn folder(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).create_new(true).open(path)?;
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
    use crate::sans_io::memory::saved_state::SavedRelay;

    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("grasp-state-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn saves_atomically_and_loads_back() {
        let dir = dir("ok");
        let path = dir.join("state.json");
        fs::write(dir.join("state.json.tmp-1-1"), "left by a crash").expect("write");
        let mut file = StateFile::open(&path).expect("open");
        assert_eq!(file.load(1), None);
        let state = SavedState {
            saved_at: 5,
            relays: vec![SavedRelay {
                url: "wss://a.example".into(),
                ..SavedRelay::default()
            }],
            ..SavedState::default()
        };
        file.save(&state).expect("save");
        file.save(&state).expect("save over");
        assert_eq!(file.load(1), Some(state));
        assert_eq!(
            names(&dir),
            ["state.json", "state.json.lock"],
            "no temporary file left, a crash's included"
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_files_are_set_aside() {
        let dir = dir("bad");
        let path = dir.join("state.json");
        let file = StateFile::open(&path).expect("open");
        for (i, bad) in [
            &b"{\"version\":1,\"saved_at\""[..],
            b"\xff\xfe",
            b"{\"version\":99}",
        ]
        .into_iter()
        .enumerate()
        {
            fs::write(&path, bad).expect("write");
            assert_eq!(file.load(100 + i as u64), None);
            assert!(!path.exists());
            let aside = dir.join(format!("state.json.bad-{}", 100 + i));
            assert_eq!(fs::read(&aside).expect("set aside"), bad);
        }
        let _ = fs::remove_dir_all(&dir);
    }

    /// Issue 26: a 60 MiB file was read whole and decoded into a tree.
    #[test]
    fn a_file_larger_than_ours_is_set_aside_unread() {
        let dir = dir("huge");
        let path = dir.join("state.json");
        let huge = File::create(&path).expect("create");
        huge.set_len(60 * 1024 * 1024).expect("sparse 60 MiB");
        let file = StateFile::open(&path).expect("open");
        assert_eq!(file.load(7), None);
        assert!(dir.join("state.json.bad-7").exists());
        let _ = fs::remove_dir_all(&dir);
    }

    /// Issue 26: two engines on one file corrupted each other's writes
    /// (one fixed `PATH.tmp`, no lock). The second is refused at start,
    /// told who holds it; once the first is gone, the file is free.
    #[test]
    fn a_second_engine_on_the_same_file_is_refused() {
        let dir = dir("twice");
        let path = dir.join("state.json");
        let first = StateFile::open(&path).expect("first");
        let err = StateFile::open(&path).expect_err("second");
        let text = err.to_string();
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        assert!(text.contains("state.json.lock"), "{text}");
        drop(first);
        StateFile::open(&path).expect("free again");
        let _ = fs::remove_dir_all(&dir);
    }

    /// Issue 26: a directory was renamed to `PATH.bad-<time>` and a file
    /// written in its place; a folder that cannot be written was found
    /// at the first save, three minutes in.
    #[test]
    fn a_directory_or_a_missing_folder_is_an_error_at_start() {
        let dir = dir("isdir");
        let err = StateFile::open(&dir).expect_err("a directory");
        assert!(err.to_string().contains("is a directory"), "{err}");
        assert!(dir.is_dir(), "left as it was");
        assert_eq!(names(&dir), Vec::<String>::new());
        let err = StateFile::open(&dir.join("missing/state.json")).expect_err("no folder");
        assert!(err.to_string().contains("missing/state.json.lock"), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }
}
