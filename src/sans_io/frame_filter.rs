//! A relay's websocket frames, seen as their bytes arrive and before the
//! websocket library buffers them.
//!
//! Every byte a relay can make us hold has a per-connection cap and a
//! global cap, and reaching a cap costs that relay, never the others or the
//! own relay's data. The websocket library enforces the per-connection
//! size caps but cannot tell us what it holds, nor skip a frame it refused.
//! So the shell passes a relay's bytes through a [`FrameFilter`] first,
//! which reads the frame headers (server frames are unmasked, so a header
//! is 2 to 10 bytes) and:
//!
//! - counts every frame and byte, whatever its kind (text, binary, ping,
//!   pong, a fragment), so the read budget charges all of them;
//! - skips, without buffering a byte of it, a data message whose first
//!   frame is over the size cap, and reports its length: an honest relay
//!   may store an event larger than we accept, and cutting the connection
//!   over it would cut it again on every re-read of history;
//! - tells whether a message is unfinished (a header, a payload or a
//!   fragmented message in progress), so the shell can give it a deadline,
//!   and how many bytes the library may hold for it, for the global cap.
//!
//! A fragmented message that grows over the cap after its first fragment
//! is passed on: the library refuses it as a protocol violation, which it
//! is (honest relays do not fragment).

use std::io::Cursor;

use tungstenite::protocol::frame::FrameHeader;
use tungstenite::protocol::frame::coding::{Data, OpCode};

/// Bytes of the upgrade response's end: the headers' blank line.
const HEADERS_END: &[u8; 4] = b"\r\n\r\n";

/// The status of an accepted upgrade, at [`STATUS_AT`] in its status line
/// (`HTTP/1.1 101`).
const SWITCHING: &[u8; 3] = b"101";

/// Where the status code starts in the status line.
const STATUS_AT: usize = 9;

/// Longest frame header: 2 bytes, 8 of extended length, 4 of mask.
const MAX_HEADER: usize = 14;

/// Bytes that cost one frame against the read budget: a frame costs one,
/// and one more per this many bytes, so large frames are not free.
pub(crate) const BYTES_PER_FRAME: u64 = 4 * 1024;

/// Where the byte stream stands.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// The HTTP upgrade response: `seen` bytes of it, `matched` bytes of
    /// its blank line, and whether its status is still `101`.
    Upgrade {
        seen: usize,
        matched: usize,
        switching: bool,
    },
    /// Bytes pass untouched, for the library to read and refuse: the body
    /// of a refused upgrade, or a stream after a frame header it will not
    /// take (a reserved opcode).
    Opaque,
    /// A frame header, `len` bytes of it so far.
    Header { buf: [u8; MAX_HEADER], len: usize },
    /// A frame's payload: `remaining` bytes still to come.
    Payload { frame: Frame, remaining: u64 },
}

/// A frame whose header was read.
#[derive(Debug, Clone, Copy)]
struct Frame {
    fin: bool,
    /// Text, binary or continuation (not a control frame).
    data: bool,
    len: u64,
    /// Passed on to the library (else skipped).
    pass: bool,
}

/// The filter over one connection's incoming bytes.
#[derive(Debug)]
pub(crate) struct FrameFilter {
    /// Largest data frame passed on.
    cap: u64,
    phase: Phase,
    /// Frames whose header was read.
    frames: u64,
    /// Bytes fed after the upgrade response.
    bytes: u64,
    /// Payload bytes of the passed fragments of an unfinished message.
    message_bytes: u64,
    /// A fragmented message passed on is unfinished.
    in_message: bool,
    /// Bytes of a message being skipped, while its fragments come.
    skipping: Option<u64>,
    /// Lengths of the messages skipped, not yet taken.
    skipped: Vec<u64>,
}

impl FrameFilter {
    /// A filter for a new connection, starting at the upgrade response;
    /// data messages whose first frame is over `cap` bytes are skipped.
    pub(crate) fn new(cap: usize) -> FrameFilter {
        FrameFilter {
            cap: cap as u64,
            phase: Phase::Upgrade {
                seen: 0,
                matched: 0,
                switching: true,
            },
            frames: 0,
            bytes: 0,
            message_bytes: 0,
            in_message: false,
            skipping: None,
            skipped: Vec::new(),
        }
    }

