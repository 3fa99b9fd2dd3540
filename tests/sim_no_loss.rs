//! One regression test per way the engine lost events, synced what it must
//! not, or punished an honest relay: each fails on the code before its fix.
//! Fake relays behave like the real ones that showed the bug (khatru's
//! per-filter result cap, eventstore's value caps, relays that keep serving
//! subscriptions we opened), under a simulated clock.

mod support;

use std::time::Duration;

use grasp_sync::Offence;
use grasp_sync::testing::limits::TOO_MANY_TAG_VALUES;
use grasp_sync::{Config, ItemKey, ItemState, Status, Time};
use nostr::prelude::*;
use support::*;

const A: &str = "wss://a.example";
const B: &str = "wss://b.example";
const C: &str = "wss://c.example";
const W: &str = "wss://w.example";

/// An announcement as a GRASP-01 relay for `domain` accepts it: the
/// service in `relays` and a clone URL on the domain.
fn grasp_announcement(k: &Keys, d: &str, relays: &[&str], domain: &str, created_at: u64) -> Event {
    let service = format!("wss://{domain}");
    let mut values = vec!["relays", service.as_str()];
    values.extend_from_slice(relays);
    let clone = format!("https://{domain}/{}/{d}.git", k.public_key().to_hex());
    sign(
        k,
        30617,
        created_at,
        vec![tag(&["d", d]), tag(&values), tag(&["clone", &clone])],
        "",
    )
}

/// An announcement with a `relays` tag alone: no `clone` URL.
fn bare_announcement(k: &Keys, d: &str, relays: &[&str], created_at: u64) -> Event {
    let mut values = vec!["relays"];
    values.extend_from_slice(relays);
    sign(k, 30617, created_at, vec![tag(&["d", d]), tag(&values)], "")
}

/// True for a relay's wide live filter: kinds beyond announcements, no tags.
fn is_wide(filter: &Filter) -> bool {
    filter.generic_tags.is_empty()
        && filter.since.is_some()
        && filter
            .kinds
            .as_ref()
            .is_some_and(|k| k.iter().any(|k| k.as_u16() != 30617))
}

/// True for a REQ filter that asks history from the beginning of a repo or
/// root (a tag filter without `since` or `until`): a fresh or daily sync.
fn full_history(filter: &Filter) -> bool {
    !filter.generic_tags.is_empty() && filter.since.is_none() && filter.until.is_none()
}

/// Bug 1 (own relay): khatru returns at most 100 stored events per filter
/// whatever `limit` asks; a page of 100 under a `limit` of 500 was taken as
/// the end of history, and 50 announcements were never read.
#[test]
fn own_relay_capped_at_100_with_150_announcements_syncs_every_repo() {
    let mut sim = Sim::new(config());
    let own = sim.own.clone();
    sim.relay(&own).filter_cap = 100;
    sim.add_relay(A);
    let owner = keys(1);
    let mut history = Vec::new();
    for i in 0..150u64 {
        let d = format!("r{i}");
        sim.seed(&own, &announcement(&owner, &d, &[A], T0 - 10_000 + i));
        let comment = repo_comment(&keys(2), &coord(&owner, &d), T0 - 5_000 + i, "c");
        sim.seed(A, &comment);
        history.push(comment);
    }
    sim.advance(Duration::from_secs(60));
    let a = sim.id(A);
    assert_eq!(
        sim.engine.item_counts(a).confirmed,
        150,
        "every announcement read"
    );
    assert_eq!(sim.missing(&history), vec![], "every repo synced");
}

/// Bug 1 (remote relay): 250 replies behind a per-filter cap of 100.
#[test]
fn a_remote_relay_capped_at_100_delivers_all_250_replies() {
    let mut sim = Sim::new(config());
    sim.add_relay(A).filter_cap = 100;
    let owner = keys(1);
    let repo = announce(&mut sim, &owner, "r", &[A], T0);
    let issue = root(&owner, 1621, &[&repo], T0 - 100_000, "issue");
    let own = sim.own.clone();
    sim.publish(&own, &issue);
    let replies: Vec<Event> = (0..250)
        .map(|i| reply(&keys(2), &issue, T0 - 50_000 + i * 7, &format!("r{i}")))
        .collect();
    for r in &replies {
        sim.seed(A, r);
    }
    sim.advance(Duration::from_secs(60));
    assert_eq!(sim.missing(&replies).len(), 0, "all 250 replies synced");
    let a = sim.id(A);
    assert_eq!(
        sim.engine.item_state(a, &ItemKey::Root(issue.id)),
        Some(ItemState::Confirmed)
    );
}

/// Bug 2: eventstore's SQL backends refuse a filter with more than 10 tag
/// values (`CLOSED blocked: too many tag values`) or 10 kinds; chunks of 100
/// were retried forever and nothing arrived.
#[test]
fn a_relay_refusing_more_than_10_tag_values_still_delivers_everything() {
    let mut sim = Sim::new(config());
    sim.add_relay(A).value_caps = Some(ValueCaps::eventstore().closed());
    let owner = keys(1);
    let own = sim.own.clone();
    let mut history = Vec::new();
    let mut coords = Vec::new();
    for i in 0..30u64 {
        let d = format!("r{i}");
        sim.seed(&own, &announcement(&owner, &d, &[A], T0 - 10_000 + i));
        let c = coord(&owner, &d);
        let comment = repo_comment(&keys(2), &c, T0 - 5_000 + i, "on the repo");
        sim.seed(A, &comment);
        history.push(comment);
        coords.push(c);
    }
    for (i, c) in coords.iter().take(25).enumerate() {
        let issue = root(&keys(3), 1621, &[c], T0 - 4_000 + i as u64, "issue");
        sim.seed(&own, &issue);
        let answer = reply(&keys(4), &issue, T0 - 3_000 + i as u64, "answer");
        sim.seed(A, &answer);
        history.push(answer);
    }
    sim.advance(Duration::from_secs(120));
    let a = sim.id(A);
    assert_eq!(sim.missing(&history), vec![], "everything delivered");
    assert_eq!(sim.engine.item_counts(a).confirmed, 55);
    assert!(
        sim.relays[A].value_refusals <= 5,
        "the cap is learnt, not retried: {} refusals",
        sim.relays[A].value_refusals
    );
    for (_, filters) in sim.reqs(A).iter().rev().take(5) {
        for f in filters {
            assert!(ValueCaps::eventstore().check(f).is_none(), "{f:?}");
        }
    }
    let live = repo_comment(&keys(5), &coords[29], T0 + 500, "live");
    sim.publish(A, &live);
    sim.settle();
    assert!(sim.synced(&live.id), "live coverage within the value cap");
    sim.engine.check_invariants().unwrap();
}

