//! Load run (not criterion): round trips per first sync, in simulated
//! time, over the whole matrix of issue 46 — N = 1,000 / 20,000 / 100,000
//! replies, remote caps 100 and 500, with and without NIP-77 — each with
//! the default batch window and a 200 ms one (their difference is what
//! waiting out windows costs). The world and the harness are
//! `tests/support/round_trips.rs`.
//!
//! ```sh
//! cargo bench --bench round_trips            # the table
//! cargo bench --bench round_trips -- goal    # and issue 46's goal
//! ```
//!
//! `goal` exits 1 unless, for every cap and NIP-77 mode, the largest
//! history costs at most 6 round trips more than the smallest.

#[path = "../tests/support/mod.rs"]
mod support;

use support::round_trips::*;

fn main() {
    let goal = std::env::args().any(|a| a == "goal");
    let mut runs = Vec::new();
    for nip77 in [false, true] {
        for cap in CAPS {
            for n in NS {
                runs.push(cell(n, cap, nip77));
            }
        }
    }
    print(&runs);
    if !goal {
        return;
    }
    let mut failures = Vec::new();
    for chunk in runs.chunks(NS.len()) {
        let (small, large) = (&chunk[0].0, &chunk[NS.len() - 1].0);
        if large.round_trips > small.round_trips + 6.0 {
            failures.push(format!(
                "cap {}, NIP-77 {}: {:.1} round trips for {} replies, {:.1} for {}",
                small.cap, small.nip77, large.round_trips, large.n, small.round_trips, small.n
            ));
        }
    }
    if !failures.is_empty() {
        eprintln!("round trips grow with N:");
        for f in &failures {
            eprintln!("  {f}");
        }
        std::process::exit(1);
    }
    eprintln!("goal met: round trips do not grow with N");
}
