//! NIP-11 fetches and the own relay's `OK` over real sockets: the real
//! shell against in-process test relays, with tiny canned HTTP servers
//! ("fronts") in front of them.
//!
//! A front listens on 127.0.0.1 like a real relay does: an HTTP `GET` gets
//! a canned response (the NIP-11 document, or a broken one), a websocket
//! upgrade is proxied to a [`TestRelay`], and the proxy decodes the
//! client's frames so a test can read the `limit` of every REQ the engine
//! sent. Upgrades wait at a gate the test opens once the metrics show the
//! fetch ended, so every REQ is sent knowing the document (the engine does
//! not make a connection wait for it, which is right for relays and racy
//! for a test).

mod support;

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use grasp_sync::testing::relay::{RelayOptions, TestRelay, server_tls_config};
use grasp_sync::{Config, ShellOptions};
use nostr::prelude::*;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, KeyUsagePurpose};
use rustls::{ServerConfig, ServerConnection, StreamOwned};
use support::running::*;
use support::*;

const OK: &str = "grasp_sync_relay_info_total{result=\"ok\"}";
const FAILED: &str = "grasp_sync_relay_info_total{result=\"failed\"}";
const ADDRESS_REFUSED: &str = "grasp_sync_connection_attempts_total{result=\"address_refused\"}";

/// The own relay's public name in these tests (see [`start`]).
const DOMAIN: &str = "git.own.example";

/// The engine's `limit` per filter when no document lowered it.
const DEFAULT_LIMIT: u64 = 500;

/// How a front answers an HTTP request.
#[derive(Clone)]
enum Reply {
    /// These bytes, then close.
    Bytes(Vec<u8>),
    /// Nothing, until the client gives up and closes.
    Silent,
}

struct Shared {
    reply: Reply,
    /// Proxy websocket upgrades here; `None` refuses them with 503.
    upstream: Option<u16>,
    tls: Option<Arc<ServerConfig>>,
    gate: (Mutex<bool>, Condvar),
    accepted: AtomicUsize,
    /// HTTP request heads received (not upgrades).
    requests: Mutex<Vec<String>>,
    /// Connections of `Reply::Silent` the client closed.
    silent_closed: AtomicUsize,
    /// Text frames the client sent through the proxy.
    frames: Mutex<Vec<String>>,
}

/// A canned HTTP server and websocket proxy on one port.
struct Front {
    shared: Arc<Shared>,
    url: String,
}

impl Front {
    fn start(reply: Reply, upstream: Option<&TestRelay>) -> Front {
        Front::start_with(reply, upstream, None, "127.0.0.1")
    }

    fn start_with(
        reply: Reply,
        upstream: Option<&TestRelay>,
        tls: Option<Arc<ServerConfig>>,
        host: &str,
    ) -> Front {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let scheme = if tls.is_some() { "wss" } else { "ws" };
        let shared = Arc::new(Shared {
            reply,
            upstream: upstream.map(|r| r.port()),
            tls,
            gate: (Mutex::new(false), Condvar::new()),
            accepted: AtomicUsize::new(0),
            requests: Mutex::new(Vec::new()),
            silent_closed: AtomicUsize::new(0),
            frames: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        // The acceptor lives as long as the test process; so do its connections.
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                s.accepted.fetch_add(1, Ordering::SeqCst);
                let s = s.clone();
                thread::spawn(move || serve(stream, &s));
            }
        });
        Front {
            shared,
            url: format!("{scheme}://{host}:{port}"),
        }
    }

    /// Lets websocket upgrades through (they wait until then).
    fn open_gate(&self) {
        let (open, cv) = &self.shared.gate;
        *open.lock().unwrap() = true;
        cv.notify_all();
    }

    fn requests(&self) -> Vec<String> {
        self.shared.requests.lock().unwrap().clone()
    }

    fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// The `limit` of every filter of every REQ sent through the proxy.
    fn req_limits(&self) -> Vec<u64> {
        let frames = self.shared.frames.lock().unwrap();
        let mut limits = Vec::new();
        for text in frames.iter() {
            let Ok(serde_json::Value::Array(msg)) = serde_json::from_str(text) else {
                continue;
            };
            if msg.first().and_then(|v| v.as_str()) != Some("REQ") {
                continue;
            }
            for filter in msg.iter().skip(2) {
                limits.push(
                    filter["limit"]
                        .as_u64()
                        .expect("every REQ filter has a limit"),
                );
            }
        }
        limits
    }
}

