//! The client side of the websocket upgrade, over bytes the caller moves.
//!
//! tungstenite writes the request ([`generate_request`]), parses the
//! response head ([`TryParse`]) and derives the key the response must carry
//! ([`derive_accept_key`]); the bytes are ours. Its handshake machine
//! gives every connection a read buffer of 8 KiB (a 4 KiB chunk and a
//! 4 KiB store) for the few hundred bytes of a response: at 5,000 relays
//! connecting at once that was 19 MB, freed moments later in pieces
//! between the connections' long-lived state, and the heap kept the holes.
//! Here the response is read through the loop-wide buffer, and a
//! connection keeps bytes of its own only when the head arrives in pieces.

use tungstenite::client::IntoClientRequest;
use tungstenite::handshake::client::{Response, generate_request};
use tungstenite::handshake::derive_accept_key;
use tungstenite::handshake::machine::TryParse;

/// Longest response head taken. Relays answer the upgrade in a few hundred
/// bytes; this bounds what a hostile one makes us hold.
const MAX_HEAD: usize = 16 * 1024;

/// A websocket upgrade in flight.
#[derive(Debug)]
pub(crate) struct Upgrade {
    /// The request, and how much of it the socket took.
    request: Vec<u8>,
    sent: usize,
    /// What the response's `Sec-WebSocket-Accept` must be.
    accept: String,
    /// The response head so far, when it came in pieces (empty otherwise).
    head: Vec<u8>,
}

/// What the bytes of one read did to the upgrade.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The head is not complete yet.
    More,
    /// The websocket is open; the read's bytes from this offset on are
    /// frames the relay sent right behind its response.
    Open { frames_from: usize },
    /// The relay answered with this HTTP status instead (e.g. 429 or 503).
    Refused(u16),
    /// The response is not a websocket upgrade we asked for.
    Failed(String),
}

impl Upgrade {
    /// The upgrade request for `url` (a normalized `ws://` or `wss://`
    /// URL), with a fresh key.
    pub(crate) fn new(url: &str) -> Result<Upgrade, String> {
        let request = url.into_client_request().map_err(|e| e.to_string())?;
        let (request, key) = generate_request(request).map_err(|e| e.to_string())?;
        Ok(Upgrade {
            request,
            sent: 0,
            accept: derive_accept_key(key.as_bytes()),
            head: Vec::new(),
        })
    }

    /// Request bytes the socket has not taken yet.
    pub(crate) fn unsent(&self) -> &[u8] {
        &self.request[self.sent..]
    }

    /// The socket took `n` more request bytes. The request is dropped
    /// once sent.
    pub(crate) fn advance(&mut self, n: usize) {
        self.sent = (self.sent + n).min(self.request.len());
        if self.sent == self.request.len() {
            self.request = Vec::new();
            self.sent = 0;
        }
    }

    /// Takes the bytes of one read from the socket.
    pub(crate) fn take(&mut self, bytes: &[u8]) -> Step {
        let held = self.head.len();
        let parsed = if held == 0 {
            Response::try_parse(bytes)
        } else {
            self.head.extend_from_slice(bytes);
            Response::try_parse(&self.head)
        };
        match parsed {
            Ok(Some((end, response))) => {
                self.head = Vec::new();
                match self.verify(&response) {
                    Ok(()) => Step::Open {
                        frames_from: end - held,
                    },
                    Err(step) => step,
                }
            }
            Ok(None) if held + bytes.len() > MAX_HEAD => {
                Step::Failed(format!("response head over {MAX_HEAD} bytes"))
            }
            Ok(None) => {
                if held == 0 {
                    self.head.extend_from_slice(bytes);
                }
                Step::More
            }
            Err(e) => Step::Failed(format!("response: {e}")),
        }
    }

