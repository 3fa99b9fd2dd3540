//! A client's websocket frames on their way out: encoded as client frames
//! must be (masked, by tungstenite's [`Frame::format`]), handed to the
//! socket at once, and only what the socket did not take kept.
//!
//! A frame is written to the socket as soon as it is queued; the buffer
//! holds it only until then, and is freed once everything in it was
//! taken, so an idle connection keeps no write buffer. What is left (a
//! peer reading slowly) is counted, so the shell can hold it to its write
//! cap.

use tungstenite::protocol::frame::Frame;

/// The unsent bytes of one connection's outgoing frames.
#[derive(Debug, Default)]
pub struct WsWriter {
    buf: Vec<u8>,
    /// Bytes of `buf` already sent.
    sent: usize,
}

impl WsWriter {
    /// Encodes `frame` behind what is waiting, masked with `mask` (the
    /// caller draws it at random, per frame, as RFC 6455 asks of clients).
    pub fn queue(&mut self, mut frame: Frame, mask: [u8; 4]) {
        if self.sent > 0 {
            self.buf.drain(..self.sent);
            self.sent = 0;
        }
        frame.header_mut().mask = Some(mask);
        // Writing into a Vec cannot fail.
        frame
            .format(&mut self.buf)
            .expect("writing a frame into a Vec");
    }

    /// Bytes waiting to be sent, in order.
    pub fn unsent(&self) -> &[u8] {
        &self.buf[self.sent..]
    }

    /// How many bytes wait.
    pub fn len(&self) -> u64 {
        (self.buf.len() - self.sent) as u64
    }

    /// Nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The socket took `n` of the waiting bytes; the buffer is freed once
    /// it took all.
    pub fn advance(&mut self, n: usize) {
        self.sent = (self.sent + n).min(self.buf.len());
        if self.sent == self.buf.len() {
            self.buf = Vec::new();
            self.sent = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tungstenite::protocol::frame::FrameHeader;
    use tungstenite::protocol::frame::coding::{Data, OpCode};

    /// Parses one masked frame from `wire`: its header and unmasked payload.
    fn unmask(wire: &[u8]) -> (FrameHeader, Vec<u8>) {
        let mut cursor = std::io::Cursor::new(wire);
        let (header, len) = FrameHeader::parse(&mut cursor).unwrap().unwrap();
        let start = cursor.position() as usize;
        let mask = header.mask.expect("client frames are masked");
        let payload = wire[start..start + len as usize]
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ mask[i % 4])
            .collect();
        (header, payload)
    }

    #[test]
    fn frames_are_masked_queued_in_order_and_freed_once_sent() {
        let mut w = WsWriter::default();
        let text = Frame::message(b"hello".to_vec(), OpCode::Data(Data::Text), true);
        w.queue(text, [1, 2, 3, 4]);
        assert_eq!(w.len(), 2 + 4 + 5);
        let (header, payload) = unmask(w.unsent());
        assert_eq!(header.opcode, OpCode::Data(Data::Text));
        assert_eq!(payload, b"hello");
        w.advance(3);
        w.queue(Frame::ping(b"p".to_vec()), [9, 9, 9, 9]);
        assert_eq!(w.len(), 8 + 7);
        w.advance(8);
        let (header, payload) = unmask(w.unsent());
        assert!(header.is_final);
        assert_eq!(payload, b"p");
        w.advance(7);
        assert_eq!(w.len(), 0);
        assert_eq!(w.buf.capacity(), 0, "an idle writer holds no buffer");
    }

    #[test]
    fn every_length_form_is_encoded() {
        for len in [0, 125, 126, 65_535, 65_536] {
            let mut w = WsWriter::default();
            let frame = Frame::message(vec![7; len], OpCode::Data(Data::Binary), true);
            w.queue(frame, [0xde, 0xad, 0xbe, 0xef]);
            let (_, payload) = unmask(w.unsent());
            assert_eq!(payload, vec![7; len], "length {len}");
        }
    }
}
