//! AVX-512 versions of the row kernels of `task`: the same FMA chains, in
//! the same order, so they compute bit for bit what the portable ones do.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::quant::BlockQ8_0;

use super::task::{key_blocks, KEYS};

/// [`super::task::score`] on AVX-512: two blocks of 16 keys per pass, `2·Q`
/// accumulators in registers.
///
/// # Safety
/// The CPU must have AVX-512F. `q` holds `Q` vectors of at least `d`
/// values; `kt` covers every block the ranges touch (`[block][d][KEYS]`);
/// `scores` is `[Q, n_keys]` with every range inside `0..n_keys`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn score<const Q: usize>(
    q: &[&[f32]],
    kt: &[f32],
    d: usize,
    ranges: &[Range<usize>],
    scale: f32,
    scores: &mut [f32],
) {
    let n_keys = scores.len() / Q;
    let q: [&[f32]; Q] = std::array::from_fn(|i| &q[i][..d]);
    let Range {
        start: from,
        end: to,
    } = key_blocks(ranges);
    assert!(to * KEYS * d <= kt.len(), "transposed keys");
    let scale = _mm512_set1_ps(scale);
    let mut lanes = [[0f32; KEYS]; 2];
    let mut block = from;
    while block < to {
        let blocks = if block + 1 < to { 2 } else { 1 };
        let k0 = kt.as_ptr().add(block * KEYS * d);
        let k1 = k0.add(if blocks == 2 { KEYS * d } else { 0 });
        let mut acc = [[_mm512_setzero_ps(); 2]; Q];
        for c in 0..d {
            let (a, b) = (
                _mm512_loadu_ps(k0.add(c * KEYS)),
                _mm512_loadu_ps(k1.add(c * KEYS)),
            );
            for i in 0..Q {
                let x = _mm512_set1_ps(*q[i].get_unchecked(c));
                acc[i][0] = _mm512_fmadd_ps(x, a, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(x, b, acc[i][1]);
            }
        }
        let span = block * KEYS..(block + blocks) * KEYS;
        for (i, range) in ranges.iter().enumerate() {
            for (b, lane) in lanes.iter_mut().enumerate() {
                _mm512_storeu_ps(lane.as_mut_ptr(), _mm512_mul_ps(scale, acc[i][b]));
            }
            for j in span.start.max(range.start)..span.end.min(range.end) {
                let j_in = j - span.start;
                scores[i * n_keys + j] = lanes[j_in / KEYS][j_in % KEYS];
            }
        }
        block += blocks;
    }
}

/// [`super::task::weigh`] on AVX-512: 64 output elements of `H` heads per
/// pass over the keys, `4·H` accumulators in registers.
///
/// # Safety
/// The CPU must have AVX-512F. `p` is `[H, n_keys]`, `v` `[n_keys, d]`,
/// `out` `[H, d]`, and `local` lies inside `0..n_keys`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn weigh<const H: usize>(
    p: &[f32],
    v: &[f32],
    d: usize,
    local: &Range<usize>,
    out: &mut [f32],
) {
    let n_keys = p.len() / H;
    assert!(
        local.end <= n_keys && v.len() >= n_keys * d && out.len() >= H * d,
        "weigh sizes"
    );
    let mut first = 0;
    while first < d {
        let width = (d - first).min(4 * 16);
        // Lanes of each of the 4 vectors that lie inside the row.
        let masks: [__mmask16; 4] = std::array::from_fn(|t| {
            let live = width.saturating_sub(t * 16).min(16);
            ((1u32 << live) - 1) as __mmask16
        });
        let mut acc = [[_mm512_setzero_ps(); 4]; H];
        for j in local.clone() {
            let row = v.as_ptr().add(j * d + first);
            let x: [__m512; 4] =
                std::array::from_fn(|t| _mm512_maskz_loadu_ps(masks[t], row.add(t * 16)));
            for (h, acc) in acc.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*p.get_unchecked(h * n_keys + j));
                for (a, &x) in acc.iter_mut().zip(&x) {
                    *a = _mm512_fmadd_ps(w, x, *a);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            let dst = out.as_mut_ptr().add(h * d + first);
            for t in 0..4 {
                _mm512_mask_storeu_ps(dst.add(t * 16), masks[t], acc[t]);
            }
        }
        first += width;
    }
}

