//! One client websocket over a non-blocking socket: TCP connect, optional
//! TLS, the websocket handshake, then frames — each step resumed on
//! readiness, never blocking the loop.
//!
//! tungstenite writes the upgrade request and parses its response
//! (`ws_upgrade`); the bytes, and after the upgrade the frames, are ours:
//! every socket is read into one loop-wide buffer (the caller's), parsed by a
//! [`WsReader`] that keeps only an unfinished message per connection, and
//! every frame we send is written to the socket at once by a [`WsWriter`]
//! that keeps only what the socket did not take. So an idle connection
//! holds no read or write buffer of its own (tungstenite's would each stay
//! at the largest frame the connection ever carried).
//!
//! mio readiness is edge-triggered, so reads go on until `WouldBlock` — or
//! until the caller's frame budget is spent, in which case the caller must
//! come back (see [`WsConnection::on_ready`]): a relay that floods faster
//! than we read cannot keep the loop to itself. Every frame is counted
//! against that budget, and so is every TLS record (or 4 KiB of them),
//! whichever costs more: records that decrypt to one byte, or to nothing
//! (session tickets), cost what they cost us to process, and one TLS read
//! that yields nothing comes back after a bounded share of work
//! (`Interrupted`, see `tls_stream`). A message over the size cap is
//! skipped (reported, never buffered), and an unfinished message is
//! visible to the loop, which gives it a deadline. Outgoing bytes not yet taken by the socket
//! count against the write cap.
//!
//! [`HttpGet`] is the one other client the loop runs: the NIP-11 fetch, a
//! single HTTP GET to the same host and port as the websocket. It shares
//! the connect and TLS phases (so the same roots, private CAs and name
//! checks apply) and leaves what the bytes mean to `info_fetch`.

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;

use log::debug;
use mio::net::TcpStream;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tungstenite::protocol::WebSocketConfig;
use tungstenite::protocol::frame::Frame;
use tungstenite::protocol::frame::coding::{Data, OpCode};

use crate::sans_io::timing::time::Time;
use crate::sans_io::wire::info_fetch::{Progress, ResponseReader};
use crate::sans_io::wire::ws_reader::{Incoming, WsReader};
use crate::sans_io::wire::ws_writer::WsWriter;
use crate::shell::tcp_options;
use crate::shell::tls::MaybeTls;
use crate::shell::tls_stream::TlsStream;
use crate::shell::ws_upgrade::{Step, Upgrade};

/// The engine's client stream.
pub(crate) type Stream = MaybeTls<TlsStream<TcpStream>, TcpStream>;

/// Bytes of the loop-wide read buffer the shell passes to
/// [`WsConnection::on_ready`].
pub(crate) const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Wire units (see `TlsStream::wire_cost`) one `on_ready` spends at most
/// on the TLS and websocket handshakes, and one NIP-11 fetch's
/// `on_ready` on its exchange: a peer that floods records before its
/// response then lets the other sockets have their turn, and the
/// handshake's or fetch's deadline ends it.
const HANDSHAKE_UNITS: u64 = 64;

/// Bytes read per unit of read budget left: a read never brings in much
/// more than the budget pays for (a frame costs at least one unit, see
/// `WsReader::cost`), so a turn overshoots its budget by little.
const READ_BYTES_PER_UNIT: usize = 1024;

thread_local! {
    /// Masks for our frames. The loop is one thread; a generator per
    /// connection would cost every connection its state.
    static MASKS: RefCell<SmallRng> = RefCell::new(SmallRng::from_entropy());
}

