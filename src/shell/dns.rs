//! Name resolution off the event-loop thread.
//!
//! `getaddrinfo` (std's [`ToSocketAddrs`]) blocks, for seconds when a name
//! server is slow or gone, and there is no non-blocking form of it in std. The
//! network shell is one `mio` event loop, so a single lookup on that thread
//! would stall every relay connection. Lookups therefore run on a small pool
//! of worker threads, fed from one shared queue:
//!
//! * the loop queues a job and gets a [`Pending`] back, never blocking; a
//!   full queue is reported as [`ResolveError::QueueFull`];
//! * finished lookups go back on one `mpsc::channel`, and the worker wakes
//!   the loop through the one [`mio::Waker`] it was given; the loop then
//!   drains [`Resolver::try_recv`].
//!
//! One `Mutex` guards the queue. It is held for queue bookkeeping only,
//! never across a lookup, so the loop never waits on a name server.
//!
//! # Hostile names
//!
//! Anyone can announce relay names, and names under a lame delegation take
//! 5 to 20 seconds each to fail. A lookup in flight cannot be cancelled, so
//! the pool keeps such names from starving the rest:
//!
//! * **Cancelled before they start.** Dropping a [`Pending`] (the caller
//!   dropped the connection, e.g. at its deadline) takes its job out of the
//!   queue; a dropped relay's lookup never runs.
//! * **One lookup per zone at a time.** A zone is a name's last two labels
//!   (`*.tarpit.example`); a worker skips jobs whose zone already has a
//!   lookup in flight. Ten thousand names under one lame delegation occupy
//!   one worker, not all of them.
//! * **A slow lane.** A zone whose lookup took [`SLOW_LOOKUP`] or more is
//!   remembered as slow (the last [`SLOW_ZONES_MAX`]); its names wait in the
//!   slow lane, which is served only when no other job is runnable, and by
//!   at most all workers but one, so one worker always serves the rest.
//!
//! What is left: the first lookup in each fresh slow zone still holds a
//! worker until it fails, so many distinct lame zones announced at once
//! slow everyone down for a while (each zone once).
//!
//! # Timeouts are the caller's job
//!
//! The caller arms a timer when it calls [`Resolver::resolve`] and drops
//! the connection (and with it the [`Pending`]) when it fires. The deadline
//! counts from queuing, not from the start of the lookup: with the lanes
//! above an honest name waits only behind other runnable names, so a wait
//! that long means the pool is saturated, and cancelling the lookup then
//! (rather than running it late) is what drains the queue. The `id` comes
//! back in [`Resolved`], so a result that arrives after the connection is
//! gone is recognised as stale (tag ids with a generation) and dropped.
//!
//! Resolved addresses are not yet checked: pass each through
//! [`crate::sans_io::identity::address::is_public`] before connecting.

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use mio::Waker;

/// The function that turns a host and port into addresses. [`Resolver::new`]
/// uses std's blocking `getaddrinfo`; tests inject others through
/// [`Resolver::with_lookup`].
pub(crate) type Lookup = fn(&str, u16) -> io::Result<Vec<SocketAddr>>;

/// A lookup taking this long marks its zone slow.
pub(crate) const SLOW_LOOKUP: Duration = Duration::from_secs(2);
/// Slow zones remembered; past this the memory starts over.
pub(crate) const SLOW_ZONES_MAX: usize = 4096;

/// A finished lookup.
#[derive(Debug)]
pub(crate) struct Resolved {
    /// The id given to [`Resolver::resolve`].
    pub id: u64,
    /// The addresses found (possibly several, of both families, not yet
    /// checked by [`crate::sans_io::identity::address::is_public`]), or why none were.
    pub result: io::Result<Vec<SocketAddr>>,
}

/// Why a lookup was not queued.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ResolveError {
    /// The queue is full; try again later (or give up on the connection
    /// for now).
    QueueFull,
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResolveError::QueueFull => "DNS lookup queue is full",
        })
    }
}

impl std::error::Error for ResolveError {}

/// One queued lookup.
struct Job {
    id: u64,
    host: String,
    port: u16,
    zone: String,
}

