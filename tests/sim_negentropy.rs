//! NIP-77 negentropy for historic sync, in the core against fake relays
//! with a simulated clock: only missing events are fetched, and every way a
//! relay can lack negentropy ends in the REQ path with nothing lost.

mod support;

use std::time::Duration;

use grasp_sync::Config;
use nostr::prelude::*;
use support::*;

const A: &str = "wss://a.example";

/// A repo on `A` with `n` comments, of which the own relay already holds
/// all but `missing`; returns (all comments, the missing ones).
fn world(sim: &mut Sim, mode: NegMode, n: usize, missing: usize) -> (Vec<Event>, Vec<Event>) {
    let owner = keys(1);
    let coord = coord(&owner, "r");
    sim.add_relay(A).negentropy = mode;
    let own = sim.own.clone();
    let comments: Vec<Event> = (0..n)
        .map(|i| repo_comment(&owner, &coord, T0 - 1_000 + i as u64, &format!("c{i}")))
        .collect();
    for (i, c) in comments.iter().enumerate() {
        sim.seed(A, c);
        if i >= missing {
            sim.seed(&own, c);
        }
    }
    sim.publish(&own, &announcement(&owner, "r", &[A], T0));
    let gone = comments[..missing].to_vec();
    (comments, gone)
}

/// Events the engine fetched by `ids` REQ.
fn ids_asked(sim: &Sim) -> usize {
    sim.reqs(A)
        .iter()
        .flat_map(|(_, fs)| fs.iter())
        .filter_map(|f| f.ids.as_ref())
        .map(|ids| ids.len())
        .sum()
}

/// REQs that re-read history by tag (the REQ path).
fn tag_reqs(sim: &Sim) -> usize {
    tag_reqs_on(sim, A)
}

/// REQs to `url` that re-read history by tag.
fn tag_reqs_on(sim: &Sim, url: &str) -> usize {
    sim.reqs(url)
        .iter()
        .filter(|(_, fs)| {
            fs.iter()
                .any(|f| !f.generic_tags.is_empty() && f.since.is_none())
        })
        .count()
}

#[test]
fn a_relay_with_negentropy_gets_asked_only_for_what_is_missing() {
    let mut sim = Sim::new(config());
    let (all, gone) = world(&mut sim, NegMode::Supported, 300, 7);
    sim.advance(Duration::from_secs(10));
    assert!(sim.missing(&all).is_empty(), "{:?}", sim.missing(&all));
    assert_eq!(ids_asked(&sim), gone.len());
    let stats = sim.engine.stats();
    assert_eq!(stats.neg_ids_fetched, gone.len() as u64);
    assert!(stats.neg_sessions >= 1 && stats.neg_rounds >= 1);
    assert_eq!(stats.neg_fallbacks, 0);
    assert_eq!(tag_reqs(&sim), 0, "no history re-read by REQ");
    let a = sim.id(A);
    assert_eq!(sim.engine.item_counts(a).pending, 0);
    assert!(sim.engine.item_counts(a).confirmed >= 1);

    // Live events still arrive: the synced items got live coverage.
    let owner = keys(1);
    let live = repo_comment(&owner, &coord(&owner, "r"), T0 + 50, "live");
    sim.publish(A, &live);
    sim.advance(Duration::from_secs(70));
    sim.publish(
        A,
        &repo_comment(&owner, &coord(&owner, "r"), T0 + 90, "later"),
    );
    sim.settle();
    assert!(sim.synced(&live.id));
    sim.engine.check_invariants().unwrap();
}

