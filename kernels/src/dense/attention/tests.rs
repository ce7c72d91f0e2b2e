//! The kernels against the definition, and batch invariance.

use super::*;

fn data(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i + seed) * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

/// Attention of one query row, straight from the definition, in f64.
#[allow(clippy::too_many_arguments)]
fn naive_row(
    q: &[f32],
    keys: &[Vec<f32>],
    values: &[Vec<f32>],
    position: usize,
    params: AttentionParams,
) -> Vec<f64> {
    let start = params
        .sliding_window
        .map_or(0, |w| (position + 1).saturating_sub(w));
    let scores: Vec<f64> = (start..=position)
        .map(|j| {
            let dot: f64 = q
                .iter()
                .zip(&keys[j])
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            let s = dot * f64::from(params.scale);
            params
                .softcap
                .map_or(s, |c| f64::from(c) * (s / f64::from(c)).tanh())
        })
        .collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut out = vec![0f64; q.len()];
    for (w, j) in weights.iter().zip(start..=position) {
        for (o, &v) in out.iter_mut().zip(&values[j]) {
            *o += w / total * f64::from(v);
        }
    }
    out
}

/// Several sequences, tiles crossing `ROW_TILE`, chunked prefill (rows
/// that start mid-sequence), GQA, windows and soft caps, against the definition.
#[test]
fn tiled_attention_matches_the_definition() {
    let (heads, kv_heads, d, block_size) = (6, 2, 8, 4);
    let layout = CacheLayout {
        block_size,
        num_kv_heads: kv_heads,
        head_dim: d,
    };
    // (context after the step, rows fed this step)
    let shapes = [(150usize, 150usize), (140, 75), (9, 1), (70, 70), (60, 1)];
    let windows = [None, Some(37), Some(200)];
    for (case, (window, softcap)) in windows
        .iter()
        .flat_map(|w| [(*w, None), (*w, Some(2.5f32))])
        .enumerate()
    {
        let params = AttentionParams {
            scale: 0.3,
            sliding_window: window,
            softcap,
        };
        let total_blocks: usize = shapes.iter().map(|(c, _)| c.div_ceil(block_size)).sum();
        let cache_len = total_blocks * block_size * kv_heads * d;
        let (mut k_cache, mut v_cache) = (vec![0f32; cache_len], vec![0f32; cache_len]);
        // Blocks handed out in reverse so that tables are not contiguous.
        let mut next_block = total_blocks;
        let tables: Vec<Vec<usize>> = shapes
            .iter()
            .map(|(c, _)| {
                (0..c.div_ceil(block_size))
                    .map(|_| {
                        next_block -= 1;
                        next_block
                    })
                    .collect()
            })
            .collect();
        // Every sequence's full history of keys and values, per kv head.
        let mut histories = Vec::new();
        let mut sequences = Vec::new();
        let mut row = 0;
        for (s, &(context, fed)) in shapes.iter().enumerate() {
            let k = data(context * kv_heads * d, 11 * s + case);
            let v = data(context * kv_heads * d, 17 * s + 3 + case);
            let all = [SequenceRows {
                rows: 0..context,
                context_len: context,
                block_table: &tables[s],
            }];
            write_kv(layout, &mut k_cache, &mut v_cache, &k, &v, &all);
            histories.push((k, v));
            sequences.push(SequenceRows {
                rows: row..row + fed,
                context_len: context,
                block_table: &tables[s],
            });
            row += fed;
        }
        let q = data(row * heads * d, 5 + case);
        let mut out = vec![f32::NAN; q.len()];
        paged_attention(
            layout, &k_cache, &v_cache, &q, &mut out, heads, &sequences, params,
        );
        let mut worst = 0f64;
        for (seq, (k, v)) in sequences.iter().zip(&histories) {
            let first_position = seq.context_len - seq.rows.len();
            for (i, r) in seq.rows.clone().enumerate() {
                for h in 0..heads {
                    let g = h / (heads / kv_heads);
                    let head_of = |x: &[f32], p: usize| {
                        x[(p * kv_heads + g) * d..(p * kv_heads + g + 1) * d].to_vec()
                    };
                    let keys: Vec<_> = (0..seq.context_len).map(|p| head_of(k, p)).collect();
                    let values: Vec<_> = (0..seq.context_len).map(|p| head_of(v, p)).collect();
                    let at = (r * heads + h) * d;
                    let expected =
                        naive_row(&q[at..at + d], &keys, &values, first_position + i, params);
                    for (&got, want) in out[at..at + d].iter().zip(expected) {
                        worst = worst.max((f64::from(got) - want).abs());
                    }
                }
            }
        }
        assert!(worst < 2e-5, "case {case}: worst |Δ| {worst:.2e}");
    }
}

