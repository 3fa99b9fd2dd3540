//! Relay URL normalization: one spelling per relay.
//!
//! Announcements are written by anyone, so the same relay shows up as
//! `WSS://Relay.Example.com:443/`, `wss://relay.example.com` and so on. Every
//! URL is reduced to one canonical string before it is interned, otherwise one
//! relay would be connected several times and its confirmed state split.
//! Parsing is nostr's `RelayUrl` (the `url` crate underneath), which already
//! lower-cases scheme and host and drops default ports. On top of it, one
//! trailing dot of the host is dropped (`relay.example.` is the same name,
//! fully qualified), and percent-encodings in the path and query are
//! normalized as RFC 3986 6.2.2 says: those of unreserved characters
//! decoded (`%7e` is `~`), the others' hex digits upper-cased (`%2f` is
//! `%2F`). The shard of a relay hashes this form (see `shard`), so these
//! rules are pinned by a golden table there too.

use std::fmt;

use nostr::prelude::RelayUrl;

/// Longest URL accepted; longer ones are hostile or broken.
const MAX_URL_LEN: usize = 512;

/// Why a URL was not taken as a relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UrlError {
    /// Longer than the accepted maximum.
    TooLong,
    /// Not `ws://` or `wss://`.
    UnsupportedScheme,
    /// Carries `user:password@`, which relays never need.
    Credentials,
    /// Not a URL at all.
    Malformed,
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UrlError::TooLong => "URL too long",
            UrlError::UnsupportedScheme => "not a ws:// or wss:// URL",
            UrlError::Credentials => "URL carries credentials",
            UrlError::Malformed => "malformed URL",
        })
    }
}

impl std::error::Error for UrlError {}

/// The canonical form of a relay URL: scheme and host lower-case, default
/// port, fragment, trailing slash and the host's trailing dot removed,
/// percent-encodings normalized.
pub fn normalize(raw: &str) -> Result<String, UrlError> {
    let url = canonical(raw)?;
    // The canonical form must be its own canonical form, or one relay could
    // be interned under two spellings, or under one we refuse when it comes
    // back: the parser drops tabs and newlines and percent-encodes, which
    // can bring a second `://` together or push the length past the cap
    // (found by fuzzing).
    match canonical(&url) {
        Ok(again) if again == url => Ok(url),
        Ok(_) => Err(UrlError::Malformed),
        Err(e) => Err(e),
    }
}

/// One pass of normalization.
fn canonical(raw: &str) -> Result<String, UrlError> {
    let raw = raw.trim();
    if raw.len() > MAX_URL_LEN {
        return Err(UrlError::TooLong);
    }
    let raw = raw.split('#').next().unwrap_or(raw);
    let scheme = raw.split("://").next().unwrap_or("").to_ascii_lowercase();
    if scheme != "ws" && scheme != "wss" {
        return Err(UrlError::UnsupportedScheme);
    }
    let url = RelayUrl::parse(raw).map_err(|_| UrlError::Malformed)?;
    if url.host().is_none() {
        return Err(UrlError::Malformed);
    }
    let url = url.as_str_without_trailing_slash();
    // Looked for in the parsed URL, not the raw text: the parser skips extra
    // slashes and drops tabs and newlines, so `ws:///user@host` carries
    // credentials its raw text hides (found by fuzzing).
    if authority(url).contains('@') {
        return Err(UrlError::Credentials);
    }
    fold(url).ok_or(UrlError::Malformed)
}

/// Drops the host's one trailing dot and normalizes the percent-encodings
/// after it, in a URL the parser wrote (`scheme://authority` then path and
/// query). `None` if no host is left.
fn fold(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    // A port is digits after the last colon; an IPv6 host is bracketed and
    // never ends in a dot.
    let (host, port) = match authority.rfind(':') {
        Some(i) if !authority[i..].contains(']') => authority.split_at(i),
        _ => (authority, ""),
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() {
        return None;
    }
    Some(format!(
        "{scheme}://{host}{port}{}",
        percent_normalized(tail)
    ))
}

/// `text` with the percent-encodings of unreserved characters decoded
/// and the others' hex digits upper-cased (RFC 3986 6.2.2.1, 6.2.2.2).
fn percent_normalized(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| bytes[i] == b'%' && h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(v) if v.is_ascii_alphanumeric() || b"-._~".contains(&v) => out.push(v),
            Some(_) => out.extend(bytes[i..i + 3].to_ascii_uppercase()),
            None => {
                out.push(bytes[i]);
                i += 1;
                continue;
            }
        }
        i += 3;
    }
    // Only ASCII triplets were replaced, by ASCII: still UTF-8.
    String::from_utf8(out).unwrap_or_else(|_| text.to_owned())
}

/// The relay a git `clone` URL names: a GRASP server serves git over
/// `https://host/...` and its relay at `wss://host` (`http` maps to `ws`).
/// Other clone URLs (ssh, git, ...) name no relay.
pub fn relay_of_clone_url(clone: &str) -> Option<String> {
    let clone = clone.trim();
    let (scheme, rest) = clone.split_once("://")?;
    let ws = match scheme.to_ascii_lowercase().as_str() {
        "https" => "wss",
        "http" => "ws",
        _ => return None,
    };
    let host = authority(clone);
    if host.is_empty() || rest.is_empty() {
        return None;
    }
    normalize(&format!("{ws}://{host}")).ok()
}

