//! The exact kernels (f32 activations) of the 256-value formats: Q2_K to
//! Q6_K and IQ4_XS.
//!
//! Each weight is dequantized to f32 by one rounding: `q·(d·sc) − dmin·m`
//! by a fused multiply-add for Q2_K, Q4_K and Q5_K, `(q − 32)·(d·sc)` by a
//! multiply for Q6_K (`q − 4` for Q3_K, `d·(sc − 32)` its scale),
//! `v·(d·(sc − 32))` for IQ4_XS (`v` the index's table value): the values
//! ggml computes, and the AVX-512 kernels'.
//! The products are then summed as `panel` says, so one activation row
//! ([`exact_k`], each quarter super-block dequantized as it is read), two
//! or three ([`exact_k_multi`]) and many (the panel kernels, from
//! [`dequantize_block`]) give the same bits.

use std::arch::x86_64::*;

use super::super::format::{iq4xs_scales, k4_scales_mins_words, Format, QK_K};
use super::super::prefetch::rows_prefetched;
use super::super::QuantType;
use super::exact::{i8x32_to_f32, nibbles8_to_f32};
use super::iq4::iq4_values;
use super::k16::{k16_d_at, k16_scales, low_bits_group, q2k_min_bytes};
use super::panel::{add_products, finish, ChainRow};
use super::{f16_at, nibbles32, q45k_group, q5k_high_bits, q6k_quarter};

/// A super-block's multipliers and addends: weight `q` of run `r` (see
/// [`run`]) is `q · mul[r] + add[r]`, rounded once; Q3_K, Q6_K and IQ4_XS
/// have no addends (their quants come with their offset taken off:
/// `(q − 32) · mul[r]`).
#[derive(Default)]
struct Scales {
    mul: [f32; 16],
    add: [f32; 16],
}

/// Whether the format's scales cover runs of 16 values (Q2_K, Q3_K,
/// Q6_K), not 32.
const fn runs_of_16(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q2K | QuantType::Q3K | QuantType::Q6K)
}

/// Whether the format has no minimums: its weights are `q · mul[r]`.
const fn no_addends(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q3K | QuantType::Q6K | QuantType::IQ4XS)
}

/// The run of [`Scales`] that values `64·p + 8·v .. 64·p + 8·v + 8` of a
/// super-block belong to.
#[inline(always)]
fn run<F: Format>(p: usize, v: usize) -> usize {
    if runs_of_16(F::TY) {
        4 * p + v / 2
    } else {
        2 * p + v / 4
    }
}

/// The [`Scales`] of super-block `b`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scales<F: Format>(b: &[u8]) -> Scales {
    let mut s = Scales::default();
    if runs_of_16(F::TY) {
        let d = f16_at(b, k16_d_at(F::TY));
        let sc = k16_scales::<F>(b);
        let high = _mm_unpackhi_epi64(sc, sc);
        _mm256_storeu_ps(s.mul.as_mut_ptr(), scaled(_mm256_cvtepi8_epi32(sc), d));
        _mm256_storeu_ps(
            s.mul[8..].as_mut_ptr(),
            scaled(_mm256_cvtepi8_epi32(high), d),
        );
        if F::TY == QuantType::Q2K {
            let mins = q2k_min_bytes(b);
            let dmin = -f16_at(b, k16_d_at(F::TY) + 2);
            let high = _mm_unpackhi_epi64(mins, mins);
            _mm256_storeu_ps(s.add.as_mut_ptr(), scaled(_mm256_cvtepu8_epi32(mins), dmin));
            _mm256_storeu_ps(
                s.add[8..].as_mut_ptr(),
                scaled(_mm256_cvtepu8_epi32(high), dmin),
            );
        }
    } else if F::TY == QuantType::IQ4XS {
        let sc = i64::from_le_bytes(iq4xs_scales(b).map(|s| s as u8));
        let sc = _mm_cvtsi64_si128(sc);
        _mm256_storeu_ps(
            s.mul.as_mut_ptr(),
            scaled(_mm256_cvtepi8_epi32(sc), f16_at(b, 0)),
        );
    } else {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let [sc0, sc1, mn0, mn1] = k4_scales_mins_words(&b[4..16]);
        let (sc, mn) = (
            _mm_setr_epi32(sc0 as i32, sc1 as i32, 0, 0),
            _mm_setr_epi32(mn0 as i32, mn1 as i32, 0, 0),
        );
        _mm256_storeu_ps(s.mul.as_mut_ptr(), scaled(_mm256_cvtepu8_epi32(sc), d));
        _mm256_storeu_ps(s.add.as_mut_ptr(), scaled(_mm256_cvtepu8_epi32(mn), -dmin));
    }
    s
}

/// Eight small integers (scales or minimums, widened to i32) as f32, times
/// `d`: exact (11 × 8 significant bits), so the weights `(d·sc)·(q − 32)`
/// and `q·(d·sc) − dmin·m` round once, like ggml's `d·sc·(q − 32)` and
/// `d·sc·q − dmin·m`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scaled(v: __m256i, d: f32) -> __m256 {
    _mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(d))
}

