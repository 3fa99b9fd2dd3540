//! How many stored events a relay returns per filter, learnt from its pages.
//!
//! Relays cap the stored events they return per filter, and not at the
//! `limit` we ask: khatru over eventstore's SQL backends at 100, others at
//! 250 or 300, strfry and LocalRelay at 500. A page shorter than our
//! `limit` is therefore no proof that history ended. What is proof:
//!
//! - a page shorter than the relay's *proven* cap (one of its pages was
//!   shown to be cut at that size: the page after it held older events);
//! - a page shorter than the relay's *floor*, the most events it ever
//!   returned for one filter: a relay that once returned 300 caps at 300
//!   or more, so a page of 120 held all there was.
//!
//! Anything else (a page at or above the floor, with the cap unknown) is
//! ambiguous and is checked with one more page (`until` = its oldest
//! event). If that page holds older events, the first was cut and its size
//! is the relay's cap from then on; if not, history ended there. A relay
//! that caps below our limit costs at most one such extra page per chunk
//! while its cap is unknown, and none once it is proven; a relay that never
//! caps costs an extra page only when a page sets a new floor.

/// What the engine knows of one relay's per-filter result cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ResultCap {
    /// Proven: a page of this many events was cut.
    proven: Option<usize>,
    /// The most events one filter ever got in one page.
    floor: usize,
}

impl ResultCap {
    /// True when a filter page of `count` events, asked with `limit`, may
    /// have been cut by the relay and needs a next page to be sure.
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

    /// The proven cap and the floor, for saving across a restart.
    pub(crate) fn parts(&self) -> (Option<usize>, usize) {
        (self.proven, self.floor)
    }

    /// A cap saved by an earlier process; the caller clamps both values.
    pub(crate) fn from_parts(proven: Option<usize>, floor: usize) -> Self {
        ResultCap { proven, floor }
    }

    /// A page returned `count` events for one filter: the relay returns at
    /// least that many.
    pub(crate) fn observe(&mut self, count: usize) {
        self.floor = self.floor.max(count);
    }

    /// A page of `count` events, shorter than asked, was followed by older
    /// events: the relay cuts at `count`.
    pub(crate) fn learn_cut(&mut self, count: usize) {
        if count > 0 {
            self.proven = Some(self.proven.map_or(count, |c| c.min(count)));
        }
    }

    /// The proven cap, if any.
    pub(crate) fn proven(&self) -> Option<usize> {
        self.proven
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
