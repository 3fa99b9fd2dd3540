//! The own relay as the world names it, and what it accepts (GRASP-01).
//!
//! An operator runs the engine beside the relay on loopback
//! (`--own-relay ws://127.0.0.1:7777`) while announcements name it by its
//! public name (`wss://git.example.com`, clone URLs
//! `https://git.example.com/<npub>/<repo>.git`). Every one of those names is
//! the own relay: syncing from it would download our own history from
//! ourselves, daily and after every reconnect, and receive every live event
//! twice. So a URL names the service when its host and port are the own
//! relay's or the domain's, whatever the scheme (`ws`/`wss`, `http`/`https`
//! for clone URLs), default port or trailing slash.
//!
//! GRASP-01 has the relay accept an announcement only if it lists the
//! service in both its `relays` and its `clone` tags. The engine applies
//! the same rule to announcements it finds on other relays, so it never
//! passes on (or syncs) a repo its own relay would refuse.

use nostr::prelude::Event;

use crate::sans_io::identity::relay_url::{host_port, normalize, relay_of_clone_url};

/// The own relay's names.
#[derive(Debug, Clone)]
pub struct Service {
    own_url: String,
    /// `host[:port]` forms (default ports dropped) that name the service.
    authorities: Vec<String>,
    domain: String,
}

impl Service {
    /// The service behind `own_url` (normalized) and `domain` (a host with
    /// an optional port; the own relay's host and port when `None`).
    pub fn new(own_url: &str, domain: Option<&str>) -> Service {
        let own_authority = host_port(own_url).to_ascii_lowercase();
        let domain = domain
            .map(|d| d.trim().trim_end_matches('/').to_ascii_lowercase())
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| own_authority.clone());
        let mut authorities = vec![own_authority];
        for scheme in ["ws", "wss"] {
            if let Ok(url) = normalize(&format!("{scheme}://{domain}")) {
                authorities.push(host_port(&url).to_owned());
            }
        }
        authorities.sort();
        authorities.dedup();
        Service {
            own_url: own_url.to_owned(),
            authorities,
            domain,
        }
    }

    /// The domain announcements must list.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// True if the normalized relay URL `url` is the own relay under any name.
    pub fn names(&self, url: &str) -> bool {
        url == self.own_url || self.authorities.iter().any(|a| a == host_port(url))
    }

    /// GRASP-01: the announcement lists the service in `relays` and in `clone`.
    pub fn accepts(&self, announcement: &Event) -> bool {
        let (mut in_relays, mut in_clone) = (false, false);
        for tag in announcement.tags.iter() {
            let values = tag.as_slice();
            let rest = values.get(1..).unwrap_or_default();
            match values.first().map(String::as_str) {
                Some("relays") => {
                    in_relays |= rest
                        .iter()
                        .filter_map(|raw| normalize(raw).ok())
                        .any(|url| self.names(&url));
                }
                Some("clone") => {
                    in_clone |= rest
                        .iter()
                        .filter_map(|raw| relay_of_clone_url(raw))
                        .any(|url| self.names(&url));
                }
                _ => {}
            }
        }
        in_relays && in_clone
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::*;

    fn announcement(tags: &[&[&str]]) -> Event {
        let tags = tags.iter().map(|t| Tag::parse(t.iter().copied()).unwrap());
        EventBuilder::new(Kind::from_u16(30617), "")
            .tags(tags)
            .finalize(&Keys::generate())
            .unwrap()
    }

    #[test]
    fn every_name_of_the_own_relay_is_the_service() {
        let s = Service::new("ws://127.0.0.1:7777", Some("git.example.com"));
        for url in [
            "ws://127.0.0.1:7777",
            "wss://127.0.0.1:7777",
            "wss://git.example.com",
            "ws://git.example.com",
            "wss://git.example.com/relay",
        ] {
            assert!(s.names(url), "{url}");
        }
        assert!(s.names(&normalize("wss://Git.Example.com:443/").unwrap()));
        for url in [
            "wss://git.example.org",
            "wss://git.example.com:8443",
            "ws://127.0.0.1:7778",
            "wss://example.com",
        ] {
            assert!(!s.names(url), "{url}");
        }
    }

    #[test]
    fn the_domain_defaults_to_the_own_relay() {
        let s = Service::new("ws://127.0.0.1:7777", None);
        assert_eq!(s.domain(), "127.0.0.1:7777");
        assert!(s.names("wss://127.0.0.1:7777"));
        let s = Service::new("ws://127.0.0.1:7777", Some("git.example.com:443"));
        assert!(s.names("wss://git.example.com"), "default port dropped");
    }

    #[test]
    fn accepts_only_announcements_listing_the_service_in_relays_and_clone() {
        let s = Service::new("ws://127.0.0.1:7777", Some("git.example.com"));
        let relays = ["relays", "wss://other.example", "wss://git.example.com"];
        let clone = ["clone", "https://git.example.com/npub1x/repo.git"];
        let other_clone = ["clone", "https://github.com/x/repo.git"];
        assert!(s.accepts(&announcement(&[&["d", "repo"], &relays, &clone])));
        assert!(!s.accepts(&announcement(&[&["d", "repo"], &relays])));
        assert!(!s.accepts(&announcement(&[&["d", "repo"], &clone])));
        assert!(!s.accepts(&announcement(&[&["d", "repo"], &relays, &other_clone])));
        assert!(!s.accepts(&announcement(&[
            &["d", "repo"],
            &["relays", "wss://other.example"],
            &clone
        ])));
    }
}
