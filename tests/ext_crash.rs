//! Nothing lost to a crash (issue 34): the real binary, SIGKILLed at
//! seeded random moments and started again over the same state file,
//! delivers every event the remote relays hold.
//!
//! The own relay rate-limits writes (a token bucket: 100 at once, then
//! 50 a second) and the outbox holds 20 events, so once the bucket ran dry
//! the outbox is full and reads wait behind it; the state is saved every second, so kills land around saves, and
//! every restart is within the quick-reconnect window, where the state
//! file's claims decide what is read again. New events are published
//! while the engine runs and while it is dead. A torn state file
//! (truncated, zeroed by a power loss, garbled) is warned about, set
//! aside, and every event still arrives.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use grasp_sync::testing::limits::EventBucket;
use grasp_sync::testing::relay::{RelayOptions, TestRelay};
use nostr::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use support::real::GraspSync;
use support::running::wait_for;
use support::*;

/// Seeds of the kill test, and kills per seed before the last run.
const SEEDS: u64 = 6;
const KILLS: usize = 4;

/// Remote relays holding the repos' events, an own relay that takes 100
/// events at once then 50 a second, and the state file's folder.
struct World {
    own: TestRelay,
    remotes: Vec<TestRelay>,
    dir: PathBuf,
    rng: SmallRng,
    /// Roots that live events reply to, with the relays holding them.
    roots: Vec<(Event, Vec<usize>)>,
    /// Every event placed on the remotes, for a cheap check while waiting.
    placed: Vec<EventId>,
}

