//! A TLS client session over a non-blocking socket that keeps no buffer of
//! its own while the connection is idle.
//!
//! rustls's buffered `ClientConnection` resizes its record buffer to 4 KiB
//! before every read and keeps it between reads: 4 KiB per idle `wss`
//! relay, more than the rest of the connection. This stream drives the
//! unbuffered API instead. A read takes the socket's bytes into the back
//! half of the caller's buffer (the loop-wide one) and decrypts them into
//! its front half; per connection it keeps only
//! - the bytes of a record that has not fully arrived,
//! - decrypted bytes the caller had no room for,
//! - encrypted bytes the socket did not take,
//!
//! each released as soon as it is empty. What stays is rustls's session
//! itself: keys, the peer's certificates, the handshake's outcome.
//!
//! Reads and writes have `std::io` semantics (`WouldBlock` when the socket
//! has nothing, or cannot take more), so the websocket handshake and frames
//! run over it as over a plain socket. One exception bounds the work of a
//! call: a read that took [`WIRE_PER_READ`] bytes from the socket and
//! decrypted none of them (post-handshake messages such as session
//! tickets, which a peer can send without end) returns `Interrupted`:
//! call again, and charge what [`TlsStream::wire_cost`] says it read.

use std::io::{self, Read, Write};
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::client::ClientConnectionData;
use rustls::client::UnbufferedClientConnection;
use rustls::pki_types::ServerName;
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, WriteTraffic};

use crate::shell::tls::OverTransport;

/// Bytes of unfinished records kept at most. A record is at most about
/// 18 KiB and a handshake message at most 64 KiB (rustls refuses larger
/// ones), so a peer that makes us hold more is broken or hostile.
const PARTIAL_MAX: usize = 96 * 1024;

/// Socket bytes one read takes at most. A peer's records are read and
/// processed whatever they carry; 17 KiB of session tickets (about 200
/// of them) is a read's worth of work even when none of it is
/// plaintext. Plaintext reads are capped alike: 17 KiB holds a full
/// record (16 KiB of plaintext, its header and tag).
pub(crate) const WIRE_PER_READ: usize = 17 * 1024;

/// Bytes of ciphertext that cost one unit of read budget, as
/// `WsReader::cost` charges plaintext.
const WIRE_BYTES_PER_UNIT: u64 = 4 * 1024;

/// A TLS client session over `T`.
pub(crate) struct TlsStream<T: Read + Write> {
    conn: UnbufferedClientConnection,
    sock: T,
    /// Bytes of a record that has not fully arrived yet.
    partial: Vec<u8>,
    /// Decrypted bytes a read had no room for; the next read starts here.
    plain: Vec<u8>,
    /// Encrypted bytes the socket has not taken yet.
    unsent: Vec<u8>,
    /// Plaintext written before the handshake completed: only the
    /// websocket upgrade or NIP-11 request, a few hundred bytes (frames
    /// wait for the upgrade's answer, which needs the session).
    early: Vec<u8>,
    /// The handshake completed: application data may be sent.
    open: bool,
    /// The peer sent close_notify: reads end cleanly.
    peer_closed: bool,
    /// The stream is being dropped: the session's next chance to write
    /// sends our close_notify.
    closing: bool,
    /// Records and bytes read from the socket, for the read budget.
    wire: WireCount,
    /// The session failed (bad data from the peer, or the socket): every
    /// later read and write returns this. A read that decrypted plaintext
    /// before the failure returns that plaintext instead; the next one
    /// returns this.
    failed: Option<(io::ErrorKind, String)>,
}

/// Where decrypted bytes go: the caller's buffer, and what does not fit to
/// the stream's overflow.
struct Plain<'a> {
    room: &'a mut [u8],
    len: usize,
    overflow: &'a mut Vec<u8>,
}

impl Plain<'_> {
    fn push(&mut self, bytes: &[u8]) {
        let fit = bytes.len().min(self.room.len() - self.len);
        self.room[self.len..self.len + fit].copy_from_slice(&bytes[..fit]);
        self.len += fit;
        self.overflow.extend_from_slice(&bytes[fit..]);
    }
}

