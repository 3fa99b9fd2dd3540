//! Property tests over the engine's hostile-input entry points, with a fixed
//! seed so every run is the same run: relay URLs (`normalize`), generated
//! announcements and roots (checked against the model the `announcement`
//! fuzz target uses), and relay messages (`handle_message`). The fuzz
//! targets in `fuzz/` explore the same ground for as long as one lets them;
//! these keep a fixed sample of it in the normal suite.

mod support;

#[path = "../fuzz/src/model.rs"]
mod model;

use std::time::Duration;

use grasp_sync::internal::{host_port, normalize, relay_of_clone_url};
use nostr::prelude::*;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config as ProptestConfig, RngAlgorithm, TestRng, TestRunner};
use support::*;

const SEED: [u8; 32] = *b"grasp-sync fixed property seed!!";
const REMOTES: [&str; 3] = [
    "wss://r0.example",
    "wss://r1.example",
    "ws://r2.example:8080",
];

/// Runs `test` on `cases` values of `strategy`, from the fixed seed; a
/// failure panics with the shrunk value.
fn check<S: Strategy>(
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    let config = ProptestConfig {
        cases,
        rng_algorithm: RngAlgorithm::ChaCha,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &SEED);
    if let Err(e) = TestRunner::new_with_rng(config, rng).run(&strategy, test) {
        panic!("{e}");
    }
}

/// Relay-URL-shaped text: every part drawn from spellings that stress the
/// parser (case, default ports, IDNA, IP literals, credentials, whitespace,
/// newlines, percent escapes, extra slashes).
fn url_like() -> impl Strategy<Value = String> {
    let scheme = select(vec!["ws", "wss", "WSS", "wS", "http", "https", ""]);
    let sep = select(vec![
        "://",
        ":///",
        ":/",
        "://user:pw@",
        ":// ",
        ":\n//",
        "://\t",
    ]);
    let host = select(vec![
        "r.example",
        "R.Example.COM",
        "127.0.0.1",
        "[::1]",
        "10.0.0.1",
        "bücher.example",
        "xn--bcher-kva.example",
        "",
        "a b",
        "localhost",
        "0x7f.1",
        "own.example",
    ]);
    let port = select(vec!["", ":443", ":80", ":7777", ":0", ":99999", ":"]);
    let path = "(/[a-zA-Z0-9%. \t\n@:?#~]{0,6}){0,3}";
    (scheme, sep, host, port, path).prop_map(|(a, b, c, d, e)| format!("{a}{b}{c}{d}{e}"))
}

/// Any text, URL-shaped text, or URL-shaped text padded towards the length cap.
fn url_text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => url_like(),
        1 => any::<String>(),
        1 => (url_like(), 150..260usize).prop_map(|(u, n)| format!("{u}/{}", " a".repeat(n))),
    ]
}

#[test]
fn normalize_is_idempotent_and_yields_relay_urls() {
    check(5_000, url_text(), |raw| {
        if let Ok(url) = normalize(&raw) {
            prop_assert_eq!(normalize(&url), Ok(url.clone()), "raw {:?}", raw);
            prop_assert!(url.starts_with("ws://") || url.starts_with("wss://"));
            prop_assert!(!host_port(&url).is_empty() && !host_port(&url).contains('@'));
            prop_assert!(url.len() <= 512, "{} bytes", url.len());
        }
        if let Some(url) = relay_of_clone_url(&raw) {
            prop_assert_eq!(normalize(&url), Ok(url.clone()), "clone {:?}", raw);
        }
        Ok(())
    });
}

/// One generated index event.
#[derive(Debug, Clone)]
enum Spec {
    /// Kind 30617 by key `key`, with these tags.
    Announcement {
        key: u8,
        age: u64,
        tags: Vec<Vec<String>>,
    },
    /// A root of `kind` naming these repo refs in `a` tags.
    Root {
        kind: u16,
        age: u64,
        coords: Vec<String>,
    },
}

/// `d` values: common ones (so announcements compete), and long ones on
/// both sides of the 256-byte cap.
fn identifier() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(vec!["", "repo", "x"]).prop_map(str::to_owned),
        1 => "[a-z]{250,262}",
    ]
}

/// Relay values: remotes and the own relay in other spellings, private
/// addresses, and URL-shaped junk.
fn relay_value() -> impl Strategy<Value = String> {
    let spelled = select(vec![
        "wss://r0.example",
        "WSS://R0.example:443/",
        "wss://r1.example/#x",
        " ws://r2.example:8080/ ",
        "wss://own.example",
        "wss://OWN.example/",
        "ws://127.0.0.1:7777",
        "ws://[::1]",
        "wss://localhost",
        "wss://r3.example/nostr",
    ]);
    prop_oneof![3 => spelled.prop_map(str::to_owned), 1 => url_like()]
}

fn d_tag() -> impl Strategy<Value = Vec<String>> {
    identifier().prop_map(|d| vec!["d".to_owned(), d])
}

