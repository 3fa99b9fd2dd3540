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
//! Pure state and messages, no IO: the farm thread feeds it and queues what
//! it returns.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::sans_io::hex::{decode, encode};
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
#[derive(Default)]
pub(super) struct NegSessions {
    sessions: HashMap<SubscriptionId, Negentropy<'static, NegentropyStorageVector>>,
}

impl NegSessions {
    /// `NEG-OPEN`: a session over `items` (the relay's matches for the
    /// filter), answering `initial` (hex). An open session with the same id
    /// is replaced, as NIP-77 says. Returns `NEG-MSG` or `NEG-ERR`.
    pub(super) fn open(
        &mut self,
        sub: SubscriptionId,
        items: impl IntoIterator<Item = (Timestamp, EventId)>,
        initial: &str,
    ) -> RelayMessage<'static> {
        self.sessions.remove(&sub);
        if self.sessions.len() >= MAX_SESSIONS {
            return neg_err(sub, "blocked: too many negentropy sessions");
        }
        let mut storage = NegentropyStorageVector::new();
        for (created_at, id) in items {
            if storage
                .insert(created_at.as_secs(), Id::from_byte_array(id.to_bytes()))
                .is_err()
            {
                // Only a sealed storage refuses an insert; it is sealed below.
                return neg_err(sub, "error: could not build the set");
            }
        }
        let negentropy = match storage
            .seal()
            .and_then(|()| Negentropy::owned(storage, FRAME_LIMIT))
        {
            Ok(negentropy) => negentropy,
            Err(e) => return neg_err(sub, &format!("error: {e}")),
        };
        self.sessions.insert(sub.clone(), negentropy);
        self.message(sub, initial)
    }

    /// `NEG-MSG`: the next frame of an open session. An unknown session,
    /// bad hex or a frame negentropy refuses is a `NEG-ERR` (and ends the
    /// session).
    pub(super) fn message(&mut self, sub: SubscriptionId, hex: &str) -> RelayMessage<'static> {
        let Some(negentropy) = self.sessions.get_mut(&sub) else {
            return neg_err(sub, "closed: no such negentropy session");
        };
        let reply = match decode(hex) {
            Some(frame) => negentropy.reconcile(&frame).map_err(|e| e.to_string()),
            None => Err("not hex".to_owned()),
        };
        match reply {
            Ok(frame) => RelayMessage::NegMsg {
                subscription_id: Cow::Owned(sub),
                message: Cow::Owned(encode(&frame)),
            },
            Err(e) => {
                self.sessions.remove(&sub);
                neg_err(sub, &format!("invalid: {e}"))
            }
        }
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
