//! The engine under test, run as a child process: the real `grasp-sync`
//! binary with its real flags, so the demo exercises exactly what operators
//! run, and the engine's memory and CPU are measured apart from the
//! simulated relays.
//!
//! Secrets reach it the way operators give them: the test CA and the
//! NIP-42 key in files (`--extra-ca-file`, `--auth-key-file`), written
//! only readable by us and deleted when the child is gone.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use grasp_sync::Shard;
use nostr::prelude::Keys;

/// Longest the counters are given to settle after the last event arrived.
const SETTLE_MAX: Duration = Duration::from_secs(5);

/// Two scrapes this far apart that agree mean the engine went quiet.
const SETTLE_STEP: Duration = Duration::from_millis(500);

/// Longest the engine may take to print the metrics address it bound.
const METRICS_ADDR_WAIT: Duration = Duration::from_secs(30);

/// What the engine prints on stdout before the address its metrics got.
const METRICS_LINE: &str = "grasp-sync: metrics on ";

/// A running engine child.
pub struct EngineProcess {
    child: Child,
    metrics: SocketAddr,
    /// The CA and key files: held only to be deleted on drop, after the
    /// child.
    _files: Vec<TempFile>,
}

/// The engine counters the demo reports (NIP-77, NIP-42, downloads, sink
/// refusals), read from its metrics in one scrape.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// Negentropy reconciliations started.
    pub neg_sessions: u64,
    /// `NEG-MSG` rounds.
    pub neg_rounds: u64,
    /// Ids negentropy found missing (and fetched).
    pub neg_ids_fetched: u64,
    /// Negentropy jobs given back to REQ.
    pub neg_fallbacks: u64,
    /// Events the own relay listed for negentropy.
    pub sink_listed: u64,
    /// AUTH events sent.
    pub auth_attempts: u64,
    /// AUTH events the relay rejected.
    pub auth_rejected: u64,
    /// Subscriptions refused with `auth-required:`.
    pub auth_required: u64,
    /// Events received from remote relays (downloaded).
    pub events_received: u64,
    /// Events the own relay refused (e.g. a bad id or signature).
    pub sink_rejected: u64,
    /// Events the own relay could not take, set aside by the outbox.
    pub sink_set_aside: u64,
    /// Repos (and roots) a relay cannot be asked for: it refuses a value.
    pub unreachable_values: u64,
    /// Seconds a relay without NIP-77 cannot be read whole in.
    pub unreachable_seconds: u64,
    /// Seconds past a relay's cap asked again in parts or by NIP-77.
    pub seconds_split: u64,
}

