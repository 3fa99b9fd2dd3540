//! Restarts: what the engine saves of each relay, and how a new engine
//! takes it back.
//!
//! A restart is treated as a disconnect of every relay at the save: a
//! relay the new process reaches within the quick-reconnect window of it
//! catches up with `since` (the same path as a quick reconnect, through
//! `lifecycle::connected`), one reached later gets its fresh sync. For the
//! quick path to skip history, items must start out confirmed, so the save
//! keeps a hash of each item a relay had confirmed, and a target the new
//! index finds on that relay starts confirmed when its hash is there
//! (until the relay's first connection). Health, the retry time, the daily
//! schedule and learned limits carry over too.
//!
//! A save claims nothing the sink has not confirmed (issue 34): the
//! process may be killed right after it, and what its outbox held, or
//! held back behind the outbox, dies with it. So the live coverage saved
//! ends no later than the oldest unconfirmed event was received, and an
//! item is saved as confirmed only if it was confirmed before that; the
//! rest is read again after a restart (re-reading is safe, losing is not).
//!
//! The saved state is input like a relay's: relays it names are only hints
//! (applied when an announcement makes the relay known), the own relay is
//! never taken (its self-subscription rebuilds the index from scratch),
//! every time is clamped to what could be true at the restore, and limits
//! only ever lower ours.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use log::info;

use super::coverage::Coverage;
use super::limits::Limits;
use super::limits::StatedLimits;
use super::neg_job::NegSupport;
use super::relay::{Facts, RelayState};
use super::{Action, Engine, Output, Timer};
use crate::sans_io::identity::relay_url::normalize;
use crate::sans_io::memory::index::{Item, RelayId, RepoIndex};
use crate::sans_io::memory::saved_state::{
    MAX_CONFIRMED, MAX_RELAYS, SavedLimits, SavedRelay, SavedState, item_hash,
};
use crate::sans_io::query::result_cap::{Hint, ResultCap};
use crate::sans_io::timing::health::{BackoffPolicy, HealthTracker, SavedHealth};
use crate::sans_io::timing::time::Time;

/// Penalties a saved relay may claim at most (each quadruples its backoff,
/// which is capped long before this).
const MAX_SAVED_PENALTIES: u32 = 16;

/// What a restore left to apply later.
#[derive(Debug, Default)]
pub(super) struct Resume {
    /// Saved relays not known yet, by normalized URL: taken when an
    /// announcement lists them, and saved again meanwhile.
    waiting: HashMap<String, SavedRelay>,
    /// The restore's `(now, unix seconds)`, to convert waiting relays' times.
    anchor: Option<(Time, u64)>,
    /// Hashes of the items each relay had confirmed; new targets found here
    /// start confirmed, until the relay's first connection.
    confirmed: HashMap<RelayId, HashSet<u64>>,
}

impl Resume {
    /// `relay` connected (or its id was released): targets found on it
    /// from now on are new.
    pub(super) fn forget(&mut self, relay: RelayId) {
        self.confirmed.remove(&relay);
    }
}

/// Converts between engine time and Unix seconds around one instant.
#[derive(Debug, Clone, Copy)]
struct Anchor {
    now: Time,
    unix: u64,
}

impl Anchor {
    fn to_unix(self, t: Time) -> u64 {
        if t <= self.now {
            self.unix.saturating_sub(self.now.since(t).as_secs())
        } else {
            self.unix.saturating_add(t.since(self.now).as_secs())
        }
    }

    /// A saved time in engine time, `None` past `latest` (seconds, at
    /// most `now` for what has happened).
    fn to_time(self, unix: Option<u64>, latest: Time) -> Option<Time> {
        let unix = unix?;
        let t = if unix <= self.unix {
            self.now
                .saturating_sub(Duration::from_secs(self.unix - unix))
        } else {
            self.now + Duration::from_secs(unix - self.unix)
        };
        Some(t.min(latest))
    }
}

