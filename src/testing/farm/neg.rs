//! NIP-77 negentropy, relay side, for the relay farm.
//!
//! The engine reconciles historic filters with negentropy where a relay
//! speaks it; the demo's relays must, or the demo never shows it. This is
//! the responder rust-nostr's relays run (the `negentropy` crate, frames of
//! at most 60,000 bytes), kept per connection: `NEG-OPEN` snapshots the
//! `(created_at, id)` of every stored event the filter matches and answers
//! the initial message, each `NEG-MSG` gets the next frame, `NEG-CLOSE`
//! forgets the session. Everything a client can get wrong (bad hex, a frame
//! negentropy refuses, an unknown session, too many sessions) is a
//! `NEG-ERR`, never a panic: the farm thread serves every relay.
//!
//! The session limit and frame size are the connection's (strfry allows
//! other numbers than rust-nostr); so is the wording of failures, which
//! [`NegSessions::start`] and [`NegSessions::reconcile`] return typed.
//!
//! Pure state and messages, no IO: the farm thread feeds it and queues what
//! it returns.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::sans_io::wire::hex::{decode, encode};
use negentropy::{Id, Negentropy, NegentropyStorageVector};
use nostr::prelude::{EventId, RelayMessage, SubscriptionId, Timestamp};

/// Largest frame the responder sends, in bytes before hex, as rust-nostr's
/// relays (`Negentropy::owned(storage, 60_000)`).
pub(super) const FRAME_LIMIT: u64 = 60_000;

/// Most reconciliations open at once on one connection. Each holds a copy
/// of its filter's `(created_at, id)` set (40 bytes an event); a client
/// opening sessions without end is refused rather than fed memory.
pub(super) const MAX_SESSIONS: usize = 64;

/// The open reconciliations of one connection, by subscription id.
pub(super) struct NegSessions {
    sessions: HashMap<SubscriptionId, Negentropy<'static, NegentropyStorageVector>>,
    /// Most sessions open at once.
    max_sessions: usize,
    /// Largest frame sent, in bytes before hex.
    frame_limit: u64,
}

impl Default for NegSessions {
    /// rust-nostr's relays: [`MAX_SESSIONS`], [`FRAME_LIMIT`].
    fn default() -> NegSessions {
        NegSessions::new(MAX_SESSIONS, FRAME_LIMIT)
    }
}

/// Why a session could not start or go on. How a relay words it is its
/// own business: [`NegSessions::open`] and [`NegSessions::message`] word it
/// as rust-nostr's relays do, the strfry relay its way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum NegFailure {
    /// As many sessions are open as allowed.
    TooMany,
    /// No open session has that id.
    Unknown,
    /// The set could not be built (negentropy's error).
    Build(String),
    /// negentropy refused the frame (its error); the session is gone.
    Refused(String),
}

impl NegSessions {
    /// No sessions; at most `max_sessions` at once, frames of at most
    /// `frame_limit` bytes.
    pub(super) fn new(max_sessions: usize, frame_limit: u64) -> NegSessions {
        NegSessions {
            sessions: HashMap::new(),
            max_sessions,
            frame_limit,
        }
    }

