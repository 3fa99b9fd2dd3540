//! Every tunable of the engine, with the defaults GRASP-02 names.
//!
//! One plain struct so the binary can map one flag to one field and an
//! embedding relay can build it in code. All durations are `Duration`s;
//! the core never interprets them against a clock of its own.

use std::time::Duration;

use nostr::prelude::Keys;

use crate::sans_io::identity::shard::Shard;

/// Engine configuration. `Config::new(own_relay)` gives the defaults.
#[derive(Debug, Clone)]
pub struct Config {
    /// The relay this engine syncs into (`ws://` or `wss://`); never a sync target.
    pub own_relay: String,
    /// The own relay's public host (and port). Remote announcements must
    /// list it in `relays` and `clone` to be passed on (GRASP-01), and a
    /// relay URL naming it (`ws://` or `wss://`) is the own relay, never a
    /// sync target. Defaults to the own relay's host and port.
    pub domain: Option<String>,
    /// Relays always connected for discovery, never dropped by the disconnect check.
    pub bootstrap: Vec<String>,
    /// Subscribe to the own relay to learn repos (off when an embedding relay
    /// feeds accepted events in through `Engine::handle_local_event`).
    pub self_subscribe: bool,
    /// Window that collects own-relay events into one batch; opened by the
    /// first event and never extended.
    pub batch_window: Duration,
    /// A window holding only the engine's own events coming back (what it
    /// just handed to the sink, echoed by the self-subscription or the
    /// embedding relay) closes once none came for this long, within
    /// `batch_window`: the burst it collects is over, and each generation
    /// of discovery (roots, then their replies) would otherwise wait out
    /// a whole window. Once every root the engine handed over is back, it
    /// waits half as long.
    pub echo_quiet: Duration,
    /// First reconnect backoff; doubles per consecutive failure.
    pub backoff_base: Duration,
    /// Longest reconnect backoff.
    pub backoff_max: Duration,
    /// A reconnect within this window keeps confirmed state and catches up with `since`.
    pub quick_reconnect: Duration,
    /// Live filter count of one relay above which its subscriptions are consolidated.
    pub consolidation_threshold: usize,
    /// Longest wait for pending batches before consolidating anyway.
    pub consolidation_timeout: Duration,
    /// Period of the check that drops relays nothing targets any more.
    pub disconnect_check: Duration,
    /// Lower bound of the per-relay daily fresh sync period.
    pub daily_min: Duration,
    /// Upper bound of the per-relay daily fresh sync period.
    pub daily_max: Duration,
    /// `limit` asked by every historic filter; a page this full asks for the next one.
    pub page_limit: usize,
    /// Continuous failure after which a relay is dead.
    pub dead_after: Duration,
    /// Retry period of a dead relay.
    pub dead_retry: Duration,
    /// Cooldown after a `rate-limited:` refusal.
    pub rate_limit_cooldown: Duration,
    /// Starting limit of concurrent subscriptions per relay (lowered on refusal).
    pub max_subscriptions: usize,
    /// Most filters per REQ. A relay gets at most 20 until its NIP-11
    /// document shows it takes more (its `max_filters`, or software known
    /// to: khatru and nostr-rs-relay check no count, strfry refuses past
    /// 200), and less once it refuses. A long history is read as time
    /// windows, a filter each, so this times the subscription limit is
    /// the pages a round trip can bring: at 20, a first sync of 100,000
    /// replies on khatru (100 results a filter) took 26 round trips, at
    /// 100 it takes 12.
    pub max_filters_per_req: usize,
    /// Starting limit of bytes per REQ message (lowered on refusal).
    pub max_message_bytes: usize,
    /// Values per tag filter (repo refs or root ids).
    pub chunk_size: usize,
    /// Time a relay has to finish connecting before the attempt counts as failed.
    pub connect_timeout: Duration,
    /// Silence after which a connected relay is pinged. The shell's
    /// sockets also have the kernel's TCP keepalive, which finds a vanished
    /// peer within 90 s without waking the loop; pings are left to find
    /// relays whose process hangs, so they can be rare: each is a wake-up
    /// per relay (at 5,000 relays, a ping a minute was most of the idle
    /// engine's CPU). Five minutes, as database clients and Redis keep
    /// their connections.
    pub keepalive: Duration,
    /// Time a pinged relay has to answer anything before it counts as dead.
    pub pong_timeout: Duration,
    /// Time a historic page has to reach EOSE before it counts as failed.
    pub eose_timeout: Duration,
    /// Relays taken from one announcement at most.
    pub max_relays_per_announcement: usize,
    /// Repos a root event may name (`a` tags) at most.
    pub max_repos_per_root: usize,
    /// After a repo's relays change, the next change waits this long (the
    /// newest announcement wins then); damps announcements that flip.
    pub relay_change_interval: Duration,
    /// Relays known (interned) at most; new URLs past it are dropped.
    /// Relays no announcement lists any more are released at the next
    /// disconnect check, so replaced junk frees its share.
    pub max_known_relays: usize,
    /// Distinct relays the announcements of one pubkey may list, so one
    /// key cannot fill `max_known_relays` for everyone.
    pub max_relays_per_pubkey: usize,
    /// Repos one pubkey may bring into the index (announced, or named by
    /// its roots); past it its new repos are ignored. The default is the
    /// scale one relay is built to carry (10,000 repos), so no real
    /// account meets it, while a flood from one key stops there.
    pub max_repos_per_pubkey: usize,
    /// Roots one pubkey may author in the index; past it its new roots are
    /// not followed (the root events themselves still sync with their
    /// repo). The default is the designed scale of one relay (100,000).
    pub max_roots_per_pubkey: usize,
    /// New roots and announcements one remote relay may deliver per
    /// minute before each further one is an offence (the event still goes
    /// to the sink). The default, 10,000, is far above what an honest
    /// relay's first sync delivers in a minute — a cut there would only
    /// slow it, but slowness is how events go missing for hours — while a
    /// relay inventing roots from fresh keys is cut within a minute.
    pub max_new_items_per_relay_minute: u32,
    /// Repos, and roots, known at most (each).
    pub max_known_items: usize,
    /// Keep announced relays on loopback/private IP literals and
    /// `localhost`. The same switch as
    /// `ShellOptions::allow_private_addresses`: either one set turns it on
    /// for both the engine and the shell's address guard.
    pub allow_private_addresses: bool,
    /// Key for NIP-42 AUTH; `None` answers no challenge (relays that
    /// require AUTH are then backed off).
    pub auth_keys: Option<Keys>,
    /// Use NIP-77 negentropy for historic sync where relays support it.
    pub negentropy: bool,
    /// A negentropy job making no progress this long falls back to REQ
    /// (and a relay that never answered is taken as not supporting it).
    pub neg_timeout: Duration,
    /// Negentropy jobs in flight at most, over all relays: each holds the
    /// sink's listings and a session's copy of one; the rest wait their
    /// turn with their work queued. The default, 512, keeps a restart at
    /// 5,000 relays well under the memory of unbounded jobs while a
    /// relay's turn comes within seconds (64 made that restart take
    /// minutes: turns came in about 80 waves).
    pub neg_jobs_at_once: usize,
    /// Event ids negentropy may hold at once over all relays: found
    /// missing by sessions and jobs, and waiting in `ids` REQs not sent
    /// yet. A job that would pass it falls back to REQ paging (counted,
    /// logged), so a relay reporting ids without end costs a bounded
    /// amount, while a first sync of one issue with 100,000 replies is
    /// still fetched by id, several REQs in flight, instead of one page
    /// per round trip. 200,000 ids are about 6.4 MB, 10 MB in the filters
    /// of waiting pages.
    pub neg_ids_held: usize,
    /// Fetch each remote relay's NIP-11 document once and start from the
    /// limits it publishes.
    pub relay_info: bool,
    /// Follow-up pages one subscription may ask before the rest is given up.
    pub max_pages: u32,
    /// Event ids remembered for de-duplication (per generation; two are kept).
    pub seen_capacity: usize,
    /// Kinds asked by a relay's wide live filter, used once per-id filters
    /// would pass the consolidation threshold; tags are then matched locally.
    /// The NIP-34 kinds (replies 1111, patches, PRs and updates, issues,
    /// status and state) and the two kinds that answer a root outside
    /// NIP-34: NIP-10 replies (1) and NIP-25 reactions (7). Without 1 and
    /// 7 a reply to one of our roots on a wide relay waited for the daily
    /// sync. On a public relay they are the note and reaction firehose:
    /// each event is matched against the relay's targets before anything
    /// is spent on its signature, so what does not tag ours costs its
    /// parsing alone. Events of other kinds that tag our roots on a wide
    /// relay (zaps, labels) arrive by its historic per-id sync, on every
    /// connect and in the daily sync.
    pub wide_kinds: Vec<u16>,
    /// Seed of the engine's own RNG (jitter); fixed seeds make runs repeatable.
    pub seed: u64,
    /// Key for the own relay's NIP-42 AUTH (the self-subscription and the
    /// sink). `None` uses [`Config::auth_keys`] there too, so an own relay
    /// that requires AUTH keeps working; then the key answering remote
    /// relays' challenges is also the one the own relay trusts, and only
    /// the own relay's check of the AUTH event's `relay` tag stops a
    /// hostile relay from forwarding the own relay's challenge. A separate
    /// key closes that: remote relays never see a signature by it.
    pub own_relay_auth_keys: Option<Keys>,
    /// The share of remote relays this engine connects to (`--shard I/N`);
    /// the default, 0/1, is every relay. The own relay is never sharded.
    pub shard: Shard,
}