#[test]
fn the_daily_sync_reconciles_again_and_fetches_only_the_gap() {
    let mut config = config();
    config.daily_min = Duration::from_secs(3_600);
    config.daily_max = Duration::from_secs(3_600);
    let mut sim = Sim::new(config);
    let (all, _) = world(&mut sim, NegMode::Supported, 100, 0);
    sim.advance(Duration::from_secs(10));
    assert!(sim.missing(&all).is_empty());
    let fetched = sim.engine.stats().neg_ids_fetched;
    // Drift the live stream missed: on the relay only, not delivered live.
    let owner = keys(1);
    let drift = repo_comment(&owner, &coord(&owner, "r"), T0 - 5, "missed live");
    sim.seed(A, &drift);
    sim.advance(Duration::from_secs(3_700));
    assert!(sim.synced(&drift.id));
    assert_eq!(sim.engine.stats().neg_ids_fetched, fetched + 1);
    assert_eq!(tag_reqs(&sim), 0);
}

#[test]
fn a_notice_saying_unknown_falls_back_and_is_remembered() {
    let mut sim = Sim::new(config());
    let (all, _) = world(&mut sim, NegMode::Unknown, 50, 5);
    sim.advance(Duration::from_secs(10));
    assert!(sim.missing(&all).is_empty());
    assert_eq!(sim.relays[A].neg_opens, 1);
    assert!(sim.engine.stats().neg_fallbacks >= 1);
    assert!(tag_reqs(&sim) >= 1);
    // Reconnect: REQ at once, no second NEG-OPEN.
    sim.stop_relay(A);
    sim.start_relay(A);
    sim.advance(Duration::from_secs(600));
    assert_eq!(sim.relays[A].neg_opens, 1);
}

#[test]
fn neg_err_falls_back_and_delivers_everything() {
    let mut sim = Sim::new(config());
    let (all, _) = world(&mut sim, NegMode::Error, 50, 5);
    sim.advance(Duration::from_secs(10));
    assert!(sim.missing(&all).is_empty());
    assert_eq!(sim.relays[A].neg_opens, 1);
    assert!(sim.engine.stats().neg_fallbacks >= 1);
}

#[test]
fn silence_times_out_falls_back_and_is_remembered() {
    let mut sim = Sim::new(config());
    let (all, _) = world(&mut sim, NegMode::Silent, 50, 5);
    sim.advance(Duration::from_secs(10));
    assert!(!sim.missing(&all).is_empty(), "still waiting for NEG-MSG");
    sim.advance(Duration::from_secs(20));
    assert!(sim.missing(&all).is_empty());
    assert_eq!(sim.relays[A].neg_opens, 1);
    sim.stop_relay(A);
    sim.start_relay(A);
    sim.advance(Duration::from_secs(600));
    assert_eq!(sim.relays[A].neg_opens, 1);
}

/// The shell leaves a relay's frames unread while the sink is full: its
/// `NEG-MSG` waits among them. A first sync holding reads past
/// `neg_timeout` marked a relay speaking NIP-77 as not speaking it, for
/// the process's life (the 2,000-relay load run: 555 relays "timed out").
#[test]
fn a_session_answered_while_reads_are_paused_is_not_taken_as_silent() {
    let mut sim = Sim::new(config());
    let (all, gone) = world(&mut sim, NegMode::Supported, 50, 5);
    sim.relay(A).reply_delay = Duration::from_millis(100);
    sim.advance(Duration::from_millis(50));
    assert_eq!(sim.relays[A].neg_opens, 1, "the session is open");
    sim.pause_reads(A);
    sim.advance(Duration::from_secs(60));
    assert_eq!(sim.missing(&gone).len(), 5, "nothing read while paused");
    sim.resume_reads(A);
    sim.advance(Duration::from_secs(5));
    assert!(sim.missing(&all).is_empty());
    assert_eq!(tag_reqs(&sim), 0, "reconciled, not paged by REQ");
    assert_eq!(ids_asked(&sim), 5);
}

#[test]
fn negentropy_can_be_turned_off() {
    let mut config: Config = config();
    config.negentropy = false;
    let mut sim = Sim::new(config);
    let (all, _) = world(&mut sim, NegMode::Supported, 50, 5);
    sim.advance(Duration::from_secs(10));
    assert!(sim.missing(&all).is_empty());
    assert_eq!(sim.relays[A].neg_opens, 0);
    assert_eq!(sim.engine.stats().neg_sessions, 0);
}

