//! `grasp-sync status` against listeners that are not grasp-sync (issue
//! 44): whatever answers at ADDR chose every byte. Escape sequences and
//! bidi controls in any string reach the terminal escaped; a huge answer,
//! a dripping one and a huge cell are bounded; a bad answer exits 1
//! naming the address and what was wrong.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use grasp_sync::status::SCHEMA;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_grasp-sync");

/// Terminal controls a hostile answer carries: clear screen, an OSC 0
/// window title, an OSC 52 clipboard write, a right-to-left override and
/// a line separator.
const HOSTILE: &str =
    "\u{1b}[2J\u{1b}]0;pwned\u{7}\u{1b}]52;c;cm0gLXJmIH4=\u{7}\u{202e}txt.exe\u{2028}\u{200b}";

/// A listener at an OS-picked port answering one connection with what
/// `answer` writes (its errors ignored: the client may hang up).
fn listener(answer: impl FnOnce(&mut TcpStream) + Send + 'static) -> (String, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let _ = s.read(&mut [0u8; 4096]);
        answer(&mut s);
    });
    (addr, server)
}

/// `grasp-sync status --metrics addr`, killed if it outlives `secs`; its
/// output and how long it ran.
fn status(addr: &str, secs: u64) -> (Output, Duration) {
    let start = Instant::now();
    let mut child = Command::new(BIN)
        .args(["status", "--metrics", addr])
        .env_remove("GRASP_SYNC_METRICS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        out.read_to_end(&mut bytes).map(|_| bytes)
    });
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(secs) {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = start.elapsed();
    let mut output = child.wait_with_output().unwrap();
    output.stdout = reader.join().unwrap().unwrap();
    (output, took)
}

fn relay(url: &str, state: &str, problem: &str) -> Value {
    json!({
        "url": url, "state": state, "problem": problem, "status": "disconnected",
        "health": "dead", "retry_at": null, "failures": 3, "penalties": 0,
        "connected_at": null, "disconnected_at": null, "history_done": false, "live": false,
        "items": [1, 0, 0, 0], "subscriptions_open": 0, "live_filters": 0,
        "limits": {"subscriptions": 10, "filters_per_req": 10, "page_limit": 500,
                   "result_cap": null, "tag_values": 10, "kinds": null, "value_bytes": null},
        "negentropy": null, "last_event_at": null, "events_received": 0,
        "events_ingested": 0, "refusals": 0, "bootstrap": false
    })
}

/// A status view as the engine serves it, with `text` in every string
/// the CLI prints and `relays` as its relays.
fn report(text: &str, relays: Vec<Value>) -> Value {
    json!({
        "schema": SCHEMA, "version": format!("0.1.0{text}"), "generated_at": 2000,
        "started_at": 1000, "shard": [0, 1],
        "first_sync": {"state": "running", "relays_total": 1, "relays_done": 0,
            "relays_failing": 1, "items_total": 1, "items_done": 0, "events_stored": 0,
            "events_per_sec": 0.0, "eta_secs": null, "finished_at": null},
        "own_relay": {"url": format!("ws://own{text}"), "write_connected": true,
            "read_connected": true, "failures": 0, "stored_per_sec": 0.0,
            "throttled_per_minute": null, "outbox_depth": 0, "outbox_capacity": 10000,
            "held_back": 0, "reads_paused": 0, "stored": 0, "duplicate": 0, "rejected": 0,
            "set_aside": 0, "refusals": 0},
        "state_file": {"path": format!("/var/lib/x{text}"), "saved_at": null,
            "saved_bytes": null, "error": format!("disk full{text}")},
        "totals": {"events_received": 0, "events_ingested": 0, "refusals": 0,
            "bytes_in": 0, "bytes_out": 0},
        "relays_total": relays.len(), "problems_total": relays.len(),
        "relays_offset": 0, "relays_limit": 500,
        "relays": relays
    })
}

