//! One client websocket over a non-blocking socket: TCP connect, optional
//! TLS, the websocket handshake, then text frames — each step resumed on
//! readiness, never blocking the loop.
//!
//! tungstenite does the websocket protocol; this file only sequences the
//! phases and maps tungstenite's non-blocking semantics onto the loop: a
//! frame written while the socket would block stays in tungstenite's buffer
//! and goes out on the next flush, so it is never sent twice. mio readiness
//! is edge-triggered, so reads go on until `WouldBlock` — or until the
//! caller's frame budget is spent, in which case the caller must come back
//! (see [`WsConnection::on_ready`]): a relay that floods faster than we
//! read cannot keep the loop to itself.
//!
//! [`HttpGet`] is the one other client the loop runs: the NIP-11 fetch, a
//! single HTTP GET to the same host and port as the websocket. It shares
//! the connect and TLS phases (so the same roots, private CAs and name
//! checks apply) and leaves what the bytes mean to `info_fetch`.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use log::debug;
use mio::net::TcpStream;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use tungstenite::error::ProtocolError;
use tungstenite::handshake::MidHandshake;
use tungstenite::handshake::client::ClientHandshake;
use tungstenite::protocol::WebSocketConfig;
use tungstenite::{HandshakeError, Message, WebSocket};

use crate::sans_io::info_fetch::{Progress, ResponseReader};
use crate::shell::tls::MaybeTls;

/// The engine's client stream.
pub(crate) type Stream = MaybeTls<ClientConnection, TcpStream>;

/// Where a connection stands.
enum Phase {
    /// TCP connect in flight.
    Connecting(TcpStream),
    /// TLS and websocket handshakes in flight.
    Handshaking(MidHandshake<ClientHandshake<Stream>>),
    /// Websocket open.
    Open(WebSocket<Stream>),
    /// Gone; the slot is about to be freed.
    Closed,
}

/// Bytes queued beyond tungstenite's own write buffer before a peer that
/// does not read is dropped (a slow or hostile relay must not grow memory).
const MAX_BACKLOG_BYTES: usize = 1 << 20;

/// What a connection reports to the loop.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WsEvent {
    /// The websocket handshake completed.
    Open,
    /// A text frame.
    Text(String),
    /// A pong (answer to our ping).
    Pong,
    /// The connection ended; the reason is for the log.
    Closed(String),
    /// The relay broke the websocket protocol (or sent a frame over the
    /// size cap); the connection ended. Counted against the relay.
    Violation(String),
    /// The relay answered the upgrade with this HTTP status (e.g. 429 or
    /// 503: come back later); the connection ended.
    Refused(u16),
}

/// TLS parameters of a `wss://` connection.
pub(crate) struct TlsTarget {
    /// Shared client config (roots, provider).
    pub config: Arc<ClientConfig>,
    /// The name the certificate must carry.
    pub name: ServerName<'static>,
}

/// One client websocket.
pub(crate) struct WsConnection {
    phase: Phase,
    url: String,
    tls: Option<TlsTarget>,
    config: WebSocketConfig,
    /// Frames refused by a full write buffer, sent on the next flush.
    backlog: Vec<Message>,
    /// Bytes in `backlog`; past [`MAX_BACKLOG_BYTES`] the peer is not
    /// reading and the connection is dropped rather than buffered forever.
    backlog_bytes: usize,
    /// Frames the current `on_ready` may still read.
    budget: usize,
}

