//! The one HTTP request `status` makes, bounded: whatever answers at ADDR
//! may be hostile, so the answer is capped at [`ANSWER_MAX`] and the whole
//! request (connect, write, every read) shares one deadline, [`DEADLINE`]:
//! a listener that sends a gigabyte, or one byte every two seconds,
//! cannot hold the terminal or its memory.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Largest answer read: the engine's default page of `/status.json` is
/// under 1 MB, its largest a little over.
pub const ANSWER_MAX: usize = 4 * 1024 * 1024;

/// How long the whole request may take: the engine answers within its
/// own 5 s deadline.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Why no answer came.
#[derive(Debug)]
pub enum Failure {
    /// Nothing took the connection, or it broke.
    Unreachable(String),
    /// Something answered, but not in time or not within bounds.
    Bad(String),
}

/// The raw answer to `GET target` at `addr`, read until the peer closes.
pub fn get(addr: &str, target: &str) -> Result<Vec<u8>, Failure> {
    let deadline = Instant::now() + DEADLINE;
    let targets: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| Failure::Unreachable(format!("not an address to ask: {e}")))?
        .collect();
    let mut stream = targets
        .iter()
        .find_map(|a| TcpStream::connect_timeout(a, left(deadline).ok()?).ok())
        .ok_or_else(|| Failure::Unreachable("connection refused or timed out".to_owned()))?;
    let request = format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    left(deadline)
        .and_then(|t| stream.set_write_timeout(Some(t)))
        .and_then(|()| stream.write_all(request.as_bytes()))
        .map_err(|e| Failure::Unreachable(e.to_string()))?;
    read_all(&mut stream, deadline)
}

/// Everything the peer sends until it closes, within the deadline and
/// [`ANSWER_MAX`].
fn read_all(stream: &mut TcpStream, deadline: Instant) -> Result<Vec<u8>, Failure> {
    let slow = || Failure::Bad(format!("no whole answer within {} s", DEADLINE.as_secs()));
    let mut answer = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let timeout = left(deadline).map_err(|_| slow())?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| Failure::Unreachable(e.to_string()))?;
        match stream.read(&mut buf) {
            Ok(0) => return Ok(answer),
            Ok(n) if answer.len() + n > ANSWER_MAX => {
                let mib = ANSWER_MAX / (1024 * 1024);
                return Err(Failure::Bad(format!("an answer over {mib} MiB")));
            }
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(slow());
            }
            Err(e) => return Err(Failure::Unreachable(e.to_string())),
        }
    }
}

/// The time left before `deadline`, or an error once it passed (a zero
/// timeout would mean "none" to the socket).
fn left(deadline: Instant) -> io::Result<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| io::Error::from(io::ErrorKind::TimedOut))
}
