//! The connection table: every socket the loop owns, in a `Slab` under
//! generation-tagged tokens.
//!
//! A token is a slot's slab key with a generation above it, and a slot
//! answers only to the token it was given. A readiness event or a DNS
//! answer (the resolver echoes the token) for a dropped connection can then
//! never reach the connection that reused its slot: the stale token finds
//! the key but not the generation. The generation keeps its top bit clear,
//! so no slot token is ever the loop's own `WAKER` or `METRICS` token.
//!
//! Every slot enters through [`Slots::insert`] and leaves through
//! [`Slots::remove`], which also keeps the count of NIP-11 fetches in flight
//! exact whichever way a fetch ends.

use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use slab::Slab;

use crate::sans_io::memory::index::RelayId;
use crate::shell::connect_error::ConnectError;
use crate::shell::dns::Pending;
use crate::shell::metrics_server::MetricsConn;
use crate::shell::read_budget::ReadRate;
use crate::shell::ws::{HttpGet, TlsTarget, WsConnection};

/// Slab keys sit below this bit; the generation above.
const KEY_BITS: u32 = 32;
const KEY_MASK: usize = (1 << KEY_BITS) - 1;
/// Generations wrap within 31 bits, so tokens stay below `usize::MAX / 2`,
/// clear of the loop's reserved tokens.
const GENERATION_MASK: u32 = 0x7fff_ffff;

/// A connection's transport: waiting for DNS, a websocket in progress, or
/// a NIP-11 fetch in progress.
///
/// Every variant is boxed: the slot table holds an entry per relay for the
/// process's life, and sized by the lookup's fields (alive only while a
/// name resolves) every entry was 128 bytes instead of 56.
pub(super) enum Conn {
    Resolving(Box<Resolving>),
    Ws(Box<WsConnection>),
    Http(Box<HttpGet>),
}

/// A connection waiting for its host name to resolve.
pub(super) struct Resolving {
    pub(super) url: String,
    pub(super) port: u16,
    pub(super) tls: Option<TlsTarget>,
    pub(super) trusted: bool,
    /// The queued lookup; dropping the slot cancels it.
    pub(super) lookup: Pending,
}

impl Conn {
    /// The socket to register with the poll; none while resolving.
    pub(super) fn socket(&mut self) -> Option<&mut TcpStream> {
        match self {
            Conn::Resolving(_) => None,
            Conn::Ws(ws) => ws.socket(),
            Conn::Http(get) => get.socket(),
        }
    }
}

/// Who a slot's connection serves, and what the loop tracks for it.
pub(super) enum SlotKind {
    Relay {
        relay: RelayId,
        conn: Conn,
        opened: bool,
        rate: ReadRate,
        /// Reads stopped until the rate window refills (a timer is armed).
        throttled: bool,
        /// Bytes of unfinished messages this connection holds, as last
        /// counted into [`Slots::held_total`].
        held: u64,
    },
    OwnSink {
        conn: Conn,
        opened: bool,
    },
    /// A NIP-11 fetch for `relay`; answered to `answer` when it ends,
    /// however it ends.
    Info {
        relay: RelayId,
        conn: Conn,
        answer: InfoFor,
    },
    /// Boxed for the same reason as [`Conn`]'s variants: metrics
    /// connections are few.
    Metrics(Box<MetricsConn>),
}

/// Who asked for a NIP-11 document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum InfoFor {
    /// The engine (`Action::FetchInfo`), for a relay's read limits.
    Engine,
    /// The own-relay sink, for the size of event the own relay takes.
    Sink,
}

/// One occupied slot: what it holds, and the generation its token carries.
pub(super) struct Slot {
    generation: u32,
    pub(super) kind: SlotKind,
}

/// The table of connections, the generation counter its tokens are tagged
/// with, and the count of NIP-11 fetches among them.
#[derive(Default)]
pub(super) struct Slots {
    slab: Slab<Slot>,
    generation: u32,
    /// `SlotKind::Info` slots, at most `max_relays` and 64 for the engine
    /// (the caller checks, see `nip11`), plus the sink's one: each relay's
    /// fetch runs beside its websocket, so a burst of connects needs
    /// little more than the sockets the operator allowed for.
    info_inflight: usize,
    /// Bytes all remote relay connections hold for unfinished messages:
    /// kept as a running sum, so checking the global cap costs nothing
    /// however many relays hold a little.
    held_total: u64,
}

