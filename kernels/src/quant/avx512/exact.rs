//! AVX-512 exact kernels (f32 activations, f32 accumulation), 64 values
//! per step: for Q4_0, Q4_1, Q5_0, Q5_1 (two blocks a step, here) and
//! Q4_K, Q6_K (a quarter of a super-block a step, `exact_k`).
//!
//! 64 weights are dequantized once to f32 ([`ExactWeights`]: scale times
//! quant, plus the minimum), then multiplied into the running sums of each
//! activation row ([`ExactSums::add`]): [`exact`] for one row (decode),
//! [`exact_multi`] for `R` rows at once (prefill), so both give the same
//! bits. A row's sums are two independent FMA chains (one per half of the
//! 64): few enough that eight rows' sums and the decoded weights fit in the
//! 32 vector registers. Rows longer than `ONE_PASS_VALUES` go by runs of
//! activations that stay in L1, the sums carried between runs.
//!
//! Safety: as the parent module's kernels.

use std::arch::x86_64::*;
use std::marker::PhantomData;

use super::super::format::{marker, Format, IQ4_VALUES};
use super::super::prefetch::rows_prefetched;
use super::super::QuantType;
use super::{hsum, hsum16, load_pair, nibble_index, qs_offset, quant_offset, unsigned_quants};

/// The `vpermb`/`vpermw` indexes the exact kernels decode blocks with.
#[derive(Clone, Copy)]
pub(crate) struct ExactIndex {
    nibbles: __m512i,
    /// The `vpermw` index putting the pair's scales and minimums in words
    /// 0 to 3: scale of block 0, of block 1, minimum of block 0, of block 1.
    scales: __m512i,
    offset: __m512i,
    /// For Q4_0 and Q4_1, per block of the pair: the `vpermb` index putting
    /// quant byte `l` of the block in byte 0 of 32-bit lane `l`.
    lanes: [__m512i; 2],
}

impl ExactIndex {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn new<F: Format>() -> Self {
        Self {
            nibbles: nibble_index::<F>(),
            scales: {
                let mut idx = [0u16; 32];
                idx[..4].copy_from_slice(&[0, F::BYTES / 2, 1, F::BYTES / 2 + 1].map(|w| w as u16));
                _mm512_loadu_si512(idx.as_ptr().cast())
            },
            offset: _mm512_set1_epi8(quant_offset(F::TY) as u8 as i8),
            lanes: [0, 1].map(|b| {
                let mut idx = [0u8; 64];
                for l in 0..16 {
                    idx[4 * l] = (b * F::BYTES + qs_offset(F::TY) + l) as u8;
                }
                _mm512_loadu_si512(idx.as_ptr().cast())
            }),
        }
    }
}

/// 64 weights dequantized to f32, in order (for the 32-value formats,
/// `w[0..2]` the first block of a pair, `w[2..4]` the second, zeros for a
/// missing one).
#[derive(Clone, Copy)]
pub(super) struct ExactWeights {
    pub w: [__m512; 4],
}

