//! The relay table: per relay, its three lifetimes.
//!
//! ```text
//!  RelayState ─┬─ facts     the process's life: role, health, conduct,
//!              │            limits, NIP-11, NIP-77 support, unaskable
//!              │            items, the daily schedule, status notes
//!              ├─ targets   while the index wants items here: each
//!              │            item queued, pending in a batch or confirmed
//!              ├─ coverage  across connections: where live coverage
//!              │            broke, and whether Layer 1 is owed
//!              └─ link      Down { retry_at }
//!                           Connecting { generation }
//!                           Up(Connection)  subscriptions, AUTH,
//!                                           keepalive, history in flight
//! ```
//!
//! A disconnect replaces `Up` by `Down` and so drops everything the
//! connection held; [`RelayState::end_connection`] is the one function
//! that hands back what outlives it. "Disconnected with subscriptions or
//! batches" cannot be represented.
//!
//! The steps that read or write one relay's state only live here, on the
//! state, and return what the engine must do: connecting and coming up
//! fresh or quick (`start_connecting`, `connect_up`, `start_reading`),
//! the NIP-11 answer (`Facts::info_answered`), whether the relay is still
//! wanted, the limit climb. Other aspects add theirs in their own files
//! (`resume`: the state file's mapping; `relay_view`: the status view).

use super::Status;
use super::bad_values::BadValues;
use super::conduct::Conduct;
use super::connection::Connection;
use super::coverage::Coverage;
use super::ctx::Ctx;
use super::limit_probe::LimitProbe;
use super::limits::{Limits, PROVISIONAL_LIMIT, StatedLimits};
use super::neg_job::NegSupport;
use super::targets::{ItemState, Targets};
use super::timers::ConnTimer;
#[cfg(any(test, feature = "testing"))]
use crate::sans_io::memory::index::Item;
use crate::sans_io::query::result_cap::ResultCap;
use crate::sans_io::timing::health::HealthTracker;
use crate::sans_io::timing::time::Time;
use crate::sans_io::timing::timer::TimerId;
use crate::sans_io::wire::relay_info::RelayInfo;
use std::time::Duration;

/// What a relay is to us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// The relay we sync into (self-subscription).
    Own,
    /// A relay we sync from; bootstrap relays are never dropped.
    Remote {
        /// Configured by the operator; kept connected without targets.
        bootstrap: bool,
    },
}

/// The relay's NIP-11 document, asked once per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum InfoFetch {
    #[default]
    NotAsked,
    /// Asked, no answer yet: the relay's limits may be far below ours.
    Asked,
    /// The fetch ended: nothing more will report on it, so the relay's
    /// id may be released.
    Answered,
}

/// What the aspects note per relay for its status view (`relay_view`);
/// each counter adds up over all relays to the engine counter it names.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Notes {
    /// `Stats::events_received` from this relay.
    pub events_received: u64,
    /// `Stats::events_ingested` from this relay.
    pub events_ingested: u64,
    /// `Stats::refusals` by this relay.
    pub refusals: u64,
    /// When its last EVENT came.
    pub last_event_at: Option<Time>,
    /// Its first history was read to the end.
    pub first_history_done: bool,
}

/// What the engine learns about a relay over the process's life.
#[derive(Debug)]
pub(super) struct Facts {
    pub role: Role,
    pub health: HealthTracker,
    /// Offences and penalties (hostile-relay defence).
    pub conduct: Conduct,
    /// NIP-77 support.
    pub neg: NegSupport,
    pub limits: Limits,
    /// The climb of `limits.subscriptions` back up after refusals lowered
    /// it: a NOTICE naming no subscription is weak evidence, and a limit
    /// left at the floor by one serialises every page on the relay.
    pub limit_probe: LimitProbe,
    /// The relay's per-filter result cap, as far as its pages showed it.
    pub result_cap: ResultCap,
    /// Where the NIP-11 fetch stands: only the link's steps here move it.
    info: InfoFetch,
    /// Items refused for one of their values (`bad_values`).
    pub bad_values: BadValues,
    /// When the next daily full sync is due; kept across connections.
    pub daily_due: Option<Time>,
    pub last_connected: Option<Time>,
    /// When the last connection (not a failed attempt) was lost.
    pub disconnected_at: Option<Time>,
    /// Counters and marks for the status view.
    pub notes: Notes,
}

/// The relay's link: a connection exists only in `Up`.
#[derive(Debug)]
pub(super) enum Link {
    /// No connection; the next attempt waits for `retry_at`, if any.
    Down { retry_at: Option<Time> },
    /// Connect asked of the shell, not yet reported.
    Connecting { generation: u32 },
    /// Connected.
    Up(Box<Connection>),
}

