//! The network between a farm relay and its clients: a round-trip time and
//! a bandwidth, so a test on loopback can count round trips and a load run
//! can meet the latency real relays sit behind (issue 46).
//!
//! The delay is applied to bytes, under TLS and the websocket, the way a
//! delaying proxy between client and relay would: every chunk read from a
//! client's socket is held until half the round trip has passed since it
//! was read, and every chunk the relay writes is held half the round trip
//! before it goes to the socket. So every message pays the round trip
//! (half each way), and so do the TLS and websocket handshakes, NIP-42 and
//! NIP-77 exchanges, and live events (half: from the relay to the client).
//! The client's TCP handshake, which the kernel completes at once on
//! loopback, is paid too: nothing the client sends reaches the relay
//! before one and a half round trips after the connection was accepted
//! (the SYN's round trip, then the first bytes' way in).
//!
//! With a bandwidth, each direction of each connection is a line of that
//! many bytes per second: a chunk starts crossing when the ones before it
//! have crossed, takes its length over the bandwidth to do so, then half
//! the round trip to arrive.
//!
//! Nothing blocks: held chunks wait in queues, and the farm's loop comes
//! back for them at the time the first is due ([`Delay::next_wake`],
//! armed as a timer by `Farm::arm`). Held bytes are bounded per direction
//! ([`MAX_HELD`]): past it the relay stops reading the client's socket
//! (the client's writes then block, as over a full TCP window) and its own
//! writes report `WouldBlock` (the farm's writer waits, as it does for a
//! full socket).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use mio::net::TcpStream;

/// The network path between a farm relay and each client of it.
///
/// The default is loopback as it is: no delay, no bandwidth limit, and no
/// bytes held (the relay reads and writes its sockets directly).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Link {
    /// The round-trip time: every byte is held half of it on the way in
    /// and half on the way out (see the module doc).
    pub rtt: Duration,
    /// Bytes per second each way, per connection; `None`: unlimited.
    pub bytes_per_sec: Option<u64>,
}

impl Link {
    /// A link of round-trip time `rtt` and unlimited bandwidth.
    pub fn rtt(rtt: Duration) -> Link {
        Link {
            rtt,
            bytes_per_sec: None,
        }
    }

    /// True if the link changes nothing: the relay uses its sockets
    /// directly, exactly as without it.
    pub(super) fn is_direct(&self) -> bool {
        self.rtt.is_zero() && self.bytes_per_sec.is_none()
    }

    /// The delays of a connection accepted at `accepted`, or `None` for a
    /// direct link.
    pub(super) fn delay(&self, accepted: Instant) -> Option<Box<Delay>> {
        if self.is_direct() {
            return None;
        }
        Some(Box::new(Delay {
            link: *self,
            inbound: VecDeque::new(),
            held_in: 0,
            in_free: accepted,
            read_done: false,
            outbound: VecDeque::new(),
            held_out: 0,
            out_free: accepted,
            socket_full: false,
            opens: accepted + self.rtt + self.rtt / 2,
            wake: None,
            armed: None,
        }))
    }
}

/// Most bytes held per direction of one connection.
pub(super) const MAX_HELD: usize = 8 * 1024 * 1024;

/// Bytes read from the socket per call.
const READ_CHUNK: usize = 64 * 1024;

/// What a client sent, held until due.
enum Inbound {
    Data(Vec<u8>, usize),
    /// The client closed its side.
    Eof,
    /// Reading the socket failed.
    Error(io::ErrorKind),
}