impl ExactWeights {
    /// Writes the weights to `out`: all 64, or the first 32 for a row's odd
    /// last block (`out` holds 32).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn store(&self, out: &mut [f32]) {
        assert!(out.len() == 64 || out.len() == 32, "32 or 64 weights");
        for (k, out) in out.chunks_exact_mut(16).enumerate() {
            _mm512_storeu_ps(out.as_mut_ptr(), self.w[k]);
        }
    }

    /// Dequantizes the one or two blocks at the start of `b` (an odd last
    /// block pairs with zeros): scale × signed quant, plus the minimum for
    /// Q4_1 and Q5_1.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn decode<F: Format>(b: &[u8], idx: &ExactIndex) -> Self {
        Self::decode_loaded::<F>(b, load_pair::<F>(b), idx)
    }

    /// [`decode`](Self::decode) of the pair's bytes `v`, loaded from `b`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn decode_loaded<F: Format>(b: &[u8], v: __m512i, idx: &ExactIndex) -> Self {
        if matches!(F::TY, QuantType::Q4_0 | QuantType::Q4_1 | QuantType::IQ4NL) {
            return Self::decode_4bit::<F>(v, idx);
        }
        if F::TY == QuantType::Q5_0 {
            return Self::decode_q5_0(b);
        }
        let q = _mm512_sub_epi8(unsigned_quants::<F>(b, v, idx.nibbles), idx.offset);
        let lanes = [
            _mm512_castsi512_si128(q),
            _mm512_extracti32x4_epi32::<1>(q),
            _mm512_extracti32x4_epi32::<2>(q),
            _mm512_extracti32x4_epi32::<3>(q),
        ];
        let q = lanes.map(|l| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(l)));
        let (d, m) = pair_scales(v, idx);
        let w = if F::TY.has_min() {
            std::array::from_fn(|k| _mm512_fmadd_ps(q[k], d[k / 2], m[k / 2]))
        } else {
            std::array::from_fn(|k| _mm512_mul_ps(q[k], d[k / 2]))
        };
        Self { w }
    }

    /// [`decode`](Self::decode) for Q5_0, block by block, without byte
    /// shuffles: the 16 quant bytes widened to 32-bit lanes straight from
    /// memory give the low four bits of values `0..16` (low nibbles) and
    /// `16..32` (high nibbles); `d·(q − 16)` is then `d·n − 16·d` where the
    /// fifth bit is clear and `d·n` where it is set, the fifth bits used as
    /// lane masks. Both sums are exact, so the weights are the values
    /// `d·(q − 16)` (as the AVX2 kernels compute them).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn decode_q5_0(b: &[u8]) -> Self {
        let ty = QuantType::Q5_0;
        // The fifth bits are the 4 bytes before the packed quants.
        let (fifth_at, quants_at) = (qs_offset(ty) - 4, qs_offset(ty));
        let offset = -(quant_offset(ty) as f32);
        let mut w = [_mm512_setzero_ps(); 4];
        for (k, block) in b.chunks_exact(marker::Q5_0::BYTES).take(2).enumerate() {
            let bits = u16::from_le_bytes([block[0], block[1]]) as i16;
            let scale = _mm512_cvtph_ps(_mm256_set1_epi16(bits));
            let clear = _mm512_mul_ps(scale, _mm512_set1_ps(offset));
            let fifth: &[u8; 4] = block[fifth_at..quants_at].try_into().expect("4 bytes");
            let fifth = u32::from_le_bytes(*fifth);
            let quants: &[u8; 16] = block[quants_at..quants_at + 16]
                .try_into()
                .expect("16 quant bytes");
            let n = _mm512_cvtepu8_epi32(_mm_loadu_si128(quants.as_ptr().cast()));
            let low = _mm512_cvtepi32_ps(_mm512_and_si512(n, _mm512_set1_epi32(0xF)));
            let high = _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(n));
            w[2 * k] = _mm512_fmadd_ps(low, scale, _mm512_maskz_mov_ps(!fifth as u16, clear));
            w[2 * k + 1] = _mm512_fmadd_ps(
                high,
                scale,
                _mm512_maskz_mov_ps(!(fifth >> 16) as u16, clear),
            );
        }
        Self { w }
    }

    /// [`decode`](Self::decode) for Q4_0, Q4_1 and IQ4_NL (`v` holds the
    /// pair's bytes), in fewer shuffles: one `vpermb` a block spreads its 16
    /// quant bytes over 32-bit lanes, whose low and high nibbles are its two
    /// runs of 16 weights, looked up in the block's table of its 16 possible
    /// weights. Q4_0's `d·(q − 8)` is computed as `d·q − 8d`, which is
    /// exact (both are small multiples of an f16 scale), and IQ4_NL's
    /// `d·v` is one product, so the weights are the f32 values
    /// `dequantize_block` gives.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn decode_4bit<F: Format>(v: __m512i, idx: &ExactIndex) -> Self {
        let (d, m) = pair_scales(v, idx);
        let m = if F::TY.has_min() {
            m
        } else {
            let offset = _mm512_set1_ps(-(quant_offset(F::TY) as f32));
            [_mm512_mul_ps(d[0], offset), _mm512_mul_ps(d[1], offset)]
        };
        let quants = if F::TY == QuantType::IQ4NL {
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                IQ4_VALUES.as_ptr().cast(),
            )))
        } else {
            _mm512_setr_ps(
                0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0,
                15.0,
            )
        };
        let mut w = [_mm512_setzero_ps(); 4];
        for b in 0..2 {
            // The block's 16 possible weights; `vpermps` reads only the
            // low 4 bits of an index lane, so the low nibble needs no mask.
            let table = if F::TY == QuantType::IQ4NL {
                _mm512_mul_ps(quants, d[b])
            } else {
                _mm512_fmadd_ps(quants, d[b], m[b])
            };
            let bytes = _mm512_maskz_permutexvar_epi8(0x1111_1111_1111_1111, idx.lanes[b], v);
            w[2 * b] = _mm512_permutexvar_ps(bytes, table);
            w[2 * b + 1] = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(bytes), table);
        }
        Self { w }
    }
}

