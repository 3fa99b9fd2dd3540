//! The relay farm's side of the nostr protocol: what a relay answers to
//! EVENT, REQ, CLOSE, AUTH and NEG-* messages, and live delivery of what
//! it stores to its subscribers. A strfry relay answers its own way
//! (`strfry`), sharing AUTH and live delivery. The farm's loop (`farm.rs`)
//! moves the bytes; this is what they mean.

use super::*;

impl Farm {
    /// Answers one text message (a strfry relay its own way, see `strfry`).
    pub(super) fn on_text(&mut self, key: usize, text: &str) {
        if let Some(limits) = self.strfry(key) {
            return self.on_strfry_text(key, text, limits);
        }
        match ClientMessage::from_json(text) {
            Ok(ClientMessage::Event(event)) => self.on_event(key, event.into_owned()),
            Ok(ClientMessage::Req {
                subscription_id,
                filters,
            }) => self.on_req(
                key,
                subscription_id.into_owned(),
                filters.into_iter().map(|f| f.into_owned()).collect(),
            ),
            Ok(ClientMessage::Close(id)) => {
                if let Some(conn) = self.conns.get_mut(key) {
                    conn.subs.remove(&*id);
                }
            }
            Ok(ClientMessage::Auth(event)) => self.on_auth(key, &event),
            Ok(ClientMessage::NegOpen {
                subscription_id,
                filter,
                initial_message,
            }) if self.speaks_nip77(key) => {
                self.on_neg_open(key, subscription_id.into_owned(), &filter, &initial_message)
            }
            Ok(ClientMessage::NegMsg {
                subscription_id,
                message,
            }) if self.speaks_nip77(key) => {
                self.on_neg_msg(key, subscription_id.into_owned(), &message)
            }
            Ok(ClientMessage::NegClose { subscription_id }) if self.speaks_nip77(key) => {
                if let Some(conn) = self.conns.get_mut(key) {
                    conn.negs.close(&subscription_id);
                }
            }
            Ok(_) => self.reply(key, &RelayMessage::notice("error: unsupported message")),
            Err(_) => self.reply(key, &RelayMessage::notice(PARSE_ERROR)),
        }
    }

    /// Answers one binary message: a parse error, but strfry reads it as it
    /// reads text (uWebSockets hands it either kind).
    pub(super) fn on_binary(&mut self, key: usize, bytes: &[u8]) {
        match self.strfry(key) {
            Some(limits) => self.on_strfry_text(key, &String::from_utf8_lossy(bytes), limits),
            None => self.reply(key, &RelayMessage::notice(PARSE_ERROR)),
        }
    }

    /// True if the relay of connection `key` answers NIP-77.
    pub(super) fn speaks_nip77(&self, key: usize) -> bool {
        self.negentropy
            && self
                .conns
                .get(key)
                .is_some_and(|c| !self.relays[c.relay].profile.no_negentropy)
    }

    pub(super) fn on_event(&mut self, key: usize, event: Event) {
        self.counters
            .events_received
            .fetch_add(1, Ordering::Relaxed);
        let id = event.id;
        if event.verify().is_err() {
            self.reply(key, &RelayMessage::ok(id, false, "invalid: bad signature"));
            return;
        }
        let Some(relay) = self.conns.get(key).map(|c| c.relay) else {
            return;
        };
        if self.relays[relay]
            .profile
            .max_event_bytes
            .is_some_and(|max| event.as_json().len() > max)
        {
            self.counters
                .events_too_large
                .fetch_add(1, Ordering::Relaxed);
            self.reply(key, &RelayMessage::notice("error: event exceeded max size"));
            return;
        }
        // Live deliveries first, as TestRelay queues them: a client
        // subscribed to its own event sees it before the OK.
        let stored = self.store_and_deliver(relay, &event);
        let reply = match stored {
            Stored::New | Stored::Ephemeral => RelayMessage::ok(id, true, ""),
            Stored::Duplicate => RelayMessage::ok(id, true, "duplicate: already have it"),
            Stored::Stale => RelayMessage::ok(id, true, "duplicate: have a newer version"),
        };
        self.reply(key, &reply);
    }

    pub(super) fn on_req(&mut self, key: usize, sub: SubscriptionId, filters: Vec<Filter>) {
        self.counters.reqs.fetch_add(1, Ordering::Relaxed);
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if conn.challenge.is_some() && !conn.authed {
            self.counters.auth_refusals.fetch_add(1, Ordering::Relaxed);
            self.reply(key, &RelayMessage::closed(sub, AUTH_REQUIRED));
            return;
        }
        if let Some((max, refuse)) = self.max_subscriptions
            && !conn.subs.contains_key(&sub)
            && conn.subs.len() >= max
        {
            let refusal = match refuse {
                Refuse::Closed => RelayMessage::closed(sub, TOO_MANY_REQS),
                Refuse::Notice => RelayMessage::notice(MAX_SUBS_NOTICE),
            };
            self.reply(key, &refusal);
            return;
        }
        let relay = &self.relays[conn.relay];
        // eventstore's value caps: a refused filter is queried for nothing.
        let mut queried = Vec::with_capacity(filters.len());
        let mut notices = Vec::new();
        for filter in &filters {
            match relay
                .profile
                .value_caps
                .and_then(|caps| Some((caps, caps.check(filter)?)))
            {
                None => queried.push(filter.clone()),
                Some((caps, error)) => {
                    self.counters.value_refusals.fetch_add(1, Ordering::Relaxed);
                    match caps.refusal {
                        ValueCapRefusal::Notice => notices.push(error),
                        ValueCapRefusal::Closed => {
                            let reason = ValueCaps::closed_reason(error);
                            self.reply(key, &RelayMessage::closed(sub, reason));
                            return;
                        }
                    }
                }
            }
        }
        let per_filter = relay.profile.max_results_per_filter.unwrap_or(usize::MAX);
        if per_filter != usize::MAX {
            // Counted for the demo's report: how often the cap bit.
            let cut = queried
                .iter()
                .filter(|f| f.limit.is_none_or(|l| l > per_filter))
                .filter(|f| {
                    let wider = Filter {
                        limit: Some(per_filter + 1),
                        ..(*f).clone()
                    };
                    relay
                        .store
                        .query_keys(std::slice::from_ref(&wider), usize::MAX)
                        .len()
                        > per_filter
                })
                .count();
            self.counters
                .capped_filters
                .fetch_add(cut as u64, Ordering::Relaxed);
        }
        let keys = relay
            .store
            .query_keys_capped(&queried, per_filter, self.cap);
        for error in notices {
            conn.queue(&RelayMessage::notice(error));
        }
        conn.out.push_back(Out::Stored {
            sub: sub.clone(),
            keys: keys.into_iter(),
        });
        conn.subs.insert(sub, filters);
    }

