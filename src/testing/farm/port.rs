//! Keeping a restarted relay's port while it is down.
//!
//! A relay that is down must refuse connections, so its listener closes.
//! But a closed port is free, and the OS may hand it to an outgoing
//! connection as its local port: the demo's engine opens thousands of
//! connections while a relay restarts, and one that took the port kept the
//! relay from ever listening again (seen once in a `demo --relays 5000`:
//! 51 events of the restarted relay never synced while that connection
//! lived). A socket bound to the port but not listening does both: a
//! connect is refused (RST, as with no socket), and Linux never picks a
//! port somebody bound as an outgoing connection's local port (its bind
//! bucket is not one `connect` made). Listening on that same socket brings
//! the relay back.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use mio::net::TcpListener;

/// Backlog of a listener brought back: as the standard library's.
const BACKLOG: libc::c_int = 128;

/// A socket bound to 127.0.0.1:`port`, not listening, closed on exec (the
/// demo's engine is a child process and must not inherit it).
pub(super) fn reserve(port: u16) -> io::Result<OwnedFd> {
    // SAFETY: socket() takes no pointers; a non-negative result is a
    // descriptor nothing else owns.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fcntl on a valid descriptor with integer arguments.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) })?;
    // The relay's closed connections may linger in TIME_WAIT on the port.
    let one: libc::c_int = 1;
    // SAFETY: the option value points at a live c_int of the given size.
    check(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    // SAFETY: sockaddr_in is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    addr.sin_family = libc::AF_INET as libc::sa_family_t;
    addr.sin_port = port.to_be();
    addr.sin_addr.s_addr = u32::from(Ipv4Addr::LOCALHOST).to_be();
    // SAFETY: the address points at a live sockaddr_in of the given size.
    check(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_in).cast(),
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    })?;
    Ok(fd)
}

/// Listens on a socket from [`reserve`]: the relay is back on its port.
pub(super) fn listen(reserved: OwnedFd) -> io::Result<TcpListener> {
    // SAFETY: listen() on a valid descriptor with an integer backlog.
    check(unsafe { libc::listen(reserved.as_raw_fd(), BACKLOG) })?;
    let listener = std::net::TcpListener::from(reserved);
    listener.set_nonblocking(true)?;
    Ok(TcpListener::from_std(listener))
}

fn check(result: libc::c_int) -> io::Result<()> {
    match result {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserved_port_refuses_connects_until_it_listens() {
        let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = first.local_addr().unwrap().port();
        drop(first);
        let reserved = reserve(port).unwrap();
        let refused = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
        let listener = listen(reserved).unwrap();
        assert_eq!(listener.local_addr().unwrap().port(), port);
        std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    }
}
