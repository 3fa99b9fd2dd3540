//! Messages from relays: events, EOSE, CLOSED, NOTICE.
//!
//! Everything here is hostile input. A message that does not parse is
//! counted and dropped. An event is dropped if it answers no subscription of
//! ours, if it was seen before (checked before the costly signature
//! verification), if its id or signature is wrong, or if it does not match
//! what the subscription asked. Only then does it reach the sink.

use std::time::Duration;

use log::{debug, info, warn};
use nostr::prelude::{Event, EventId, Filter, RelayMessage, Timestamp};

use super::connection::LiveMode;
use super::ctx::Ctx;
use super::limits::{MIN_MESSAGE_BYTES, REQ_OVERHEAD};
use super::relay::{Link, RelayState};
use super::{ConnTimer, Engine, Offence, Output};
use crate::sans_io::memory::index::{
    Item, KIND_ANNOUNCEMENT, KIND_STATE, ROOT_KINDS, RelayId, RepoIndex, is_index_kind,
};
use crate::sans_io::query::refusal::{Refusal, step_below};
use crate::sans_io::query::subscription::{
    NextPage, PageFilter, Purpose, Saturated, Scope, Subscription, WorkRef, pack, windows,
    windows_per_split,
};
use crate::sans_io::timing::time::Time;
use crate::sans_io::wire::relay_text::{dropped, relay_text};

/// Follow-up pages a relay may have queued before a full page is split
/// into windows no more: beyond, its chains go on one page at a time.
const MAX_QUEUED_PAGES: usize = 64;

/// A first page answered slower than this is not split into windows: the
/// relay, not the path, is what it waits for (a relay answering one
/// message at a time queued the windows past their EOSE deadline).
const SPLIT_WITHIN: Duration = Duration::from_secs(2);

impl Engine {
    /// A text frame from `relay`: parsed, checked and dispatched by kind.
    pub(super) fn receive_message(&mut self, now: Time, relay: RelayId, text: &str) {
        let Some(conn) = self.conn_mut(relay) else {
            return;
        };
        conn.last_heard = now;
        if self.drop_live_duplicate(relay, text, now) {
            return;
        }
        let message = match RelayMessage::from_json(text) {
            Ok(m) => m,
            Err(e) => {
                self.stats.messages_malformed += 1;
                debug!("{}: malformed message ({e})", self.relay_url(relay));
                self.offended(now, relay, Offence::Malformed);
                return;
            }
        };
        match message {
            RelayMessage::Event {
                ref subscription_id,
                ..
            }
            | RelayMessage::EndOfStoredEvents(ref subscription_id)
                if self.blame_value_notice(relay, sub_key(subscription_id.as_str()), now) => {}
            RelayMessage::Event {
                subscription_id,
                event,
            } => self.on_event(
                relay,
                sub_key(subscription_id.as_str()),
                event.into_owned(),
                now,
            ),
            RelayMessage::EndOfStoredEvents(sub) => self.on_eose(relay, sub_key(sub.as_str()), now),
            RelayMessage::Closed {
                subscription_id,
                message,
            } => {
                let (state, mut cx) = self.at(relay);
                state.closed(&mut cx, sub_key(subscription_id.as_str()), &message, now)
            }
            RelayMessage::Notice(text) => self.on_notice(relay, &text, now),
            RelayMessage::Auth { challenge } => self.on_auth_challenge(relay, &challenge, now),
            ref m @ (RelayMessage::NegMsg {
                ref subscription_id,
                ..
            }
            | RelayMessage::NegErr {
                ref subscription_id,
                ..
            }) => {
                let sub = sub_key(subscription_id.as_str());
                self.on_neg_message(relay, sub, m, now)
            }
            RelayMessage::Ok {
                event_id,
                status,
                message,
            } => self.on_ok(relay, &event_id, status, &message, now),
            _ => {}
        }
        self.flush(now);
    }

    /// The cheap path for the commonest message of all: an event we already
    /// have, arriving live from another relay. Its id is read straight from
    /// the text (an EVENT holds one object, so the only raw `"id":"` in it
    /// is the event's id: quotes inside strings are escaped), and a known
    /// id on a subscription past its stored events is dropped without
    /// parsing the JSON, the key or the signature. Stored-phase duplicates
    /// still take the full path: pagination must count them.
    fn drop_live_duplicate(&mut self, relay: RelayId, text: &str, now: Time) -> bool {
        if relay == self.own {
            return false;
        }
        let Some((sub, id)) = peek_event(text) else {
            return false;
        };
        if !self.seen.contains(&id) {
            return false;
        }
        let Some(conn) = self.conn_mut(relay) else {
            return false;
        };
        match sub_key(sub).and_then(|k| conn.subs.get_mut(k)) {
            Some(s) if s.eose => s.heard = true,
            _ => return false,
        }
        self.stats.events_received += 1;
        self.note_event(relay, now);
        self.stats.events_duplicate += 1;
        true
    }

