//! Relay conduct: how much abuse a relay has shown, and what it costs it.
//!
//! Every relay on the internet is untrusted. One bad event is not a reason
//! to drop a relay (it may have relayed a broken client's event), but a
//! relay that keeps sending forged events, garbage JSON or frames that break
//! the websocket protocol is either broken or hostile, and each of its
//! messages costs us a parse and a signature check. So offences add
//! strikes, weighted by how unlikely an honest relay is to commit them; at
//! [`STRIKES_PER_PENALTY`] in one connection the relay is cut and
//! penalised. Penalties never reset while the process runs: each one adds
//! [`BACKOFF_STEPS_PER_PENALTY`] doublings to the relay's reconnect backoff,
//! so a relay that misbehaves again and again is tried rarer and rarer,
//! while every other relay is unaffected.

use std::time::Duration;

use log::warn;

use super::ctx::Ctx;
use super::{Action, Engine, Status};
use crate::sans_io::memory::index::RelayId;
use crate::sans_io::timing::time::Time;

/// What a relay did wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Offence {
    /// An event whose id or signature does not verify.
    InvalidEvent,
    /// A message that is not valid NIP-01 JSON.
    Malformed,
    /// An event outside the exact filter it was sent for.
    OutsideFilter,
    /// A websocket protocol violation (a fragmented message over the size
    /// cap among them; a single over-size frame is skipped, not an
    /// offence); the connection is already gone, so this one costs a
    /// penalty at once.
    Protocol,
    /// A new root or announcement past the relay's budget of new index
    /// items per minute (`Config::max_new_items_per_relay_minute`).
    ItemFlood,
}

impl Offence {
    /// Strikes this offence adds. Outside-filter events are cheap to check
    /// and can be an honest relay's loose matching, so they weigh least.
    fn weight(self) -> u32 {
        match self {
            Offence::InvalidEvent | Offence::Malformed => 10,
            Offence::OutsideFilter | Offence::ItemFlood => 1,
            Offence::Protocol => STRIKES_PER_PENALTY,
        }
    }

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Offence::InvalidEvent => "invalid_event",
            Offence::Malformed => "malformed",
            Offence::OutsideFilter => "outside_filter",
            Offence::Protocol => "protocol",
            Offence::ItemFlood => "item_flood",
        }
    }

    /// Every offence, for metrics.
    pub const ALL: [Offence; 5] = [
        Offence::InvalidEvent,
        Offence::Malformed,
        Offence::OutsideFilter,
        Offence::Protocol,
        Offence::ItemFlood,
    ];
}

/// Strikes in one connection that get a relay cut and penalised.
pub(super) const STRIKES_PER_PENALTY: u32 = 100;

/// Backoff doublings each penalty adds (×4 per penalty).
pub(super) const BACKOFF_STEPS_PER_PENALTY: u32 = 2;

/// The window of `Config::max_new_items_per_relay_minute`: new roots and
/// announcements one relay may deliver per window before each further one
/// is an offence.
///
/// Fairness per delivering relay: every new root becomes historic work
/// (Layer 3) on every relay of the repos it names, and keys are free, so
/// the per-pubkey shares of the index do not bound what one relay can
/// create with events from fresh keys. The index cannot charge the
/// relay itself: it learns from the own relay, after the round trip that
/// loses who delivered an event. So the budget is charged here, at
/// ingest, and over it the event is still forwarded to the sink (an
/// event is never dropped for its relay's conduct) but the relay earns a
/// strike; a relay that keeps flooding is cut and backed off like any
/// other offender, which bounds the rate at which one relay creates work
/// for all the others. An honest relay catching up a large history is
/// at worst slowed: only ids never seen count, so each reconnect makes
/// progress and re-reads cost nothing.
pub(super) const FRESH_WINDOW: Duration = Duration::from_secs(60);

/// One relay's record.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Conduct {
    /// Strikes in the current connection.
    strikes: u32,
    /// Penalties since the process started.
    penalties: u32,
    /// An over-size message from this relay was logged (once per process).
    oversized_logged: bool,
    /// New index items delivered in the current window. Apart from when
    /// the window opened (not a tuple): the count then shares a word with
    /// the other counters, and the record is 32 bytes, not 40.
    fresh_count: u32,
    /// When the current window of new items opened.
    fresh_since: Option<Time>,
}

impl Conduct {
    /// Records `offence`; true when it earns a penalty (the caller cuts the
    /// relay). Strikes start again from zero after a penalty.
    fn offend(&mut self, offence: Offence) -> bool {
        self.strikes = self.strikes.saturating_add(offence.weight());
        if self.strikes < STRIKES_PER_PENALTY {
            return false;
        }
        self.strikes = 0;
        self.penalties = self.penalties.saturating_add(1);
        true
    }

    /// Counts `offence` against the relay of `cx` (`Stats::offences`);
    /// true when it earns a penalty (`Stats::penalties`, logged), which
    /// the engine turns into a cut (`Engine::offended`).
    pub(super) fn charge(&mut self, cx: &mut Ctx, offence: Offence) -> bool {
        cx.stats.offences[offence as usize] += 1;
        if !self.offend(offence) {
            return false;
        }
        cx.stats.penalties += 1;
        warn!(
            "{}: penalised for misbehaving ({}; {} penalties)",
            cx.url(),
            offence.label(),
            self.penalties
        );
        true
    }

