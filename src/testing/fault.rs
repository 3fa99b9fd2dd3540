//! Fault injection for [`TestRelay`]: a relay that misbehaves in one of the
//! ways real relays do, so tests and `grasp-sync demo --chaos` can show the
//! engine survives it and that one bad relay does not harm the others.
//!
//! Set [`RelayOptions::fault`]; with `None` the relay is honest and nothing
//! here runs. Every fault is counted when it fires
//! ([`TestRelay::faults_injected`]), so a test can tell a defence that held
//! from a fault that never fired, and every invalid event the relay sends is
//! remembered ([`TestRelay::invalid_sent`]), so a test can check that none
//! reached the sink.
//!
//! Transient faults ([`Fault::DropMidStream`], [`Fault::Restart`])
//! misbehave on the first connections only and then serve honestly: what
//! the engine missed meanwhile must still arrive afterwards.
//!
//! Events the relay makes up (floods, bad events) match the subscription
//! they are sent on but never use the kinds the engine learns repositories
//! and roots from: a relay inventing roots would make the engine subscribe
//! to them everywhere, spreading one relay's fault over all the others,
//! which is a different attack (hostile announcements) with its own tests.
//!
//! [`TestRelay`]: super::relay::TestRelay
//! [`RelayOptions::fault`]: super::relay::RelayOptions::fault
//! [`TestRelay::faults_injected`]: super::relay::TestRelay::faults_injected
//! [`TestRelay::invalid_sent`]: super::relay::TestRelay::invalid_sent

use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nostr::prelude::{
    Event, EventBuilder, EventId, Filter, FinalizeEvent, Keys, Kind, MatchEventOptions,
    RelayMessage, SecretKey, SubscriptionId, Tag, Timestamp,
};
use tungstenite::handshake::server::{Callback, ErrorResponse, Request, Response};
use tungstenite::http::{HeaderValue, StatusCode, header};
use tungstenite::protocol::frame::Frame;
use tungstenite::protocol::frame::coding::{Data as OpData, OpCode};

use super::lock::lock;
use super::relay_message::to_json;

/// Kinds the engine learns repositories and roots from; made-up events
/// never use them (see the module documentation).
const INDEX_KINDS: [u16; 4] = [30617, 1617, 1618, 1621];

/// Kind of made-up events when the filter names no kinds (a NIP-22 comment).
const DEFAULT_KIND: u16 = 1111;

/// nostr-rs-relay's `NOTICE` for an `EVENT` over its `max_event_bytes`.
pub const LARGE_EVENT_NOTICE: &str = "event exceeded max size";

/// The secret key of every event a fault relay makes up: any constant works,
/// and a fixed one keeps runs repeatable.
const FAULT_SECRET: [u8; 32] = [0x5a; 32];

