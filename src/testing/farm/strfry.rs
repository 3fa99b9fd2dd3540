//! The relay farm's strfry relays (see [`RelayProfile::strfry`]): what a
//! relay answers when it behaves like strfry f8a56a8, whose limits and
//! texts differ from the farm's rust-nostr-like default everywhere a
//! client can notice.
//!
//! - Every `CLOSED` and `NOTICE` starts with `ERROR: ` (strfry's
//!   `sendClosedError`, `sendNoticeError`); `OK` and `NEG-ERR` texts do
//!   not.
//! - A `REQ` is read as strfry reads it (`strfry_req`): one bad filter
//!   refuses the whole `REQ` with `CLOSED "ERROR: bad req: ..."`. Its
//!   filters are answered one after another, each its newest
//!   `min(limit, max_limit)` matches; an event two filters match is sent
//!   once but counts toward both limits (`DBQuery::process`).
//! - Subscriptions are counted three ways, each against
//!   `max_subscriptions`: REQs still scanning, live REQs, NIP-77 sessions.
//!   The farm answers a `REQ` at once, so a REQ counts as *scanning* while
//!   its stored answer waits in the connection's queue (its EOSE not yet
//!   handed to the socket): behind a slow reader, or a large answer queued
//!   before it. That stands in for strfry's timesliced scans, which a slow
//!   query holds open the same way. A new REQ is refused while as many
//!   scan (`QueryScheduler::addSub`); a REQ going live at its EOSE is
//!   refused while as many are live (`ActiveMonitors::addSub`: the client
//!   has its stored events and EOSE, then the `NOTICE`, and no live
//!   events); a `NEG-OPEN` while as many sessions are open. A refusal is a
//!   `NOTICE` naming no subscription. An id in use does not count against
//!   its own kind: a REQ reusing a scanning REQ's id (or a `CLOSE` of it)
//!   ends that scan (no more of its events, no EOSE), a REQ going live
//!   replaces the live one of that id, a `NEG-OPEN` the session. A REQ
//!   reusing a live REQ's id is still refused while as many others scan.
//! - NIP-77 is on (unless the profile's `no_negentropy`), through the
//!   farm's responder (`neg`) with strfry's frame size, limits and texts;
//!   a filter matching more than `max_sync_events` is refused with
//!   strfry's four-element `NEG-ERR`.
//! - `EVENT`s are checked as strfry checks them (`strfry_event`), against
//!   the farm's clock (the wall clock, as for NIP-42 AUTH).
//! - `COUNT` (NIP-45) is answered; strfry lists it in NIP-11.
//!
//! Not modelled: strfry's order of equal `created_at` (newest stored first;
//! the farm's store orders them by id), events reaching a REQ replaced
//! while scanning through the replaced filters, read-restricted kinds
//! (4, 1059: strfry without a `serviceUrl` serves them to no one), and
//! `#e`/`#p` matching by bytes (strfry matches upper-case hex too).

use std::collections::HashSet;

use serde_json::{Value, json};

use super::super::limits::{STRFRY_TOO_MANY_NEGS, STRFRY_TOO_MANY_REQS, StrfryLimits};
use super::super::store::EventKey;
use super::neg::{NegFailure, neg_msg};
use super::strfry_req::{ReqShape, check_filter, check_req, check_sub_id, command, from_hex};
use super::*;

/// The reason strfry gives a read that needs NIP-42 AUTH (after `ERROR: `
/// in a `CLOSED`, bare in a `NEG-ERR`).
const AUTH_TEXT: &str = "auth-required: requested filter requires authentication";

/// What a connection to a strfry relay keeps beyond [`Conn`]'s own.
pub(super) struct StrfryConn {
    pub(super) limits: StrfryLimits,
    /// REQs whose stored answer is queued and whose EOSE has not gone out
    /// (strfry's scanning REQs, see the module doc). Each is in
    /// [`Conn::subs`] too; the others there are live.
    pub(super) scanning: HashSet<SubscriptionId>,
}

impl StrfryConn {
    pub(super) fn new(limits: StrfryLimits) -> StrfryConn {
        StrfryConn {
            limits,
            scanning: HashSet::new(),
        }
    }
}

impl Conn {
    /// Ends the scan of REQ `sub`, if it scans: its queued answer goes (no
    /// more events, no EOSE) and it is not opened. strfry does this when
    /// the id comes again or is closed.
    pub(super) fn drop_scan(&mut self, sub: &SubscriptionId) {
        let Some(strfry) = self.strfry.as_mut() else {
            return;
        };
        if strfry.scanning.remove(sub) {
            self.out
                .retain(|o| !matches!(o, Out::Stored { sub: s, .. } if s == sub));
            self.subs.remove(sub);
        }
    }

