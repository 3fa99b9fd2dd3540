//! Listing what the own relay holds for a filter, for negentropy.
//!
//! Negentropy needs the `(id, created_at)` of every event the sink holds
//! that matches a historic filter. The own relay is asked with a plain REQ
//! on the sink's websocket, paged backwards with `until` because relays cap
//! results per REQ; only ids and timestamps are kept (40 bytes an event).
//! Paging stops when a page brings no id not already listed. The traffic
//! stays on the link to the own relay, which is local in every deployment
//! this tool has; the point of negentropy is the link to remote relays.

use std::collections::{HashMap, HashSet};

use nostr::prelude::{ClientMessage, EventId, Filter, RelayMessage, SubscriptionId, Timestamp};

/// Events asked per listing page; relays cap lower ones down anyway.
const PAGE: usize = 5_000;

/// What the caller does after a sink message.
#[derive(Debug, PartialEq, Eq)]
pub enum ListStep {
    /// Send these texts (CLOSE of the finished page, REQ of the next).
    Send(Vec<String>),
    /// The listing for `request` is complete.
    Done {
        /// The engine's request id.
        request: u64,
        /// What the sink holds.
        held: Vec<(EventId, Timestamp)>,
        /// CLOSE of the last page.
        close: String,
    },
    /// The own relay refused the listing; the engine's timeout falls back.
    Refused(u64),
}

struct Listing {
    request: u64,
    filter: Filter,
    held: Vec<(EventId, Timestamp)>,
    ids: HashSet<EventId>,
    /// Ids new to this listing in the current page.
    fresh: usize,
    oldest: Option<Timestamp>,
}

/// Listings in flight on the sink connection, by subscription id.
#[derive(Default)]
pub struct Listings {
    pending: HashMap<String, Listing>,
    /// Listings the own relay refused (typically `auth-required:`), to ask
    /// again once it accepts our AUTH.
    refused: Vec<(u64, Filter)>,
    next: u64,
}

impl Listings {
    /// Starts listing `filter` for engine request `request`; returns the REQ.
    pub fn start(&mut self, request: u64, filter: Filter) -> String {
        let sub = format!("list{:x}", self.next);
        self.next += 1;
        let req = req(&sub, &filter, None);
        self.pending.insert(
            sub,
            Listing {
                request,
                filter,
                held: Vec::new(),
                ids: HashSet::new(),
                fresh: 0,
                oldest: None,
            },
        );
        req
    }

    /// True when `sub` is one of ours.
    pub fn owns(&self, sub: &str) -> bool {
        self.pending.contains_key(sub)
    }

    /// Takes a message from the own relay; `None` if it is not for a listing.
    pub fn on_message(&mut self, message: &RelayMessage<'_>) -> Option<ListStep> {
        match message {
            RelayMessage::Event {
                subscription_id,
                event,
            } => {
                let l = self.pending.get_mut(subscription_id.as_str())?;
                if l.ids.insert(event.id) {
                    l.held.push((event.id, event.created_at));
                    l.fresh += 1;
                }
                l.oldest = Some(
                    l.oldest
                        .map_or(event.created_at, |o| o.min(event.created_at)),
                );
                Some(ListStep::Send(Vec::new()))
            }
            RelayMessage::EndOfStoredEvents(sub) => self.on_eose(sub.as_str()),
            RelayMessage::Closed {
                subscription_id, ..
            } => {
                let l = self.pending.remove(subscription_id.as_str())?;
                self.refused.push((l.request, l.filter));
                Some(ListStep::Refused(l.request))
            }
            _ => None,
        }
    }

    /// Asks again for every listing the own relay refused; returns the REQs.
    pub fn retry_refused(&mut self) -> Vec<String> {
        std::mem::take(&mut self.refused)
            .into_iter()
            .map(|(request, filter)| self.start(request, filter))
            .collect()
    }

    /// The sink connection is gone: its listings are lost (the engine's
    /// timeout falls back for them).
    pub fn clear(&mut self) {
        self.pending.clear();
        self.refused.clear();
    }

    fn on_eose(&mut self, sub: &str) -> Option<ListStep> {
        let close = ClientMessage::close(SubscriptionId::new(sub)).as_json();
        let l = self.pending.get_mut(sub)?;
        if l.fresh == 0 {
            let l = self.pending.remove(sub)?;
            return Some(ListStep::Done {
                request: l.request,
                held: l.held,
                close,
            });
        }
        l.fresh = 0;
        let next = req(sub, &l.filter, l.oldest);
        Some(ListStep::Send(vec![close, next]))
    }
}

fn req(sub: &str, filter: &Filter, until: Option<Timestamp>) -> String {
    let mut filter = filter.clone().limit(PAGE);
    if let Some(until) = until {
        filter = filter.until(until);
    }
    ClientMessage::req(SubscriptionId::new(sub), vec![filter]).as_json()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::*;

    fn event(keys: &Keys, at: u64) -> nostr::prelude::Event {
        EventBuilder::new(Kind::from_u16(1621), format!("{at}"))
            .custom_created_at(Timestamp::from_secs(at))
            .finalize(keys)
            .unwrap()
    }

    fn deliver(l: &mut Listings, sub: &str, e: &nostr::prelude::Event) {
        let m = RelayMessage::event(SubscriptionId::new(sub), e.clone());
        assert_eq!(l.on_message(&m), Some(ListStep::Send(Vec::new())));
    }

    #[test]
    fn pages_back_until_a_page_brings_nothing_new() {
        let keys = Keys::generate();
        let events: Vec<_> = (0..5).map(|i| event(&keys, 100 + i)).collect();
        let mut l = Listings::default();
        let first = l.start(7, Filter::new().kind(Kind::from_u16(1621)));
        assert!(first.contains("\"limit\":5000"));
        let sub = "list0";
        for e in &events[2..] {
            deliver(&mut l, sub, e);
        }
        let eose = RelayMessage::eose(SubscriptionId::new(sub));
        let Some(ListStep::Send(texts)) = l.on_message(&eose) else {
            panic!("a second page");
        };
        assert!(texts[1].contains("\"until\":102"), "{}", texts[1]);
        for e in &events[..3] {
            deliver(&mut l, sub, e);
        }
        assert!(matches!(l.on_message(&eose), Some(ListStep::Send(_))));
        deliver(&mut l, sub, &events[0]);
        let Some(ListStep::Done { request, held, .. }) = l.on_message(&eose) else {
            panic!("done");
        };
        assert_eq!(request, 7);
        let mut ids: Vec<_> = held.iter().map(|(id, _)| *id).collect();
        ids.sort();
        let mut want: Vec<_> = events.iter().map(|e| e.id).collect();
        want.sort();
        assert_eq!(ids, want);
        assert!(!l.owns(sub));
    }

    #[test]
    fn a_refusal_ends_the_listing_and_other_subscriptions_are_not_ours() {
        let mut l = Listings::default();
        l.start(3, Filter::new());
        let closed = RelayMessage::closed(SubscriptionId::new("list0"), "auth-required: x");
        assert_eq!(l.on_message(&closed), Some(ListStep::Refused(3)));
        let other = RelayMessage::eose(SubscriptionId::new("x"));
        assert_eq!(l.on_message(&other), None);
        let again = l.retry_refused();
        assert_eq!(again.len(), 1);
        assert!(again[0].starts_with(r#"["REQ","list1""#), "{}", again[0]);
        assert!(l.owns("list1"));
        assert!(l.retry_refused().is_empty());
    }
}