impl Engine {
    /// The state to save at `now` (`unix_now` is the wall clock then):
    /// the [`MAX_RELAYS`] most recently useful relays, then saved relays
    /// not known yet; confirmed items hashed for as many as
    /// [`MAX_CONFIRMED`] allows, in that order (the cost of a save is
    /// bounded by what is kept, not by what is known).
    ///
    /// Nothing is claimed past what the sink confirmed: `unsettled` is
    /// when the oldest event the sink holds unconfirmed was received, and
    /// the engine's own outputs not taken yet count too. Live coverage
    /// is saved no later than that, and an item only if it was confirmed
    /// before it, so a process killed with events in its outbox, or held
    /// back behind it, reads them again after the restart.
    pub(super) fn saved_state(
        &self,
        now: Time,
        unix_now: u64,
        unsettled: Option<Time>,
    ) -> SavedState {
        let anchor = Anchor {
            now,
            unix: unix_now,
        };
        let waiting = self
            .outputs
            .front()
            .map(|Output::Ingest { received, .. }| *received);
        let unsettled = unsettled.into_iter().chain(waiting).min();
        let ours = Limits::starting(&self.config);
        let mut known: Vec<(Time, RelayId, SavedRelay)> = (0..self.relays.len())
            .map(|i| RelayId(i as u32))
            .filter(|&r| r != self.own && self.index.relay_known(r))
            .filter_map(|r| {
                let state = &self.relays[r.index()];
                let (useful, record) = state.saved(self.relay_url(r), anchor, unsettled, &ours)?;
                Some((useful, r, record))
            })
            .collect();
        known.sort_by_key(|r| std::cmp::Reverse(r.0));
        known.truncate(MAX_RELAYS);
        let mut budget = MAX_CONFIRMED;
        let mut relays = Vec::with_capacity(known.len());
        for (_, id, mut relay) in known {
            let targets = &self.relays[id.index()].targets;
            let settled = targets.settled(unsettled).take(budget);
            relay.confirmed = settled.map(|item| hash_of(&self.index, item)).collect();
            relay.confirmed.sort_unstable();
            budget -= relay.confirmed.len();
            relays.push(relay);
        }
        for waiting in self.resume.waiting.values() {
            if relays.len() == MAX_RELAYS {
                break;
            }
            let mut relay = waiting.clone();
            relay.confirmed.truncate(budget);
            budget -= relay.confirmed.len();
            relays.push(relay);
        }
        SavedState {
            saved_at: unix_now,
            relays,
            refused: self.refused.iter().copied().collect(),
            outbox: Vec::new(),
        }
    }

    /// Takes back `saved` at `now` (`unix_now` is the wall clock then):
    /// relays known now at once, the others when they become known.
    pub(super) fn restore(&mut self, now: Time, unix_now: u64, saved: SavedState) {
        self.resume.anchor = Some((now, unix_now));
        for id in saved.refused {
            self.refused.insert(id);
        }
        let mut taken = 0;
        for relay in saved.relays.into_iter().take(MAX_RELAYS) {
            let Ok(url) = normalize(&relay.url) else {
                continue;
            };
            if self.service.names(&url) || self.resume.waiting.contains_key(&url) {
                continue;
            }
            taken += 1;
            self.resume.waiting.insert(url.clone(), relay);
            if let Some(id) = self.index.relay_id(&url) {
                self.restore_relay(id, now);
            }
        }
        info!("restored the state of {taken} relays");
    }

    /// Applies `relay`'s saved state if one waits for it (once).
    pub(super) fn restore_relay(&mut self, relay: RelayId, now: Time) {
        if self.resume.waiting.is_empty() || relay == self.own {
            return;
        }
        let Some(saved) = self.resume.waiting.remove(self.index.relay_url(relay)) else {
            return;
        };
        let Some((at, unix)) = self.resume.anchor else {
            return;
        };
        let anchor = Anchor { now: at, unix };
        let window = (self.config.quick_reconnect, self.config.daily_max);
        let state = &mut self.relays[relay.index()];
        // Called before the relay's first targets are added (`diff`), so
        // the hashes apply as targets arrive.
        if state.restore_connection(&saved, anchor, now, window) && !saved.confirmed.is_empty() {
            let hashes = saved.confirmed.iter().copied().collect();
            self.resume.confirmed.insert(relay, hashes);
        }
        let retry = state.restore_health(&saved, anchor, now, &self.policy);
        state.facts.restore_limits(&saved);
        if let Some((retry, cancelled)) = retry {
            self.restore_retry(relay, retry, cancelled, now);
        }
    }

