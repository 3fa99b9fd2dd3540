//! Round trips per first sync, counted in simulated time (issue 46; the
//! harness and its world are `support::round_trips`). The whole matrix,
//! N = 1,000 / 20,000 / 100,000 at caps 100 and 500 with and without
//! NIP-77, and the goal that the count does not grow with N, are a
//! load run (`cargo bench --bench round_trips`): the largest world takes
//! two minutes in a debug build.

mod support;

use support::round_trips::*;

/// The harness on the smallest history, every cap and NIP-77 mode: the
/// first sync completes and its round trips are counted. A first sync of
/// 1,000 replies on a relay that caps at 500 takes a handful of round
/// trips: it took 54 while each generation of discovery (the issue, then
/// its replies) waited out a whole batch window.
#[test]
fn a_first_sync_is_counted_in_round_trips() {
    let mut runs = Vec::new();
    for nip77 in [false, true] {
        for cap in CAPS {
            runs.push(cell(NS[0], cap, nip77));
        }
    }
    print(&runs);
    for (default, _) in &runs {
        if default.cap == 500 {
            assert!(
                default.round_trips <= 12.0,
                "no batch window waited out: {default:?}"
            );
        }
    }
}

/// A long history on a relay the path makes slow is read many pages per
/// round trip: the rest of a cut first page's range is split into time
/// windows, each a chain of its own, packed many to a REQ. One page per
/// round trip took 92 round trips for 20,000 replies at a cap of 500, and
/// 450 at a cap of 100 (a probe after every page); one window per REQ,
/// 16 and 84 (at most 10 REQs open at once); with a one-event page beside
/// each window (a twin pair "proving" a cap of a twentieth of its page),
/// 8 and 11.
#[test]
fn a_long_history_is_read_in_parallel_windows() {
    for (cap, most) in [(500, 9.0), (100, 10.0)] {
        let run = first_sync(20_000, cap, false, RTT, None);
        eprintln!("{run:?}");
        assert!(run.round_trips <= most, "cap {cap}: {run:?}");
        assert!(run.peak_subs > 2, "chains ran side by side: {run:?}");
        let pages = 20_000 / cap;
        assert!(run.reqs < pages, "several pages per REQ: {run:?}");
    }
}

/// khatru checks no filter count, so its NIP-11 document lifts our 20 to
/// 100; one whose operator added a policy refusing past ten (unstated,
/// `CLOSED "error: too many filters"`) teaches it in two steps, to the
/// known limits below (100, then 20, then 10; halving took four and
/// ended at six), a burst of refusals stepping once, and its long
/// history still arrives whole, a round trip or two per step later: a
/// refused page is asked again in smaller REQs, where giving it back
/// restarted its whole chain (15 round trips against 8).
#[test]
fn a_filter_limit_below_the_softwares_is_learned_in_two_steps() {
    let (n, cap, most) = (5_000, 100, 10);
    let run = first_sync_on(n, cap, false, RTT, None, |r| r.max_filters = Some(most));
    assert_eq!(run.filters_per_req, [100, 20, 10], "{run:?}");
    let refused = run.req_sizes.iter().filter(|&&f| f > most).count();
    assert!(refused <= 4, "a burst steps once: {run:?}");
    let unlimited = first_sync(n, cap, false, RTT, None);
    assert!(
        run.round_trips <= unlimited.round_trips + 4.0,
        "{run:?} against {unlimited:?}"
    );
}

/// A relay serving no NIP-11 document is held to 20 filters a REQ, which
/// rust-nostr's relay builder (LocalRelay, and the GRASP relays built on
/// it) takes and refuses past (`rate-limited: REQ exceeds max filter
/// count 20`): its long history costs no refusal.
#[test]
fn a_relay_without_a_document_gets_twenty_filters_and_no_refusal() {
    let run = first_sync_on(20_000, 100, false, RTT, None, |r| {
        r.info = None;
        r.max_filters = Some(20);
    });
    assert_eq!(run.filters_per_req, [20], "{run:?}");
    assert!(run.req_sizes.iter().all(|&f| f <= 20), "{run:?}");
    assert!(run.req_sizes.contains(&20), "REQs fill it: {run:?}");
}

/// A chain's first full page splits the rest of its range into windows at
/// once: the issue the relay sent a round trip before, asked again by id
/// up to its own second beside the replies' first page, shows that the
/// relay's `until` takes in its second, which windows meeting at a second
/// boundary need. Before, only a follow-up page showed it, and the first
/// split waited for one: 7 round trips for 20,000 replies at a cap of
/// 500, now 6 (the issue, the echo's settle, the first page, the windows
/// and what they cut).
#[test]
fn the_first_full_page_splits_once_a_probe_showed_the_until() {
    let run = first_sync(20_000, 500, false, RTT, None);
    assert!(run.round_trips < 6.5, "{run:?}");
}