/// What the workers share: the queue and what decides which job runs next.
struct Queue {
    jobs: VecDeque<Job>,
    capacity: usize,
    threads: usize,
    /// Zones with a lookup in flight.
    busy: HashSet<String>,
    /// Zones whose lookup was slow, and how many slow-lane lookups run.
    slow: HashSet<String>,
    slow_running: usize,
    /// The [`Resolver`] is gone: workers exit.
    stopped: bool,
}

impl Queue {
    /// Takes the next job a worker may run: the oldest runnable one outside
    /// the slow lane, else the oldest runnable slow one if a worker is left
    /// for the rest. Marks its zone busy; the bool says "slow lane".
    fn take(&mut self) -> Option<(Job, bool)> {
        let runnable = |q: &Queue, j: &Job, slow: bool| {
            !q.busy.contains(&j.zone) && q.slow.contains(&j.zone) == slow
        };
        let fast = self.jobs.iter().position(|j| runnable(self, j, false));
        let slow_room = self.slow_running < self.threads.saturating_sub(1).max(1);
        let slow = || self.jobs.iter().position(|j| runnable(self, j, true));
        let (at, is_slow) = match fast {
            Some(at) => (at, false),
            None if slow_room => (slow()?, true),
            None => return None,
        };
        // `at` is an index `position` just found in `jobs`.
        let job = self.jobs.remove(at).expect("index from position");
        self.busy.insert(job.zone.clone());
        self.slow_running += usize::from(is_slow);
        Some((job, is_slow))
    }

    /// Records a finished lookup of `zone`.
    fn finish(&mut self, zone: &str, was_slow_lane: bool, took: Duration) {
        self.busy.remove(zone);
        self.slow_running -= usize::from(was_slow_lane);
        if took >= SLOW_LOOKUP {
            if self.slow.len() >= SLOW_ZONES_MAX {
                self.slow.clear();
            }
            self.slow.insert(zone.to_owned());
        }
    }
}

/// The queue and the condition workers wait on for a runnable job.
struct Shared {
    queue: Mutex<Queue>,
    runnable: Condvar,
}

impl Shared {
    /// The queue. A panic never happens while it is held (lookups run
    /// outside it), so a poisoned lock still guards consistent state.
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A queued or running lookup. Dropping it cancels the lookup if it has
/// not started yet (one that has runs to its end, its result unsent).
#[derive(Debug)]
#[must_use = "dropping it cancels the lookup"]
pub(crate) struct Pending {
    shared: Weak<Shared>,
    id: u64,
}

impl Pending {
    /// A handle to no lookup: the placeholder of a connection whose lookup
    /// is not queued yet or already answered.
    pub(crate) fn none() -> Pending {
        Pending {
            shared: Weak::new(),
            id: 0,
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.lock().jobs.retain(|j| j.id != self.id);
        }
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Shared")
    }
}

/// A pool of worker threads that run blocking lookups and wake the event
/// loop when one finishes. Owned by the loop thread.
///
/// Dropping it stops the workers without waiting for them: each exits once
/// its current lookup returns (a stuck `getaddrinfo` must not hang shutdown),
/// and lookups still queued are abandoned.
#[derive(Debug)]
pub(crate) struct Resolver {
    shared: Arc<Shared>,
    /// Finished lookups from every worker.
    results: Receiver<Resolved>,
}

impl Resolver {
    /// Starts `threads` workers (at least 1) sharing a queue of
    /// `threads * queue_per_thread` (at least 1 each) pending lookups;
    /// finished lookups wake `waker`. Lookups use std's
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
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                capacity: threads * queue_per_thread,
                threads,
                busy: HashSet::new(),
                slow: HashSet::new(),
                slow_running: 0,
                stopped: false,
            }),
            runnable: Condvar::new(),
        });
        let (result_tx, results) = mpsc::channel();
        let resolver = Resolver {
            shared: Arc::clone(&shared),
            results,
        };
        for n in 0..threads {
            let (shared, result_tx, waker) =
                (Arc::clone(&shared), result_tx.clone(), Arc::clone(&waker));
            // On failure `resolver` is dropped, which stops the workers
            // already started.
            thread::Builder::new()
                .name(format!("grasp-sync-dns-{n}"))
                .spawn(move || worker(&shared, &result_tx, &waker, lookup))?;
        }
        Ok(resolver)
    }

    /// Queues a lookup of `host:port`. `id` is the caller's key (tag it with
    /// a generation): the result carries it back, so a stale result for a
    /// connection that is gone can be recognised and dropped. Keep the
    /// [`Pending`] while the lookup is wanted.
    ///
    /// Never blocks (beyond the queue's lock, which no lookup holds). The
    /// caller arms its own timeout for the lookup.
    pub(crate) fn resolve(&self, id: u64, host: &str, port: u16) -> Result<Pending, ResolveError> {
        let mut queue = self.shared.lock();
        if queue.jobs.len() >= queue.capacity {
            return Err(ResolveError::QueueFull);
        }
        queue.jobs.push_back(Job {
            id,
            host: host.to_owned(),
            port,
            zone: zone(host),
        });
        drop(queue);
        self.shared.runnable.notify_one();
        Ok(Pending {
            shared: Arc::downgrade(&self.shared),
            id,
        })
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
    /// Stops the workers without joining them: queued lookups are dropped
    /// and idle workers woken to exit; a worker in a lookup exits when it
    /// returns (dropping the result receiver, right after this, makes its
    /// send fail). A `getaddrinfo` stuck for a minute must not hang shutdown.
    fn drop(&mut self) {
        let mut queue = self.shared.lock();
        queue.stopped = true;
        queue.jobs.clear();
        drop(queue);
        self.shared.runnable.notify_all();
    }
}