fn serve(stream: TcpStream, s: &Shared) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    match &s.tls {
        None => {
            let mut stream = stream;
            let Some((head, extra)) = read_head(&mut stream) else {
                return;
            };
            if is_upgrade(&head) {
                if let Some(port) = s.upstream {
                    return proxy(stream, port, &head, extra, s);
                }
                return refuse_upgrade(&mut stream);
            }
            answer(&mut stream, &head, s);
            if matches!(s.reply, Reply::Bytes(_)) {
                let _ = stream.shutdown(Shutdown::Write);
            }
            drain(&mut stream, s);
        }
        Some(config) => {
            let Ok(conn) = ServerConnection::new(config.clone()) else {
                return;
            };
            let mut tls = StreamOwned::new(conn, stream);
            let Some((head, _)) = read_head(&mut tls) else {
                return;
            };
            if is_upgrade(&head) {
                return refuse_upgrade(&mut tls);
            }
            answer(&mut tls, &head, s);
            if matches!(s.reply, Reply::Bytes(_)) {
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
            drain(&mut tls, s);
        }
    }
}

fn is_upgrade(head: &[u8]) -> bool {
    String::from_utf8_lossy(head)
        .to_ascii_lowercase()
        .contains("upgrade: websocket")
}

fn refuse_upgrade(stream: &mut impl Write) {
    let _ = stream.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n");
}

fn answer(stream: &mut impl Write, head: &[u8], s: &Shared) {
    s.requests
        .lock()
        .unwrap()
        .push(String::from_utf8_lossy(head).into_owned());
    if let Reply::Bytes(bytes) = &s.reply {
        // A client that stopped reading (too large) may reset us: fine.
        let _ = stream.write_all(bytes);
        let _ = stream.flush();
    }
}

/// Reads until the client closes (or the read timeout), so a silent front
/// holds its connection open and learns when the client dropped it.
fn drain(stream: &mut impl Read, s: &Shared) {
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut =>
            {
                return;
            }
            Err(_) => break,
        }
    }
    if matches!(s.reply, Reply::Silent) {
        s.silent_closed.fetch_add(1, Ordering::SeqCst);
    }
}

/// A request head and whatever arrived after it.
fn read_head(stream: &mut impl Read) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let extra = buf.split_off(end + 4);
            return Some((buf, extra));
        }
        if buf.len() > 16 * 1024 {
            return None;
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Waits at the gate, then pipes the websocket to the test relay both
/// ways, decoding the client's text frames on the way.
fn proxy(client: TcpStream, port: u16, head: &[u8], extra: Vec<u8>, s: &Shared) {
    {
        let (open, cv) = &s.gate;
        let guard = open.lock().unwrap();
        let _ = cv
            .wait_timeout_while(guard, Duration::from_secs(60), |open| !*open)
            .unwrap();
    }
    let Ok(mut up) = TcpStream::connect(("127.0.0.1", port)) else {
        return;
    };
    if up.write_all(head).is_err() || up.write_all(&extra).is_err() {
        return;
    }
    let (Ok(mut up_read), Ok(mut client_write)) = (up.try_clone(), client.try_clone()) else {
        return;
    };
    thread::spawn(move || {
        let _ = io::copy(&mut up_read, &mut client_write);
        let _ = client_write.shutdown(Shutdown::Write);
    });
    let mut client = client;
    let _ = client.set_read_timeout(None);
    let mut pending = extra;
    let mut buf = [0u8; 16 * 1024];
    loop {
        match client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if up.write_all(&buf[..n]).is_err() {
                    break;
                }
                pending.extend_from_slice(&buf[..n]);
                let texts = client_texts(&mut pending);
                s.frames.lock().unwrap().extend(texts);
            }
        }
    }
    let _ = up.shutdown(Shutdown::Write);
}

