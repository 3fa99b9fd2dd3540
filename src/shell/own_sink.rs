//! The sink side of the loop: where synced events go and what the sink is
//! asked.
//!
//! A custom [`Sink`] is called directly (`custom_sink`: what it answered,
//! and the one event it handed back while full). The own relay is a websocket of
//! its own, in a `SlotKind::OwnSink` slot, driven by the sans-IO
//! `OwnRelayClient`: it says when to connect, what to send (outbox,
//! listings, AUTH) and whether the outbox has room; this file only carries
//! its texts and tells it what happened on the socket. `sink_has_room` is
//! the back-pressure: while it is false the loop stops reading remote
//! relays (their tokens wait in `deferred`) and `pump_sink` resumes them.
//! The client sets aside what the own relay cannot take, so the
//! back-pressure ends: a stuck connection is dropped here when the client
//! says so.

use log::{info, warn};
use mio::Token;
use nostr::prelude::{Event, EventId, Filter, Keys, Timestamp};

use crate::sans_io::memory::index::RelayId;
use crate::sans_io::own_relay::{ClientOutput, HeldBack, OwnRelayClient, Transmit};
use crate::sans_io::timing::time::Time;
use crate::sans_io::wire::relay_info::RelayInfo;
use crate::shell::Shell;
use crate::shell::connect::Transport;
use crate::shell::custom_sink::{CustomSink, Offered};
use crate::shell::metrics::SinkView;
use crate::shell::sink::{Listing, SinkTarget};
use crate::shell::slots::{Conn, InfoFor, SlotKind};

/// The own relay as the sink: its client, and the slot of its connection
/// while there is one.
pub(super) struct OwnSink {
    client: OwnRelayClient,
    slot: Option<Token>,
    /// Its NIP-11 document is still to be fetched (once, at start).
    info_wanted: bool,
}

/// The sink the shell was built with.
pub(super) enum SinkState {
    OwnRelay(Box<OwnSink>),
    Custom(Box<CustomSink>),
}

impl SinkState {
    /// The sink `target` names; the own relay's client (at `url`, signing
    /// AUTH with `auth_keys`) starts disconnected with an empty outbox, and
    /// its NIP-11 document is wanted if `relay_info` (the engine's setting
    /// for every relay).
    pub(super) fn new(
        target: SinkTarget,
        url: &str,
        auth_keys: Option<Keys>,
        outbox_capacity: usize,
        relay_info: bool,
        now: Time,
    ) -> SinkState {
        match target {
            SinkTarget::OwnRelay => SinkState::OwnRelay(Box::new(OwnSink {
                client: OwnRelayClient::new(url, auth_keys, outbox_capacity, now),
                slot: None,
                info_wanted: relay_info,
            })),
            SinkTarget::Custom(sink) => SinkState::Custom(Box::new(CustomSink::new(sink))),
        }
    }

    /// Offers first what the last run's outbox still held (the state
    /// file's), as received at `now`. The file is input: an event that
    /// does not verify is dropped, and counted in the log line.
    pub(super) fn restore_outbox(&mut self, events: Vec<Event>, now: Time) {
        let SinkState::OwnRelay(own) = self else {
            return;
        };
        let total = events.len();
        let mut taken = 0;
        for event in events.into_iter().filter(|e| e.verify().is_ok()) {
            own.client.push(event, now);
            taken += 1;
        }
        if total > 0 {
            info!("state file: {taken} of {total} events left in the last outbox offered first");
        }
    }
}

impl Shell {
    /// Gives back the room bursts left in the own relay client's queues.
    pub(super) fn sink_shrink_to_fit(&mut self) {
        if let SinkState::OwnRelay(own) = &mut self.sink {
            own.client.shrink_to_fit();
        }
    }

    /// Fetches the own relay's NIP-11 document, once, for the size limit
    /// it states: an event over it is then set aside instead of offered
    /// (nostr-rs-relay answers one with a `NOTICE` and no `OK`, strfry cuts
    /// the connection). The engine does not ask for it (the own relay's
    /// reads are the engine's, its writes are the sink's), and it is not
    /// counted with the remote relays' fetches; a failure only leaves the
    /// limit to be learned from the relay's refusals.
    pub(super) fn fetch_sink_info(&mut self, now: Time) {
        let SinkState::OwnRelay(own) = &mut self.sink else {
            return;
        };
        if !std::mem::take(&mut own.info_wanted) {
            return;
        }
        let url = own.client.url().to_owned();
        self.fetch_info_for(self.engine.own_relay(), &url, InfoFor::Sink, now);
    }

    /// The own relay's NIP-11 document arrived (`None`: it could not be had).
    pub(super) fn sink_info(&mut self, info: Option<RelayInfo>) {
        if let (SinkState::OwnRelay(own), Some(info)) = (&mut self.sink, info) {
            own.client.handle_relay_info(&info);
        }
    }

    pub(super) fn sink_has_room(&self) -> bool {
        match &self.sink {
            SinkState::OwnRelay(own) => own.client.has_room(),
            SinkState::Custom(custom) => custom.has_room(),
        }
    }

