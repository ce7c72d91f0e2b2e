//! Causal attention over a paged KV cache for ragged batches, and attention
//! within each sequence without a cache (encoders).
//!
//! A layer's cache is two arrays (keys, values) of
//! `[num_blocks, block_size, num_kv_heads, head_dim]`, of f32 or of f16/bf16
//! at half the memory ([`CacheElement`]). Sequence `b` stores position `p`
//! in block `block_table[p / block_size]`, slot `p % block_size`.

use std::ops::Range;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

/// What the KV cache stores a number as: f32, or f16/bf16 (rounded to
/// nearest even when written, widened to f32 when attention reads it).
pub trait CacheElement: Copy + Default + Send + Sync + 'static {
    /// `dst = src`, rounded.
    fn store(src: &[f32], dst: &mut [Self]);
    /// `dst = src`, widened.
    fn load(src: &[Self], dst: &mut [f32]);
}

impl CacheElement for f32 {
    fn store(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn load(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl CacheElement for f16 {
    fn store(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src);
    }
    fn load(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
}

impl CacheElement for bf16 {
    fn store(src: &[f32], dst: &mut [bf16]) {
        dst.convert_from_f32_slice(src);
    }
    fn load(src: &[bf16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
}

/// The shape of one layer's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLayout {
    /// Positions per block.
    pub block_size: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Size of one head.
    pub head_dim: usize,
}

impl CacheLayout {
    /// Floats per cached position (all heads).
    pub fn position_stride(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Offset of `position` of a sequence with `block_table`.
    fn offset(&self, block_table: &[usize], position: usize) -> usize {
        let block = block_table[position / self.block_size];
        (block * self.block_size + position % self.block_size) * self.position_stride()
    }
}

/// One sequence of the batch.
#[derive(Clone, Debug)]
pub struct SequenceRows<'a> {
    /// Its rows in the flattened batch.
    pub rows: Range<usize>,
    /// Positions in the cache after this step (the new rows are the last ones).
    pub context_len: usize,
    /// Its cache blocks.
    pub block_table: &'a [usize],
}

/// Score options.
#[derive(Clone, Copy, Debug)]
pub struct AttentionParams {
    /// Multiplies `q·k`.
    pub scale: f32,
    /// Only the last `window` positions are visible.
    pub sliding_window: Option<usize>,
    /// `cap * tanh(score / cap)`.
    pub softcap: Option<f32>,
}

/// Writes this step's keys and values (`[T, num_kv_heads, head_dim]`) into the cache.
pub fn write_kv<T: CacheElement>(
    layout: CacheLayout,
    k_cache: &mut [T],
    v_cache: &mut [T],
    k: &[f32],
    v: &[f32],
    sequences: &[SequenceRows<'_>],
) {
    let stride = layout.position_stride();
    for seq in sequences {
        let first_position = seq.context_len - seq.rows.len();
        for (i, row) in seq.rows.clone().enumerate() {
            let at = layout.offset(seq.block_table, first_position + i);
            T::store(
                &k[row * stride..(row + 1) * stride],
                &mut k_cache[at..at + stride],
            );
            T::store(
                &v[row * stride..(row + 1) * stride],
                &mut v_cache[at..at + stride],
            );
        }
    }
}

/// Query rows per task: bounds the score tile (`ROW_TILE × context` floats).
const ROW_TILE: usize = 64;

/// `out [T, num_heads, head_dim]`: each query row attends to its sequence's
/// cached positions up to its own (query head `h` reads key/value head
/// `h / (num_heads / num_kv_heads)`).
///
/// Work is split into tasks of (sequence, tile of up to [`ROW_TILE`] query
/// rows, key/value head), run in parallel. A task copies its key and value
/// rows out of the paged cache once, then for each query head of its group
/// computes the score tile `Q·Kᵀ` and the output `P·V` as matrix products
/// (the `gemm` crate), with the causal and sliding-window masks applied to
/// the scores before the softmax. A task of one row (a decode step) reads
/// the cache in place instead (`one_row`).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention<T: CacheElement>(
    layout: CacheLayout,
    k_cache: &[T],
    v_cache: &[T],
    q: &[f32],
    out: &mut [f32],
    num_heads: usize,
    sequences: &[SequenceRows<'_>],
    params: AttentionParams,
) {
    attend(
        layout, k_cache, v_cache, q, out, num_heads, sequences, params, true,
    );
}

/// `out [T, num_heads, head_dim]`: attention of `q` over `k, v [T,
/// num_kv_heads, head_dim]` within each sequence `row_offsets[b] ..
/// row_offsets[b + 1]`, bidirectional unless `causal` (an encoder's
/// attention, with no cache). The rows themselves serve as a cache of
/// one-position blocks, so the work splits as in [`paged_attention`].
#[allow(clippy::too_many_arguments)]
pub fn sequence_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    num_heads: usize,
    num_kv_heads: usize,
    row_offsets: &[usize],
    scale: f32,
    causal: bool,
) {
    let tokens = row_offsets.last().copied().unwrap_or(0);
    let layout = CacheLayout {
        block_size: 1,
        num_kv_heads,
        head_dim: k.len() / (tokens * num_kv_heads).max(1),
    };
    let rows: Vec<usize> = (0..tokens).collect();
    let sequences: Vec<SequenceRows<'_>> = row_offsets
        .windows(2)
        .map(|pair| SequenceRows {
            rows: pair[0]..pair[1],
            context_len: pair[1] - pair[0],
            block_table: &rows[pair[0]..pair[1]],
        })
        .collect();
    let params = AttentionParams {
        scale,
        sliding_window: None,
        softcap: None,
    };
    attend(layout, k, v, q, out, num_heads, &sequences, params, causal);
}

/// [`paged_attention`], causal or not.
#[allow(clippy::too_many_arguments)]
fn attend<T: CacheElement>(
    layout: CacheLayout,
    k_cache: &[T],
    v_cache: &[T],
    q: &[f32],
    out: &mut [f32],
    num_heads: usize,
    sequences: &[SequenceRows<'_>],
    params: AttentionParams,
    causal: bool,
) {
    let d = layout.head_dim;
    let row_len = num_heads * d;
    assert!(
        q.len() == out.len()
            && q.len().is_multiple_of(row_len)
            && num_heads.is_multiple_of(layout.num_kv_heads),
        "attention sizes"
    );
    let mut tasks = Vec::new();
    for seq in sequences {
        let mut first = seq.rows.start;
        while first < seq.rows.end {
            let last = (first + ROW_TILE).min(seq.rows.end);
            for kv_head in 0..layout.num_kv_heads {
                tasks.push((seq, first..last, kv_head));
            }
            first = last;
        }
    }
    let out = SharedOut(out.as_mut_ptr(), out.len());
    tasks.par_iter().for_each(|(seq, rows, kv_head)| {
        let task = Task {
            layout,
            num_heads,
            params,
            seq,
            rows: rows.clone(),
            kv_head: *kv_head,
            causal,
        };
        task.run(k_cache, v_cache, q, &out);
    });
}

/// The output buffer, shared by tasks that write disjoint parts of it.
struct SharedOut(*mut f32, usize);

// SAFETY: tasks write disjoint (row, head) blocks; see `Task::run`.
unsafe impl Sync for SharedOut {}

/// One (sequence, row tile, key/value head) of [`paged_attention`].
struct Task<'a> {
    layout: CacheLayout,
    num_heads: usize,
    params: AttentionParams,
    seq: &'a SequenceRows<'a>,
    rows: Range<usize>,
    kv_head: usize,
    /// Each row sees only positions up to its own.
    causal: bool,
}

impl Task<'_> {
    fn run<T: CacheElement>(&self, k_cache: &[T], v_cache: &[T], q: &[f32], out: &SharedOut) {
        let d = self.layout.head_dim;
        let row_len = self.num_heads * d;
        let group = self.num_heads / self.layout.num_kv_heads;
        let first_position = self.seq.context_len - self.seq.rows.len();
        // Query row i of the tile sits at `positions.start + i`.
        let positions = first_position + (self.rows.start - self.seq.rows.start)
            ..first_position + (self.rows.end - self.seq.rows.start);
        let visible_from = |position: usize| {
            self.params
                .sliding_window
                .map_or(0, |w| (position + 1).saturating_sub(w))
        };
        let keys = if self.causal {
            visible_from(positions.start)..positions.end
        } else {
            0..self.seq.context_len
        };
        let (n_rows, n_keys) = (self.rows.len(), keys.len());
        if n_rows == 1 {
            // A decode step's row sees every key of the range.
            return one_row(self, k_cache, v_cache, q, out, keys);
        }

        let mut k = vec![0f32; n_keys * d];
        let mut v = vec![0f32; n_keys * d];
        for (j, position) in keys.clone().enumerate() {
            let at = self.layout.offset(self.seq.block_table, position) + self.kv_head * d;
            T::load(&k_cache[at..at + d], &mut k[j * d..(j + 1) * d]);
            T::load(&v_cache[at..at + d], &mut v[j * d..(j + 1) * d]);
        }
        let mut scores = vec![0f32; n_rows * n_keys];
        for h in self.kv_head * group..(self.kv_head + 1) * group {
            let q_head = &q[self.rows.start * row_len + h * d..];
            // scores [rows, keys] = scale · Q_h [rows, d] · Kᵀ [d, keys]
            // SAFETY: Q_h reads rows × d with row stride row_len inside `q`;
            // k holds keys × d; scores holds rows × keys.
            unsafe {
                gemm::gemm(
                    n_rows,
                    n_keys,
                    d,
                    scores.as_mut_ptr(),
                    1,
                    n_keys as isize,
                    false,
                    q_head.as_ptr(),
                    1,
                    row_len as isize,
                    k.as_ptr(),
                    d as isize,
                    1,
                    0.0,
                    self.params.scale,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
            for (i, row) in scores.chunks_exact_mut(n_keys).enumerate() {
                let position = positions.start + i;
                let visible = if self.causal {
                    visible_from(position) - keys.start..position + 1 - keys.start
                } else {
                    0..n_keys
                };
                masked_softmax(row, visible, self.params.softcap);
            }
            // out[rows, h] = P [rows, keys] · V [keys, d]
            let dst_offset = self.rows.start * row_len + h * d;
            debug_assert!(dst_offset + (n_rows - 1) * row_len + d <= out.1);
            // SAFETY: this task alone writes rows `self.rows` × head `h`
            // (heads of its key/value group); the range lies inside `out`.
            unsafe {
                gemm::gemm(
                    n_rows,
                    d,
                    n_keys,
                    out.0.add(dst_offset),
                    1,
                    row_len as isize,
                    false,
                    scores.as_ptr(),
                    1,
                    n_keys as isize,
                    v.as_ptr(),
                    1,
                    d as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        }
    }
}

/// One query row (a decode step) of `task` over `keys`: the scores and the
/// weighted sum straight from the cache, each key and value widened once for
/// the whole group of query heads that reads it, nothing copied out. The
/// loops are compiled for AVX-512 or AVX2 where the CPU has them.
fn one_row<T: CacheElement>(
    task: &Task<'_>,
    k_cache: &[T],
    v_cache: &[T],
    q: &[f32],
    out: &SharedOut,
    keys: Range<usize>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        unsafe fn avx512<T: CacheElement>(
            task: &Task<'_>,
            k_cache: &[T],
            v_cache: &[T],
            q: &[f32],
            out: &SharedOut,
            keys: Range<usize>,
        ) {
            one_row_portable(task, k_cache, v_cache, q, out, keys);
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2<T: CacheElement>(
            task: &Task<'_>,
            k_cache: &[T],
            v_cache: &[T],
            q: &[f32],
            out: &SharedOut,
            keys: Range<usize>,
        ) {
            one_row_portable(task, k_cache, v_cache, q, out, keys);
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            return unsafe { avx512(task, k_cache, v_cache, q, out, keys) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA.
            return unsafe { avx2(task, k_cache, v_cache, q, out, keys) };
        }
    }
    one_row_portable(task, k_cache, v_cache, q, out, keys);
}

#[inline(always)]
fn one_row_portable<T: CacheElement>(
    task: &Task<'_>,
    k_cache: &[T],
    v_cache: &[T],
    q: &[f32],
    out: &SharedOut,
    keys: Range<usize>,
) {
    let d = task.layout.head_dim;
    let group = task.num_heads / task.layout.num_kv_heads;
    // The group's query heads sit side by side in the row, as do their
    // outputs.
    let at = task.rows.start * task.num_heads * d + task.kv_head * group * d;
    let q_group = &q[at..at + group * d];
    let n = keys.len();
    let mut scores = vec![0f32; group * n];
    let mut widened = vec![0f32; d];
    let cached =
        |position: usize| task.layout.offset(task.seq.block_table, position) + task.kv_head * d;
    for (j, position) in keys.clone().enumerate() {
        let k = cached(position);
        T::load(&k_cache[k..k + d], &mut widened);
        for (h, q_head) in q_group.chunks_exact(d).enumerate() {
            scores[h * n + j] = task.params.scale * dot_inline(q_head, &widened);
        }
    }
    for row in scores.chunks_exact_mut(n) {
        masked_softmax(row, 0..n, task.params.softcap);
    }
    let mut acc = vec![0f32; group * d];
    for (j, position) in keys.enumerate() {
        let v = cached(position);
        T::load(&v_cache[v..v + d], &mut widened);
        for (h, acc_head) in acc.chunks_exact_mut(d).enumerate() {
            let p = scores[h * n + j];
            acc_head
                .iter_mut()
                .zip(&widened)
                .for_each(|(a, &x)| *a = p.mul_add(x, *a));
        }
    }
    assert!(at + group * d <= out.1, "attention output range");
    // SAFETY: this task alone writes row `task.rows.start` × the heads of
    // its key/value group, which lie inside `out` (checked above).
    unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), out.0.add(at), group * d) };
}

/// A dot product inlined into its caller's target features.
#[inline(always)]
fn dot_inline(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..16 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Softmax of `row[visible]` (after the optional soft cap); zero elsewhere.
fn masked_softmax(row: &mut [f32], visible: Range<usize>, softcap: Option<f32>) {
    let (head, rest) = row.split_at_mut(visible.start);
    let (live, tail) = rest.split_at_mut(visible.len());
    head.fill(0.0);
    tail.fill(0.0);
    if let Some(cap) = softcap {
        live.iter_mut().for_each(|s| *s = cap * (*s / cap).tanh());
    }
    super::norm::softmax_rows(live, visible.len());
}

#[cfg(test)]
mod tests {
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
                        let values: Vec<_> =
                            (pair[0]..pair[1]).map(|p| head_of(&v, p, g)).collect();
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

    /// A half-precision cache computes exactly what the f32 cache computes
    /// over the rounded keys and values.
    #[test]
    fn half_caches_attend_over_the_rounded_keys_and_values() {
        fn run<T: CacheElement>(k: &[f32], v: &[f32], q: &[f32]) -> Vec<f32> {
            let layout = CacheLayout {
                block_size: 4,
                num_kv_heads: 2,
                head_dim: 8,
            };
            let table: Vec<usize> = (0..10).rev().collect();
            let (mut k_cache, mut v_cache) =
                (vec![T::default(); k.len()], vec![T::default(); v.len()]);
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
        let (k, v, q) = (data(40 * 16, 1), data(40 * 16, 2), data(3 * 32, 3));
        let exact = run::<f32>(&k, &v, &q);
        for (name, round) in [
            (
                "f16",
                (|x: f32| f16::from_f32(x).to_f32()) as fn(f32) -> f32,
            ),
            ("bf16", |x: f32| bf16::from_f32(x).to_f32()),
        ] {
            let (kr, vr): (Vec<f32>, Vec<f32>) = (
                k.iter().map(|&x| round(x)).collect(),
                v.iter().map(|&x| round(x)).collect(),
            );
            let half = if name == "f16" {
                run::<f16>(&k, &v, &q)
            } else {
                run::<bf16>(&k, &v, &q)
            };
            assert_eq!(half, run::<f32>(&kr, &vr, &q), "{name}");
            let worst = half
                .iter()
                .zip(&exact)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst > 0.0 && worst < 2e-2, "{name}: {worst}");
        }
    }
}