    /// Filters `input`, appending the bytes the library should see to `out`.
    pub(crate) fn filter(&mut self, input: &[u8], out: &mut Vec<u8>) {
        let mut i = 0;
        while i < input.len() {
            match &mut self.phase {
                Phase::Upgrade {
                    seen,
                    matched,
                    switching,
                } => {
                    let b = input[i];
                    i += 1;
                    out.push(b);
                    if let Some(expected) =
                        seen.checked_sub(STATUS_AT).and_then(|k| SWITCHING.get(k))
                    {
                        *switching &= b == *expected;
                    }
                    *seen += 1;
                    *matched = next_match(*matched, b);
                    if *matched == HEADERS_END.len() {
                        self.phase = if *switching {
                            empty_header()
                        } else {
                            Phase::Opaque
                        };
                    }
                }
                Phase::Opaque => {
                    out.extend_from_slice(&input[i..]);
                    i = input.len();
                }
                Phase::Header { buf, len } => {
                    buf[*len] = input[i];
                    *len += 1;
                    i += 1;
                    self.bytes += 1;
                    let (buf, len) = (*buf, *len);
                    let raw = &buf[..len];
                    match FrameHeader::parse(&mut Cursor::new(raw)) {
                        Ok(None) => {}
                        Ok(Some((header, payload))) => {
                            self.start_frame(&header, payload, raw, out);
                        }
                        Err(_) => {
                            out.extend_from_slice(raw);
                            self.phase = Phase::Opaque;
                        }
                    }
                }
                Phase::Payload { frame, remaining } => {
                    let n = (*remaining).min((input.len() - i) as u64) as usize;
                    if frame.pass {
                        out.extend_from_slice(&input[i..i + n]);
                    }
                    i += n;
                    self.bytes += n as u64;
                    *remaining -= n as u64;
                    if *remaining == 0 {
                        let frame = *frame;
                        self.end_frame(frame);
                    }
                }
            }
        }
    }

    /// Frames seen, each costing one, plus one per [`BYTES_PER_FRAME`]
    /// bytes: what the read budget charges.
    pub(crate) fn cost(&self) -> u64 {
        self.frames + self.bytes / BYTES_PER_FRAME
    }

    /// True while a frame or a fragmented message is in progress.
    pub(crate) fn unfinished(&self) -> bool {
        let mid_frame = match self.phase {
            Phase::Upgrade { .. } | Phase::Opaque => false,
            Phase::Header { len, .. } => len > 0,
            Phase::Payload { .. } => true,
        };
        mid_frame || self.in_message || self.skipping.is_some()
    }

    /// Bytes the library may hold for the unfinished message: its passed
    /// fragments and the whole length of the frame in progress (the
    /// library reserves it when the header arrives).
    pub(crate) fn held(&self) -> u64 {
        let frame = match self.phase {
            Phase::Payload { frame, .. } if frame.pass && frame.data => frame.len,
            _ => 0,
        };
        self.message_bytes + frame
    }

    /// Lengths of the messages skipped since the last call.
    pub(crate) fn take_skipped(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.skipped)
    }

    /// A header (`raw`, parsed as `header` announcing `len` payload bytes)
    /// is complete: decide whether the frame passes.
    fn start_frame(&mut self, header: &FrameHeader, len: u64, raw: &[u8], out: &mut Vec<u8>) {
        self.frames += 1;
        let frame = Frame {
            fin: header.is_final,
            data: matches!(header.opcode, OpCode::Data(_)),
            len,
            pass: true,
        };
        let first = matches!(header.opcode, OpCode::Data(Data::Text | Data::Binary));
        let skip = frame.data
            && (self.skipping.is_some() || (first && !self.in_message && frame.len > self.cap));
        let frame = Frame {
            pass: !skip,
            ..frame
        };
        if frame.pass {
            out.extend_from_slice(raw);
        }
        self.phase = Phase::Payload {
            frame,
            remaining: frame.len,
        };
        if frame.len == 0 {
            self.end_frame(frame);
        }
    }

    /// A frame's payload is complete: the message state moves on.
    fn end_frame(&mut self, frame: Frame) {
        self.phase = empty_header();
        if !frame.data {
            return;
        }
        if !frame.pass {
            let total = self.skipping.unwrap_or(0) + frame.len;
            self.skipping = (!frame.fin).then_some(total);
            if frame.fin {
                self.skipped.push(total);
            }
            return;
        }
        self.in_message = !frame.fin;
        self.message_bytes = if frame.fin {
            0
        } else {
            self.message_bytes + frame.len
        };
    }
}

fn empty_header() -> Phase {
    Phase::Header {
        buf: [0; MAX_HEADER],
        len: 0,
    }
}

