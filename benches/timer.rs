//! `grasp_sync::internal::TimerWheel` against a `BinaryHeap` with lazy
//! deletion (a `HashSet` of cancelled ids), at 1k / 10k / 100k live timers:
//! insert N, cancel half, then advance through all of them (poll until
//! empty, jumping `now` to the next deadline each time).
//!
//! Deadlines are spread like the engine's: batch windows and connect
//! timeouts (ms to 30 s), keepalives and EOSE timeouts (60-120 s), reconnect
//! backoff (5 s to 1 h) and daily fresh syncs (23-25 h). Throughput is per
//! timer, so a flat time per element across sizes means O(1) per timer.

mod common;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::hint::black_box;

use common::Rng;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use grasp_sync::internal::TimerWheel;

const NOW: u64 = 1_700_000_000_000;
const SEC: u64 = 1_000;

/// Deadline offsets (ms) for `n` timers.
fn offsets(n: usize, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| match rng.below(10) {
            0 | 1 => rng.between(1, 5 * SEC),
            2 => rng.between(5 * SEC, 30 * SEC),
            3..=5 => rng.between(60 * SEC, 120 * SEC),
            6 | 7 => rng.between(5 * SEC, 3_600 * SEC),
            _ => rng.between(23 * 3_600 * SEC, 25 * 3_600 * SEC),
        })
        .collect()
}

fn wheel_run(offsets: &[u64]) -> u64 {
    let mut wheel = TimerWheel::new(NOW);
    let ids: Vec<_> = offsets
        .iter()
        .enumerate()
        .map(|(i, &off)| wheel.insert(NOW + off, i as u64))
        .collect();
    for id in ids.iter().step_by(2) {
        wheel.cancel(*id);
    }
    let mut fired = 0;
    while let Some(now) = wheel.next_deadline() {
        while let Some((_, value)) = wheel.poll_expired(now) {
            fired += black_box(value) & 1;
        }
    }
    fired
}

fn heap_run(offsets: &[u64]) -> u64 {
    let mut heap = BinaryHeap::new();
    let mut cancelled = HashSet::new();
    for (i, &off) in offsets.iter().enumerate() {
        heap.push(Reverse((NOW + off, i as u64)));
    }
    for i in (0..offsets.len() as u64).step_by(2) {
        cancelled.insert(i);
    }
    let mut fired = 0;
    // Jump to the next live deadline and fire everything due then.
    while let Some(Reverse((deadline, id))) = heap.pop() {
        if cancelled.remove(&id) {
            continue;
        }
        let now = deadline;
        fired += black_box(id) & 1;
        while let Some(&Reverse((d, next))) = heap.peek() {
            if d > now {
                break;
            }
            heap.pop();
            if !cancelled.remove(&next) {
                fired += black_box(next) & 1;
            }
        }
    }
    fired
}

fn bench_timer(c: &mut Criterion) {
    let mut group = c.benchmark_group("timers_insert_cancel_half_drain");
    for n in [1_000usize, 10_000, 100_000] {
        let offsets = offsets(n, n as u64);
        assert_eq!(wheel_run(&offsets), heap_run(&offsets), "same timers fire");
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("wheel", n), &offsets, |b, o| {
            b.iter(|| wheel_run(o))
        });
        group.bench_with_input(BenchmarkId::new("heap_lazy_delete", n), &offsets, |b, o| {
            b.iter(|| heap_run(o))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_timer);
criterion_main!(benches);
