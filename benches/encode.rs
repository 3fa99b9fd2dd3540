//! Encoding one packed REQ of 20 filters × 100 values (the engine's default
//! limits): `grasp_sync::internal::req_message` against nostr's
//! `ClientMessage::req(..).as_json()`.
//!
//! - `req_message`: the engine's encoder.
//! - `nostr_client_message_req`: `ClientMessage::req(id, filters)` built
//!   from owned filters (the clone happens in untimed setup), then `as_json`.
//! - `nostr_client_message_borrowed`: the same message holding borrowed
//!   filters, so only serialization is timed.

mod common;

use std::borrow::Cow;
use std::hint::black_box;

use common::Rng;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use grasp_sync::internal::req_message;
use nostr::prelude::*;

const FILTERS: usize = 20;
const VALUES: usize = 100;
const SUB: &str = "1f";

/// Filters as the engine packs them: root ids under `e`, `E` and `q`, and
/// repo refs under `a`, `A`, `q` (and `d` for 30618), each with a limit.
fn filters() -> Vec<Filter> {
    let mut rng = Rng::new(7);
    let letters = [
        SingleLetterTag::LOWERCASE_E,
        SingleLetterTag::UPPERCASE_E,
        SingleLetterTag::LOWERCASE_Q,
        SingleLetterTag::LOWERCASE_A,
        SingleLetterTag::UPPERCASE_A,
    ];
    (0..FILTERS)
        .map(|i| {
            let letter = letters[i % letters.len()];
            let values: Vec<String> = (0..VALUES)
                .map(|_| {
                    let mut id = [0u8; 32];
                    for chunk in id.chunks_mut(8) {
                        chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
                    }
                    let hex = EventId::from_byte_array(id).to_hex();
                    if letter == SingleLetterTag::LOWERCASE_A
                        || letter == SingleLetterTag::UPPERCASE_A
                    {
                        format!("30617:{hex}:repo-{}", rng.below(100_000))
                    } else {
                        hex
                    }
                })
                .collect();
            Filter::new().custom_tags(letter, values).limit(500)
        })
        .collect()
}

fn bench_encode(c: &mut Criterion) {
    let filters = filters();
    let ours = req_message(SUB, &filters);
    let theirs = ClientMessage::req(SubscriptionId::new(SUB), filters.clone()).as_json();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&ours).expect("valid JSON"),
        serde_json::from_str::<serde_json::Value>(&theirs).expect("valid JSON"),
        "same message"
    );
    eprintln!(
        "encode: REQ of {FILTERS} filters × {VALUES} values, {} bytes",
        ours.len()
    );

    let mut group = c.benchmark_group("encode_req_20x100");
    group.throughput(Throughput::Bytes(ours.len() as u64));
    group.bench_function("req_message", |b| {
        b.iter(|| req_message(black_box(SUB), black_box(&filters)))
    });
    group.bench_function("nostr_client_message_req", |b| {
        b.iter_batched(
            || filters.clone(),
            |owned| ClientMessage::req(SubscriptionId::new(SUB), owned).as_json(),
            BatchSize::SmallInput,
        )
    });
    let id = SubscriptionId::new(SUB);
    group.bench_function("nostr_client_message_borrowed", |b| {
        b.iter(|| {
            let message = ClientMessage::Req {
                subscription_id: Cow::Borrowed(&id),
                filters: black_box(&filters).iter().map(Cow::Borrowed).collect(),
            };
            message.as_json()
        })
    });
    group.finish();
}

criterion_group!(benches, bench_encode);
criterion_main!(benches);