/// The quants of values `64·p .. 64·p + 64` of super-block `b` as f32, in
/// order (eight at a time; Q6_K's less 32). For Q5_K, `qh` holds the fifth
/// bits still to come, as `q45k_group` takes them: quarters go in order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn quarter_quants<F: Format>(b: &[u8], p: usize, qh: &mut __m256i) -> [__m256; 8] {
    // No closures here: `array::from_fn` and `map` were not inlined into
    // the kernels' loops.
    let ([l0, l1, l2, l3], [h0, h1, h2, h3]) = match F::TY {
        // Straight from the packed bytes by widening loads: the quarter's
        // first 32 values are the low nibbles of its 32 bytes, the next 32
        // the high ones.
        QuantType::Q4K => {
            let qs = &b[16 + 32 * p..][..32];
            let zero = [_mm256_setzero_si256(); 2];
            let ([l0, h0], [l1, h1], [l2, h2], [l3, h3]) = (
                nibbles8_to_f32(qs, zero),
                nibbles8_to_f32(&qs[8..], zero),
                nibbles8_to_f32(&qs[16..], zero),
                nibbles8_to_f32(&qs[24..], zero),
            );
            ([l0, l1, l2, l3], [h0, h1, h2, h3])
        }
        QuantType::Q5K => {
            let (low, high) = q45k_group::<F>(b, p, qh);
            (i8x32_to_f32(low), i8x32_to_f32(high))
        }
        QuantType::Q6K => {
            let [low, high] = q6k_quarter(b, p);
            let offset = _mm256_set1_epi8(32);
            (
                i8x32_to_f32(_mm256_sub_epi8(low, offset)),
                i8x32_to_f32(_mm256_sub_epi8(high, offset)),
            )
        }
        QuantType::Q2K | QuantType::Q3K => {
            let (low, high) = (
                low_bits_group::<F>(b, 2 * p),
                low_bits_group::<F>(b, 2 * p + 1),
            );
            if F::TY == QuantType::Q3K {
                let four = _mm256_set1_epi8(4);
                (
                    i8x32_to_f32(_mm256_sub_epi8(low, four)),
                    i8x32_to_f32(_mm256_sub_epi8(high, four)),
                )
            } else {
                (i8x32_to_f32(low), i8x32_to_f32(high))
            }
        }
        QuantType::IQ4XS => {
            // The quarter's two sub-blocks, 16 bytes each.
            let qs = &b[8 + 32 * p..][..32];
            (
                i8x32_to_f32(iq4_values(nibbles32(qs))),
                i8x32_to_f32(iq4_values(nibbles32(&qs[16..]))),
            )
        }
        _ => unreachable!("{} has no exact AVX2 super-block kernels", F::TY),
    };
    [l0, l1, l2, l3, h0, h1, h2, h3]
}

/// Values `64·p .. 64·p + 64` of super-block `b` dequantized (eight at a
/// time), given its [`Scales`] and, for Q5_K, the fifth bits still to come.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dequantize_quarter<F: Format>(
    b: &[u8],
    p: usize,
    s: &Scales,
    qh: &mut __m256i,
) -> [__m256; 8] {
    let mut w = quarter_quants::<F>(b, p, qh);
    for (v, w) in w.iter_mut().enumerate() {
        let r = run::<F>(p, v);
        let mul = _mm256_set1_ps(s.mul[r]);
        *w = if no_addends(F::TY) {
            _mm256_mul_ps(*w, mul)
        } else {
            _mm256_fmadd_ps(*w, mul, _mm256_set1_ps(s.add[r]))
        };
    }
    w
}

/// `out[r]` = weight row `r` · `x` (one activation row: [`exact_k_multi`]
/// for one row).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exact_k<F: Format>(w: &[u8], x: &[f32], out: &mut [f32]) {
    exact_k_multi::<F, 1>(w, x, x.len(), out);
}

/// `out[i * n + r]` = weight row `r` · activation row `i`, for the `R`
/// activation rows of `cols` values in `x` (`n = out.len() / R` weight
/// rows): each quarter super-block dequantized once for the `R` rows, each
/// row's chains those of [`exact_k`], so the bits are its bits.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exact_k_multi<F: Format, const R: usize>(
    w: &[u8],
    x: &[f32],
    cols: usize,
    out: &mut [f32],
) {
    let n = out.len() / R;
    let xs: [&[[f32; 64]]; R] = std::array::from_fn(|i| x[i * cols..][..cols].as_chunks().0);
    let row_bytes = cols / QK_K * F::BYTES;
    for (r, row) in rows_prefetched(w, row_bytes).take(n).enumerate() {
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        let mut s = Scales::default();
        let mut qh = _mm256_setzero_si256();
        // One quarter of a super-block an iteration, not a super-block with
        // its quarters unrolled: then LLVM dequantized all 256 weights
        // first, spilling them (and the sums) to the stack.
        for q in 0..cols / 64 {
            let (b, p) = (&row[q / 4 * F::BYTES..][..F::BYTES], q % 4);
            if p == 0 {
                s = scales::<F>(b);
                qh = q5k_high_bits::<F>(b);
            }
            let w = dequantize_quarter::<F>(b, p, &s, &mut qh);
            for (acc, x) in acc.iter_mut().zip(&xs) {
                add_products(acc, &w[..4], &x[q]);
                add_products(acc, &w[4..], &x[q][32..]);
            }
        }
        for (i, acc) in acc.into_iter().enumerate() {
            out[i * n + r] = finish(acc);
        }
    }
}

/// Super-block `b` dequantized into `row`, as its values `32·j .. 32·j +
/// 256`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn dequantize_block<F: Format>(b: &[u8], row: &mut ChainRow, j: usize) {
    let s = scales::<F>(b);
    let mut qh = q5k_high_bits::<F>(b);
    for p in 0..4 {
        let w = dequantize_quarter::<F>(b, p, &s, &mut qh);
        row.put(j + 2 * p, &w[..4]);
        row.put(j + 2 * p + 1, &w[4..]);
    }
}
