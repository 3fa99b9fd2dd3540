//! `grasp-sync demo`: the main job, end to end, with no outside network.
//!
//! The engine runs as a child process (the real binary with its real
//! flags) so its memory and CPU are measured apart from the relays.
//!
//! It starts an own relay and N remote relays on 127.0.0.1 (a relay farm on
//! a helper thread, not the engine's loop), seeds them with signed
//! repository announcements, issues, patches, PRs, replies, status and state
//! events spread across relays (some repos announced only on remote
//! relays), runs the real engine over real sockets, publishes more events
//! while it runs, restarts one remote relay midway, and reports progress
//! until every expected event reached the own relay. Then it stops the
//! engine, publishes more while it is down and starts it again (see
//! `restart`). With `--chaos` a third of the remote relays misbehave (see
//! `chaos`).
//!
//! The remote relays behave like the ones the engine meets: they speak
//! NIP-77 negentropy, and every fifth requires NIP-42 AUTH before it serves
//! reads, so the engine gets a throwaway key (`--auth-key-file`). Every
//! third is limited like a khatru relay over eventstore's SQL backends (see
//! `profiles`): at most 100 stored events per filter; half of them
//! also refuse filters with more than 10 tag values or kinds and do not
//! speak NIP-77 (khatru's default), so even the restarted engine reads
//! them by REQ; some publish their limits in a NIP-11 document; one in 20
//! relays holds a busy issue with more replies than the cap and is read by
//! REQ, so paging past the cap is needed. What the engine did with them is
//! read from its metrics and printed.

mod chaos;
mod engine_process;
mod idle;
mod options;
mod profiles;
mod progress;
mod restart;
mod scenario;
mod shards;
mod summary;
mod unfinished;

use std::time::{Duration, Instant};

use nostr::prelude::{Event, EventId, Keys};

pub use chaos::ChaosSummary;
use chaos::{Chaos, rss_ceiling_kib};
pub use engine_process::EngineCounters;
pub use options::{DemoOptions, help_text, parse_args};
pub use restart::RestartSummary;
pub use summary::DemoSummary;

use engine_process::EngineProcess;
use grasp_sync::testing::cert::{CA_PEM, LEAF_KEY_PEM, LEAF_PEM};
use grasp_sync::testing::farm::{FarmOptions, FarmStats, RelayFarm};
use grasp_sync::testing::relay::server_tls_config;
use idle::Idle;
use profiles::{Plan, describe_profiles};
use progress::{Progress, drive};
use scenario::{Roles, Scenario, generate};
use shards::EngineSet;

/// Runs the demo, printing progress; returns the summary. A failed chaos
/// check prints the summary, then is an error.
pub fn run(opts: &DemoOptions) -> Result<DemoSummary, String> {
    let _ = grasp_sync::internal::raise_fd_limit();
    let setup = Setup::start(opts)?;
    setup.print_description(opts);
    // A fresh key each run: relays here accept any key that answers their
    // challenge, as public relays requiring AUTH do.
    let auth_key = Keys::generate();
    let own_url = setup.farm.url(0);
    let spawn = || {
        EngineSet::spawn(opts.shards, |shard| {
            EngineProcess::spawn(
                &own_url,
                setup.relays,
                opts.seed.wrapping_add(u64::from(shard.index())),
                opts.tls.then_some(CA_PEM),
                Some(&auth_key),
                shard,
                opts.max_unfinished_bytes,
            )
        })
    };
    let first = first_run(opts, &setup, spawn()?)?;
    let restart = restart::run(&setup.farm, &setup.scenario.down, opts.timeout, spawn)?;
    print_restart(&restart, &setup.scenario);
    let summary = setup.summarize(opts, first, restart);
    match summary.chaos_failure() {
        Some(failure) => {
            println!("{}", summary.line());
            Err(format!("chaos: {failure}"))
        }
        None => Ok(summary),
    }
}

/// The relays of one run, seeded: the farm (the own relay and the honest
/// remote relays), the misbehaving relays, and what was put where.
struct Setup {
    /// Remote relays, honest and misbehaving.
    relays: usize,
    /// Misbehaving remote relays (`--chaos`).
    chaotic: usize,
    chaos: Chaos,
    farm: RelayFarm,
    plan: Plan,
    scenario: Scenario,
    /// Events too large for the own relay, on honest relays (`--chaos`).
    large: Vec<(usize, Event)>,
}

