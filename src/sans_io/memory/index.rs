//! The repo index: what we want to sync, learnt from announcements and roots.
//!
//! Repo refs, root event ids and relay URLs are interned once into small
//! integer ids; everything downstream (relay table, batches, filters) holds
//! ids. Each update returns the exact per-relay target changes it caused, so
//! the engine's three-way diff looks only at what a batch touched instead of
//! re-deriving every relay's targets (`derive_relay_targets` below is that
//! full recompute, kept as the reference the incremental path is checked and
//! benchmarked against).
//!
//! Deletions (NIP-09) live in `deletion`, and which relays an announcement
//! may name, per owner and in all, in `relay_lists`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use log::{debug, info, warn};
use nostr::prelude::{Event, EventId, Kind, Timestamp};

use crate::sans_io::identity::address::{host_and_port, ip_literal, is_public};
use crate::sans_io::identity::relay_url::{normalize, relay_of_clone_url};
use crate::sans_io::identity::service::Service;
use crate::sans_io::timing::time::Time;

mod deletion;
mod relay_lists;

/// Kind of a repository announcement (NIP-34).
pub(crate) const KIND_ANNOUNCEMENT: u16 = 30617;
/// Kind of a repository state event (NIP-34).
pub(crate) const KIND_STATE: u16 = 30618;
/// Kinds of root events: patch, pull request, issue.
pub(crate) const ROOT_KINDS: [u16; 3] = [1617, 1618, 1621];
/// Kind of a deletion request (NIP-09): its author's roots and
/// announcements named in it leave the index and free their share.
pub(crate) const KIND_DELETION: u16 = 5;

/// Longest `d` identifier accepted; longer ones are ignored as hostile.
const MAX_IDENTIFIER_LEN: usize = 256;

/// Interned repo ref `30617:<pubkey>:<d>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepoId(pub(crate) u32);

/// Interned root event id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RootId(pub(crate) u32);

/// Interned normalized relay URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelayId(pub(crate) u32);

impl RelayId {
    /// Position in tables indexed by relay.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One thing a relay is asked to sync: a repo (Layer 2) or a root (Layer 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Item {
    /// Events tagging this repo, and its 30618 state.
    Repo(RepoId),
    /// Events tagging this root event.
    Root(RootId),
}

/// One change of a relay's targets caused by an index update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetChange {
    /// The relay whose targets changed.
    pub relay: RelayId,
    /// The item gained or lost.
    pub item: Item,
    /// True when the relay gained one more reason to sync the item.
    pub added: bool,
}

#[derive(Debug)]
struct Repo {
    /// `30617:<pubkey>:<d>`, shared with the map from coordinates to ids:
    /// one allocation per repo, not two (at thousands of repos each copy
    /// cost ~100 bytes). The `d` identifier is its third part.
    coord: Arc<str>,
    /// `created_at` and id of the announcement in force; `None` while only
    /// roots have named the repo.
    announced: Option<(Timestamp, EventId)>,
    relays: Vec<RelayId>,
    roots: Vec<RootId>,
    /// When the relay set last changed after the first announcement.
    relays_changed: Option<Time>,
    /// A newer announcement whose relay change waits for the change
    /// interval to pass (see [`IndexLimits::relay_change_interval`]).
    /// Boxed: rare (a change within the interval), and inline it made
    /// every repo of the table 56 bytes larger.
    held: Option<Box<Held>>,
    /// The pubkey (hex) whose share pays for the repo: the first to name
    /// it, until its owner announces it. `None` for the owner (the
    /// coordinate's pubkey), as with every announced repo: no copy of a
    /// key the coordinate holds already.
    charged: Option<Box<str>>,
    /// True once the repo was some relay's target: see [`Root::targeted`].
    targeted: bool,
}

impl Repo {
    /// The pubkey (hex) whose share pays for the repo.
    fn charged(&self) -> &str {
        self.charged
            .as_deref()
            .unwrap_or_else(|| owner_of(&self.coord))
    }

    /// The newest announcement seen: the one held back, else the one in force.
    fn latest(&self) -> Option<(Timestamp, EventId)> {
        self.held.as_ref().map(|h| h.stamp).or(self.announced)
    }
}

/// An announcement held back: its stamp and relays.
#[derive(Debug)]
struct Held {
    stamp: (Timestamp, EventId),
    relays: Vec<RelayId>,
}

