//! Relays nobody here wrote, run as child processes: rust-nostr's
//! LocalRelay (nostr-sdk wheel) and nostr-rs-relay 0.8.12. `.ci/run`
//! installs both; tests fail with instructions when they are missing.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use nostr::prelude::*;
use tungstenite::Message;

use super::running::wait_for;

/// A free port on 127.0.0.1, picked by the OS.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A LocalRelay in a Python child process, killed on drop.
pub struct PyRelay {
    child: Child,
    /// Its URL.
    pub url: String,
}

impl PyRelay {
    pub fn start() -> PyRelay {
        PyRelay::spawn(&[])
    }

    /// A LocalRelay requiring NIP-42 AUTH (its own `nip42` option) for
    /// `"read"` (REQs), `"write"` (EVENTs) or `"both"`. It challenges only
    /// when refusing: `["AUTH", challenge]` then `CLOSED`/`OK false` with
    /// `auth-required:`, a fresh challenge each time; any challenge it
    /// issued on the connection is accepted.
    pub fn start_requiring_auth(mode: &str) -> PyRelay {
        assert!(matches!(mode, "read" | "write" | "both"), "{mode}");
        PyRelay::spawn(&["--auth", mode])
    }

    fn spawn(flags: &[&str]) -> PyRelay {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/local_relay.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(port.to_string())
            .args(flags)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(
            line.starts_with("ws://"),
            "LocalRelay did not start (is the nostr-sdk==0.45.1 wheel installed? `pip install nostr-sdk==0.45.1`)"
        );
        let url = format!("ws://127.0.0.1:{port}");
        assert!(wait_for(10, || std::net::TcpStream::connect((
            "127.0.0.1",
            port
        ))
        .is_ok()));
        PyRelay { child, url }
    }

    pub fn publish(&self, events: &[Event]) {
        publish(&self.url, events);
    }

    /// How many of `ids` the relay does not hold.
    pub fn missing(&self, ids: &[EventId]) -> usize {
        missing(&self.url, ids)
    }
}

/// Publishes events to any relay over a plain websocket, waiting for every OK.
pub fn publish(url: &str, events: &[Event]) {
    let (mut ws, _) = tungstenite::connect(url).unwrap();
    for e in events {
        ws.send(Message::text(ClientMessage::event(e.clone()).as_json()))
            .unwrap();
    }
    let mut acked = 0;
    while acked < events.len() {
        if let Message::Text(t) = ws.read().unwrap()
            && let Ok(RelayMessage::Ok {
                status, message, ..
            }) = RelayMessage::from_json(t.as_str())
        {
            assert!(status, "{url} refused a test event: {message}");
            acked += 1;
        }
    }
}

/// Publishes many events without waiting per event: windows of
/// [`BULK_WINDOW`] EVENTs are written, then their OKs read (reading between
/// windows keeps both sides' socket buffers from filling). LocalRelay
/// (nostr-sdk 0.45.1) drops a connection sending more than about 6,000
/// messages a minute, a limit its Python builder does not expose, so each
/// [`BULK_PER_CONNECTION`] events go over a fresh websocket.
pub fn publish_bulk(url: &str, events: &[Event]) {
    for batch in events.chunks(BULK_PER_CONNECTION) {
        let (mut ws, _) = tungstenite::connect(url).unwrap();
        if let tungstenite::stream::MaybeTlsStream::Plain(tcp) = ws.get_ref() {
            tcp.set_read_timeout(Some(std::time::Duration::from_secs(30)))
                .unwrap();
        }
        for window in batch.chunks(BULK_WINDOW) {
            for e in window {
                ws.write(Message::text(ClientMessage::event(e.clone()).as_json()))
                    .unwrap();
            }
            ws.flush().unwrap();
            let mut acked = 0;
            while acked < window.len() {
                if let Message::Text(t) = ws.read().expect("an OK within 30 s")
                    && let Ok(RelayMessage::Ok {
                        status, message, ..
                    }) = RelayMessage::from_json(t.as_str())
                {
                    assert!(status, "{url} refused a test event: {message}");
                    acked += 1;
                }
            }
        }
        let _ = ws.close(None);
    }
}

/// EVENTs [`publish_bulk`] has in flight at most.
pub const BULK_WINDOW: usize = 500;
/// EVENTs [`publish_bulk`] sends over one websocket.
pub const BULK_PER_CONNECTION: usize = 4_000;