/// Bug: khatru refuses a filter over eventstore's value caps with a bare
/// `NOTICE` (no subscription id) just before that REQ's `EOSE`, as if the
/// filter matched nothing. The engine guessed the REQ: the oldest silent
/// one over its cap, else the newest silent one. Before the first refusal
/// its cap is 100, so no REQ looked over it and the NOTICE of the oldest
/// REQ was blamed on the newest; the oldest was taken as complete at its
/// EOSE and its repos confirmed with their events never read. The
/// 5,000-relay demo lost up to a few hundred replies and statuses that way.
#[test]
fn a_value_cap_notice_refuses_the_req_it_precedes() {
    let mut cfg = config();
    cfg.negentropy = false;
    // Pages only: a refused live REQ would have its work asked again by
    // the consolidation that follows, hiding the loss.
    cfg.consolidation_threshold = 0;
    let mut sim = Sim::new(cfg);
    // The relay holds nothing yet and answers nothing: REQs stay silent.
    sim.add_relay(A).silent = true;
    let owner = keys(1);
    let own = sim.own.clone();
    let mut coords = Vec::new();
    // Two batches of 12 repos each: two REQs, every filter over 10 values.
    for batch in 0..2u64 {
        for i in 0..12u64 {
            let d = format!("r{batch}-{i}");
            let at = T0 - 10_000 + batch * 100 + i;
            sim.publish(&own, &announcement(&owner, &d, &[A], at));
            coords.push(coord(&owner, &d));
        }
        sim.advance(Duration::from_secs(10));
    }
    let history: Vec<Event> = (0..)
        .zip(&coords)
        .map(|(i, c)| repo_comment(&keys(2), c, T0 - 5_000 + i, "on the repo"))
        .collect();
    for comment in &history {
        sim.seed(A, comment);
    }
    let over_cap: Vec<(String, usize)> = sim
        .reqs(A)
        .iter()
        .map(|(id, fs)| {
            let refused = fs
                .iter()
                .filter(|f| ValueCaps::eventstore().check(f) == Some(TOO_MANY_TAG_VALUES));
            (id.clone(), refused.count())
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    assert!(over_cap.len() >= 2, "two REQs over the cap: {over_cap:?}");
    // The relay answers them in turn, as it got them; the engine's cap is
    // 100 until the first refusal, so neither looks over it yet.
    for (id, refused) in &over_cap {
        for _ in 0..*refused {
            sim.inject(A, r#"["NOTICE","too many tag values"]"#);
        }
        sim.inject(A, &format!(r#"["EOSE","{id}"]"#));
    }
    let relay = sim.relay(A);
    relay.silent = false;
    relay.value_caps = Some(ValueCaps::eventstore());
    sim.advance(Duration::from_secs(300));
    assert_eq!(sim.missing(&history), vec![], "everything delivered");
    sim.engine.check_invariants().unwrap();
}

/// Bug 3: an event a wide relay sent for a repo it does not carry was
/// dropped as unwanted but remembered as seen, so the same event from the
/// repo's own relay was dropped as a duplicate, for good.
#[test]
fn an_unwanted_copy_from_a_wide_relay_does_not_block_the_wanted_copy() {
    let mut cfg = config();
    cfg.consolidation_threshold = 3; // any repo sends a relay wide
    let mut sim = Sim::new(cfg);
    sim.add_relay(W);
    sim.add_relay(A);
    announce(&mut sim, &keys(1), "on-w", &[W], T0);
    let wanted = announce(&mut sim, &keys(2), "on-a", &[A], T0);
    sim.advance(Duration::from_secs(30));
    for url in [W, A] {
        assert!(
            sim.relays[url].subs.values().flatten().any(is_wide),
            "{url} went wide"
        );
    }
    let comment = repo_comment(&keys(3), &wanted, T0 + 40, "for the repo on A");
    sim.publish(W, &comment); // W does not carry the repo: unwanted there
    sim.settle();
    sim.publish(A, &comment);
    sim.settle();
    assert!(
        sim.ingested
            .iter()
            .any(|(url, e)| e.id == comment.id && url == A),
        "the copy from the repo's relay is synced"
    );
    assert!(sim.synced(&comment.id));
}

/// Bug 4: the daily full sync timer was cancelled at every disconnect and
/// re-armed from zero at connect, so a relay that reconnects more often
/// than daily never got one, and a backdated event behind its live
/// filters' `since` was never fetched.
#[test]
fn a_relay_reconnecting_every_6_hours_still_gets_a_daily_full_sync() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    let owner = keys(1);
    let repo = announce(&mut sim, &owner, "r", &[A], T0);
    sim.advance(Duration::from_secs(10));
    let start = sim.now;
    let mut full_syncs = vec![start];
    let mut seen_reqs = sim.reqs(A).len();
    let mut backdated = None;
    for step in 0..(3 * 24 * 6) {
        if step % 36 == 35 {
            // Every 6 hours a short outage: a quick reconnect each time.
            sim.stop_relay(A);
            sim.advance(Duration::from_secs(20));
            sim.start_relay(A);
        }
        sim.advance(Duration::from_secs(600));
        if step == 40 {
            // Published behind the live filters' `since`: only a full
            // history fetch finds it.
            let ev = repo_comment(&keys(2), &repo, T0 - 100_000, "backdated");
            sim.publish(A, &ev);
            sim.settle();
            backdated = Some(ev);
        }
        let reqs = sim.reqs(A);
        if reqs[seen_reqs..]
            .iter()
            .any(|(_, fs)| fs.iter().any(full_history))
        {
            full_syncs.push(sim.now);
        }
        seen_reqs = reqs.len();
    }
    let a = sim.id(A);
    assert_eq!(sim.engine.relay_status(a), Status::Connected);
    let gaps: Vec<u64> = full_syncs
        .windows(2)
        .map(|w| w[1].since(w[0]).as_secs() / 60)
        .collect();
    assert!(
        full_syncs.len() >= 3,
        "a full sync every 23-25 h over 3 days; minutes between: {gaps:?}"
    );
    assert!(
        gaps.iter().all(|&g| g <= 25 * 60 + 20),
        "no gap beyond 25 h: {gaps:?}"
    );
    assert!(
        sim.synced(&backdated.unwrap().id),
        "the daily sync fetched the backdated event"
    );
}

/// Disconnects `url` after it has been up for hours, reconnects it within
/// the quick window, and returns (disconnect time, every `since` of the
/// REQs sent after the reconnect).
fn since_after_quick_reconnect(sim: &mut Sim, url: &str) -> (Time, Vec<u64>) {
    sim.advance(Duration::from_secs(3 * 3600));
    let down_at = sim.now;
    let before = sim.reqs(url).len();
    sim.stop_relay(url);
    sim.advance(Duration::from_secs(120));
    sim.start_relay(url);
    sim.advance(Duration::from_secs(300));
    let since = sim.reqs(url)[before..]
        .iter()
        .flat_map(|(_, fs)| fs)
        .filter_map(|f| f.since.map(|s| s.as_secs()))
        .collect();
    (down_at, since)
}

/// After a quick reconnect of `url`, every REQ asks `since` the disconnect
/// minus 15 minutes.
fn assert_quick_reconnect_reaches_back_from_the_disconnect(sim: &mut Sim, url: &str) {
    let (down_at, since) = since_after_quick_reconnect(sim, url);
    assert!(
        !since.is_empty(),
        "the quick reconnect catches up with since"
    );
    let want = down_at.as_secs() - 900;
    for s in since {
        assert!(
            s.abs_diff(want) <= 1,
            "since {s}: want the disconnect minus 15 min ({want}), {} s off",
            want as i64 - s as i64
        );
    }
}

/// Bug 5: a quick reconnect caught up from the connection's start minus 15
/// minutes, re-fetching hours it had already streamed; it must reach back
/// from the disconnect.
#[test]
fn quick_reconnect_catches_up_from_the_disconnect_not_the_connect() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    announce(&mut sim, &keys(1), "r", &[A], T0);
    sim.advance(Duration::from_secs(10));
    assert_quick_reconnect_reaches_back_from_the_disconnect(&mut sim, A);
}

/// Bug 5, the own relay's self-subscription.
#[test]
fn own_relay_quick_reconnect_catches_up_from_the_disconnect_not_the_connect() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    announce(&mut sim, &keys(1), "r", &[A], T0);
    sim.advance(Duration::from_secs(10));
    let own = sim.own.clone();
    assert_quick_reconnect_reaches_back_from_the_disconnect(&mut sim, &own);
}

/// Bug 6: with `--own-relay ws://127.0.0.1:7777 --domain git.example.com`
/// announcements name the own relay as `wss://git.example.com` (relays and
/// clone URLs), and it was synced as a remote relay.
#[test]
fn the_own_relay_under_its_public_domain_is_never_a_sync_target() {
    const OWN_LOCAL: &str = "ws://127.0.0.1:7777";
    const DOMAIN: &str = "git.example.com";
    let mut cfg = Config::new(OWN_LOCAL);
    cfg.domain = Some(DOMAIN.into());
    cfg.allow_private_addresses = true; // only the own-relay rule may refuse them
    cfg.seed = 7;
    let mut sim = Sim::new(cfg);
    sim.add_relay(A);
    sim.add_relay(C);
    let owner = keys(1);
    let names = [
        "wss://git.example.com",
        "ws://git.example.com",
        "wss://GIT.example.com:443/",
        "ws://git.example.com:80/",
        "wss://git.example.com/",
        "ws://127.0.0.1:7777/",
    ];
    let mut relays = vec!["relays", A];
    relays.extend(names);
    let clone = format!("https://{DOMAIN}/{}/r.git", owner.public_key().to_hex());
    let plain_clone = format!("http://{DOMAIN}/{}/r.git", owner.public_key().to_hex());
    let ann = sign(
        &owner,
        30617,
        T0,
        vec![
            tag(&["d", "r"]),
            tag(&relays),
            tag(&["clone", &clone, &plain_clone]),
        ],
        "",
    );
    sim.publish(OWN_LOCAL, &ann);
    // A repo found on A, listing the service under its public name and C.
    let remote = grasp_announcement(&keys(2), "remote", &[C], DOMAIN, T0);
    sim.seed(A, &remote);
    let issue = root(&keys(3), 1621, &[&coord(&keys(2), "remote")], T0, "issue");
    sim.seed(C, &issue);
    sim.advance(Duration::from_secs(120));
    let repo = ItemKey::Repo(coord(&owner, "r"));
    assert_eq!(
        sim.engine.item_state(sim.id(A), &repo),
        Some(ItemState::Confirmed),
        "the real remote is synced"
    );
    assert!(sim.synced(&remote.id) && sim.synced(&issue.id));
    let wrong: Vec<&String> = sim
        .connects
        .iter()
        .map(|(_, url)| url)
        .filter(|url| url.as_str() != OWN_LOCAL && url.as_str() != A && url.as_str() != C)
        .collect();
    assert_eq!(wrong, Vec::<&String>::new(), "connects to the own relay");
    for name in names {
        if let Some(id) = sim.engine.relay_id(name)
            && id != sim.engine.own_relay()
        {
            assert_eq!(
                sim.engine.item_state(id, &repo),
                None,
                "{name} is a sync target"
            );
        }
    }
}

/// Bug 7: a repo moved off relay A, whose live subscription still asks for
/// it: A keeps sending what we asked, and 100 such events cut it with a
/// penalty as if it were hostile.
#[test]
fn a_relay_keeps_sending_for_a_repo_that_moved_away_and_is_not_penalised() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    sim.add_relay(B);
    let owner = keys(1);
    let moving = announce(&mut sim, &owner, "moving", &[A], T0);
    let staying = announce(&mut sim, &owner, "staying", &[A], T0);
    sim.advance(Duration::from_secs(10));
    announce(&mut sim, &owner, "moving", &[B], T0 + 100);
    sim.advance(Duration::from_secs(6));
    let a = sim.id(A);
    assert_eq!(
        sim.engine.item_state(a, &ItemKey::Repo(moving.clone())),
        None,
        "the repo moved to B"
    );
    for i in 0..150 {
        let ev = repo_comment(&keys(2), &moving, T0 + 200 + i, &format!("c{i}"));
        sim.publish(A, &ev);
    }
    sim.settle();
    let stats = sim.engine.stats();
    assert_eq!(stats.penalties, 0, "A followed the protocol");
    assert_eq!(sim.engine.relay_penalties(a), 0);
    assert_eq!(stats.offences[Offence::OutsideFilter as usize], 0);
    assert_eq!(sim.engine.relay_status(a), Status::Connected);
    let live = repo_comment(&keys(3), &staying, T0 + 500, "still served");
    sim.publish(A, &live);
    sim.settle();
    assert!(sim.synced(&live.id));
}

/// Bug 8: GRASP-01 accepts an announcement only if it lists the service in
/// both `relays` and a `clone` URL; one found on a remote relay that lists
/// us in `relays` alone was passed on and indexed.
#[test]
fn a_remote_announcement_without_clone_for_our_domain_is_not_indexed() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    sim.add_relay(B);
    sim.add_relay(C);
    announce(&mut sim, &keys(1), "seed", &[A], T0);
    let domain = "own.example";
    // Lists us in relays, no clone URL.
    let no_clone = bare_announcement(&keys(2), "no-clone", &[OWN, C], T0);
    // A clone URL on our domain, but not in relays.
    let clone = format!(
        "https://{domain}/{}/no-relay.git",
        keys(3).public_key().to_hex()
    );
    let no_relay = sign(
        &keys(3),
        30617,
        T0,
        vec![
            tag(&["d", "no-relay"]),
            tag(&["relays", C]),
            tag(&["clone", &clone]),
        ],
        "",
    );
    // Both: accepted.
    let both = grasp_announcement(&keys(4), "both", &[B], domain, T0);
    for ann in [&no_clone, &no_relay, &both] {
        sim.seed(A, ann);
    }
    let on_c = root(
        &keys(5),
        1621,
        &[&coord(&keys(2), "no-clone"), &coord(&keys(3), "no-relay")],
        T0,
        "an issue on C",
    );
    sim.seed(C, &on_c);
    let on_b = root(&keys(5), 1621, &[&coord(&keys(4), "both")], T0, "on B");
    sim.seed(B, &on_b);
    sim.advance(Duration::from_secs(60));
    assert!(sim.synced(&both.id) && sim.synced(&on_b.id), "both: synced");
    for (ann, what) in [(&no_clone, "no clone"), (&no_relay, "not in relays")] {
        assert!(
            !sim.ingested.iter().any(|(_, e)| e.id == ann.id),
            "{what}: passed to the sink"
        );
    }
    assert!(!sim.synced(&on_c.id), "C synced for a repo we do not host");
    assert!(
        !sim.connects.iter().any(|(_, url)| url == C),
        "C connected for a repo we do not host"
    );
}