impl Slots {
    /// Takes `kind` into a fresh slot, registering its socket (if it has
    /// one yet) with `registry` under the slot's token.
    pub(super) fn insert(
        &mut self,
        mut kind: SlotKind,
        registry: &Registry,
    ) -> Result<Token, ConnectError> {
        self.generation = (self.generation + 1) & GENERATION_MASK;
        let entry = self.slab.vacant_entry();
        let token = slot_token(entry.key(), self.generation);
        if let Some(socket) = kind_socket(&mut kind) {
            registry
                .register(socket, token, Interest::READABLE | Interest::WRITABLE)
                .map_err(ConnectError::Register)?;
        }
        if matches!(kind, SlotKind::Info { .. }) {
            self.info_inflight += 1;
        }
        entry.insert(Slot {
            generation: self.generation,
            kind,
        });
        Ok(token)
    }

    /// The slot `token` names, unless it was freed (and maybe reused) since.
    pub(super) fn get_mut(&mut self, token: Token) -> Option<&mut Slot> {
        let (key, generation) = (token.0 & KEY_MASK, (token.0 >> KEY_BITS) as u32);
        self.slab
            .get_mut(key)
            .filter(|s| s.generation == generation)
    }

    /// Frees the slot `token` names (closing its websocket; dropping the
    /// socket takes it out of the poll), unless it was freed already.
    pub(super) fn remove(&mut self, token: Token) -> Option<SlotKind> {
        self.get_mut(token)?;
        let mut slot = self.slab.remove(token.0 & KEY_MASK);
        match &mut slot.kind {
            SlotKind::Relay {
                conn: Conn::Ws(ws), ..
            }
            | SlotKind::OwnSink {
                conn: Conn::Ws(ws), ..
            } => ws.close(),
            SlotKind::Info { .. } => self.info_inflight -= 1,
            _ => {}
        }
        if let SlotKind::Relay { held, .. } = slot.kind {
            self.held_total -= held;
        }
        Some(slot.kind)
    }

    /// Records that relay slot `token` now holds `held` bytes of unfinished
    /// messages; returns what all relay slots hold together.
    pub(super) fn set_held(&mut self, token: Token, held: u64) -> u64 {
        if let Some(Slot {
            kind: SlotKind::Relay { held: counted, .. },
            ..
        }) = self.get_mut(token)
        {
            let before = std::mem::replace(counted, held);
            self.held_total = self.held_total - before + held;
        }
        self.held_total
    }

    /// Every occupied slot's token and kind.
    pub(super) fn iter(&self) -> impl Iterator<Item = (Token, &SlotKind)> {
        self.slab
            .iter()
            .map(|(key, s)| (slot_token(key, s.generation), &s.kind))
    }

    /// NIP-11 fetches in flight.
    pub(super) fn info_inflight(&self) -> usize {
        self.info_inflight
    }
}

impl SlotKind {
    /// The outgoing connection of a relay, sink or fetch slot (a metrics
    /// slot is an accepted one, not a `Conn`).
    pub(super) fn conn_mut(&mut self) -> Option<&mut Conn> {
        match self {
            SlotKind::Relay { conn, .. }
            | SlotKind::OwnSink { conn, .. }
            | SlotKind::Info { conn, .. } => Some(conn),
            SlotKind::Metrics(_) => None,
        }
    }
}

fn kind_socket(kind: &mut SlotKind) -> Option<&mut TcpStream> {
    match kind {
        SlotKind::Metrics(m) => Some(m.socket()),
        _ => kind.conn_mut().and_then(Conn::socket),
    }
}

/// A slot's token: its generation above its slab key, so a token outlives
/// its slot harmlessly (a reused key gets a new generation).
fn slot_token(key: usize, generation: u32) -> Token {
    Token(((generation as usize) << KEY_BITS) | key)
}

#[cfg(test)]
mod tests {
    use mio::Poll;

    use super::*;
    use crate::shell::{METRICS, WAKER};

