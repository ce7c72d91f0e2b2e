//! What the IQ4_NL and IQ4_XS kernels add: the lookup of their 4-bit
//! indices ([`iq4_values`], which the exact kernels and IQ4_NL's fast ones
//! share with Q8_0's), and IQ4_XS's fast kernel ([`fast_iq4xs`]).
//!
//! IQ4_XS with Q8_K activations: per sub-block of 32, the signed values
//! times the activations (pairs of products in 16 bits, at most 2·127·127),
//! times the sub-block's six-bit scale less 32 (`|sc| ≤ 32`, so a pair of
//! them stays below 2²¹), summed in 32-bit lanes over the super-block and
//! scaled once by `d` times the activations' scale, as ggml does.

use std::arch::x86_64::*;

use super::super::act::BlockQ8K;
use super::super::format::{iq4xs_scales, marker, Format, IQ4_VALUES};
use super::super::prefetch::rows_prefetched;
use super::{f16_at, hsum, load32_i8, nibbles32};

/// IQ4_NL/IQ4_XS indices (bytes of 0..16) replaced by the signed values
/// they stand for ([`IQ4_VALUES`]): one byte shuffle.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn iq4_values(indices: __m256i) -> __m256i {
    let table = _mm_loadu_si128(IQ4_VALUES.as_ptr().cast());
    _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), indices)
}

/// IQ4_XS with Q8_K activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fast_iq4xs(w: &[u8], acts: &[BlockQ8K], out: &mut [f32]) {
    type F = marker::IQ4XS;
    let row_bytes = acts.len() * F::BYTES;
    for (row, y) in rows_prefetched(w, row_bytes).zip(out) {
        *y = fast_iq4xs_row(row, acts);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn fast_iq4xs_row(row: &[u8], acts: &[BlockQ8K]) -> f32 {
    type F = marker::IQ4XS;
    let mut acc = [_mm256_setzero_ps(); 2];
    for (i, (b, a)) in row.chunks_exact(F::BYTES).zip(acts).enumerate() {
        let scales = iq4xs_scales(b);
        // Two chains of sub-blocks, so that one does not wait on the other.
        let mut sums = [_mm256_setzero_si256(); 2];
        for (j, &sc) in scales.iter().enumerate() {
            let q = iq4_values(nibbles32(&b[8 + 16 * j..]));
            let x = load32_i8(&a.qs[32 * j..]);
            // maddubs needs an unsigned operand: |q| times x with q's sign.
            let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
            let scaled = _mm256_madd_epi16(pairs, _mm256_set1_epi16(i16::from(sc)));
            sums[j % 2] = _mm256_add_epi32(sums[j % 2], scaled);
        }
        let sum = _mm256_cvtepi32_ps(_mm256_add_epi32(sums[0], sums[1]));
        let d = _mm256_set1_ps(f16_at(b, 0) * a.d);
        acc[i % 2] = _mm256_fmadd_ps(d, sum, acc[i % 2]);
    }
    hsum(_mm256_add_ps(acc[0], acc[1]))
}
