//! Kernel TCP options on relay sockets: keepalive, and ACKs that are not
//! held back.
//!
//! **Keepalive.** A relay whose host or path vanished leaves a half-open
//! connection that looks connected until something is sent. The kernel's
//! keepalive finds it after [`IDLE`] of silence and [`PROBES`] unanswered
//! probes, and the socket then reports an error like any other lost
//! connection. The probes are the kernel's: they wake neither the loop nor
//! the relay's process, where a websocket ping costs both a wake-up (at
//! 5,000 relays, a ping a minute each was most of the engine's idle CPU).
//! So the engine's own pings (`Config::keepalive`) can be rare: they are
//! left to find relays whose process hangs while its host still answers.
//!
//! **Quick ACKs.** A relay that leaves Nagle's algorithm on (tokio and
//! tungstenite do unless told otherwise: rust-nostr's LocalRelay and
//! relay builder, nostr-rs-relay) writes the first message of an answer
//! at once and holds the rest until that one is acknowledged. Linux sees
//! our REQ-then-answer exchange as interactive and delays its ACK, by 40
//! ms at least, hoping to carry it on our next write; but we write nothing
//! until the answer is whole. So every page (`EVENT`s, then `EOSE`) and
//! every stored event's last `OK`s came 40 ms late: 44 ms for a REQ to a
//! LocalRelay on loopback, against 0.1 ms with the ACK sent at once
//! (issue 46). Once a read drains a socket the loop waits on the peer,
//! and an ACK the kernel still holds only stalls it: [`ack_now`] sends it.

use std::io;
use std::os::fd::AsRawFd;

/// Silence after which the kernel starts probing, in seconds.
const IDLE: libc::c_int = 60;
/// Seconds between probes.
const INTERVAL: libc::c_int = 10;
/// Unanswered probes after which the connection is dead: 90 s of silence
/// in all.
const PROBES: libc::c_int = 3;

/// Turns keepalive on for `socket`, probing as above where the platform
/// lets us say how (Linux); elsewhere with the system's timing.
pub(crate) fn enable_keepalive(socket: &impl AsRawFd) -> io::Result<()> {
    let fd = socket.as_raw_fd();
    set(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    #[cfg(target_os = "linux")]
    {
        set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, IDLE)?;
        set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, INTERVAL)?;
        set(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, PROBES)?;
    }
    Ok(())
}

/// Sends the ACK the kernel holds for what `socket` received, and ACKs
/// what comes next at once too (Linux's `TCP_QUICKACK`, which the kernel
/// drops again as it sees fit: call it whenever a read found the socket
/// drained). Elsewhere nothing: the delay stays, nothing breaks. A failure
/// costs only that delay, so it is not reported.
pub(crate) fn ack_now(socket: &impl AsRawFd) {
    #[cfg(target_os = "linux")]
    let _ = set(socket.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_QUICKACK, 1);
    #[cfg(not(target_os = "linux"))]
    let _ = socket;
}

fn set(
    fd: libc::c_int,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` is a live c_int and the length passed is its size;
    // setsockopt reads only that much. A bad fd is an error, not UB.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(fd: libc::c_int, level: libc::c_int, name: libc::c_int) -> libc::c_int {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `value` and `len` are live and sized for the option.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                level,
                name,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        value
    }

    #[test]
    fn a_socket_gets_the_kernels_keepalive_with_our_timing() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let socket = mio::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        enable_keepalive(&socket).unwrap();
        let fd = socket.as_raw_fd();
        assert_eq!(get(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        #[cfg(target_os = "linux")]
        {
            assert_eq!(get(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), IDLE);
            assert_eq!(get(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), INTERVAL);
            assert_eq!(get(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT), PROBES);
        }
    }

    #[test]
    fn a_closed_descriptor_is_an_error() {
        struct Bad;
        impl AsRawFd for Bad {
            fn as_raw_fd(&self) -> libc::c_int {
                -1
            }
        }
        assert!(enable_keepalive(&Bad).is_err());
    }
}
