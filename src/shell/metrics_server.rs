//! The metrics endpoint (`/metrics`, `/healthz`, `/status`,
//! `/status.json`): accept, read one request head, answer, close.
//!
//! It runs on the loop thread beside the relays, so it does the least an
//! HTTP server can: the head is bounded ([`METRICS_REQUEST_MAX`]) so a
//! client cannot make the loop hold its bytes, nothing is kept alive, and
//! nothing about the engine is looked at before a whole head arrived (a
//! client dripping one byte at a time costs a read, no more). What a head
//! asks is a pure function of its bytes ([`Request::parse`]); the answer's
//! body is a page shared by every connection that asked for it while it
//! is fresh (`metrics_pages`), each connection keeping only its offset
//! into it.
//!
//! Any local browser can reach this port, and a web page can make one ask
//! it under a name of the attacker's that resolves to 127.0.0.1 (DNS
//! rebinding): a `Host` that is not an IP literal, `localhost` or a name
//! the operator allows (`--metrics-host`) is answered `421 Misdirected
//! Request`. Every answer forbids sniffing, caching, and any script or
//! fetch on the page (`Content-Security-Policy`).
//!
//! Each connection also costs a file descriptor, which relay connects need
//! too, so the loop holds at most [`METRICS_CONNECTIONS_MAX`] at once (a new
//! one evicts the oldest, so idle squatters cannot lock a scraper out) and
//! none longer than [`METRICS_DEADLINE`].

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use log::warn;
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};

use crate::shell::status::Window;

/// Largest HTTP request head the metrics endpoint reads.
const METRICS_REQUEST_MAX: usize = 8 * 1024;
/// Metrics connections held at once; a scraper needs one.
pub(crate) const METRICS_CONNECTIONS_MAX: usize = 16;
/// Longest a metrics connection is held, from accept: a scrape over
/// loopback or a LAN takes milliseconds.
pub(crate) const METRICS_DEADLINE: Duration = Duration::from_secs(5);

/// Headers of every answer: no type sniffing, no caching (the numbers are
/// of one moment), and a page that may use its inline style and nothing
/// else (no script, no fetch, no frame, no form).
const SAFETY_HEADERS: &str = "X-Content-Type-Options: nosniff\r\n\
    Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'; \
    base-uri 'none'; form-action 'none'; frame-ancestors 'none'\r\n\
    Cache-Control: no-store\r\n";

/// The listening socket.
pub(crate) struct MetricsListener(TcpListener);

impl MetricsListener {
    /// Listens on `addr`, readable under `token`.
    pub(crate) fn bind(addr: SocketAddr, registry: &Registry, token: Token) -> io::Result<Self> {
        let mut listener = TcpListener::bind(addr)?;
        registry.register(&mut listener, token, Interest::READABLE)?;
        Ok(MetricsListener(listener))
    }

    /// The address it listens on.
    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        self.0.local_addr().ok()
    }

    /// The next waiting client, until none waits (or accepting fails,
    /// logged: the listener stays up for the next readiness).
    pub(crate) fn accept(&self) -> Option<MetricsConn> {
        match self.0.accept() {
            Ok((stream, _)) => Some(MetricsConn::new(stream)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            Err(e) => {
                warn!("metrics accept: {e}");
                None
            }
        }
    }
}

/// The request head read so far, bounded.
#[derive(Debug, Default)]
pub(crate) struct RequestHead(Vec<u8>);

impl RequestHead {
    /// Adds bytes read; false once the head is too large to be a scrape.
    fn extend(&mut self, bytes: &[u8]) -> bool {
        self.0.extend_from_slice(bytes);
        self.0.len() <= METRICS_REQUEST_MAX
    }

    /// True once the blank line ending the head arrived.
    fn is_complete(&self) -> bool {
        self.0.windows(4).any(|w| w == b"\r\n\r\n")
    }
}

/// One client: its request head, then the answer being written.
pub(crate) struct MetricsConn {
    stream: TcpStream,
    request: RequestHead,
    answer: Option<Written>,
}

/// An answer and how much of it the socket took.
struct Written {
    /// The status line and headers.
    head: Vec<u8>,
    /// The body: a page shared with other connections, or none (`HEAD`).
    body: Option<Arc<[u8]>>,
    /// Bytes of `head`, then `body`, written so far.
    written: usize,
}

/// Where reading a request stands.
#[derive(Debug)]
pub(crate) enum Reading {
    /// The client left, or its head is too large to be a scrape: close.
    Gone,
    /// The head is not complete yet.
    Waiting,
    /// The head is complete: answer it ([`MetricsConn::answer`]).
    Complete(Request),
    /// The answer is being written.
    Answered,
}

impl MetricsConn {
    fn new(stream: TcpStream) -> Self {
        MetricsConn {
            stream,
            request: RequestHead::default(),
            answer: None,
        }
    }