/// The zone a name's lookups are grouped by: its last two labels,
/// lower-cased (`a.b.tarpit.example` is `tarpit.example`). Under a public
/// suffix like `co.uk` unrelated names share a zone; they only resolve one
/// at a time, never fail for it.
fn zone(host: &str) -> String {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let mut dots = host.rmatch_indices('.').map(|(i, _)| i);
    match (dots.next(), dots.next()) {
        (Some(_), Some(second)) => host[second + 1..].to_owned(),
        _ => host,
    }
}

/// std's blocking lookup (`getaddrinfo`).
fn system_lookup(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    Ok((host, port).to_socket_addrs()?.collect())
}

/// A worker: runs lookups from the queue until the [`Resolver`] is gone.
fn worker(shared: &Shared, results: &Sender<Resolved>, waker: &Waker, lookup: Lookup) {
    while let Some((
        Job {
            id,
            host,
            port,
            zone,
        },
        slow_lane,
    )) = next_job(shared)
    {
        let started = Instant::now();
        // A panicking lookup fails that lookup, not the worker. Nothing is
        // shared with the lookup but its arguments, so nothing is left
        // half-updated.
        let result = panic::catch_unwind(AssertUnwindSafe(|| lookup(&host, port)))
            .unwrap_or_else(|_| Err(io::Error::other("DNS lookup panicked")));
        shared.lock().finish(&zone, slow_lane, started.elapsed());
        shared.runnable.notify_all();
        if results.send(Resolved { id, result }).is_err() {
            // The Resolver is gone; nobody wants the rest.
            break;
        }
        if let Err(e) = waker.wake() {
            log::warn!("DNS worker could not wake the event loop: {e}");
        }
    }
}

