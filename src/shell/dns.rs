//! Name resolution off the event-loop thread.
//!
//! `getaddrinfo` (std's [`ToSocketAddrs`]) blocks, for seconds when a name
//! server is slow or gone, and there is no non-blocking form of it in std. The
//! network shell is one `mio` event loop, so a single lookup on that thread
//! would stall every relay connection. Lookups therefore run on a small pool
//! of worker threads:
//!
//! * each worker owns a bounded job queue (`mpsc::sync_channel`); the loop
//!   hands out jobs round-robin with `try_send`, so queuing never blocks and
//!   a full pool is reported as [`ResolveError::QueueFull`] instead;
//! * finished lookups go back on one shared `mpsc::channel`, and the worker
//!   wakes the loop through the one [`mio::Waker`] it was given; the loop
//!   then drains [`Resolver::try_recv`].
//!
//! No locks: channels and a `Cell` only.
//!
//! # Timeouts are the caller's job
//!
//! A lookup cannot be cancelled: `getaddrinfo` runs to its own timeout. The
//! caller arms a timer (from its timer wheel) when it calls
//! [`Resolver::resolve`] and gives up on the connection when it fires. The
//! `id` it passed comes back in [`Resolved`], so a result that arrives after
//! the timeout, or after the connection is gone, is recognised as stale (tag
//! ids with a generation) and dropped. A stuck lookup keeps its worker busy;
//! the other workers keep serving, and once every queue is full `resolve`
//! says so.
//!
//! Resolved addresses are not yet checked: pass each through
//! [`crate::sans_io::address::is_public`] before connecting.

use std::cell::Cell;
use std::fmt;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TrySendError};
use std::thread;

use mio::Waker;

/// The function that turns a host and port into addresses. [`Resolver::new`]
/// uses std's blocking `getaddrinfo`; tests inject others through
/// [`Resolver::with_lookup`].
pub(crate) type Lookup = fn(&str, u16) -> io::Result<Vec<SocketAddr>>;

/// A finished lookup.
#[derive(Debug)]
pub(crate) struct Resolved {
    /// The id given to [`Resolver::resolve`].
    pub id: u64,
    /// The addresses found (possibly several, of both families, not yet
    /// checked by [`crate::sans_io::address::is_public`]), or why none were.
    pub result: io::Result<Vec<SocketAddr>>,
}

/// Why a lookup was not queued.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ResolveError {
    /// Every worker's queue is full; try again later (or give up on the
    /// connection for now).
    QueueFull,
    /// No worker is running any more.
    Stopped,
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResolveError::QueueFull => "DNS lookup queues are full",
            ResolveError::Stopped => "DNS workers have stopped",
        })
    }
}

impl std::error::Error for ResolveError {}

/// One queued lookup.
struct Job {
    id: u64,
    host: String,
    port: u16,
}

/// A pool of worker threads that run blocking lookups and wake the event
/// loop when one finishes. Owned by the loop thread (it is `Send`, not
/// `Sync`).
///
/// Dropping it stops the workers without waiting for them: each exits once
/// its current lookup returns (a stuck `getaddrinfo` must not hang shutdown),
/// and lookups still queued are abandoned.
#[derive(Debug)]
pub(crate) struct Resolver {
    /// One bounded job queue per worker.
    jobs: Vec<SyncSender<Job>>,
    /// Finished lookups from every worker.
    results: Receiver<Resolved>,
    /// The worker whose queue is tried first by the next `resolve`.
    next: Cell<usize>,
}

impl Resolver {
    /// Starts `threads` workers (at least 1), each with a queue of
    /// `queue_per_thread` (at least 1) pending lookups beside the one it is
    /// running; finished lookups wake `waker`. Lookups use std's
    /// `(host, port).to_socket_addrs()`, i.e. `getaddrinfo`.
    ///
    /// Fails with `InvalidInput` on a zero count, or when a thread cannot be
    /// spawned.
    pub(crate) fn new(
        threads: usize,
        queue_per_thread: usize,
        waker: Arc<Waker>,
    ) -> io::Result<Resolver> {
        Resolver::with_lookup(threads, queue_per_thread, waker, system_lookup)
    }

