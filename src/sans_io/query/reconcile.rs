//! NIP-77 negentropy reconciliation of one filter on one relay.
//!
//! Historic sync by REQ downloads every stored event a filter matches, and
//! once a relay has been synced before nearly all of them are events the
//! sink already holds. Negentropy instead compares the relay's set of
//! `(created_at, id)` for the filter with ours in a few round trips of
//! fingerprints and yields only the ids we lack; those are then fetched by
//! `ids` REQs ([`fetch_filters`]).
//!
//! This module is the protocol alone: [`Reconciliation::start`] builds the
//! `NEG-OPEN` text and [`Reconciliation::handle`] takes each `NEG-MSG` or
//! `NEG-ERR` and says what to send next. It does no IO and reads no clock:
//! the caller owns the timeout that detects a silent relay, and
//! [`means_unsupported`] reads a `NOTICE` answering `NEG-OPEN`. Every
//! failure can fall back to REQ pagination, so hostile input ends in
//! [`Step::Failed`], never in a panic.

use std::borrow::Cow;

use negentropy::{Id, Negentropy, NegentropyStorageVector};
use nostr::prelude::{ClientMessage, EventId, Filter, RelayMessage, SubscriptionId, Timestamp};

use crate::sans_io::query::filters::Encoded;
use crate::sans_io::wire::hex::{decode, encode};

/// The smallest frame the negentropy crate accepts, in bytes before hex.
const MIN_FRAME: usize = 4096;

/// Round trips after which a reconciliation is abandoned. An honest
/// exchange takes a handful; even a relay with the smallest frames
/// negentropy allows (4 KB, ~120 ids a round) reports 20,000 missing ids
/// within this many. A relay that never ends (buggy or hostile) falls back
/// to REQ paging, which loses nothing, instead of holding a slot for
/// thousands of rounds.
pub(crate) const MAX_ROUNDS: u32 = 200;

/// Ids per `ids` filter by default: 500 ids are ~33.5 KB of JSON, within
/// the common 64 KB message limit, and 500 is the commonest relay cap on
/// `limit` (strfry's default).
pub(crate) const IDS_PER_FILTER: usize = 500;

/// JSON bytes one id costs in an `ids` filter: 64 hex digits, two quotes
/// and a comma.
const ID_JSON_BYTES: usize = 67;

/// Room for the rest of an `ids` REQ: `{"ids":[`, `],"limit":N}` and the
/// `["REQ","<sub id up to 64 chars>",` envelope.
const REQ_OVERHEAD: usize = 128;

/// What to do after a relay message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send this `NEG-MSG` text and wait for the relay's answer.
    Send(String),
    /// Reconciliation is complete: send `close` (`NEG-CLOSE`) and fetch
    /// `need`, the ids the relay holds and we lack (sorted, no repeats).
    Done {
        /// Ids to fetch.
        need: Vec<EventId>,
        /// The `NEG-CLOSE` text.
        close: String,
    },
    /// Reconciliation failed: fall back to REQ pagination.
    Failed {
        /// Why, for the log.
        reason: String,
        /// The `NEG-CLOSE` text to send, or `None` after a `NEG-ERR`: the
        /// relay has then closed the subscription itself (NIP-77).
        close: Option<String>,
    },
}

/// The relay's message limit cannot hold a `NEG-OPEN` for this filter with
/// the smallest frame negentropy allows; use REQ for this relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitTooSmall {
    /// The message limit given.
    pub limit: usize,
    /// The smallest limit that would do for this filter and sub id.
    pub needed: usize,
}

/// One reconciliation of one filter on one relay, as initiator.
pub struct Reconciliation {
    sub_id: SubscriptionId,
    negentropy: Negentropy<'static, NegentropyStorageVector>,
    /// Ids the relay reported that we lack, gathered over all rounds.
    need: Vec<Id>,
    /// `NEG-MSG`s received so far.
    rounds: u32,
    finished: bool,
}