    /// The socket, to register with the poll.
    pub(crate) fn socket(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    /// Reads what arrived of the request head (nothing once answered).
    pub(crate) fn read_request(&mut self) -> Reading {
        if self.answer.is_some() {
            return Reading::Answered;
        }
        if !self.read_head() {
            return Reading::Gone;
        }
        match self.request.is_complete() {
            true => Reading::Complete(Request::parse(&self.request.0)),
            false => Reading::Waiting,
        }
    }

    /// Sets the answer to write; the head's bytes are let go.
    pub(crate) fn answer(&mut self, answer: Answer) {
        self.request = RequestHead::default();
        self.answer = Some(Written {
            head: answer.head().into_bytes(),
            body: answer.body,
            written: 0,
        });
    }

    /// Writes what the socket takes of the answer; true once the
    /// connection is finished (all written, or the client gone).
    pub(crate) fn write(&mut self) -> bool {
        let Some(w) = &mut self.answer else {
            return false;
        };
        loop {
            let body = w.body.as_deref().unwrap_or_default();
            let rest = match w.written.checked_sub(w.head.len()) {
                None => &w.head[w.written..],
                Some(at) if at < body.len() => &body[at..],
                Some(_) => return true,
            };
            match self.stream.write(rest) {
                Ok(0) => return true,
                Ok(n) => w.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
    }

    /// Reads the request head; false when the client is gone or too chatty.
    fn read_head(&mut self) -> bool {
        let mut buf = [0u8; 1024];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return false,
                Ok(n) => {
                    if !self.request.extend(&buf[..n]) {
                        return false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }
}

/// What a client can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resource {
    /// `/metrics`: the Prometheus page.
    Metrics,
    /// `/healthz`: 200 or 503 with the reason.
    Health,
    /// `/status`: the operator's page (HTML).
    Status,
    /// `/status.json`: the same as JSON, one page of relays.
    StatusJson,
}

impl Resource {
    fn content_type(self) -> &'static str {
        match self {
            Resource::Metrics => "text/plain; version=0.0.4",
            Resource::Health => "text/plain",
            Resource::Status => "text/html; charset=utf-8",
            Resource::StatusJson => "application/json",
        }
    }
}

/// What one request head asks, parsed once it is complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    /// `GET` (true) or `HEAD` (false); anything else is [`Request::resource`] `None`.
    pub get: bool,
    /// The resource asked for, if it is one of ours and the method fits.
    pub resource: Option<Resource>,
    /// `/status.json`'s `?offset=&limit=`.
    pub window: Window,
    /// Every `Host` header's value (none for an HTTP/1.0 client).
    pub hosts: Vec<String>,
}

impl Request {
    /// Parses a complete head: the request line, the query and the `Host`
    /// headers; what it does not know it ignores.
    pub(crate) fn parse(head: &[u8]) -> Request {
        let mut lines = head
            .split(|&b| b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
        let line = lines.next().unwrap_or_default();
        let mut parts = line.split(|&b| b == b' ');
        let (method, target) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        let (path, query) = match target.iter().position(|&b| b == b'?') {
            Some(at) => (&target[..at], &target[at + 1..]),
            None => (target, &b""[..]),
        };
        let resource = match path {
            b"/metrics" => Some(Resource::Metrics),
            b"/healthz" => Some(Resource::Health),
            b"/status" => Some(Resource::Status),
            b"/status.json" => Some(Resource::StatusJson),
            _ => None,
        };
        let get = method == b"GET";
        let hosts = lines
            .filter_map(|l| {
                let (name, value) = l.split_at(l.iter().position(|&b| b == b':')?);
                name.eq_ignore_ascii_case(b"host")
                    .then(|| String::from_utf8_lossy(&value[1..]).trim().to_owned())
            })
            .collect();
        Request {
            get,
            resource: resource.filter(|_| get || method == b"HEAD"),
            window: window(query),
            hosts,
        }
    }

    /// Whether every `Host` names this machine as the operator allows: an
    /// IP literal, `localhost`, or one of `allowed` (any port).
    pub(crate) fn host_allowed(&self, allowed: &[String]) -> bool {
        self.hosts.iter().all(|h| host_ok(h, allowed))
    }
}

/// `?offset=N&limit=M` (either, in any order; others ignored); what is
/// missing or not a number keeps its default.
fn window(query: &[u8]) -> Window {
    let mut window = Window::default();
    for pair in query.split(|&b| b == b'&') {
        let (name, value) = match pair.iter().position(|&b| b == b'=') {
            Some(at) => (&pair[..at], &pair[at + 1..]),
            None => continue,
        };
        let Some(n) = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()) else {
            continue;
        };
        match name {
            b"offset" => window.offset = n,
            b"limit" => window.limit = n,
            _ => {}
        }
    }
    window
}

/// Whether `host` (a `Host` value: name or address, maybe a port) is an IP
/// literal, `localhost` or an allowed name.
fn host_ok(host: &str, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => {
            return rest.split_once(']').is_some_and(|(ip, port)| {
                let port = port.strip_prefix(':');
                ip.parse::<Ipv6Addr>().is_ok() && (rest.ends_with(']') || port.is_some_and(is_port))
            });
        }
        None => match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return false,
            None => host,
        },
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    name.parse::<Ipv4Addr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// The port after a host's colon: 1 to 5 digits.
fn is_port(port: &str) -> bool {
    (1..=5).contains(&port.len()) && port.bytes().all(|b| b.is_ascii_digit())
}

/// An answer: its status, type and body.
#[derive(Debug)]
pub(crate) struct Answer {
    status: &'static str,
    content_type: &'static str,
    /// The body's length, sent as `Content-Length` when known.
    length: Option<usize>,
    body: Option<Arc<[u8]>>,
}

impl Answer {
    /// `body` (shared) as `resource`'s answer.
    pub(crate) fn page(resource: Resource, body: Arc<[u8]>) -> Answer {
        Answer {
            status: "200 OK",
            content_type: resource.content_type(),
            length: Some(body.len()),
            body: Some(body),
        }
    }

    /// The headers `GET` of `resource` would get, without its body, which
    /// is not built for it (so nor is its length).
    pub(crate) fn head_only(resource: Resource) -> Answer {
        Answer {
            status: "200 OK",
            content_type: resource.content_type(),
            length: None,
            body: None,
        }
    }

    /// A short text answer: an error, or a body too small to share.
    pub(crate) fn text(status: &'static str, body: &str) -> Answer {
        Answer {
            status,
            content_type: "text/plain",
            length: Some(body.len()),
            body: Some(Arc::from(body.as_bytes())),
        }
    }

    /// The same answer without its body (for `HEAD`).
    pub(crate) fn without_body(self) -> Answer {
        Answer { body: None, ..self }
    }

    /// `404 Not Found`.
    pub(crate) fn not_found() -> Answer {
        Answer::text("404 Not Found", "not found\n")
    }

    /// `421 Misdirected Request`: the `Host` is not this machine's.
    pub(crate) fn misdirected() -> Answer {
        Answer::text(
            "421 Misdirected Request",
            "Host is not an IP address, localhost or a --metrics-host name\n",
        )
    }

    /// The status line and headers.
    fn head(&self) -> String {
        let length = self
            .length
            .map_or(String::new(), |n| format!("Content-Length: {n}\r\n"));
        format!(
            "HTTP/1.1 {}\r\nContent-Type: {}\r\n{length}{SAFETY_HEADERS}Connection: close\r\n\r\n",
            self.status, self.content_type
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head_of(answer: &Answer) -> String {
        answer.head()
    }

    #[test]
    fn resources_are_read_off_the_request_line_with_or_without_a_query() {
        for (head, resource) in [
            (
                "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                Some(Resource::Metrics),
            ),
            (
                "GET /metrics?name=x HTTP/1.0\r\n\r\n",
                Some(Resource::Metrics),
            ),
            ("HEAD /healthz HTTP/1.1\r\n\r\n", Some(Resource::Health)),
            ("GET /status HTTP/1.1\r\n\r\n", Some(Resource::Status)),
            (
                "GET /status.json?limit=3 HTTP/1.1\r\n\r\n",
                Some(Resource::StatusJson),
            ),
            ("POST /metrics HTTP/1.1\r\n\r\n", None),
            ("GET / HTTP/1.1\r\n\r\n", None),
            ("GET /metricsx HTTP/1.1\r\n\r\n", None),
            ("GET /healthz/x HTTP/1.1\r\n\r\n", None),
            ("GET /status.jsonx HTTP/1.1\r\n\r\n", None),
            ("", None),
        ] {
            assert_eq!(
                Request::parse(head.as_bytes()).resource,
                resource,
                "{head:?}"
            );
        }
        assert!(!Request::parse(b"HEAD /metrics HTTP/1.1\r\n\r\n").get);
    }

    #[test]
    fn the_query_pages_the_status_json() {
        let w = |q: &str| {
            Request::parse(format!("GET /status.json?{q} HTTP/1.1\r\n\r\n").as_bytes()).window
        };
        assert_eq!(w(""), Window::default());
        assert_eq!(
            w("limit=3&offset=7"),
            Window {
                offset: 7,
                limit: 3
            }
        );
        assert_eq!(
            w("offset=2&x=y"),
            Window {
                offset: 2,
                ..Window::default()
            }
        );
        assert_eq!(w("limit=-1&offset=z"), Window::default());
    }

    #[test]
    fn only_this_machines_names_are_hosts() {
        let allowed = ["metrics.example.net".to_owned()];
        let ok = |h: &str| {
            let head = format!("GET /metrics HTTP/1.1\r\nhost: {h}\r\n\r\n");
            Request::parse(head.as_bytes()).host_allowed(&allowed)
        };
        for good in [
            "127.0.0.1",
            "127.0.0.1:9478",
            "10.1.2.3:80",
            "[::1]",
            "[::1]:9478",
            "localhost",
            "LOCALHOST:9478",
            "localhost.",
            "metrics.example.net:9478",
            "Metrics.Example.Net",
        ] {
            assert!(ok(good), "{good}");
        }
        for bad in [
            "rebind.attacker.example",
            "rebind.attacker.example:9478",
            "127.0.0.1.nip.io",
            "localhost.attacker.example",
            "[::1",
            "[evil]:80",
            "127.0.0.1:x",
            "127.0.0.1:",
            "1.2.3",
            "",
            "metrics.example.net.attacker.example",
        ] {
            assert!(!ok(bad), "{bad}");
        }
        let two = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n";
        assert!(!Request::parse(two).host_allowed(&[]), "every Host counts");
        assert!(Request::parse(b"HEAD /healthz HTTP/1.0\r\n\r\n").host_allowed(&[]));
    }

    #[test]
    fn every_answer_forbids_sniffing_caching_and_scripts() {
        for answer in [
            Answer::page(Resource::Status, Arc::from(&b"<p>x</p>"[..])),
            Answer::not_found(),
            Answer::misdirected(),
            Answer::head_only(Resource::StatusJson),
        ] {
            let head = head_of(&answer);
            assert!(
                head.contains("\r\nX-Content-Type-Options: nosniff\r\n"),
                "{head}"
            );
            assert!(head.contains("\r\nCache-Control: no-store\r\n"), "{head}");
            assert!(
                head.contains(
                    "\r\nContent-Security-Policy: default-src 'none'; style-src 'unsafe-inline';"
                ),
                "{head}"
            );
            assert!(head.ends_with("Connection: close\r\n\r\n"), "{head}");
        }
        let page = head_of(&Answer::page(Resource::Status, Arc::from(&b"12345"[..])));
        assert!(page.starts_with("HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"));
        assert!(page.contains("Content-Length: 5\r\n"));
        let head = head_of(&Answer::head_only(Resource::Metrics));
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            !head.contains("Content-Length"),
            "no body built, so no length: {head}"
        );
        let health = Answer::text("503 Service Unavailable", "own relay down\n").without_body();
        assert!(health.body.is_none());
        let head = head_of(&health);
        assert!(
            head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{head}"
        );
        assert!(
            head.contains("Content-Length: 15\r\n"),
            "GET's length: {head}"
        );
        assert!(
            head_of(&Answer::misdirected()).starts_with("HTTP/1.1 421 Misdirected Request\r\n")
        );
    }

    /// A client and the server's end of its connection, over loopback.
    fn pair() -> (std::net::TcpStream, MetricsConn) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        (client, MetricsConn::new(TcpStream::from_std(server)))
    }

    #[test]
    fn a_dripped_head_is_nothing_until_its_last_byte() {
        let (mut client, mut conn) = pair();
        let head = b"GET /status.json?limit=2 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        for (i, byte) in head.iter().enumerate() {
            client.write_all(&[*byte]).unwrap();
            loop {
                assert!(
                    std::time::Instant::now() < deadline,
                    "byte {i} never arrived"
                );
                let reading = conn.read_request();
                if i + 1 < head.len() {
                    assert!(
                        matches!(reading, Reading::Waiting),
                        "{reading:?} at byte {i}"
                    );
                    if conn.request.0.len() == i + 1 {
                        break;
                    }
                } else if let Reading::Complete(request) = reading {
                    assert_eq!(request.resource, Some(Resource::StatusJson));
                    assert_eq!(request.window.limit, 2);
                    break;
                }
            }
        }
        conn.answer(Answer::not_found());
        assert!(
            matches!(conn.read_request(), Reading::Answered),
            "asked once"
        );
        assert!(conn.write());
    }

    #[test]
    fn a_head_is_complete_at_its_blank_line_and_bounded() {
        let mut head = RequestHead::default();
        assert!(head.extend(b"GET /metrics HTTP/1.1\r\n"));
        assert!(!head.is_complete());
        assert!(head.extend(b"\r\n"));
        assert!(head.is_complete());
        let mut chatty = RequestHead::default();
        assert!(chatty.extend(&[b'a'; METRICS_REQUEST_MAX]));
        assert!(!chatty.extend(b"a"), "one byte over the bound");
    }
}
