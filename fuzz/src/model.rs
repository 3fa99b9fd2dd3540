//! What the repo index must hold after a set of announcements and roots,
//! derived from the rules alone, to check the engine against: the newest
//! announcement of a repo wins (ties to the lower id), its `d` tag must not
//! pass 256 bytes, its relays are the first `cap` distinct allowed URLs of
//! its `relays` and `clone` tags without the own relay, and a root is synced
//! wherever one of its first `cap` well-formed repo refs is.
//!
//! Shared by the `announcement` fuzz target and `tests/sim_properties.rs`
//! (which includes this file by path).

use std::cmp::Reverse;
use std::collections::HashMap;

use grasp_sync::internal::is_repo_coord;
use grasp_sync::internal::{host_and_port, ip_literal, is_public};
use grasp_sync::internal::{normalize, relay_of_clone_url};
use grasp_sync::{Engine, ItemKey};
use nostr::prelude::{Event, EventId, Timestamp};

/// Longest `d` identifier the engine accepts.
pub const MAX_IDENTIFIER_LEN: usize = 256;

/// The engine's limits the model needs.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `Config::max_relays_per_announcement`.
    pub relays_per_announcement: usize,
    /// `Config::max_repos_per_root`.
    pub repos_per_root: usize,
    /// `Config::allow_private_addresses`.
    pub allow_private: bool,
}

/// The expected index.
pub struct Model {
    /// Relay URLs of each repo's winning announcement (empty when only roots name it).
    repos: HashMap<String, Vec<String>>,
    /// Repo refs of each root.
    roots: HashMap<EventId, Vec<String>>,
    /// Repo refs of announcements with oversized `d` tags.
    oversized: Vec<String>,
    limits: Limits,
}

type Stamp<'a> = (Timestamp, Reverse<EventId>, &'a Event);

impl Model {
    /// The index after `events` (in any order), own relay `own` (normalized).
    pub fn new(own: &str, events: &[Event], limits: Limits) -> Model {
        let mut winners: HashMap<String, Stamp> = HashMap::new();
        let mut model = Model {
            repos: HashMap::new(),
            roots: HashMap::new(),
            oversized: Vec::new(),
            limits,
        };
        for e in events {
            match e.kind.as_u16() {
                30617 => model.announcement(e, &mut winners),
                1617 | 1618 | 1621 => model.root(e),
                _ => {}
            }
        }
        for (c, (_, _, e)) in winners {
            model.repos.insert(c, relays_of(e, own, &limits));
        }
        model
    }

    fn announcement<'a>(&mut self, e: &'a Event, winners: &mut HashMap<String, Stamp<'a>>) {
        let d = first_d(e);
        let c = format!("30617:{}:{d}", e.pubkey.to_hex());
        if d.len() > MAX_IDENTIFIER_LEN {
            self.oversized.push(c);
            return;
        }
        let stamp = (e.created_at, Reverse(e.id), e);
        let w = winners.entry(c).or_insert(stamp);
        if (stamp.0, stamp.1) > (w.0, w.1) {
            *w = stamp;
        }
    }

    fn root(&mut self, e: &Event) {
        let mut coords: Vec<String> = Vec::new();
        for t in e.tags.iter().map(|t| t.as_slice()) {
            if t[0] == "a"
                && let Some(c) = t.get(1).filter(|c| is_repo_coord(c))
                && !coords.contains(c)
            {
                coords.push(c.clone());
            }
        }
        coords.truncate(self.limits.repos_per_root);
        for c in &coords {
            self.repos.entry(c.clone()).or_default();
        }
        self.roots.insert(e.id, coords);
    }

    /// Compares the engine's index and every relay's targets with the model.
    pub fn check(&self, engine: &Engine) -> Result<(), String> {
        let index = engine.index();
        expect_eq(index.repo_count(), self.repos.len(), "repos")?;
        expect_eq(index.root_count(), self.roots.len(), "roots")?;
        if let Some(c) = self.oversized.iter().find(|c| index.repo_id(c).is_some()) {
            return Err(format!("oversized d indexed: {c}"));
        }
        for (c, want) in &self.repos {
            let repo = index.repo_id(c).ok_or(format!("repo {c} missing"))?;
            let got: Vec<&str> = index
                .repo_relays(repo)
                .iter()
                .map(|&r| engine.relay_url(r))
                .collect();
            expect_eq(got, want.iter().map(String::as_str).collect(), c)?;
        }
        engine
            .relays()
            .try_for_each(|r| self.check_targets(engine, r))
    }

    /// The relay syncs exactly the repos that list it and the roots under them.
    fn check_targets(&self, engine: &Engine, relay: grasp_sync::RelayId) -> Result<(), String> {
        let url = engine.relay_url(relay);
        let on = |c: &String| self.repos[c].iter().any(|u| u == url);
        for c in self.repos.keys() {
            let got = engine
                .item_state(relay, &ItemKey::Repo(c.clone()))
                .is_some();
            expect_eq(got, on(c), &format!("{url} syncs repo {c}"))?;
        }
        for (id, coords) in &self.roots {
            let got = engine.item_state(relay, &ItemKey::Root(*id)).is_some();
            expect_eq(
                got,
                coords.iter().any(on),
                &format!("{url} syncs root {id}"),
            )?;
        }
        Ok(())
    }
}

fn expect_eq<T: PartialEq + std::fmt::Debug>(got: T, want: T, what: &str) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: engine has {got:?}, model {want:?}"))
    }
}

/// The value of the first `d` tag, empty when it has none.
pub fn first_d(e: &Event) -> &str {
    e.tags
        .iter()
        .map(|t| t.as_slice())
        .find(|t| t[0] == "d")
        .and_then(|t| t.get(1))
        .map_or("", String::as_str)
}

/// False for `localhost` and loopback, private or link-local IP literals.
fn is_public_host(url: &str) -> bool {
    let Some((host, _)) = host_and_port(url) else {
        return false;
    };
    let local_name = host == "localhost" || host.ends_with(".localhost");
    !local_name && ip_literal(&host).is_none_or(is_public)
}

/// The first `cap` distinct allowed relays an announcement names, own relay aside.
pub fn relays_of(e: &Event, own: &str, limits: &Limits) -> Vec<String> {
    let mut relays: Vec<String> = Vec::new();
    for t in e.tags.iter().map(|t| t.as_slice()) {
        let urls: Vec<String> = match t[0].as_str() {
            "relays" => t[1..].iter().filter_map(|u| normalize(u).ok()).collect(),
            "clone" => t[1..]
                .iter()
                .filter_map(|u| relay_of_clone_url(u))
                .collect(),
            _ => continue,
        };
        for u in urls {
            let allowed = limits.allow_private || is_public_host(&u);
            if u != own
                && allowed
                && !relays.contains(&u)
                && relays.len() < limits.relays_per_announcement
            {
                relays.push(u);
            }
        }
    }
    relays
}
