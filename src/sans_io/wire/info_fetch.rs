//! The HTTP side of a NIP-11 fetch, sans-IO: the request to send and a
//! response reader fed whatever bytes the socket gave.
//!
//! A relay serves its information document at its websocket URL over plain
//! HTTP (`ws`→`http`, `wss`→`https`, same host, port and path) when asked
//! with `Accept: application/nostr+json`. The shell (`shell`, `ws`) moves
//! the bytes; everything that decides what they mean lives here, so every
//! framing a relay may use and every way a hostile one may break it is a
//! plain unit test.
//!
//! The reader knows just enough HTTP/1.1 for one `GET` with
//! `Connection: close`: a status line (only `200` is a document; interim
//! `1xx` heads are skipped), `Content-Length`, `Transfer-Encoding: chunked`
//! (Go's net/http, behind khatru, sends it when a handler does not set a
//! length) and bodies that run to the end of the connection. Everything is
//! bounded: the head at [`MAX_HEAD_BYTES`], the body at
//! [`MAX_DOCUMENT_BYTES`], the bytes read in all at [`MAX_RESPONSE_BYTES`],
//! so a relay that streams forever costs us 72 KiB and a failed fetch, not
//! memory. No input panics; the worst a relay gets is `Failed`.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use crate::sans_io::wire::relay_info::{MAX_DOCUMENT_BYTES, RelayInfo};

/// Longest response head (status line and headers, interim heads included).
pub(crate) const MAX_HEAD_BYTES: usize = 8 * 1024;

/// Most bytes read for one response: head, body and chunk framing together.
pub(crate) const MAX_RESPONSE_BYTES: usize = MAX_DOCUMENT_BYTES + MAX_HEAD_BYTES;

/// Longest chunk-size or trailer line (extensions included).
const MAX_LINE_BYTES: usize = 1024;

/// How long a fetch may take, connect included, before it is dropped. The
/// document only tunes limits we would otherwise learn from refusals, so a
/// slow relay is not worth waiting for.
pub(crate) const DEADLINE: Duration = Duration::from_secs(10);

/// The `GET` for the information document of the relay at `ws_url` (a
/// normalized `ws://` or `wss://` URL): its path and query, a `Host`
/// header with the port when it is not the default, `Accept:
/// application/nostr+json` and `Connection: close` (one request, then the
/// relay may end the body by closing). `None` for another scheme, an empty
/// host, credentials, or any byte that could split the request (controls,
/// spaces, non-ASCII: the URL parser percent-encodes those, so a URL that
/// still has one did not come from it).
pub(crate) fn request(ws_url: &str) -> Option<Vec<u8>> {
    let (scheme, rest) = ws_url.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("ws") && !scheme.eq_ignore_ascii_case("wss") {
        return None;
    }
    let rest = rest.split('#').next().unwrap_or(rest);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, target) = rest.split_at(end);
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    let safe = |s: &str| s.bytes().all(|b| b.is_ascii_graphic());
    if !safe(authority) || !safe(target) {
        return None;
    }
    let path: Cow<'_, str> = match target.as_bytes().first() {
        None => "/".into(),
        Some(b'?') => format!("/{target}").into(),
        Some(_) => target.into(),
    };
    Some(
        format!(
            "GET {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: application/nostr+json\r\n\
             User-Agent: grasp-sync/{}\r\nConnection: close\r\n\r\n",
            env!("CARGO_PKG_VERSION")
        )
        .into_bytes(),
    )
}

/// The relay limits in a response body: the NIP-11 document, read as
/// leniently as [`RelayInfo::parse`] reads it (a byte-order mark and stray
/// invalid UTF-8 in some text field do not cost the limits).
pub(crate) fn decode_document(body: &[u8]) -> Option<RelayInfo> {
    let body = body.strip_prefix(b"\xef\xbb\xbf").unwrap_or(body);
    RelayInfo::parse(&String::from_utf8_lossy(body))
}