#[test]
fn nothing_held_locally_goes_straight_to_req() {
    let mut sim = Sim::new(config());
    let owner = keys(1);
    let coord = coord(&owner, "r");
    sim.add_relay(A).negentropy = NegMode::Supported;
    let comment = repo_comment(&owner, &coord, T0 - 10, "only remote");
    sim.seed(A, &comment);
    let own = sim.own.clone();
    sim.publish(&own, &announcement(&owner, "r", &[A], T0));
    sim.advance(Duration::from_secs(10));
    assert!(sim.synced(&comment.id));
    let stats = sim.engine.stats();
    assert_eq!(stats.neg_sessions, 0);
    assert_eq!((stats.neg_skipped, stats.neg_fallbacks), (1, 0));
}

/// Issue 13, item 4: after a long downtime thousands of ids are missing.
/// Their `ids` REQs wait for free subscription slots like any historic
/// work, so a relay allowing ten at once refuses none of them.
#[test]
fn thousands_of_missing_ids_are_fetched_within_the_subscription_limit() {
    let mut sim = Sim::new(config());
    let (all, gone) = world(&mut sim, NegMode::Supported, 6_010, 6_000);
    sim.relay(A).max_subs = Some((10, Refuse::Closed));
    sim.advance(Duration::from_secs(60));
    assert!(
        sim.missing(&all).is_empty(),
        "{} missing",
        sim.missing(&all).len()
    );
    assert!(
        sim.relays[A].peak_subs <= 10,
        "{} open at once",
        sim.relays[A].peak_subs
    );
    let stats = sim.engine.stats();
    assert_eq!(stats.refusals, 0);
    assert_eq!(stats.neg_fallbacks, 0);
    assert_eq!(stats.neg_ids_fetched, gone.len() as u64);
    assert_eq!(tag_reqs(&sim), 0, "no history re-read by REQ");
    sim.engine.check_invariants().unwrap();
}

/// Issue 13, item 4: a relay whose `NEG-MSG`s never converge, reporting
/// ids no one stores (or none) round after round. The exchange ends
/// within a bounded number of rounds and ids, never opens more REQs than
/// the relay allows, and the history arrives by REQ paging.
#[test]
fn a_neg_msg_exchange_that_never_converges_ends_in_req_paging() {
    for ids_per_round in [0, 300] {
        let mut sim = Sim::new(config());
        let mode = NegMode::Endless { ids_per_round };
        let (all, _) = world(&mut sim, mode, 50, 5);
        sim.relay(A).max_subs = Some((10, Refuse::Closed));
        sim.advance(Duration::from_secs(60));
        assert!(sim.missing(&all).is_empty(), "{ids_per_round} ids a round");
        let stats = sim.engine.stats();
        // 200 rounds answered; the 201st NEG-MSG is the one given up on.
        assert!(stats.neg_rounds <= 201, "{} rounds", stats.neg_rounds);
        assert!(stats.neg_fallbacks >= 1);
        assert_eq!(stats.neg_ids_fetched, 0, "no made-up id fetched");
        assert!(
            sim.relays[A].peak_subs <= 10,
            "{} open",
            sim.relays[A].peak_subs
        );
        assert!(tag_reqs(&sim) >= 1, "history re-read by REQ");
        sim.engine.check_invariants().unwrap();
    }
}

/// Relay URLs `wss://r{i}.example` for `i` in `0..n`.
fn urls(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("wss://r{i}.example")).collect()
}

/// One repo per relay in `urls`, each with `n` comments on its relay, of
/// which the own relay lacks `missing`; returns (all comments, missing).
fn repos_per_relay(
    sim: &mut Sim,
    urls: &[String],
    n: usize,
    missing: usize,
) -> (Vec<Event>, Vec<Event>) {
    let owner = keys(1);
    let own = sim.own.clone();
    let (mut all, mut gone) = (Vec::new(), Vec::new());
    for (r, url) in urls.iter().enumerate() {
        sim.add_relay(url).negentropy = NegMode::Supported;
        let d = format!("r{r}");
        let coord = coord(&owner, &d);
        for i in 0..n {
            let c = repo_comment(&owner, &coord, T0 - 1_000 + i as u64, &format!("{d} c{i}"));
            sim.seed(url, &c);
            if i < missing {
                gone.push(c.clone());
            } else {
                sim.seed(&own, &c);
            }
            all.push(c);
        }
        sim.publish(&own, &announcement(&owner, &d, &[url], T0));
    }
    (all, gone)
}