impl Config {
    /// Defaults for syncing into `own_relay`.
    pub fn new(own_relay: impl Into<String>) -> Self {
        Config {
            own_relay: own_relay.into(),
            domain: None,
            bootstrap: Vec::new(),
            self_subscribe: true,
            batch_window: Duration::from_millis(5_000),
            echo_quiet: Duration::from_millis(200),
            backoff_base: Duration::from_secs(5),
            backoff_max: Duration::from_secs(3_600),
            quick_reconnect: Duration::from_secs(900),
            consolidation_threshold: 70,
            consolidation_timeout: Duration::from_secs(30),
            disconnect_check: Duration::from_secs(60),
            daily_min: Duration::from_secs(82_800),
            daily_max: Duration::from_secs(90_000),
            page_limit: 500,
            dead_after: Duration::from_secs(24 * 3_600),
            dead_retry: Duration::from_secs(24 * 3_600),
            rate_limit_cooldown: Duration::from_secs(65),
            max_subscriptions: 10,
            max_filters_per_req: 100,
            max_message_bytes: 64 * 1024,
            chunk_size: 100,
            connect_timeout: Duration::from_secs(30),
            eose_timeout: Duration::from_secs(120),
            keepalive: Duration::from_secs(300),
            pong_timeout: Duration::from_secs(20),
            max_relays_per_announcement: 50,
            max_repos_per_root: 20,
            relay_change_interval: Duration::from_secs(60),
            max_known_relays: 50_000,
            max_relays_per_pubkey: 500,
            max_repos_per_pubkey: 10_000,
            max_roots_per_pubkey: 100_000,
            max_new_items_per_relay_minute: 10_000,
            max_known_items: 1_000_000,
            allow_private_addresses: false,
            auth_keys: None,
            negentropy: true,
            neg_timeout: Duration::from_secs(15),
            neg_jobs_at_once: 512,
            neg_ids_held: 200_000,
            relay_info: true,
            max_pages: 10_000,
            seen_capacity: 100_000,
            wide_kinds: vec![
                1, 7, 1111, 1617, 1618, 1619, 1621, 1622, 1630, 1631, 1632, 1633, 30618,
            ],
            seed: 0,
            own_relay_auth_keys: None,
            shard: Shard::default(),
        }
    }
}