/// Bug 8, the index side: a remote announcement is indexed only once the
/// own relay accepted it; one it refuses (`OK false`) must not be synced.
#[test]
fn an_announcement_the_own_relay_refuses_is_not_indexed() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    sim.add_relay(C);
    announce(&mut sim, &keys(1), "seed", &[A], T0);
    let ann = grasp_announcement(&keys(2), "refused", &[C], "own.example", T0);
    sim.seed(A, &ann);
    sim.sink_refuses.insert(ann.id);
    let issue = root(&keys(3), 1621, &[&coord(&keys(2), "refused")], T0, "on C");
    sim.seed(C, &issue);
    sim.advance(Duration::from_secs(60));
    assert!(
        sim.ingested.iter().any(|(_, e)| e.id == ann.id),
        "offered to the own relay"
    );
    assert!(
        !sim.synced(&issue.id),
        "synced a repo the own relay refused"
    );
    assert!(
        !sim.connects.iter().any(|(_, url)| url == C),
        "C connected for a repo the own relay refused"
    );
}

/// Bug 8, removal: a newer announcement that no longer lists the service
/// (found on a remote relay; our own relay would refuse it) ends the repo
/// here: its relays are no longer targets.
#[test]
fn a_newer_announcement_dropping_our_domain_removes_the_repo() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    sim.add_relay(B);
    let owner = keys(1);
    let repo = coord(&owner, "r");
    let own = sim.own.clone();
    sim.publish(
        &own,
        &grasp_announcement(&owner, "r", &[A], "own.example", T0),
    );
    sim.advance(Duration::from_secs(10));
    let a = sim.id(A);
    let key = ItemKey::Repo(repo.clone());
    assert_eq!(sim.engine.item_state(a, &key), Some(ItemState::Confirmed));
    let moved_off = bare_announcement(&owner, "r", &[A, B], T0 + 100);
    sim.publish(A, &moved_off);
    sim.advance(Duration::from_secs(120));
    assert!(!sim.synced(&moved_off.id), "passed to the sink");
    assert_eq!(
        sim.engine.item_state(a, &key),
        None,
        "A still syncs a repo we no longer host"
    );
    assert!(
        sim.engine
            .relay_id(B)
            .is_none_or(|b| sim.engine.item_state(b, &key).is_none()),
        "B targets it"
    );
    let after = repo_comment(&keys(2), &repo, T0 + 300, "after the move");
    sim.publish(A, &after);
    sim.settle();
    assert!(!sim.synced(&after.id));
}