/// One way a relay misbehaves. Put it in [`RelayOptions::fault`].
///
/// [`RelayOptions::fault`]: super::relay::RelayOptions::fault
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Cuts the TCP connection (no close frame) right after writing
    /// `after_events` events, on each of the first `connections`
    /// connections; later connections are served honestly. A relay crashing
    /// mid-answer: the engine must not take a half-sent history for done.
    DropMidStream {
        /// Events written before the cut.
        after_events: usize,
        /// Connections cut this way before the relay recovers.
        connections: u64,
    },
    /// `after` the first `REQ` of each of the first `times` connections,
    /// cuts every connection and refuses new ones for `down_for` (the port
    /// is closed), then serves the same store on the same port again: a
    /// relay restart, during which events may be published.
    Restart {
        /// Time from the first `REQ` of a connection to the restart.
        after: Duration,
        /// Time the port stays closed.
        down_for: Duration,
        /// Restarts before the relay stays up.
        times: u64,
    },
    /// Answers `REQ`s with their stored events but never with `EOSE`; live
    /// events still flow. The engine must time the page out, not wait
    /// forever.
    NoEose,
    /// Answers every `REQ` with `["CLOSED", <sub>, reason]` and nothing
    /// else. The reason's prefix (`auth-required:`, `rate-limited:`,
    /// `restricted:`, `error:`, strfry's `ERROR: ...`) tells the engine how
    /// long to stay away.
    Closed {
        /// The `CLOSED` message.
        reason: String,
    },
    /// Answers every `REQ` with `["NOTICE", text]` only, naming no
    /// subscription, as nostr-rs-relay refuses one over its limit.
    Notice {
        /// The `NOTICE` text.
        text: String,
    },
    /// Accepts TCP but never finishes the (TLS and) websocket handshake: it
    /// reads and discards until the client gives up (slowloris). The engine
    /// must time the attempt out without stalling other relays.
    Slowloris,
    /// Finishes the handshake, then lets one byte out per `interval`: a
    /// connection that is alive but useless.
    Trickle {
        /// Time between two bytes.
        interval: Duration,
    },
    /// Sends, with each `REQ`'s answer, `events` freshly signed events
    /// matching it, as fast as the socket takes them, before `EOSE`.
    Flood {
        /// Events per `REQ`.
        events: usize,
    },
    /// Sends a `NOTICE` frame of `bytes` bytes as soon as the websocket
    /// opens, before anything else: a frame over the engine's size cap.
    Oversized {
        /// Size of the frame's text.
        bytes: usize,
    },
    /// Sends, with each `REQ`'s answer, an event matching it whose id is not
    /// the hash of its content (the signature is over the real hash).
    BadId,
    /// Sends, with each `REQ`'s answer, an event matching it whose id is
    /// right but whose signature does not verify.
    BadSignature,
    /// Sends, with each `REQ`'s answer, a correctly signed event that
    /// matches none of its filters.
    OutsideFilter,
    /// Sends the first stored match of each `REQ` `copies` times.
    Duplicates {
        /// Copies sent.
        copies: usize,
    },
    /// Sends text frames that are not NIP-01 relay messages (not JSON,
    /// wrong shapes, truncated) before each `REQ`'s answer.
    Garbage,
    /// Answers the websocket upgrade with HTTP `status` (429, 503) and
    /// closes: a relay or its proxy shedding load.
    HttpStatus {
        /// The HTTP status code.
        status: u16,
        /// `Retry-After` seconds, if sent.
        retry_after: Option<u64>,
    },
    /// Answers an `EVENT` message longer than `max_bytes` with a `NOTICE`
    /// naming no event and no `OK`, as nostr-rs-relay does past its
    /// `max_event_bytes`. A fault of an own relay: remote relays are never
    /// sent events, so it is not in [`Fault::matrix`].
    LargeEventNotice {
        /// Longest `EVENT` message taken.
        max_bytes: usize,
    },
    /// Cuts the connection on an `EVENT` message longer than `max_bytes`,
    /// as strfry does past its `maxWebsocketPayloadSize`: the event is a
    /// poison pill for a client that sends it again first on reconnect. A
    /// fault of an own relay, like [`Fault::LargeEventNotice`].
    LargeEventCut {
        /// Longest `EVENT` message taken.
        max_bytes: usize,
    },
    /// Once the websocket opens, sends the first fragment (no FIN) of a
    /// text message of `bytes` bytes and never the rest; then only an
    /// unsolicited pong every `pong_every`, answering nothing else. The
    /// engine must not take the pongs for progress, and must not hold the
    /// unfinished message past its deadline.
    NeverFinished {
        /// Bytes of the fragment.
        bytes: usize,
        /// Time between two unsolicited pongs.
        pong_every: Duration,
    },
}

