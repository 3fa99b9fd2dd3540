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
        ..SavedState::default()
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

/// Runs the binary to its exit (a start-up error), returning its exit
/// code and stderr.
fn start_error(own: &TestRelay, state: &Path) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .args(["--own-relay", &own.url(), "--allow-private-addresses"])
        .arg("--state-file")
        .arg(state)
        .stdout(Stdio::null())
        .output()
        .expect("binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue 26: two engines on one state file (a copied unit, two shards
/// given one path) corrupted each other's writes. The second is refused
/// at start, exit 2, told who holds the file; the first runs on.
#[test]
fn a_second_engine_on_the_same_state_file_exits_2_naming_the_first() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    world(&own, &a);
    let dir = state_dir("twice");
    let path = dir.join("state.json");
    let first = start(&own, &path);
    assert!(
        wait_for(20, || dir.join("state.json.lock").exists()),
        "the first holds the file"
    );
    let (code, stderr) = start_error(&own, &path);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("in use by another grasp-sync (pid {}", first.id())),
        "{stderr}"
    );
    assert!(stderr.contains("--state-file"), "names its flag: {stderr}");
    stop(first);
    let _ = fs::remove_dir_all(&dir);
}

/// Issue 26: `--state-file` naming a directory (a slip with systemd's
/// `StateDirectory=`) had the directory renamed to `PATH.bad-<time>` and a
/// file written in its place. It is an error at start, the folder left
/// as it was.
#[test]
fn a_state_file_that_is_a_directory_exits_2_and_is_left_alone() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let dir = state_dir("isdir");
    fs::write(dir.join("keep"), "operator's").unwrap();
    let (code, stderr) = start_error(&own, &dir);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("is a directory"), "{stderr}");
    assert_eq!(fs::read_to_string(dir.join("keep")).unwrap(), "operator's");
    let (code, stderr) = start_error(&own, &dir.join("no/such/folder.json"));
    assert_eq!(code, Some(2), "{stderr}");
    let _ = fs::remove_dir_all(&dir);
}

/// Issue 24: what the outbox still held when the shutdown deadline passed
/// (an own relay taking one event a minute) was lost to this run, found
/// again only by the next full sync of a relay that still has it. It is
/// kept in the state file and offered first at the next start: here the
/// remote relay is gone by then, so only the state file can deliver it.
#[test]
fn what_the_outbox_held_at_the_deadline_is_offered_first_at_the_next_start() {
    use grasp_sync::testing::limits::EventBucket;
    let slow = TestRelay::start(RelayOptions {
        event_bucket: Some(EventBucket {
            tokens_per_interval: 1,
            interval: Duration::from_secs(600),
            max_tokens: 2,
        }),
        ..RelayOptions::default()
    })
    .unwrap();
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    let announced = announcement(&owner, "repo", &[&a.url()], T0);
    slow.publish(announced.clone());
    let repo = coord(&owner, "repo");
    let comments: Vec<Event> = (0..12)
        .map(|i| repo_comment(&keys(2), &repo, T0 + i, &format!("c{i}")))
        .collect();
    for c in &comments {
        a.publish(c.clone());
    }
    let dir = state_dir("outbox");
    let path = dir.join("state.json");
    let engine = start(&slow, &path);
    let stored = |relay: &TestRelay| comments.iter().filter(|c| relay.has(&c.id)).count();
    assert!(wait_for(30, || stored(&slow) == 2), "the bucket's burst");
    assert!(
        wait_for(30, || slow.rate_limited() > 0),
        "the rest waits in the outbox"
    );
    stop(engine);
    let saved = SavedState::decode(&fs::read_to_string(&path).unwrap()).unwrap();
    let left: Vec<EventId> = saved.outbox.iter().map(|e| e.id).collect();
    let expected: Vec<EventId> = comments
        .iter()
        .filter(|c| !slow.has(&c.id))
        .map(|c| c.id)
        .collect();
    assert_eq!(left.len(), 10, "{left:?}");
    assert!(expected.iter().all(|id| left.contains(id)));
    drop(a);

    let own = TestRelay::start(RelayOptions::default()).unwrap();
    own.publish(announced);
    let engine = start(&own, &path);
    assert!(
        wait_for(30, || expected.iter().all(|id| own.has(id))),
        "{} of {} offered from the state file",
        expected.iter().filter(|id| own.has(id)).count(),
        expected.len()
    );
    stop(engine);
    let _ = fs::remove_dir_all(&dir);
}
