//! What the integration tests share. The simulated world of the `sim_*`
//! tests (the engine wired to in-memory fake relays, a clock that jumps to
//! the engine's next deadline, signed NIP-34 events from fixed keys) is the
//! crate's one simulation harness, [`grasp_sync::testing::sim`], re-exported
//! here; the modules below are the socket-level extras of the `net_*` and
//! `ext_*` tests.

#![allow(dead_code, unused_imports)]

pub mod client;
pub mod real;
pub mod round_trips;
pub mod running;

pub use grasp_sync::testing::limits::ValueCaps;
pub use grasp_sync::testing::sim::*;

/// A file written in a directory of its own under the temp directory,
/// named after `name` and this process; the directory goes on drop, so a
/// test run leaves nothing behind.
pub struct ScratchFile {
    dir: std::path::PathBuf,
    path: std::path::PathBuf,
}

impl ScratchFile {
    pub fn new(name: &str, file: &str, contents: &str) -> ScratchFile {
        let dir = std::env::temp_dir().join(format!("grasp-sync-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(file);
        std::fs::write(&path, contents).unwrap();
        ScratchFile { dir, path }
    }

    pub fn path(&self) -> std::path::PathBuf {
        self.path.clone()
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