/// What the index refused or held back from hostile or sloppy input, for
/// metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Announcements ignored whole (oversized `d` tag).
    pub announcements_rejected: u64,
    /// Relay URLs dropped: malformed, unknown scheme, credentials, or a
    /// private address.
    pub relay_urls_rejected: u64,
    /// Relay URLs past the per-announcement cap, the cap on known relays
    /// or the announcing pubkey's share of it.
    pub relay_urls_over_cap: u64,
    /// Interned relays released once nothing listed them any more.
    pub relays_released: u64,
    /// Repos and roots not interned: their pubkey's share, or the global
    /// cap, was used up.
    pub items_over_cap: u64,
    /// Repos and roots released once nothing referenced them any more
    /// (deleted by their author, or named only by deleted roots).
    pub items_released: u64,
    /// Relay changes held back because the repo changed relays too recently.
    pub relay_changes_held: u64,
}

#[derive(Debug)]
struct Root {
    id: EventId,
    repos: Vec<RepoId>,
    /// The author (hex), whose share pays for the root.
    author: String,
    /// True once the root was some relay's target. Such an id may still
    /// sit in a subscription's item list when released, and an EOSE of
    /// that subscription would confirm whatever reused the id: so it is
    /// retired, never reused (its share is still freed). Ids never
    /// targeted, the bulk of junk, are reused.
    targeted: bool,
}

/// Limits the index applies to hostile input.
#[derive(Debug, Clone)]
pub struct IndexLimits {
    /// Relays taken from one announcement.
    pub relays_per_announcement: usize,
    /// Repos one root may name.
    pub repos_per_root: usize,
    /// After a repo's relays change, further changes wait this long (the
    /// newest is applied then), so an announcement flipping its relays
    /// every second cannot make us connect and drop relays every second.
    pub relay_change_interval: Duration,
    /// Relays interned at most; URLs beyond are dropped (and counted), so
    /// announcements naming ever new relays cannot grow memory without
    /// bound. Relays no announcement lists any more are released (see
    /// [`RepoIndex::release_relay`]), so the cap never fills for good.
    pub max_relays: usize,
    /// Distinct relays the announcements of one pubkey may list: one key
    /// cannot take the whole of `max_relays` from everyone else.
    pub max_relays_per_pubkey: usize,
    /// Repos one pubkey may bring into the index, by announcing them or by
    /// naming them in its roots. A repo is released (and its share freed)
    /// once nothing references it: its announcement deleted and no root
    /// naming it left (roots leave through NIP-09 deletions by their
    /// author), so junk a key deletes does not hold its share for good.
    pub max_repos_per_pubkey: usize,
    /// Roots one pubkey may author in the index.
    pub max_roots_per_pubkey: usize,
    /// Repos and roots known at most, each.
    pub max_items: usize,
    /// Keep relays on loopback, private and link-local IP literals (and
    /// `localhost`); otherwise they are dropped before they cost a slot.
    pub allow_private: bool,
}

/// Private relay URLs logged once each at most: hostile announcements
/// could name any number, and past this they stay at debug.
const PRIVATE_LOGGED_MAX: usize = 1024;

/// Repos, their relays and roots, with ids interned.
#[derive(Debug)]
pub struct RepoIndex {
    service: Service,
    limits: IndexLimits,
    repo_ids: HashMap<Arc<str>, RepoId>,
    repos: Vec<Repo>,
    root_ids: HashMap<EventId, RootId>,
    roots: Vec<Root>,
    /// Ids by normalized URL; each key is shared with `relay_urls`.
    relay_ids: HashMap<Arc<str>, RelayId>,
    /// Private relay URLs already logged at info (see
    /// `relay_lists::refuse_private`), at most [`PRIVATE_LOGGED_MAX`].
    private_logged: HashSet<String>,
    /// Normalized URLs by id; empty for a released id.
    relay_urls: Vec<Arc<str>>,
    /// Per relay id: announcement relay lists (in force or held) naming it.
    relay_refs: Vec<u32>,
    /// Per relay id: interned by the engine itself (own relay, bootstrap),
    /// never released.
    relay_pinned: Vec<bool>,
    /// Released relay ids, reused before new ones are made.
    free_relays: Vec<RelayId>,
    /// Per pubkey (hex): how many of its relay lists name each relay.
    pubkey_relays: HashMap<String, HashMap<RelayId, u32>>,
    /// Per pubkey (hex): repos and roots it brought into the index.
    pubkey_items: HashMap<String, (usize, usize)>,
    /// Repos and roots live now (interned, not released), for the global cap.
    live: (usize, usize),
    /// Released repo and root ids never targeted, reused before new ones.
    free_repos: Vec<RepoId>,
    free_roots: Vec<RootId>,
    /// Repos with a held change and when it is due, for the engine to arm.
    holds: Vec<(RepoId, Time)>,
    stats: IndexStats,
}