/// Takes the complete client (masked) frames off the front of `buf` and
/// returns the text ones. The engine sends every message as one frame.
fn client_texts(buf: &mut Vec<u8>) -> Vec<String> {
    let mut texts = Vec::new();
    loop {
        if buf.len() < 2 {
            return texts;
        }
        let opcode = buf[0] & 0x0f;
        let masked = buf[1] & 0x80 != 0;
        let (len, mut at) = match buf[1] & 0x7f {
            126 if buf.len() >= 4 => (u16::from_be_bytes([buf[2], buf[3]]) as usize, 4),
            127 if buf.len() >= 10 => {
                let mut n = [0u8; 8];
                n.copy_from_slice(&buf[2..10]);
                (u64::from_be_bytes(n) as usize, 10)
            }
            126 | 127 => return texts,
            n => (n as usize, 2),
        };
        let mask = if masked {
            if buf.len() < at + 4 {
                return texts;
            }
            let m = [buf[at], buf[at + 1], buf[at + 2], buf[at + 3]];
            at += 4;
            m
        } else {
            [0; 4]
        };
        if buf.len() < at + len {
            return texts;
        }
        let payload: Vec<u8> = buf[at..at + len]
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ mask[i % 4])
            .collect();
        buf.drain(..at + len);
        if opcode == 1 {
            texts.push(String::from_utf8_lossy(&payload).into_owned());
        }
    }
}

