//! Subscriptions a relay leaves silent: refused by a NOTICE that names
//! none, or dropped without a word.
//!
//! A REQ normally hears a stored event or EOSE within milliseconds. Two
//! ways it hears nothing, ever, with the relay otherwise answering:
//! - nostr-rs-relay refuses a REQ over its limit with a bare `NOTICE` as
//!   it reads it, but answers accepted ones from worker threads, later;
//!   the NOTICE is blamed on the newest silent REQ, which may be one the
//!   relay accepted after the refused one.
//! - nostr-rs-relay drops a query it aborts while a WAL checkpoint runs
//!   (and one that waited over five seconds for a reader thread): no
//!   EVENT, no EOSE, no CLOSED, no NOTICE, and the subscription stays
//!   open on its side. CI caught it after a burst of writes: one page of
//!   five roots silent, the first sync stalled at 445 of 450 events until
//!   the EOSE deadline, two minutes on.
//!
//! Either way a silent subscription becomes a suspect, and one that still
//! hears nothing after a grace is closed and its work asked again
//! (nothing is lost; a REQ is asked twice at worst). A suspect is every
//! silent one when a refusing NOTICE lands, and every silent one sent
//! before a REQ that reached its EOSE: the relay has read it, and answered
//! a later one. The grace (10 s, doubling per round on a connection) is
//! `timing::silence`'s, which the own relay's listings keep too.

use log::info;

use super::{ConnTimer, Engine};
use crate::sans_io::memory::index::RelayId;
use crate::sans_io::timing::time::Time;

impl Engine {
    /// Makes every silent subscription of `relay` opened before `before`
    /// (all: `u64::MAX`) a suspect, to be asked again if it stays silent
    /// past the grace ([`Self::on_unanswered`]). Ids grow with every REQ
    /// sent, so a smaller id was sent earlier.
    pub(super) fn suspect_silent(&mut self, relay: RelayId, before: u64, now: Time) {
        let Some(conn) = self.conn_mut(relay) else {
            return;
        };
        let (grace, newly) = conn.suspect_silent(before);
        for id in newly {
            self.arm_conn(now + grace, relay, ConnTimer::Unanswered(id));
        }
    }

    /// Subscription `id` reached its EOSE: the silent ones sent before it
    /// are suspects. Not on the own relay: its one subscription is
    /// re-opened by its own path, not by giving its work back.
    pub(super) fn suspect_skipped(&mut self, relay: RelayId, id: u64, now: Time) {
        if relay != self.own {
            self.suspect_silent(relay, id, now);
        }
    }

    /// A suspect heard nothing in its grace: its REQ was refused or
    /// dropped. Its work goes back to be asked again; the limit is not
    /// lowered (a refusal's NOTICE already lowered it).
    pub(super) fn on_unanswered(&mut self, relay: RelayId, id: u64, now: Time) {
        let sub = self.conn(relay).and_then(|c| c.subs.get(id));
        if sub.is_none_or(|s| s.heard) {
            return;
        }
        info!(
            "{}: subscription {id:x} unanswered while later ones were answered or refused; asking again",
            self.relay_url(relay)
        );
        if let Some(conn) = self.conn_mut(relay) {
            conn.silence.count(now);
        }
        self.stats.unanswered += 1;
        if let Some(sub) = self.close_subscription(relay, id) {
            self.give_back(relay, &sub, now);
            self.dirty.push(relay);
        }
    }
}
