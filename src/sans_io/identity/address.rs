//! Which resolved addresses a relay URL may connect to (SSRF guard).
//!
//! Relay URLs come from announcements, and anyone can write an announcement.
//! A URL such as `ws://127.0.0.1:6379`, `wss://router.lan` or a name whose DNS
//! record points at `10.0.0.1` would otherwise make this server open
//! connections into its own network: to local services, cloud metadata
//! endpoints (`169.254.169.254`) or the operator's LAN. So only public unicast
//! addresses may be connected.
//!
//! The check belongs on the *resolved* addresses, every one of them, right
//! before connecting: a public-looking name can resolve to a private address,
//! and `getaddrinfo` also accepts odd literal spellings (`0x7f.1`,
//! `2130706433`) that are not IP literals to [`ip_literal`]. Connect to an
//! address that passed [`is_public`], never re-resolve the name afterwards.
//!
//! IPv6 addresses that carry an IPv4 address (IPv4-mapped `::ffff:a.b.c.d`,
//! IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) are
//! judged by the IPv4 address they carry, since that is where the packets
//! end up. Other IPv6 addresses outside global unicast `2000::/3` are refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// True if `ip` is a public unicast address we may connect to.
pub fn is_public(ip: IpAddr) -> bool {
    refusal_reason(ip).is_none()
}

/// Why an address was refused, for the log line: `None` when it is public,
/// otherwise a short name of its range ("loopback", "private", "link-local",
/// "unspecified", "shared (CGNAT)", "multicast", "broadcast",
/// "documentation", "benchmarking", "reserved", "unique-local",
/// "site-local", "NAT64 (local-use)", "discard-only").
pub(crate) fn refusal_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_refusal(v4),
        IpAddr::V6(v6) => v6_refusal(v6),
    }
}

/// The IPv4 rules.
fn v4_refusal(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    let reason = match (a, b, c) {
        // 0.0.0.0/8 "this network"; connecting to 0.0.0.0 reaches localhost.
        (0, _, _) => "unspecified",
        (127, _, _) => "loopback",
        (10, _, _) => "private",
        (172, 16..=31, _) => "private",
        (192, 168, _) => "private",
        (169, 254, _) => "link-local",
        (100, 64..=127, _) => "shared (CGNAT)",
        // IETF protocol assignments (192.0.0.0/24), none of them a relay.
        (192, 0, 0) => "reserved",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (198, 18..=19, _) => "benchmarking",
        (224..=239, _, _) => "multicast",
        _ if ip.is_broadcast() => "broadcast",
        (240..=255, _, _) => "reserved",
        _ => return None,
    };
    Some(reason)
}

/// The IPv6 rules.
fn v6_refusal(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    // IPv4-mapped ::ffff:a.b.c.d and IPv4-compatible ::a.b.c.d (:: and ::1
    // are handled above): the IPv4 part decides.
    if let Some(v4) = ip.to_ipv4() {
        return v4_refusal(v4);
    }
    // NAT64 well-known prefix 64:ff9b::/96: the IPv4 address is the last 32
    // bits.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return v4_refusal(low_v4(s[6], s[7]));
    }
    // Local-use NAT64 prefix (RFC 8215): translates into a private network.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
        return Some("NAT64 (local-use)");
    }
    // 6to4 2002:AABB:CCDD::/48 carries IPv4 AA.BB.CC.DD.
    if s[0] == 0x2002 {
        return v4_refusal(low_v4(s[1], s[2]));
    }
    let reason = match s[0] {
        0xff00..=0xffff => "multicast",
        0xfe80..=0xfebf => "link-local",
        0xfec0..=0xfeff => "site-local",
        0xfc00..=0xfdff => "unique-local",
        0x0100 if s[1..4] == [0, 0, 0] => "discard-only",
        0x2001 if s[1] == 0x0db8 => "documentation",
        0x3fff if s[1] <= 0x0fff => "documentation",
        0x2001 if s[1] < 0x0200 && !ietf_assignment_is_global(s) => "reserved",
        // Not global unicast (2000::/3): unassigned or special.
        0..=0x1fff | 0x4000..=0xffff => "reserved",
        _ => return None,
    };
    Some(reason)
}