    /// REQ `sub`'s EOSE went out: it stops scanning and goes live, unless
    /// as many other REQs are live as allowed; then it is dropped and the
    /// `NOTICE` to send next is returned.
    pub(super) fn finish_scan(&mut self, sub: &SubscriptionId) -> Option<String> {
        let strfry = self.strfry.as_mut()?;
        if !strfry.scanning.remove(sub) {
            return None;
        }
        let live = self
            .subs
            .keys()
            .filter(|s| *s != sub && !strfry.scanning.contains(*s))
            .count();
        if live < strfry.limits.max_subscriptions {
            return None;
        }
        self.subs.remove(sub);
        Some(json!(["NOTICE", STRFRY_TOO_MANY_REQS]).to_string())
    }

    /// True if as many REQs scan as strfry allows.
    fn scanning_full(&self) -> bool {
        self.strfry
            .as_ref()
            .is_some_and(|s| s.scanning.len() >= s.limits.max_subscriptions)
    }
}

/// A REQ's stored answer as strfry gives it: each filter in turn, its
/// newest `min(limit, max_limit)` matches (no `limit` is `max_limit`),
/// an event already sent for an earlier filter not sent again but counted
/// toward this filter's limit. Also returns how many filters the clamp cut
/// short (they matched more than `max_limit` and asked for more).
fn answer(store: &Store, filters: &[Filter], max_limit: usize) -> (Vec<EventKey>, u64) {
    let mut sent = HashSet::new();
    let mut keys = Vec::new();
    let mut cut = 0;
    for filter in filters {
        let asked = filter.limit.unwrap_or(usize::MAX);
        let take = asked.min(max_limit);
        if take == 0 {
            continue;
        }
        // One more than the clamp, to tell whether it cut.
        let probe = Filter {
            limit: Some(take.saturating_add(usize::from(asked > take))),
            ..filter.clone()
        };
        let mut hits = store.query_keys(std::slice::from_ref(&probe), usize::MAX);
        if hits.len() > take {
            cut += 1;
            hits.truncate(take);
        }
        keys.extend(hits.into_iter().filter(|k| sent.insert(*k)));
    }
    (keys, cut)
}

impl Farm {
    /// The strfry limits of connection `key`'s relay, if it is a strfry
    /// relay.
    pub(super) fn strfry(&self, key: usize) -> Option<StrfryLimits> {
        self.conns.get(key)?.strfry.as_ref().map(|s| s.limits)
    }

    /// Answers one message from a client of a strfry relay.
    pub(super) fn on_strfry_text(&mut self, key: usize, text: &str, limits: StrfryLimits) {
        let elements = match command(text) {
            Ok(Some(elements)) => elements,
            Ok(None) => return,
            Err(e) => return self.strfry_notice(key, &format!("bad msg: {e}")),
        };
        // `command` checked that the first element is a string.
        let name = elements[0].as_str().unwrap_or_default();
        match name {
            "EVENT" => self.on_strfry_event(key, &elements[1], &limits),
            "REQ" => self.on_strfry_req(key, &elements, &limits),
            "COUNT" => self.on_strfry_count(key, &elements, &limits),
            "CLOSE" => self.on_strfry_close(key, &elements),
            "AUTH" => match serde_json::from_value::<Event>(elements[1].clone()) {
                Ok(event) => self.on_auth(key, &event),
                Err(e) => self.strfry_ok(key, &elements[1], false, &format!("error: {e}")),
            },
            "NEG-OPEN" | "NEG-MSG" | "NEG-CLOSE" if !self.strfry_speaks_nip77(key) => {
                self.strfry_notice(key, "bad msg: negentropy disabled")
            }
            "NEG-OPEN" | "NEG-MSG" | "NEG-CLOSE" => {
                let done = match name {
                    "NEG-OPEN" => self.on_strfry_neg_open(key, &elements, &limits),
                    "NEG-MSG" => self.on_strfry_neg_msg(key, &elements),
                    _ => self.on_strfry_neg_close(key, &elements),
                };
                if let Err(e) = done {
                    self.strfry_notice(key, &format!("negentropy error: {e}"));
                }
            }
            _ => self.strfry_notice(key, "bad msg: unknown cmd"),
        }
    }

    /// `["NOTICE", "ERROR: <text>"]`.
    fn strfry_notice(&mut self, key: usize, text: &str) {
        self.reply(key, &RelayMessage::notice(format!("ERROR: {text}")));
    }

