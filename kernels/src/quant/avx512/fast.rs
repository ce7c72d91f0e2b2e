//! AVX-512 fast kernels (8-bit activations, integer products) for Q4_0,
//! Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL, 16 weight rows at a time, one per lane.
//!
//! Every fast kernel of these formats on AVX-512, the AMX one (`amx`)
//! included, computes a (weight row, activation row) product in the same
//! arithmetic, so that a product's bits do not depend on the kernel, on how
//! many rows it has, or on whether the CPU has AMX:
//! - per block `b`, in order, the exact integer sum `Σ (q − offset)·a` of
//!   its 32 products, `q` the unsigned quants (Q8_0's signed ones and
//!   IQ4_NL's values plus 128) and `offset` 8, 16 or 128 for Q4_0, Q5_0,
//!   Q8_0 and IQ4_NL, 0 for the formats with a minimum;
//! - `acc = fma(float(sum), d_w · d_a, acc)` from `acc = 0`;
//! - for Q4_1 and Q5_1, then `acc = fma(m_w, d_a · Σa, acc)`.
//!
//! Integer sums per block are what AMX's `tdpbssd`/`tdpbusd` produce (16 × 16
//! of them in one instruction). Here `vpdpbusd` leaves each pair of blocks'
//! sum spread over 8 lanes per block; [`reduce`] adds 16 rows' lanes down to
//! one vector per block, lane `l` holding row [`LANE_ROW`]`[l]`, and the
//! scaling runs on 16 rows at once.
//!
//! Safety: as the parent module's kernels.

use std::arch::x86_64::*;

use super::super::act::rows_of;
use super::super::format::Format;
use super::{load_pair, nibble_index, quant_offset, unsigned_quants};

/// Weight rows a kernel computes together, one per lane.
pub(crate) const LANES: usize = 16;

/// The weight row (of a group of 16) whose sums [`reduce`] leaves in each
/// lane. It is its own inverse.
const LANE_ROW: [u32; LANES] = [0, 4, 2, 6, 1, 5, 3, 7, 8, 12, 10, 14, 9, 13, 11, 15];

/// Two consecutive activation blocks of 32, quantized like
/// [`BlockQ8`](super::super::act::BlockQ8). A row's odd last block is paired
/// with zeros.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub(crate) struct BlockQ8x2 {
    /// The two blocks' quants, in order.
    pub qs: [i8; 64],
    /// Each block's scale.
    pub d: [f32; 2],
    /// Each block's quant sum.
    pub sum: [i32; 2],
    /// Each block's scale × quant sum.
    pub s: [f32; 2],
}

impl Default for BlockQ8x2 {
    fn default() -> Self {
        Self {
            qs: [0; 64],
            d: [0.0; 2],
            sum: [0; 2],
            s: [0.0; 2],
        }
    }
}

impl BlockQ8x2 {
    /// Quantizes 32 or 64 activations.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn quantize(x: &[f32], out: &mut Self) {
        *out = Self::default();
        for (k, (x, qs)) in x
            .chunks_exact(32)
            .zip(out.qs.chunks_exact_mut(32))
            .enumerate()
        {
            let d = super::super::avx2::quantize_run(x, qs);
            let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
            out.d[k] = d;
            out.sum[k] = sum;
            out.s[k] = d * sum as f32;
        }
    }
}

/// Fast kernel for one activation row: `out[r]` = weight row `r` of `w`
/// times `acts`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn fast_32<F: Format>(w: &[u8], acts: &[BlockQ8x2], out: &mut [f32]) {
    fast_32_multi::<F, 1>(w, acts, acts.len(), out);
}

