//! Announcements (30617), states (30618) and roots (1617/1618/1621) are
//! written by anyone: built here from the fuzz input with hostile tags (huge,
//! duplicate, malformed and differently spelled relay URLs, clone URLs, huge
//! `d` tags, floods of `a` tags), signed, and fed to the engine as local
//! events or through the own relay's subscription, together with raw text
//! the own relay "sends". Beyond no panic and the engine's invariants, the
//! index and every relay's targets are checked against a model written from
//! the rules (`fuzz/src/model.rs`).

#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use grasp_sync::Config;
use grasp_sync::internal::normalize;
use grasp_sync_fuzz::model::{Limits, Model};
use grasp_sync_fuzz::{OWN, REMOTES, T0, World, keys, sign, tag};
use libfuzzer_sys::fuzz_target;
use nostr::prelude::{Event, RelayMessage, SubscriptionId};

/// Relays the input can name by number, spelled in many ways.
const KNOWN: [&str; 7] = [
    REMOTES[0],
    REMOTES[1],
    REMOTES[2],
    OWN,
    "wss://r4.example/nostr",
    "ws://[::1]:7777",
    "ws://127.0.0.1",
];

#[derive(Arbitrary, Debug)]
struct Input {
    relays_cap: u8,
    repos_cap: u8,
    allow_private: bool,
    damp_changes: bool,
    events: Vec<Spec>,
    raw: Vec<Raw>,
}

#[derive(Arbitrary, Debug)]
struct Spec {
    kind: KindSpec,
    key: u8,
    /// Seconds after the base time: few values, so ties (broken by id) are common.
    age: u8,
    /// Varies the id of otherwise equal events.
    content: u8,
    tags: Vec<TagSpec>,
    via_own_relay: bool,
}

#[derive(Arbitrary, Debug)]
enum KindSpec {
    Announcement,
    State,
    Patch,
    PullRequest,
    Issue,
    Other(u16),
}

#[derive(Arbitrary, Debug)]
enum TagSpec {
    D(Ident),
    Relays(Vec<UrlSpec>),
    Clone(Vec<UrlSpec>),
    A(CoordSpec),
    ManyRelays { count: u16, distinct: u8 },
    ManyA { count: u16 },
    Raw(Vec<String>),
}

#[derive(Arbitrary, Debug)]
enum Ident {
    Short(u8),
    Text(String),
    /// Around the accepted maximum, on both sides.
    Huge(u16),
}

#[derive(Arbitrary, Debug)]
enum UrlSpec {
    Known {
        n: u8,
        spelling: u8,
    },
    Text(String),
    /// Around the accepted maximum length, on both sides.
    Huge(u16),
}

#[derive(Arbitrary, Debug)]
enum CoordSpec {
    Known { key: u8, d: Ident },
    Text(String),
}

#[derive(Arbitrary, Debug)]
enum Raw {
    /// Text the own relay sends as is.
    Message(String),
    /// Text sent as the event of an EVENT on the self-subscription.
    Event(String),
    /// A built event's JSON with one byte changed, on the self-subscription.
    Mutated { event: u8, at: u16, byte: u8 },
}

fuzz_target!(|input: Input| {
    let relays_cap = [0, 1, 2, 3, 5, 50][usize::from(input.relays_cap) % 6];
    let repos_cap = [0, 1, 2, 3, 20][usize::from(input.repos_cap) % 5];
    let mut config = Config::new(OWN);
    config.max_relays_per_announcement = relays_cap;
    config.max_repos_per_root = repos_cap;
    config.allow_private_addresses = input.allow_private;
    if !input.damp_changes {
        config.relay_change_interval = Duration::ZERO;
    }
    let mut world = World::new(config);
    let own = world.engine.own_relay();
    let sub = world.subs(own).first().cloned().unwrap_or_default();
    let mut applied = Vec::new();
    for spec in input.events.iter().take(24) {
        let event = build(spec);
        if spec.via_own_relay {
            world.message(
                own,
                &RelayMessage::event(SubscriptionId::new(&sub), event.clone()).as_json(),
            );
        } else {
            world.local_event(event.clone());
        }
        world.check();
        applied.push(event);
    }
    let built = applied.clone();
    for raw in input.raw.iter().take(8) {
        let text = raw_message(raw, &sub, &built);
        // A refusal among the raw messages may have ended the self-subscription.
        if world.engine.open_subscriptions(own) > 0 {
            applied.extend(valid_event_on(&text, &sub));
        }
        world.message(own, &text);
        world.check();
    }
    // Past the batch window (5 s) and any relay change held back (60 s after it).
    world.advance(Duration::from_secs(70), 64);
    world.check();
    let limits = Limits {
        relays_per_announcement: relays_cap,
        repos_per_root: repos_cap,
        allow_private: input.allow_private,
    };
    // OWN is a constant, canonical relay URL (the engine started with it).
    let own = normalize(OWN).expect("own relay URL is valid");
    if let Err(e) = Model::new(&own, &applied, limits).check(&world.engine) {
        panic!("index differs from the model: {e}");
    }
});

