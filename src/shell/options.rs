//! What an operator tunes about the shell, beside the engine's `Config`:
//! limits (relays, frame sizes, read rate, outbox), TLS roots, DNS threads,
//! the metrics address, the shutdown deadline and the state file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Default of [`ShellOptions::max_relays`].
const DEFAULT_MAX_RELAYS: usize = 10_000;
/// Default of [`ShellOptions::max_frame_bytes`] (1 MiB).
const DEFAULT_MAX_FRAME_BYTES: usize = 1_048_576;
/// Default of [`ShellOptions::max_frames_per_sec`]: as much as the loop
/// checks signatures for all relays together ([`GLOBAL_FRAMES_PER_SEC`]),
/// so one relay holding a big history is read as fast as the own relay
/// stores it (at 5,000 a first sync of one relay ran at half the own
/// relay's pace); the own relay's back-pressure, not this, paces it.
///
/// [`GLOBAL_FRAMES_PER_SEC`]: crate::shell::read_budget::GLOBAL_FRAMES_PER_SEC
const DEFAULT_MAX_FRAMES_PER_SEC: u32 = 20_000;
/// Default of [`ShellOptions::max_unfinished_bytes`] (64 MiB).
const DEFAULT_MAX_UNFINISHED_BYTES: u64 = 64 << 20;
/// Default of [`ShellOptions::unfinished_timeout`].
const DEFAULT_UNFINISHED_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`ShellOptions::shutdown_timeout`].
const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`ShellOptions::state_save_every`]: the state is bounded and
/// cheap to write, and three minutes of progress is cheap to redo.
const DEFAULT_STATE_SAVE_EVERY: Duration = Duration::from_secs(180);

/// A name lookup: host and port to addresses, blocking (it runs on a
/// resolver worker, never on the loop).
pub type DnsLookup = fn(&str, u16) -> std::io::Result<Vec<SocketAddr>>;

/// Shell settings besides the engine's.
#[derive(Debug, Clone)]
pub struct ShellOptions {
    /// Connect to relays that resolve to loopback/private/link-local
    /// addresses. The same switch as `Config::allow_private_addresses`:
    /// either one set turns it on for both the engine (announcements naming
    /// private relays) and the shell (the address guard after DNS).
    pub allow_private_addresses: bool,
    /// Relays connected at once at most; also the most NIP-11 fetches in
    /// flight at once (counted apart: a relay's fetch runs beside its
    /// websocket, and one past the cap is skipped, not queued).
    pub max_relays: usize,
    /// PEM files with extra root certificates (private CAs).
    pub extra_ca_files: Vec<PathBuf>,
    /// Largest websocket message and frame accepted.
    pub max_frame_bytes: usize,
    /// Longest flush of the outbox at shutdown.
    pub shutdown_timeout: Duration,
    /// Serve Prometheus metrics here.
    pub metrics: Option<SocketAddr>,
    /// Names the metrics port answers under beside IP literals and
    /// `localhost` (its `Host` header); any other name is refused, so a web
    /// page cannot reach the port through a name of its own that resolves
    /// here (DNS rebinding).
    pub metrics_hosts: Vec<String>,
    /// DNS worker threads.
    pub dns_threads: usize,
    /// Events the own-relay outbox holds before reading pauses.
    pub outbox_capacity: usize,
    /// Frames read per second from one remote relay at most (see
    /// `read_budget`); the rest waits in the kernel's socket buffers.
    pub max_frames_per_sec: u32,
    /// Longest a remote relay may leave a message unfinished (a frame or a
    /// fragmented message begun) before it is cut: what it makes us hold
    /// for it is held this long at most.
    pub unfinished_timeout: Duration,
    /// Bytes all remote relays together may make us hold for unfinished
    /// messages; each relay also holds at most `max_frame_bytes`, for at
    /// most `unfinished_timeout`. A relay whose message would pass it is
    /// cut (it costs that relay a reconnect, nobody else anything). Below
    /// `max_frame_bytes`, one relay's largest message is already over it.
    pub max_unfinished_bytes: u64,
    /// Where the engine's state is kept across restarts (`state_file`);
    /// `None` starts every run fresh.
    pub state_file: Option<PathBuf>,
    /// How often the state file is written while running (also at
    /// shutdown).
    pub state_save_every: Duration,
    /// Resolves relay names instead of the system's `getaddrinfo` (an
    /// embedder's own resolver; tests make names slow with it, the tarpit
    /// DNS fault `testing::fault::tarpit_dns`). The address guard still
    /// checks what it answers. `None`: the system's. Present in every
    /// build, so a struct literal does not depend on features.
    pub dns_lookup: Option<DnsLookup>,
}

impl Default for ShellOptions {
    fn default() -> Self {
        ShellOptions {
            allow_private_addresses: false,
            max_relays: DEFAULT_MAX_RELAYS,
            extra_ca_files: Vec::new(),
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            metrics: None,
            metrics_hosts: Vec::new(),
            dns_threads: 2,
            outbox_capacity: 10_000,
            max_frames_per_sec: DEFAULT_MAX_FRAMES_PER_SEC,
            unfinished_timeout: DEFAULT_UNFINISHED_TIMEOUT,
            max_unfinished_bytes: DEFAULT_MAX_UNFINISHED_BYTES,
            state_file: None,
            state_save_every: DEFAULT_STATE_SAVE_EVERY,
            dns_lookup: None,
        }
    }
}
