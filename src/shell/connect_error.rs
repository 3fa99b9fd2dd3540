//! Why the shell could not start (or, after DNS, continue) a connection:
//! one value per cause, so callers log it and tell the connection's owner
//! without parsing strings.

use std::io;
use std::net::IpAddr;

use rustls::pki_types::InvalidDnsNameError;

use crate::shell::dns::ResolveError;

/// Why a connection could not be started (or, after DNS, continued).
/// Logged, and the connection's owner told it failed.
#[derive(Debug)]
pub(crate) enum ConnectError {
    /// The URL has no host and port.
    UnparsableUrl,
    /// The host is no TLS server name.
    TlsName(InvalidDnsNameError),
    /// The address guard refused `ip`; `reason` names its kind.
    Refused { reason: &'static str, ip: IpAddr },
    /// No NIP-11 request can be made for the URL.
    NoHttpRequest,
    /// The TCP connect failed at once.
    Connect(io::Error),
    /// The poll would not take the socket.
    Register(io::Error),
    /// The DNS workers would not take the lookup.
    DnsQueue(ResolveError),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::UnparsableUrl => f.write_str("unparsable URL"),
            ConnectError::TlsName(e) => write!(f, "bad TLS name: {e}"),
            ConnectError::Refused { reason, ip } => write!(
                f,
                "refused {reason} address {ip} (see --allow-private-addresses)"
            ),
            ConnectError::NoHttpRequest => f.write_str("no HTTP request for URL"),
            ConnectError::Connect(e) => write!(f, "connect: {e}"),
            ConnectError::Register(e) => write!(f, "register: {e}"),
            ConnectError::DnsQueue(e) => write!(f, "DNS queue: {e:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Operators grep logs for these: they read as they did when they were strings.
    #[test]
    fn messages_read_as_the_log_lines_always_did() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let refused = ConnectError::Refused {
            reason: "private",
            ip,
        };
        assert_eq!(
            refused.to_string(),
            "refused private address 10.0.0.1 (see --allow-private-addresses)"
        );
        assert_eq!(ConnectError::UnparsableUrl.to_string(), "unparsable URL");
        assert_eq!(
            ConnectError::DnsQueue(ResolveError::QueueFull).to_string(),
            "DNS queue: QueueFull"
        );
        let refused_io = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(
            ConnectError::Connect(refused_io).to_string(),
            format!(
                "connect: {}",
                io::Error::from(io::ErrorKind::ConnectionRefused)
            )
        );
    }
}
