//! The relay of BENCHMARKS.md with grasp-sync embedded (no repositories
//! yet: what embedding costs at rest). Starts, idles 5 s, prints its
//! resident memory and threads.

use std::time::Duration;

use grasp_sync_relay_builder::py_relay::{rss_kib, threads};
use grasp_sync_relay_builder::{EmbeddedRelay, Options};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let relay = EmbeddedRelay::start(Options::default()).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    println!("idle: rss_kib={} threads={}", rss_kib(), threads());
    tokio::task::spawn_blocking(move || relay.shutdown()).await??;
    Ok(())
}