/// The held bytes of one connection, both ways (see the module doc).
pub(super) struct Delay {
    link: Link,
    /// What the client sent, with the time it reaches the relay, in order.
    inbound: VecDeque<(Instant, Inbound)>,
    /// Bytes in `inbound`.
    held_in: usize,
    /// When the inbound line is free (bandwidth).
    in_free: Instant,
    /// The socket's end (or an error) is in `inbound`: read no more.
    read_done: bool,
    /// What the relay wrote, with the time it may go to the socket, and
    /// how much of it went already.
    outbound: VecDeque<(Instant, Vec<u8>, usize)>,
    /// Bytes in `outbound` not yet written to the socket.
    held_out: usize,
    /// When the outbound line is free (bandwidth).
    out_free: Instant,
    /// The socket took less than it was offered: writability, not a
    /// timer, resumes the writing.
    socket_full: bool,
    /// Nothing from the client arrives earlier: its TCP handshake.
    opens: Instant,
    /// An extra wake-up asked for (see [`Delay::wake_at`]).
    wake: Option<Instant>,
    /// The time of the farm timer set for this connection, if any: a later
    /// wake-up needs no new timer.
    pub(super) armed: Option<Instant>,
}

impl Delay {
    /// The time a chunk of `len` bytes entering a line free at `*free` at
    /// `now` comes out at the other end; moves `*free` on.
    fn cross(&self, free: &mut Instant, now: Instant, len: usize) -> Instant {
        let start = (*free).max(now);
        let on_the_line = match self.link.bytes_per_sec {
            Some(rate) => Duration::from_secs_f64(len as f64 / rate.max(1) as f64),
            None => Duration::ZERO,
        };
        *free = start + on_the_line;
        *free + self.link.rtt / 2
    }