    fn on_event(&mut self, relay: RelayId, sub: Option<u64>, event: Event, now: Time) {
        let own = relay == self.own;
        if !own {
            self.stats.events_received += 1;
            self.note_event(relay, now);
        }
        let state = &mut self.relays[relay.index()];
        let Some((scope, matched)) = state.answered(&self.index, sub, &event) else {
            self.stats.events_unwanted += 1;
            return;
        };
        if !matched {
            self.stats.events_unwanted += 1;
            debug!(
                "{}: event {} outside its filter",
                self.relay_url(relay),
                event.id
            );
            // A compacted live set still reaches repos the relay no longer
            // carries (one moved away since it was asked): the relay keeps
            // sending what it was asked for, and that is no offence. State
            // (30618) is asked by `#d` alone, any author: one for a moved
            // repo names no repo at all.
            let still_asked = event.kind.as_u16() == KIND_STATE || tags_known(&self.index, &event);
            if !(scope == Scope::Targets && still_asked) {
                self.offended(now, relay, Offence::OutsideFilter);
            }
            return;
        }
        if own {
            return self.on_own_event(event, now);
        }
        // What the relay targets is decided before anything is spent on the
        // signature, and before the id is marked seen: a copy dropped here
        // must not block a wanted copy from another relay.
        match self.verdict(relay, scope, &event) {
            Verdict::Wanted => {}
            Verdict::Unwanted => {
                self.stats.events_unwanted += 1;
                return;
            }
            Verdict::Withdrawal => {
                self.stats.events_unwanted += 1;
                if self.verified(now, relay, &event) {
                    self.push_withdrawal(now, event);
                }
                return;
            }
        }
        if self.seen.contains(&event.id) {
            self.stats.events_duplicate += 1;
            return;
        }
        if self.refused.contains(&event.id) {
            self.stats.events_refused_skipped += 1;
            return;
        }
        if !self.verified(now, relay, &event) {
            return;
        }
        self.seen.insert(event.id);
        self.stats.events_ingested += 1;
        self.note_ingested(relay);
        if event.kind.is_regular() {
            let cap = &mut self.relays[relay.index()].facts.result_cap;
            cap.witness(event.id, event.created_at);
        }
        let (state, cx) = self.at(relay);
        if !state.fresh_item(&cx, now, &event) {
            self.offended(now, relay, Offence::ItemFlood);
        }
        // Announcements and roots reach the index only once the own relay
        // accepted them (its `OK`, the self-subscription, or the embedding
        // relay's feed), so the index never holds what the own relay refused.
        if is_index_kind(event.kind) {
            self.batching.echo_wait.handed(event.id, now);
        }
        self.outputs.push_back(Output::Ingest {
            relay,
            event: Box::new(event),
            received: now,
        });
    }

    /// An event of the self-subscription: announcements and roots feed the index.
    fn on_own_event(&mut self, event: Event, now: Time) {
        if self.seen.contains(&event.id) {
            // A seen id vouches for an event only if the event hashes to it
            // (the id was verified with its signature): the own relay's copy
            // is indexed, and one with a seen id but forged content must not
            // be (found by fuzzing). Hashing costs a fraction of a signature.
            if event.verify_id() {
                self.push_to_batch(now, event, true);
            } else {
                self.stats.events_invalid += 1;
            }
            return;
        }
        if !self.verifier.verify(&event) {
            self.stats.events_invalid += 1;
            return;
        }
        self.seen.insert(event.id);
        if is_index_kind(event.kind) {
            self.push_to_batch(now, event, false);
        }
    }

    /// Checks id and signature; a forgery is counted against the relay.
    fn verified(&mut self, now: Time, relay: RelayId, event: &Event) -> bool {
        if self.verifier.verify(event) {
            return true;
        }
        self.stats.events_invalid += 1;
        warn!(
            "{}: event {} has a bad id or signature",
            self.relay_url(relay),
            event.id
        );
        self.offended(now, relay, Offence::InvalidEvent);
        false
    }

    /// Rules beyond the filter: wide subscriptions must tag something the
    /// relay targets; announcements must list the service in `relays` and
    /// `clone` (GRASP-01), and one that does not but is newer than the
    /// announcement indexed for its repo withdraws the repo from us.
    fn verdict(&self, relay: RelayId, scope: Scope, event: &Event) -> Verdict {
        if event.kind.as_u16() == KIND_ANNOUNCEMENT {
            return if self.service.accepts(event) {
                Verdict::Wanted
            } else if self.index.announced_before(event) {
                Verdict::Withdrawal
            } else {
                Verdict::Unwanted
            };
        }
        if scope != Scope::Wide || self.relays[relay.index()].tags_target(&self.index, event) {
            Verdict::Wanted
        } else {
            Verdict::Unwanted
        }
    }

