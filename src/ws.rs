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

use crate::tls::MaybeTls;

/// The engine's client stream.
pub type Stream = MaybeTls<ClientConnection, TcpStream>;

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
pub enum WsEvent {
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
pub struct TlsTarget {
    /// Shared client config (roots, provider).
    pub config: Arc<ClientConfig>,
    /// The name the certificate must carry.
    pub name: ServerName<'static>,
}

/// One client websocket.
pub struct WsConnection {
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
    pub fn connect(
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
    pub fn socket(&mut self) -> Option<&mut TcpStream> {
        match &mut self.phase {
            Phase::Connecting(s) => Some(s),
            Phase::Handshaking(m) => Some(m.get_mut().get_mut().transport_mut()),
            Phase::Open(ws) => Some(ws.get_mut().transport_mut()),
            Phase::Closed => None,
        }
    }

    /// True once the websocket is open.
    pub fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Open(_))
    }

    /// Drives the connection after a readiness event; appends what happened.
    /// Reads at most `max_frames` frames; returns true when it stopped
    /// because of that budget, so more may be waiting and the caller must
    /// call again (readiness will not be reported twice).
    pub fn on_ready(&mut self, out: &mut Vec<WsEvent>, max_frames: usize) -> bool {
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
    pub fn send_text(&mut self, text: String, out: &mut Vec<WsEvent>) {
        self.send(Message::text(text), out);
    }

    /// Queues a ping.
    pub fn ping(&mut self, out: &mut Vec<WsEvent>) {
        self.send(Message::Ping(Vec::new().into()), out);
    }

    /// Starts a clean close (close frame, best effort); the caller drops
    /// the connection afterwards.
    pub fn close(&mut self) {
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
        if let Ok(Some(e)) | Err(e) = tcp.take_error() {
            out.push(WsEvent::Closed(format!("connect: {e}")));
            return Phase::Closed;
        }
        match tcp.peer_addr() {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotConnected => return Phase::Connecting(tcp),
            Err(e) => {
                out.push(WsEvent::Closed(format!("connect: {e}")));
                return Phase::Closed;
            }
        }
        let stream = match &self.tls {
            None => MaybeTls::Plain(tcp),
            Some(t) => match ClientConnection::new(t.config.clone(), t.name.clone()) {
                Ok(conn) => MaybeTls::Tls(Box::new(StreamOwned::new(conn, tcp))),
                Err(e) => {
                    out.push(WsEvent::Closed(format!("tls: {e}")));
                    return Phase::Closed;
                }
            },
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