/// Writes the transpose of the 16 × 16 block at column `first` of `rows`
/// (16 rows of `stride` floats) to `out` (`[16][16]`: row `c` holds column
/// `first + c` of the block).
///
/// # Safety
/// The CPU must have AVX-512F; `rows` holds 16 rows of `stride ≥ first +
/// 16` floats and `out` 256 floats.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn transpose16(rows: &[f32], stride: usize, first: usize, out: &mut [f32]) {
    assert!(
        rows.len() >= 15 * stride + first + 16 && out.len() >= 256,
        "transpose sizes"
    );
    let r: [__m512; 16] =
        std::array::from_fn(|i| _mm512_loadu_ps(rows.as_ptr().add(i * stride + first)));
    // Pairs of rows interleaved: t[2i], t[2i+1] from rows 2i, 2i+1.
    let t: [__m512; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    // u[4g + m], 128-bit lane L: column 4L + m of rows 4g .. 4g + 4.
    let u: [__m512; 16] = std::array::from_fn(|i| {
        let (base, m) = (i & !3, i & 3);
        let (a, b) = (
            _mm512_castps_pd(t[base + (m >> 1)]),
            _mm512_castps_pd(t[base + 2 + (m >> 1)]),
        );
        _mm512_castpd_ps(if m & 1 == 0 {
            _mm512_unpacklo_pd(a, b)
        } else {
            _mm512_unpackhi_pd(a, b)
        })
    });
    // v[8h + k]: lanes of u[8h + k % 4] and u[8h + 4 + k % 4], even lanes
    // for k < 4, odd ones above.
    let v: [__m512; 16] = std::array::from_fn(|i| {
        let (base, k) = (i & !7, i & 7);
        let (a, b) = (u[base + (k & 3)], u[base + 4 + (k & 3)]);
        if k < 4 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xdd>(a, b)
        }
    });
    for c in 0..16 {
        let (a, b) = (v[c & 7], v[8 + (c & 7)]);
        let column = if c < 8 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xdd>(a, b)
        };
        _mm512_storeu_ps(out.as_mut_ptr().add(c * 16), column);
    }
}

/// `dst` = the 16-bit floats whose bits are `bits`, widened 16 at a time:
/// bf16 when `BF16` (the bits moved to the top half), else f16 (`vcvtph2ps`,
/// exact, as `half`'s conversion is).
///
/// # Safety
/// The CPU must have AVX-512F.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn widen_16bit<const BF16: bool>(bits: &[u16], dst: &mut [f32]) {
    assert_eq!(bits.len(), dst.len(), "widen sizes");
    let (whole, tail) = bits.as_chunks::<16>();
    let (out, out_tail) = dst.as_chunks_mut::<16>();
    for (h, o) in whole.iter().zip(out) {
        let h = _mm256_loadu_si256(h.as_ptr().cast());
        let wide = if BF16 {
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        } else {
            _mm512_cvtph_ps(h)
        };
        _mm512_storeu_ps(o.as_mut_ptr(), wide);
    }
    for (&h, o) in tail.iter().zip(out_tail) {
        *o = super::widen_half::<BF16>(h);
    }
}

/// `dst` = the Q8_0 blocks `blocks` dequantized (`d · q`, as
/// [`BlockQ8_0::dequantize`] computes them: the same product, rounded
/// once), 16 values at a time.
///
/// # Safety
/// The CPU must have AVX-512F.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn widen_q8_0(blocks: &[BlockQ8_0], dst: &mut [f32]) {
    assert_eq!(blocks.len() * 32, dst.len(), "widen sizes");
    for (b, out) in blocks.iter().zip(dst.as_chunks_mut::<32>().0) {
        let d = _mm512_set1_ps(b.d.to_f32());
        for (half, o) in
            b.qs.as_chunks::<16>()
                .0
                .iter()
                .zip(out.as_chunks_mut::<16>().0)
        {
            let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(half.as_ptr().cast()));
            _mm512_storeu_ps(o.as_mut_ptr(), _mm512_mul_ps(_mm512_cvtepi32_ps(q), d));
        }
    }
}
