//! The three-way diff, incremental: target − pending − confirmed.
//!
//! An index update reports exactly which (relay, item) targets it added or
//! removed. Only those relays are touched: a new target becomes `Queued`
//! (the diff's "new"), a lost one disappears with whatever state it had.
//! Queued items of connected relays are then grouped into one pending batch
//! per relay, split into chunks, and handed to the request scheduler. A
//! batch is confirmed when every chunk has reached its last EOSE; a failed
//! batch sends its items back to `Queued`.

use log::{debug, info};
use nostr::prelude::Event;
use std::time::Duration;

use super::connection::Batch;
use super::ctx::Ctx;
use super::echo_wait::EchoWait;
use super::relay::{Link, RelayState};
use super::targets::ItemState;
use super::{Engine, Status, Timer};
use crate::sans_io::memory::index::{Item, RelayId, RepoId, TargetChange};
use crate::sans_io::query::subscription::WorkRef;
use crate::sans_io::timing::time::Time;
use crate::sans_io::timing::timer::TimerId;

/// `Config::echo_quiet` over this is how long an echo-only window waits
/// after its last echo once everything handed over is back
/// (`Engine::echo_settle`).
const ECHO_SETTLE_DIVISOR: u32 = 2;

/// The engine's batching state: the open window and the batch ids.
#[derive(Debug, Default)]
pub(super) struct Batching {
    /// Own-relay events collected in the open batch window.
    events: Vec<Event>,
    /// Verified announcements from other relays that drop the service,
    /// newer than the one indexed: they remove the repo's targets.
    withdrawals: Vec<Event>,
    /// The open window's timer; `None` while no window is open.
    window: Option<TimerId>,
    /// Every event in the open window is an echo of one the engine handed
    /// to the sink, and the last came at this time (`Config::echo_quiet`).
    echoes: Option<Echoes>,
    /// What the engine handed to the sink and awaits back as echoes: once
    /// all are back, an echo-only window waits half the quiet.
    pub(super) echo_wait: EchoWait,
    /// The id of the next pending batch.
    next_batch: u64,
    /// Scratch list of target changes, kept for its allocation.
    changes: Vec<TargetChange>,
}

/// An open window that holds only echoes, and its quiet check.
#[derive(Debug)]
struct Echoes {
    /// When the last echo joined the window.
    last: Time,
    /// A quiet check is armed.
    armed: bool,
}

impl Batching {
    /// A batch window is open: own-relay events wait to be acted on.
    pub(super) fn is_open(&self) -> bool {
        self.window.is_some()
    }
}

impl Engine {
    /// Adds an own-relay (or locally accepted) event to the batch window,
    /// opening the window on the first event. The window is not extended by
    /// later events, so a steady stream still produces a batch per window.
    /// An `echo` (an event the engine itself handed to the sink, back
    /// through the self-subscription or the embedding relay) is news the
    /// engine caused: while the window holds nothing else, it closes once
    /// the echoes stop for `Config::echo_quiet`, or for half that once
    /// everything the engine handed over is back (`echo_wait`).
    pub(super) fn push_to_batch(&mut self, now: Time, event: Event, echo: bool) {
        let opening = self.batching.window.is_none();
        if echo {
            self.batching.echo_wait.ended(&event.id);
        }
        self.batching.events.push(event);
        self.open_batch_window(now);
        match (&mut self.batching.echoes, echo) {
            (_, false) => self.batching.echoes = None,
            (Some(echoes), true) => echoes.last = now,
            (None, true) if opening => {
                self.batching.echoes = Some(Echoes {
                    last: now,
                    armed: false,
                })
            }
            (None, true) => {}
        }
        if self.batching.echoes.is_some() && self.batching.echo_wait.all_back() {
            // Its own check, sooner than the armed one: a stale check
            // only looks again.
            self.arm(now + self.echo_settle(), Timer::BatchQuiet);
        }
        self.arm_batch_quiet(now);
    }

    /// How long an echo-only window waits after its last echo once
    /// everything handed over is back: a fraction of `Config::echo_quiet`.
    /// Closing at once made a generation of REQs of every few roots while
    /// the own relay's outbox was full and echoes trickled back (the
    /// demo's REQs grew by half, and by 45 % after a quarter of the
    /// quiet); half the quiet collects them (11 % more than the whole).
    fn echo_settle(&self) -> Duration {
        self.config.echo_quiet / ECHO_SETTLE_DIVISOR
    }

    /// Arms the quiet check of an echo-only window, if none is armed.
    fn arm_batch_quiet(&mut self, now: Time) {
        let quiet = self.config.echo_quiet;
        if let Some(echoes) = self.batching.echoes.as_mut()
            && !echoes.armed
        {
            echoes.armed = true;
            self.arm(now + quiet, Timer::BatchQuiet);
        }
    }