impl WsConnection {
    /// Starts a non-blocking TCP connect to `addr` for websocket `url`.
    pub(crate) fn connect(
        addr: SocketAddr,
        url: &str,
        tls: Option<TlsTarget>,
        config: WebSocketConfig,
    ) -> io::Result<Self> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(WsConnection {
            phase: Phase::Connecting(stream),
            url: url.to_owned(),
            tls,
            config,
            backlog: Vec::new(),
            backlog_bytes: 0,
            budget: 0,
        })
    }

    /// The socket, for registering with the poll.
    pub(crate) fn socket(&mut self) -> Option<&mut TcpStream> {
        match &mut self.phase {
            Phase::Connecting(s) => Some(s),
            Phase::Handshaking(m) => Some(m.get_mut().get_mut().transport_mut()),
            Phase::Open(ws) => Some(ws.get_mut().transport_mut()),
            Phase::Closed => None,
        }
    }

    /// True once the websocket is open.
    pub(crate) fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Open(_))
    }

    /// Drives the connection after a readiness event; appends what happened.
    /// Reads at most `max_frames` frames; returns true when it stopped
    /// because of that budget, so more may be waiting and the caller must
    /// call again (readiness will not be reported twice).
    pub(crate) fn on_ready(&mut self, out: &mut Vec<WsEvent>, max_frames: usize) -> bool {
        self.budget = max_frames;
        let phase = std::mem::replace(&mut self.phase, Phase::Closed);
        self.phase = match phase {
            Phase::Connecting(tcp) => self.finish_tcp(tcp, out),
            Phase::Handshaking(mid) => self.resume(mid.handshake(), out),
            Phase::Open(ws) => self.pump(ws, out),
            Phase::Closed => Phase::Closed,
        };
        self.budget == 0 && self.is_open()
    }

    /// Queues a text frame; it leaves on this or a later flush.
    pub(crate) fn send_text(&mut self, text: String, out: &mut Vec<WsEvent>) {
        self.send(Message::text(text), out);
    }

    /// Queues a ping.
    pub(crate) fn ping(&mut self, out: &mut Vec<WsEvent>) {
        self.send(Message::Ping(Vec::new().into()), out);
    }

    /// Starts a clean close (close frame, best effort); the caller drops
    /// the connection afterwards.
    pub(crate) fn close(&mut self) {
        if let Phase::Open(ws) = &mut self.phase {
            let _ = ws.close(None);
            let _ = ws.flush();
        }
        self.phase = Phase::Closed;
    }

    fn send(&mut self, message: Message, out: &mut Vec<WsEvent>) {
        let Phase::Open(ws) = &mut self.phase else {
            self.hold(message, out);
            return;
        };
        match ws.write(message) {
            Ok(()) => {}
            Err(tungstenite::Error::WriteBufferFull(m)) => self.hold(*m, out),
            Err(tungstenite::Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                out.push(WsEvent::Closed(format!("write: {e}")));
                self.phase = Phase::Closed;
                return;
            }
        }
        self.flush(out);
    }

    /// Keeps a frame for a later flush, unless the peer has left too much unread.
    fn hold(&mut self, message: Message, out: &mut Vec<WsEvent>) {
        self.backlog_bytes += message.len();
        self.backlog.push(message);
        if self.backlog_bytes > MAX_BACKLOG_BYTES {
            out.push(WsEvent::Closed(format!(
                "peer not reading: {} bytes waiting",
                self.backlog_bytes
            )));
            self.phase = Phase::Closed;
        }
    }

    fn flush(&mut self, out: &mut Vec<WsEvent>) {
        let Phase::Open(ws) = &mut self.phase else {
            return;
        };
        while !self.backlog.is_empty() {
            let message = self.backlog.remove(0);
            self.backlog_bytes -= message.len();
            match ws.write(message) {
                Ok(()) => {}
                Err(tungstenite::Error::WriteBufferFull(m)) => {
                    self.backlog_bytes += m.len();
                    self.backlog.insert(0, *m);
                    break;
                }
                Err(tungstenite::Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    out.push(WsEvent::Closed(format!("write: {e}")));
                    self.phase = Phase::Closed;
                    return;
                }
            }
        }
        match ws.flush() {
            Ok(()) => {}
            Err(tungstenite::Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                out.push(WsEvent::Closed(format!("flush: {e}")));
                self.phase = Phase::Closed;
            }
        }
    }

    /// The TCP connect finished (or failed): start TLS and the websocket handshake.
    fn finish_tcp(&mut self, tcp: TcpStream, out: &mut Vec<WsEvent>) -> Phase {
        let stream = match dial(tcp, self.tls.as_ref()) {
            Dialed::Pending(tcp) => return Phase::Connecting(tcp),
            Dialed::Failed(reason) => {
                out.push(WsEvent::Closed(reason));
                return Phase::Closed;
            }
            Dialed::Ready(stream) => stream,
        };
        let started = ClientHandshake::start(stream, self.request(), Some(self.config));
        match started {
            Ok(mid) => self.resume(mid.handshake(), out),
            Err(e) => {
                out.push(WsEvent::Closed(format!("handshake: {e}")));
                Phase::Closed
            }
        }
    }

    fn request(&self) -> tungstenite::handshake::client::Request {
        use tungstenite::client::IntoClientRequest;
        // The URL was normalized and parsed before a connection was made.
        self.url.as_str().into_client_request().unwrap_or_default()
    }

    fn resume(
        &mut self,
        result: Result<
            (WebSocket<Stream>, tungstenite::handshake::client::Response),
            HandshakeError<ClientHandshake<Stream>>,
        >,
        out: &mut Vec<WsEvent>,
    ) -> Phase {
        match result {
            Ok((ws, _)) => {
                debug!("{}: websocket open", self.url);
                out.push(WsEvent::Open);
                self.phase = Phase::Open(ws);
                self.flush(out);
                // Data may have arrived with the handshake response.
                let phase = std::mem::replace(&mut self.phase, Phase::Closed);
                match phase {
                    Phase::Open(ws) => self.pump(ws, out),
                    other => other,
                }
            }
            Err(HandshakeError::Interrupted(mid)) => Phase::Handshaking(mid),
            Err(HandshakeError::Failure(tungstenite::Error::Http(response))) => {
                out.push(WsEvent::Refused(response.status().as_u16()));
                Phase::Closed
            }
            Err(HandshakeError::Failure(e)) => {
                out.push(WsEvent::Closed(format!("handshake: {e}")));
                Phase::Closed
            }
        }
    }

    /// Reads the frames available (within the budget), then flushes what is waiting.
    fn pump(&mut self, mut ws: WebSocket<Stream>, out: &mut Vec<WsEvent>) -> Phase {
        while self.budget > 0 {
            self.budget -= 1;
            match ws.read() {
                Ok(Message::Text(t)) => out.push(WsEvent::Text(t.as_str().to_owned())),
                Ok(Message::Pong(_)) => out.push(WsEvent::Pong),
                Ok(Message::Binary(_)) | Ok(Message::Ping(_)) | Ok(Message::Frame(_)) => {}
                Ok(Message::Close(frame)) => {
                    let _ = ws.flush();
                    out.push(WsEvent::Closed(format!("closed by relay: {frame:?}")));
                    return Phase::Closed;
                }
                Err(tungstenite::Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Not spent: nothing more is waiting.
                    self.budget += 1;
                    break;
                }
                // A peer that drops the TCP connection without a close frame
                // is rude but common (restarts, crashes): not a violation.
                Err(tungstenite::Error::Protocol(ProtocolError::ResetWithoutClosingHandshake)) => {
                    out.push(WsEvent::Closed(
                        "reset without closing handshake".to_owned(),
                    ));
                    return Phase::Closed;
                }
                Err(
                    e @ (tungstenite::Error::Capacity(_)
                    | tungstenite::Error::Protocol(_)
                    | tungstenite::Error::Utf8(_)),
                ) => {
                    out.push(WsEvent::Violation(format!("read: {e}")));
                    return Phase::Closed;
                }
                Err(e) => {
                    out.push(WsEvent::Closed(format!("read: {e}")));
                    return Phase::Closed;
                }
            }
        }
        self.phase = Phase::Open(ws);
        self.flush(out);
        std::mem::replace(&mut self.phase, Phase::Closed)
    }
}

