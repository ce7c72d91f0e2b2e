//! AVX-512 kernels (F, BW, VL, VBMI, VNNI) for the 32-value formats (Q4_0,
//! Q4_1, Q5_0, Q5_1, Q8_0), two blocks per 512-bit vector, and exact
//! kernels for Q4_K and Q6_K (`exact_k`). The other K-quants, and fast
//! Q4_K/Q6_K, use the AVX2 kernels on these CPUs. (VL lets the 256-bit
//! instructions use all 32 registers, which the multi-row kernel needs.)
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
//!
//! For several activation rows (prefill), [`fast_32_multi`] decodes each
//! pair of weight blocks once for up to 8 activation rows, two weight rows
//! at a time, with the same arithmetic as the single-row [`fast_32`], so
//! both give the same bits.

use std::arch::x86_64::*;

use super::format::Format;
use super::prefetch::rows_prefetched;
use super::QuantType;

mod exact;
mod exact_k;
mod exact_panel;
pub(crate) use exact::{exact, exact_multi, Blocks32, ExactRows};
pub(crate) use exact_panel::{decode_rows, pack_acts, panel_multiply};

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

/// The `vpermw` index gathering the f16 at byte `at` of each of two blocks,
/// alternating between them every `run` words.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
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
/// signed quants plus 128 for Q8_0.
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
    q
}

/// Sum of the 16 lanes, halving: lanes `i` and `i + 8`, then `i + 4`,
/// `i + 2`, `i + 1` (the order `_mm512_reduce_add_ps` compiles to, written
/// out so that the multi-row kernel can rely on it: a vector whose lanes
/// 0..8 all hold `a` and lanes 8..16 all hold `b` sums to exactly
/// `8 × (a + b)`).
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

/// The f16 values the `vpermw` index picked, as f32: words 0..16 (the
/// first block's) and words 16..32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
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
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn fast_32<F: Format>(w: &[u8], acts: &[BlockQ8x2], out: &mut [f32]) {
    let Some(row_bytes) = w.len().checked_div(out.len()) else {
        return;
    };
    for (row, y) in rows_prefetched(w, row_bytes).zip(out) {
        *y = fast_32_row::<F>(row, acts);
    }
}

/// The `vpermb` and `vpermw` indexes the fast kernels decode weights with.
#[derive(Clone, Copy)]
struct FastIndex {
    nibbles: __m512i,
    scale: __m512i,
    min: __m512i,
}

impl FastIndex {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn new<F: Format>() -> Self {
        Self {
            nibbles: nibble_index::<F>(),
            scale: half_index::<F>(0, 8),
            min: half_index::<F>(2, 8),
        }
    }
}

/// One or two weight blocks decoded for the fast kernels: the unsigned
/// quants, each block's scale in the 8 lanes of its products, and the
/// factor of the activation sums (the minimum for Q4_1/Q5_1, else the scale).
#[derive(Clone, Copy)]
struct FastWeights {
    q: __m512i,
    d: __m512,
    c: __m512,
}

/// Decodes the one or two blocks at the start of `b`, `v` their bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn fast_weights<F: Format>(b: &[u8], v: __m512i, idx: &FastIndex) -> FastWeights {
    let q = unsigned_quants::<F>(b, v, idx.nibbles);
    let (d, _) = halves(_mm512_permutexvar_epi16(idx.scale, v));
    let c = if F::TY.has_min() {
        halves(_mm512_permutexvar_epi16(idx.min, v)).0
    } else {
        d
    };
    FastWeights { q, d, c }
}

/// The fast kernels' running sums for one (weight row, activation row):
/// Σ scales × integer products, and Σ (scale or minimum) × activation sums,
/// lane by lane.
#[derive(Clone, Copy)]
struct FastSums {
    acc: __m512,
    corr: __m512,
}

impl FastSums {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn zero() -> Self {
        Self {
            acc: _mm512_setzero_ps(),
            corr: _mm512_setzero_ps(),
        }
    }

    /// Adds the products of a decoded pair of weight blocks with a pair of
    /// activation blocks. Every kernel accumulates through this one function,
    /// so results do not depend on how many rows a kernel handles at once.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn add(self, w: &FastWeights, a: &BlockQ8x2) -> Self {
        let p = _mm512_dpbusd_epi32(
            _mm512_setzero_si512(),
            w.q,
            _mm512_loadu_si512(a.qs.as_ptr().cast()),
        );
        let dx = _mm512_loadu_ps(a.d.as_ptr());
        Self {
            acc: _mm512_fmadd_ps(_mm512_mul_ps(w.d, dx), _mm512_cvtepi32_ps(p), self.acc),
            corr: _mm512_fmadd_ps(w.c, _mm512_loadu_ps(a.s.as_ptr()), self.corr),
        }
    }

    /// The dot product.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn finish<F: Format>(self) -> f32 {
        let k = if F::TY.has_min() {
            1.0
        } else {
            -(quant_offset(F::TY) as f32)
        };
        hsum(self.acc) + k * hsum(self.corr)
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn fast_32_row<F: Format>(row: &[u8], acts: &[BlockQ8x2]) -> f32 {
    let idx = FastIndex::new::<F>();
    let step =
        |sums: FastSums, b: &[u8], a: &BlockQ8x2, v| sums.add(&fast_weights::<F>(b, v, &idx), a);
    fold_pairs::<F, _, _>(row, acts, FastSums::zero(), step, |b| load_pair::<F>(b)).finish::<F>()
}