impl RepoIndex {
    /// An empty index; the own relay, under any of its names, is never
    /// made a target.
    pub fn new(service: Service, limits: IndexLimits) -> Self {
        RepoIndex {
            service,
            limits,
            repo_ids: HashMap::new(),
            repos: Vec::new(),
            root_ids: HashMap::new(),
            roots: Vec::new(),
            relay_ids: HashMap::new(),
            private_logged: HashSet::new(),
            relay_urls: Vec::new(),
            relay_refs: Vec::new(),
            relay_pinned: Vec::new(),
            free_relays: Vec::new(),
            pubkey_relays: HashMap::new(),
            pubkey_items: HashMap::new(),
            live: (0, 0),
            free_repos: Vec::new(),
            free_roots: Vec::new(),
            holds: Vec::new(),
            stats: IndexStats::default(),
        }
    }

    /// What was refused or held back so far.
    pub fn stats(&self) -> IndexStats {
        self.stats
    }

    /// Repos whose relay change was held back since the last call, with
    /// when to call [`release_held`](Self::release_held) for each.
    pub fn take_holds(&mut self) -> Vec<(RepoId, Time)> {
        std::mem::take(&mut self.holds)
    }

    /// Applies the change held back for `repo`, if any (it may have been
    /// superseded by an announcement that restored the relays in force).
    pub fn release_held(&mut self, repo: RepoId, now: Time, changes: &mut Vec<TargetChange>) {
        let Some(held) = self
            .repos
            .get_mut(repo.0 as usize)
            .and_then(|r| r.held.take())
        else {
            return;
        };
        self.reference(repo, &held.relays, false);
        self.change_relays(repo, held.stamp, held.relays, now, changes);
    }

    /// Applies an announcement or a root event received at `now`; other
    /// kinds change nothing.
    pub fn apply(&mut self, event: &Event, now: Time, changes: &mut Vec<TargetChange>) {
        let kind = event.kind.as_u16();
        if kind == KIND_ANNOUNCEMENT {
            self.apply_announcement(event, now, changes, false);
        } else if ROOT_KINDS.contains(&kind) {
            self.apply_root(event, changes);
        } else if kind == KIND_DELETION {
            self.apply_deletion(event, changes);
        }
    }

    /// A verified announcement that no longer lists the service, newer than
    /// the one in force: the repo keeps its name and roots but loses every
    /// relay, as if announced with none (GRASP-01: the own relay refuses it,
    /// so the old relay list must not be synced forever).
    pub fn withdraw(&mut self, event: &Event, now: Time, changes: &mut Vec<TargetChange>) {
        if event.kind.as_u16() == KIND_ANNOUNCEMENT {
            self.apply_announcement(event, now, changes, true);
        }
    }

    /// True if the index holds an announcement for `event`'s repo older
    /// than `event` (a withdrawal would change something).
    pub fn announced_before(&self, event: &Event) -> bool {
        let Some(identifier) = identifier_of(event) else {
            return false;
        };
        let coord = format!("{KIND_ANNOUNCEMENT}:{}:{identifier}", event.pubkey);
        let Some(repo) = self.repo_id(&coord) else {
            return false;
        };
        let entry = &self.repos[repo.0 as usize];
        let latest = entry.latest();
        latest.is_some_and(|cur| newer((event.created_at, event.id), cur))
    }

    /// The id of a relay URL (already normalized), interning it. A relay
    /// the engine interns itself (own relay, bootstrap) is pinned: never
    /// released.
    pub fn intern_relay(&mut self, url: &str) -> RelayId {
        let id = self.intern_unpinned(url);
        self.relay_pinned[id.index()] = true;
        id
    }

    /// The id of a relay URL, interning it under a released id if one is
    /// free, else a new one.
    fn intern_unpinned(&mut self, url: &str) -> RelayId {
        if let Some(&id) = self.relay_ids.get(url) {
            return id;
        }
        let url: Arc<str> = Arc::from(url);
        let id = match self.free_relays.pop() {
            Some(id) => {
                self.relay_urls[id.index()] = Arc::clone(&url);
                id
            }
            None => {
                self.relay_urls.push(Arc::clone(&url));
                self.relay_refs.push(0);
                self.relay_pinned.push(false);
                RelayId(self.relay_urls.len() as u32 - 1)
            }
        };
        self.relay_ids.insert(url, id);
        id
    }

    /// True when no announcement lists `relay` and the engine did not pin
    /// it: the engine may release it once no connection holds it.
    pub fn relay_unreferenced(&self, relay: RelayId) -> bool {
        let i = relay.index();
        self.relay_refs[i] == 0 && !self.relay_pinned[i] && !self.relay_urls[i].is_empty()
    }

