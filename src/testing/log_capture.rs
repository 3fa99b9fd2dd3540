//! The log lines a test binary wrote, for tests that check what an
//! operator reads. The logger is installed once per test binary (the
//! lib's unit tests, or an integration test); such a binary installs no
//! other, and each test looks only for its own lines.

use std::sync::{Mutex, Once};

use log::{Level, LevelFilter, Log, Metadata, Record};

/// Every line at info or above, as formatted.
static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl Log for Capture {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= Level::Info
    }

    fn log(&self, r: &Record) {
        if self.enabled(r.metadata()) {
            LINES.lock().unwrap().push(r.args().to_string());
        }
    }

    fn flush(&self) {}
}

/// Installs the capture (once) and returns the lines so far that contain
/// `needle`.
pub fn logged(needle: &str) -> Vec<String> {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        log::set_logger(&Capture).unwrap();
        log::set_max_level(LevelFilter::Info);
    });
    let lines = LINES.lock().unwrap();
    lines
        .iter()
        .filter(|l| l.contains(needle))
        .cloned()
        .collect()
}