/// How many of `ids` a relay does not hold.
pub fn missing(url: &str, ids: &[EventId]) -> usize {
    let (mut ws, _) = tungstenite::connect(url).unwrap();
    let mut found = 0;
    for (n, chunk) in ids.chunks(400).enumerate() {
        let filter = Filter::new().ids(chunk.iter().copied()).limit(500);
        ws.send(Message::text(
            ClientMessage::req(SubscriptionId::new(format!("q{n}")), vec![filter]).as_json(),
        ))
        .unwrap();
        loop {
            let Message::Text(t) = ws.read().unwrap() else {
                continue;
            };
            match RelayMessage::from_json(t.as_str()) {
                Ok(RelayMessage::Event { .. }) => found += 1,
                Ok(RelayMessage::EndOfStoredEvents(_)) => break,
                _ => {}
            }
        }
    }
    ids.len() - found
}

/// A websocket to a relay that answers NIP-42 challenges with `keys`, for
/// tests that read from or write to a relay requiring AUTH.
struct AuthSession {
    ws: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>,
    url: String,
    keys: Keys,
    /// The latest challenge the relay sent.
    challenge: Option<String>,
    authenticated: bool,
}

impl AuthSession {
    fn connect(url: &str, keys: &Keys) -> AuthSession {
        let (ws, _) = tungstenite::connect(url).unwrap();
        if let tungstenite::stream::MaybeTlsStream::Plain(tcp) = ws.get_ref() {
            tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)))
                .unwrap();
        }
        AuthSession {
            ws,
            url: url.to_owned(),
            keys: keys.clone(),
            challenge: None,
            authenticated: false,
        }
    }

    fn send(&mut self, message: ClientMessage) {
        self.ws.send(Message::text(message.as_json())).unwrap();
    }

    /// The next relay message that is not a challenge (challenges are kept).
    fn next(&mut self) -> RelayMessage<'static> {
        loop {
            let Message::Text(t) = self.ws.read().expect("relay answers within 10 s") else {
                continue;
            };
            match RelayMessage::from_json(t.as_str()).expect("relay JSON") {
                RelayMessage::Auth { challenge } => self.challenge = Some(challenge.into_owned()),
                other => return other,
            }
        }
    }

    /// Answers the latest challenge; panics unless the relay accepts it.
    fn authenticate(&mut self) {
        assert!(!self.authenticated, "{} refused us after AUTH", self.url);
        let challenge = self
            .challenge
            .clone()
            .unwrap_or_else(|| panic!("{} wants AUTH but sent no challenge", self.url));
        let event = EventBuilder::new(Kind::Authentication, "")
            .tags([
                Tag::parse(["relay", self.url.as_str()]).unwrap(),
                Tag::parse(["challenge", challenge.as_str()]).unwrap(),
            ])
            .finalize(&self.keys)
            .unwrap();
        let id = event.id;
        self.send(ClientMessage::auth(event));
        loop {
            if let RelayMessage::Ok {
                event_id,
                status,
                message,
            } = self.next()
                && event_id == id
            {
                assert!(status, "{} rejected our AUTH: {message}", self.url);
                self.authenticated = true;
                return;
            }
        }
    }

    /// Publishes one event, authenticating if the relay asks.
    fn publish(&mut self, event: &Event) {
        loop {
            self.send(ClientMessage::event(event.clone()));
            let (status, message) = loop {
                if let RelayMessage::Ok {
                    event_id,
                    status,
                    message,
                } = self.next()
                    && event_id == event.id
                {
                    break (status, message.into_owned());
                }
            };
            if !status && message.starts_with("auth-required") {
                self.authenticate();
                continue;
            }
            assert!(status, "{} refused a test event: {message}", self.url);
            return;
        }
    }

    /// The stored events matching `filter`, authenticating if the relay asks.
    fn query(&mut self, filter: Filter) -> Vec<Event> {
        let sub = SubscriptionId::new("q");
        loop {
            self.send(ClientMessage::req(sub.clone(), vec![filter.clone()]));
            let mut found = Vec::new();
            loop {
                match self.next() {
                    RelayMessage::Event {
                        subscription_id,
                        event,
                    } if *subscription_id == sub => found.push(event.into_owned()),
                    RelayMessage::EndOfStoredEvents(id) if *id == sub => {
                        self.send(ClientMessage::close(sub.clone()));
                        return found;
                    }
                    RelayMessage::Closed {
                        subscription_id,
                        message,
                    } if *subscription_id == sub => {
                        assert!(
                            message.starts_with("auth-required"),
                            "{} closed our query: {message}",
                            self.url
                        );
                        break;
                    }
                    _ => {}
                }
            }
            self.authenticate();
        }
    }
}

/// Publishes events to a relay that may require NIP-42 AUTH, answering its
/// challenge with `keys`; one at a time, each OK awaited.
pub fn publish_as(url: &str, keys: &Keys, events: &[Event]) {
    let mut session = AuthSession::connect(url, keys);
    for e in events {
        session.publish(e);
    }
}