/// The few globally reachable blocks inside `2001::/23` (IETF protocol
/// assignments): AMT, AS112-v6, ORCHIDv2, drone remote ID, and the anycast
/// addresses `2001:1::1` and `2001:1::2`. Everything else there (Teredo
/// `2001::/32` among it) is refused.
fn ietf_assignment_is_global(s: [u16; 8]) -> bool {
    match s[1] {
        0x0001 => s[2..7] == [0, 0, 0, 0, 0] && matches!(s[7], 1 | 2),
        0x0003 => true,
        0x0004 => s[2] == 0x0112,
        0x0020..=0x003f => true,
        _ => false,
    }
}

/// The IPv4 address in two 16-bit segments.
fn low_v4(hi: u16, lo: u16) -> Ipv4Addr {
    Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo))
}

/// The host part of a `ws://` or `wss://` URL (scheme matched
/// case-insensitively, host lower-cased) and its port: the explicit one, or
/// 80 for `ws` and 443 for `wss`. IPv6 literals come bracketed in URLs
/// (`ws://[::1]:7777`) and are returned without brackets. `None` for other
/// schemes, an empty host, a malformed port or port 0.
///
/// A `user:password@` part is skipped the way URL parsers do (the host is
/// what follows the last `@`), so the host checked is the one connected.
pub fn host_and_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.trim().split_once("://")?;
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "ws" => 80,
        "wss" => 443,
        _ => return None,
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let (host, port) = if let Some(bracketed) = host_port.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']')?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':')?),
        };
        // Only IPv6 literals are written in brackets.
        host.parse::<Ipv6Addr>().ok()?;
        (host, port)
    } else {
        match host_port.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        // `ws://host:/` means the default port, as in the URL standard.
        None | Some("") => default_port,
        Some(p) if p.bytes().all(|b| b.is_ascii_digit()) => p.parse().ok()?,
        Some(_) => return None,
    };
    if port == 0 {
        return None;
    }
    Some((host.to_ascii_lowercase(), port))
}

