//! Against a relay nobody here wrote: rust-nostr's `LocalRelay`, from the
//! `nostr-sdk` PyPI wheel that `.ci/run` installs (`pip install
//! nostr-sdk==0.45.1`). Both the own relay and the remote relay are
//! LocalRelays; the remote one caps results at 500 per filter.

mod support;

use std::time::Duration;

use grasp_sync::{Config, Shell, ShellOptions, SinkTarget};
use nostr::prelude::*;
use support::real::PyRelay;
use support::running::wait_for;
use support::*;

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
