//! `Config::shard` in the engine, without sockets: the connects an engine
//! asks for at start. The own relay is never sharded; bootstrap relays are
//! split like any other remote relay, each to exactly one shard.

use grasp_sync::{Action, Config, Engine, Shard, Time, shard_of};

const OWN: &str = "wss://own.example";

/// The URLs `shard`'s engine asks to connect right after it starts.
fn first_connects(bootstrap: &[String], shard: Shard) -> Vec<String> {
    let mut config = Config::new(OWN);
    config.bootstrap = bootstrap.to_vec();
    config.shard = shard;
    let mut engine = Engine::new(config, Time::from_millis(0)).unwrap();
    std::iter::from_fn(|| engine.poll_action())
        .filter_map(|a| match a {
            Action::Connect { url, .. } => Some(url),
            _ => None,
        })
        .collect()
}

#[test]
fn bootstrap_relays_are_split_and_the_own_relay_is_always_connected() {
    let bootstrap: Vec<String> = (0..40).map(|i| format!("wss://relay{i}.example")).collect();
    for count in 1..=4 {
        let mut connected_by = vec![0; bootstrap.len()];
        for index in 0..count {
            let shard = Shard::new(index, count).unwrap();
            let urls = first_connects(&bootstrap, shard);
            assert!(urls.iter().any(|u| u == OWN), "{shard}: own relay");
            for (i, url) in bootstrap.iter().enumerate() {
                let mine = urls.contains(url);
                assert_eq!(mine, shard_of(url, count) == index, "{shard}: {url}");
                connected_by[i] += usize::from(mine);
            }
        }
        assert!(
            connected_by.iter().all(|&n| n == 1),
            "{count}: {connected_by:?}"
        );
    }
}
