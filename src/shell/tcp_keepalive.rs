//! Kernel TCP keepalive on relay sockets.
//!
//! A relay whose host or path vanished leaves a half-open connection that
//! looks connected until something is sent. The kernel's keepalive finds
//! it after [`IDLE`] of silence and [`PROBES`] unanswered probes, and the
//! socket then reports an error like any other lost connection. The
//! probes are the kernel's: they wake neither the loop nor the relay's
//! process, where a websocket ping costs both a wake-up (at 5,000 relays,
//! a ping a minute each was most of the engine's idle CPU). So the
//! engine's own pings (`Config::keepalive`) can be rare: they are left to
//! find relays whose process hangs while its host still answers.

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
pub(crate) fn enable(socket: &impl AsRawFd) -> io::Result<()> {
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
        enable(&socket).unwrap();
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
        assert!(enable(&Bad).is_err());
    }
}
