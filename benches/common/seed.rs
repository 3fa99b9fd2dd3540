//! The seed design's algorithms (GRASP-02 proactive sync v4,
//! `derive_relay_targets`, `compute_actions` and the filter builders),
//! written as the seed writes them: String keys, `HashSet`s, a full
//! recompute per batch. The baseline the engine is measured against.

use std::collections::{HashMap, HashSet};

use nostr::prelude::*;

/// What we want to sync for one repo (key: `30617:<pubkey>:<d>`).
#[derive(Debug, Clone, Default)]
pub struct RepoSyncNeeds {
    /// Relay URLs listed in the repo's announcement.
    pub relays: HashSet<String>,
    /// Root events that reference the repo.
    pub root_events: HashSet<EventId>,
}

/// Per-relay view derived from the repo index.
#[derive(Debug, Clone, Default)]
pub struct RelaySyncNeeds {
    pub repos: HashSet<String>,
    pub root_events: HashSet<EventId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionStatus {
    Disconnected,
    Connecting,
    Connected,
}

/// Confirmed state of a relay (the fields `compute_actions` reads).
#[derive(Debug)]
pub struct RelayState {
    pub repos: HashSet<String>,
    pub root_events: HashSet<EventId>,
    pub connection_status: ConnectionStatus,
}

#[derive(Debug, Clone, Default)]
pub struct PendingItems {
    pub repos: HashSet<String>,
    pub root_events: HashSet<EventId>,
}

#[derive(Debug, Clone)]
pub struct PendingBatch {
    pub batch_id: u64,
    pub items: PendingItems,
    pub outstanding_subs: HashSet<SubscriptionId>,
}

/// New subscriptions for one relay.
#[derive(Debug)]
pub struct AddFilters {
    pub relay_url: String,
    pub repos: HashSet<String>,
    pub root_events: HashSet<EventId>,
    pub filters: Vec<Filter>,
}

/// Inverts the repo index into a per-relay view.
pub fn derive_relay_targets(
    repo_index: &HashMap<String, RepoSyncNeeds>,
) -> HashMap<String, RelaySyncNeeds> {
    let mut targets: HashMap<String, RelaySyncNeeds> = HashMap::new();

    for (repo_ref, needs) in repo_index {
        for relay_url in &needs.relays {
            let target = targets.entry(relay_url.clone()).or_default();
            target.repos.insert(repo_ref.clone());
            target.root_events.extend(needs.root_events.iter().cloned());
        }
    }

    targets
}

/// The three-way diff: target − pending − confirmed, over every relay.
pub fn compute_actions(
    targets: &HashMap<String, RelaySyncNeeds>,
    pending: &HashMap<String, Vec<PendingBatch>>,
    confirmed: &HashMap<String, RelayState>,
) -> Vec<AddFilters> {
    let mut actions = Vec::new();
    // The seed writes `.unwrap_or(&HashSet::new())`, which does not borrow-check.
    let no_repos: HashSet<String> = HashSet::new();
    let no_events: HashSet<EventId> = HashSet::new();

    for (relay_url, target) in targets {
        // Skip disconnected relays - they will get AddFilters on reconnect
        if let Some(state) = confirmed.get(relay_url)
            && state.connection_status != ConnectionStatus::Connected
        {
            continue;
        }

        // Collect all pending items for this relay
        let pending_repos: HashSet<_> = pending
            .get(relay_url)
            .map(|batches| {
                batches
                    .iter()
                    .flat_map(|b| b.items.repos.iter().cloned())
                    .collect()
            })
            .unwrap_or_default();
        let pending_events: HashSet<_> = pending
            .get(relay_url)
            .map(|batches| {
                batches
                    .iter()
                    .flat_map(|b| b.items.root_events.iter().cloned())
                    .collect()
            })
            .unwrap_or_default();

        // Collect confirmed items for this relay
        let confirmed_repos = confirmed
            .get(relay_url)
            .map(|c| &c.repos)
            .unwrap_or(&no_repos);
        let confirmed_events = confirmed
            .get(relay_url)
            .map(|c| &c.root_events)
            .unwrap_or(&no_events);

        // New = target - pending - confirmed
        let new_repos: HashSet<_> = target
            .repos
            .iter()
            .filter(|r| !pending_repos.contains(*r) && !confirmed_repos.contains(*r))
            .cloned()
            .collect();
        let new_events: HashSet<_> = target
            .root_events
            .iter()
            .filter(|e| !pending_events.contains(*e) && !confirmed_events.contains(*e))
            .cloned()
            .collect();

        if !new_repos.is_empty() || !new_events.is_empty() {
            let filters = build_layer2_and_layer3_filters(&new_repos, &new_events, None);
            actions.push(AddFilters {
                relay_url: relay_url.clone(),
                repos: new_repos,
                root_events: new_events,
                filters,
            });
        }
    }

    actions
}

/// Layer 2: one filter per tag letter (`a`, `A`, `q`) per 100 repo refs.
pub fn tagged_one_of_our_repo_event_filters(
    repos: &HashSet<String>,
    since: Option<Timestamp>,
) -> Vec<Filter> {
    let mut filters = Vec::new();
    let repo_refs: Vec<_> = repos.iter().collect();

    for chunk in repo_refs.chunks(100) {
        let chunk_vec: Vec<&str> = chunk.iter().map(|s| s.as_str()).collect();

        let mut f1 = Filter::new().custom_tags(SingleLetterTag::LOWERCASE_A, chunk_vec.clone());
        let mut f2 = Filter::new().custom_tags(SingleLetterTag::UPPERCASE_A, chunk_vec.clone());
        let mut f3 = Filter::new().custom_tags(SingleLetterTag::LOWERCASE_Q, chunk_vec);

        if let Some(ts) = since {
            f1 = f1.since(ts);
            f2 = f2.since(ts);
            f3 = f3.since(ts);
        }

        filters.push(f1);
        filters.push(f2);
        filters.push(f3);
    }

    filters
}

/// Layer 3: one filter per tag letter (`e`, `E`, `q`) per 100 root ids.
pub fn tagged_one_of_our_root_event_filters(
    root_events: &HashSet<EventId>,
    since: Option<Timestamp>,
) -> Vec<Filter> {
    let mut filters = Vec::new();
    let event_ids: Vec<String> = root_events.iter().map(|id| id.to_hex()).collect();

    for chunk in event_ids.chunks(100) {
        let chunk_vec: Vec<&str> = chunk.iter().map(|s| s.as_str()).collect();

        let mut f1 = Filter::new().custom_tags(SingleLetterTag::LOWERCASE_E, chunk_vec.clone());
        let mut f2 = Filter::new().custom_tags(SingleLetterTag::UPPERCASE_E, chunk_vec.clone());
        let mut f3 = Filter::new().custom_tags(SingleLetterTag::LOWERCASE_Q, chunk_vec);

        if let Some(ts) = since {
            f1 = f1.since(ts);
            f2 = f2.since(ts);
            f3 = f3.since(ts);
        }

        filters.push(f1);
        filters.push(f2);
        filters.push(f3);
    }

    filters
}

/// Layer 2 + Layer 3 filters (not Layer 1).
pub fn build_layer2_and_layer3_filters(
    repos: &HashSet<String>,
    root_events: &HashSet<EventId>,
    since: Option<Timestamp>,
) -> Vec<Filter> {
    let mut filters = Vec::new();
    filters.extend(tagged_one_of_our_repo_event_filters(repos, since));
    filters.extend(tagged_one_of_our_root_event_filters(root_events, since));
    filters
}
