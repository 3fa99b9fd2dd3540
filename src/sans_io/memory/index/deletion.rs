//! NIP-09 deletions in the index: a root or announcement its author deletes
//! leaves, with the targets it gave relays and the share of the author's
//! quota it held.

use super::*;

impl RepoIndex {
    /// A NIP-09 deletion: each root (`e`) and announcement (`a`) it names
    /// that its author made leaves the index. Others' deletions are
    /// ignored: nobody may free a share that is not theirs.
    pub(super) fn apply_deletion(&mut self, event: &Event, changes: &mut Vec<TargetChange>) {
        let author = event.pubkey.to_hex();
        for tag in event.tags.iter() {
            let values = tag.as_slice();
            let Some(value) = values.get(1) else { continue };
            match values[0].as_str() {
                "e" => {
                    let root = EventId::from_hex(value)
                        .ok()
                        .and_then(|id| self.root_ids.get(&id).copied());
                    if let Some(root) = root
                        && self.roots[root.0 as usize].author == author
                    {
                        self.release_root(root, changes);
                    }
                }
                "a" if is_repo_coord(value) && owner_of(value) == author => {
                    self.delete_announcement(value, event.created_at, changes);
                }
                _ => {}
            }
        }
    }

    /// A deleted root: it stops being a target, leaves its repos, and
    /// frees its author's share; repos it alone kept are released too.
    pub(super) fn release_root(&mut self, root: RootId, changes: &mut Vec<TargetChange>) {
        let entry = &mut self.roots[root.0 as usize];
        let repos = std::mem::take(&mut entry.repos);
        let author = std::mem::take(&mut entry.author);
        let targeted = entry.targeted;
        self.root_ids.remove(&entry.id);
        for repo in repos {
            let entry = &mut self.repos[repo.0 as usize];
            entry.roots.retain(|r| *r != root);
            for &relay in &entry.relays {
                changes.push(TargetChange {
                    relay,
                    item: Item::Root(root),
                    added: false,
                });
            }
            self.release_repo_if_unused(repo);
        }
        self.count_share(&author, false, false);
        self.stats.items_released += 1;
        if !targeted {
            self.free_roots.push(root);
        }
    }

    /// A deleted announcement (NIP-09 `a`: every version up to the
    /// deletion's `created_at`): the repo loses its relays, as if never
    /// announced, and is released unless roots still name it. A newer
    /// version than the deletion stays in force.
    pub(super) fn delete_announcement(
        &mut self,
        coord: &str,
        until: Timestamp,
        changes: &mut Vec<TargetChange>,
    ) {
        let Some(repo) = self.repo_id(coord) else {
            return;
        };
        let entry = &mut self.repos[repo.0 as usize];
        if entry.latest().is_none_or(|(at, _)| at > until) {
            return;
        }
        entry.announced = None;
        entry.relays_changed = None;
        let held = entry.held.take();
        let old = std::mem::take(&mut entry.relays);
        if let Some(held) = held {
            self.reference(repo, &held.relays, false);
        }
        self.reference(repo, &old, false);
        for &relay in &old {
            self.push_repo_changes(repo, relay, false, changes);
        }
        self.release_repo_if_unused(repo);
    }

    /// Releases `repo` once nothing references it: no announcement (in
    /// force or held) and no root. Its share is freed; its id is reused
    /// unless it was ever a target (see [`Root::targeted`]).
    pub(super) fn release_repo_if_unused(&mut self, repo: RepoId) {
        let entry = &mut self.repos[repo.0 as usize];
        if entry.announced.is_some() || entry.held.is_some() || !entry.roots.is_empty() {
            return;
        }
        let charged = entry.charged().to_owned();
        // Released: no key pays for it any more (an empty key, as before).
        entry.charged = Some(Box::default());
        let targeted = entry.targeted;
        self.repo_ids.remove(&entry.coord);
        self.count_share(&charged, true, false);
        self.stats.items_released += 1;
        if !targeted {
            self.free_repos.push(repo);
        }
    }
}
