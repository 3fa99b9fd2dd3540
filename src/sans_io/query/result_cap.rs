//! How many stored events a relay returns per filter, learnt from its pages.
//!
//! Relays cap the stored events they return per filter, and not at the
//! `limit` we ask: khatru over eventstore's SQL backends at 100, others at
//! 250 or 300, strfry and LocalRelay at 500. A page shorter than our
//! `limit` is therefore no proof that history ended. What is proof:
//!
//! - a page shorter than the relay's *proven* cap (one of its pages was
//!   shown to be cut at that size: the page after it held older events);
//! - a page shorter than the relay's *floor*, the most events it returned
//!   for one filter: a relay that returned 300 caps at 300 or more, so a
//!   page of 120 held all there was.
//!
//! Anything else (a page at or above the floor, with the cap unknown) is
//! ambiguous and is checked with one more page (`until` = its oldest
//! event). If that page holds older events, the first was cut and its size
//! is the relay's cap from then on; if not, history ended there.
//!
//! Both proofs hold only for the connection that showed them. Relays
//! change their caps (a move from strfry to khatru, a config change, a
//! restart with other settings), so a relay that served 300 yesterday may
//! serve 100 today, and a page of 150 taken as complete on yesterday's
//! floor lost 150 events. What an earlier connection, an earlier daily
//! sync or an earlier process (the state file) learnt is a [`Hint`]: it
//! shapes the check (a page at the hinted cap asks a full next page at
//! once instead of a probe first) but never settles one. Each connection,
//! and each daily full sync, starts its evidence afresh ([`ResultCap::renew`]).

use nostr::prelude::{EventId, Filter, Timestamp};

/// The lowest per-filter cap relays in the wild are known to have:
/// khatru over eventstore's SQL backends, 100.
pub(crate) const LOWEST_CAP_IN_THE_WILD: usize = 100;

/// What earlier connections learnt: a starting guess, never proof.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Hint {
    /// The smallest cut shown before.
    pub proven: Option<usize>,
    /// The largest page seen before.
    pub floor: usize,
}

/// Whether a relay's `until` takes in its own second. NIP-01 says it does;
/// nostr-relay's SQL (`created_at < until`) does not. Paging asks again
/// the second a page ended on, so a page after the first shows which; so
/// does asking a stored event the relay sent again by id, up to its own
/// second ([`ResultCap::until_probe`]), a round trip sooner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum UntilBound {
    /// No follow-up page has shown it yet.
    #[default]
    Unknown,
    /// Not shown yet, and the probe is out.
    Probed,
    /// A follow-up page brought events of its `until` second again.
    Inclusive,
    /// A follow-up page reached below its `until` second without any of
    /// it: windows meeting at a second boundary would skip one second
    /// each (`subscription::windows`).
    Exclusive,
}

/// What the engine knows of one relay's per-filter result cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ResultCap {
    /// Proven on this connection: a page of this many events was cut.
    proven: Option<usize>,
    /// The most events one filter got in one page on this connection.
    floor: usize,
    /// Learnt before this connection.
    hint: Hint,
    /// The most events one REQ returned on this connection, all its
    /// filters together.
    req_floor: usize,
    /// What this connection's pages showed of `until`.
    until: UntilBound,
    /// The first regular event this connection brought
    /// ([`ResultCap::witness`]).
    witness: Option<(EventId, Timestamp)>,
}

impl ResultCap {
    /// True when a filter page of `count` events, asked with `limit`, may
    /// have been cut by the relay and needs a next page to be sure. Only
    /// this connection's evidence decides.
    pub(crate) fn may_be_cut(&self, count: usize, limit: usize) -> bool {
        if count == 0 {
            return false;
        }
        if count >= limit {
            return true;
        }
        match self.proven {
            Some(cap) => count >= cap,
            None => count >= self.floor,
        }
    }

    /// True when the hint says a page of `count` was likely cut: the check
    /// asks a full next page straight away rather than a probe.
    pub(crate) fn hinted_cut(&self, count: usize) -> bool {
        self.hint.proven.is_some_and(|cap| count >= cap)
    }

    /// True when a short page of `count` events all in one second may have
    /// been cut inside that second, so the second is asked on its own: it
    /// is as large as the smallest cap known for the relay (proven now or
    /// before), or as [`LOWEST_CAP_IN_THE_WILD`]. Smaller one-second
    /// pages are checked by the usual probe below their second, which
    /// proves a lower cap if there is one; asking each alone would cost
    /// every quick reconnect's one-event pages a REQ more.
    pub(crate) fn may_saturate(&self, count: usize) -> bool {
        let known = [self.proven, self.hint.proven].into_iter().flatten().min();
        count
            >= known
                .unwrap_or(LOWEST_CAP_IN_THE_WILD)
                .min(LOWEST_CAP_IN_THE_WILD)
    }

