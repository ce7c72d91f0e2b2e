//! AVX-512 kernels (F, BW, VBMI, VNNI) for the 32-value formats (Q4_0,
//! Q4_1, Q5_0, Q5_1, Q8_0), two blocks per 512-bit vector. The K-quants use
//! the AVX2 kernels on these CPUs.
//!
//! Safety: every function here may only run on a CPU with the features above
//! and AVX2, FMA and F16C ([`Isa::Avx512`](super::Isa::Avx512) available).
//! Byte loads are masked to the blocks they read; everything else goes
//! through slices.
//!
//! A pair of blocks is decoded with one masked load: `vpermb` places each
//! packed byte under both of its nibbles, a per-lane shift and a mask finish
//! the unpacking, and `vpermw` gathers the two f16 scales (and minimums).
//! The fast kernels take [`BlockQ8x2`] activations, whose per-lane scales
//! and sums turn the block bookkeeping into vector multiplies.

use std::arch::x86_64::*;

use super::format::Format;
use super::QuantType;

/// Two consecutive activation blocks of 32, quantized like
/// [`BlockQ8`](super::act::BlockQ8), laid out for the AVX-512 kernels. A
/// row's odd last block is paired with zeros.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub(crate) struct BlockQ8x2 {
    /// The two blocks' quants, in order.
    pub qs: [i8; 64],
    /// Each block's scale, in the 8 lanes that hold its products.
    pub d: [f32; 16],
    /// Each block's scale × quant sum, spread over the same 8 lanes (so the
    /// lanes add up to it).
    pub s: [f32; 16],
}

impl Default for BlockQ8x2 {
    fn default() -> Self {
        Self {
            qs: [0; 64],
            d: [0.0; 16],
            s: [0.0; 16],
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
            let d = super::avx2::quantize_run(x, qs);
            let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
            out.d[8 * k..8 * k + 8].fill(d);
            out.s[8 * k..8 * k + 8].fill(d * sum as f32 / 8.0);
        }
    }
}

/// Offset of the packed 4-bit quants in a block.
const fn qs_offset(ty: QuantType) -> usize {
    match ty {
        QuantType::Q4_0 => 2,
        QuantType::Q4_1 => 4,
        QuantType::Q5_0 => 6,
        _ => 8,
    }
}

/// The offset subtracted from the unsigned quants (0 for the formats with a
/// minimum, 128 for Q8_0 whose signed quants are biased to unsigned).
const fn quant_offset(ty: QuantType) -> i32 {
    match ty {
        QuantType::Q4_0 => 8,
        QuantType::Q5_0 => 16,
        QuantType::Q8_0 => 128,
        _ => 0,
    }
}

const fn has_min(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q4_1 | QuantType::Q5_1)
}

/// The `vpermb` index placing each packed byte of two blocks under both of
/// its nibbles: byte `32 * b + k` takes byte `k % 16` of block `b`'s quants.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn nibble_index<F: Format>() -> __m512i {
    let mut idx = [0u8; 64];
    for (j, v) in idx.iter_mut().enumerate() {
        *v = ((j / 32) * F::BYTES + qs_offset(F::TY) + j % 16) as u8;
    }
    _mm512_loadu_si512(idx.as_ptr().cast())
}

/// The `vpermw` index gathering the f16 at byte `at` of each of two blocks,
/// alternating between them every `run` words.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn half_index<F: Format>(at: usize, run: usize) -> __m512i {
    let mut idx = [0u16; 32];
    for (j, v) in idx.iter_mut().enumerate() {
        *v = ((((j / run) % 2) * F::BYTES + at) / 2) as u16;
    }
    _mm512_loadu_si512(idx.as_ptr().cast())
}

/// Loads the (at most 64) bytes of the one or two blocks at the start of `b`,
/// and zeros.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn load_pair<F: Format>(b: &[u8]) -> __m512i {
    let n = b.len().min(2 * F::BYTES).min(64);
    let mask = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
    // SAFETY: only the first `n` bytes, all inside `b`, are read.
    _mm512_maskz_loadu_epi8(mask, b.as_ptr().cast())
}

/// Decodes one or two blocks (`v` holds their bytes) to unsigned bytes:
/// 0..16 or 0..32 for the 4- and 5-bit formats (before their offset), the
/// signed quants plus 128 for Q8_0.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,avx2,fma,f16c")]
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
    q
}

/// Sum of the 16 lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn hsum(v: __m512) -> f32 {
    _mm512_reduce_add_ps(v)
}

/// The f16 values the `vpermw` index picked, as f32: words 0..16 (the
/// first block's) and words 16..32.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn halves(words: __m512i) -> (__m512, __m512) {
    (
        _mm512_cvtph_ps(_mm512_castsi512_si256(words)),
        _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(words)),
    )
}