impl<T: Read + Write> TlsStream<T> {
    /// A session with `name` over `sock`, which is connected (or
    /// connecting: nothing is sent before the first read, write or flush).
    pub(crate) fn new(
        config: Arc<ClientConfig>,
        name: ServerName<'static>,
        sock: T,
    ) -> Result<Self, rustls::Error> {
        Ok(TlsStream {
            conn: UnbufferedClientConnection::new(config, name)?,
            sock,
            partial: Vec::new(),
            plain: Vec::new(),
            unsent: Vec::new(),
            early: Vec::new(),
            open: false,
            peer_closed: false,
            closing: false,
            wire: WireCount::default(),
            failed: None,
        })
    }

    /// What the socket bytes read so far cost in budget units: per socket
    /// read, one per record begun, or one per 4 KiB (counted across
    /// reads), whichever is more. A
    /// peer that sends one byte per record, or records that carry no
    /// plaintext at all, costs what processing them costs us, not what
    /// they decrypt to.
    pub(crate) fn wire_cost(&self) -> u64 {
        self.wire.units
    }

    /// Bytes of buffer room the stream holds itself (not rustls's session).
    /// Zero for a connection that is idle with everything sent.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.partial.capacity()
            + self.plain.capacity()
            + self.unsent.capacity()
            + self.early.capacity()
    }

    /// Runs the session over `incoming` (whole and partial records from
    /// the socket): handshake messages are answered, application data goes
    /// to `plain`, and once the session is open, `early` plaintext and then
    /// `send` are encrypted. Returns how many bytes of `incoming` were
    /// consumed and whether `send` was taken.
    fn drive(
        &mut self,
        incoming: &mut [u8],
        send: &[u8],
        plain: &mut Plain<'_>,
    ) -> io::Result<(usize, bool)> {
        let mut consumed = 0;
        let mut sent = send.is_empty();
        loop {
            let status = self.conn.process_tls_records(&mut incoming[consumed..]);
            let discard = status.discard;
            match status.state.map_err(tls_error)? {
                ConnectionState::ReadTraffic(mut traffic) => {
                    while let Some(record) = traffic.next_record() {
                        let record = record.map_err(tls_error)?;
                        plain.push(record.payload);
                        consumed += record.discard;
                    }
                }
                ConnectionState::EncodeTlsData(mut encode) => {
                    encode_into(&mut self.unsent, |out| encode.encode(out))?;
                }
                ConnectionState::TransmitTlsData(transmit) => {
                    // What is not taken now leaves with the next write or
                    // flush, in order: rustls only needs it sent once.
                    send_unsent(&mut self.sock, &mut self.unsent)?;
                    transmit.done();
                }
                ConnectionState::WriteTraffic(mut traffic) => {
                    self.open = true;
                    if !self.early.is_empty() {
                        let early = std::mem::take(&mut self.early);
                        encrypt_into(&mut self.unsent, &mut traffic, &early)?;
                    }
                    if !sent {
                        encrypt_into(&mut self.unsent, &mut traffic, send)?;
                        sent = true;
                    }
                    if self.closing {
                        // A close_notify alert is 24 to 31 bytes.
                        let mut alert = [0; 64];
                        let n = traffic
                            .queue_close_notify(&mut alert)
                            .map_err(encrypt_error)?;
                        self.unsent.extend_from_slice(&alert[..n]);
                    }
                    // The request written during the handshake leaves as
                    // soon as it can, whether a read or a write got here.
                    send_unsent(&mut self.sock, &mut self.unsent)?;
                    return Ok((consumed + discard, sent));
                }
                ConnectionState::BlockedHandshake => return Ok((consumed + discard, sent)),
                ConnectionState::PeerClosed => self.peer_closed = true,
                ConnectionState::Closed => {
                    self.peer_closed = true;
                    return Ok((consumed + discard, sent));
                }
                // Early data is a server's; nothing else exists today.
                _ => return Ok((consumed + discard, sent)),
            }
            consumed += discard;
        }
    }

    /// Runs the session over the bytes kept from earlier reads followed by
    /// `fresh` ones, and keeps what it did not consume: rustls may refer
    /// back to bytes it has not told us to discard, so they are always
    /// passed again, in order. Any failure ends the session for good (its
    /// state no longer matches the bytes), and is returned again on every
    /// later call.
    fn run(&mut self, fresh: &mut [u8], send: &[u8], plain: &mut Plain<'_>) -> io::Result<bool> {
        if let Some((kind, reason)) = &self.failed {
            return Err(io::Error::new(*kind, reason.clone()));
        }
        // Kept bytes go first; what rustls leaves unconsumed is kept again.
        let result = if self.partial.is_empty() {
            self.drive(fresh, send, plain)
                .map(|(used, sent)| (fresh[used..].to_vec(), sent))
        } else {
            let mut data = std::mem::take(&mut self.partial);
            data.extend_from_slice(fresh);
            self.drive(&mut data, send, plain).map(|(used, sent)| {
                data.drain(..used);
                (data, sent)
            })
        };
        let result = result.and_then(|(left, sent)| match left.len() {
            n if n > PARTIAL_MAX => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{n} bytes of unfinished TLS records"),
            )),
            // An empty `Vec` holds no room: an idle connection keeps none.
            0 => Ok(sent),
            _ => {
                self.partial = left;
                Ok(sent)
            }
        });
        if let Err(e) = &result {
            self.failed = Some((e.kind(), e.to_string()));
        }
        result
    }

    /// Reads the socket once into `back` and runs the session over what
    /// arrived; decrypted bytes go to `front`. Returns how many.
    ///
    /// Plaintext decrypted before a failure in the same read (a relay's
    /// EOSE, then its fatal alert or a corrupt record) is the peer's last
    /// word: it is returned, and the failure, which `run` keeps in
    /// `failed` for good, is returned by the next read, once `plain` is
    /// empty too; as rustls's buffered API delivers plaintext, then the
    /// error.
    fn read_records(&mut self, front: &mut [u8], back: &mut [u8]) -> io::Result<usize> {
        let n = match self.sock.read(back)? {
            0 if self.peer_closed => return Ok(0),
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => n,
        };
        self.wire.count(&back[..n]);
        let mut overflow = std::mem::take(&mut self.plain);
        let mut plain = Plain {
            room: front,
            len: 0,
            overflow: &mut overflow,
        };
        let result = self.run(&mut back[..n], &[], &mut plain);
        let len = plain.len;
        self.plain = overflow;
        match result {
            Err(_) if len > 0 || !self.plain.is_empty() => Ok(len),
            result => result.map(|_| len),
        }
    }

    /// Sends what the socket will take; `WouldBlock` if some is left.
    fn flush_unsent(&mut self) -> io::Result<()> {
        send_unsent(&mut self.sock, &mut self.unsent)?;
        match self.unsent.is_empty() {
            true => Ok(()),
            false => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Moves the handshake on without reading: sends our first flight
    /// (or anything else the session has to say).
    fn kick(&mut self, send: &[u8]) -> io::Result<bool> {
        let mut overflow = std::mem::take(&mut self.plain);
        let mut plain = Plain {
            room: &mut [],
            len: 0,
            overflow: &mut overflow,
        };
        let result = self.run(&mut [], send, &mut plain);
        self.plain = overflow;
        // A handshake flight the socket did not take whole goes on now,
        // even while the session waits for the peer.
        send_unsent(&mut self.sock, &mut self.unsent)?;
        result
    }

    /// Moves decrypted bytes kept from an earlier read into `buf`.
    fn take_plain(&mut self, buf: &mut [u8]) -> usize {
        let n = buf.len().min(self.plain.len());
        buf[..n].copy_from_slice(&self.plain[..n]);
        self.plain.drain(..n);
        if self.plain.is_empty() {
            self.plain = Vec::new();
        }
        n
    }
}

impl<T: Read + Write> TlsStream<T> {
    /// Sends close_notify (RFC 8446 6.1) on an open session that has not
    /// failed, so that the peer sees a clean end rather than a truncation;
    /// best effort: what the socket does not take at once is dropped.
    fn close_notify(&mut self) {
        if self.open && self.failed.is_none() {
            self.closing = true;
            // Any error: the peer or socket is gone, nothing to tell it.
            let _ = self.kick(&[]);
        }
    }
}

impl<T: Read + Write> Drop for TlsStream<T> {
    fn drop(&mut self) {
        self.close_notify();
    }
}

impl<T: Read + Write> OverTransport<T> for TlsStream<T> {
    fn transport_mut(&mut self) -> &mut T {
        &mut self.sock
    }
}

impl<T: Read + Write> Read for TlsStream<T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.plain.is_empty() {
            // The first flight goes out before anything can come back.
            self.kick(&[])?;
        }
        // A record is never longer decrypted, so the front half mostly has
        // room for what a read into the back half completes; the rest (a
        // record begun in an earlier read, or a one-byte buffer's byte)
        // waits in `plain` for the next read.
        let half = buf.len().div_ceil(2);
        let start = self.wire.bytes;
        loop {
            if !self.plain.is_empty() {
                return Ok(self.take_plain(buf));
            }
            // `start` is at most `wire.bytes`, and their difference at
            // most `WIRE_PER_READ`: it fits.
            let taken = (self.wire.bytes - start) as usize;
            if taken >= WIRE_PER_READ {
                // No plaintext yet: come back, so that the caller can
                // charge what was read and let other sockets have a turn.
                return Err(io::ErrorKind::Interrupted.into());
            }
            let (front, back) = buf.split_at_mut(buf.len() - half);
            let back = &mut back[..half.min(WIRE_PER_READ - taken)];
            match self.read_records(front, back)? {
                0 if self.peer_closed && self.plain.is_empty() => return Ok(0),
                // Handshake messages, or part of a record: read on until
                // the socket has nothing more (`WouldBlock`) or this read
                // has done its share of work.
                0 => {}
                n => return Ok(n),
            }
        }
    }
}