/// Fast kernel over `R` activation rows at once: each pair of blocks of 16
/// weight rows is decoded once for the `R` rows. `acts` holds the `R` rows
/// of `act_len` pairs one after another, `out` the `R` output rows of `n =
/// out.len() / R` values: `out[i * n + r]` is weight row `r` times
/// activation row `i`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn fast_32_multi<F: Format, const R: usize>(
    w: &[u8],
    acts: &[BlockQ8x2],
    act_len: usize,
    out: &mut [f32],
) {
    let n = out.len() / R;
    let Some(row_bytes) = w.len().checked_div(n) else {
        return;
    };
    let rows_acts = rows_of::<_, R>(acts, act_len, act_len);
    let nibbles = nibble_index::<F>();
    for g0 in (0..n).step_by(LANES) {
        let rows = (n - g0).min(LANES);
        let group = &w[g0 * row_bytes..(g0 + rows) * row_bytes];
        let next = &w[(g0 + rows) * row_bytes..(g0 + rows + LANES).min(n) * row_bytes];
        let sums = group_products::<F, R>(group, row_bytes, &rows_acts, nibbles, next);
        for (i, s) in sums.iter().enumerate() {
            let mut y = [0f32; LANES];
            _mm512_storeu_ps(y.as_mut_ptr(), natural_order(*s));
            out[i * n + g0..i * n + g0 + rows].copy_from_slice(&y[..rows]);
        }
    }
}

/// Lanes in [`LANE_ROW`]'s order put back in row order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn natural_order(v: __m512) -> __m512 {
    _mm512_permutexvar_ps(_mm512_loadu_si512(LANE_ROW.as_ptr().cast()), v)
}

/// The products of the (at most 16) weight rows in `w` with each activation
/// row, lane `l` holding weight row [`LANE_ROW`]`[l]`. `next` (the following
/// rows) is prefetched on the way.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn group_products<F: Format, const R: usize>(
    w: &[u8],
    row_bytes: usize,
    acts: &[&[BlockQ8x2]; R],
    nibbles: __m512i,
    next: &[u8],
) -> [__m512; R] {
    let rows = w.len() / row_bytes;
    let blocks = row_bytes / F::BYTES;
    let pairs = blocks.div_ceil(2);
    let offset = quant_offset(F::TY);
    // Byte offsets of each lane's row, for gathering the blocks' scales.
    let mut lane_rows = [0i32; LANES];
    let mut present = 0u16;
    for (l, (&row, at)) in LANE_ROW.iter().zip(&mut lane_rows).enumerate() {
        if (row as usize) < rows {
            *at = (row as usize * row_bytes) as i32;
            present |= 1 << l;
        }
    }
    let lane_rows = _mm512_loadu_si512(lane_rows.as_ptr().cast());
    let prefetch_step = next.len().div_ceil(pairs.max(1)).next_multiple_of(64);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut q = [_mm512_setzero_si512(); LANES];
    for p in 0..pairs {
        let at = 2 * p * F::BYTES;
        let end = row_bytes.min(at + 2 * F::BYTES);
        for (k, q) in q.iter_mut().enumerate().take(rows) {
            let b = &w[k * row_bytes + at..k * row_bytes + end];
            *q = unsigned_quants::<F>(b, load_pair::<F>(b), nibbles);
        }
        if let Some(ahead) = next.get(p * prefetch_step..) {
            for line in ahead[..prefetch_step.min(ahead.len())].chunks(64) {
                _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast());
            }
        }
        let second = 2 * p + 1 < blocks;
        let mut scales = [BlockScales::zero(); 2];
        for (h, scales) in scales.iter_mut().enumerate() {
            let mask = if h == 0 || second { present } else { 0 };
            let at = _mm512_add_epi32(lane_rows, _mm512_set1_epi32((at + h * F::BYTES) as i32));
            // SAFETY: each unmasked lane reads the first 4 bytes of a block
            // of `w` (every block is at least 18 bytes).
            let words = _mm512_mask_i32gather_epi32::<1>(
                _mm512_setzero_si512(),
                mask,
                at,
                w.as_ptr().cast(),
            );
            *scales = BlockScales::new(words);
        }
        for (acc, a) in acc.iter_mut().zip(acts) {
            let a = &a[p];
            let x = _mm512_loadu_si512(a.qs.as_ptr().cast());
            let mut prods = [_mm512_setzero_si512(); LANES];
            for (prod, q) in prods.iter_mut().zip(&q) {
                *prod = _mm512_dpbusd_epi32(_mm512_setzero_si512(), *q, x);
            }
            let sums = reduce(&prods);
            for h in 0..1 + usize::from(second) {
                let sum = _mm512_sub_epi32(sums[h], _mm512_set1_epi32(offset * a.sum[h]));
                *acc = scale_block::<F>(*acc, sum, &scales[h], a.d[h], a.s[h]);
            }
        }
    }
    acc
}

