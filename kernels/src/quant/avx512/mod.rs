//! AVX-512 kernels (F, BW, VL, VBMI, VNNI) for the 32-value formats (Q4_0,
//! Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), two blocks per 512-bit vector, and exact
//! kernels for Q4_K, Q6_K and IQ4_XS (`exact_k`). The other K-quants, and
//! fast Q4_K/Q6_K/IQ4_XS, use the AVX2 kernels on these CPUs. (VL lets the 256-bit
//! instructions use all 32 registers, which the multi-row kernel needs.)
//!
//! Safety: every function here may only run on a CPU with the features above
//! and AVX2, FMA and F16C ([`Isa::Avx512`](super::Isa::Avx512) available).
//! Byte loads are masked to the blocks they read; everything else goes
//! through slices.
//!
//! A pair of blocks is decoded with one masked load: `vpermb` places each
//! packed byte under both of its nibbles, a per-lane shift and a mask finish
//! the unpacking, and `vpermw` gathers the f16 scales (and minimums).
//! The fast kernels (`fast`) take [`BlockQ8x2`] activations and compute 16
//! weight rows at a time, one per lane, from exact integer sums per block.

use std::arch::x86_64::*;

use super::format::{Format, IQ4_VALUES};
use super::QuantType;

pub(crate) mod amx;
mod exact;
mod exact_k;
mod exact_panel;
mod fast;
pub(crate) mod vnni;
pub(crate) use exact::{exact, exact_multi, Blocks32, ExactRows};
pub(crate) use exact_panel::{decode_rows, pack_acts, panel_multiply};
pub(crate) use fast::{fast_32, fast_32_multi, BlockQ8x2, LANES};

/// Offset of the packed 4-bit quants in a block.
const fn qs_offset(ty: QuantType) -> usize {
    match ty {
        QuantType::Q4_0 | QuantType::IQ4NL => 2,
        QuantType::Q4_1 => 4,
        QuantType::Q5_0 => 6,
        _ => 8,
    }
}

/// The offset subtracted from the unsigned quants (0 for the formats with a
/// minimum, 128 for Q8_0 and IQ4_NL, whose signed values are biased to
/// unsigned).
const fn quant_offset(ty: QuantType) -> i32 {
    match ty {
        QuantType::Q4_0 => 8,
        QuantType::Q5_0 => 16,
        QuantType::Q8_0 | QuantType::IQ4NL => 128,
        _ => 0,
    }
}

/// The `vpermb` index placing each packed byte of two blocks under both of
/// its nibbles: byte `32 * b + k` takes byte `k % 16` of block `b`'s quants.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn nibble_index<F: Format>() -> __m512i {
    let mut idx = [0u8; 64];
    for (j, v) in idx.iter_mut().enumerate() {
        *v = ((j / 32) * F::BYTES + qs_offset(F::TY) + j % 16) as u8;
    }
    _mm512_loadu_si512(idx.as_ptr().cast())
}

/// Loads the (at most 64) bytes of the one or two blocks at the start of `b`,
/// and zeros.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load_pair<F: Format>(b: &[u8]) -> __m512i {
    let n = b.len().min(2 * F::BYTES).min(64);
    let mask = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
    // SAFETY: only the first `n` bytes, all inside `b`, are read.
    _mm512_maskz_loadu_epi8(mask, b.as_ptr().cast())
}

/// Decodes one or two blocks (`v` holds their bytes) to unsigned bytes:
/// 0..16 or 0..32 for the 4- and 5-bit formats (before their offset), the
/// signed quants plus 128 for Q8_0, and IQ4_NL's values plus 128 (its
/// indices looked up in the biased table, a byte shuffle).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn unsigned_quants<F: Format>(b: &[u8], v: __m512i, nibbles: __m512i) -> __m512i {
    if F::TY == QuantType::Q8_0 {
        let q0 = _mm256_loadu_si256(b[2..34].as_ptr().cast());
        let q1 = match b.get(F::BYTES + 2..2 * F::BYTES) {
            Some(q1) => _mm256_loadu_si256(q1.as_ptr().cast()),
            None => _mm256_set1_epi8(-128),
        };
        let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q0), q1);
        return _mm512_xor_si512(q, _mm512_set1_epi8(-128));
    }
    // Shift the second 16 bytes of each block right by 4 (the high nibbles).
    let shifts = _mm512_set_epi64(
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
        0,
        0,
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
        0,
        0,
    );
    let q = _mm512_permutexvar_epi8(nibbles, v);
    let q = _mm512_and_si512(_mm512_srlv_epi16(q, shifts), _mm512_set1_epi8(0xF));
    if matches!(F::TY, QuantType::Q5_0 | QuantType::Q5_1) {
        let at = qs_offset(F::TY) - 4;
        let bits = |k: usize| {
            b.get(k * F::BYTES + at..k * F::BYTES + at + 4)
                .map_or(0, |h| {
                    u64::from(u32::from_le_bytes([h[0], h[1], h[2], h[3]]))
                })
        };
        let high = _mm512_movm_epi8(bits(0) | bits(1) << 32);
        return _mm512_or_si512(q, _mm512_and_si512(high, _mm512_set1_epi8(0x10)));
    }
    if F::TY == QuantType::IQ4NL {
        let biased = IQ4_VALUES.map(|v| (v as u8) ^ 0x80);
        let table = _mm_loadu_si128(biased.as_ptr().cast());
        return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(table), q);
    }
    q
}

