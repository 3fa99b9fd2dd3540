//! A relay's websocket bytes are anyone's: reading them must never panic,
//! and must not depend on how the socket cut them into reads (the same
//! messages, the same violation, whatever the split). What a connection
//! holds stays within the size cap (twice, for a growing buffer), an
//! unfinished message is only ever one that is in progress, and a text
//! message handed on is within the cap.

#![no_main]

use arbitrary::Arbitrary;
use grasp_sync::internal::{Incoming, Violation, WsReader};
use libfuzzer_sys::fuzz_target;

/// Longest control frame payload (RFC 6455).
const MAX_CONTROL: u64 = 125;

#[derive(Arbitrary, Debug)]
struct Input {
    /// The size cap, small so inputs reach past it.
    cap: u16,
    /// Sizes of the reads, cycled.
    reads: Vec<u8>,
    bytes: Vec<u8>,
}

/// Feeds `bytes` in reads of `sizes` (cycled; all at once if none),
/// checking the bounds after each.
fn read(cap: u16, bytes: &[u8], sizes: &[u8]) -> (Vec<Incoming>, Option<Violation>) {
    let mut reader = WsReader::new(cap as usize);
    let bound = 2 * (u64::from(cap) + MAX_CONTROL) + 64;
    let mut out = Vec::new();
    let mut sizes = sizes.iter().map(|s| usize::from(*s).max(1)).cycle();
    let mut at = 0;
    while at < bytes.len() {
        let end = (at + sizes.next().unwrap_or(bytes.len())).min(bytes.len());
        let result = reader.handle_bytes(&bytes[at..end], &mut out);
        assert!(reader.held() <= bound, "{} held, cap {cap}", reader.held());
        if let Err(v) = result {
            assert!(!reader.unfinished(), "a violation ends the message");
            assert_eq!(reader.held(), 0, "a violation frees what was held");
            assert!(reader.handle_bytes(b"\x81\x00", &mut Vec::new()).is_err());
            return (out, Some(v));
        }
        at = end;
    }
    if matches!(out.last(), Some(Incoming::Close(_))) {
        assert!(!reader.unfinished(), "nothing is read after a close");
    }
    (out, None)
}

fuzz_target!(|input: Input| {
    let whole = read(input.cap, &input.bytes, &[]);
    let split = read(input.cap, &input.bytes, &input.reads);
    assert_eq!(whole, split, "the split changed what was read");
    for message in &whole.0 {
        if let Incoming::Text(text) = message {
            assert!(text.len() <= input.cap as usize, "a text over the cap");
        }
    }
});
