//! The cheapest relay, answering straight on an [`Engine`]: every connect
//! succeeds at once, every REQ gets EOSE at once, every ping a pong, and the
//! sink cannot list. No stored events and no bookkeeping but a count of the
//! REQs, so benches measure the engine and not the relay.

use crate::{Action, Engine, RelayId, Time};

/// REQ messages and their bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReqCount {
    /// REQ messages sent.
    pub reqs: usize,
    /// Their bytes.
    pub bytes: usize,
}

/// The subscription id of a `["REQ","<id>",...]` message.
pub fn req_sub_id(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("[\"REQ\",\"")?;
    rest.split('"').next()
}

/// Answers one action the way an instant, empty relay would: connects
/// succeed, every REQ gets EOSE, pings get pongs.
pub fn answer(engine: &mut Engine, now: Time, action: Action, count: &mut ReqCount) {
    match action {
        Action::Connect { relay, .. } => engine.handle_connected(now, relay),
        Action::Send { relay, message } => {
            if let Some(id) = req_sub_id(&message) {
                count.reqs += 1;
                count.bytes += message.len();
                let eose = format!("[\"EOSE\",\"{id}\"]");
                engine.handle_message(now, relay, &eose);
            }
        }
        Action::Ping { relay } => engine.handle_pong(now, relay),
        Action::Disconnect { .. } => {}
        // Only the REQ path is exercised: the sink cannot list.
        Action::ListLocal { request, .. } => engine.handle_local_list(now, request, None),
        Action::FetchInfo { relay, .. } => engine.handle_relay_info(now, relay, None),
    }
}

/// Answers actions until the engine asks nothing more; the REQs it sent.
pub fn settle(engine: &mut Engine, now: Time) -> ReqCount {
    let mut count = ReqCount::default();
    while let Some(action) = engine.poll_action() {
        answer(engine, now, action, &mut count);
    }
    count
}

/// Items confirmed over every relay, or the first relay with items still
/// queued or pending.
pub fn all_confirmed(engine: &Engine) -> Result<usize, String> {
    let mut confirmed = 0;
    for relay in engine.relays().collect::<Vec<RelayId>>() {
        let c = engine.item_counts(relay);
        if c.queued != 0 || c.pending != 0 {
            return Err(format!("{}: {c:?}", engine.relay_url(relay)));
        }
        confirmed += c.confirmed;
    }
    Ok(confirmed)
}
