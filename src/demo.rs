//! `grasp-sync demo`: the main job, end to end, with no outside network.
//!
//! It starts an own relay and N remote relays on 127.0.0.1 (a relay farm on
//! a helper thread, not the engine's loop), seeds them with signed
//! repository announcements, issues, patches, PRs, replies, status and state
//! events spread across relays (some repos announced only on remote
//! relays), runs the real engine over real sockets, publishes more events
//! while it runs, restarts one remote relay midway, and reports progress
//! until every expected event reached the own relay.

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use nostr::prelude::{
    Event, EventBuilder, EventId, FinalizeEvent, Keys, Kind, SecretKey, Tag, Timestamp,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::config::Config;
use crate::shell::{Shell, ShellOptions, SinkTarget};
use crate::testing::farm::{FarmOptions, RelayFarm};

/// Demo parameters (`grasp-sync demo --relays N --repos M --events K --seed S`).
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Remote relays.
    pub relays: usize,
    /// Repositories (default: 2 per relay).
    pub repos: Option<usize>,
    /// Events besides announcements (default: 20 per relay).
    pub events: Option<usize>,
    /// Seed of everything random in the scenario and the engine.
    pub seed: u64,
    /// Give up after this long.
    pub timeout: Duration,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            relays: 20,
            repos: None,
            events: None,
            seed: 1,
            timeout: Duration::from_secs(300),
        }
    }
}

/// The outcome, as the summary line prints it.
#[derive(Debug, Clone, Copy)]
pub struct DemoSummary {
    /// Remote relays.
    pub relays: usize,
    /// Events that had to reach the own relay.
    pub expected: usize,
    /// Events that did.
    pub synced: usize,
    /// Seconds from engine start until everything arrived (or the timeout).
    pub seconds: f64,
    /// Peak resident memory of this process, KiB.
    pub peak_rss_kib: u64,
    /// REQs the relays received.
    pub reqs: u64,
}

impl DemoSummary {
    /// The last line of the demo's output; scripts parse it.
    pub fn line(&self) -> String {
        format!(
            "demo: relays={} expected={} synced={} missing={} seconds={:.1} peak_rss_kib={} reqs={}",
            self.relays,
            self.expected,
            self.synced,
            self.expected - self.synced,
            self.seconds,
            self.peak_rss_kib,
            self.reqs
        )
    }
}

/// Parses `demo` flags.
pub fn parse_args(args: &[String]) -> Result<DemoOptions, String> {
    let mut opts = DemoOptions::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (flag.as_str(), None),
        };
        let mut value = |what: &str| -> Result<u64, String> {
            let v = inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or(format!("{name}: missing value"))?;
            v.trim()
                .parse::<u64>()
                .map_err(|_| format!("{name}: invalid value {v:?} (expected {what})"))
        };
        match name {
            "--relays" => opts.relays = value("a positive integer")?.max(1) as usize,
            "--repos" => opts.repos = Some(value("a positive integer")?.max(1) as usize),
            "--events" => opts.events = Some(value("an integer")? as usize),
            "--seed" => opts.seed = value("an integer")?,
            "--timeout-secs" => opts.timeout = Duration::from_secs(value("seconds")?.max(1)),
            _ => {
                return Err(format!(
                    "demo: unknown flag {flag} (flags: --relays --repos --events --seed --timeout-secs)"
                ));
            }
        }
    }
    Ok(opts)
}

/// One generated repository.
struct Repo {
    owner: Keys,
    d: String,
    relays: Vec<usize>,
    roots: Vec<(Event, usize)>,
}

/// The generated world: what each relay holds and what must arrive.
struct Scenario {
    own: Vec<Event>,
    remote: Vec<Vec<Event>>,
    live: Vec<(usize, Event)>,
    expected: Vec<EventId>,
}