    /// True when a REQ that returned `total` events (all its filters
    /// together) may have been cut as a whole, and records `total`.
    ///
    /// Some relays cap per REQ, not per filter: nostr-relay runs one SQL
    /// query for all of a REQ's filters, newest first, under one `LIMIT`.
    /// Such a cut leaves the filters reaching furthest back short or
    /// empty, which the per-filter proofs above would settle as complete.
    /// A relay returned this connection at least `req_floor` events for
    /// one REQ, so a REQ with fewer was not cut by it; one with as many
    /// or more may have been.
    pub(crate) fn may_cut_req(&mut self, total: usize) -> bool {
        let cut = total > 0 && total >= self.req_floor;
        self.req_floor = self.req_floor.max(total);
        cut
    }

    /// A new connection or a daily full sync: what was shown so far
    /// becomes a hint, and proof must be shown again.
    pub(crate) fn renew(&mut self) {
        self.hint = self.for_saving();
        self.proven = None;
        self.floor = 0;
        self.req_floor = 0;
        self.until = UntilBound::Unknown;
        self.witness = None;
    }

    /// A follow-up page asked again the second its filter's last page
    /// ended on: `again` when it brought events of that second, `below`
    /// when it reached older ones. Showing none of the second while going
    /// below it is final for the connection; nothing proves it wrong.
    pub(crate) fn learn_until(&mut self, again: bool, below: bool) {
        self.until = match (self.until, again, below) {
            (UntilBound::Exclusive, _, _) => UntilBound::Exclusive,
            (_, false, true) => UntilBound::Exclusive,
            (_, true, _) => UntilBound::Inclusive,
            (until, false, false) => until,
        };
    }

    /// True once this connection showed the relay's `until` takes in its
    /// own second: only then may a range be split into windows that meet
    /// at a second boundary.
    pub(crate) fn until_inclusive(&self) -> bool {
        self.until == UntilBound::Inclusive
    }

    /// The relay sent event `id` of second `at`, a regular one (a
    /// replaceable one may be gone by the time it is asked again), on this
    /// connection: the first is the witness [`ResultCap::until_probe`]
    /// asks again.
    pub(crate) fn witness(&mut self, id: EventId, at: Timestamp) {
        if self.witness.is_none() {
            self.witness = Some((id, at));
        }
    }

    /// While nothing showed the relay's `until` yet, once per connection:
    /// a filter asking the witness again by id with `until` at its own
    /// second, sent just before a history REQ's first pages. The witness
    /// coming back shows the relay takes in the `until` second (the
    /// probe's page learns it as a follow-up does: `learn_until`), so the
    /// REQ's full pages may already split into windows; without it, the
    /// first split waited for a follow-up page, one round trip of every
    /// first sync. Its absence proves nothing (the event may be gone):
    /// only a follow-up page reaching below its second does.
    pub(crate) fn until_probe(&mut self) -> Option<Filter> {
        if self.until != UntilBound::Unknown {
            return None;
        }
        let (id, at) = self.witness?;
        self.until = UntilBound::Probed;
        Some(Filter::new().id(id).until(at).limit(1))
    }

    /// The best knowledge to carry to a later process: this connection's
    /// where it showed anything, the hint otherwise.
    pub(crate) fn for_saving(&self) -> Hint {
        Hint {
            proven: self.proven.or(self.hint.proven),
            floor: if self.floor > 0 {
                self.floor
            } else {
                self.hint.floor
            },
        }
    }

    /// A cap saved by an earlier process (the caller clamps both values):
    /// a hint only.
    pub(crate) fn from_hint(hint: Hint) -> Self {
        ResultCap {
            hint,
            ..ResultCap::default()
        }
    }

    /// A page returned `count` events for one filter: the relay returns at
    /// least that many.
    pub(crate) fn observe(&mut self, count: usize) {
        self.floor = self.floor.max(count);
    }

    /// A page of `count` events, shorter than asked, was followed by older
    /// events: the relay cuts at `count`. A cut below the hint lowers the
    /// hint at once.
    pub(crate) fn learn_cut(&mut self, count: usize) {
        if count > 0 {
            self.proven = Some(self.proven.map_or(count, |c| c.min(count)));
            if self.hint.proven.is_some_and(|h| h > count) {
                self.hint.proven = Some(count);
            }
        }
    }

    /// The most events one filter got in one page on this connection.
    pub(crate) fn floor(&self) -> usize {
        self.floor
    }

