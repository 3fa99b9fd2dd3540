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
//! Incoming bytes pass through a [`FrameFilter`] before tungstenite sees
//! them: every frame is counted against the read budget, a message over
//! the size cap is skipped (reported, never buffered), and an unfinished
//! message is visible to the loop, which gives it a deadline. Outgoing
//! bytes are counted too, so the write cap covers everything we hold for a
//! peer: tungstenite's buffer and our backlog together.
//!
//! [`HttpGet`] is the one other client the loop runs: the NIP-11 fetch, a
//! single HTTP GET to the same host and port as the websocket. It shares
//! the connect and TLS phases (so the same roots, private CAs and name
//! checks apply) and leaves what the bytes mean to `info_fetch`.

use std::io::{self, Read, Write};
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

use crate::sans_io::frame_filter::FrameFilter;
use crate::sans_io::info_fetch::{Progress, ResponseReader};
use crate::sans_io::time::Time;
use crate::shell::tls::MaybeTls;

/// The engine's client stream.
pub(crate) type Stream = MaybeTls<ClientConnection, TcpStream>;

/// The stream as tungstenite sees it: incoming bytes filtered and counted,
/// outgoing bytes counted.
pub(crate) struct Tapped {
    inner: Stream,
    filter: FrameFilter,
    /// Filtered bytes not yet handed to tungstenite.
    pending: Vec<u8>,
    /// How many of `pending` were handed.
    pending_at: usize,
    /// Bytes the transport took from us.
    written: u64,
}

/// `pending` kept between reads at most; a larger one is freed once
/// drained, so an idle connection holds no read-sized buffer of ours.
const KEEP_PENDING: usize = 256;

impl Tapped {
    fn new(inner: Stream, max_frame: usize) -> Tapped {
        Tapped {
            inner,
            filter: FrameFilter::new(max_frame),
            pending: Vec::new(),
            pending_at: 0,
            written: 0,
        }
    }

    fn transport_mut(&mut self) -> &mut TcpStream {
        self.inner.transport_mut()
    }

    /// Hands over filtered bytes waiting from an earlier read.
    fn drain_pending(&mut self, buf: &mut [u8]) -> usize {
        let n = (self.pending.len() - self.pending_at).min(buf.len());
        buf[..n].copy_from_slice(&self.pending[self.pending_at..self.pending_at + n]);
        self.pending_at += n;
        if self.pending_at == self.pending.len() {
            self.pending_at = 0;
            self.pending.clear();
            if self.pending.capacity() > KEEP_PENDING {
                self.pending = Vec::new();
            }
        }
        n
    }
}

impl Read for Tapped {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.pending_at < self.pending.len() || buf.is_empty() {
                return Ok(self.drain_pending(buf));
            }
            let n = self.inner.read(buf)?;
            if n == 0 {
                return Ok(0);
            }
            // Everything read may have been skipped: read on, never
            // report an end of stream that is not one.
            self.filter.filter(&buf[..n], &mut self.pending);
        }
    }
}

