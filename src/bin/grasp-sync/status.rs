//! `grasp-sync status [--metrics ADDR]`: a running engine's status view
//! in the terminal. It fetches `/status.json` from the engine's metrics
//! port (one blocking request: this is a command, not the loop) and
//! prints the first sync's progress, the own relay and a table of relays,
//! problems first (the engine sorted them).
//!
//! ADDR is `--metrics`, else `GRASP_SYNC_METRICS` (what the engine it asks
//! reads, so the same environment finds it), else the shipped units'
//! 127.0.0.1:9478. When nothing answers there, or something that is not
//! grasp-sync's status does (too large, too slow, not its JSON), it says
//! so naming the address and exits 1; a usage error exits 2.
//!
//! Whatever answers at ADDR is untrusted: the request is bounded
//! (`request`) and every string printed passes one sanitiser (`shown`).

mod request;
mod shown;

use std::process::ExitCode;
use std::time::Duration;

use grasp_sync::internal::spoken;
use grasp_sync::status::{RelayStatus, SCHEMA, StatusReport};

use request::Failure;
use shown::cell;

/// Where the shipped units serve metrics (`examples/grasp-sync.default`).
const DEFAULT_ADDR: &str = "127.0.0.1:9478";

/// The usage line `--help` shows.
pub const USAGE: &str = "  grasp-sync status [--metrics <ip:port>]   \
     (a running engine's relays, problems first; default $GRASP_SYNC_METRICS, else 127.0.0.1:9478)\n";

/// Widest cells of the table; longer ones are cut with `…`.
const STATE_WIDTH: usize = 32;
const URL_WIDTH: usize = 48;
const PROBLEM_WIDTH: usize = 40;
/// Widest version shown.
const VERSION_WIDTH: usize = 40;
/// Widest own relay URL, state file path or error shown.
const TEXT_WIDTH: usize = 160;
/// Widest error message about the answer.
const ERROR_WIDTH: usize = 400;

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
            eprintln!("grasp-sync status: {}", cell(&e, ERROR_WIDTH));
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
    let response = request::get(addr, "/status.json").map_err(|e| match e {
        Failure::Unreachable(e) => {
            format!("no grasp-sync answers at {addr} ({e}); is it running with --metrics {addr}?")
        }
        Failure::Bad(why) => not_ours(addr, &why),
    })?;
    let split = response.windows(4).position(|w| w == b"\r\n\r\n");
    let Some(at) = split else {
        return Err(not_ours(addr, "no HTTP response"));
    };
    let (head, body) = (
        String::from_utf8_lossy(&response[..at]),
        &response[at + 4..],
    );
    let status_line = head.lines().next().unwrap_or_default();
    if !status_line.starts_with("HTTP/1.1 200") {
        return Err(not_ours(addr, status_line));
    }
    let report: StatusReport =
        serde_json::from_slice(body).map_err(|e| not_ours(addr, &format!("its JSON: {e}")))?;
    if report.schema != SCHEMA {
        let why = format!("schema {}, this grasp-sync reads {SCHEMA}", report.schema);
        return Err(not_ours(addr, &why));
    }
    Ok(report)
}

/// The error for an answer that is not the status view.
fn not_ours(addr: &str, why: &str) -> String {
    format!("{addr} answered, but not as grasp-sync's status ({why})")
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
        cell(&r.version, VERSION_WIDTH),
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
            (_, Some(e)) => format!("last save FAILED: {}", cell(e, TEXT_WIDTH)),
            (Some(at), None) => format!("saved {} ({} bytes)", ago(at), s.saved_bytes.unwrap_or(0)),
            (None, None) => "not saved yet".to_owned(),
        };
        out += &format!("state file {}: {saved}\n", cell(&s.path, TEXT_WIDTH));
    }
    out += &format!(
        "\n{} relays, {} with problems\n",
        r.relays_total, r.problems_total
    );
    out += &table(&r.relays, now);
    let shown = r.relays_offset.saturating_add(r.relays.len());
    if shown < r.relays_total {
        out += &format!(
            "... {} more relays: /status.json?offset={shown}\n",
            r.relays_total - shown
        );
    }
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
        cell(&o.url, TEXT_WIDTH),
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
            let state = cell(&state, STATE_WIDTH);
            let last = r.last_event_at.map_or("never".to_owned(), |at| {
                format!(
                    "{} ago",
                    spoken(Duration::from_secs(now.saturating_sub(at)))
                )
            });
            [
                state,
                cell(&r.url, URL_WIDTH),
                cell(r.problem.as_deref().unwrap_or("-"), PROBLEM_WIDTH),
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
}