/// Issue 14, item 2: after a restart thousands of relays started their
/// jobs at once, each holding the sink's listings and a session. Now at
/// most `neg_jobs_at_once` run; the others wait their turn, none is failed
/// for waiting, and every missing id is still fetched by negentropy.
#[test]
fn at_most_k_jobs_run_at_once_and_every_missing_id_is_still_fetched() {
    let mut config = config();
    config.neg_jobs_at_once = 3;
    let mut sim = Sim::new(config);
    let urls = urls(40);
    let (all, gone) = repos_per_relay(&mut sim, &urls, 20, 2);
    sim.advance(Duration::from_secs(30));
    assert!(sim.missing(&all).is_empty(), "{}", sim.missing(&all).len());
    let stats = sim.engine.stats();
    assert!(
        (1..=3).contains(&stats.neg_jobs_peak),
        "{} jobs at once",
        stats.neg_jobs_peak
    );
    assert_eq!(
        stats.neg_ids_fetched,
        gone.len() as u64,
        "exactly the missing"
    );
    assert_eq!(stats.neg_fallbacks, 0);
    let sessions = sim.relays[urls[0].as_str()].neg_opens;
    assert!(sessions >= 1);
    for url in &urls {
        assert_eq!(sim.relays[url.as_str()].neg_opens, sessions, "{url}");
        assert_eq!(tag_reqs_on(&sim, url), 0, "{url} re-read by REQ");
    }
    sim.engine.check_invariants().unwrap();
}

/// A relay waiting for its turn holds no job, so no deadline runs for it:
/// two silent relays hold the only two turns for the whole `neg_timeout`,
/// and the relays behind them still reconcile (no fallback, no re-read
/// by REQ) once the turns free up.
#[test]
fn waiting_for_a_turn_behind_silent_relays_fails_no_one() {
    let mut config = config();
    config.neg_jobs_at_once = 2;
    let mut sim = Sim::new(config);
    let urls = urls(12);
    let (all, gone) = repos_per_relay(&mut sim, &urls, 10, 1);
    for url in &urls[..2] {
        sim.relay(url).negentropy = NegMode::Silent;
    }
    sim.advance(Duration::from_secs(120));
    assert!(sim.missing(&all).is_empty(), "{}", sim.missing(&all).len());
    let stats = sim.engine.stats();
    assert!(stats.neg_jobs_peak <= 2, "{} at once", stats.neg_jobs_peak);
    assert_eq!(stats.neg_fallbacks, 2, "only the silent relays fell back");
    let sessions = sim.relays[urls[2].as_str()].neg_opens;
    assert!(sessions >= 1);
    for url in &urls[2..] {
        assert_eq!(sim.relays[url.as_str()].neg_opens, sessions, "{url}");
        assert_eq!(tag_reqs_on(&sim, url), 0, "{url} re-read by REQ");
    }
    // The ten that reconciled fetched just their missing one each; the
    // silent ones re-read their history by REQ.
    assert_eq!(stats.neg_ids_fetched, gone.len() as u64 - 2);
    assert_eq!(sim.connects.len(), urls.len() + 1, "no one reconnected");
    sim.engine.check_invariants().unwrap();
}

