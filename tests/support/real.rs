//! Relays nobody here wrote, run as child processes: rust-nostr's
//! LocalRelay (the nostr-sdk wheel), the PyPI `nostr-relay` (Python,
//! sqlite) and nostr-rs-relay 0.8.12.
//!
//! The two Python relays install themselves on first use (see [`py_env`]):
//! `tests/pyrelays.py` puts each, pinned, in a virtualenv under
//! `<target>/pyrelays/`, so `cargo test` needs only `python3` and the
//! package registry once. nostr-rs-relay takes ten minutes to build, so
//! `.ci/run` installs it and the tests that need it are
//! `#[ignore = "needs nostr-rs-relay 0.8.12: .ci/run installs it"]`, run by
//! `cargo test -- --include-ignored`.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use nostr::prelude::*;
use tungstenite::Message;

use super::running::wait_for;
use super::{T0, announcement, coord, keys, reply, root};

/// Starts a relay process on a port picked for it, again on another port
/// if another process took that one before the relay bound it: a port the
/// OS called free is not reserved, and on a busy machine (another test run,
/// a demo with thousands of sockets) it is sometimes gone. Any other
/// failure ends at once, with what the relay said.
pub fn start_on_free_port<T>(what: &str, mut start: impl FnMut(u16) -> Result<T, String>) -> T {
    let mut said = String::new();
    for _ in 0..5 {
        match start(free_port()) {
            Ok(relay) => return relay,
            Err(why) if why.to_lowercase().contains("already in use") => said.push_str(&why),
            Err(why) => panic!("{what} did not start: {why}"),
        }
    }
    panic!("{what} did not start: its port was taken five times: {said}");
}

/// A free port on 127.0.0.1, picked by the OS.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Python environment `tests/pyrelays.py` installed: the interpreter and,
/// where it fell back to `pip install --target`, the `PYTHONPATH`.
#[derive(Debug, Clone)]
pub struct PyEnv {
    python: PathBuf,
    pythonpath: Option<PathBuf>,
}

impl PyEnv {
    /// A command running `script` (under `tests/`) with this environment.
    pub fn command(&self, script: &str) -> Command {
        let mut command = Command::new(&self.python);
        command
            .arg(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests")
                    .join(script),
            )
            .env("PYTHONNOUSERSITE", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1");
        match &self.pythonpath {
            Some(path) => command.env("PYTHONPATH", path),
            None => command.env_remove("PYTHONPATH"),
        };
        command
    }
}

/// Where the Python relays are installed: `<target>/pyrelays`.
pub fn pyrelays_root() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).join("pyrelays")
}

/// The Python environment for `name` (`"nostr-sdk"` or `"nostr-relay"`),
/// installed on first use by `tests/pyrelays.py` (pinned versions, a lock
/// against concurrent installs, nothing outside `<target>/pyrelays`). Once
/// per test binary; every test needing it waits for the first. Panics with
/// pip's own words if it cannot be installed (e.g. no registry).
pub fn py_env(name: &str) -> PyEnv {
    static SDK: OnceLock<Result<PyEnv, String>> = OnceLock::new();
    static RELAY: OnceLock<Result<PyEnv, String>> = OnceLock::new();
    let cell = match name {
        "nostr-sdk" => &SDK,
        "nostr-relay" => &RELAY,
        other => panic!("no Python environment named {other}"),
    };
    match cell.get_or_init(|| provision(name)) {
        Ok(env) => env.clone(),
        Err(e) => panic!("{e}"),
    }
}

fn provision(name: &str) -> Result<PyEnv, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pyrelays.py");
    let output = Command::new("python3")
        .arg(&script)
        .arg(pyrelays_root())
        .arg(name)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run python3 (needed for the {name} test relay): {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let field = |key: &str| {
        stdout
            .lines()
            .filter_map(|l| l.strip_prefix(key))
            .next_back()
            .map(str::to_owned)
    };
    match (output.status.success(), field("python=")) {
        (true, Some(python)) => Ok(PyEnv {
            python: PathBuf::from(python),
            pythonpath: field("pythonpath=")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
        }),
        _ => Err(format!(
            "installing the {name} test relay failed (tests/pyrelays.py into {}):\n{stdout}{}",
            pyrelays_root().display(),
            String::from_utf8_lossy(&output.stderr)
        )),
    }
}

/// Reads a child's stdout until a line starting with `ws://`; `None` if it
/// ends first. The lines before it (library chatter) are returned too.
fn read_url_line(child: &mut Child) -> (Option<String>, String) {
    let mut seen = String::new();
    let mut reader = BufReader::new(child.stdout.take().expect("stdout is piped"));
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return (None, seen),
            Ok(_) if line.starts_with("ws://") => return (Some(line.trim().to_owned()), seen),
            Ok(_) => seen.push_str(&line),
        }
    }
}