    /// `["OK", <the event's id, or "?">, ok, message]`, raw: the id may be
    /// no event id at all.
    fn strfry_ok(&mut self, key: usize, event: &Value, ok: bool, message: &str) {
        let id = event.get("id").and_then(Value::as_str).unwrap_or("?");
        self.reply_text(key, json!(["OK", id, ok, message]).to_string());
    }

    /// True unless the profile turned NIP-77 off (strfry's
    /// `relay.negentropy.enabled`); the farm-wide option does not matter.
    fn strfry_speaks_nip77(&self, key: usize) -> bool {
        self.conns
            .get(key)
            .is_some_and(|c| !self.relays[c.relay].profile.no_negentropy)
    }

    /// True if connection `key` must AUTH before reading.
    fn needs_auth(&self, key: usize) -> bool {
        self.conns
            .get(key)
            .is_some_and(|c| c.challenge.is_some() && !c.authed)
    }

    /// strfry's `EVENT`: checked (see `strfry_event`), stored, delivered,
    /// acknowledged with strfry's `OK` texts.
    fn on_strfry_event(&mut self, key: usize, raw: &Value, limits: &StrfryLimits) {
        self.counters
            .events_received
            .fetch_add(1, Ordering::Relaxed);
        let event = match serde_json::from_value::<Event>(raw.clone()) {
            Ok(event) => event,
            Err(e) => return self.strfry_ok(key, raw, false, &format!("invalid: {e}")),
        };
        if let Some(why) = strfry_event::refusal(&event, limits, Timestamp::now()) {
            return self.strfry_ok(key, raw, false, &format!("invalid: {why}"));
        }
        let Some(relay) = self.conns.get(key).map(|c| c.relay) else {
            return;
        };
        let stored = self.store_and_deliver(relay, &event);
        let (ok, message) = match stored {
            Stored::New | Stored::Ephemeral => (true, ""),
            Stored::Duplicate => (true, "duplicate: have this event"),
            Stored::Stale => (false, "replaced: have newer event"),
        };
        self.reply(key, &RelayMessage::ok(event.id, ok, message));
    }

    /// strfry's `REQ`: checked, then counted as scanning and answered (see
    /// the module doc).
    fn on_strfry_req(&mut self, key: usize, elements: &[Value], limits: &StrfryLimits) {
        self.counters.reqs.fetch_add(1, Ordering::Relaxed);
        let Some((sub, filters)) = self.strfry_read(key, elements, limits) else {
            return;
        };
        if !self.strfry_begin_scan(key, &sub) {
            return;
        }
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let (keys, cut) = answer(&self.relays[conn.relay].store, &filters, limits.max_limit);
        self.counters
            .capped_filters
            .fetch_add(cut, Ordering::Relaxed);
        conn.out.push_back(Out::Stored {
            sub: sub.clone(),
            keys: keys.into_iter(),
        });
        if let Some(strfry) = conn.strfry.as_mut() {
            strfry.scanning.insert(sub.clone());
        }
        conn.subs.insert(sub, filters);
    }

    /// strfry's NIP-45 `COUNT`: read like a `REQ`, counted as scanning
    /// while it counts (not at all, in the farm), answered with the number
    /// of distinct events its filters match (each up to
    /// `relay.maxFilterLimitCount`, 1,000,000, past which it says
    /// `limited`).
    fn on_strfry_count(&mut self, key: usize, elements: &[Value], limits: &StrfryLimits) {
        /// strfry's `relay.maxFilterLimitCount`.
        const MAX_COUNT: usize = 1_000_000;
        let Some((sub, filters)) = self.strfry_read(key, elements, limits) else {
            return;
        };
        if !self.strfry_begin_scan(key, &sub) {
            return;
        }
        let Some(relay) = self.conns.get(key).map(|c| c.relay) else {
            return;
        };
        let (keys, _) = answer(&self.relays[relay].store, &filters, MAX_COUNT + 1);
        let body = match keys.len() {
            n if n > MAX_COUNT => json!({"count": MAX_COUNT, "limited": true}),
            n => json!({ "count": n }),
        };
        self.reply_text(key, json!(["COUNT", sub.as_str(), body]).to_string());
    }