/// A fresh mask for a client frame.
fn mask() -> [u8; 4] {
    MASKS.with(|rng| rng.borrow_mut().r#gen())
}

/// Where a connection stands.
enum Phase {
    /// TCP connect in flight.
    Connecting(TcpStream),
    /// TLS (inside the stream) and the websocket upgrade in flight (boxed:
    /// an open connection should not carry the upgrade's size).
    Upgrading(Stream, Box<Upgrade>),
    /// Websocket open: frames are ours.
    Open(Stream),
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
    /// What we hold for the peer's unsent frames at most (the config's
    /// write buffer limit).
    write_cap: u64,
    reader: WsReader,
    /// Frames not yet taken by the socket, those queued before the
    /// websocket opened among them.
    writer: WsWriter,
    /// Budget units (see `WsReader::cost`) the current `on_ready` may
    /// still spend.
    budget: u64,
    /// Units the last `on_ready` spent.
    spent: u64,
    /// The last `on_ready` stopped at a bound with more perhaps waiting.
    more: bool,
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
        if let Err(e) = tcp_options::enable_keepalive(&stream) {
            // The engine's pings still find a dead connection, later.
            debug!("{url}: no TCP keepalive: {e}");
        }
        Ok(WsConnection {
            phase: Phase::Connecting(stream),
            url: url.to_owned(),
            tls,
            reader: WsReader::new(config.max_message_size.unwrap_or(usize::MAX)),
            write_cap: config.max_write_buffer_size as u64,
            writer: WsWriter::default(),
            budget: 0,
            spent: 0,
            more: false,
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
            Phase::Upgrading(stream, _) => Some(stream.transport_mut()),
            Phase::Open(stream) => Some(stream.transport_mut()),
            Phase::Closed => None,
        }
    }

    /// True once the websocket is open.
    pub(crate) fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Open(_))
    }

    /// Drives the connection after a readiness event at `now`, reading
    /// into `buf` (the loop's one read buffer); appends what happened.
    /// Reads frames costing at most about `max_frames` (see
    /// `WsReader::cost`: one per frame of any kind, one more per 4 KiB; a
    /// read may overshoot it a little, see [`READ_BYTES_PER_UNIT`]; TLS
    /// records are charged too, see `charge`); returns true when it stopped
    /// because of that budget (or the handshake's share of work,
    /// [`HANDSHAKE_UNITS`]), so more may be waiting and the caller must
    /// call again (readiness will not be reported twice).
    pub(crate) fn on_ready(
        &mut self,
        out: &mut Vec<WsEvent>,
        max_frames: usize,
        now: Time,
        buf: &mut [u8],
    ) -> bool {
        self.budget = max_frames as u64;
        self.spent = 0;
        self.more = false;
        let phase = std::mem::replace(&mut self.phase, Phase::Closed);
        self.phase = match phase {
            Phase::Connecting(tcp) => self.finish_tcp(tcp, out, buf),
            Phase::Upgrading(stream, up) => self.upgrade(stream, up, out, buf),
            Phase::Open(stream) => self.pump(stream, out, buf),
            Phase::Closed => Phase::Closed,
        };
        let unfinished = self.is_open() && self.reader.unfinished();
        self.unfinished_since = match (unfinished, self.unfinished_since) {
            (false, _) => None,
            (true, since) => since.or(Some(now)),
        };
        self.more && !matches!(self.phase, Phase::Closed)
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

    /// Bytes held for the unfinished message.
    pub(crate) fn held(&self) -> u64 {
        self.reader.held()
    }

    /// Queues a text frame; it leaves on this or a later flush.
    pub(crate) fn send_text(&mut self, text: String, out: &mut Vec<WsEvent>) {
        self.send_texts(std::iter::once(text), out);
    }

    /// Queues a text frame each and writes them with as few system calls
    /// as the socket allows. A first sync sends the own relay thousands of
    /// `EVENT`s a second: one write each cost both processes a wakeup per
    /// event, where one write per turn of the loop carries them all.
    pub(crate) fn send_texts(
        &mut self,
        texts: impl IntoIterator<Item = String>,
        out: &mut Vec<WsEvent>,
    ) {
        let frames = texts
            .into_iter()
            .map(|t| Frame::message(t.into_bytes(), OpCode::Data(Data::Text), true));
        self.send(frames, out);
    }

    /// Queues a ping carrying a number of its own, so that only its pong
    /// is reported: a relay cannot pass unsolicited pongs off as answers.
    pub(crate) fn ping(&mut self, out: &mut Vec<WsEvent>) {
        self.pings += 1;
        let payload = self.pings.to_be_bytes();
        self.ping_out = Some(payload);
        self.send(std::iter::once(Frame::ping(payload.to_vec())), out);
    }

    /// Starts a clean close (close frame, best effort); the caller drops
    /// the connection afterwards.
    pub(crate) fn close(&mut self) {
        if self.is_open() {
            self.writer.queue(Frame::close(None), mask());
            self.flush(&mut Vec::new());
        }
        self.phase = Phase::Closed;
    }

    /// Queues `frames` and sends what the socket takes, unless the peer
    /// has left more than the write cap unread: a slow or hostile peer
    /// must not grow our memory.
    fn send(&mut self, frames: impl Iterator<Item = Frame>, out: &mut Vec<WsEvent>) {
        if matches!(self.phase, Phase::Closed) {
            return;
        }
        for frame in frames {
            self.writer.queue(frame, mask());
        }
        self.flush(out);
        let unsent = self.writer.len();
        if unsent > self.write_cap && !matches!(self.phase, Phase::Closed) {
            out.push(WsEvent::Closed(format!(
                "peer not reading: {unsent} bytes waiting"
            )));
            self.phase = Phase::Closed;
        }
    }

    /// Writes what waits until the socket would block.
    fn flush(&mut self, out: &mut Vec<WsEvent>) {
        let Phase::Open(stream) = &mut self.phase else {
            return;
        };
        if let Err(e) = write_out(stream, &mut self.writer) {
            out.push(WsEvent::Closed(format!("write: {e}")));
            self.phase = Phase::Closed;
        }
    }

    /// The TCP connect finished (or failed): start TLS and the websocket handshake.
    fn finish_tcp(&mut self, tcp: TcpStream, out: &mut Vec<WsEvent>, buf: &mut [u8]) -> Phase {
        let stream = match dial(tcp, self.tls.as_ref()) {
            Dialed::Pending(tcp) => return Phase::Connecting(tcp),
            Dialed::Failed(reason) => {
                out.push(WsEvent::Closed(reason));
                return Phase::Closed;
            }
            Dialed::Ready(stream) => stream,
        };
        match Upgrade::new(&self.url) {
            Ok(up) => self.upgrade(stream, Box::new(up), out, buf),
            Err(e) => {
                out.push(WsEvent::Closed(format!("handshake: {e}")));
                Phase::Closed
            }
        }
    }

    /// Sends what is left of the upgrade request, then reads the response
    /// through `buf`. Once it is in, the websocket is open and the bytes
    /// behind it are frames.
    fn upgrade(
        &mut self,
        mut stream: Stream,
        mut up: Box<Upgrade>,
        out: &mut Vec<WsEvent>,
        buf: &mut [u8],
    ) -> Phase {
        if let Err(e) = write_out(&mut stream, &mut *up) {
            out.push(WsEvent::Closed(format!("handshake: {e}")));
            return Phase::Closed;
        }
        if !up.unsent().is_empty() {
            return Phase::Upgrading(stream, up);
        }
        let start = wire_cost(&stream);
        loop {
            if wire_cost(&stream) - start >= HANDSHAKE_UNITS {
                self.more = true;
                return Phase::Upgrading(stream, up);
            }
            let n = match stream.read(buf) {
                Ok(0) => {
                    out.push(WsEvent::Closed("closed during the handshake".to_owned()));
                    return Phase::Closed;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    tcp_options::ack_now(stream.transport_mut());
                    return Phase::Upgrading(stream, up);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    out.push(WsEvent::Closed(format!("handshake: {e}")));
                    return Phase::Closed;
                }
            };
            match up.take(&buf[..n]) {
                Step::More => {}
                Step::Open { frames_from } => {
                    debug!("{}: websocket open", self.url);
                    out.push(WsEvent::Open);
                    self.phase = Phase::Open(stream);
                    self.flush(out);
                    // Frames may have arrived with the response.
                    if frames_from < n {
                        let before = self.reader.cost();
                        self.take_bytes(&buf[frames_from..n], out);
                        self.charge(before, 0);
                    }
                    return match std::mem::replace(&mut self.phase, Phase::Closed) {
                        Phase::Open(stream) => self.pump(stream, out, buf),
                        other => other,
                    };
                }
                Step::Refused(status) => {
                    out.push(WsEvent::Refused(status));
                    return Phase::Closed;
                }
                Step::Failed(reason) => {
                    out.push(WsEvent::Closed(format!("handshake: {reason}")));
                    return Phase::Closed;
                }
            }
        }
    }

    /// Reads what is available (within the budget) into `buf`, then
    /// flushes what is waiting. Each read is charged what the reader saw
    /// it cost, or what its TLS records cost, whichever is more.
    fn pump(&mut self, mut stream: Stream, out: &mut Vec<WsEvent>, buf: &mut [u8]) -> Phase {
        while self.budget > 0 {
            let limit = buf.len().min(
                usize::try_from(self.budget)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(READ_BYTES_PER_UNIT),
            );
            let before = (self.reader.cost(), wire_cost(&stream));
            let read = stream.read(&mut buf[..limit]);
            let wire = wire_cost(&stream) - before.1;
            match read {
                // A peer that drops the TCP connection without a close
                // frame is rude but common (restarts, crashes): not a
                // violation.
                Ok(0) => {
                    out.push(WsEvent::Closed(
                        "reset without closing handshake".to_owned(),
                    ));
                    return Phase::Closed;
                }
                Ok(n) => {
                    self.phase = Phase::Open(stream);
                    self.take_bytes(&buf[..n], out);
                    self.charge(before.0, wire);
                    match std::mem::replace(&mut self.phase, Phase::Closed) {
                        Phase::Open(s) => stream = s,
                        other => return other,
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Nothing more is waiting; the budget is not spent.
                    self.charge(before.0, wire);
                    self.budget = self.budget.max(1);
                    tcp_options::ack_now(stream.transport_mut());
                    break;
                }
                // TLS records without plaintext, a read's share of them.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => self.charge(before.0, wire),
                Err(e) => {
                    out.push(WsEvent::Closed(format!("read: {e}")));
                    return Phase::Closed;
                }
            }
        }
        self.more = self.budget == 0;
        self.phase = Phase::Open(stream);
        self.flush(out);
        std::mem::replace(&mut self.phase, Phase::Closed)
    }

    /// Charges one read to the budget: what its frames cost the reader
    /// (since its cost was `frames_before`), or the `wire` units its TLS
    /// records cost, whichever is more.
    fn charge(&mut self, frames_before: u64, wire: u64) {
        let units = self.reader.cost().saturating_sub(frames_before).max(wire);
        self.budget = self.budget.saturating_sub(units);
        self.spent = self.spent.saturating_add(units);
    }

    /// Reads `bytes` (all of them; the caller charges them) and acts on
    /// what they complete. May leave the connection closed.
    fn take_bytes(&mut self, bytes: &[u8], out: &mut Vec<WsEvent>) {
        let mut incoming = Vec::new();
        let read = self.reader.handle_bytes(bytes, &mut incoming);
        for message in incoming {
            self.on_message(message, out);
        }
        if let Err(violation) = read {
            out.push(WsEvent::Violation(format!("read: {violation}")));
            self.phase = Phase::Closed;
        }
    }

    /// Acts on one message from the relay.
    fn on_message(&mut self, message: Incoming, out: &mut Vec<WsEvent>) {
        match message {
            Incoming::Text(text) => out.push(WsEvent::Text(text)),
            Incoming::Oversized(bytes) => out.push(WsEvent::Oversized(bytes)),
            Incoming::Binary(_) => {}
            Incoming::Ping(payload) => self.send(std::iter::once(Frame::pong(payload)), out),
            Incoming::Pong(payload) => {
                if self.ping_out.is_some_and(|p| payload[..] == p[..]) {
                    self.ping_out = None;
                    out.push(WsEvent::Pong);
                }
            }
            Incoming::Close(frame) => {
                // The close handshake: answer with the relay's close.
                let reason = format!("closed by relay: {frame:?}");
                self.writer.queue(Frame::close(frame), mask());
                self.flush(out);
                out.push(WsEvent::Closed(reason));
                self.phase = Phase::Closed;
            }
        }
    }
}

/// Bytes waiting for the socket: our frames, or the upgrade request.
trait Outgoing {
    fn unsent(&self) -> &[u8];
    fn advance(&mut self, n: usize);
}

impl Outgoing for WsWriter {
    fn unsent(&self) -> &[u8] {
        WsWriter::unsent(self)
    }

    fn advance(&mut self, n: usize) {
        WsWriter::advance(self, n);
    }
}

impl Outgoing for Upgrade {
    fn unsent(&self) -> &[u8] {
        Upgrade::unsent(self)
    }

    fn advance(&mut self, n: usize) {
        Upgrade::advance(self, n);
    }
}

/// Writes what waits in `pending` to `stream` until it would block, then
/// flushes (over TLS that sends the records rustls made; before the TLS
/// handshake ends, rustls keeps the bytes for when it does).
fn write_out(stream: &mut Stream, pending: &mut impl Outgoing) -> io::Result<()> {
    while !pending.unsent().is_empty() {
        match stream.write(pending.unsent()) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => pending.advance(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    match stream.flush() {
        Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
        _ => Ok(()),
    }
}

/// What the TLS records read from `stream` so far cost (see
/// `TlsStream::wire_cost`); nothing over plain TCP, whose bytes the
/// reader charges as frames.
fn wire_cost(stream: &Stream) -> u64 {
    match stream {
        MaybeTls::Plain(_) => 0,
        MaybeTls::Tls(tls) => tls.wire_cost(),
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
        Some(t) => match TlsStream::new(t.config.clone(), t.name.clone(), tcp) {
            Ok(tls) => Dialed::Ready(MaybeTls::Tls(Box::new(tls))),
            Err(e) => Dialed::Failed(format!("tls: {e}")),
        },
    }
}

/// What an [`HttpGet`] reports after a readiness event.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum GetEvent {
    /// Not done; wait for the next readiness event.
    Pending,
    /// Not done, and stopped at its share of work ([`HANDSHAKE_UNITS`])
    /// with more perhaps waiting: call again (readiness will not be
    /// reported twice).
    More,
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
        if matches!(event, GetEvent::Pending | GetEvent::More) {
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
        let start = wire_cost(stream);
        loop {
            if wire_cost(stream) - start >= HANDSHAKE_UNITS {
                return GetEvent::More;
            }
            let progress = match stream.read(&mut buf) {
                Ok(0) => self.response.finish(),
                Ok(n) => self.response.feed(&buf[..n]),
                Err(e) if would_block(&e) => {
                    tcp_options::ack_now(stream.transport_mut());
                    return GetEvent::Pending;
                }
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

    /// Drives `ws` on readiness events until it reports something; the
    /// deadline is generous (a missed wake-up fails, a slow machine does not).
    fn next_events(poll: &mut mio::Poll, ws: &mut WsConnection, buf: &mut [u8]) -> Vec<WsEvent> {
        let mut events = mio::Events::with_capacity(8);
        let mut out = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while out.is_empty() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "no readiness event came");
            poll.poll(&mut events, Some(left)).unwrap();
            if !events.is_empty() {
                ws.on_ready(&mut out, 100, Time::default(), buf);
            }
        }
        out
    }

    /// The server's answer to the websocket upgrade `request`.
    fn switching_protocols(request: &str) -> String {
        let key = request
            .lines()
            .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
            .unwrap();
        let accept = tungstenite::handshake::derive_accept_key(key.trim().as_bytes());
        format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
        )
    }

    /// A `ws://` connection to `addr` started, and a poll it is registered with.
    fn polled_ws(addr: SocketAddr) -> (WsConnection, mio::Poll) {
        let config = WebSocketConfig::default();
        let mut ws = WsConnection::connect(addr, &format!("ws://{addr}/"), None, config).unwrap();
        let poll = mio::Poll::new().unwrap();
        let interest = mio::Interest::READABLE | mio::Interest::WRITABLE;
        poll.registry()
            .register(ws.socket().unwrap(), mio::Token(0), interest)
            .unwrap();
        (ws, poll)
    }

    /// A TLS server the test drives itself, over a loopback socket: it
    /// reads and writes only when told, so what the client finds waiting
    /// is what the test wrote.
    struct TlsPeer {
        sock: std::net::TcpStream,
        conn: rustls::ServerConnection,
        /// Plaintext from the client.
        got: Vec<u8>,
        /// The client sent close_notify.
        closed: bool,
    }

    impl TlsPeer {
        /// A listener and the client config that trusts its certificate.
        fn listen() -> (std::net::TcpListener, TlsTarget, Arc<rustls::ServerConfig>) {
            let (server, client) = crate::shell::tls_stream::tests::localhost_pair(true);
            let target = TlsTarget {
                config: Arc::new(client),
                name: ServerName::try_from("localhost").unwrap(),
            };
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            (listener, target, Arc::new(server))
        }

        fn accept(listener: &std::net::TcpListener, config: Arc<rustls::ServerConfig>) -> Self {
            let (sock, _) = listener.accept().unwrap();
            sock.set_nonblocking(true).unwrap();
            TlsPeer {
                sock,
                conn: rustls::ServerConnection::new(config).unwrap(),
                got: Vec::new(),
                closed: false,
            }
        }

        /// Takes what the client sent.
        fn read_in(&mut self) {
            loop {
                match self.conn.read_tls(&mut self.sock) {
                    Ok(0) => return,
                    Ok(_) => {
                        let state = self.conn.process_new_packets().unwrap();
                        let mut plain = vec![0; state.plaintext_bytes_to_read()];
                        self.conn.reader().read_exact(&mut plain).unwrap();
                        self.got.extend(plain);
                        self.closed |= state.peer_has_closed();
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(e) => panic!("server read: {e}"),
                }
            }
        }

        /// Sends what the session has to send (the test keeps it well
        /// under the socket buffers); returns how many bytes.
        fn write_out(&mut self) -> usize {
            let mut out = Vec::new();
            while self.conn.wants_write() {
                self.conn.write_tls(&mut out).unwrap();
            }
            self.sock.set_nonblocking(false).unwrap();
            self.sock.write_all(&out).unwrap();
            self.sock.set_nonblocking(true).unwrap();
            out.len()
        }
    }

    /// Until `done`, drives the client and the server by turns; the
    /// deadline is generous (a loaded machine is slow, not wrong).
    fn drive(peer: &mut TlsPeer, mut client: impl FnMut(), mut done: impl FnMut(&TlsPeer) -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !done(peer) {
            assert!(std::time::Instant::now() < deadline, "stuck");
            client();
            peer.read_in();
            if !done(peer) {
                peer.write_out();
            }
            std::thread::yield_now();
        }
    }

    /// Waits until the client's socket has `n` bytes waiting.
    fn wait_waiting(sock: &mut TcpStream, n: usize) {
        let mut buf = vec![0; n];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while sock.peek(&mut buf).unwrap_or(0) < n {
            assert!(std::time::Instant::now() < deadline, "bytes never came");
            std::thread::yield_now();
        }
    }

    /// A `wss://` websocket to a [`TlsPeer`], open.
    fn open_wss(buf: &mut [u8]) -> (WsConnection, TlsPeer) {
        let (listener, tls, config) = TlsPeer::listen();
        let addr = listener.local_addr().unwrap();
        let url = format!("wss://localhost:{}/", addr.port());
        let config_ws = WebSocketConfig::default();
        let mut ws = WsConnection::connect(addr, &url, Some(tls), config_ws).unwrap();
        let mut peer = TlsPeer::accept(&listener, config);
        let mut out = Vec::new();
        // The handshakes: the server answers the upgrade once it has it.
        drive(
            &mut peer,
            || {
                ws.on_ready(&mut out, 64, Time::default(), buf);
            },
            |peer| peer.got.ends_with(b"\r\n\r\n"),
        );
        let response = switching_protocols(&String::from_utf8_lossy(&peer.got));
        peer.conn.writer().write_all(response.as_bytes()).unwrap();
        peer.write_out();
        let mut out = Vec::new();
        while !ws.is_open() {
            ws.on_ready(&mut out, 64, Time::default(), buf);
            std::thread::yield_now();
        }
        (ws, peer)
    }

    #[test]
    fn closing_a_wss_connection_sends_close_notify() {
        let mut buf = vec![0; READ_BUFFER_BYTES];
        let (mut ws, mut peer) = open_wss(&mut buf);
        ws.close();
        drop(ws);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !peer.closed {
            assert!(std::time::Instant::now() < deadline, "no close_notify");
            peer.read_in();
            std::thread::yield_now();
        }
    }

    #[test]
    fn texts_sent_together_leave_in_few_tls_records() {
        let mut buf = vec![0; READ_BUFFER_BYTES];
        let (mut ws, mut peer) = open_wss(&mut buf);
        peer.got.clear();
        let texts: Vec<String> = (0..100).map(|i| format!("message {i:02}")).collect();
        let mut out = Vec::new();
        ws.send_texts(texts.clone(), &mut out);
        assert!(out.is_empty(), "{out:?}");
        // Each text is a 16-byte masked frame; a TLS 1.3 record adds 22
        // bytes (header, content type, tag), so one write per frame would
        // put 100 records, 2,200 bytes of them, on the wire.
        let plain = 100 * 16;
        let (mut wire, mut on_wire) = (Vec::new(), 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while peer.got.len() < plain {
            assert!(std::time::Instant::now() < deadline, "frames never came");
            let mut chunk = [0; 4096];
            match peer.sock.read(&mut chunk) {
                Ok(n) => {
                    wire.extend_from_slice(&chunk[..n]);
                    on_wire += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("server read: {e}"),
            }
            let mut fed = &wire[..];
            while !fed.is_empty() && peer.conn.read_tls(&mut fed).unwrap() > 0 {}
            let left = fed.len();
            wire.drain(..wire.len() - left);
            let state = peer.conn.process_new_packets().unwrap();
            let mut got = vec![0; state.plaintext_bytes_to_read()];
            peer.conn.reader().read_exact(&mut got).unwrap();
            peer.got.extend(got);
        }
        assert!(on_wire < plain + 5 * 22, "{on_wire} bytes for {plain}");
        // In order, whole: FIN + text, masked length 10, the mask, the text.
        let got: Vec<String> = peer
            .got
            .chunks(16)
            .map(|f| {
                assert_eq!(f[..2], [0x81, 0x80 | 10]);
                let text = f[6..].iter().zip(f[2..6].iter().cycle());
                String::from_utf8(text.map(|(b, m)| b ^ m).collect()).unwrap()
            })
            .collect();
        assert_eq!(got, texts);
    }

    #[test]
    fn one_byte_tls_records_are_charged_one_unit_each() {
        let mut buf = vec![0; READ_BUFFER_BYTES];
        let (mut ws, mut peer) = open_wss(&mut buf);
        // A 2,000-byte text frame, one byte per record.
        let mut frame = vec![0x81, 126, 0x07, 0xd0];
        frame.extend([b'x'; 2000]);
        let mut wire = 0;
        for byte in &frame {
            peer.conn.writer().write_all(&[*byte]).unwrap();
            wire += peer.write_out();
        }
        // Everything is waiting before the client reads.
        wait_waiting(ws.socket().unwrap(), wire);
        // One turn of 64 units reads about 64 records, not the frame.
        let mut out = Vec::new();
        let more = ws.on_ready(&mut out, 64, Time::default(), &mut buf);
        assert!(more, "stopped at its budget: {out:?}");
        assert!(ws.spent() >= 64, "{}", ws.spent());
        assert!(
            ws.spent() <= 64 + 800,
            "one read's overshoot: {}",
            ws.spent()
        );
        assert!(
            !out.iter().any(|e| matches!(e, WsEvent::Text(_))),
            "{out:?}"
        );
        // The rest costs its records too, and the frame arrives whole.
        let mut spent = ws.spent();
        let mut text = None;
        while text.is_none() {
            let mut out = Vec::new();
            ws.on_ready(&mut out, 64, Time::default(), &mut buf);
            spent += ws.spent();
            text = out.into_iter().find_map(|e| match e {
                WsEvent::Text(t) => Some(t),
                _ => None,
            });
        }
        assert_eq!(text.unwrap(), "x".repeat(2000));
        assert!(
            spent >= frame.len(),
            "{spent} units for {} records",
            frame.len()
        );
    }

    #[test]
    fn a_nip11_response_in_one_byte_tls_records_is_read_a_share_per_wake_up() {
        let (listener, tls, config) = TlsPeer::listen();
        let addr = listener.local_addr().unwrap();
        let url = format!("wss://localhost:{}/", addr.port());
        let request = crate::sans_io::wire::info_fetch::request(&url).unwrap();
        let mut get = HttpGet::connect(addr, request, Some(tls)).unwrap();
        let mut peer = TlsPeer::accept(&listener, config);
        drive(
            &mut peer,
            || assert_eq!(get.on_ready(), GetEvent::Pending),
            |peer| peer.got.ends_with(b"\r\n\r\n"),
        );
        let body = format!(r#"{{"name":"{}"}}"#, "n".repeat(500));
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/nostr+json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut wire = 0;
        for byte in response.as_bytes() {
            peer.conn.writer().write_all(&[*byte]).unwrap();
            wire += peer.write_out();
        }
        wait_waiting(get.socket().unwrap(), wire);
        // A wake-up reads its share of records and asks to be called again.
        assert_eq!(get.on_ready(), GetEvent::More);
        let mut calls = 1;
        let got = loop {
            calls += 1;
            match get.on_ready() {
                GetEvent::More => {}
                GetEvent::Done(got) => break got,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(got, body.into_bytes());
        assert!(calls >= 2, "{calls}");
    }

    /// Reads one small masked client frame from `server` (blocking).
    fn read_client_frame(server: &mut std::net::TcpStream) {
        let mut head = [0u8; 2];
        server.read_exact(&mut head).unwrap();
        let len = usize::from(head[1] & 0x7f);
        assert!(len < 126, "the test's frames are small");
        let mut rest = vec![0u8; 4 + len];
        server.read_exact(&mut rest).unwrap();
    }

    /// A relay that leaves Nagle's algorithm on writes an answer's first
    /// message at once and holds the rest until it is acknowledged; Linux
    /// delays that ACK by 40 ms at least, so each exchange cost 40 ms
    /// unless the client acknowledges at once what it read (issue 46: a
    /// LocalRelay's page 44 ms late on loopback). 100 exchanges take at
    /// least 4 s with the delay, and a few milliseconds without it: the
    /// 2 s bound leaves a loaded machine room.
    #[cfg(target_os = "linux")]
    #[test]
    fn an_answer_a_nagle_relay_writes_in_two_pieces_is_not_held_for_our_ack() {
        const EXCHANGES: usize = 100;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let relay = std::thread::spawn(move || {
            let (mut server, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            while !request.ends_with(b"\r\n\r\n") {
                let mut byte = [0u8; 1];
                server.read_exact(&mut byte).unwrap();
                request.push(byte[0]);
            }
            let response = switching_protocols(&String::from_utf8(request).unwrap());
            server.write_all(response.as_bytes()).unwrap();
            for _ in 0..EXCHANGES {
                read_client_frame(&mut server);
                // Two writes, as a relay writes EVENT and then EOSE.
                server.write_all(b"\x81\x05EVENT").unwrap();
                server.write_all(b"\x81\x04EOSE").unwrap();
            }
            // Open until the client is done with it.
            let _ = server.read(&mut [0u8; 1]);
        });
        let (mut ws, mut poll) = polled_ws(addr);
        let mut buf = vec![0; READ_BUFFER_BYTES];
        assert!(matches!(
            next_events(&mut poll, &mut ws, &mut buf)[..],
            [WsEvent::Open]
        ));
        let started = std::time::Instant::now();
        for i in 0..EXCHANGES {
            let mut out = Vec::new();
            ws.send_text("REQ".to_owned(), &mut out);
            assert!(out.is_empty(), "{out:?}");
            let mut texts = Vec::new();
            while texts.len() < 2 {
                for event in next_events(&mut poll, &mut ws, &mut buf) {
                    match event {
                        WsEvent::Text(t) => texts.push(t),
                        other => panic!("exchange {i}, {texts:?}: {other:?}"),
                    }
                }
            }
            assert_eq!(texts, ["EVENT", "EOSE"]);
        }
        let took = started.elapsed();
        drop(ws);
        relay.join().unwrap();
        assert!(
            took < std::time::Duration::from_secs(2),
            "{EXCHANGES} exchanges took {took:?}: the relay waited for delayed ACKs"
        );
    }

    #[test]
    fn a_frame_split_across_wake_ups_arrives_whole() {
        use std::io::{BufRead, BufReader};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (mut ws, mut poll) = polled_ws(addr);
        let (server, _) = listener.accept().unwrap();
        let mut buf = vec![0; READ_BUFFER_BYTES];
        // The client writes its upgrade request once connected; the server
        // reads it (blocking: the kernel holds what the client wrote).
        let mut events = mio::Events::with_capacity(8);
        let mut request = BufReader::new(server.try_clone().unwrap());
        let mut text = String::new();
        let mut line = String::new();
        while line != "\r\n" {
            if !request.buffer().contains(&b'\n') {
                poll.poll(&mut events, Some(std::time::Duration::from_millis(10)))
                    .unwrap();
                ws.on_ready(&mut Vec::new(), 100, Time::default(), &mut buf);
            }
            line.clear();
            request.read_line(&mut line).unwrap();
            text.push_str(&line);
        }
        let mut server = server;
        server
            .write_all(switching_protocols(&text).as_bytes())
            .unwrap();
        assert!(matches!(
            next_events(&mut poll, &mut ws, &mut buf)[..],
            [WsEvent::Open]
        ));
        // Each piece is read on its own wake-up; the frame completes on the last.
        let frame = b"\x81\x0bhello relay";
        for piece in frame.chunks(3) {
            server.write_all(piece).unwrap();
            if piece.as_ptr_range().end != frame.as_ptr_range().end {
                let mut events = mio::Events::with_capacity(8);
                poll.poll(&mut events, Some(std::time::Duration::from_secs(60)))
                    .unwrap();
                assert!(!events.is_empty(), "no readiness event for a piece");
                let mut out = Vec::new();
                ws.on_ready(&mut out, 100, Time::default(), &mut buf);
                assert!(out.is_empty(), "{out:?}");
            }
        }
        match &next_events(&mut poll, &mut ws, &mut buf)[..] {
            [WsEvent::Text(text)] => assert_eq!(text, "hello relay"),
            other => panic!("{other:?}"),
        }
    }
}