/// `host` parsed as an IP literal, if it is one. Brackets around an IPv6
/// literal are accepted. Only the canonical dotted-quad form counts as IPv4;
/// other spellings go through the resolver, whose results are checked anyway.
pub fn ip_literal(host: &str) -> Option<IpAddr> {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (address, expected refusal reason; `None` = public).
    const TABLE: &[(&str, Option<&str>)] = &[
        // IPv4 public.
        ("1.1.1.1", None),
        ("8.8.8.8", None),
        ("93.184.216.34", None),
        ("223.255.255.255", None),
        // 0/8.
        ("0.0.0.0", Some("unspecified")),
        ("0.1.2.3", Some("unspecified")),
        ("1.0.0.0", None),
        // Loopback.
        ("127.0.0.1", Some("loopback")),
        ("127.255.255.255", Some("loopback")),
        ("126.255.255.255", None),
        ("128.0.0.0", None),
        // Private.
        ("9.255.255.255", None),
        ("10.0.0.0", Some("private")),
        ("10.255.255.255", Some("private")),
        ("11.0.0.0", None),
        ("172.15.255.255", None),
        ("172.16.0.0", Some("private")),
        ("172.31.255.255", Some("private")),
        ("172.32.0.0", None),
        ("192.167.255.255", None),
        ("192.168.0.0", Some("private")),
        ("192.168.255.255", Some("private")),
        ("192.169.0.0", None),
        // Link-local, including cloud metadata.
        ("169.253.255.255", None),
        ("169.254.0.0", Some("link-local")),
        ("169.254.169.254", Some("link-local")),
        ("169.255.0.0", None),
        // CGNAT.
        ("100.63.255.255", None),
        ("100.64.0.0", Some("shared (CGNAT)")),
        ("100.127.255.255", Some("shared (CGNAT)")),
        ("100.128.0.0", None),
        // IETF protocol assignments.
        ("192.0.0.8", Some("reserved")),
        ("192.0.1.0", None),
        // Documentation.
        ("192.0.2.0", Some("documentation")),
        ("192.0.2.255", Some("documentation")),
        ("192.0.3.0", None),
        ("198.51.100.7", Some("documentation")),
        ("198.51.101.0", None),
        ("203.0.113.9", Some("documentation")),
        ("203.0.112.255", None),
        // Benchmarking.
        ("198.17.255.255", None),
        ("198.18.0.0", Some("benchmarking")),
        ("198.19.255.255", Some("benchmarking")),
        ("198.20.0.0", None),
        // Multicast, reserved, broadcast.
        ("224.0.0.0", Some("multicast")),
        ("239.255.255.255", Some("multicast")),
        ("240.0.0.0", Some("reserved")),
        ("255.255.255.254", Some("reserved")),
        ("255.255.255.255", Some("broadcast")),
        // IPv6 public.
        ("2606:4700:4700::1111", None),
        ("2001:4860:4860::8888", None),
        ("2a00:1450:4001::1", None),
        ("2000::", None),
        ("3ffe:ffff::1", None),
        // IPv6 special.
        ("::", Some("unspecified")),
        ("::1", Some("loopback")),
        ("fe80::1", Some("link-local")),
        ("febf:ffff::1", Some("link-local")),
        ("fec0::1", Some("site-local")),
        ("fc00::1", Some("unique-local")),
        ("fdff:ffff::1", Some("unique-local")),
        ("fbff:ffff::1", Some("reserved")),
        ("ff02::1", Some("multicast")),
        ("ff0e::1", Some("multicast")),
        ("2001:db8::1", Some("documentation")),
        ("2001:db8:ffff::1", Some("documentation")),
        ("2001:db9::1", None),
        ("3fff::1", Some("documentation")),
        ("100::1", Some("discard-only")),
        ("4000::1", Some("reserved")),
        ("1fff::1", Some("reserved")),
        // Teredo and other IETF assignments.
        ("2001::1", Some("reserved")),
        ("2001:1::1", None),
        ("2001:1::3", Some("reserved")),
        ("2001:20::1", None),
        ("2001:200::1", None),
        // IPv4-mapped, judged by the IPv4 part.
        ("::ffff:127.0.0.1", Some("loopback")),
        ("::ffff:10.1.2.3", Some("private")),
        ("::ffff:169.254.169.254", Some("link-local")),
        ("::ffff:0.0.0.0", Some("unspecified")),
        ("::ffff:8.8.8.8", None),
        // IPv4-compatible, judged by the IPv4 part.
        ("::127.0.0.1", Some("loopback")),
        ("::192.168.1.1", Some("private")),
        ("::8.8.8.8", None),
        ("::2", Some("unspecified")),
        // NAT64, judged by the embedded IPv4.
        ("64:ff9b::8.8.8.8", None),
        ("64:ff9b::127.0.0.1", Some("loopback")),
        ("64:ff9b::10.0.0.1", Some("private")),
        ("64:ff9b::100.64.0.1", Some("shared (CGNAT)")),
        ("64:ff9b:1::8.8.8.8", Some("NAT64 (local-use)")),
        ("64:ff9b:0:0:0:1::", Some("reserved")),
        // 6to4, judged by the embedded IPv4.
        ("2002:0808:0808::1", None),
        ("2002:7f00:0001::1", Some("loopback")),
        ("2002:c0a8:0101::1", Some("private")),
    ];

    #[test]
    fn verdicts() {
        for &(addr, expected) in TABLE {
            let ip: IpAddr = addr.parse().unwrap();
            assert_eq!(refusal_reason(ip), expected, "{addr}");
            assert_eq!(is_public(ip), expected.is_none(), "{addr}");
        }
    }

    #[test]
    fn host_and_port_defaults_and_explicit_ports() {
        let hp = host_and_port;
        let some = |h: &str, p| Some((h.to_owned(), p));
        assert_eq!(hp("ws://relay.example.com"), some("relay.example.com", 80));
        assert_eq!(
            hp("wss://relay.example.com"),
            some("relay.example.com", 443)
        );
        assert_eq!(hp("wss://r.example:4443"), some("r.example", 4443));
        assert_eq!(hp("ws://r.example:443"), some("r.example", 443));
        assert_eq!(hp("ws://r.example:/"), some("r.example", 80));
        assert_eq!(hp("ws://127.0.0.1:7777"), some("127.0.0.1", 7777));
        assert_eq!(hp("WSS://R.Example:8443/"), some("r.example", 8443));
        assert_eq!(hp("Ws://r.example"), some("r.example", 80));
    }

    #[test]
    fn host_and_port_ipv6_path_query_fragment() {
        let some = |h: &str, p| Some((h.to_owned(), p));
        assert_eq!(host_and_port("ws://[::1]:7777"), some("::1", 7777));
        assert_eq!(host_and_port("wss://[::1]"), some("::1", 443));
        assert_eq!(host_and_port("ws://[::1]:/"), some("::1", 80));
        assert_eq!(
            host_and_port("wss://[2001:DB8::1]:9/path"),
            some("2001:db8::1", 9)
        );
        assert_eq!(
            host_and_port("wss://r.example/path/to?x=1:2"),
            some("r.example", 443)
        );
        assert_eq!(
            host_and_port("wss://r.example:4443?a=b"),
            some("r.example", 4443)
        );
        assert_eq!(host_and_port("wss://r.example#f:1"), some("r.example", 443));
        assert_eq!(host_and_port(" wss://r.example "), some("r.example", 443));
        // Credentials are skipped the way URL parsers skip them.
        assert_eq!(
            host_and_port("ws://evil.example@127.0.0.1:80/"),
            some("127.0.0.1", 80)
        );
    }

    #[test]
    fn host_and_port_rejects() {
        for url in [
            "https://r.example",
            "r.example",
            "wss://",
            "wss:///path",
            "wss://:443",
            "wss://r.example:x",
            "wss://r.example:+1",
            "wss://r.example:65536",
            "wss://r.example:0",
            "wss://r.example:1:2",
            "ws://[::1",
            "ws://[::1]x",
            "ws://[r.example]:80",
            "ws://::1:80",
        ] {
            assert_eq!(host_and_port(url), None, "{url}");
        }
    }

    #[test]
    fn ip_literals() {
        assert_eq!(ip_literal("127.0.0.1"), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(ip_literal("::1"), Some("::1".parse().unwrap()));
        assert_eq!(ip_literal("[::1]"), Some("::1".parse().unwrap()));
        assert_eq!(
            ip_literal("::ffff:10.0.0.1"),
            Some("::ffff:10.0.0.1".parse().unwrap())
        );
        assert_eq!(ip_literal("r.example"), None);
        assert_eq!(ip_literal("127.1"), None);
        assert_eq!(ip_literal(""), None);
        assert_eq!(ip_literal("[r.example]"), None);
    }

    #[test]
    fn url_to_verdict() {
        let verdict = |url| {
            let (host, _) = host_and_port(url)?;
            ip_literal(&host).map(is_public)
        };
        assert_eq!(verdict("ws://[::1]:7777"), Some(false));
        assert_eq!(verdict("ws://[::ffff:127.0.0.1]"), Some(false));
        assert_eq!(verdict("wss://10.0.0.1/"), Some(false));
        assert_eq!(verdict("wss://1.1.1.1/"), Some(true));
        assert_eq!(verdict("wss://r.example/"), None);
    }
}