    /// [`Resolver::new`] with another lookup function, so tests can inject a
    /// slow or failing resolver.
    pub(crate) fn with_lookup(
        threads: usize,
        queue_per_thread: usize,
        waker: Arc<Waker>,
        lookup: Lookup,
    ) -> io::Result<Resolver> {
        if threads == 0 || queue_per_thread == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "DNS resolver needs at least one thread and a queue of at least one",
            ));
        }
        let (result_tx, results) = mpsc::channel();
        let mut jobs = Vec::with_capacity(threads);
        for n in 0..threads {
            let (job_tx, job_rx) = mpsc::sync_channel(queue_per_thread);
            let result_tx = result_tx.clone();
            let waker = Arc::clone(&waker);
            // On failure the workers already started see their job queue
            // dropped with `jobs` and exit.
            thread::Builder::new()
                .name(format!("grasp-sync-dns-{n}"))
                .spawn(move || worker(job_rx, result_tx, waker, lookup))?;
            jobs.push(job_tx);
        }
        Ok(Resolver {
            jobs,
            results,
            next: Cell::new(0),
        })
    }

    /// Queues a lookup of `host:port`. `id` is the caller's key (tag it with
    /// a generation): the result carries it back, so a stale result for a
    /// connection that is gone can be recognised and dropped.
    ///
    /// Never blocks. Workers are tried round-robin; a full queue passes the
    /// job to the next one, and [`ResolveError::QueueFull`] means every
    /// queue is full. The caller arms its own timeout for the lookup.
    pub(crate) fn resolve(&self, id: u64, host: &str, port: u16) -> Result<(), ResolveError> {
        let count = self.jobs.len();
        let start = self.next.get();
        let mut job = Job {
            id,
            host: host.to_owned(),
            port,
        };
        let mut full = false;
        for i in 0..count {
            let n = (start + i) % count;
            match self.jobs[n].try_send(job) {
                Ok(()) => {
                    self.next.set((n + 1) % count);
                    return Ok(());
                }
                Err(TrySendError::Full(back)) => {
                    full = true;
                    job = back;
                }
                Err(TrySendError::Disconnected(back)) => job = back,
            }
        }
        if full {
            Err(ResolveError::QueueFull)
        } else {
            Err(ResolveError::Stopped)
        }
    }

    /// A finished lookup, if any. Never blocks.
    ///
    /// Wake-ups coalesce (several results may arrive behind one wake), so on
    /// the waker's token call this until it returns `None`.
    pub(crate) fn try_recv(&self) -> Option<Resolved> {
        self.results.try_recv().ok()
    }
}

impl Drop for Resolver {
    /// Stops the workers without joining them. Dropping the job senders ends
    /// each worker's `recv` loop; dropping the result receiver (right after
    /// this) makes a worker that finishes its current lookup exit instead of
    /// working through what is still queued. The threads are detached: a
    /// `getaddrinfo` stuck for a minute must not hang shutdown.
    fn drop(&mut self) {
        self.jobs.clear();
    }
}

/// std's blocking lookup (`getaddrinfo`).
fn system_lookup(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    Ok((host, port).to_socket_addrs()?.collect())
}

