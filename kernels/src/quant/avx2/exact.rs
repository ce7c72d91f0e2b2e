//! The exact kernels (f32 activations) of the K-quants and of any format
//! without one of its own ([`exact_any`]), and the widening helpers they
//! share with `exact_32` (the 32-value formats): each block's quants widened
//! to f32 and multiplied with FMA, two accumulators a row (over the
//! sub-blocks of each pair), each sub-block's scale applied to its sum.
//!
//! Widening is most of a single row's work (the multi-row kernels share it).
//! Q4_K's quants widen straight from the packed bytes, eight at a time by a
//! widening load (`vpmovzxbd`), the high nibbles by a shift; Q5_0's and
//! Q5_1's fifth bits come by a variable shift of their word: no byte
//! shuffles. The sums of the activation blocks, which the minimums multiply,
//! are taken once per product.

use std::arch::x86_64::*;

use super::super::format::{marker, Format, Unpacked, QK_K};
use super::super::prefetch::rows_prefetched;
use super::super::QuantType;
use super::{f16_at, hsum, k4_scales_mins_words, load8, q45k_group, q5k_high_bits, q6k_half};

/// Loads 32 f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load32_f32(x: &[f32]) -> [__m256; 4] {
    [load8(x), load8(&x[8..]), load8(&x[16..]), load8(&x[24..])]
}

/// Products of 32 quants (as f32, values 0..8, 8..16, 16..24, 24..32) with
/// 32 f32: the first 16 summed into eight lanes, and the last 16.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot32(q: &[__m256; 4], x: &[__m256; 4]) -> (__m256, __m256) {
    let a = _mm256_fmadd_ps(q[1], x[1], _mm256_mul_ps(q[0], x[0]));
    let b = _mm256_fmadd_ps(q[3], x[3], _mm256_mul_ps(q[2], x[2]));
    (a, b)
}

/// 32 signed bytes as f32 (values 0..8, 8..16, 16..24, 24..32).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn i8x32_to_f32(q: __m256i) -> [__m256; 4] {
    let (lo, hi) = (_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
    [
        i8x8_to_f32(lo),
        i8x8_to_f32(_mm_unpackhi_epi64(lo, lo)),
        i8x8_to_f32(hi),
        i8x8_to_f32(_mm_unpackhi_epi64(hi, hi)),
    ]
}

/// The eight signed bytes at the start of `b` as f32 (one widening load).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn i8x8_at(b: &[u8]) -> __m256 {
    i8x8_to_f32(_mm_loadl_epi64(b[..8].as_ptr().cast()))
}

/// The eight bytes of packed nibbles at the start of `b`, each with its
/// fifth bit from `fifth` (0 or 16 in each lane: the low nibbles', and the
/// high ones'), as f32: the low nibbles, and the high ones. One widening
/// load, no byte shuffles.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn nibbles8_to_f32(b: &[u8], fifth: [__m256i; 2]) -> [__m256; 2] {
    let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(b[..8].as_ptr().cast()));
    let f32_of = |v, fifth| _mm256_cvtepi32_ps(_mm256_or_si256(v, fifth));
    [
        f32_of(_mm256_and_si256(v, _mm256_set1_epi32(0xF)), fifth[0]),
        f32_of(_mm256_srli_epi32::<4>(v), fifth[1]),
    ]
}

/// 16 bytes of packed nibbles at the start of `b` (byte `i` holding value
/// `i` and value `16 + i`), with the fifth bits `qh` (bit `j` value `j`'s;
/// zero for the 4-bit formats), as 32 f32 (values 0..8, 8..16, 16..24,
/// 24..32).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn nibbles_to_f32(b: &[u8], qh: u32) -> [__m256; 4] {
    let fifth = fifth_bits(qh);
    let ([low0, high0], [low1, high1]) = (
        nibbles8_to_f32(b, [fifth[0], fifth[2]]),
        nibbles8_to_f32(&b[8..], [fifth[1], fifth[3]]),
    );
    [low0, low1, high0, high1]
}

/// Bit `j` of `qh` moved to bit 4 of lane `j % 8` of vector `j / 8` (0 or
/// 16): a variable shift and a mask a vector, no byte shuffles.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn fifth_bits(qh: u32) -> [__m256i; 4] {
    let sixteen = _mm256_set1_epi32(16);
    // Bits 0..24 from `qh << 4` (shifted right by j), bits 24..32 from `qh`
    // (by j - 4): every count within 0..32.
    let (low, high) = (
        _mm256_set1_epi32((qh << 4) as i32),
        _mm256_set1_epi32(qh as i32),
    );
    let bit = |word, first| {
        let counts = _mm256_setr_epi32(
            first,
            first + 1,
            first + 2,
            first + 3,
            first + 4,
            first + 5,
            first + 6,
            first + 7,
        );
        _mm256_and_si256(_mm256_srlv_epi32(word, counts), sixteen)
    };
    [bit(low, 0), bit(low, 8), bit(low, 16), bit(high, 20)]
}