    /// A subscription's stored events ended: a page's chain goes on or
    /// completes its chunks (`RelayState::end_page`), and what the page
    /// showed of the relay's cap settles its unsure seconds.
    fn on_eose(&mut self, relay: RelayId, sub: Option<u64>, now: Time) {
        let Some(id) = sub else { return };
        let own = relay == self.own;
        let (state, mut cx) = self.at(relay);
        let Some(scope) = state.eose(&mut cx, id) else {
            return;
        };
        state.climb_limit(&cx, now);
        // The silent subscriptions sent before it are suspects. Not on the
        // own relay: its one subscription is re-opened by its own path,
        // not by giving its work back.
        if !own {
            state.suspect_silent(&mut cx, id, now);
        }
        if scope == Scope::Own {
            // Everything before now is read: a re-subscription after a
            // refusal need only reach back over the quick window.
            let back = now.saturating_sub(self.config.quick_reconnect);
            self.self_since = Some(Timestamp::from_secs(back.as_secs()));
        }
        let neg = self.negentropy_usable(relay);
        let (state, mut cx) = self.at(relay);
        let Some(PageEnd { done, unsure }) = state.end_page(&mut cx, id, neg, now) else {
            return;
        };
        if let Some(done) = done {
            for w in done {
                self.complete_chunk(relay, w.batch, now);
            }
            if scope == Scope::Own {
                self.close_batch_window_early(now);
            }
        }
        // After the chunks completed: whether history is read decides.
        let neg = self.negentropy_usable(relay);
        let (state, mut cx) = self.at(relay);
        state.note_unsure(&cx, unsure, scope);
        state.recheck_unsure(&mut cx, neg, now);
        self.dirty.push(relay);
        self.maybe_consolidate(relay, now);
    }

    /// A NOTICE: a NIP-77 job's (`nip77`), or one that may refuse a REQ
    /// (`RelayState::notice`).
    fn on_notice(&mut self, relay: RelayId, text: &str, now: Time) {
        if self.neg_limit_notice(relay, text, now) || self.neg_notice(relay, text, now) {
            return;
        }
        let (state, mut cx) = self.at(relay);
        state.notice(&mut cx, text, now);
    }

    /// After a value or kind NOTICE, the first EVENT or EOSE of a
    /// subscription not heard from yet names the REQ it refused
    /// (`RelayState::blame_value_notice`); true when its message is
    /// dropped.
    fn blame_value_notice(&mut self, relay: RelayId, sub: Option<u64>, now: Time) -> bool {
        let (state, mut cx) = self.at(relay);
        state.blame_value_notice(&mut cx, sub, now)
    }
}

/// A relay's steps on what it answered: a page's end, a refusal (CLOSED,
/// a NOTICE, no EOSE in time) and what it teaches.
impl RelayState {
    /// Subscription `sub` of the relay (if it is one) heard `event`: its
    /// scope, and whether the event is one it asked for: matching one of
    /// its filters, or, for a compacted live set, a repo announcement or
    /// an event tagging what the relay targets. Stored events are counted
    /// for the subscription's paging.
    fn answered(
        &mut self,
        index: &RepoIndex,
        sub: Option<u64>,
        event: &Event,
    ) -> Option<(Scope, bool)> {
        let s = self.conn_mut()?.subs.get_mut(sub?)?;
        s.heard = true;
        let matched: Vec<usize> = s.matching(event).collect();
        if !s.eose {
            s.count_stored(event.id, event.created_at, event.kind.as_u16(), &matched);
        }
        let scope = s.scope;
        let compacted_match = scope == Scope::Targets
            && (event.kind.as_u16() == KIND_ANNOUNCEMENT || self.tags_target(index, event));
        Some((scope, !matched.is_empty() || compacted_match))
    }

    /// A new root or announcement (never seen before) counts against the
    /// relay's budget of new index items: see
    /// `Config::max_new_items_per_relay_minute` and
    /// [`FRESH_WINDOW`](super::conduct::FRESH_WINDOW). False when it is
    /// past it (an offence); the event goes on to the sink either way.
    fn fresh_item(&mut self, cx: &Ctx, now: Time, event: &Event) -> bool {
        let kind = event.kind.as_u16();
        if kind != KIND_ANNOUNCEMENT && !ROOT_KINDS.contains(&kind) {
            return true;
        }
        let budget = cx.config.max_new_items_per_relay_minute;
        self.facts.conduct.fresh_item(now, budget)
    }

    /// The relay closed subscription `sub` (CLOSED): it ended unfinished.
    fn closed(&mut self, cx: &mut Ctx, sub: Option<u64>, reason: &str, now: Time) {
        let Some(id) = sub else { return };
        let Some(s) = self.conn_mut().and_then(|c| c.subs.remove(id)) else {
            return;
        };
        let refusal = Refusal::of_closed(reason);
        if let Some(n) = cx.admit_log(now) {
            info!(
                "{}: subscription {id:x} closed: {}{}",
                cx.url(),
                relay_text(reason),
                dropped(n)
            );
        }
        self.refused(cx, s, refusal, now);
    }