    /// RFC 6455 4.1's checks of the response, as tungstenite makes them,
    /// except that `Connection` may list other tokens beside `Upgrade`.
    fn verify(&self, response: &Response) -> Result<(), Step> {
        if response.status().as_u16() != 101 {
            return Err(Step::Refused(response.status().as_u16()));
        }
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
        };
        let fail = |what: &str| Err(Step::Failed(what.to_owned()));
        if !header("Upgrade").eq_ignore_ascii_case("websocket") {
            return fail("no Upgrade: websocket");
        }
        if !header("Connection")
            .split(',')
            .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
        {
            return fail("no Connection: Upgrade");
        }
        if header("Sec-WebSocket-Accept") != self.accept {
            return fail("wrong Sec-WebSocket-Accept");
        }
        if response.headers().contains_key("Sec-WebSocket-Protocol") {
            return fail("a subprotocol we did not ask for");
        }
        // We offer no extension, so any named here is one we did not
        // offer (RFC 6455 4.1: fail): its frames, compressed say, would
        // not read as ours.
        let extensions = response.headers().get_all("Sec-WebSocket-Extensions");
        if extensions
            .iter()
            .any(|v| v.to_str().map_or(true, |v| !v.trim().is_empty()))
        {
            return fail("an extension we did not offer");
        }
        Ok(())
    }

    /// Bytes this upgrade holds of its own.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.request.capacity() + self.head.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key a request carries.
    fn key_of(request: &[u8]) -> String {
        let text = String::from_utf8_lossy(request);
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
            .expect("a key");
        line.trim().to_owned()
    }

    fn response(up: &Upgrade, extra: &str) -> String {
        let accept = derive_accept_key(key_of(&up.request).as_bytes());
        format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n{extra}\r\n"
        )
    }

    #[test]
    fn the_request_is_tungstenites_and_is_dropped_once_sent() {
        let mut up = Upgrade::new("wss://relay.example.com/path").unwrap();
        let text = String::from_utf8(up.unsent().to_vec()).unwrap();
        assert!(text.starts_with("GET /path HTTP/1.1\r\n"), "{text}");
        assert!(text.contains("Host: relay.example.com\r\n"));
        assert!(text.contains("Upgrade: websocket\r\n"));
        assert!(text.contains("Sec-WebSocket-Version: 13\r\n"));
        assert!(!text.contains("Extensions"), "no extension offered");
        let len = up.unsent().len();
        up.advance(10);
        assert_eq!(up.unsent().len(), len - 10);
        up.advance(len);
        assert!(up.unsent().is_empty());
        assert_eq!(up.held(), 0);
    }

    #[test]
    fn a_response_in_any_two_pieces_opens_and_hands_on_the_frames_behind_it() {
        let probe = Upgrade::new("ws://127.0.0.1:7000/").unwrap();
        let head_len = response(&probe, "").len();
        for cut in 0..head_len + 2 {
            let mut up = Upgrade::new("ws://127.0.0.1:7000/").unwrap();
            let whole = format!("{}\u{81}\u{0}", response(&up, ""));
            let (a, b) = whole.as_bytes().split_at(cut);
            // Where the frames begin, counted from the start of `whole`.
            let frames_at = match up.take(a) {
                Step::Open { frames_from } => frames_from,
                Step::More => match up.take(b) {
                    Step::Open { frames_from } => cut + frames_from,
                    other => panic!("cut at {cut}: {other:?}"),
                },
                other => panic!("cut at {cut}: {other:?}"),
            };
            assert_eq!(frames_at, head_len, "cut at {cut}");
            assert!(up.head.is_empty(), "the head is let go");
        }
    }

    #[test]
    fn a_refusal_names_its_status() {
        let mut up = Upgrade::new("ws://127.0.0.1:7000/").unwrap();
        let step = up.take(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 60\r\n\r\n");
        assert_eq!(step, Step::Refused(429));
    }

    #[test]
    fn responses_that_are_not_our_upgrade_fail() {
        type Spoil = fn(&str) -> String;
        let cases: [(&str, Spoil); 5] = [
            ("no upgrade header", |r| {
                r.replace("Upgrade: websocket\r\n", "")
            }),
            ("no connection upgrade", |r| {
                r.replace("Connection: Upgrade", "Connection: keep-alive")
            }),
            ("wrong accept key", |r| {
                r.replace("Sec-WebSocket-Accept: ", "Sec-WebSocket-Accept: x")
            }),
            ("a subprotocol", |r| {
                r.replace("\r\n\r\n", "\r\nSec-WebSocket-Protocol: chat\r\n\r\n")
            }),
            ("an extension", |r| {
                r.replace(
                    "\r\n\r\n",
                    "\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n",
                )
            }),
        ];
        for (what, spoil) in cases {
            let mut up = Upgrade::new("ws://127.0.0.1:7000/").unwrap();
            let text = spoil(&response(&up, ""));
            assert!(
                matches!(up.take(text.as_bytes()), Step::Failed(_)),
                "{what}"
            );
        }
        let mut up = Upgrade::new("ws://127.0.0.1:7000/").unwrap();
        let listed =
            response(&up, "").replace("Connection: Upgrade", "Connection: keep-alive, Upgrade");
        assert!(matches!(up.take(listed.as_bytes()), Step::Open { .. }));
        let mut up = Upgrade::new("ws://127.0.0.1:7000/").unwrap();
        assert!(matches!(
            up.take(b"SSH-2.0-OpenSSH\r\n\r\n"),
            Step::Failed(_)
        ));
    }

    #[test]
    fn a_head_that_never_ends_is_cut_at_the_cap() {
        let mut up = Upgrade::new("ws://127.0.0.1:7000/").unwrap();
        assert_eq!(up.take(b"HTTP/1.1 101 Switching Protocols\r\n"), Step::More);
        assert_eq!(up.take(b"X-Filler: "), Step::More);
        let filler = [b'a'; 1024];
        let mut step = Step::More;
        for _ in 0..MAX_HEAD / filler.len() + 2 {
            step = up.take(&filler);
            if step != Step::More {
                break;
            }
        }
        assert!(matches!(step, Step::Failed(_)), "{step:?}");
        assert!(up.head.len() <= MAX_HEAD + filler.len());
    }
}
