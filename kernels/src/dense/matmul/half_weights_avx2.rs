//! AVX2 + FMA register tiles for [`super::linear_half`]: blocks of up to
//! six rows of `x` times two to four weight rows, each output in its own
//! eight-lane accumulator, so every load feeds several fused multiply-adds
//! and each accumulator's chain is one of up to twelve in flight.
//! The arithmetic of each output is the portable kernel's (see
//! `half_weights`), so the bits are the same.

use std::arch::x86_64::*;

use super::half_weights::{lane_sum, HalfFormat};

/// The weight formats the blocks read, in place.
const BF16: u8 = 0;
const F16: u8 = 1;

/// [`super::half_weights`]'s `multiply_tile`: the weights are widened as
/// they are loaded (the kernel is bound by its multiply-adds, and a tile
/// widened to f32 first measured 7–18 % slower).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn multiply_tile(
    x: &[f32],
    tile: &[u8],
    format: HalfFormat,
    outs: &mut [&mut [f32]],
    col: usize,
    k: usize,
) {
    let (m, rows) = (x.len() / k, tile.len() / (2 * k));
    // The blocks read x and the tile through pointers; outs are indexed.
    assert!(x.len() == m * k && tile.len() == 2 * rows * k && outs.len() == m);
    match format {
        HalfFormat::BF16 => rows_of_x::<BF16>(x, tile, rows, outs, col, k),
        HalfFormat::F16 => rows_of_x::<F16>(x, tile, rows, outs, col, k),
    }
}

/// All rows of `x` against the tile's `rows` weight rows (format `F`):
/// six rows of `x` at a time, then the rest together. The first pass over
/// the tile prefetches it (it streams from memory); the others find it in
/// the core's L2. The block shapes fill the 16 vector registers: six by
/// two was measured ahead of four by three (`dense_matmul` benchmark,
/// 576 × 576 at 64 rows: 148 against 131 GFLOP/s on a 2-core Zen 3).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows_of_x<const F: u8>(
    x: &[f32],
    w: &[u8],
    rows: usize,
    outs: &mut [&mut [f32]],
    col: usize,
    k: usize,
) {
    let m = x.len() / k;
    let mut i = 0;
    while i + 6 <= m {
        weight_rows::<F, 6, 2>(x, i, w, rows, outs, col, k, i == 0);
        i += 6;
    }
    let first = i == 0;
    match m - i {
        5 => weight_rows::<F, 5, 2>(x, i, w, rows, outs, col, k, first),
        4 => weight_rows::<F, 4, 3>(x, i, w, rows, outs, col, k, first),
        3 => weight_rows::<F, 3, 3>(x, i, w, rows, outs, col, k, first),
        2 => weight_rows::<F, 2, 4>(x, i, w, rows, outs, col, k, first),
        1 => weight_rows::<F, 1, 4>(x, i, w, rows, outs, col, k, first),
        _ => {}
    }
}

/// Rows `i..i + R` of `x` against every weight row, `C` at a time, then
/// one at a time; with `prefetch`, each block requests the next block's
/// weights as it goes (they are streaming from memory).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn weight_rows<const F: u8, const R: usize, const C: usize>(
    x: &[f32],
    i: usize,
    w: &[u8],
    rows: usize,
    outs: &mut [&mut [f32]],
    col: usize,
    k: usize,
    prefetch: bool,
) {
    let row_bytes = w.len() / rows;
    let xs = x.as_ptr().add(i * k);
    let mut r = 0;
    while r < rows {
        // C weight rows at a time, then one at a time.
        let cols = if r + C <= rows { C } else { 1 };
        let ws = w.as_ptr().add(r * row_bytes);
        if cols == C {
            let sums = if prefetch {
                block::<F, R, C, true>(xs, ws, k, row_bytes)
            } else {
                block::<F, R, C, false>(xs, ws, k, row_bytes)
            };
            for (out, sums) in outs[i..i + R].iter_mut().zip(&sums) {
                out[col + r..col + r + C].copy_from_slice(sums);
            }
        } else {
            let sums = if prefetch {
                block::<F, R, 1, true>(xs, ws, k, row_bytes)
            } else {
                block::<F, R, 1, false>(xs, ws, k, row_bytes)
            };
            for (out, sum) in outs[i..i + R].iter_mut().zip(&sums) {
                out[col + r] = sum[0];
            }
        }
        r += cols;
    }
}

/// The products of `R` rows of `x` (from `xs`, `k` apart) with `C` weight
/// rows (from `ws`, `row_bytes` apart, format `F`): `[i][j]` is row `i` of
/// `x` times weight row `j`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn block<const F: u8, const R: usize, const C: usize, const PREFETCH: bool>(
    xs: *const f32,
    ws: *const u8,
    k: usize,
    row_bytes: usize,
) -> [[f32; C]; R] {
    let chunks = k / 8;
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut wv = [_mm256_setzero_ps(); C];
    for c in 0..chunks {
        if PREFETCH && c % 4 == 0 {
            // The same line of each row of the next block: every 64 bytes
            // a row consumes, one line each row, one block ahead.
            let ahead = ws.wrapping_add(C * row_bytes + 16 * c);
            for j in 0..C {
                // A prefetch is a hint: it never faults, wherever it points.
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(j * row_bytes).cast());
            }
        }
        for (j, wv) in wv.iter_mut().enumerate() {
            *wv = load8::<F>(ws.add(j * row_bytes), 8 * c);
        }
        for (i, acc) in acc.iter_mut().enumerate() {
            let xv = _mm256_loadu_ps(xs.add(i * k + 8 * c));
            for (acc, wv) in acc.iter_mut().zip(&wv) {
                *acc = _mm256_fmadd_ps(xv, *wv, *acc);
            }
        }
    }
    let mut sums = [[0f32; C]; R];
    for (i, (sums, acc)) in sums.iter_mut().zip(&acc).enumerate() {
        for (j, (sum, acc)) in sums.iter_mut().zip(acc).enumerate() {
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), *acc);
            *sum = lane_sum(lanes);
            for t in 8 * chunks..k {
                let weight = load1::<F>(ws.add(j * row_bytes), t);
                *sum = (*xs.add(i * k + t)).mul_add(weight, *sum);
            }
        }
    }
    sums
}

/// Eight weights of a row (format `F`) from element `at` on, as f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8<const F: u8>(row: *const u8, at: usize) -> __m256 {
    match F {
        BF16 => {
            let bits = _mm_loadu_si128(row.cast::<u16>().add(at).cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
        }
        _ => _mm256_cvtph_ps(_mm_loadu_si128(row.cast::<u16>().add(at).cast())),
    }
}

/// Weight `at` of a row (format `F`) as f32.
#[inline(always)]
unsafe fn load1<const F: u8>(row: *const u8, at: usize) -> f32 {
    match F {
        BF16 => f32::from_bits(u32::from(row.cast::<u16>().add(at).read_unaligned()) << 16),
        _ => half::f16::from_bits(row.cast::<u16>().add(at).read_unaligned()).to_f32(),
    }
}