/// Issue 14, item 2: relays holding the same repo ask the sink for the
/// same filters; the chaos demo's restart listed twelve times its history.
/// Jobs asking a filter while another job uses its listing share it.
#[test]
fn relays_asking_the_same_filter_share_one_listing() {
    let mut sim = Sim::new(config());
    let comments = same_repo_on(&mut sim, &RELAYS);
    sim.advance(Duration::from_secs(30));
    assert!(sim.missing(&comments).is_empty());
    // One session per filter on each relay, one listing per filter.
    let filters = sim.relays[RELAYS[0]].neg_opens;
    assert!(filters >= 1);
    for url in RELAYS {
        assert_eq!(sim.relays[url].neg_opens, filters, "{url}");
        assert_eq!(tag_reqs_on(&sim, url), 0, "{url} re-read by REQ");
    }
    assert_eq!(sim.lists_asked, filters, "one listing for three relays");
    sim.engine.check_invariants().unwrap();
}

/// A listing can be older than what the engine has passed to the sink
/// since (shared, or asked before a fetch's events arrived). Ids already
/// seen are not fetched again: one job at a time over three relays holding
/// the same three missing events fetches each once.
#[test]
fn ids_seen_since_the_listing_are_not_fetched_again() {
    let mut config = config();
    config.neg_jobs_at_once = 1;
    let mut sim = Sim::new(config);
    let comments = same_repo_on(&mut sim, &RELAYS);
    sim.advance(Duration::from_secs(30));
    assert!(sim.missing(&comments).is_empty());
    assert_eq!(sim.engine.stats().neg_ids_fetched, 3);
    assert_eq!(sim.engine.stats().neg_fallbacks, 0);
    sim.engine.check_invariants().unwrap();
}

const RELAYS: [&str; 3] = ["wss://a.example", "wss://b.example", "wss://c.example"];

/// One repo on every relay of `relays`, with the same 50 comments on each;
/// the own relay lacks the first three. Returns the comments.
fn same_repo_on(sim: &mut Sim, relays: &[&str]) -> Vec<Event> {
    let owner = keys(1);
    let coord = coord(&owner, "r");
    let own = sim.own.clone();
    let comments: Vec<Event> = (0..50)
        .map(|i| repo_comment(&owner, &coord, T0 - 1_000 + i, &format!("c{i}")))
        .collect();
    for &url in relays {
        sim.add_relay(url).negentropy = NegMode::Supported;
        for c in &comments {
            sim.seed(url, c);
        }
    }
    for c in &comments[3..] {
        sim.seed(&own, c);
    }
    sim.publish(&own, &announcement(&owner, "r", relays, T0));
    comments
}

/// Issue 33: the filters of one job overlap (a NIP-22 reply tags its root
/// with `E` and `e`), so a reconciliation of each finds the same ids. They
/// were counted once per filter, and an issue with more than half of
/// `MAX_NEED` (20,000) replies went to REQ paging, one page after another,
/// instead of a pipelined fetch by id.
#[test]
fn ids_two_filters_of_a_job_miss_count_once() {
    fetched_by_id_on_a_first_sync(10_050);
}

/// Issue 33: a reconciliation gave up at 20,000 missing ids, so a first
/// sync of an issue with more replies than that read them by REQ paging,
/// one page per round trip (1,350 events a second in the load run). The
/// bound is now on the ids held over all relays, and this issue's
/// history fits in it.
#[test]
fn an_issue_with_25_000_replies_is_fetched_by_id() {
    fetched_by_id_on_a_first_sync(25_000);
}

/// Issue 33: a job reconciles its filters one after the other (`#e`, then
/// `#E` over the same 20,000 replies), and fetched nothing until the
/// last ended. What a finished filter found missing is now fetched while
/// the next is reconciled, and not asked again when the next finds it.
#[test]
fn a_filters_missing_ids_are_fetched_while_the_next_is_reconciled() {
    let mut sim = Sim::new(config());
    let relay = sim.add_relay(A);
    relay.negentropy = NegMode::Supported;
    relay.reply_delay = Duration::from_millis(20);
    let seeded = issue_with_replies(&mut sim, &[A], 2_000, T0 - 9_000);
    for r in &seeded {
        sim.seed(A, r);
    }
    sim.advance(Duration::from_secs(60));
    assert_eq!(sim.missing(&seeded).len(), 0);
    let stats = sim.engine.stats();
    assert_eq!(stats.neg_fetched_ahead, 1);
    assert_eq!(stats.neg_ids_fetched, 2_000, "each id asked once");
    let relay = sim.relay(A);
    let first_fetch = relay
        .reqs
        .iter()
        .position(|(_, fs)| fs.iter().any(|f| f.ids.is_some()))
        .expect("fetched by id");
    assert!(
        relay.neg_opens_before[first_fetch] < relay.neg_opens,
        "the first fetch went out before the job's last NEG-OPEN"
    );
    sim.engine.check_invariants().unwrap();
}

