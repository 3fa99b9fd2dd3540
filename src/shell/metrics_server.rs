//! The metrics endpoint: accept, read one request head, answer, close.
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

    /// Reads what arrived and writes what it can; `body` renders the
    /// metrics page, called once the head is complete (and only if it asks
    /// for it). True when the connection is finished and should close.
    pub(crate) fn on_ready(&mut self, body: impl FnOnce() -> String) -> bool {
        if self.response.is_empty() {
            if !self.read_head() {
                return true;
            }
            if !self.request.is_complete() {
                return false;
            }
            self.response = http_response(&self.request.0, body);
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

/// The HTTP response to one request head: the page from `body` for
/// `GET /metrics` (with or without a query), 404 for anything else.
pub(crate) fn http_response(request_head: &[u8], body: impl FnOnce() -> String) -> Vec<u8> {
    let line = request_head
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, path) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let (status, content_type, body) =
        if method == b"GET" && (path == b"/metrics" || path.starts_with(b"/metrics?")) {
            ("200 OK", "text/plain; version=0.0.4", body())
        } else {
            ("404 Not Found", "text/plain", "not found\n".to_owned())
        };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(head: &str) -> String {
        String::from_utf8(http_response(head.as_bytes(), || "m 1\n".to_owned())).unwrap()
    }

    #[test]
    fn get_metrics_is_served_with_or_without_a_query() {
        for head in [
            "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /metrics?name=x HTTP/1.0\r\n\r\n",
        ] {
            let response = answer(head);
            assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
            assert!(response.contains("Content-Length: 4\r\n"));
            assert!(response.contains("Connection: close\r\n"));
            assert!(response.ends_with("\r\n\r\nm 1\n"));
        }
    }

    #[test]
    fn anything_else_is_not_found_and_not_rendered() {
        for head in [
            "POST /metrics HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\n\r\n",
            "GET /metricsx HTTP/1.1\r\n\r\n",
            "",
        ] {
            let response = http_response(head.as_bytes(), || panic!("rendered for {head:?}"));
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