/// The scales and the minimums of the blocks of a pair (`v` holds its
/// bytes), as f32 in every lane: one `vpermw` and one conversion of the four
/// f16, stored, then broadcast from memory. A broadcast from memory is a
/// load; one from a register (which LLVM turns a plain `_mm512_set1_ps` of
/// the stored lane back into) is a shuffle on port 5, which the decoding
/// already keeps busy: measured, `quant_decode_step` exact, one thread,
/// 13.0 → 11.3 ms.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn pair_scales(v: __m512i, idx: &ExactIndex) -> ([__m512; 2], [__m512; 2]) {
    let words = _mm512_castsi512_si128(_mm512_permutexvar_epi16(idx.scales, v));
    let mut f = [0f32; 4];
    _mm_storeu_ps(f.as_mut_ptr(), _mm_cvtph_ps(words));
    let lane = |k: usize| {
        let out: __m512;
        // SAFETY: reads the 4 bytes of `f[k]`, which is initialized.
        std::arch::asm!(
            "vbroadcastss {out}, dword ptr [{at}]",
            out = out(zmm_reg) out,
            at = in(reg) &f[k],
            options(readonly, nostack, preserves_flags),
        );
        out
    };
    ([lane(0), lane(1)], [lane(2), lane(3)])
}

/// The running sums of one (weight row, activation row), one per half of
/// the 64 weights.
#[derive(Clone, Copy)]
pub(crate) struct ExactSums(pub(super) [__m512; 2]);

impl ExactSums {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn zero() -> Self {
        Self([_mm512_setzero_ps(); 2])
    }

    /// Adds 64 decoded weights times their activations: all 64 (`x` holds
    /// 64 values), or the first 32 for a row's odd last block (`x` holds 32).
    /// Every exact kernel accumulates through this one function. `x` is
    /// taken as a whole array so the loads need no bounds checks (a check
    /// and a branch per FMA cost more than the FMA).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn add(self, w: &ExactWeights, x: &[f32]) -> Self {
        if let Ok(x) = <&[f32; 64]>::try_from(x) {
            return self.add64(w, x);
        }
        let mut s = self.0;
        let x: &[f32; 32] = x.try_into().expect("32 or 64 activations");
        for k in 0..2 {
            let x = _mm512_loadu_ps(x[16 * k..16 * k + 16].as_ptr());
            s[0] = _mm512_fmadd_ps(w.w[k], x, s[0]);
        }
        Self(s)
    }

    /// [`add`](Self::add) of all 64.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn add64(self, w: &ExactWeights, x: &[f32; 64]) -> Self {
        let mut s = self.0;
        for k in 0..4 {
            let x = _mm512_loadu_ps(x[16 * k..16 * k + 16].as_ptr());
            s[k / 2] = _mm512_fmadd_ps(w.w[k], x, s[k / 2]);
        }
        Self(s)
    }

    /// The dot product.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn finish(self) -> f32 {
        hsum(self.both())
    }

    /// The dot products of up to 16 sums (zeros past `sums.len()`), bit
    /// for bit what [`finish`](Self::finish) gives each, in one [`hsum16`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn finish16(sums: &[Self]) -> [f32; 16] {
        let mut both = [_mm512_setzero_ps(); 16];
        for (b, s) in both.iter_mut().zip(sums) {
            *b = s.both();
        }
        let mut dots = [0f32; 16];
        _mm512_storeu_ps(dots.as_mut_ptr(), hsum16(&both));
        dots
    }

    /// The two chains added lane by lane.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn both(self) -> __m512 {
        _mm512_add_ps(self.0[0], self.0[1])
    }
}

