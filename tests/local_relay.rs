//! Against a relay nobody here wrote: rust-nostr's `LocalRelay`, from the
//! `nostr-sdk` PyPI wheel that `.ci/run` installs (`pip install
//! nostr-sdk==0.45.1`). Both the own relay and the remote relay are
//! LocalRelays; the remote one caps results at 500 per filter.

mod support;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use grasp_sync::{Config, Shell, ShellOptions, SinkTarget};
use nostr::prelude::*;
use support::running::wait_for;
use support::*;
use tungstenite::Message;

/// A LocalRelay in a Python child process, killed on drop.
struct PyRelay {
    child: Child,
    url: String,
}

impl PyRelay {
    fn start() -> PyRelay {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/local_relay.py");
        let mut child = Command::new("python3")
            .args([script, &port.to_string()])
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

    fn publish(&self, events: &[Event]) {
        let (mut ws, _) = tungstenite::connect(&self.url).unwrap();
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
                assert!(status, "LocalRelay refused a test event: {message}");
                acked += 1;
            }
        }
    }

    /// How many of `ids` the relay does not hold.
    fn missing(&self, ids: &[EventId]) -> usize {
        let (mut ws, _) = tungstenite::connect(&self.url).unwrap();
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
}

impl Drop for PyRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn syncs_history_past_the_cap_and_live_events_between_local_relays() {
    let own = PyRelay::start();
    let remote = PyRelay::start();
    let owner = keys(1);
    let repo = coord(&owner, "repo");
    let issue = root(&keys(2), 1621, &[&repo], T0, "issue");
    own.publish(&[
        announcement(&owner, "repo", &[&remote.url, &own.url], T0),
        issue.clone(),
    ]);
    let mut history: Vec<Event> = (0..600)
        .map(|i| reply(&keys(3), &issue, T0 + 1 + i, &format!("reply {i}")))
        .collect();
    history.push(repo_comment(&keys(4), &repo, T0 + 700, "about the repo"));
    history.push(state(&owner, "repo", T0 + 701));
    remote.publish(&history);

    let mut config = Config::new(own.url.clone());
    config.batch_window = Duration::from_millis(200);
    let opts = ShellOptions {
        allow_private_addresses: true,
        ..ShellOptions::default()
    };
    let shell = Shell::new(config, opts, SinkTarget::OwnRelay).unwrap();
    let handle = shell.handle();
    let thread = std::thread::spawn(move || shell.run());

    let ids: Vec<EventId> = history.iter().map(|e| e.id).collect();
    assert!(
        wait_for(60, || own.missing(&ids) == 0),
        "{} of {} missing",
        own.missing(&ids),
        ids.len()
    );
    let live = reply(&keys(5), &issue, Timestamp::now().as_secs(), "live");
    remote.publish(std::slice::from_ref(&live));
    assert!(
        wait_for(5, || own.missing(&[live.id]) == 0),
        "live event arrives"
    );

    handle.shutdown();
    thread.join().unwrap().unwrap();
}