    /// Reads a `REQ` or `COUNT` as strfry does, refusing it (`CLOSED`, or
    /// a `NOTICE` before the id is known) with strfry's text: its
    /// subscription and the filters that can match, or `None` when
    /// refused.
    fn strfry_read(
        &mut self,
        key: usize,
        elements: &[Value],
        limits: &StrfryLimits,
    ) -> Option<(SubscriptionId, Vec<Filter>)> {
        let shape = match check_req(elements, limits.max_filters, limits.max_tags_per_filter) {
            Ok(shape) => shape,
            Err(refusal) => {
                self.strfry_refuse(key, refusal.sub.as_deref(), &refusal.reason);
                return None;
            }
        };
        if self.needs_auth(key) {
            self.counters.auth_refusals.fetch_add(1, Ordering::Relaxed);
            let reason = format!("ERROR: {AUTH_TEXT}");
            self.reply(
                key,
                &RelayMessage::closed(SubscriptionId::new(&shape.sub), reason),
            );
            return None;
        }
        if let Err(e) = check_sub_id(&shape.sub) {
            self.strfry_refuse(key, Some(&shape.sub), e);
            return None;
        }
        match nostr_filters(&shape, &elements[2..]) {
            Ok(filters) => Some((SubscriptionId::new(shape.sub), filters)),
            Err(e) => {
                self.strfry_refuse(key, Some(&shape.sub), &e);
                None
            }
        }
    }

    /// `CLOSED "ERROR: bad req: <reason>"` naming `sub`, or the same as a
    /// `NOTICE` when strfry has no id to name (none read, or an empty one).
    fn strfry_refuse(&mut self, key: usize, sub: Option<&str>, reason: &str) {
        let text = format!("ERROR: bad req: {reason}");
        let msg = match sub.filter(|s| !s.is_empty()) {
            Some(sub) => RelayMessage::closed(SubscriptionId::new(sub), text),
            None => RelayMessage::notice(text),
        };
        self.reply(key, &msg);
    }

    /// Makes room for a scan of `sub` as strfry's `QueryScheduler::addSub`
    /// does: a scan with the same id ends; if as many still scan as
    /// allowed, the `NOTICE` is sent and false returned.
    fn strfry_begin_scan(&mut self, key: usize, sub: &SubscriptionId) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        conn.drop_scan(sub);
        if conn.scanning_full() {
            self.reply(key, &RelayMessage::notice(STRFRY_TOO_MANY_REQS));
            return false;
        }
        true
    }

    /// strfry's `CLOSE`: exactly an id; ends its scan or its live
    /// subscription.
    fn on_strfry_close(&mut self, key: usize, elements: &[Value]) {
        if elements.len() != 2 {
            return self.strfry_notice(key, "bad close: arr too small/big");
        }
        let Some(sub) = elements[1].as_str() else {
            return self.strfry_notice(key, "bad close: CLOSE subscription id was not a string");
        };
        if let Err(e) = check_sub_id(sub) {
            return self.strfry_notice(key, &format!("bad close: {e}"));
        }
        let sub = SubscriptionId::new(sub);
        if let Some(conn) = self.conns.get_mut(key) {
            conn.drop_scan(&sub);
            conn.subs.remove(&sub);
        }
    }

    /// strfry's `NEG-OPEN`, read in its order; `Err` is the text of the
    /// `NOTICE "ERROR: negentropy error: ..."`.
    fn on_strfry_neg_open(
        &mut self,
        key: usize,
        elements: &[Value],
        limits: &StrfryLimits,
    ) -> Result<(), String> {
        let sub = neg_sub(elements)?;
        if elements.len() < 4 {
            return Err("negentropy query missing elements".to_owned());
        }
        if !elements[2].is_object() {
            return Err("negentropy filter must be an object".to_owned());
        }
        let matches = check_filter(&elements[2], limits.max_tags_per_filter)?;
        if self.needs_auth(key) {
            self.counters.auth_refusals.fetch_add(1, Ordering::Relaxed);
            self.neg_reply(key, &neg_err(SubscriptionId::new(sub), AUTH_TEXT));
            return Ok(());
        }
        check_sub_id(sub)?;
        let frame = neg_payload(&elements[3])?;
        let filter =
            serde_json::from_value::<Filter>(elements[2].clone()).map_err(|e| e.to_string())?;
        let sub = SubscriptionId::new(sub);
        self.strfry_neg_start(key, sub, matches.then_some(filter), &frame, limits);
        Ok(())
    }

    /// Opens a strfry session over what `filter` matches (`None`: nothing)
    /// and answers its first frame, or refuses it: too many sessions (a
    /// `NOTICE`), too many events (strfry's `NEG-ERR` with the limit as a
    /// fourth element), a frame negentropy refuses (`PROTOCOL-ERROR`).
    fn strfry_neg_start(
        &mut self,
        key: usize,
        sub: SubscriptionId,
        filter: Option<Filter>,
        frame: &[u8],
        limits: &StrfryLimits,
    ) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.negs.close(&sub);
        if !conn.negs.has_room(&sub) {
            return self.reply(key, &RelayMessage::notice(STRFRY_TOO_MANY_NEGS));
        }
        let store = &self.relays[conn.relay].store;
        let items: Vec<(Timestamp, EventId)> = filter.map_or_else(Vec::new, |f| {
            // strfry clamps the filter's limit to one past the maximum.
            let cap = limits.max_sync_events.saturating_add(1);
            let probe = Filter {
                limit: Some(f.limit.unwrap_or(usize::MAX).min(cap)),
                ..f
            };
            store
                .query_keys(std::slice::from_ref(&probe), usize::MAX)
                .into_iter()
                .filter_map(|k| store.get_by_key(&k))
                .map(|e| (e.created_at, e.id))
                .collect()
        });
        if items.len() > limits.max_sync_events {
            self.counters.neg_errors.fetch_add(1, Ordering::Relaxed);
            let too_many = "blocked: too many query results";
            let text = json!(["NEG-ERR", sub.as_str(), too_many, limits.max_sync_events]);
            return self.reply_text(key, text.to_string());
        }
        let reply = match conn.negs.start(sub.clone(), items, frame) {
            Ok(reply) => {
                self.counters.neg_sessions.fetch_add(1, Ordering::Relaxed);
                neg_msg(sub, &reply)
            }
            Err(_) => neg_err(sub, "PROTOCOL-ERROR"),
        };
        self.neg_reply(key, &reply);
    }

    /// strfry's `NEG-MSG`: the next round, or `NEG-ERR` for an unknown
    /// session or a refused frame.
    fn on_strfry_neg_msg(&mut self, key: usize, elements: &[Value]) -> Result<(), String> {
        let sub = neg_sub(elements)?;
        if elements.len() < 3 {
            return Err("negentropy message missing elements".to_owned());
        }
        let frame = neg_payload(&elements[2])?;
        check_sub_id(sub)?;
        let sub = SubscriptionId::new(sub);
        let Some(conn) = self.conns.get_mut(key) else {
            return Ok(());
        };
        let reply = match conn.negs.reconcile(&sub, &frame) {
            Ok(reply) => {
                self.counters.neg_rounds.fetch_add(1, Ordering::Relaxed);
                neg_msg(sub, &reply)
            }
            Err(NegFailure::Unknown) => neg_err(sub, "closed: unknown subscription handle"),
            Err(_) => neg_err(sub, "PROTOCOL-ERROR"),
        };
        self.neg_reply(key, &reply);
        Ok(())
    }

    /// strfry's `NEG-CLOSE`: forgets the session.
    fn on_strfry_neg_close(&mut self, key: usize, elements: &[Value]) -> Result<(), String> {
        let sub = neg_sub(elements)?;
        check_sub_id(sub)?;
        if let Some(conn) = self.conns.get_mut(key) {
            conn.negs.close(&SubscriptionId::new(sub));
        }
        Ok(())
    }
}