    /// The saved state asks for no connect before `retry`: a connect this
    /// engine already asked for the relay (`cancelled`) and has not
    /// handed out yet is taken back, and the retry armed.
    fn restore_retry(&mut self, relay: RelayId, retry: Time, cancelled: bool, now: Time) {
        if cancelled {
            self.actions.retain(|a| !connects(a, relay));
            self.stats.connects = self.stats.connects.saturating_sub(1);
        }
        info!(
            "{}: failing before the restart; next try in {:?}",
            self.relay_url(relay),
            retry.since(now)
        );
        self.arm(retry, Timer::Reconnect(relay));
    }

    /// A target `item` newly added on `relay`: true when the relay had it
    /// confirmed before the restart and has not connected since.
    pub(super) fn restored_confirmed(&self, relay: RelayId, item: Item) -> bool {
        self.resume
            .confirmed
            .get(&relay)
            .is_some_and(|set| set.contains(&hash_of(&self.index, item)))
    }
}

/// The hash `item` is saved as: of its repo's coordinate, or of its
/// root's event id.
fn hash_of(index: &RepoIndex, item: Item) -> u64 {
    match item {
        Item::Repo(repo) => item_hash(index.repo_coord(repo)),
        Item::Root(root) => item_hash(&index.root_event(root).to_hex()),
    }
}

/// One relay's side of the state file: what it saves, and how a saved
/// record is taken back into it.
impl RelayState {
    /// The relay's record at `anchor`, as `url` (confirmed items left
    /// out), with the time it was last useful (for the order), or `None`
    /// when it taught us nothing. Its live coverage ends no later than
    /// `unsettled`; its limits are saved where below `ours`.
    fn saved(
        &self,
        url: &str,
        anchor: Anchor,
        unsettled: Option<Time>,
        ours: &Limits,
    ) -> Option<(Time, SavedRelay)> {
        let now = anchor.now;
        let (mut disconnected, mut covered, mut layer1) = (
            self.facts.disconnected_at,
            self.coverage.gap(),
            self.coverage.layer1_unread(),
        );
        if let Some((gap, cut)) = self.coverage_end(now) {
            (disconnected, covered, layer1) = (Some(now), Some(gap), cut);
        }
        let covered = covered.map(|t| unsettled.map_or(t, |u| t.min(u)));
        let health = self.facts.health.saved();
        let useful = disconnected.or(self.facts.last_connected);
        if useful.is_none() && health == SavedHealth::default() && self.retry_at().is_none() {
            return None;
        }
        let unix = |t: Option<Time>| t.map(|t| anchor.to_unix(t));
        let record = SavedRelay {
            url: url.to_owned(),
            last_connected: unix(self.facts.last_connected),
            disconnected: unix(disconnected),
            covered_until: unix(covered),
            layer1_unread: layer1,
            next_full_sync: unix(self.facts.daily_due),
            failures: health.failures,
            refusals: health.refusals,
            failing_since: unix(health.failing_since),
            rate_limited_until: unix(health.rate_limited_until),
            retry_at: unix(self.retry_at()),
            penalties: self.facts.conduct.penalties(),
            limits: self.facts.saved_limits(ours),
            negentropy: self.facts.neg.known(),
            confirmed: Vec::new(),
        };
        Some((useful.unwrap_or_default(), record))
    }

    /// The daily schedule, and the quick-reconnect state only when it is
    /// whole (a quick reconnect keeps the daily schedule, so it needs
    /// one), consistent and still within the quick-reconnect window
    /// (`window.0`; `window.1` bounds the daily schedule): otherwise the
    /// relay gets a fresh sync. True when the quick state was taken, so
    /// the saved confirmed items apply.
    fn restore_connection(
        &mut self,
        saved: &SavedRelay,
        anchor: Anchor,
        now: Time,
        (window, daily_max): (Duration, Duration),
    ) -> bool {
        let facts = &mut self.facts;
        facts.daily_due = anchor.to_time(saved.next_full_sync, now + daily_max);
        let connected = anchor.to_time(saved.last_connected, now);
        let lost = anchor.to_time(saved.disconnected, now);
        let covered = anchor.to_time(saved.covered_until, now);
        let (Some(connected), Some(lost), Some(covered)) = (connected, lost, covered) else {
            return false;
        };
        if connected > lost
            || now.since(lost) > window
            || facts.last_connected.is_some()
            || facts.daily_due.is_none()
        {
            return false;
        }
        facts.last_connected = Some(connected);
        facts.disconnected_at = Some(lost);
        self.coverage = Coverage::restored(covered.min(lost), saved.layer1_unread);
        true
    }