impl<T: Read + Write> Write for TlsStream<T> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.flush_unsent()?;
        if buf.is_empty() {
            return Ok(0);
        }
        if !self.kick(buf)? {
            self.early.extend_from_slice(buf);
        }
        // Taken: encrypted (or queued until the session is up); what the
        // socket does not take now leaves with the next write or flush.
        send_unsent(&mut self.sock, &mut self.unsent)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.open {
            self.kick(&[])?;
        }
        self.flush_unsent()?;
        self.sock.flush()
    }
}

/// Counts the records and bytes a peer sent, for the read budget: record
/// headers are followed across reads (5 bytes: type, version, length).
/// Bytes that are not TLS count as whatever they claim; rustls refuses
/// them anyway.
#[derive(Debug, Default)]
struct WireCount {
    /// Budget units charged so far.
    units: u64,
    /// Bytes counted so far.
    bytes: u64,
    /// Header bytes of the next record seen so far.
    header: [u8; 5],
    header_len: usize,
    /// Body bytes of the current record still to come.
    body_left: usize,
}

impl WireCount {
    /// Counts one socket read's bytes.
    fn count(&mut self, mut bytes: &[u8]) {
        let before = self.bytes / WIRE_BYTES_PER_UNIT;
        self.bytes += bytes.len() as u64;
        // Whole 4 KiB units this read completed, the rest carried over.
        let by_size = self.bytes / WIRE_BYTES_PER_UNIT - before;
        let mut records = 0;
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let skip = self.body_left.min(bytes.len());
                self.body_left -= skip;
                bytes = &bytes[skip..];
                continue;
            }
            let take = (5 - self.header_len).min(bytes.len());
            self.header[self.header_len..self.header_len + take].copy_from_slice(&bytes[..take]);
            self.header_len += take;
            bytes = &bytes[take..];
            if self.header_len == 5 {
                records += 1;
                self.header_len = 0;
                self.body_left = u16::from_be_bytes([self.header[3], self.header[4]]) as usize;
            }
        }
        self.units += records.max(by_size);
    }
}

