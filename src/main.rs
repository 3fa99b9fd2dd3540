//! The `grasp-sync` binary: parse flags and environment, run the shell.

use std::process::ExitCode;

use grasp_sync::cli::{self, Command, Options};
use grasp_sync::{Shell, ShellOptions, SinkTarget};

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match cli::parse(args, &|name| std::env::var(name).ok()) {
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
        Command::Run(options) => run(options),
    }
}

fn run(mut options: Options) -> ExitCode {
    if !options.seed_given {
        // Jitter only needs to differ between instances, not to be secret.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        options.config.seed = nanos ^ (u64::from(std::process::id()) << 32);
    }
    let shell_options = ShellOptions {
        allow_private_addresses: options.allow_private_addresses,
        max_relays: options.max_relays,
        extra_ca_files: options.extra_ca_files,
        max_frame_bytes: options.max_frame_bytes,
        shutdown_timeout: options.shutdown_timeout,
        metrics: options.metrics,
        handle_signals: true,
        ..ShellOptions::default()
    };
    let shell = match Shell::new(options.config, shell_options, SinkTarget::OwnRelay) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("grasp-sync: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(addr) = shell.metrics_addr() {
        log::info!("metrics on http://{addr}/metrics");
    }
    match shell.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("grasp-sync: {e}");
            ExitCode::FAILURE
        }
    }
}