/// Issue 43: a relay gone wide left kinds 1 and 7 out of its live set, so
/// a NIP-10 reply or a reaction to one of our roots published there waited
/// for the daily sync. The wide set asks them by kind, and the rest of
/// that firehose is dropped before its signature is checked: forged notes
/// that tag nothing of ours are never verified, so never counted invalid.
#[test]
fn a_wide_relay_brings_a_live_kind_1_reply_within_seconds_and_verifies_no_firehose() {
    let mut cfg = config();
    cfg.consolidation_threshold = 3;
    let mut sim = Sim::new(cfg);
    sim.add_relay(A);
    let owner = keys(1);
    let repo = announce(&mut sim, &owner, "r", &[A], T0);
    let issue = root(&owner, 1621, &[&repo], T0, "issue");
    let own = sim.own.clone();
    sim.publish(&own, &issue);
    let old_note = sign(
        &keys(2),
        1,
        T0 - 500,
        vec![tag(&["e", &issue.id.to_hex()])],
        "a kind 1 reply",
    );
    sim.seed(A, &old_note);
    sim.advance(Duration::from_secs(30));
    let filters: Vec<&Filter> = sim.reqs(A).iter().flat_map(|(_, fs)| fs).collect();
    assert!(filters.iter().any(|f| is_wide(f)), "A went wide");
    assert!(sim.synced(&old_note.id), "historic sync found the kind 1");
    let note = sign(
        &keys(2),
        1,
        T0 + 60,
        vec![tag(&["e", &issue.id.to_hex()])],
        "a live kind 1 reply",
    );
    let reaction = sign(
        &keys(3),
        7,
        T0 + 60,
        vec![tag(&["e", &issue.id.to_hex()])],
        "+",
    );
    let stranger = sign(&keys(4), 1, T0 + 60, vec![], "gm");
    let mut forged = sign(&keys(4), 1, T0 + 61, vec![], "gm again");
    forged.sig = stranger.sig;
    for e in [&stranger, &forged, &note, &reaction] {
        sim.publish(A, e);
    }
    sim.advance(Duration::from_secs(5));
    assert!(sim.synced(&note.id), "the live kind 1 reply arrived");
    assert!(sim.synced(&reaction.id), "the live reaction arrived");
    assert!(!sim.synced(&stranger.id), "a note tagging nothing of ours");
    let stats = sim.engine.stats();
    assert_eq!(
        stats.events_invalid, 0,
        "the forged note was never verified"
    );
    assert!(stats.events_unwanted >= 2, "the firehose was dropped");
    assert_eq!(stats.offences[Offence::InvalidEvent as usize], 0);
}

/// Found by the oracle (`tests/sim_oracle.rs`, seeds 7 and 18): a REQ's filters
/// overlap (a NIP-22 reply tags its root with both `E` and `e`), and a
/// relay returns each event once, for the first filter that asks it, each
/// filter up to its `limit`. The replies older than the `#e` page came in
/// through `#E`; the next `#e` page started below them (`until` = the
/// oldest event matching `#e`), and the events between the end of the
/// `#e` page and those replies were never asked again.
#[test]
fn events_a_sibling_filter_returned_do_not_push_a_page_past_unread_events() {
    let mut sim = Sim::new(config());
    sim.add_relay(A); // honours `limit` per filter, no cap of its own
    let owner = keys(1);
    let repo = announce(&mut sim, &owner, "r", &[A], T0);
    let issue = root(&owner, 1621, &[&repo], T0 - 100_000, "issue");
    let own = sim.own.clone();
    sim.publish(&own, &issue);
    let id = issue.id.to_hex();
    let mut history: Vec<Event> = (0..600)
        .map(|i| sign(&keys(2), 7, T0 - 1_000 - i, vec![tag(&["e", &id])], "+"))
        .collect();
    history.extend((0..5).map(|i| reply(&keys(3), &issue, T0 - 10_000 - i, "old reply")));
    for e in &history {
        sim.seed(A, e);
    }
    sim.advance(Duration::from_secs(60));
    assert_eq!(
        sim.missing(&history).len(),
        0,
        "reactions between the first #e page and the older replies"
    );
}

/// Found by the oracle (seeds 1002, 1125, 1364, 1485 from 1000): bug 7's
/// fix covers events tagging a repo (`a`/`A`/`q`) or root, but a repo's
/// 30618 state is asked by `#d` and tags no repo: a relay the repo moved
/// away from keeps streaming its state updates, each counted as an
/// outside-filter offence, and 100 of them cut the relay.
#[test]
fn a_relay_keeps_sending_state_for_a_repo_that_moved_away_and_is_not_penalised() {
    let mut sim = Sim::new(config());
    sim.add_relay(A);
    sim.add_relay(B);
    let owner = keys(1);
    announce(&mut sim, &owner, "moving", &[A], T0);
    let staying = announce(&mut sim, &owner, "staying", &[A], T0);
    sim.advance(Duration::from_secs(10));
    announce(&mut sim, &owner, "moving", &[B], T0 + 100);
    sim.advance(Duration::from_secs(6));
    for i in 0..120 {
        sim.publish(A, &state(&owner, "moving", T0 + 200 + i));
    }
    sim.settle();
    let a = sim.id(A);
    let stats = sim.engine.stats();
    assert_eq!(stats.offences[Offence::OutsideFilter as usize], 0);
    assert_eq!(stats.penalties, 0, "A followed the protocol");
    assert_eq!(sim.engine.relay_status(a), Status::Connected);
    let live = repo_comment(&keys(3), &staying, T0 + 500, "still served");
    sim.publish(A, &live);
    sim.settle();
    assert!(sim.synced(&live.id));
}