    /// Releases an unreferenced relay: its URL is forgotten and its id
    /// reused by the next relay interned, so junk announcements that were
    /// replaced leave no trace in the cap. The engine calls it only while
    /// nothing can still report on the id (no connection, no connect in
    /// flight, no NIP-11 fetch pending). False (and nothing done) if it is
    /// referenced or pinned.
    pub fn release_relay(&mut self, relay: RelayId) -> bool {
        if !self.relay_unreferenced(relay) {
            return false;
        }
        let url = std::mem::take(&mut self.relay_urls[relay.index()]);
        self.relay_ids.remove(&url);
        self.free_relays.push(relay);
        self.stats.relays_released += 1;
        debug!("{url}: no announcement lists it; released");
        true
    }

    /// True while `relay` names a relay (it was not released).
    pub fn relay_known(&self, relay: RelayId) -> bool {
        self.relay_urls
            .get(relay.index())
            .is_some_and(|u| !u.is_empty())
    }

    /// The id of a relay URL (already normalized), if known.
    pub fn relay_id(&self, url: &str) -> Option<RelayId> {
        self.relay_ids.get(url).copied()
    }

    /// The normalized URL of a relay.
    pub fn relay_url(&self, relay: RelayId) -> &str {
        &self.relay_urls[relay.index()]
    }

    /// Size of tables indexed by relay id: every id handed out so far,
    /// released ones included.
    pub fn relay_count(&self) -> usize {
        self.relay_urls.len()
    }

    /// Relays known now (interned and not released).
    pub fn known_relays(&self) -> usize {
        self.relay_ids.len()
    }

    /// Repos known (announced or only named by roots), released ones not
    /// counted.
    pub fn repo_count(&self) -> usize {
        self.live.0
    }

    /// Roots known, released ones not counted.
    pub fn root_count(&self) -> usize {
        self.live.1
    }

    /// Size of the repo and root tables: every id handed out so far,
    /// released ones included (reused ids are counted once).
    pub fn item_slots(&self) -> (usize, usize) {
        (self.repos.len(), self.roots.len())
    }

    /// The id of repo ref `30617:<pubkey>:<d>`, if known.
    pub fn repo_id(&self, coord: &str) -> Option<RepoId> {
        self.repo_ids.get(coord).copied()
    }

    /// The id of a root event, if known.
    pub fn root_id(&self, id: &EventId) -> Option<RootId> {
        self.root_ids.get(id).copied()
    }

    /// The repo ref string of a repo.
    pub fn repo_coord(&self, repo: RepoId) -> &str {
        &self.repos[repo.0 as usize].coord
    }

    /// The `d` identifier of a repo.
    pub fn repo_identifier(&self, repo: RepoId) -> &str {
        identifier_in(&self.repos[repo.0 as usize].coord)
    }

    /// The relays a repo's announcement in force lists.
    pub fn repo_relays(&self, repo: RepoId) -> &[RelayId] {
        &self.repos[repo.0 as usize].relays
    }

    /// The event id of a root.
    pub fn root_event(&self, root: RootId) -> EventId {
        self.roots[root.0 as usize].id
    }

    /// The seed's `derive_relay_targets`: every relay's targets recomputed
    /// from scratch, with how many repos make each item a target there.
    /// O(everything); the reference for tests and benchmarks only.
    pub fn derive_relay_targets(&self) -> HashMap<RelayId, HashMap<Item, u32>> {
        let mut targets: HashMap<RelayId, HashMap<Item, u32>> = HashMap::new();
        for (i, repo) in self.repos.iter().enumerate() {
            for &relay in &repo.relays {
                let t = targets.entry(relay).or_default();
                *t.entry(Item::Repo(RepoId(i as u32))).or_default() += 1;
                for &root in &repo.roots {
                    *t.entry(Item::Root(root)).or_default() += 1;
                }
            }
        }
        targets
    }

    fn apply_announcement(
        &mut self,
        event: &Event,
        now: Time,
        changes: &mut Vec<TargetChange>,
        withdrawn: bool,
    ) {
        let Some(identifier) = identifier_of(event) else {
            warn!("announcement {} has an oversized d tag; ignored", event.id);
            self.stats.announcements_rejected += 1;
            return;
        };
        let coord = format!("{KIND_ANNOUNCEMENT}:{}:{identifier}", event.pubkey);
        let owner = event.pubkey.to_hex();
        let Some(repo) = self.intern_repo(&coord, &owner) else {
            return;
        };
        self.charge_owner(repo, &owner);
        let stamp = (event.created_at, event.id);
        let entry = &self.repos[repo.0 as usize];
        let latest = entry.latest();
        if latest.is_some_and(|cur| !newer(stamp, cur)) {
            debug!(
                "announcement {} for {coord} is not newer; ignored",
                event.id
            );
            return;
        }
        let relays = if withdrawn {
            Vec::new()
        } else {
            self.relays_of(event, repo)
        };
        let entry = &mut self.repos[repo.0 as usize];
        let first = entry.announced.is_none();
        let due = entry
            .relays_changed
            .map(|t| t + self.limits.relay_change_interval)
            .filter(|due| now < *due && !same_set(&entry.relays, &relays));
        match due {
            Some(due) => {
                if entry.held.is_none() {
                    self.holds.push((repo, due));
                }
                let new = relays.clone();
                let old = entry.held.replace(Box::new(Held { stamp, relays }));
                self.reference(repo, &new, true);
                if let Some(old) = old {
                    self.reference(repo, &old.relays, false);
                }
                self.stats.relay_changes_held += 1;
                debug!("{coord} changes relays too often; newest change held until {due:?}");
            }
            None => {
                if let Some(old) = entry.held.take() {
                    self.reference(repo, &old.relays, false);
                }
                self.change_relays(repo, stamp, relays, now, changes);
                if first {
                    // Learning a repo's relays is not a change: the next
                    // real change may follow at once.
                    self.repos[repo.0 as usize].relays_changed = None;
                }
            }
        }
    }