/// A worker: runs lookups from its queue until the [`Resolver`] is gone.
fn worker(jobs: Receiver<Job>, results: Sender<Resolved>, waker: Arc<Waker>, lookup: Lookup) {
    while let Ok(Job { id, host, port }) = jobs.recv() {
        // A panicking lookup fails that lookup, not the worker. Nothing is
        // shared with the lookup but its arguments, so nothing is left
        // half-updated.
        let result = panic::catch_unwind(AssertUnwindSafe(|| lookup(&host, port)))
            .unwrap_or_else(|_| Err(io::Error::other("DNS lookup panicked")));
        if results.send(Resolved { id, result }).is_err() {
            // The Resolver is gone; nobody wants the rest.
            break;
        }
        if let Err(e) = waker.wake() {
            log::warn!("DNS worker could not wake the event loop: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use mio::{Events, Poll, Token};

    const WAKE: Token = Token(7);
    const DEADLINE: Duration = Duration::from_secs(5);

    fn poll_and_waker() -> (Poll, Arc<Waker>) {
        let poll = Poll::new().unwrap();
        let waker = Arc::new(Waker::new(poll.registry(), WAKE).unwrap());
        (poll, waker)
    }

    /// Polls until `n` results have arrived, asserting that each batch was
    /// announced by the waker. Panics after [`DEADLINE`].
    fn wait_for(poll: &mut Poll, resolver: &Resolver, n: usize) -> Vec<Resolved> {
        let deadline = Instant::now() + DEADLINE;
        let mut events = Events::with_capacity(8);
        let mut got = Vec::new();
        while got.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "only {} of {n} results", got.len());
            poll.poll(&mut events, Some(left)).unwrap();
            if events.iter().any(|e| e.token() == WAKE) {
                got.extend(std::iter::from_fn(|| resolver.try_recv()));
            }
        }
        got
    }

    /// Polls `cond` until it holds. Panics after [`DEADLINE`].
    fn wait_until(cond: impl Fn() -> bool) {
        let deadline = Instant::now() + DEADLINE;
        while !cond() {
            assert!(Instant::now() < deadline, "condition not reached in time");
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// Gates for lookups that block until released, one per test (tests
    /// run in parallel). `ENTERED[G]` counts lookups that started.
    static RELEASED: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];
    static ENTERED: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

    /// Blocks on gate `G` when the host is "stuck"; other hosts answer at
    /// once with 192.0.2.1.
    fn gated<const G: usize>(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        if host != "stuck" {
            return Ok(vec![SocketAddr::from(([192, 0, 2, 1], port))]);
        }
        ENTERED[G].fetch_add(1, Ordering::SeqCst);
        while !RELEASED[G].load(Ordering::SeqCst) {
            thread::park_timeout(Duration::from_millis(1));
        }
        Err(io::Error::new(io::ErrorKind::TimedOut, "released"))
    }

    fn failing(_: &str, _: u16) -> io::Result<Vec<SocketAddr>> {
        Err(io::Error::new(io::ErrorKind::NotFound, "no such host"))
    }

    fn panicking(_: &str, _: u16) -> io::Result<Vec<SocketAddr>> {
        panic!("lookup bug")
    }

    #[test]
    fn resolves_and_wakes_the_loop() {
        let (mut poll, waker) = poll_and_waker();
        let resolver = Resolver::new(2, 4, waker).unwrap();
        resolver.resolve(41, "localhost", 7777).unwrap();
        resolver.resolve(u64::MAX, "127.0.0.1", 80).unwrap();
        let mut got = wait_for(&mut poll, &resolver, 2);
        got.sort_by_key(|r| r.id);
        assert_eq!(got[0].id, 41);
        assert_eq!(got[1].id, u64::MAX);
        let localhost = got[0].result.as_ref().unwrap();
        assert!(!localhost.is_empty());
        assert!(
            localhost
                .iter()
                .all(|a| a.ip().is_loopback() && a.port() == 7777)
        );
        let literal = got[1].result.as_ref().unwrap();
        assert_eq!(literal, &[SocketAddr::from(([127, 0, 0, 1], 80))]);
        assert!(resolver.try_recv().is_none());
    }

    #[test]
    fn results_carry_the_ids_given() {
        let (mut poll, waker) = poll_and_waker();
        let resolver = Resolver::with_lookup(3, 8, waker, gated::<0>).unwrap();
        let ids: Vec<u64> = (0..20).map(|i| (i << 32) | 5).collect();
        for &id in &ids {
            resolver.resolve(id, "fast", 9).unwrap();
        }
        let mut got: Vec<u64> = wait_for(&mut poll, &resolver, ids.len())
            .into_iter()
            .map(|r| {
                assert_eq!(r.result.unwrap(), [SocketAddr::from(([192, 0, 2, 1], 9))]);
                r.id
            })
            .collect();
        got.sort_unstable();
        assert_eq!(got, ids);
    }

    #[test]
    fn full_queues_are_refused_without_blocking() {
        let (mut poll, waker) = poll_and_waker();
        let resolver = Resolver::with_lookup(2, 1, waker, gated::<0>).unwrap();
        // Each step waits until the workers have taken what they were given,
        // so the queues hold exactly what the comments say.
        resolver.resolve(1, "stuck", 1).unwrap(); // worker 0 runs it
        wait_until(|| ENTERED[0].load(Ordering::SeqCst) == 1);
        resolver.resolve(2, "fast", 1).unwrap(); // worker 1 answers it
        assert_eq!(wait_for(&mut poll, &resolver, 1)[0].id, 2);
        resolver.resolve(3, "stuck", 1).unwrap(); // queued behind worker 0
        resolver.resolve(4, "stuck", 1).unwrap(); // worker 1 runs it
        wait_until(|| ENTERED[0].load(Ordering::SeqCst) == 2);

        // Round-robin starts at worker 0, whose queue is full: worker 1 takes it.
        let started = Instant::now();
        resolver.resolve(5, "stuck", 1).unwrap();
        // Now both queues are full and both workers stuck.
        assert_eq!(resolver.resolve(6, "fast", 1), Err(ResolveError::QueueFull));
        assert_eq!(resolver.resolve(7, "fast", 1), Err(ResolveError::QueueFull));
        assert!(started.elapsed() < Duration::from_secs(1));

        RELEASED[0].store(true, Ordering::SeqCst);
        let mut done: Vec<_> = wait_for(&mut poll, &resolver, 4)
            .into_iter()
            .map(|r| {
                assert_eq!(r.result.unwrap_err().kind(), io::ErrorKind::TimedOut);
                r.id
            })
            .collect();
        done.sort_unstable();
        assert_eq!(done, [1, 3, 4, 5]);
        // Room again.
        resolver.resolve(8, "fast", 1).unwrap();
        assert_eq!(wait_for(&mut poll, &resolver, 1)[0].id, 8);
    }

    #[test]
    fn failing_lookup_returns_err() {
        let (mut poll, waker) = poll_and_waker();
        let resolver = Resolver::with_lookup(1, 2, waker, failing).unwrap();
        resolver.resolve(3, "nowhere.invalid", 443).unwrap();
        let got = wait_for(&mut poll, &resolver, 1);
        assert_eq!(got[0].id, 3);
        assert_eq!(
            got[0].result.as_ref().unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn panicking_lookup_fails_that_lookup_only() {
        let (mut poll, waker) = poll_and_waker();
        let resolver = Resolver::with_lookup(1, 2, waker, panicking).unwrap();
        resolver.resolve(1, "a", 1).unwrap();
        resolver.resolve(2, "b", 1).unwrap();
        let got = wait_for(&mut poll, &resolver, 2);
        assert!(got.iter().all(|r| r.result.is_err()));
        // The worker survived.
        resolver.resolve(3, "c", 1).unwrap();
        assert_eq!(wait_for(&mut poll, &resolver, 1)[0].id, 3);
    }

    #[test]
    fn zero_threads_or_queue_is_invalid() {
        let (_poll, waker) = poll_and_waker();
        for (threads, queue) in [(0, 1), (1, 0)] {
            let err = Resolver::new(threads, queue, Arc::clone(&waker)).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        }
    }

    #[test]
    fn drop_does_not_wait_for_stuck_workers() {
        let (_poll, waker) = poll_and_waker();
        let resolver = Resolver::with_lookup(2, 2, Arc::clone(&waker), gated::<1>).unwrap();
        resolver.resolve(0, "stuck", 1).unwrap();
        resolver.resolve(1, "stuck", 1).unwrap();
        wait_until(|| ENTERED[1].load(Ordering::SeqCst) == 2);
        // Both workers stuck, two more lookups queued behind each.
        for id in 2..6 {
            resolver.resolve(id, "stuck", 1).unwrap();
        }
        let started = Instant::now();
        drop(resolver);
        assert!(started.elapsed() < Duration::from_secs(1));

        // Once released, each worker exits after its current lookup rather
        // than working through its queue, dropping its handle on the waker.
        RELEASED[1].store(true, Ordering::SeqCst);
        wait_until(|| Arc::strong_count(&waker) == 1);
        assert_eq!(ENTERED[1].load(Ordering::SeqCst), 2);
    }
}