fn http_200(body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// The CLI exited 1 naming `addr` and `why` the answer was not the status.
fn assert_refused(o: &Output, addr: &str, why: &str) {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "{addr} answered, but not as grasp-sync's status {why}"
        )),
        "{err}"
    );
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn terminal_controls_in_any_string_are_printed_escaped() {
    let relays = vec![relay(
        &format!("wss://r.example/{HOSTILE}"),
        &format!("dead{HOSTILE}"),
        &format!("unreachable{HOSTILE}"),
    )];
    let body = report(HOSTILE, relays).to_string();
    let (addr, server) = listener(move |s| {
        let _ = s.write_all(&http_200(body.as_bytes()));
    });
    let (o, _) = status(&addr, 60);
    server.join().unwrap();
    let out = text(&o.stdout);
    assert!(o.status.success(), "{out}{}", text(&o.stderr));
    for raw in ['\u{1b}', '\u{7}', '\u{202e}', '\u{2028}', '\u{200b}'] {
        assert!(!out.contains(raw), "{raw:?} reached the terminal: {out:?}");
    }
    for field in [
        "0.1.0",
        "ws://own",
        "/var/lib/x",
        "disk full",
        "wss://r.example/",
    ] {
        let escaped = format!("{field}\\u{{1b}}[2J");
        assert!(out.contains(&escaped), "{field} shown escaped: {out}");
    }
    assert!(out.contains("dead\\u{1b}[2J"), "the state escaped: {out}");
    assert!(
        out.contains("unreachable\\u{1b}"),
        "the problem escaped: {out}"
    );
}

#[test]
fn a_huge_answer_is_cut_off_and_named() {
    let (addr, server) = listener(|s| {
        let head = "HTTP/1.1 200 OK\r\nContent-Length: 67108864\r\n\r\n";
        let _ = s.write_all(head.as_bytes());
        let chunk = vec![b' '; 1 << 20];
        for _ in 0..64 {
            if s.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let (o, _) = status(&addr, 60);
    server.join().unwrap();
    assert_refused(&o, &addr, "(an answer over 4 MiB)");
}

#[test]
fn a_dripping_answer_meets_one_deadline_for_the_whole_request() {
    let (addr, server) = listener(|s| {
        // One byte a second for up to a minute: each read is quick, the
        // whole answer never comes.
        for b in b"HTTP/1.1 200 OK\r\n".iter().cycle().take(60) {
            if s.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    let (o, took) = status(&addr, 120);
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert_refused(&o, &addr, "(no whole answer within 10 s)");
    server.join().unwrap();
}

#[test]
fn a_huge_cell_is_cut_to_its_column() {
    let mut relays: Vec<Value> = (0..1000)
        .map(|i| relay(&format!("wss://r{i}.example"), "dead", "unreachable"))
        .collect();
    relays[0] = relay(
        "wss://wide.example",
        &"s".repeat(50 * 1024),
        &"p".repeat(50 * 1024),
    );
    let body = report("", relays).to_string();
    let (addr, server) = listener(move |s| {
        let _ = s.write_all(&http_200(body.as_bytes()));
    });
    let (o, _) = status(&addr, 60);
    server.join().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let widest = out.lines().map(|l| l.chars().count()).max().unwrap();
    assert!(widest < 400, "a line of {widest} characters");
    assert!(out.len() < 400 * 1024, "{} bytes printed", out.len());
}

#[test]
fn answers_that_are_not_the_status_exit_1_naming_the_address_and_why() {
    let wrong_schema = report("", vec![])
        .as_object()
        .map(|o| {
            let mut o = o.clone();
            o.insert("schema".into(), json!(999));
            Value::Object(o).to_string()
        })
        .unwrap();
    for (answer, why) in [
        (
            b"HTTP/1.1 404 Not Found\r\n\r\nno".to_vec(),
            "(HTTP/1.1 404 Not Found)",
        ),
        (b"garbage".to_vec(), "(no HTTP response)"),
        (http_200(b"{\"x\": 1}"), "(its JSON: "),
        (
            http_200(wrong_schema.as_bytes()),
            "(schema 999, this grasp-sync reads",
        ),
        (
            b"HTTP/1.1 500 \x1b]0;pwned\x07\r\n\r\n".to_vec(),
            "(HTTP/1.1 500 \\u{1b}]0;pwned\\u{7})",
        ),
    ] {
        let (addr, server) = listener(move |s| {
            let _ = s.write_all(&answer);
        });
        let (o, _) = status(&addr, 60);
        server.join().unwrap();
        assert_refused(&o, &addr, why);
        assert!(!text(&o.stderr).contains('\u{1b}'), "{:?}", text(&o.stderr));
    }
}
