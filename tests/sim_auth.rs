//! NIP-42 AUTH in the core, against fake relays with a simulated clock:
//! challenges are answered with a signed 22242, refused work is re-sent once
//! accepted, and every way it can go wrong ends in backoff, never a loop.

mod support;

use std::time::Duration;

use grasp_sync::{Config, Health};
use nostr::prelude::*;
use support::*;

const A: &str = "wss://a.example";
const B: &str = "wss://b.example";

fn config_with_key() -> Config {
    let mut c = config();
    c.auth_keys = Some(keys(9));
    c
}

/// A repo on `A` (requiring AUTH) and `B` (open), one root and a reply on
/// each; returns the events that must reach the own relay.
fn world(sim: &mut Sim, challenge: &str) -> Vec<Event> {
    let owner = keys(1);
    let coord = coord(&owner, "r");
    let issue = root(&owner, 1621, &[&coord], T0 - 50, "issue");
    let on_a = reply(&owner, &issue, T0 - 40, "only on A");
    let on_b = reply(&owner, &issue, T0 - 30, "only on B");
    sim.add_relay(A).require_auth = Some(challenge.to_owned());
    for e in [&issue, &on_a] {
        sim.seed(A, e);
    }
    sim.seed(B, &on_b);
    let own = sim.own.clone();
    sim.publish(&own, &announcement(&owner, "r", &[A, B], T0));
    sim.publish(&own, &issue);
    vec![on_a, on_b]
}

/// REQs on `A` asking tags (Layer 2/3 work), refused or not.
fn tag_reqs(sim: &Sim) -> usize {
    sim.reqs(A)
        .iter()
        .filter(|(_, fs)| fs.iter().any(|f| !f.generic_tags.is_empty()))
        .count()
}

#[test]
fn with_a_key_the_challenge_is_answered_and_refused_work_is_resent() {
    let mut sim = Sim::new(config_with_key());
    let wanted = world(&mut sim, "chal-1");
    sim.advance(Duration::from_secs(10));
    assert!(
        sim.missing(&wanted).is_empty(),
        "{:?}",
        sim.missing(&wanted)
    );

    let auths = &sim.relays[A].auths;
    assert_eq!(auths.len(), 1);
    let auth = &auths[0];
    assert_eq!(auth.kind, Kind::Authentication);
    assert_eq!(auth.pubkey, keys(9).public_key());
    let tag = |name: &str| {
        auth.tags
            .iter()
            .map(|t| t.as_slice().to_vec())
            .find(|t| t[0] == name)
            .map(|t| t[1].clone())
    };
    assert_eq!(tag("challenge").as_deref(), Some("chal-1"));
    assert_eq!(tag("relay").as_deref(), Some(A));
    assert!(auth.created_at.as_secs() >= T0);
    let stats = sim.engine.stats();
    assert_eq!((stats.auth_attempts, stats.auth_failures), (1, 0));
    assert!(stats.auth_required >= 1);
    assert!(sim.relays[B].auths.is_empty(), "B never asked");

    // Live events on A flow after AUTH too.
    let owner = keys(1);
    let live = repo_comment(&owner, &coord(&owner, "r"), T0 + 20, "live on A");
    sim.publish(A, &live);
    sim.settle();
    assert!(sim.synced(&live.id));
}

#[test]
fn without_a_key_the_relay_is_backed_off_and_counted() {
    let mut sim = Sim::new(config());
    let wanted = world(&mut sim, "chal-2");
    sim.advance(Duration::from_secs(600));
    assert_eq!(sim.missing(&wanted), vec![wanted[0].id]);
    assert!(sim.relays[A].auths.is_empty());
    let stats = sim.engine.stats();
    assert!(stats.auth_required >= 1);
    assert_eq!(stats.auth_attempts, 0);
    // Backoff, not a loop: ten minutes of doubling retries from 5 s.
    let tag_reqs = tag_reqs(&sim);
    assert!(tag_reqs <= 20, "{tag_reqs} REQs in ten minutes");
    let a = sim.id(A);
    assert_ne!(sim.engine.relay_health(a, sim.now), Health::Healthy);
}

#[test]
fn a_rejected_auth_is_not_retried_on_the_same_connection() {
    let mut sim = Sim::new(config_with_key());
    let wanted = world(&mut sim, "chal-3");
    sim.relay(A).reject_auth = true;
    sim.advance(Duration::from_secs(600));
    assert_eq!(sim.missing(&wanted), vec![wanted[0].id]);
    assert_eq!(sim.relays[A].auths.len(), 1);
    assert_eq!(sim.engine.stats().auth_failures, 1);
    let tag_reqs = tag_reqs(&sim);
    assert!(tag_reqs <= 20, "{tag_reqs} REQs in ten minutes");
}

#[test]
fn restricted_after_auth_backs_off_instead_of_looping() {
    let mut sim = Sim::new(config_with_key());
    let wanted = world(&mut sim, "chal-4");
    sim.relay(A).restricted_after_auth = true;
    sim.advance(Duration::from_secs(600));
    assert_eq!(sim.missing(&wanted), vec![wanted[0].id]);
    assert_eq!(sim.relays[A].auths.len(), 1, "one AUTH per connection");
    let tag_reqs = tag_reqs(&sim);
    assert!(tag_reqs <= 20, "{tag_reqs} REQs in ten minutes");
    // B is unaffected.
    assert!(sim.synced(&wanted[1].id));
}