/// A block's scale (and minimum) for each lane's weight row.
#[derive(Clone, Copy)]
struct BlockScales {
    d: __m512,
    m: __m512,
}

impl BlockScales {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn zero() -> Self {
        Self {
            d: _mm512_setzero_ps(),
            m: _mm512_setzero_ps(),
        }
    }

    /// From the first 4 bytes of each row's block (the f16 scale, then for
    /// Q4_1 and Q5_1 the f16 minimum).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn new(words: __m512i) -> Self {
        Self {
            d: _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words)),
            m: _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(words))),
        }
    }
}

/// Adds one block's products to the running sums (the module's contract):
/// `sum` the exact integer sums, `w` the weight rows' scales, `d` and `s`
/// the activation block's scale and scale × quant sum.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn scale_block<F: Format>(
    acc: __m512,
    sum: __m512i,
    w: &BlockScales,
    d: f32,
    s: f32,
) -> __m512 {
    let acc = _mm512_fmadd_ps(
        _mm512_cvtepi32_ps(sum),
        _mm512_mul_ps(w.d, _mm512_set1_ps(d)),
        acc,
    );
    if F::TY.has_min() {
        _mm512_fmadd_ps(w.m, _mm512_set1_ps(s), acc)
    } else {
        acc
    }
}

/// Adds up the 8 lanes each block of a pair takes in 16 rows' `vpdpbusd`
/// products (`prods[k]`: row `k`, lanes 0..8 the first block, 8..16 the
/// second): per block, a vector of the 16 rows' sums in [`LANE_ROW`]'s order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn reduce(prods: &[__m512i; LANES]) -> [__m512i; 2] {
    let mut q = [_mm512_setzero_si512(); 8];
    for (j, q) in q.iter_mut().enumerate() {
        *q = merge::<4>(prods[2 * j], prods[2 * j + 1]);
    }
    let mut s = [_mm512_setzero_si512(); 4];
    for (j, s) in s.iter_mut().enumerate() {
        *s = merge::<2>(q[2 * j], q[2 * j + 1]);
    }
    let t0 = merge::<1>(s[0], s[1]);
    let t1 = merge::<1>(s[2], s[3]);
    [
        _mm512_shuffle_i32x4::<0b01_00_01_00>(t0, t1),
        _mm512_shuffle_i32x4::<0b11_10_11_10>(t0, t1),
    ]
}

/// One step of [`reduce`]: in every group of `2H` lanes, the first `H` get
/// the sum of `a`'s two halves of the group, the last `H` that of `b`'s.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn merge<const H: usize>(a: __m512i, b: __m512i) -> __m512i {
    let high = match H {
        4 => 0xF0F0,
        2 => 0xCCCC,
        _ => 0xAAAA,
    };
    let kept = _mm512_mask_blend_epi32(high, a, b);
    let other = _mm512_mask_blend_epi32(high, b, a);
    let swapped = match H {
        4 => _mm512_shuffle_i32x4::<0b10_11_00_01>(other, other),
        2 => _mm512_shuffle_epi32::<0b01_00_11_10>(other),
        _ => _mm512_shuffle_epi32::<0b10_11_00_01>(other),
    };
    _mm512_add_epi32(kept, swapped)
}