    /// Puts announcement `stamp` with `relays` in force for `repo`.
    fn change_relays(
        &mut self,
        repo: RepoId,
        stamp: (Timestamp, EventId),
        relays: Vec<RelayId>,
        now: Time,
        changes: &mut Vec<TargetChange>,
    ) {
        let entry = &mut self.repos[repo.0 as usize];
        entry.announced = Some(stamp);
        if same_set(&entry.relays, &relays) {
            return;
        }
        entry.relays_changed = Some(now);
        let old = std::mem::replace(&mut entry.relays, relays);
        let new = entry.relays.clone();
        if !new.is_empty() {
            self.mark_targeted(repo);
        }
        self.reference(repo, &new, true);
        self.reference(repo, &old, false);
        for relay in old.iter().filter(|r| !new.contains(r)) {
            self.push_repo_changes(repo, *relay, false, changes);
        }
        for relay in new.iter().filter(|r| !old.contains(r)) {
            self.push_repo_changes(repo, *relay, true, changes);
        }
    }

    /// Changes for a repo gaining or losing a relay: the repo and every root under it.
    fn push_repo_changes(
        &self,
        repo: RepoId,
        relay: RelayId,
        added: bool,
        changes: &mut Vec<TargetChange>,
    ) {
        changes.push(TargetChange {
            relay,
            item: Item::Repo(repo),
            added,
        });
        for &root in &self.repos[repo.0 as usize].roots {
            changes.push(TargetChange {
                relay,
                item: Item::Root(root),
                added,
            });
        }
    }

    fn apply_root(&mut self, event: &Event, changes: &mut Vec<TargetChange>) {
        let author = event.pubkey.to_hex();
        let Some(root) = self.intern_root(event.id, &author) else {
            return;
        };
        let coords = repo_coords_of(event);
        for (n, coord) in coords.into_iter().enumerate() {
            if n >= self.limits.repos_per_root {
                warn!(
                    "root {} names more than {} repos; rest ignored",
                    event.id, n
                );
                break;
            }
            let Some(repo) = self.intern_repo(coord, &author) else {
                continue;
            };
            if self.roots[root.0 as usize].repos.contains(&repo) {
                continue;
            }
            self.roots[root.0 as usize].repos.push(repo);
            let entry = &mut self.repos[repo.0 as usize];
            entry.roots.push(root);
            self.roots[root.0 as usize].targeted |= !entry.relays.is_empty();
            for &relay in &entry.relays {
                changes.push(TargetChange {
                    relay,
                    item: Item::Root(root),
                    added: true,
                });
            }
        }
    }

    /// The id of a repo, interning it on behalf of `by` (the announcing or
    /// root-authoring pubkey) unless `by`'s share or the global cap is used
    /// up.
    fn intern_repo(&mut self, coord: &str, by: &str) -> Option<RepoId> {
        if let Some(&id) = self.repo_ids.get(coord) {
            return Some(id);
        }
        if !self.take_share(by, true) {
            return None;
        }
        let coord: Arc<str> = Arc::from(coord);
        let charged = (by != owner_of(&coord)).then(|| Box::from(by));
        let entry = Repo {
            coord: Arc::clone(&coord),
            announced: None,
            relays: Vec::new(),
            roots: Vec::new(),
            relays_changed: None,
            held: None,
            charged,
            targeted: false,
        };
        let id = match self.free_repos.pop() {
            Some(id) => {
                self.repos[id.0 as usize] = entry;
                id
            }
            None => {
                self.repos.push(entry);
                RepoId(self.repos.len() as u32 - 1)
            }
        };
        self.repo_ids.insert(coord, id);
        Some(id)
    }

