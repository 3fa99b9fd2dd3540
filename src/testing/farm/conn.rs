//! What the relay farm keeps per relay and per connection, and the byte
//! stream under a connection (plain TCP or TLS, counting its bytes).

use super::super::store::EventKey;
use super::link::Delay;
use super::strfry::StrfryConn;
use super::*;
use tungstenite::WebSocket;
use tungstenite::handshake::MidHandshake;
use tungstenite::handshake::server::{Callback, ErrorResponse, Request, Response, ServerHandshake};
use tungstenite::protocol::frame::Frame;
use tungstenite::protocol::frame::coding::{Data as OpData, OpCode};

/// A client socket that counts the bytes written to it, behind its
/// relay's [`Link`] (whose [`Delay`] holds bytes both ways) unless that is
/// direct.
pub(super) struct Socket {
    pub(super) tcp: TcpStream,
    pub(super) counters: Arc<Counters>,
    /// The bytes the link holds; `None` on a direct link, where reads and
    /// writes go straight to `tcp`.
    pub(super) delay: Option<Box<Delay>>,
}

impl Socket {
    /// Moves the link's held bytes on (due ones out, the socket's in); an
    /// error means the connection is dead. Nothing on a direct link.
    pub(super) fn pump(&mut self) -> io::Result<()> {
        let Some(delay) = self.delay.as_deref_mut() else {
            return Ok(());
        };
        let mut written = 0;
        let pumped = delay.pump(&mut self.tcp, &mut written);
        self.counters
            .bytes_out
            .fetch_add(written, Ordering::Relaxed);
        pumped
    }

