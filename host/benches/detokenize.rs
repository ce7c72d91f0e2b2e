//! The incremental detokenizer's cost per generated token (every stream
//! pays it every step): SmolLM2's tokenizer (byte-level BPE, 49,152 tokens)
//! streaming a paragraph of text token by token, and a run of its
//! end-of-text token, which decoding skips (what a model emits past
//! `ignore_eos`). Needs the SmolLM2 GGUF that `.ci/setup` fetches (or
//! `KILN_SMOLLM2_GGUF`).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

mod common;

const TEXT: &str = "The capital of France is Paris. It has been the country's largest city \
    for centuries, and its museums, cafés and bridges over the Seine draw visitors from \
    around the world — about 44 million a year, by one estimate (2023).";

fn bench(c: &mut Criterion) {
    let tokenizer = common::smollm2_tokenizer();
    let text = tokenizer.encode(TEXT, false).unwrap();
    let end = (0..tokenizer.vocab_size() as u32)
        .find(|&id| tokenizer.skips_when_decoding(id))
        .expect("a special token");
    let mut group = c.benchmark_group("detokenize");
    for (name, ids) in [
        ("text", text.clone()),
        ("skipped special tokens", vec![end; 256]),
    ] {
        group.throughput(Throughput::Elements(ids.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut stream = tokenizer.decode_stream(true);
                let mut out = String::new();
                for &id in &ids {
                    if let Some(delta) = stream.step(id).unwrap() {
                        out.push_str(&delta);
                    }
                }
                out
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