    /// A NOTICE that refuses something names no subscription: the refused
    /// one is the newest that has heard nothing yet.
    ///
    /// Too many tag values or kinds is different: khatru sends one NOTICE
    /// per refused filter, just before that REQ's stored events and EOSE,
    /// which it sends as if the filter matched nothing. Guessing the REQ
    /// from what it asked lost events: before the first refusal no REQ
    /// looks over the cap (100), so the oldest REQ's NOTICE was blamed on
    /// the newest and the oldest's EOSE confirmed its items unread; and a
    /// REQ the engine had closed unanswered (a consolidation) had its
    /// NOTICE blamed on one within the cap, which halved the cap to 1. So
    /// the NOTICE is held until the relay answers a REQ not heard from
    /// yet: that one is the refused one ([`Self::blame_value_notice`]).
    fn notice(&mut self, cx: &mut Ctx, text: &str, now: Time) {
        let Some(refusal) = Refusal::of_notice(text) else {
            debug!("{}: notice: {}", cx.url(), relay_text(text));
            return;
        };
        if let Some(n) = cx.admit_log(now) {
            let url = cx.url();
            info!("{url}: refusing notice: {}{}", relay_text(text), dropped(n));
        }
        if matches!(
            refusal,
            Refusal::TooManyValues | Refusal::TooManyKinds | Refusal::BadValue { .. }
        ) {
            if let Some(conn) = self.conn_mut() {
                let flight = conn.start_flight();
                flight.value_notice = flight.value_notice.or(Some(refusal));
            }
            return;
        }
        if let Some(s) = self.close_newest_silent(cx, refusal, now) {
            self.refused(cx, s, refusal, now);
        }
        self.suspect_silent(cx, u64::MAX, now);
    }

    /// Subscription `sub` answers first after a value or kind NOTICE
    /// (`Flight::value_notice`): unless it was heard from before, it is
    /// the REQ the NOTICE refused, closed and refused (true: its message
    /// is dropped). A subscription the engine closed before the relay
    /// answered it takes the NOTICE too; its work was queued again when
    /// it was closed.
    fn blame_value_notice(&mut self, cx: &mut Ctx, sub: Option<u64>, now: Time) -> bool {
        let Some((s, refusal)) = sub.and_then(|sub| self.value_notice_blames(cx, sub)) else {
            return false;
        };
        self.refused(cx, s, refusal, now);
        true
    }

    /// The subscription a held value or kind NOTICE refused, if `sub` is
    /// it ([`Self::blame_value_notice`]), closed, with the refusal.
    fn value_notice_blames(&mut self, cx: &mut Ctx, sub: u64) -> Option<(Subscription, Refusal)> {
        let conn = self.conn_mut()?;
        let refusal = conn.flight().and_then(|f| f.value_notice)?;
        if conn.subs.get(sub).is_some_and(|s| s.heard) {
            return None;
        }
        if let Some(flight) = conn.flight_mut() {
            flight.value_notice = None;
        }
        Some((self.close_subscription(cx, sub)?, refusal))
    }

    /// A page got no EOSE in time (`ConnTimer::EoseTimeout`): it is
    /// treated as refused.
    pub(super) fn eose_timeout(&mut self, cx: &mut Ctx, id: u64, now: Time) {
        let sub = self.conn().and_then(|c| c.subs.get(id));
        if sub.is_none_or(|s| s.eose) {
            return;
        }
        info!("{}: subscription {id:x} got no EOSE in time", cx.url());
        if let Some(sub) = self.close_subscription(cx, id) {
            self.refused(cx, sub, Refusal::Error, now);
        }
    }

    /// A subscription ended without finishing: fail its batches, learn from
    /// the reason, and retry later (never drop the work).
    fn refused(&mut self, cx: &mut Ctx, sub: Subscription, refusal: Refusal, now: Time) {
        self.note_refusal(cx);
        if refusal == Refusal::TooManyFilters && self.may_ask_narrower(&sub) {
            return self.ask_narrower(cx, sub, now);
        }
        self.give_back(cx, &sub, now);
        if sub.scope == Scope::Own {
            return self.pause(cx, refusal, now);
        }
        self.ask_orphan_again(cx, &sub, refusal);
        if refusal == Refusal::AuthRequired {
            self.auth_required(cx, now);
        }
        if let Refusal::BadValue { too_long } = refusal {
            // Asked again at once, split: each round halves the suspects'
            // chunks, so the offending item stands alone in a few rounds.
            let (facts, targets) = (&mut self.facts, &mut self.targets);
            let bad = &mut facts.bad_values;
            return bad.refused(cx, (&mut facts.limits, targets), &sub, too_long);
        }
        if refusal.is_limit() && !self.facts.limits.at_floor(refusal) {
            let hint = match refusal {
                Refusal::TooManyValues | Refusal::TooManyKinds => {
                    counted(refusal, &sub).max().unwrap_or(0)
                }
                // A subscription refusal steps one (`limit_probe`); the
                // others learn from what the refused REQ carried.
                _ => sub.filter_count,
            };
            self.lower_limits(cx, refusal, hint, now);
        } else {
            // A limit already as low as it goes is not a limit: retrying at
            // once would loop, so it backs off like any refusal.
            self.pause(cx, refusal, now);
        }
    }

