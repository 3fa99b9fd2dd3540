//! The release binary as the load runs start it: a child process against
//! an own relay, its metrics on a port, its CPU read from `/proc`.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `GRASP_SYNC_BIN`, or the release binary of this checkout.
pub fn engine_bin() -> String {
    std::env::var("GRASP_SYNC_BIN").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/target/release/grasp-sync").to_owned()
    })
}

/// `bin` started against `own` with its metrics on `port` and `extra` flags.
pub fn start_engine<'a>(
    bin: &str,
    own: &str,
    port: u16,
    extra: impl IntoIterator<Item = &'a str>,
) -> Child {
    Command::new(bin)
        .args(["--own-relay", own, "--allow-private-addresses"])
        .args(extra)
        .args(["--metrics", &format!("127.0.0.1:{port}")])
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{bin}: {e} (cargo build --release first)"))
}

/// The metrics page; empty while the engine does not answer yet.
pub fn metrics_page(port: u16) -> String {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = write!(s, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    let mut page = String::new();
    let _ = s.read_to_string(&mut page);
    page
}

/// A metric's value (summed over its labels matching `label`).
pub fn metric(port: u16, name: &str, label: &str) -> Option<u64> {
    let page = metrics_page(port);
    let sum = page
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    Some(sum as u64)
}

/// CPU seconds process `pid` used so far, all its threads: the sum of
/// `/proc/<pid>/task/*/schedstat` (nanoseconds; `/proc/<pid>/stat` counts
/// ticks of 10 ms, too coarse for an engine that idles).
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    let nanos: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    nanos as f64 / 1e9
}