impl Reconciliation {
    /// Starts reconciling `filter` against `local`, the `(id, created_at)`
    /// of every event the sink holds that matches it. Returns the state and
    /// the `NEG-OPEN` text to send.
    ///
    /// `message_limit` bounds every text this reconciliation produces, in
    /// bytes of the whole JSON: the relay drops larger messages. The frame
    /// handed to negentropy is what remains after the `NEG-OPEN` envelope
    /// (the largest one, holding the filter), halved for hex.
    pub fn start(
        sub_id: &str,
        filter: &Filter,
        local: impl IntoIterator<Item = (EventId, Timestamp)>,
        message_limit: usize,
    ) -> Result<(Self, String), LimitTooSmall> {
        let sub_id = SubscriptionId::new(sub_id);
        let mut open =
            ClientMessage::neg_open(sub_id.clone(), filter.clone(), String::new()).as_json();
        let frame = message_limit.saturating_sub(open.len()) / 2;
        if frame < MIN_FRAME {
            return Err(LimitTooSmall {
                limit: message_limit,
                needed: open.len() + 2 * MIN_FRAME,
            });
        }
        let mut negentropy = Negentropy::owned(storage(local), frame as u64)
            .expect("the frame is at least MIN_FRAME, checked above");
        let first = negentropy
            .initiate()
            .expect("a new instance over sealed storage initiates once");
        // The text ends in `""]`: the hex goes between the quotes, and hex
        // digits need no JSON escaping.
        open.insert_str(open.len() - 2, &encode(&first));
        let state = Reconciliation {
            sub_id,
            negentropy,
            need: Vec::new(),
            rounds: 0,
            finished: false,
        };
        Ok((state, open))
    }

    /// Takes a relay message. `None` when it is not a `NEG-MSG` or `NEG-ERR`
    /// for this subscription, or the reconciliation has already ended.
    pub fn handle(&mut self, message: &RelayMessage<'_>) -> Option<Step> {
        if self.finished {
            return None;
        }
        let step = match message {
            RelayMessage::NegMsg {
                subscription_id,
                message,
            } if **subscription_id == self.sub_id => self.on_message(message),
            RelayMessage::NegErr {
                subscription_id,
                message,
            } if **subscription_id == self.sub_id => Step::Failed {
                reason: format!("NEG-ERR: {message}"),
                close: None,
            },
            _ => return None,
        };
        self.finished = !matches!(step, Step::Send(_));
        Some(step)
    }

    /// True once the relay has answered with a `NEG-MSG`: from then on a
    /// `NOTICE` cannot mean that it does not speak negentropy.
    pub fn answered(&self) -> bool {
        self.rounds > 0
    }

    /// One round: decode the relay's frame and answer it, or finish.
    fn on_message(&mut self, hex: &str) -> Step {
        self.rounds += 1;
        if self.rounds > MAX_ROUNDS {
            return self.fail(format!("no end after {MAX_ROUNDS} rounds"));
        }
        let Some(frame) = decode(hex) else {
            return self.fail("NEG-MSG is not hex".to_owned());
        };
        // We only pull: the ids we have and the relay lacks are not ours to push.
        let mut have = Vec::new();
        match self
            .negentropy
            .reconcile_with_ids(&frame, &mut have, &mut self.need)
        {
            Ok(Some(next)) => Step::Send(self.neg_msg(next)),
            Ok(None) => Step::Done {
                need: self.take_need(),
                close: self.close_text(),
            },
            Err(e) => self.fail(format!("undecodable NEG-MSG: {e}")),
        }
    }

    /// Ids gathered so far (repeats included). A relay may report ids
    /// without end, so the caller bounds what sessions hold (the engine
    /// over all of them at once, `Config::neg_ids_held`), as it owns the
    /// timeout.
    pub fn need_len(&self) -> usize {
        self.need.len()
    }

    fn fail(&self, reason: String) -> Step {
        Step::Failed {
            reason,
            close: Some(self.close_text()),
        }
    }

    /// The gathered ids, sorted and without repeats: a relay may report an
    /// id in more than one range.
    fn take_need(&mut self) -> Vec<EventId> {
        let mut need = std::mem::take(&mut self.need);
        need.sort_unstable();
        need.dedup();
        need.into_iter()
            .map(|id| EventId::from_byte_array(id.to_bytes()))
            .collect()
    }

    fn neg_msg(&self, frame: Vec<u8>) -> String {
        ClientMessage::NegMsg {
            subscription_id: Cow::Borrowed(&self.sub_id),
            message: Cow::Owned(encode(&frame)),
        }
        .as_json()
    }

    fn close_text(&self) -> String {
        ClientMessage::NegClose {
            subscription_id: Cow::Borrowed(&self.sub_id),
        }
        .as_json()
    }
}

/// Negentropy's sorted, sealed view of the local set.
fn storage(local: impl IntoIterator<Item = (EventId, Timestamp)>) -> NegentropyStorageVector {
    let mut storage = NegentropyStorageVector::new();
    for (id, created_at) in local {
        storage
            .insert(created_at.as_secs(), Id::from_byte_array(id.to_bytes()))
            .expect("inserting fails only once sealed, which happens below");
    }
    storage.seal().expect("sealed once, here");
    storage
}

