//! `--shard I/N` over real sockets: two engines, shard 0/2 and 1/2, share
//! one own relay and a dozen remote relays. Each learns every repository
//! from the own relay, connects only to the relays of its shard, and
//! together they sync everything: every relay is connected by exactly one
//! shard and no event is missing.

mod support;

use support::running::*;

use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use grasp_sync::{Shard, normalize_relay_url};
use support::*;

/// Remote relays: enough that both shards are very likely to own some
/// (the test holds whatever the split of the OS-picked ports).
const RELAYS: usize = 12;

#[test]
fn two_shards_cover_every_relay_exactly_once_and_sync_everything() {
    let own = TestRelay::start(RelayOptions::default()).unwrap();
    let remotes: Vec<TestRelay> = (0..RELAYS)
        .map(|_| TestRelay::start(RelayOptions::default()).unwrap())
        .collect();
    let urls: Vec<String> = remotes.iter().map(TestRelay::url).collect();
    // Repo i is announced (on the own relay) on relays i and i+1; its
    // issue and reply sit on relay i only, so each must be read from the
    // one shard that owns that relay.
    let mut expected = Vec::new();
    for i in 0..RELAYS {
        let owner = keys(i as u8 + 1);
        let d = format!("repo{i}");
        let listed = [urls[i].as_str(), urls[(i + 1) % RELAYS].as_str()];
        own.publish(announcement(&owner, &d, &listed, T0));
        let issue = root(&keys(100), 1621, &[&coord(&owner, &d)], T0 + 1, "issue");
        let answer = reply(&keys(101), &issue, T0 + 2, "reply");
        for e in [&issue, &answer] {
            remotes[i].publish(e.clone());
            expected.push(e.clone());
        }
    }
    let shards = [Shard::new(0, 2).unwrap(), Shard::new(1, 2).unwrap()];
    let engines: Vec<Running> = shards
        .iter()
        .map(|&shard| Running::start(&own, |config, _| config.shard = shard))
        .collect();
    // What each shard should hold: its relays, by the stable hash.
    let owned: Vec<usize> = shards
        .iter()
        .map(|s| {
            urls.iter()
                .filter(|u| s.owns(&normalize_relay_url(u).unwrap()))
                .count()
        })
        .collect();
    assert_eq!(owned.iter().sum::<usize>(), RELAYS, "a partition");

    let connected = |e: &Running| e.metric("grasp_sync_relays{status=\"connected\"}") as usize;
    assert!(
        wait_for(30, || missing(&own, &expected) == 0
            && engines.iter().zip(&owned).all(|(e, &n)| connected(e) == n)),
        "{} of {} events missing; connected {:?}, owned {owned:?}",
        missing(&own, &expected),
        expected.len(),
        engines.iter().map(connected).collect::<Vec<_>>(),
    );
    // Each shard only ever tried its own relays and the own relay: the
    // engines' own counts, so a stray client of another test run reaching
    // one of these ports cannot blur them.
    for ((engine, &n), shard) in engines.iter().zip(&owned).zip(&shards) {
        assert_eq!(
            engine.metric("grasp_sync_connection_attempts_total{result=\"started\"}") as usize,
            n + 1,
            "shard {shard} connected outside its share"
        );
        // The gauges count this shard's relays, no other shard's (nor the
        // own relay, which has gauges of its own).
        let counted: u64 = ["disconnected", "connecting", "connected"]
            .iter()
            .map(|s| engine.metric(&format!("grasp_sync_relays{{status=\"{s}\"}}")))
            .sum();
        assert_eq!(counted as usize, n, "shard {shard} counts other relays");
        let info = format!(
            "grasp_sync_shard{{index=\"{}\",count=\"2\"}}",
            shard.index()
        );
        assert_eq!(engine.metric(&info), 1, "{info}");
    }
    // And every remote relay saw a connection (from its one shard).
    for (i, relay) in remotes.iter().enumerate() {
        assert!(relay.connections_made() >= 1, "relay {i} never connected");
    }
    for engine in engines {
        engine.stop();
    }
}
