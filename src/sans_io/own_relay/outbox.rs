//! The own-relay sink's delivery state: events waiting, events in flight,
//! and what each `OK` means. Sans-IO like the engine, so "nothing is lost
//! across an own-relay restart" is a unit test.
//!
//! Events are published as `EVENT` and stay in flight until the relay
//! answers `OK`. `duplicate:` means stored. `rate-limited:` (and transient
//! `error:`/`auth-required:`) puts the event back and pauses with backoff.
//! `invalid:`, `blocked:`, `pow:`, `restricted:` are final: logged, counted,
//! not retried. A lost connection puts everything in flight back in front
//! of the queue, in order.

use std::collections::VecDeque;
use std::time::Duration;

use log::{debug, warn};
use nostr::prelude::{ClientMessage, Event, EventId};

use crate::sans_io::relay_text::relay_text;
use crate::sans_io::time::Time;

/// Counters of the own-relay sink.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OutboxStats {
    /// Accepted by the own relay (new or duplicate).
    pub stored: u64,
    /// Of those, answered `duplicate:`.
    pub duplicate: u64,
    /// Refused for good (`invalid:`, `blocked:`, ...).
    pub rejected: u64,
    /// Put back for a retry.
    pub retried: u64,
}

/// Events on their way to the own relay.
#[derive(Debug)]
pub(crate) struct Outbox {
    queue: VecDeque<Event>,
    inflight: Vec<Event>,
    capacity: usize,
    window: usize,
    paused_until: Option<Time>,
    failures: u32,
    /// Counters.
    pub stats: OutboxStats,
}

/// Longest pause after repeated transient refusals.
const MAX_PAUSE: Duration = Duration::from_secs(60);

impl Outbox {
    /// An outbox holding up to `capacity` events, with up to `window` in flight.
    pub(crate) fn new(capacity: usize, window: usize) -> Self {
        Outbox {
            queue: VecDeque::new(),
            inflight: Vec::new(),
            capacity: capacity.max(1),
            window: window.max(1),
            paused_until: None,
            failures: 0,
            stats: OutboxStats::default(),
        }
    }

    /// Takes an event. Capacity is a watermark, not a wall: the caller
    /// checks [`Outbox::is_full`] and stops reading relays while it holds,
    /// so an event already received is never dropped.
    pub(crate) fn push(&mut self, event: Event) {
        self.queue.push_back(event);
    }

    /// True when the caller should stop taking events.
    pub(crate) fn is_full(&self) -> bool {
        self.depth() >= self.capacity
    }

    /// Events waiting or in flight.
    pub(crate) fn depth(&self) -> usize {
        self.queue.len() + self.inflight.len()
    }

    /// True when nothing is waiting or in flight.
    pub(crate) fn is_empty(&self) -> bool {
        self.depth() == 0
    }

    /// When a paused outbox may send again.
    pub(crate) fn paused_until(&self) -> Option<Time> {
        self.paused_until
    }

    /// The next `EVENT` message to send on a connected own relay, if the
    /// window and any pause allow.
    pub(crate) fn next_message(&mut self, now: Time) -> Option<String> {
        if self.paused_until.is_some_and(|t| now < t) {
            return None;
        }
        self.paused_until = None;
        if self.inflight.len() >= self.window {
            return None;
        }
        let event = self.queue.pop_front()?;
        let message = ClientMessage::event(event.clone()).as_json();
        self.inflight.push(event);
        Some(message)
    }