#[test]
fn the_own_relay_is_authenticated_when_it_asks() {
    let mut sim = Sim::new(config_with_key());
    let own = sim.own.clone();
    sim.relay(&own).require_auth = Some("own-chal".to_owned());
    let owner = keys(1);
    let coord = coord(&owner, "r");
    let comment = repo_comment(&owner, &coord, T0 - 10, "on B");
    sim.seed(B, &comment);
    sim.seed(&own, &announcement(&owner, "r", &[B], T0 - 100));
    sim.advance(Duration::from_secs(30));
    assert_eq!(sim.relays[&own].auths.len(), 1);
    assert!(
        sim.synced(&comment.id),
        "the self-subscription ran after AUTH"
    );
}

/// With its own key the own relay is answered with that key and remote
/// relays with the shared one, so a remote relay never holds a signature
/// the own relay would take.
#[test]
fn the_own_relay_key_answers_the_own_relay_only() {
    let mut config = config_with_key();
    config.own_relay_auth_keys = Some(keys(8));
    let mut sim = Sim::new(config);
    let own = sim.own.clone();
    sim.relay(&own).require_auth = Some("own-chal".to_owned());
    let wanted = world(&mut sim, "chal-a");
    sim.advance(Duration::from_secs(30));
    assert!(
        sim.missing(&wanted).is_empty(),
        "{:?}",
        sim.missing(&wanted)
    );
    let signers =
        |url: &str| -> Vec<PublicKey> { sim.relays[url].auths.iter().map(|e| e.pubkey).collect() };
    assert_eq!(signers(&own), [keys(8).public_key()]);
    assert_eq!(signers(A), [keys(9).public_key()]);
}

#[test]
fn strfry_style_auth_required_is_understood() {
    let mut sim = Sim::new(config_with_key());
    let owner = keys(1);
    let coord = coord(&owner, "r");
    let comment = repo_comment(&owner, &coord, T0 - 10, "on A");
    sim.seed(A, &comment);
    let own = sim.own.clone();
    sim.publish(&own, &announcement(&owner, "r", &[A], T0));
    sim.advance(Duration::from_secs(6));
    // The relay challenges, then refuses in strfry's spelling.
    sim.relay(A).require_auth = Some("s".to_owned());
    sim.inject(A, r#"["AUTH","s"]"#);
    assert_eq!(sim.relays[A].auths.len(), 1);
    sim.relay(A)
        .close_next
        .push_back("ERROR: AUTH-REQUIRED: sign in".to_owned());
    let before = sim.engine.stats().auth_required;
    let newer = repo_comment(&owner, &coord, T0 - 5, "newer");
    sim.seed(A, &newer);
    let issue = root(&owner, 1621, &[&coord], T0 + 1, "issue");
    sim.publish(&own, &issue);
    sim.advance(Duration::from_secs(60));
    assert_eq!(sim.engine.stats().auth_required, before + 1);
    assert!(sim.synced(&comment.id));
}

/// The `since` of the newest REQ the own relay got.
fn last_self_since(sim: &Sim) -> Option<Timestamp> {
    let (_, filters) = sim.reqs(&sim.own).last().expect("a self REQ").clone();
    filters[0].since
}

#[test]
fn a_self_subscription_refused_before_eose_resumes_from_its_own_since() {
    let mut sim = Sim::new(config());
    let own = sim.own.clone();
    sim.relay(&own).silent = true;
    sim.settle();
    assert_eq!(
        last_self_since(&sim),
        None,
        "a fresh connect reads everything"
    );
    let sub = sim.reqs(&own)[0].0.clone();
    sim.inject(
        &own,
        &format!(r#"["CLOSED","{sub}","rate-limited: slow down"]"#),
    );
    sim.advance(Duration::from_secs(70));
    assert_eq!(sim.reqs(&own).len(), 2, "retried after the cooldown");
    assert_eq!(last_self_since(&sim), None, "still from the beginning");

    // Once a self-subscription reached EOSE, a refusal resumes over the
    // quick window before that EOSE only.
    sim.relay(&own).silent = false;
    let sub = sim.reqs(&own)[1].0.clone();
    sim.inject(&own, &format!(r#"["EOSE","{sub}"]"#));
    let eose_at = sim.now;
    sim.inject(
        &own,
        &format!(r#"["CLOSED","{sub}","rate-limited: again"]"#),
    );
    sim.advance(Duration::from_secs(70));
    let window = config().quick_reconnect.as_secs();
    assert_eq!(
        last_self_since(&sim),
        Some(Timestamp::from_secs(eose_at.as_secs() - window))
    );
}

#[test]
fn announcements_on_a_relay_that_wants_auth_first_are_read_from_the_beginning() {
    let mut config = config_with_key();
    config.bootstrap = vec![A.to_owned()];
    let mut sim = Sim::new(config);
    sim.add_relay(A).require_auth = Some("boot".to_owned());
    let owner = keys(1);
    // Announced on A two hours before we start, listing our relay and B.
    let ann = announcement(&owner, "r", &[OWN, B], T0 - 7_200);
    sim.seed(A, &ann);
    let comment = repo_comment(&owner, &coord(&owner, "r"), T0 - 7_000, "on B");
    sim.seed(B, &comment);
    sim.advance(Duration::from_secs(30));
    assert_eq!(sim.relays[A].auths.len(), 1);
    assert!(
        sim.synced(&ann.id),
        "Layer 1 re-read from the beginning after AUTH"
    );
    assert!(sim.synced(&comment.id), "and the repo it announces synced");
}