impl Setup {
    /// Starts the misbehaving relays and the farm with its profiles, and
    /// seeds them with the scenario.
    fn start(opts: &DemoOptions) -> Result<Setup, String> {
        let relays = opts.relays.max(1);
        let chaotic = if opts.chaos { relays / 3 } else { 0 };
        if opts.chaos && chaotic == 0 {
            return Err("--chaos needs --relays 3 or more".to_owned());
        }
        let tls = match opts.tls {
            true => Some(
                server_tls_config(LEAF_PEM.as_bytes(), LEAF_KEY_PEM.as_bytes())
                    .map_err(|e| e.to_string())?,
            ),
            false => None,
        };
        let chaos = Chaos::start(chaotic, opts.seed, tls.clone())?;
        let farm_len = relays - chaotic + 1;
        let own = opts.chaos.then(chaos::own_profile);
        let plan = Plan::new(farm_len, opts.busy_issues(farm_len), own);
        let farm = RelayFarm::start(
            farm_len,
            FarmOptions {
                tls,
                negentropy: true,
                auth_required: plan.auth_required.clone(),
                profiles: plan.profiles.clone(),
                ..FarmOptions::default()
            },
        )
        .map_err(|e| format!("starting relays: {e}"))?;
        let (scenario, large) = seed(opts, &farm, &chaos, &plan);
        Ok(Setup {
            relays,
            chaotic,
            chaos,
            farm,
            plan,
            scenario,
            large,
        })
    }

    /// Prints what the relays are like and what they hold.
    fn print_description(&self, opts: &DemoOptions) {
        let (n, scenario, plan) = (self.relays, &self.scenario, &self.plan);
        println!(
            "demo: {} relays on 127.0.0.1{}, {} repos, {} events to sync ({} published while running)",
            n,
            if opts.tls { " (wss, test CA)" } else { "" },
            opts.repos.unwrap_or(2 * n),
            scenario.expected.len(),
            scenario.live.len()
        );
        println!(
            "demo: the remote relays speak NIP-77; {} of them require NIP-42 AUTH; the engine gets a throwaway key",
            plan.auth_required.len()
        );
        println!(
            "{}",
            describe_profiles(&plan.profiles, plan.busy.len(), opts.tls)
        );
        println!(
            "demo: {} relays behave like strfry (500 per filter, 255-byte tag values, three subscription counts); \
             one of them alone carries a repo with a {}-character d tag ({} events no relay can be asked for); \
             {} capped relay holds an issue with {} replies in one second",
            plan.strfry.len(),
            scenario::LONG_D_LEN,
            scenario.unreachable.len(),
            usize::from(plan.crowded.is_some()),
            scenario::SAME_SECOND_REPLIES,
        );
        if opts.chaos {
            println!("{}", self.chaos.describe());
        }
    }

    /// Prints the relays' figures, counts what reached the own relay over
    /// both runs, stops the relays and sums it all up.
    fn summarize(
        self,
        opts: &DemoOptions,
        first: FirstRun,
        restart: RestartSummary,
    ) -> DemoSummary {
        let counters = first.counters + restart.counters;
        let stats = self.farm.stats();
        print_relay_figures(&stats);
        let reqs = stats.reqs + self.chaos.reqs();
        let chaos = opts.chaos.then(|| self.chaos_summary(&stats, &counters));
        let scenario = &self.scenario;
        let all: Vec<EventId> = scenario
            .expected
            .iter()
            .copied()
            .chain(scenario.down.iter().map(|(_, e)| e.id))
            .collect();
        let synced = self.farm.count_present(0, &all);
        let unreachable_expected = scenario.unreachable.len();
        let first_needed = scenario.expected.len();
        self.farm.stop();
        DemoSummary {
            relays: self.relays,
            expected: all.len(),
            synced,
            seconds: first.converged.as_secs_f64(),
            peak_rss_kib: first.peak_rss_kib.max(restart.peak_rss_kib),
            reqs,
            chaos,
            counters,
            relay_neg_errors: stats.neg_errors,
            restart,
            shards: opts.shards,
            unreachable_expected,
            first_needed,
            first_synced: first.progress.synced,
        }
    }

    /// What `--chaos` found: faults injected, invalid events that reached
    /// the own relay, and what became of the events too large for it.
    fn chaos_summary(&self, stats: &FarmStats, counters: &EngineCounters) -> ChaosSummary {
        ChaosSummary {
            chaotic: self.chaotic,
            faults_injected: self.chaos.faults_injected(),
            invalid_ingested: self.farm.count_present(0, &self.chaos.invalid_sent()) as u64
                + counters.sink_rejected,
            rss_ceiling_kib: rss_ceiling_kib(self.relays),
            large_events: self.large.len(),
            large_refused: stats.events_too_large,
            set_aside: counters.sink_set_aside,
        }
    }
}

/// Generates the scenario over the farm's relays and seeds them with it:
/// the own relay, the honest remote relays, the misbehaving ones, and
/// (with `--chaos`) events too large for the own relay, which it returns.
fn seed(
    opts: &DemoOptions,
    farm: &RelayFarm,
    chaos: &Chaos,
    plan: &Plan,
) -> (Scenario, Vec<(usize, Event)>) {
    let own_url = farm.url(0);
    let urls: Vec<String> = (1..farm.len()).map(|i| farm.url(i)).collect();
    let (req_only, strfry) = (plan.req_only(), plan.strfry_indexes());
    let roles = Roles {
        busy: &plan.busy,
        req_only: &req_only,
        strfry: &strfry,
        crowded: plan.crowded,
    };
    let scenario = generate(opts, &own_url, &urls, &chaos.urls(), &roles);
    farm.seed(0, scenario.own.clone());
    for (i, events) in scenario.remote.iter().enumerate() {
        farm.seed(i + 1, events.clone());
    }
    chaos.seed(&scenario.chaotic);
    let large = if opts.chaos {
        chaos::large_events(&scenario.remote)
    } else {
        Vec::new()
    };
    for (i, event) in &large {
        farm.seed(i + 1, vec![event.clone()]);
    }
    (scenario, large)
}