/// Everything the engine knows about one relay, by lifetime.
#[derive(Debug)]
pub(super) struct RelayState {
    pub facts: Facts,
    pub targets: Targets,
    pub coverage: Coverage,
    pub link: Link,
}

impl Facts {
    /// The daily full sync is due at `now`.
    pub(super) fn daily_sync_due(&self, now: Time) -> bool {
        self.daily_due.is_some_and(|due| now >= due)
    }

    /// The relay's NIP-11 document came (`None`: none could be had): the
    /// fetch is over, and the limits it states lower ours (never raise
    /// them past ours, `ours_filters` for filters per REQ: ours are what
    /// we can afford), the filters per REQ raised from their unproven
    /// start to what it shows it takes. True when there was one.
    pub(super) fn info_answered(&mut self, info: Option<RelayInfo>, ours_filters: usize) -> bool {
        self.info = InfoFetch::Answered;
        let Some(info) = info else {
            return false;
        };
        self.limits.lower_to(StatedLimits {
            subscriptions: info.max_subscriptions,
            filters_per_req: info.max_filters,
            message_bytes: info.max_message_length,
            page_limit: info.max_limit,
            value_bytes: info.max_value_bytes,
            ..StatedLimits::default()
        });
        if let Some(stated) = info.max_subscriptions {
            self.limit_probe.cap(stated);
        }
        if let Some(taken) = info.max_filters {
            self.limits.raise_filters(taken, ours_filters);
        }
        true
    }
}

impl RelayState {
    pub(super) fn new(role: Role, limits: Limits) -> Self {
        RelayState {
            facts: Facts {
                role,
                health: HealthTracker::default(),
                conduct: Conduct::default(),
                neg: NegSupport::default(),
                limits,
                limit_probe: LimitProbe::new(limits.subscriptions),
                result_cap: ResultCap::default(),
                info: InfoFetch::NotAsked,
                bad_values: BadValues::default(),
                daily_due: None,
                last_connected: None,
                disconnected_at: None,
                notes: Notes::default(),
            },
            targets: Targets::default(),
            coverage: Coverage::default(),
            link: Link::Down { retry_at: None },
        }
    }

    /// The link as the public API names it.
    pub(super) fn status(&self) -> Status {
        match self.link {
            Link::Down { .. } => Status::Disconnected,
            Link::Connecting { .. } => Status::Connecting,
            Link::Up(_) => Status::Connected,
        }
    }

    /// The open connection, if any.
    pub(super) fn conn(&self) -> Option<&Connection> {
        match &self.link {
            Link::Up(c) => Some(c),
            _ => None,
        }
    }

    /// The open connection, if any.
    pub(super) fn conn_mut(&mut self) -> Option<&mut Connection> {
        match &mut self.link {
            Link::Up(c) => Some(c),
            _ => None,
        }
    }

    /// The generation of the connection or connect attempt, if any.
    pub(super) fn generation(&self) -> Option<u32> {
        match &self.link {
            Link::Down { .. } => None,
            Link::Connecting { generation } => Some(*generation),
            Link::Up(c) => Some(c.generation),
        }
    }

    /// Arms `timer` for the current connection (or connect attempt) at
    /// `at` (`Ctx::arm_conn`); `None` when there is neither.
    pub(super) fn arm(&self, cx: &mut Ctx, at: Time, timer: ConnTimer) -> Option<TimerId> {
        Some(cx.arm_conn(self.generation()?, at, timer))
    }

    /// When the next connect attempt is allowed, while down.
    pub(super) fn retry_at(&self) -> Option<Time> {
        match self.link {
            Link::Down { retry_at } => retry_at,
            _ => None,
        }
    }

    /// The NIP-11 document was asked and is not answered yet: the relay's
    /// limits may be far below ours.
    pub(super) fn info_pending(&self) -> bool {
        self.facts.info == InfoFetch::Asked
    }

    /// True when one more REQ or job fits the relay's subscription limit
    /// (a conservative one while its NIP-11 document is on its way). Jobs
    /// count too: a relay may count them with its REQs, and a job started
    /// while every REQ slot is taken mostly finds the sink holding
    /// nothing and waits for a slot anyway (ten times the listings, at
    /// 110,000 items).
    pub(super) fn req_room(&self) -> bool {
        self.req_room_beside(0)
    }

    /// True when one more REQ fits beside `more` about to open.
    pub(super) fn req_room_beside(&self, more: usize) -> bool {
        self.conn().is_some_and(|c| {
            c.subs.len() + c.neg_jobs() + more < self.budget(self.facts.limits.subscriptions)
        })
    }

