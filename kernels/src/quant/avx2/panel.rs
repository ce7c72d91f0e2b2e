//! The arithmetic every AVX2 exact kernel of a known format shares (f32
//! activations; the 32-value formats in `exact_32`, the K-quants in
//! `exact_k`), and the panel kernels built on it.
//!
//! Each output sums its products in 32 lanes: lane `l` takes values `l`,
//! `l + 32`, … of the row in order by fused multiply-adds ([`add_products`],
//! four eight-lane chains), and the lanes are added as [`finish`] says. The
//! weights are dequantized to f32 first, the same way whether a kernel
//! reads them as it goes (one to three activation rows: batched decode) or
//! [`decode_rows`] decodes a tile of weight rows once for many activation
//! rows ([`panel_multiply`]: register blocks of activation rows × weight
//! rows, one chain at a time). So every number of activation rows gives the
//! same bits.

use std::arch::x86_64::*;

use super::super::format::{Format, QK_K};
use super::{exact_32, exact_k, hsum};

/// Adds 32 weights `w` (dequantized, values 0..8, 8..16, 16..24, 24..32)
/// times the activations `x[..32]` to the four chains `acc`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn add_products(acc: &mut [__m256; 4], w: &[__m256], x: &[f32]) {
    let x = &x[..32];
    acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x.as_ptr()), w[0], acc[0]);
    acc[1] = _mm256_fmadd_ps(_mm256_loadu_ps(x[8..].as_ptr()), w[1], acc[1]);
    acc[2] = _mm256_fmadd_ps(_mm256_loadu_ps(x[16..].as_ptr()), w[2], acc[2]);
    acc[3] = _mm256_fmadd_ps(_mm256_loadu_ps(x[24..].as_ptr()), w[3], acc[3]);
}

/// An output from its 32 lanes of sums: the four vectors added in pairs,
/// then the eight lanes as [`hsum`] adds them.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn finish(acc: [__m256; 4]) -> f32 {
    hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ))
}

/// Where value `v` of a row of `cols` values goes in the panel layout: the
/// row's values of chain 0 (values `0..8` of every 32) first, in order,
/// then those of chains 1, 2 and 3. So each chain of a row is one run of
/// `cols / 4` values, which [`panel_multiply`] streams.
fn lay_out_row(row: &[f32], out: &mut [f32]) {
    let segment = row.len() / 4;
    for (b, block) in row.chunks_exact(32).enumerate() {
        for (g, values) in block.chunks_exact(8).enumerate() {
            out[g * segment + 8 * b..][..8].copy_from_slice(values);
        }
    }
}

/// Lays out activation rows (of `cols` values) for [`panel_multiply`].
pub(crate) fn pack_acts(x: &[f32], cols: usize, out: &mut [f32]) {
    for (x, out) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        lay_out_row(x, out);
    }
}

/// Dequantizes `w` (whole weight rows of `cols` values) to f32 rows in
/// `out`, laid out for [`panel_multiply`] as they are stored.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn decode_rows<F: Format>(w: &[u8], cols: usize, out: &mut [f32]) {
    let row_bytes = cols / F::ELEMS * F::BYTES;
    let groups = F::ELEMS / 32;
    for (w, out) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut(cols)) {
        let mut row = ChainRow {
            out,
            segment: cols / 4,
        };
        for (i, b) in w.chunks_exact(F::BYTES).enumerate() {
            if F::ELEMS == QK_K {
                exact_k::dequantize_block::<F>(b, &mut row, i * groups);
            } else {
                exact_32::dequantize_block::<F>(b, &mut row, i * groups);
            }
        }
    }
}

/// A weight row of the panel, written in [`lay_out_row`]'s layout as its
/// blocks are dequantized.
pub(super) struct ChainRow<'a> {
    out: &'a mut [f32],
    /// Values a chain: a quarter of the row.
    segment: usize,
}

impl ChainRow<'_> {
    /// Stores values `32·j .. 32·j + 32` of the row, dequantized (`w`: 0..8,
    /// 8..16, 16..24, 24..32), each eight where its chain's run has them.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn put(&mut self, j: usize, w: &[__m256]) {
        for (g, w) in w[..4].iter().enumerate() {
            let at = &mut self.out[g * self.segment + 8 * j..][..8];
            _mm256_storeu_ps(at.as_mut_ptr(), *w);
        }
    }
}