/// How many of `ids` a relay that may require NIP-42 AUTH does not hold,
/// read as `keys`.
pub fn missing_as(url: &str, keys: &Keys, ids: &[EventId]) -> usize {
    let mut session = AuthSession::connect(url, keys);
    let mut found = 0;
    for chunk in ids.chunks(400) {
        found += session
            .query(Filter::new().ids(chunk.iter().copied()).limit(500))
            .len();
    }
    ids.len() - found
}

impl Drop for PyRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nostr-rs-relay 0.8.12 (sqlite) in a child process, on its own port and
/// data directory; restartable with the same data.
pub struct RsRelay {
    child: Option<Child>,
    /// Its URL.
    pub url: String,
    dir: PathBuf,
}

impl RsRelay {
    /// The binary: `$NOSTR_RS_RELAY_BIN`, or where `.ci/run` installs it.
    fn binary() -> PathBuf {
        let path = std::env::var_os("NOSTR_RS_RELAY_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let home = std::env::var_os("HOME")
                    .map(PathBuf::from)
                    .unwrap_or_default();
                home.join(".cache/grasp-sync/nostr-rs-relay-0.8.12/bin/nostr-rs-relay")
            });
        assert!(
            path.exists(),
            "nostr-rs-relay not found at {} (run .ci/run, or `cargo install nostr-rs-relay --version 0.8.12`, and set NOSTR_RS_RELAY_BIN)",
            path.display()
        );
        path
    }

    /// Starts a fresh relay on an OS-picked port.
    pub fn start() -> RsRelay {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("grasp-sync-nrr-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = format!(
            "[info]\nrelay_url = \"ws://127.0.0.1:{port}/\"\nname = \"test\"\n\n[database]\ndata_directory = \"{}\"\n\n[network]\naddress = \"127.0.0.1\"\nport = {port}\n",
            dir.display()
        );
        std::fs::write(dir.join("config.toml"), config).unwrap();
        let mut relay = RsRelay {
            child: None,
            url: format!("ws://127.0.0.1:{port}"),
            dir,
        };
        relay.spawn(port);
        relay
    }

    fn spawn(&mut self, port: u16) {
        let config = self.dir.join("config.toml");
        let child = Command::new(Self::binary())
            .arg("--config")
            .arg(&config)
            .arg("--db")
            .arg(&self.dir)
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nostr-rs-relay starts");
        self.child = Some(child);
        assert!(
            wait_for(30, || std::net::TcpStream::connect(("127.0.0.1", port))
                .is_ok()),
            "nostr-rs-relay listening"
        );
    }

    fn port(&self) -> u16 {
        self.url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("url has a port")
    }

    /// Stops the relay (connections drop) and starts it again on the same port and data.
    pub fn restart(&mut self, down: std::time::Duration) {
        self.kill();
        std::thread::sleep(down);
        self.spawn(self.port());
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RsRelay {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `grasp-sync` binary as a child process, stopped with SIGTERM on drop.
pub struct GraspSync {
    child: Option<Child>,
    /// Where its stderr (the log) goes, when captured.
    log: Option<PathBuf>,
}

impl GraspSync {
    /// Runs `grasp-sync --own-relay <own>` with test timings plus `extra` flags.
    pub fn start(own: &str, extra: &[&str]) -> GraspSync {
        GraspSync::spawn(own, extra, &[], None)
    }

    /// Like [`GraspSync::start`], with `env` added to its environment
    /// (`RUST_LOG` there wins) and its stderr captured for [`GraspSync::log`].
    pub fn start_logged(own: &str, extra: &[&str], env: &[(&str, &str)]) -> GraspSync {
        let path = std::env::temp_dir().join(format!(
            "grasp-sync-log-{}-{}.txt",
            std::process::id(),
            free_port()
        ));
        GraspSync::spawn(own, extra, env, Some(path))
    }

    fn spawn(own: &str, extra: &[&str], env: &[(&str, &str)], log: Option<PathBuf>) -> GraspSync {
        let stderr = match &log {
            Some(path) => Stdio::from(std::fs::File::create(path).unwrap()),
            None => Stdio::inherit(),
        };
        let child = Command::new(env!("CARGO_BIN_EXE_grasp-sync"))
            .args([
                "--own-relay",
                own,
                "--allow-private-addresses",
                "--batch-window-ms",
                "300",
                "--backoff-base-secs",
                "1",
            ])
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("grasp-sync starts");
        GraspSync {
            child: Some(child),
            log,
        }
    }

    /// Its log so far (empty unless started with [`GraspSync::start_logged`]).
    pub fn log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    /// SIGTERM, then the exit code.
    pub fn stop(mut self) -> Option<i32> {
        let child = self.child.take()?;
        terminate(child)
    }
}

fn terminate(mut child: Child) -> Option<i32> {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while std::time::Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return status.code();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

impl Drop for GraspSync {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            terminate(child);
        }
        if let Some(path) = self.log.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}