/// Where a non-blocking TCP connect stands after a readiness event.
enum Dialed {
    /// Still connecting; wait for the next event.
    Pending(TcpStream),
    /// Connected, wrapped in TLS when the URL asked for it (the TLS
    /// handshake itself runs with the first reads and writes).
    Ready(Stream),
    /// Refused, unreachable, or no TLS session could be made.
    Failed(String),
}

/// Finishes a TCP connect started with [`TcpStream::connect`]: the one
/// place both clients learn whether it worked and start TLS.
fn dial(tcp: TcpStream, tls: Option<&TlsTarget>) -> Dialed {
    if let Ok(Some(e)) | Err(e) = tcp.take_error() {
        return Dialed::Failed(format!("connect: {e}"));
    }
    match tcp.peer_addr() {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotConnected => return Dialed::Pending(tcp),
        Err(e) => return Dialed::Failed(format!("connect: {e}")),
    }
    match tls {
        None => Dialed::Ready(MaybeTls::Plain(tcp)),
        Some(t) => match ClientConnection::new(t.config.clone(), t.name.clone()) {
            Ok(conn) => Dialed::Ready(MaybeTls::Tls(Box::new(StreamOwned::new(conn, tcp)))),
            Err(e) => Dialed::Failed(format!("tls: {e}")),
        },
    }
}

/// What an [`HttpGet`] reports after a readiness event.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum GetEvent {
    /// Not done; wait for the next readiness event.
    Pending,
    /// A complete `200` response with this body.
    Done(Vec<u8>),
    /// The fetch failed; the reason is for the log. The connection is over.
    Failed(String),
}

