//! Structured output's cost per generated token on SmolLM2's 49,152-token
//! vocabulary: the grammar's mask (llguidance) and taking the sampled
//! token, walking a City JSON object token by token; a step of 16
//! constrained rows one at a time and in parallel (as the engine decides
//! them); and the CPU sampler's pick with and without the mask. Needs the
//! SmolLM2 GGUF that `.ci/setup` fetches (or `KILN_SMOLLM2_GGUF`).

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kiln_host::engine::structured::{allowed_tokens, Grammar, Grammars};
use kiln_host::runtime::sampling::{sample_row, RowSampling};
use llguidance::Matcher;
use rayon::prelude::*;

mod common;

const CITY: &str = r#"{"name":"Paris","country":"France","population_millions":2}"#;

fn bench(c: &mut Criterion) {
    let tokenizer = common::smollm2_tokenizer();
    let vocab = tokenizer.vocab_size();
    let ids = tokenizer.encode(CITY, false).unwrap();
    let grammars = Grammars::new(Arc::new(tokenizer), vec![2], vocab);
    let schema = serde_json::json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24}, "country": {"type": "string", "maxLength": 24},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 40}},
        "required": ["name", "country", "population_millions"], "additionalProperties": false});
    let matcher = grammars.matcher(&Grammar::JsonSchema(schema)).unwrap();

    let mut group = c.benchmark_group("structured_output");
    group.sample_size(20);
    group.throughput(Throughput::Elements(ids.len() as u64));
    group.bench_function("mask_and_consume_per_token", |b| {
        b.iter(|| {
            let mut m = matcher.deep_clone();
            for &t in &ids {
                let mask = allowed_tokens(&mut m).unwrap();
                assert!(mask[t as usize / 32] >> (t % 32) & 1 == 1);
                m.consume_token(t).unwrap();
            }
        })
    });
    // A step of 16 rows at different points of the object: each row's mask,
    // then its next token taken (fresh matchers every iteration: a matcher
    // keeps the mask it computed).
    let rows: Vec<(Matcher, u32)> = (0..16)
        .map(|i| {
            let at = i * (ids.len() - 1) / 16;
            let mut m = matcher.deep_clone();
            for &t in &ids[..at] {
                m.consume_token(t).unwrap();
            }
            (m, ids[at])
        })
        .collect();
    let fresh =
        || -> Vec<(Matcher, u32)> { rows.iter().map(|(m, t)| (m.deep_clone(), *t)).collect() };
    let row_step = |(m, next): &mut (Matcher, u32)| {
        let mask = allowed_tokens(m).unwrap();
        m.consume_token(*next).unwrap();
        mask
    };
    group.throughput(Throughput::Elements(rows.len() as u64));
    group.bench_function("step_of_16_rows_one_at_a_time", |b| {
        b.iter_batched(
            fresh,
            |mut rows| rows.iter_mut().map(row_step).collect::<Vec<_>>(),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("step_of_16_rows_in_parallel", |b| {
        b.iter_batched(
            fresh,
            |mut rows| rows.par_iter_mut().map(row_step).collect::<Vec<_>>(),
            BatchSize::SmallInput,
        )
    });
    group.throughput(Throughput::Elements(1));
    let logits: Vec<f32> = (0..vocab)
        .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
        .collect();
    let mut m = matcher.deep_clone();
    let mask = allowed_tokens(&mut m).unwrap();
    let plain = RowSampling::greedy();
    let masked = RowSampling {
        allowed: Some(mask),
        ..RowSampling::greedy()
    };
    group.bench_function("cpu_pick_without_mask", |b| {
        b.iter(|| sample_row(&logits, &plain))
    });
    group.bench_function("cpu_pick_with_mask", |b| {
        b.iter(|| sample_row(&logits, &masked))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
