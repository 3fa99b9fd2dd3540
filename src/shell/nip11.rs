//! The shell's NIP-11 fetches: for the engine (`Action::FetchInfo`), a
//! relay's read limits; for the own-relay sink, the size of event the own
//! relay takes. Each runs in a `SlotKind::Info` slot, capped in number, and
//! is answered exactly once. The HTTP itself (request, response reader,
//! decoding) is the sans-IO `info_fetch`; the connection is `connect`'s.

use log::debug;
use mio::Token;

use crate::sans_io::index::RelayId;
use crate::sans_io::info_fetch;
use crate::sans_io::relay_info::RelayInfo;
use crate::sans_io::time::Time;
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

    /// Fetches the NIP-11 document of `relay` at `url` for `answer`. Past
    /// the cap of fetches in flight the answer is `None` at once: the
    /// document only saves refusals we learn the limits from anyway.
    pub(super) fn fetch_info_for(&mut self, relay: RelayId, url: &str, answer: InfoFor, now: Time) {
        if self.slots.info_inflight() >= self.opts.max_relays.max(1) {
            debug!("{url}: NIP-11 fetch skipped; too many in flight");
            if answer == InfoFor::Engine {
                self.stats.relay_info_skipped += 1;
            }
            return self.answer_info(relay, answer, None, now);
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
    }
}