/// Fast kernel over `R` activation rows at once, `W` weight rows at a time:
/// each pair of weight blocks is decoded once for the `R` activation rows,
/// and each activation block loaded once for the `W` weight rows.
///
/// `acts` holds the `R` rows of `act_len` blocks one after another, `out`
/// the `R` output rows of `n = out.len() / R` values (one per weight row in
/// `w`): `out[i * n + r]` is weight row `r` times activation row `i`, bit
/// for bit what [`fast_32`] gives.
///
/// The products accumulate exactly as in [`fast_32_row`]. The sums of the
/// activation sums (`FastSums::corr`) are kept compactly: in the
/// single-row kernel the 8 lanes of a block all hold the same value (the
/// same scale or minimum times the same activation sum, added in the same
/// order), so here one lane per (weight row, activation row, block of the
/// pair) does the same additions, `W × R × 2` lanes in all instead of
/// `W × R × 16`, and [`hsum`]'s halving order turns the two values back into
/// the single-row kernel's sum exactly.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn fast_32_multi<F: Format, const W: usize, const R: usize>(
    w: &[u8],
    acts: &[BlockQ8x2],
    act_len: usize,
    out: &mut [f32],
) {
    let n = out.len() / R;
    let Some(row_bytes) = w.len().checked_div(n) else {
        return;
    };
    let pairs = row_bytes.div_ceil(2 * F::BYTES).min(act_len);
    let mut rows_acts = [&acts[..0]; R];
    for (i, a) in rows_acts.iter_mut().enumerate() {
        *a = &acts[i * act_len..i * act_len + pairs];
    }
    // The activation sums in the compact lanes' order, for every pair (on
    // the stack unless the rows are long): lane `(k × R + i) × 2 + b` holds
    // the sum of block `b` of activation row `i`, for every weight row `k`.
    let stride = corr_vectors(W, R) * 16;
    let mut stack = [0f32; SUMS_ON_STACK];
    let mut heap = Vec::new();
    let sums: &mut [f32] = if pairs * stride <= SUMS_ON_STACK {
        &mut stack[..pairs * stride]
    } else {
        heap.resize(pairs * stride, 0.0);
        &mut heap
    };
    for (i, a) in rows_acts.iter().enumerate() {
        for (s, a) in sums.chunks_exact_mut(stride).zip(a.iter()) {
            for k in 0..W {
                let lane = 2 * (k * R + i);
                s[lane] = a.s[0];
                s[lane + 1] = a.s[8];
            }
        }
    }
    let sums: &[f32] = sums;
    let consts = MultiConsts::new::<F, W, R>();
    let mut r = 0;
    while r + W <= n {
        let mut rows = [&w[..0]; W];
        for (k, row) in rows.iter_mut().enumerate() {
            *row = &w[(r + k) * row_bytes..(r + k + 1) * row_bytes];
        }
        let y = fast_32_block::<F, W, R>(&rows, &rows_acts, sums, &consts);
        for (k, y) in y.iter().enumerate() {
            for (i, &y) in y.iter().enumerate() {
                out[i * n + r + k] = y;
            }
        }
        r += W;
    }
    if r < n {
        // The last rows one at a time; with `W = 1` the compact lanes of
        // the first weight row are at the same places.
        let consts = MultiConsts::new::<F, 1, R>();
        for r in r..n {
            let row = [&w[r * row_bytes..(r + 1) * row_bytes]];
            let [y] = fast_32_block::<F, 1, R>(&row, &rows_acts, sums, &consts);
            for (i, &y) in y.iter().enumerate() {
                out[i * n + r] = y;
            }
        }
    }
}

/// Vectors of 16 compact lanes for `w` weight rows times `r` activation
/// rows times 2 blocks.
const fn corr_vectors(w: usize, r: usize) -> usize {
    (2 * w * r).div_ceil(16)
}

/// Floats of lane-ordered activation sums [`fast_32_multi`] keeps on the
/// stack (32 pairs of blocks at 2 x 8 rows).
const SUMS_ON_STACK: usize = 1024;

/// The most [`corr_vectors`] a [`fast_32_block`] may use.
const MAX_CORR_VECTORS: usize = 4;

/// Whether each vector of compact lanes takes its weights' scales (or
/// minimums) from at most two weight rows, which one two-source `vpermw`
/// can gather.
const fn corr_lanes_fit(w: usize, r: usize) -> bool {
    let lanes = 2 * w * r;
    let mut v = 0;
    while v * 16 < lanes {
        let last = if (v + 1) * 16 < lanes {
            (v + 1) * 16
        } else {
            lanes
        } - 1;
        if last / (2 * r) > v * 16 / (2 * r) + 1 {
            return false;
        }
        v += 1;
    }
    corr_vectors(w, r) <= MAX_CORR_VECTORS
}

