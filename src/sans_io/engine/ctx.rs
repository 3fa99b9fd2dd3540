//! What a step of one relay's state reaches of the engine.
//!
//! A step that changes one relay (a method of `RelayState`, `Connection`,
//! `Flight`) still reads the engine's config and index and hands the
//! engine what it must do: messages to send, timers to arm, counters,
//! log lines within the relay's budget. [`Ctx`] lends it those, borrowed
//! beside the relay's state (`Engine::at`), so the step need not be the
//! engine's to reach them, and cannot reach another relay.

use std::collections::VecDeque;
use std::time::Duration;

use rand::Rng;
use rand::rngs::SmallRng;

use super::timers::{ConnTimer, Timer, whole_second};
use super::{Action, Stats};
use crate::sans_io::config::Config;
use crate::sans_io::memory::index::{RelayId, RepoIndex};
use crate::sans_io::timing::health::BackoffPolicy;
use crate::sans_io::timing::time::Time;
use crate::sans_io::timing::timer::{TimerId, TimerWheel};
use crate::sans_io::wire::relay_text::LogBudget;

/// The engine-wide things a step of relay `relay` reads and feeds.
pub(super) struct Ctx<'a> {
    /// The relay the step is of.
    pub relay: RelayId,
    pub config: &'a Config,
    pub policy: &'a BackoffPolicy,
    pub index: &'a RepoIndex,
    pub stats: &'a mut Stats,
    pub rng: &'a mut SmallRng,
    pub(super) actions: &'a mut VecDeque<Action>,
    pub(super) timers: &'a mut TimerWheel<Timer>,
    pub(super) log_budget: &'a mut LogBudget,
    pub(super) next_sub: &'a mut u64,
    pub(super) dirty: &'a mut Vec<RelayId>,
}

impl Ctx<'_> {
    /// The relay's normalized URL, for log lines.
    pub(super) fn url(&self) -> &str {
        self.index.relay_url(self.relay)
    }

    /// Sends `message` on the relay's websocket.
    pub(super) fn send(&mut self, message: String) {
        let relay = self.relay;
        self.actions.push_back(Action::Send { relay, message });
    }

    /// Asks the shell to do `action`.
    pub(super) fn act(&mut self, action: Action) {
        self.actions.push_back(action);
    }

    /// A uniformly random duration in `[min, max]`.
    pub(super) fn jitter_between(&mut self, min: Duration, max: Duration) -> Duration {
        let (lo, hi) = (
            min.as_millis() as u64,
            max.as_millis().max(min.as_millis()) as u64,
        );
        Duration::from_millis(self.rng.gen_range(lo..=hi))
    }

    /// Arms `timer` of the relay's connection (or connect attempt)
    /// `generation` at `at`, rounded up to the whole second if it only
    /// catches a lack of progress ([`ConnTimer::rounded`]).
    pub(super) fn arm_conn(&mut self, generation: u32, at: Time, timer: ConnTimer) -> TimerId {
        let at = if timer.rounded() {
            whole_second(at)
        } else {
            at
        };
        let timer = Timer::Conn(self.relay, generation, timer);
        self.timers.insert(at.as_millis(), timer)
    }

    /// Takes back a timer armed before.
    pub(super) fn cancel(&mut self, timer: TimerId) {
        self.timers.cancel(timer);
    }

    /// The id of the next subscription or negentropy session.
    pub(super) fn next_sub_id(&mut self) -> u64 {
        let id = *self.next_sub;
        *self.next_sub += 1;
        id
    }

    /// The relay has queued items for the diff (`Engine::flush`).
    pub(super) fn mark_dirty(&mut self) {
        self.dirty.push(self.relay);
    }

    /// Whether the relay may log one more line of its text at `now`, and
    /// how many it had dropped before (`LogBudget::admit`).
    pub(super) fn admit_log(&mut self, now: Time) -> Option<u64> {
        self.log_budget.admit(self.relay.index(), now)
    }
}