impl Fault {
    /// Every fault of the matrix once, with parameters that fit a demo or
    /// a test run of seconds; frames are `oversized_bytes` long.
    pub fn matrix(oversized_bytes: usize) -> Vec<Fault> {
        let closed = |reason: &str| Fault::Closed {
            reason: reason.to_owned(),
        };
        vec![
            Fault::DropMidStream {
                after_events: 3,
                connections: 2,
            },
            Fault::Restart {
                after: Duration::from_millis(500),
                down_for: Duration::from_secs(2),
                times: 1,
            },
            Fault::NoEose,
            closed("auth-required: this relay wants NIP-42 first"),
            closed("rate-limited: slow down"),
            closed("restricted: members only"),
            closed("error: internal error"),
            closed("ERROR: bad req: unsupported filter"),
            Fault::Notice {
                text: "too many concurrent REQs".to_owned(),
            },
            Fault::Slowloris,
            Fault::Trickle {
                interval: Duration::from_secs(1),
            },
            Fault::Flood { events: 2_000 },
            Fault::Oversized {
                bytes: oversized_bytes,
            },
            Fault::BadId,
            Fault::BadSignature,
            Fault::OutsideFilter,
            Fault::Duplicates { copies: 10_000 },
            Fault::Garbage,
            Fault::HttpStatus {
                status: 429,
                retry_after: Some(30),
            },
            Fault::HttpStatus {
                status: 503,
                retry_after: None,
            },
            Fault::NeverFinished {
                bytes: oversized_bytes / 4,
                pong_every: Duration::from_millis(200),
            },
        ]
    }

    /// A short name for logs and the demo's output.
    pub fn name(&self) -> String {
        match self {
            Fault::DropMidStream { .. } => "drop-mid-stream".to_owned(),
            Fault::Restart { .. } => "restart".to_owned(),
            Fault::NoEose => "no-eose".to_owned(),
            Fault::Closed { reason } => {
                let prefix = reason.split(':').next().unwrap_or_default();
                format!("closed-{prefix}")
            }
            Fault::Notice { .. } => "notice".to_owned(),
            Fault::Slowloris => "slowloris".to_owned(),
            Fault::Trickle { .. } => "trickle".to_owned(),
            Fault::Flood { .. } => "flood".to_owned(),
            Fault::Oversized { .. } => "oversized".to_owned(),
            Fault::BadId => "bad-id".to_owned(),
            Fault::BadSignature => "bad-signature".to_owned(),
            Fault::OutsideFilter => "outside-filter".to_owned(),
            Fault::Duplicates { .. } => "duplicates".to_owned(),
            Fault::Garbage => "garbage".to_owned(),
            Fault::HttpStatus { status, .. } => format!("http-{status}"),
            Fault::LargeEventNotice { .. } => "large-event-notice".to_owned(),
            Fault::LargeEventCut { .. } => "large-event-cut".to_owned(),
            Fault::NeverFinished { .. } => "never-finished".to_owned(),
        }
    }
}

/// What a fresh TCP connection gets.
pub(super) enum Opening {
    /// The websocket handshake (answered with `refusal` when set).
    Handshake(Upgrade),
    /// Nothing: hold the socket and never answer.
    Stall,
}

/// The websocket upgrade decision: accept, or answer with an HTTP error.
pub(super) struct Upgrade(Option<ErrorResponse>);

impl Upgrade {
    /// Accept the upgrade, as an honest relay does.
    pub(super) fn accept() -> Upgrade {
        Upgrade(None)
    }
}

impl Callback for Upgrade {
    fn on_request(self, _request: &Request, response: Response) -> Result<Response, ErrorResponse> {
        match self.0 {
            Some(refusal) => Err(refusal),
            None => Ok(response),
        }
    }
}

/// What a relay does with an `EVENT` it will not take.
pub(super) enum Publish {
    /// Sends this text (a `NOTICE`) and nothing else.
    Notice(String),
    /// Cuts the connection.
    Cut,
}

/// How one `REQ` is answered.
pub(super) enum Answer {
    /// This message only; the subscription is not opened.
    Refuse(String),
    /// The stored events, with extras around them.
    Serve(Plan),
}

