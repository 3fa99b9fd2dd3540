//! The relays an announcement names, as the index takes them: read from
//! `relays` tags and `clone` URLs, normalized, refused when private or
//! over the caps, and counted per owner so that one pubkey cannot make the
//! engine connect anywhere it likes.

use super::*;

impl RepoIndex {
    /// Counts `repo`'s relay list `relays` in (`add`) or out of the
    /// references that keep relays interned, globally and per owner.
    pub(super) fn reference(&mut self, repo: RepoId, relays: &[RelayId], add: bool) {
        let owner = owner_of(&self.repos[repo.0 as usize].coord).to_owned();
        let mine = self.pubkey_relays.entry(owner.clone()).or_default();
        for &relay in relays {
            let global = &mut self.relay_refs[relay.index()];
            let count = mine.entry(relay).or_default();
            if add {
                *global += 1;
                *count += 1;
            } else {
                *global = global.saturating_sub(1);
                *count = count.saturating_sub(1);
                if *count == 0 {
                    mine.remove(&relay);
                }
            }
        }
        if mine.is_empty() {
            self.pubkey_relays.remove(&owner);
        }
    }

    /// True when pubkey `owner`'s relay lists already name `relay`.
    pub(super) fn lists(&self, owner: &str, relay: Option<RelayId>) -> bool {
        relay.is_some_and(|r| {
            self.pubkey_relays
                .get(owner)
                .is_some_and(|m| m.contains_key(&r))
        })
    }

    /// True when pubkey `owner` may list `fresh` + 1 relays it lists
    /// nowhere yet, in an announcement replacing `repo`'s: the relays
    /// `repo` lists now will be let go, so they do not count against the
    /// share.
    pub(super) fn within_share(&self, owner: &str, repo: RepoId, fresh: usize) -> bool {
        let listed = self.pubkey_relays.get(owner).map_or(0, HashMap::len);
        let replaced = self.repos[repo.0 as usize].relays.len();
        listed.saturating_sub(replaced) + fresh < self.limits.max_relays_per_pubkey
    }

    /// Every relay an announcement names: each value of each `relays` tag and
    /// the relay of each `clone` URL, normalized, without the own relay and
    /// refused addresses, de-duplicated, capped.
    pub(super) fn relays_of(&mut self, event: &Event, repo: RepoId) -> Vec<RelayId> {
        let owner = event.pubkey.to_hex();
        let mut relays = Vec::new();
        let mut fresh = 0;
        let mut over_cap = 0u64;
        for url in self.relay_urls_of(event) {
            if self.service.names(&url) {
                continue;
            }
            let known = self.relay_ids.get(url.as_str()).copied();
            if known.is_some_and(|id| relays.contains(&id)) {
                continue;
            }
            let listed = self.lists(&owner, known);
            if relays.len() >= self.limits.relays_per_announcement
                || known.is_none() && self.relay_ids.len() >= self.limits.max_relays
                || !listed && !self.within_share(&owner, repo, fresh)
            {
                over_cap += 1;
                continue;
            }
            fresh += usize::from(!listed);
            let id = known.unwrap_or_else(|| self.intern_unpinned(&url));
            relays.push(id);
        }
        if over_cap > 0 {
            self.stats.relay_urls_over_cap += over_cap;
            warn!(
                "announcement {}: {over_cap} relays over the cap ({} per announcement, {} per pubkey, {} known) ignored",
                event.id,
                self.limits.relays_per_announcement,
                self.limits.max_relays_per_pubkey,
                self.limits.max_relays
            );
        }
        relays
    }

    /// The normalized relay URLs an announcement names, refused ones
    /// counted and left out.
    pub(super) fn relay_urls_of(&mut self, event: &Event) -> Vec<String> {
        let mut urls = Vec::new();
        for tag in event.tags.iter() {
            let values = tag.as_slice();
            match values.first().map(String::as_str) {
                Some("relays") => {
                    for raw in &values[1..] {
                        match normalize(raw) {
                            Ok(url) if self.allowed_host(&url) => urls.push(url),
                            Ok(url) => {
                                self.stats.relay_urls_rejected += 1;
                                self.refuse_private(event, url);
                            }
                            Err(e) => {
                                self.stats.relay_urls_rejected += 1;
                                debug!("announcement {}: relay {raw:?} ignored: {e}", event.id);
                            }
                        }
                    }
                }
                Some("clone") => {
                    for url in values[1..].iter().filter_map(|c| relay_of_clone_url(c)) {
                        if self.allowed_host(&url) {
                            urls.push(url);
                        } else {
                            self.refuse_private(event, url);
                        }
                    }
                }
                _ => {}
            }
        }
        urls
    }

    /// Logs a relay refused for its private address: at info the first
    /// time (an operator syncing a LAN relay learns why it is skipped and
    /// which flag allows it), at debug after, and at debug for all once
    /// [`PRIVATE_LOGGED_MAX`] were logged.
    fn refuse_private(&mut self, event: &Event, url: String) {
        if self.private_logged.len() < PRIVATE_LOGGED_MAX && self.private_logged.insert(url.clone())
        {
            info!(
                "relay {url} refused: a private address (named by announcement {}; --allow-private-addresses allows it); said once per relay",
                event.id
            );
        } else {
            debug!("announcement {}: private relay {url} ignored", event.id);
        }
    }

    /// False for a loopback, private or link-local IP literal or
    /// `localhost`, unless private addresses are allowed. Names that resolve
    /// to such addresses are refused later, by the shell's address guard.
    pub(super) fn allowed_host(&self, url: &str) -> bool {
        if self.limits.allow_private {
            return true;
        }
        let Some((host, _)) = host_and_port(url) else {
            return false;
        };
        let local_name = host == "localhost" || host.ends_with(".localhost");
        !local_name && ip_literal(&host).is_none_or(is_public)
    }
}