/// Bug: nostr-rs-relay refuses a REQ over its subscription limit with a
/// bare `NOTICE` as it reads it, but answers accepted REQs from worker
/// threads, later. The engine blamed a NOTICE on its newest silent REQ;
/// when that one had been sent after the refused one (an EOSE had freed a
/// slot in between), the relay had accepted it, and the refused REQ stayed
/// open in the engine's eyes, silent, until its EOSE deadline two minutes
/// on. The real-relay test `nostr_rs_relay_32_subscription_limit...` (the
/// same world as this one) missed up to 295 of 450 events at its deadline.
#[test]
fn a_subscription_refused_by_an_unnamed_notice_is_retried_within_seconds() {
    let mut cfg = config();
    cfg.negentropy = false;
    cfg.chunk_size = 5;
    cfg.max_filters_per_req = 4;
    cfg.max_subscriptions = 64;
    let mut sim = Sim::new(cfg);
    let relay = sim.add_relay(A);
    relay.max_subs = Some((32, Refuse::Notice));
    relay.per_message = Duration::from_millis(2);
    relay.reply_delay = Duration::from_millis(1);
    relay.query_delay = Duration::from_millis(40);
    let owner = keys(1);
    let own = sim.own.clone();
    let mut history = Vec::new();
    for i in 0..150u64 {
        let d = format!("repo-{i}");
        sim.seed(&own, &announcement(&owner, &d, &[A], T0 - 100));
        let c = coord(&owner, &d);
        for j in 0..2 {
            let issue = root(
                &keys(2),
                1621,
                &[&c],
                T0 - 90 + j,
                &format!("issue {i}/{j}"),
            );
            sim.seed(&own, &issue);
            let e = reply(&keys(3), &issue, T0 - 80, &format!("reply {i}/{j}"));
            sim.seed(A, &e);
            history.push(e);
        }
        let e = repo_comment(&keys(4), &c, T0 - 70, &format!("comment {i}"));
        sim.seed(A, &e);
        history.push(e);
    }
    // Two minutes is the EOSE deadline, which used to be the only way out.
    sim.advance(Duration::from_secs(20));
    assert!(sim.engine.stats().refusals > 0, "the relay refused");
    assert_eq!(sim.missing(&history), vec![], "everything delivered");
    sim.engine.check_invariants().unwrap();
}

/// Bug (CI, `nostr_rs_relay_32_subscription_limit...`): nostr-rs-relay
/// drops a query it aborts while a WAL checkpoint runs: no event, no
/// EOSE, no CLOSED, no NOTICE, and the subscription stays open on its
/// side. The engine waited for that page's EOSE deadline, two minutes,
/// with 5 of 450 events unread. A silent REQ sent before one the relay
/// answered is now asked again after a grace of ten seconds, doubled at
/// every round on the same connection.
#[test]
fn a_req_the_relay_drops_without_a_word_is_asked_again_within_seconds() {
    let mut cfg = config();
    cfg.negentropy = false;
    // One root per REQ (three filters each), so a later REQ is answered.
    cfg.chunk_size = 1;
    cfg.max_filters_per_req = 3;
    let mut sim = Sim::new(cfg);
    let relay = sim.add_relay(A);
    relay.drop_next = 1;
    relay.query_delay = Duration::from_millis(40);
    let owner = keys(1);
    let own = sim.own.clone();
    let c = coord(&owner, "repo");
    sim.seed(&own, &announcement(&owner, "repo", &[A], T0 - 100));
    let issue_with_reply = |sim: &mut Sim, i: u64, live: bool| {
        let issue = root(&keys(2), 1621, &[&c], T0 + i, &format!("issue {i}"));
        let answer = reply(&keys(3), &issue, T0 + i + 1, &format!("reply {i}"));
        sim.seed(A, &answer);
        if live {
            sim.publish(&own, &issue);
        } else {
            sim.seed(&own, &issue);
        }
        answer
    };
    let history: Vec<Event> = (0..6)
        .map(|i| issue_with_reply(&mut sim, i, false))
        .collect();
    sim.advance(Duration::from_secs(5));
    assert!(!sim.missing(&history).is_empty(), "a REQ dropped");
    sim.advance(Duration::from_secs(10));
    assert_eq!(
        sim.missing(&history),
        vec![],
        "asked again, well before two minutes"
    );
    assert_eq!(sim.engine.stats().unanswered, 1);
    // A second round on the same connection waits twice as long.
    sim.relay(A).drop_next = 1;
    let later: Vec<Event> = (10..12)
        .map(|i| issue_with_reply(&mut sim, i, true))
        .collect();
    // The new roots are asked about 6 s after they are published; a
    // grace of 10 s would bring the dropped one by 20 s.
    sim.advance(Duration::from_secs(20));
    assert!(!sim.missing(&later).is_empty(), "the grace is now 20 s");
    sim.advance(Duration::from_secs(15));
    assert_eq!(sim.missing(&later), vec![]);
    assert_eq!(sim.engine.stats().unanswered, 2);
    sim.engine.check_invariants().unwrap();
}

/// Bug (CI log of `discovery_history_and_live_from_nostr_rs_relay...`):
/// every run warned that five seconds of nostr-rs-relay "hold more events
/// than the 1 it returns; the rest are unreachable there", each holding
/// one. A relay sends an event two filters of one REQ match once: the
/// issue's reply (second 1, tagging the root `e` and `E`) was the `#e`
/// filter's shared event, its status (second 2) its own. The page below
/// the status brought the reply again, older than the own edge, and that
/// "proved" a cut at 1. Only an event older than all the page brought for
/// the filter proves a cut now.
#[test]
fn an_event_two_filters_share_proves_no_cut() {
    let mut cfg = config();
    cfg.negentropy = false;
    let mut sim = Sim::new(cfg);
    sim.add_relay(A);
    let owner = keys(1);
    let own = sim.own.clone();
    let repo = announce(&mut sim, &owner, "repo", &[A], T0 - 100);
    let issue = root(&keys(2), 1621, &[&repo], T0, "issue");
    sim.seed(&own, &issue);
    let history = [
        reply(&keys(3), &issue, T0 + 1, "reply"),
        status(&owner, &issue, 1632, T0 + 2),
    ];
    for e in &history {
        sim.seed(A, e);
    }
    sim.advance(Duration::from_secs(30));
    assert_eq!(sim.missing(&history), vec![]);
    let stats = sim.engine.stats();
    assert_eq!(stats.seconds_unreachable, 0, "no cut was shown");
    assert_eq!(stats.seconds_unverified, 0);
    sim.engine.check_invariants().unwrap();
}

/// A relay that caps per REQ, not per filter (nostr-relay: one SQL query
/// for all of a REQ's filters, newest first, under one `LIMIT`), with no
/// NIP-11 saying so. The issue's `#e`, `#E` and `#q` filters went in one
/// REQ; its 150 newest replies filled the cap of 100, the 50 older quotes
/// got nothing, and the empty `#q` filter was taken as complete: the
/// quotes were never asked again. A REQ that returns as many events as
/// any on the connection may have been cut as a whole, so its other
/// filters go on below its oldest second.
#[test]
fn a_relay_capping_per_req_loses_no_filter_of_a_cut_req() {
    let (mut sim, history) = capped_per_req((50, T0 - 50_000, 1), (150, T0 - 10_000, 1));
    sim.advance(Duration::from_secs(120));
    assert_eq!(sim.missing(&history), vec![], "every quote and reply");
    let shared = sim.reqs(A).iter().any(|(_, filters)| {
        let letters: Vec<char> = filters
            .iter()
            .flat_map(|f| f.generic_tags.keys().map(|t| t.as_char()))
            .collect();
        letters.contains(&'q') && letters.contains(&'e')
    });
    assert!(shared, "the quotes' and replies' filters shared a REQ");
    sim.check();
}

/// History windows go many to a REQ (issue 46), which a relay capping per
/// REQ cuts as a whole: 2,000 replies and 100 older quotes on such a relay
/// (cap 100, no NIP-11), split into windows by the first pages, all
/// arrive.
#[test]
fn windows_packed_in_one_req_lose_nothing_on_a_relay_capping_per_req() {
    let (mut sim, history) = capped_per_req((100, T0 - 400_000, 7), (2_000, T0 - 100_000, 13));
    sim.advance(Duration::from_secs(600));
    assert_eq!(sim.missing(&history).len(), 0, "every quote and reply");
    let packed = sim.reqs(A).iter().map(|(_, f)| f.len()).max().unwrap_or(0);
    assert!(
        packed > 3,
        "windows went several to a REQ: {packed} filters at most"
    );
    sim.check();
}