/// The `host[:port]` part of a normalized URL, as `--domain` spells it.
pub fn host_port(url: &str) -> &str {
    authority(url)
}

/// The text between `scheme://` and the first `/`, `?` or `#`.
fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    &rest[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_case_port_and_slash() {
        assert_eq!(
            normalize("WSS://Relay.Example.COM:443/").unwrap(),
            "wss://relay.example.com"
        );
        assert_eq!(
            normalize("ws://relay.example.com:80").unwrap(),
            "ws://relay.example.com"
        );
        assert_eq!(
            normalize("wss://relay.example.com:4443/").unwrap(),
            "wss://relay.example.com:4443"
        );
        assert_eq!(
            normalize(" wss://r.example/path/ ").unwrap(),
            "wss://r.example/path"
        );
        assert_eq!(
            normalize("wss://r.example/#frag").unwrap(),
            "wss://r.example"
        );
        assert_eq!(
            normalize("ws://127.0.0.1:7777").unwrap(),
            "ws://127.0.0.1:7777"
        );
        assert_eq!(normalize("ws://[::1]:7777/").unwrap(), "ws://[::1]:7777");
    }

    /// One relay, two spellings, used to be two relays (issue 26).
    #[test]
    fn folds_the_hosts_trailing_dot_and_normalizes_percent_encodings() {
        for (raw, canonical) in [
            ("wss://relay.example.", "wss://relay.example"),
            ("wss://Relay.Example.:443/", "wss://relay.example"),
            ("wss://relay.example.:4443/x", "wss://relay.example:4443/x"),
            ("ws://127.0.0.1.:7777", "ws://127.0.0.1:7777"),
            ("wss://r.example/%7eu", "wss://r.example/~u"),
            ("wss://r.example/%7Eu", "wss://r.example/~u"),
            ("wss://r.example/%41%2d%2E%5f%30", "wss://r.example/A-._0"),
            ("wss://r.example/a%2fb%3f", "wss://r.example/a%2Fb%3F"),
            ("wss://r.example/?u=%7e&v=%2f", "wss://r.example/?u=~&v=%2F"),
            ("wss://r.example/%zz%+f%", "wss://r.example/%zz%+f%"),
            ("ws://[::1]:7777/%7e", "ws://[::1]:7777/~"),
        ] {
            assert_eq!(normalize(raw).as_deref(), Ok(canonical), "{raw}");
        }
        assert_eq!(normalize("wss://relay.example.."), Err(UrlError::Malformed));
    }

    #[test]
    fn rejects_what_is_not_a_relay() {
        assert_eq!(
            normalize("https://r.example"),
            Err(UrlError::UnsupportedScheme)
        );
        assert_eq!(normalize("r.example"), Err(UrlError::UnsupportedScheme));
        assert_eq!(
            normalize("wss://user:pw@r.example"),
            Err(UrlError::Credentials)
        );
        assert_eq!(normalize("wss://"), Err(UrlError::Malformed));
        assert_eq!(normalize("wss://a b"), Err(UrlError::Malformed));
        assert_eq!(
            normalize(&format!("wss://{}", "a".repeat(600))),
            Err(UrlError::TooLong)
        );
        assert_eq!(normalize("wss://a.example://b"), Err(UrlError::Malformed));
    }

    /// Inputs the `relay_url` fuzz target found: credentials behind extra
    /// slashes, and canonical forms that did not normalize to themselves.
    #[test]
    fn canonical_forms_are_their_own_canonical_form() {
        assert_eq!(normalize("ws:///o@r.example"), Err(UrlError::Credentials));
        assert_eq!(
            normalize("wss:///user:pw@r.example/x"),
            Err(UrlError::Credentials)
        );
        // The parser drops the newline, which makes a second `://`.
        assert_eq!(
            normalize("wss://r.example/ws:\n//x"),
            Err(UrlError::Malformed)
        );
        // Percent-encoding triples each space past the length cap.
        let spaced = format!("wss://r.example/{}", " a".repeat(200));
        assert_eq!(normalize(&spaced), Err(UrlError::TooLong));
        for raw in [
            "WSS://Relay.Example.COM:443/",
            "wss://r.example/a b/",
            "wss://xn--bcher-kva.example",
            "wss://bücher.example/",
            "ws://[::1]:7777/",
            "wss://r.example/%7e?x=1/",
        ] {
            let url = normalize(raw).unwrap();
            assert_eq!(normalize(&url), Ok(url.clone()), "{raw:?}");
        }
    }

    #[test]
    fn clone_urls_name_their_relay() {
        assert_eq!(
            relay_of_clone_url("https://Git.Example.com/npub1x/repo.git").as_deref(),
            Some("wss://git.example.com")
        );
        assert_eq!(
            relay_of_clone_url("http://git.example.com:8080/x").as_deref(),
            Some("ws://git.example.com:8080")
        );
        assert_eq!(relay_of_clone_url("git@github.com:a/b.git"), None);
        assert_eq!(relay_of_clone_url("ssh://git@host/x"), None);
        assert_eq!(relay_of_clone_url("https://"), None);
    }

    #[test]
    fn host_port_is_the_authority() {
        assert_eq!(host_port("wss://r.example:4443/x"), "r.example:4443");
        assert_eq!(host_port("wss://r.example"), "r.example");
    }
}