    /// The cap proven on this connection, if any.
    pub(crate) fn proven(&self) -> Option<usize> {
        self.proven
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follow_up_page_shows_whether_until_takes_in_its_second() {
        let mut cap = ResultCap::default();
        assert!(!cap.until_inclusive(), "unknown until a follow-up shows it");
        cap.learn_until(false, false);
        assert!(!cap.until_inclusive(), "an empty follow-up shows nothing");
        cap.learn_until(true, true);
        assert!(cap.until_inclusive());
        cap.renew();
        assert!(!cap.until_inclusive(), "each connection shows it again");
        cap.learn_until(false, true);
        cap.learn_until(true, true);
        assert!(
            !cap.until_inclusive(),
            "a follow-up that went below its second without it is final"
        );
    }

    #[test]
    fn the_until_probe_asks_the_first_witness_once_per_connection() {
        let mut cap = ResultCap::default();
        assert_eq!(cap.until_probe(), None, "no event came yet");
        let (first, second) = (
            EventId::from_byte_array([0; 32]),
            EventId::from_byte_array([1; 32]),
        );
        cap.witness(first, Timestamp::from_secs(50));
        cap.witness(second, Timestamp::from_secs(60));
        let probe = cap.until_probe().expect("one is due");
        assert_eq!(
            probe.ids.map(|ids| ids.into_iter().collect::<Vec<_>>()),
            Some(vec![first])
        );
        assert_eq!(probe.until, Some(Timestamp::from_secs(50)));
        assert_eq!(probe.limit, Some(1));
        assert_eq!(cap.until_probe(), None, "once per connection");
        assert!(!cap.until_inclusive(), "a probe out proves nothing");
        cap.learn_until(false, false);
        assert_eq!(cap.until_probe(), None, "nor does its absence");
        cap.learn_until(true, false);
        assert!(cap.until_inclusive(), "the witness came back");
        cap.renew();
        assert_eq!(
            cap.until_probe(),
            None,
            "a new connection needs its own witness"
        );
        cap.witness(second, Timestamp::from_secs(60));
        cap.learn_until(false, true);
        assert_eq!(cap.until_probe(), None, "a follow-up showed it first");
    }

    #[test]
    fn unknown_cap_checks_pages_at_or_above_the_floor() {
        let mut cap = ResultCap::default();
        assert!(!cap.may_be_cut(0, 500), "an empty page is the end");
        assert!(cap.may_be_cut(100, 500), "first short page is ambiguous");
        cap.observe(100);
        assert!(
            !cap.may_be_cut(99, 500),
            "below what the relay once returned"
        );
        assert!(cap.may_be_cut(100, 500), "as many as the floor: maybe cut");
        assert!(cap.may_be_cut(500, 500), "a full page always continues");
    }

    #[test]
    fn proven_cap_decides_without_extra_pages() {
        let mut cap = ResultCap::default();
        cap.observe(100);
        cap.learn_cut(100);
        assert_eq!(cap.proven(), Some(100));
        assert!(cap.may_be_cut(100, 500));
        assert!(!cap.may_be_cut(99, 500));
        cap.observe(250);
        assert!(
            !cap.may_be_cut(99, 500),
            "a later floor does not undo a proof"
        );
        cap.learn_cut(50);
        assert_eq!(cap.proven(), Some(50), "the smallest cut wins");
        cap.learn_cut(0);
        assert_eq!(cap.proven(), Some(50), "an empty page proves nothing");
    }

    #[test]
    fn evidence_of_an_earlier_connection_is_only_a_hint() {
        let mut cap = ResultCap::default();
        cap.observe(300);
        cap.learn_cut(300);
        assert!(!cap.may_be_cut(150, 500), "this connection proved 300");
        cap.renew();
        assert_eq!(cap.proven(), None);
        assert!(
            cap.may_be_cut(150, 500),
            "the relay may cap at 100 now: 150 must be checked again"
        );
        assert!(cap.hinted_cut(300), "the hint shapes the check");
        assert!(!cap.hinted_cut(150));
        assert_eq!(
            cap.for_saving(),
            Hint {
                proven: Some(300),
                floor: 300
            }
        );
        cap.observe(100);
        cap.learn_cut(100);
        assert_eq!(
            cap.for_saving().proven,
            Some(100),
            "a lower cut wins at once"
        );
        cap.renew();
        assert!(cap.hinted_cut(100), "the hint fell with it");
        assert!(!cap.hinted_cut(99));
    }

    #[test]
    fn a_saved_floor_never_settles_a_page() {
        let cap = ResultCap::from_hint(Hint {
            proven: None,
            floor: 500,
        });
        assert!(cap.may_be_cut(150, 500), "a state file is no proof");
        assert_eq!(cap.for_saving().floor, 500, "but is kept for the next one");
    }
}