/// nostr-relay as it is: one SQL query per REQ under one `LIMIT` (100),
/// and `until` exclusive (`created_at < until`; NIP-01 includes it). The
/// windows a cut page is split into met at `until = lo - 1` of one and
/// `since = lo` of the next, so on this relay no window asked the second
/// below each boundary: `ext_caps`' 250 replies a second apart lost one
/// now and then under load. Windows now overlap by one second.
#[test]
fn windows_lose_no_second_on_a_relay_whose_until_is_exclusive() {
    for (n, step) in [(250, 1), (2_000, 1), (2_000, 13)] {
        let (mut sim, history) = capped_per_req((0, T0, 1), (n, T0 - 100_000, step));
        sim.relay(A).until_exclusive = true;
        sim.advance(Duration::from_secs(600));
        let reqs = sim.reqs(A).len();
        assert_eq!(
            sim.missing(&history).len(),
            0,
            "{n} replies {step} s apart, {reqs} REQs"
        );
        assert!(reqs > 3, "the history was paged: {reqs} REQs");
        sim.check();
    }
}

/// A repo whose issue is on the own relay and on `A`, which caps each REQ
/// at 100 (all filters together, newest first) and states no NIP-11; `A`
/// also holds quotes and replies of the issue, each `(count, first
/// created_at, seconds apart)`. Returns the world and that history.
fn capped_per_req(quotes: (u64, u64, u64), replies: (u64, u64, u64)) -> (Sim, Vec<Event>) {
    let mut sim = Sim::new(config());
    let own = sim.own.clone();
    let owner = keys(1);
    let repo = coord(&owner, "r");
    let issue = root(&keys(2), 1621, &[&repo], T0 - 1_000_000, "issue");
    sim.seed(&own, &issue);
    let a = sim.add_relay(A);
    a.cap = 100;
    a.events.push(issue.clone());
    let (n, from, step) = quotes;
    let quotes = (0..n).map(|i| {
        let q = tag(&["q", &issue.id.to_hex()]);
        sign(&keys(3), 1, from + i * step, vec![q], "a quote")
    });
    let (n, from, step) = replies;
    let replies = (0..n).map(|i| reply(&keys(3), &issue, from + i * step, "a reply"));
    let history: Vec<Event> = quotes.chain(replies).collect();
    sim.relay(A).events.extend(history.iter().cloned());
    sim.seed(&own, &announcement(&owner, "r", &[OWN, A], T0 - 2_000_000));
    (sim, history)
}

/// `n` comments on repo `coord` (tagged `A` alone, so each is its
/// filter's own event and teaches the relay's cap), seconds apart, on `url`.
fn comments_on(sim: &mut Sim, url: &str, coord: &str, n: u64, from: u64) -> Vec<Event> {
    let comments: Vec<Event> = (0..n)
        .map(|i| repo_comment(&keys(5), coord, from + i * 3, &format!("c{i}")))
        .collect();
    for c in &comments {
        sim.seed(url, c);
    }
    comments
}

/// Issue 23, finding 1: a relay proved a cap of 300 on one connection,
/// then lowered it to 100 (a move from strfry to khatru). A page of 100
/// under the old proof looked complete, and 150 of a new repo's 250
/// comments were lost for good, the daily sync included.
#[test]
fn a_cap_lowered_between_connections_loses_nothing() {
    let mut sim = Sim::new(config());
    sim.add_relay(A).filter_cap = 300;
    let owner = keys(1);
    let old = announce(&mut sim, &owner, "old", &[A], T0);
    let first = comments_on(&mut sim, A, &old, 400, T0 - 150_000);
    sim.advance(Duration::from_secs(60));
    assert_eq!(sim.missing(&first), vec![], "400 behind a cap of 300");
    // The relay moves to a store that caps at 100, and the connection drops.
    sim.relay(A).filter_cap = 100;
    let a = sim.id(A);
    sim.disconnect(a);
    sim.advance(Duration::from_secs(60));
    let new = coord(&owner, "new");
    let second = comments_on(&mut sim, A, &new, 250, T0 - 90_000);
    announce(&mut sim, &owner, "new", &[A], T0 + 100);
    sim.advance(Duration::from_secs(60));
    assert_eq!(sim.missing(&second).len(), 0, "all 250 behind the new cap");
    sim.check();
}

/// Issue 23, finding 1: a state file that says the relay returned 500
/// for one filter (written by an earlier process, or by hand) made a page
/// of 100 look complete.
#[test]
fn a_saved_floor_does_not_make_a_capped_page_complete() {
    use grasp_sync::{Engine, SavedLimits, SavedRelay, SavedState};
    let mut sim = Sim::new(config());
    sim.add_relay(A).filter_cap = 100;
    let saved = SavedState {
        saved_at: T0,
        relays: vec![SavedRelay {
            url: A.to_owned(),
            limits: SavedLimits {
                result_floor: Some(500),
                ..SavedLimits::default()
            },
            ..SavedRelay::default()
        }],
        ..SavedState::default()
    };
    sim.engine = Engine::new(config(), sim.now).expect("valid config");
    sim.engine.restore_state(sim.now, T0, saved);
    let repo = announce(&mut sim, &keys(1), "r", &[A], T0);
    let comments = comments_on(&mut sim, A, &repo, 250, T0 - 90_000);
    sim.advance(Duration::from_secs(60));
    assert_eq!(
        sim.missing(&comments).len(),
        0,
        "all 250 behind a cap of 100"
    );
    sim.check();
}

/// Issue 23, finding 2: strfry refuses a whole REQ when one tag value is
/// over 255 bytes. One announcement with a long `d` tag (185+ characters:
/// its coordinate passes 255) was read as "message too large": the same
/// 100-repo chunk was asked every minute, and none of the 99 ordinary
/// repos packed with it synced, live events included.
#[test]
fn one_long_tag_value_does_not_block_the_repos_packed_with_it() {
    let mut sim = Sim::new(config());
    sim.add_relay(A).value_bytes = Some(255);
    let owner = keys(1);
    let own = sim.own.clone();
    let long_d = "d".repeat(200);
    let mut history = Vec::new();
    for i in 0..100u64 {
        let d = if i == 37 {
            long_d.clone()
        } else {
            format!("r{i}")
        };
        sim.seed(&own, &announcement(&owner, &d, &[A], T0 - 10_000 + i));
        let comment = repo_comment(&keys(2), &coord(&owner, &d), T0 - 5_000 + i, "c");
        sim.seed(A, &comment);
        if i != 37 {
            history.push(comment);
        }
    }
    sim.advance(Duration::from_secs(30));
    assert_eq!(
        sim.missing(&history),
        vec![],
        "the 99 ordinary repos synced"
    );
    assert_eq!(
        sim.engine.stats().items_unaskable,
        1,
        "the long one counted"
    );
    let refusals = sim.relay(A).value_refusals;
    assert!(refusals <= 10, "isolated in a few rounds, not {refusals}");
    // Live events of the ordinary repos arrive too, and the long value is
    // never asked again.
    let live = repo_comment(&keys(3), &coord(&owner, "r5"), T0 + 100, "live");
    sim.publish(A, &live);
    sim.advance(Duration::from_secs(600));
    assert!(sim.synced(&live.id), "live coverage for the others");
    assert_eq!(
        sim.relay(A).value_refusals,
        refusals,
        "no REQ carries it again"
    );
    sim.check();
}

/// `n` replies to `issue` all in second `at`, on relay `url`.
fn burst(sim: &mut Sim, url: &str, issue: &Event, n: u64, at: u64) -> Vec<Event> {
    let replies: Vec<Event> = (0..n)
        .map(|i| reply(&keys(6), issue, at, &format!("bulk {i}")))
        .collect();
    for r in &replies {
        sim.seed(url, r);
    }
    replies
}

