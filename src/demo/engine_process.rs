//! The engine under test, run as a child process: the real `grasp-sync`
//! binary with its real flags, so the demo exercises exactly what operators
//! run, and the engine's memory and CPU are measured apart from the
//! simulated relays.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running engine child.
pub struct EngineProcess {
    child: Child,
    metrics: SocketAddr,
    ca_file: Option<PathBuf>,
}

impl EngineProcess {
    /// Starts `grasp-sync --own-relay <own> ...` with demo timings.
    pub fn spawn(
        own: &str,
        relays: usize,
        seed: u64,
        ca_pem: Option<&str>,
    ) -> Result<EngineProcess, String> {
        let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let metrics = SocketAddr::from(([127, 0, 0, 1], port));
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
        .args(["--metrics", &metrics.to_string()])
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null());
        let ca_file = match ca_pem {
            Some(pem) => {
                let path = std::env::temp_dir()
                    .join(format!("grasp-sync-demo-ca-{}.pem", std::process::id()));
                std::fs::write(&path, pem).map_err(|e| format!("{}: {e}", path.display()))?;
                cmd.arg("--extra-ca-file").arg(&path);
                Some(path)
            }
            None => None,
        };
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting the engine: {e}"))?;
        Ok(EngineProcess {
            child,
            metrics,
            ca_file,
        })
    }

    /// One metric value (name with labels) from the engine's `/metrics`.
    pub fn metric(&self, name: &str) -> Option<u64> {
        let text = http_get(self.metrics)?;
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
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
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(path) = &self.ca_file {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn http_get(addr: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: demo\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}