    /// Whether a page refused for its filter count may be asked again in
    /// smaller REQs, its chain going on: a historic page (a live set's
    /// coverage is re-covered by consolidation instead), with a lower
    /// limit left to learn.
    fn may_ask_narrower(&self, sub: &Subscription) -> bool {
        sub.purpose == Purpose::Page
            && sub.scope == Scope::Exact
            && !self.facts.limits.at_floor(Refusal::TooManyFilters)
    }

    /// A page refused for carrying more filters than the relay takes is
    /// asked again first, split to the limit the refusal taught
    /// (`split_front_page`). Giving it back restarted its whole batch
    /// from the newest page: at a cap of 100, a first sync of 5,000
    /// replies on a relay taking ten filters cost 15 round trips.
    fn ask_narrower(&mut self, cx: &mut Ctx, sub: Subscription, now: Time) {
        self.lower_limits(cx, Refusal::TooManyFilters, sub.filter_count, now);
        let page = NextPage {
            filters: sub.as_asked(),
            scope: sub.scope,
            work: sub.work,
            page: sub.page,
            started: sub.started,
            reconcile: None,
        };
        if let Some(flight) = self.conn_mut().and_then(|c| c.flight_mut()) {
            flight.next_pages.push_front(page);
        }
    }

    /// True if `event` tags a repo or root the relay targets.
    fn tags_target(&self, index: &RepoIndex, event: &Event) -> bool {
        let items = &self.targets.items;
        let targeted = |item: Option<Item>| item.is_some_and(|i| items.contains_key(&i));
        if event.kind.as_u16() == KIND_STATE {
            // The per-id filter asks `#d` alone: state from any maintainer of
            // a repo with that identifier. 30618 is rare, so a scan of the
            // relay's repos is cheaper than another index.
            let d = event.tags.identifier().unwrap_or_default();
            let repo_with_d =
                |item: &Item| matches!(item, Item::Repo(r) if index.repo_identifier(*r) == d);
            if items.keys().any(repo_with_d) {
                return true;
            }
        }
        event.tags.iter().map(|t| t.as_slice()).any(|t| {
            let (Some(name), Some(value)) = (t.first(), t.get(1)) else {
                return false;
            };
            match name.as_str() {
                "a" | "A" => targeted(index.repo_id(value).map(Item::Repo)),
                "e" | "E" => targeted(root_item(index, value)),
                "q" => {
                    targeted(index.repo_id(value).map(Item::Repo))
                        || targeted(root_item(index, value))
                }
                _ => false,
            }
        })
    }

    /// What an ended subscription had not finished goes back to be asked
    /// again: its batches' chunks, and for live coverage the time from
    /// which events are unread.
    pub(super) fn give_back(&mut self, cx: &mut Ctx, sub: &Subscription, now: Time) {
        for w in &sub.work {
            self.fail_batch(cx, w.batch);
        }
        if sub.scope == Scope::Own {
            return;
        }
        let per_id = self.conn().is_none_or(|c| c.live_mode != LiveMode::Wide);
        if sub.purpose == Purpose::Live && per_id || sub.scope == Scope::Wide {
            let (lost, layer1) = sub.uncovered_from(now);
            self.coverage.owe_layer1(layer1);
            self.coverage.gap_from(lost);
        }
    }

    /// A refused page that no batch waits for (a crowded second's part, or
    /// the chain after it, asked once the history that found it ended)
    /// has no batch to fail and ask again: it goes back to the follow-up
    /// pages itself, to be asked when the relay has room or its pause
    /// ends. Not when the relay refused what it asks (a value, a kind
    /// count, `restricted:`), which asking again cannot change. Dropped,
    /// a second's events were lost (oracle world 338235: `too many
    /// concurrent REQs`). The relay is marked for scheduling, which
    /// counts the ids an `ids` page holds (`Engine::recount_ids`).
    fn ask_orphan_again(&mut self, cx: &mut Ctx, sub: &Subscription, refusal: Refusal) {
        let passing = matches!(
            refusal,
            Refusal::TooManySubscriptions
                | Refusal::RateLimited
                | Refusal::AuthRequired
                | Refusal::Error
        );
        if sub.purpose != Purpose::Page || !sub.work.is_empty() || !passing {
            return;
        }
        let Some(conn) = self.conn_mut() else {
            return;
        };
        conn.start_flight().next_pages.push_back(NextPage {
            filters: sub.filters.iter().cloned().map(PageFilter::first).collect(),
            scope: sub.scope,
            work: Vec::new(),
            page: sub.page,
            started: sub.started,
            reconcile: None,
        });
        cx.mark_dirty();
    }