fn build(spec: &Spec) -> Event {
    let kind = match spec.kind {
        KindSpec::Announcement => 30617,
        KindSpec::State => 30618,
        KindSpec::Patch => 1617,
        KindSpec::PullRequest => 1618,
        KindSpec::Issue => 1621,
        KindSpec::Other(k) => k,
    };
    let tags = spec.tags.iter().take(16).flat_map(tags_of).collect();
    let created_at = T0 - 300 + u64::from(spec.age % 8);
    sign(
        &keys(1 + spec.key % 3),
        kind,
        created_at,
        tags,
        &spec.content.to_string(),
    )
}

fn tags_of(spec: &TagSpec) -> Vec<nostr::prelude::Tag> {
    let many = |values: Vec<String>| {
        let refs: Vec<&str> = values.iter().map(String::as_str).collect();
        tag(&refs).into_iter().collect()
    };
    match spec {
        TagSpec::D(d) => many(vec!["d".into(), ident(d)]),
        TagSpec::Relays(urls) => many(prefixed("relays", urls.iter().map(url))),
        TagSpec::Clone(urls) => many(prefixed("clone", urls.iter().map(clone_url))),
        TagSpec::A(c) => many(vec!["a".into(), coord(c)]),
        TagSpec::ManyRelays { count, distinct } => {
            let n = usize::from(*distinct).max(1);
            let urls = (0..usize::from(*count) % 600).map(|i| format!("wss://m{}.example", i % n));
            many(prefixed("relays", urls))
        }
        TagSpec::ManyA { count } => (0..usize::from(*count) % 300)
            .filter_map(|i| {
                let c = format!(
                    "30617:{}:d{}",
                    keys(1 + (i % 3) as u8).public_key().to_hex(),
                    i % 40
                );
                tag(&["a", &c])
            })
            .collect(),
        TagSpec::Raw(values) => many(values.iter().take(8).cloned().collect()),
    }
}

fn prefixed(name: &str, values: impl Iterator<Item = String>) -> Vec<String> {
    std::iter::once(name.to_owned())
        .chain(values.take(64))
        .collect()
}

fn ident(d: &Ident) -> String {
    match d {
        Ident::Short(n) => format!("d{}", n % 4),
        Ident::Text(s) => s.clone(),
        Ident::Huge(n) => "d".repeat(200 + usize::from(*n) % 150),
    }
}

fn coord(c: &CoordSpec) -> String {
    match c {
        CoordSpec::Known { key, d } => {
            format!(
                "30617:{}:{}",
                keys(1 + key % 3).public_key().to_hex(),
                ident(d)
            )
        }
        CoordSpec::Text(s) => s.clone(),
    }
}

/// A known relay in one of many spellings that all normalize alike, or junk.
fn url(spec: &UrlSpec) -> String {
    match spec {
        UrlSpec::Known { n, spelling } => {
            let base = KNOWN[usize::from(*n) % KNOWN.len()];
            let bit = |b: u8| spelling & (1 << b) != 0;
            let mut u = if bit(0) {
                base.to_uppercase()
            } else {
                base.to_owned()
            };
            if bit(1) && !base.contains("/nostr") && base.matches(':').count() == 1 {
                u.push_str(if base.starts_with("wss") {
                    ":443"
                } else {
                    ":80"
                });
            }
            if bit(2) {
                u.push('/');
            }
            if bit(3) {
                u.push_str("#frag");
            }
            if bit(4) {
                u = format!("  {u}\t");
            }
            u
        }
        UrlSpec::Text(s) => s.clone(),
        UrlSpec::Huge(n) => format!("wss://{}.example", "h".repeat(480 + usize::from(*n) % 60)),
    }
}

/// A git clone URL whose host is a known relay's, or junk.
fn clone_url(spec: &UrlSpec) -> String {
    let u = url(spec);
    match u.trim().split_once("://") {
        Some((scheme, rest)) if matches!(spec, UrlSpec::Known { .. }) => {
            let web = if scheme.eq_ignore_ascii_case("wss") {
                "https"
            } else {
                "http"
            };
            format!("{web}://{rest}/repo.git")
        }
        _ => u,
    }
}

fn raw_message(raw: &Raw, sub: &str, built: &[Event]) -> String {
    match raw {
        Raw::Message(text) => text.clone(),
        Raw::Event(text) => format!(r#"["EVENT","{sub}",{text}]"#),
        Raw::Mutated { event, at, byte } => {
            let Some(e) = built.get(usize::from(*event) % built.len().max(1)) else {
                return String::new();
            };
            let mut json = e.as_json().into_bytes();
            let i = usize::from(*at) % json.len();
            json[i] = *byte;
            format!(r#"["EVENT","{sub}",{}]"#, String::from_utf8_lossy(&json))
        }
    }
}

/// The event `text` carries if the engine must take it: a validly signed
/// EVENT on the self-subscription (a mutation can keep an event valid, for
/// example by escaping a character of its content differently).
fn valid_event_on(text: &str, sub: &str) -> Option<Event> {
    match RelayMessage::from_json(text).ok()? {
        RelayMessage::Event {
            subscription_id,
            event,
        } if subscription_id.as_str() == sub && event.verify().is_ok() => Some(event.into_owned()),
        _ => None,
    }
}