    /// The id of a root authored by `by`, interning it unless `by`'s share
    /// or the global cap is used up.
    fn intern_root(&mut self, id: EventId, by: &str) -> Option<RootId> {
        if let Some(&root) = self.root_ids.get(&id) {
            return Some(root);
        }
        if !self.take_share(by, false) {
            return None;
        }
        let entry = Root {
            id,
            repos: Vec::new(),
            author: by.to_owned(),
            targeted: false,
        };
        let root = match self.free_roots.pop() {
            Some(root) => {
                self.roots[root.0 as usize] = entry;
                root
            }
            None => {
                self.roots.push(entry);
                RootId(self.roots.len() as u32 - 1)
            }
        };
        self.root_ids.insert(id, root);
        Some(root)
    }

    /// Counts one more repo (or root) for pubkey `by`; false, counted as
    /// over the cap, when its share or the global cap is used up. Shares
    /// are what make the caps fair: a flood from one key (or one relay's
    /// worth of keys, each capped) fills its own share, not the index.
    fn take_share(&mut self, by: &str, repo: bool) -> bool {
        let (known, per_key) = if repo {
            (self.live.0, self.limits.max_repos_per_pubkey)
        } else {
            (self.live.1, self.limits.max_roots_per_pubkey)
        };
        let share = self.pubkey_items.get(by).copied().unwrap_or_default();
        let taken = if repo { share.0 } else { share.1 };
        if known >= self.limits.max_items || taken >= per_key {
            // Checked before an entry is made: keys turned away leave none.
            self.stats.items_over_cap += 1;
            debug!("{by}: repo or root over its cap; ignored");
            return false;
        }
        self.count_share(by, repo, true);
        true
    }

    /// Counts one repo (or root) into (`add`) or out of `by`'s share and
    /// the live total; a key with nothing left leaves no entry.
    fn count_share(&mut self, by: &str, repo: bool, add: bool) {
        let share = self.pubkey_items.entry(by.to_owned()).or_default();
        let (mine, live) = if repo {
            (&mut share.0, &mut self.live.0)
        } else {
            (&mut share.1, &mut self.live.1)
        };
        if add {
            *mine += 1;
            *live += 1;
        } else {
            *mine = mine.saturating_sub(1);
            *live = live.saturating_sub(1);
        }
        if *share == (0, 0) {
            self.pubkey_items.remove(by);
        }
    }

    /// An owner announcing a repo first named by someone else's roots
    /// takes it into its own share (if it has room), so the share of the
    /// key that named it is freed only of junk, and deleting those roots
    /// leaves the announced repo alone.
    fn charge_owner(&mut self, repo: RepoId, owner: &str) {
        if self.repos[repo.0 as usize].charged() == owner {
            return;
        }
        let taken = self.pubkey_items.get(owner).map_or(0, |s| s.0);
        if taken >= self.limits.max_repos_per_pubkey {
            return;
        }
        let entry = &mut self.repos[repo.0 as usize];
        let old = entry.charged().to_owned();
        entry.charged = (owner != owner_of(&entry.coord)).then(|| Box::from(owner));
        self.count_share(&old, true, false);
        self.count_share(owner, true, true);
    }

    /// Marks `repo` and its roots as targets of some relay (see
    /// [`Root::targeted`]).
    fn mark_targeted(&mut self, repo: RepoId) {
        let entry = &mut self.repos[repo.0 as usize];
        entry.targeted = true;
        for &root in &entry.roots {
            self.roots[root.0 as usize].targeted = true;
        }
    }
}

/// The pubkey (hex) of repo ref `30617:<pubkey>:<d>`.
fn owner_of(coord: &str) -> &str {
    coord.split(':').nth(1).unwrap_or_default()
}

/// The `d` identifier of repo ref `30617:<pubkey>:<d>` (which may hold
/// colons itself).
fn identifier_in(coord: &str) -> &str {
    coord.splitn(3, ':').nth(2).unwrap_or_default()
}

/// True when both lists hold the same relays, in any order.
fn same_set(a: &[RelayId], b: &[RelayId]) -> bool {
    a.len() == b.len() && a.iter().all(|r| b.contains(r))
}

/// True when announcement `a` replaces `b`: newer, or as new with the lower id (NIP-01).
fn newer(a: (Timestamp, EventId), b: (Timestamp, EventId)) -> bool {
    a.0 > b.0 || (a.0 == b.0 && a.1 < b.1)
}

/// The `d` tag value (empty when absent), `None` when oversized.
fn identifier_of(event: &Event) -> Option<String> {
    let d = event
        .tags
        .iter()
        .map(|t| t.as_slice())
        .find(|t| t.first().map(String::as_str) == Some("d"))
        .and_then(|t| t.get(1))
        .map_or("", String::as_str);
    (d.len() <= MAX_IDENTIFIER_LEN).then(|| d.to_owned())
}