fn with_length(status: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/nostr+json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// As Go's net/http sends a body whose length a handler did not set.
fn chunked(body: &[u8], size: usize) -> Vec<u8> {
    let mut out =
        b"HTTP/1.1 200 OK\r\nContent-Type: application/nostr+json\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    for c in body.chunks(size) {
        out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// No length: the body ends when the server closes.
fn to_eof(body: &[u8]) -> Vec<u8> {
    let mut out = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n".to_vec();
    out.extend_from_slice(body);
    out
}

fn document(max_limit: u64) -> Vec<u8> {
    format!(
        r#"{{"name":"front","supported_nips":[1,11],"limitation":{{"max_limit":{max_limit},"max_subscriptions":8,"auth_required":false}}}}"#
    )
    .into_bytes()
}

/// The shell against `own`, whose public name is [`DOMAIN`]: clone URLs
/// on that host name the own relay (GRASP-01 acceptance), not one more
/// remote relay to connect and fetch a document from.
fn start(own: &TestRelay, tune: impl FnOnce(&mut Config, &mut ShellOptions)) -> Running {
    Running::start(own, |config, opts| {
        config.domain = Some(DOMAIN.to_owned());
        tune(config, opts);
    })
}

/// A repo announced on the own relay, served by every front (all backed by
/// one test relay holding `comment`).
fn repo_on(own: &TestRelay, upstream: &TestRelay, fronts: &[&Front]) -> Event {
    let owner = keys(1);
    let urls: Vec<&str> = fronts.iter().map(|f| f.url.as_str()).collect();
    own.publish(announcement(&owner, "repo", &urls, T0));
    let comment = repo_comment(&keys(2), &coord(&owner, "repo"), T0, "hello");
    upstream.publish(comment.clone());
    comment
}

#[test]
fn nip11_limits_from_length_chunked_and_eof_bodies_shape_every_req() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let upstream = TestRelay::start(RelayOptions::default()).unwrap();
    let fronts = [
        (
            7,
            Front::start(
                Reply::Bytes(with_length("200 OK", &document(7))),
                Some(&upstream),
            ),
        ),
        (
            9,
            Front::start(Reply::Bytes(chunked(&document(9), 10)), Some(&upstream)),
        ),
        (
            11,
            Front::start(Reply::Bytes(to_eof(&document(11))), Some(&upstream)),
        ),
    ];
    let refs: Vec<&Front> = fronts.iter().map(|(_, f)| f).collect();
    let comment = repo_on(&own, &upstream, &refs);
    let running = start(&own, |_, _| {});
    assert!(
        wait_for(30, || running.metric(OK) == 3),
        "three documents read: ok {} failed {}",
        running.metric(OK),
        running.metric(FAILED)
    );
    for (_, front) in &fronts {
        front.open_gate();
    }
    assert!(wait_for(30, || own.has(&comment.id)), "synced");
    for (max_limit, front) in &fronts {
        assert!(
            wait_for(30, || !front.req_limits().is_empty()),
            "{}: REQs sent",
            front.url
        );
        let limits = front.req_limits();
        assert!(
            limits.iter().all(|l| l <= max_limit) && limits.contains(max_limit),
            "{}: every REQ asks at most the published max_limit {max_limit}: {limits:?}",
            front.url
        );
        let requests = front.requests();
        assert_eq!(requests.len(), 1, "{}: fetched once", front.url);
        let port = front.url.rsplit(':').next().unwrap();
        let request = &requests[0];
        assert!(request.starts_with("GET / HTTP/1.1\r\n"), "{request}");
        assert!(
            request.contains(&format!("\r\nHost: 127.0.0.1:{port}\r\n")),
            "{request}"
        );
        assert!(
            request.contains("\r\nAccept: application/nostr+json\r\n"),
            "{request}"
        );
        assert!(request.contains("\r\nConnection: close\r\n"), "{request}");
    }
    assert_eq!(running.metric(FAILED), 0);
    running.stop();
}

#[test]
fn failed_fetches_answer_once_and_leave_the_default_limits() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let upstream = TestRelay::start(RelayOptions::default()).unwrap();
    let huge_doc = {
        let mut d = br#"{"limitation":{"max_limit":3},"description":""#.to_vec();
        d.extend(std::iter::repeat_n(b'x', 200 * 1024));
        d.extend_from_slice(br#""}"#);
        d
    };
    let replies = [
        ("404", Reply::Bytes(with_length("404 Not Found", b"not found"))),
        ("redirect", Reply::Bytes(
            b"HTTP/1.1 301 Moved Permanently\r\nLocation: https://elsewhere/\r\nContent-Length: 0\r\n\r\n".to_vec(),
        )),
        ("garbage", Reply::Bytes(b"\x16\x03\x01\x00\xff garbage\r\n\r\n\x00\x01".to_vec())),
        ("not json", Reply::Bytes(with_length("200 OK", b"<html>relay</html>"))),
        ("oversized to eof", Reply::Bytes(to_eof(&huge_doc))),
        ("oversized length", Reply::Bytes(with_length("200 OK", &huge_doc))),
        ("oversized chunked", Reply::Bytes(chunked(&huge_doc, 4096))),
        ("truncated", Reply::Bytes({
            let mut r = with_length("200 OK", &document(3));
            r.truncate(r.len() - 5);
            r
        })),
        ("silent", Reply::Silent),
    ];
    let fronts: Vec<(&str, Front)> = replies
        .into_iter()
        .map(|(name, reply)| (name, Front::start(reply, Some(&upstream))))
        .collect();
    let refs: Vec<&Front> = fronts.iter().map(|(_, f)| f).collect();
    let comment = repo_on(&own, &upstream, &refs);
    let started = Instant::now();
    let running = start(&own, |_, _| {});
    let n = fronts.len() as u64;
    assert!(
        wait_for(40, || running.metric(FAILED) == n),
        "every fetch failed: failed {} ok {}",
        running.metric(FAILED),
        running.metric(OK)
    );
    assert!(
        started.elapsed() >= Duration::from_secs(9),
        "the silent relay was given its 10 s"
    );
    for (_, front) in &fronts {
        front.open_gate();
    }
    assert!(
        wait_for(30, || own.has(&comment.id)),
        "syncing never waited for a document"
    );
    for (name, front) in &fronts {
        assert!(
            wait_for(30, || !front.req_limits().is_empty()),
            "{name}: REQs sent"
        );
        let limits = front.req_limits();
        assert!(
            limits.iter().all(|l| *l == DEFAULT_LIMIT),
            "{name}: default limits: {limits:?}"
        );
        assert_eq!(front.requests().len(), 1, "{name}: asked once");
    }
    assert_eq!(running.metric(FAILED), n, "each failure answered once");
    assert_eq!(running.metric(OK), 0);
    let silent = &fronts.last().unwrap().1;
    assert!(
        wait_for(20, || silent.shared.silent_closed.load(Ordering::SeqCst)
            == 1),
        "the silent fetch's socket was closed at its deadline"
    );
    running.stop();
}

#[test]
fn shutdown_with_a_fetch_in_flight_frees_it() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let upstream = TestRelay::start(RelayOptions::default()).unwrap();
    let front = Front::start(Reply::Silent, Some(&upstream));
    repo_on(&own, &upstream, &[&front]);
    let running = start(&own, |_, _| {});
    assert!(
        wait_for(20, || front.requests().len() == 1),
        "fetch in flight"
    );
    let stopping = Instant::now();
    running.stop();
    assert!(
        stopping.elapsed() < Duration::from_secs(9),
        "shutdown did not wait out the fetch deadline: {:?}",
        stopping.elapsed()
    );
    assert!(
        wait_for(20, || front.shared.silent_closed.load(Ordering::SeqCst)
            == 1),
        "the fetch's socket was closed"
    );
}