    /// The quiet check of an echo-only window: closes it if no echo came
    /// for `Config::echo_quiet` (half that once everything handed over
    /// is back, `echo_settle`), else checks again when that is due.
    pub(super) fn on_batch_quiet(&mut self, now: Time) {
        let (quiet, settle) = (self.config.echo_quiet, self.echo_settle());
        let stale = self.config.batch_window;
        self.batching.echo_wait.forget_older(now, stale);
        let Some(echoes) = self.batching.echoes.as_mut() else {
            return;
        };
        echoes.armed = false;
        let wait = match self.batching.echo_wait.all_back() {
            true => settle,
            false => quiet,
        };
        let due = echoes.last + wait;
        if now >= due {
            return self.close_batch_window_early(now);
        }
        echoes.armed = true;
        self.arm(due, Timer::BatchQuiet);
    }

    /// A verified announcement from another relay that drops the service
    /// joins the window too, to withdraw its repo.
    pub(super) fn push_withdrawal(&mut self, now: Time, event: Event) {
        self.batching.withdrawals.push(event);
        self.open_batch_window(now);
    }

    fn open_batch_window(&mut self, now: Time) {
        if self.batching.window.is_none() {
            let timer = self.arm(now + self.config.batch_window, Timer::BatchWindow);
            self.batching.window = Some(timer);
        }
    }

    /// The own relay's stored events are all in (the self-subscription's
    /// EOSE): the burst the window waits for is over, so an open window
    /// closes now. At start this is the whole own relay, and waiting out
    /// the window only delayed the first sync by its length.
    pub(super) fn close_batch_window_early(&mut self, now: Time) {
        if let Some(timer) = self.batching.window {
            self.timers.cancel(timer);
            self.close_batch_window(now);
        }
    }

    /// The window closed: update the index and diff the touched relays.
    pub(super) fn close_batch_window(&mut self, now: Time) {
        self.batching.window = None;
        self.batching.echoes = None;
        let events = std::mem::take(&mut self.batching.events);
        let withdrawals = std::mem::take(&mut self.batching.withdrawals);
        let mut changes = std::mem::take(&mut self.batching.changes);
        for event in &events {
            self.index.apply(event, now, &mut changes);
        }
        for event in &withdrawals {
            self.index.withdraw(event, now, &mut changes);
        }
        for (repo, due) in self.index.take_holds() {
            self.arm(due, Timer::ReleaseHeld(repo));
        }
        debug!(
            "batch of {} events: {} target changes",
            events.len(),
            changes.len()
        );
        self.apply_changes(&changes, now);
        changes.clear();
        self.batching.changes = changes;
    }

    /// A repo's held relay change is due: apply it.
    pub(super) fn release_held(&mut self, repo: RepoId, now: Time) {
        let mut changes = std::mem::take(&mut self.batching.changes);
        self.index.release_held(repo, now, &mut changes);
        self.apply_changes(&changes, now);
        changes.clear();
        self.batching.changes = changes;
    }

