//! The `grasp-sync` binary. The network shell arrives with the next
//! milestone; until then it validates its configuration and says so.

use std::process::ExitCode;

fn main() -> ExitCode {
    env_logger::init();
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next()) {
        (Some("--own-relay"), Some(url)) => match grasp_sync::Engine::new(
            grasp_sync::Config::new(url),
            grasp_sync::Time::from_millis(0),
        ) {
            Ok(_) => {
                eprintln!("grasp-sync: configuration valid; the network shell is not built yet");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("grasp-sync: {e}");
                ExitCode::from(2)
            }
        },
        _ => {
            eprintln!("usage: grasp-sync --own-relay <ws-url>");
            ExitCode::from(2)
        }
    }
}
