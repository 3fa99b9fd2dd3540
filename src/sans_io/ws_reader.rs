//! A relay's websocket frames, read from bytes the shell hands over, with
//! nothing kept per connection but an unfinished frame or message.
//!
//! Every byte a relay can make us hold has a per-connection cap and a
//! global cap, and reaching a cap costs that relay, never the others or the
//! own relay's data. The shell reads every socket into one loop-wide
//! buffer and passes the bytes here; a frame that arrived whole becomes its
//! message straight from that buffer. Only the bytes of a text message
//! still in progress (a frame cut by a read, or a fragmented message) are
//! copied and kept, and their buffer is freed as soon as the message is
//! complete, so an idle connection holds no buffer at all. Binary messages
//! are counted, never kept: nothing here uses them. Frame headers are
//! parsed by tungstenite ([`FrameHeader::parse`]); the protocol's rules
//! (RFC 6455, as tungstenite's client applies them) are checked here:
//!
//! - every frame and byte counts, whatever its kind (text, binary, ping,
//!   pong, a fragment), so the read budget charges all of them
//!   ([`WsReader::cost`]);
//! - a data message whose first frame is over the size cap is skipped
//!   without keeping a byte of it, and reported with its length: an honest
//!   relay may store an event larger than we accept, and cutting the
//!   connection over it would cut it again on every re-read of history;
//! - a fragmented message that grows over the cap after its first fragment
//!   is a protocol violation (honest relays do not fragment);
//! - whether a message is unfinished and how many bytes it holds are
//!   visible, so the shell can give it a deadline and a global cap;
//! - a close frame ends the reading: nothing after it is looked at.

use std::io::Cursor;

use tungstenite::protocol::CloseFrame;
use tungstenite::protocol::frame::FrameHeader;
use tungstenite::protocol::frame::coding::{CloseCode, Control, Data, OpCode};

/// Bytes that cost one frame against the read budget: a frame costs one,
/// and one more per this many bytes, so large frames are not free.
pub(crate) const BYTES_PER_FRAME: u64 = 4 * 1024;

/// Longest frame header: 2 bytes, 8 of extended length, 4 of mask.
const MAX_HEADER: usize = 14;

/// Longest control frame payload (RFC 6455, 5.5).
const MAX_CONTROL: u64 = 125;

/// A message (or control frame) read from a relay.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Incoming {
    /// A complete text message.
    Text(String),
    /// A complete binary message of this many bytes (its bytes are not kept).
    Binary(u64),
    /// A ping with its payload; the shell answers it.
    Ping(Vec<u8>),
    /// A pong with its payload.
    Pong(Vec<u8>),
    /// The relay closes; nothing after it is read.
    Close(Option<CloseFrame>),
    /// A data message of this many bytes, over the size cap, was skipped.
    Oversized(u64),
}

/// The relay broke the websocket protocol; the connection must end. The
/// text is for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation(pub(crate) String);

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a data message in progress is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Text: its bytes are kept until it is complete.
    Text,
    /// Binary: only counted.
    Binary,
    /// Over the cap: only counted, then reported as oversized.
    Skipped,
}

/// A frame whose header was read.
#[derive(Debug, Clone, Copy)]
struct Frame {
    fin: bool,
    /// `None` for a data frame (the message's kind says what it is).
    control: Option<Control>,
}

/// Where the byte stream stands.
#[derive(Debug, Clone, Copy)]
enum Stage {
    /// A frame header, `len` bytes of it so far.
    Header { buf: [u8; MAX_HEADER], len: usize },
    /// A frame's payload: `remaining` bytes still to come.
    Payload { frame: Frame, remaining: u64 },
    /// A close frame was read: nothing more is.
    Closed,
    /// The relay broke the protocol: nothing more is.
    Failed,
}

/// The reader of one connection's incoming frames (server to client, so
/// unmasked), from the first byte after the upgrade response.
#[derive(Debug)]
pub(crate) struct WsReader {
    /// Largest data message taken, bytes.
    cap: u64,
    stage: Stage,
    /// The data message in progress, if one is, and its bytes so far.
    message: Option<(Kind, u64)>,
    /// Bytes of the text message in progress, when a read cut it.
    text: Vec<u8>,
    /// Bytes of the control frame in progress, when a read cut it.
    control: Vec<u8>,
    /// Frames whose header was read.
    frames: u64,
    /// Bytes read.
    bytes: u64,
}

impl WsReader {
    /// A reader whose data messages over `cap` bytes are skipped (or, when
    /// fragmented, a violation).
    pub(crate) fn new(cap: usize) -> WsReader {
        WsReader {
            cap: cap as u64,
            stage: empty_header(),
            message: None,
            text: Vec::new(),
            control: Vec::new(),
            frames: 0,
            bytes: 0,
        }
    }