    /// When the sink wants to be called again: the own-relay client (a
    /// reconnect, the end of an outbox pause), a custom sink (its held
    /// event's retry).
    pub(super) fn sink_timeout(&self) -> Option<Time> {
        match &self.sink {
            SinkState::OwnRelay(own) => own.client.poll_timeout(),
            SinkState::Custom(custom) => custom.timeout(),
        }
    }

    /// Hands the sink `event` from `relay`, which the engine received at
    /// `received`.
    pub(super) fn deliver(&mut self, relay: RelayId, event: Event, received: Time, now: Time) {
        let custom = match &mut self.sink {
            SinkState::Custom(custom) => custom,
            SinkState::OwnRelay(own) => return own.client.push(event, received),
        };
        let url = self.engine.relay_url(relay);
        match custom.offer(now, relay, url, event, received) {
            Offered::Stored(index) => {
                self.stats.sink_stored += 1;
                // As the own relay's `OK true`: the index follows the store.
                if let Some(event) = index {
                    self.engine.handle_local_event(now, event);
                }
            }
            Offered::Full => {}
            Offered::Rejected(id) => self.engine.handle_sink_rejected(now, &id),
        }
    }

    /// The embedder says its sink has room again.
    pub(super) fn sink_ready(&mut self) {
        if let SinkState::Custom(custom) = &mut self.sink {
            custom.handle_ready();
        }
    }

    /// A custom sink's held event is offered again when due; deferred
    /// reads resume once it has room and the engine's backlog went first
    /// (`drive` delivers outputs before it pumps the sink, so room here
    /// means none are left): resuming on the held event alone read 64
    /// frames a relay for every event stored. True if anything moved.
    fn pump_custom(&mut self, now: Time) -> bool {
        let SinkState::Custom(custom) = &mut self.sink else {
            return false;
        };
        if let Some((relay, event, received)) = custom.take_due(now) {
            self.deliver(relay, event, received, now);
            return true;
        }
        if custom.has_room() && !self.deferred.is_empty() {
            self.resume_deferred(now);
            return true;
        }
        false
    }

    /// Reads the relays left unread while the sink was full, in token
    /// order; one the sink fills up on is deferred again.
    fn resume_deferred(&mut self, now: Time) {
        for token in std::mem::take(&mut self.deferred) {
            if let Some(relay) = self.slot_relay(token) {
                self.engine.handle_reads_resumed(now, relay);
            }
            self.on_slot_ready(token, now);
        }
    }

    /// Connects the own relay when its client asks, sends what the client
    /// has for the open connection, and resumes deferred reads once there
    /// is room. True if anything moved.
    pub(super) fn pump_sink(&mut self, now: Time) -> bool {
        let held_back = HeldBack {
            events: self.engine.outputs_waiting(),
            relays: self.deferred.len(),
        };
        let SinkState::OwnRelay(own) = &mut self.sink else {
            return self.pump_custom(now);
        };
        own.client.handle_held_back(held_back);
        if own.client.handle_timeout(now) {
            if let Some(token) = own.slot {
                self.slots.remove(token);
            }
            self.on_sink_closed("nothing in flight answered in time", now);
            return true;
        }
        if own.client.poll_rotate() {
            if let Some(token) = own.slot.take() {
                self.slots.remove(token);
            }
            own.client.handle_rotated(now);
        }
        if own.client.poll_connect(now) {
            let url = own.client.url().to_owned();
            self.connect_sink(&url, now);
            return true;
        }
        let (Some(token), true) = (own.slot, own.client.is_open()) else {
            return false;
        };
        let mut texts = Vec::new();
        while let Some(transmit) = own.client.poll_transmit(now) {
            if let Transmit::Publish(text) = &transmit {
                self.stats.bytes_out += text.len() as u64;
            }
            texts.push(transmit.into_text());
        }
        let has_room = own.client.has_room();
        let mut moved = !texts.is_empty();
        self.send_to_sink(token, texts, now);
        self.take_sink_outputs(now);
        if has_room && !self.deferred.is_empty() {
            self.resume_deferred(now);
            moved = true;
        }
        moved
    }

    /// Starts the own-relay connection the client asked for.
    fn connect_sink(&mut self, url: &str, now: Time) {
        let kind = |conn| SlotKind::OwnSink {
            conn,
            opened: false,
        };
        let started = self.start_conn(url, Transport::Ws, true, now, kind);
        let SinkState::OwnRelay(own) = &mut self.sink else {
            return;
        };
        match started {
            Ok(token) => own.slot = Some(token),
            Err(reason) => {
                warn!("own relay sink: {reason}");
                own.client.handle_connect_error(now);
            }
        }
    }

    /// Sends texts on the own-relay connection.
    fn send_to_sink(&mut self, token: Token, texts: Vec<String>, now: Time) {
        if texts.is_empty() {
            return;
        }
        let mut out = std::mem::take(&mut self.scratch);
        if let Some(SlotKind::OwnSink {
            conn: Conn::Ws(ws), ..
        }) = self.slots.get_mut(token).map(|s| &mut s.kind)
        {
            ws.send_texts(texts, &mut out);
        }
        self.handle_ws_events(token, &mut out, now);
        self.scratch = out;
    }