    /// True when one more negentropy job fits: the subscription limit and
    /// the relay's own limit on sessions (strfry counts them apart and
    /// refuses one over it by its own NOTICE), and no such refusal is
    /// still untied to its session: the limit it teaches is not known yet.
    pub(super) fn neg_room(&self) -> bool {
        self.req_room()
            && self.conn().is_some_and(|c| {
                c.neg_jobs() < self.budget(self.facts.limits.neg_sessions)
                    && c.flight().is_none_or(|f| f.neg_refused == 0)
            })
    }

    /// `limit`, or [`PROVISIONAL_LIMIT`] below it until the relay's NIP-11
    /// document is answered or failed: strfry with `maxSubsPerConnection`
    /// under our 10 refused the excess of the jobs started in the 33 ms
    /// before its document arrived, and the refused ones waited out their
    /// timeout.
    fn budget(&self, limit: usize) -> usize {
        if self.info_pending() {
            limit.min(PROVISIONAL_LIMIT)
        } else {
            limit
        }
    }

    /// A remote relay the operator did not configure, that nothing
    /// targets any more: it need not stay connected.
    pub(super) fn unwanted(&self) -> bool {
        matches!(self.facts.role, Role::Remote { bootstrap: false })
            && self.targets.items.is_empty()
    }

    /// Unwanted, and nothing can report on it any more (disconnected, no
    /// NIP-11 fetch pending): its id may go back to the index.
    pub(super) fn releasable(&self) -> bool {
        self.unwanted() && self.status() == Status::Disconnected && !self.info_pending()
    }

    /// A connect is asked, as attempt `generation`. True when the relay's
    /// NIP-11 document is to be fetched too: once per process, never of
    /// the own relay, and only if the config asks (`ask_info`).
    pub(super) fn start_connecting(&mut self, generation: u32, ask_info: bool) -> bool {
        self.link = Link::Connecting { generation };
        let ask =
            ask_info && self.facts.info == InfoFetch::NotAsked && self.facts.role != Role::Own;
        if ask {
            self.facts.info = InfoFetch::Asked;
        }
        ask
    }

    /// No connect before `retry` (a failure's backoff, or a restored
    /// state's): the link goes down to wait for it. True when that took
    /// back a connect attempt (only a restore can: a failure has dropped
    /// it already); its NIP-11 fetch, asked with it, is then taken back
    /// too and asked again with the next.
    pub(super) fn wait_until(&mut self, retry: Time) -> bool {
        let cancelled = self.status() == Status::Connecting;
        if cancelled {
            self.facts.info = InfoFetch::NotAsked;
        }
        self.link = Link::Down {
            retry_at: Some(retry),
        };
        cancelled
    }

    /// The connect attempt succeeded at `now`, as connection `generation`.
    /// Returns whether the connection starts fresh (never connected, away
    /// longer than `quick_window`, or its daily full sync due: a per-relay
    /// schedule that connections do not reset, so one due while the relay
    /// was away is done now) and, for a quick reconnect, when to read
    /// back from: from where live coverage ended (the disconnect, or an
    /// earlier refused live set), less the window; not from when the
    /// connection began, so a relay connected for weeks is not re-read.
    pub(super) fn connect_up(
        &mut self,
        generation: u32,
        now: Time,
        quick_window: Duration,
    ) -> (bool, Option<Time>) {
        let facts = &mut self.facts;
        let fresh = facts.daily_sync_due(now)
            || match (facts.last_connected, facts.disconnected_at) {
                (Some(_), Some(at)) => now.since(at) > quick_window,
                _ => true,
            };
        let catch_up = self
            .coverage
            .take_gap()
            .filter(|_| !fresh)
            .map(|t| t.saturating_sub(quick_window));
        facts.conduct.on_connect();
        facts.last_connected = Some(now);
        facts.disconnected_at = None;
        self.link = Link::Up(Box::new(Connection::new(generation, now)));
        (fresh, catch_up)
    }

    /// The connection starts reading: the relay's cap is proven again (it
    /// may have changed while we were away, and a full sync catches what
    /// a cap lowered since the last one cut). A `fresh` read starts every
    /// target over from the beginning, so nothing is owed either.
    pub(super) fn start_reading(&mut self, fresh: bool) {
        self.facts.result_cap.renew();
        if fresh {
            self.targets.requeue_where(|s| s == ItemState::Confirmed);
            self.coverage.clear();
        }
    }