/// Writes `unsent` to `sock` until it is empty or the socket would block;
/// keeps the rest, and no room once it is empty.
fn send_unsent(sock: &mut impl Write, unsent: &mut Vec<u8>) -> io::Result<()> {
    let mut sent = 0;
    while sent < unsent.len() {
        match sock.write(&unsent[sent..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    unsent.drain(..sent);
    if unsent.is_empty() {
        *unsent = Vec::new();
    }
    Ok(())
}

/// Appends a handshake record to `out`, giving `encode` the room it asks for.
fn encode_into(
    out: &mut Vec<u8>,
    mut encode: impl FnMut(&mut [u8]) -> Result<usize, EncodeError>,
) -> io::Result<()> {
    let start = out.len();
    let mut room = 1024;
    loop {
        out.resize(start + room, 0);
        match encode(&mut out[start..]) {
            Ok(n) => {
                out.truncate(start + n);
                return Ok(());
            }
            Err(EncodeError::InsufficientSize(e)) => room = e.required_size,
            Err(e) => {
                out.truncate(start);
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
        }
    }
}

/// Appends `plain`, encrypted, to `out`.
fn encrypt_into(
    out: &mut Vec<u8>,
    traffic: &mut WriteTraffic<'_, ClientConnectionData>,
    plain: &[u8],
) -> io::Result<()> {
    let start = out.len();
    // A record's header and tag are 22 bytes, one record per 16 KiB.
    let mut room = plain.len() + (plain.len() / 16384 + 1) * 64;
    loop {
        out.resize(start + room, 0);
        match traffic.encrypt(plain, &mut out[start..]) {
            Ok(n) => {
                out.truncate(start + n);
                return Ok(());
            }
            Err(EncryptError::InsufficientSize(e)) if e.required_size > room => {
                room = e.required_size
            }
            Err(e) => {
                out.truncate(start);
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
        }
    }
}

/// An encryption failure (a buffer too small, or keys used up).
fn encrypt_error(e: EncryptError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// A TLS failure as the stream reports it: bad data from the peer.
fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::RefCell;
    use std::collections::VecDeque;
    use std::rc::Rc;

    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use rcgen::{CertificateParams, KeyPair};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use rustls::{RootCertStore, ServerConfig, ServerConnection};

    use super::*;

    /// A server config with a fresh self-signed certificate for
    /// `localhost`, and a client config that trusts it if `trusted`.
    pub(crate) fn localhost_pair(trusted: bool) -> (ServerConfig, ClientConfig) {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![der.clone()],
                PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
            )
            .unwrap();
        let mut roots = RootCertStore::empty();
        if trusted {
            roots.add(der).unwrap();
        }
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (server, client)
    }

    /// One direction of an in-memory socket.
    type Pipe = Rc<RefCell<VecDeque<u8>>>;

    /// An in-memory non-blocking socket: reads what the other side wrote
    /// (`WouldBlock` when there is nothing, a random part of it when there
    /// is), takes at most `room` unread bytes, and reads 0 once closed.
    struct Sock {
        rx: Pipe,
        tx: Pipe,
        rng: SmallRng,
        room: usize,
        closed: Rc<RefCell<bool>>,
        /// A read takes a random part of what is there; else all that fits.
        split: bool,
    }

    impl Read for Sock {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let mut rx = self.rx.borrow_mut();
            if rx.is_empty() {
                return match *self.closed.borrow() {
                    true => Ok(0),
                    false => Err(io::ErrorKind::WouldBlock.into()),
                };
            }
            let most = rx.len().min(buf.len());
            let n = match self.split {
                true => self.rng.gen_range(1..=most),
                false => most,
            };
            for (b, byte) in buf.iter_mut().zip(rx.drain(..n)) {
                *b = byte;
            }
            Ok(n)
        }
    }

    impl Write for Sock {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let mut tx = self.tx.borrow_mut();
            let free = self.room.saturating_sub(tx.len());
            if free == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = self.rng.gen_range(1..=free.min(buf.len()));
            tx.extend(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A client stream and a buffered rustls server joined by pipes.
    struct World {
        client: TlsStream<Sock>,
        server: ServerConnection,
        to_client: Pipe,
        to_server: Pipe,
        closed: Rc<RefCell<bool>>,
        rng: SmallRng,
        /// Plaintext the server received.
        served: Vec<u8>,
    }

    /// A self-signed `localhost` certificate; `trusted` puts it in the
    /// client's roots.
    fn world(seed: u64, trusted: bool) -> World {
        world_with(seed, trusted, |_| {})
    }

    /// As [`world`], with a server that sends `tickets` session tickets
    /// once the handshake is done, each in a record of its own: records
    /// aligned to messages, as a hostile server would send them (rustls
    /// packs them into full records).
    fn world_with_tickets(seed: u64, tickets: usize) -> World {
        world_with(seed, true, |server| {
            server.send_tls13_tickets = tickets;
            // A NewSessionTicket of rustls's (a 32-byte nonce and a
            // 32-byte id) is 81 bytes.
            server.max_fragment_size = Some(81 + 5);
        })
    }

    /// As [`world`], with the server's config changed by `tweak`.
    fn world_with(seed: u64, trusted: bool, tweak: impl FnOnce(&mut ServerConfig)) -> World {
        let (mut server, client) = localhost_pair(trusted);
        tweak(&mut server);
        let (to_client, to_server) = (Pipe::default(), Pipe::default());
        let closed = Rc::new(RefCell::new(false));
        let sock = Sock {
            rx: to_client.clone(),
            tx: to_server.clone(),
            rng: SmallRng::seed_from_u64(seed),
            room: 1 + seed as usize % 3000,
            closed: closed.clone(),
            split: true,
        };
        let name = ServerName::try_from("localhost").unwrap();
        let mut server = ServerConnection::new(Arc::new(server)).unwrap();
        // The tests write up to 70 KB at once, over rustls's default 64 KiB.
        server.set_buffer_limit(None);
        World {
            client: TlsStream::new(Arc::new(client), name, sock).unwrap(),
            server,
            to_client,
            to_server,
            closed,
            rng: SmallRng::seed_from_u64(seed + 1),
            served: Vec::new(),
        }
    }

    impl World {
        /// The server reads what the client sent, keeps the plaintext in
        /// `served`, and answers.
        fn serve(&mut self) {
            while !self.to_server.borrow().is_empty() {
                let bytes: Vec<u8> = self.to_server.borrow_mut().drain(..).collect();
                let mut rest = &bytes[..];
                while !rest.is_empty() {
                    self.server.read_tls(&mut rest).unwrap();
                    let state = self.server.process_new_packets().unwrap();
                    let mut plain = vec![0; state.plaintext_bytes_to_read()];
                    self.server.reader().read_exact(&mut plain).unwrap();
                    self.served.extend(plain);
                }
            }
            self.pass_to_client();
        }

        fn pass_to_client(&mut self) {
            let mut out = Vec::new();
            while self.server.wants_write() {
                self.server.write_tls(&mut out).unwrap();
            }
            self.to_client.borrow_mut().extend(out);
        }

        /// The client reads until `WouldBlock` with nothing in flight,
        /// through buffers of random sizes, serving as it goes; returns
        /// what it read.
        fn client_reads(&mut self) -> io::Result<Vec<u8>> {
            let mut got = Vec::new();
            loop {
                let mut buf = vec![0; self.rng.gen_range(1..9000)];
                match self.client.read(&mut buf) {
                    Ok(0) => return Ok(got),
                    Ok(n) => got.extend(&buf[..n]),
                    // A read did its share of work: call again.
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if self.to_server.borrow().is_empty() && self.to_client.borrow().is_empty()
                        {
                            return Ok(got);
                        }
                        self.serve();
                    }
                    Err(e) => return Err(e),
                }
            }
        }

        /// The client writes all of `data`, in pieces, serving (and
        /// reading, as the handshake needs) when the socket is full.
        fn client_writes(&mut self, data: &[u8]) {
            let mut at = 0;
            while at < data.len() {
                let end = (at + self.rng.gen_range(1..20_000)).min(data.len());
                match self.client.write(&data[at..end]) {
                    Ok(n) => at += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.serve();
                        self.client_reads().unwrap();
                    }
                    Err(e) => panic!("write: {e}"),
                }
            }
            while let Err(e) = self.client.flush() {
                assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
                self.serve();
            }
            self.serve();
        }

        /// Writes `request` before the handshake, as the websocket upgrade
        /// is, and runs both sides until the server has it.
        fn connect(&mut self, request: &[u8]) {
            self.client_writes(request);
            for _ in 0..100_000 {
                if self.served.len() >= request.len() {
                    break;
                }
                assert!(
                    self.client_reads().unwrap().is_empty(),
                    "data before the request was served"
                );
                self.serve();
            }
            assert_eq!(
                std::mem::take(&mut self.served),
                request,
                "the request, served"
            );
        }
    }

    fn bytes(rng: &mut SmallRng, n: usize) -> Vec<u8> {
        (0..n).map(|_| rng.r#gen()).collect()
    }

    #[test]
    fn data_crosses_both_ways_split_at_random_and_nothing_is_held_after() {
        for seed in 0..40 {
            let mut w = world(seed, true);
            let mut rng = SmallRng::seed_from_u64(seed);
            w.connect(&bytes(&mut rng, 300));
            for round in 0..3 {
                let len = rng.gen_range(1..70_000);
                let down = bytes(&mut rng, len);
                w.server.writer().write_all(&down).unwrap();
                w.pass_to_client();
                assert_eq!(
                    w.client_reads().unwrap(),
                    down,
                    "seed {seed} round {round}: down"
                );
                let len = rng.gen_range(1..70_000);
                let up = bytes(&mut rng, len);
                w.client_writes(&up);
                assert_eq!(
                    std::mem::take(&mut w.served),
                    up,
                    "seed {seed} round {round}: up"
                );
                assert_eq!(
                    w.client.held(),
                    0,
                    "seed {seed} round {round}: idle, nothing held"
                );
            }
        }
    }

    #[test]
    fn an_untrusted_certificate_fails_the_read_with_invalid_data() {
        let mut w = world(7, false);
        w.client_writes(b"GET / HTTP/1.1\r\n\r\n");
        let e = w.client_reads().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("certificate"), "{e}");
        // The session stays failed.
        assert_eq!(
            w.client.write(b"x").unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn close_notify_ends_reads_and_a_bare_eof_is_unexpected() {
        for clean in [true, false] {
            let mut w = world(3, true);
            w.connect(b"hello");
            w.server.writer().write_all(b"bye").unwrap();
            if clean {
                w.server.send_close_notify();
            }
            w.pass_to_client();
            *w.closed.borrow_mut() = true;
            let mut buf = [0; 64];
            let mut got: Vec<u8> = Vec::new();
            let end = loop {
                match w.client.read(&mut buf) {
                    Ok(0) => break Ok(()),
                    Ok(n) => got.extend(&buf[..n]),
                    Err(e) => break Err(e.kind()),
                }
            };
            assert_eq!(got, b"bye".to_vec());
            match clean {
                true => assert_eq!(end, Ok(())),
                false => assert_eq!(end, Err(io::ErrorKind::UnexpectedEof)),
            }
        }
    }

    #[test]
    fn a_session_ticket_flood_is_read_a_share_per_call_and_charged_per_record() {
        let tickets = 3_000;
        let mut w = world_with_tickets(5, tickets);
        w.client.sock.split = false;
        w.client_writes(b"hello");
        // The client reads the server's flight and sends its Finished;
        // the server answers with the tickets.
        let mut buf = vec![0; 64 * 1024];
        while w.server.is_handshaking() {
            match w.client.read(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => w.serve(),
                other => panic!("{other:?}"),
            }
        }
        let flood = w.to_client.borrow().len();
        assert!(flood > tickets * 50, "{flood} bytes of tickets");
        let cost_before = w.client.wire_cost();
        let mut calls = 0;
        loop {
            let before = w.to_client.borrow().len();
            let read = w.client.read(&mut buf);
            let taken = before - w.to_client.borrow().len();
            assert!(taken <= WIRE_PER_READ, "one read took {taken} bytes");
            match read {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => calls += 1,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                other => panic!("{other:?}"),
            }
        }
        assert!(calls >= flood / WIRE_PER_READ, "{calls} calls");
        assert!(
            w.client.wire_cost() - cost_before >= tickets as u64,
            "each ticket's record costs a unit"
        );
        // The session goes on.
        w.server.writer().write_all(b"after").unwrap();
        w.pass_to_client();
        assert_eq!(w.client_reads().unwrap(), b"after".to_vec());
    }

    #[test]
    fn one_byte_records_cost_a_unit_each() {
        let mut w = world(9, true);
        w.connect(b"hello");
        let data = bytes(&mut w.rng, 1_000);
        let before = w.client.wire_cost();
        for byte in &data {
            // A write of its own: a record of its own.
            w.server.writer().write_all(&[*byte]).unwrap();
        }
        w.pass_to_client();
        assert_eq!(w.client_reads().unwrap(), data);
        assert!(w.client.wire_cost() - before >= 1_000);
        // Full records cost their 4 KiB units.
        let before = w.client.wire_cost();
        w.server.writer().write_all(&[7; 64 * 1024]).unwrap();
        w.pass_to_client();
        assert_eq!(w.client_reads().unwrap().len(), 64 * 1024);
        let cost = w.client.wire_cost() - before;
        assert!((16..=20).contains(&cost), "{cost}");
    }

    #[test]
    fn dropping_an_open_stream_sends_close_notify_and_an_unopened_one_nothing() {
        let mut w = world(11, true);
        w.connect(b"hello");
        // The socket takes the alert (best effort: a full one would not).
        w.client.sock.room = 1 << 20;
        let World {
            client,
            mut server,
            to_server,
            ..
        } = w;
        drop(client);
        let bytes: Vec<u8> = to_server.borrow_mut().drain(..).collect();
        server.read_tls(&mut &bytes[..]).unwrap();
        let state = server.process_new_packets().unwrap();
        assert!(state.peer_has_closed(), "the server saw close_notify");
        // Before the handshake there is no session to close.
        let w = world(12, true);
        let World {
            client, to_server, ..
        } = w;
        drop(client);
        assert!(to_server.borrow().is_empty());
    }

    /// A record that does not decrypt: an application-data header and a
    /// tag's worth of zeros.
    fn corrupt_record() -> Vec<u8> {
        let mut record = vec![23, 3, 3, 0, 17];
        record.extend([0; 17]);
        record
    }

    #[test]
    fn data_before_a_fatal_record_is_read_first_and_the_error_next() {
        let last = br#"["EOSE","sub"]"#;
        for seed in 0..48 {
            let mut w = world(seed, true);
            w.connect(b"hello");
            // Half the runs get every byte in one socket read, the data
            // and the fatal record together; the others split at random.
            w.client.sock.split = seed % 2 == 1;
            w.server.writer().write_all(last).unwrap();
            let alert = seed % 4 < 2;
            if alert {
                // The server fails on a corrupt record and answers with
                // a fatal alert, sent right after the data.
                w.server.read_tls(&mut &corrupt_record()[..]).unwrap();
                w.server.process_new_packets().unwrap_err();
                w.pass_to_client();
            } else {
                w.pass_to_client();
                w.to_client.borrow_mut().extend(corrupt_record());
            }
            let mut buf = vec![0; [65536, 4096, 64][seed as usize % 3]];
            let mut got: Vec<u8> = Vec::new();
            let e = loop {
                match w.client.read(&mut buf) {
                    Ok(0) => panic!("seed {seed}: a clean end"),
                    Ok(n) => got.extend(&buf[..n]),
                    Err(e) => break e,
                }
            };
            assert_eq!(got, last.to_vec(), "seed {seed}: the last data, first");
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "seed {seed}: {e}");
            if alert {
                assert!(e.to_string().contains("alert"), "seed {seed}: {e}");
            }
            // The session stays failed: the error is neither lost nor
            // turned into data or a clean end.
            let again = w.client.read(&mut buf).unwrap_err();
            assert_eq!(again.to_string(), e.to_string(), "seed {seed}");
            assert_eq!(w.client.held(), 0, "seed {seed}: nothing held");
        }
    }

    #[test]
    fn garbage_from_the_peer_is_an_error_never_a_panic_or_a_hoard() {
        for seed in 0..200 {
            let mut w = world(seed, true);
            if seed % 2 == 1 {
                // Garbage after a good handshake.
                w.connect(b"hello");
            }
            let junk = bytes(&mut w.rng, 1 + seed as usize * 997 % 200_000);
            let mut junk = junk;
            if seed % 4 == 0 {
                // An application-data header promising a long record.
                junk.splice(0..0, [23, 3, 3, 0x40, 0x00]);
            }
            w.to_client.borrow_mut().extend(junk);
            *w.closed.borrow_mut() = true;
            let mut buf = vec![0; 4096];
            let mut reads = 0;
            loop {
                match w.client.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => reads += 1,
                }
                assert!(reads < 1000, "seed {seed}: reads garbage forever");
            }
            assert!(
                w.client.held() <= PARTIAL_MAX + 64 * 1024,
                "seed {seed}: held {}",
                w.client.held()
            );
        }
    }
}