/// Folds `step(state, blocks, activations, loaded bytes)` over the pairs of
/// blocks of a row, and its odd last block.
#[inline(always)]
fn fold_pairs<F: Format, A, S>(
    row: &[u8],
    acts: &[A],
    init: S,
    mut step: impl FnMut(S, &[u8], &A, __m512i) -> S,
    mut load: impl FnMut(&[u8]) -> __m512i,
) -> S {
    let pairs = row.chunks_exact(2 * F::BYTES);
    let tail = pairs.remainder();
    let mut state = init;
    for (b, a) in pairs.zip(acts) {
        state = step(state, b, a, load(b));
    }
    match acts.get(row.len() / (2 * F::BYTES)) {
        Some(a) if !tail.is_empty() => step(state, tail, a, load(tail)),
        _ => state,
    }
}

/// Fast kernel: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 with [`BlockQ8x2`]
/// activations (the portable kernels' contract).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn fast_32<F: Format>(w: &[u8], acts: &[BlockQ8x2], out: &mut [f32]) {
    let Some(row_bytes) = w.len().checked_div(out.len()) else {
        return;
    };
    for (row, y) in w.chunks_exact(row_bytes).zip(out) {
        *y = fast_32_row::<F>(row, acts);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn fast_32_row<F: Format>(row: &[u8], acts: &[BlockQ8x2]) -> f32 {
    let nibbles = nibble_index::<F>();
    let scale_idx = half_index::<F>(0, 8);
    let min_idx = half_index::<F>(2, 8);
    let zero = _mm512_setzero_ps();
    let step = |(acc, corr), b: &[u8], a: &BlockQ8x2, v| {
        let q = unsigned_quants::<F>(b, v, nibbles);
        let p = _mm512_dpbusd_epi32(
            _mm512_setzero_si512(),
            q,
            _mm512_loadu_si512(a.qs.as_ptr().cast()),
        );
        let (d0, _) = halves(_mm512_permutexvar_epi16(scale_idx, v));
        let dx = _mm512_loadu_ps(a.d.as_ptr());
        let acc = _mm512_fmadd_ps(_mm512_mul_ps(d0, dx), _mm512_cvtepi32_ps(p), acc);
        let c = if has_min(F::TY) {
            halves(_mm512_permutexvar_epi16(min_idx, v)).0
        } else {
            d0
        };
        (acc, _mm512_fmadd_ps(c, _mm512_loadu_ps(a.s.as_ptr()), corr))
    };
    let (acc, corr) = fold_pairs::<F, _, _>(row, acts, (zero, zero), step, |b| load_pair::<F>(b));
    let k = if has_min(F::TY) {
        1.0
    } else {
        -(quant_offset(F::TY) as f32)
    };
    hsum(acc) + k * hsum(corr)
}

/// Exact kernel: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 with f32 activations.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn exact_32<F: Format>(w: &[u8], x: &[f32], out: &mut [f32]) {
    let blocks = x.len() / 32;
    for (row, y) in w.chunks_exact(blocks * F::BYTES).zip(out) {
        *y = exact_32_row::<F>(row, x);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn exact_32_row<F: Format>(row: &[u8], x: &[f32]) -> f32 {
    let nibbles = nibble_index::<F>();
    let scale_idx = half_index::<F>(0, 16);
    let min_idx = half_index::<F>(2, 16);
    let offset = _mm512_set1_epi8(quant_offset(F::TY) as u8 as i8);
    let (xs, _) = x.as_chunks::<64>();
    let step = |acc, b: &[u8], x: &[f32; 64], v| {
        let q = _mm512_sub_epi8(unsigned_quants::<F>(b, v, nibbles), offset);
        let f = |k: i32| -> __m512 {
            let lane = match k {
                0 => _mm512_castsi512_si128(q),
                1 => _mm512_extracti32x4_epi32::<1>(q),
                2 => _mm512_extracti32x4_epi32::<2>(q),
                _ => _mm512_extracti32x4_epi32::<3>(q),
            };
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lane))
        };
        let xs = [0, 1, 2, 3].map(|k| _mm512_loadu_ps(x[16 * k..].as_ptr()));
        let p0 = _mm512_fmadd_ps(f(1), xs[1], _mm512_mul_ps(f(0), xs[0]));
        let p1 = _mm512_fmadd_ps(f(3), xs[3], _mm512_mul_ps(f(2), xs[2]));
        let (d0, d1) = halves(_mm512_permutexvar_epi16(scale_idx, v));
        let acc = _mm512_fmadd_ps(d1, p1, _mm512_fmadd_ps(d0, p0, acc));
        if has_min(F::TY) {
            let (m0, m1) = halves(_mm512_permutexvar_epi16(min_idx, v));
            let acc = _mm512_fmadd_ps(m0, _mm512_add_ps(xs[0], xs[1]), acc);
            _mm512_fmadd_ps(m1, _mm512_add_ps(xs[2], xs[3]), acc)
        } else {
            acc
        }
    };
    let mut acc = fold_pairs::<F, _, _>(row, xs, _mm512_setzero_ps(), step, |b| load_pair::<F>(b));
    // An odd last block pairs with activations beyond the 64-value chunks.
    if !row.len().is_multiple_of(2 * F::BYTES) {
        let b = &row[row.len() - F::BYTES..];
        let mut tail = [0f32; 64];
        tail[..32].copy_from_slice(&x[x.len() - 32..]);
        acc = step(acc, b, &tail, load_pair::<F>(b));
    }
    hsum(acc)
}
