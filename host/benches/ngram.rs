//! Speculative decoding's n-gram proposer, which runs for every drafting
//! sequence before every step (with drafts, steps run one at a time, so its
//! time adds to each step's): contexts of 1k to 32k tokens over a
//! 50k-token vocabulary where the suffix never occurred before and where it
//! recurs. `first lookup` indexes the whole context (once a sequence);
//! `a step's lookup` indexes the token the step before added and looks up.

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use kiln_host::engine::speculative::{NgramConfig, NgramIndex};

/// A deterministic token stream without repeats of 3-grams in practice.
fn tokens(len: usize) -> Vec<u32> {
    let mut x = 0x9e37_79b9_u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 50_000) as u32
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let ngram = NgramConfig::parse(
        r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 3, "prompt_lookup_max": 5}"#,
    )
    .unwrap();
    let mut group = c.benchmark_group("ngram_propose");
    for len in [1024, 8192, 32768] {
        let unmatched = tokens(len);
        // The last 8 tokens also occur in the middle.
        let mut recurring = tokens(len);
        let copy: Vec<u32> = recurring[len / 2..len / 2 + 8].to_vec();
        recurring[len - 8..].copy_from_slice(&copy);
        for (name, context) in [("unmatched", &unmatched), ("recurring", &recurring)] {
            let id = |what: &str| BenchmarkId::new(format!("{what}/{name}"), len);
            group.bench_with_input(id("first lookup"), context, |b, context| {
                b.iter(|| NgramIndex::default().propose(&ngram, context, 4))
            });
            group.bench_with_input(id("a step's lookup"), context, |b, context| {
                b.iter_batched(
                    || {
                        let mut index = NgramIndex::default();
                        index.propose(&ngram, &context[..len - 1], 4);
                        index
                    },
                    |mut index| {
                        let drafts = index.propose(&ngram, context, 4);
                        (index, drafts)
                    },
                    BatchSize::LargeInput,
                )
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
