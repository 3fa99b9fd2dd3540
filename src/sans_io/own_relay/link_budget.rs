//! How many messages one connection to the own relay may carry, learned
//! from the relay cutting it.
//!
//! Some relays cap the messages of one connection and cut it without a
//! word when it goes over: rust-nostr's LocalRelay (as the nostr-sdk 0.45.1
//! wheel ships it) resets a connection after about 6,000 messages in a
//! minute. A first sync writes faster than that, so the link was cut every
//! few seconds: each cut cost a reconnect's backoff, and every event whose
//! `OK` the cut swallowed was sent again and answered `duplicate:` (the 17
//! duplicates of issue 33). The client ends its links itself a little
//! before that count, with nothing in flight, and opens a fresh one at
//! once: no event is sent twice and no backoff is paid. A busy link's cut
//! is not a failure either: the next link opens at once, and ends a little
//! before the count that cut came after.
//!
//! Before any cut, links end after [`FIRST_BUDGET`] messages. Waiting to
//! learn the count from a cut cost a stall: LocalRelay stops answering a
//! connection past its count and resets it only seconds later, while the
//! outbox stays full (3-4 s of a GRASP-shaped first sync storing
//! nothing, issue 46). A fresh link costs a local handshake, so ending
//! links that would have carried more costs one per thousands of events.

/// A cut after fewer messages than this says nothing about a budget: a
/// relay restart or a network fault, not a limit.
const MIN_EVIDENCE: usize = 1_000;

/// Of the smallest count a cut came after, the share a link carries
/// before it is ended: a cap counted over time (a token bucket) cuts a
/// slower link a little later, so this leaves room either way.
const MARGIN_PERCENT: usize = 80;

/// Messages a link carries before any cut taught a budget: the share
/// [`MARGIN_PERCENT`] of LocalRelay's 6,000, the relay builder that
/// ngit-grasp and the other GRASP relays on rust-nostr run.
const FIRST_BUDGET: usize = 6_000 * MARGIN_PERCENT / 100;

/// Messages a link carries at most: [`FIRST_BUDGET`] until a busy link's
/// cut teaches less.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinkBudget {
    messages: usize,
}

impl Default for LinkBudget {
    fn default() -> Self {
        LinkBudget {
            messages: FIRST_BUDGET,
        }
    }
}

impl LinkBudget {
    /// The relay cut a link that had carried `sent` messages; true when
    /// the link was busy (the cut is evidence of a budget).
    pub(crate) fn handle_cut(&mut self, sent: usize) -> bool {
        if sent < MIN_EVIDENCE {
            return false;
        }
        let budget = sent * MARGIN_PERCENT / 100;
        if budget < self.messages {
            log::info!("own relay cut a link after {sent} messages; links now end after {budget}");
            self.messages = budget;
        }
        true
    }

    /// True once a link that carried `sent` messages should carry no more.
    pub(crate) fn spent(&self, sent: usize) -> bool {
        sent >= self.messages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_link_cut_sets_the_budget_below_its_count() {
        let mut b = LinkBudget::default();
        assert!(
            !b.spent(FIRST_BUDGET - 1) && b.spent(FIRST_BUDGET),
            "before a cut, LocalRelay's count less the margin"
        );
        b.handle_cut(3_000);
        assert!(!b.spent(2_399));
        assert!(b.spent(2_400));
    }

    #[test]
    fn a_cut_of_a_quiet_link_teaches_nothing_and_the_smallest_count_wins() {
        let mut b = LinkBudget::default();
        b.handle_cut(MIN_EVIDENCE - 1);
        assert!(!b.spent(FIRST_BUDGET - 1), "a restart, not a limit");
        b.handle_cut(10_000);
        assert!(
            !b.spent(FIRST_BUDGET - 1),
            "a cut past the first budget does not raise it"
        );
        b.handle_cut(4_000);
        b.handle_cut(5_000);
        assert!(
            b.spent(3_200) && !b.spent(3_199),
            "a later, larger count does not raise it"
        );
        b.handle_cut(2_000);
        assert!(b.spent(1_600) && !b.spent(1_599));
    }
}