/// Sum of the 16 lanes, halving: lanes `i` and `i + 8`, then `i + 4`,
/// `i + 2`, `i + 1` (the order `_mm512_reduce_add_ps` compiles to, written
/// out so that every kernel relying on it gets the same bits).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn hsum(v: __m512) -> f32 {
    let v = _mm256_add_ps(
        _mm512_castps512_ps256(v),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
    );
    let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let v = _mm_add_ps(v, _mm_castpd_ps(_mm_permute_pd::<1>(_mm_castps_pd(v))));
    _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)))
}

/// [`hsum`] of 16 vectors at once: lane `j` of the result is `hsum(v[j])`,
/// bit for bit (every lane sees the same additions of the same pairs), in
/// 30 shuffles and 15 additions instead of 16 × 7 operations.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn hsum16(v: &[__m512; 16]) -> __m512 {
    // Each step adds the halves of the groups of two vectors and packs
    // both results into one: groups of 16 lanes, then 8, 4, 2.
    macro_rules! add_halves {
        ($shuffle:ident, $low:literal, $high:literal) => {
            |a: __m512, b: __m512| _mm512_add_ps($shuffle::<$low>(a, b), $shuffle::<$high>(a, b))
        };
    }
    // Lanes i and i + 8 of each vector: [a's 8 | b's 8].
    let eights = add_halves!(_mm512_shuffle_f32x4, 0x44, 0xEE);
    // Lanes i and i + 4 of each group of 8: [a's two 4 | b's two 4].
    let fours = add_halves!(_mm512_shuffle_f32x4, 0x88, 0xDD);
    // Lanes i and i + 2 of each group of 4 (a 128-bit lane).
    let twos = add_halves!(_mm512_shuffle_ps, 0x44, 0xEE);
    // The two lanes of each group of 2.
    let ones = add_halves!(_mm512_shuffle_ps, 0x88, 0xDD);
    // These pairings put `hsum(v[j])` in lane j.
    let group = |a: usize| fours(eights(v[a], v[a + 4]), eights(v[a + 8], v[a + 12]));
    ones(twos(group(0), group(1)), twos(group(2), group(3)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Isa;

    /// `hsum16` gives each lane the bits `hsum` gives its vector, on values
    /// whose sums round differently in every order (wide exponents, signs).
    #[test]
    fn hsum16_has_the_bits_of_hsum() {
        if !Isa::Avx512.is_available() {
            println!("hsum16_has_the_bits_of_hsum: skipped, this CPU lacks AVX-512");
            return;
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mantissa = (state >> 40) as f32 / (1u64 << 24) as f32;
            let scale = [1e-7, 1e-3, 1.0, 3e3, 1e7][(state % 5) as usize];
            (mantissa - 0.5) * scale
        };
        for _ in 0..200 {
            let values: Vec<[f32; 16]> = (0..16).map(|_| std::array::from_fn(|_| next())).collect();
            // SAFETY: the CPU has AVX-512 (checked above); loads read 16 f32.
            unsafe {
                let v: [__m512; 16] = std::array::from_fn(|j| _mm512_loadu_ps(values[j].as_ptr()));
                let mut got = [0f32; 16];
                _mm512_storeu_ps(got.as_mut_ptr(), hsum16(&v));
                for j in 0..16 {
                    assert_eq!(got[j].to_bits(), hsum(v[j]).to_bits(), "vector {j}");
                }
            }
        }
    }
}
