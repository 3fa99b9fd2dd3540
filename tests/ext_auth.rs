//! NIP-42 AUTH end to end: the `grasp-sync` binary against rust-nostr's
//! LocalRelay (nostr-sdk 0.45.1 wheel) started with its own `nip42`
//! option, all on 127.0.0.1 with OS-picked ports. LocalRelay challenges
//! only when it refuses (`["AUTH", c]`, then `CLOSED`/`OK false` with
//! `auth-required:`), so these tests see the engine meet AUTH the way it
//! meets it in the wild: mid-conversation, on work already sent. The last
//! test replays, in the simulated world, the own-relay bug these found.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nostr::prelude::*;
use support::real::{GraspSync, PyRelay, free_port, missing_as, publish, publish_as};
use support::running::{http_get, wait_for};
use support::*;
use tungstenite::Message;

fn ids(events: &[Event]) -> Vec<EventId> {
    events.iter().map(|e| e.id).collect()
}

/// The key the engine authenticates with.
fn engine_keys() -> Keys {
    keys(9)
}

/// A secret key in a file, removed on drop.
struct KeyFile(PathBuf);

impl KeyFile {
    fn new(contents: &str) -> KeyFile {
        let path = std::env::temp_dir().join(format!(
            "grasp-sync-auth-key-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::write(&path, contents).unwrap();
        KeyFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A metrics address on an OS-picked port.
fn metrics_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// `grasp_sync_auth_total{event="<event>"}`, 0 when absent.
fn auth_metric(addr: &str, event: &str) -> u64 {
    metric(
        addr,
        &format!("grasp_sync_auth_total{{event=\"{event}\"}} "),
    )
}

fn metric(addr: &str, prefix: &str) -> u64 {
    http_get(addr.parse().unwrap(), "/metrics")
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The reason a relay gives a keyless REQ, or `None` when it serves it.
fn keyless_req_refusal(url: &str) -> Option<String> {
    let (mut ws, _) = tungstenite::connect(url).unwrap();
    let req = ClientMessage::req(SubscriptionId::new("probe"), vec![Filter::new().limit(1)]);
    ws.send(Message::text(req.as_json())).unwrap();
    loop {
        let Message::Text(t) = ws.read().unwrap() else {
            continue;
        };
        match RelayMessage::from_json(t.as_str()).unwrap() {
            RelayMessage::EndOfStoredEvents(_) => return None,
            RelayMessage::Closed { message, .. } => return Some(message.into_owned()),
            _ => {}
        }
    }
}

/// The `OK` message a relay gives a keyless EVENT, if it refuses it.
fn keyless_event_refusal(url: &str, event: &Event) -> Option<String> {
    let (mut ws, _) = tungstenite::connect(url).unwrap();
    ws.send(Message::text(ClientMessage::event(event.clone()).as_json()))
        .unwrap();
    loop {
        let Message::Text(t) = ws.read().unwrap() else {
            continue;
        };
        if let Ok(RelayMessage::Ok {
            status, message, ..
        }) = RelayMessage::from_json(t.as_str())
        {
            return (!status).then(|| message.into_owned());
        }
    }
}

/// Asserts `cond` within `secs`, showing the engine's log when it fails.
fn assert_within(secs: u64, engine: &GraspSync, what: &str, cond: impl FnMut() -> bool) {
    assert!(
        wait_for(secs, cond),
        "{what} within {secs} s; engine log:\n{}",
        engine.log()
    );
}

#[test]
fn a_relay_requiring_auth_for_reads_is_synced_with_a_key() {
    let started = Instant::now();
    let own = PyRelay::start();
    let remote = PyRelay::start_requiring_auth("read");
    assert_eq!(
        keyless_req_refusal(&remote.url).as_deref(),
        Some("auth-required: you must auth"),
        "the remote really wants AUTH for reads"
    );
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let issue = root(&keys(2), 1621, &[&repo], T0, "issue");
    own.publish(&[
        announcement(&owner, "repo", &[&remote.url], T0),
        issue.clone(),
    ]);
    let history = vec![
        reply(&keys(3), &issue, T0 + 1, "NIP-22 reply"),
        status(&owner, &issue, 1632, T0 + 2),
        repo_comment(&keys(4), &repo, T0 + 3, "about the repo"),
        root(&keys(5), 1617, &[&repo], T0 + 4, "a patch only there"),
    ];
    // Writes are open on this relay; only reads need AUTH.
    publish(&remote.url, &history);

    let key = KeyFile::new(&engine_keys().secret_key().to_bech32().unwrap());
    let metrics = metrics_addr();
    let engine = GraspSync::start_logged(
        &own.url,
        &["--auth-key-file", key.path(), "--metrics", &metrics],
        &[("RUST_LOG", "info")],
    );
    assert_within(60, &engine, "history synced", || {
        own.missing(&ids(&history)) == 0
    });
    let live = reply(&keys(6), &issue, Timestamp::now().as_secs(), "live");
    publish(&remote.url, std::slice::from_ref(&live));
    assert_within(30, &engine, "live event synced", || {
        own.missing(&[live.id]) == 0
    });

    assert!(auth_metric(&metrics, "attempt") >= 1, "{}", engine.log());
    assert_eq!(auth_metric(&metrics, "rejected"), 0, "{}", engine.log());
    let log = engine.log();
    assert!(
        log.contains(&format!("{}: authenticated", remote.url)),
        "the relay's OK to our AUTH was read: {log}"
    );
    assert_eq!(engine.stop(), Some(0));
    eprintln!("with a key: {:?}", started.elapsed());
}

/// A TCP proxy in front of a relay that counts the connections made
/// through it and the reads (`REQ`, `NEG-OPEN`) the clients send (client
/// frames unmasked), so a test sees how hard the engine knocks on a relay
/// that refuses it.
struct CountingProxy {
    url: String,
    connections: Arc<AtomicUsize>,
    reads: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl CountingProxy {
    fn start(upstream: &str) -> CountingProxy {
        let upstream: SocketAddr = upstream
            .strip_prefix("ws://")
            .expect("a ws:// relay")
            .parse()
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let connections = Arc::new(AtomicUsize::new(0));
        let reads = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, r, s) = (connections.clone(), reads.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        c.fetch_add(1, Ordering::Relaxed);
                        let r = r.clone();
                        std::thread::spawn(move || pipe(client, upstream, &r));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        CountingProxy {
            url,
            connections,
            reads,
            stop,
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    fn reads(&self) -> usize {
        self.reads.load(Ordering::Relaxed)
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copies one connection both ways, counting the client's reads.
fn pipe(mut client: TcpStream, upstream: SocketAddr, reads: &AtomicUsize) {
    client.set_nonblocking(false).unwrap();
    let Ok(mut server) = TcpStream::connect(upstream) else {
        return;
    };
    let (mut down_from, mut down_to) = (server.try_clone().unwrap(), client.try_clone().unwrap());
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut down_from, &mut down_to);
        let _ = down_to.shutdown(std::net::Shutdown::Both);
    });
    let mut pending = Vec::new();
    let mut upgraded = false;
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = match client.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if server.write_all(&chunk[..n]).is_err() {
            break;
        }
        pending.extend_from_slice(&chunk[..n]);
        if !upgraded {
            let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            pending.drain(..end + 4);
            upgraded = true;
        }
        while let Some((opcode, payload, used)) = client_frame(&pending) {
            let read = payload.starts_with(b"[\"REQ\"") || payload.starts_with(b"[\"NEG-OPEN\"");
            if opcode == 1 && read {
                reads.fetch_add(1, Ordering::Relaxed);
            }
            pending.drain(..used);
        }
    }
    let _ = server.shutdown(std::net::Shutdown::Both);
}

/// One whole websocket frame at the start of `buf`: opcode, unmasked
/// payload, bytes used.
fn client_frame(buf: &[u8]) -> Option<(u8, Vec<u8>, usize)> {
    let (&b0, &b1) = (buf.first()?, buf.get(1)?);
    let (len, mut at) = match b1 & 0x7f {
        126 => (
            u16::from_be_bytes(buf.get(2..4)?.try_into().ok()?) as usize,
            4,
        ),
        127 => (
            u64::from_be_bytes(buf.get(2..10)?.try_into().ok()?) as usize,
            10,
        ),
        n => (n as usize, 2),
    };
    let mask: [u8; 4] = if b1 & 0x80 != 0 {
        let m = buf.get(at..at + 4)?.try_into().ok()?;
        at += 4;
        m
    } else {
        [0; 4]
    };
    let payload = buf.get(at..at + len)?;
    let payload = payload
        .iter()
        .enumerate()
        .map(|(i, b)| b ^ mask[i % 4])
        .collect();
    Some((b0 & 0x0f, payload, at + len))
}

#[test]
fn without_a_key_a_relay_requiring_auth_is_backed_off_and_others_still_sync() {
    let started = Instant::now();
    let own = PyRelay::start();
    let locked = PyRelay::start_requiring_auth("read");
    let proxy = CountingProxy::start(&locked.url);
    let open = PyRelay::start();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let issue = root(&keys(2), 1621, &[&repo], T0, "issue");
    own.publish(&[
        announcement(&owner, "repo", &[&proxy.url, &open.url], T0),
        issue.clone(),
    ]);
    let behind_auth = vec![
        reply(&keys(3), &issue, T0 + 1, "only behind AUTH"),
        repo_comment(&keys(4), &repo, T0 + 2, "also only behind AUTH"),
    ];
    publish(&locked.url, &behind_auth);
    let in_the_open = vec![
        reply(&keys(5), &issue, T0 + 3, "on the open relay"),
        repo_comment(&keys(6), &repo, T0 + 4, "also on the open relay"),
    ];
    publish(&open.url, &in_the_open);
    assert_eq!(
        keyless_req_refusal(&proxy.url).as_deref(),
        Some("auth-required: you must auth"),
        "the proxied relay really wants AUTH for reads"
    );
    let probe_connections = proxy.connections();
    let probe_reads = proxy.reads();
    assert_eq!(
        (probe_connections, probe_reads),
        (1, 1),
        "the proxy counts connections and reads"
    );

    let metrics = metrics_addr();
    let engine =
        GraspSync::start_logged(&own.url, &["--metrics", &metrics], &[("RUST_LOG", "info")]);
    let engine_started = Instant::now();
    assert_within(30, &engine, "the open relay's events synced", || {
        own.missing(&ids(&in_the_open)) == 0
    });
    assert_within(30, &engine, "auth-required counted", || {
        auth_metric(&metrics, "auth_required") >= 1
    });
    // Watch the refused relay for a while: with --backoff-base-secs 1 the
    // retries come at about 1, 2, 4 s after each refusal, so a few seconds
    // hold a handful of rounds; a loop would hold hundreds.
    let watch = Duration::from_secs(6);
    std::thread::sleep(watch.saturating_sub(engine_started.elapsed()));
    let reads = proxy.reads() - probe_reads;
    let connections = proxy.connections() - probe_connections;
    let refused = auth_metric(&metrics, "auth_required");
    let log = engine.log();

    assert_eq!(
        own.missing(&ids(&behind_auth)),
        behind_auth.len(),
        "nothing from behind AUTH arrived"
    );
    assert_eq!(auth_metric(&metrics, "attempt"), 0, "no key, no AUTH sent");
    assert_eq!(auth_metric(&metrics, "rejected"), 0);
    assert!(reads >= 1, "the engine asked the locked relay: {log}");
    assert!(
        reads <= 12,
        "{reads} reads sent to a relay refusing every one in {watch:?}: {log}"
    );
    assert!(
        refused as usize <= reads,
        "every counted auth-required ({refused}) answered a read on the wire ({reads})"
    );
    assert!(
        connections <= 2,
        "{connections} connections: the refusals are backed off on the open connection, not redialled: {log}"
    );
    let warning = format!(
        "{} requires NIP-42 AUTH and no --auth-key-file is set; backing off",
        proxy.url
    );
    let warnings = log.matches(&warning).count();
    assert!(
        (1..=connections).contains(&warnings),
        "the operator is told, once per connection ({warnings} for {connections}): {log}"
    );
    assert_eq!(engine.stop(), Some(0));
    eprintln!(
        "without a key: {reads} reads, {connections} connections, {refused} auth-required in {watch:?}; test {:?}",
        started.elapsed()
    );
}

#[test]
fn an_own_relay_requiring_auth_for_reads_and_writes_is_synced_into() {
    let started = Instant::now();
    let own = PyRelay::start_requiring_auth("both");
    let remote = PyRelay::start();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let issue = root(&keys(2), 1621, &[&repo], T0, "issue");
    let ann = announcement(&owner, "repo", &[&remote.url], T0);
    assert_eq!(
        keyless_event_refusal(&own.url, &ann).as_deref(),
        Some("auth-required: you must auth"),
        "the own relay really wants AUTH for writes"
    );
    assert_eq!(
        keyless_req_refusal(&own.url).as_deref(),
        Some("auth-required: you must auth"),
        "and for reads"
    );
    // The test seeds and reads the own relay as someone else.
    let tester = keys(7);
    publish_as(&own.url, &tester, &[ann, issue.clone()]);
    let history = vec![
        reply(&keys(3), &issue, T0 + 1, "reply on the remote"),
        repo_comment(&keys(4), &repo, T0 + 2, "comment on the remote"),
        status(&owner, &issue, 1632, T0 + 3),
    ];
    publish(&remote.url, &history);

    // The key as hex, from the environment variable this time.
    let key = KeyFile::new(&engine_keys().secret_key().to_secret_hex());
    let metrics = metrics_addr();
    // The sink's negentropy listings sent before it authenticated are
    // refused with auth-required and asked again once AUTH is accepted, well
    // before the 15 s negentropy timeout would fall back to REQ.
    let engine = GraspSync::start_logged(
        &own.url,
        &["--metrics", &metrics],
        &[
            ("RUST_LOG", "info"),
            ("GRASP_SYNC_AUTH_KEY_FILE", key.path()),
        ],
    );
    assert_within(30, &engine, "history stored in the own relay", || {
        missing_as(&own.url, &tester, &ids(&history)) == 0
    });
    let neg = |event: &str| {
        metric(
            &metrics,
            &format!("grasp_sync_negentropy_total{{event=\"{event}\"}} "),
        )
    };
    assert!(neg("session") >= 1, "{}", engine.log());
    assert_eq!(neg("fallback"), 0, "{}", engine.log());
    let live = reply(&keys(6), &issue, Timestamp::now().as_secs(), "live");
    publish(&remote.url, std::slice::from_ref(&live));
    assert_within(30, &engine, "live event stored in the own relay", || {
        missing_as(&own.url, &tester, &[live.id]) == 0
    });
    assert!(auth_metric(&metrics, "attempt") >= 1, "{}", engine.log());
    assert_eq!(auth_metric(&metrics, "rejected"), 0, "{}", engine.log());
    let log = engine.log();
    assert!(
        log.contains(&format!("{}: authenticated", own.url)),
        "the own relay accepted the engine's AUTH: {log}"
    );
    assert_eq!(engine.stop(), Some(0));
    eprintln!("own relay with AUTH: {:?}", started.elapsed());
}

/// The regression behind the test above, without sockets: an own relay
/// that refuses the self-subscription until AUTH must, once it accepts us,
/// be read from the beginning, not from `quick_reconnect` before this
/// connection (which skipped every announcement older than 15 minutes).
#[test]
fn after_auth_the_own_relay_is_read_from_the_beginning() {
    let mut config = config();
    config.auth_keys = Some(engine_keys());
    let mut sim = Sim::new(config);
    let own = sim.own.clone();
    sim.relay(&own).require_auth = Some("own-chal".to_owned());
    let owner = keys(1);
    let repo = coord(&owner, "old");
    let remote = "wss://remote.example";
    let comment = repo_comment(&owner, &repo, T0 - 7_200, "on the remote");
    sim.seed(remote, &comment);
    // Announced two hours before the engine starts.
    sim.seed(&own, &announcement(&owner, "old", &[remote], T0 - 7_200));
    sim.advance(Duration::from_secs(30));
    assert_eq!(sim.relays[&own].auths.len(), 1);
    assert!(
        sim.synced(&comment.id),
        "the old announcement was read after AUTH and its repo synced"
    );
}