/// Bytes of the headers' blank line matched after `b`, having matched
/// `matched` before it.
fn next_match(matched: usize, b: u8) -> usize {
    if b == HEADERS_END[matched] {
        matched + 1
    } else if b == b'\r' {
        1
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UPGRADE: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";

    /// An unmasked server frame.
    fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![if fin { 0x80 } else { 0 } | opcode];
        match payload.len() {
            n if n < 126 => f.push(n as u8),
            n if n < 65_536 => {
                f.push(126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(payload);
        f
    }

    /// Feeds `input` in `chunk`-byte pieces; returns what passed.
    fn run(filter: &mut FrameFilter, input: &[u8], chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for piece in input.chunks(chunk) {
            filter.filter(piece, &mut out);
        }
        out
    }

    #[test]
    fn honest_frames_pass_unchanged_in_any_chunking() {
        let mut input = UPGRADE.to_vec();
        input.extend(frame(true, 1, b"[\"EOSE\",\"s\"]"));
        input.extend(frame(true, 0xA, b""));
        input.extend(frame(true, 2, &[7; 300]));
        input.extend(frame(true, 1, &[b'x'; 70_000]));
        for chunk in [1, 3, 7, 4096, input.len()] {
            let mut f = FrameFilter::new(100_000);
            assert_eq!(run(&mut f, &input, chunk), input, "chunk {chunk}");
            assert_eq!(f.frames, 4);
            assert!(!f.unfinished());
            assert_eq!(f.held(), 0);
        }
    }

    #[test]
    fn every_frame_and_every_4_kib_cost_one() {
        let mut f = FrameFilter::new(1 << 20);
        let mut input = UPGRADE.to_vec();
        for _ in 0..10 {
            input.extend(frame(true, 0x9, b"ping"));
        }
        input.extend(frame(true, 2, &vec![0; 1 << 20]));
        run(&mut f, &input, 4096);
        assert_eq!(f.frames, 11);
        assert_eq!(f.cost(), 11 + (1 << 20) / BYTES_PER_FRAME);
    }

    #[test]
    fn an_oversize_message_is_skipped_and_reported_once() {
        let mut f = FrameFilter::new(1_000);
        let big = frame(true, 1, &[b'x'; 5_000]);
        let small = frame(true, 1, b"[\"EOSE\",\"s\"]");
        let mut input = UPGRADE.to_vec();
        input.extend(&big);
        input.extend(&small);
        let out = run(&mut f, &input, 512);
        let mut expected = UPGRADE.to_vec();
        expected.extend(&small);
        assert_eq!(out, expected);
        assert_eq!(f.take_skipped(), vec![5_000]);
        assert!(f.take_skipped().is_empty());
    }

    #[test]
    fn a_skipped_message_takes_its_fragments_and_lets_pongs_through() {
        let mut f = FrameFilter::new(1_000);
        let mut input = UPGRADE.to_vec();
        input.extend(frame(false, 1, &[b'x'; 2_000]));
        let pong = frame(true, 0xA, b"");
        input.extend(&pong);
        input.extend(frame(true, 0, &[b'y'; 10]));
        let out = run(&mut f, &input, 100);
        let mut expected = UPGRADE.to_vec();
        expected.extend(&pong);
        assert_eq!(out, expected);
        assert_eq!(f.take_skipped(), vec![2_010]);
        assert!(!f.unfinished());
    }

    #[test]
    fn an_unfinished_message_is_seen_with_what_it_holds() {
        let mut f = FrameFilter::new(1 << 20);
        let mut out = Vec::new();
        f.filter(UPGRADE, &mut out);
        assert!(!f.unfinished());
        f.filter(&frame(false, 1, &[b'x'; 100]), &mut out);
        assert!(f.unfinished());
        assert_eq!(f.held(), 100);
        f.filter(&frame(true, 0xA, b""), &mut out);
        assert!(f.unfinished(), "a pong does not finish it");
        let next = frame(true, 0, &[b'y'; 50_000]);
        f.filter(&next[..10], &mut out);
        assert_eq!(f.held(), 100 + 50_000, "the frame's length is reserved");
        f.filter(&next[10..], &mut out);
        assert!(!f.unfinished());
        assert_eq!(f.held(), 0);
    }

    #[test]
    fn a_refused_upgrade_body_passes_untouched() {
        let mut f = FrameFilter::new(10);
        let mut input = b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 40\r\n\r\n".to_vec();
        input.extend_from_slice(&[0x81, 0x7e, 0xff, 0xff]);
        input.extend_from_slice(&[b'x'; 36]);
        assert_eq!(run(&mut f, &input, 5), input);
        assert_eq!(f.frames, 0);
    }

    #[test]
    fn a_reserved_opcode_leaves_the_rest_to_the_library_untouched() {
        let mut input = UPGRADE.to_vec();
        input.extend(frame(true, 3, &[b'x'; 20]));
        input.extend(frame(true, 1, &[b'y'; 20]));
        let mut f = FrameFilter::new(10);
        assert_eq!(run(&mut f, &input, 3), input);
        assert!(!f.unfinished());
    }

    #[test]
    fn half_a_header_is_unfinished() {
        let mut f = FrameFilter::new(10);
        let mut out = Vec::new();
        f.filter(UPGRADE, &mut out);
        f.filter(&[0x81], &mut out);
        assert!(f.unfinished());
    }
}