    /// `peek` on the socket, through the link: what has arrived, not
    /// taken, and when its last byte arrived (now on a direct link).
    pub(super) fn peek(&mut self, buf: &mut [u8]) -> io::Result<(usize, Instant)> {
        if self.delay.is_none() {
            return self.tcp.peek(buf).map(|n| (n, Instant::now()));
        }
        self.pump()?;
        match self.delay.as_deref() {
            Some(delay) => delay.peek(buf),
            None => Ok((0, Instant::now())),
        }
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.delay.is_none() {
            return self.tcp.read(buf);
        }
        self.pump()?;
        match self.delay.as_deref_mut() {
            Some(delay) => delay.read(buf),
            None => self.tcp.read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.delay.is_some() {
            // Due bytes first: they may make room.
            self.pump()?;
            if let Some(delay) = self.delay.as_deref_mut() {
                return delay.write(buf);
            }
        }
        let n = self.tcp.write(buf)?;
        self.counters
            .bytes_out
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        // Held bytes are the link's to send when due (the farm's timer, or
        // writability, brings the loop back for them): not the caller's
        // to wait for.
        self.pump()?;
        self.tcp.flush()
    }
}

/// The byte stream under a websocket: plain TCP or TLS over TCP.
pub(super) type Stream = MaybeTls<StreamOwned<ServerConnection, Socket>, Socket>;

/// True for "the socket would block": try again on the next readiness.
pub(super) fn would_block(e: &tungstenite::Error) -> bool {
    matches!(e, tungstenite::Error::Io(io) if io.kind() == io::ErrorKind::WouldBlock)
}

/// Serializes a relay message; `None` (logged) only if serde_json fails on
/// it, which for these plain messages would be a bug in nostr.
fn to_json(msg: &RelayMessage<'_>) -> Option<String> {
    match msg.try_as_json() {
        Ok(text) => Some(text),
        Err(e) => {
            log::error!("relay farm: cannot serialize a relay message: {e}");
            None
        }
    }
}

/// A relay's port.
pub(super) enum Listen {
    /// Up: connections are accepted.
    Open(TcpListener),
    /// Down after a restart, the port kept: bound, not listening (see
    /// [`port`]).
    Reserved(std::os::fd::OwnedFd),
    /// Down, the port not kept (keeping it failed): listening again binds
    /// it anew.
    Closed,
}

/// One relay.
pub(super) struct Relay {
    pub(super) port: u16,
    /// Its limits beyond the farm's.
    pub(super) profile: RelayProfile,
    /// The network between it and its clients.
    pub(super) link: Link,
    /// Reads need NIP-42 AUTH first.
    pub(super) auth: bool,
    /// Its port: listening, or down after a restart.
    pub(super) listen: Listen,
    /// Bumped by every restart: tags the listener's token and the re-listen
    /// timer.
    pub(super) generation: u32,
    pub(super) store: Store,
    /// Slab keys of its connections.
    pub(super) conns: Vec<usize>,
}

/// Where a connection stands.
pub(super) enum Phase {
    /// A relay serving NIP-11 looks at the request head (peeked, not
    /// consumed) before any handshake.
    Sniffing(Stream),
    /// TLS and websocket handshakes in flight.
    Handshaking(MidHandshake<ServerHandshake<Stream, OwnClient>>),
    /// Websocket open.
    Open(WebSocket<Stream>),
    /// Transient, while the phase is being replaced.
    Closed,
}

/// Something queued for a client, not yet handed to tungstenite.
pub(super) enum Out {
    /// A serialized message.
    Text(String),
    /// The stored results of a `REQ`, serialized as they leave (an event
    /// replaced meanwhile is skipped), then its `EOSE`.
    Stored {
        sub: SubscriptionId,
        keys: std::vec::IntoIter<EventKey>,
    },
}

/// The handshake callback that marks a connection (and counts it in
/// [`FarmStats::own_connections`]) when its request carries the farm's
/// token, as [`RelayFarm::own_url`] puts it.
pub(super) struct OwnClient {
    pub(super) token: Arc<str>,
    pub(super) own: Arc<AtomicBool>,
    pub(super) counters: Arc<Counters>,
}

impl Callback for OwnClient {
    fn on_request(self, request: &Request, response: Response) -> Result<Response, ErrorResponse> {
        let query = request.uri().query().unwrap_or_default();
        if query
            .split('&')
            .any(|kv| kv.strip_prefix("farm=") == Some(&*self.token))
        {
            self.own.store(true, Ordering::Relaxed);
            self.counters
                .own_connections
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(response)
    }
}

/// One client connection.
pub(super) struct Conn {
    pub(super) relay: usize,
    pub(super) generation: u32,
    /// Set by the handshake when the client came through `own_url`.
    pub(super) own: Arc<AtomicBool>,
    pub(super) phase: Phase,
    /// Open subscriptions.
    pub(super) subs: HashMap<SubscriptionId, Vec<Filter>>,
    /// Open negentropy reconciliations.
    pub(super) negs: NegSessions,
    /// On a strfry relay: its limits and the REQs still scanning.
    pub(super) strfry: Option<StrfryConn>,
    /// The NIP-42 challenge sent, on a relay that requires AUTH.
    pub(super) challenge: Option<String>,
    /// A valid AUTH arrived: reads are served.
    pub(super) authed: bool,
    pub(super) out: VecDeque<Out>,
    /// Bytes of the `Text` entries of `out`.
    pub(super) queued: usize,
    /// tungstenite (or rustls) holds bytes the socket did not take: wait
    /// for writability before handing over more.
    pub(super) blocked: bool,
    /// A message was begun and is never finished: nothing else is sent.
    pub(super) mute: bool,
}

impl Conn {
    /// Queues a message; false if the client is too far behind (it must be
    /// disconnected).
    pub(super) fn queue(&mut self, msg: &RelayMessage<'_>) -> bool {
        match to_json(msg) {
            Some(text) => self.queue_text(text),
            None => self.queued <= MAX_QUEUED,
        }
    }

    /// Queues an already serialized message (one nostr's `RelayMessage`
    /// cannot say, e.g. strfry's four-element `NEG-ERR`); false as
    /// [`queue`](Conn::queue).
    pub(super) fn queue_text(&mut self, text: String) -> bool {
        self.queued += text.len();
        self.out.push_back(Out::Text(text));
        self.queued <= MAX_QUEUED
    }