    /// A refusing NOTICE names no subscription: the newest that has heard
    /// nothing yet is the refused one, closed and returned. With none
    /// silent, the limit the refusal names is lowered (by one step).
    fn close_newest_silent(
        &mut self,
        cx: &mut Ctx,
        refusal: Refusal,
        now: Time,
    ) -> Option<Subscription> {
        let silent = self.conn().into_iter().flat_map(|c| c.subs.iter());
        let newest = silent.filter(|(_, s)| !s.heard).map(|(id, _)| id).max();
        let closed = newest.and_then(|id| self.close_subscription(cx, id));
        if closed.is_none() {
            self.lower_limits(cx, refusal, 0, now);
        }
        closed
    }

    /// EOSE of subscription `id`: it is past its stored events and heard
    /// from, the relay did its part (`HealthTracker::record_success`), and
    /// its deadline is taken back. Its scope, unless it is unknown or had
    /// its EOSE already.
    fn eose(&mut self, cx: &mut Ctx, id: u64) -> Option<Scope> {
        let Link::Up(conn) = &mut self.link else {
            return None;
        };
        let s = conn.subs.get_mut(id).filter(|s| !s.eose)?;
        s.eose = true;
        s.heard = true;
        let (timer, scope) = (s.eose_timer.take(), s.scope);
        self.facts.health.record_success();
        if let Some(timer) = timer {
            cx.cancel(timer);
        }
        Some(scope)
    }

    /// Subscription `id`'s page ended: a page is closed before its
    /// follow-up opens (the relay never sees one subscription more than
    /// we count), a live one compacted; its saturated seconds are asked
    /// in parts; a full page queues the next, and windows of the rest
    /// where it may (`may_split`). `None` when the subscription is gone.
    /// `neg`: see `split_saturated`.
    fn end_page(&mut self, cx: &mut Ctx, id: u64, neg: bool, now: Time) -> Option<PageEnd> {
        let (limit, max_pages) = (self.page_limit(), cx.config.max_pages);
        let Link::Up(conn) = &mut self.link else {
            return None;
        };
        let s = conn.subs.get_mut(id)?;
        let end = s.next_page(limit, &mut self.facts.result_cap);
        s.end_stored();
        let next = end.next;
        let (purpose, scope, started, page) = (s.purpose, s.scope, s.started, s.page);
        let answered_in = now.since(s.sent);
        let work = std::mem::take(&mut s.work);
        if purpose == Purpose::Page {
            self.close_subscription(cx, id);
        } else {
            s.compact();
        }
        for saturated in end.saturated {
            self.split_saturated(cx, neg, saturated, scope, &work, started, now);
        }
        match next {
            Some(mut filters) if page < max_pages => {
                debug!("{}: page {page} of {id:x} full; asking the next", cx.url());
                // The continuation and the windows share REQs: a REQ is
                // a subscription slot for a round trip whatever its filter
                // count, and a continuation on its own was a slot for the
                // few filters a page left cut (at a cap of 100, REQs of
                // 2 to 6 filters beside the windows' 20).
                let reqs = match self.may_split(&work, answered_in) {
                    true => {
                        let filters_per_req = self.facts.limits.filters_per_req;
                        let most = windows_per_split(filters_per_req, end.spans.len());
                        let rest = windows(&mut filters, &end.spans, most);
                        filters.extend(rest);
                        self.pack_windows(filters)
                    }
                    false => vec![filters],
                };
                // The first REQ goes on the chain; the others are new ones.
                let chains = reqs.len().saturating_sub(1) as u32;
                let pages = reqs.into_iter().enumerate().map(|(i, filters)| NextPage {
                    filters,
                    scope,
                    work: work.clone(),
                    page: if i == 0 { page + 1 } else { 1 },
                    started,
                    reconcile: None,
                });
                if let Some(conn) = self.conn_mut() {
                    let flight = conn.start_flight();
                    flight.add_chains(&work, chains);
                    flight.next_pages.extend(pages);
                }
                Some(PageEnd {
                    done: None,
                    unsure: end.unsure,
                })
            }
            _ => {
                if next.is_some() {
                    warn!(
                        "{}: {id:x} passed {max_pages} pages; rest given up",
                        cx.url()
                    );
                }
                let bad = &mut self.facts.bad_values;
                bad.clear(work.iter().flat_map(|w| w.items.iter()));
                Some(PageEnd {
                    done: Some(work),
                    unsure: end.unsure,
                })
            }
        }
    }

