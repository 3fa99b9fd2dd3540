//! Running the real shell on a thread for integration tests.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use grasp_sync::testing::relay::TestRelay;
use grasp_sync::{Config, Shell, ShellHandle, ShellOptions, SinkTarget};
use nostr::prelude::*;

/// The engine running on its own thread against `own`.
pub struct Running {
    pub handle: ShellHandle,
    /// Where metrics are served (every test run serves them on an OS-picked port).
    pub metrics: std::net::SocketAddr,
    pub thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl Running {
    pub fn start(own: &TestRelay, tune: impl FnOnce(&mut Config, &mut ShellOptions)) -> Running {
        Running::start_with(&own.url(), tune, |_| SinkTarget::OwnRelay)
    }

    /// [`Running::start`] for own relay `own`, with the sink `make_sink`
    /// makes from the shell's handle (`Shell::with_sink`).
    pub fn start_with(
        own: &str,
        tune: impl FnOnce(&mut Config, &mut ShellOptions),
        make_sink: impl FnOnce(&ShellHandle) -> SinkTarget,
    ) -> Running {
        let mut config = Config::new(own);
        config.batch_window = Duration::from_millis(200);
        config.backoff_base = Duration::from_millis(200);
        let mut opts = ShellOptions {
            allow_private_addresses: true,
            metrics: Some("127.0.0.1:0".parse().expect("valid address")),
            ..ShellOptions::default()
        };
        tune(&mut config, &mut opts);
        let shell = Shell::with_sink(config, opts, make_sink).expect("shell starts");
        let metrics = shell.metrics_addr().expect("metrics bound");
        let (handle, thread) = shell.spawn().expect("thread starts");
        Running {
            handle,
            metrics,
            thread: Some(thread),
        }
    }

    pub fn stop(mut self) {
        self.handle.shutdown();
        let result = self
            .thread
            .take()
            .expect("running")
            .join()
            .expect("no panic");
        result.expect("clean exit");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.handle.shutdown();
            let _ = t.join();
        }
    }
}

impl Running {
    /// The value of one metric line (name with labels), 0 when absent.
    pub fn metric(&self, name: &str) -> u64 {
        let text = http_get(self.metrics, "/metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0)
    }
}

/// Waits until `cond` holds, at most `secs` seconds.
pub fn wait_for(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

pub fn missing(own: &TestRelay, events: &[Event]) -> usize {
    events.iter().filter(|e| !own.has(&e.id)).count()
}

pub fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    http_request(addr, "GET", path)
}

/// The whole response to `HEAD path`.
pub fn http_head(addr: std::net::SocketAddr, path: &str) -> String {
    http_request(addr, "HEAD", path)
}

fn http_request(addr: std::net::SocketAddr, method: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    // Generous: a loaded machine may take seconds to schedule the loop.
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}
