//! A blocking websocket client for tests that talk NIP-01 to a relay
//! directly (the test relay and the relay farm).

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use nostr::prelude::*;

use super::sign;
use serde_json::Value;
use tungstenite::{Message, WebSocket};

/// A client on one websocket.
pub struct Client<S: Read + Write> {
    /// The socket.
    pub ws: WebSocket<S>,
}

/// True for a read that timed out.
pub fn is_timeout(e: &tungstenite::Error) -> bool {
    matches!(e, tungstenite::Error::Io(io)
        if matches!(io.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

impl<S: Read + Write> Client<S> {
    pub fn send(&mut self, text: impl Into<String>) {
        self.ws
            .send(Message::text(text.into()))
            .expect("client sends");
    }

    /// The next text message, as JSON.
    pub fn recv(&mut self) -> Value {
        loop {
            match self.ws.read().expect("a message within 5 s") {
                Message::Text(t) => return serde_json::from_str(t.as_str()).expect("relay JSON"),
                _ => continue,
            }
        }
    }

    /// Publishes and returns the OK's status and message.
    pub fn publish(&mut self, event: &Event) -> (bool, String) {
        self.send(ClientMessage::event(event.clone()).as_json());
        let ok = self.recv();
        assert_eq!(ok[0], "OK", "{ok}");
        assert_eq!(ok[1], event.id.to_hex());
        (
            ok[2].as_bool().expect("status"),
            ok[3].as_str().expect("message").to_owned(),
        )
    }

    pub fn send_req(&mut self, sub: &str, filters: Vec<Filter>) {
        self.send(ClientMessage::req(SubscriptionId::new(sub), filters).as_json());
    }

    /// Sends a REQ and collects its stored events up to EOSE.
    pub fn req(&mut self, sub: &str, filters: Vec<Filter>) -> Vec<Event> {
        self.send_req(sub, filters);
        self.until_eose(sub)
    }

    /// Events for `sub` up to its EOSE; any other message fails the test.
    pub fn until_eose(&mut self, sub: &str) -> Vec<Event> {
        let mut out = Vec::new();
        loop {
            let msg = self.recv();
            match msg[0].as_str() {
                Some("EVENT") if msg[1] == sub => out.push(event_of(&msg)),
                Some("EOSE") if msg[1] == sub => return out,
                _ => panic!("unexpected message while waiting for EOSE of {sub}: {msg}"),
            }
        }
    }

    /// The next message, which must be a live EVENT for `sub`.
    pub fn live(&mut self, sub: &str) -> Event {
        let msg = self.recv();
        assert_eq!(msg[0], "EVENT", "{msg}");
        assert_eq!(msg[1], sub, "{msg}");
        event_of(&msg)
    }

    pub fn close(&mut self, sub: &str) {
        self.send(ClientMessage::close(SubscriptionId::new(sub)).as_json());
    }

    /// Asserts nothing is pending for this client: a REQ matching nothing
    /// gets its EOSE first (replies come in order).
    pub fn assert_quiet(&mut self) {
        let probe = Filter::new().id(EventId::from_byte_array([0; 32]));
        assert!(self.req("probe", vec![probe]).is_empty());
        self.close("probe");
    }

    /// Asserts the relay cut the connection (an error that is no timeout).
    pub fn assert_cut(&mut self) {
        loop {
            match self.ws.read() {
                Ok(_) => continue,
                Err(e) => {
                    assert!(!is_timeout(&e), "cut, not silent: {e}");
                    return;
                }
            }
        }
    }
}

/// The event of an `["EVENT", sub, event]` message.
pub fn event_of(msg: &Value) -> Event {
    let event = Event::from_json(msg[2].to_string()).expect("relay sends valid events");
    event.verify().expect("relay sends signed events");
    event
}

/// Longest a test waits for anything; client reads time out after it.
pub const WAIT: Duration = Duration::from_secs(30);

pub fn note(k: &Keys, created_at: u64, content: &str) -> Event {
    sign(k, 1, created_at, Vec::new(), content)
}

pub fn kinds(k: u16) -> Filter {
    Filter::new().kind(Kind::from_u16(k))
}

pub fn ids(events: &[Event]) -> Vec<EventId> {
    events.iter().map(|e| e.id).collect()
}

/// Polls `cond` every 10 ms for up to [`WAIT`].
pub fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A client of the relay at `url` over plain TCP, its reads bounded by
/// [`WAIT`].
pub fn connect(url: &str) -> Client<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>> {
    let (ws, _) = tungstenite::connect(url).expect("client connects");
    if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_ref() {
        s.set_read_timeout(Some(WAIT)).expect("set read timeout");
    }
    Client { ws }
}

/// One raw HTTP/1.1 `GET /` to a port with extra `headers`; the whole
/// response.
pub fn http_get(port: u16, headers: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    write!(s, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

pub fn letter(c: char) -> SingleLetterTag {
    SingleLetterTag::from_char(c).unwrap()
}