/// The well-formed repo refs among a root's `a` tags, de-duplicated.
fn repo_coords_of(event: &Event) -> Vec<&str> {
    let mut coords: Vec<&str> = Vec::new();
    for tag in event.tags.iter() {
        let values = tag.as_slice();
        if values.first().map(String::as_str) != Some("a") {
            continue;
        }
        if let Some(coord) = values.get(1).filter(|c| is_repo_coord(c))
            && !coords.contains(&coord.as_str())
        {
            coords.push(coord);
        }
    }
    coords
}

/// `30617:<64 lowercase hex>:<d>` with a sane `d`.
pub fn is_repo_coord(coord: &str) -> bool {
    let mut parts = coord.splitn(3, ':');
    let (Some(kind), Some(pubkey), Some(d)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    kind == "30617"
        && pubkey.len() == 64
        && pubkey
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && d.len() <= MAX_IDENTIFIER_LEN
}

/// The kinds the index learns from: repository announcements (30617),
/// root events (patches 1617, pull requests 1618, issues 1621) and
/// deletion requests (5). An embedding relay feeds the events of these
/// kinds it stores from its own clients (see the shell's `Sink`).
pub const INDEX_KINDS: [u16; 5] = [
    KIND_ANNOUNCEMENT,
    ROOT_KINDS[0],
    ROOT_KINDS[1],
    ROOT_KINDS[2],
    KIND_DELETION,
];

/// True for the kinds the index learns from ([`INDEX_KINDS`]).
pub fn is_index_kind(kind: Kind) -> bool {
    INDEX_KINDS.contains(&kind.as_u16())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Tag};

    const T0: Time = Time::from_secs(1_700_000_000);
    const RELAY: &str = "wss://a.example";

    fn limits() -> IndexLimits {
        IndexLimits {
            relays_per_announcement: 10,
            repos_per_root: 10,
            relay_change_interval: Duration::from_secs(60),
            max_relays: 100,
            max_relays_per_pubkey: 10,
            max_repos_per_pubkey: 3,
            max_roots_per_pubkey: 2,
            max_items: 1_000,
            allow_private: false,
        }
    }

    fn index() -> RepoIndex {
        RepoIndex::new(Service::new("wss://own.example", None), limits())
    }

    fn signed(keys: &Keys, kind: u16, tags: Vec<Vec<String>>, at: u64) -> Event {
        let tags = tags.into_iter().map(|t| Tag::parse(t).unwrap());
        EventBuilder::new(Kind::from_u16(kind), format!("{at}"))
            .tags(tags)
            .custom_created_at(Timestamp::from_secs(at))
            .finalize(keys)
            .unwrap()
    }

    fn coord(keys: &Keys, d: &str) -> String {
        format!("{KIND_ANNOUNCEMENT}:{}:{d}", keys.public_key())
    }

    fn announcement(keys: &Keys, d: &str, at: u64) -> Event {
        let tags = vec![
            vec!["d".into(), d.into()],
            vec!["relays".into(), RELAY.into(), "wss://own.example".into()],
        ];
        signed(keys, KIND_ANNOUNCEMENT, tags, at)
    }

    fn root(keys: &Keys, coords: &[String], at: u64) -> Event {
        let tags = coords.iter().map(|c| vec!["a".into(), c.clone()]).collect();
        signed(keys, 1621, tags, at)
    }

    fn deletion(keys: &Keys, tag: &str, value: &str, at: u64) -> Event {
        signed(
            keys,
            KIND_DELETION,
            vec![vec![tag.into(), value.into()]],
            at,
        )
    }

    fn apply(index: &mut RepoIndex, event: &Event) -> Vec<TargetChange> {
        let mut changes = Vec::new();
        index.apply(event, T0, &mut changes);
        changes
    }

    /// A repo keeps one copy of its coordinate, shared with the map of
    /// ids (its identifier is a part of it, colons and all), and no copy
    /// of its owner's key: a repo another key named is charged to that
    /// key until its owner announces it.
    #[test]
    fn a_repo_keeps_its_coordinate_once() {
        let mut index = index();
        let (p, q) = (Keys::generate(), Keys::generate());
        apply(&mut index, &root(&q, &[coord(&p, "a:b")], 10));
        let repo = index.repo_id(&coord(&p, "a:b")).unwrap();
        assert_eq!(index.repo_identifier(repo), "a:b");
        assert_eq!(
            index.repos[repo.0 as usize].charged(),
            q.public_key().to_hex()
        );
        apply(&mut index, &announcement(&p, "a:b", 11));
        let entry = &index.repos[repo.0 as usize];
        assert!(
            entry.charged.is_none(),
            "the owner's key is the coordinate's"
        );
        assert_eq!(entry.charged(), p.public_key().to_hex());
        let q_share = index.pubkey_items.get(&q.public_key().to_hex());
        assert_eq!(q_share, Some(&(0, 1)), "q pays for its root only");
        let (key, _) = index.repo_ids.get_key_value(&*entry.coord).unwrap();
        assert!(Arc::ptr_eq(key, &entry.coord));
    }

    /// The repo table holds an entry per repo ever known: what is rare
    /// (a held relay change) or a copy (the identifier, the owner's key)
    /// stays out of it.
    #[test]
    fn a_repo_entry_stays_small() {
        assert!(size_of::<Repo>() <= 160, "{}", size_of::<Repo>());
    }

    /// A key's junk roots filled its repo share; once it deletes them, the
    /// repos they alone named are released, their ids reused, and the
    /// key's own repo is accepted.
    #[test]
    fn deleted_junk_roots_free_their_key_s_share_and_ids() {
        let mut index = index();
        let p = Keys::generate();
        let junk: Vec<String> = (0..3).map(|i| coord(&p, &format!("junk{i}"))).collect();
        let fake = root(&p, &junk, 10);
        apply(&mut index, &fake);
        apply(&mut index, &announcement(&p, "legit", 11));
        assert_eq!(index.repo_id(&coord(&p, "legit")), None, "share full");
        apply(&mut index, &deletion(&p, "e", &fake.id.to_hex(), 12));
        assert_eq!((index.repo_count(), index.root_count()), (0, 0));
        assert_eq!(index.stats().items_released, 4);
        assert!(index.pubkey_items.is_empty(), "no share left behind");
        apply(&mut index, &announcement(&p, "legit", 13));
        assert!(index.repo_id(&coord(&p, "legit")).is_some());
        assert_eq!(index.item_slots(), (3, 1), "released ids were reused");
    }

    /// Nobody frees a share that is not theirs: a deletion by another key
    /// changes nothing.
    #[test]
    fn a_deletion_by_another_key_releases_nothing() {
        let mut index = index();
        let (p, q) = (Keys::generate(), Keys::generate());
        let fake = root(&p, &[coord(&p, "x")], 10);
        apply(&mut index, &fake);
        apply(&mut index, &deletion(&q, "e", &fake.id.to_hex(), 11));
        apply(&mut index, &deletion(&q, "a", &coord(&p, "x"), 11));
        assert_eq!((index.repo_count(), index.root_count()), (1, 1));
        assert_eq!(index.stats().items_released, 0);
    }

    /// A deleted announcement takes its repo off every relay and frees
    /// the share; having been a target, its id is retired, not reused.
    #[test]
    fn a_deleted_announcement_releases_its_repo_and_its_targets() {
        let mut index = index();
        let p = Keys::generate();
        let added = apply(&mut index, &announcement(&p, "r", 10));
        assert_eq!(added.len(), 1);
        let c = coord(&p, "r");
        let removed = apply(&mut index, &deletion(&p, "a", &c, 11));
        assert_eq!(removed.len(), 1);
        assert!(!removed[0].added);
        assert_eq!(index.repo_id(&c), None);
        assert_eq!(index.repo_count(), 0);
        assert!(index.derive_relay_targets().is_empty());
        apply(&mut index, &announcement(&p, "s", 12));
        assert_eq!(index.item_slots().0, 2, "a targeted id is not reused");
    }

    /// A deletion older than the announcement in force deletes nothing.
    #[test]
    fn a_deletion_older_than_the_announcement_leaves_it() {
        let mut index = index();
        let p = Keys::generate();
        apply(&mut index, &announcement(&p, "r", 10));
        assert!(apply(&mut index, &deletion(&p, "a", &coord(&p, "r"), 9)).is_empty());
        assert_eq!(index.repo_count(), 1);
    }

    /// A repo first named by another key's roots moves to its owner's
    /// share when announced: deleting the roots frees the namer's share
    /// and leaves the announced repo (and its relays) in force.
    #[test]
    fn an_announced_repo_survives_the_deletion_of_roots_that_named_it() {
        let mut index = index();
        let (p, q) = (Keys::generate(), Keys::generate());
        let c = coord(&p, "r");
        let fake = root(&q, std::slice::from_ref(&c), 10);
        apply(&mut index, &fake);
        apply(&mut index, &announcement(&p, "r", 11));
        let changes = apply(&mut index, &deletion(&q, "e", &fake.id.to_hex(), 12));
        assert_eq!(changes.len(), 1, "the root leaves the relay");
        assert!(index.repo_id(&c).is_some());
        assert_eq!(index.repo_count(), 1);
        let q_hex = q.public_key().to_hex();
        assert!(!index.pubkey_items.contains_key(&q_hex), "q's share freed");
        assert_eq!(
            index.derive_relay_targets().values().next().unwrap().len(),
            1
        );
    }
}