/// A first sync of one issue with `replies` replies on `A` fetches every
/// one by id, after one reconciliation, with no history re-read by REQ.
fn fetched_by_id_on_a_first_sync(replies: u64) {
    let mut sim = Sim::new(config());
    sim.add_relay(A).negentropy = NegMode::Supported;
    let seeded = issue_with_replies(&mut sim, &[A], replies, T0 - replies - 5_000);
    for r in &seeded {
        sim.seed(A, r);
    }
    sim.advance(Duration::from_secs(60));
    assert_eq!(sim.missing(&seeded).len(), 0);
    let stats = sim.engine.stats();
    assert_eq!(stats.neg_ids_fetched, replies);
    assert_eq!(stats.neg_fallbacks, 0);
    assert_eq!(tag_reqs(&sim), 0, "no history re-read by REQ");
    sim.engine.check_invariants().unwrap();
}

/// Announces repo "r" on `relays` at `start` and an issue on it 1,000 s
/// later, both on the own relay, and returns `n` replies to the issue a
/// second apart from `start` + 2,000 (for the caller to seed).
fn issue_with_replies(sim: &mut Sim, relays: &[&str], n: u64, start: u64) -> Vec<Event> {
    let owner = keys(1);
    let own = sim.own.clone();
    sim.publish(&own, &announcement(&owner, "r", relays, start));
    let c = coord(&owner, "r");
    let issue = root(&keys(2), 1621, &[&c], start + 1_000, "an issue");
    sim.publish(&own, &issue);
    (0..n)
        .map(|i| reply(&keys(3), &issue, start + 2_000 + i, &format!("r{i}")))
        .collect()
}

/// Two relays each holding 1,000 replies the own relay lacks, with
/// `neg_ids_held` at `bound`: the engine's stats once all arrived.
fn two_relays_missing_1000_each(bound: usize) -> grasp_sync::Stats {
    const B: &str = "wss://b.example";
    let mut config = config();
    config.neg_ids_held = bound;
    let mut sim = Sim::new(config);
    let replies = issue_with_replies(&mut sim, &[A, B], 2_000, T0 - 5_000);
    for (url, half) in [(A, &replies[..1_000]), (B, &replies[1_000..])] {
        sim.add_relay(url).negentropy = NegMode::Supported;
        for r in half {
            sim.seed(url, r);
        }
    }
    sim.advance(Duration::from_secs(60));
    assert_eq!(sim.missing(&replies).len(), 0, "bound {bound}");
    // The count of ids held agrees with a recount, so all were released.
    sim.engine.check_invariants().unwrap();
    *sim.engine.stats()
}

/// The ids negentropy holds are bounded over all relays, not per job: a
/// job that would pass the bound goes to REQ paging, with nothing lost,
/// and says so in a stat. A relay reporting ids without end thus costs a
/// bounded amount however many relays do it at once.
#[test]
fn a_job_past_the_bound_on_ids_held_goes_to_req_and_loses_nothing() {
    let roomy = two_relays_missing_1000_each(2_500);
    assert_eq!(roomy.neg_over_id_budget, 0);
    assert_eq!(roomy.neg_fallbacks, 0);
    assert_eq!(roomy.neg_ids_fetched, 2_000);
    let tight = two_relays_missing_1000_each(1_500);
    assert_eq!(tight.neg_over_id_budget, 1, "one job fits, the other not");
    assert_eq!(tight.neg_fallbacks, 1);
    assert_eq!(tight.neg_ids_fetched, 1_000);
}