    /// Reads what the socket has (while under [`MAX_HELD`]) into the
    /// inbound queue, each chunk stamped with the time it is due.
    fn pull(&mut self, tcp: &mut TcpStream, now: Instant) {
        let mut buf = [0u8; READ_CHUNK];
        while !self.read_done && self.held_in < MAX_HELD {
            let (len, item) = match tcp.read(&mut buf) {
                Ok(0) => (0, Inbound::Eof),
                Ok(n) => (n, Inbound::Data(buf[..n].to_vec(), 0)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => (0, Inbound::Error(e.kind())),
            };
            self.read_done = !matches!(item, Inbound::Data(..));
            let mut free = self.in_free;
            let due = self.cross(&mut free, now, len).max(self.opens);
            self.in_free = free;
            self.held_in += len;
            self.inbound.push_back((due, item));
        }
    }

    /// Writes the outbound chunks that are due to the socket, while it
    /// takes them; counts the bytes written in `bytes_out`. An error means
    /// the connection is dead.
    fn push(&mut self, tcp: &mut TcpStream, now: Instant, bytes_out: &mut u64) -> io::Result<()> {
        self.socket_full = false;
        while let Some((due, chunk, sent)) = self.outbound.front_mut() {
            if *due > now {
                return Ok(());
            }
            match tcp.write(&chunk[*sent..]) {
                Ok(n) => {
                    *sent += n;
                    self.held_out -= n;
                    *bytes_out += n as u64;
                    if *sent == chunk.len() {
                        self.outbound.pop_front();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.socket_full = true;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Moves both ways on: due bytes out to the socket, the socket's bytes
    /// in to the queue.
    pub(super) fn pump(&mut self, tcp: &mut TcpStream, bytes_out: &mut u64) -> io::Result<()> {
        let now = Instant::now();
        self.push(tcp, now, bytes_out)?;
        self.pull(tcp, now);
        Ok(())
    }

    /// Reads what has arrived, as a socket would: `WouldBlock` while
    /// nothing is due.
    pub(super) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let now = Instant::now();
        let Some((due, item)) = self.inbound.front_mut() else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        if *due > now {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        match item {
            // Left in place: every later read sees the end too.
            Inbound::Eof => Ok(0),
            Inbound::Error(kind) => Err((*kind).into()),
            Inbound::Data(data, taken) => {
                let n = buf.len().min(data.len() - *taken);
                buf[..n].copy_from_slice(&data[*taken..*taken + n]);
                *taken += n;
                self.held_in -= n;
                if *taken == data.len() {
                    self.inbound.pop_front();
                }
                Ok(n)
            }
        }
    }

    /// Copies what has arrived into `buf` without taking it, as `peek`
    /// does on a socket; also returns when the last byte copied arrived.
    /// `Ok((0, _))` means the client closed its side.
    pub(super) fn peek(&self, buf: &mut [u8]) -> io::Result<(usize, Instant)> {
        let now = Instant::now();
        let mut n = 0;
        let mut arrived = self.opens;
        for (due, item) in &self.inbound {
            if *due > now || n == buf.len() {
                break;
            }
            match item {
                Inbound::Data(data, taken) => {
                    let take = (buf.len() - n).min(data.len() - taken);
                    buf[n..n + take].copy_from_slice(&data[*taken..*taken + take]);
                    n += take;
                    arrived = *due;
                }
                Inbound::Eof if n == 0 => return Ok((0, *due)),
                Inbound::Error(kind) if n == 0 => return Err((*kind).into()),
                Inbound::Eof | Inbound::Error(_) => break,
            }
        }
        if n == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok((n, arrived))
    }

    /// Holds `buf` to go out when due; `WouldBlock` if [`MAX_HELD`] bytes
    /// wait already.
    pub(super) fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.held_out >= MAX_HELD {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let now = Instant::now();
        let mut free = self.out_free;
        let due = self.cross(&mut free, now, buf.len());
        self.out_free = free;
        self.held_out += buf.len();
        self.outbound.push_back((due, buf.to_vec(), 0));
        Ok(buf.len())
    }

    /// Half the round trip: how long the way back takes.
    pub(super) fn half_rtt(&self) -> Duration {
        self.link.rtt / 2
    }

    /// Asks for a wake-up at `at` besides the held bytes' (a NIP-11
    /// answer waiting out the way back).
    pub(super) fn wake_at(&mut self, at: Instant) {
        self.wake = Some(self.wake.map_or(at, |w| w.min(at)));
    }

    /// When the farm's loop must come back to this connection: the first
    /// held byte not yet due either way (outbound only while the socket
    /// takes bytes: otherwise writability comes first), or an asked-for
    /// wake-up; `None` if nothing waits on time.
    pub(super) fn next_wake(&mut self, now: Instant) -> Option<Instant> {
        if self.wake.is_some_and(|w| w <= now) {
            self.wake = None;
        }
        let inbound = self
            .inbound
            .iter()
            .map(|(due, _)| *due)
            .find(|due| *due > now);
        let outbound = match self.socket_full {
            true => None,
            false => self.outbound.front().map(|(due, _, _)| *due),
        };
        [inbound, outbound, self.wake].into_iter().flatten().min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::farm::{FarmOptions, RelayFarm, RelayProfile};
    use crate::testing::sim::{T0, keys, sign};
    use nostr::prelude::{ClientMessage, Filter, Kind, RelayMessage, SubscriptionId};
    use std::net::TcpStream as StdTcp;
    use tungstenite::Message;

    /// The round trip of the delaying relays in the farm tests: long enough
    /// that a direct relay on a busy machine answers well within it.
    const RTT: Duration = Duration::from_secs(1);

    /// Reads messages until one `done` accepts.
    fn read_until<S: Read + Write>(
        ws: &mut tungstenite::WebSocket<S>,
        mut done: impl FnMut(&RelayMessage<'_>) -> bool,
    ) {
        loop {
            let Message::Text(text) = ws.read().expect("the relay answers") else {
                continue;
            };
            if RelayMessage::from_json(text.as_str()).is_ok_and(|m| done(&m)) {
                return;
            }
        }
    }

    /// Connecting, a `REQ` answered and a live event, timed on one relay:
    /// (handshake, REQ to EOSE, publish to delivery).
    fn timings(farm: &RelayFarm, relay: usize) -> (Duration, Duration, Duration) {
        let start = Instant::now();
        let (mut ws, _) = tungstenite::connect(farm.url(relay)).expect("the relay accepts");
        let handshake = start.elapsed();
        let start = Instant::now();
        let sub = SubscriptionId::new("s");
        let req = ClientMessage::req(sub, vec![Filter::new().kind(Kind::TextNote)]);
        ws.send(Message::text(req.as_json())).expect("sent");
        read_until(&mut ws, |m| matches!(m, RelayMessage::EndOfStoredEvents(_)));
        let answered = start.elapsed();
        let live = sign(&keys(2), 1, T0 + 1, vec![], "live");
        let start = Instant::now();
        farm.publish(relay, live.clone());
        read_until(
            &mut ws,
            |m| matches!(m, RelayMessage::Event { event, .. } if event.id == live.id),
        );
        let live = start.elapsed();
        eprintln!("relay {relay}: handshake {handshake:?}, REQ {answered:?}, live {live:?}");
        (handshake, answered, live)
    }

    #[test]
    fn a_relay_behind_a_link_pays_its_round_trip_and_a_direct_one_does_not() {
        let nip11 = RelayProfile {
            nip11: true,
            ..RelayProfile::default()
        };
        let opts = FarmOptions {
            links: vec![(0, Link::rtt(RTT)), (2, Link::rtt(RTT))],
            profiles: vec![(2, nip11)],
            ..FarmOptions::default()
        };
        let farm = RelayFarm::start(3, opts).expect("the farm starts");
        for relay in 0..2 {
            farm.seed(relay, vec![sign(&keys(1), 1, T0, vec![], "stored")]);
        }

        let (handshake, answered, live) = timings(&farm, 0);
        // The TCP handshake's round trip, then the websocket upgrade's.
        assert!(handshake >= 2 * RTT, "handshake in {handshake:?}");
        assert!(answered >= RTT, "REQ answered in {answered:?}");
        assert!(live >= RTT / 2, "live event in {live:?}");

        let (handshake, answered, live) = timings(&farm, 1);
        assert!(handshake < RTT, "direct handshake in {handshake:?}");
        assert!(answered < RTT, "direct REQ answered in {answered:?}");
        assert!(live < RTT / 2, "direct live event in {live:?}");

        // A NIP-11 request, answered over plain HTTP, pays the same.
        let start = Instant::now();
        let mut http = StdTcp::connect(("127.0.0.1", farm.port(2))).expect("connects");
        http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nAccept: application/nostr+json\r\n\r\n")
            .expect("sent");
        let mut answer = String::new();
        http.read_to_string(&mut answer)
            .expect("answered, then closed");
        let took = start.elapsed();
        assert!(answer.contains("limitation"), "{answer}");
        assert!(took >= 2 * RTT, "NIP-11 answered in {took:?}");
        assert_eq!(farm.stats().info_served, 1);
    }

    fn delay(rtt_ms: u64, bytes_per_sec: Option<u64>, at: Instant) -> Box<Delay> {
        let link = Link {
            rtt: Duration::from_millis(rtt_ms),
            bytes_per_sec,
        };
        link.delay(at).expect("a delaying link")
    }

    #[test]
    fn a_link_without_delay_or_limit_holds_nothing() {
        assert!(Link::default().delay(Instant::now()).is_none());
        assert!(Link::rtt(Duration::ZERO).is_direct());
        assert!(!Link::rtt(Duration::from_millis(1)).is_direct());
    }

    #[test]
    fn written_bytes_are_held_half_the_round_trip() {
        let start = Instant::now();
        let mut d = delay(200, None, start);
        assert_eq!(d.write(b"hello").unwrap(), 5);
        let wake = d
            .next_wake(Instant::now())
            .expect("a held chunk wakes the loop");
        assert!(wake >= start + Duration::from_millis(100), "{wake:?}");
        assert!(wake < start + Duration::from_millis(200), "{wake:?}");
    }

    #[test]
    fn nothing_is_read_before_the_handshake_and_half_a_round_trip() {
        let start = Instant::now();
        let mut d = delay(200, None, start);
        let mut free = d.in_free;
        let due = d.cross(&mut free, start, 10).max(d.opens);
        assert_eq!(due, start + Duration::from_millis(300));
        d.inbound
            .push_back((due, Inbound::Data(b"0123456789".to_vec(), 0)));
        d.held_in = 10;
        let mut buf = [0u8; 4];
        let e = d.read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(d.next_wake(start), Some(due));
        // Due: read in pieces, then nothing more.
        d.inbound[0].0 = start;
        assert_eq!(d.peek(&mut buf).unwrap().0, 4);
        assert_eq!(d.read(&mut buf).unwrap(), 4);
        assert_eq!(&buf, b"0123");
        let mut rest = [0u8; 16];
        assert_eq!(d.read(&mut rest).unwrap(), 6);
        assert_eq!(d.held_in, 0);
        assert!(d.read(&mut rest).is_err());
    }

    #[test]
    fn a_bandwidth_spaces_the_chunks() {
        let start = Instant::now();
        let mut d = delay(0, Some(1_000), start);
        let mut free = start;
        let first = d.cross(&mut free, start, 500);
        let second = d.cross(&mut free, start, 500);
        assert_eq!(first, start + Duration::from_millis(500));
        assert_eq!(second, start + Duration::from_secs(1));
        d.held_out = MAX_HELD;
        assert_eq!(
            d.write(b"x").unwrap_err().kind(),
            io::ErrorKind::WouldBlock,
            "a full queue pushes back"
        );
    }

    #[test]
    fn tls_and_a_bandwidth_behind_a_link() {
        use crate::testing::cert::{CA_PEM, LEAF_KEY_PEM, LEAF_PEM};
        use crate::testing::relay::server_tls_config;
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, ServerName};
        use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
        use std::sync::Arc;

        const RATE: u64 = 4_000_000;
        let chain = format!("{LEAF_PEM}{CA_PEM}");
        let link = Link {
            rtt: Duration::from_millis(400),
            bytes_per_sec: Some(RATE),
        };
        let opts = FarmOptions {
            tls: Some(server_tls_config(chain.as_bytes(), LEAF_KEY_PEM.as_bytes()).unwrap()),
            links: vec![(0, link)],
            ..FarmOptions::default()
        };
        let farm = RelayFarm::start(1, opts).expect("the farm starts");
        let filler = "z".repeat(1_000);
        let many: Vec<_> = (0..3_000)
            .map(|i| sign(&keys(4), 1, T0 + i, vec![], &filler))
            .collect();
        farm.seed(0, many);

        let mut roots = RootCertStore::empty();
        let ca = CertificateDer::from_pem_slice(CA_PEM.as_bytes()).unwrap();
        roots.add(ca).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let start = Instant::now();
        let tcp = StdTcp::connect(("127.0.0.1", farm.port(0))).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let tls = ClientConnection::new(Arc::new(config), name).unwrap();
        let (mut ws, _) = tungstenite::client(farm.url(0), StreamOwned::new(tls, tcp))
            .expect("wss handshake behind a link");
        let handshake = start.elapsed();
        // TCP's round trip, TLS 1.3's, the websocket upgrade's.
        assert!(handshake >= 3 * link.rtt, "wss handshake in {handshake:?}");

        let start = Instant::now();
        let req = ClientMessage::req(
            SubscriptionId::new("all"),
            vec![Filter::new().kind(Kind::TextNote)],
        );
        ws.send(Message::text(req.as_json())).expect("sent");
        let mut events = 0;
        read_until(&mut ws, |m| {
            events += usize::from(matches!(m, RelayMessage::Event { .. }));
            matches!(m, RelayMessage::EndOfStoredEvents(_))
        });
        let answered = start.elapsed();
        assert_eq!(events, 3_000, "every stored event arrives");
        let bytes = farm.stats().bytes_out;
        let on_the_line = Duration::from_secs_f64(bytes as f64 / RATE as f64);
        eprintln!("{bytes} bytes answered in {answered:?} (handshake {handshake:?})");
        assert!(bytes > 3_000_000, "{bytes} bytes");
        assert!(
            answered >= link.rtt + on_the_line.mul_f64(0.9),
            "{bytes} bytes at {RATE} bytes/s answered in {answered:?}"
        );
    }
}
