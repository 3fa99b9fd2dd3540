//! Remote relays for the test and the load run: rust-nostr's LocalRelay
//! from the nostr-sdk 0.45.1 wheel, in Python child processes, as the main
//! crate's tests start them (`tests/pyrelays.py` installs it, pinned, under
//! `target/pyrelays/`; `tests/local_relay.py` runs it), and a plain
//! websocket client to fill them.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nostr_relay_builder::prelude::*;
use tungstenite::Message;

/// The main crate's directory.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The interpreter (and `PYTHONPATH`) `tests/pyrelays.py` installed
/// nostr-sdk for, installing it on first use.
fn python() -> (PathBuf, Option<String>) {
    // The main crate's (`.ci/run` warms it), not this crate's target dir.
    let root = std::env::var_os("PYRELAYS_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target").join("pyrelays"));
    let out = Command::new("python3")
        .arg(repo().join("tests/pyrelays.py"))
        .arg(&root)
        .arg("nostr-sdk")
        .stdin(Stdio::null())
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let field = |key: &str| {
        stdout
            .lines()
            .filter_map(|l| l.strip_prefix(key))
            .next_back()
            .map(str::to_owned)
    };
    assert!(
        out.status.success(),
        "pyrelays.py failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let python = field("python=").expect("pyrelays.py names the interpreter");
    (
        PathBuf::from(python),
        field("pythonpath=").filter(|p| !p.is_empty()),
    )
}

/// A LocalRelay in a child process, killed on drop.
pub struct PyRelay {
    child: Child,
    /// Its URL.
    pub url: String,
}

impl PyRelay {
    /// Starts one on a free port of 127.0.0.1.
    pub fn start() -> PyRelay {
        let (python, pythonpath) = python();
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut command = Command::new(&python);
            command
                .arg(repo().join("tests/local_relay.py"))
                .arg(port.to_string())
                .env("PYTHONNOUSERSITE", "1")
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped());
            match &pythonpath {
                Some(path) => command.env("PYTHONPATH", path),
                None => command.env_remove("PYTHONPATH"),
            };
            let mut child = command.spawn().expect("python runs");
            let stdout = child.stdout.take().expect("piped");
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            if line.starts_with("ws://") {
                return PyRelay {
                    child,
                    url: format!("ws://127.0.0.1:{port}"),
                };
            }
            // Its port was taken meanwhile: another.
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("LocalRelay did not start");
    }

    /// Publishes `events`, waiting for every `OK`.
    pub fn publish(&self, events: &[Event]) {
        publish(&self.url, events);
    }
}

impl Drop for PyRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Publishes `events` to the relay at `url` in windows of 500, each
/// answered before the next (LocalRelay drops a connection sending much
/// more than 6,000 messages a minute: 4,000 per connection).
pub fn publish(url: &str, events: &[Event]) {
    for batch in events.chunks(4_000) {
        let (mut ws, _) = tungstenite::connect(url).expect("relay reachable");
        if let tungstenite::stream::MaybeTlsStream::Plain(tcp) = ws.get_ref() {
            tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        }
        for window in batch.chunks(500) {
            for e in window {
                ws.write(Message::text(ClientMessage::event(e.clone()).as_json()))
                    .unwrap();
            }
            ws.flush().unwrap();
            let mut acked = 0;
            while acked < window.len() {
                if let Message::Text(t) = ws.read().expect("an OK within 30 s")
                    && let Ok(RelayMessage::Ok {
                        status, message, ..
                    }) = RelayMessage::from_json(t.as_str())
                {
                    assert!(status, "{url} refused a test event: {message}");
                    acked += 1;
                }
            }
        }
        let _ = ws.close(None);
    }
}

/// Waits until `cond` holds, at most `secs` seconds.
pub fn wait_for(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

/// The process's peak resident memory (`VmHWM`), in KiB.
pub fn peak_rss_kib() -> u64 {
    status_field("VmHWM:")
}

/// The process's resident memory now (`VmRSS`), in KiB.
pub fn rss_kib() -> u64 {
    status_field("VmRSS:")
}

/// The process's threads now.
pub fn threads() -> u64 {
    status_field("Threads:")
}

fn status_field(name: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}
