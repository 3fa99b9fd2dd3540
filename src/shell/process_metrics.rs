//! The process metrics Prometheus client libraries export (resident
//! memory, CPU seconds, open and allowed file descriptors, start time),
//! under their names, read from `/proc/self` on each scrape: no dependency,
//! and a few small reads of procfs, which the kernel answers from memory.

use std::fmt::Write as _;

/// What one scrape read; a field it could not read is left out.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct ProcessStats {
    pub resident_bytes: Option<u64>,
    pub cpu_seconds: Option<f64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub start_time_seconds: Option<f64>,
}

impl ProcessStats {
    /// Reads this process's figures (none off Linux).
    pub(crate) fn read() -> ProcessStats {
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| boot_time(&s));
        // SAFETY: sysconf has no preconditions; it only reads a constant.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let mut stats = stat
            .and_then(|s| {
                from_stat(
                    &s,
                    u64::try_from(ticks).ok()?,
                    u64::try_from(page).ok()?,
                    boot?,
                )
            })
            .unwrap_or_default();
        stats.open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as u64);
        stats.max_fds = fd_limit();
        stats
    }

    /// Appends the metrics it holds, as Prometheus text.
    pub(crate) fn render(&self, out: &mut String) {
        let rows: [(&str, &str, &str, Option<f64>); 5] = [
            (
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory size in bytes.",
                self.resident_bytes.map(|b| b as f64),
            ),
            (
                "process_cpu_seconds_total",
                "counter",
                "Total user and system CPU time spent in seconds.",
                self.cpu_seconds,
            ),
            (
                "process_open_fds",
                "gauge",
                "Number of open file descriptors.",
                self.open_fds.map(|n| n as f64),
            ),
            (
                "process_max_fds",
                "gauge",
                "Maximum number of open file descriptors.",
                self.max_fds.map(|n| n as f64),
            ),
            (
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since unix epoch in seconds.",
                self.start_time_seconds,
            ),
        ];
        for (name, kind, help, value) in rows {
            if let Some(value) = value {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
                );
            }
        }
    }
}

/// `btime` of `/proc/stat`: when the system booted, in Unix seconds.
fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// Memory, CPU and start time from `/proc/self/stat`. The command name
/// (field 2) is in parentheses and may hold spaces, so fields are counted
/// after its closing one: utime and stime are fields 14 and 15, starttime
/// 22 and rss 24 (proc(5)).
fn from_stat(stat: &str, ticks_per_sec: u64, page_bytes: u64, boot: u64) -> Option<ProcessStats> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field n of proc(5) is fields[n - 3]: the first two precede `rest`.
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let ticks = ticks_per_sec.max(1) as f64;
    Some(ProcessStats {
        resident_bytes: Some(field(24)? * page_bytes),
        cpu_seconds: Some((field(14)? + field(15)?) as f64 / ticks),
        start_time_seconds: Some(boot as f64 + field(22)? as f64 / ticks),
        ..ProcessStats::default()
    })
}

/// The soft limit on open files.
fn fd_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for getrlimit to fill.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
    ok.then_some(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with spaces and a parenthesis, as proc(5) allows.
        let stat = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0 1000 123456 300 rest";
        let got = from_stat(stat, 100, 4096, 1_700_000_000).unwrap();
        assert_eq!(got.resident_bytes, Some(300 * 4096));
        assert_eq!(got.cpu_seconds, Some(3.0));
        assert_eq!(got.start_time_seconds, Some(1_700_000_010.0));
        assert_eq!(from_stat("4242 (x) S 1", 100, 4096, 0), None);
        assert_eq!(
            boot_time("cpu 1 2\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
    }

    #[test]
    fn this_process_reads_plausibly() {
        let s = ProcessStats::read();
        assert!(s.resident_bytes.unwrap() > 1 << 20, "{s:?}");
        assert!(s.open_fds.unwrap() >= 3, "{s:?}");
        assert!(s.max_fds.unwrap() >= s.open_fds.unwrap(), "{s:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = s.start_time_seconds.unwrap();
        assert!(
            start <= now + 1.0 && start > now - 86_400.0,
            "{start} vs {now}"
        );
        let mut page = String::new();
        s.render(&mut page);
        assert!(
            page.contains("\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total ")
        );
    }
}
