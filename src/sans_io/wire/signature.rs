//! An event's id and signature checked the way `Event::verify` checks
//! them, with the authors' keys kept parsed.
//!
//! Every event a relay sends is checked before it counts as seen (a forged
//! copy taken for the real one would hide the real one for good). On a
//! first sync that check is most of the engine's CPU, and `Event::verify`
//! spends about a ninth of it turning the 32 key bytes into a curve point
//! (a square root) for every event, though a history holds many events by
//! few authors. The last points parsed are kept here, by key.

use nostr::prelude::{Event, PublicKey};
use secp256k1::{Secp256k1, VerifyOnly, XOnlyPublicKey, schnorr};

/// Keys kept: one slot per value of a key's first byte, which is uniform
/// (an x coordinate). 256 × 97 bytes, about 25 KB.
const SLOTS: usize = 256;

/// Checks events; holds the parsed keys of recent authors.
pub(crate) struct Verifier {
    secp: Secp256k1<VerifyOnly>,
    keys: Vec<Option<(PublicKey, XOnlyPublicKey)>>,
}

impl Verifier {
    pub(crate) fn new() -> Verifier {
        Verifier {
            secp: Secp256k1::verification_only(),
            keys: vec![None; SLOTS],
        }
    }

    /// True when `event`'s id is the hash of its content and its signature
    /// is its author's over that id: what `Event::verify` accepts.
    pub(crate) fn verify(&mut self, event: &Event) -> bool {
        if !event.verify_id() {
            return false;
        }
        let Some(key) = self.key(&event.pubkey) else {
            return false;
        };
        let sig = schnorr::Signature::from_byte_array(*event.sig.as_bytes());
        self.secp
            .verify_schnorr(&sig, event.id.as_bytes(), &key)
            .is_ok()
    }

    /// The curve point of `pubkey`, parsed once while its slot keeps it;
    /// `None` for bytes that are no point (no event of theirs verifies).
    fn key(&mut self, pubkey: &PublicKey) -> Option<XOnlyPublicKey> {
        let slot = &mut self.keys[usize::from(pubkey.as_bytes()[0]) % SLOTS];
        if let Some((kept, point)) = slot
            && kept == pubkey
        {
            return Some(*point);
        }
        let point = XOnlyPublicKey::from_byte_array(pubkey.as_bytes()).ok()?;
        *slot = Some((*pubkey, point));
        Some(point)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{EventBuilder, EventId, FinalizeEvent, Keys, Kind, Tag, Tags};

    fn signed(keys: &Keys, content: &str) -> Event {
        EventBuilder::new(Kind::TextNote, content)
            .finalize(keys)
            .unwrap()
    }

    /// Two keys that share a slot, so the second evicts the first.
    fn slot_mates() -> (Keys, Keys) {
        let a = Keys::generate();
        loop {
            let b = Keys::generate();
            if b.public_key().as_bytes()[0] == a.public_key().as_bytes()[0] {
                return (a, b);
            }
        }
    }

    #[test]
    fn agrees_with_event_verify_on_good_and_forged_events() {
        let mut v = Verifier::new();
        let keys = Keys::generate();
        let good = signed(&keys, "hello");
        let mut forged_sig = good.clone();
        forged_sig.sig = signed(&keys, "other").sig;
        let mut forged_content = good.clone();
        forged_content.content = "changed".into();
        let mut forged_tags = good.clone();
        forged_tags.tags = Tags::from_list(vec![Tag::hashtag("x")]);
        for (event, ok) in [
            (&good, true),
            (&forged_sig, false),
            (&forged_content, false),
            (&forged_tags, false),
            (&good, true),
        ] {
            assert_eq!(event.verify().is_ok(), ok);
            assert_eq!(v.verify(event), ok, "{}", event.content);
        }
    }

    /// An event whose id is right for `author` but whose signature is
    /// `signer`'s over that id: only the key check can catch it.
    fn claimed(author: &Keys, signer: &Keys, content: &str) -> Event {
        let mut event = signed(author, content);
        event.sig = signer.sign_schnorr(event.id.as_bytes());
        event
    }

    #[test]
    fn a_kept_key_never_vouches_for_another_author() {
        let mut v = Verifier::new();
        let (a, b) = slot_mates();
        let by_a = signed(&a, "a");
        assert!(v.verify(&by_a));
        // A's point is kept; B signing in A's name must still fail.
        let b_as_a = claimed(&a, &b, "b");
        assert!(b_as_a.verify_id() && b_as_a.verify().is_err());
        assert!(!v.verify(&b_as_a));
        // B's own event takes the slot; A's still verify (parsed again),
        // and A signing in B's name fails against B's kept point.
        assert!(v.verify(&signed(&b, "b")));
        let a_as_b = claimed(&b, &a, "a2");
        assert!(!v.verify(&a_as_b));
        assert!(v.verify(&by_a));
    }

    #[test]
    fn key_bytes_that_are_no_point_verify_nothing() {
        let mut v = Verifier::new();
        let keys = Keys::generate();
        let mut event = signed(&keys, "x");
        // x = 5 is not on secp256k1 (5³ + 7 = 132 is no square mod p).
        // The id is recomputed for that key, so only the key check can fail.
        let mut bytes = [0u8; 32];
        bytes[31] = 5;
        event.pubkey = PublicKey::from_byte_array(bytes);
        event.id = EventId::compute(
            &event.pubkey,
            &event.created_at,
            &event.kind,
            &event.tags,
            &event.content,
        );
        assert!(event.verify_id());
        assert!(event.verify().is_err());
        assert!(!v.verify(&event));
    }
}
