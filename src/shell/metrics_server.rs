//! The metrics endpoint (`/metrics`, `/healthz`, `/status`,
//! `/status.json`): accept, read one request head, answer, close.
//!
//! It runs on the loop thread beside the relays, so it does the least an
//! HTTP server can: the head is bounded ([`METRICS_REQUEST_MAX`]) so a
//! client cannot make the loop hold its bytes, nothing is kept alive, and
//! the page is rendered only once a whole head arrived. What to answer is
//! a pure function of the head ([`http_response`]); the sockets only carry
//! bytes.
//!
//! Each connection also costs a file descriptor, which relay connects need
//! too, so the loop holds at most [`METRICS_CONNECTIONS_MAX`] at once (a new
//! one evicts the oldest, so idle squatters cannot lock a scraper out) and
//! none longer than [`METRICS_DEADLINE`].

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use log::warn;
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};

/// Largest HTTP request head the metrics endpoint reads.
const METRICS_REQUEST_MAX: usize = 8 * 1024;
/// Metrics connections held at once; a scraper needs one.
pub(crate) const METRICS_CONNECTIONS_MAX: usize = 16;
/// Longest a metrics connection is held, from accept: a scrape over
/// loopback or a LAN takes milliseconds.
pub(crate) const METRICS_DEADLINE: Duration = Duration::from_secs(5);

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

/// One client: its request head, then the response being written.
pub(crate) struct MetricsConn {
    stream: TcpStream,
    request: RequestHead,
    response: Vec<u8>,
    written: usize,
}

impl MetricsConn {
    fn new(stream: TcpStream) -> Self {
        MetricsConn {
            stream,
            request: RequestHead::default(),
            response: Vec::new(),
            written: 0,
        }
    }

    /// The socket, to register with the poll.
    pub(crate) fn socket(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    /// Reads what arrived and writes what it can; `page` renders what the
    /// client asked for, called once the head is complete (and only if it
    /// asks for something). True when the connection is finished and
    /// should close.
    pub(crate) fn on_ready(&mut self, page: impl FnOnce(Resource) -> Page) -> bool {
        if self.response.is_empty() {
            if !self.read_head() {
                return true;
            }
            if !self.request.is_complete() {
                return false;
            }
            self.response = http_response(&self.request.0, page);
        }
        while self.written < self.response.len() {
            match self.stream.write(&self.response[self.written..]) {
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(_) => break,
            }
        }
        true
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
    /// `/status.json`: the same as JSON.
    StatusJson,
}

/// A resource's answer: whether it is healthy (503 if not) and its body.
#[derive(Debug)]
pub(crate) struct Page {
    pub ok: bool,
    pub body: String,
}

/// The HTTP response to one request head: `GET` or `HEAD` of `/metrics`,
/// `/healthz`, `/status` or `/status.json` (with or without a query) from
/// `page`, rendered only then; 404 for anything else. `HEAD` gets the
/// headers `GET` would.
pub(crate) fn http_response(request_head: &[u8], page: impl FnOnce(Resource) -> Page) -> Vec<u8> {
    let line = request_head
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, target) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    let resource = match path {
        b"/metrics" => Some(Resource::Metrics),
        b"/healthz" => Some(Resource::Health),
        b"/status" => Some(Resource::Status),
        b"/status.json" => Some(Resource::StatusJson),
        _ => None,
    };
    let head_only = method == b"HEAD";
    let (status, content_type, body) = match resource {
        Some(resource) if head_only || method == b"GET" => {
            let Page { ok, body } = page(resource);
            let status = if ok {
                "200 OK"
            } else {
                "503 Service Unavailable"
            };
            let content_type = match resource {
                Resource::Metrics => "text/plain; version=0.0.4",
                Resource::Health => "text/plain",
                Resource::Status => "text/html; charset=utf-8",
                Resource::StatusJson => "application/json",
            };
            (status, content_type, body)
        }
        _ => ("404 Not Found", "text/plain", "not found\n".to_owned()),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        response.push_str(&body);
    }
    response.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(head: &str) -> String {
        let page = |r| Page {
            ok: r == Resource::Metrics,
            body: format!("{r:?}\n"),
        };
        String::from_utf8(http_response(head.as_bytes(), page)).unwrap()
    }

    #[test]
    fn get_metrics_is_served_with_or_without_a_query() {
        for head in [
            "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /metrics?name=x HTTP/1.0\r\n\r\n",
        ] {
            let response = answer(head);
            assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
            assert!(response.contains("Content-Length: 8\r\n"));
            assert!(response.contains("Connection: close\r\n"));
            assert!(response.ends_with("\r\n\r\nMetrics\n"));
        }
    }

    #[test]
    fn healthz_answers_its_status_and_reason() {
        let response = answer("GET /healthz HTTP/1.1\r\n\r\n");
        assert!(
            response.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{response}"
        );
        assert!(response.ends_with("\r\n\r\nHealth\n"), "{response}");
    }

    #[test]
    fn the_status_page_and_its_json_are_served_with_their_types() {
        for (head, body, content_type) in [
            (
                "GET /status HTTP/1.1\r\n\r\n",
                "Status\n",
                "text/html; charset=utf-8",
            ),
            (
                "GET /status.json HTTP/1.1\r\n\r\n",
                "StatusJson\n",
                "application/json",
            ),
        ] {
            let response = answer(head);
            assert!(response.contains(&format!("Content-Type: {content_type}\r\n")));
            assert!(response.ends_with(&format!("\r\n\r\n{body}")), "{response}");
        }
    }

    #[test]
    fn head_gets_the_headers_without_the_body() {
        for (head, status) in [
            ("HEAD /metrics HTTP/1.1\r\n\r\n", "200 OK"),
            ("HEAD /healthz HTTP/1.1\r\n\r\n", "503 Service Unavailable"),
        ] {
            let response = answer(head);
            assert!(response.starts_with(&format!("HTTP/1.1 {status}\r\n")));
            assert!(response.ends_with("\r\n\r\n"), "no body: {response}");
            assert!(!response.contains("Content-Length: 0\r\n"), "{response}");
        }
    }

    #[test]
    fn anything_else_is_not_found_and_not_rendered() {
        for head in [
            "POST /metrics HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\n\r\n",
            "GET /metricsx HTTP/1.1\r\n\r\n",
            "GET /healthz/x HTTP/1.1\r\n\r\n",
            "GET /status.jsonx HTTP/1.1\r\n\r\n",
            "",
        ] {
            let response = http_response(head.as_bytes(), |_| panic!("rendered for {head:?}"));
            assert!(response.starts_with(b"HTTP/1.1 404 Not Found\r\n"));
        }
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