/// Why a response is not a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FetchError {
    /// The relay answered with another status than `200`.
    Status(u16),
    /// Past one of the size caps.
    TooLarge,
    /// The connection ended before the response did.
    Truncated,
    /// Not HTTP as we asked for it (the reason names what).
    Malformed(&'static str),
    /// A framing or encoding we did not ask for (`gzip`, ...).
    Unsupported(&'static str),
    /// Fed again after the response ended (a bug in the caller).
    Ended,
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::Status(s) => write!(f, "HTTP status {s}"),
            FetchError::TooLarge => f.write_str("response too large"),
            FetchError::Truncated => f.write_str("connection closed mid-response"),
            FetchError::Malformed(what) => write!(f, "malformed response: {what}"),
            FetchError::Unsupported(what) => write!(f, "unsupported {what}"),
            FetchError::Ended => f.write_str("response already ended"),
        }
    }
}

impl std::error::Error for FetchError {}

/// Where a response stands after a feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Incomplete; feed more (or [`ResponseReader::finish`] at EOF).
    More,
    /// A `200` response with this body, complete.
    Done(Vec<u8>),
    /// Not a document; stop reading.
    Failed(FetchError),
}

/// How the body of the response is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading the head.
    Head,
    /// `Content-Length`: this many bytes still to come.
    Fixed(usize),
    /// No length: the body ends with the connection.
    ToEof,
    /// Chunked: a chunk-size line.
    ChunkSize,
    /// Chunked: this many data bytes of the current chunk still to come.
    ChunkData(usize),
    /// Chunked: the line end after a chunk's data.
    ChunkEnd,
    /// Chunked: trailer lines after the last chunk, up to an empty one.
    Trailers,
    /// A result was returned.
    Ended,
}

/// Reads one HTTP/1.1 response from bytes fed in any pieces.
///
/// Feeding a response in one piece or byte by byte gives the same
/// [`Progress`]: every state waits for a whole line before deciding.
#[derive(Debug)]
pub(crate) struct ResponseReader {
    state: State,
    /// Bytes fed and not yet consumed (from `pos`).
    buf: Vec<u8>,
    pos: usize,
    /// Head bytes consumed so far, interim heads included.
    head_bytes: usize,
    /// Where the unfinished line of an unfinished head starts (from `pos`):
    /// scanning resumes there, so a head trickled in byte by byte costs
    /// linear time, not quadratic.
    head_scan: usize,
    /// Bytes consumed in all (bytes past the response are never consumed).
    consumed: usize,
    body: Vec<u8>,
}

impl Default for ResponseReader {
    fn default() -> Self {
        ResponseReader::new()
    }
}

impl ResponseReader {
    /// A reader waiting for the status line.
    pub(crate) fn new() -> Self {
        ResponseReader {
            state: State::Head,
            buf: Vec::new(),
            pos: 0,
            head_bytes: 0,
            head_scan: 0,
            consumed: 0,
            body: Vec::new(),
        }
    }