fn announcement_tags() -> impl Strategy<Value = Vec<Vec<String>>> {
    let relays = prop::collection::vec(relay_value(), 0..8).prop_map(|urls| {
        std::iter::once("relays".to_owned())
            .chain(urls)
            .collect::<Vec<_>>()
    });
    let many = (1..80usize).prop_map(|n| {
        let urls = (0..n).map(|i| format!("wss://m{i}.example"));
        std::iter::once("relays".to_owned()).chain(urls).collect()
    });
    let clone = select(vec![
        "https://r0.example/a.git",
        "http://r2.example:8080/x",
        "https://own.example/x.git",
        "https://127.0.0.1/x",
        "git@github.com:a/b",
    ])
    .prop_map(|c| vec!["clone".to_owned(), c.to_owned()]);
    let tag = prop_oneof![3 => relays, 1 => many, 1 => clone, 1 => d_tag()];
    (
        prop::option::weighted(0.9, d_tag()),
        prop::collection::vec(tag, 0..4),
    )
        .prop_map(|(d, rest)| d.into_iter().chain(rest).collect())
}

/// Repo refs: ones the announcements may use, and malformed ones.
fn repo_ref() -> impl Strategy<Value = String> {
    let known = (1..4u8, identifier()).prop_map(|(k, d)| coord(&keys(k), &d));
    let junk = select(vec!["30617:ABC:x", "30618:00:repo", "", "30617:"]).prop_map(str::to_owned);
    prop_oneof![4 => known, 1 => junk]
}

fn spec() -> impl Strategy<Value = Spec> {
    prop_oneof![
        3 => (1..4u8, 0..4u64, announcement_tags())
            .prop_map(|(key, age, tags)| Spec::Announcement { key, age, tags }),
        1 => (select(vec![1617u16, 1618, 1621]), 0..4u64, prop::collection::vec(repo_ref(), 0..5))
            .prop_map(|(kind, age, coords)| Spec::Root { kind, age, coords }),
    ]
}

fn build(spec: &Spec) -> Event {
    let strs = |v: &Vec<String>| tag(&v.iter().map(String::as_str).collect::<Vec<_>>());
    match spec {
        Spec::Announcement { key, age, tags } => sign(
            &keys(*key),
            30617,
            T0 + age,
            tags.iter().map(strs).collect(),
            "",
        ),
        Spec::Root { kind, age, coords } => {
            let tags = coords.iter().map(|c| tag(&["a", c])).collect();
            sign(&keys(9), *kind, T0 + age, tags, "root")
        }
    }
}

#[test]
fn announcements_target_exactly_their_valid_relays() {
    let limits = (
        select(vec![1usize, 2, 3, 50]),
        select(vec![1usize, 2, 20]),
        any::<bool>(),
    );
    let input = (limits, prop::collection::vec(spec(), 1..12));
    check(
        256,
        input,
        |((relays_cap, repos_cap, allow_private), specs)| {
            let mut cfg = config();
            cfg.max_relays_per_announcement = relays_cap;
            cfg.max_repos_per_root = repos_cap;
            cfg.allow_private_addresses = allow_private;
            let mut sim = Sim::new(cfg);
            for r in REMOTES {
                sim.add_relay(r);
            }
            let own = sim.own.clone();
            let events: Vec<Event> = specs.iter().map(build).collect();
            for e in &events {
                sim.publish(&own, e);
            }
            // Past the batch window and any relay change held back after it.
            sim.advance(Duration::from_secs(70));
            sim.engine.check_invariants().map_err(TestCaseError::fail)?;
            let index = sim.engine.index();
            for e in &events {
                let d = model::first_d(e);
                let Some(repo) = index.repo_id(&format!("30617:{}:{d}", e.pubkey)) else {
                    continue;
                };
                prop_assert!(d.len() <= model::MAX_IDENTIFIER_LEN, "oversized d indexed");
                prop_assert!(index.repo_relays(repo).len() <= relays_cap);
                let own_id = sim.engine.own_relay();
                prop_assert!(!index.repo_relays(repo).contains(&own_id));
            }
            let limits = model::Limits {
                relays_per_announcement: relays_cap,
                repos_per_root: repos_cap,
                allow_private,
            };
            model::Model::new(&own, &events, limits)
                .check(&sim.engine)
                .map_err(TestCaseError::fail)
        },
    );
}

/// A step of a relay conversation.
#[derive(Debug, Clone)]
enum Step {
    /// Relay `relay` (0 is the own relay) sends `text`, with `$S` replaced
    /// by the subscription `sub` picks among those open on it.
    Message {
        relay: usize,
        sub: prop::sample::Index,
        text: String,
    },
    /// Time passes.
    Advance(u64),
    /// A remote relay goes down, dropping its connection.
    Stop(usize),
    /// A remote relay comes back.
    Start(usize),
}

/// Mostly a subscription that is open, sometimes one that is not.
fn sub_id() -> impl Strategy<Value = String> {
    prop_oneof![4 => Just("$S".to_owned()), 1 => "[0-9a-f]{1,2}"]
}

