//! The demo's flags: what `demo --help` prints and what `parse_args`
//! makes of them.

use std::time::Duration;

/// Demo parameters (`grasp-sync demo --relays N --repos M --events K --seed S`).
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Remote relays.
    pub relays: usize,
    /// Repositories (default: 2 per relay).
    pub repos: Option<usize>,
    /// Events besides announcements (default: 20 per relay).
    pub events: Option<usize>,
    /// Seed of everything random in the scenario and the engine.
    pub seed: u64,
    /// Give up after this long.
    pub timeout: Duration,
    /// Serve every relay over `wss://` with the test CA.
    pub tls: bool,
    /// After converging, let the engine idle this many seconds and measure it.
    pub idle: u64,
    /// A third of the remote relays misbehave, one fault each.
    pub chaos: bool,
    /// Busy issues (each with [`BUSY_REPLIES`](super::profiles::BUSY_REPLIES)
    /// replies, on a capped relay read by REQ). Default: one per 20
    /// relays, at most 8, and none with `--chaos` (see
    /// [`DemoOptions::busy_issues`]).
    pub busy: Option<usize>,
    /// Engines run side by side, one per shard (`--shard I/N`) of the
    /// remote relays, over the one own relay.
    pub shards: u32,
    /// After converging (and idling), every relay leaves a message of
    /// this many KiB unfinished, and the engine's RSS is measured (see
    /// `unfinished`); 0 for none.
    pub unfinished_kib: u64,
    /// The engine's `--max-unfinished-bytes`, when given: what the
    /// `--unfinished-kib` measurement may cost at most.
    pub max_unfinished_bytes: Option<u64>,
}

impl DemoOptions {
    /// How many busy issues the run has. By default one per 20 relays (a
    /// relay read by REQ is read again in full by the restarted engine,
    /// and the restart is the negentropy demonstration, so a smaller run
    /// has none), at most 8, and none with `--chaos`: with both, the
    /// engine has been seen to page a busy issue's filters on the
    /// misbehaving relays for minutes and pass its memory ceiling
    /// (`--chaos --busy 2` shows it).
    pub fn busy_issues(&self, farm_len: usize) -> usize {
        match self.busy {
            Some(n) => n,
            None if self.chaos => 0,
            None => (farm_len / 20).min(8),
        }
    }
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            relays: 20,
            repos: None,
            events: None,
            seed: 1,
            timeout: Duration::from_secs(300),
            tls: false,
            idle: 0,
            chaos: false,
            busy: None,
            shards: 1,
            unfinished_kib: 0,
            max_unfinished_bytes: None,
        }
    }
}

/// The demo's flags for `demo --help`: name, value placeholder (empty for
/// a switch) and meaning. `parse_args` accepts exactly these.
const FLAGS: &[(&str, &str, &str)] = &[
    ("--relays", "N", "remote relays (default 20)"),
    ("--repos", "M", "repositories (default: 2 per relay)"),
    (
        "--events",
        "K",
        "events besides announcements (default: 20 per relay)",
    ),
    (
        "--seed",
        "S",
        "seed of the scenario and the engine (default 1)",
    ),
    (
        "--timeout-secs",
        "SECS",
        "give up after this long (default 300)",
    ),
    (
        "--idle-secs",
        "SECS",
        "after converging, idle this long and measure it (default 0)",
    ),
    ("--tls", "", "serve every relay over wss:// with a test CA"),
    (
        "--chaos",
        "",
        "a third of the remote relays misbehave, one fault each",
    ),
    (
        "--busy",
        "N",
        "busy issues on a capped relay (default: one per 20 relays, at most 8)",
    ),
    (
        "--shards",
        "N",
        "engines side by side, one per shard of the remote relays (default 1)",
    ),
    (
        "--unfinished-kib",
        "KIB",
        "after converging, every relay leaves a message this large unfinished (default 0)",
    ),
    (
        "--max-unfinished-bytes",
        "BYTES",
        "the engine's cap on unfinished messages over all relays (default: the engine's)",
    ),
];

/// What `grasp-sync demo --help` prints.
pub fn help_text() -> String {
    let mut out = String::from(
        "Usage:\n  grasp-sync demo [OPTIONS]\n\n\
         Runs the real engine over real sockets against simulated relays on \
         127.0.0.1 and checks every expected event reached the own relay; the last \
         line is a summary scripts parse (exit 0: all synced).\n\nOptions:\n",
    );
    for (name, value, help) in FLAGS {
        let usage = if value.is_empty() {
            name.to_string()
        } else {
            format!("{name} <{value}>")
        };
        out.push_str(&format!("  {usage}\n      {help}\n"));
    }
    out.push_str("  -h, --help\n      Print this help and exit.\n");
    out
}

/// Parses `demo` flags.
pub fn parse_args(args: &[String]) -> Result<DemoOptions, String> {
    let mut opts = DemoOptions::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (flag.as_str(), None),
        };
        let mut value = |what: &str| -> Result<u64, String> {
            let v = inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or(format!("{name}: missing value"))?;
            v.trim()
                .parse::<u64>()
                .map_err(|_| format!("{name}: invalid value {v:?} (expected {what})"))
        };
        match name {
            "--relays" => opts.relays = value("a positive integer")?.max(1) as usize,
            "--repos" => opts.repos = Some(value("a positive integer")?.max(1) as usize),
            "--events" => opts.events = Some(value("an integer")? as usize),
            "--seed" => opts.seed = value("an integer")?,
            "--timeout-secs" => opts.timeout = Duration::from_secs(value("seconds")?.max(1)),
            "--idle-secs" => opts.idle = value("seconds")?,
            "--busy" => opts.busy = Some(value("an integer")? as usize),
            "--shards" => opts.shards = value("a positive integer")?.clamp(1, 64) as u32,
            "--unfinished-kib" => opts.unfinished_kib = value("KiB")?,
            "--max-unfinished-bytes" => opts.max_unfinished_bytes = Some(value("bytes")?),
            "--tls" if inline.is_none() => opts.tls = true,
            "--chaos" if inline.is_none() => opts.chaos = true,
            _ => {
                return Err(format!("demo: unknown flag {flag} (see demo --help)"));
            }
        }
    }
    Ok(opts)
}