    /// Asks the sink what it holds for `filter` (negentropy). A custom sink
    /// answers at once or later (`sink_listed`); the own relay is asked by
    /// its client.
    pub(super) fn list_sink(&mut self, request: u64, filter: Filter, now: Time) {
        match &mut self.sink {
            SinkState::Custom(custom) => match custom.list(request, &filter) {
                Listing::Now(held) => self.sink_listed(request, held, now),
                Listing::Later => {}
                Listing::Failed => self.engine.handle_local_unlisted(now, request),
            },
            SinkState::OwnRelay(own) => {
                own.client.handle_list(request, filter);
                // Not asked while the own relay is down: the engine hears so.
                self.take_sink_outputs(now);
            }
        }
    }

    /// A custom sink's answer to listing `request`.
    pub(super) fn sink_listed(
        &mut self,
        request: u64,
        held: Option<Vec<(EventId, Timestamp)>>,
        now: Time,
    ) {
        if let Some(held) = &held {
            self.stats.sink_listed += held.len() as u64;
        }
        self.engine.handle_local_list(now, request, held);
    }

    /// A text from the own relay: its client reads it, and the engine
    /// learns what came of it (what the relay took, what it listed). What
    /// the client answers goes out on the next `pump_sink`.
    pub(super) fn on_sink_message(&mut self, text: &str, now: Time) {
        let SinkState::OwnRelay(own) = &mut self.sink else {
            return;
        };
        own.client.handle_message(now, text);
        self.take_sink_outputs(now);
    }

    /// Tells the engine what came of the client's work: what the own relay
    /// took, listed, or refused for good.
    fn take_sink_outputs(&mut self, now: Time) {
        let SinkState::OwnRelay(own) = &mut self.sink else {
            return;
        };
        while let Some(output) = own.client.poll_output() {
            match output {
                ClientOutput::Stored(event) => self.engine.handle_local_event(now, event),
                ClientOutput::Listed { request, listed } => {
                    self.stats.sink_listed += listed.len() as u64;
                    self.engine.handle_local_list(now, request, Some(listed));
                }
                ClientOutput::Unlisted(request) => self.engine.handle_local_unlisted(now, request),
                ClientOutput::RefusedForGood(id) => self.engine.handle_refused_for_good(id),
            }
        }
    }

    /// When the oldest event the sink has not confirmed was received, for
    /// the state file: it claims nothing past it.
    pub(super) fn sink_unsettled(&self) -> Option<Time> {
        match &self.sink {
            SinkState::OwnRelay(own) => own.client.unsettled(),
            SinkState::Custom(custom) => custom.unsettled(),
        }
    }

    /// What the own relay has not taken yet, in order, for the state file.
    pub(super) fn sink_leftovers(&mut self, now: Time) -> Vec<Event> {
        // Refusals found while sending are the engine's before it saves.
        self.take_sink_outputs(now);
        match &self.sink {
            SinkState::OwnRelay(own) => own.client.leftovers(),
            SinkState::Custom(_) => Vec::new(),
        }
    }

    // ----- shutdown -----
    pub(super) fn sink_view(&self) -> SinkView {
        match &self.sink {
            SinkState::OwnRelay(own) => SinkView {
                own_relay_open: Some(own.client.is_open()),
                outbox_depth: own.client.outbox_depth(),
                outbox_capacity: own.client.outbox_capacity(),
                outbox: own.client.outbox_stats(),
                accepted_per_minute: own.client.accepted_per_minute(),
                own_relay_failures: own.client.link_failures(),
                listings_unanswered: own.client.listings_unanswered(),
            },
            SinkState::Custom(custom) => SinkView {
                outbox_depth: usize::from(!custom.has_room()),
                outbox: custom.stats,
                ..SinkView::default()
            },
        }
    }

    /// The own-relay websocket opened.
    pub(super) fn on_sink_open(&mut self) {
        if let SinkState::OwnRelay(own) = &mut self.sink {
            own.client.handle_connected();
        }
    }

    /// The own-relay connection ended; its client decides when to retry.
    pub(super) fn on_sink_closed(&mut self, reason: &str, now: Time) {
        if let SinkState::OwnRelay(own) = &mut self.sink {
            warn!("own relay sink: {reason}");
            own.slot = None;
            own.client.handle_disconnected(now);
            // The listings it lost: their jobs go to REQ.
            self.take_sink_outputs(now);
        }
    }

    /// Shutting down: the own-relay client stops taking work and flushes.
    pub(super) fn sink_shutdown(&mut self) {
        if let SinkState::OwnRelay(own) = &mut self.sink {
            own.client.handle_shutdown();
        }
    }

    /// Nothing is left to hand the sink (the outbox is flushed).
    pub(super) fn sink_drained(&self) -> bool {
        match &self.sink {
            SinkState::OwnRelay(own) => own.client.is_drained(),
            SinkState::Custom(custom) => custom.has_room(),
        }
    }
}