/// The nostr filters of a `REQ` strfry took (`filters` are its filter
/// elements), without those that match nothing. `Err` if nostr cannot
/// read one strfry takes (e.g. a kind over 65,535): the farm refuses that
/// `REQ`, strfry would not.
fn nostr_filters(shape: &ReqShape, filters: &[Value]) -> Result<Vec<Filter>, String> {
    filters
        .iter()
        .zip(&shape.matches)
        .filter(|(f, matches)| **matches && !non_letter_tag(f))
        .map(|(f, _)| serde_json::from_value::<Filter>(f.clone()).map_err(|e| e.to_string()))
        .collect()
}

/// True for a filter on a tag that is no ASCII letter (`#1`): strfry takes
/// it, but nostr's `Filter` drops the condition (it would match
/// everything) and the farm's store indexes letters only, so the farm
/// matches nothing.
fn non_letter_tag(filter: &Value) -> bool {
    filter.as_object().is_some_and(|fields| {
        fields.keys().any(|k| {
            k.strip_prefix('#')
                .is_some_and(|t| t.len() == 1 && !t.as_bytes()[0].is_ascii_alphabetic())
        })
    })
}

/// A NEG message's subscription id, which strfry reads first.
fn neg_sub(elements: &[Value]) -> Result<&str, String> {
    elements[1]
        .as_str()
        .ok_or_else(|| "NEG subscription id was not a string".to_owned())
}

/// A NEG message's payload: hex, an odd number of digits padded (strfry
/// calls `from_hex` without `allowUnevenSize = false` there).
fn neg_payload(payload: &Value) -> Result<Vec<u8>, String> {
    let hex = payload
        .as_str()
        .ok_or_else(|| "negentropy payload not a string".to_owned())?;
    from_hex(hex, true)
}