/// A served `REQ`: `before`, the stored events, `copies` more copies of the
/// first of them, `after`, then `EOSE` if `eose`.
pub(super) struct Plan {
    pub(super) before: Vec<String>,
    pub(super) copies: usize,
    pub(super) after: Vec<String>,
    pub(super) eose: bool,
}

impl Plan {
    fn honest() -> Plan {
        Plan {
            before: Vec::new(),
            copies: 0,
            after: Vec::new(),
            eose: true,
        }
    }
}

/// One connection's progress through a transient fault.
#[derive(Debug, Default)]
pub(super) struct ConnFaults {
    events_sent: Cell<usize>,
    first_req: Cell<Option<Instant>>,
    restarted: Cell<bool>,
    /// When the next unsolicited pong is due ([`Fault::NeverFinished`]),
    /// once the fragment went out.
    next_pong: Cell<Option<Instant>>,
}

/// Lets one byte out per interval ([`Fault::Trickle`]); the socket reports
/// `WouldBlock` in between, so the connection thread never sleeps in a
/// write and still notices a stop.
#[derive(Debug)]
pub(super) struct Pace {
    interval: Duration,
    next: Instant,
}

impl Pace {
    /// True when one byte may go now (and starts the next interval).
    pub(super) fn allow(&mut self) -> bool {
        let now = Instant::now();
        if now < self.next {
            return false;
        }
        self.next = now + self.interval;
        true
    }
}

/// A relay's fault and what it has done so far; shared by its threads.
pub(super) struct Injector {
    fault: Option<Fault>,
    keys: Keys,
    injected: AtomicUsize,
    invalid: Mutex<Vec<EventId>>,
    serial: AtomicU64,
    /// Downtime of a restart a connection asked for; the acceptor does it.
    restart: Mutex<Option<Duration>>,
}

impl Injector {
    pub(super) fn new(fault: Option<Fault>) -> Injector {
        // 0x5a.. is a non-zero scalar below the curve order: a valid key.
        let secret = SecretKey::from_slice(&FAULT_SECRET).expect("a valid constant secret key");
        Injector {
            fault,
            keys: Keys::new(secret),
            injected: AtomicUsize::new(0),
            invalid: Mutex::new(Vec::new()),
            serial: AtomicU64::new(0),
            restart: Mutex::new(None),
        }
    }

    /// Faults fired so far.
    pub(super) fn injected(&self) -> usize {
        self.injected.load(Ordering::SeqCst)
    }

    /// Ids of the invalid events sent so far.
    pub(super) fn invalid_sent(&self) -> Vec<EventId> {
        lock(&self.invalid).clone()
    }

    fn count(&self, n: usize) {
        self.injected.fetch_add(n, Ordering::SeqCst);
    }

    /// How a fresh connection is opened.
    pub(super) fn opening(&self) -> Opening {
        match &self.fault {
            Some(Fault::Slowloris) => {
                self.count(1);
                Opening::Stall
            }
            Some(Fault::HttpStatus {
                status,
                retry_after,
            }) => {
                self.count(1);
                Opening::Handshake(Upgrade(Some(refusal(*status, *retry_after))))
            }
            _ => Opening::Handshake(Upgrade(None)),
        }
    }

    /// The frame to send as soon as the websocket is open, if any.
    pub(super) fn greeting(&self) -> Option<String> {
        let Some(Fault::Oversized { bytes }) = &self.fault else {
            return None;
        };
        self.count(1);
        to_json(&RelayMessage::notice("x".repeat(*bytes)))
    }

    /// The pace of writes once the websocket is open, if limited.
    pub(super) fn pace(&self) -> Option<Pace> {
        let Some(Fault::Trickle { interval }) = &self.fault else {
            return None;
        };
        self.count(1);
        Some(Pace {
            interval: *interval,
            next: Instant::now(),
        })
    }