    /// Reads `input`, appending what it completes to `out`. After a close
    /// frame the rest is ignored; after a violation every call fails.
    pub(crate) fn handle_bytes(
        &mut self,
        input: &[u8],
        out: &mut Vec<Incoming>,
    ) -> Result<(), Violation> {
        let mut i = 0;
        loop {
            let rest = &input[i..];
            let taken = match self.stage {
                // An empty payload completes without a byte more.
                Stage::Payload { frame, remaining } if remaining == 0 || !rest.is_empty() => {
                    self.read_payload(frame, remaining, rest, out)?
                }
                _ if rest.is_empty() => return Ok(()),
                Stage::Header { .. } => self.read_header(rest)?,
                Stage::Payload { .. } | Stage::Closed => return Ok(()),
                Stage::Failed => return Err(Violation("read after a violation".to_owned())),
            };
            self.bytes += taken as u64;
            i += taken;
        }
    }

    /// Frames read, each costing one, plus one per [`BYTES_PER_FRAME`]
    /// bytes: what the read budget charges.
    pub(crate) fn cost(&self) -> u64 {
        self.frames + self.bytes / BYTES_PER_FRAME
    }

    /// True while a frame or a fragmented message is in progress.
    pub(crate) fn unfinished(&self) -> bool {
        let mid_frame = match self.stage {
            Stage::Header { len, .. } => len > 0,
            Stage::Payload { .. } => true,
            Stage::Closed | Stage::Failed => false,
        };
        mid_frame || self.message.is_some()
    }

    /// Bytes held for the unfinished message (and control frame).
    pub(crate) fn held(&self) -> u64 {
        (self.text.capacity() + self.control.capacity()) as u64
    }

    /// Takes header bytes from `input`; returns how many.
    fn read_header(&mut self, input: &[u8]) -> Result<usize, Violation> {
        let Stage::Header { mut buf, len } = self.stage else {
            return Ok(0);
        };
        let n = (MAX_HEADER - len).min(input.len());
        buf[len..len + n].copy_from_slice(&input[..n]);
        let mut cursor = Cursor::new(&buf[..len + n]);
        match FrameHeader::parse(&mut cursor) {
            Ok(None) => {
                self.stage = Stage::Header { buf, len: len + n };
                Ok(n)
            }
            Ok(Some((header, payload))) => {
                // The cursor stops at the header's end, within `len + n`.
                let taken = cursor.position() as usize - len;
                self.start_frame(&header, payload)?;
                Ok(taken)
            }
            Err(e) => self.fail(format!("frame header: {e}")),
        }
    }

    /// A header announcing `len` payload bytes is read: check it against
    /// the protocol and the message in progress.
    fn start_frame(&mut self, header: &FrameHeader, len: u64) -> Result<(), Violation> {
        self.frames += 1;
        if header.rsv1 || header.rsv2 || header.rsv3 {
            return self.fail("reserved bits set".to_owned());
        }
        if header.mask.is_some() {
            return self.fail("masked frame from the server".to_owned());
        }
        let frame = Frame {
            fin: header.is_final,
            control: match header.opcode {
                OpCode::Control(c) => Some(c),
                OpCode::Data(_) => None,
            },
        };
        match header.opcode {
            OpCode::Control(_) if !frame.fin => self.fail("fragmented control frame".to_owned())?,
            OpCode::Control(_) if len > MAX_CONTROL => {
                self.fail(format!("control frame of {len} bytes"))?
            }
            OpCode::Control(_) => {}
            OpCode::Data(data) => self.start_data(data, len)?,
        }
        self.stage = Stage::Payload {
            frame,
            remaining: len,
        };
        Ok(())
    }

    /// A data frame of `len` bytes starts: a message, or its next fragment.
    fn start_data(&mut self, data: Data, len: u64) -> Result<(), Violation> {
        let first = match data {
            Data::Text => Kind::Text,
            Data::Binary => Kind::Binary,
            Data::Continue => {
                let Some((kind, so_far)) = self.message else {
                    return self.fail("continuation frame without a message".to_owned());
                };
                let total = so_far.saturating_add(len);
                if kind != Kind::Skipped && total > self.cap {
                    return self.fail(format!("fragmented message over {} bytes", self.cap));
                }
                self.message = Some((kind, total));
                return Ok(());
            }
            Data::Reserved(op) => return self.fail(format!("reserved opcode {op}")),
        };
        if self.message.is_some() {
            return self.fail("new message inside a fragmented one".to_owned());
        }
        let kind = if len > self.cap { Kind::Skipped } else { first };
        self.message = Some((kind, len));
        Ok(())
    }

