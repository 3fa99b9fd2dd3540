//! The relay's database as its own clients write to it: each event of
//! `grasp_sync::INDEX_KINDS` it saves is fed to the sync engine, as JSON
//! (the relay is on nostr 0.44, grasp-sync on 0.45). Synced events do not
//! pass here: the sink writes them to the inner database, and the shell
//! feeds the index from what the sink reported stored.

use std::fmt;

use grasp_sync::{INDEX_KINDS, ShellHandle};
use nostr_relay_builder::prelude::*;

/// A [`MemoryDatabase`] that tells the engine what the relay's clients
/// stored.
#[derive(Clone)]
pub struct FedDatabase {
    inner: MemoryDatabase,
    shell: ShellHandle,
}

impl fmt::Debug for FedDatabase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FedDatabase").finish_non_exhaustive()
    }
}

impl FedDatabase {
    /// Feeds what `inner` saves to the engine behind `shell`.
    pub fn new(inner: MemoryDatabase, shell: ShellHandle) -> FedDatabase {
        FedDatabase { inner, shell }
    }
}

impl NostrDatabase for FedDatabase {
    fn backend(&self) -> Backend {
        self.inner.backend()
    }

    fn save_event<'a>(
        &'a self,
        event: &'a Event,
    ) -> BoxedFuture<'a, Result<SaveEventStatus, DatabaseError>> {
        Box::pin(async move {
            let status = self.inner.save_event(event).await?;
            if status.is_success() && INDEX_KINDS.contains(&event.kind.as_u16()) {
                // Our own serialisation of a verified event always parses.
                if let Err(e) = self.shell.feed_json(&event.as_json()) {
                    log::warn!("feeding {}: {e}", event.id);
                }
            }
            Ok(status)
        })
    }

    fn check_id<'a>(
        &'a self,
        event_id: &'a EventId,
    ) -> BoxedFuture<'a, Result<DatabaseEventStatus, DatabaseError>> {
        self.inner.check_id(event_id)
    }

    fn event_by_id<'a>(
        &'a self,
        event_id: &'a EventId,
    ) -> BoxedFuture<'a, Result<Option<Event>, DatabaseError>> {
        self.inner.event_by_id(event_id)
    }

    fn count(&self, filter: Filter) -> BoxedFuture<'_, Result<usize, DatabaseError>> {
        self.inner.count(filter)
    }

    fn query(&self, filter: Filter) -> BoxedFuture<'_, Result<Events, DatabaseError>> {
        self.inner.query(filter)
    }

    fn negentropy_items(
        &self,
        filter: Filter,
    ) -> BoxedFuture<'_, Result<Vec<(EventId, Timestamp)>, DatabaseError>> {
        self.inner.negentropy_items(filter)
    }

    fn delete(&self, filter: Filter) -> BoxedFuture<'_, Result<(), DatabaseError>> {
        self.inner.delete(filter)
    }

    fn wipe(&self) -> BoxedFuture<'_, Result<(), DatabaseError>> {
        self.inner.wipe()
    }
}
