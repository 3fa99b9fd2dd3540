//! The mio shell over real loopback sockets against the in-process test
//! relay: discovery, history, live events, reconnects, pagination, restarts.

mod support;

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use grasp_sync::{Config, Shell, ShellHandle, ShellOptions, SinkTarget};
use nostr::prelude::*;
use support::*;

/// The engine running on its own thread against `own`.
struct Running {
    handle: ShellHandle,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl Running {
    fn start(own: &TestRelay, tune: impl FnOnce(&mut Config, &mut ShellOptions)) -> Running {
        let mut config = Config::new(own.url());
        config.batch_window = Duration::from_millis(200);
        config.backoff_base = Duration::from_millis(200);
        let mut opts = ShellOptions {
            allow_private_addresses: true,
            ..ShellOptions::default()
        };
        tune(&mut config, &mut opts);
        let shell = Shell::new(config, opts, SinkTarget::OwnRelay).expect("shell starts");
        let handle = shell.handle();
        let thread = Some(std::thread::spawn(move || shell.run()));
        Running { handle, thread }
    }

    fn stop(mut self) {
        self.handle.shutdown();
        let result = self
            .thread
            .take()
            .expect("running")
            .join()
            .expect("no panic");
        result.expect("clean exit");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.handle.shutdown();
            let _ = t.join();
        }
    }
}

/// Waits until `cond` holds, at most `secs` seconds.
fn wait_for(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

fn missing(own: &TestRelay, events: &[Event]) -> usize {
    events.iter().filter(|e| !own.has(&e.id)).count()
}

#[test]
fn discovery_history_then_live_over_real_sockets() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let a = TestRelay::start(RelayOptions::default()).unwrap();
    let b = TestRelay::start(RelayOptions::default()).unwrap();
    let owner = keys(1);
    let ann = announcement(&owner, "repo", &[&a.url(), &b.url(), &own.url()], T0);
    own.publish(ann.clone());
    let repo = coord(&owner, "repo");
    let issue = root(&keys(2), 1621, &[&repo], T0 + 1, "issue");
    let patch = root(&keys(2), 1617, &[&repo], T0 + 2, "patch");
    let pr = root(&owner, 1618, &[&repo], T0 + 3, "pr");
    let history = vec![
        issue.clone(),
        patch.clone(),
        pr.clone(),
        reply(&owner, &issue, T0 + 4, "NIP-22 reply"),
        status(&owner, &patch, 1631, T0 + 5),
        state(&owner, "repo", T0 + 6),
        repo_comment(&keys(3), &repo, T0 + 7, "about the repo"),
    ];
    for (i, e) in history.iter().enumerate() {
        if i % 2 == 0 {
            a.publish(e.clone())
        } else {
            b.publish(e.clone())
        }
    }
    let running = Running::start(&own, |_, _| {});
    assert!(
        wait_for(20, || missing(&own, &history) == 0),
        "history synced: {} missing",
        missing(&own, &history)
    );

    let live = reply(&keys(4), &pr, Timestamp::now().as_secs(), "live");
    let published = Instant::now();
    b.publish(live.clone());
    assert!(wait_for(5, || own.has(&live.id)));
    assert!(
        published.elapsed() < Duration::from_secs(2),
        "live within 2 s: {:?}",
        published.elapsed()
    );
    running.stop();
}
