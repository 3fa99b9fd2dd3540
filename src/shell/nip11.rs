//! The shell's side of `Action::FetchInfo`: a NIP-11 fetch in a
//! `SlotKind::Info` slot, capped in number, answered to the engine exactly
//! once. The HTTP itself (request, response reader, decoding) is the
//! sans-IO `info_fetch`; the connection is `connect`'s.

use log::debug;
use mio::Token;

use crate::sans_io::index::RelayId;
use crate::sans_io::info_fetch;
use crate::sans_io::time::Time;
use crate::shell::Shell;
use crate::shell::connect::Transport;
use crate::shell::slots::SlotKind;

impl Shell {
    /// Fetches the NIP-11 document of `relay` (websocket URL `url`) and
    /// answers `handle_relay_info` exactly once, however the fetch ends
    /// (document, failure, deadline, shutdown). Past the cap of fetches in
    /// flight the answer is `None` at once: the document only saves
    /// refusals we learn the limits from anyway.
    pub(super) fn fetch_info(&mut self, relay: RelayId, url: &str, now: Time) {
        if self.slots.info_inflight() >= self.opts.max_relays.max(1) {
            debug!("{url}: NIP-11 fetch skipped; too many in flight");
            self.stats.relay_info_skipped += 1;
            return self.engine.handle_relay_info(now, relay, None);
        }
        if info_fetch::request(url).is_none() {
            self.stats.relay_info_failed += 1;
            debug!("{url}: no NIP-11 request for this URL");
            return self.engine.handle_relay_info(now, relay, None);
        }
        let trusted = self.trusted.contains(&relay);
        let kind = |conn| SlotKind::Info { relay, conn };
        match self.start_conn(url, Transport::Http, trusted, now, kind) {
            Ok(_) => {}
            Err(reason) => {
                debug!("{url}: NIP-11 fetch: {reason}");
                self.stats.relay_info_failed += 1;
                self.engine.handle_relay_info(now, relay, None);
            }
        }
    }

    /// A NIP-11 fetch got its response body: decode it and answer the engine.
    pub(super) fn info_done(&mut self, token: Token, body: &[u8], now: Time) {
        let Some(SlotKind::Info { relay, .. }) = self.slots.remove(token) else {
            return;
        };
        let info = info_fetch::decode_document(body);
        if info.is_some() {
            self.stats.relay_info_ok += 1;
        } else {
            self.stats.relay_info_failed += 1;
            debug!(
                "{}: NIP-11 response is not a JSON object",
                self.engine.relay_url(relay)
            );
        }
        self.engine.handle_relay_info(now, relay, info);
    }
}