    /// What to do with a client's text message instead of handling it:
    /// `None` unless it is an `EVENT` over a large-event fault's limit.
    pub(super) fn publish(&self, text: &str) -> Option<Publish> {
        let (max_bytes, publish) = match &self.fault {
            Some(Fault::LargeEventNotice { max_bytes }) => (
                *max_bytes,
                Publish::Notice(to_json(&RelayMessage::notice(LARGE_EVENT_NOTICE))?),
            ),
            Some(Fault::LargeEventCut { max_bytes }) => (*max_bytes, Publish::Cut),
            _ => return None,
        };
        if text.len() <= max_bytes || !text.starts_with("[\"EVENT\"") {
            return None;
        }
        self.count(1);
        Some(publish)
    }

    /// How to answer a `REQ`. Signs any made-up events, so call it without
    /// holding the relay's state lock.
    pub(super) fn answer(&self, sub: &str, filters: &[Filter], faults: &ConnFaults) -> Answer {
        if faults.first_req.get().is_none() {
            faults.first_req.set(Some(Instant::now()));
        }
        let sub_id = SubscriptionId::new(sub);
        let mut plan = Plan::honest();
        match &self.fault {
            Some(Fault::Closed { reason }) => {
                self.count(1);
                let closed = to_json(&RelayMessage::closed(sub_id, reason.clone()));
                return Answer::Refuse(closed.unwrap_or_default());
            }
            Some(Fault::Notice { text }) => {
                self.count(1);
                let notice = to_json(&RelayMessage::notice(text.clone()));
                return Answer::Refuse(notice.unwrap_or_default());
            }
            Some(Fault::NoEose) => {
                self.count(1);
                plan.eose = false;
            }
            Some(Fault::Garbage) => {
                plan.before = garbage(&sub_id);
                self.count(plan.before.len());
            }
            Some(Fault::BadId | Fault::BadSignature | Fault::OutsideFilter) => {
                plan.before = self.bad_event(&sub_id, filters).into_iter().collect();
            }
            Some(Fault::Flood { events }) => {
                plan.after = self.flood(&sub_id, filters, *events);
            }
            Some(Fault::Duplicates { copies }) => plan.copies = *copies,
            _ => {}
        }
        Answer::Serve(plan)
    }

    /// `copies` copies of the `EVENT` message for `first`, counted as one
    /// fault when any are sent.
    pub(super) fn copies(&self, sub: &SubscriptionId, first: &Event, copies: usize) -> Vec<String> {
        let Some(text) = to_json(&RelayMessage::event(sub.clone(), first.clone())) else {
            return Vec::new();
        };
        if copies > 0 {
            self.count(1);
        }
        vec![text; copies]
    }

    /// Called after each `EVENT` written to connection `conn`: true when
    /// the connection must be cut now ([`Fault::DropMidStream`]).
    pub(super) fn cut_now(&self, conn: u64, faults: &ConnFaults) -> bool {
        let Some(Fault::DropMidStream {
            after_events,
            connections,
        }) = &self.fault
        else {
            return false;
        };
        let sent = faults.events_sent.get() + 1;
        faults.events_sent.set(sent);
        let cut = conn < *connections && sent == *after_events;
        if cut {
            self.count(1);
        }
        cut
    }

    /// Called on every turn of connection `conn`'s loop: asks for a restart
    /// once one is due ([`Fault::Restart`]).
    pub(super) fn tick(&self, conn: u64, faults: &ConnFaults) {
        let Some(Fault::Restart {
            after,
            down_for,
            times,
        }) = &self.fault
        else {
            return;
        };
        let due = faults
            .first_req
            .get()
            .is_some_and(|t| t.elapsed() >= *after);
        if conn < *times && due && !faults.restarted.get() {
            faults.restarted.set(true);
            self.count(1);
            *lock(&self.restart) = Some(*down_for);
        }
    }