    /// Whether the rest of a chain's range may be read by several chains
    /// at once (`subscription::windows`): from any full page of a chain
    /// (each window is a chain whose own full pages may split again; a
    /// window denser than its first page showed was read one page a round
    /// trip when only first pages split: 20 pages at 265 ms after the rest
    /// of a GRASP-shaped first sync had ended), only for history some
    /// batch waits for (a live set's look-back stays one chain), only when
    /// the page came back within [`SPLIT_WITHIN`] (`answered_in`: parallel
    /// REQs help a relay the path makes slow, and only queue on one that
    /// answers one message at a time), and not while the relay's queue of
    /// pages is long (a relay answering every window with a full page
    /// cannot make the queue grow past it). And only once a follow-up page
    /// on this connection showed the relay's `until` takes in its own
    /// second (`ResultCap::until_inclusive`): windows meet at a second
    /// boundary, and on nostr-relay, whose `until` excludes it, each
    /// boundary second was asked by no window (a chain's first split waits
    /// one page for it).
    fn may_split(&self, work: &[WorkRef], answered_in: Duration) -> bool {
        let queued = self
            .conn()
            .and_then(|c| c.flight())
            .map_or(0, |f| f.next_pages.len());
        !work.is_empty()
            && answered_in <= SPLIT_WITHIN
            && queued < MAX_QUEUED_PAGES
            && self.facts.result_cap.until_inclusive()
    }

    /// `windows` packed into REQs within the relay's limits on filters and
    /// bytes per REQ (`subscription::pack`).
    pub(super) fn pack_windows(&self, windows: Vec<PageFilter>) -> Vec<Vec<PageFilter>> {
        let limits = &self.facts.limits;
        let bytes = limits.message_bytes.saturating_sub(REQ_OVERHEAD);
        pack(windows, limits.filters_per_req, bytes)
    }

    /// A limit refusal lowers the limit it names, to below `hint` (what
    /// the refused REQ carried) where that teaches more; the relay's
    /// queued work is diffed again under it.
    fn lower_limits(&mut self, cx: &mut Ctx, refusal: Refusal, hint: usize, now: Time) {
        let facts = &mut self.facts;
        let limits = &mut facts.limits;
        match refusal {
            Refusal::TooManySubscriptions => {
                // One step per refusal, not to what is open when it lands:
                // a refusal arrives after the answers the relay sent
                // before it, and the pages those closed were open on the
                // relay when it refused (issue 46: 7 → 6 → 1). A burst of
                // refusals steps as many times; the climb takes back a
                // step too far (`limit_probe`).
                limits.subscriptions = facts.limit_probe.refused(limits.subscriptions, now);
            }
            Refusal::TooManyFilters => {
                // A REQ sent before an earlier refusal lowered the limit
                // is refused for what that one taught already: a burst of
                // refusals steps once.
                let asked = if hint == 0 {
                    limits.filters_per_req
                } else {
                    hint
                };
                if asked <= limits.filters_per_req {
                    limits.filters_per_req = fewer_filters(asked);
                }
            }
            Refusal::TooLarge => {
                limits.message_bytes = (limits.message_bytes / 2).max(MIN_MESSAGE_BYTES)
            }
            Refusal::TooManyValues => {
                limits.tag_values = limits.tag_values.min(fewer_values(hint, limits.tag_values))
            }
            Refusal::TooManyKinds => {
                limits.kinds = limits.kinds.min(fewer_values(hint, limits.kinds))
            }
            _ => {}
        }
        info!("{}: limits now {:?}", cx.url(), self.facts.limits);
        cx.mark_dirty();
    }

    /// Stops historic work until a backoff (or rate-limit cooldown) ends.
    fn pause(&mut self, cx: &mut Ctx, refusal: Refusal, now: Time) {
        let (facts, policy) = (&mut self.facts, cx.policy);
        let until = match refusal {
            Refusal::RateLimited => facts.health.record_rate_limit(now, policy),
            _ => {
                let penalty = facts.conduct.backoff_steps();
                facts.health.record_refusal(now, policy, penalty, cx.rng)
            }
        };
        if let Some(conn) = self.conn_mut() {
            conn.paused_until = Some(until);
        }
        self.arm(cx, until, ConnTimer::Resume);
    }
}

/// True if `event` tags any repo or root the index knows, targeted by
/// this relay or not.
fn tags_known(index: &RepoIndex, event: &Event) -> bool {
    event.tags.iter().map(|t| t.as_slice()).any(|t| {
        let (Some(name), Some(value)) = (t.first(), t.get(1)) else {
            return false;
        };
        match name.as_str() {
            "a" | "A" => index.repo_id(value).is_some(),
            "e" | "E" => root_item(index, value).is_some(),
            "q" => index.repo_id(value).is_some() || root_item(index, value).is_some(),
            _ => false,
        }
    })
}

