//! How many messages one connection to the own relay may carry, learned
//! from the relay cutting it.
//!
//! Some relays cap the messages of one connection and cut it without a
//! word when it goes over: rust-nostr's LocalRelay (as the nostr-sdk 0.45.1
//! wheel ships it) resets a connection after about 6,000 messages in a
//! minute. A first sync writes faster than that, so the link was cut every
//! few seconds: each cut cost a reconnect's backoff, and every event whose
//! `OK` the cut swallowed was sent again and answered `duplicate:` (the 17
//! duplicates of issue 33). Once a busy link has been cut, the client ends
//! the next ones itself a little before that count, with nothing in
//! flight, and opens a fresh one at once: no event is sent twice and no
//! backoff is paid. A busy link's cut is not a failure either: the next
//! link opens at once.

/// A cut after fewer messages than this says nothing about a budget: a
/// relay restart or a network fault, not a limit.
const MIN_EVIDENCE: usize = 1_000;

/// Of the smallest count a cut came after, the share a link carries
/// before it is ended: a cap counted over time (a token bucket) cuts a
/// slower link a little later, so this leaves room either way.
const MARGIN_PERCENT: usize = 80;

/// The learned budget; none until a busy link was cut.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LinkBudget {
    messages: Option<usize>,
}

impl LinkBudget {
    /// The relay cut a link that had carried `sent` messages; true when
    /// the link was busy (the cut is evidence of a budget).
    pub(crate) fn handle_cut(&mut self, sent: usize) -> bool {
        if sent < MIN_EVIDENCE {
            return false;
        }
        let budget = sent * MARGIN_PERCENT / 100;
        if self.messages.is_none_or(|m| budget < m) {
            log::info!("own relay cut a link after {sent} messages; links now end after {budget}");
            self.messages = Some(budget);
        }
        true
    }

    /// True once a link that carried `sent` messages should carry no more.
    pub(crate) fn spent(&self, sent: usize) -> bool {
        self.messages.is_some_and(|m| sent >= m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_link_cut_sets_the_budget_below_its_count() {
        let mut b = LinkBudget::default();
        assert!(!b.spent(1_000_000), "no budget before a cut");
        b.handle_cut(6_000);
        assert!(!b.spent(4_799));
        assert!(b.spent(4_800));
    }

    #[test]
    fn a_cut_of_a_quiet_link_teaches_nothing_and_the_smallest_count_wins() {
        let mut b = LinkBudget::default();
        b.handle_cut(MIN_EVIDENCE - 1);
        assert!(!b.spent(1_000_000), "a restart, not a limit");
        b.handle_cut(10_000);
        b.handle_cut(20_000);
        assert!(
            b.spent(8_000) && !b.spent(7_999),
            "a later, larger count does not raise it"
        );
        b.handle_cut(5_000);
        assert!(b.spent(4_000) && !b.spent(3_999));
    }
}