/// A format whose rows the exact kernels decode 64 values at a time.
pub(crate) trait ExactRows {
    /// What a kernel call sets up once (decoding indexes).
    type Setup: Copy;
    /// Bytes of one block.
    const BLOCK_BYTES: usize;
    /// Values in one block.
    const BLOCK_VALUES: usize;

    /// The set-up.
    unsafe fn setup() -> Self::Setup;

    /// Adds one weight row (or a run of its blocks) times `R` activation
    /// rows (each as long as the run's values) to `sums`: every 64 weights
    /// are decoded once for all of them and accumulated with
    /// [`ExactSums::add`].
    unsafe fn rows<const R: usize>(
        row: &[u8],
        xs: &[&[f32]; R],
        setup: &Self::Setup,
        sums: &mut [ExactSums; R],
    );

    /// Writes one weight row's values to `out` (as long as the row's
    /// values) as f32: the weights [`rows`](Self::rows) multiplies with.
    unsafe fn decode_row(row: &[u8], setup: &Self::Setup, out: &mut [f32]);
}

/// The 32-value formats, decoded a pair of blocks at a time.
pub(crate) struct Blocks32<F>(PhantomData<F>);

impl<F: Format> ExactRows for Blocks32<F> {
    type Setup = ExactIndex;
    const BLOCK_BYTES: usize = F::BYTES;
    const BLOCK_VALUES: usize = 32;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn setup() -> ExactIndex {
        ExactIndex::new::<F>()
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn rows<const R: usize>(
        row: &[u8],
        xs: &[&[f32]; R],
        idx: &ExactIndex,
        sums_io: &mut [ExactSums; R],
    ) {
        // A local copy, so the sums live in registers through the loop.
        let mut sums = *sums_io;
        let pair_bytes = 2 * F::BYTES;
        let pairs = row.len() / pair_bytes;
        for x in xs {
            assert!(x.len() >= pairs * 64, "activations for every weight");
        }
        // Whole pairs: one fixed-mask load each, no per-pair bounds logic
        // (as `load_pair`: at most 64 bytes; Q8_0's quants are read from
        // the slice).
        let mask = u64::MAX >> 64usize.saturating_sub(pair_bytes);
        for (p, b) in row.chunks_exact(pair_bytes).enumerate() {
            // SAFETY: the mask keeps the load inside `b`.
            let v = _mm512_maskz_loadu_epi8(mask, b.as_ptr().cast());
            let w = ExactWeights::decode_loaded::<F>(b, v, idx);
            for (s, x) in sums.iter_mut().zip(xs) {
                // SAFETY: `x` holds `pairs * 64` values or more (checked
                // above) and `p < pairs`.
                *s = s.add64(&w, &*x.as_ptr().add(64 * p).cast::<[f32; 64]>());
            }
        }
        // A last, odd block, paired with zeros.
        let tail = &row[pairs * pair_bytes..];
        if !tail.is_empty() {
            let w = ExactWeights::decode::<F>(tail, idx);
            for (s, x) in sums.iter_mut().zip(xs) {
                *s = s.add(&w, &x[pairs * 64..]);
            }
        }
        *sums_io = sums;
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    unsafe fn decode_row(row: &[u8], idx: &ExactIndex, out: &mut [f32]) {
        for (b, out) in row.chunks(2 * F::BYTES).zip(out.chunks_mut(64)) {
            ExactWeights::decode::<F>(b, idx).store(out);
        }
    }
}

/// Exact kernel for one activation row: `out[r]` = weight row `r` · `x`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn exact<D: ExactRows>(w: &[u8], x: &[f32], out: &mut [f32]) {
    let setup = D::setup();
    let row_bytes = x.len() / D::BLOCK_VALUES * D::BLOCK_BYTES;
    let mut rows = rows_prefetched(w, row_bytes);
    // 16 rows' sums, then their 16 dot products at once.
    for out in out.chunks_mut(16) {
        let mut sums = [ExactSums::zero(); 16];
        for (s, row) in sums.iter_mut().zip(&mut rows).take(out.len()) {
            let mut one = [ExactSums::zero()];
            D::rows::<1>(row, &[x], &setup, &mut one);
            *s = one[0];
        }
        out.copy_from_slice(&ExactSums::finish16(&sums[..out.len()])[..out.len()]);
    }
}

/// Activation values a multi-row kernel takes at a time on longer rows:
/// the `R ≤ 8` rows' run (8 × 4 KiB) stays in the 48 KiB L1 while a band of
/// weight rows passes over it. A multiple of 256 (whole K-quant blocks and
/// pairs of 32-value blocks). Measured (`quant_prefill`, exact, m = 64):
/// rows of 2048 and 4864 values 13–25 % faster than in one pass.
const RUN_VALUES: usize = 1024;
/// The longest rows multiplied in one pass: 8 rows of 1536 values (48 KiB)
/// ran 10–15 % faster in one pass, 8 rows of 2048 values 5–10 % slower.
const ONE_PASS_VALUES: usize = 1536;
/// Weight rows whose running sums are kept while the activation runs pass.
const BAND_ROWS: usize = 32;

/// Exact kernel for `R` activation rows of `cols` values (one after another
/// in `x`): `out[i * n + r]` = weight row `r` · activation row `i`, bit for
/// bit what [`exact`] gives, with `n = out.len() / R` weight rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn exact_multi<D: ExactRows, const R: usize>(
    w: &[u8],
    x: &[f32],
    cols: usize,
    out: &mut [f32],
) {
    let n = out.len() / R;
    let setup = D::setup();
    let xs: [&[f32]; R] = std::array::from_fn(|i| &x[i * cols..(i + 1) * cols]);
    let row_bytes = (cols / D::BLOCK_VALUES * D::BLOCK_BYTES).max(1);
    let run_bytes = RUN_VALUES / D::BLOCK_VALUES * D::BLOCK_BYTES;
    if cols <= ONE_PASS_VALUES {
        // One pass: each row's sums stay in registers.
        for (r, row) in rows_prefetched(w, row_bytes).take(n).enumerate() {
            let mut sums = [ExactSums::zero(); R];
            D::rows::<R>(row, &xs, &setup, &mut sums);
            for (i, s) in sums.iter().enumerate() {
                out[i * n + r] = s.finish();
            }
        }
        return;
    }
    let mut band = [[ExactSums::zero(); R]; BAND_ROWS];
    for b0 in (0..n).step_by(BAND_ROWS) {
        let band_rows =
            w[b0 * row_bytes..(b0 + BAND_ROWS).min(n) * row_bytes].chunks_exact(row_bytes);
        let band = &mut band[..band_rows.len()];
        band.fill([ExactSums::zero(); R]);
        // Each activation run passes every row of the band before the
        // next run: a row's sums see the same additions in the same order
        // as in one pass, so the bits do not change.
        for (k, run) in (0..cols).step_by(RUN_VALUES).enumerate() {
            let values = run..(run + RUN_VALUES).min(cols);
            let xs_run = xs.map(|x| &x[values.clone()]);
            let bytes = k * run_bytes..values.end / D::BLOCK_VALUES * D::BLOCK_BYTES;
            for (row, sums) in band_rows.clone().zip(band.iter_mut()) {
                D::rows::<R>(&row[bytes.clone()], &xs_run, &setup, sums);
            }
        }
        for (j, sums) in band.iter().enumerate() {
            for (i, s) in sums.iter().enumerate() {
                out[i * n + b0 + j] = s.finish();
            }
        }
    }
}