    /// Takes the next bytes the connection gave. Bytes past the end of the
    /// response are ignored.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Progress {
        if self.state == State::Ended {
            return Progress::Failed(FetchError::Ended);
        }
        self.buf.extend_from_slice(bytes);
        match self.run() {
            Ok(None) => {
                // Keep only what is unconsumed: every state consumes or
                // caps what waits (a head, a line), so `buf` never holds
                // more than that plus one read.
                self.buf.drain(..self.pos);
                self.pos = 0;
                Progress::More
            }
            result => self.end(result),
        }
    }

    /// The connection ended (EOF): a body that runs to the end is complete;
    /// anything else still missing bytes is truncated.
    pub(crate) fn finish(&mut self) -> Progress {
        let result = match self.state {
            State::Ended => Err(FetchError::Ended),
            State::ToEof | State::Trailers => Ok(Some(())),
            State::Head
            | State::Fixed(_)
            | State::ChunkSize
            | State::ChunkData(_)
            | State::ChunkEnd => Err(FetchError::Truncated),
        };
        self.end(result)
    }

    /// Turns a terminal result into the [`Progress`] returned, once.
    fn end(&mut self, result: Result<Option<()>, FetchError>) -> Progress {
        if self.state == State::Ended {
            return Progress::Failed(FetchError::Ended);
        }
        self.state = State::Ended;
        self.buf = Vec::new();
        match result {
            Ok(_) => Progress::Done(std::mem::take(&mut self.body)),
            Err(e) => Progress::Failed(e),
        }
    }

    /// Consumes what `buf` holds; `Ok(Some(()))` once the body is complete,
    /// `Ok(None)` when more is needed.
    fn run(&mut self) -> Result<Option<()>, FetchError> {
        loop {
            let available = self.buf.len() - self.pos;
            match self.state {
                State::Head => {
                    let len = match head_end(&self.buf[self.pos..], self.head_scan) {
                        Ok(len) => len,
                        Err(resume) => {
                            self.head_scan = resume;
                            if self.head_bytes + available > MAX_HEAD_BYTES {
                                return Err(FetchError::TooLarge);
                            }
                            return Ok(None);
                        }
                    };
                    self.head_scan = 0;
                    self.head_bytes += len;
                    if self.head_bytes > MAX_HEAD_BYTES {
                        return Err(FetchError::TooLarge);
                    }
                    let head = parse_head(&self.buf[self.pos..self.pos + len])?;
                    self.consume(len)?;
                    self.state = match head {
                        Head::Interim => State::Head,
                        Head::Final(Framing::Length(0)) => return Ok(Some(())),
                        Head::Final(Framing::Length(n)) => State::Fixed(n),
                        Head::Final(Framing::Chunked) => State::ChunkSize,
                        Head::Final(Framing::ToEof) => State::ToEof,
                    };
                }
                State::Fixed(remaining) => {
                    let take = remaining.min(available);
                    self.take_body(take)?;
                    if take == remaining {
                        return Ok(Some(()));
                    }
                    self.state = State::Fixed(remaining - take);
                    return Ok(None);
                }
                State::ToEof => {
                    self.take_body(available)?;
                    return Ok(None);
                }
                State::ChunkSize => {
                    let Some(line) = self.line()? else {
                        return Ok(None);
                    };
                    let size = chunk_size(line)?;
                    if size == 0 {
                        self.state = State::Trailers;
                    } else if size > MAX_DOCUMENT_BYTES - self.body.len() {
                        return Err(FetchError::TooLarge);
                    } else {
                        self.state = State::ChunkData(size);
                    }
                }
                State::ChunkData(remaining) => {
                    let take = remaining.min(available);
                    self.take_body(take)?;
                    if take < remaining {
                        self.state = State::ChunkData(remaining - take);
                        return Ok(None);
                    }
                    self.state = State::ChunkEnd;
                }
                State::ChunkEnd => {
                    let Some(line) = self.line()? else {
                        return Ok(None);
                    };
                    if !line.is_empty() {
                        return Err(FetchError::Malformed("chunk longer than its size"));
                    }
                    self.state = State::ChunkSize;
                }
                State::Trailers => {
                    let Some(line) = self.line()? else {
                        return Ok(None);
                    };
                    if line.is_empty() {
                        return Ok(Some(()));
                    }
                }
                State::Ended => return Err(FetchError::Ended),
            }
        }
    }

    /// Marks `n` buffered bytes read, within the response cap. Checked at
    /// every step, so where the cap bites does not depend on how the bytes
    /// were split into reads.
    fn consume(&mut self, n: usize) -> Result<(), FetchError> {
        self.pos += n;
        self.consumed += n;
        if self.consumed > MAX_RESPONSE_BYTES {
            return Err(FetchError::TooLarge);
        }
        Ok(())
    }

    /// Moves `n` buffered bytes to the body, within the document cap.
    fn take_body(&mut self, n: usize) -> Result<(), FetchError> {
        if self.body.len() + n > MAX_DOCUMENT_BYTES {
            return Err(FetchError::TooLarge);
        }
        self.body
            .extend_from_slice(&self.buf[self.pos..self.pos + n]);
        self.consume(n)
    }

    /// The next whole line (without its `\r\n` or bare `\n`), consumed;
    /// `None` until one has arrived.
    fn line(&mut self) -> Result<Option<&[u8]>, FetchError> {
        let rest = &self.buf[self.pos..];
        let Some(n) = rest.iter().position(|&b| b == b'\n') else {
            if rest.len() > MAX_LINE_BYTES {
                return Err(FetchError::Malformed("line too long"));
            }
            return Ok(None);
        };
        if n > MAX_LINE_BYTES {
            return Err(FetchError::Malformed("line too long"));
        }
        let start = self.pos;
        self.consume(n + 1)?;
        let line = &self.buf[start..start + n];
        Ok(Some(line.strip_suffix(b"\r").unwrap_or(line)))
    }
}

