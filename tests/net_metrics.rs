//! The metrics port under a flood of idle connections: it holds at most a
//! few at once and none past its deadline, so it cannot eat the process's
//! file descriptors, and a scrape still gets through.

mod support;

use std::io::{ErrorKind, Read};
use std::net::TcpStream;

use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use support::running::*;

/// Connections the test opens and never writes to.
const IDLE: usize = 300;
/// The shell's cap on metrics connections held at once.
const CAP: usize = 16;

/// How many of `streams` the server still holds open: a closed one reads
/// end-of-file (or a reset), an open one would block.
fn still_open(streams: &[TcpStream]) -> usize {
    streams
        .iter()
        .filter(|&(mut s)| {
            matches!(s.read(&mut [0u8; 16]), Err(e) if e.kind() == ErrorKind::WouldBlock)
        })
        .count()
}

#[test]
fn idle_metrics_connections_are_capped_and_closed_by_their_deadline() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let running = Running::start(&own, |_, _| {});
    let streams: Vec<TcpStream> = (0..IDLE)
        .map(|_| {
            let s = TcpStream::connect(running.metrics).unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    assert!(
        wait_for(30, || still_open(&streams) <= CAP),
        "{} of {IDLE} idle connections held, cap {CAP}",
        still_open(&streams)
    );
    let page = http_get(running.metrics, "/metrics");
    assert!(
        page.starts_with("HTTP/1.1 200"),
        "a scrape gets through: {page}"
    );
    assert!(
        wait_for(20, || still_open(&streams) == 0),
        "{} idle connections still held after the deadline",
        still_open(&streams)
    );
    running.stop();
}