    /// A fetch still resolving: a slot with no socket yet.
    fn resolving(relay: u32) -> SlotKind {
        SlotKind::Info {
            answer: InfoFor::Engine,
            relay: RelayId(relay),
            conn: Conn::Resolving(Box::new(Resolving {
                url: format!("ws://relay{relay}.example"),
                port: 80,
                tls: None,
                trusted: false,
                lookup: Pending::none(),
            })),
        }
    }

    /// The slot table keeps an entry per relay for the process's life:
    /// what only a connection on its way needs stays out of it (boxed).
    #[test]
    fn a_slot_stays_small() {
        assert!(
            std::mem::size_of::<Slot>() <= 56,
            "{}",
            std::mem::size_of::<Slot>()
        );
    }

    fn relay_of(slot: Option<&mut Slot>) -> Option<RelayId> {
        match slot.map(|s| &s.kind) {
            Some(SlotKind::Info { relay, .. }) => Some(*relay),
            _ => None,
        }
    }

    #[test]
    fn a_stale_token_never_reaches_the_slot_that_reused_its_key() {
        let poll = Poll::new().unwrap();
        let mut slots = Slots::default();
        let old = slots.insert(resolving(1), poll.registry()).unwrap();
        assert!(slots.remove(old).is_some());
        let new = slots.insert(resolving(2), poll.registry()).unwrap();
        assert_eq!(old.0 & KEY_MASK, new.0 & KEY_MASK, "the key is reused");
        assert_ne!(old, new);
        assert_eq!(relay_of(slots.get_mut(old)), None);
        assert!(slots.remove(old).is_none(), "a stale remove frees nothing");
        assert_eq!(relay_of(slots.get_mut(new)), Some(RelayId(2)));
        assert_eq!(slots.iter().map(|(t, _)| t).collect::<Vec<_>>(), [new]);
    }

    #[test]
    fn fetches_in_flight_are_counted_in_and_out_once() {
        let poll = Poll::new().unwrap();
        let mut slots = Slots::default();
        let a = slots.insert(resolving(1), poll.registry()).unwrap();
        let b = slots.insert(resolving(2), poll.registry()).unwrap();
        assert_eq!(slots.info_inflight(), 2);
        slots.remove(a);
        slots.remove(a);
        assert_eq!(slots.info_inflight(), 1);
        slots.remove(b);
        assert_eq!(slots.info_inflight(), 0);
    }

    /// A relay connection still resolving: enough to count what it holds.
    fn relay(relay: u32) -> SlotKind {
        let SlotKind::Info { conn, .. } = resolving(relay) else {
            unreachable!("resolving builds a fetch slot")
        };
        SlotKind::Relay {
            relay: RelayId(relay),
            conn,
            opened: false,
            rate: ReadRate::new(100, crate::sans_io::timing::time::Time::from_millis(0)),
            throttled: false,
            held: 0,
        }
    }

    #[test]
    fn held_bytes_are_a_running_sum_that_a_removed_slot_leaves() {
        let poll = Poll::new().unwrap();
        let mut slots = Slots::default();
        let tokens: Vec<Token> = (0..1000)
            .map(|i| slots.insert(relay(i), poll.registry()).unwrap())
            .collect();
        // A thousand relays each holding a little add up, however small.
        for t in &tokens {
            slots.set_held(*t, 1000);
        }
        assert_eq!(slots.set_held(tokens[0], 1000), 1_000_000);
        assert_eq!(slots.set_held(tokens[0], 0), 999_000, "a finished message");
        slots.remove(tokens[1]);
        slots.remove(tokens[1]);
        assert_eq!(slots.set_held(tokens[2], 1000), 998_000, "counted out once");
        assert_eq!(slots.set_held(tokens[1], 5000), 998_000, "a stale token");
    }

    #[test]
    fn slot_tokens_stay_clear_of_the_reserved_tokens() {
        let highest = slot_token(KEY_MASK, GENERATION_MASK);
        for reserved in [WAKER, METRICS] {
            assert!(highest < reserved, "{highest:?} reaches {reserved:?}");
        }
        let mut slots = Slots {
            generation: GENERATION_MASK,
            ..Slots::default()
        };
        let poll = Poll::new().unwrap();
        let wrapped = slots.insert(resolving(1), poll.registry()).unwrap();
        assert_eq!(wrapped, slot_token(0, 0), "the generation wraps to 0");
    }
}