/// `outs[i][col0 + r]` = weight row `r` (of those [`decode_rows`] put in
/// `panel`) · activation row `i` (of those [`pack_acts`] put in `x`), rows
/// of `cols` values: bit for bit what the single-row kernels give from the
/// encoded row. In register blocks of up to six activation rows × two to four
/// weight rows, which run a pair's four chains one after another (one
/// accumulator a pair, twelve in flight; each loaded weight feeds up to six
/// FMAs), as `dense::matmul`'s f16/bf16 blocks do.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn panel_multiply(
    panel: &[f32],
    x: &[f32],
    cols: usize,
    outs: &mut [&mut [f32]],
    col0: usize,
) {
    let (m, rows) = (x.len() / cols, panel.len() / cols);
    assert!(x.len() == m * cols && panel.len() == rows * cols && cols.is_multiple_of(32));
    assert!(outs.len() == m && outs.iter().all(|o| o.len() >= col0 + rows));
    let mut tile = Tile {
        x,
        panel,
        cols,
        rows,
        chains: vec![0f32; 12 * 4 * 8],
    };
    let mut i = 0;
    while i + 6 <= m {
        tile.act_rows::<6, 2>(i, outs, col0);
        i += 6;
    }
    match m - i {
        5 => tile.act_rows::<5, 2>(i, outs, col0),
        4 => tile.act_rows::<4, 3>(i, outs, col0),
        3 => tile.act_rows::<3, 3>(i, outs, col0),
        2 => tile.act_rows::<2, 4>(i, outs, col0),
        1 => tile.act_rows::<1, 4>(i, outs, col0),
        _ => {}
    }
}

/// [`panel_multiply`]'s operands, and where a register block's chains wait
/// for the last (on the heap: kept in registers, they crowded the next
/// chain's accumulators out into memory).
struct Tile<'a> {
    x: &'a [f32],
    panel: &'a [f32],
    cols: usize,
    rows: usize,
    chains: Vec<f32>,
}

impl Tile<'_> {
    /// Activation rows `i..i + R` against every weight row, `C` at a time,
    /// then one at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn act_rows<const R: usize, const C: usize>(
        &mut self,
        i: usize,
        outs: &mut [&mut [f32]],
        col0: usize,
    ) {
        let mut r = 0;
        while r < self.rows {
            if r + C <= self.rows {
                let sums = self.block::<R, C>(i, r);
                for (out, sums) in outs[i..i + R].iter_mut().zip(&sums) {
                    out[col0 + r..col0 + r + C].copy_from_slice(sums);
                }
                r += C;
            } else {
                let sums = self.block::<R, 1>(i, r);
                for (out, sums) in outs[i..i + R].iter_mut().zip(&sums) {
                    out[col0 + r] = sums[0];
                }
                r += 1;
            }
        }
    }

    /// The products of activation rows `i..i + R` with weight rows
    /// `r..r + C`: `[a][b]` is activation row `i + a` times weight row
    /// `r + b`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn block<const R: usize, const C: usize>(
        &mut self,
        i: usize,
        r: usize,
    ) -> [[f32; C]; R] {
        let cols = self.cols;
        let segment = cols / 4;
        // In bounds: the caller keeps `i + R <= m` and `r + C <= rows`.
        let xs = self.x.as_ptr().add(i * cols);
        let ws = self.panel.as_ptr().add(r * cols);
        // Chain `g` of pair (a, b) at `8 * (4 * (a * C + b) + g)`.
        let chains = self.chains[..R * C * 32].as_mut_ptr();
        for g in 0..4 {
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            for at in (g * segment..(g + 1) * segment).step_by(8) {
                let mut wv = [_mm256_setzero_ps(); C];
                for (j, wv) in wv.iter_mut().enumerate() {
                    *wv = _mm256_loadu_ps(ws.add(j * cols + at));
                }
                for (a, acc) in acc.iter_mut().enumerate() {
                    let xv = _mm256_loadu_ps(xs.add(a * cols + at));
                    for (acc, wv) in acc.iter_mut().zip(&wv) {
                        *acc = _mm256_fmadd_ps(xv, *wv, *acc);
                    }
                }
            }
            for (a, acc) in acc.iter().enumerate() {
                for (b, acc) in acc.iter().enumerate() {
                    _mm256_storeu_ps(chains.add(8 * (4 * (a * C + b) + g)), *acc);
                }
            }
        }
        let mut sums = [[0f32; C]; R];
        for (a, sums) in sums.iter_mut().enumerate() {
            for (b, sum) in sums.iter_mut().enumerate() {
                let at = chains.add(32 * (a * C + b));
                *sum = finish([
                    _mm256_loadu_ps(at),
                    _mm256_loadu_ps(at.add(8)),
                    _mm256_loadu_ps(at.add(16)),
                    _mm256_loadu_ps(at.add(24)),
                ]);
            }
        }
        sums
    }
}
