//! `grasp-sync status [--metrics ADDR]`: a running engine's status view
//! in the terminal. It fetches `/status.json` from the engine's metrics
//! port (one blocking request: this is a command, not the loop) and
//! prints the first sync's progress, the own relay and a table of relays,
//! problems first (the engine sorted them).
//!
//! ADDR is `--metrics`, else `GRASP_SYNC_METRICS` (what the engine it asks
//! reads, so the same environment finds it), else the shipped units'
//! 127.0.0.1:9478. When nothing answers there, or something that is not
//! grasp-sync's status does, it says so naming the address and exits 1; a
//! usage error exits 2.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use grasp_sync::internal::spoken;
use grasp_sync::status::{RelayStatus, SCHEMA, StatusReport};

/// Where the shipped units serve metrics (`examples/grasp-sync.default`).
const DEFAULT_ADDR: &str = "127.0.0.1:9478";

/// How long the engine may take to answer: its loop serves the page
/// between relays' messages, within its own 5 s deadline.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The usage line `--help` shows.
pub const USAGE: &str = "  grasp-sync status [--metrics <ip:port>]   \
     (a running engine's relays, problems first; default $GRASP_SYNC_METRICS, else 127.0.0.1:9478)\n";

/// Widest URL and problem columns; longer ones are cut with `…`.
const URL_WIDTH: usize = 48;
const PROBLEM_WIDTH: usize = 40;

