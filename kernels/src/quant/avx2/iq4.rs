//! What the IQ4_NL and IQ4_XS kernels add: the lookup of their 4-bit
//! indices ([`iq4_values`], which the exact kernels and IQ4_NL's fast ones
//! share with Q8_0's), and IQ4_XS's fast kernels ([`fast_iq4xs`],
//! [`fast_iq4xs_multi`]).
//!
//! IQ4_XS with Q8_K activations: per sub-block of 32, the signed values
//! times the activations (pairs of products in 16 bits, at most 2·127·127),
//! times the sub-block's six-bit scale less 32 (`|sc| ≤ 32`, so a pair of
//! them stays below 2²¹), summed exactly in 32-bit lanes over the
//! super-block (below 2³¹: 256·127·127·32), then one fused multiply-add a
//! block, `d` times the activations' scale times that sum, as ggml does.
//! The integer sum does not depend on the order of its additions, so the
//! single-row and multi-row kernels give the same bits.

use std::arch::x86_64::*;

use super::super::act::{rows_of, BlockQ8K};
use super::super::format::{iq4xs_scales, marker, Format, IQ4_VALUES};
use super::super::prefetch::rows_prefetched;
use super::{f16_at, hsum_i32, load32_i8, nibbles32};

/// IQ4_NL/IQ4_XS indices (bytes of 0..16) replaced by the signed values
/// they stand for ([`IQ4_VALUES`]): one byte shuffle.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn iq4_values(indices: __m256i) -> __m256i {
    let table = _mm_loadu_si128(IQ4_VALUES.as_ptr().cast());
    _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), indices)
}

/// An IQ4_XS block decoded once for any number of activation rows: per
/// sub-block its values, their magnitudes, and its scale less 32 in every
/// 16-bit lane; and `d`.
struct Iq4xsBlock {
    q: [__m256i; 8],
    abs: [__m256i; 8],
    scale: [__m256i; 8],
    d: f32,
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn decode(b: &[u8]) -> Iq4xsBlock {
    let scales = iq4xs_scales(b);
    let mut w = Iq4xsBlock {
        q: [_mm256_setzero_si256(); 8],
        abs: [_mm256_setzero_si256(); 8],
        scale: [_mm256_setzero_si256(); 8],
        d: f16_at(b, 0),
    };
    for (j, &sc) in scales.iter().enumerate() {
        let q = iq4_values(nibbles32(&b[8 + 16 * j..]));
        w.q[j] = q;
        w.abs[j] = _mm256_sign_epi8(q, q);
        w.scale[j] = _mm256_set1_epi16(i16::from(sc));
    }
    w
}

/// The block's exact integer sum `Σ_j (sc_j − 32) · Σ v·x` with the 256
/// activation quants `qs`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn block_sum(w: &Iq4xsBlock, qs: &[i8]) -> i32 {
    // Two chains of sub-blocks, so that one does not wait on the other.
    let mut sums = [_mm256_setzero_si256(); 2];
    for j in 0..8 {
        let x = load32_i8(&qs[32 * j..]);
        // maddubs needs an unsigned operand: |v| times x with v's sign.
        let pairs = _mm256_maddubs_epi16(w.abs[j], _mm256_sign_epi8(x, w.q[j]));
        let scaled = _mm256_madd_epi16(pairs, w.scale[j]);
        sums[j % 2] = _mm256_add_epi32(sums[j % 2], scaled);
    }
    hsum_i32(_mm256_add_epi32(sums[0], sums[1]))
}

/// IQ4_XS with Q8_K activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fast_iq4xs(w: &[u8], acts: &[BlockQ8K], out: &mut [f32]) {
    fast_iq4xs_multi::<1>(w, acts, acts.len(), out);
}

/// [`fast_iq4xs`] over `R` (at most 8) activation rows at once: each weight
/// block is decoded once for the `R` rows. `acts` holds the `R` rows of
/// `act_len` blocks one after another, `out` the `R` output rows of `n =
/// out.len() / R` values: `out[i * n + r]` is weight row `r` times
/// activation row `i`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fast_iq4xs_multi<const R: usize>(
    w: &[u8],
    acts: &[BlockQ8K],
    act_len: usize,
    out: &mut [f32],
) {
    const { assert!(R >= 1 && R <= 8) };
    let n = out.len() / R;
    let Some(row_bytes) = w.len().checked_div(n) else {
        return;
    };
    let bytes = marker::IQ4XS::BYTES;
    let blocks = (row_bytes / bytes).min(act_len);
    let rows_acts = rows_of::<_, R>(acts, act_len, blocks);
    for (r, row) in rows_prefetched(w, row_bytes).enumerate() {
        let mut acc = [0f32; R];
        for (j, b) in row.chunks_exact(bytes).take(blocks).enumerate() {
            let block = decode(b);
            for (acc, a) in acc.iter_mut().zip(&rows_acts) {
                let a = &a[j];
                *acc = (block.d * a.d).mul_add(block_sum(&block, &a.qs) as f32, *acc);
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            out[i * n + r] = *acc;
        }
    }
}