    /// A message of `bytes` over the size cap was skipped: counted every
    /// time, logged once (why it is no offence: `Engine::oversized`).
    pub(super) fn oversized(&mut self, cx: &mut Ctx, bytes: u64) {
        cx.stats.messages_oversized += 1;
        if self.first_oversized() {
            warn!(
                "{}: skipped a message of {bytes} bytes, over the size cap (logged once)",
                cx.url()
            );
        }
    }

    /// Counts one new root or announcement delivered at `now`; false when
    /// it is past the budget of the window.
    pub(super) fn fresh_item(&mut self, now: Time, budget: u32) -> bool {
        let (count, since) = (&mut self.fresh_count, &mut self.fresh_since);
        if since.is_none_or(|t| now.since(t) >= FRESH_WINDOW) {
            *count = 0;
            *since = Some(now);
        }
        *count = count.saturating_add(1);
        *count <= budget
    }

    /// A new connection starts with a clean slate of strikes, not of penalties.
    pub(super) fn on_connect(&mut self) {
        self.strikes = 0;
    }

    /// Extra backoff doublings the relay has earned.
    pub(super) fn backoff_steps(&self) -> u32 {
        self.penalties.saturating_mul(BACKOFF_STEPS_PER_PENALTY)
    }

    /// A message over the size cap was skipped: true the first time in
    /// the process, which alone is logged.
    fn first_oversized(&mut self) -> bool {
        !std::mem::replace(&mut self.oversized_logged, true)
    }

    /// Penalties so far.
    pub(super) fn penalties(&self) -> u32 {
        self.penalties
    }

    /// Penalties an earlier process recorded (`resume`), capped by the caller.
    pub(super) fn restore_penalties(&mut self, penalties: u32) {
        self.penalties = penalties;
    }
}

impl Engine {
    /// The shell skipped a message of `bytes` from `relay`, over the size
    /// cap. Not an offence: an honest relay may store an event larger than
    /// we accept, and it would be met again on every re-read of history, so
    /// penalising it would cut the relay on every daily sync. It is counted
    /// every time and logged once per relay.
    pub(super) fn oversized(&mut self, relay: RelayId, bytes: u64) {
        if relay.index() < self.relays.len() {
            let (state, mut cx) = self.at(relay);
            state.facts.conduct.oversized(&mut cx, bytes);
        }
    }

    /// Counts `offence` against `relay`; enough of them in one connection
    /// cut the relay and lengthen its backoff. The own relay is trusted.
    pub(super) fn offended(&mut self, now: Time, relay: RelayId, offence: Offence) {
        if relay == self.own || relay.index() >= self.relays.len() {
            return;
        }
        let (state, mut cx) = self.at(relay);
        if state.facts.conduct.charge(&mut cx, offence) && state.status() != Status::Disconnected {
            self.actions.push_back(Action::Disconnect { relay });
            self.fail_connection(relay, now, "cut for misbehaving");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every relay keeps a record for the process's life.
    #[test]
    fn a_record_stays_32_bytes() {
        assert!(std::mem::size_of::<Conduct>() <= 32);
    }

    #[test]
    fn a_few_bad_events_are_tolerated_a_stream_is_not() {
        let mut c = Conduct::default();
        for _ in 0..9 {
            assert!(!c.offend(Offence::InvalidEvent));
        }
        assert!(c.offend(Offence::InvalidEvent));
        assert_eq!(c.penalties(), 1);
        assert_eq!(c.backoff_steps(), 2);
    }

    #[test]
    fn outside_filter_events_weigh_least() {
        let mut c = Conduct::default();
        for _ in 0..99 {
            assert!(!c.offend(Offence::OutsideFilter));
        }
        assert!(c.offend(Offence::OutsideFilter));
    }

    #[test]
    fn new_items_past_the_window_s_budget_are_refused_until_it_turns() {
        let mut c = Conduct::default();
        let t0 = Time::from_secs(1_000);
        for _ in 0..1000 {
            assert!(c.fresh_item(t0, 1000));
        }
        assert!(!c.fresh_item(t0 + Duration::from_secs(59), 1000));
        assert!(c.fresh_item(t0 + FRESH_WINDOW, 1000));
    }

    #[test]
    fn a_protocol_violation_is_penalised_at_once() {
        let mut c = Conduct::default();
        assert!(c.offend(Offence::Protocol));
        assert!(c.offend(Offence::Protocol));
        assert_eq!(c.backoff_steps(), 4);
    }

    #[test]
    fn strikes_reset_per_connection_penalties_do_not() {
        let mut c = Conduct::default();
        for _ in 0..9 {
            c.offend(Offence::Malformed);
        }
        c.on_connect();
        for _ in 0..9 {
            assert!(!c.offend(Offence::Malformed));
        }
        assert!(c.offend(Offence::Malformed));
        c.on_connect();
        assert_eq!(c.penalties(), 1);
    }

    #[test]
    fn an_oversized_message_is_counted_each_time_never_penalised() {
        let mut config = crate::sans_io::config::Config::new("wss://own.example");
        config.bootstrap = vec!["wss://relay.example".to_owned()];
        let now = Time::from_secs(1_000);
        let mut engine = Engine::new(config, now).expect("valid config");
        let relay = engine.relay_id("wss://relay.example").expect("bootstrap");
        for _ in 0..1_000 {
            engine.oversized(relay, 2 << 20);
        }
        assert_eq!(engine.stats.messages_oversized, 1_000);
        assert_eq!(engine.stats.penalties, 0);
        assert_eq!(engine.relays[relay.index()].facts.conduct.penalties(), 0);
    }
}