impl EngineProcess {
    /// Starts `grasp-sync --own-relay <own> --shard <shard> ...` with demo
    /// timings; trusts `ca_pem` when given and answers NIP-42 challenges
    /// with `auth_key` when given, and passes `max_unfinished_bytes` on
    /// when given. Its metrics listen on a port the kernel
    /// picks (`127.0.0.1:0`), read back from the line the engine prints:
    /// a port picked here and released would be free for any other
    /// process on a busy machine to take before the engine binds it.
    pub fn spawn(
        own: &str,
        relays: usize,
        seed: u64,
        ca_pem: Option<&str>,
        auth_key: Option<&Keys>,
        shard: Shard,
        max_unfinished_bytes: Option<u64>,
    ) -> Result<EngineProcess, String> {
        let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
        let mut cmd = Command::new(exe);
        cmd.args([
            "--own-relay",
            own,
            "--allow-private-addresses",
            "--batch-window-ms",
            "500",
            "--backoff-base-secs",
            "1",
        ])
        .args([
            "--max-relays",
            &(relays + 10).to_string(),
            "--seed",
            &seed.to_string(),
        ])
        .args(["--metrics", "127.0.0.1:0", "--shard", &shard.to_string()])
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
        // The demo's engine is configured by its flags alone: an operator's
        // GRASP_SYNC_* settings (a state file, say) would change what the
        // demo checks.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("GRASP_SYNC_") {
                cmd.env_remove(name);
            }
        }
        if let Some(bytes) = max_unfinished_bytes {
            cmd.arg(format!("--max-unfinished-bytes={bytes}"));
        }
        let mut files = Vec::new();
        if let Some(pem) = ca_pem {
            let file = TempFile::write("ca.pem", pem)?;
            cmd.arg("--extra-ca-file").arg(&file.path);
            files.push(file);
        }
        if let Some(keys) = auth_key {
            let file = TempFile::write("auth.key", &keys.secret_key().to_secret_hex())?;
            cmd.arg("--auth-key-file").arg(&file.path);
            files.push(file);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting the engine: {e}"))?;
        let stdout = child.stdout.take();
        // The child is killed on drop if its address never comes.
        let mut process = EngineProcess {
            child,
            metrics: SocketAddr::from(([127, 0, 0, 1], 0)),
            _files: files,
        };
        process.metrics = stdout
            .ok_or("the engine's stdout is not piped")
            .and_then(|out| metrics_addr(out).ok_or("the engine printed no metrics address"))?;
        Ok(process)
    }

    /// Where its metrics and status pages are served.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics
    }

    /// The counters so far (zeros if the metrics cannot be read).
    pub fn counters(&self) -> EngineCounters {
        let text = http_get(self.metrics).unwrap_or_default();
        let get = |name: &str| value(&text, name).unwrap_or(0);
        let neg = |event: &str| get(&format!("grasp_sync_negentropy_total{{event=\"{event}\"}}"));
        let auth = |event: &str| get(&format!("grasp_sync_auth_total{{event=\"{event}\"}}"));
        EngineCounters {
            neg_sessions: neg("session"),
            neg_rounds: neg("round"),
            neg_ids_fetched: neg("id_fetched"),
            neg_fallbacks: neg("fallback"),
            sink_listed: neg("sink_listed"),
            auth_attempts: auth("attempt"),
            auth_rejected: auth("rejected"),
            auth_required: auth("auth_required"),
            events_received: get("grasp_sync_events_total{outcome=\"received\"}"),
            sink_rejected: get("grasp_sync_sink_events_total{outcome=\"rejected\"}"),
            sink_set_aside: get("grasp_sync_sink_events_total{outcome=\"set_aside\"}"),
            unreachable_values: get("grasp_sync_unreachable_total{cause=\"value\"}"),
            unreachable_seconds: get("grasp_sync_unreachable_total{cause=\"second\"}"),
            seconds_split: get("grasp_sync_seconds_split_total "),
        }
    }

    /// One metric value (name with labels) from the engine's `/metrics`.
    pub fn metric(&self, name: &str) -> Option<u64> {
        value(&http_get(self.metrics)?, name)
    }

    /// The counters once the engine went quiet: the last expected event
    /// may arrive while other relays are still reconciling (finding nothing
    /// missing), and the figures should include them. At most
    /// [`SETTLE_MAX`]: misbehaving relays keep some counters moving for
    /// good.
    pub fn settled_counters(&self) -> EngineCounters {
        let until = Instant::now() + SETTLE_MAX;
        let mut last = self.counters();
        loop {
            std::thread::sleep(SETTLE_STEP);
            let now = self.counters();
            if now == last || Instant::now() >= until {
                return now;
            }
            last = now;
        }
    }

    /// Peak and current resident memory of the engine, KiB.
    pub fn rss_kib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("VmHWM:"), field("VmRSS:"))
    }

    /// CPU time the engine used so far (user + system).
    pub fn cpu_time(&self) -> Duration {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the parenthesised command name; utime and stime are 14th and 15th overall.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let fields: Vec<u64> = rest
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
        // SAFETY: sysconf with a valid name has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Duration::from_millis(ticks * 1000 / hz)
    }

    /// SIGTERM, then the exit code (None if it had to be killed).
    pub fn stop(mut self) -> Option<i32> {
        // SAFETY: kill with a pid we spawned and a valid signal number.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        // The files go (TempFile's drop) once the child is gone.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl std::ops::Add for EngineCounters {
    type Output = EngineCounters;

    /// Counters of two engine runs together.
    fn add(self, o: EngineCounters) -> EngineCounters {
        EngineCounters {
            neg_sessions: self.neg_sessions + o.neg_sessions,
            neg_rounds: self.neg_rounds + o.neg_rounds,
            neg_ids_fetched: self.neg_ids_fetched + o.neg_ids_fetched,
            neg_fallbacks: self.neg_fallbacks + o.neg_fallbacks,
            sink_listed: self.sink_listed + o.sink_listed,
            auth_attempts: self.auth_attempts + o.auth_attempts,
            auth_rejected: self.auth_rejected + o.auth_rejected,
            auth_required: self.auth_required + o.auth_required,
            events_received: self.events_received + o.events_received,
            sink_rejected: self.sink_rejected + o.sink_rejected,
            sink_set_aside: self.sink_set_aside + o.sink_set_aside,
            unreachable_values: self.unreachable_values + o.unreachable_values,
            unreachable_seconds: self.unreachable_seconds + o.unreachable_seconds,
            seconds_split: self.seconds_split + o.seconds_split,
        }
    }
}

/// A file in the temp directory, readable by this user only, deleted on
/// drop: the CA and the key outlive no run.
struct TempFile {
    path: PathBuf,
}

impl TempFile {
    /// Writes `text` to a new file named after this process, a per-process
    /// counter and `name`, so concurrent demos and successive engine
    /// children never share one.
    fn write(name: &str, text: &str) -> Result<TempFile, String> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("grasp-sync-demo-{}-{n}-{name}", std::process::id()));
        // A new file only: never one planted in the shared temp directory
        // (a symlink would send the key elsewhere). Ours, and so deleted on
        // drop, only once created.
        let mut handle = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let file = TempFile { path };
        handle
            .write_all(text.as_bytes())
            .map_err(|e| format!("{}: {e}", file.path.display()))?;
        Ok(file)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        // Already gone is fine: the goal is no file left.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The address in the engine's `grasp-sync: metrics on ADDR` line, read
/// from its stdout on a thread (a blocking read has no deadline; the wait
/// here has). The thread keeps draining stdout afterwards, so the engine
/// never blocks on a full pipe, and ends when the engine does.
fn metrics_addr(stdout: ChildStdout) -> Option<SocketAddr> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if !sent && let Some(addr) = line.strip_prefix(METRICS_LINE) {
                sent = true;
                let _ = tx.send(addr.trim().parse::<SocketAddr>().ok());
            }
        }
    });
    rx.recv_timeout(METRICS_ADDR_WAIT).ok().flatten()
}

/// The value of metric `name` (with its labels) in Prometheus text.
fn value(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
}

fn http_get(addr: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}
