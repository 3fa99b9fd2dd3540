//! The connections a turn of the loop reads: those the poll found ready,
//! then those whose read budget ran out last turn with data maybe
//! waiting, each once.
//!
//! A relay that floods is read one budget a turn, after every other
//! ready socket had its turn, so the own relay's `OK`s are read, and its
//! next events sent, between its reads. The queue was a list: a relay the
//! poll reported ready again while it waited in it was added once more
//! each time, and read that many times a turn. In a first sync it grew to
//! ten reads of 9-35 ms each per turn, the own relay's answers waited the
//! whole turn, and it stored 4,400 events a second where it takes 13,000
//! (issue 46).

use std::collections::BTreeSet;

use mio::Token;

/// Connections to read again on the next turn.
#[derive(Debug, Default)]
pub(super) struct ReadyAgain {
    queued: BTreeSet<Token>,
}

impl ReadyAgain {
    /// `token`'s read stopped at its budget: read it again next turn.
    pub(super) fn insert(&mut self, token: Token) {
        self.queued.insert(token);
    }

    /// True when no read waits for the next turn (the poll may sleep).
    pub(super) fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    /// This turn's reads, in order: the poll's `ready` tokens (epoll
    /// reports each once) that are not queued, then the queued ones; each
    /// once. What is inserted while the turn runs is read on the next one.
    pub(super) fn take_turn(&mut self, ready: impl Iterator<Item = Token>) -> Vec<Token> {
        let queued = std::mem::take(&mut self.queued);
        let mut turn: Vec<Token> = ready.filter(|t| !queued.contains(t)).collect();
        turn.extend(queued);
        turn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_ready_again_and_queued_is_read_once_a_turn() {
        let (flood, own, other) = (Token(7), Token(3), Token(9));
        let mut again = ReadyAgain::default();
        again.insert(flood);
        again.insert(flood);
        let turn = again.take_turn([flood, own].into_iter());
        assert_eq!(turn, [own, flood], "the others first, the queued once");
        assert!(again.is_empty());
        again.insert(flood);
        again.insert(other);
        assert_eq!(again.take_turn([flood].into_iter()), [flood, other]);
        assert_eq!(again.take_turn([own].into_iter()), [own]);
    }
}