/// What the first engine run left for the summary.
struct FirstRun {
    progress: Progress,
    /// From the engine's start until everything arrived (or the timeout).
    converged: Duration,
    peak_rss_kib: u64,
    counters: EngineCounters,
}

/// Drives the first engine run until everything arrived or time is up,
/// measures it (idle and unfinished messages when asked), prints its
/// figures and stops it. An engine that does not exit cleanly on SIGTERM
/// is an error.
fn first_run(opts: &DemoOptions, setup: &Setup, engine: EngineSet) -> Result<FirstRun, String> {
    for addr in engine.metrics_addrs() {
        println!("demo: the engine's status page is http://{addr}/status");
    }
    let (farm, scenario) = (&setup.farm, &setup.scenario);
    let started = Instant::now();
    let progress = drive(farm, &engine, scenario, started + opts.timeout, started);
    let converged = started.elapsed();
    let idle = idle::measure(&engine, opts.idle);
    if opts.unfinished_kib > 0 {
        unfinished::measure(farm, &engine, opts.unfinished_kib);
    }
    let (peak_rss_kib, _) = engine.rss_kib();
    print_engine_figures(&engine, &progress, converged, idle);
    let counters = engine.settled_counters();
    println!("demo: first run: {}", describe(&counters));
    let code = engine.stop();
    if code != Some(0) {
        return Err(format!("the engine exited with {code:?} on SIGTERM"));
    }
    Ok(FirstRun {
        progress,
        converged,
        peak_rss_kib,
        counters,
    })
}

/// The engine's connections, timings, idle cost and traffic, read from
/// its metrics.
fn print_engine_figures(
    engine: &EngineSet,
    progress: &Progress,
    converged: Duration,
    idle: Option<Idle>,
) {
    let metric = |name: &str| engine.metric(name).unwrap_or(0);
    let idle_text = idle.map_or(String::new(), |i| {
        format!(" idle_rss_kib={} idle_cpu_pct={:.2}", i.rss_kib, i.cpu_pct)
    });
    println!(
        "demo: engine: relays_connected={} connect_seconds={:.1} converge_seconds={:.1}{idle_text} reqs_sent={} bytes_out={} bytes_in={}",
        metric("grasp_sync_relays{status=\"connected\"}"),
        progress.connected.map_or(f64::NAN, |d| d.as_secs_f64()),
        converged.as_secs_f64(),
        metric("grasp_sync_reqs_total "),
        metric("grasp_sync_bytes_total{direction=\"out\"}"),
        metric("grasp_sync_bytes_total{direction=\"in\"}"),
    );
}

/// What the restarted engine fetched of the events published while it
/// was down.
fn print_restart(restart: &RestartSummary, scenario: &Scenario) {
    println!(
        "demo: restart: {}/{} events published while the engine was down arrived in {:.1} s; \
         negentropy fetched {} ids for them; {} events downloaded, the history is {}",
        restart.synced,
        restart.needed,
        restart.seconds,
        restart.counters.neg_ids_fetched,
        restart.counters.events_received,
        scenario.expected.len(),
    );
    println!("demo: restart: {}", describe(&restart.counters));
}

/// What the relays saw of NIP-77, NIP-42, their caps and NIP-11, over
/// both runs.
fn print_relay_figures(stats: &FarmStats) {
    println!(
        "demo: relays: negentropy sessions={} rounds={} errors={}; auth accepted={} rejected={} reads_refused={}; \
         capped filters={} value-cap refusals={} nip11 served={}",
        stats.neg_sessions,
        stats.neg_rounds,
        stats.neg_errors,
        stats.auth_accepted,
        stats.auth_rejected,
        stats.auth_refusals,
        stats.capped_filters,
        stats.value_refusals,
        stats.info_served,
    );
}

/// One run's NIP-77 and NIP-42 figures, for a progress line.
fn describe(c: &EngineCounters) -> String {
    format!(
        "negentropy sessions={} rounds={} ids_fetched={} fallbacks={} sink_listed={}; \
         auth attempts={} rejected={} auth_required={}; events downloaded={}",
        c.neg_sessions,
        c.neg_rounds,
        c.neg_ids_fetched,
        c.neg_fallbacks,
        c.sink_listed,
        c.auth_attempts,
        c.auth_rejected,
        c.auth_required,
        c.events_received,
    )
}