/// Relay messages: well-formed ones, signed events whole or with a byte
/// changed, and arbitrary text.
fn message(events: Vec<String>) -> impl Strategy<Value = String> {
    let reason = select(vec![
        "rate-limited: slow down",
        "error: too many concurrent REQs",
        "auth-required: sign in",
        "restricted: no",
        "blocked: negentropy disabled",
        "",
    ]);
    let event = select(events);
    prop_oneof![
        (sub_id(), event.clone()).prop_map(|(s, e)| format!(r#"["EVENT","{s}",{e}]"#)),
        (sub_id(), event, any::<prop::sample::Index>(), any::<u8>()).prop_map(|(s, e, at, b)| {
            let mut bytes = e.into_bytes();
            let i = at.index(bytes.len());
            bytes[i] = b;
            format!(r#"["EVENT","{s}",{}]"#, String::from_utf8_lossy(&bytes))
        }),
        sub_id().prop_map(|s| format!(r#"["EOSE","{s}"]"#)),
        (sub_id(), reason.clone()).prop_map(|(s, r)| format!(r#"["CLOSED","{s}","{r}"]"#)),
        reason.prop_map(|r| format!(r#"["NOTICE","{r}"]"#)),
        (sub_id(), "(61|6100|61[0-9a-f]{0,40})")
            .prop_map(|(s, m)| format!(r#"["NEG-MSG","{s}","{m}"]"#)),
        sub_id().prop_map(|s| format!(r#"["NEG-ERR","{s}","blocked: no"]"#)),
        "[a-z]{0,8}".prop_map(|c| format!(r#"["AUTH","{c}"]"#)),
        any::<String>(),
    ]
}

fn steps(events: Vec<String>) -> impl Strategy<Value = Vec<Step>> {
    let message = (0..4usize, any::<prop::sample::Index>(), message(events));
    let step = prop_oneof![
        6 => message.prop_map(|(relay, sub, text)| Step::Message { relay, sub, text }),
        2 => (0..600_000u64).prop_map(Step::Advance),
        1 => (1..4usize).prop_map(Step::Stop),
        1 => (1..4usize).prop_map(Step::Start),
    ];
    prop::collection::vec(step, 1..60)
}

/// The subscription `pick` chooses among those open on the fake relay at
/// `url`, in a fixed order; an id that is not ours when none is.
fn open_sub(sim: &Sim, url: &str, pick: prop::sample::Index) -> String {
    let mut subs: Vec<&String> = sim.relays[url].subs.keys().collect();
    subs.sort();
    subs.get(pick.index(subs.len().max(1)))
        .map_or("zz".to_owned(), |s| s.to_string())
}

/// A world with repos on every remote relay and subscriptions open.
fn synced_sim() -> Sim {
    let mut cfg = config();
    cfg.page_limit = 2;
    cfg.consolidation_threshold = 4;
    let mut sim = Sim::new(cfg);
    for r in REMOTES {
        sim.add_relay(r);
    }
    let own = sim.own.clone();
    let (a, b) = (keys(1), keys(2));
    sim.publish(&own, &announcement(&a, "one", &REMOTES[..2], T0));
    sim.publish(&own, &announcement(&b, "two", &REMOTES[1..], T0));
    let repos = [coord(&a, "one"), coord(&b, "two")];
    let refs: Vec<&str> = repos.iter().map(String::as_str).collect();
    sim.publish(&own, &root(&keys(3), 1621, &refs, T0 + 1, "issue"));
    sim.advance(Duration::from_secs(10));
    sim
}

#[test]
fn relay_messages_keep_invariants() {
    let (a, c) = (keys(1), keys(3));
    let issue = root(&c, 1621, &[&coord(&a, "one")], T0 + 1, "other issue");
    let events: Vec<String> = [
        reply(&c, &issue, T0 + 5, "a reply"),
        repo_comment(&c, &coord(&a, "one"), T0 + 6, "a comment"),
        state(&a, "one", T0 + 7),
        announcement(&c, "three", &["wss://own.example", REMOTES[2]], T0 + 8),
        issue,
    ]
    .iter()
    .map(|e| e.as_json())
    .collect();
    check(256, steps(events), |steps| {
        let mut sim = synced_sim();
        let urls: Vec<String> = std::iter::once(sim.own.clone())
            .chain(REMOTES.map(str::to_owned))
            .collect();
        for step in steps {
            match step {
                Step::Message { relay, sub, text } => {
                    let text = text.replace("$S", &open_sub(&sim, &urls[relay], sub));
                    sim.inject(&urls[relay], &text);
                }
                Step::Advance(ms) => sim.advance(Duration::from_millis(ms)),
                Step::Stop(r) => sim.stop_relay(&urls[r]),
                Step::Start(r) => sim.start_relay(&urls[r]),
            }
            sim.engine.check_invariants().map_err(TestCaseError::fail)?;
        }
        Ok(())
    });
}