    /// Frames to write now on a connection of a [`Fault::NeverFinished`]
    /// relay: the fragment first, then a pong whenever one is due. `None`
    /// for any other relay; `Some` means the relay writes nothing else.
    pub(super) fn never_finished(&self, faults: &ConnFaults) -> Option<Vec<Frame>> {
        let Some(Fault::NeverFinished { bytes, pong_every }) = &self.fault else {
            return None;
        };
        let now = Instant::now();
        let Some(due) = faults.next_pong.get() else {
            self.count(1);
            faults.next_pong.set(Some(now + *pong_every));
            let fragment = Frame::message(vec![b'x'; *bytes], OpCode::Data(OpData::Text), false);
            return Some(vec![fragment]);
        };
        if now < due {
            return Some(Vec::new());
        }
        faults.next_pong.set(Some(now + *pong_every));
        Some(vec![Frame::pong(Vec::new())])
    }

    /// The downtime of a restart asked for since the last call, if any.
    pub(super) fn take_restart(&self) -> Option<Duration> {
        lock(&self.restart).take()
    }

    /// One bad event of the relay's kind for this `REQ`, as an `EVENT`
    /// message, remembered as invalid; `None` when no filter can be matched
    /// (or, for [`Fault::OutsideFilter`], missed) by a made-up event.
    fn bad_event(&self, sub: &SubscriptionId, filters: &[Filter]) -> Option<String> {
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let event = match self.fault.as_ref()? {
            Fault::OutsideFilter => self.outside(filters, serial)?,
            Fault::BadId => {
                let e = self.matching(filters, &format!("bad id {serial}"))?;
                Event::new(
                    e.id,
                    e.pubkey,
                    e.created_at,
                    e.kind,
                    e.tags.clone(),
                    format!("tampered {serial}"),
                    e.sig,
                )
            }
            Fault::BadSignature => {
                let e = self.matching(filters, &format!("signed {serial}"))?;
                let content = format!("bad signature {serial}");
                let id = EventId::compute(&e.pubkey, &e.created_at, &e.kind, &e.tags, &content);
                Event::new(
                    id,
                    e.pubkey,
                    e.created_at,
                    e.kind,
                    e.tags.clone(),
                    content,
                    e.sig,
                )
            }
            _ => return None,
        };
        let text = to_json(&RelayMessage::event(sub.clone(), event.clone()))?;
        lock(&self.invalid).push(event.id);
        self.count(1);
        Some(text)
    }

    /// `events` fresh events matching the `REQ`, as `EVENT` messages,
    /// counted as one fault when any are made.
    fn flood(&self, sub: &SubscriptionId, filters: &[Filter], events: usize) -> Vec<String> {
        let out: Vec<String> = (0..events)
            .map_while(|_| {
                let serial = self.serial.fetch_add(1, Ordering::Relaxed);
                let event = self.matching(filters, &format!("flood {serial}"))?;
                to_json(&RelayMessage::event(sub.clone(), event))
            })
            .collect();
        if !out.is_empty() {
            self.count(1);
        }
        out
    }

    /// A signed event matching the first filter one can be made for.
    fn matching(&self, filters: &[Filter], content: &str) -> Option<Event> {
        filters.iter().find_map(|f| {
            let event = self.sign(filter_kind(f)?, filter_tags(f), filter_time(f), content)?;
            f.match_event(&event, MatchEventOptions::new())
                .then_some(event)
        })
    }

    /// A signed event matching none of `filters`: a kind-1 note about a
    /// repository nobody announced.
    fn outside(&self, filters: &[Filter], serial: u64) -> Option<Event> {
        let coord = format!("30617:{}:outside-{serial}", self.keys.public_key().to_hex());
        let tag = Tag::parse(["a", coord.as_str()]).ok()?;
        let event = self.sign(1, vec![tag], Timestamp::now(), "outside the filter")?;
        let matched = filters
            .iter()
            .any(|f| f.match_event(&event, MatchEventOptions::new()));
        (!matched).then_some(event)
    }