/// The length of a complete head at the start of `bytes` (its blank line
/// included), scanning from `from`, the start of a line. `Err` carries
/// where the unfinished last line starts, to resume from when more bytes
/// came. Bare `\n` line ends are accepted too.
fn head_end(bytes: &[u8], from: usize) -> Result<usize, usize> {
    let mut line_start = from;
    for i in from..bytes.len() {
        if bytes[i] != b'\n' {
            continue;
        }
        let line = &bytes[line_start..i];
        // A blank line before any status line is not a head's end.
        if line_start > 0 && (line.is_empty() || line == b"\r") {
            return Ok(i + 1);
        }
        line_start = i + 1;
    }
    Err(line_start)
}

/// What a head says.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// A `1xx` head; the real one follows.
    Interim,
    /// A `200` head and how its body is framed.
    Final(Framing),
}

#[derive(Debug, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
    ToEof,
}

/// Reads a complete head: the status and, for a `200`, the body framing.
fn parse_head(head: &[u8]) -> Result<Head, FetchError> {
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let status_line = lines.next().unwrap_or_default();
    let status = status_code(status_line)?;
    if (100..200).contains(&status) && status != 101 {
        return Ok(Head::Interim);
    }
    if status != 200 {
        return Err(FetchError::Status(status));
    }
    let mut length: Option<usize> = None;
    let mut too_long = false;
    let mut codings: Vec<Vec<u8>> = Vec::new();
    for line in lines {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            // Blank end line, or an obsolete folded/odd line: nothing we use.
            continue;
        };
        let (name, value) = (&line[..colon], trim(&line[colon + 1..]));
        if name.eq_ignore_ascii_case(b"content-length") {
            for part in value.split(|&b| b == b',').map(trim) {
                match decimal(part) {
                    Some(n) if length.is_none_or(|l| l == n) => length = Some(n),
                    Some(_) => return Err(FetchError::Malformed("conflicting content-length")),
                    None if !part.is_empty() && part.iter().all(u8::is_ascii_digit) => {
                        too_long = true
                    }
                    None => return Err(FetchError::Malformed("content-length")),
                }
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            codings.extend(
                value
                    .split(|&b| b == b',')
                    .map(|c| trim(c).to_ascii_lowercase())
                    .filter(|c| !c.is_empty()),
            );
        } else if name.eq_ignore_ascii_case(b"content-encoding") {
            let value = value.to_ascii_lowercase();
            if !value.is_empty() && value != b"identity" {
                return Err(FetchError::Unsupported("content-encoding"));
            }
        }
    }
    // Transfer-Encoding wins over Content-Length (RFC 9112 §6.3).
    codings.retain(|c| c != b"identity");
    match codings.as_slice() {
        [] => {}
        [only] if only == b"chunked" => return Ok(Head::Final(Framing::Chunked)),
        _ => return Err(FetchError::Unsupported("transfer-encoding")),
    }
    match length {
        _ if too_long => Err(FetchError::TooLarge),
        Some(n) if n > MAX_DOCUMENT_BYTES => Err(FetchError::TooLarge),
        Some(n) => Ok(Head::Final(Framing::Length(n))),
        None => Ok(Head::Final(Framing::ToEof)),
    }
}

/// The code of a status line `HTTP/1.x NNN reason`.
fn status_code(line: &[u8]) -> Result<u16, FetchError> {
    let mut parts = line.split(|&b| b == b' ').filter(|p| !p.is_empty());
    let version = parts.next().unwrap_or_default();
    if !version.starts_with(b"HTTP/1.") {
        return Err(FetchError::Malformed("status line"));
    }
    match parts.next() {
        Some(code) if code.len() == 3 => decimal(code)
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n >= 100)
            .ok_or(FetchError::Malformed("status code")),
        _ => Err(FetchError::Malformed("status code")),
    }
}