/// The root a hex event id names, if the index knows it.
fn root_item(index: &RepoIndex, hex: &str) -> Option<Item> {
    let id = EventId::from_hex(hex).ok()?;
    index.root_id(&id).map(Item::Root)
}

/// The next value cap below a refused filter's `asked` values (its current
/// cap if the filter is gone, `step_below`): straight to 10 from above
/// it, the cap of eventstore's SQL backends (the commonest that refuses),
/// halving below.
fn fewer_values(asked: usize, current: usize) -> usize {
    const KNOWN_VALUE_CAPS: [usize; 1] = [10];
    let asked = if asked == 0 { current } else { asked };
    step_below(&KNOWN_VALUE_CAPS, asked)
}

/// Filters per REQ relays are known to refuse past, below our 100:
/// rust-nostr's relay builder's 20 and nostream's 10 (nostream states
/// it, but a proxy may hide the document).
const KNOWN_FILTER_LIMITS: [usize; 2] = [20, 10];

/// The filter limit to try after a REQ of `asked` filters was refused
/// (`step_below`): halving from 100 took four refusals to get below
/// nostream's 10.
fn fewer_filters(asked: usize) -> usize {
    step_below(&KNOWN_FILTER_LIMITS, asked)
}

/// The longest value list of a filter: tag values, ids or authors.
fn values_in(filter: &Filter) -> usize {
    let tags = filter.generic_tags.values().map(|v| v.len()).max();
    let ids = filter.ids.as_ref().map(|v| v.len());
    let authors = filter.authors.as_ref().map(|v| v.len());
    [tags, ids, authors]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0)
}

fn kinds_in(filter: &Filter) -> usize {
    filter.kinds.as_ref().map_or(0, |k| k.len())
}

/// Per filter of `sub`, what a value or kind refusal counts (nothing for
/// other refusals).
fn counted(refusal: Refusal, sub: &Subscription) -> impl Iterator<Item = usize> + '_ {
    let count: Option<fn(&Filter) -> usize> = match refusal {
        Refusal::TooManyValues => Some(values_in),
        Refusal::TooManyKinds => Some(kinds_in),
        _ => None,
    };
    sub.filters.iter().filter_map(move |f| count.map(|c| c(f)))
}

/// What a page's end leaves the engine to do (`RelayState::end_page`).
struct PageEnd {
    /// The chunks of a chain that ended, to complete.
    done: Option<Vec<WorkRef>>,
    /// Seconds the page found that may be saturated (`saturated`).
    unsure: Vec<Saturated>,
}

/// What becomes of a remote event that matched its subscription.
enum Verdict {
    /// Verify, de-duplicate, pass to the sink.
    Wanted,
    /// Not for this relay to deliver (or not acceptable): drop unmarked.
    Unwanted,
    /// An announcement dropping the service: verify, then un-index its repo.
    Withdrawal,
}

/// The subscription id and event id of an `["EVENT","<sub>",{..."id":"<hex>"...}]`
/// message, read without parsing it; `None` when it does not look like one.
fn peek_event(text: &str) -> Option<(&str, EventId)> {
    let rest = text.strip_prefix("[\"EVENT\",\"")?;
    let (sub, rest) = rest.split_once('"')?;
    let at = rest.find("\"id\":\"")? + 6;
    let hex = rest.get(at..at + 64)?;
    Some((sub, EventId::from_hex(hex).ok()?))
}

/// Our subscription ids are lower-case hex counters; anything else is not ours.
fn sub_key(id: &str) -> Option<u64> {
    if id.is_empty()
        || id.len() > 16
        || !id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    u64::from_str_radix(id, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_filter_count_steps_to_the_known_limits_then_halves() {
        assert_eq!(fewer_filters(100), 20);
        assert_eq!(fewer_filters(44), 20);
        assert_eq!(fewer_filters(20), 10);
        assert_eq!(fewer_filters(15), 10);
        assert_eq!(fewer_filters(10), 5);
        assert_eq!(fewer_filters(1), 1, "never below one");
    }

    #[test]
    fn peek_reads_sub_and_event_id_or_declines() {
        let id = "ab".repeat(32);
        let msg = format!(
            r#"["EVENT","1f",{{"content":"say \"id\":\"{}\"","id":"{id}","kind":1}}]"#,
            "cd".repeat(32)
        );
        let (sub, got) = peek_event(&msg).unwrap();
        assert_eq!(sub, "1f");
        assert_eq!(
            got.to_hex(),
            id,
            "the escaped id inside content is not taken"
        );
        assert!(
            peek_event(r#"[ "EVENT", "1", {"id":"x"}]"#).is_none(),
            "other spellings take the full path"
        );
        assert!(peek_event(r#"["EVENT","1",{"id":"short"}]"#).is_none());
        assert!(peek_event(r#"["EOSE","1"]"#).is_none());
        assert!(peek_event("").is_none());
    }
}