impl Write for Tapped {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Bytes a client frame of `payload` bytes takes on the wire (client frames
/// are masked).
fn client_frame_len(payload: usize) -> u64 {
    let extended = match payload {
        0..=125 => 0,
        126..=65_535 => 2,
        _ => 8,
    };
    (2 + extended + 4 + payload) as u64
}

/// Where a connection stands.
enum Phase {
    /// TCP connect in flight.
    Connecting(TcpStream),
    /// TLS and websocket handshakes in flight.
    Handshaking(MidHandshake<ClientHandshake<Tapped>>),
    /// Websocket open.
    Open(WebSocket<Tapped>),
    /// Gone; the slot is about to be freed.
    Closed,
}

/// What a connection reports to the loop.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WsEvent {
    /// The websocket handshake completed.
    Open,
    /// A text frame.
    Text(String),
    /// The pong answering our last ping (others are not reported).
    Pong,
    /// A data message of this many bytes, over the size cap, was skipped
    /// unread; the connection goes on.
    Oversized(u64),
    /// The connection ended; the reason is for the log.
    Closed(String),
    /// The relay broke the websocket protocol (a fragmented message over
    /// the size cap among it); the connection ended. Counted against the
    /// relay.
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
    /// Frames queued before the websocket opened, sent on the first
    /// flush. A frame refused by tungstenite's full buffer lands here too,
    /// but then the write cap, counting both, is passed and the peer cut.
    backlog: Vec<Message>,
    /// Frame bytes in `backlog`.
    backlog_bytes: u64,
    /// Frame bytes handed to tungstenite so far; less what the transport
    /// took, that is what tungstenite holds for the peer.
    handed: u64,
    /// Budget units (see `FrameFilter::cost`) the current `on_ready` may
    /// still spend.
    budget: u64,
    /// Units the last `on_ready` spent.
    spent: u64,
    /// Since when a message has been unfinished, if one is.
    unfinished_since: Option<Time>,
    /// A deadline timer for the unfinished message is armed.
    deadline_armed: bool,
    /// Pings sent; the last one's number is its payload.
    pings: u64,
    /// Our last ping's payload, until its pong comes. A pong carrying
    /// anything else was not asked for and is not reported.
    ping_out: Option<[u8; 8]>,
}

/// What an unfinished message's deadline timer finds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Deadline {
    /// The message is still unfinished past its deadline: cut the relay.
    Passed,
    /// Another message is unfinished now; its deadline is this.
    Rearm(Time),
    /// Nothing is unfinished.
    Clear,
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
            handed: 0,
            budget: 0,
            spent: 0,
            unfinished_since: None,
            deadline_armed: false,
            pings: 0,
            ping_out: None,
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

    /// Drives the connection after a readiness event at `now`; appends
    /// what happened. Reads frames costing at most about `max_frames` (see
    /// `FrameFilter::cost`: one per frame of any kind, one more per 4 KiB;
    /// bytes already read ahead may overshoot it a little); returns true
    /// when it stopped because of that budget, so more may be waiting and
    /// the caller must call again (readiness will not be reported twice).
    pub(crate) fn on_ready(
        &mut self,
        out: &mut Vec<WsEvent>,
        max_frames: usize,
        now: Time,
    ) -> bool {
        self.budget = max_frames as u64;
        let cost_before = self.cost();
        let phase = std::mem::replace(&mut self.phase, Phase::Closed);
        self.phase = match phase {
            Phase::Connecting(tcp) => self.finish_tcp(tcp, out),
            Phase::Handshaking(mid) => self.resume(mid.handshake(), out),
            Phase::Open(ws) => self.pump(ws, out),
            Phase::Closed => Phase::Closed,
        };
        self.spent = self.cost().saturating_sub(cost_before);
        let unfinished = self.filter().is_some_and(FrameFilter::unfinished);
        self.unfinished_since = match (unfinished, self.unfinished_since) {
            (false, _) => None,
            (true, since) => since.or(Some(now)),
        };
        self.budget == 0 && self.is_open()
    }

    /// Budget units the last [`WsConnection::on_ready`] spent.
    pub(crate) fn spent(&self) -> usize {
        usize::try_from(self.spent).unwrap_or(usize::MAX)
    }

    /// The deadline to arm for an unfinished message `limit` after it
    /// began, when one is unfinished and no timer is armed yet: one timer
    /// per connection at most.
    pub(crate) fn deadline_to_arm(&mut self, limit: std::time::Duration) -> Option<Time> {
        let since = self.unfinished_since.filter(|_| !self.deadline_armed)?;
        self.deadline_armed = true;
        Some(since + limit)
    }

    /// The deadline timer fired at `now`: what it finds. When `excused`
    /// (we were not reading the relay: throttled, or the sink full), the
    /// message's clock starts again: the delay was ours, not the relay's.
    pub(crate) fn check_deadline(
        &mut self,
        now: Time,
        limit: std::time::Duration,
        excused: bool,
    ) -> Deadline {
        self.deadline_armed = false;
        if excused {
            self.unfinished_since = self.unfinished_since.map(|_| now);
        }
        match self.unfinished_since {
            Some(since) if now >= since + limit => Deadline::Passed,
            Some(since) => {
                self.deadline_armed = true;
                Deadline::Rearm(since + limit)
            }
            None => Deadline::Clear,
        }
    }

    /// Bytes tungstenite may hold for the unfinished message.
    pub(crate) fn held(&self) -> u64 {
        self.filter().map_or(0, FrameFilter::held)
    }

    fn filter(&self) -> Option<&FrameFilter> {
        match &self.phase {
            Phase::Open(ws) => Some(&ws.get_ref().filter),
            Phase::Handshaking(m) => Some(&m.get_ref().get_ref().filter),
            _ => None,
        }
    }