/// A LocalRelay in a Python child process, killed on drop.
pub struct PyRelay {
    child: Child,
    /// Its URL.
    pub url: String,
    /// Most stored events it returns per filter.
    cap: usize,
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

    /// A LocalRelay at its default rate limit (60 `EVENT`s a minute per
    /// connection), as an own relay on rust-nostr's relay builder
    /// (ngit-grasp) runs.
    pub fn start_rate_limited() -> PyRelay {
        PyRelay::spawn(&["--default-rate-limit"])
    }

    /// A LocalRelay returning at most `max` stored events per filter (its
    /// `max_filter_limit`; 500 by default), as khatru relays return 100.
    pub fn start_capped(max: usize) -> PyRelay {
        let mut relay = PyRelay::spawn(&["--max-filter-limit", &max.to_string()]);
        relay.cap = max;
        relay
    }

    /// Like [`PyRelay::start_capped`], holding at most `max_reqs` open
    /// subscriptions per connection (its `RateLimit::max_reqs`; 500 by
    /// default): one more is refused with `CLOSED "rate-limited: too many
    /// REQs"`.
    pub fn start_capped_with_reqs(max: usize, max_reqs: usize) -> PyRelay {
        let (max_s, reqs_s) = (max.to_string(), max_reqs.to_string());
        let mut relay = PyRelay::spawn(&["--max-filter-limit", &max_s, "--max-reqs", &reqs_s]);
        relay.cap = max;
        relay
    }

    fn spawn(flags: &[&str]) -> PyRelay {
        let what = format!(
            "LocalRelay (nostr-sdk 0.45.1, installed under {})",
            pyrelays_root().display()
        );
        start_on_free_port(&what, |port| PyRelay::try_spawn(port, flags))
    }

    fn try_spawn(port: u16, flags: &[&str]) -> Result<PyRelay, String> {
        let mut child = py_env("nostr-sdk")
            .command("local_relay.py")
            .arg(port.to_string())
            .args(flags)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let (line, seen) = read_url_line(&mut child);
        if line.is_none() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(seen);
        }
        let url = format!("ws://127.0.0.1:{port}");
        assert!(wait_for(10, || std::net::TcpStream::connect((
            "127.0.0.1",
            port
        ))
        .is_ok()));
        Ok(PyRelay {
            child,
            url,
            cap: 500,
        })
    }

    pub fn publish(&self, events: &[Event]) {
        publish(&self.url, events);
    }

    /// How many of `ids` the relay does not hold.
    pub fn missing(&self, ids: &[EventId]) -> usize {
        missing_in_chunks(&self.url, ids, self.cap)
    }

    /// Its process id (the relay runs in the Python process), for the
    /// load run's CPU accounting.
    pub fn pid(&self) -> u32 {
        self.child.id()
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
    missing_in_chunks(url, ids, 400)
}

