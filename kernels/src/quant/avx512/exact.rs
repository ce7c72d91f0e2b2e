//! AVX-512 exact kernels (f32 activations, f32 accumulation) for Q4_0,
//! Q4_1, Q5_0, Q5_1 and Q8_0, two blocks per step.
//!
//! A pair of weight blocks is dequantized once to 64 f32 weights
//! ([`ExactWeights`]: scale × quant + minimum), then multiplied into the
//! running sums of each activation row ([`ExactSums::add`]): [`exact_32`]
//! for one row (decode), [`exact_32_multi`] for `R` rows at once (prefill),
//! so both give the same bits. A row's sums are two independent FMA chains
//! (one per block of the pair): few enough that eight rows' sums and a
//! decoded pair fit in the 32 vector registers.
//!
//! Safety: as the parent module's kernels.

use std::arch::x86_64::*;

use super::super::format::Format;
use super::super::prefetch::rows_prefetched;
use super::{half_index, has_min, hsum, load_pair, nibble_index, quant_offset, unsigned_quants};

/// The `vpermb`/`vpermw` indexes the exact kernels decode blocks with.
#[derive(Clone, Copy)]
struct ExactIndex {
    nibbles: __m512i,
    scale: __m512i,
    min: __m512i,
    offset: __m512i,
}

impl ExactIndex {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn new<F: Format>() -> Self {
        Self {
            nibbles: nibble_index::<F>(),
            scale: half_index::<F>(0, 16),
            min: half_index::<F>(2, 16),
            offset: _mm512_set1_epi8(quant_offset(F::TY) as u8 as i8),
        }
    }
}

/// One or two weight blocks dequantized to f32: `w[0..2]` the first
/// block's 32 weights, `w[2..4]` the second's (zeros for a missing one).
#[derive(Clone, Copy)]
struct ExactWeights {
    w: [__m512; 4],
}

impl ExactWeights {
    /// Dequantizes the one or two blocks at the start of `b` (an odd last
    /// block pairs with zeros): scale × signed quant, plus the minimum for
    /// Q4_1 and Q5_1.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn decode<F: Format>(b: &[u8], idx: &ExactIndex) -> Self {
        let v = load_pair::<F>(b);
        let q = _mm512_sub_epi8(unsigned_quants::<F>(b, v, idx.nibbles), idx.offset);
        let lanes = [
            _mm512_castsi512_si128(q),
            _mm512_extracti32x4_epi32::<1>(q),
            _mm512_extracti32x4_epi32::<2>(q),
            _mm512_extracti32x4_epi32::<3>(q),
        ];
        let q = lanes.map(|l| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(l)));
        let halves = |index| {
            let words = _mm512_permutexvar_epi16(index, v);
            [
                _mm512_cvtph_ps(_mm512_castsi512_si256(words)),
                _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(words)),
            ]
        };
        let d = halves(idx.scale);
        let w = if has_min(F::TY) {
            let m = halves(idx.min);
            std::array::from_fn(|k| _mm512_fmadd_ps(q[k], d[k / 2], m[k / 2]))
        } else {
            std::array::from_fn(|k| _mm512_mul_ps(q[k], d[k / 2]))
        };
        Self { w }
    }
}

/// The running sums of one (weight row, activation row), one per block of
/// the pair.
#[derive(Clone, Copy)]
struct ExactSums([__m512; 2]);

impl ExactSums {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn zero() -> Self {
        Self([_mm512_setzero_ps(); 2])
    }

    /// Adds a decoded pair times its 64 activations (`live` of them real,
    /// 32 or 64; the rest read as zeros). Every exact kernel accumulates
    /// through this one function.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn add(self, w: &ExactWeights, x: &[f32], live: usize) -> Self {
        let mut s = self.0;
        for k in 0..4 {
            if 16 * k < live {
                let x = _mm512_loadu_ps(x[16 * k..16 * k + 16].as_ptr());
                s[k / 2] = _mm512_fmadd_ps(w.w[k], x, s[k / 2]);
            }
        }
        Self(s)
    }

    /// The dot product.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn finish(self) -> f32 {
        hsum(_mm512_add_ps(self.0[0], self.0[1]))
    }
}

/// One weight row times `R` activation rows (each as long as the row's
/// values): every pair of blocks is decoded once for all of them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn exact_rows<F: Format, const R: usize>(
    row: &[u8],
    xs: &[&[f32]; R],
    idx: &ExactIndex,
) -> [f32; R] {
    let mut sums = [ExactSums::zero(); R];
    // Byte offset `at` of the pair and index `first` of its first value,
    // stepped together (`chunks().enumerate()` was a few % slower in an
    // A/B of prefills).
    let pair_bytes = 2 * F::BYTES;
    let (mut at, mut first) = (0, 0);
    while at < row.len() {
        let b = &row[at..row.len().min(at + pair_bytes)];
        let w = ExactWeights::decode::<F>(b, idx);
        for (s, x) in sums.iter_mut().zip(xs) {
            let live = (x.len() - first).min(64);
            *s = s.add(&w, &x[first..], live);
        }
        at += pair_bytes;
        first += 64;
    }
    sums.map(|s| s.finish())
}

/// Exact kernel for one activation row: `out[r]` = weight row `r` · `x`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn exact_32<F: Format>(w: &[u8], x: &[f32], out: &mut [f32]) {
    let idx = ExactIndex::new::<F>();
    for (row, y) in rows_prefetched(w, x.len() / 32 * F::BYTES).zip(out) {
        let [s] = exact_rows::<F, 1>(row, &[x], &idx);
        *y = s;
    }
}

/// Exact kernel for `R` activation rows of `cols` values (one after another
/// in `x`): `out[i * n + r]` = weight row `r` · activation row `i`, bit for
/// bit what [`exact_32`] gives, with `n = out.len() / R` weight rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn exact_32_multi<F: Format, const R: usize>(
    w: &[u8],
    x: &[f32],
    cols: usize,
    out: &mut [f32],
) {
    let n = out.len() / R;
    let idx = ExactIndex::new::<F>();
    let xs: [&[f32]; R] = std::array::from_fn(|i| &x[i * cols..(i + 1) * cols]);
    for (r, row) in w
        .chunks_exact((cols / 32 * F::BYTES).max(1))
        .take(n)
        .enumerate()
    {
        let y = exact_rows::<F, R>(row, &xs, &idx);
        for (i, y) in y.into_iter().enumerate() {
            out[i * n + r] = y;
        }
    }
}