/// `ids` filters fetching `need`, each holding at most `max_ids` ids and
/// small enough that a REQ of it alone stays within `max_bytes`. Each
/// filter sets `limit` to its id count: an id matches at most one event, and
/// without a `limit` some relays apply a default below the chunk size.
/// `max_ids` must not exceed the relay's cap on `limit`
/// ([`IDS_PER_FILTER`] suits most).
pub(crate) fn fetch_filters(need: &[EventId], max_ids: usize, max_bytes: usize) -> Vec<Encoded> {
    let per_filter = max_ids
        .min(max_bytes.saturating_sub(REQ_OVERHEAD) / ID_JSON_BYTES)
        .max(1);
    need.chunks(per_filter)
        .map(|ids| Encoded::new(Filter::new().ids(ids.iter().copied()).limit(ids.len())))
        .collect()
}

/// Whether a `NOTICE` that arrives before the first `NEG-MSG` says the relay
/// does not speak negentropy. Relays word it variously: strfry with
/// negentropy off and most others name the verb (`NEG-OPEN`) or call it
/// unknown or unsupported; nostr-rs-relay answers any verb it lacks with
/// "could not parse command". A wrong guess only costs the REQ fallback.
pub fn means_unsupported(notice: &str) -> bool {
    const HINTS: [&str; 7] = [
        "neg-",
        "neg_",
        "negentropy",
        "unknown",
        "unsupported",
        "not supported",
        "could not parse",
    ];
    let lower = notice.to_ascii_lowercase();
    HINTS.iter().any(|hint| lower.contains(hint))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sans_io::query::filters::req_message_encoded;
    use nostr::prelude::Kind;
    use rand::rngs::SmallRng;
    use rand::{RngCore, SeedableRng};

    const LIMIT: usize = 60_000;

    /// `n` distinct events, several per second as on a busy relay.
    fn events(seed: u64, n: usize) -> Vec<(EventId, Timestamp)> {
        let mut rng = SmallRng::seed_from_u64(seed);
        (0..n)
            .map(|i| {
                let mut id = [0u8; 32];
                rng.fill_bytes(&mut id);
                let at = Timestamp::from_secs(1_700_000_000 + i as u64 / 3);
                (EventId::from_byte_array(id), at)
            })
            .collect()
    }

    /// The relay side, from the same crate, as rust-nostr's LocalRelay runs it.
    struct Responder {
        items: Vec<(EventId, Timestamp)>,
        frame: u64,
        negentropy: Option<Negentropy<'static, NegentropyStorageVector>>,
    }

    impl Responder {
        fn new(items: Vec<(EventId, Timestamp)>, frame: u64) -> Self {
            Responder {
                items,
                frame,
                negentropy: None,
            }
        }

        /// Answers a client text with a relay text.
        fn answer(&mut self, text: &str) -> String {
            let (sub, hex) = match ClientMessage::from_json(text).unwrap() {
                ClientMessage::NegOpen {
                    subscription_id,
                    initial_message,
                    ..
                } => {
                    let storage = storage(self.items.iter().copied());
                    self.negentropy = Some(Negentropy::owned(storage, self.frame).unwrap());
                    (subscription_id.into_owned(), initial_message.into_owned())
                }
                ClientMessage::NegMsg {
                    subscription_id,
                    message,
                } => (subscription_id.into_owned(), message.into_owned()),
                other => panic!("unexpected {other:?}"),
            };
            let negentropy = self.negentropy.as_mut().unwrap();
            let reply = negentropy.reconcile(&decode(&hex).unwrap()).unwrap();
            neg_msg(sub.as_str(), &encode(&reply))
        }
    }

    fn neg_msg(sub: &str, hex: &str) -> String {
        format!(r#"["NEG-MSG","{sub}","{hex}"]"#)
    }

    fn parse(text: &str) -> RelayMessage<'static> {
        RelayMessage::from_json(text).unwrap()
    }

    /// A whole reconciliation: the need set and every text we sent.
    fn sync(
        remote: &[(EventId, Timestamp)],
        local: &[(EventId, Timestamp)],
        limit: usize,
        relay_frame: u64,
    ) -> (Vec<EventId>, Vec<String>) {
        let mut relay = Responder::new(remote.to_vec(), relay_frame);
        let filter = Filter::new().kind(Kind::from_u16(1617));
        let (mut recon, open) =
            Reconciliation::start("neg1", &filter, local.iter().copied(), limit).unwrap();
        let mut sent = vec![open];
        loop {
            let answer = relay.answer(sent.last().unwrap());
            match recon.handle(&parse(&answer)).unwrap() {
                Step::Send(text) => sent.push(text),
                Step::Done { need, close } => {
                    sent.push(close);
                    return (need, sent);
                }
                Step::Failed { reason, .. } => panic!("failed: {reason}"),
            }
        }
    }

    fn sorted(items: &[(EventId, Timestamp)]) -> Vec<EventId> {
        let mut ids: Vec<EventId> = items.iter().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn needs_exactly_the_ten_missing_of_ten_thousand() {
        let remote = events(1, 10_000);
        let missing: Vec<_> = remote.iter().copied().step_by(997).take(10).collect();
        let local: Vec<_> = remote
            .iter()
            .copied()
            .filter(|e| !missing.contains(e))
            .collect();
        let (need, sent) = sync(&remote, &local, LIMIT, 60_000);
        assert_eq!(need, sorted(&missing));
        assert!(sent.iter().all(|t| t.len() <= LIMIT));
        assert_eq!(sent.last().unwrap(), r#"["NEG-CLOSE","neg1"]"#);
    }

    #[test]
    fn items_only_we_hold_are_not_needed() {
        let remote = events(2, 3_000);
        let extra = events(3, 500);
        let local: Vec<_> = remote[3..].iter().chain(&extra).copied().collect();
        let (need, _) = sync(&remote, &local, LIMIT, 60_000);
        assert_eq!(need, sorted(&remote[..3]));
    }

    #[test]
    fn empty_sets_on_either_side() {
        let some = events(4, 100);
        assert_eq!(sync(&[], &[], LIMIT, 0).0, vec![]);
        assert_eq!(sync(&some, &[], LIMIT, 0).0, sorted(&some));
        assert_eq!(sync(&[], &some, LIMIT, 0).0, vec![]);
        assert_eq!(sync(&some, &some, LIMIT, 0).0, vec![]);
    }

    #[test]
    fn small_frames_take_several_rounds_and_stay_under_the_limit() {
        let remote = events(5, 10_000);
        let local: Vec<_> = remote.iter().copied().step_by(2).collect();
        let limit = 9_000;
        let (need, sent) = sync(&remote, &local, limit, 4096);
        let expected: Vec<_> = remote.iter().copied().skip(1).step_by(2).collect();
        assert_eq!(need, sorted(&expected));
        assert!(sent.len() > 10, "only {} texts", sent.len());
        for text in &sent {
            assert!(text.len() <= limit, "{} bytes", text.len());
        }
    }

    #[test]
    fn the_open_carries_one_filter_object_and_the_initial_frame() {
        let filter = Filter::new().kind(Kind::from_u16(30617));
        let (_, open) = Reconciliation::start("n", &filter, events(6, 50), LIMIT).unwrap();
        assert!(open.starts_with(r#"["NEG-OPEN","n",{"#), "{open}");
        let ClientMessage::NegOpen {
            subscription_id,
            filter: sent,
            initial_message,
        } = ClientMessage::from_json(&open).unwrap()
        else {
            panic!("not a NEG-OPEN: {open}");
        };
        assert_eq!(subscription_id.as_str(), "n");
        assert_eq!(*sent, filter);
        // Protocol V1: the first byte is 0x61.
        assert!(initial_message.starts_with("61"));
    }

    #[test]
    fn a_limit_without_room_for_a_minimal_frame_is_refused() {
        let filter = Filter::new().kind(Kind::from_u16(1));
        let err = Reconciliation::start("n", &filter, events(7, 5), 8_000)
            .err()
            .unwrap();
        assert_eq!(err.limit, 8_000);
        assert!(err.needed > 2 * MIN_FRAME);
        assert!(Reconciliation::start("n", &filter, events(7, 5), err.needed).is_ok());
    }

    fn started() -> Reconciliation {
        let filter = Filter::new().kind(Kind::from_u16(1617));
        Reconciliation::start("neg1", &filter, events(8, 200), LIMIT)
            .unwrap()
            .0
    }

    #[test]
    fn neg_err_fails_without_a_close_and_ends_it() {
        let mut recon = started();
        let step = recon.handle(&parse(r#"["NEG-ERR","neg1","blocked: too many"]"#));
        assert_eq!(
            step,
            Some(Step::Failed {
                reason: "NEG-ERR: blocked: too many".to_owned(),
                close: None,
            })
        );
        assert_eq!(recon.handle(&parse(&neg_msg("neg1", "61"))), None);
    }

    #[test]
    fn garbage_fails_with_a_close_and_never_panics() {
        for hex in ["", "6", "zz", "61zz", "60", "62", "ff00", "6100000202"] {
            let step = started().handle(&parse(&neg_msg("neg1", hex)));
            let Some(Step::Failed { close, .. }) = step else {
                panic!("{hex}: {step:?}");
            };
            assert_eq!(close.as_deref(), Some(r#"["NEG-CLOSE","neg1"]"#));
        }
        let mut rng = SmallRng::seed_from_u64(9);
        for len in 0..3_000 {
            let mut frame = vec![0u8; len % 300];
            rng.fill_bytes(&mut frame);
            if let Some(first) = frame.first_mut() {
                *first = 0x61; // past the version check, into the ranges
            }
            let mut recon = started();
            // Any outcome is fine but a panic; a later message is still handled.
            let _ = recon.handle(&parse(&neg_msg("neg1", &encode(&frame))));
            let _ = recon.handle(&parse(&neg_msg("neg1", &encode(&frame))));
        }
    }

    #[test]
    fn other_subscriptions_and_messages_are_ignored() {
        let remote = events(10, 1_000);
        let mut relay = Responder::new(remote.clone(), 0);
        let filter = Filter::new().kind(Kind::from_u16(1617));
        let (mut recon, open) = Reconciliation::start("neg1", &filter, [], LIMIT).unwrap();
        let answer = relay.answer(&open);
        let elsewhere = answer.replace("\"neg1\"", "\"neg2\"");
        assert_eq!(recon.handle(&parse(&elsewhere)), None);
        assert_eq!(recon.handle(&parse(r#"["NEG-ERR","neg2","x"]"#)), None);
        assert_eq!(recon.handle(&parse(r#"["EOSE","neg1"]"#)), None);
        assert_eq!(recon.handle(&parse(r#"["NOTICE","neg1"]"#)), None);
        assert!(!recon.answered());
        let Some(Step::Done { need, .. }) = recon.handle(&parse(&answer)) else {
            panic!("not done in one round");
        };
        assert!(recon.answered());
        assert_eq!(need, sorted(&remote));
    }

    #[test]
    fn a_relay_that_never_ends_is_given_up() {
        let remote = events(11, 2_000);
        let mut relay = Responder::new(remote.clone(), 0);
        let filter = Filter::new().kind(Kind::from_u16(1617));
        let local = remote.iter().copied().step_by(2);
        let (mut recon, open) = Reconciliation::start("neg1", &filter, local, LIMIT).unwrap();
        // The first answer again and again: each asks for another round.
        let answer = parse(&relay.answer(&open));
        for _ in 0..MAX_ROUNDS {
            assert!(matches!(recon.handle(&answer), Some(Step::Send(_))));
        }
        let Some(Step::Failed { reason, close }) = recon.handle(&answer) else {
            panic!("round {} accepted", MAX_ROUNDS + 1);
        };
        assert!(reason.contains("rounds"), "{reason}");
        assert!(close.is_some());
    }

    #[test]
    fn fetch_filters_cut_by_count_and_by_bytes() {
        let need = sorted(&events(12, 1_234));
        let filters = fetch_filters(&need, IDS_PER_FILTER, LIMIT);
        let sizes: Vec<usize> = filters
            .iter()
            .map(|f| f.filter.ids.as_ref().unwrap().len())
            .collect();
        assert_eq!(sizes, [500, 500, 234]);
        let mut fetched: Vec<EventId> = filters
            .iter()
            .flat_map(|f| f.filter.ids.clone().unwrap())
            .collect();
        fetched.sort_unstable();
        assert_eq!(fetched, need);
        assert!(filters[2].json.contains(r#""limit":234"#));

        let max_bytes = 10_000;
        let sub = "f".repeat(64);
        let small = fetch_filters(&need, IDS_PER_FILTER, max_bytes);
        assert!(small.len() > 3);
        for filter in &small {
            let req = req_message_encoded(&sub, std::slice::from_ref(filter));
            assert!(req.len() <= max_bytes, "{} bytes", req.len());
        }
        assert_eq!(fetch_filters(&need[..3], 500, 0).len(), 3);
        assert!(fetch_filters(&[], 500, LIMIT).is_empty());
    }

    #[test]
    fn notices_that_mean_no_negentropy() {
        for notice in [
            "ERROR: bad msg: unknown cmd",
            "Unknown message type: NEG-OPEN",
            "negentropy disabled",
            "NEG_OPEN is unsupported",
            "error: NIP-77 not supported",
            "could not parse command",
        ] {
            assert!(means_unsupported(notice), "{notice}");
        }
        for notice in [
            "rate-limited: slow down",
            "error: too many subscriptions",
            "restricted: paid relay",
            "",
        ] {
            assert!(!means_unsupported(notice), "{notice}");
        }
    }
}