/// Issue 23, finding 3: paging by `until` cannot get past a second that
/// holds more matching events than the relay's cap: 150 replies in one
/// second behind a cap of 100 lost 50. On a relay that speaks NIP-77 the
/// second is reconciled and all arrive: whether history goes by REQ (the
/// sink holds nothing yet, the first sync: the second is reconciled) or
/// by negentropy (its `ids` fetch asks again for the ids that did not come).
#[test]
fn a_second_with_more_events_than_the_cap_is_read_whole_by_negentropy() {
    for listing in [Listing::Empty, Listing::Held] {
        let mut sim = Sim::new(config());
        sim.listing = listing;
        let a = sim.add_relay(A);
        a.filter_cap = 100;
        a.negentropy = NegMode::Supported;
        let owner = keys(1);
        let repo = announce(&mut sim, &owner, "r", &[A], T0);
        let issue = root(&owner, 1621, &[&repo], T0 - 100_000, "issue");
        let older = burst(&mut sim, A, &issue, 30, T0 - 90_000);
        let bulk = burst(&mut sim, A, &issue, 150, T0 - 50_000);
        let own = sim.own.clone();
        sim.publish(&own, &issue);
        sim.advance(Duration::from_secs(120));
        let stats = sim.engine.stats();
        let missing = sim.missing(&bulk).len();
        assert_eq!(
            missing, 0,
            "{listing:?}: all 150 of the one second: {stats:?}"
        );
        assert_eq!(sim.missing(&older).len(), 0, "and what lies below it");
        if listing == Listing::Empty {
            assert!(
                stats.seconds_split >= 1,
                "by a split of the second: {stats:?}"
            );
        }
        assert_eq!(stats.seconds_unreachable + stats.seconds_unverified, 0);
        sim.check();
    }
}

/// Oracle world 334153: a relay allowing one NIP-77 session is asked to
/// reconcile four crowded seconds at once (two roots, each tagged `e` and
/// `E`). It takes the first, whose one round lists every id, and refuses
/// the other three by NOTICEs that name none. Each refusal was tied to
/// the newest session without an answer: a session opened again after the
/// first refusal took the second, and a refused one stayed waiting until
/// its timeout, when its second was given up as unreachable (here the
/// sibling filter's chain read it; in the oracle's world six events were
/// lost with it).
/// Now refusals are tied once no more sessions wait than refusals came,
/// and no session opens meanwhile: each second is reconciled in turn.
#[test]
fn sessions_refused_by_notices_are_told_apart_and_wait_for_room() {
    let mut sim = Sim::new(config());
    sim.listing = Listing::Empty;
    let a = sim.add_relay(A);
    a.filter_cap = 30;
    a.negentropy = NegMode::Supported;
    a.max_neg = Some(1);
    let owner = keys(1);
    let repo = announce(&mut sim, &owner, "r", &[A], T0);
    let own = sim.own.clone();
    let mut bulk = Vec::new();
    for i in 0..2 {
        let issue = root(&owner, 1621, &[&repo], T0 - 100_000 + i, "issue");
        bulk.extend(burst(&mut sim, A, &issue, 50, T0 - 50_000 + i * 10_000));
        sim.publish(&own, &issue);
    }
    sim.advance(Duration::from_secs(120));
    let stats = *sim.engine.stats();
    assert!(
        sim.relay(A).neg_refusals >= 1,
        "the limit was met: {stats:?}"
    );
    assert_eq!(sim.missing(&bulk), vec![], "every second whole: {stats:?}");
    assert_eq!(stats.neg_fallbacks, 0, "no session given up: {stats:?}");
    assert_eq!(stats.seconds_unreachable + stats.seconds_unverified, 0);
    sim.check();
}

/// Oracle world 338235: a crowded second found only once the history
/// that showed it had ended (the relay's cap shows as its largest page)
/// is asked in a part no batch waits for. The relay refused that REQ
/// (`too many concurrent REQs`), and with no batch to fail and ask again
/// the part was dropped, and the second's events with it. Now it goes
/// back to the follow-up pages and is asked again.
#[test]
fn a_refused_part_of_a_second_no_batch_waits_for_is_asked_again() {
    let mut sim = Sim::new(config());
    sim.listing = Listing::Empty;
    let a = sim.add_relay(A);
    a.filter_cap = 30;
    a.negentropy = NegMode::Supported;
    let crowded = Timestamp::from_secs(T0 - 50_000);
    // One refusal for each part: the `e` and the `E` filter.
    let busy = (crowded, "error: too many concurrent REQs".to_string());
    a.close_second = vec![busy.clone(), busy];
    let owner = keys(1);
    let repo = announce(&mut sim, &owner, "r", &[A], T0);
    let issue = root(&owner, 1621, &[&repo], T0 - 100_000, "issue");
    let bulk = burst(&mut sim, A, &issue, 50, crowded.as_secs());
    let own = sim.own.clone();
    sim.publish(&own, &issue);
    sim.advance(Duration::from_secs(120));
    let stats = *sim.engine.stats();
    assert!(sim.relay(A).close_second.is_empty(), "both parts refused");
    assert_eq!(sim.missing(&bulk), vec![], "the second whole: {stats:?}");
    sim.check();
}

/// Issue 23, finding 3, without NIP-77: a saturated second spread over
/// several roots is split by value until each part returns a short page.
#[test]
fn a_second_shared_by_many_roots_is_split_until_each_part_fits() {
    let mut sim = Sim::new(config());
    sim.add_relay(A).filter_cap = 100;
    let owner = keys(1);
    let repo = announce(&mut sim, &owner, "r", &[A], T0);
    let own = sim.own.clone();
    let mut all = Vec::new();
    for i in 0..4 {
        let issue = root(&owner, 1621, &[&repo], T0 - 100_000 + i, "issue");
        all.extend(burst(&mut sim, A, &issue, 60, T0 - 50_000));
        sim.publish(&own, &issue);
    }
    sim.advance(Duration::from_secs(120));
    assert_eq!(
        sim.missing(&all).len(),
        0,
        "240 replies in one second, 60 a root"
    );
    let stats = sim.engine.stats();
    assert!(stats.seconds_split >= 1, "{stats:?}");
    assert_eq!(stats.seconds_unreachable + stats.seconds_unverified, 0);
    sim.check();
}

/// Issue 23, finding 3: where one value and one kind still fill the cap
/// and the relay has no NIP-77, what stays unreachable is counted, never
/// silent; everything else of the repo still arrives.
#[test]
fn an_unreadable_second_on_a_relay_without_negentropy_is_counted() {
    let mut sim = Sim::new(config());
    sim.add_relay(A).filter_cap = 100;
    let owner = keys(1);
    let repo = announce(&mut sim, &owner, "r", &[A], T0);
    let issue = root(&owner, 1621, &[&repo], T0 - 100_000, "issue");
    let older = burst(&mut sim, A, &issue, 30, T0 - 90_000);
    let bulk = burst(&mut sim, A, &issue, 150, T0 - 50_000);
    let own = sim.own.clone();
    sim.publish(&own, &issue);
    sim.advance(Duration::from_secs(120));
    assert_eq!(sim.missing(&older).len(), 0, "below the second");
    assert_eq!(sim.missing(&bulk).len(), 50, "a cap of 100 on 150");
    let stats = sim.engine.stats();
    assert!(
        stats.seconds_unreachable + stats.seconds_unverified >= 1,
        "said, not silent: {stats:?}"
    );
    sim.check();
}

