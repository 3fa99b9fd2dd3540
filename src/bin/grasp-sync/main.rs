//! The `grasp-sync` binary: parse flags and environment, run the shell.

mod cli;
mod demo;
mod status;

use std::io::Write;
use std::process::ExitCode;

use grasp_sync::{Shell, ShellError, ShellHandle, SinkTarget};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use cli::{Command, Options};

fn main() -> ExitCode {
    let is_demo = std::env::args().nth(1).as_deref() == Some("demo");
    // The demo prints its own progress; engine logs would drown it unless asked for.
    let default_level = if is_demo { "error" } else { "info" };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_level))
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("demo") {
        return demo(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("status") {
        return status::main(&args[1..]);
    }
    let env = |name: &str| std::env::var(name).ok();
    let command = match cli::parse(args.clone(), &env) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("grasp-sync: {e}");
            return ExitCode::from(2);
        }
    };
    match command {
        Command::Help => {
            print!("{}", cli::help_text());
            ExitCode::SUCCESS
        }
        Command::Version => {
            println!("{}", cli::version_text());
            ExitCode::SUCCESS
        }
        Command::Run(options) => run(options, &|e| cli::describe(e, &args, &env)),
    }
}

/// `grasp-sync demo ...`: exit 0 only if every expected event arrived, the
/// first run's all within the first run.
fn demo(args: &[String]) -> ExitCode {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{}", demo::help_text());
        return ExitCode::SUCCESS;
    }
    let opts = match demo::parse_args(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("grasp-sync: {e}");
            return ExitCode::from(2);
        }
    };
    match demo::run(&opts) {
        Ok(summary) => {
            println!("{}", summary.line());
            if summary.passed() {
                return ExitCode::SUCCESS;
            }
            if summary.first_synced < summary.first_needed {
                eprintln!(
                    "grasp-sync: demo: the first run ended with {} of {} events (missing ones listed above); \
                     what the restart fetched later does not make up for it",
                    summary.first_synced, summary.first_needed
                );
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("grasp-sync: demo: {e}");
            ExitCode::from(2)
        }
    }
}

/// `describe` words a start-up error, naming the flag it is about.
fn run(mut options: Options, describe: &dyn Fn(&ShellError) -> String) -> ExitCode {
    let _ = grasp_sync::internal::raise_fd_limit();
    if !options.seed_given {
        // Jitter only needs to differ between instances, not to be secret.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        options.config.seed = nanos ^ (u64::from(std::process::id()) << 32);
    }
    let shard = options.config.shard;
    let settings = cli::settings_text(&options);
    let shell = match Shell::new(options.config, options.shell, SinkTarget::OwnRelay) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("grasp-sync: {}", describe(&e));
            return ExitCode::from(2);
        }
    };
    if let Err(e) = stop_on_signals(shell.handle()) {
        eprintln!("grasp-sync: cannot handle signals: {e}");
        return ExitCode::from(2);
    }
    let metrics = shell
        .metrics_addr()
        .map_or("off".to_owned(), |a| a.to_string());
    log::info!(
        "{} starting: shard={shard} metrics={metrics} {settings}",
        cli::version_text()
    );
    if let Some(addr) = shell.metrics_addr() {
        log::info!("metrics on http://{addr}/metrics (and /healthz)");
        // On stdout too, so whoever asked for port 0 (the demo, tests) can
        // read the port the kernel picked instead of racing for one.
        // Ignored if stdout is closed: the metrics still serve.
        let _ = writeln!(std::io::stdout(), "grasp-sync: metrics on {addr}");
    }
    if shard.count() > 1 {
        log::info!("shard {shard}: connecting only to this shard's relays");
    }
    match shell.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("grasp-sync: {e}");
            ExitCode::FAILURE
        }
    }
}

/// SIGINT, SIGTERM or SIGHUP starts the shell's graceful shutdown (save
/// the state file, flush the outbox, then exit 0). SIGHUP does what SIGTERM
/// does: every setting comes from flags and the environment, which a
/// running process cannot re-read, so there is nothing to reload; without a
/// handler the kernel's default for SIGHUP would kill it without saving.
/// The library installs no signal handlers, since an embedding relay owns
/// its process; the binary waits for them on a thread of its own that
/// sleeps in the kernel until a signal comes.
fn stop_on_signals(handle: ShellHandle) -> std::io::Result<()> {
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::spawn(move || {
        for signal in signals.forever() {
            let name = match signal {
                SIGHUP => "SIGHUP (no reload: same as SIGTERM)",
                SIGINT => "SIGINT",
                _ => "SIGTERM",
            };
            log::info!("{name} received; saving state and shutting down");
            handle.shutdown();
        }
    });
    Ok(())
}