    /// The own relay answered `OK` for `id`. Returns the event when the
    /// relay now holds it (`OK true`, or `duplicate:`), so the caller can
    /// act on what the own relay accepted: the engine's index must learn
    /// only announcements and roots the own relay took (GRASP-01). `None`
    /// for a refusal, a retry, or an `OK` for nothing in flight.
    pub(crate) fn handle_ok(
        &mut self,
        now: Time,
        id: &EventId,
        accepted: bool,
        message: &str,
    ) -> Option<Event> {
        let Some(pos) = self.inflight.iter().position(|e| e.id == *id) else {
            debug!("OK for {id} not in flight; ignored");
            return None;
        };
        let event = self.inflight.remove(pos);
        let lower = message.to_ascii_lowercase();
        let prefix = lower
            .strip_prefix("error: ")
            .unwrap_or(&lower)
            .split(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_owned();
        if accepted || prefix == "duplicate" {
            self.stats.stored += 1;
            self.stats.duplicate += u64::from(prefix == "duplicate");
            self.failures = 0;
            return Some(event);
        }
        match prefix.as_str() {
            "rate-limited" | "error" | "auth-required" | "" => {
                self.stats.retried += 1;
                // A whole window refused in one go (every event in flight
                // when the relay asked for AUTH) is one failure, not a
                // streak: only a refusal after the pause ran out doubles it.
                if self.paused_until.is_none_or(|until| now >= until) {
                    self.failures = self.failures.saturating_add(1);
                    let pause = Duration::from_secs(1u64 << self.failures.min(6)).min(MAX_PAUSE);
                    self.paused_until = Some(now + pause);
                }
                self.queue.push_front(event);
            }
            _ => {
                self.stats.rejected += 1;
                warn!("own relay refused {id}: {}", relay_text(message));
            }
        }
        None
    }

    /// The own relay accepted our AUTH: what it refused for wanting AUTH
    /// may go again now rather than when the pause runs out.
    pub(crate) fn resume(&mut self) {
        self.paused_until = None;
        self.failures = 0;
    }

    /// The connection to the own relay was lost: everything in flight goes
    /// back to the front of the queue, in order.
    pub(crate) fn handle_disconnect(&mut self) {
        for event in self.inflight.drain(..).rev() {
            self.queue.push_front(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{Keys, Kind, SecretKey, Signature, Timestamp};

    fn event(n: u8) -> Event {
        let sk = SecretKey::from_slice(&[n.max(1); 32]).unwrap();
        let pk = Keys::new(sk).public_key();
        let sig = Signature::from_slice(&[1u8; 64]).unwrap();
        Event::new(
            EventId::from_byte_array([n; 32]),
            pk,
            Timestamp::from_secs(1),
            Kind::from_u16(1),
            [],
            "",
            sig,
        )
    }

    fn sent_id(msg: &str) -> EventId {
        let v: Vec<serde_json::Value> = serde_json::from_str(msg).unwrap();
        EventId::from_hex(v[1]["id"].as_str().unwrap()).unwrap()
    }

    #[test]
    fn ok_hands_back_what_the_own_relay_now_holds() {
        let mut o = Outbox::new(10, 10);
        for n in 1..=5 {
            o.push(event(n));
        }
        let t = Time::from_secs(1);
        let sent: Vec<EventId> = std::iter::from_fn(|| o.next_message(t))
            .map(|m| sent_id(&m))
            .collect();
        let back = |o: &mut Outbox, i: usize, ok: bool, msg: &str| {
            o.handle_ok(t, &sent[i], ok, msg).map(|e| e.id)
        };
        assert_eq!(back(&mut o, 0, true, ""), Some(sent[0]), "stored");
        assert_eq!(
            back(&mut o, 1, false, "duplicate: have it"),
            Some(sent[1]),
            "held already: the relay holds it all the same"
        );
        assert_eq!(back(&mut o, 2, false, "blocked: not our repo"), None);
        assert_eq!(
            back(&mut o, 3, false, "rate-limited: slow"),
            None,
            "retried"
        );
        assert_eq!(
            back(&mut o, 0, true, ""),
            None,
            "a second OK: not in flight"
        );
        assert_eq!(
            o.handle_ok(t, &EventId::from_byte_array([9; 32]), true, ""),
            None,
            "never sent"
        );
        assert_eq!(back(&mut o, 4, true, ""), Some(sent[4]));
        assert_eq!(o.depth(), 1, "only the rate-limited event is left");
    }

    #[test]
    fn window_bounds_inflight_and_ok_frees_it() {
        let mut o = Outbox::new(10, 2);
        for n in 1..=3 {
            o.push(event(n));
        }
        let t = Time::from_secs(1);
        let a = o.next_message(t).unwrap();
        let _b = o.next_message(t).unwrap();
        assert!(o.next_message(t).is_none(), "window of 2");
        o.handle_ok(t, &sent_id(&a), true, "");
        assert!(o.next_message(t).is_some());
        assert_eq!(o.stats.stored, 1);
    }

    #[test]
    fn duplicate_counts_as_stored_and_invalid_is_dropped() {
        let mut o = Outbox::new(10, 10);
        o.push(event(1));
        o.push(event(2));
        let t = Time::from_secs(1);
        let a = o.next_message(t).unwrap();
        let b = o.next_message(t).unwrap();
        o.handle_ok(t, &sent_id(&a), false, "duplicate: have it");
        o.handle_ok(t, &sent_id(&b), false, "invalid: bad sig");
        assert_eq!(
            (o.stats.stored, o.stats.duplicate, o.stats.rejected),
            (1, 1, 1)
        );
        assert!(o.is_empty());
    }

    #[test]
    fn rate_limited_pauses_and_retries_the_same_event() {
        let mut o = Outbox::new(10, 10);
        o.push(event(1));
        let t = Time::from_secs(100);
        let a = o.next_message(t).unwrap();
        o.handle_ok(t, &sent_id(&a), false, "rate-limited: slow down");
        assert!(o.next_message(t).is_none(), "paused");
        let later = o.paused_until().unwrap();
        let again = o.next_message(later).unwrap();
        assert_eq!(sent_id(&again), sent_id(&a));
        assert_eq!(o.stats.retried, 1);
    }

    #[test]
    fn a_window_refused_at_once_is_one_failure_not_a_streak() {
        let mut o = Outbox::new(100, 100);
        for n in 1..=20 {
            o.push(event(n));
        }
        let t = Time::from_secs(100);
        let sent: Vec<String> = std::iter::from_fn(|| o.next_message(t)).collect();
        assert_eq!(sent.len(), 20);
        for m in &sent {
            o.handle_ok(t, &sent_id(m), false, "auth-required: you must auth");
        }
        assert_eq!(o.stats.retried, 20);
        assert_eq!(
            o.paused_until(),
            Some(t + Duration::from_secs(2)),
            "one refusal's pause, not 2^20 s capped at a minute"
        );
        // Refused again after the pause: now it is a streak.
        let later = o.paused_until().unwrap();
        let again = o.next_message(later).unwrap();
        o.handle_ok(later, &sent_id(&again), false, "auth-required: still no");
        assert_eq!(o.paused_until(), Some(later + Duration::from_secs(4)));
    }

    #[test]
    fn disconnect_returns_inflight_in_order_and_capacity_is_a_watermark() {
        let mut o = Outbox::new(3, 10);
        for n in 1..=3 {
            o.push(event(n));
        }
        assert!(o.is_full(), "full at capacity");
        let t = Time::from_secs(1);
        let first: Vec<EventId> = (0..2)
            .map(|_| sent_id(&o.next_message(t).unwrap()))
            .collect();
        o.handle_disconnect();
        let again: Vec<EventId> = (0..3)
            .map(|_| sent_id(&o.next_message(t).unwrap()))
            .collect();
        assert_eq!(&again[..2], &first[..], "in flight resent first, in order");
        assert_eq!(again[2], EventId::from_byte_array([3; 32]));
    }
}