/// Bidirectional and causal attention within sequences (tiles crossing
/// `ROW_TILE`, GQA) against the definition.
#[test]
fn sequence_attention_matches_the_definition() {
    let (heads, kv_heads, d) = (4, 2, 8);
    let offsets = [0usize, 5, 6, 150, 170];
    let tokens = offsets[offsets.len() - 1];
    let (k, v) = (
        data(tokens * kv_heads * d, 3),
        data(tokens * kv_heads * d, 9),
    );
    let q = data(tokens * heads * d, 21);
    for causal in [false, true] {
        let mut out = vec![f32::NAN; q.len()];
        sequence_attention(&q, &k, &v, &mut out, heads, kv_heads, &offsets, 0.4, causal);
        let params = AttentionParams {
            scale: 0.4,
            sliding_window: None,
            softcap: None,
        };
        let mut worst = 0f64;
        for pair in offsets.windows(2) {
            let head_of = |x: &[f32], row: usize, g: usize| {
                x[(row * kv_heads + g) * d..(row * kv_heads + g + 1) * d].to_vec()
            };
            for r in pair[0]..pair[1] {
                for h in 0..heads {
                    let g = h / (heads / kv_heads);
                    let keys: Vec<_> = (pair[0]..pair[1]).map(|p| head_of(&k, p, g)).collect();
                    let values: Vec<_> = (pair[0]..pair[1]).map(|p| head_of(&v, p, g)).collect();
                    // Bidirectional: the last position sees every key.
                    let position = if causal { r - pair[0] } else { keys.len() - 1 };
                    let at = (r * heads + h) * d;
                    let expected = naive_row(&q[at..at + d], &keys, &values, position, params);
                    for (&got, want) in out[at..at + d].iter().zip(expected) {
                        worst = worst.max((f64::from(got) - want).abs());
                    }
                }
            }
        }
        assert!(worst < 2e-5, "causal {causal}: worst |Δ| {worst:.2e}");
    }
}

/// The last 3 rows of a 37-token sequence (4 query heads over 2 key/value
/// heads of `head_dim`) attending over a cache of `T` holding `k` and `v`.
fn attend_last_rows<T: CacheElement>(head_dim: usize, k: &[f32], v: &[f32], q: &[f32]) -> Vec<f32> {
    let layout = CacheLayout {
        block_size: 4,
        num_kv_heads: 2,
        head_dim,
    };
    let table: Vec<usize> = (0..10).rev().collect();
    let len = k.len() / T::VALUES;
    let (mut k_cache, mut v_cache) = (vec![T::default(); len], vec![T::default(); len]);
    let whole = [SequenceRows {
        rows: 0..37,
        context_len: 37,
        block_table: &table,
    }];
    write_kv(layout, &mut k_cache, &mut v_cache, k, v, &whole);
    let mut out = vec![0f32; q.len()];
    let last = [SequenceRows {
        rows: 0..3,
        context_len: 37,
        block_table: &table,
    }];
    let params = AttentionParams {
        scale: 0.35,
        sliding_window: None,
        softcap: None,
    };
    paged_attention(layout, &k_cache, &v_cache, q, &mut out, 4, &last, params);
    out
}

