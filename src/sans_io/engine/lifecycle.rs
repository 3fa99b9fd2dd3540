//! Connection lifecycle: connect, fresh or quick (re)connect, disconnect,
//! daily fresh sync, and the periodic drop of relays nothing targets.
//!
//! One entry point handles every successful connect (GRASP-02's
//! `handle_connect_or_reconnect`): a relay never connected, or disconnected
//! for longer than the quick-reconnect window, starts from a blank confirmed
//! state and fetches full history; a quick reconnect keeps what was
//! confirmed and catches up with `since = last_connected - window`, a
//! timestamp. Pending batches are dropped at disconnect, not at reconnect.

use crate::sans_io::own_relay::client::RECONNECT as OWN_RECONNECT;
use log::{debug, info, warn};
use nostr::prelude::Timestamp;
use rand::rngs::SmallRng;
use std::time::Duration;

use super::connection::Keepalive;
use super::ctx::Ctx;
use super::failure_log::Loudness;
use super::relay::{Link, RelayState, Role};
use super::{Action, ConnTimer, Engine, Status, Timer, whole_second};
use crate::sans_io::config::Config;
use crate::sans_io::memory::index::RelayId;
use crate::sans_io::timing::health::{BackoffPolicy, HealthTracker};
use crate::sans_io::timing::time::Time;
use crate::sans_io::wire::relay_info::RelayInfo;

impl Engine {
    /// One entry point for every successful connect: fresh or quick
    /// (`RelayState::connect_up`), then the live set, the queued history
    /// and the daily schedule.
    pub(super) fn connected(&mut self, now: Time, relay: RelayId) {
        let Link::Connecting { .. } = self.relays[relay.index()].link else {
            debug!(
                "connected report for relay {} not connecting; ignored",
                relay.index()
            );
            return;
        };
        self.resume.forget(relay);
        let generation = self.next_generation();
        let quick_window = self.config.quick_reconnect;
        let (fresh, catch_up) = self.relay(relay).connect_up(generation, now, quick_window);
        let since = catch_up.map(|t| Timestamp::from_secs(t.as_secs()));
        self.log_connected(relay, fresh, now);
        self.start_reading(relay, fresh, since, now);
        let (state, mut cx) = self.at(relay);
        let keepalive = now + cx.config.keepalive;
        state.arm_watch(&mut cx, keepalive);
        self.flush(now);
    }

    /// A pong from `relay` (see `Connection::pong`).
    pub(super) fn heard_pong(&mut self, now: Time, relay: RelayId) {
        if let Some(conn) = self.conn_mut(relay) {
            conn.pong(now);
        }
    }

    /// A connection's watch: the daily full sync once due, and the
    /// keepalive. One timer per connection does both, re-armed every
    /// round, so no long-lived timer stays where a burst left it in the
    /// timer slab (see `TimerWheel::shrink_to_fit`).
    pub(super) fn on_watch(&mut self, relay: RelayId, now: Time) {
        let state = &self.relays[relay.index()];
        if state.status() != Status::Connected {
            return;
        }
        if state.facts.daily_sync_due(now) {
            self.daily_sync(relay, now);
        }
        let (state, mut cx) = self.at(relay);
        if let Some(silent) = state.keepalive(&mut cx, now) {
            // A half-open TCP connection would look connected forever.
            self.actions.push_back(Action::Disconnect { relay });
            self.fail_connection(relay, now, &format!("silent for {silent:?}"));
        }
    }

    /// A connect attempt failed for `cause`: backoff, unless the attempt
    /// was abandoned.
    pub(super) fn connect_failed(&mut self, now: Time, relay: RelayId, cause: &str) {
        if self.relays[relay.index()].status() == Status::Connecting {
            self.fail_connection(relay, now, cause);
        }
    }

    /// An upgrade refused with HTTP `status`. 429 and 503 mean "come back
    /// later": the relay gets the rate-limit cooldown rather than a quick
    /// retry that would hammer it. Anything else is an ordinary failure
    /// with backoff.
    pub(super) fn connect_refused(&mut self, now: Time, relay: RelayId, status: u16) {
        if self.relays[relay.index()].status() != Status::Connecting {
            return;
        }
        self.stats.upgrades_refused += 1;
        if status != 429 && status != 503 {
            let cause = format!("upgrade refused with HTTP {status}");
            return self.fail_connection(relay, now, &cause);
        }
        let cause = format!("HTTP {status}: busy");
        self.fail_connection_with(relay, now, &cause, |health, policy, _| {
            health.record_rate_limit(now, policy)
        });
    }

    /// A lost connection fails like a connect: backoff and retry. A report
    /// for a connection the engine already dropped is ignored.
    pub(super) fn disconnected(&mut self, now: Time, relay: RelayId, cause: &str) {
        if self.relays[relay.index()].status() != Status::Disconnected {
            self.fail_connection(relay, now, cause);
        }
    }

