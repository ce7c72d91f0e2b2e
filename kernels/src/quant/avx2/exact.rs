//! The widening helpers the exact kernels share (quants to f32 in
//! eight-lane vectors: `exact_32`, `exact_k`).
//!
//! Q4_K's quants widen straight from the packed bytes, eight at a time by a
//! widening load (`vpmovzxbd`), the high nibbles by a shift; Q5_1's fifth
//! bits come by a variable shift of their word: no byte shuffles.

use std::arch::x86_64::*;

/// 32 signed bytes as f32 (values 0..8, 8..16, 16..24, 24..32).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn i8x32_to_f32(q: __m256i) -> [__m256; 4] {
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
pub(super) unsafe fn nibbles8_to_f32(b: &[u8], fifth: [__m256i; 2]) -> [__m256; 2] {
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