/// Checks that a cache of `T` computes exactly what the f32 cache computes
/// over keys and values passed through `round` (per run of `head_dim`
/// numbers), and that it is close to the f32 cache's result.
fn check_rounded_cache<T: CacheElement>(
    name: &str,
    head_dim: usize,
    round: impl Fn(&[f32]) -> Vec<f32>,
    tolerance: f32,
) {
    let n = 40 * 2 * head_dim;
    let (k, v, q) = (data(n, 1), data(n, 2), data(3 * 4 * head_dim, 3));
    let exact = attend_last_rows::<f32>(head_dim, &k, &v, &q);
    let rounded = |x: &[f32]| x.chunks(head_dim).flat_map(&round).collect::<Vec<f32>>();
    let cached = attend_last_rows::<T>(head_dim, &k, &v, &q);
    assert_eq!(
        cached,
        attend_last_rows::<f32>(head_dim, &rounded(&k), &rounded(&v), &q),
        "{name}"
    );
    let worst = cached
        .iter()
        .zip(&exact)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst > 0.0 && worst < tolerance, "{name}: {worst}");
}

/// A half-precision cache computes exactly what the f32 cache computes
/// over the rounded keys and values.
#[test]
fn half_caches_attend_over_the_rounded_keys_and_values() {
    let each = |f: fn(f32) -> f32| move |x: &[f32]| x.iter().map(|&v| f(v)).collect();
    check_rounded_cache::<f16>("f16", 8, each(|x| f16::from_f32(x).to_f32()), 2e-2);
    check_rounded_cache::<bf16>("bf16", 8, each(|x| bf16::from_f32(x).to_f32()), 2e-2);
}

/// A Q8_0 cache computes exactly what the f32 cache computes over keys and
/// values quantized and dequantized by ggml's Q8_0 quantizer (the reference
/// `quantize_row` and `dequantize_row`), within 1 % of the f32 cache.
#[test]
fn a_q8_0_cache_attends_over_the_dequantized_keys_and_values() {
    use crate::quant::{dequantize_row, quantize_row, QuantType};
    let ggml_round_trip = |x: &[f32]| {
        let mut bytes = vec![0u8; QuantType::Q8_0.row_bytes(x.len()).unwrap()];
        quantize_row(QuantType::Q8_0, x, &mut bytes).unwrap();
        let mut y = vec![0f32; x.len()];
        dequantize_row(QuantType::Q8_0, &bytes, &mut y).unwrap();
        y
    };
    for head_dim in [32, 64, 256] {
        check_rounded_cache::<BlockQ8_0>("q8_0", head_dim, ggml_round_trip, 1e-2);
    }
}

