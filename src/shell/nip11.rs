//! The shell's NIP-11 fetches: for the engine (`Action::FetchInfo`), a
//! relay's read limits; for the own-relay sink, the size of event the own
//! relay takes. Each runs in a `SlotKind::Info` slot and is answered
//! exactly once. At most [`AT_ONCE`] of the engine's run at a time; the
//! rest wait in line. The HTTP itself (request, response reader,
//! decoding) is the sans-IO `info_fetch`; the connection is `connect`'s.

use log::debug;
use mio::Token;

/// The engine's fetches in flight at most. Each is a second connection to
/// a relay, beside its websocket: at 5,000 relays all fetched at once,
/// their buffers and connections doubled the connect storm's memory, and
/// what they freed afterwards stayed as holes in the heap. A fetch takes
/// a round trip or two; 64 at once get through thousands in seconds.
const AT_ONCE: usize = 64;

use crate::sans_io::memory::index::RelayId;
use crate::sans_io::timing::time::Time;
use crate::sans_io::wire::info_fetch;
use crate::sans_io::wire::relay_info::RelayInfo;
use crate::shell::Shell;
use crate::shell::connect::Transport;
use crate::shell::slots::{InfoFor, SlotKind};

impl Shell {
    /// Fetches the NIP-11 document of `relay` (websocket URL `url`) and
    /// answers `handle_relay_info` exactly once, however the fetch ends
    /// (document, failure, deadline, shutdown).
    pub(super) fn fetch_info(&mut self, relay: RelayId, url: &str, now: Time) {
        self.fetch_info_for(relay, url, InfoFor::Engine, now);
    }

    /// Fetches the NIP-11 document of `relay` at `url` for `answer`; one
    /// for the engine waits in line while [`AT_ONCE`] are in flight (the
    /// engine's relay ids stay valid until answered, so the line holds ids
    /// only). The sink's one fetch never waits.
    pub(super) fn fetch_info_for(&mut self, relay: RelayId, url: &str, answer: InfoFor, now: Time) {
        if answer == InfoFor::Engine && self.slots.info_inflight() >= self.info_at_once() {
            self.info_waiting.push_back(relay);
            return;
        }
        if info_fetch::request(url).is_none() {
            debug!("{url}: no NIP-11 request for this URL");
            return self.info_failed(relay, answer, now);
        }
        let trusted = self.trusted.contains(&relay);
        let kind = |conn| SlotKind::Info {
            relay,
            conn,
            answer,
        };
        if let Err(reason) = self.start_conn(url, Transport::Http, trusted, now, kind) {
            debug!("{url}: NIP-11 fetch: {reason}");
            self.info_failed(relay, answer, now);
        }
    }

    /// A NIP-11 fetch got its response body: decode it and answer.
    pub(super) fn info_done(&mut self, token: Token, body: &[u8], now: Time) {
        let Some(SlotKind::Info { relay, answer, .. }) = self.slots.remove(token) else {
            return;
        };
        let info = info_fetch::decode_document(body);
        if info.is_none() {
            debug!(
                "{}: NIP-11 response is not a JSON object",
                self.engine.relay_url(relay)
            );
        }
        if answer == InfoFor::Engine {
            match info {
                Some(_) => self.stats.relay_info_ok += 1,
                None => self.stats.relay_info_failed += 1,
            }
        }
        self.answer_info(relay, answer, info, now);
    }

    /// A NIP-11 fetch failed (its slot is gone or never was): answer `None`.
    pub(super) fn info_failed(&mut self, relay: RelayId, answer: InfoFor, now: Time) {
        if answer == InfoFor::Engine {
            self.stats.relay_info_failed += 1;
        }
        self.answer_info(relay, answer, None, now);
    }

    fn answer_info(&mut self, relay: RelayId, answer: InfoFor, info: Option<RelayInfo>, now: Time) {
        match answer {
            InfoFor::Engine => self.engine.handle_relay_info(now, relay, info),
            InfoFor::Sink => self.sink_info(info),
        }
        self.start_waiting_info(now);
    }

    /// Fetches in flight at most: [`AT_ONCE`], or fewer if the operator
    /// allows fewer relays (each fetch is a socket beside a relay's).
    fn info_at_once(&self) -> usize {
        AT_ONCE.min(self.opts.max_relays.max(1))
    }

    /// Starts waiting fetches while there is room.
    fn start_waiting_info(&mut self, now: Time) {
        if std::mem::replace(&mut self.info_starting, true) {
            return;
        }
        while self.slots.info_inflight() < self.info_at_once() {
            let Some(relay) = self.info_waiting.pop_front() else {
                break;
            };
            let url = self.engine.relay_url(relay).to_owned();
            self.fetch_info_for(relay, &url, InfoFor::Engine, now);
        }
        if self.info_waiting.is_empty() {
            self.info_waiting = std::collections::VecDeque::new();
        }
        self.info_starting = false;
    }

    /// Shutdown: waiting fetches are answered `None`, never started.
    pub(super) fn skip_waiting_info(&mut self, now: Time) {
        for relay in std::mem::take(&mut self.info_waiting) {
            self.stats.relay_info_skipped += 1;
            self.engine.handle_relay_info(now, relay, None);
        }
    }
}