/// The size on a chunk-size line (`1a3;ext=x`).
fn chunk_size(line: &[u8]) -> Result<usize, FetchError> {
    let digits = trim(line.split(|&b| b == b';').next().unwrap_or_default());
    if digits.is_empty() {
        return Err(FetchError::Malformed("chunk size"));
    }
    let mut size: usize = 0;
    for &b in digits {
        let digit = (b as char)
            .to_digit(16)
            .ok_or(FetchError::Malformed("chunk size"))?;
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(digit as usize))
            .ok_or(FetchError::TooLarge)?;
    }
    Ok(size)
}

/// A decimal number of ASCII digits only; `None` if not one or too large
/// for `usize`.
fn decimal(bytes: &[u8]) -> Option<usize> {
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    bytes.iter().try_fold(0usize, |n, &b| {
        n.checked_mul(10)?.checked_add(usize::from(b - b'0'))
    })
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |e| e + 1);
    &bytes[start..end.max(start)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DOC: &str = r#"{"name":"r","limitation":{"max_limit":100,"max_subscriptions":20}}"#;

    /// Feeds `bytes` in pieces of `step` bytes, then EOF if still open.
    fn read_in(bytes: &[u8], step: usize) -> Progress {
        let mut r = ResponseReader::new();
        for piece in bytes.chunks(step.max(1)) {
            match r.feed(piece) {
                Progress::More => {}
                end => return end,
            }
        }
        r.finish()
    }

    /// The result fed whole and fed one byte at a time, which must agree.
    fn read(bytes: &[u8]) -> Progress {
        let whole = read_in(bytes, usize::MAX);
        assert_eq!(read_in(bytes, 1), whole, "split-invariant");
        assert_eq!(read_in(bytes, 7), whole, "split-invariant");
        whole
    }

    fn with_length(body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/nostr+json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    fn chunked(body: &[u8], size: usize) -> Vec<u8> {
        let mut out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for c in body.chunks(size) {
            out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
            out.extend_from_slice(c);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    }

    #[test]
    fn request_maps_the_websocket_url() {
        let text = |u| request(u).map(|r| String::from_utf8(r).unwrap());
        let r = text("wss://relay.example.com").unwrap();
        assert!(
            r.starts_with("GET / HTTP/1.1\r\nHost: relay.example.com\r\n"),
            "{r}"
        );
        assert!(r.contains("\r\nAccept: application/nostr+json\r\n"));
        assert!(r.contains("\r\nConnection: close\r\n"));
        assert!(r.ends_with("\r\n\r\n"));
        let r = text("ws://127.0.0.1:7777/nostr?x=1#frag").unwrap();
        assert!(r.starts_with("GET /nostr?x=1 HTTP/1.1\r\nHost: 127.0.0.1:7777\r\n"));
        let r = text("ws://[::1]:80?q").unwrap();
        assert!(
            r.starts_with("GET /?q HTTP/1.1\r\nHost: [::1]:80\r\n"),
            "{r}"
        );
        for bad in [
            "https://relay.example.com",
            "ws://",
            "ws:///path",
            "ws://user@host",
            "ws://host/a b",
            "ws://host/\r\nX-Evil: 1",
            "ws://hôst",
            "no scheme",
        ] {
            assert_eq!(request(bad), None, "{bad}");
        }
    }

    #[test]
    fn content_length_body() {
        assert_eq!(read(&with_length(DOC)), Progress::Done(DOC.into()));
        // Bytes after the body are not ours to read.
        let mut extra = with_length(DOC);
        extra.extend_from_slice(b"HTTP/1.1 500 junk");
        assert_eq!(read(&extra), Progress::Done(DOC.into()));
        let empty = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(read(empty), Progress::Done(Vec::new()));
        let agreeing = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {0}, {0}\r\nContent-Length:{0}\r\n\r\n{DOC}",
            DOC.len()
        );
        assert_eq!(read(agreeing.as_bytes()), Progress::Done(DOC.into()));
    }

    #[test]
    fn chunked_body_in_any_chunk_size() {
        for size in [1, 2, 5, 64, 4096] {
            assert_eq!(
                read(&chunked(DOC.as_bytes(), size)),
                Progress::Done(DOC.into())
            );
        }
        // Extensions, trailers, bare LF, hex case, and a Content-Length
        // that chunked framing overrides.
        let odd = format!(
            "HTTP/1.1 200 OK\nContent-Length: 3\nTransfer-Encoding: Chunked\n\n\
             A;name=val\n0123456789\n{:X}\r\n{}\r\n0\r\nX-Trailer: 1\r\n\r\n",
            DOC.len() - 10,
            &DOC[10..]
        );
        let mut want = b"0123456789".to_vec();
        want.extend_from_slice(&DOC.as_bytes()[10..]);
        assert_eq!(read(odd.as_bytes()), Progress::Done(want));
        // EOF right after the last chunk is a complete body.
        let mut bare = chunked(DOC.as_bytes(), 16);
        bare.truncate(bare.len() - 2);
        assert_eq!(read(&bare), Progress::Done(DOC.into()));
    }

    #[test]
    fn body_to_eof_and_interim_heads() {
        let r = format!("HTTP/1.0 200 OK\r\nServer: x\r\n\r\n{DOC}");
        assert_eq!(read(r.as_bytes()), Progress::Done(DOC.into()));
        let mut r = b"HTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n".to_vec();
        r.extend_from_slice(&with_length(DOC));
        assert_eq!(read(&r), Progress::Done(DOC.into()));
    }

    #[test]
    fn other_statuses_fail_at_the_head() {
        let mut r = ResponseReader::new();
        assert_eq!(
            r.feed(b"HTTP/1.1 404 Not Found\r\nContent-Length: 10000\r\n\r\n"),
            Progress::Failed(FetchError::Status(404))
        );
        assert_eq!(r.feed(b"more"), Progress::Failed(FetchError::Ended));
        assert_eq!(r.finish(), Progress::Failed(FetchError::Ended));
        for status in [
            "301 Moved",
            "101 Switching Protocols",
            "204 No Content",
            "500",
        ] {
            let head = format!("HTTP/1.1 {status}\r\n\r\n");
            assert!(
                matches!(
                    read(head.as_bytes()),
                    Progress::Failed(FetchError::Status(_))
                ),
                "{status}"
            );
        }
    }

    #[test]
    fn garbage_and_truncation_fail() {
        let malformed = |b: &[u8]| matches!(read(b), Progress::Failed(FetchError::Malformed(_)));
        assert!(malformed(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"));
        assert!(malformed(b"HTTP/1.1 2000 OK\r\n\r\n"));
        assert!(malformed(b"HTTP/1.1 OK\r\n\r\n"));
        assert!(malformed(b"HTTP/2 200\r\n\r\n"));
        assert!(malformed(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"));
        assert!(malformed(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\nx"
        ));
        assert!(malformed(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
        ));
        assert!(malformed(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n"
        ));
        assert!(malformed(b"\xff\xfe\x00\r\n\r\n"));
        assert!(malformed(b"\r\n\r\n"));
        let truncated = |b: &[u8]| read(b) == Progress::Failed(FetchError::Truncated);
        assert!(truncated(b""));
        assert!(truncated(&[0xff; 100]));
        assert!(truncated(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n"));
        assert!(truncated(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc"
        ));
        assert!(truncated(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"
        ));
        assert!(truncated(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n"
        ));
    }

    #[test]
    fn encodings_we_did_not_ask_for_are_refused() {
        for head in [
            "Transfer-Encoding: gzip, chunked",
            "Transfer-Encoding: chunked, gzip",
            "Content-Encoding: gzip",
        ] {
            let r = format!("HTTP/1.1 200 OK\r\n{head}\r\n\r\n");
            assert!(
                matches!(
                    read(r.as_bytes()),
                    Progress::Failed(FetchError::Unsupported(_))
                ),
                "{head}"
            );
        }
        let identity = format!("HTTP/1.1 200 OK\r\nContent-Encoding: identity\r\n\r\n{DOC}");
        assert_eq!(read(identity.as_bytes()), Progress::Done(DOC.into()));
    }

    #[test]
    fn every_cap_holds() {
        let big = "x".repeat(MAX_DOCUMENT_BYTES + 1);
        // Announced too large: refused at the head, before any body byte.
        let mut r = ResponseReader::new();
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", big.len());
        assert_eq!(
            r.feed(head.as_bytes()),
            Progress::Failed(FetchError::TooLarge)
        );
        let huge = "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n";
        assert_eq!(
            read(huge.as_bytes()),
            Progress::Failed(FetchError::TooLarge)
        );
        // Chunked: one chunk too large, or many that add up.
        let r = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\n";
        assert_eq!(read(r.as_bytes()), Progress::Failed(FetchError::TooLarge));
        assert_eq!(
            read(&chunked(big.as_bytes(), 4096)),
            Progress::Failed(FetchError::TooLarge)
        );
        // To EOF.
        let r = format!("HTTP/1.1 200 OK\r\n\r\n{big}");
        assert_eq!(read(r.as_bytes()), Progress::Failed(FetchError::TooLarge));
        // A head that never ends.
        let r = format!("HTTP/1.1 200 OK\r\nX: {}", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(read(r.as_bytes()), Progress::Failed(FetchError::TooLarge));
        // Endless interim heads.
        let r = "HTTP/1.1 100 Continue\r\n\r\n".repeat(MAX_HEAD_BYTES / 10);
        assert_eq!(read(r.as_bytes()), Progress::Failed(FetchError::TooLarge));
        // Endless trailers, and chunk framing that outweighs its data.
        let r = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n{}",
            "X: y\r\n".repeat(MAX_RESPONSE_BYTES / 6)
        );
        assert_eq!(read(r.as_bytes()), Progress::Failed(FetchError::TooLarge));
        let r = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{}",
            "1;padding-padding-padding\r\nx\r\n".repeat(MAX_DOCUMENT_BYTES / 8)
        );
        assert_eq!(read(r.as_bytes()), Progress::Failed(FetchError::TooLarge));
        let r = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;{}",
            "e".repeat(2 * MAX_LINE_BYTES)
        );
        assert!(matches!(
            read(r.as_bytes()),
            Progress::Failed(FetchError::Malformed(_))
        ));
        // A document exactly at the cap is read.
        let at_cap = "y".repeat(MAX_DOCUMENT_BYTES);
        assert_eq!(
            read(&chunked(at_cap.as_bytes(), 8192)),
            Progress::Done(at_cap.clone().into())
        );
        assert_eq!(read(&with_length(&at_cap)), Progress::Done(at_cap.into()));
    }

    #[test]
    fn document_decoding_is_lenient() {
        let info = decode_document(DOC.as_bytes()).unwrap();
        assert_eq!(
            (info.max_limit, info.max_subscriptions),
            (Some(100), Some(20))
        );
        let mut bom = b"\xef\xbb\xbf".to_vec();
        bom.extend_from_slice(br#"{"description":"caf"#);
        bom.push(0xe9); // Latin-1, not UTF-8
        bom.extend_from_slice(br#"","limitation":{"max_limit":7}}"#);
        assert_eq!(decode_document(&bom).unwrap().max_limit, Some(7));
        assert_eq!(decode_document(b"<html>not found</html>"), None);
        assert_eq!(decode_document(b""), None);
    }

    proptest! {
        #[test]
        fn hostile_bytes_never_panic_and_any_split_agrees(
            bytes in proptest::collection::vec(any::<u8>(), 0..600),
            step in 1usize..64,
        ) {
            let whole = read_in(&bytes, usize::MAX);
            prop_assert_eq!(read_in(&bytes, step), whole);
        }

        #[test]
        fn mutated_responses_never_panic(
            flips in proptest::collection::vec((0usize..200, any::<u8>()), 0..6),
            step in 1usize..64,
        ) {
            let mut bytes = chunked(DOC.as_bytes(), 9);
            for (at, b) in flips {
                let at = at % bytes.len();
                bytes[at] = b;
            }
            let whole = read_in(&bytes, usize::MAX);
            prop_assert_eq!(read_in(&bytes, step), whole);
        }
    }
}