/// One sequence's rows fed in one step, in chunks, and one at a time (as
/// decode steps) give bit-identical outputs, for every cache element type,
/// with GQA groups of 1 to 7 heads, head sizes that are and are not
/// multiples of the vector width, a sliding window and a soft cap.
#[test]
fn rows_do_not_depend_on_how_they_are_batched() {
    fn run<T: CacheElement>(
        (heads, kv_heads, d): (usize, usize, usize),
        params: AttentionParams,
        chunks: &[usize],
    ) -> Vec<f32> {
        let (tokens, block_size) = (chunks.iter().sum::<usize>(), 16);
        let layout = CacheLayout {
            block_size,
            num_kv_heads: kv_heads,
            head_dim: d,
        };
        let table: Vec<usize> = (0..tokens.div_ceil(block_size)).rev().collect();
        let cache_len = table.len() * block_size * kv_heads * d / T::VALUES;
        let (mut k_cache, mut v_cache) =
            (vec![T::default(); cache_len], vec![T::default(); cache_len]);
        let (k, v) = (
            data(tokens * kv_heads * d, 4),
            data(tokens * kv_heads * d, 8),
        );
        let q = data(tokens * heads * d, 15);
        let row_len = heads * d;
        let mut out = vec![f32::NAN; q.len()];
        let mut start = 0;
        for &n in chunks {
            let rows = [SequenceRows {
                rows: 0..n,
                context_len: start + n,
                block_table: &table,
            }];
            let kv = start * kv_heads * d..(start + n) * kv_heads * d;
            write_kv(
                layout,
                &mut k_cache,
                &mut v_cache,
                &k[kv.clone()],
                &v[kv],
                &rows,
            );
            let mut step = vec![0f32; n * row_len];
            let q_step = &q[start * row_len..(start + n) * row_len];
            paged_attention(
                layout, &k_cache, &v_cache, q_step, &mut step, heads, &rows, params,
            );
            out[start * row_len..(start + n) * row_len].copy_from_slice(&step);
            start += n;
        }
        out
    }
    fn check<T: CacheElement>(name: &str) {
        let shapes = [(9, 3, 64), (14, 2, 64), (4, 1, 256), (6, 6, 40)];
        let tokens = 150;
        let batchings: [Vec<usize>; 3] = [vec![tokens], vec![70, 1, 64, 15], vec![1; tokens]];
        for shape in shapes.into_iter().filter(|s| s.2 % T::VALUES == 0) {
            for (window, softcap) in [(None, None), (Some(37), Some(20.0))] {
                let params = AttentionParams {
                    scale: 0.125,
                    sliding_window: window,
                    softcap,
                };
                let whole = run::<T>(shape, params, &batchings[0]);
                for chunks in &batchings[1..] {
                    let fed = run::<T>(shape, params, chunks);
                    let differing = whole
                        .iter()
                        .zip(&fed)
                        .filter(|(a, b)| a.to_bits() != b.to_bits())
                        .count();
                    assert_eq!(
                        differing,
                        0,
                        "{name} {shape:?} window {window:?}: {differing} outputs differ fed in {} steps",
                        chunks.len()
                    );
                }
            }
        }
    }
    check::<f32>("f32");
    check::<f16>("f16");
    check::<bf16>("bf16");
    check::<BlockQ8_0>("q8_0");
}

/// `load_avx512` against `load` on `values`, in runs of odd lengths so that
/// the 16-wide loops and their tails both run.
#[cfg(target_arch = "x86_64")]
fn check_widening<T: CacheElement>(values: &[T]) {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for len in [1, 15, 16, 17, 64, 257] {
        for chunk in values.chunks(len) {
            let n = chunk.len() * T::VALUES;
            let (mut a, mut b) = (vec![0f32; n], vec![1f32; n]);
            T::load(chunk, &mut a);
            // SAFETY: the caller checked for AVX-512F.
            unsafe { T::load_avx512(chunk, &mut b) };
            assert_eq!(bits(&a), bits(&b));
        }
    }
}

/// Every f16 and bf16 bit pattern but NaNs.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_widening_gives_the_portable_values() {
    if !std::arch::is_x86_feature_detected!("avx512f") {
        return;
    }
    let all = || 0..=u16::MAX;
    check_widening(
        &all()
            .map(f16::from_bits)
            .filter(|h| !h.is_nan())
            .collect::<Vec<_>>(),
    );
    check_widening(
        &all()
            .map(bf16::from_bits)
            .filter(|h| !h.is_nan())
            .collect::<Vec<_>>(),
    );
}

/// Q8_0 blocks with every finite f16 scale, and quants from -128 to 127.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_q8_0_widening_gives_the_portable_values() {
    if !std::arch::is_x86_feature_detected!("avx512f") {
        return;
    }
    let blocks: Vec<BlockQ8_0> = (0..=u16::MAX)
        .map(f16::from_bits)
        .filter(|d| d.is_finite())
        .enumerate()
        .map(|(i, d)| BlockQ8_0 {
            d,
            qs: std::array::from_fn(|j| ((i * 37 + j * 11) % 256) as u8 as i8),
        })
        .collect();
    check_widening(&blocks);
}
