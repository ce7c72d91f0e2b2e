//! The super-block formats whose scales cover runs of 16 values: Q2_K,
//! Q3_K and Q6_K.
//!
//! Their fast kernels (8-bit activations) share one shape: a super-block's
//! eight groups of 32 values as unsigned bytes ([`k16_half`]), each group's
//! two runs times their scales (`maddubs`, then `madd` with the scales
//! widened to 16 bits), and the formats' offsets through the activations'
//! sums of 16 (`bsums`): Q6_K's −32 and Q3_K's −4 times each run's scale,
//! Q2_K's minimums. A super-block's integer totals are exact, so the
//! single-row ([`fast_k16`]) and multi-row ([`fast_k16_multi`]) kernels
//! give the same bits, as do the AMX kernels of Q6_K (`avx512::amx`).
//!
//! Q2_K and Q3_K store four 2-bit planes in each 32 bytes of quants (value
//! `32·k + l` of a 128-value half in bits `2·k` of byte `l`); Q3_K's third
//! bit comes from its 32-byte mask, bit `4·h + k` of byte `l`, set for the
//! values that are not lowered by 4. [`low_bits_group`] also gives the
//! exact kernels their quants (`exact_k`).

use std::arch::x86_64::*;

use super::super::act::{rows_of, BlockQ8K};
use super::super::format::{q3k_scales_words, Format};
use super::super::prefetch::rows_prefetched;
use super::super::QuantType;
use super::{f16_at, hsum_i32, load32, load32_i8, q6k_half, sum128_i32};

/// The unsigned quants of group `t` (values `32·t .. 32·t + 32`) of a
/// Q2_K or Q3_K super-block `b`: Q2_K's quants (0..4), Q3_K's plus 4
/// (0..8).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn low_bits_group<F: Format>(b: &[u8], t: usize) -> __m256i {
    let (h, k) = (t / 4, t % 4);
    let three = F::TY == QuantType::Q3K;
    let bits = load32(&b[if three { 32 } else { 16 } + 32 * h..]);
    let shift = _mm_cvtsi32_si128(2 * k as i32);
    let low = _mm256_and_si256(_mm256_srl_epi16(bits, shift), _mm256_set1_epi8(3));
    if !three {
        return low;
    }
    let bit = _mm256_set1_epi8((1u8 << (4 * h + k)) as i8);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(load32(&b[..32]), bit), bit);
    _mm256_or_si256(low, _mm256_and_si256(set, _mm256_set1_epi8(4)))
}

/// The unsigned quants of half `h` (values `128·h .. 128·h + 128`) of a
/// Q2_K, Q3_K or Q6_K super-block, 32 values a vector.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k16_half<F: Format>(b: &[u8], h: usize) -> [__m256i; 4] {
    if F::TY == QuantType::Q6K {
        q6k_half(b, h)
    } else {
        // No closure (`map`): it would not inherit the target features.
        [
            low_bits_group::<F>(b, 4 * h),
            low_bits_group::<F>(b, 4 * h + 1),
            low_bits_group::<F>(b, 4 * h + 2),
            low_bits_group::<F>(b, 4 * h + 3),
        ]
    }
}

/// The 16 scales of a Q2_K, Q3_K or Q6_K super-block `b` as signed bytes
/// (Q3_K's less 32; Q2_K's low nibbles).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn k16_scales<F: Format>(b: &[u8]) -> __m128i {
    match F::TY {
        QuantType::Q6K => _mm_loadu_si128(b[192..208].as_ptr().cast()),
        QuantType::Q2K => {
            _mm_and_si128(_mm_loadu_si128(b[..16].as_ptr().cast()), _mm_set1_epi8(0xF))
        }
        QuantType::Q3K => {
            let [w0, w1, w2, w3] = q3k_scales_words(&b[96..108]).map(|w| w as i32);
            _mm_sub_epi8(_mm_setr_epi32(w0, w1, w2, w3), _mm_set1_epi8(32))
        }
        _ => unreachable!("{} has no 16-value scales", F::TY),
    }
}

/// The 16 minimums of a Q2_K super-block `b` (its scale bytes' high
/// nibbles).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q2k_min_bytes(b: &[u8]) -> __m128i {
    let raw = _mm_loadu_si128(b[..16].as_ptr().cast());
    _mm_and_si128(_mm_srli_epi16::<4>(raw), _mm_set1_epi8(0xF))
}

/// Offset of the f16 scale `d` in a Q2_K, Q3_K or Q6_K super-block (Q2_K's
/// minimums' `dmin` follows it).
pub(super) const fn k16_d_at(ty: QuantType) -> usize {
    match ty {
        QuantType::Q2K => 80,
        QuantType::Q3K => 108,
        _ => 208,
    }
}

/// Shuffles that widen scales `2·t` and `2·t + 1` of [`k16_scales`] to
/// the 16-bit lanes of group `t`'s two runs (low and high 128-bit halves).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn run_scales(scales: __m128i, t: usize) -> __m256i {
    let j = 2 * t as u8;
    let pick = _mm_set_epi64x(i64::from_le_bytes([j + 1; 8]), i64::from_le_bytes([j; 8]));
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, pick))
}

