//! The core's defences against hostile relays and hostile announcements,
//! against fake relays with a simulated clock: misbehaving relays are cut
//! and backed off longer without touching others, busy upgrades cool down,
//! and announcements cannot make the engine connect anywhere or everywhere.

mod support;

use std::time::Duration;

use grasp_sync::Offence;
use grasp_sync::{Action, Config, Engine, Status, Time};
use nostr::prelude::*;
use support::*;

const A: &str = "wss://a.example";
const B: &str = "wss://b.example";
const C: &str = "wss://c.example";

/// The relays the index holds for a repo, as URLs, sorted.
fn repo_relays(sim: &Sim, coord: &str) -> Vec<String> {
    let index = sim.engine.index();
    let repo = index.repo_id(coord).expect("repo known");
    let mut urls: Vec<String> = index
        .repo_relays(repo)
        .iter()
        .map(|r| index.relay_url(*r).to_owned())
        .collect();
    urls.sort();
    urls
}

/// `event` with its content changed after signing: its id no longer matches.
fn forged(event: &Event) -> String {
    event.as_json().replacen(
        &format!("\"content\":{:?}", event.content),
        "\"content\":\"forged\"",
        1,
    )
}

#[test]
fn a_relay_streaming_forged_events_is_cut_and_backed_off_longer_while_another_is_unaffected() {
    let mut sim = Sim::new(config());
    let owner = keys(1);
    let coord = coord(&owner, "r");
    let honest = repo_comment(&owner, &coord, T0 - 100, "honest");
    for url in [A, B] {
        sim.seed(url, &honest);
    }
    announce(&mut sim, &owner, "r", &[A, B], T0);
    sim.advance(Duration::from_secs(10));
    assert!(sim.synced(&honest.id));
    let (a, b) = (sim.id(A), sim.id(B));
    let sub = sim.sub_asking(A, SingleLetterTag::LOWERCASE_A);
    let bad = repo_comment(&owner, &coord, T0, "to be forged");
    for _ in 0..10 {
        sim.inject(A, &format!(r#"["EVENT","{sub}",{}]"#, forged(&bad)));
    }
    assert_eq!(
        sim.engine.stats().offences[Offence::InvalidEvent as usize],
        10
    );
    assert_eq!(sim.engine.relay_penalties(a), 1);
    assert_eq!(sim.engine.stats().penalties, 1);
    assert_eq!(sim.engine.relay_status(a), Status::Disconnected);
    assert_eq!(sim.engine.relay_status(b), Status::Connected);
    assert!(!sim.synced(&bad.id));

    // A plain failure waits about `backoff_base` (5 s); a penalised one
    // four times as long.
    let cut_at = sim.now;
    sim.advance(Duration::from_secs(60));
    let retry = sim
        .connects
        .iter()
        .find(|(t, url)| *t > cut_at && url == A)
        .map(|(t, _)| t.since(cut_at))
        .expect("A is retried");
    assert!(retry >= Duration::from_secs(20), "retried after {retry:?}");

    // B kept serving live events the whole time; A is back and serves too.
    let live = repo_comment(&owner, &coord, T0 + 100, "live on B");
    sim.publish(B, &live);
    sim.settle();
    assert!(sim.synced(&live.id));
    assert_eq!(sim.engine.relay_status(a), Status::Connected);
}

#[test]
fn a_few_events_outside_the_filter_are_tolerated() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    let owner = keys(1);
    announce(&mut sim, &owner, "r", &[A], T0);
    sim.advance(Duration::from_secs(10));
    let sub = sim.sub_asking(A, SingleLetterTag::LOWERCASE_A);
    let stray = repo_comment(&keys(2), &coord(&keys(2), "other"), T0, "stray");
    for _ in 0..20 {
        sim.inject(A, &format!(r#"["EVENT","{sub}",{}]"#, stray.as_json()));
    }
    let a = sim.id(A);
    assert_eq!(
        sim.engine.stats().offences[Offence::OutsideFilter as usize],
        20
    );
    assert_eq!(sim.engine.relay_penalties(a), 0);
    assert_eq!(sim.engine.relay_status(a), Status::Connected);
    assert!(!sim.synced(&stray.id));
}

/// An engine with one bootstrap relay whose first connect is refused with
/// HTTP `status`; returns how long until it is tried again.
fn retry_after_upgrade_refused(status: u16) -> (Duration, u64) {
    let mut config = Config::new(OWN);
    config.self_subscribe = false;
    config.bootstrap = vec![A.to_owned()];
    let t0 = Time::from_secs(T0);
    let mut engine = Engine::new(config, t0).unwrap();
    let a = engine.relay_id(A).unwrap();
    assert!(matches!(engine.poll_action(), Some(Action::Connect { .. })));
    engine.handle_connect_refused(t0, a, status);
    while let Some(next) = engine.poll_timeout() {
        engine.handle_timeout(next);
        while let Some(action) = engine.poll_action() {
            if let Action::Connect { relay, .. } = action {
                assert_eq!(relay, a);
                return (next.since(t0), engine.stats().upgrades_refused);
            }
        }
    }
    panic!("never retried");
}

#[test]
fn http_429_and_503_cool_down_other_statuses_back_off() {
    for status in [429, 503] {
        let (wait, refused) = retry_after_upgrade_refused(status);
        assert_eq!(wait, Duration::from_secs(65), "HTTP {status}");
        assert_eq!(refused, 1);
    }
    let (wait, _) = retry_after_upgrade_refused(500);
    assert!(wait < Duration::from_secs(10), "HTTP 500 waited {wait:?}");
}

#[test]
fn an_announcement_flipping_its_relays_changes_them_at_most_once_per_interval() {
    let mut sim = Sim::new(config());
    let owner = keys(1);
    let coord = announce(&mut sim, &owner, "r", &[A], T0);
    sim.advance(Duration::from_secs(10));
    let mut last = repo_relays(&sim, &coord);
    let mut changes = 0;
    for i in 1..=180u64 {
        let relays = if i % 2 == 0 { [B] } else { [C] };
        announce(&mut sim, &owner, "r", &relays, T0 + i);
        sim.advance(Duration::from_secs(1));
        let now = repo_relays(&sim, &coord);
        if now != last {
            changes += 1;
            last = now;
        }
    }
    // 180 s of flipping: the first change at once, then one per minute.
    let held = sim.engine.index().stats().relay_changes_held;
    assert!((2..=4).contains(&changes), "{changes} changes, {held} held");
    // Every other announcement names the relays already in force: not held.
    assert!(held >= 80, "{changes} changes, {held} held");
    // The newest announcement (C at T0+179... B at T0+180) wins once due.
    sim.advance(Duration::from_secs(61));
    assert_eq!(repo_relays(&sim, &coord), vec![B.to_owned()]);
    sim.engine.check_invariants().unwrap();
}

#[test]
fn a_single_change_applies_at_once() {
    let mut sim = Sim::new(config());
    let owner = keys(1);
    let coord = announce(&mut sim, &owner, "r", &[A], T0);
    sim.advance(Duration::from_secs(10));
    announce(&mut sim, &owner, "r", &[B], T0 + 1);
    sim.advance(Duration::from_secs(10));
    assert_eq!(repo_relays(&sim, &coord), vec![B.to_owned()]);
    assert_eq!(sim.engine.index().stats().relay_changes_held, 0);
}

#[test]
fn private_malformed_and_duplicate_relay_urls_are_dropped_and_counted() {
    let urls = [
        "ws://127.0.0.1:7000",
        "ws://localhost:7000",
        "ws://[::1]:7000",
        "wss://10.1.2.3",
        "wss://192.168.0.1",
        "http://web.example",
        "ftp://files.example",
        "not a url",
        "wss://user:pw@cred.example",
        "WSS://Good.Example:443/",
        "wss://good.example",
        "wss://good.example/",
        "wss://public.example",
    ];
    let mut sim = Sim::new(config());
    let owner = keys(1);
    let coord = announce(&mut sim, &owner, "r", &urls, T0);
    sim.advance(Duration::from_secs(10));
    assert_eq!(
        repo_relays(&sim, &coord),
        vec![
            "wss://good.example".to_owned(),
            "wss://public.example".to_owned()
        ]
    );
    assert_eq!(sim.engine.index().stats().relay_urls_rejected, 9);

    let mut config = config();
    config.allow_private_addresses = true;
    let mut sim = Sim::new(config);
    let coord = announce(&mut sim, &owner, "r", &urls, T0);
    sim.advance(Duration::from_secs(10));
    assert_eq!(repo_relays(&sim, &coord).len(), 7);
}

#[test]
fn thousands_of_relays_in_one_tag_are_capped() {
    let mut sim = Sim::new(config());
    let owner = keys(1);
    let urls: Vec<String> = (0..5_000).map(|i| format!("wss://r{i}.example")).collect();
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let coord = announce(&mut sim, &owner, "r", &refs, T0);
    sim.advance(Duration::from_secs(10));
    assert_eq!(repo_relays(&sim, &coord).len(), 50);
    assert_eq!(sim.engine.index().stats().relay_urls_over_cap, 4_950);
    assert!(sim.engine.relays().count() <= 51);
}

#[test]
fn announcements_naming_ever_new_relays_cannot_grow_the_relay_table_past_its_cap() {
    let mut config = config();
    config.max_known_relays = 100;
    let mut sim = Sim::new(config);
    let owner = keys(1);
    for n in 0..10 {
        let urls: Vec<String> = (0..50).map(|i| format!("wss://r{n}-{i}.example")).collect();
        let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
        announce(&mut sim, &owner, &format!("repo{n}"), &refs, T0);
    }
    sim.advance(Duration::from_secs(10));
    assert!(sim.engine.index().relay_count() <= 100);
    assert!(sim.engine.index().stats().relay_urls_over_cap >= 400);
    sim.engine.check_invariants().unwrap();
}

#[test]
fn an_announcement_with_a_huge_d_tag_is_rejected_and_counted() {
    let mut sim = Sim::new(config());
    let owner = keys(1);
    let huge = "d".repeat(10_000);
    let coord = announce(&mut sim, &owner, &huge, &[A], T0);
    sim.advance(Duration::from_secs(10));
    assert!(sim.engine.index().repo_id(&coord).is_none());
    assert_eq!(sim.engine.index().stats().announcements_rejected, 1);
    assert!(sim.engine.relay_id(A).is_none());
}

#[test]
fn a_relay_refusing_every_req_as_too_many_backs_off_once_the_limit_is_at_its_floor() {
    let mut sim = Sim::new(config());
    sim.add_relay(A).max_subs = Some((0, Refuse::Notice));
    let owner = keys(1);
    announce(&mut sim, &owner, "r", &[A], T0);
    sim.advance(Duration::from_secs(600));
    let reqs = sim.reqs(A).len();
    // Limits fall 10 → 1 at once, then doubling backoff from 5 s: a few
    // dozen REQs in ten minutes, not thousands.
    assert!(reqs <= 40, "{reqs} REQs in ten minutes");
    let a = sim.id(A);
    assert_eq!(sim.engine.subscription_limit(a), 1);
}

/// Announces repo `d` of key `k` listing `n` junk relays named after `tag`.
fn announce_junk(sim: &mut Sim, k: &Keys, d: &str, tag: &str, n: usize, at: u64) {
    let urls: Vec<String> = (0..n).map(|i| format!("wss://{tag}-{i}.example")).collect();
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    announce(sim, k, d, &refs, at);
}

/// A legitimate repo on `A` with one comment; true once it reached the sink.
fn legit_repo_syncs(sim: &mut Sim, at: u64) -> bool {
    let owner = keys(1);
    let comment = repo_comment(&owner, &coord(&owner, "legit"), T0 - 100, "legit");
    sim.seed(A, &comment);
    announce(sim, &owner, "legit", &[A], at);
    sim.advance(Duration::from_secs(10));
    sim.synced(&comment.id)
}

/// Issue 13, item 5: junk relays announced from many keys fill the cap
/// on known relays; once those announcements are replaced, the relays
/// are released, and a legitimate repo announced later gets its relay.
#[test]
fn junk_relays_from_many_keys_are_released_once_their_announcements_are_replaced() {
    let mut config = config();
    config.max_known_relays = 200;
    let mut sim = Sim::new(config);
    for k in 0..10 {
        announce_junk(&mut sim, &wide_keys(k), "junk", &format!("j{k}"), 50, T0);
    }
    sim.advance(Duration::from_secs(10));
    assert_eq!(sim.engine.index().known_relays(), 200);
    for k in 0..10 {
        announce(&mut sim, &wide_keys(k), "junk", &[], T0 + 1);
    }
    // Two disconnect checks: one disconnects, the next releases.
    sim.advance(Duration::from_secs(130));
    assert!(sim.engine.index().known_relays() <= 1);
    assert!(sim.engine.index().stats().relays_released >= 199);
    assert!(legit_repo_syncs(&mut sim, T0 + 200), "the cap stayed full");
    // Released ids are reused: the table (own relay and 199 junk) did
    // not grow for A.
    assert_eq!(sim.engine.index().relay_count(), 200);
    sim.check();
}

/// Issue 13, item 5: one key announcing thousands of junk relays takes
/// only its share of the cap; another key's repo still gets its relay.
#[test]
fn one_key_announcing_thousands_of_junk_relays_takes_only_its_share() {
    let mut config = config();
    config.max_known_relays = 300;
    config.max_relays_per_pubkey = 100;
    let mut sim = Sim::new(config);
    let flooder = wide_keys(1);
    for d in 0..20 {
        announce_junk(
            &mut sim,
            &flooder,
            &format!("r{d}"),
            &format!("f{d}"),
            50,
            T0,
        );
    }
    sim.advance(Duration::from_secs(10));
    let known = sim.engine.index().known_relays();
    assert!(
        known <= 101,
        "{known} known: more than the own relay and the share"
    );
    assert!(
        legit_repo_syncs(&mut sim, T0),
        "the flood took the legit relay's slot"
    );
    sim.check();
}

/// Issue 13, item 5: roots from one key naming ever new repos create only
/// that key's share of repos and roots; the rest is ignored and counted.
#[test]
fn roots_naming_thousands_of_repos_take_only_their_key_s_share() {
    let mut config = config();
    config.max_repos_per_pubkey = 50;
    config.max_roots_per_pubkey = 20;
    let mut sim = Sim::new(config);
    let flooder = wide_keys(2);
    let own = sim.own.clone();
    for n in 0..40 {
        let coords: Vec<String> = (0..20)
            .map(|i| coord(&flooder, &format!("x{n}-{i}")))
            .collect();
        let refs: Vec<&str> = coords.iter().map(String::as_str).collect();
        sim.publish(&own, &root(&flooder, 1621, &refs, T0, &format!("fake {n}")));
    }
    sim.advance(Duration::from_secs(10));
    let index = sim.engine.index();
    assert!(index.repo_count() <= 50, "{} repos", index.repo_count());
    assert!(index.root_count() <= 20, "{} roots", index.root_count());
    assert!(index.stats().items_over_cap > 0);
    assert!(legit_repo_syncs(&mut sim, T0));
    sim.check();
}

/// Issue 13, item 5: one key fills its share of repos and roots with
/// junk (roots naming made-up repos of its own, and junk announcements);
/// once it deletes them (NIP-09), the share is free again, and the same
/// key's legitimate repo is accepted and synced.
#[test]
fn a_key_s_deleted_junk_frees_its_share_for_its_legitimate_repo() {
    let mut config = config();
    config.max_repos_per_pubkey = 20;
    config.max_roots_per_pubkey = 10;
    let mut sim = Sim::new(config);
    let own = sim.own.clone();
    let owner = keys(1);
    let mut junk = Vec::new();
    for n in 0..10 {
        let coords: Vec<String> = (0..2)
            .map(|i| coord(&owner, &format!("x{n}-{i}")))
            .collect();
        let refs: Vec<&str> = coords.iter().map(String::as_str).collect();
        let fake = root(&owner, 1621, &refs, T0, &format!("fake {n}"));
        sim.publish(&own, &fake);
        junk.push(tag(&["e", &fake.id.to_hex()]));
    }
    sim.advance(Duration::from_secs(10));
    assert_eq!(sim.engine.index().repo_count(), 20);
    let comment = repo_comment(&owner, &coord(&owner, "legit"), T0 - 100, "legit");
    sim.seed(A, &comment);
    announce(&mut sim, &owner, "legit", &[A], T0 + 1);
    sim.advance(Duration::from_secs(10));
    assert!(!sim.synced(&comment.id), "the share was not full");
    sim.publish(&own, &sign(&owner, 5, T0 + 2, junk, "junk"));
    sim.advance(Duration::from_secs(10));
    assert_eq!(sim.engine.index().repo_count(), 0);
    assert_eq!(sim.engine.index().root_count(), 0);
    announce(&mut sim, &owner, "legit", &[A], T0 + 3);
    sim.advance(Duration::from_secs(10));
    assert!(sim.synced(&comment.id), "the share stayed full");
    assert_eq!(sim.engine.index().item_slots(), (20, 10), "ids reused");
    sim.check();
}

/// Issue 13, item 5, fairness per delivering relay: a relay streaming
/// new roots from many keys (no key's share stops them) is charged for
/// them: past its budget of new items per window it is cut and backed
/// off, so it cannot create historic work on every other relay at line
/// rate. Nothing is lost: every root reaches the sink, and a relay
/// delivering a few roots is not charged.
#[test]
fn a_relay_flooding_new_roots_is_charged_and_still_loses_nothing() {
    const H: &str = "wss://hostile.example";
    // A budget of 1,000 per minute (10,000 by default) keeps the flood
    // small enough to sign quickly; the rule is the same.
    let mut sim = Sim::new(Config {
        max_new_items_per_relay_minute: 1_000,
        ..config()
    });
    let owner = keys(1);
    let c = coord(&owner, "r");
    sim.add_relay(H);
    sim.add_relay(B);
    announce(&mut sim, &owner, "r", &[H, B], T0);
    sim.advance(Duration::from_secs(10));
    let authors: Vec<Keys> = (0..20).map(wide_keys).collect();
    let flood: Vec<Event> = (0..1_200)
        .map(|n| root(&authors[n % 20], 1621, &[&c], T0 + 1, &format!("flood {n}")))
        .collect();
    let few: Vec<Event> = (0..5)
        .map(|n| root(&owner, 1621, &[&c], T0 + 1, &format!("few {n}")))
        .collect();
    for event in &few {
        sim.publish(B, event);
    }
    for event in &flood {
        sim.publish(H, event);
    }
    sim.settle();
    let (h, b) = (sim.id(H), sim.id(B));
    assert!(sim.engine.stats().offences[Offence::ItemFlood as usize] > 0);
    assert_eq!(sim.engine.relay_penalties(h), 1, "the flooder is cut");
    assert_eq!(sim.engine.relay_penalties(b), 0);
    sim.advance(Duration::from_secs(600));
    let missing = sim.missing(flood.iter().chain(&few));
    assert!(missing.is_empty(), "{} roots lost", missing.len());
    sim.check();
}

/// Fault mode "a relay announcing thousands of junk relays from many
/// keys": a bootstrap relay serves 100 announcements, each from its own
/// key and listing 49 junk relays (and the service, so GRASP-01 passes
/// them on). One key each, so no per-key share stops them: they fill the
/// cap on known relays. Once the announcements are replaced, the junk is
/// released and a legitimate repo gets its relay.
#[test]
fn a_relay_announcing_thousands_of_junk_relays_from_many_keys_frees_the_cap_once_replaced() {
    const H: &str = "wss://hostile.example";
    let mut config = config();
    config.bootstrap = vec![H.to_owned()];
    config.max_known_relays = 1_000;
    let mut sim = Sim::new(config);
    sim.add_relay(H);
    for k in 0..100 {
        let mut urls: Vec<String> = (0..49).map(|i| format!("wss://k{k}-{i}.example")).collect();
        urls.push(OWN.to_owned());
        let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
        sim.seed(H, &announcement(&wide_keys(k), "junk", &refs, T0 - 10));
    }
    sim.advance(Duration::from_secs(10));
    assert_eq!(sim.engine.index().known_relays(), 1_000);
    for k in 0..100 {
        sim.publish(H, &announcement(&wide_keys(k), "junk", &[OWN], T0 + 1));
    }
    sim.advance(Duration::from_secs(130));
    assert_eq!(sim.engine.index().known_relays(), 2, "the own relay and H");
    assert!(legit_repo_syncs(&mut sim, T0 + 200), "the cap stayed full");
    sim.check();
}

/// Relays listed only by a held-back announcement, or by one that was
/// replaced while held, are released like any other unlisted relay; the
/// relays in force, and the held ones once applied, stay.
#[test]
fn relays_of_held_and_superseded_announcements_are_released_once_unlisted() {
    const D: &str = "wss://d.example";
    let mut sim = Sim::new(config());
    let owner = keys(1);
    let coord = announce(&mut sim, &owner, "r", &[A], T0);
    sim.advance(Duration::from_secs(10));
    announce(&mut sim, &owner, "r", &[B], T0 + 1); // a change: applied
    sim.advance(Duration::from_secs(10));
    announce(&mut sim, &owner, "r", &[C], T0 + 2); // held
    sim.advance(Duration::from_secs(10));
    announce(&mut sim, &owner, "r", &[D], T0 + 3); // replaces the held one
    sim.advance(Duration::from_secs(10));
    assert_eq!(repo_relays(&sim, &coord), vec![B.to_owned()]);
    assert!(sim.engine.relay_id(D).is_some(), "held: still listed");
    sim.advance(Duration::from_secs(200));
    assert_eq!(repo_relays(&sim, &coord), vec![D.to_owned()]);
    for gone in [A, B, C] {
        assert!(sim.engine.relay_id(gone).is_none(), "{gone} not released");
    }
    assert!(sim.engine.relay_id(D).is_some());
    sim.check();
}