    /// `NEG-OPEN`: a session over `items` (the relay's matches for the
    /// filter), answering `initial` (hex). An open session with the same id
    /// is replaced, as NIP-77 says. Returns `NEG-MSG` or `NEG-ERR`.
    pub(super) fn open(
        &mut self,
        sub: SubscriptionId,
        items: impl IntoIterator<Item = (Timestamp, EventId)>,
        initial: &str,
    ) -> RelayMessage<'static> {
        let Some(frame) = decode(initial) else {
            self.sessions.remove(&sub);
            return neg_err(sub, "invalid: not hex");
        };
        match self.start(sub.clone(), items, &frame) {
            Ok(reply) => neg_msg(sub, &reply),
            Err(failure) => neg_err(sub, &rust_nostr_reason(&failure)),
        }
    }

    /// `NEG-MSG`: the next frame of an open session. An unknown session,
    /// bad hex or a frame negentropy refuses is a `NEG-ERR` (and ends the
    /// session).
    pub(super) fn message(&mut self, sub: SubscriptionId, hex: &str) -> RelayMessage<'static> {
        if !self.sessions.contains_key(&sub) {
            return neg_err(sub, &rust_nostr_reason(&NegFailure::Unknown));
        }
        let Some(frame) = decode(hex) else {
            self.sessions.remove(&sub);
            return neg_err(sub, "invalid: not hex");
        };
        match self.reconcile(&sub, &frame) {
            Ok(reply) => neg_msg(sub, &reply),
            Err(failure) => neg_err(sub, &rust_nostr_reason(&failure)),
        }
    }

    /// True if a session `sub` could open now: there is room, or it
    /// replaces an open one.
    pub(super) fn has_room(&self, sub: &SubscriptionId) -> bool {
        self.sessions.contains_key(sub) || self.sessions.len() < self.max_sessions
    }

    /// Starts a session over `items` (replacing one with the same id) and
    /// answers the first `frame`: the reply frame, or why not (no session is
    /// left open then).
    pub(super) fn start(
        &mut self,
        sub: SubscriptionId,
        items: impl IntoIterator<Item = (Timestamp, EventId)>,
        frame: &[u8],
    ) -> Result<Vec<u8>, NegFailure> {
        self.sessions.remove(&sub);
        if !self.has_room(&sub) {
            return Err(NegFailure::TooMany);
        }
        let mut storage = NegentropyStorageVector::new();
        for (created_at, id) in items {
            if storage
                .insert(created_at.as_secs(), Id::from_byte_array(id.to_bytes()))
                .is_err()
            {
                // Only a sealed storage refuses an insert; it is sealed below.
                return Err(NegFailure::Build("could not build the set".to_owned()));
            }
        }
        let negentropy = storage
            .seal()
            .and_then(|()| Negentropy::owned(storage, self.frame_limit))
            .map_err(|e| NegFailure::Build(e.to_string()))?;
        self.sessions.insert(sub.clone(), negentropy);
        self.reconcile(&sub, frame)
    }

    /// The next frame of open session `sub`, or why not (a refused frame
    /// ends the session).
    pub(super) fn reconcile(
        &mut self,
        sub: &SubscriptionId,
        frame: &[u8],
    ) -> Result<Vec<u8>, NegFailure> {
        let negentropy = self.sessions.get_mut(sub).ok_or(NegFailure::Unknown)?;
        negentropy.reconcile(frame).map_err(|e| {
            self.sessions.remove(sub);
            NegFailure::Refused(e.to_string())
        })
    }

    /// `NEG-CLOSE`: forgets the session (unknown ones are ignored).
    pub(super) fn close(&mut self, sub: &SubscriptionId) {
        self.sessions.remove(sub);
    }

    /// Sessions open now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.sessions.len()
    }
}

/// A failure as rust-nostr's relays word it in a `NEG-ERR`.
fn rust_nostr_reason(failure: &NegFailure) -> String {
    match failure {
        NegFailure::TooMany => "blocked: too many negentropy sessions".to_owned(),
        NegFailure::Unknown => "closed: no such negentropy session".to_owned(),
        NegFailure::Build(e) => format!("error: {e}"),
        NegFailure::Refused(e) => format!("invalid: {e}"),
    }
}

/// `["NEG-MSG", sub, hex(frame)]`.
pub(super) fn neg_msg(sub: SubscriptionId, frame: &[u8]) -> RelayMessage<'static> {
    RelayMessage::NegMsg {
        subscription_id: Cow::Owned(sub),
        message: Cow::Owned(encode(frame)),
    }
}

/// `["NEG-ERR", sub, reason]`.
pub(super) fn neg_err(sub: SubscriptionId, reason: &str) -> RelayMessage<'static> {
    RelayMessage::NegErr {
        subscription_id: Cow::Owned(sub),
        message: Cow::Owned(reason.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_a_neg_err_that_ends_the_session() {
        let mut s = NegSessions::default();
        let sub = SubscriptionId::new("n");
        for bad in ["zz", "6", "61zz"] {
            let reply = s.open(sub.clone(), [], bad);
            assert!(
                matches!(reply, RelayMessage::NegErr { .. }),
                "{bad}: {reply:?}"
            );
            assert_eq!(s.len(), 0, "{bad}");
        }
        let reply = s.message(sub, "61");
        assert!(matches!(reply, RelayMessage::NegErr { .. }), "{reply:?}");
    }

    #[test]
    fn sessions_are_capped_per_connection() {
        let mut s = NegSessions::default();
        let mut initiator = Negentropy::owned(sealed(), 0).unwrap();
        let initial = encode(&initiator.initiate().unwrap());
        for i in 0..MAX_SESSIONS {
            let reply = s.open(SubscriptionId::new(i.to_string()), [], &initial);
            assert!(matches!(reply, RelayMessage::NegMsg { .. }), "{reply:?}");
        }
        let over = s.open(SubscriptionId::new("over"), [], &initial);
        assert!(matches!(over, RelayMessage::NegErr { .. }), "{over:?}");
        // Reusing an open id replaces it and is never refused.
        let again = s.open(SubscriptionId::new("0"), [], &initial);
        assert!(matches!(again, RelayMessage::NegMsg { .. }), "{again:?}");
        s.close(&SubscriptionId::new("0"));
        assert_eq!(s.len(), MAX_SESSIONS - 1);
    }

    fn sealed() -> NegentropyStorageVector {
        let mut storage = NegentropyStorageVector::new();
        storage.seal().unwrap();
        storage
    }
}
