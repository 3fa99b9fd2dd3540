//! The metrics port as any local browser or client reaches it (issue 44):
//! a `Host` that is not this machine's is refused (DNS rebinding), every
//! answer forbids sniffing, caching and scripts, `/status.json` comes in
//! pages with the total, a page is rendered once for every client that
//! asks within its second, and `HEAD` renders nothing.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use grasp_sync::status::StatusReport;
use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use support::running::*;
use support::*;

/// The whole answer to `GET path` with `host` as its `Host`.
fn get_as(addr: SocketAddr, path: &str, host: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn body(response: &str) -> &str {
    response.split_once("\r\n\r\n").expect("a body").1
}

/// Relay URLs where nothing listens: connects are refused.
fn dead_urls(n: usize) -> Vec<String> {
    let listeners: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| format!("ws://127.0.0.1:{}", l.local_addr().unwrap().port()))
        .collect()
}

#[test]
fn only_this_machines_names_are_answered_and_answers_are_locked_down() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let running = Running::start(&own, |_, o| {
        o.metrics_hosts = vec!["metrics.example.net".to_owned()];
    });
    let port = running.metrics.port();
    for path in ["/status", "/status.json", "/metrics", "/healthz"] {
        for host in [
            "rebind.attacker.example",
            &format!("rebind.attacker.example:{port}"),
        ] {
            let answer = get_as(running.metrics, path, host);
            assert!(
                answer.starts_with("HTTP/1.1 421 Misdirected Request\r\n"),
                "{path} as {host}: {answer}"
            );
            assert!(
                !answer.contains("grasp_sync") && !answer.contains("relays"),
                "{answer}"
            );
        }
    }
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "metrics.example.net".to_owned(),
    ] {
        let answer = get_as(running.metrics, "/status", &host);
        assert!(
            answer.starts_with("HTTP/1.1 200 OK\r\n"),
            "as {host}: {answer}"
        );
        for header in [
            "X-Content-Type-Options: nosniff\r\n",
            "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline';",
            "Cache-Control: no-store\r\n",
        ] {
            assert!(answer.contains(header), "{header}: {answer}");
        }
    }
    running.stop();
}

/// `grasp_sync_metrics_renders_total{page=...}` once `/metrics` shows
/// it at least `at_least` (renders finish on the loop, after the answer
/// that caused them may already be read).
fn renders_reaching(running: &Running, page: &str, at_least: u64) -> u64 {
    let series = format!("grasp_sync_metrics_renders_total{{page=\"{page}\"}}");
    let mut seen = 0;
    wait_for(30, || {
        seen = running.metric(&series);
        seen >= at_least
    });
    seen
}

#[test]
fn status_json_is_paged_rendered_once_for_many_clients_and_head_renders_nothing() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let dead = dead_urls(5);
    let mut listed: Vec<&str> = dead.iter().map(String::as_str).collect();
    let own_url = own.url();
    listed.push(&own_url);
    own.publish(announcement(&keys(1), "repo", &listed, T0));
    let running = Running::start(&own, |_, _| {});
    let page = |query: &str| -> StatusReport {
        let answer = http_get(running.metrics, &format!("/status.json{query}"));
        serde_json::from_str(body(&answer)).unwrap_or_else(|e| panic!("{e}: {answer}"))
    };
    assert!(
        wait_for(30, || page("").relays_total == 5),
        "the relays are listed"
    );
    let all = page("?limit=1000");
    assert_eq!(all.relays.len(), 5);
    assert_eq!(page("").relays_limit, grasp_sync::status::DEFAULT_LIMIT);
    let part = page("?limit=2&offset=1");
    assert_eq!(
        (part.relays_total, part.relays_offset, part.relays_limit),
        (5, 1, 2)
    );
    assert_eq!(part.relays.len(), 2);
    let mut urls: Vec<String> = [
        page("?limit=2"),
        page("?offset=2&limit=2"),
        page("?offset=4"),
    ]
    .into_iter()
    .flat_map(|p| p.relays.into_iter().map(|r| r.url))
    .collect();
    urls.sort();
    let mut dead_sorted = dead.clone();
    dead_sorted.sort();
    assert_eq!(urls, dead_sorted, "the pages cover every relay once");
    assert_eq!(
        page("?limit=99999").relays_limit,
        grasp_sync::status::MAX_LIMIT
    );

    // Sixteen clients asking at once get one page, rendered once (twice
    // at most, should the second turn between them).
    let before = renders_reaching(&running, "status_json", 1);
    let mut clients: Vec<TcpStream> = (0..16)
        .map(|_| {
            let mut s = TcpStream::connect(running.metrics).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            s.write_all(b"GET /status.json?limit=3 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                .unwrap();
            s
        })
        .collect();
    for s in &mut clients {
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    }
    let after = renders_reaching(&running, "status_json", before + 1);
    assert!(
        (before + 1..=before + 2).contains(&after),
        "{before} -> {after}"
    );

    // HEAD gets the headers and builds no page.
    for path in ["/status.json?limit=4", "/status", "/metrics"] {
        for _ in 0..5 {
            let head = http_head(running.metrics, path);
            assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
            assert!(
                head.ends_with("\r\n\r\n") && !head.contains("Content-Length"),
                "{head}"
            );
        }
    }
    http_get(running.metrics, "/status.json?limit=5");
    let last = renders_reaching(&running, "status_json", after + 1);
    assert_eq!(last, after + 1, "only the GET rendered");
    running.stop();
}
