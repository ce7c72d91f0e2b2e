//! Causal attention over a paged KV cache for ragged batches.
//!
//! A layer's cache is two f32 arrays (keys, values) of
//! `[num_blocks, block_size, num_kv_heads, head_dim]`. Sequence `b` stores
//! position `p` in block `block_table[p / block_size]`, slot `p % block_size`.

use std::ops::Range;

use rayon::prelude::*;

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
pub fn write_kv(
    layout: CacheLayout,
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    k: &[f32],
    v: &[f32],
    sequences: &[SequenceRows<'_>],
) {
    let stride = layout.position_stride();
    for seq in sequences {
        let first_position = seq.context_len - seq.rows.len();
        for (i, row) in seq.rows.clone().enumerate() {
            let at = layout.offset(seq.block_table, first_position + i);
            k_cache[at..at + stride].copy_from_slice(&k[row * stride..(row + 1) * stride]);
            v_cache[at..at + stride].copy_from_slice(&v[row * stride..(row + 1) * stride]);
        }
    }
}

/// `out [T, num_heads, head_dim]`: each query row attends to its sequence's
/// cached positions up to its own (query head `h` reads key/value head
/// `h / (num_heads / num_kv_heads)`).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    layout: CacheLayout,
    k_cache: &[f32],
    v_cache: &[f32],
    q: &[f32],
    out: &mut [f32],
    num_heads: usize,
    sequences: &[SequenceRows<'_>],
    params: AttentionParams,
) {
    let d = layout.head_dim;
    let row_len = num_heads * d;
    let group = num_heads / layout.num_kv_heads;
    assert!(
        q.len() == out.len() && q.len().is_multiple_of(row_len),
        "attention sizes"
    );
    // Each output row is one token's heads; find its sequence and position.
    let mut owner = vec![(0usize, 0usize); q.len() / row_len];
    for (s, seq) in sequences.iter().enumerate() {
        let first_position = seq.context_len - seq.rows.len();
        for (i, row) in seq.rows.clone().enumerate() {
            owner[row] = (s, first_position + i);
        }
    }
    out.par_chunks_mut(row_len)
        .enumerate()
        .for_each(|(row, out_row)| {
            let (s, position) = owner[row];
            let seq = &sequences[s];
            let start = params
                .sliding_window
                .map_or(0, |w| (position + 1).saturating_sub(w));
            let mut scores = vec![0f32; position + 1 - start];
            for h in 0..num_heads {
                let kv_head = h / group;
                let qh = &q[row * row_len + h * d..row * row_len + (h + 1) * d];
                for (j, score) in (start..=position).zip(scores.iter_mut()) {
                    let at = layout.offset(seq.block_table, j) + kv_head * d;
                    let mut s = super::matmul::dot(qh, &k_cache[at..at + d]) * params.scale;
                    if let Some(cap) = params.softcap {
                        s = cap * (s / cap).tanh();
                    }
                    *score = s;
                }
                let len = scores.len();
                super::norm::softmax_rows(&mut scores, len);
                let oh = &mut out_row[h * d..(h + 1) * d];
                oh.fill(0.0);
                for (j, &p) in (start..=position).zip(&scores) {
                    let at = layout.offset(seq.block_table, j) + kv_head * d;
                    for (o, v) in oh.iter_mut().zip(&v_cache[at..at + d]) {
                        *o += p * v;
                    }
                }
            }
        });
}