/// Runs the demo, printing progress; returns the summary.
pub fn run(opts: &DemoOptions) -> Result<DemoSummary, String> {
    let _ = crate::rlimit::raise_fd_limit();
    let n = opts.relays.max(1);
    let farm = RelayFarm::start(n + 1, FarmOptions::default())
        .map_err(|e| format!("starting relays: {e}"))?;
    let own_url = farm.url(0);
    let urls: Vec<String> = (1..=n).map(|i| farm.url(i)).collect();
    let scenario = generate(opts, &own_url, &urls);
    farm.seed(0, scenario.own.clone());
    for (i, events) in scenario.remote.iter().enumerate() {
        farm.seed(i + 1, events.clone());
    }
    let expected = scenario.expected.clone();
    println!(
        "demo: {} relays on 127.0.0.1, {} repos, {} events to sync ({} published while running)",
        n,
        opts.repos.unwrap_or(2 * n),
        expected.len(),
        scenario.live.len()
    );

    let mut config = Config::new(own_url);
    config.seed = opts.seed;
    config.batch_window = Duration::from_millis(500);
    config.backoff_base = Duration::from_secs(1);
    let shell_opts = ShellOptions {
        allow_private_addresses: true,
        max_relays: n + 10,
        dns_threads: 1,
        ..ShellOptions::default()
    };
    let shell = Shell::new(config, shell_opts, SinkTarget::OwnRelay).map_err(|e| e.to_string())?;
    let handle = shell.handle();
    let started = Instant::now();
    let timeout = opts.timeout;
    let (summary_tx, summary_rx) = std::sync::mpsc::channel();
    let monitor = std::thread::Builder::new()
        .name("demo-monitor".into())
        .spawn(move || {
            let synced = drive(&farm, &scenario, started + timeout, started);
            let (elapsed, reqs) = (started.elapsed(), farm.stats().reqs);
            handle.shutdown();
            // The relays outlive the engine's shutdown so its outbox can flush.
            let _ = summary_tx.send((synced, elapsed, reqs, farm));
        })
        .map_err(|e| e.to_string())?;
    shell.run().map_err(|e| e.to_string())?;
    let _ = monitor.join();
    let (synced, elapsed, reqs, farm) = summary_rx
        .recv()
        .map_err(|_| "monitor thread failed".to_owned())?;
    farm.stop();
    Ok(DemoSummary {
        relays: n,
        expected: expected.len(),
        synced,
        seconds: elapsed.as_secs_f64(),
        peak_rss_kib: peak_rss_kib(),
        reqs,
    })
}

