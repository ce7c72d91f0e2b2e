//! Paged attention at the real models' head shapes: a 512-token prefill of
//! one sequence, and one decode step of 8 sequences at 512 cached positions
//! over an f32 cache and over an f16 cache. Throughput is query rows per
//! second.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::f16;
use kiln_kernels::dense::attention::{
    paged_attention, write_kv, AttentionParams, CacheLayout, SequenceRows,
};

/// (name, query heads, key/value heads, head size).
const MODELS: [(&str, usize, usize, usize); 3] = [
    ("smollm2", 9, 3, 64),
    ("qwen2.5-0.5b", 14, 2, 64),
    ("gemma3-270m", 4, 1, 256),
];
const CONTEXT: usize = 512;
const BLOCK: usize = 16;

fn data(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i + seed) * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("paged_attention");
    group.sample_size(20);
    for (name, heads, kv_heads, d) in MODELS {
        let layout = CacheLayout {
            block_size: BLOCK,
            num_kv_heads: kv_heads,
            head_dim: d,
        };
        let seqs = 8;
        let blocks_per_seq = CONTEXT / BLOCK;
        let cache_len = seqs * blocks_per_seq * BLOCK * kv_heads * d;
        let (mut k_cache, mut v_cache) = (vec![0f32; cache_len], vec![0f32; cache_len]);
        let tables: Vec<Vec<usize>> = (0..seqs)
            .map(|s| (s * blocks_per_seq..(s + 1) * blocks_per_seq).collect())
            .collect();
        let params = AttentionParams {
            scale: 1.0 / (d as f32).sqrt(),
            sliding_window: None,
            softcap: None,
        };
        // Fill every sequence's cache as a whole-prompt prefill would.
        let kv = data(CONTEXT * kv_heads * d, 1);
        for table in &tables {
            let seq = [SequenceRows {
                rows: 0..CONTEXT,
                context_len: CONTEXT,
                block_table: table,
            }];
            write_kv(layout, &mut k_cache, &mut v_cache, &kv, &kv, &seq);
        }

        let prefill = [SequenceRows {
            rows: 0..CONTEXT,
            context_len: CONTEXT,
            block_table: &tables[0],
        }];
        let q = data(CONTEXT * heads * d, 2);
        let mut out = vec![0f32; q.len()];
        group.throughput(Throughput::Elements(CONTEXT as u64));
        group.bench_with_input(BenchmarkId::new("prefill512", name), &(), |b, _| {
            b.iter(|| {
                paged_attention(
                    layout, &k_cache, &v_cache, &q, &mut out, heads, &prefill, params,
                )
            })
        });

        let decode: Vec<SequenceRows<'_>> = tables
            .iter()
            .enumerate()
            .map(|(s, table)| SequenceRows {
                rows: s..s + 1,
                context_len: CONTEXT,
                block_table: table,
            })
            .collect();
        let q = data(seqs * heads * d, 3);
        let mut out = vec![0f32; q.len()];
        group.throughput(Throughput::Elements(seqs as u64));
        group.bench_with_input(BenchmarkId::new("decode8x512", name), &(), |b, _| {
            b.iter(|| {
                paged_attention(
                    layout, &k_cache, &v_cache, &q, &mut out, heads, &decode, params,
                )
            })
        });
        let to_f16 = |c: &[f32]| c.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
        let (k_half, v_half) = (to_f16(&k_cache), to_f16(&v_cache));
        group.bench_with_input(BenchmarkId::new("decode8x512_f16", name), &(), |b, _| {
            b.iter(|| {
                paged_attention(
                    layout, &k_half, &v_half, &q, &mut out, heads, &decode, params,
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