/// Two relays whose NIP-11 fetches never answer, with one relay allowed:
/// one fetch in flight at most, the other waiting.
struct TwoSilent {
    running: Running,
    fronts: [Front; 2],
    _relays: [TestRelay; 2],
}

impl TwoSilent {
    fn start() -> TwoSilent {
        let own = TestRelay::start(RelayOptions::default()).unwrap();
        let upstream = TestRelay::start(RelayOptions::default()).unwrap();
        let fronts = [
            Front::start(Reply::Silent, Some(&upstream)),
            Front::start(Reply::Silent, Some(&upstream)),
        ];
        repo_on(&own, &upstream, &[&fronts[0], &fronts[1]]);
        let running = start(&own, |_, o| o.max_relays = 1);
        TwoSilent {
            running,
            fronts,
            _relays: [own, upstream],
        }
    }
}

/// Fetches the fronts received.
fn sent(fronts: &[Front]) -> usize {
    fronts.iter().map(|f| f.requests().len()).sum()
}

#[test]
fn fetches_past_the_cap_wait_in_line_and_are_all_made() {
    let TwoSilent {
        running,
        fronts,
        _relays,
    } = TwoSilent::start();
    let skipped = "grasp_sync_relay_info_total{result=\"skipped\"}";
    assert!(wait_for(20, || sent(&fronts) == 1), "one fetch sent");
    assert_eq!(running.metric(FAILED), 0, "in flight");
    // The first is silent until its 10 s deadline; only then is the other
    // one sent.
    assert!(
        wait_for(60, || running.metric(FAILED) >= 1),
        "the first ended at its deadline"
    );
    assert!(
        wait_for(20, || sent(&fronts) == 2),
        "the waiting one was sent"
    );
    assert_eq!(running.metric(skipped), 0, "none skipped");
    running.stop();
}

#[test]
fn shutdown_answers_waiting_fetches_without_making_them() {
    let TwoSilent {
        running,
        fronts,
        _relays,
    } = TwoSilent::start();
    assert!(
        wait_for(20, || sent(&fronts) == 1),
        "one fetch in flight, one waiting"
    );
    let stopping = Instant::now();
    running.stop();
    assert!(
        stopping.elapsed() < Duration::from_secs(9),
        "shutdown waited for neither fetch: {:?}",
        stopping.elapsed()
    );
    assert_eq!(sent(&fronts), 1, "the waiting fetch was never made");
}

/// A CA and a `localhost` leaf it signed: (CA PEM, server config).
fn tls_front_config() -> (String, Arc<ServerConfig>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let config =
        server_tls_config(leaf.pem().as_bytes(), leaf_key.serialize_pem().as_bytes()).unwrap();
    (ca.pem(), config)
}

#[test]
fn https_fetch_trusts_the_configured_private_ca_through_the_dns_pool() {
    let (ca, config) = tls_front_config();
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let reply = Reply::Bytes(chunked(&document(5), 16));
    let front = Front::start_with(reply, None, Some(config), "localhost");
    assert!(front.url.starts_with("wss://localhost:"));
    own.publish(announcement(&keys(1), "repo", &[&front.url], T0));
    let ca_file = ScratchFile::new("nip11", "ca.pem", &ca);
    let running = start(&own, |_, o| o.extra_ca_files = vec![ca_file.path()]);
    assert!(
        wait_for(20, || running.metric(OK) == 1),
        "document read over TLS: ok {} failed {}",
        running.metric(OK),
        running.metric(FAILED)
    );
    let requests = front.requests();
    assert_eq!(requests.len(), 1);
    let port = front.url.rsplit(':').next().unwrap();
    assert!(
        requests[0].contains(&format!("\r\nHost: localhost:{port}\r\n")),
        "{}",
        requests[0]
    );
    running.stop();
}