    /// NIP-42 `AUTH`: `OK true` and reads served from now on, or `OK false`
    /// with the reason (see [`auth::check`]).
    pub(super) fn on_auth(&mut self, key: usize, event: &Event) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let port = self.relays[conn.relay].port;
        let verdict = auth::check(event, conn.challenge.as_deref(), port, Timestamp::now());
        let reply = match verdict {
            Ok(()) => {
                conn.authed = true;
                self.counters.auth_accepted.fetch_add(1, Ordering::Relaxed);
                RelayMessage::ok(event.id, true, "")
            }
            Err(reason) => {
                self.counters.auth_rejected.fetch_add(1, Ordering::Relaxed);
                RelayMessage::ok(event.id, false, reason)
            }
        };
        self.reply(key, &reply);
    }

    /// NIP-77 `NEG-OPEN`: reconcile against every stored event the filter
    /// matches (no result cap: the set is ids and timestamps, and the point
    /// is to compare all of it).
    pub(super) fn on_neg_open(
        &mut self,
        key: usize,
        sub: SubscriptionId,
        filter: &Filter,
        initial: &str,
    ) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let reply = if conn.challenge.is_some() && !conn.authed {
            // NIP-77 answers a refused NEG-OPEN with NEG-ERR; the reason is
            // the one a REQ gets.
            self.counters.auth_refusals.fetch_add(1, Ordering::Relaxed);
            neg_err(sub, AUTH_REQUIRED)
        } else {
            let store = &self.relays[conn.relay].store;
            let items = store
                .query_keys(std::slice::from_ref(filter), usize::MAX)
                .into_iter()
                .filter_map(|k| store.get_by_key(&k))
                .map(|e| (e.created_at, e.id));
            let reply = conn.negs.open(sub, items, initial);
            if matches!(reply, RelayMessage::NegMsg { .. }) {
                self.counters.neg_sessions.fetch_add(1, Ordering::Relaxed);
            }
            reply
        };
        self.neg_reply(key, &reply);
    }

    /// NIP-77 `NEG-MSG`: the next round of an open reconciliation.
    pub(super) fn on_neg_msg(&mut self, key: usize, sub: SubscriptionId, hex: &str) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let reply = conn.negs.message(sub, hex);
        if matches!(reply, RelayMessage::NegMsg { .. }) {
            self.counters.neg_rounds.fetch_add(1, Ordering::Relaxed);
        }
        self.neg_reply(key, &reply);
    }

    /// Queues a `NEG-MSG` or `NEG-ERR`, counting the errors.
    pub(super) fn neg_reply(&mut self, key: usize, reply: &RelayMessage<'_>) {
        if matches!(reply, RelayMessage::NegErr { .. }) {
            self.counters.neg_errors.fetch_add(1, Ordering::Relaxed);
        }
        self.reply(key, reply);
    }

    /// Stores `event` on `relay`, counts it if new, and delivers it live
    /// unless it was a duplicate.
    pub(super) fn store_and_deliver(&mut self, relay: usize, event: &Event) -> Stored {
        let stored = self.relays[relay].store.insert(event.clone());
        if stored == Stored::New {
            self.counters.events_stored.fetch_add(1, Ordering::Relaxed);
        }
        if matches!(stored, Stored::New | Stored::Ephemeral) {
            self.deliver(relay, event);
        }
        stored
    }

    /// Sends `event` to every matching subscription of a relay's
    /// connections.
    pub(super) fn deliver(&mut self, relay: usize, event: &Event) {
        let Some(r) = self.relays.get(relay) else {
            return;
        };
        let mut slow = Vec::new();
        let mut written = Vec::new();
        for &key in &r.conns {
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            let mut keep = true;
            let matching: Vec<SubscriptionId> = conn
                .subs
                .iter()
                .filter(|(_, filters)| {
                    filters
                        .iter()
                        .any(|f| f.match_event(event, MatchEventOptions::new()))
                })
                .map(|(id, _)| id.clone())
                .collect();
            for sub in &matching {
                keep &= conn.queue(&RelayMessage::Event {
                    subscription_id: Cow::Borrowed(sub),
                    event: Cow::Borrowed(event),
                });
            }
            if !keep {
                slow.push(key);
            } else if !matching.is_empty() {
                match conn.write(&r.store) {
                    Ok(()) => written.push(key),
                    Err(e) => {
                        log::debug!("relay farm: write failed: {e}");
                        slow.push(key);
                    }
                }
            }
        }
        for key in slow {
            self.close(key);
        }
        // Behind a link, what was written is held: come back for it.
        for key in written {
            self.arm(key);
        }
    }
}
