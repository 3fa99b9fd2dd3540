//! A `nostr-relay-builder` 0.44 relay with grasp-sync embedded: the proof
//! that a relay on another nostr version can embed the engine through its
//! JSON edge, with back-pressure from a slow store.
//!
//! - The relay is a [`LocalRelay`] over an in-memory store.
//! - grasp-sync runs on its own thread (`Shell::spawn`); synced events go
//!   to a [`QueueSink`](queue_sink::QueueSink) (a bounded queue to a tokio
//!   writer, `Full` when it is full), listings are answered later from the
//!   store.
//! - What the relay's own clients store reaches the engine through the
//!   database ([`FedDatabase`](fed_database::FedDatabase)); what the
//!   relay already holds is replayed at start.

pub mod fed_database;
pub mod py_relay;
pub mod queue_sink;
pub mod scenario;

use std::error::Error;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;

use grasp_sync::{Config, INDEX_KINDS, Shell, ShellHandle, ShellOptions, SinkTarget};
use nostr_relay_builder::prelude::*;

use crate::fed_database::FedDatabase;
use crate::queue_sink::{SinkCounters, queue_sink};

/// How the relay is set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// Synced events waiting for the writer at most.
    pub queue: usize,
    /// Events the writer stores a second at most (`None`: as fast as it can).
    pub store_rate: Option<u32>,
    /// Relays grasp-sync always reads for discovery.
    pub bootstrap: Vec<String>,
    /// Connect to relays on loopback and private addresses (tests).
    pub allow_private_addresses: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            queue: 256,
            store_rate: None,
            bootstrap: Vec::new(),
            allow_private_addresses: false,
        }
    }
}

/// The relay and the sync engine inside it.
pub struct EmbeddedRelay {
    /// The relay's URL.
    pub url: String,
    /// The relay.
    pub relay: LocalRelay,
    /// Its store.
    pub db: MemoryDatabase,
    /// The sync engine's handle.
    pub shell: ShellHandle,
    /// What the sink and its writer did.
    pub counters: Arc<SinkCounters>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl EmbeddedRelay {
    /// Starts the relay on 127.0.0.1 and the engine syncing into it; call
    /// from a tokio runtime (the writer and the lister are its tasks).
    pub async fn start(opts: Options) -> Result<EmbeddedRelay, Box<dyn Error>> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let url = format!("ws://127.0.0.1:{port}");
        let db = MemoryDatabase::with_opts(MemoryDatabaseOptions {
            events: true,
            max_events: None,
        });
        let counters = Arc::new(SinkCounters::default());
        let (sink, workers) = queue_sink(opts.queue, counters.clone());
        let mut config = Config::new(url.clone());
        // The relay feeds what its clients store instead.
        config.self_subscribe = false;
        config.bootstrap = opts.bootstrap;
        config.allow_private_addresses = opts.allow_private_addresses;
        let shell = Shell::new(config, ShellOptions::default(), SinkTarget::json(sink))?;
        let (handle, thread) = shell.spawn()?;
        let builder = RelayBuilder::default()
            .addr(IpAddr::V4(Ipv4Addr::LOCALHOST))
            .port(port)
            .database(FedDatabase::new(db.clone(), handle.clone()));
        let relay = LocalRelay::new(builder);
        relay.run().await?;
        workers.spawn(db.clone(), relay.clone(), handle.clone(), opts.store_rate);
        // What the relay already holds, in one call (empty for a new store).
        let held = db
            .query(Filter::new().kinds(INDEX_KINDS.map(Kind::from)))
            .await?;
        let texts: Vec<String> = held.iter().map(|e| e.as_json()).collect();
        handle.replay_json(texts.iter().map(String::as_str))?;
        Ok(EmbeddedRelay {
            url,
            relay,
            db,
            shell: handle,
            counters,
            thread: Some(thread),
        })
    }

    /// Stops the engine (its sink flushed into the queue) and the relay.
    pub fn shutdown(mut self) -> std::io::Result<()> {
        self.shell.shutdown();
        let result = match self.thread.take() {
            Some(thread) => thread
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("sync thread panicked"))),
            None => Ok(()),
        };
        self.relay.shutdown();
        result
    }
}