#[test]
fn https_fetch_refuses_an_untrusted_certificate() {
    let (_ca, config) = tls_front_config();
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let front = Front::start_with(
        Reply::Bytes(to_eof(&document(5))),
        None,
        Some(config),
        "localhost",
    );
    own.publish(announcement(&keys(1), "repo", &[&front.url], T0));
    let running = start(&own, |_, _| {});
    assert!(
        wait_for(20, || running.metric(FAILED) == 1),
        "refused: ok {} failed {}",
        running.metric(OK),
        running.metric(FAILED)
    );
    assert_eq!(running.metric(OK), 0);
    assert!(
        front.requests().is_empty(),
        "no request was sent over an unverified connection"
    );
    running.stop();
}

/// A name other than `localhost` that resolves only to loopback or private
/// addresses (the index refuses `localhost` and IP literals itself, so the
/// shell's guard is only reached through a name like this).
fn private_name() -> Option<String> {
    use std::net::ToSocketAddrs;
    let mut candidates = vec!["ip6-localhost".to_owned(), "ip6-loopback".to_owned()];
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        candidates.insert(0, h.trim().to_owned());
    }
    candidates.into_iter().find(|name| {
        !name.is_empty()
            && name != "localhost"
            && (name.as_str(), 80)
                .to_socket_addrs()
                .is_ok_and(|mut addrs| {
                    let addrs: Vec<_> = addrs.by_ref().collect();
                    !addrs.is_empty()
                        && addrs
                            .iter()
                            .all(|a| !grasp_sync::internal::is_public(a.ip()))
                })
    })
}

#[test]
fn fetch_obeys_the_private_address_guard() {
    let Some(name) = private_name() else {
        eprintln!("skipped: no non-`localhost` name resolves to loopback here");
        return;
    };
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let front = Front::start_with(Reply::Bytes(to_eof(&document(5))), None, None, &name);
    own.publish(announcement(&keys(1), "repo", &[&front.url], T0));
    let running = start(&own, |_, o| o.allow_private_addresses = false);
    assert!(
        wait_for(20, || running.metric(FAILED) == 1),
        "{}: fetch refused: ok {} failed {}",
        front.url,
        running.metric(OK),
        running.metric(FAILED)
    );
    assert!(
        running.metric(ADDRESS_REFUSED) >= 2,
        "both the connect and the fetch were refused by the guard"
    );
    assert_eq!(front.accepted(), 0, "no socket ever reached it");
    running.stop();
}

#[test]
fn own_relay_ok_feeds_a_remotely_found_announcement_into_the_index() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let c = TestRelay::start(RelayOptions::default()).unwrap();
    // GRASP-01: the own relay is listed in `relays` (by URL) and `clone`
    // (by its public name), so the engine passes the announcement on.
    let remote_owner = keys(2);
    let npub = remote_owner.public_key().to_bech32().unwrap();
    let clone = format!("https://{DOMAIN}/{npub}/remote.git");
    let ann = sign(
        &remote_owner,
        30617,
        T0,
        vec![
            tag(&["d", "remote"]),
            tag(&["relays", &own.url(), &c.url()]),
            tag(&["clone", &clone]),
        ],
        "",
    );
    a.publish(ann.clone());
    let repo = coord(&remote_owner, "remote");
    let issue = root(&keys(3), 1621, &[&repo], T0, "issue on C");
    c.publish(issue.clone());
    // No self-subscription: the only way the index can learn the remote
    // announcement is the own relay's `OK` to our `EVENT`.
    let running = start(&own, |config, _| config.self_subscribe = false);
    running
        .handle
        .feed(announcement(&keys(1), "seed", &[&a.url()], T0));
    assert!(
        wait_for(30, || own.has(&ann.id)),
        "announcement synced from A"
    );
    assert!(
        wait_for(30, || own.has(&issue.id)),
        "C, known only from the accepted announcement, was synced"
    );
    running.stop();
}