/// Runs the subcommand on its arguments (after `status`).
pub fn main(args: &[String]) -> ExitCode {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("Usage:\n{USAGE}");
        return ExitCode::SUCCESS;
    }
    let addr = match address(args, std::env::var("GRASP_SYNC_METRICS").ok()) {
        Ok(addr) => addr,
        Err(e) => {
            eprintln!("grasp-sync status: {e}");
            return ExitCode::from(2);
        }
    };
    match fetch(&addr) {
        Ok(report) => {
            print!("{}", render(&report));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("grasp-sync status: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The address to ask: `--metrics ADDR` or `--metrics=ADDR`, else `env`,
/// else [`DEFAULT_ADDR`].
fn address(args: &[String], env: Option<String>) -> Result<String, String> {
    let mut given = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let value = match arg.strip_prefix("--metrics") {
            Some("") => args.next().ok_or("--metrics needs an address (ip:port)")?,
            Some(rest) if rest.starts_with('=') => &rest[1..],
            _ => {
                return Err(format!(
                    "unexpected argument {arg:?} (usage:{})",
                    USAGE.trim_end()
                ));
            }
        };
        if given.replace(value.to_owned()).is_some() {
            return Err("--metrics given twice".to_owned());
        }
    }
    Ok(given.or(env).unwrap_or_else(|| DEFAULT_ADDR.to_owned()))
}

/// `/status.json` from the engine at `addr`, or why not, naming `addr`.
fn fetch(addr: &str) -> Result<StatusReport, String> {
    let nothing = |e: &dyn std::fmt::Display| {
        format!("no grasp-sync answers at {addr} ({e}); is it running with --metrics {addr}?")
    };
    let targets: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| format!("{addr} is not an address to ask ({e})"))?
        .collect();
    let mut stream = targets
        .iter()
        .find_map(|a| TcpStream::connect_timeout(a, TIMEOUT).ok())
        .ok_or_else(|| nothing(&"connection refused or timed out"))?;
    let request = format!("GET /status.json HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut response = Vec::new();
    stream
        .set_read_timeout(Some(TIMEOUT))
        .and_then(|()| stream.write_all(request.as_bytes()))
        .and_then(|()| stream.read_to_end(&mut response))
        .map_err(|e| nothing(&e))?;
    let not_ours = |why: &str| format!("{addr} answered, but not as grasp-sync's status ({why})");
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| not_ours("no HTTP response"))?;
    let status_line = head.lines().next().unwrap_or_default();
    if !status_line.starts_with("HTTP/1.1 200") {
        return Err(not_ours(status_line));
    }
    let report: StatusReport =
        serde_json::from_str(body).map_err(|e| not_ours(&format!("its JSON: {e}")))?;
    if report.schema != SCHEMA {
        return Err(not_ours(&format!(
            "schema {}, this grasp-sync reads {SCHEMA}",
            report.schema
        )));
    }
    Ok(report)
}

/// The view as text: a few lines of summary, then the relays' table.
fn render(r: &StatusReport) -> String {
    let now = r.generated_at;
    let ago = |at: u64| {
        format!(
            "{} ago",
            spoken(Duration::from_secs(now.saturating_sub(at)))
        )
    };
    let mut out = format!(
        "grasp-sync {}, shard {}/{}, up {}\n",
        r.version,
        r.shard[0],
        r.shard[1],
        spoken(Duration::from_secs(now.saturating_sub(r.started_at)))
    );
    let f = &r.first_sync;
    let failing = if f.relays_failing > 0 {
        format!(" ({} failing)", f.relays_failing)
    } else {
        String::new()
    };
    let when = match (f.finished_at, f.eta_secs) {
        (Some(at), _) => format!("done {}", ago(at)),
        (None, Some(eta)) => format!("about {} left", spoken(Duration::from_secs(eta))),
        (None, None) => "time left unknown".to_owned(),
    };
    out += &format!(
        "first sync: {}/{} relays done{failing}, {} events stored, {} events/s, {when}\n",
        f.relays_done, f.relays_total, f.events_stored, f.events_per_sec
    );
    out += &own_relay_line(r);
    if let Some(s) = &r.state_file {
        let saved = match (s.saved_at, &s.error) {
            (_, Some(e)) => format!("last save FAILED: {e}"),
            (Some(at), None) => format!("saved {} ({} bytes)", ago(at), s.saved_bytes.unwrap_or(0)),
            (None, None) => "not saved yet".to_owned(),
        };
        out += &format!("state file {}: {saved}\n", s.path);
    }
    let problems = r.relays.iter().filter(|x| x.problem.is_some()).count();
    out += &format!("\n{} relays, {problems} with problems\n", r.relays.len());
    out += &table(&r.relays, now);
    out
}

fn own_relay_line(r: &StatusReport) -> String {
    let o = &r.own_relay;
    let link = |up: Option<bool>| match up {
        Some(true) => "open",
        Some(false) => "DOWN",
        None => "none",
    };
    let throttled = o
        .throttled_per_minute
        .map_or("not throttled".to_owned(), |n| {
            format!("THROTTLED to {n} events a minute")
        });
    format!(
        "own relay {}: write {}, read {}; outbox {}/{}, {} held back, reads of {} relays paused; \
         {} stored/s, {} stored, {} duplicate, {} rejected, {} set aside; {throttled}\n",
        o.url,
        link(o.write_connected),
        link(o.read_connected),
        o.outbox_depth,
        o.outbox_capacity,
        o.held_back,
        o.reads_paused,
        o.stored_per_sec,
        o.stored,
        o.duplicate,
        o.rejected,
        o.set_aside,
    )
}

/// The relays as aligned columns, in the engine's order (problems first).
fn table(relays: &[RelayStatus], now: u64) -> String {
    let header = [
        "STATE",
        "RELAY",
        "PROBLEM",
        "HISTORY",
        "LAST EVENT",
        "EVENTS",
        "NEW",
        "REFUSALS",
    ];
    let rows: Vec<[String; 8]> = relays
        .iter()
        .map(|r| {
            let state = match r.retry_at {
                Some(at) => format!(
                    "{} (retry in {})",
                    r.state,
                    spoken(Duration::from_secs(at.saturating_sub(now)))
                ),
                None => r.state.clone(),
            };
            let last = r.last_event_at.map_or("never".to_owned(), |at| {
                format!(
                    "{} ago",
                    spoken(Duration::from_secs(now.saturating_sub(at)))
                )
            });
            [
                state,
                cut(&r.url, URL_WIDTH),
                cut(r.problem.as_deref().unwrap_or("-"), PROBLEM_WIDTH),
                if r.history_done { "done" } else { "reading" }.to_owned(),
                last,
                r.events_received.to_string(),
                r.events_ingested.to_string(),
                r.refusals.to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out += padded.join("  ").trim_end();
        out.push('\n');
    };
    line(&header);
    for row in &rows {
        line(&row.each_ref().map(String::as_str));
    }
    out
}

/// `text` cut to `width` characters, the cut marked.
fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(width - 1).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_address_is_the_flag_then_the_variable_then_the_units_default() {
        let env = Some("10.0.0.1:9500".to_owned());
        assert_eq!(
            address(&args(&["--metrics", "1.2.3.4:5"]), env.clone()).unwrap(),
            "1.2.3.4:5"
        );
        assert_eq!(
            address(&args(&["--metrics=1.2.3.4:6"]), None).unwrap(),
            "1.2.3.4:6"
        );
        assert_eq!(address(&[], env).unwrap(), "10.0.0.1:9500");
        assert_eq!(address(&[], None).unwrap(), "127.0.0.1:9478");
        assert!(address(&args(&["--metrics"]), None).is_err());
        assert!(address(&args(&["extra"]), None).is_err());
        assert!(address(&args(&["--metrics", "a:1", "--metrics", "b:2"]), None).is_err());
    }

    #[test]
    fn long_cells_are_cut_and_marked() {
        assert_eq!(cut("wss://short", 20), "wss://short");
        assert_eq!(cut("abcdefgh", 5), "abcd…");
    }
}
