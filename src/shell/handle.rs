//! The shell as other threads see it: a [`ShellHandle`] queues a
//! [`Command`] on a channel and wakes the loop through the mio `Waker`,
//! so the loop, which owns every socket and the engine, never shares them.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};

use mio::Waker;
use nostr::prelude::Event;

/// Requests from other threads.
pub(super) enum Command {
    /// An event the embedding relay accepted.
    Feed(Box<Event>),
    /// Stop: no new work, flush the outbox.
    Shutdown,
}

/// A cloneable handle to a running shell, usable from any thread.
#[derive(Clone)]
pub struct ShellHandle {
    tx: Sender<Command>,
    waker: Arc<Waker>,
}

impl ShellHandle {
    /// A handle that wakes the loop through `waker`, and the receiving end
    /// the loop drains when woken.
    pub(super) fn new(waker: Arc<Waker>) -> (ShellHandle, Receiver<Command>) {
        let (tx, commands) = channel();
        (ShellHandle { tx, waker }, commands)
    }

    /// Feeds an event the embedding relay accepted (instead of the self-subscription).
    pub fn feed(&self, event: Event) {
        if self.tx.send(Command::Feed(Box::new(event))).is_ok() {
            let _ = self.waker.wake();
        }
    }

    /// Asks the shell to stop: no new work, outbox flushed within the deadline.
    pub fn shutdown(&self) {
        if self.tx.send(Command::Shutdown).is_ok() {
            let _ = self.waker.wake();
        }
    }
}