/// The low eight signed bytes of `v` as f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn i8x8_to_f32(v: __m128i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
}

/// Sum of 32 f32, in eight lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn sum32(x: &[__m256; 4]) -> __m256 {
    _mm256_add_ps(_mm256_add_ps(x[0], x[1]), _mm256_add_ps(x[2], x[3]))
}

/// f32 dot product.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let (a32, b32) = (a.chunks_exact(32), b.chunks_exact(32));
    let tail = super::super::scalar::dot_f32(a32.remainder(), b32.remainder());
    let mut acc = [_mm256_setzero_ps(); 4];
    for (x, y) in a32.zip(b32) {
        for (k, acc) in acc.iter_mut().enumerate() {
            *acc = _mm256_fmadd_ps(load8(&x[8 * k..]), load8(&y[8 * k..]), *acc);
        }
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    hsum(s) + tail
}

/// Any format: dequantizes one block at a time (portable code) and takes the
/// dot product with FMA.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exact_any<F: Format>(w: &[u8], x: &[f32], out: &mut [f32]) {
    let row_bytes = x.len() / F::ELEMS * F::BYTES;
    let mut u = Unpacked::default();
    let mut buf = [0f32; QK_K];
    let buf = &mut buf[..F::ELEMS];
    for (row, y) in rows_prefetched(w, row_bytes).zip(out) {
        let mut acc = 0.0;
        for (block, xs) in row.chunks_exact(F::BYTES).zip(x.chunks_exact(F::ELEMS)) {
            F::TY.dequantize_block(block, &mut u, buf);
            acc += dot_f32(buf, xs);
        }
        *y = acc;
    }
}

/// A block of activations' sum in eight lanes, which the weight blocks'
/// minimums multiply: taken once for a product, not once for each weight
/// row.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn block_sum(x: &[f32; 32]) -> __m256 {
    sum32(&load32_f32(x))
}

/// The `R` activation rows of `cols` values in `x` as blocks of 32, and
/// with `sums` each block's [`block_sum`] (empty without).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn row_blocks<const R: usize>(
    x: &[f32],
    cols: usize,
    sums: bool,
) -> ([&[[f32; 32]]; R], [Vec<__m256>; R]) {
    let xs: [&[[f32; 32]]; R] = std::array::from_fn(|i| x[i * cols..][..cols].as_chunks().0);
    let sums = std::array::from_fn(|i| {
        let x = if sums { xs[i] } else { &[] };
        x.iter().map(|x| block_sum(x)).collect()
    });
    (xs, sums)
}

/// Q4_K and Q5_K (the single-row kernel: [`exact_q45k_multi`] for one row).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exact_q45k<F: Format>(w: &[u8], x: &[f32], out: &mut [f32]) {
    exact_q45k_multi::<F, 1>(w, x, x.len(), out);
}

