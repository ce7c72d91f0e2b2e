//! The exact kernels (f32 activations) of the 32-value formats: Q4_0, Q4_1,
//! Q5_0, Q5_1, Q8_0 and IQ4_NL.
//!
//! Each weight is dequantized to f32 as `d·q + m` by one fused multiply-add
//! (`m` the block's minimum, or `−offset·d`: then the sum is `d·(q −
//! offset)`, exact in f32; Q8_0's and IQ4_NL's signed quants by one multiply),
//! which is the value `dequantize_block` gives,
//! and summed as `panel` says: so one activation row ([`exact_32`], blocks
//! dequantized as they are read, four independent chains of FMAs a row),
//! two or three ([`exact_32_multi`]) and many (the panel kernels, from
//! [`dequantize_block`]) give the same bits.

use std::arch::x86_64::*;

use super::super::format::Format;
use super::super::prefetch::rows_prefetched;
use super::super::QuantType;
use super::exact::{i8x32_to_f32, i8x8_at, nibbles_to_f32};
use super::iq4::iq4_values;
use super::panel::{add_products, finish, ChainRow};
use super::{f16_splat, nibbles32, quant_offset, signed_32, u32_at};

/// Block `b` dequantized: its 32 weights as f32, in order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dequantize<F: Format>(b: &[u8]) -> [__m256; 4] {
    // No closures here: `array::from_fn` and `map` were not inlined into
    // the kernels' loops (a call a block).
    let q = match F::TY {
        QuantType::Q8_0 => [
            i8x8_at(&b[2..]),
            i8x8_at(&b[10..]),
            i8x8_at(&b[18..]),
            i8x8_at(&b[26..]),
        ],
        QuantType::Q4_0 => nibbles_to_f32(&b[2..18], 0),
        QuantType::Q4_1 => nibbles_to_f32(&b[4..20], 0),
        QuantType::Q5_0 => return dequantize_q5_0(b),
        QuantType::Q5_1 => nibbles_to_f32(&b[8..24], u32_at(b, 4)),
        QuantType::IQ4NL => i8x32_to_f32(iq4_values(nibbles32(&b[2..]))),
        _ => unreachable!("{} is not a 32-value format", F::TY),
    };
    let scale = f16_splat(b, 0);
    if signed_32(F::TY) {
        return [
            _mm256_mul_ps(q[0], scale),
            _mm256_mul_ps(q[1], scale),
            _mm256_mul_ps(q[2], scale),
            _mm256_mul_ps(q[3], scale),
        ];
    }
    let min = if F::TY.has_min() {
        f16_splat(b, 2)
    } else {
        _mm256_mul_ps(_mm256_set1_ps(-f32::from(quant_offset(F::TY))), scale)
    };
    [
        _mm256_fmadd_ps(q[0], scale, min),
        _mm256_fmadd_ps(q[1], scale, min),
        _mm256_fmadd_ps(q[2], scale, min),
        _mm256_fmadd_ps(q[3], scale, min),
    ]
}

/// [`dequantize`] for Q5_0, in fewer operations: `d·(q − 16)` is `d·n −
/// 16·d` where the fifth bit is clear and `d·n` where it is set (`n` the
/// low four bits): the fifth bits, each shifted into its lane's sign bit,
/// choose the addend of the fused multiply-add (both sums exact, so the
/// values are [`dequantize`]'s).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dequantize_q5_0(b: &[u8]) -> [__m256; 4] {
    let scale = f16_splat(b, 0);
    let clear = _mm256_mul_ps(_mm256_set1_ps(-16.0), scale);
    let set = _mm256_setzero_ps();
    let qh = _mm256_set1_epi32(u32_at(b, 2) as i32);
    let (lo, hi) = (
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(b[6..14].as_ptr().cast())),
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(b[14..22].as_ptr().cast())),
    );
    let mask = _mm256_set1_epi32(0xF);
    // Value `j` (lane `j % 8` of group `j / 8`) has its fifth bit shifted
    // left by `31 − j`.
    let group = |nibbles: __m256i, first: i32| {
        let c = 31 - first;
        let counts = _mm256_setr_epi32(c, c - 1, c - 2, c - 3, c - 4, c - 5, c - 6, c - 7);
        let fifth = _mm256_castsi256_ps(_mm256_sllv_epi32(qh, counts));
        let addend = _mm256_blendv_ps(clear, set, fifth);
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(nibbles), scale, addend)
    };
    [
        group(_mm256_and_si256(lo, mask), 0),
        group(_mm256_and_si256(hi, mask), 8),
        group(_mm256_srli_epi32::<4>(lo), 16),
        group(_mm256_srli_epi32::<4>(hi), 24),
    ]
}

/// `out[r]` = weight row `r` · `x` (one activation row: [`exact_32_multi`]
/// for one row).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exact_32<F: Format>(w: &[u8], x: &[f32], out: &mut [f32]) {
    exact_32_multi::<F, 1>(w, x, x.len(), out);
}

/// `out[i * n + r]` = weight row `r` · activation row `i`, for the `R`
/// activation rows of `cols` values in `x` (`n = out.len() / R` weight
/// rows): each block dequantized once for the `R` rows, each row's chains
/// those of [`exact_32`], so the bits are its bits.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exact_32_multi<F: Format, const R: usize>(
    w: &[u8],
    x: &[f32],
    cols: usize,
    out: &mut [f32],
) {
    let n = out.len() / R;
    let xs: [&[[f32; 32]]; R] = std::array::from_fn(|i| x[i * cols..][..cols].as_chunks().0);
    let row_bytes = cols / 32 * F::BYTES;
    for (r, row) in rows_prefetched(w, row_bytes).take(n).enumerate() {
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        for (j, b) in row.chunks_exact(F::BYTES).enumerate() {
            let w = dequantize::<F>(b);
            for (acc, x) in acc.iter_mut().zip(&xs) {
                add_products(acc, &w, &x[j]);
            }
        }
        for (i, acc) in acc.into_iter().enumerate() {
            out[i * n + r] = finish(acc);
        }
    }
}

/// Block `b` dequantized into `row`, as its values `32·j .. 32·j + 32`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn dequantize_block<F: Format>(b: &[u8], row: &mut ChainRow, j: usize) {
    row.put(j, &dequantize::<F>(b));
}