    fn sign(&self, kind: u16, tags: Vec<Tag>, at: Timestamp, content: &str) -> Option<Event> {
        EventBuilder::new(Kind::from_u16(kind), content)
            .tags(tags)
            .custom_created_at(at)
            .finalize(&self.keys)
            .ok()
    }
}

/// A kind the filter asks that is not an index kind; `None` if it asks
/// index kinds only.
fn filter_kind(f: &Filter) -> Option<u16> {
    match &f.kinds {
        None => Some(DEFAULT_KIND),
        Some(kinds) => kinds
            .iter()
            .map(|k| k.as_u16())
            .find(|k| !INDEX_KINDS.contains(k)),
    }
}

/// One tag per tag letter the filter asks, with its first value.
fn filter_tags(f: &Filter) -> Vec<Tag> {
    f.generic_tags
        .iter()
        .filter_map(|(letter, values)| {
            let value = values.iter().next()?;
            Tag::parse([letter.as_ref(), value.as_str()]).ok()
        })
        .collect()
}

/// Now, pulled into the filter's `since..=until`.
fn filter_time(f: &Filter) -> Timestamp {
    let now = Timestamp::now();
    let at = f.until.map_or(now, |until| until.min(now));
    f.since.map_or(at, |since| at.max(since))
}

/// Text frames a relay should never send: not JSON, JSON that is no relay
/// message, and relay messages of the wrong shape.
fn garbage(sub: &SubscriptionId) -> Vec<String> {
    // The subscription id as a JSON string, escaped however the client chose
    // it: cut out of the `EOSE` nostr serializes.
    let eose = to_json(&RelayMessage::eose(sub.clone())).unwrap_or_default();
    let sub = eose
        .strip_prefix("[\"EOSE\",")
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or("\"\"");
    vec![
        "this is not json".to_owned(),
        "{\"EVENT\":true}".to_owned(),
        "[]".to_owned(),
        "[\"EVENT\"]".to_owned(),
        format!("[\"EVENT\",{sub},{{\"id\":\"zz\",\"sig\":7}}]"),
        format!("[\"EVENT\",{sub},{{\"id\":"),
        "[\"EOSE\",42]".to_owned(),
        format!("[\"NOT-A-VERB\",{sub}]"),
        "\u{0}\u{1}\u{2}".to_owned(),
    ]
}

/// The HTTP answer to a refused upgrade.
fn refusal(status: u16, retry_after: Option<u64>) -> ErrorResponse {
    let mut response = ErrorResponse::new(Some(format!("HTTP {status} from a test relay\n")));
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    if let Some(secs) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// Zone of the tarpit DNS fault: every name under it resolves slowly.
pub const TARPIT_ZONE: &str = "tarpit.test";

/// How long a tarpit name's lookup takes before it fails: a lame
/// delegation's 5 to 20 s, past any connect deadline of a test.
pub const TARPIT_LOOKUP: Duration = Duration::from_secs(10);

/// The tarpit DNS fault, as a name lookup for
/// `ShellOptions::dns_lookup`: names under [`TARPIT_ZONE`] block for
/// [`TARPIT_LOOKUP`] and fail, as names under a lame delegation do; every
/// other name resolves at once to 127.0.0.1, so honest test relays can
/// be named by hostname. The blocking is the fault itself: it runs on a
/// resolver worker, never on the loop.
pub fn tarpit_dns(host: &str, port: u16) -> std::io::Result<Vec<std::net::SocketAddr>> {
    if host.ends_with(TARPIT_ZONE) {
        std::thread::sleep(TARPIT_LOOKUP);
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "lame delegation",
        ));
    }
    Ok(vec![std::net::SocketAddr::from(([127, 0, 0, 1], port))])
}
