//! The `grasp-sync` binary over a state file (issue 15): stopped with
//! SIGTERM and started again moments later, it catches the remote relay up
//! with `since` instead of re-reading its history; a corrupt or truncated
//! file is set aside and the binary starts fresh.

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use grasp_sync::{SavedRelay, SavedState};
use nostr::prelude::*;
use support::running::wait_for;
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_grasp-sync");

/// An empty folder for one test's state file.
fn state_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("grasp-ext-restart-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn start(own: &TestRelay, state: &Path) -> Child {
    Command::new(BIN)
        .args(["--own-relay", &own.url(), "--allow-private-addresses"])
        .args(["--batch-window-ms", "200", "--shutdown-timeout-secs", "3"])
        .arg("--state-file")
        .arg(state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("binary starts")
}

/// SIGTERM, then a clean exit within the shutdown deadline.
fn stop(mut child: Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let start = Instant::now();
    loop {
        if let Some(exit) = child.try_wait().expect("wait") {
            assert_eq!(exit.code(), Some(0), "clean exit");
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "exited in time");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An own relay announcing one repo on `remote`, with an issue (on the own
/// relay) and a reply to it (on the remote): the reply must be synced.
fn world(own: &TestRelay, remote: &TestRelay) -> (Event, Event) {
    let owner = keys(1);
    own.publish(announcement(&owner, "repo", &[&remote.url()], T0));
    let issue = root(&owner, 1621, &[&coord(&owner, "repo")], T0, "issue");
    own.publish(issue.clone());
    let first = reply(&keys(2), &issue, T0 + 1, "before the restart");
    remote.publish(first.clone());
    (issue, first)
}

fn filters_without_since(reqs: &[Vec<Filter>]) -> usize {
    reqs.iter().flatten().filter(|f| f.since.is_none()).count()
}

#[test]
fn a_restart_over_the_state_file_catches_up_with_since() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let (issue, first) = world(&own, &a);
    let dir = state_dir("since");
    let path = dir.join("state.json");

    let engine = start(&own, &path);
    assert!(wait_for(20, || own.has(&first.id)), "first run synced");
    stop(engine);
    let text = fs::read_to_string(&path).expect("state file written at shutdown");
    let saved = SavedState::decode(&text).expect("a valid state file");
    let url = grasp_sync::normalize_relay_url(&a.url()).unwrap();
    assert!(saved.relays.iter().any(|r| r.url == url), "A saved");
    let first_run = a.reqs();
    assert!(
        filters_without_since(&first_run) > 0,
        "the first run read A's history (what the state saves us)"
    );

    let away = reply(
        &keys(3),
        &issue,
        Timestamp::now().as_secs() - 2,
        "while the engine was down",
    );
    a.publish(away.clone());
    let engine = start(&own, &path);
    assert!(
        wait_for(20, || own.has(&away.id)),
        "the reply posted while down arrived"
    );
    stop(engine);
    let second_run = &a.reqs()[first_run.len()..];
    assert!(!second_run.is_empty(), "A subscribed again");
    assert_eq!(
        filters_without_since(second_run),
        0,
        "no filter re-read A's history: {second_run:?}"
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_corrupt_or_truncated_state_file_is_set_aside_and_the_binary_starts() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    world(&own, &a);
    let valid = SavedState {
        saved_at: Timestamp::now().as_secs(),
        relays: vec![SavedRelay {
            url: a.url(),
            ..SavedRelay::default()
        }],
    }
    .encode();
    let truncated = &valid[..valid.len() / 2];
    for (name, bad) in [
        ("corrupt", "\u{1}\u{2} not json at all"),
        ("truncated", truncated),
    ] {
        let dir = state_dir(name);
        let path = dir.join("state.json");
        fs::write(&path, bad).unwrap();
        let engine = start(&own, &path);
        let aside = || {
            fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .find(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with("state.json.bad-")
                })
                .map(|e| e.path())
        };
        assert!(wait_for(30, || aside().is_some()), "{name}: set aside");
        assert_eq!(fs::read_to_string(aside().unwrap()).unwrap(), bad);
        assert!(
            wait_for(20, || own.connection_count() >= 2),
            "{name}: the engine runs (self-subscription and sink connected)"
        );
        stop(engine);
        assert!(
            wait_for(30, || own.connection_count() == 0),
            "sockets closed"
        );
        let text = fs::read_to_string(&path).expect("a fresh state file written");
        assert!(
            SavedState::decode(&text).is_ok(),
            "{name}: the new file is valid"
        );
        let _ = fs::remove_dir_all(&dir);
    }
}