    /// An EOSE, its page still open: a subscription limit a refusal
    /// lowered climbs one if every slot is in use and it held quietly
    /// long enough (`limit_probe`). Returns the limit it climbed from, if
    /// it did. The next schedule uses it.
    pub(super) fn climb_limit(&mut self, cx: &Ctx, now: Time) {
        let in_use = self.conn().map_or(0, |c| c.subs.len() + c.neg_jobs());
        let facts = &mut self.facts;
        let before = facts.limits.subscriptions;
        facts.limits.subscriptions = facts.limit_probe.climb(before, in_use, now);
        if facts.limits.subscriptions > before {
            let url = cx.url();
            log::info!(
                "{url}: subscription limit {before} held; trying {}",
                before + 1
            );
        }
    }

    /// Items synced without a live subscription of their own (negentropy
    /// fetches by id) need one from the next consolidation, reaching back
    /// to `since`. A wide live filter already covers them.
    pub(super) fn mark_uncovered(&mut self, since: Time) {
        use super::connection::LiveMode;
        if self.conn().is_some_and(|c| c.live_mode == LiveMode::PerId) {
            self.coverage.gap_from(since);
        }
    }

    /// Where live coverage ends if the connection is lost at `now`, and
    /// whether Layer 1 would then be owed; `None` when not connected.
    pub(super) fn coverage_end(&self, now: Time) -> Option<(Time, bool)> {
        let (lost, layer1) = self.conn()?.coverage_end(now);
        let gap = self.coverage.gap().map_or(lost, |t| t.min(lost));
        Some((gap, layer1 || self.coverage.layer1_unread()))
    }

    /// Starts the connection's history over (a daily sync): what was in
    /// flight is dropped and its pending items go back to queued. Returns
    /// the negentropy jobs it dropped.
    pub(super) fn restart_flight(&mut self) -> usize {
        let Some(conn) = self.conn_mut() else {
            return 0;
        };
        let flight = conn.take_flight();
        self.targets
            .requeue_where(|s| matches!(s, ItemState::Pending(_)));
        flight.map_or(0, |f| f.neg_jobs.len())
    }

    /// True while job `id` runs on its connection.
    pub(super) fn has_neg_job(&self, id: u64) -> bool {
        let flight = self.conn().and_then(|c| c.flight());
        flight.is_some_and(|f| f.neg_jobs.contains(id))
    }

    /// Drops the connection (or the attempt) and hands back what outlives
    /// it: the coverage watermark moves back to where the live set's
    /// coverage ended, pending items go back to queued, the loss is dated.
    /// Returns the negentropy jobs it dropped (for
    /// `Engine::neg_jobs_dropped`).
    pub(super) fn end_connection(&mut self, now: Time) -> usize {
        let old = std::mem::replace(&mut self.link, Link::Down { retry_at: None });
        let Link::Up(conn) = old else {
            return 0;
        };
        self.facts.disconnected_at = Some(now);
        let (lost, layer1) = conn.coverage_end(now);
        self.coverage.gap_from(lost);
        self.coverage.owe_layer1(layer1);
        self.targets
            .requeue_where(|s| matches!(s, ItemState::Pending(_)));
        self.targets.queued.clear();
        conn.neg_jobs()
    }
}

/// Checks for tests and fuzzing.
#[cfg(any(test, feature = "testing"))]
impl RelayState {
    /// The relay's targets against `want`, a full recompute of them from
    /// the index (item and how many repos make it a target), and every
    /// batch's bookkeeping; errors name the relay as `url`.
    pub(super) fn check(
        &self,
        want: Option<&std::collections::HashMap<Item, u32>>,
        url: &str,
    ) -> Result<(), String> {
        let items = &self.targets.items;
        let want_len = want.map_or(0, |t| t.len());
        if items.len() != want_len {
            return Err(format!("{url}: {} items, targets {want_len}", items.len()));
        }
        let batches = self.conn().and_then(|c| c.flight()).map(|f| &f.batches);
        for (item, slot) in items {
            let refs = want.and_then(|t| t.get(item)).copied().unwrap_or(0);
            if slot.refs != refs {
                return Err(format!("{url}: {item:?} refs {} want {refs}", slot.refs));
            }
            if let ItemState::Pending(b) = slot.state {
                let batch = batches
                    .and_then(|batches| batches.get(&b))
                    .ok_or(format!("{item:?} pending in missing batch {b}"))?;
                if !batch.items.contains(item) {
                    return Err(format!(
                        "{item:?} pending in batch {b} that does not list it"
                    ));
                }
            }
        }
        let Some(conn) = self.conn() else {
            return Ok(());
        };
        let chains = conn.open_chains();
        for (b, batch) in conn.flight().into_iter().flat_map(|f| &f.batches) {
            let open = chains.get(b).copied().unwrap_or(0);
            if open != batch.chunks_left {
                return Err(format!(
                    "{url}: batch {b} waits for {} chains, {open} are working for it",
                    batch.chunks_left
                ));
            }
        }
        Ok(())
    }
}
