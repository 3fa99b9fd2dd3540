//! Plain HTTP on a relay's websocket port, before any handshake: a relay
//! serving NIP-11 peeks at a connection's request head and answers a
//! NIP-11 request (khatru's way, see [`classify_http`], or strfry's, see
//! [`classify_http_strfry`], which also answers other `GET`s with a landing
//! page); anything else goes on to the websocket handshake. Also the
//! per-relay websocket settings and NIP-11 `limitation`.

use super::super::limits::{
    StrfryHead, classify_http_strfry, strfry_landing_response, strfry_nip11_document,
    strfry_nip11_response,
};
use super::*;

/// What to do with a connection's first bytes.
enum Sniffed {
    /// The head is incomplete: wait for more bytes.
    Wait,
    /// On to the websocket handshake.
    Websocket,
    /// Consume `head` bytes, write `response`, close; `nip11` if it is the
    /// relay information document (counted).
    Answer {
        head: usize,
        response: Vec<u8>,
        nip11: bool,
    },
}

impl Farm {
    /// A connection to a relay serving HTTP, before its handshake: a
    /// request answered over HTTP is answered and the connection closed
    /// (false); any other request goes on to the websocket handshake
    /// (true); an incomplete head waits for more bytes (false).
    pub(super) fn sniff(&mut self, key: usize) -> bool {
        let Some((relay, own)) = self.conns.get(key).map(|c| (c.relay, Arc::clone(&c.own))) else {
            return false;
        };
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        let Phase::Sniffing(stream) = &mut conn.phase else {
            return true;
        };
        let mut buf = vec![0u8; MAX_HEAD];
        let socket = stream.transport_mut();
        let (seen, arrived) = match socket.peek(&mut buf) {
            Ok((0, _)) => {
                self.close(key);
                return false;
            }
            Ok(seen) => seen,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return false,
            Err(_) => {
                self.close(key);
                return false;
            }
        };
        match self.read_head(relay, &buf[..seen]) {
            // Readiness is edge-triggered: the rest of the head raises
            // another event.
            Sniffed::Wait => false,
            Sniffed::Websocket => {
                let own_client = self.own_client(&own);
                self.begin_websocket(key, self.ws_config_for(relay), own_client)
            }
            Sniffed::Answer {
                head,
                response,
                nip11,
            } => {
                // Behind a link the answer is written straight to the
                // socket (the connection closes after it), so the way
                // back's half round trip is waited out before it.
                let back = self.conns.get_mut(key).and_then(Conn::delay).and_then(|d| {
                    let at = arrived + d.half_rtt();
                    (at > Instant::now()).then(|| d.wake_at(at))
                });
                if back.is_none() {
                    self.answer_http(key, head, &response, nip11);
                }
                false
            }
        }
    }

    /// What relay `relay` makes of a connection's first bytes.
    fn read_head(&self, relay: usize, bytes: &[u8]) -> Sniffed {
        let profile = &self.relays[relay].profile;
        if let Some(limits) = &profile.strfry {
            return match classify_http_strfry(bytes) {
                StrfryHead::Incomplete => Sniffed::Wait,
                StrfryHead::Websocket => Sniffed::Websocket,
                StrfryHead::Nip11(head) => Sniffed::Answer {
                    head,
                    response: strfry_nip11_response(&strfry_nip11_document(
                        limits,
                        !profile.no_negentropy,
                    )),
                    nip11: true,
                },
                StrfryHead::Landing(head) => Sniffed::Answer {
                    head,
                    response: strfry_landing_response(),
                    nip11: false,
                },
            };
        }
        match classify_http(bytes) {
            HttpHead::Incomplete => Sniffed::Wait,
            HttpHead::Other => Sniffed::Websocket,
            HttpHead::Nip11(head) => Sniffed::Answer {
                head,
                response: nip11_response(&nip11_document(&self.limitation(relay))),
                nip11: true,
            },
        }
    }

    /// Moves a sniffed connection on to its websocket handshake; false if
    /// that failed (the connection is closed).
    fn begin_websocket(&mut self, key: usize, ws_config: WebSocketConfig, own: OwnClient) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        let Phase::Sniffing(stream) = std::mem::replace(&mut conn.phase, Phase::Closed) else {
            return false;
        };
        match Farm::start_handshake(stream, ws_config, own) {
            Some(phase) => {
                conn.phase = phase;
                true
            }
            None => {
                self.close(key);
                false
            }
        }
    }

    /// Consumes the `head` bytes of a request, writes `response` and closes
    /// the connection.
    fn answer_http(&mut self, key: usize, head: usize, response: &[u8], nip11: bool) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let Phase::Sniffing(stream) = &mut conn.phase else {
            return;
        };
        let socket = stream.transport_mut();
        // Consumed first (through the link, which holds what was peeked):
        // closing with unread bytes would reset the connection and could
        // lose the answer. The answers are small: one write fits an empty
        // socket buffer.
        let mut consumed = vec![0u8; head];
        let served =
            socket.read_exact(&mut consumed).is_ok() && socket.tcp.write_all(response).is_ok();
        let tcp = &mut socket.tcp;
        if served && nip11 {
            self.counters.info_served.fetch_add(1, Ordering::Relaxed);
        }
        let _ = tcp.shutdown(Shutdown::Write);
        self.close(key);
    }

    /// The websocket settings of relay `relay`'s connections: the farm's,
    /// with strfry's message size limit on a strfry relay (a larger frame
    /// or message is an error, and the farm drops the connection, as
    /// strfry's uWebSockets does past `maxPayload`).
    pub(super) fn ws_config_for(&self, relay: usize) -> WebSocketConfig {
        match &self.relays[relay].profile.strfry {
            Some(limits) => self
                .ws_config
                .max_message_size(Some(limits.max_message_length))
                .max_frame_size(Some(limits.max_message_length)),
            None => self.ws_config,
        }
    }

    /// The NIP-11 `limitation` of relay `relay` (not a strfry one: strfry
    /// writes its own, see [`strfry_nip11_document`]).
    fn limitation(&self, relay: usize) -> Limitation {
        let cap = self.relays[relay]
            .profile
            .max_results_per_filter
            .unwrap_or(usize::MAX)
            .min(self.cap);
        Limitation {
            max_limit: (cap != usize::MAX).then_some(cap),
            max_subscriptions: self.max_subscriptions.map(|(n, _)| n),
            max_filters: None,
            max_message_length: None,
        }
    }
}