/// Publishes the live events over the first seconds, restarts one relay
/// midway, and reports progress until everything arrived or time is up.
/// Returns how many expected events the own relay holds.
fn drive(farm: &RelayFarm, scenario: &Scenario, deadline: Instant, started: Instant) -> usize {
    let tty = std::io::stdout().is_terminal();
    let total = scenario.expected.len();
    let mut live = scenario.live.iter();
    let mut restarted = false;
    let mut last_print = Instant::now() - Duration::from_secs(10);
    loop {
        let elapsed = started.elapsed();
        // Live events trickle in over the first 3 s; one relay restarts at 1 s,
        // so some are published to it while it is down.
        for (relay, event) in live.by_ref().take(scenario.live.len().div_ceil(30).max(1)) {
            farm.publish(*relay, event.clone());
        }
        if !restarted && elapsed > Duration::from_secs(1) && !farm.is_empty() {
            let victim = 1 + (farm.len() - 1) / 2;
            println!("demo: restarting relay {} for 2 s", farm.url(victim));
            farm.restart(victim, Duration::from_secs(2));
            restarted = true;
        }
        let synced = farm.count_present(0, &scenario.expected);
        let done = synced == total && restarted && live.len() == 0;
        if tty || last_print.elapsed() >= Duration::from_secs(1) || done {
            print_progress(
                tty,
                synced,
                total,
                farm.stats().connections,
                farm.len() - 1,
                elapsed,
            );
            last_print = Instant::now();
        }
        if done || Instant::now() >= deadline {
            if tty {
                println!();
            }
            if !done {
                report_missing(farm, scenario);
            }
            return synced;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Names up to ten events that never arrived, with where they were put.
fn report_missing(farm: &RelayFarm, scenario: &Scenario) {
    let placed = scenario
        .remote
        .iter()
        .enumerate()
        .flat_map(|(i, events)| events.iter().map(move |e| (i + 1, e)))
        .chain(scenario.live.iter().map(|(r, e)| (*r, e)));
    let mut shown = 0;
    for (relay, event) in placed {
        if shown < 10 && farm.count_present(0, &[event.id]) == 0 {
            let root = event
                .tags
                .iter()
                .map(|t| t.as_slice())
                .find(|t| t.len() > 1 && (t[0] == "e" || t[0] == "E"))
                .and_then(|t| EventId::from_hex(&t[1]).ok());
            let root_synced = root.map(|r| farm.count_present(0, &[r]) == 1);
            println!(
                "demo: missing {} (kind {}) from {} (root {root:?} synced: {root_synced:?})",
                event.id,
                event.kind.as_u16(),
                farm.url(relay)
            );
            shown += 1;
        }
    }
}

fn print_progress(
    tty: bool,
    synced: usize,
    total: usize,
    connections: usize,
    relays: usize,
    elapsed: Duration,
) {
    let secs = elapsed.as_secs_f64();
    if tty {
        let width = 30;
        let filled = (synced * width).checked_div(total).unwrap_or(width);
        print!(
            "\r[{}{}] {synced}/{total} events synced, {connections} connections to {relays}+1 relays, {secs:.1} s ",
            "#".repeat(filled),
            ".".repeat(width - filled)
        );
        let _ = std::io::stdout().flush();
    } else {
        println!(
            "demo: {secs:.1} s: {synced}/{total} events synced, {connections} connections to {relays}+1 relays"
        );
    }
}

/// Peak resident set size of this process (VmHWM), KiB.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(str::to_owned)
        })
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// Generates the repos and their events, deterministically from the seed.
fn generate(opts: &DemoOptions, own_url: &str, urls: &[String]) -> Scenario {
    let mut rng = SmallRng::seed_from_u64(opts.seed);
    let n = urls.len();
    let repo_count = opts.repos.unwrap_or(2 * n).max(1);
    let event_count = opts.events.unwrap_or(20 * n);
    let owners: Vec<Keys> = (0..8).map(|_| keys(&mut rng)).collect();
    let authors: Vec<Keys> = (0..16).map(|_| keys(&mut rng)).collect();
    let now = Timestamp::now().as_secs();
    let mut s = Scenario {
        own: Vec::new(),
        remote: vec![Vec::new(); n],
        live: Vec::new(),
        expected: Vec::new(),
    };
    let mut repos: Vec<Repo> = (0..repo_count)
        .map(|i| {
            let mut relays: Vec<usize> = (0..rng.gen_range(1..=3.min(n)))
                .map(|_| rng.gen_range(0..n))
                .collect();
            relays.sort_unstable();
            relays.dedup();
            Repo {
                owner: owners[i % owners.len()].clone(),
                d: format!("repo-{i}"),
                relays,
                roots: Vec::new(),
            }
        })
        .collect();
    // Relays some own-announced repo lists: a remote-only announcement placed
    // there is found through Layer 1 (recursive discovery).
    let mut listed: HashSet<usize> = HashSet::new();
    for (i, repo) in repos.iter().enumerate() {
        let mut tags = vec![tag(&["d", &repo.d]), tag(&["name", &repo.d])];
        let mut relay_tag = vec!["relays".to_owned(), own_url.to_owned()];
        relay_tag.extend(repo.relays.iter().map(|&r| urls[r].clone()));
        tags.push(Tag::parse(relay_tag).expect("the relays tag has a name"));
        let ann = sign(&repo.owner, 30617, now - 86_400 + i as u64, tags, "");
        let remote_only = i % 5 == 4 && !listed.is_empty();
        if remote_only {
            let host = *listed
                .iter()
                .nth(i % listed.len())
                .unwrap_or(&repo.relays[0]);
            s.remote[host].push(ann.clone());
            s.expected.push(ann.id);
        } else {
            listed.extend(repo.relays.iter().copied());
            s.own.push(ann);
        }
        let state = sign(
            &repo.owner,
            30618,
            now - 80_000,
            vec![tag(&["d", &repo.d]), tag(&["refs/heads/main", "0123abcd"])],
            "",
        );
        place(&mut s, &repo.relays, &mut rng, state, None);
    }
    let live_from = event_count - event_count / 10;
    for i in 0..event_count {
        let r = rng.gen_range(0..repos.len());
        let repo = &mut repos[r];
        let coord = format!("30617:{}:{}", repo.owner.public_key().to_hex(), repo.d);
        let author = &authors[rng.gen_range(0..authors.len())];
        // History is backdated; live events carry the time they are published
        // at (within seconds), as real clients stamp them.
        let at = if i >= live_from {
            now + ((i - live_from) / 50) as u64
        } else {
            now - 70_000 + i as u64
        };
        let event = if repo.roots.is_empty() || rng.gen_bool(0.3) {
            let kind = [1621, 1617, 1618][rng.gen_range(0..3)];
            sign(
                author,
                kind,
                at,
                vec![
                    tag(&["a", &coord]),
                    tag(&["p", &repo.owner.public_key().to_hex()]),
                ],
                "root",
            )
        } else {
            let (root, _) = &repo.roots[rng.gen_range(0..repo.roots.len())];
            let id = root.id.to_hex();
            match rng.gen_range(0..4) {
                0 => sign(
                    author,
                    1111,
                    at,
                    vec![
                        tag(&["E", &id]),
                        tag(&["e", &id]),
                        tag(&["K", &root.kind.as_u16().to_string()]),
                    ],
                    "reply",
                ),
                1 => sign(
                    &repo.owner,
                    1630 + rng.gen_range(0..4),
                    at,
                    vec![tag(&["e", &id])],
                    "",
                ),
                2 => sign(
                    author,
                    1619,
                    at,
                    vec![tag(&["e", &id]), tag(&["a", &coord])],
                    "PR update",
                ),
                _ => sign(author, 1, at, vec![tag(&["e", &id])], "NIP-10 reply"),
            }
        };
        let is_root = matches!(event.kind.as_u16(), 1617 | 1618 | 1621);
        let at_relay = repo.relays[rng.gen_range(0..repo.relays.len())];
        if is_root {
            repo.roots.push((event.clone(), at_relay));
        }
        let live = (i >= live_from).then_some(at_relay);
        place(&mut s, &repo.relays, &mut rng, event, live);
    }
    s
}

/// Puts an event on one of `relays` (now, or live later) and expects it.
fn place(
    s: &mut Scenario,
    relays: &[usize],
    rng: &mut SmallRng,
    event: Event,
    live: Option<usize>,
) {
    s.expected.push(event.id);
    match live {
        Some(relay) => s.live.push((relay + 1, event)),
        None => s.remote[relays[rng.gen_range(0..relays.len())]].push(event),
    }
}

fn keys(rng: &mut SmallRng) -> Keys {
    loop {
        let bytes: [u8; 32] = rng.r#gen();
        if let Ok(sk) = SecretKey::from_slice(&bytes) {
            return Keys::new(sk);
        }
    }
}

fn tag(values: &[&str]) -> Tag {
    Tag::parse(values.iter().copied()).expect("tags built here always have a name")
}

fn sign(keys: &Keys, kind: u16, at: u64, tags: Vec<Tag>, content: &str) -> Event {
    EventBuilder::new(Kind::from_u16(kind), content)
        .tags(tags)
        .custom_created_at(Timestamp::from_secs(at))
        .finalize(keys)
        .expect("signing with an in-memory key cannot fail")
}