    /// Applies target changes to the relay table; touched relays that are
    /// connected get their new items diffed, disconnected ones are connected.
    pub(super) fn apply_changes(&mut self, changes: &[TargetChange], now: Time) {
        self.ensure_relay_slots();
        let mut touched = Vec::new();
        for change in changes {
            if change.added {
                self.restore_relay(change.relay, now);
            }
            let restored = change.added && self.restored_confirmed(change.relay, change.item);
            let state = &mut self.relays[change.relay.index()];
            let connected = state.status() == Status::Connected;
            match change.added {
                true => state.targets.add(change.item, restored, connected),
                false => state.targets.remove(change.item),
            }
            if touched.last() != Some(&change.relay) {
                touched.push(change.relay);
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for relay in touched {
            match self.relays[relay.index()].status() {
                Status::Connected => self.dirty.push(relay),
                Status::Disconnected if self.wants_connection(relay) => self.connect(relay, now),
                _ => {}
            }
        }
    }

    /// Runs the diff and the scheduler for every relay marked dirty, then
    /// offers free negentropy room to the relays waiting for it. Offering
    /// it only when a job ended left waiting relays waiting for good once
    /// no job was left to end (a daily sync or a lost connection dropped
    /// the last ones): their batches stayed pending.
    pub(super) fn flush(&mut self, now: Time) {
        loop {
            while let Some(relay) = self.dirty.pop() {
                self.diff_relay(relay, now);
                self.schedule(relay, now);
            }
            if !self.offer_turn(now) {
                return;
            }
        }
    }

    /// Turns a connected relay's queued items into one pending batch
    /// (`RelayState::diff`), under the next batch id.
    fn diff_relay(&mut self, relay: RelayId, now: Time) {
        let batch = self.batching.next_batch;
        let (state, mut cx) = self.at(relay);
        if state.diff(&mut cx, batch, now) {
            self.batching.next_batch += 1;
        }
    }

    /// One chunk of `batch` reached its last EOSE at `now`
    /// (`RelayState::complete_chunk`).
    pub(super) fn complete_chunk(&mut self, relay: RelayId, batch: u64, now: Time) {
        let (state, mut cx) = self.at(relay);
        state.complete_chunk(&mut cx, batch, now);
    }
}

/// A relay's side of the diff: its queued items made a batch, and the
/// batch confirmed or failed as its chunks end.
impl RelayState {
    /// Turns the queued items into pending batch `batch_id`, split into
    /// chunks queued for the scheduler. Nothing while not connected or
    /// paused. True when it made the batch (it took the id).
    fn diff(&mut self, cx: &mut Ctx, batch_id: u64, now: Time) -> bool {
        let chunk_size = self.facts.limits.chunk_size(cx.config.chunk_size);
        if self.conn().is_none_or(|c| c.paused_until.is_some()) {
            return false;
        }
        let mut repos = Vec::new();
        let mut roots = Vec::new();
        let mut suspects = Vec::new();
        for item in std::mem::take(&mut self.targets.queued) {
            let facts = &mut self.facts;
            if !facts.bad_values.askable(cx, &mut facts.limits, item) {
                continue;
            }
            let Some(slot) = self.targets.items.get_mut(&item) else {
                continue;
            };
            if slot.state != ItemState::Queued {
                continue;
            }
            slot.state = ItemState::Pending(batch_id);
            match (self.facts.bad_values.suspect(&item), item) {
                (Some(size), _) => suspects.push((size, item)),
                (None, Item::Repo(_)) => repos.push(item),
                (None, Item::Root(_)) => roots.push(item),
            }
        }
        if repos.is_empty() && roots.is_empty() && suspects.is_empty() {
            return false;
        }
        // Connected: checked above, and asking `askable` changes nothing.
        let Some(conn) = self.conn_mut() else {
            return true;
        };
        let flight = conn.start_flight();
        let mut chunks = 0;
        let mut isolated: Vec<Item> = Vec::new();
        for part in [repos.as_slice(), roots.as_slice()] {
            for chunk in part.chunks(chunk_size) {
                flight.work.push_back(WorkRef {
                    batch: batch_id,
                    items: chunk.to_vec(),
                });
                chunks += 1;
            }
        }
        // Suspects of a refused value, by the chunk size each may have
        // (`bad_values`): repos and roots apart, each chunk asked alone.
        suspects.sort_unstable_by_key(|&(size, item)| (size, matches!(item, Item::Root(_)), item));
        for group in suspects.chunk_by(|a, b| {
            (a.0, matches!(a.1, Item::Root(_))) == (b.0, matches!(b.1, Item::Root(_)))
        }) {
            let size = group[0].0.clamp(1, chunk_size);
            for chunk in group.chunks(size) {
                let items: Vec<Item> = chunk.iter().map(|&(_, i)| i).collect();
                isolated.extend(&items);
                flight.work.push_back(WorkRef {
                    batch: batch_id,
                    items,
                });
                chunks += 1;
            }
        }
        debug!(
            "batch {batch_id}: {} repos, {} roots in {chunks} chunks",
            repos.len(),
            roots.len()
        );
        repos.extend(roots);
        repos.extend(isolated);
        flight.batches.insert(
            batch_id,
            Batch {
                items: repos,
                chunks_left: chunks,
                started: now,
            },
        );
        true
    }

    /// One chunk of `batch` reached its last EOSE at `now`.
    pub(super) fn complete_chunk(&mut self, cx: &mut Ctx, batch: u64, now: Time) {
        let Link::Up(conn) = &mut self.link else {
            return;
        };
        let Some(batches) = conn.flight_mut().map(|f| &mut f.batches) else {
            return;
        };
        let Some(b) = batches.get_mut(&batch) else {
            return;
        };
        b.chunks_left = b.chunks_left.saturating_sub(1);
        if b.chunks_left > 0 {
            return;
        }
        let Some(done) = batches.remove(&batch) else {
            return;
        };
        let covered = conn.live_covers_all(&done.items);
        for item in &done.items {
            if let Some(slot) = self.targets.items.get_mut(item)
                && slot.state == ItemState::Pending(batch)
            {
                slot.confirm(now);
            }
        }
        // Items read by pages, listings or ids have no live subscription
        // yet. A consolidation that ran while this batch was pending only
        // knew the pages open then, so the batch itself says so: else its
        // items waited for the next reconnect or the daily sync (found by
        // the oracle's timeliness check, world 180).
        if !covered {
            self.mark_uncovered(done.started);
        }
        self.facts.health.record_progress();
        cx.stats.batches_confirmed += 1;
        self.note_batch_confirmed();
        let items = done.items.len();
        debug!("{}: batch {batch} confirmed ({items} items)", cx.url());
    }

    /// A chunk of `batch` failed: the whole batch goes back to the diff.
    pub(super) fn fail_batch(&mut self, cx: &mut Ctx, batch: u64) {
        let Some(flight) = self.conn_mut().and_then(|c| c.flight_mut()) else {
            return;
        };
        let Some(failed) = flight.batches.remove(&batch) else {
            return;
        };
        flight.work.retain(|w| w.batch != batch);
        // A chunk built ahead may be of this batch: never keep it idle.
        flight.built_front = None;
        for item in failed.items {
            if let Some(slot) = self.targets.items.get_mut(&item)
                && slot.state == ItemState::Pending(batch)
            {
                slot.state = ItemState::Queued;
                self.targets.queued.push(item);
            }
        }
        cx.stats.batches_failed += 1;
        info!("{}: batch {batch} failed; items back to the diff", cx.url());
    }
}
