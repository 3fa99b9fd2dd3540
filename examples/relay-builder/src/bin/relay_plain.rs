//! The baseline for BENCHMARKS.md: the same relay-builder relay with no
//! sync engine. Starts, idles 5 s, prints its resident memory and threads.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use grasp_sync_relay_builder::py_relay::{rss_kib, threads};
use nostr_relay_builder::prelude::*;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = MemoryDatabase::with_opts(MemoryDatabaseOptions {
        events: true,
        max_events: None,
    });
    let builder = RelayBuilder::default()
        .addr(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .database(db);
    let relay = LocalRelay::new(builder);
    relay.run().await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    println!("idle: rss_kib={} threads={}", rss_kib(), threads());
    relay.shutdown();
    Ok(())
}