    fn cost(&self) -> u64 {
        self.filter().map_or(0, FrameFilter::cost)
    }

    /// Frame bytes we hold for the peer: in tungstenite's buffer (handed
    /// but not taken by the transport) and in the backlog.
    fn unsent(&self) -> u64 {
        let written = match &self.phase {
            Phase::Open(ws) => ws.get_ref().written,
            _ => 0,
        };
        self.handed.saturating_sub(written) + self.backlog_bytes
    }

    /// The write cap: tungstenite's buffer limit, which also bounds the
    /// backlog, so together they never hold more than it.
    fn write_cap(&self) -> u64 {
        self.config.max_write_buffer_size as u64
    }

    /// Queues a text frame; it leaves on this or a later flush.
    pub(crate) fn send_text(&mut self, text: String, out: &mut Vec<WsEvent>) {
        self.send(Message::text(text), out);
    }

    /// Queues a ping carrying a number of its own, so that only its pong
    /// is reported: a relay cannot pass unsolicited pongs off as answers.
    pub(crate) fn ping(&mut self, out: &mut Vec<WsEvent>) {
        self.pings += 1;
        let payload = self.pings.to_be_bytes();
        self.ping_out = Some(payload);
        self.send(Message::Ping(payload.to_vec().into()), out);
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
        let len = client_frame_len(message.len());
        match ws.write(message) {
            Ok(()) => self.handed += len,
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

    /// Keeps a frame for a later flush, unless the peer has left more than
    /// the write cap unread (counting tungstenite's buffer): a slow or
    /// hostile peer must not grow our memory.
    fn hold(&mut self, message: Message, out: &mut Vec<WsEvent>) {
        self.backlog_bytes += client_frame_len(message.len());
        self.backlog.push(message);
        let unsent = self.unsent();
        if unsent > self.write_cap() {
            out.push(WsEvent::Closed(format!(
                "peer not reading: {unsent} bytes waiting"
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
            let len = client_frame_len(message.len());
            self.backlog_bytes -= len;
            match ws.write(message) {
                Ok(()) => self.handed += len,
                Err(tungstenite::Error::WriteBufferFull(m)) => {
                    self.backlog_bytes += len;
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
        let stream = Tapped::new(stream, self.config.max_frame_size.unwrap_or(usize::MAX));
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
            (WebSocket<Tapped>, tungstenite::handshake::client::Response),
            HandshakeError<ClientHandshake<Tapped>>,
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

    /// Reads the frames available (within the budget), then flushes what
    /// is waiting. Each read is charged what the filter saw it cost; one
    /// served from bytes read ahead costs nothing more, and those are few.
    fn pump(&mut self, mut ws: WebSocket<Tapped>, out: &mut Vec<WsEvent>) -> Phase {
        while self.budget > 0 {
            let before = ws.get_ref().filter.cost();
            let read = ws.read();
            let cost = ws.get_ref().filter.cost() - before;
            self.budget = self.budget.saturating_sub(cost);
            let skipped = ws.get_mut().filter.take_skipped();
            out.extend(skipped.into_iter().map(WsEvent::Oversized));
            match read {
                Ok(Message::Text(t)) => out.push(WsEvent::Text(t.as_str().to_owned())),
                Ok(Message::Pong(data)) => {
                    if self.ping_out.is_some_and(|p| data[..] == p[..]) {
                        self.ping_out = None;
                        out.push(WsEvent::Pong);
                    }
                }
                Ok(Message::Binary(_)) | Ok(Message::Ping(_)) | Ok(Message::Frame(_)) => {}
                Ok(Message::Close(frame)) => {
                    let _ = ws.flush();
                    out.push(WsEvent::Closed(format!("closed by relay: {frame:?}")));
                    return Phase::Closed;
                }
                Err(tungstenite::Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Nothing more is waiting; the budget is not spent.
                    self.budget = self.budget.max(1);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_frames_count_their_header_and_mask() {
        assert_eq!(client_frame_len(0), 6);
        assert_eq!(client_frame_len(125), 131);
        assert_eq!(client_frame_len(126), 134);
        assert_eq!(client_frame_len(65_535), 65_543);
        assert_eq!(client_frame_len(65_536), 65_550);
    }
}
