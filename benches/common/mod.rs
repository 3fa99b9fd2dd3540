//! Helpers shared by the benches: sizes, a deterministic RNG, cheap local
//! events, and a fake relay that answers every REQ with EOSE at once.

#![allow(dead_code)]

pub mod seed;

use std::time::Duration;

use grasp_sync::{Action, Engine, RelayId, Time};
use nostr::prelude::*;

/// The own relay of every bench engine.
pub const OWN: &str = "wss://own.example";
/// Start of simulated time (seconds).
pub const T0: u64 = 1_700_000_000;
/// The engine's default batch window.
pub const WINDOW: Duration = Duration::from_millis(5_000);

/// `GRASP_BENCH_SCALE` (default 1.0): multiplies every world size so quick
/// runs (`cargo bench -- --test`, CI) stay cheap.
pub fn scale() -> f64 {
    std::env::var("GRASP_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(1.0)
}

/// `n` scaled by [`scale`], at least `min`.
pub fn scaled(n: usize, min: usize) -> usize {
    ((n as f64 * scale()).round() as usize).max(min)
}

/// SplitMix64: small, fast, deterministic.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

/// Deterministic keys.
pub fn keys(n: u32) -> Keys {
    let mut sk = [0x11u8; 32];
    sk[..4].copy_from_slice(&(n + 1).to_be_bytes());
    Keys::new(SecretKey::from_slice(&sk).expect("valid secret"))
}

pub fn tag(values: &[&str]) -> Tag {
    Tag::parse(values.iter().copied()).expect("valid tag")
}

/// The made-up id [`local_event`] gives event `n` of `kind`.
pub fn local_id(n: u64, kind: u16) -> EventId {
    let mut id = [0u8; 32];
    id[..8].copy_from_slice(&n.to_be_bytes());
    id[8] = (kind & 0xff) as u8;
    id[9] = (kind >> 8) as u8;
    EventId::from_byte_array(id)
}

/// An event with a made-up id and signature, for the local-feed path that
/// trusts its input (an embedding relay already verified it).
pub fn local_event(pubkey: PublicKey, n: u64, kind: u16, tags: Vec<Tag>) -> Event {
    let sig = Signature::from_slice(&[1u8; 64]).expect("64 bytes");
    Event::new(
        local_id(n, kind),
        pubkey,
        Timestamp::from_secs(T0),
        Kind::from_u16(kind),
        tags,
        "",
        sig,
    )
}

/// A signed event.
pub fn sign(k: &Keys, kind: u16, created_at: u64, tags: Vec<Tag>, content: &str) -> Event {
    EventBuilder::new(Kind::from_u16(kind), content)
        .tags(tags)
        .custom_created_at(Timestamp::from_secs(created_at))
        .finalize(k)
        .expect("signing works")
}

/// The subscription id of a `["REQ","<id>",...]` message.
pub fn req_sub_id(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("[\"REQ\",\"")?;
    rest.split('"').next()
}

/// REQ messages and their bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReqCount {
    pub reqs: usize,
    pub bytes: usize,
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
        // The benches measure the REQ path: the sink cannot list.
        Action::ListLocal { request, .. } => engine.handle_local_list(now, request, None),
        Action::FetchInfo { relay, .. } => engine.handle_relay_info(now, relay, None),
    }
}

/// Answers actions until the engine asks nothing more.
pub fn settle(engine: &mut Engine, now: Time) -> ReqCount {
    let mut count = ReqCount::default();
    while let Some(action) = engine.poll_action() {
        answer(engine, now, action, &mut count);
    }
    count
}

/// True when every relay has all its items confirmed.
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