/// Waits for a job this worker may run; `None` once the resolver stopped.
fn next_job(shared: &Shared) -> Option<(Job, bool)> {
    let mut queue = shared.lock();
    loop {
        if queue.stopped {
            return None;
        }
        if let Some(taken) = queue.take() {
            return Some(taken);
        }
        queue = shared
            .runnable
            .wait(queue)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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

    fn ids(results: Vec<Resolved>) -> Vec<u64> {
        let mut ids: Vec<u64> = results.into_iter().map(|r| r.id).collect();
        ids.sort_unstable();
        ids
    }

    /// Gates for lookups that block until released, one per test (tests
    /// run in parallel). `ENTERED[G]` counts lookups that started.
    static RELEASED: [AtomicBool; 4] = [const { AtomicBool::new(false) }; 4];
    static ENTERED: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

    /// Blocks on gate `G` when the host starts with "stuck"; other hosts
    /// answer at once with 192.0.2.1.
    fn gated<const G: usize>(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        if !host.starts_with("stuck") {
            return Ok(vec![SocketAddr::from(([192, 0, 2, 1], port))]);
        }
        ENTERED[G].fetch_add(1, Ordering::SeqCst);
        while !RELEASED[G].load(Ordering::SeqCst) {
            thread::park_timeout(Duration::from_millis(1));
        }
        Err(io::Error::new(io::ErrorKind::TimedOut, "released"))
    }

    /// A lame delegation: names under `tarpit.example` block on gate `G`
    /// (like a lookup that takes seconds); others answer at once.
    fn tarpit<const G: usize>(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        if !host.ends_with(".tarpit.example") {
            return Ok(vec![SocketAddr::from(([192, 0, 2, 7], port))]);
        }
        ENTERED[G].fetch_add(1, Ordering::SeqCst);
        while !RELEASED[G].load(Ordering::SeqCst) {
            thread::park_timeout(Duration::from_millis(1));
        }
        Err(io::Error::new(io::ErrorKind::TimedOut, "lame delegation"))
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
        let _a = resolver.resolve(41, "localhost", 7777).unwrap();
        let _b = resolver.resolve(u64::MAX, "127.0.0.1", 80).unwrap();
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
        let want: Vec<u64> = (0..20).map(|i| (i << 32) | 5).collect();
        let _held: Vec<Pending> = want
            .iter()
            .map(|&id| resolver.resolve(id, "fast", 9).unwrap())
            .collect();
        let got = wait_for(&mut poll, &resolver, want.len());
        for r in &got {
            let addrs = r.result.as_ref().unwrap();
            assert_eq!(addrs, &[SocketAddr::from(([192, 0, 2, 1], 9))]);
        }
        assert_eq!(ids(got), want);
    }

    #[test]
    fn a_full_queue_is_refused_without_blocking() {
        let (mut poll, waker) = poll_and_waker();
        // Room for two queued lookups beside the two running.
        let resolver = Resolver::with_lookup(2, 1, waker, gated::<0>).unwrap();
        let _one = resolver.resolve(1, "stuck.one", 1).unwrap();
        let _two = resolver.resolve(2, "stuck.two", 1).unwrap();
        wait_until(|| ENTERED[0].load(Ordering::SeqCst) == 2);
        let _three = resolver.resolve(3, "stuck.three", 1).unwrap();
        let four = resolver.resolve(4, "stuck.four", 1).unwrap();
        let started = Instant::now();
        assert_eq!(
            resolver.resolve(5, "fast", 1).unwrap_err(),
            ResolveError::QueueFull
        );
        assert!(started.elapsed() < Duration::from_secs(1));
        // Cancelling a queued lookup makes room at once.
        drop(four);
        let _six = resolver.resolve(6, "fast", 1).unwrap();

        RELEASED[0].store(true, Ordering::SeqCst);
        assert_eq!(ids(wait_for(&mut poll, &resolver, 4)), [1, 2, 3, 6]);
    }

    /// Two hundred announced tarpit names queued first must not hold up
    /// honest names queued after them: those resolve while the tarpit
    /// names still wait.
    #[test]
    fn honest_names_resolve_promptly_behind_tarpit_names() {
        let (mut poll, waker) = poll_and_waker();
        let resolver = Resolver::with_lookup(2, 128, waker, tarpit::<2>).unwrap();
        let tarpits: Vec<Pending> = (0..200)
            .map(|i| {
                let name = format!("n{i}.tarpit.example");
                resolver.resolve(i, &name, 443).unwrap()
            })
            .collect();
        let started = Instant::now();
        let _honest: Vec<Pending> = (0..5)
            .map(|i| {
                let name = format!("relay{i}.example");
                resolver.resolve(1000 + i, &name, 443).unwrap()
            })
            .collect();
        let got = wait_for(&mut poll, &resolver, 5);
        assert_eq!(ids(got), [1000, 1001, 1002, 1003, 1004]);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(ENTERED[2].load(Ordering::SeqCst) < 200, "tarpit names wait");
        drop(tarpits);
        RELEASED[2].store(true, Ordering::SeqCst);
    }

    /// Lookups of dropped connections are taken out of the queue: released
    /// workers never run them.
    #[test]
    fn dropped_lookups_never_start() {
        let (mut poll, waker) = poll_and_waker();
        let resolver = Resolver::with_lookup(1, 64, waker, gated::<3>).unwrap();
        let _running = resolver.resolve(0, "stuck.running", 1).unwrap();
        wait_until(|| ENTERED[3].load(Ordering::SeqCst) == 1);
        let dropped: Vec<Pending> = (1..=50)
            .map(|i| resolver.resolve(i, &format!("stuck.z{i}"), 1).unwrap())
            .collect();
        let _wanted = resolver.resolve(99, "fast", 1).unwrap();
        drop(dropped);
        RELEASED[3].store(true, Ordering::SeqCst);
        assert_eq!(ids(wait_for(&mut poll, &resolver, 2)), [0, 99]);
        assert_eq!(
            ENTERED[3].load(Ordering::SeqCst),
            1,
            "no dropped lookup ran"
        );
    }

    /// A zone seen slow waits in the slow lane: other names go first, and
    /// slow lookups never take the last worker.
    #[test]
    fn slow_zones_wait_in_a_lane_that_leaves_a_worker_free() {
        let job = |id, host: &str| Job {
            id,
            host: host.to_owned(),
            port: 1,
            zone: zone(host),
        };
        let mut queue = Queue {
            jobs: VecDeque::new(),
            capacity: 8,
            threads: 2,
            busy: HashSet::new(),
            slow: HashSet::new(),
            slow_running: 0,
            stopped: false,
        };
        queue.finish("tarpit.example", false, SLOW_LOOKUP);
        queue.finish("lame.example", false, SLOW_LOOKUP);
        queue.finish("relay.example", false, Duration::from_millis(50));
        queue.jobs.extend([
            job(1, "a.tarpit.example"),
            job(2, "b.lame.example"),
            job(3, "wss.relay.example"),
        ]);
        let (first, slow) = queue.take().unwrap();
        assert_eq!((first.id, slow), (3, false), "the fast lane first");
        let (second, slow) = queue.take().unwrap();
        assert_eq!((second.id, slow), (1, true));
        assert!(queue.take().is_none(), "one worker stays for the rest");
        queue.finish(&second.zone, true, SLOW_LOOKUP);
        assert_eq!(queue.take().unwrap().0.id, 2);
    }

    #[test]
    fn zones_are_the_last_two_labels() {
        assert_eq!(zone("n1.Tarpit.Example."), "tarpit.example");
        assert_eq!(zone("relay.example"), "relay.example");
        assert_eq!(zone("localhost"), "localhost");
    }

    #[test]
    fn failing_lookup_returns_err() {
        let (mut poll, waker) = poll_and_waker();
        let resolver = Resolver::with_lookup(1, 2, waker, failing).unwrap();
        let _p = resolver.resolve(3, "nowhere.invalid", 443).unwrap();
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
        let _a = resolver.resolve(1, "a", 1).unwrap();
        let _b = resolver.resolve(2, "b", 1).unwrap();
        let got = wait_for(&mut poll, &resolver, 2);
        assert!(got.iter().all(|r| r.result.is_err()));
        // The worker survived.
        let _c = resolver.resolve(3, "c", 1).unwrap();
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
        let resolver = Resolver::with_lookup(2, 3, Arc::clone(&waker), gated::<1>).unwrap();
        let held: Vec<Pending> = (0..6)
            .map(|i| resolver.resolve(i, &format!("stuck.z{i}"), 1).unwrap())
            .collect();
        // Both workers stuck, four more lookups queued.
        wait_until(|| ENTERED[1].load(Ordering::SeqCst) == 2);
        let started = Instant::now();
        drop(resolver);
        drop(held);
        assert!(started.elapsed() < Duration::from_secs(1));

        // Once released, each worker exits after its current lookup rather
        // than working through the queue, dropping its handle on the waker.
        RELEASED[1].store(true, Ordering::SeqCst);
        wait_until(|| Arc::strong_count(&waker) == 1);
        assert_eq!(ENTERED[1].load(Ordering::SeqCst), 2);
    }
}
