//! Causal attention over a paged KV cache for ragged batches, and attention
//! within each sequence without a cache (encoders).
//!
//! A layer's cache is two arrays (keys, values) of
//! `[num_blocks, block_size, num_kv_heads, head_dim]`, of f32, of f16/bf16
//! at half the memory, or of Q8_0 blocks at 34 bytes per 32 values
//! ([`CacheElement`]). Sequence `b` stores position `p`
//! in block `block_table[p / block_size]`, slot `p % block_size`.

use std::ops::Range;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

use task::Task;

use crate::quant::BlockQ8_0;

/// What the KV cache stores numbers as: f32, f16/bf16 (rounded to nearest
/// even when written, widened to f32 when attention reads it), or Q8_0
/// blocks (quantized when written, dequantized when read). One element
/// holds [`VALUES`](Self::VALUES) numbers; the head dimension must be a
/// multiple of it.
pub trait CacheElement: Copy + Default + Send + Sync + 'static {
    /// Numbers one element holds.
    const VALUES: usize = 1;
    /// `dst = src`, rounded (`src.len() == dst.len() * VALUES`).
    fn store(src: &[f32], dst: &mut [Self]);
    /// `dst = src`, widened (`dst.len() == src.len() * VALUES`).
    fn load(src: &[Self], dst: &mut [f32]);
    /// [`load`](Self::load) for code compiled with AVX-512F: the same
    /// values, widened by instructions that inline into the caller.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load_avx512(src: &[Self], dst: &mut [f32]) {
        Self::load(src, dst);
    }
    /// [`load`](Self::load) for code compiled with AVX2 and F16C, as
    /// [`load_avx512`](Self::load_avx512) is for AVX-512.
    ///
    /// # Safety
    /// The CPU must have AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load_avx2(src: &[Self], dst: &mut [f32]) {
        Self::load(src, dst);
    }
    /// The cache as numbers that attention may read in place, one per
    /// element (`None`: it widens them first).
    fn floats(_cache: &[Self]) -> Option<CacheFloats<'_>> {
        None
    }
}

/// A cache whose elements are single numbers, which attention's AVX2
/// decode kernels read in place.
#[derive(Clone, Copy, Debug)]
pub enum CacheFloats<'a> {
    /// f32 numbers.
    F32(&'a [f32]),
    /// f16 numbers.
    F16(&'a [f16]),
    /// bf16 numbers.
    Bf16(&'a [bf16]),
}

impl CacheElement for f32 {
    fn store(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn load(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn floats(cache: &[f32]) -> Option<CacheFloats<'_>> {
        Some(CacheFloats::F32(cache))
    }
}

/// f16 and bf16: `half`'s slice conversions, and on AVX-512 and AVX2 the
/// inline widening of [`avx512::widen_16bit`] and [`avx2::widen_16bit`].
macro_rules! half_cache_element {
    ($t:ty, bf16: $bf16:expr, $floats:ident) => {
        impl CacheElement for $t {
            fn floats(cache: &[$t]) -> Option<CacheFloats<'_>> {
                Some(CacheFloats::$floats(cache))
            }
            fn store(src: &[f32], dst: &mut [$t]) {
                dst.convert_from_f32_slice(src);
            }
            fn load(src: &[$t], dst: &mut [f32]) {
                src.convert_to_f32_slice(dst);
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn load_avx512(src: &[$t], dst: &mut [f32]) {
                // SAFETY: the caller guarantees AVX-512F.
                unsafe { avx512::widen_16bit::<$bf16>(src.reinterpret_cast(), dst) };
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn load_avx2(src: &[$t], dst: &mut [f32]) {
                // SAFETY: the caller guarantees AVX2 and F16C.
                unsafe { avx2::widen_16bit::<$bf16>(src.reinterpret_cast(), dst) };
            }
        }
    };
}

/// One f16 (or, with `BF16`, bf16) value's bits widened to f32: the tails
/// of the SIMD widenings.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn widen_half<const BF16: bool>(bits: u16) -> f32 {
    if BF16 {
        bf16::from_bits(bits).to_f32()
    } else {
        f16::from_bits(bits).to_f32()
    }
}

half_cache_element!(f16, bf16: false, F16);
half_cache_element!(bf16, bf16: true, Bf16);

/// llama.cpp's `--cache-type-k/v q8_0`: ggml's Q8_0 quantizer per 32
/// numbers of a head.
impl CacheElement for BlockQ8_0 {
    const VALUES: usize = 32;
    fn store(src: &[f32], dst: &mut [BlockQ8_0]) {
        assert_eq!(src.len(), dst.len() * Self::VALUES, "Q8_0 cache sizes");
        for (x, block) in src.chunks_exact(Self::VALUES).zip(dst) {
            *block = BlockQ8_0::quantize(x);
        }
    }
    fn load(src: &[BlockQ8_0], dst: &mut [f32]) {
        assert_eq!(src.len() * Self::VALUES, dst.len(), "Q8_0 cache sizes");
        for (block, y) in src.iter().zip(dst.chunks_exact_mut(Self::VALUES)) {
            block.dequantize(y);
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load_avx512(src: &[BlockQ8_0], dst: &mut [f32]) {
        // SAFETY: the caller guarantees AVX-512F.
        unsafe { avx512::widen_q8_0(src, dst) };
    }
}

/// The elements of a cache of `T` that hold the `len` numbers from number
/// `at` (both multiples of `T::VALUES`).
fn elements<T: CacheElement>(at: usize, len: usize) -> Range<usize> {
    debug_assert!(at.is_multiple_of(T::VALUES) && len.is_multiple_of(T::VALUES));
    at / T::VALUES..(at + len) / T::VALUES
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
    assert!(
        layout.head_dim.is_multiple_of(T::VALUES),
        "a head of {} numbers in a cache of {}-number elements",
        layout.head_dim,
        T::VALUES
    );
    for seq in sequences {
        let first_position = seq.context_len - seq.rows.len();
        for (i, row) in seq.rows.clone().enumerate() {
            let at = layout.offset(seq.block_table, first_position + i);
            let cached = elements::<T>(at, stride);
            T::store(
                &k[row * stride..(row + 1) * stride],
                &mut k_cache[cached.clone()],
            );
            T::store(&v[row * stride..(row + 1) * stride], &mut v_cache[cached]);
        }
    }
}

/// Query rows per task: the rows that share one widened copy of the keys
/// and values.
const ROW_TILE: usize = 64;

/// `out [T, num_heads, head_dim]`: each query row attends to its sequence's
/// cached positions up to its own (query head `h` reads key/value head
/// `h / (num_heads / num_kv_heads)`).
///
/// Work is split into tasks of (sequence, tile of up to [`ROW_TILE`] query
/// rows, key/value head), run in parallel. A task widens its keys and
/// values out of the paged cache once, then computes each row on its own
/// (see `task`): a row's result does not depend on the rows it is batched
/// with, so prefill, chunked prefill and decode agree to the bit.
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
            && num_heads.is_multiple_of(layout.num_kv_heads)
            && d.is_multiple_of(T::VALUES),
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

/// Softmax of a row's visible scores, after the optional soft cap.
fn softmax_visible(live: &mut [f32], softcap: Option<f32>) {
    if let Some(cap) = softcap {
        live.iter_mut().for_each(|s| *s = cap * (*s / cap).tanh());
    }
    super::norm::softmax_rows(live, live.len());
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod task;
#[cfg(test)]
mod tests;