    /// Failures, retry time and penalties: a dead relay stays dead until
    /// its retry. Returns the retry the saved state asks for, if any, and
    /// whether it cancelled a connect attempt (whose `Connect` and NIP-11
    /// fetch the engine then takes back).
    fn restore_health(
        &mut self,
        saved: &SavedRelay,
        anchor: Anchor,
        now: Time,
        policy: &BackoffPolicy,
    ) -> Option<(Time, bool)> {
        let longest = policy
            .dead_retry
            .max(policy.max)
            .max(policy.rate_limit_cooldown);
        let health = SavedHealth {
            failures: saved.failures,
            refusals: saved.refusals,
            failing_since: anchor.to_time(saved.failing_since, now),
            rate_limited_until: anchor.to_time(saved.rate_limited_until, now + longest),
        };
        let retry = anchor
            .to_time(saved.retry_at, now + longest)
            .filter(|&t| t > now);
        self.facts.health = HealthTracker::restored(health, now, policy);
        self.facts
            .conduct
            .restore_penalties(saved.penalties.min(MAX_SAVED_PENALTIES));
        let retry = retry?;
        Some((retry, self.wait_until(retry)))
    }
}

impl Facts {
    /// The limits held below `ours`, our starting ones.
    fn saved_limits(&self, ours: &Limits) -> SavedLimits {
        let l = &self.limits;
        let below = |theirs: usize, ours: usize| (theirs < ours).then_some(theirs as u64);
        let hint = self.result_cap.for_saving();
        SavedLimits {
            subscriptions: below(l.subscriptions, ours.subscriptions),
            filters: below(l.filters_per_req, ours.filters_per_req),
            message_bytes: below(l.message_bytes, ours.message_bytes),
            page_limit: below(l.page_limit, ours.page_limit),
            tag_values: below(l.tag_values, ours.tag_values),
            kinds: below(l.kinds, ours.kinds),
            result_cap: hint.proven.map(|c| c as u64),
            result_floor: (hint.floor > 0).then_some(hint.floor as u64),
        }
    }

    /// Learned limits, each only lowering ours and never below its floor.
    fn restore_limits(&mut self, saved: &SavedRelay) {
        let l = saved.limits;
        let size = |v: Option<u64>| v.map(|v| usize::try_from(v).unwrap_or(usize::MAX));
        let limits = &mut self.limits;
        limits.lower_to(StatedLimits {
            subscriptions: size(l.subscriptions),
            filters_per_req: size(l.filters),
            message_bytes: size(l.message_bytes),
            page_limit: size(l.page_limit),
            tag_values: size(l.tag_values),
            kinds: size(l.kinds),
            value_bytes: None,
        });
        let page = limits.page_limit;
        let clamp = |v: u64| usize::try_from(v).unwrap_or(usize::MAX).clamp(1, page);
        // What an earlier process learnt is a hint, never proof: the relay
        // may have changed its cap since.
        self.result_cap = ResultCap::from_hint(Hint {
            proven: l.result_cap.map(clamp),
            floor: l.result_floor.map_or(0, clamp),
        });
        // Only "does not" is taken: it saves a failed NEG-OPEN per job. A
        // saved "does" would stop a relay's failures from ever turning
        // negentropy off for it, so it must be shown again.
        if saved.negentropy == Some(false) {
            self.neg = NegSupport::Unsupported;
        }
    }
}

/// True for the actions that open a connection to `relay` (its connect,
/// its NIP-11 fetch).
fn connects(action: &Action, relay: RelayId) -> bool {
    match action {
        Action::Connect { relay: r, .. } | Action::FetchInfo { relay: r, .. } => *r == relay,
        _ => false,
    }
}
