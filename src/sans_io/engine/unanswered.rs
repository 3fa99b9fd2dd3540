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

use super::ConnTimer;
use super::ctx::Ctx;
use super::relay::RelayState;
use crate::sans_io::timing::time::Time;

/// A relay's silent subscriptions: suspected, and asked again.
impl RelayState {
    /// Makes every silent subscription opened before `before` (all:
    /// `u64::MAX`) a suspect, to be asked again if it stays silent past
    /// the grace (`RelayState::unanswered`). Ids grow with every REQ
    /// sent, so a smaller id was sent earlier.
    pub(super) fn suspect_silent(&mut self, cx: &mut Ctx, before: u64, now: Time) {
        let Some(conn) = self.conn_mut() else {
            return;
        };
        let (grace, newly) = conn.suspect_silent(before);
        for id in newly {
            self.arm(cx, now + grace, ConnTimer::Unanswered(id));
        }
    }

    /// A suspect heard nothing in its grace: its REQ was refused or
    /// dropped. Its work goes back to be asked again; the limit is not
    /// lowered (a refusal's NOTICE already lowered it).
    pub(super) fn unanswered(&mut self, cx: &mut Ctx, id: u64, now: Time) {
        let Some(conn) = self.conn_mut() else {
            return;
        };
        if conn.subs.get(id).is_none_or(|s| s.heard) {
            return;
        }
        info!(
            "{}: subscription {id:x} unanswered while later ones were answered or refused; asking again",
            cx.url()
        );
        conn.silence.count(now);
        cx.stats.unanswered += 1;
        if let Some(sub) = self.close_subscription(cx, id) {
            self.give_back(cx, &sub, now);
            cx.mark_dirty();
        }
    }
}