    /// Hands queued messages to tungstenite while the socket takes them,
    /// then flushes. An error means the connection is dead.
    pub(super) fn write(&mut self, store: &Store) -> tungstenite::Result<()> {
        if !matches!(self.phase, Phase::Open(_)) {
            return Ok(());
        }
        if self.mute {
            self.out.clear();
            self.queued = 0;
        }
        if self.blocked {
            match self.flush() {
                Ok(()) => self.blocked = false,
                Err(e) if would_block(&e) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        while let Some(text) = self.next_text(store) {
            let Phase::Open(ws) = &mut self.phase else {
                return Ok(());
            };
            match ws.write(Message::text(text)) {
                Ok(()) => {}
                // The frame stays in tungstenite's buffer for the next flush.
                Err(e) if would_block(&e) => {
                    self.blocked = true;
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        // Pongs and close replies, and TLS records rustls still holds.
        match self.flush() {
            Ok(()) => Ok(()),
            Err(e) if would_block(&e) => {
                self.blocked = true;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Flushes the websocket (nothing to do if it is not open).
    fn flush(&mut self) -> tungstenite::Result<()> {
        match &mut self.phase {
            Phase::Open(ws) => ws.flush(),
            _ => Ok(()),
        }
    }

    /// Takes the next message to send off the queue, serialized; `None`
    /// when the queue is empty.
    fn next_text(&mut self, store: &Store) -> Option<String> {
        loop {
            let text = match self.out.front_mut()? {
                Out::Text(text) => {
                    let text = std::mem::take(text);
                    self.out.pop_front();
                    self.queued -= text.len();
                    Some(text)
                }
                Out::Stored { sub, keys } => match keys.find_map(|k| store.get_by_key(&k)) {
                    Some(event) => to_json(&RelayMessage::Event {
                        subscription_id: Cow::Borrowed(sub),
                        event: Cow::Borrowed(event),
                    }),
                    None => self.end_stored(),
                },
            };
            // `None`: a message serde_json failed on (logged); skip it.
            if text.is_some() {
                return text;
            }
        }
    }

    /// The front entry, a `REQ`'s stored answer, is done: it goes and its
    /// `EOSE` is returned. On a strfry relay the `REQ` goes live then, or
    /// is refused with a `NOTICE` queued right after the `EOSE` (see
    /// [`finish_scan`](Conn::finish_scan)).
    fn end_stored(&mut self) -> Option<String> {
        let Some(Out::Stored { sub, .. }) = self.out.front() else {
            return None;
        };
        let sub = sub.clone();
        self.out.pop_front();
        if let Some(notice) = self.finish_scan(&sub) {
            self.queued += notice.len();
            self.out.push_front(Out::Text(notice));
        }
        to_json(&RelayMessage::eose(sub))
    }

    /// Sends the first fragment of a `bytes`-byte text message and an
    /// unsolicited pong; from now on the connection sends nothing else.
    pub(super) fn begin_unfinished(&mut self, bytes: usize) {
        let Phase::Open(ws) = &mut self.phase else {
            return;
        };
        self.mute = true;
        let fragment = Frame::message(vec![b'x'; bytes], OpCode::Data(OpData::Text), false);
        for frame in [fragment, Frame::pong(Vec::new())] {
            if ws.write(Message::Frame(frame)).is_err() {
                self.blocked = true;
            }
        }
        if ws.flush().is_err() {
            self.blocked = true;
        }
    }

    /// The bytes its relay's [`Link`] holds; `None` on a direct link (or
    /// a connection already closed).
    pub(super) fn delay(&mut self) -> Option<&mut Delay> {
        self.stream()?.transport_mut().delay.as_deref_mut()
    }

    pub(super) fn stream(&mut self) -> Option<&mut Stream> {
        match &mut self.phase {
            Phase::Sniffing(stream) => Some(stream),
            Phase::Handshaking(mid) => Some(mid.get_mut().get_mut()),
            Phase::Open(ws) => Some(ws.get_mut()),
            Phase::Closed => None,
        }
    }
}