    /// Asks the shell to connect `relay` unless it is connected, connecting,
    /// or backing off (`RelayState::connect`).
    pub(super) fn connect(&mut self, relay: RelayId, now: Time) {
        let state = &self.relays[relay.index()];
        if state.status() != Status::Disconnected || state.retry_at().is_some_and(|t| now < t) {
            return;
        }
        let generation = self.next_generation();
        let (state, mut cx) = self.at(relay);
        state.connect(&mut cx, generation, now);
    }

    /// Marks `relay` disconnected after a failure for `cause` and
    /// schedules the retry.
    pub(super) fn fail_connection(&mut self, relay: RelayId, now: Time, cause: &str) {
        if relay == self.own {
            return self.fail_connection_with(relay, now, cause, |health, _, _| {
                health.record_failure_exact(now, &OWN_RECONNECT)
            });
        }
        let penalty = self.relays[relay.index()].facts.conduct.backoff_steps();
        self.fail_connection_with(relay, now, cause, |health, policy, rng| {
            health.record_failure(now, policy, penalty, rng)
        });
    }

    /// Marks `relay` disconnected and schedules the retry `retry_at` picks;
    /// the one line logged says why (`cause`) and when it is retried.
    fn fail_connection_with(
        &mut self,
        relay: RelayId,
        now: Time,
        cause: &str,
        retry_at: impl FnOnce(&mut HealthTracker, &BackoffPolicy, &mut SmallRng) -> Time,
    ) {
        self.stats.connect_failures += 1;
        self.drop_connection(relay, now);
        let policy = self.policy;
        let state = &mut self.relays[relay.index()];
        let retry = retry_at(&mut state.facts.health, &policy, &mut self.rng);
        state.wait_until(retry);
        let url = self.index.relay_url(relay);
        let retry_in = retry.since(now);
        let loud = match relay == self.own {
            true => Loudness::Said,
            false => self.failure_log.failed(relay, cause, now),
        };
        match loud {
            Loudness::Said => warn!("{url} failed: {cause}; retry in {retry_in:?}"),
            Loudness::Quiet => debug!("{url} failed: {cause}; retry in {retry_in:?}"),
        }
        if let Some(summary) = self.failure_log.summary(now) {
            warn!("{summary}");
        }
        self.arm(retry, Timer::Reconnect(relay));
    }

    /// The line of a connect: said, unless it ends failures whose start
    /// the log budget kept quiet (`failure_log`).
    fn log_connected(&mut self, relay: RelayId, fresh: bool, now: Time) {
        let how = if fresh {
            "fresh sync"
        } else {
            "quick reconnect"
        };
        let url = self.index.relay_url(relay);
        match self.failure_log.connected(relay, now) {
            None => info!("{url} connected ({how})"),
            Some((n, Loudness::Said)) => info!("{url} connected ({how}) after {n} failed attempts"),
            Some((n, Loudness::Quiet)) => {
                debug!("{url} connected ({how}) after {n} failed attempts")
            }
        }
    }

    /// Forgets the connection, or the attempt: what outlives it is kept
    /// (`RelayState::end_connection`), the rest is dropped with it.
    fn drop_connection(&mut self, relay: RelayId, now: Time) {
        let jobs = self.relay(relay).end_connection(now);
        self.neg_jobs_dropped(relay, jobs, now);
    }

    /// A relay's backoff is over. Only a relay still down is connected: one
    /// the diff connected once the backoff had passed, before this timer
    /// ran, is connecting or up, and setting its link down here dropped
    /// that connection without a `Disconnect` and without handing back
    /// its coverage (`RelayState::end_connection`).
    pub(super) fn on_reconnect_timer(&mut self, relay: RelayId, now: Time) {
        let state = &self.relays[relay.index()];
        if !matches!(state.link, Link::Down { .. }) || state.retry_at().is_some_and(|t| now < t) {
            return;
        }
        self.relay(relay).link = Link::Down { retry_at: None };
        if self.wants_connection(relay) {
            self.connect(relay, now);
        }
    }

    pub(super) fn on_connect_timeout(&mut self, relay: RelayId, now: Time) {
        let state = &self.relays[relay.index()];
        if state.status() == Status::Connecting {
            self.actions.push_back(Action::Disconnect { relay });
            self.fail_connection(relay, now, "connect timed out");
        }
    }

    /// True when `relay` should be connected (`RelayState::wanted`).
    pub(super) fn wants_connection(&self, relay: RelayId) -> bool {
        self.relays[relay.index()].wanted(&self.config, self.relay_url(relay))
    }

    /// Daily fresh sync: close everything, forget pending and confirmed,
    /// fetch full history again. Catches drift a live stream cannot:
    /// events stored late with an old `created_at` never match a live
    /// filter's `since`. The own relay's self-subscription is read again
    /// from the beginning too, for the announcements and roots it
    /// accepted that way.
    fn daily_sync(&mut self, relay: RelayId, now: Time) {
        info!("{}: daily fresh sync", self.relay_url(relay));
        let (state, mut cx) = self.at(relay);
        state.close_all_subscriptions(&mut cx);
        state.close_all_sessions(&mut cx);
        let jobs = self.relay(relay).restart_flight();
        self.start_reading(relay, true, None, now);
        self.neg_jobs_dropped(relay, jobs, now);
    }