/// A super-block's integer total before its products: the offset of Q6_K
/// (−32) or Q3_K (−4) times Σ scale·(sum of the run's 16 activations), in
/// eight lanes; zero for Q2_K, whose minimums [`q2k_mins`] takes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn offsets<F: Format>(scales16: __m256i, bsums: __m256i) -> __m256i {
    let sums = _mm256_madd_epi16(scales16, bsums);
    let zero = _mm256_setzero_si256();
    match F::TY {
        QuantType::Q6K => _mm256_slli_epi32::<5>(_mm256_sub_epi32(zero, sums)),
        QuantType::Q3K => _mm256_slli_epi32::<2>(_mm256_sub_epi32(zero, sums)),
        _ => zero,
    }
}

/// The 16 minimums of a Q2_K super-block `b` in 16-bit lanes (zero for
/// the other formats).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q2k_mins16<F: Format>(b: &[u8]) -> __m256i {
    if F::TY != QuantType::Q2K {
        return _mm256_setzero_si256();
    }
    _mm256_cvtepu8_epi16(q2k_min_bytes(b))
}

/// Σ minimum·(sum of the run's 16 activations) of a Q2_K super-block whose
/// minimums are `mins16` ([`q2k_mins16`]; zero for the other formats).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q2k_mins<F: Format>(mins16: __m256i, bsums: __m256i) -> i32 {
    if F::TY != QuantType::Q2K {
        return 0;
    }
    let m = _mm256_madd_epi16(mins16, bsums);
    sum128_i32(_mm_add_epi32(
        _mm256_castsi256_si128(m),
        _mm256_extracti128_si256::<1>(m),
    ))
}

/// Adds a super-block's product to `acc` from its exact integer totals
/// (the contract of the fast kernels of these formats, AMX's included):
/// `sum` = Σ scale·((quants − offset)·activations), `mins` = Σ
/// minimum·(run sums) for Q2_K; `b` the weight block, `d` the activations'
/// scale.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn scale_k16<F: Format>(acc: f32, sum: i32, mins: i32, b: &[u8], d: f32) -> f32 {
    let at = k16_d_at(F::TY);
    let acc = (sum as f32).mul_add(f16_at(b, at) * d, acc);
    if F::TY == QuantType::Q2K {
        (-(mins as f32)).mul_add(f16_at(b, at + 2) * d, acc)
    } else {
        acc
    }
}

/// Q2_K, Q3_K and Q6_K with Q8_K activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fast_k16<F: Format>(w: &[u8], acts: &[BlockQ8K], out: &mut [f32]) {
    by_rows!(fast_k16_row::<F>, w, acts.len(), acts, out);
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn fast_k16_row<F: Format>(row: &[u8], acts: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in row.chunks_exact(F::BYTES).zip(acts) {
        let scales = k16_scales::<F>(b);
        let bsums = _mm256_loadu_si256(a.bsums.as_ptr().cast());
        let mut sumi = offsets::<F>(_mm256_cvtepi8_epi16(scales), bsums);
        for h in 0..2 {
            for (k, q) in k16_half::<F>(b, h).into_iter().enumerate() {
                let t = 4 * h + k;
                let p = _mm256_maddubs_epi16(q, load32_i8(&a.qs[32 * t..]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, run_scales(scales, t)));
            }
        }
        let mins = q2k_mins::<F>(q2k_mins16::<F>(b), bsums);
        acc = scale_k16::<F>(acc, hsum_i32(sumi), mins, b, a.d);
    }
    acc
}

/// [`fast_k16`] over `R` (at most 8) activation rows at once, with
/// `fast_q45k_multi`'s layout of `acts` and `out`: each weight block is
/// decoded once for the `R` rows, and the results are bit for bit what
/// [`fast_k16`] gives (integer totals in any order, then the same
/// floating-point steps, [`scale_k16`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fast_k16_multi<F: Format, const R: usize>(
    w: &[u8],
    acts: &[BlockQ8K],
    act_len: usize,
    out: &mut [f32],
) {
    const { assert!(R <= 8) };
    let n = out.len() / R;
    let Some(row_bytes) = w.len().checked_div(n) else {
        return;
    };
    let blocks = (row_bytes / F::BYTES).min(act_len);
    let rows_acts = rows_of::<_, R>(acts, act_len, blocks);
    for (r, row) in rows_prefetched(w, row_bytes).enumerate() {
        let mut acc = [0f32; R];
        for (j, b) in row.chunks_exact(F::BYTES).take(blocks).enumerate() {
            // The block's quants and scales are decoded once, then each
            // activation row's sum.
            let scales = k16_scales::<F>(b);
            let scales16 = _mm256_cvtepi8_epi16(scales);
            let mins16 = q2k_mins16::<F>(b);
            let mut quants = [_mm256_setzero_si256(); 8];
            let mut picks = [_mm256_setzero_si256(); 8];
            for h in 0..2 {
                for (k, q) in k16_half::<F>(b, h).into_iter().enumerate() {
                    quants[4 * h + k] = q;
                    picks[4 * h + k] = run_scales(scales, 4 * h + k);
                }
            }
            for (acc, a) in acc.iter_mut().zip(&rows_acts) {
                let a = &a[j];
                let bsums = _mm256_loadu_si256(a.bsums.as_ptr().cast());
                let mut sumi = offsets::<F>(scales16, bsums);
                for (t, (q, scale)) in quants.iter().zip(&picks).enumerate() {
                    let p = _mm256_maddubs_epi16(*q, load32_i8(&a.qs[32 * t..]));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, *scale));
                }
                let mins = q2k_mins::<F>(mins16, bsums);
                *acc = scale_k16::<F>(*acc, hsum_i32(sumi), mins, b, a.d);
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            out[i * n + r] = *acc;
        }
    }
}