/// Where an [`HttpGet`] stands.
enum GetPhase {
    /// TCP connect in flight.
    Connecting(TcpStream),
    /// TLS handshake, request and response over the stream.
    Exchanging(Box<Stream>),
    /// A result was reported.
    Ended,
}

/// One HTTP GET over a non-blocking socket (the NIP-11 fetch): connect,
/// optional TLS, write the request, read the response until
/// [`ResponseReader`] has it or gives up — each step resumed on readiness,
/// never blocking the loop. The caller owns the deadline.
pub(crate) struct HttpGet {
    phase: GetPhase,
    tls: Option<TlsTarget>,
    request: Vec<u8>,
    /// Request bytes the stream took so far.
    written: usize,
    /// The whole request was flushed onto the socket.
    flushed: bool,
    response: ResponseReader,
}

/// Bytes read from the socket at a time; a NIP-11 document is a few KiB.
const GET_READ_BYTES: usize = 8 * 1024;

impl HttpGet {
    /// Starts a non-blocking TCP connect to `addr` that will send `request`
    /// (see `info_fetch::request`), over TLS when `tls` is given.
    pub(crate) fn connect(
        addr: SocketAddr,
        request: Vec<u8>,
        tls: Option<TlsTarget>,
    ) -> io::Result<Self> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(HttpGet {
            phase: GetPhase::Connecting(stream),
            tls,
            request,
            written: 0,
            flushed: false,
            response: ResponseReader::new(),
        })
    }

    /// The socket, for registering with the poll.
    pub(crate) fn socket(&mut self) -> Option<&mut TcpStream> {
        match &mut self.phase {
            GetPhase::Connecting(s) => Some(s),
            GetPhase::Exchanging(s) => Some(s.transport_mut()),
            GetPhase::Ended => None,
        }
    }

    /// Drives the fetch after a readiness event. Writes and reads go on
    /// until the socket would block (mio readiness is edge-triggered), or
    /// the response is complete or refused. A result other than
    /// [`GetEvent::Pending`] is reported once; the caller then drops this.
    pub(crate) fn on_ready(&mut self) -> GetEvent {
        let phase = std::mem::replace(&mut self.phase, GetPhase::Ended);
        let mut stream = match phase {
            GetPhase::Connecting(tcp) => match dial(tcp, self.tls.as_ref()) {
                Dialed::Pending(tcp) => {
                    self.phase = GetPhase::Connecting(tcp);
                    return GetEvent::Pending;
                }
                Dialed::Failed(reason) => return GetEvent::Failed(reason),
                Dialed::Ready(stream) => Box::new(stream),
            },
            GetPhase::Exchanging(stream) => stream,
            GetPhase::Ended => return GetEvent::Failed("fetch already ended".to_owned()),
        };
        let event = self.exchange(&mut stream);
        if event == GetEvent::Pending {
            self.phase = GetPhase::Exchanging(stream);
        }
        event
    }

    /// Sends what is left of the request, then reads what has arrived.
    fn exchange(&mut self, stream: &mut Stream) -> GetEvent {
        use std::io::{Read, Write};
        let would_block = |e: &io::Error| e.kind() == io::ErrorKind::WouldBlock;
        while self.written < self.request.len() {
            match stream.write(&self.request[self.written..]) {
                Ok(0) => return GetEvent::Failed("connection closed while sending".to_owned()),
                Ok(n) => self.written += n,
                // Over TLS this is also the handshake waiting to read.
                Err(e) if would_block(&e) => return GetEvent::Pending,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return GetEvent::Failed(format!("write: {e}")),
            }
        }
        while !self.flushed {
            match stream.flush() {
                Ok(()) => self.flushed = true,
                Err(e) if would_block(&e) => return GetEvent::Pending,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return GetEvent::Failed(format!("write: {e}")),
            }
        }
        let mut buf = [0u8; GET_READ_BYTES];
        loop {
            let progress = match stream.read(&mut buf) {
                Ok(0) => self.response.finish(),
                Ok(n) => self.response.feed(&buf[..n]),
                Err(e) if would_block(&e) => return GetEvent::Pending,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // TLS closed without close_notify: the framing decides
                // whether the response is complete.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => self.response.finish(),
                Err(e) => return GetEvent::Failed(format!("read: {e}")),
            };
            match progress {
                Progress::More => {}
                Progress::Done(body) => return GetEvent::Done(body),
                Progress::Failed(e) => return GetEvent::Failed(e.to_string()),
            }
        }
    }
}