/// Q4_K and Q5_K over `R` activation rows of `cols` values each (one after
/// another in `x`): each group of two sub-blocks is decoded once for the
/// `R` rows. `out[i * n + r]` = weight row `r` · activation row `i`, with
/// `n = out.len() / R` weight rows; each row's sums take the same steps
/// whatever `R`, so every `R` gives [`exact_q45k`]'s bits.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exact_q45k_multi<F: Format, const R: usize>(
    w: &[u8],
    x: &[f32],
    cols: usize,
    out: &mut [f32],
) {
    let n = out.len() / R;
    let (xs, sums) = row_blocks::<R>(x, cols, true);
    let row_bytes = (cols / QK_K * F::BYTES).max(1);
    for (r, row) in rows_prefetched(w, row_bytes).take(n).enumerate() {
        // Per activation row: the low and the high sub-blocks' sums.
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for (s, b) in row.chunks_exact(F::BYTES).enumerate() {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let sm = k4_scales_mins_words(&b[4..16]);
            let (sc, mn) = (words_to_bytes(sm[0], sm[1]), words_to_bytes(sm[2], sm[3]));
            let mut qh = q5k_high_bits::<F>(b);
            for p in 0..4 {
                let [low, high] = q45k_group_f32::<F>(b, p, &mut qh);
                let (j, at) = (2 * p, 8 * s + 2 * p);
                let factors = |j: usize| {
                    let scale = _mm256_set1_ps(d * f32::from(sc[j]));
                    (scale, _mm256_set1_ps(-dmin * f32::from(mn[j])))
                };
                let (f_low, f_high) = (factors(j), factors(j + 1));
                for ((acc, x), sums) in acc.iter_mut().zip(&xs).zip(&sums) {
                    let [acc_low, acc_high] = acc;
                    q45k_sub_block(acc_low, &low, &x[at], sums[at], f_low);
                    q45k_sub_block(acc_high, &high, &x[at + 1], sums[at + 1], f_high);
                }
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            out[i * n + r] = hsum(_mm256_add_ps(acc[0], acc[1]));
        }
    }
}

/// Adds a Q4_K/Q5_K sub-block (quants `q`) times 32 activations `x` (of
/// sum `sum`) to `acc`, given the sub-block's scale and minus its minimum.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q45k_sub_block(
    acc: &mut __m256,
    q: &[__m256; 4],
    x: &[f32; 32],
    sum: __m256,
    (scale, min): (__m256, __m256),
) {
    let (lo, hi) = dot32(q, &load32_f32(x));
    *acc = _mm256_fmadd_ps(scale, _mm256_add_ps(lo, hi), *acc);
    *acc = _mm256_fmadd_ps(min, sum, *acc);
}

/// [`q45k_group`]'s two sub-blocks as f32; Q4_K's straight from the packed
/// bytes by widening loads.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q45k_group_f32<F: Format>(b: &[u8], p: usize, qh: &mut __m256i) -> [[__m256; 4]; 2] {
    if F::TY == QuantType::Q4K {
        let qs = &b[16 + 32 * p..][..32];
        let v: [[__m256; 2]; 4] =
            std::array::from_fn(|k| nibbles8_to_f32(&qs[8 * k..], [_mm256_setzero_si256(); 2]));
        [v.map(|[low, _]| low), v.map(|[_, high]| high)]
    } else {
        let (low, high) = q45k_group::<F>(b, p, qh);
        [i8x32_to_f32(low), i8x32_to_f32(high)]
    }
}

/// The bytes of two little-endian words.
#[inline(always)]
fn words_to_bytes(a: u32, b: u32) -> [u8; 8] {
    (u64::from(a) | u64::from(b) << 32).to_le_bytes()
}

/// Q6_K (the single-row kernel: [`exact_q6k_multi`] for one row).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exact_q6k(w: &[u8], x: &[f32], out: &mut [f32]) {
    exact_q6k_multi::<1>(w, x, x.len(), out);
}

/// Q6_K over `R` activation rows, as [`exact_q45k_multi`]: each 32 quants
/// widened once for the `R` rows, every `R` giving [`exact_q6k`]'s bits.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exact_q6k_multi<const R: usize>(
    w: &[u8],
    x: &[f32],
    cols: usize,
    out: &mut [f32],
) {
    const BYTES: usize = <marker::Q6K as Format>::BYTES;
    let n = out.len() / R;
    let (xs, _) = row_blocks::<R>(x, cols, false);
    let row_bytes = (cols / QK_K * BYTES).max(1);
    for (r, row) in rows_prefetched(w, row_bytes).take(n).enumerate() {
        // Per activation row: the sums of the even and the odd sub-blocks
        // of 16.
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for (s, b) in row.chunks_exact(BYTES).enumerate() {
            let d = f16_at(b, 208);
            let scales = &b[192..208];
            for h in 0..2 {
                for (k, q) in q6k_half(b, h).into_iter().enumerate() {
                    let q = i8x32_to_f32(_mm256_sub_epi8(q, _mm256_set1_epi8(32)));
                    let j = 8 * h + 2 * k;
                    let s_lo = _mm256_set1_ps(d * f32::from(scales[j] as i8));
                    let s_hi = _mm256_set1_ps(d * f32::from(scales[j + 1] as i8));
                    for (acc, x) in acc.iter_mut().zip(&xs) {
                        let (lo, hi) = dot32(&q, &load32_f32(&x[8 * s + 4 * h + k]));
                        acc[0] = _mm256_fmadd_ps(s_lo, lo, acc[0]);
                        acc[1] = _mm256_fmadd_ps(s_hi, hi, acc[1]);
                    }
                }
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            out[i * n + r] = hsum(_mm256_add_ps(acc[0], acc[1]));
        }
    }
}