/// A relay refusing a reconciliation for its size (rust-nostr's relays:
/// `NEG-ERR "rate-limited: too many negentropy items"`; strfry: `"blocked:
/// too many query results"`) speaks NIP-77: a filter that cannot be split
/// in time windows (here the sink holds none of its events, so no second
/// to split it at) has the job read by REQ, and the relay is asked by
/// negentropy again. When the refused session was the relay's first, it
/// was remembered as not speaking NIP-77, and every later sync of it (the
/// daily one included) paged by REQ until a restart.
#[test]
fn a_session_refused_for_its_size_falls_back_without_forgetting_negentropy() {
    let mut config: Config = config();
    config.daily_min = Duration::from_secs(3_600);
    config.daily_max = Duration::from_secs(3_600);
    let mut sim = Sim::new(config);
    let (mut all, _) = world(&mut sim, NegMode::Supported, 50, 5);
    // Two issues for the `#a` filter, reconciled first: its session is
    // the relay's first, and is refused.
    let coord = coord(&keys(1), "r");
    for i in 0..2 {
        let issue = root(&keys(2), 1621, &[&coord], T0 - 500 + i, "an issue");
        sim.seed(A, &issue);
        all.push(issue);
    }
    sim.relays.get_mut(A).unwrap().max_neg_items = Some(1);
    sim.advance(Duration::from_secs(10));
    assert!(sim.missing(&all).is_empty());
    assert!(tag_reqs(&sim) >= 1, "read by REQ");
    assert_eq!(sim.engine.stats().neg_size_splits, 0, "nothing to split");
    let opens = sim.relays[A].neg_opens;
    sim.relays.get_mut(A).unwrap().max_neg_items = None;
    sim.advance(Duration::from_secs(3_700));
    assert!(
        sim.relays[A].neg_opens > opens,
        "the daily sync asks by negentropy again"
    );
    sim.engine.check_invariants().unwrap();
}

/// A relay refusing a reconciliation for its size speaks NIP-77, and
/// refused every filter of a big repo at every daily sync and restart:
/// the job then re-read the whole history by REQ paging, though the sink
/// held nearly all of it. Now the refused filter is split in time windows
/// at the sink's median second, each reconciled apart, and only what is
/// missing is fetched.
#[test]
fn a_filter_refused_for_its_size_is_reconciled_in_time_windows() {
    let mut sim = Sim::new(config());
    let relay = sim.add_relay(A);
    relay.negentropy = NegMode::Supported;
    relay.max_neg_items = Some(150);
    let replies = issue_with_replies(&mut sim, &[A], 400, T0 - 9_000);
    let own = sim.own.clone();
    let mut gone = Vec::new();
    for (i, r) in replies.iter().enumerate() {
        sim.seed(A, r);
        if i % 20 == 7 {
            gone.push(r.clone());
        } else {
            sim.seed(&own, r);
        }
    }
    sim.advance(Duration::from_secs(60));
    assert!(
        sim.missing(&replies).is_empty(),
        "{:?}",
        sim.missing(&replies)
    );
    let stats = sim.engine.stats();
    let opens = sim.relays[A].neg_opens;
    assert_eq!(tag_reqs(&sim), 0, "no history re-read by REQ");
    assert_eq!(ids_asked(&sim), gone.len(), "only the missing fetched");
    assert_eq!(stats.events_received, gone.len() as u64);
    assert_eq!(stats.neg_ids_fetched, gone.len() as u64);
    assert_eq!(stats.neg_fallbacks, 0);
    assert!(stats.neg_size_splits > 0);
    // Each split follows one refused NEG-OPEN and adds one window.
    assert!(
        opens > stats.neg_size_splits as usize + 1,
        "{opens} NEG-OPENs"
    );
    sim.engine.check_invariants().unwrap();
}