/// [`missing`] asking at most `chunk` ids per REQ, for relays that return
/// fewer than 400 events per REQ or filter.
pub fn missing_in_chunks(url: &str, ids: &[EventId], chunk: usize) -> usize {
    let (mut ws, _) = tungstenite::connect(url).unwrap();
    let mut found = std::collections::HashSet::new();
    for (n, chunk) in ids.chunks(chunk.clamp(1, 400)).enumerate() {
        let sub = SubscriptionId::new(format!("q{n}"));
        let filter = Filter::new().ids(chunk.iter().copied()).limit(500);
        ws.send(Message::text(
            ClientMessage::req(sub.clone(), vec![filter]).as_json(),
        ))
        .unwrap();
        loop {
            let Message::Text(t) = ws.read().unwrap() else {
                continue;
            };
            // Only this query's stored events: a live delivery to an earlier
            // one (an event stored meanwhile) must not count twice.
            match RelayMessage::from_json(t.as_str()) {
                Ok(RelayMessage::Event {
                    subscription_id,
                    event,
                }) if *subscription_id == sub && chunk.contains(&event.id) => {
                    found.insert(event.id);
                }
                Ok(RelayMessage::EndOfStoredEvents(id)) if *id == sub => break,
                _ => {}
            }
        }
        ws.send(Message::text(ClientMessage::close(sub).as_json()))
            .unwrap();
    }
    ids.len() - found.len()
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

/// The PyPI `nostr-relay` 1.14 (Python, sqlite, uvicorn) in a child
/// process on its own port and data directory, killed on drop; launched by
/// `tests/pypi_nostr_relay.py` (which says how it is configured).
///
/// As it is in the wild: `max_limit` caps the stored events of a whole REQ
/// (its filters are one SQL query), `until` is exclusive, 32 subscriptions
/// per connection (then `NOTICE "rejected: too many subscriptions"`), and
/// its NIP-11 document has no `limitation`.
pub struct NostrRelay {
    child: Child,
    /// Its URL.
    pub url: String,
    dir: PathBuf,
    max_limit: usize,
}

impl NostrRelay {
    /// A fresh relay whose `max_limit` is `max_limit`.
    pub fn start(max_limit: usize) -> NostrRelay {
        start_on_free_port("nostr-relay 1.14", |port| {
            NostrRelay::try_start(port, max_limit)
        })
    }

    fn try_start(port: u16, max_limit: usize) -> Result<NostrRelay, String> {
        let dir = std::env::temp_dir().join(format!(
            "grasp-sync-nostr-relay-{}-{port}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(dir.join("stderr.txt")).unwrap();
        let mut child = py_env("nostr-relay")
            .command("pypi_nostr_relay.py")
            .arg(port.to_string())
            .arg("--dir")
            .arg(&dir)
            .args(["--max-limit", &max_limit.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("python runs");
        let (line, seen) = read_url_line(&mut child);
        if line.is_none() {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = std::fs::read_to_string(dir.join("stderr.txt")).unwrap_or_default();
            return Err(format!("{seen}{stderr}"));
        }
        Ok(NostrRelay {
            child,
            url: format!("ws://127.0.0.1:{port}"),
            dir,
            max_limit,
        })
    }

    pub fn publish(&self, events: &[Event]) {
        publish_bulk(&self.url, events);
    }

    /// How many of `ids` the relay does not hold.
    pub fn missing(&self, ids: &[EventId]) -> usize {
        missing_in_chunks(&self.url, ids, self.max_limit)
    }
}

impl Drop for NostrRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The GRASP-01 clone URL of repository `d` of `owner` on the relay at
/// `relay_url`: `http://` for `ws://`, `https://` for `wss://`, the same
/// host and port, then `/<npub>/<d>.git`.
pub fn clone_url(relay_url: &str, owner: &Keys, d: &str) -> String {
    let (scheme, rest) = relay_url.split_once("://").unwrap_or(("ws", relay_url));
    let http = if scheme.eq_ignore_ascii_case("wss") {
        "https"
    } else {
        "http"
    };
    let npub = owner.public_key().to_bech32().unwrap();
    format!("{http}://{}/{npub}/{d}.git", rest.trim_end_matches('/'))
}

/// A repo announcement a GRASP relay at `service` accepts (GRASP-01): it
/// lists `service` in its `relays` tag (with `relays`) and in a `clone`
/// URL. Announcements the engine finds on other relays must look like
/// this to be passed on.
pub fn grasp_announcement(
    k: &Keys,
    d: &str,
    service: &str,
    relays: &[&str],
    created_at: u64,
) -> Event {
    let mut values = vec!["relays", service];
    values.extend_from_slice(relays);
    let clone = clone_url(service, k, d);
    super::sign(
        k,
        30617,
        created_at,
        vec![
            super::tag(&["d", d]),
            super::tag(&values),
            super::tag(&["clone", &clone]),
        ],
        "",
    )
}

/// nostr-rs-relay 0.8.12 (sqlite) in a child process, on its own port and
/// data directory; restartable with the same data.
pub struct RsRelay {
    child: Option<Child>,
    /// Its URL.
    pub url: String,
    dir: PathBuf,
}

/// Where a nostr-rs-relay's log goes: `$NOSTR_RS_RELAY_LOG_DIR/nrr-<port>.log`
/// when set (at `$NOSTR_RS_RELAY_LOG`, `RUST_LOG` syntax; its DEBUG lines
/// say when it drops a query without a word), else nowhere.
fn rs_relay_log(port: u16) -> Stdio {
    match std::env::var("NOSTR_RS_RELAY_LOG_DIR") {
        Ok(dir) => Stdio::from(std::fs::File::create(format!("{dir}/nrr-{port}.log")).unwrap()),
        Err(_) => Stdio::null(),
    }
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
            .env(
                "RUST_LOG",
                std::env::var("NOSTR_RS_RELAY_LOG").unwrap_or("info".into()),
            )
            .stdout(rs_relay_log(port))
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

    /// Its process id while it runs, for the load run's CPU accounting.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
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

    /// SIGKILL, as a crash or a power loss: no save, no flush.
    pub fn kill(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
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

/// A repo of `keys(1)` announced on `own` as living on `remote`, with one
/// issue on `own`; the issue, for replies to sync.
pub fn announced_issue(own: &PyRelay, remote: &str) -> Event {
    let owner = keys(1);
    let issue = root(&owner, 1621, &[&coord(&owner, "repo")], T0, "issue");
    own.publish(&[announcement(&owner, "repo", &[remote], T0), issue.clone()]);
    issue
}

/// `n` replies by `keys(2)` to `issue`, a second apart.
pub fn replies_to(issue: &Event, n: u64) -> Vec<Event> {
    (0..n)
        .map(|i| reply(&keys(2), issue, T0 + 1 + i, &format!("r{i}")))
        .collect()
}