    /// Takes payload bytes of `frame` (`remaining` still to come) from
    /// `input`; returns how many.
    fn read_payload(
        &mut self,
        frame: Frame,
        remaining: u64,
        input: &[u8],
        out: &mut Vec<Incoming>,
    ) -> Result<usize, Violation> {
        let n = remaining.min(input.len() as u64) as usize;
        let bytes = &input[..n];
        let remaining = remaining - n as u64;
        let keep = match frame.control {
            Some(_) => Some(&mut self.control),
            None if matches!(self.message, Some((Kind::Text, _))) => Some(&mut self.text),
            None => None,
        };
        // A frame that arrives whole in this read, and is all of its
        // message, is taken from the read without a copy kept.
        let last = frame.fin || frame.control.is_some();
        let whole = last && remaining == 0 && keep.as_ref().is_some_and(|k| k.is_empty());
        if let Some(keep) = keep
            && !whole
        {
            keep.extend_from_slice(bytes);
        }
        if remaining > 0 {
            self.stage = Stage::Payload { frame, remaining };
            return Ok(n);
        }
        self.stage = empty_header();
        let payload = whole.then_some(bytes);
        match frame.control {
            Some(control) => self.end_control(control, payload, out)?,
            None if frame.fin => self.end_message(payload, out)?,
            None => {}
        }
        Ok(n)
    }

    /// A control frame is complete; `whole` is its payload when it
    /// arrived in one read (else it is in `self.control`).
    fn end_control(
        &mut self,
        control: Control,
        whole: Option<&[u8]>,
        out: &mut Vec<Incoming>,
    ) -> Result<(), Violation> {
        let payload = match whole {
            Some(bytes) => bytes.to_vec(),
            None => std::mem::take(&mut self.control),
        };
        match control {
            Control::Ping => out.push(Incoming::Ping(payload)),
            Control::Pong => out.push(Incoming::Pong(payload)),
            Control::Close => {
                let frame = close_frame(&payload).map_err(|e| self.violation(e))?;
                out.push(Incoming::Close(frame));
                self.stage = Stage::Closed;
            }
            Control::Reserved(op) => return self.fail(format!("reserved opcode {op}")),
        }
        Ok(())
    }

    /// A data message is complete; `whole` is its last frame's payload
    /// when it arrived in one read and is all of the message.
    fn end_message(
        &mut self,
        whole: Option<&[u8]>,
        out: &mut Vec<Incoming>,
    ) -> Result<(), Violation> {
        let Some((kind, total)) = self.message.take() else {
            return Ok(());
        };
        match kind {
            Kind::Binary => out.push(Incoming::Binary(total)),
            Kind::Skipped => out.push(Incoming::Oversized(total)),
            Kind::Text => {
                let bytes = match whole {
                    Some(bytes) => bytes.to_vec(),
                    None => std::mem::take(&mut self.text),
                };
                match String::from_utf8(bytes) {
                    Ok(text) => out.push(Incoming::Text(text)),
                    Err(_) => return self.fail("text message not UTF-8".to_owned()),
                }
            }
        }
        Ok(())
    }

    /// Ends the reading with a violation, freeing what was held.
    fn fail<T>(&mut self, reason: String) -> Result<T, Violation> {
        Err(self.violation(reason))
    }

    fn violation(&mut self, reason: String) -> Violation {
        self.stage = Stage::Failed;
        self.message = None;
        self.text = Vec::new();
        self.control = Vec::new();
        Violation(reason)
    }
}

/// A close frame's payload, parsed as tungstenite's client does: empty, or
/// a code and a UTF-8 reason; a code not allowed on the wire becomes
/// "protocol error", which is what the reply carries.
fn close_frame(payload: &[u8]) -> Result<Option<CloseFrame>, String> {
    match payload {
        [] => Ok(None),
        [_] => Err("close frame of one byte".to_owned()),
        [hi, lo, reason @ ..] => {
            let reason = std::str::from_utf8(reason)
                .map_err(|_| "close reason not UTF-8".to_owned())?
                .to_owned();
            let code = CloseCode::from(u16::from_be_bytes([*hi, *lo]));
            Ok(Some(match code.is_allowed() {
                true => CloseFrame {
                    code,
                    reason: reason.into(),
                },
                false => CloseFrame {
                    code: CloseCode::Protocol,
                    reason: "Protocol violation".into(),
                },
            }))
        }
    }
}

fn empty_header() -> Stage {
    Stage::Header {
        buf: [0; MAX_HEADER],
        len: 0,
    }
}