/// The indexes of a [`fast_32_block`] shape.
struct MultiConsts {
    idx: FastIndex,
    /// Per vector of compact lanes: the `vpermw` index gathering the f16
    /// scales (or minimums) of its two weight rows' loaded bytes, lane
    /// `(k × R + i) × 2 + b` taking block `b` of weight row `k`.
    corr: [__m512i; MAX_CORR_VECTORS],
}

impl MultiConsts {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn new<F: Format, const W: usize, const R: usize>() -> Self {
        let at = if F::TY.has_min() { 2 } else { 0 };
        let mut corr = [_mm512_setzero_si512(); MAX_CORR_VECTORS];
        for (v, corr) in corr.iter_mut().enumerate().take(corr_vectors(W, R)) {
            let first = v * 16 / (2 * R);
            let mut idx = [0u16; 32];
            for (lane, x) in idx.iter_mut().enumerate().take(16) {
                let l = v * 16 + lane;
                if l < 2 * W * R {
                    let source = l / (2 * R) - first;
                    *x = (32 * source + ((l % 2) * F::BYTES + at) / 2) as u16;
                }
            }
            *corr = _mm512_loadu_si512(idx.as_ptr().cast());
        }
        Self {
            idx: FastIndex::new::<F>(),
            corr,
        }
    }
}

/// The products of `W` weight rows (of equal length) with `R` activation
/// rows: `[weight row][activation row]`. `sums` holds, for every pair of
/// blocks, the activation sums in the compact lanes' order for `W' >= W`
/// weight rows (`16 × corr_vectors(W', R)` values a pair), whose first
/// `2 × W × R` lanes are also this shape's.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn fast_32_block<F: Format, const W: usize, const R: usize>(
    rows: &[&[u8]; W],
    acts: &[&[BlockQ8x2]; R],
    sums: &[f32],
    consts: &MultiConsts,
) -> [[f32; R]; W] {
    const { assert!(corr_lanes_fit(W, R)) };
    let vectors = corr_vectors(W, R);
    let row_bytes = rows[0].len();
    let pairs = acts[0].len();
    let stride = sums.len() / pairs.max(1);
    let zero = _mm512_setzero_ps();
    let mut acc = [[zero; R]; W];
    let mut corr = [zero; MAX_CORR_VECTORS];
    let mut v = [_mm512_setzero_si512(); W];
    let mut q = [_mm512_setzero_si512(); W];
    let mut d = [zero; W];
    // One loop, with the odd last block (paired with zeros as in
    // `fold_pairs`) as its last step: a single copy of the body, which
    // keeps the sums in registers.
    for j in 0..pairs {
        let at = j * 2 * F::BYTES;
        let end = row_bytes.min(at + 2 * F::BYTES);
        for k in 0..W {
            let b = &rows[k][at..end];
            v[k] = load_pair::<F>(b);
            q[k] = unsigned_quants::<F>(b, v[k], consts.idx.nibbles);
            d[k] = halves(_mm512_permutexvar_epi16(consts.idx.scale, v[k])).0;
        }
        for (i, a) in acts.iter().enumerate() {
            let a = &a[j];
            let x = _mm512_loadu_si512(a.qs.as_ptr().cast());
            let dx = _mm512_loadu_ps(a.d.as_ptr());
            for k in 0..W {
                // As `FastSums::add`.
                let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[k], x);
                acc[k][i] =
                    _mm512_fmadd_ps(_mm512_mul_ps(d[k], dx), _mm512_cvtepi32_ps(p), acc[k][i]);
            }
        }
        let s = &sums[j * stride..];
        for (c, (corr, idx)) in corr.iter_mut().zip(&consts.corr).enumerate().take(vectors) {
            let first = c * 16 / (2 * R);
            let second = (first + 1).min(W - 1);
            let words = _mm512_permutex2var_epi16(v[first], *idx, v[second]);
            let factor = _mm512_cvtph_ps(_mm512_castsi512_si256(words));
            *corr = _mm512_fmadd_ps(factor, _mm512_loadu_ps(s[16 * c..].as_ptr()), *corr);
        }
    }
    let mut corr_lanes = [0f32; 16 * MAX_CORR_VECTORS];
    for (c, lanes) in corr.iter().zip(corr_lanes.chunks_exact_mut(16)) {
        _mm512_storeu_ps(lanes.as_mut_ptr(), *c);
    }
    let k_corr = if F::TY.has_min() {
        1.0
    } else {
        -(quant_offset(F::TY) as f32)
    };
    let mut out = [[0f32; R]; W];
    for (k, (out, acc)) in out.iter_mut().zip(&acc).enumerate() {
        for (i, (y, acc)) in out.iter_mut().zip(acc).enumerate() {
            let lane = 2 * (k * R + i);
            // `hsum` of the single-row kernel's `corr`, whose lanes 0..8
            // hold the first value and lanes 8..16 the second.
            let corr = 8.0 * (corr_lanes[lane] + corr_lanes[lane + 1]);
            *y = hsum(*acc) + k_corr * corr;
        }
    }
    out
}