    /// Starts reading a connected relay: the one path of the first
    /// connect, a stale reconnect and the daily sync (`fresh`: every
    /// target read again from the beginning, and the next daily sync
    /// scheduled), and of a quick reconnect (confirmed targets kept, live
    /// filters reaching back to `since`); `RelayState::start_reading`
    /// says what either way renews.
    fn start_reading(&mut self, relay: RelayId, fresh: bool, since: Option<Timestamp>, now: Time) {
        self.relay(relay).start_reading(fresh);
        if relay == self.own {
            self.subscribe_self(since, now);
        } else {
            let (state, mut cx) = self.at(relay);
            state.subscribe_live(&mut cx, since, !fresh, now);
            self.requeue_all(relay);
        }
        if fresh {
            let (state, mut cx) = self.at(relay);
            let delay = cx.jitter_between(cx.config.daily_min, cx.config.daily_max);
            // The next full sync is due in 23–25 h (the watch looks for it).
            state.facts.daily_due = Some(now + delay);
        }
    }

    /// Every `disconnect_check`: drop remote relays that are not bootstrap
    /// and that nothing targets any more.
    pub(super) fn check_disconnects(&mut self, now: Time) {
        for i in 0..self.relays.len() {
            let relay = RelayId(i as u32);
            let state = &self.relays[i];
            if state.unwanted() && state.status() != Status::Disconnected {
                info!("{}: nothing to sync; disconnecting", self.relay_url(relay));
                self.actions.push_back(Action::Disconnect { relay });
                self.drop_connection(relay, now);
            }
        }
        self.arm(now + self.config.disconnect_check, Timer::DisconnectCheck);
    }

    /// Puts every queued item of a connected relay up for the next diff.
    pub(super) fn requeue_all(&mut self, relay: RelayId) {
        if self.relay(relay).targets.requeue_all() {
            self.dirty.push(relay);
        }
    }
}

/// A relay's link steps that reach the engine's config and outputs.
impl RelayState {
    /// True when the relay should be connected (`url`: its normalized
    /// URL): the own relay if it is read (self-subscribing), a remote one
    /// if it is a bootstrap or targeted relay of this engine's shard.
    fn wanted(&self, config: &Config, url: &str) -> bool {
        match self.facts.role {
            Role::Own => config.self_subscribe,
            Role::Remote { bootstrap } => {
                (bootstrap || !self.targets.items.is_empty()) && config.shard.owns(url)
            }
        }
    }

    /// The relay's NIP-11 document came (`Facts::info_answered`; its
    /// limits logged if it had one). True when the relay is connected:
    /// its queued work is diffed again, as the provisional limit is
    /// lifted and more may start now.
    pub(super) fn relay_info(&mut self, cx: &mut Ctx, info: Option<RelayInfo>) -> bool {
        if self
            .facts
            .info_answered(info, cx.config.max_filters_per_req)
        {
            info!("{}: NIP-11 limits {:?}", cx.url(), self.facts.limits);
        }
        let connected = self.status() == Status::Connected;
        if connected {
            cx.mark_dirty();
        }
        connected
    }

    /// The keepalive check (`Connection::keepalive`): a silent connection
    /// is pinged, and the watch armed again; a dead one is left to the
    /// engine to drop, with how long it was silent.
    fn keepalive(&mut self, cx: &mut Ctx, now: Time) -> Option<Duration> {
        let (keepalive, pong) = (cx.config.keepalive, cx.config.pong_timeout);
        let next = match self.conn_mut()?.keepalive(now, keepalive, pong) {
            Keepalive::Dead { silent } => return Some(silent),
            Keepalive::Ping { next } => {
                cx.act(Action::Ping { relay: cx.relay });
                next
            }
            Keepalive::Heard { next } => next,
        };
        self.arm_watch(cx, next);
        None
    }

    /// Asks the shell to connect, as attempt `generation`, and to fetch
    /// the relay's NIP-11 document with it if due
    /// (`RelayState::start_connecting`); the attempt has its deadline.
    fn connect(&mut self, cx: &mut Ctx, generation: u32, now: Time) {
        let ask_info = self.start_connecting(generation, cx.config.relay_info);
        cx.stats.connects += 1;
        let (relay, url) = (cx.relay, cx.url().to_owned());
        debug!("connecting {url}");
        let fetch = ask_info.then(|| Action::FetchInfo {
            relay,
            url: url.clone(),
        });
        cx.act(Action::Connect { relay, url });
        if let Some(fetch) = fetch {
            cx.act(fetch);
        }
        let at = now + cx.config.connect_timeout;
        self.arm(cx, at, ConnTimer::ConnectTimeout);
    }

    /// Arms the connection's watch for the keepalive check at `keepalive`
    /// (to the whole second, so checks due together share a wake-up), or
    /// for the daily full sync if that is due first.
    fn arm_watch(&mut self, cx: &mut Ctx, keepalive: Time) {
        let keepalive = whole_second(keepalive);
        let at = self
            .facts
            .daily_due
            .map_or(keepalive, |due| due.min(keepalive));
        self.arm(cx, at, ConnTimer::Watch);
    }
}