/// Issue 23, finding 3, below the lowest cap in the wild: a relay capping
/// at 30 shows it only once a probe below a one-second page finds older
/// events; the second it cut is then asked again, and nothing is lost.
#[test]
fn a_second_cut_by_a_small_cap_is_read_once_the_cut_shows() {
    let mut sim = Sim::new(config());
    let a = sim.add_relay(A);
    a.filter_cap = 30;
    a.negentropy = NegMode::Supported;
    sim.listing = Listing::Empty;
    let owner = keys(1);
    let repo = announce(&mut sim, &owner, "r", &[A], T0);
    let issue = root(&owner, 1621, &[&repo], T0 - 100_000, "issue");
    let older = burst(&mut sim, A, &issue, 10, T0 - 90_000);
    let bulk = burst(&mut sim, A, &issue, 50, T0 - 50_000);
    let own = sim.own.clone();
    sim.publish(&own, &issue);
    sim.advance(Duration::from_secs(120));
    let stats = sim.engine.stats();
    assert_eq!(
        sim.missing(&bulk).len(),
        0,
        "all 50 of the second: {stats:?}"
    );
    assert_eq!(sim.missing(&older).len(), 0);
    sim.check();
}

/// Issue 23, the slowdown: strfry with `maxSubsPerConnection` below our
/// 10 counts NIP-77 sessions apart from REQs and refuses the excess with a
/// NOTICE naming none. The refused sessions waited out their timeout, the
/// relay was taken for one without NIP-77, and the REQ limit fell to the
/// REQs open alone. Now a refused session waits for room and the session
/// limit alone is lowered.
#[test]
fn negentropy_sessions_refused_for_a_limit_wait_for_room() {
    let mut c = config();
    // Ten chunks of four repos, a REQ (or job) each.
    c.chunk_size = 4;
    c.max_filters_per_req = 4;
    let mut sim = Sim::new(c);
    let a = sim.add_relay(A);
    a.negentropy = NegMode::Supported;
    a.max_neg = Some(2);
    let owner = keys(1);
    let own = sim.own.clone();
    let mut history = Vec::new();
    for i in 0..40u64 {
        let d = format!("r{i}");
        sim.seed(&own, &announcement(&owner, &d, &[A], T0 - 10_000 + i));
        let c = coord(&owner, &d);
        // The sink holds one comment per repo, so negentropy is worth it.
        let held = repo_comment(&keys(2), &c, T0 - 6_000 + i, "held");
        sim.seed(&own, &held);
        sim.seed(A, &held);
        let comment = repo_comment(&keys(2), &c, T0 - 5_000 + i, "new");
        sim.seed(A, &comment);
        history.push(comment);
    }
    sim.advance(Duration::from_secs(5));
    let stats = *sim.engine.stats();
    assert_eq!(
        sim.missing(&history),
        vec![],
        "in seconds, not timeouts: {stats:?}"
    );
    assert!(sim.relay(A).neg_refusals >= 1, "the limit was met");
    assert_eq!(stats.neg_fallbacks, 0, "no session taken for unsupported");
    let a = sim.id(A);
    assert_eq!(
        sim.engine.subscription_limit(a),
        config().max_subscriptions,
        "the REQ limit is not lowered for a refused session"
    );
    sim.check();
}

/// Issue 23, finding 2, in a live set: a relay that starts refusing long
/// values (it moved to strfry) while the long repo is confirmed there. The
/// quick reconnect's live set carries it and is refused whole; its items
/// go back to history, isolated by REQ (a relay may take in NEG-OPEN what
/// it refuses in a REQ: confirmed by negentropy, they were refused in the
/// next live set again, forever), and live events reach the others.
#[test]
fn a_live_set_refused_for_one_value_isolates_it() {
    let mut sim = Sim::new(config());
    sim.add_relay(A).negentropy = NegMode::Supported;
    let owner = keys(1);
    let own = sim.own.clone();
    let long_d = "d".repeat(200);
    for i in 0..20u64 {
        let d = if i == 7 {
            long_d.clone()
        } else {
            format!("r{i}")
        };
        sim.seed(&own, &announcement(&owner, &d, &[A], T0 - 10_000 + i));
        let c = coord(&owner, &d);
        let held = repo_comment(&keys(2), &c, T0 - 6_000 + i, "held");
        sim.seed(&own, &held);
        sim.seed(A, &held);
    }
    sim.advance(Duration::from_secs(30));
    let a = sim.id(A);
    assert_eq!(sim.engine.item_counts(a).confirmed, 20, "all synced first");
    sim.relay(A).value_bytes = Some(255);
    sim.disconnect(a);
    sim.advance(Duration::from_secs(30));
    let live = repo_comment(&keys(3), &coord(&owner, "r3"), T0 + 100, "live");
    sim.publish(A, &live);
    sim.advance(Duration::from_secs(120));
    assert!(sim.synced(&live.id), "live coverage for the others");
    assert_eq!(sim.engine.stats().items_unaskable, 1);
    assert_eq!(sim.engine.item_counts(a).confirmed, 19);
    sim.check();
}

/// Issue 23, finding 3, without NIP-77: a crowded second of one root
/// holding two kinds is split by kind; each part fits the cap, and all
/// arrive (what other kinds may hold is counted as unverified).
#[test]
fn a_second_split_by_kind_reads_each_kind_whole() {
    let mut sim = Sim::new(config());
    sim.add_relay(A).filter_cap = 100;
    let owner = keys(1);
    let repo = announce(&mut sim, &owner, "r", &[A], T0);
    let issue = root(&owner, 1621, &[&repo], T0 - 100_000, "issue");
    let at = T0 - 50_000;
    let mut all = burst(&mut sim, A, &issue, 60, at);
    for i in 0..60 {
        let s = sign(
            &keys(7),
            1630,
            at,
            vec![tag(&["e", &issue.id.to_hex()])],
            &format!("s{i}"),
        );
        sim.seed(A, &s);
        all.push(s);
    }
    let own = sim.own.clone();
    sim.publish(&own, &issue);
    sim.advance(Duration::from_secs(120));
    let stats = *sim.engine.stats();
    assert_eq!(sim.missing(&all).len(), 0, "both kinds whole: {stats:?}");
    assert!(stats.seconds_unverified >= 1, "other kinds said unverified");
    sim.check();
}

/// Issue 23, finding 4's world: an own relay that refuses the listings'
/// REQs (LocalRelay past its `max_reqs`), beside a relay that says nothing
/// to `NEG-OPEN` and refuses over 10 tag values. A refused listing was
/// never reported, so every job waited out the listing timeout (a minute)
/// before its REQ; now its jobs go to REQ at once, so 40 roots' replies
/// arrive long before that timeout could have passed.
#[test]
fn jobs_whose_listing_the_own_relay_refuses_go_to_req_at_once() {
    let mut sim = Sim::new(config());
    sim.listing = Listing::Refusing(1);
    let a = sim.add_relay(A);
    a.negentropy = NegMode::Silent;
    a.value_caps = Some(ValueCaps::eventstore().closed());
    let owner = keys(1);
    let own = sim.own.clone();
    let repo = announce(&mut sim, &owner, "repo", &[A], T0 - 10_000);
    let mut wanted = Vec::new();
    for i in 0..40u64 {
        let issue = root(
            &owner,
            1621,
            &[&repo],
            T0 - 9_000 + i,
            &format!("issue {i}"),
        );
        sim.seed(&own, &issue);
        // The sink holds replies of each root: negentropy is worth asking.
        let held = reply(&keys(3), &issue, T0 - 8_000 + i, "held");
        sim.seed(&own, &held);
        sim.seed(A, &held);
        let new = reply(&keys(2), &issue, T0 - 7_000 + i, "new");
        sim.seed(A, &new);
        wanted.push(new);
    }
    // Well under one listing timeout (4 × the 15 s session timeout).
    sim.advance(Duration::from_secs(30));
    let stats = *sim.engine.stats();
    assert!(sim.lists_asked > 0, "negentropy asked the sink");
    assert_eq!(sim.missing(&wanted), vec![], "{stats:?}");
    assert_eq!(sim.relay(A).neg_opens, 0, "no session without a listing");
    sim.check();
}