impl World {
    /// Three repos on two remotes (one on both, one on each), each with
    /// 40 comments on the repo and two issues with 12 replies each: 198
    /// events, each on one or both of its repo's relays as the seed says,
    /// and more as the test publishes. Most are the repos' own (fetched
    /// with the repo, early), so many wait behind the full outbox while
    /// the repo counts as synced.
    fn new(name: &str, seed: u64) -> World {
        let own = TestRelay::start(RelayOptions {
            event_bucket: Some(EventBucket {
                tokens_per_interval: 50,
                interval: Duration::from_secs(1),
                max_tokens: 100,
            }),
            ..RelayOptions::default()
        })
        .expect("own relay starts");
        let remotes: Vec<TestRelay> = (0..2)
            .map(|_| TestRelay::start(RelayOptions::default()).expect("remote starts"))
            .collect();
        let dir = std::env::temp_dir().join(format!(
            "grasp-ext-crash-{name}-{seed}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut world = World {
            own,
            remotes,
            dir,
            rng: SmallRng::seed_from_u64(seed),
            roots: Vec::new(),
            placed: Vec::new(),
        };
        world.seed_history(seed);
        world
    }

    fn seed_history(&mut self, seed: u64) {
        let urls: Vec<String> = self.remotes.iter().map(TestRelay::url).collect();
        for r in 0..3u8 {
            let owner = keys(10 + r);
            let d = format!("repo{r}");
            let homes: Vec<usize> = match r {
                0 => vec![0, 1],
                _ => vec![usize::from(r) - 1],
            };
            let listed: Vec<&str> = homes.iter().map(|&i| urls[i].as_str()).collect();
            self.own.publish(announcement(&owner, &d, &listed, T0));
            let repo = coord(&owner, &d);
            for i in 0..40 {
                let text = format!("{d} comment {i} seed {seed}");
                self.place(&repo_comment(&keys(21), &repo, T0 + 50 + i, &text), &homes);
            }
            for i in 0..2u64 {
                let text = format!("{d} issue {i} seed {seed}");
                let issue = root(&keys(20), 1621, &[&repo], T0 + 10 * i, &text);
                self.place(&issue, &homes);
                for j in 0..12 {
                    let text = format!("{d} issue {i} reply {j} seed {seed}");
                    self.place(&reply(&keys(30), &issue, T0 + 100 + j, &text), &homes);
                }
                self.roots.push((issue, homes.clone()));
            }
        }
    }

    /// Stores `event` on one of `homes` at random, or on all of them.
    fn place(&mut self, event: &Event, homes: &[usize]) {
        self.placed.push(event.id);
        let pick = self.rng.gen_range(0..=homes.len());
        for (n, &home) in homes.iter().enumerate() {
            if pick == homes.len() || pick == n {
                self.remotes[home].publish(event.clone());
            }
        }
    }

    /// `n` new replies created now, on a random root's relays: live
    /// traffic for a running engine, or history missed by a dead one.
    fn publish_new(&mut self, n: usize) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        for _ in 0..n {
            let (root, homes) = self.roots[self.rng.gen_range(0..self.roots.len())].clone();
            let text = format!("live {}", self.rng.r#gen::<u64>());
            self.place(&reply(&keys(31), &root, now, &text), &homes);
        }
    }

    fn state_file(&self) -> PathBuf {
        self.dir.join("state.json")
    }

    /// The binary over this world's state file, saving every second,
    /// with an outbox of 20 events.
    fn start(&self) -> GraspSync {
        let state = self.state_file();
        GraspSync::start_logged(
            &self.own.url(),
            &[
                "--state-file",
                state.to_str().expect("UTF-8 path"),
                "--state-save-secs",
                "1",
                "--outbox-capacity",
                "20",
            ],
            &[("RUST_LOG", "grasp_sync=warn")],
        )
    }

    /// Every event the remotes hold.
    fn expected(&self) -> Vec<Event> {
        let mut events: Vec<Event> = self.remotes.iter().flat_map(TestRelay::events).collect();
        events.sort_by_key(|e| e.id);
        events.dedup_by_key(|e| e.id);
        events
    }

    /// True when the own relay holds every event placed.
    fn synced(&self) -> bool {
        self.placed.iter().all(|id| self.own.has(id))
    }

    /// Ids of the remotes' events the own relay lacks.
    fn missing(&self) -> Vec<EventId> {
        let expected = self.expected();
        expected
            .iter()
            .filter(|e| !self.own.has(&e.id))
            .map(|e| e.id)
            .collect()
    }

    /// Runs the binary until every event arrived (a generous deadline),
    /// stops it, and returns what is still missing.
    fn finish(&self) -> Vec<EventId> {
        let engine = self.start();
        wait_for(120, || self.synced());
        let log = engine.log();
        engine.stop();
        let missing = self.missing();
        if !self.synced() {
            eprintln!("last run's log:\n{log}");
        }
        missing
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Temporary files a save left half-written: the kill hit it mid-write.
fn torn_saves(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
                .count()
        })
        .unwrap_or(0)
}

/// How a kill picks its moment.
#[derive(Debug, Clone, Copy)]
enum Moment {
    /// Early in the run: connecting, listing, first pages, maybe before
    /// any save.
    Early,
    /// Right after one of the run's first periodic saves (one a second),
    /// when what it claims is newest.
    AtSave,
    /// Once the own relay refused for its rate (the outbox is full) and
    /// a save followed.
    Throttled,
}

/// When the state file was last written, if it exists.
fn written_at(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Waits (a generous deadline) until the state file was written `n`
/// times after `since`, as far as polling sees.
fn wait_for_saves(path: &Path, since: Option<SystemTime>, n: usize) {
    let mut last = since;
    for _ in 0..n {
        wait_for(30, || {
            let now = written_at(path);
            now.is_some() && now != last
        });
        last = written_at(path);
    }
}

#[test]
fn sigkill_at_random_moments_loses_no_event() {
    let mut kills = [0usize; 3];
    let mut torn = 0;
    let mut events = 0;
    for seed in 0..SEEDS {
        let mut world = World::new("kill", seed);
        for _ in 0..KILLS {
            let moment = match world.rng.gen_range(0..3) {
                0 => Moment::Early,
                1 => Moment::AtSave,
                _ => Moment::Throttled,
            };
            let throttled_before = world.own.rate_limited();
            let path = world.state_file();
            let saved_before = written_at(&path);
            let engine = world.start();
            let wait = match moment {
                Moment::Early => Duration::from_millis(world.rng.gen_range(50..800)),
                Moment::AtSave => {
                    wait_for_saves(&path, saved_before, world.rng.gen_range(1..3));
                    Duration::from_millis(world.rng.gen_range(0..20))
                }
                Moment::Throttled => {
                    wait_for(20, || {
                        world.own.rate_limited() > throttled_before || world.synced()
                    });
                    wait_for_saves(&path, saved_before, 1);
                    Duration::from_millis(world.rng.gen_range(0..300))
                }
            };
            std::thread::sleep(wait);
            world.publish_new(2);
            engine.kill();
            kills[moment as usize] += 1;
            torn += torn_saves(&world.dir);
            world.publish_new(2);
        }
        let missing = world.finish();
        events += world.expected().len();
        assert!(
            missing.is_empty(),
            "seed {seed}: {} of {} events lost: {missing:?}",
            missing.len(),
            world.expected().len()
        );
    }
    eprintln!(
        "ext_crash: seeds={SEEDS} kills={} early={} at_save={} throttled={} torn_saves={torn} events={events} lost=0",
        kills.iter().sum::<usize>(),
        kills[0],
        kills[1],
        kills[2]
    );
}

/// A way to tear a state file's bytes.
type Tear = fn(&[u8]) -> Vec<u8>;

/// A state file torn by a power loss, three ways: cut in half, zeroed
/// (a file whose size reached the disk before its data), garbled bytes.
/// Each start warns naming the file, sets it aside and starts fresh;
/// every event arrives all the same.
#[test]
fn a_torn_state_file_is_set_aside_with_a_warning_and_nothing_is_lost() {
    let world = World::new("torn", 99);
    let path = world.state_file();
    let tear: [(&str, Tear); 3] = [
        ("truncated", |b| b[..b.len() / 2].to_vec()),
        ("zeroed", |b| vec![0; b.len()]),
        ("garbled", |b| {
            let mut b = b.to_vec();
            let at = b.len() / 3;
            b[at..at + 8].copy_from_slice(b"\xff}]\"{:,\x00");
            b
        }),
    ];
    for (how, tear) in tear {
        let engine = world.start();
        let saved = wait_for(30, || std::fs::metadata(&path).is_ok_and(|m| m.len() > 100));
        assert!(saved, "{how}: a state file was written");
        std::thread::sleep(Duration::from_millis(300));
        engine.kill();
        let bytes = std::fs::read(&path).expect("the state file");
        std::fs::write(&path, tear(&bytes)).expect("tear it");
        let engine = world.start();
        let name = path.display().to_string();
        let warned = wait_for(30, || {
            engine
                .log()
                .lines()
                .any(|l| l.contains("WARN") && l.contains(&name) && l.contains("starting fresh"))
        });
        assert!(warned, "{how}: warned naming the file:\n{}", engine.log());
        let aside = std::fs::read_dir(&world.dir)
            .expect("dir")
            .flatten()
            .any(|e| e.file_name().to_string_lossy().contains(".bad-"));
        assert!(aside, "{how}: the torn file was set aside");
        engine.kill();
        for entry in std::fs::read_dir(&world.dir).expect("dir").flatten() {
            if entry.file_name().to_string_lossy().contains(".bad-") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    let missing = world.finish();
    assert!(missing.is_empty(), "{} lost: {missing:?}", missing.len());
}
